//! CPU kernels for flowrt: a scalar reference for every operation, and SIMD versions chosen at
//! run time from a table (one [`Kernels`] table per instruction set).
//!
//! * Quantised rows use ggml's block layouts byte for byte (see [`blocks`]).
//! * [`Kernels::detect`] picks the best table the host can run (or the one named by the
//!   `FLOWRT_KERNELS` environment variable); nothing is compiled for a fixed CPU.
//! * Every table is a copy of the scalar one with some entries replaced, so a type or an
//!   operation without a SIMD version still works everywhere. Adding a weight type means adding a
//!   slot to `SLOT_TYPES` and its row to the scalar table (then, optionally, SIMD rows).
//! * Length mismatches are programmer errors and panic at the API boundary, before any SIMD code
//!   runs, so the SIMD code never reads or writes out of bounds.
//!
//! The hot path is [`Kernels::matmul`] on quantised weights. The x86 tables compute it in tiles
//! of a few weight rows by a few tokens (`x86/quant.rs`): a weight block is unpacked once and
//! used for every token of the tile, an activation block once for every row, the accumulators
//! stay in registers, and integer block sums are exact (`maddubs` on AVX2, `vpdpbusd` with
//! VNNI). Decoding (one token) uses tiles of several rows so that one activation load and
//! scale serve them all.
//!
//! Weight types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4. The default
//! path quantises activations to Q16 ([`Kernels::matmul_q16`], AVX2 kernels for every
//! quantised weight type); the ggml path ([`Kernels::matmul`] with Q8_0/Q8_1/Q8_K activations)
//! has SIMD tiles for Q4_0, Q4_1 and Q8_0 and the scalar reference for Q5_0, Q5_1 and the
//! k-quants.
//!
//! The fastest path: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K weights repacked at load
//! into [`x8`]'s layout (8 rows interleaved per block, one row per 32-bit lane) and multiplied
//! with Q16 activations by [`Kernels::matmul_q16_x8`]: no horizontal sums, 8 rows' scales in one
//! vector, one linear weight stream per task. AVX2 (`x86/x8.rs`) and NEON (`arm/x8.rs`, each
//! 32-byte vector of 8 rows taken as two 128-bit registers, `vmlal_s16` in place of
//! `vpmaddwd`) have kernels for all eight; the NEON ones are tested under `qemu-aarch64`
//! (`scripts/test-aarch64`) and have not been timed on ARM hardware.
//!
//! Opt-in, with 8-bit activations: [`Kernels::matmul_a8_x8`] multiplies x8-packed Q4_0, Q4_1,
//! Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and MXFP4 weights with [`a8`] activation blocks (AVX2:
//! `vpmaddubsw`, 16-bit partial sums; AVX-512: two groups per vector, `vpdpbusd` with VNNI;
//! the scalar reference elsewhere): about 1.35-1.5x the Q16 kernels' rate on AVX2, about 2x
//! on AVX-512 VNNI, at ggml's precision class.
//!
//! MXFP4 (gpt-oss's experts, GGUF type 39) has the x8 layout and AVX2, AVX-512 (VNNI) and
//! NEON kernels there (`x86/x8.rs`, `x86/x8_512.rs`, `arm/x8.rs`: a `vpshufb` (`tbl` on NEON) of the doubled E2M1 values
//! `0, ±1, ±2, ±3, ±4, ±6, ±8, ±12` gives each block's integer dot `sum k_j q_a` exactly,
//! scaled by the E8M0 scale halved, `2^(e - 128)`, and the activation scale: the numerics of
//! the Q8_0 x8 path, one integer sum and one scale per 32 values). Its row-layout Q16 matmul,
//! its ggml-path matmul (Q8_0 activations) use the scalar reference; the NEON kernel, like the other NEON ones, is tested under
//! `qemu-aarch64` and not timed on ARM hardware.

use std::sync::OnceLock;

use flowrt_dtype::GgmlType;

pub mod a8;
pub mod blocks;
pub mod gptq;
pub mod q16;
mod scalar;
mod tiling;
pub mod x8;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86;

#[cfg(target_arch = "aarch64")]
#[allow(unsafe_code)]
mod arm;

/// An instruction set a [`Kernels`] table is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, the reference for every other table.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F+BW+DQ+VL (plus AVX2, FMA, F16C).
    Avx512,
    /// [`Isa::Avx512`] plus AVX-512 VNNI.
    Avx512Vnni,
    /// aarch64 Advanced SIMD.
    Neon,
}

impl Isa {
    /// Every ISA, in the order [`Kernels::available`] lists them.
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Vnni,
        Isa::Neon,
    ];

    /// Lower-case name, as accepted by `FLOWRT_KERNELS` and [`Kernels::select`].
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Neon => "neon",
        }
    }

    /// Parses a name accepted by [`Isa::name`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(name.trim()))
    }
}

/// Why a kernel table could not be selected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("unknown kernel set {name:?}; expected one of scalar, avx2, avx512, avx512vnni, neon")]
    UnknownIsa { name: String },
    #[error("kernel set {isa} needs CPU features this host lacks ({missing}); host has: {host}")]
    Unsupported {
        isa: &'static str,
        missing: String,
        host: String,
    },
}

