//! AVX2 + FMA + F16C table: quantised tiles (maddubs), float-weight tiles, Q8 quantisation.
//! Q5_0, Q5_1 and the k-quants keep the scalar reference for the ggml-style (Q8_0/Q8_1/Q8_K
//! activation) `vec_dot`/`matmul` and for quantisation; their fast path is the Q16 one
//! (`q16.rs`, `q16k.rs`).

use core::arch::x86_64::*;

use super::quant::{dispatch_tile, drive, TileShape};
use crate::blocks::{f32_to_f16, BlockQ8_0, BlockQ8_1, QK};
use crate::{slot, Kernels, MatmulArgs};
use flowrt_dtype::GgmlType;

/// Builds the AVX2 table.
///
/// # Safety
/// The host must support AVX2, FMA and F16C: the table's functions are compiled for them.
pub(super) unsafe fn build() -> Kernels {
    let mut t = crate::scalar::table();
    t.isa = crate::Isa::Avx2;
    tiles::install(&mut t);
    install_common(&mut t);
    t
}

/// Entries shared by every x86 table (AVX-512 hosts have AVX2 too).
pub(super) fn install_common(t: &mut Kernels) {
    let s = |ty| slot(ty).expect("slot");
    t.types[s(GgmlType::Q8_0)].quantize = quantize_row_q8_0;
    t.types[s(GgmlType::Q8_1)].quantize = quantize_row_q8_1;
    t.types[s(GgmlType::F32)].matmul = Some(matmul_f32);
    t.types[s(GgmlType::F16)].matmul = Some(matmul_f16);
    t.types[s(GgmlType::BF16)].matmul = Some(matmul_bf16);
    t.types[s(GgmlType::F32)].vec_dot = Some(vec_dot_f32);
    t.types[s(GgmlType::F16)].vec_dot = Some(vec_dot_f16);
    t.types[s(GgmlType::BF16)].vec_dot = Some(vec_dot_bf16);
    super::elem::install(t);
    super::search::install(t);
}

/// `acc + sum of 4 adjacent u * a` per i32 lane; `u <= 15` keeps `maddubs` from saturating.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn mul_sum_u8_i8_acc(acc: __m256i, u: __m256i, a: __m256i) -> __m256i {
    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
    _mm256_add_epi32(acc, p)
}

/// `sum of 4 adjacent w * a` per i32 lane, as `|w| * (a * sign(w))` (exact for `a != -128`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn mul_sum_i8_i8(w: __m256i, a: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

mod tiles {
    use super::{mul_sum_i8_i8, mul_sum_u8_i8_acc};
    super::super::quant::x86_quant_kernels!(
        features: "avx2,fma,f16c",
        shape: TileShape { decode_rows: 3, prefill_rows: 2, prefill_toks: 4 }
    );
}

// ---------------------------------------------------------------------------------------------
// Float weights (F32, F16, BF16) times f32 activations.

const KIND_F32: u8 = 0;
const KIND_F16: u8 = 1;
const KIND_BF16: u8 = 2;

/// Raw view of a float matmul; same contract as `quant::Tile` (rows/tokens in range).
struct FTile {
    w: *const u8,
    wstride: usize,
    a: *const f32,
    k: usize,
    out: *mut f32,
    out_stride: usize,
}

/// 8 weights at element `i` of the row at `p`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<const KIND: u8>(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees elements i..i + 8 exist.
    unsafe {
        match KIND {
            KIND_F32 => _mm256_loadu_ps(p.cast::<f32>().add(i)),
            KIND_F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i).cast())),
            _ => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i).cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            }
        }
    }
}

