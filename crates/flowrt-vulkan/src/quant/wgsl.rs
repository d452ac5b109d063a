//! WGSL source of the quantised kernels, generated per weight type.
//!
//! Every kernel is one type's dequantisation snippet plus a body shared by all types (the
//! matmul, in any [`Shape`], or the embedding lookup).
//!
//! # Steps
//!
//! A row of weights is a run of blocks (`BLOCK` values in `BSIZE` bytes; F32, F16 and BF16 use
//! a virtual block of 32 values), read 32 values at a time: `deq(o, j)` returns the values
//! `32 j..32 j + 32` of the block at byte `o` of the weight buffer, in column order, as 8
//! vec4s (`j` is 0 for 32-value blocks, 0..8 for the 256-value k-quant blocks). Weights are
//! `array<u32>`: bytes are read through words with shifts. `ld`/`ld4` read one/four words at
//! any byte offset (where every offset is known to be 4-byte aligned, plain word loads).
//!
//! Loads are what CPU emulations (lavapipe) pay for most: each one becomes a loop over the
//! SIMD lanes. So `deq` loads each word once per 32 values, and the matmul body reuses every
//! loaded activation for `rpt` rows and every dequantised weight for `nt` tokens.

use flowrt_dtype::GgmlType;

/// What the kernels need to know about one weight type.
pub(crate) struct TypeInfo {
    /// Values per block (32 for the float types' virtual blocks).
    pub block: u32,
    /// Bytes per block.
    pub bsize: u32,
    /// Whether rows may end inside a block (F32, F16, BF16 rows of any length): values and
    /// activations past the row's end are masked to zero.
    pub float: bool,
    /// The WGSL of `fn deq(o: u32, j: u32) -> array<vec4<f32>, 8>`.
    pub deq: String,
}

impl TypeInfo {
    /// Whether every word the snippet reads is 4-byte aligned, given rows of `row_bytes`.
    pub fn aligned(&self, row_bytes: u32) -> bool {
        self.bsize.is_multiple_of(4) && row_bytes.is_multiple_of(4)
    }
}

const C: [&str; 4] = ["x", "y", "z", "w"];

/// `fn deq` with the statements `pre` and the 8 vec4s `elem(0..8)` (values `4k..4k + 4`).
fn deq_fn(pre: &str, elem: impl Fn(usize) -> String) -> String {
    let elems: Vec<String> = (0..8).map(elem).collect();
    format!(
        "
fn deq(o: u32, j: u32) -> array<vec4<f32>, 8> {{
{pre}
    return array<vec4<f32>, 8>(
        {});
}}
",
        elems.join(",\n        ")
    )
}

/// The 4-byte group `k % 4` of the words `lo` (k < 4) or `hi` (k >= 4).
fn word(k: usize, lo: &str, hi: &str) -> String {
    format!("{}.{}", if k < 4 { lo } else { hi }, C[k % 4])
}