// ---------------------------------------------------------------------------------------------
// The table.

/// Quantise (or convert) one f32 row into a row of the slot's type.
pub(crate) type QuantizeFn = fn(&[f32], &mut [u8]);
/// Dequantise one row into f32.
pub(crate) type DequantizeFn = fn(&[u8], &mut [f32]);
/// Dot of one weight row with one activation row of `k` values.
pub(crate) type VecDotFn = fn(usize, &[u8], &[u8]) -> f32;
/// A weight tile times an activation tile (see [`Kernels::matmul`]).
pub(crate) type MatmulFn = fn(MatmulArgs<'_>);

/// Arguments of a matmul call, lengths already checked by [`Kernels::matmul`].
pub(crate) struct MatmulArgs<'a> {
    /// Values per row.
    pub k: usize,
    /// `nrows` weight rows, `row_size(w, k)` bytes each.
    pub w: &'a [u8],
    pub nrows: usize,
    /// `ntok` activation rows of type `vec_dot_type(w)`.
    pub a: &'a [u8],
    pub ntok: usize,
    /// `out[t * out_stride + r]`.
    pub out: &'a mut [f32],
    pub out_stride: usize,
}

/// Per-type entries: every matmul path of a weight type is one entry here, filled when the
/// table is built (`Kernels::with_matmul_paths` for the Q16, x8 and A8 ones). `None` where the
/// type has no such path (`vec_dot`/`matmul`: types that are not weight types).
#[derive(Clone, Copy)]
pub(crate) struct TypeOps {
    pub quantize: QuantizeFn,
    pub dequantize: DequantizeFn,
    pub vec_dot: Option<VecDotFn>,
    pub matmul: Option<MatmulFn>,
    /// Q16 activations on weights in ggml's row layout ([`Kernels::matmul_q16`]).
    pub matmul_q16: Option<MatmulFn>,
    /// Q16 activations on x8-packed weights ([`Kernels::matmul_q16_x8`]).
    pub matmul_q16_x8: Option<MatmulFn>,
    /// A8 activations on x8-packed weights ([`Kernels::matmul_a8_x8`]).
    pub matmul_a8_x8: Option<MatmulFn>,
}

/// f32 element-wise and attention helpers.
#[derive(Clone, Copy)]
pub(crate) struct ElemOps {
    pub rms_norm: fn(&[f32], &[f32], f32, &mut [f32]),
    pub silu_mul: fn(&mut [f32], &[f32]),
    pub gelu_tanh_mul: fn(&mut [f32], &[f32]),
    pub softcap: fn(&mut [f32], f32),
    pub softmax: fn(&mut [f32]),
    pub softmax_unscaled: fn(&mut [f32]) -> (f32, f32),
    pub add: fn(&mut [f32], &[f32]),
    pub scale: fn(&mut [f32], f32),
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    pub dot_f32_f16: fn(&[f32], &[half::f16]) -> f32,
    pub axpy_f32: fn(&mut [f32], f32, &[f32]),
    pub axpy_f16: fn(&mut [f32], f32, &[half::f16]),
    pub f32_to_f16: fn(&[f32], &mut [half::f16]),
    pub attn_scores_f16: fn(&[f32], usize, &[half::f16], f32, &mut [f32]),
    pub attn_values_f16: fn(&[f32], usize, &[half::f16], &mut [f32]),
    pub panel_dots_f64: fn(&[f64], usize, usize, usize, &mut PanelTile),
    pub panel_dots_f32: fn(&[f32], usize, usize, usize, &mut PanelTileF32),
}

/// The 4 × 8 tile of dot products [`Kernels::panel_dots_f64`] writes.
pub type PanelTile = [[f64; 8]; 4];

/// The 4 × 16 tile of dot products [`Kernels::panel_dots_f32`] writes.
pub type PanelTileF32 = [[f32; 16]; 4];

/// The types with a row in the table, in slot order.
pub(crate) const SLOT_TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::Mxfp4,
];
pub(crate) const N_SLOTS: usize = SLOT_TYPES.len();

/// Slot of `ty` in [`Kernels`]'s per-type table.
pub(crate) fn slot(ty: GgmlType) -> Option<usize> {
    SLOT_TYPES.iter().position(|&t| t == ty)
}

/// A table of kernels for one instruction set. Obtain one with [`Kernels::detect`],
/// [`Kernels::select`], [`Kernels::scalar`] or [`Kernels::available`].
pub struct Kernels {
    pub(crate) isa: Isa,
    pub(crate) types: [TypeOps; N_SLOTS],
    pub(crate) elem: ElemOps,
    /// The Q16 and A8 activation quantisers.
    pub(crate) quantize_q16: fn(&[f32], &mut [u8]),
    pub(crate) quantize_a8: fn(&[f32], &mut [u8]),
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("isa", &self.isa)
            .finish_non_exhaustive()
    }
}

