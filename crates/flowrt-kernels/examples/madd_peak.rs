//! What `vpmaddwd` can do on this CPU, next to what the x8 Q16 kernel does, in one run.
//!
//! `cargo run --profile ci -p flowrt-kernels --example madd_peak`
//!
//! The peak loop is the x8 kernel's inner loop with everything else taken out: weight pairs
//! already widened to 16 bits and activations in L1, nothing but broadcast loads, `vpmaddwd`,
//! `vpaddd` and one scale per 32 values. Its rate bounds any AVX2 kernel with 16-bit
//! activations; the x8 kernel (Q4_1, 1024 x 256, 64 tokens, single thread) is timed in the
//! same rounds. Medians of 15 rounds, GMAC/s (one multiply-add per weight and token).
#![allow(unsafe_code)] // the peak loop is raw intrinsics, as in the kernels
// Elsewhere only `main`'s message remains.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused))]

use std::time::Instant;

use flowrt_dtype::GgmlType;
use flowrt_kernels::{q16, row_size, x8, Kernels};

const ROUNDS: usize = 15;
/// 32-value blocks per row (K = 1024).
const NB: usize = 32;

#[cfg(target_arch = "x86_64")]
mod peak {
    use core::arch::x86_64::*;

    /// `reps` passes over `NB` blocks of `R` rows x `V` vectors of activation pairs.
    ///
    /// # Safety
    /// AVX2 and FMA host; `w` holds `nb * 16 * 8` pairs, `a` `nb * 16 * V` vectors.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn run<const R: usize, const V: usize>(
        w: &[u32],
        a: &[__m256i],
        nb: usize,
        reps: usize,
    ) -> f32 {
        let mut tot = _mm256_setzero_ps();
        for _ in 0..reps {
            let mut acc = [[_mm256_setzero_ps(); V]; R];
            for b in 0..nb {
                let mut isum = [[_mm256_setzero_si256(); V]; R];
                for p in 0..16 {
                    let av: [__m256i; V] = std::array::from_fn(|v| a[(b * 16 + p) * V + v]);
                    for (r, isum) in isum.iter_mut().enumerate() {
                        let wb = _mm256_set1_epi32(w[(b * 16 + p) * 8 + r] as i32);
                        for v in 0..V {
                            isum[v] = _mm256_add_epi32(isum[v], _mm256_madd_epi16(wb, av[v]));
                        }
                    }
                }
                for r in 0..R {
                    for v in 0..V {
                        acc[r][v] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isum[r][v]),
                            _mm256_set1_ps(1.0001),
                            acc[r][v],
                        );
                    }
                }
            }
            for acc in &acc {
                for &x in acc {
                    tot = _mm256_add_ps(tot, x);
                }
            }
        }
        let mut o = [0f32; 8];
        // SAFETY: 8 floats of room.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), tot) };
        o.iter().sum()
    }

    /// Pseudo-random operands: 4-bit weight pairs and 16-bit activation pairs.
    pub fn operands(nb: usize, v: usize) -> (Vec<u32>, Vec<__m256i>) {
        let w = (0..nb * 16 * 8)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761) & 0x000F_000F)
            .collect();
        // SAFETY: AVX (checked by the caller) for the set1.
        let a = (0..nb * 16 * v)
            .map(|i| unsafe { _mm256_set1_epi32((i as i32).wrapping_mul(40_503) & 0x3FFF_3FFF) })
            .collect();
        (w, a)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("madd_peak: this CPU has no AVX2/FMA");
            return;
        }
        let kern = Kernels::detect();
        // The x8 kernel: Q4_1, 1024 x 256, 64 tokens.
        let (k, rows, ntok, ty) = (NB * 32, 256, 64, GgmlType::Q4_1);
        let wf: Vec<f32> = (0..k)
            .map(|i| ((i * 7919 % 1009) as f32 / 504.5 - 1.0) * 0.1)
            .collect();
        let mut wrow = vec![0u8; row_size(ty, k)];
        kern.quantize_row(ty, &wf, &mut wrow);
        let w = wrow.repeat(rows);
        let mut packed = vec![0u8; x8::packed_size(ty, rows, k)];
        x8::pack(ty, rows, k, &w, &mut packed);
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut a16 = vec![0u8; q16::q16_row_size(k)];
        kern.quantize_row_q16(&x, &mut a16);
        let a16 = a16.repeat(ntok);
        let mut out = vec![0f32; rows * ntok];

        let (w41, a41) = peak::operands(NB, 1);
        let (w42, a42) = peak::operands(NB, 2);
        let reps = 4000;
        let macs = |r: usize, v: usize| (reps * NB * 32 * r * v * 8) as f64;
        let (mut t41, mut t42, mut t61, mut tx8) = (vec![], vec![], vec![], vec![]);
        let mut sink = 0f32;
        for _ in 0..ROUNDS {
            let t = Instant::now();
            // SAFETY: AVX2 and FMA checked above; operand lengths as `run` needs.
            sink += unsafe { peak::run::<4, 1>(&w41, &a41, NB, reps) };
            t41.push(macs(4, 1) / t.elapsed().as_secs_f64() / 1e9);
            let t = Instant::now();
            // SAFETY: as above.
            sink += unsafe { peak::run::<4, 2>(&w42, &a42, NB, reps) };
            t42.push(macs(4, 2) / t.elapsed().as_secs_f64() / 1e9);
            let t = Instant::now();
            // SAFETY: as above.
            sink += unsafe { peak::run::<6, 1>(&w41, &a41, NB, reps) };
            t61.push(macs(6, 1) / t.elapsed().as_secs_f64() / 1e9);
            let iters = 20;
            let t = Instant::now();
            for _ in 0..iters {
                kern.matmul_q16_x8(ty, k, &packed, rows, &a16, ntok, &mut out, rows);
            }
            tx8.push((iters * k * rows * ntok) as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
        println!(
            "{} single thread, median of {ROUNDS} rounds, GMAC/s:",
            kern.name()
        );
        println!("  peak loop 4 rows x 1 vector : {:6.1}", median(t41));
        println!("  peak loop 4 rows x 2 vectors: {:6.1}", median(t42));
        println!("  peak loop 6 rows x 1 vector : {:6.1}", median(t61));
        println!(
            "  x8 Q16 kernel, q4_1 {k}x{rows}, {ntok} tokens: {:6.1}",
            median(tx8)
        );
        std::hint::black_box((sink, out));
    }
    #[cfg(not(target_arch = "x86_64"))]
    eprintln!("madd_peak: x86-64 only");
}