pub(crate) fn info(ty: GgmlType) -> Option<TypeInfo> {
    use GgmlType::*;
    let (block, bsize, float, deq) = match ty {
        // Virtual blocks of 32 values: 8 words of 4 values, 4 words of 8 halves.
        F32 => (
            32,
            128,
            true,
            deq_fn("", |k| format!("bitcast<vec4<f32>>(ld4(o + {}u))", 16 * k)),
        ),
        F16 | BF16 => {
            let f = if ty == F16 { "h4" } else { "b4" };
            (
                32,
                64,
                true,
                deq_fn(
                    "    let a = ld4(o);
    let b = ld4(o + 16u);
    let c = ld4(o + 32u);
    let e = ld4(o + 48u);",
                    |k| {
                        let g = ["a", "b", "c", "e"][k / 2];
                        if k.is_multiple_of(2) {
                            format!("{f}({g}.x, {g}.y)")
                        } else {
                            format!("{f}({g}.z, {g}.w)")
                        }
                    },
                ),
            )
        }
        // d (f16) | qs[16]: value l < 16 the low nibble of qs[l], value l + 16 its high one.
        Q4_0 => (
            32,
            18,
            false,
            deq_fn(
                "    let d = f16at(o);
    let q = ld4(o + 2u);",
                |k| {
                    let sh = if k < 4 { "" } else { " >> 4u" };
                    format!("d * (nib(q.{}{sh}) - 8.0)", C[k % 4])
                },
            ),
        ),
        // d, m (f16) | qs[16]
        Q4_1 => (
            32,
            20,
            false,
            deq_fn(
                "    let dm = unpack2x16float(ld(o));
    let q = ld4(o + 4u);",
                |k| {
                    let sh = if k < 4 { "" } else { " >> 4u" };
                    format!("dm.x * nib(q.{}{sh}) + dm.y", C[k % 4])
                },
            ),
        ),
        // d (f16) | qh (bit l: fifth bit of value l) | qs[16]
        Q5_0 => (
            32,
            22,
            false,
            deq_fn(
                "    let d = f16at(o);
    let h = ld(o + 2u);
    let q = ld4(o + 6u);",
                |k| format!("d * (u8x4({}) - 16.0)", q5(k)),
            ),
        ),
        // d, m (f16) | qh | qs[16]
        Q5_1 => (
            32,
            24,
            false,
            deq_fn(
                "    let dm = unpack2x16float(ld(o));
    let h = ld(o + 4u);
    let q = ld4(o + 8u);",
                |k| format!("dm.x * u8x4({}) + dm.y", q5(k)),
            ),
        ),
        // d (f16) | qs[32] (i8)
        Q8_0 => (
            32,
            34,
            false,
            deq_fn(
                "    let d = f16at(o);
    let q = ld4(o + 2u);
    let r = ld4(o + 18u);",
                |k| format!("d * i8x4({})", word(k, "q", "r")),
            ),
        ),
        // d, dmin (f16) | scales[12] | qs[128]: sub-blocks 2c and 2c + 1 share qs[32c..32c + 32]
        // (low nibbles, high nibbles); value = d sc_j q - dmin m_j.
        Q4K => (
            256,
            144,
            false,
            deq_fn(
                "    let dm = unpack2x16float(ld(o));
    let sm = scmin(o + 4u, j);
    let ds = dm.x * sm.x;
    let mn = dm.y * sm.y;
    let sh = (j & 1u) * 4u;
    let qo = o + 16u + 32u * (j >> 1u);
    let q = ld4(qo);
    let r = ld4(qo + 16u);",
                |k| format!("ds * nib({} >> sh) - mn", word(k, "q", "r")),
            ),
        ),
        // d, dmin | scales[12] | qh[32] (bit j of qh[l]: fifth bit of value l of sub-block j)
        // | qs[128] as Q4_K.
        Q5K => (
            256,
            176,
            false,
            deq_fn(
                "    let dm = unpack2x16float(ld(o));
    let sm = scmin(o + 4u, j);
    let ds = dm.x * sm.x;
    let mn = dm.y * sm.y;
    let sh = (j & 1u) * 4u;
    let qo = o + 48u + 32u * (j >> 1u);
    let q = ld4(qo);
    let r = ld4(qo + 16u);
    let h = ld4(o + 16u);
    let g = ld4(o + 32u);",
                |k| {
                    format!(
                        "ds * u8x4((({} >> sh) & 0x0f0f0f0fu) | ((({} >> j) & 0x01010101u) << 4u)) - mn",
                        word(k, "q", "r"),
                        word(k, "h", "g")
                    )
                },
            ),
        ),
        // ql[128] | qh[64] | scales[16] (i8) | d (f16). Value 128 hf + 32 s + l: low 4 bits
        // nibble s / 2 of ql[64 hf + 32 (s % 2) + l], high 2 bits bits 2s of qh[32 hf + l];
        // scale scales[value / 16].
        Q6K => (
            256,
            210,
            false,
            deq_fn(
                "    let hf = j >> 2u;
    let s = j & 3u;
    let lo = o + 64u * hf + 32u * (s & 1u);
    let sl = (s >> 1u) * 4u;
    let hq = o + 128u + 32u * hf;
    let sh = 2u * s;
    let q = ld4(lo);
    let r = ld4(lo + 16u);
    let h = ld4(hq);
    let g = ld4(hq + 16u);
    let d = f16at(o + 208u);
    let sc = ld(o + 192u + 2u * j);
    let s0 = d * f32(bitcast<i32>(sc << 24u) >> 24u);
    let s1 = d * f32(bitcast<i32>(sc << 16u) >> 24u);",
                |k| {
                    format!(
                        "{} * (u8x4((({} >> sl) & 0x0f0f0f0fu) | ((({} >> sh) & 0x03030303u) << 4u)) - 32.0)",
                        if k < 4 { "s0" } else { "s1" },
                        word(k, "q", "r"),
                        word(k, "h", "g")
                    )
                },
            ),
        ),
        // e (E8M0) | qs[16] as Q4_0's: value l < 16 the low nibble of qs[l], l + 16 its high
        // one; value = 2^(e - 128) (exact, subnormal for e < 2, as ggml) times the doubled E2M1
        // code.
        Mxfp4 => (
            32,
            17,
            false,
            deq_fn(
                "    let e = ld(o) & 255u;
    let d = bitcast<f32>(select(0x00200000u << e, (e - 1u) << 23u, e >= 2u));
    let q = ld4(o + 1u);",
                |k| {
                    let sh = if k < 4 { "" } else { " >> 4u" };
                    format!("d * fp4(q.{}{sh})", C[k % 4])
                },
            ),
        ),
        _ => return None,
    };
    Some(TypeInfo {
        block,
        bsize,
        float,
        deq,
    })
}