/// Bytes of a row of `k` values of type `ty`.
///
/// # Panics
/// If `k` is not a multiple of the type's block size or the size overflows `usize`: both are
/// programmer errors (shapes from files are checked with [`GgmlType::row_size`] when loading).
pub fn row_size(ty: GgmlType, k: usize) -> usize {
    let bytes = ty
        .row_size(k as u64)
        .unwrap_or_else(|e| panic!("row_size({ty}, {k}): {e}"));
    usize::try_from(bytes).unwrap_or_else(|_| panic!("row_size({ty}, {k}) overflows usize"))
}

impl Kernels {
    /// Fills the Q16, x8 and A8 matmul entries of every type, and the activation quantisers,
    /// with this table's instruction set's kernels: the one place they are chosen (a table is
    /// built once per process, and every call then reads its entry).
    pub(crate) fn with_matmul_paths(mut self) -> Kernels {
        let isa = self.isa;
        for (ops, &ty) in self.types.iter_mut().zip(SLOT_TYPES.iter()) {
            ops.matmul_q16 = q16::matmul_fn(isa, ty);
            ops.matmul_q16_x8 = x8::matmul_fn(isa, ty);
            ops.matmul_a8_x8 = a8::matmul_fn(isa, ty);
        }
        self.quantize_q16 = q16::quantize_fn(isa);
        self.quantize_a8 = a8::quantize_fn(isa);
        self
    }
}

fn table_for(isa: Isa) -> Option<&'static Kernels> {
    match isa {
        Isa::Scalar => Some(Kernels::scalar()),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni => x86::table(isa),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::table(),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// Whether this build has a table for `isa` at all: each SIMD table is compiled only for its
/// own architecture, so on another one no CPU feature could make it available.
fn built_for_this_arch(isa: Isa) -> bool {
    match isa {
        Isa::Scalar => true,
        Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni => cfg!(target_arch = "x86_64"),
        Isa::Neon => cfg!(target_arch = "aarch64"),
    }
}

/// CPU features an ISA needs, as `is_x86_feature_detected!`/`std::arch` names them.
fn required_features(isa: Isa) -> &'static [&'static str] {
    match isa {
        Isa::Scalar => &[],
        Isa::Avx2 => &["avx2", "fma", "f16c"],
        Isa::Avx512 => &[
            "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
        ],
        Isa::Avx512Vnni => &[
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512dq",
            "avx512vl",
            "avx512vnni",
        ],
        Isa::Neon => &["neon"],
    }
}

/// Which table's code runs each Q16 matmul path (see [`Kernels::q16_paths`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q16Paths {
    /// Weights repacked into the x8 layout, several tokens (prefill, batches).
    pub x8: &'static str,
    /// Weights repacked into the x8 layout, one token (decode).
    pub x8_decode: &'static str,
    /// Weights in ggml's row layout.
    pub rows: &'static str,
}

