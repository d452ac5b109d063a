//! MXFP4 (OCP microscaling FP4, ggml type 39) reference: quantise, dequantise, and the dot with
//! Q8_0 activations (ggml's pairing).
//!
//! Quantising follows gguf-py's `MXFP4.quantize_blocks` (and ggml's reference): the block's
//! exponent is `floor(log2(amax)) - 2 + 127`, so `amax / scale` lies in `[4, 8)` (values up to 6
//! are representable; above, they saturate at 6), and each value takes the E2M1 code whose
//! value is nearest, the first in code order on a tie (`|d * k - x|` computed in f32 as gguf-py
//! does). `floor(log2)` is taken exactly from the float's bits here, where gguf-py uses numpy's
//! f32 `log2`: the two can differ only for an `amax` a few ulps below a power of two. An
//! exponent below 0 (an `amax` under about 2^-125) is clamped to 0 (gguf-py's uint8 cast wraps).

use crate::blocks::{
    f16_to_f32, mxfp4_code, mxfp4_half_scale, BlockQ8_0, MXFP4_BLOCK_BYTES, MXFP4_KVALUES, QK,
};

/// `floor(log2(x))` of a finite `x > 0`, exactly.
fn floor_log2(x: f32) -> i32 {
    let bits = x.to_bits();
    let be = ((bits >> 23) & 0xFF) as i32;
    if be == 0 {
        // Subnormal: x = m 2^-149.
        let m = bits & 0x007F_FFFF;
        31 - m.leading_zeros() as i32 - 149
    } else {
        be - 127
    }
}

/// The E8M0 exponent byte for a block whose largest magnitude is `amax`.
pub(crate) fn mxfp4_exponent(amax: f32) -> u8 {
    if amax.is_nan() || amax <= 0.0 {
        return 0;
    }
    (floor_log2(amax) - 2 + 127).clamp(0, 255) as u8
}

/// The code nearest to `v` at half-scale `d`: the first minimum of `|d k - v|` in code order.
pub(crate) fn mxfp4_nearest(d: f32, v: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = f32::INFINITY;
    for (c, &k) in MXFP4_KVALUES.iter().enumerate() {
        let err = (d * k as f32 - v).abs();
        if err < best_err {
            best_err = err;
            best = c as u8;
        }
    }
    best
}

pub(crate) fn quantize_row_mxfp4(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(MXFP4_BLOCK_BYTES))
    {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let e = mxfp4_exponent(amax);
        let d = mxfp4_half_scale(e);
        ob[0] = e;
        for j in 0..QK / 2 {
            ob[1 + j] = mxfp4_nearest(d, xb[j]) | (mxfp4_nearest(d, xb[j + QK / 2]) << 4);
        }
    }
}

pub(crate) fn dequantize_row_mxfp4(row: &[u8], out: &mut [f32]) {
    for (b, ob) in row
        .chunks_exact(MXFP4_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = mxfp4_half_scale(b[0]);
        for (j, o) in ob.iter_mut().enumerate() {
            *o = d * MXFP4_KVALUES[mxfp4_code(&b[1..], j) as usize] as f32;
        }
    }
}

/// `sum_b (d_w / 2) d_a sum_j k_j q_a`, the doubled E2M1 values `k_j` times the Q8_0 values
/// summed exactly in i32 per block (as ggml's `ggml_vec_dot_mxfp4_q8_0`).
pub(crate) fn vec_dot_mxfp4_q8_0(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(MXFP4_BLOCK_BYTES)
        .zip(a.chunks_exact(BlockQ8_0::SIZE))
    {
        let ab = BlockQ8_0::read(ab);
        let isum: i32 = (0..QK)
            .map(|j| MXFP4_KVALUES[mxfp4_code(&wb[1..], j) as usize] as i32 * ab.qs[j] as i32)
            .sum();
        sum += isum as f32 * (mxfp4_half_scale(wb[0]) * f16_to_f32(ab.d));
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponents_put_amax_over_the_scale_in_4_to_8() {
        for &amax in &[1.0f32, 0.75, 6.0, 7.99, 8.0, 1e-3, 3e5, 1e-37] {
            let e = mxfp4_exponent(amax);
            let scale = 2f64.powi(e as i32 - 127);
            let r = amax as f64 / scale;
            assert!((4.0..8.0).contains(&r), "amax {amax}: e {e}, ratio {r}");
        }
        assert_eq!(mxfp4_exponent(0.0), 0);
        // Below 2^-125 the exponent would be negative: clamped to 0.
        assert_eq!(mxfp4_exponent(1e-40), 0);
        assert_eq!(mxfp4_exponent(1.0), 125);
    }

    #[test]
    fn nearest_code_ties_take_the_first_code() {
        // d = 0.5: doubled values times d are the E2M1 values.
        assert_eq!(mxfp4_nearest(0.5, 0.75), 1); // between 0.5 (code 1) and 1 (code 2)
        assert_eq!(mxfp4_nearest(0.5, -0.75), 9);
        assert_eq!(mxfp4_nearest(0.5, 5.0), 6); // between 4 and 6
        assert_eq!(mxfp4_nearest(0.5, 100.0), 7); // saturates at 6
        assert_eq!(mxfp4_nearest(0.5, -0.0), 0);
    }

    /// What `flowrt pack --quant MXFP4_MOE` writes, read back by flowrt's dequantiser (the
    /// one inference uses): on random rows over many magnitudes, every block's exponent puts
    /// its largest magnitude in `[4, 8)` times the scale, every value reads back as a nearest
    /// representable value of its block (no code is closer), and quantising what was read
    /// back gives the same bytes.
    #[test]
    fn quantised_rows_read_back_as_the_nearest_values() {
        let k = crate::Kernels::detect();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 // [0, 1)
        };
        let n = 8 * QK;
        for trial in 0..200 {
            let mag = 2f32.powi(trial % 40 - 20);
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    let v = (next() * 2.0 - 1.0) * mag;
                    if i % 11 == 0 {
                        0.0
                    } else {
                        v
                    }
                })
                .collect();
            let mut q = vec![0u8; crate::row_size(crate::GgmlType::Mxfp4, n)];
            k.quantize_row(crate::GgmlType::Mxfp4, &x, &mut q);
            let mut y = vec![0f32; n];
            k.dequantize_row(crate::GgmlType::Mxfp4, &q, &mut y);
            for (b, (xb, yb)) in x.chunks(QK).zip(y.chunks(QK)).enumerate() {
                let e = q[b * MXFP4_BLOCK_BYTES];
                let d = mxfp4_half_scale(e);
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                if amax > 0.0 {
                    let r = amax as f64 / (2.0 * d as f64);
                    assert!((4.0..8.0).contains(&r), "trial {trial} block {b}: {r}");
                }
                for (&xv, &yv) in xb.iter().zip(yb) {
                    let err = (xv - yv).abs();
                    for &kv in &MXFP4_KVALUES {
                        assert!(
                            err <= (xv - d * kv as f32).abs(),
                            "trial {trial}: {xv} read back as {yv}, {} is nearer",
                            d * kv as f32
                        );
                    }
                }
            }
            let mut q2 = vec![0u8; q.len()];
            k.quantize_row(crate::GgmlType::Mxfp4, &y, &mut q2);
            assert_eq!(q, q2, "trial {trial}: requantising the values read back");
        }
    }
}