/// Q5_0/Q5_1 values `4k..4k + 4` of the block as bytes 0..=31 (nibbles `q`, fifth bits `h`).
fn q5(k: usize) -> String {
    let (sh, bit) = if k < 4 {
        ("", 4 * k)
    } else {
        (" >> 4u", 16 + 4 * (k - 4))
    };
    format!(
        "((q.{}{sh}) & 0x0f0f0f0fu) | (spread4(h >> {bit}u) << 4u)",
        C[k % 4]
    )
}

// ---------------------------------------------------------------------------------------------
// Shared parts.

/// Weight buffer, byte helpers and the type's `deq`. `aligned`: every offset `ld`/`ld4` see is
/// a multiple of 4.
fn common(t: &TypeInfo, aligned: bool) -> String {
    let ld = if aligned {
        "fn ld(off: u32) -> u32 {
    return w[off >> 2u];
}

fn ld4(off: u32) -> vec4<u32> {
    let i = off >> 2u;
    return vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
}"
    } else {
        // The next word is shifted in two steps so that an aligned offset (a shift of 32)
        // gives 0. Weight buffers carry 4 bytes of padding, so the word after the last exists.
        "fn ld(off: u32) -> u32 {
    let i = off >> 2u;
    let s = (off & 3u) * 8u;
    return (w[i] >> s) | ((w[i + 1u] << (31u - s)) << 1u);
}

fn ld4(off: u32) -> vec4<u32> {
    let i = off >> 2u;
    let s = vec4<u32>((off & 3u) * 8u);
    let w0 = w[i];
    let w1 = w[i + 1u];
    let w2 = w[i + 2u];
    let w3 = w[i + 3u];
    let w4 = w[i + 4u];
    return (vec4<u32>(w0, w1, w2, w3) >> s)
        | ((vec4<u32>(w1, w2, w3, w4) << (vec4<u32>(31u) - s)) << vec4<u32>(1u));
}"
    };
    format!(
        "
const BLOCK: u32 = {block}u;
const BSIZE: u32 = {bsize}u;
// 32-value steps per block.
const SPB: u32 = {spb}u;

@group(0) @binding(0) var<storage, read> w: array<u32>;

{ld}

// The f16 at the even offset `off`.
fn f16at(off: u32) -> f32 {{
    return unpack2x16float(w[off >> 2u] >> ((off & 2u) * 8u)).x;
}}

// The four bytes of `v` as floats.
fn u8x4(v: u32) -> vec4<f32> {{
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));
}}

// The low nibbles of the four bytes of `v`.
fn nib(v: u32) -> vec4<f32> {{
    return u8x4(v & 0x0f0f0f0fu);
}}

// The four bytes of `v` as signed values.
fn i8x4(v: u32) -> vec4<f32> {{
    let s = bitcast<vec4<i32>>(vec4<u32>(v) << vec4<u32>(24u, 16u, 8u, 0u));
    return vec4<f32>(s >> vec4<u32>(24u));
}}