impl Kernels {
    /// The best table this host can run, or the one `FLOWRT_KERNELS` names. If that variable
    /// names a table the host cannot run (or no table at all), prints one warning line and uses
    /// the scalar table. Decided once per process.
    pub fn detect() -> &'static Kernels {
        static DETECTED: OnceLock<&'static Kernels> = OnceLock::new();
        DETECTED.get_or_init(|| {
            let env = std::env::var("FLOWRT_KERNELS")
                .ok()
                .filter(|s| !s.trim().is_empty());
            match Kernels::select(env.as_deref()) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("flowrt: FLOWRT_KERNELS: {e}; using the scalar kernels");
                    Kernels::scalar()
                }
            }
        })
    }

    /// The table named `name` (`scalar`, `avx2`, `avx512`, `avx512vnni`, `neon`), or the best
    /// the host supports for `None`. Errors name what is missing.
    pub fn select(name: Option<&str>) -> Result<&'static Kernels, KernelError> {
        let Some(name) = name else {
            return Ok(*Kernels::available()
                .last()
                .expect("scalar is always available"));
        };
        let isa =
            Isa::from_name(name).ok_or_else(|| KernelError::UnknownIsa { name: name.into() })?;
        table_for(isa).ok_or_else(|| {
            let host = Kernels::cpu_features();
            let missing: Vec<&str> = required_features(isa)
                .iter()
                .copied()
                .filter(|f| !host.contains(f))
                .collect();
            let missing = if missing.is_empty() || !built_for_this_arch(isa) {
                format!("not built for {}", std::env::consts::ARCH)
            } else {
                missing.join(", ")
            };
            KernelError::Unsupported {
                isa: isa.name(),
                missing,
                host: if host.is_empty() {
                    "none".into()
                } else {
                    host.join(",")
                },
            }
        })
    }

    /// The portable reference table.
    pub fn scalar() -> &'static Kernels {
        static SCALAR: OnceLock<Kernels> = OnceLock::new();
        SCALAR.get_or_init(|| scalar::table().with_matmul_paths())
    }

    /// Every table this host can run, scalar first, best last.
    pub fn available() -> Vec<&'static Kernels> {
        Isa::ALL.into_iter().filter_map(table_for).collect()
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The code that runs Q16 matmuls with this table: on x8-packed weights
    /// ([`Kernels::matmul_q16_x8`]) and on weights in ggml's row layout
    /// ([`Kernels::matmul_q16`]), by table name (the AVX-512 tables have their own x8 kernels
    /// and use the AVX2 row kernels).
    pub fn q16_paths(&self) -> Q16Paths {
        let rows = match self.isa {
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni => "avx2",
            Isa::Scalar | Isa::Neon => "scalar",
        };
        // The AVX-512 x8 kernels hand single tokens to the AVX2 one (see `x86/x8_512.rs`).
        let x8_decode = match self.isa {
            Isa::Avx512 | Isa::Avx512Vnni => "avx2",
            other => other.name(),
        };
        Q16Paths {
            x8: self.isa.name(),
            x8_decode,
            rows,
        }
    }

    /// The code that runs A8 matmuls on x8-packed weights ([`Kernels::matmul_a8_x8`]) with
    /// this table, `(one token, batches)` by table name: the AVX2 kernels on the AVX2 table,
    /// the 512-bit ones for batches on the AVX-512 tables (single tokens go to the AVX2 one,
    /// as in [`Kernels::q16_paths`]); `None` where the A8 matmuls are the scalar reference.
    pub fn a8_paths(&self) -> Option<(&'static str, &'static str)> {
        if !a8::has_simd(self.isa) {
            return None;
        }
        Some(("avx2", self.isa.name()))
    }

    pub fn name(&self) -> &'static str {
        self.isa.name()
    }

    /// SIMD features detected on this host that the kernels care about.
    pub fn cpu_features() -> Vec<&'static str> {
        #[allow(unused_mut)]
        let mut v: Vec<&'static str> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            macro_rules! check {
                ($($f:tt),*) => {$( if std::arch::is_x86_feature_detected!($f) { v.push($f); } )*};
            }
            check!(
                "avx2",
                "fma",
                "f16c",
                "avx512f",
                "avx512bw",
                "avx512dq",
                "avx512vl",
                "avx512vnni",
                "avx512bf16",
                "avxvnni"
            );
        }
        #[cfg(target_arch = "aarch64")]
        {
            macro_rules! check {
                ($($f:tt),*) => {$( if std::arch::is_aarch64_feature_detected!($f) { v.push($f); } )*};
            }
            check!("neon", "dotprod", "i8mm", "fp16", "bf16");
        }
        v
    }

    /// Activation type a weight type is multiplied with, as in ggml: Q4_0, Q5_0, Q8_0, MXFP4 -> Q8_0;
    /// Q4_1, Q5_1 -> Q8_1; k-quants (Q4_K, Q5_K, Q6_K, and the unsupported Q2_K, Q3_K) ->
    /// Q8_K; F32/F16/BF16 -> F32. Meaningful only where [`Kernels::supports`] is true; other
    /// types map to F32.
    pub fn vec_dot_type(w: GgmlType) -> GgmlType {
        use GgmlType::*;
        match w {
            Q4_0 | Q8_0 | Q5_0 | Mxfp4 => Q8_0,
            Q4_1 | Q5_1 => Q8_1,
            Q2K | Q3K | Q4K | Q5K | Q6K => Q8K,
            _ => F32,
        }
    }

    /// Whether `w` can be used as a weight type with [`Kernels::vec_dot`] and
    /// [`Kernels::matmul`] (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
    /// MXFP4).
    pub fn supports(w: GgmlType) -> bool {
        slot(w).is_some_and(|s| Kernels::scalar().types[s].vec_dot.is_some())
    }

    /// Whether [`Kernels::quantize_row`] and [`Kernels::dequantize_row`] handle `ty`
    /// (the weight types plus the activation types Q8_1 and Q8_K).
    pub fn supports_conversion(ty: GgmlType) -> bool {
        slot(ty).is_some()
    }

    fn ops(&self, ty: GgmlType) -> &TypeOps {
        match slot(ty) {
            Some(s) => &self.types[s],
            None => panic!("flowrt-kernels: type {ty} is not supported"),
        }
    }

    /// Quantises (or converts; copies for F32) one row: `x.len()` must be a multiple of the
    /// type's block size and `out.len() == row_size(ty, x.len())`.
    ///
    /// Q8_0/Q8_1 rounding: `d = amax / 127`, `q = round(x * (1 / d))` with ties away from
    /// zero (C `roundf`, Rust `f32::round`), as ggml's reference; every table produces the same
    /// bytes. Q8_1's `s` is `d * sum(q)` with `d` before its rounding to f16. Q8_K uses the
    /// same rule with `d` kept in f32 (ggml's own Q8_K quantiser differs slightly).
    ///
    /// Q4_0, Q4_1, Q5_0 and Q5_1 follow ggml's reference quantisers (the bytes llama.cpp's
    /// `llama-quantize` writes for them without an importance matrix, and what gguf-py writes);
    /// [`Kernels::quantize_row_weights`] searches their scales instead.
    /// The k-quant quantisers (Q4_K, Q5_K, Q6_K) search for each block's scales: candidate
    /// scales, a least-squares refit of scale and min for each rounding, the 6-bit (Q6_K:
    /// 8-bit) sub-block scales chosen by the error they give, and a refit of the super-block
    /// scales, minimising the squared error weighted by `sqrt(2 sigma^2) + |x|` (no importance
    /// matrix). Their relative RMS error is 11-12 % below the min/max quantisers flowrt had
    /// and 1-3.5 % below llama.cpp's without an importance matrix, on trained f32 weights and
    /// on Gaussian ones (`docs/quantisation.md`). Every table writes the same bytes (the x86 tables run the same
    /// search on AVX registers); finite input gives finite scales.
    ///
    /// # Panics
    /// On an unsupported type or a length mismatch.
    pub fn quantize_row(&self, ty: GgmlType, x: &[f32], out: &mut [u8]) {
        let ops = self.ops(ty);
        assert_eq!(
            out.len(),
            row_size(ty, x.len()),
            "quantize_row({ty}): output length for {} values",
            x.len()
        );
        (ops.quantize)(x, out)
    }

    /// Quantises one row of weights (what `flowrt pack` writes): as [`Kernels::quantize_row`]
    /// except that Q4_0, Q4_1, Q5_0 and Q5_1 search each block's scale (and offset) for the
    /// least squared error instead of ggml's range-spanning reference rule: candidate scales
    /// around it, a least-squares refit for each rounding, the result in the f16 the block
    /// stores, kept only where its error is below the reference bytes' (so no block is worse).
    /// Same block format (llama.cpp reads it unchanged); the same bytes from every table.
    /// Activations and quantisation on load use [`Kernels::quantize_row`].
    ///
    /// # Panics
    /// On an unsupported type or a length mismatch.
    pub fn quantize_row_weights(&self, ty: GgmlType, x: &[f32], out: &mut [u8]) {
        self.quantize_row_weighted(ty, x, None, out)
    }

    /// [`Kernels::quantize_row_weights`] with an importance per value of the row (`weights`,
    /// `x.len()` of them, finite and non-negative: e.g. the mean square of the activation
    /// column each weight multiplies): the Q4_0, Q4_1, Q5_0 and Q5_1 searches minimise the
    /// squared error weighted by them, and keep ggml's reference bytes wherever those have
    /// the lower weighted error. Other types ignore the weights. `None` is the plain search.
    ///
    /// # Panics
    /// On an unsupported type or a length mismatch.
    pub fn quantize_row_weighted(
        &self,
        ty: GgmlType,
        x: &[f32],
        weights: Option<&[f32]>,
        out: &mut [u8],
    ) {
        use scalar::legacy_search as ls;
        let f: fn(&[f32], Option<&[f32]>, &mut [u8]) = match ty {
            GgmlType::Q4_0 => ls::quantize_row_q4_0,
            GgmlType::Q4_1 => ls::quantize_row_q4_1,
            GgmlType::Q5_0 => ls::quantize_row_q5_0,
            GgmlType::Q5_1 => ls::quantize_row_q5_1,
            _ => return self.quantize_row(ty, x, out),
        };
        assert_eq!(
            out.len(),
            row_size(ty, x.len()),
            "quantize_row_weights({ty}): output length for {} values",
            x.len()
        );
        if let Some(w) = weights {
            assert_eq!(w.len(), x.len(), "quantize_row_weighted({ty}): weights");
        }
        f(x, weights, out)
    }

    /// Dequantises (or converts) one row: `row.len() == row_size(ty, out.len())`.
    ///
    /// # Panics
    /// On an unsupported type or a length mismatch.
    pub fn dequantize_row(&self, ty: GgmlType, row: &[u8], out: &mut [f32]) {
        let ops = self.ops(ty);
        assert_eq!(
            row.len(),
            row_size(ty, out.len()),
            "dequantize_row({ty}): input length for {} values",
            out.len()
        );
        (ops.dequantize)(row, out)
    }

    /// Dot of one weight row (type `w`, `k` values) with one activation row (type
    /// `vec_dot_type(w)`). Quantised activation rows must come from [`Kernels::quantize_row`]
    /// (their values lie in -127..=127).
    ///
    /// # Panics
    /// On an unsupported type or a length mismatch.
    pub fn vec_dot(&self, w: GgmlType, k: usize, wrow: &[u8], arow: &[u8]) -> f32 {
        let f = self
            .ops(w)
            .vec_dot
            .unwrap_or_else(|| panic!("vec_dot: {w} is not a weight type"));
        assert_eq!(
            wrow.len(),
            row_size(w, k),
            "vec_dot({w}): weight row length for k={k}"
        );
        let at = Kernels::vec_dot_type(w);
        assert_eq!(
            arow.len(),
            row_size(at, k),
            "vec_dot({w}): activation row length for k={k}"
        );
        f(k, wrow, arow)
    }

    /// For `r in 0..nrows`, `t in 0..ntok`: `out[t * out_stride + r] = vec_dot(w row r, act row t)`.
    ///
    /// `wrows` holds `nrows` consecutive weight rows (`row_size(w, k)` bytes each), `a` holds
    /// `ntok` consecutive activation rows of type `vec_dot_type(w)`. Single-threaded: callers
    /// split the rows across threads. Output entries outside the `nrows` columns of each token
    /// are not touched.
    ///
    /// # Panics
    /// On an unsupported type, a length mismatch, or `out_stride < nrows` with `ntok > 1`.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        w: GgmlType,
        k: usize,
        wrows: &[u8],
        nrows: usize,
        a: &[u8],
        ntok: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let f = self
            .ops(w)
            .matmul
            .unwrap_or_else(|| panic!("matmul: {w} is not a weight type"));
        let arow = row_size(Kernels::vec_dot_type(w), k);
        checked_matmul(
            f,
            w,
            k,
            wrows,
            rows_size(w, k, nrows),
            nrows,
            a,
            arow,
            ntok,
            out,
            out_stride,
        );
    }

    /// Like [`Kernels::matmul`], with activation rows quantised to Q16 by
    /// [`Kernels::quantize_row_q16`] (see [`q16`]) instead of `vec_dot_type(w)`.
    ///
    /// # Panics
    /// If `w` has no Q16 matmul (see [`Kernels::supports_q16`]) or on a length mismatch.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_q16(
        &self,
        w: GgmlType,
        k: usize,
        wrows: &[u8],
        nrows: usize,
        a: &[u8],
        ntok: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let f = slot(w)
            .and_then(|s| self.types[s].matmul_q16)
            .unwrap_or_else(|| panic!("matmul_q16: {w} has no Q16 matmul"));
        checked_matmul(
            f,
            w,
            k,
            wrows,
            rows_size(w, k, nrows),
            nrows,
            a,
            q16::q16_row_size(k),
            ntok,
            out,
            out_stride,
        );
    }

    /// Like [`Kernels::matmul_q16`], with weights packed by [`x8::pack`]: `packed` holds
    /// `nrows / 8` whole groups (`nrows` a multiple of 8).
    ///
    /// # Panics
    /// If `w` has no x8 layout (see [`x8::supports`]), `nrows` is not a multiple of 8, or on a
    /// length mismatch.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_q16_x8(
        &self,
        w: GgmlType,
        k: usize,
        packed: &[u8],
        nrows: usize,
        a: &[u8],
        ntok: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let f = slot(w)
            .and_then(|s| self.types[s].matmul_q16_x8)
            .unwrap_or_else(|| panic!("matmul_q16_x8: {w} has no x8 layout"));
        let arow = q16::q16_row_size(k);
        checked_x8_matmul(f, w, k, packed, nrows, a, arow, ntok, out, out_stride);
    }

    /// Weight types [`Kernels::matmul_q16`] takes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
    /// Q6_K, MXFP4.
    pub fn supports_q16(w: GgmlType) -> bool {
        q16::supports(w)
    }

    /// Whether this table multiplies x8-packed weights of type `w` with A8 activations in
    /// SIMD code (see [`a8`]): Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and MXFP4 on x86. Elsewhere
    /// [`Kernels::matmul_a8_x8`] is the scalar reference, correct and slow.
    pub fn has_a8_x8(&self, w: GgmlType) -> bool {
        a8::supports(w) && a8::has_simd(self.isa)
    }

    /// Like [`Kernels::matmul_q16_x8`], with activation rows quantised to A8 by
    /// [`Kernels::quantize_row_a8`] (8-bit, see [`a8`]).
    ///
    /// # Panics
    /// If `w` has no A8 matmul (see [`a8::supports`]), `nrows` is not a multiple of 8, or on a
    /// length mismatch.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_a8_x8(
        &self,
        w: GgmlType,
        k: usize,
        packed: &[u8],
        nrows: usize,
        a: &[u8],
        ntok: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let f = slot(w)
            .and_then(|s| self.types[s].matmul_a8_x8)
            .unwrap_or_else(|| panic!("matmul_a8_x8: {w} has no A8 matmul"));
        let arow = a8::a8_row_size(k);
        checked_x8_matmul(f, w, k, packed, nrows, a, arow, ntok, out, out_stride);
    }

    /// The scalar reference of [`Kernels::matmul_a8_x8`] (for tests of the SIMD kernels).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_a8_x8_ref(
        w: GgmlType,
        k: usize,
        packed: &[u8],
        nrows: usize,
        a: &[u8],
        ntok: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        Kernels::scalar().matmul_a8_x8(w, k, packed, nrows, a, ntok, out, out_stride)
    }

    /// Quantise one activation row to A8 (`x.len()` a multiple of 32).
    pub fn quantize_row_a8(&self, x: &[f32], out: &mut [u8]) {
        assert_eq!(
            out.len(),
            a8::a8_row_size(x.len()),
            "quantize_row_a8: output length"
        );
        (self.quantize_a8)(x, out)
    }

    /// Quantise one activation row to Q16 (`x.len()` a multiple of 32).
    pub fn quantize_row_q16(&self, x: &[f32], out: &mut [u8]) {
        assert_eq!(
            out.len(),
            q16::q16_row_size(x.len()),
            "quantize_row_q16: output length"
        );
        (self.quantize_q16)(x, out)
    }

    /// `out = x / sqrt(mean(x^2) + eps) * weight`.
    pub fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        assert!(
            x.len() == weight.len() && x.len() == out.len(),
            "rms_norm: length mismatch"
        );
        (self.elem.rms_norm)(x, weight, eps, out)
    }

    /// `gate = silu(gate) * up`, `silu(x) = x / (1 + exp(-x))`.
    pub fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "silu_mul: length mismatch");
        (self.elem.silu_mul)(gate, up)
    }

    /// `gate = gelu_tanh(gate) * up`,
    /// `gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    pub fn gelu_tanh_mul(&self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "gelu_tanh_mul: length mismatch");
        (self.elem.gelu_tanh_mul)(gate, up)
    }

    /// `x = cap · tanh(x / cap)` in place (soft-capping, as Gemma 2 caps attention scores).
    /// `cap` must be positive and finite; `±inf` map to `±cap`, NaN stays NaN.
    pub fn softcap(&self, x: &mut [f32], cap: f32) {
        assert!(
            cap.is_finite() && cap > 0.0,
            "softcap: cap {cap} is not positive"
        );
        (self.elem.softcap)(x, cap)
    }

    /// In-place softmax, max-subtracted. An empty slice is left alone.
    pub fn softmax(&self, x: &mut [f32]) {
        if !x.is_empty() {
            (self.elem.softmax)(x)
        }
    }

    /// Softmax without the final division: `x = exp(x - m)` in place, where `m = max(x)`;
    /// returns `(m, sum(x))`. Attention over a key range split into parts uses it: each part's
    /// `(m, sum)` lets the parts be merged exactly (`softmax` is this, then `x /= sum`).
    /// An empty slice gives `(-inf, 0)`.
    pub fn softmax_unscaled(&self, x: &mut [f32]) -> (f32, f32) {
        if x.is_empty() {
            return (f32::NEG_INFINITY, 0.0);
        }
        (self.elem.softmax_unscaled)(x)
    }

    /// `acc += x`.
    pub fn add(&self, acc: &mut [f32], x: &[f32]) {
        assert_eq!(acc.len(), x.len(), "add: length mismatch");
        (self.elem.add)(acc, x)
    }

    /// `x *= s`.
    pub fn scale(&self, x: &mut [f32], s: f32) {
        (self.elem.scale)(x, s)
    }

    pub fn dot_f32(&self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
        (self.elem.dot_f32)(a, b)
    }

    pub fn dot_f32_f16(&self, a: &[f32], b: &[half::f16]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot_f32_f16: length mismatch");
        (self.elem.dot_f32_f16)(a, b)
    }

    /// `out += alpha * x`.
    pub fn axpy_f32(&self, out: &mut [f32], alpha: f32, x: &[f32]) {
        assert_eq!(out.len(), x.len(), "axpy_f32: length mismatch");
        (self.elem.axpy_f32)(out, alpha, x)
    }

    /// `out += alpha * x`.
    pub fn axpy_f16(&self, out: &mut [f32], alpha: f32, x: &[half::f16]) {
        assert_eq!(out.len(), x.len(), "axpy_f16: length mismatch");
        (self.elem.axpy_f16)(out, alpha, x)
    }

    /// Attention scores of `group` query heads against `len` keys: `out[h * len + j] =
    /// scale * q_h · k_j`, where `q` is `(group, hd)` and `k` is `(len, hd)` (f16, one key
    /// per row). Each key is read once for all the heads that share it (GQA).
    ///
    /// # Panics
    /// On a length mismatch (`hd` 0, `q` or `k` not whole rows, `out` not `group * len`).
    pub fn attn_scores_f16(
        &self,
        q: &[f32],
        hd: usize,
        k: &[half::f16],
        scale: f32,
        out: &mut [f32],
    ) {
        assert!(
            hd > 0 && q.len().is_multiple_of(hd) && k.len().is_multiple_of(hd),
            "attn_scores_f16: rows of {hd}"
        );
        assert_eq!(
            out.len(),
            q.len() / hd * (k.len() / hd),
            "attn_scores_f16: output length"
        );
        (self.elem.attn_scores_f16)(q, hd, k, scale, out)
    }

    /// Attention outputs of `group` heads: `out[h] = sum_j p[h * len + j] * v_j`, where `p`
    /// is `(group, len)` and `v` is `(len, hd)` (f16); `out` is `(group, hd)`, overwritten.
    ///
    /// # Panics
    /// On a length mismatch.
    pub fn attn_values_f16(&self, p: &[f32], hd: usize, v: &[half::f16], out: &mut [f32]) {
        assert!(
            hd > 0 && v.len().is_multiple_of(hd) && out.len().is_multiple_of(hd),
            "attn_values_f16: rows of {hd}"
        );
        assert_eq!(
            p.len(),
            out.len() / hd * (v.len() / hd),
            "attn_values_f16: weights length"
        );
        (self.elem.attn_values_f16)(p, hd, v, out)
    }

    /// The 4 × 8 dot products of a panel's columns: `out[r][c] = Σ_m p[m·stride + i0 + r] ·
    /// p[m·stride + j0 + c]` over the `p.len() / stride` rows `m` of the row-major `p` (the
    /// tile of a symmetric rank-k update, what error-feedback quantisation factors its
    /// second moments with). The sums run in `m` order per lane, so every table gives the
    /// same bits where the products are exact in f64.
    ///
    /// # Panics
    /// When `p` is not whole rows of `stride`, or the tile reaches past `stride`.
    pub fn panel_dots_f64(
        &self,
        p: &[f64],
        stride: usize,
        i0: usize,
        j0: usize,
        out: &mut PanelTile,
    ) {
        check_panel("panel_dots_f64", p.len(), stride, i0, j0, 8);
        (self.elem.panel_dots_f64)(p, stride, i0, j0, out)
    }

    /// [`Self::panel_dots_f64`] in f32 with a 4 × 16 tile: `out[r][c] = Σ_m p[m·stride + i0
    /// + r] · p[m·stride + j0 + c]` (a rank-k update's tile: calibration's second moments
    /// `Σ x xᵀ` over the rows `m` of token activations).
    ///
    /// # Panics
    /// When `p` is not whole rows of `stride`, or the tile reaches past `stride`.
    pub fn panel_dots_f32(
        &self,
        p: &[f32],
        stride: usize,
        i0: usize,
        j0: usize,
        out: &mut PanelTileF32,
    ) {
        check_panel("panel_dots_f32", p.len(), stride, i0, j0, 16);
        (self.elem.panel_dots_f32)(p, stride, i0, j0, out)
    }

    /// Converts with round-to-nearest-even (the same bits as `half::f16::from_f32`, NaNs aside).
    pub fn f32_to_f16(&self, x: &[f32], out: &mut [half::f16]) {
        assert_eq!(x.len(), out.len(), "f32_to_f16: length mismatch");
        (self.elem.f32_to_f16)(x, out)
    }
}

