//! How activations are quantised for matmuls with quantised weights: the user's choice
//! ([`ActQuant`]), the row format it gives each weight matrix ([`ActRows`]), and the one place
//! that quantises rows and runs the matching kernel (dense matmuls and experts alike).

use flowrt_dtype::GgmlType;
use flowrt_kernels::Kernels;
use flowrt_model::WeightMatrix;

/// How activations are quantised for matmuls with quantised weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ActQuant {
    /// 16-bit integers per block of 32 (see `flowrt_kernels::q16`): agrees with f32 reference
    /// math to rounding noise. The default.
    #[default]
    Q16,
    /// ggml's 8-bit activation types (Q8_0/Q8_1/Q8_K) on the file's row layout: less precise,
    /// and slower than Q16 on the repacked weights; for comparisons with ggml's numerics.
    Q8,
    /// 8-bit activations (`flowrt_kernels::a8`) for the repacked (x8) weights of the 4- and
    /// 5-bit types and MXFP4, Q16 for the rest: faster batches (prefill) on x86, at about
    /// ggml's precision. Opt-in.
    Q8x,
}

impl std::str::FromStr for ActQuant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "q16" => Ok(ActQuant::Q16),
            "q8" => Ok(ActQuant::Q8),
            "q8x" => Ok(ActQuant::Q8x),
            _ => Err(format!(
                "unknown activation quantisation `{s}` (use q16, q8 or q8x)"
            )),
        }
    }
}

impl std::fmt::Display for ActQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ActQuant::Q16 => "q16",
            ActQuant::Q8 => "q8",
            ActQuant::Q8x => "q8x",
        })
    }
}

/// The format of quantised activation rows held for a matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActRows {
    /// ggml's activation type for the weight type (`Kernels::vec_dot_type`).
    Ggml(GgmlType),
    Q16,
    /// Only for weights repacked into the x8 layout.
    A8,
}

impl ActRows {
    /// The rows for weights of type `ty` under `q`; `packed`: whether the matrix was
    /// repacked into the x8 layout.
    pub fn for_weight(q: ActQuant, kern: &Kernels, ty: GgmlType, packed: bool) -> ActRows {
        match q {
            ActQuant::Q8x if packed && kern.has_a8_x8(ty) => ActRows::A8,
            ActQuant::Q16 | ActQuant::Q8x if Kernels::supports_q16(ty) => ActRows::Q16,
            _ => ActRows::Ggml(Kernels::vec_dot_type(ty)),
        }
    }

    /// Bytes of one quantised row of `k` values.
    pub fn row_size(self, k: usize) -> usize {
        match self {
            ActRows::Q16 => flowrt_kernels::q16::q16_row_size(k),
            ActRows::A8 => flowrt_kernels::a8::a8_row_size(k),
            ActRows::Ggml(t) => flowrt_kernels::row_size(t, k),
        }
    }

    /// Quantises `x` into `out` ([`ActRows::row_size`] bytes).
    pub fn quantize(self, kern: &Kernels, x: &[f32], out: &mut [u8]) {
        match self {
            ActRows::Q16 => kern.quantize_row_q16(x, out),
            ActRows::A8 => kern.quantize_row_a8(x, out),
            ActRows::Ggml(t) => kern.quantize_row(t, x, out),
        }
    }

    /// `out` (`(m, c1 - c0)`) = rows `c0..c1` of `w` times the `m` rows `act` in this format;
    /// `packed`: `w` in the x8 layout, if it was repacked (`c0` is then a multiple of 8).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        self,
        kern: &Kernels,
        w: &WeightMatrix,
        packed: Option<&[u8]>,
        c0: usize,
        c1: usize,
        act: &[u8],
        m: usize,
        out: &mut [f32],
    ) {
        let (k, nr) = (w.cols, c1 - c0);
        let out = &mut out[..m * nr];
        // A repacked matrix's rows `c0..c1` (whole groups of 8).
        let packed = packed.map(|p| {
            let prb = flowrt_kernels::x8::packed_row_bytes(w.dtype, k);
            &p[c0 * prb..c1 * prb]
        });
        match (self, packed) {
            (ActRows::Q16, Some(p)) => kern.matmul_q16_x8(w.dtype, k, p, nr, act, m, out, nr),
            (ActRows::A8, Some(p)) => kern.matmul_a8_x8(w.dtype, k, p, nr, act, m, out, nr),
            (ActRows::Q16, None) => {
                kern.matmul_q16(w.dtype, k, w.rows_bytes(c0, c1), nr, act, m, out, nr)
            }
            (ActRows::A8, None) => {
                unreachable!("A8 rows are chosen only for repacked weights (ActRows::for_weight)")
            }
            (ActRows::Ggml(_), _) => {
                kern.matmul(w.dtype, k, w.rows_bytes(c0, c1), nr, act, m, out, nr)
            }
        }
    }
}