/// Weight element `i` of the row at `p`.
#[inline]
unsafe fn load1<const KIND: u8>(p: *const u8, i: usize) -> f32 {
    // SAFETY: the caller guarantees element i exists.
    unsafe {
        match KIND {
            KIND_F32 => p.cast::<f32>().add(i).read_unaligned(),
            KIND_F16 => half::f16::from_bits(p.cast::<u16>().add(i).read_unaligned()).to_f32(),
            _ => f32::from_bits((p.cast::<u16>().add(i).read_unaligned() as u32) << 16),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ftile<const KIND: u8, const R: usize, const T: usize>(g: &FTile, r0: usize, t0: usize) {
    let k8 = g.k & !7;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    // SAFETY (whole body): rows r0..r0+R and tokens t0..t0+T exist (FTile contract), each with
    // k elements; out index checked by Kernels::matmul.
    unsafe {
        let mut i = 0;
        while i < k8 {
            let mut av = [_mm256_setzero_ps(); T];
            for t in 0..T {
                av[t] = _mm256_loadu_ps(g.a.add((t0 + t) * g.k + i));
            }
            for r in 0..R {
                let wv = load8::<KIND>(g.w.add((r0 + r) * g.wstride), i);
                for t in 0..T {
                    acc[r][t] = _mm256_fmadd_ps(wv, av[t], acc[r][t]);
                }
            }
            i += 8;
        }
        for r in 0..R {
            let wrow = g.w.add((r0 + r) * g.wstride);
            for t in 0..T {
                let arow = g.a.add((t0 + t) * g.k);
                let mut s = hsum(acc[r][t]);
                for j in k8..g.k {
                    s += load1::<KIND>(wrow, j) * *arow.add(j);
                }
                *g.out.add((t0 + t) * g.out_stride + r0 + r) = s;
            }
        }
    }
}

macro_rules! float_matmul {
    ($matmul:ident, $vec_dot:ident, $tile:ident, $kind:ident, $ty:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $tile<const R: usize, const T: usize>(g: &FTile, r0: usize, t0: usize) {
            // SAFETY: forwarded contract.
            unsafe { ftile::<$kind, R, T>(g, r0, t0) }
        }

        fn $matmul(args: MatmulArgs<'_>) {
            let MatmulArgs {
                k,
                w,
                nrows,
                a,
                ntok,
                out,
                out_stride,
            } = args;
            let g = FTile {
                w: w.as_ptr(),
                wstride: crate::row_size(GgmlType::$ty, k),
                a: a.as_ptr().cast(),
                k,
                out: out.as_mut_ptr(),
                out_stride,
            };
            let shape = TileShape {
                decode_rows: 4,
                prefill_rows: 2,
                prefill_toks: 4,
            };
            drive(nrows, ntok, g.wstride, shape, |rr, tt, r0, t0| {
                // SAFETY: reachable only through a table built after detecting AVX2/FMA/F16C;
                // lengths checked by Kernels::matmul; drive keeps tiles in range.
                unsafe { dispatch_tile!($tile, rr, tt, &g, r0, t0) }
            });
        }

        fn $vec_dot(k: usize, w: &[u8], a: &[u8]) -> f32 {
            super::quant::vec_dot_via(k, w, a, $matmul)
        }
    };
}

float_matmul!(matmul_f32, vec_dot_f32, ftile_f32, KIND_F32, F32);
float_matmul!(matmul_f16, vec_dot_f16, ftile_f16, KIND_F16, F16);
float_matmul!(matmul_bf16, vec_dot_bf16, ftile_bf16, KIND_BF16, BF16);

// ---------------------------------------------------------------------------------------------
// Activation quantisation (Q8_0, Q8_1): same bytes as the scalar reference.

/// Quantises one block of 32 floats: returns `d` (before f16 rounding), the 32 values and their
/// sum. `q = round(x * (1/d))` with ties away from zero, exactly as `f32::round`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_block(x: *const f32, qs: *mut u8) -> (f32, i32) {
    // SAFETY: the caller guarantees 32 readable floats at x and 32 writable bytes at qs.
    unsafe {
        let v = [
            _mm256_loadu_ps(x),
            _mm256_loadu_ps(x.add(8)),
            _mm256_loadu_ps(x.add(16)),
            _mm256_loadu_ps(x.add(24)),
        ];
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let m01 = _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask));
        let m23 = _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask));
        let m = _mm256_max_ps(m01, m23);
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let half = _mm256_set1_ps(0.5);
        let sign = _mm256_set1_ps(-0.0);
        let one = _mm256_set1_ps(1.0);
        let mut q = [_mm256_setzero_si256(); 4];
        for j in 0..4 {
            let y = _mm256_mul_ps(v[j], id);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
            // |y - trunc(y)| >= 0.5 rounds away from zero (the subtraction is exact).
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
            let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
            let step = _mm256_and_ps(up, _mm256_or_ps(one, _mm256_and_ps(y, sign)));
            q[j] = _mm256_cvtps_epi32(_mm256_add_ps(t, step));
        }
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256::<1>(sum),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        let p01 = _mm256_packs_epi32(q[0], q[1]);
        let p23 = _mm256_packs_epi32(q[2], q[3]);
        let p = _mm256_packs_epi16(p01, p23);
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.cast(), p);
        (d, _mm_cvtsi128_si32(s))
    }
}

fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(BlockQ8_0::SIZE))
    {
        // SAFETY: AVX2 was detected (table contract); xb has 32 floats, ob[2..] 32 bytes.
        let (d, _) = unsafe { quantize_block(xb.as_ptr(), ob[2..].as_mut_ptr()) };
        ob[0..2].copy_from_slice(&f32_to_f16(d));
    }
}

fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(BlockQ8_1::SIZE))
    {
        // SAFETY: AVX2 was detected (table contract); xb has 32 floats, ob[4..] 32 bytes.
        let (d, sum) = unsafe { quantize_block(xb.as_ptr(), ob[4..].as_mut_ptr()) };
        ob[0..2].copy_from_slice(&f32_to_f16(d));
        ob[2..4].copy_from_slice(&f32_to_f16(d * sum as f32));
    }
}

/// Quantises one row to A8 (see `crate::a8`): the scalar reference's bytes.
pub(crate) fn quantize_row_a8(x: &[f32], out: &mut [u8]) {
    use crate::a8::{a8_row_size, quantize_block_ref, A8_BLOCK_BYTES};
    assert_eq!(out.len(), a8_row_size(x.len()), "quantize_row_a8: lengths");
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(A8_BLOCK_BYTES)) {
        // SAFETY: reachable only from x86 tables, which exist only on hosts with AVX2, FMA and
        // F16C; xb has 32 floats, ob[8..] 32 bytes.
        let (d, sum) = unsafe { quantize_block(xb.as_ptr(), ob[8..].as_mut_ptr()) };
        if d != 0.0 && !(1.0 / d).is_finite() {
            // A block of values below about 1e-36: the reference's rescaled path.
            quantize_block_ref(xb, ob);
            continue;
        }
        // SAFETY: as above.
        unsafe { permute_runs(ob[8..].as_mut_ptr()) };
        ob[0..4].copy_from_slice(&d.to_le_bytes());
        ob[4..8].copy_from_slice(&sum.to_le_bytes());
    }
}

/// Reorders each run of 8 bytes of the 32 at `q` into `crate::a8::PERM`'s order.
///
/// # Safety
/// 32 readable and writable bytes at `q`; AVX2 host.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn permute_runs(q: *mut u8) {
    let p = _mm256_setr_epi8(
        0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15, 0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11,
        12, 14, 13, 15,
    );
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm256_loadu_si256(q.cast());
        _mm256_storeu_si256(q.cast(), _mm256_shuffle_epi8(v, p));
    }
}