// Two words of two f16 (or bf16) each as four floats.
fn h4(a: u32, b: u32) -> vec4<f32> {{
    return vec4<f32>(unpack2x16float(a), unpack2x16float(b));
}}
fn b4(a: u32, b: u32) -> vec4<f32> {{
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u));
}}

// The low nibbles of the four bytes of `v` as E2M1 codes, doubled (0, 1, 2, 3, 4, 6, 8, 12
// and their negatives for codes 8..16): 0 and 1 for exponent 0, else (2 + m) << (e - 1).
fn fp4(v: u32) -> vec4<f32> {{
    let c = (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
    let e = (c >> vec4<u32>(1u)) & vec4<u32>(3u);
    let m = c & vec4<u32>(1u);
    let mag = vec4<f32>(select((vec4<u32>(2u) + m) << (max(e, vec4<u32>(1u)) - vec4<u32>(1u)), m, e == vec4<u32>(0u)));
    return select(mag, -mag, (c & vec4<u32>(8u)) != vec4<u32>(0u));
}}

// Bits 0..4 of `v` moved to bit 0 of bytes 0..4.
fn spread4(v: u32) -> u32 {{
    return (v & 1u) | ((v & 2u) << 7u) | ((v & 4u) << 14u) | ((v & 8u) << 21u);
}}

// Scale and min (6 bits each) of sub-block j of a Q4_K/Q5_K block whose 12 packed bytes start
// at `s`: bytes 0..4 hold the low 6 bits of scales 0..4, bytes 4..8 those of mins 0..4; for
// j >= 4, byte j + 4 holds the low 4 bits (scale in the low nibble, min in the high one) and
// the top 2 bits of bytes j - 4 (scale) and j (min) the high 2 bits.
fn scmin(s: u32, j: u32) -> vec2<f32> {{
    let sh = 8u * (j & 3u);
    let x0 = (ld(s) >> sh) & 255u;
    let x1 = (ld(s + 4u) >> sh) & 255u;
    let x2 = (ld(s + 8u) >> sh) & 255u;
    let hi = j >= 4u;
    let sc = select(x0 & 63u, (x2 & 15u) | ((x0 >> 6u) << 4u), hi);
    let mn = select(x1 & 63u, (x2 >> 4u) | ((x1 >> 6u) << 4u), hi);
    return vec2<f32>(f32(sc), f32(mn));
}}
{deq}",
        block = t.block,
        bsize = t.bsize,
        spb = t.block / 32,
        deq = t.deq,
    )
}

/// How a matmul kernel splits its work: a workgroup of 64 threads in `64 / tpr` row groups;
/// the `tpr` threads of a group split the row's 32-value steps and add their sums through
/// workgroup memory; each thread computes `rpt` rows x `nt` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Threads per row group (1, 2, 4, ..., 64).
    pub tpr: u32,
    /// Rows per thread.
    pub rpt: u32,
    /// Tokens per thread (workgroup z: tokens `nt z..nt z + nt`).
    pub nt: u32,
}

/// Which expert form a matmul kernel takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Ids {
    /// A plain matmul over the step's tokens.
    None,
    /// One (token, slot) pair per workgroup layer `z`, its expert read from `ids[p]`; needs
    /// `nt == 1`.
    PerPair,
    /// The pairs grouped by expert: workgroup layer `z` takes tile `z` of the step's tile list
    /// (`tiles[0]` tiles, then `(expert, s0, s1)` each), the slots `perm[s0..min(s0 + nt,
    /// s1)]` of one expert, so each dequantised weight serves up to `nt` pairs.
    Grouped,
}

const ID_FIELDS: &str = "
    k: u32,
    x_div: u32,
    e0: u32,
    ne: u32,";

/// Threads per matmul workgroup.
pub(crate) const WG: u32 = 64;

impl Shape {
    /// Rows per workgroup.
    pub fn rows_per_group(&self) -> u32 {
        WG / self.tpr * self.rpt
    }

    /// Whether kernels can be built in this shape: `tpr` a power of two up to 64, at most
    /// 128 accumulators per thread, and at most 64 where threads add their sums through
    /// workgroup memory (16 KiB).
    pub fn valid(&self) -> bool {
        self.tpr.is_power_of_two()
            && self.tpr <= WG
            && (1..=16).contains(&self.rpt)
            && (1..=64).contains(&self.nt)
            && self.rpt * self.nt <= if self.tpr > 1 { 64 } else { 128 }
    }