/// The bounds of a panel-dots call: `len` values in whole rows of `stride`, and a tile of 4
/// rows and `width` columns inside a row.
fn check_panel(name: &str, len: usize, stride: usize, i0: usize, j0: usize, width: usize) {
    assert!(
        stride > 0 && len.is_multiple_of(stride),
        "{name}: rows of {stride}"
    );
    assert!(
        i0 + 4 <= stride && j0 + width <= stride,
        "{name}: tile at ({i0}, {j0}) past {stride} columns"
    );
}

/// Bytes of `nrows` rows of `k` values of type `w`.
fn rows_size(w: GgmlType, k: usize, nrows: usize) -> usize {
    row_size(w, k)
        .checked_mul(nrows)
        .expect("matmul: weight size overflows")
}

/// [`checked_matmul`] on x8-packed weights: `nrows` whole groups of 8, `k` whole units.
#[allow(clippy::too_many_arguments)]
fn checked_x8_matmul(
    f: MatmulFn,
    w: GgmlType,
    k: usize,
    packed: &[u8],
    nrows: usize,
    a: &[u8],
    arow: usize,
    ntok: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(
        nrows.is_multiple_of(x8::ROWS),
        "x8 matmul: nrows {nrows} is not a multiple of {}",
        x8::ROWS
    );
    assert!(
        k.is_multiple_of(x8::unit_values(w)),
        "x8 matmul({w}): k={k} is not whole packed units"
    );
    let wsize = x8::packed_size(w, nrows, k);
    checked_matmul(
        f, w, k, packed, wsize, nrows, a, arow, ntok, out, out_stride,
    );
}