    /// This shape, or a copy with rows split over more threads (doubling `tpr`; first halving
    /// `rpt` where the sums would not fit workgroup memory) until `rows` rows make at least
    /// `min_groups` workgroups or `tpr` reaches 64.
    pub fn spread(self, rows: u32, min_groups: u32) -> Shape {
        let mut s = self;
        while rows.div_ceil(s.rows_per_group()) < min_groups && s.tpr < WG {
            if s.rpt * s.nt > 64 && s.rpt > 1 {
                s.rpt /= 2;
            } else if s.rpt * s.nt > 64 {
                break;
            } else {
                s.tpr *= 2;
            }
        }
        s
    }
}

/// `y[t * y_stride + y_col0 + r] = sum_k W[r, k] x[t * x_stride + k]`, in `shape`. `xvec4`:
/// the activations are read as vec4s (`x_stride` a multiple of 4).
///
/// `ids`: the expert forms (`matmul_id`, see [`Ids`]). The weight buffer holds `ne` experts'
/// matrices of `rows` rows each, experts `e0..e0 + ne` of a stack; the kernel runs over the
/// step's `n_tok * k` (token, slot) pairs `p`, each reading its expert's rows (a pair whose
/// expert lies in another chunk does nothing) and the activation row `p / x_div`, and writing
/// row `p` of `y`: `y[p * y_stride + r] = sum_k W_ids[p][r, k] x[(p / x_div) * x_stride + k]`.
/// Only the chosen experts' rows are read.
pub(crate) fn matmul(ty: &TypeInfo, aligned: bool, xvec4: bool, shape: Shape, ids: Ids) -> String {
    let Shape { tpr, rpt, nt } = shape;
    assert!(shape.valid(), "{shape:?}");
    assert!(
        ids != Ids::PerPair || nt == 1,
        "the per-pair expert matmul takes one pair per thread: {shape:?}"
    );
    let id = ids != Ids::None;
    let grouped = ids == Ids::Grouped;
    let rg = WG / tpr;
    let mut s = common(ty, aligned);
    let (xtype, xv) = if xvec4 {
        ("array<vec4<f32>>", "x[o >> 2u]")
    } else {
        (
            "array<f32>",
            "vec4<f32>(x[o], x[o + 1u], x[o + 2u], x[o + 3u])",
        )
    };
    let msk = if ty.float {
        "select(vec4<f32>(0.0), v, vec4<u32>(c) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(mp.cols))"
    } else {
        "v"
    };
    let (id_fields, id_binding) = match ids {
        Ids::None => ("", ""),
        Ids::PerPair => (
            ID_FIELDS,
            "
@group(0) @binding(5) var<storage, read> ids: array<u32>;",
        ),
        Ids::Grouped => (
            ID_FIELDS,
            "
@group(0) @binding(5) var<storage, read> perm: array<u32>;
@group(0) @binding(6) var<storage, read> tiles: array<u32>;",
        ),
    };
    s.push_str(&format!(
        "
struct Mat {{
    rows: u32,
    cols: u32,
    row_bytes: u32,
    x_stride: u32,
    y_stride: u32,
    y_col0: u32,
    n_sel: u32,
    pad: u32,{id_fields}
}}
struct Step {{
    n_tok: u32,
    n_out: u32,
    p0: u32,
    p1: u32,
}}
@group(0) @binding(1) var<storage, read> x: {xtype};
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> mp: Mat;
@group(0) @binding(4) var<uniform> sp: Step;{id_binding}

// Four activations from float `o` (a multiple of 4 when read as vec4s).
fn xv(o: u32) -> vec4<f32> {{
    return {xv};
}}

// `v` at columns c..c + 4, zero past the row's end (float types: rows end inside a step).
fn msk(v: vec4<f32>, c: u32) -> vec4<f32> {{
    return {msk};
}}
"
    ));
    if tpr > 1 {
        s.push_str(&format!(
            "\nvar<workgroup> red: array<f32, {}>;\n",
            WG * rpt * nt
        ));
    }
    let mut b = String::new();
    b.push_str(&format!(
        "
@compute @workgroup_size({WG})
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
    let lane = lid % {tpr}u;
    let grp = lid / {tpr}u;
    let r0 = ((wid.y * nwg.x + wid.x) * {rg}u + grp) * {rpt}u;
    // Rows and tokens past the end are computed on the last ones and not written.
    let rl = max(mp.rows, 1u) - 1u;
",
    ));
    if grouped {
        // Tile `wid.z` of the step's list: expert `e`, its slots `perm[s0..min(s0 + nt, s1)]`.
        // A workgroup past the list's end, or whose expert another chunk holds, does nothing.
        b.push_str(
            "    let nti = tiles[0];
    let tz = min(wid.z, max(nti, 1u) - 1u);
    let e = tiles[1u + 3u * tz];
    let s0 = tiles[2u + 3u * tz];
    // (No slot past the step's pairs, whatever the list holds.)
    let s1 = min(tiles[3u + 3u * tz], sp.n_tok * mp.k);
    let ok = wid.z < nti && e >= mp.e0 && e < mp.e0 + mp.ne;
    let eb = select(0u, e - mp.e0, ok) * mp.rows;
    let sl = max(s1, 1u) - 1u;
",
        );
    } else {
        b.push_str(&format!(
            "    let n = {n};
    let t0 = wid.z * {nt}u;
    let tl = max(n, 1u) - 1u;
",
            n = if id {
                "sp.n_tok * mp.k"
            } else {
                "select(sp.n_out, sp.n_tok, mp.n_sel == 0u)"
            }
        ));
    }
    if ids == Ids::PerPair {
        // The pair's expert, and whether this chunk holds it (the same for the whole
        // workgroup: one pair per workgroup z).
        b.push_str(
            "    let e = ids[min(t0, tl)];
    let ok = e >= mp.e0 && e < mp.e0 + mp.ne;
    let eb = select(0u, e - mp.e0, ok) * mp.rows;
",
        );
    }
    let (eb, ok) = if id { ("eb + ", " && ok") } else { ("", "") };
    for r in 0..rpt {
        b.push_str(&format!(
            "    let rb{r} = ({eb}min(r0 + {r}u, rl)) * mp.row_bytes;\n"
        ));
    }
    for t in 0..nt {
        let xrow = match ids {
            Ids::None => format!("min(t0 + {t}u, tl)"),
            Ids::PerPair => format!("(min(t0 + {t}u, tl) / mp.x_div)"),
            Ids::Grouped => {
                b.push_str(&format!("    let p{t} = perm[min(s0 + {t}u, sl)];\n"));
                format!("(p{t} / mp.x_div)")
            }
        };
        b.push_str(&format!("    let xo{t} = {xrow} * mp.x_stride;\n"));
        for r in 0..rpt {
            b.push_str(&format!("    var a{r}_{t} = 0.0;\n"));
        }
    }
    // A thread whose rows all lie past the end does no work (it still meets the barrier).
    b.push_str(&format!(
        "    let steps = select(0u, (mp.cols + 31u) / 32u, r0 < mp.rows{ok});
    for (var st = lane; st < steps; st += {tpr}u) {{
        let bo = (st / SPB) * BSIZE;
        let j = st % SPB;
        let c = st * 32u;
"
    ));
    for r in 0..rpt {
        b.push_str(&format!("        let w{r} = deq(rb{r} + bo, j);\n"));
    }
    for i in 0..8 {
        b.push_str(&format!(
            "        {{\n            let ci = c + {}u;\n",
            4 * i
        ));
        for t in 0..nt {
            b.push_str(&format!(
                "            let x{t} = msk(xv(xo{t} + ci), ci);\n"
            ));
        }
        for r in 0..rpt {
            let wv = if ty.float {
                format!("msk(w{r}[{i}], ci)")
            } else {
                format!("w{r}[{i}]")
            };
            if ty.float {
                b.push_str(&format!("            let v{r} = {wv};\n"));
            }
            for t in 0..nt {
                let v = if ty.float {
                    format!("v{r}")
                } else {
                    wv.clone()
                };
                b.push_str(&format!("            a{r}_{t} += dot({v}, x{t});\n"));
            }
        }
        b.push_str("        }\n");
    }
    b.push_str("    }\n");
    // Row `t` of this thread's tokens (or slots) in `y`, and whether it exists.
    let live = if grouped { "s0 + " } else { "t0 + " };
    let lim = if grouped { "s1" } else { "n" };
    let write = |r: u32, t: u32, v: &str| {
        let yr = if grouped {
            format!("p{t}")
        } else {
            format!("(t0 + {t}u)")
        };
        format!(
            "        if (r0 + {r}u < mp.rows && {live}{t}u < {lim}{ok}) {{
            y[{yr} * mp.y_stride + mp.y_col0 + r0 + {r}u] = {v};
        }}
"
        )
    };
    if tpr == 1 {
        b.push_str("    {\n");
        for r in 0..rpt {
            for t in 0..nt {
                b.push_str(&write(r, t, &format!("a{r}_{t}")));
            }
        }
        b.push_str("    }\n");
    } else {
        let rn = rpt * nt;
        for r in 0..rpt {
            for t in 0..nt {
                b.push_str(&format!(
                    "    red[lid * {rn}u + {}u] = a{r}_{t};\n",
                    r * nt + t
                ));
            }
        }
        if grouped {
            let ps: Vec<String> = (0..nt).map(|t| format!("p{t}")).collect();
            b.push_str(&format!(
                "    var pp = array<u32, {nt}>({});\n",
                ps.join(", ")
            ));
        }
        let yt = if grouped { "pp[t]" } else { "(t0 + t)" };
        b.push_str(&format!(
            "    workgroupBarrier();
    let first = grp * {tpr}u;
    for (var e = lane; e < {rn}u; e += {tpr}u) {{
        var sum = 0.0;
        for (var i = 0u; i < {tpr}u; i++) {{
            sum += red[(first + i) * {rn}u + e];
        }}
        let r = e / {nt}u;
        let t = e % {nt}u;
        if (r0 + r < mp.rows && {live}t < {lim}{ok}) {{
            y[{yt} * mp.y_stride + mp.y_col0 + r0 + r] = sum;
        }}
    }}
"
        ));
    }
    b.push_str("}\n");
    s.push_str(&b);
    s
}