/// Check a matmul's lengths (programmer errors panic here, before any SIMD code runs) and call
/// `f`. `wsize` is the byte size the weights must have, `arow` that of one activation row.
#[allow(clippy::too_many_arguments)]
fn checked_matmul(
    f: MatmulFn,
    w: GgmlType,
    k: usize,
    wrows: &[u8],
    wsize: usize,
    nrows: usize,
    a: &[u8],
    arow: usize,
    ntok: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert_eq!(
        wrows.len(),
        wsize,
        "matmul({w}): weights for nrows={nrows}, k={k}"
    );
    let asize = arow
        .checked_mul(ntok)
        .expect("matmul: activation size overflows");
    assert_eq!(
        a.len(),
        asize,
        "matmul({w}): activations for ntok={ntok}, k={k}"
    );
    if nrows == 0 || ntok == 0 {
        return;
    }
    assert!(
        ntok == 1 || out_stride >= nrows,
        "matmul: out_stride {out_stride} < nrows {nrows}"
    );
    let need = (ntok - 1)
        .checked_mul(out_stride)
        .and_then(|n| n.checked_add(nrows))
        .expect("matmul: output size overflows");
    assert!(
        out.len() >= need,
        "matmul: output has {} floats, needs {need}",
        out.len()
    );
    f(MatmulArgs {
        k,
        w: wrows,
        nrows,
        a,
        ntok,
        out,
        out_stride,
    })
}