/// Threads of the embedding lookup per workgroup (one workgroup per token).
pub(crate) const EMB_WG: u32 = 64;

/// Embedding lookup: workgroup `y * num_workgroups.x + x` takes token `t`; if its row lies in
/// this chunk, the workgroup's threads stride over the row's 32-value steps and write them
/// scaled.
pub(crate) fn embed(ty: &TypeInfo, aligned: bool) -> String {
    let mut s = common(ty, aligned);
    let puts: String = (0..8)
        .map(|i| format!("        put(v[{i}], xo, c + {}u);\n", 4 * i))
        .collect();
    s.push_str(&format!(
        "
struct Emb {{
    rows: u32,
    cols: u32,
    row_bytes: u32,
    row0: u32,
    scale: f32,
    p0: u32,
    p1: u32,
    p2: u32,
}}
struct Step {{
    n_tok: u32,
    n_out: u32,
    p0: u32,
    p1: u32,
}}
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<uniform> ep: Emb;
@group(0) @binding(4) var<uniform> sp: Step;

fn put(v: vec4<f32>, o: u32, c: u32) {{
    let s = v * ep.scale;
    if (c + 3u < ep.cols) {{
        x[o + c] = s.x;
        x[o + c + 1u] = s.y;
        x[o + c + 2u] = s.z;
        x[o + c + 3u] = s.w;
    }} else {{
        for (var i = 0u; i < 4u; i++) {{
            if (c + i < ep.cols) {{
                x[o + c + i] = s[i];
            }}
        }}
    }}
}}

@compute @workgroup_size({EMB_WG})
fn main(@builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
    let t = wid.y * nwg.x + wid.x;
    if (t >= sp.n_tok) {{
        return;
    }}
    let tok = tokens[t];
    if (tok < ep.row0 || tok - ep.row0 >= ep.rows) {{
        return;
    }}
    let rb = (tok - ep.row0) * ep.row_bytes;
    let steps = (ep.cols + 31u) / 32u;
    let xo = t * ep.cols;
    for (var st = lid; st < steps; st += {EMB_WG}u) {{
        let v = deq(rb + (st / SPB) * BSIZE, st % SPB);
        let c = st * 32u;
{puts}    }}
}}
"
    ));
    s
}
