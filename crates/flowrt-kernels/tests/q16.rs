//! Q16-activation matmuls: every table the host can run against the scalar reference, and the
//! scalar reference against plain f64 math on dequantised values.

mod common;

use common::{config, decode_parts_f64, random_f32s, rng, tables, TestRng};
use flowrt_dtype::GgmlType;
use flowrt_kernels::q16::{q16_row_size, quantize_row_ref, Q16_BLOCK_BYTES};
use flowrt_kernels::{row_size, x8, Isa, Kernels};
use proptest::prelude::*;
use rand::Rng;

const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Offsets of the f16 scale fields in a block of `ty`, and the largest integer factor (sub-block
/// scale) that multiplies them.
fn scale_fields(ty: GgmlType) -> (&'static [usize], f32) {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 => (&[0, 2], 1.0),
        GgmlType::Q4K | GgmlType::Q5K => (&[0, 2], 63.0),
        GgmlType::Q6K => (&[208], 127.0),
        _ => (&[0], 1.0),
    }
}

/// Row length for a type from a block count in 1..=48 (k-quants: 1..=9 super-blocks).
fn k_for(ty: GgmlType, nb: usize) -> usize {
    if ty.block_size() == 256 {
        256 * (1 + nb % 9)
    } else {
        32 * nb
    }
}

/// The sum of `(|scaled part| + |offset part|) * |x|` over a row: every term a kernel adds is
/// bounded by it, so f32 rounding differences are a small multiple of it.
fn abs_terms(ty: GgmlType, wrow: &[u8], x: &[f32]) -> f64 {
    decode_parts_f64(ty, wrow)
        .iter()
        .zip(x)
        .map(|((p, o), &v)| (p.abs() + o.abs()) * (v as f64).abs())
        .sum()
}

/// Random weight rows of type `ty`: sane f16 scales, random payload bytes.
fn weights(ty: GgmlType, k: usize, rows: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let bs = ty.type_size() as usize;
    let mut out = vec![0u8; row_size(ty, k) * rows];
    for blk in out.chunks_exact_mut(bs) {
        for b in blk.iter_mut() {
            *b = next() as u8;
        }
        let (fields, factor) = scale_fields(ty);
        let scale = |r: u64| {
            half::f16::from_f32(((r % 2000) as f32 / 1000.0 - 1.0) * 0.05 / factor).to_le_bytes()
        };
        for &o in fields {
            blk[o..o + 2].copy_from_slice(&scale(next()));
        }
    }
    out
}

fn acts(k: usize, ntok: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..k * ntok)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state % 20001) as f32 / 10000.0 - 1.0;
            // A few outliers, as real activations have.
            if i % 97 == 0 {
                v * 40.0
            } else {
                v
            }
        })
        .collect()
}

fn quantize(x: &[f32], k: usize) -> Vec<u8> {
    let mut a = vec![0u8; q16_row_size(x.len())];
    for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(q16_row_size(k))) {
        quantize_row_ref(xr, ar);
    }
    a
}

fn matmul(
    kern: &Kernels,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    nrows: usize,
    a: &[u8],
    ntok: usize,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; ntok * nrows];
    kern.matmul_q16(ty, k, w, nrows, a, ntok, &mut out, nrows);
    out
}

/// The types with an x8 layout.
const X8_TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Packs `w` (`nrows x k` of type `ty`) into the x8 layout.
fn pack_x8(ty: GgmlType, k: usize, w: &[u8], nrows: usize) -> Vec<u8> {
    let mut p = vec![0u8; x8::packed_size(ty, nrows, k)];
    x8::pack(ty, nrows, k, w, &mut p);
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn x8_packing_round_trips(ty_i in 0usize..8, nb in 1usize..=12, groups in 1usize..=3, seed in any::<u64>()) {
        let ty = X8_TYPES[ty_i];
        let k = k_for(ty, nb);
        let nb = k / ty.block_size() as usize;
        let nrows = 8 * groups;
        let w = weights(ty, k, nrows, seed);
        let p = pack_x8(ty, k, &w, nrows);
        prop_assert_ne!(&p, &w, "packing must move bytes");
        let bb = ty.type_size() as usize;
        let ub = x8::unit_bytes(ty);
        let mut blk = vec![0u8; bb];
        let (mut want, mut got) = (vec![0f32; k], vec![f32::NAN; k]);
        for r in 0..nrows {
            Kernels::scalar().dequantize_row(ty, &w[r * nb * bb..(r + 1) * nb * bb], &mut want);
            x8::dequantize_row(ty, &p, r, &mut got);
            prop_assert_eq!(&got, &want, "dequantised row {}", r);
        }
        for r in 0..nrows {
            for b in 0..nb {
                let o = ((r / 8) * nb + b) * ub;
                x8::unpack_block(ty, &p[o..o + ub], r % 8, &mut blk);
                prop_assert_eq!(&blk[..], &w[(r * nb + b) * bb..(r * nb + b + 1) * bb], "row {} block {}", r, b);
            }
        }
    }

    #[test]
    fn x8_matmuls_match_the_unpacked_reference(
        ty_i in 0usize..8, nb in 1usize..=48, groups in 1usize..=3, ntok in 1usize..=9, seed in any::<u64>()
    ) {
        let ty = X8_TYPES[ty_i];
        let (k, nrows) = (k_for(ty, nb), 8 * groups);
        let w = weights(ty, k, nrows, seed);
        let p = pack_x8(ty, k, &w, nrows);
        let x = acts(k, ntok, seed);
        let a = quantize(&x, k);
        let want = matmul(Kernels::scalar(), ty, k, &w, nrows, &a, ntok);
        let rb = row_size(ty, k);
        for kern in tables() {
            // A wider output than the rows: the kernels must keep to their columns.
            let stride = nrows + 3;
            let mut got = vec![f32::NAN; ntok * stride];
            kern.matmul_q16_x8(ty, k, &p, nrows, &a, ntok, &mut got, stride);
            for t in 0..ntok {
                prop_assert!(got[t * stride + nrows..][..3.min(got.len() - t * stride - nrows)].iter().all(|v| v.is_nan()));
                for row in 0..nrows {
                    let (g, r) = (got[t * stride + row], want[t * nrows + row]);
                    if kern.name() == "scalar" {
                        prop_assert_eq!(g.to_bits(), r.to_bits(), "scalar {} k={} t={} row={}", ty, k, t, row);
                    }
                    let abs = abs_terms(ty, &w[row * rb..(row + 1) * rb], &x[t * k..(t + 1) * k]);
                    let tol = 1e-6 * (1.0 + abs) * (k as f64).sqrt();
                    prop_assert!(((g - r).abs() as f64) <= tol, "{} {ty} k={k} t={t} row={row}: {g} vs {r} (tol {tol:e})", kern.name());
                }
            }
        }
    }

    #[test]
    fn every_table_matches_the_scalar_reference(
        ty_i in 0usize..8, nb in 1usize..=48, nrows in 1usize..=9, ntok in 1usize..=9, seed in any::<u64>()
    ) {
        let ty = TYPES[ty_i];
        let k = k_for(ty, nb);
        let w = weights(ty, k, nrows, seed);
        let x = acts(k, ntok, seed);
        let a = quantize(&x, k);
        let want = matmul(Kernels::scalar(), ty, k, &w, nrows, &a, ntok);
        let rb = row_size(ty, k);
        for kern in tables() {
            let got = matmul(kern, ty, k, &w, nrows, &a, ntok);
            for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                let (t, row) = (i / nrows, i % nrows);
                let abs = abs_terms(ty, &w[row * rb..(row + 1) * rb], &x[t * k..(t + 1) * k]);
                let tol = 1e-6 * (1.0 + abs) * (k as f64).sqrt();
                prop_assert!(((g - r).abs() as f64) <= tol, "{} {ty} k={k} [{i}]: {g} vs {r} (tol {tol:e})", kern.name());
            }
        }
    }
}

/// The reference itself: Q16 activations give the f64 dot of dequantised weights with the
/// unquantised activations to about 1e-4 relative (8-bit activations: about 1e-2).
#[test]
fn scalar_reference_is_close_to_exact_math() {
    for ty in TYPES {
        for (k, nrows, seed) in [(32usize, 3, 1u64), (576, 5, 2), (1536, 4, 3)] {
            let k = if ty.block_size() == 256 {
                k.div_ceil(256) * 256
            } else {
                k
            };
            let w = weights(ty, k, nrows, seed);
            let x = acts(k, 1, seed + 10);
            let a = quantize(&x, k);
            let got = matmul(Kernels::scalar(), ty, k, &w, nrows, &a, 1);
            let mut wf = vec![0f32; k];
            for r in 0..nrows {
                let rb = row_size(ty, k);
                Kernels::scalar().dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut wf);
                let exact: f64 = wf.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let scale = abs_terms(ty, &w[r * rb..(r + 1) * rb], &x);
                let err = (got[r] as f64 - exact).abs() / scale.max(1e-30);
                assert!(
                    err < 2e-4,
                    "{ty} k={k} row {r}: {} vs {exact} (relative {err:e})",
                    got[r]
                );
            }
        }
    }
}

#[test]
fn zero_rows_quantise_to_zero() {
    let mut out = vec![0xFFu8; Q16_BLOCK_BYTES];
    quantize_row_ref(&[0.0; 32], &mut out);
    assert!(out.iter().all(|&b| b == 0));
}

// ---------------------------------------------------------------------------------------------
// Q16 quantisation, byte for byte.

fn f32_at(b: &[u8], o: usize) -> f32 {
    f32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn q_at(b: &[u8], j: usize) -> i16 {
    i16::from_le_bytes([b[8 + 2 * j], b[9 + 2 * j]])
}

/// Checks a table's Q16 row `got` for `x` against the scalar reference's row `want`, every
/// byte of every block:
///
/// * the scale `d = amax / 32767`, bit for bit (in both);
/// * the reference's quants are `x * (1/d)` (the f32 product; `(2^64 x) * (1/(2^64 d))` where
///   `1/d` overflows) rounded half away from zero, within -32767..=32767;
/// * the table's quants equal the reference's, except where that product lies exactly half-way
///   between two integers: there the table may round to even instead (x86's `vroundps`), and
///   nowhere else;
/// * the block sum `s` is `d * sum(q)` of the quants the row holds, bit for bit (in both).
///
/// Returns how many quants rounded a tie to even.
fn check_q16_row(name: &str, x: &[f32], got: &[u8], want: &[u8]) -> Result<usize, TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    let mut to_even = 0;
    for (b, ((xb, gb), wb)) in x
        .chunks_exact(32)
        .zip(got.chunks_exact(Q16_BLOCK_BYTES))
        .zip(want.chunks_exact(Q16_BLOCK_BYTES))
        .enumerate()
    {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 32767.0;
        prop_assert_eq!(
            f32_at(wb, 0).to_bits(),
            d.to_bits(),
            "reference: block {} scale",
            b
        );
        prop_assert_eq!(
            f32_at(gb, 0).to_bits(),
            d.to_bits(),
            "{}: block {} scale",
            name,
            b
        );
        // Where 1/d overflows (amax below about 1e-34), x and d are scaled by 2^64 first.
        let pre = if (1.0 / d).is_finite() {
            1.0
        } else {
            2f32.powi(64)
        };
        let id = if d > 0.0 { 1.0 / (d * pre) } else { 0.0 };
        let (mut gsum, mut wsum) = (0i32, 0i32);
        for (j, &v) in xb.iter().enumerate() {
            let (g, w) = (q_at(gb, j), q_at(wb, j));
            let p = v * pre * id;
            let away = p.round().clamp(-32767.0, 32767.0) as i16;
            prop_assert_eq!(
                w,
                away,
                "reference: block {} value {} ({} * {})",
                b,
                j,
                v,
                id
            );
            if g != w {
                let tie = (p - p.trunc()).abs() == 0.5;
                prop_assert!(
                    tie && g as f32 == p.round_ties_even(),
                    "{name}: block {b} value {j}: {g}, reference {w} (x * (1/d) = {p})"
                );
                to_even += 1;
            }
            gsum += g as i32;
            wsum += w as i32;
        }
        let (gs, ws) = (f32_at(gb, 4), f32_at(wb, 4));
        prop_assert_eq!(
            ws.to_bits(),
            (d * wsum as f32).to_bits(),
            "reference: block {} sum {}",
            b,
            ws
        );
        prop_assert_eq!(
            gs.to_bits(),
            (d * gsum as f32).to_bits(),
            "{}: block {} sum field {} is not d * {} (the sum of its quants)",
            name,
            b,
            gs,
            gsum
        );
    }
    Ok(to_even)
}

/// A row of `nb` blocks to quantise, each of one kind: activation-like values (with outliers),
/// [`random_f32s`] (zeros, duplicates, magnitudes 1e-3 to 1e3), all zeros, exact ties
/// (`d` a power of two, values `(m + 1/2) d`), or any magnitude from 1e-37 (subnormals among
/// the values, and a scale whose inverse overflows) to 1e30.
fn q16_input(rng: &mut TestRng, nb: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(32 * nb);
    for _ in 0..nb {
        match rng.random_range(0..6) {
            0 => x.extend(acts(32, 1, rng.random())),
            1 => x.extend(random_f32s(rng, 32)),
            2 => x.extend([0.0; 32]),
            3 | 4 => {
                let d = 2f32.powi(rng.random_range(-60..60));
                let amax = 32767.0 * d * if rng.random_bool(0.5) { 1.0 } else { -1.0 };
                let at = rng.random_range(0..32);
                x.extend((0..32).map(|j| {
                    let m = rng.random_range(-32767i32..32767) as f32;
                    match j {
                        _ if j == at => amax,
                        _ if rng.random_bool(0.7) => (m + 0.5) * d,
                        _ => m * d,
                    }
                }));
            }
            _ => {
                let mag = 10f32.powf(rng.random_range(-37.0..30.0));
                x.extend((0..32).map(|_| rng.random_range(-1.0f32..1.0) * mag));
            }
        }
    }
    x
}

proptest! {
    #![proptest_config(config(64))]

    /// Every table quantises to Q16 exactly as the scalar reference, ties aside (see
    /// [`check_q16_row`]).
    #[test]
    fn q16_quantisation_is_exact(nb in 1usize..=20, seed: u64) {
        let mut rng = rng(seed);
        let x = q16_input(&mut rng, nb);
        let k = x.len();
        let mut want = vec![0u8; q16_row_size(k)];
        quantize_row_ref(&x, &mut want);
        for kern in tables() {
            let mut got = vec![0xA5u8; q16_row_size(k)];
            kern.quantize_row_q16(&x, &mut got);
            check_q16_row(kern.name(), &x, &got, &want)?;
        }
    }
}

/// Exact ties: with `amax = 32767` the scale is 1, so `x * (1/d) = x`. The reference rounds
/// them away from zero; a table may round them to even, and its block sum then follows its
/// own quants. Values next to a tie round the same way everywhere.
#[test]
fn q16_ties_are_the_only_difference() {
    let mut x = vec![0f32; 64];
    x[0] = 32767.0;
    let ties = [
        0.5f32, -0.5, 1.5, -1.5, 2.5, -2.5, 100.5, -101.5, 32766.5, -32766.5,
    ];
    x[1..1 + ties.len()].copy_from_slice(&ties);
    x[20] = 2.4999998;
    x[21] = -2.5000002;
    x[22] = 0.49999997;
    // A second block with d = 2^-10: ties at (m + 1/2) 2^-10.
    x[32] = -32767.0 / 1024.0;
    for (j, m) in (33..64).zip(-15..) {
        x[j] = (m as f32 * 997.0 + 0.5) / 1024.0;
    }
    let mut want = vec![0u8; q16_row_size(64)];
    quantize_row_ref(&x, &mut want);
    let q: Vec<i16> = (1..1 + ties.len()).map(|j| q_at(&want, j)).collect();
    assert_eq!(
        q,
        [1, -1, 2, -2, 3, -3, 101, -102, 32767, -32767],
        "reference"
    );
    assert_eq!(
        (q_at(&want, 20), q_at(&want, 21), q_at(&want, 22)),
        (2, -3, 0)
    );
    for kern in tables() {
        let mut got = vec![0u8; want.len()];
        kern.quantize_row_q16(&x, &mut got);
        // A table rounds every tie one way: away from zero (the reference's quantiser, in the
        // scalar and NEON tables) or to even (`vroundps`, in the x86 tables: 23 of them here
        // move, the other ties being even both ways).
        let to_even = check_q16_row(kern.name(), &x, &got, &want).unwrap();
        assert!(
            to_even == 0 || to_even == 23,
            "{}: {to_even} ties to even",
            kern.name()
        );
        assert_eq!(
            (q_at(&got, 20), q_at(&got, 21), q_at(&got, 22)),
            (2, -3, 0),
            "{}",
            kern.name()
        );
    }
}

/// Blocks of extreme magnitude: subnormal and huge values, and scales on both sides of the
/// one whose inverse overflows f32 (`amax` about 9.6e-35). Before the reference rescaled such
/// blocks, `x * (1/d)` was `±inf` (NaN for zeros): the reference wrote 32767 with the sign of
/// `x` for every nonzero value, the x86 tables -32768 for every value, zeros included.
#[test]
fn q16_extreme_magnitudes_quantise_exactly() {
    for mag in [
        1e-45f32,
        1e-40,
        1e-38,
        f32::MIN_POSITIVE,
        1e-36,
        9e-35,
        1e-34,
        1e-30,
        1e30,
        1e38,
        f32::MAX,
    ] {
        let mut rng = rng(mag.to_bits() as u64);
        let mut x: Vec<f32> = (0..32)
            .map(|_| rng.random_range(-1.0f32..1.0) * mag)
            .collect();
        x[3] = mag;
        x[4] = 0.0;
        let mut want = vec![0u8; q16_row_size(32)];
        quantize_row_ref(&x, &mut want);
        for kern in tables() {
            let mut got = vec![0u8; want.len()];
            kern.quantize_row_q16(&x, &mut got);
            check_q16_row(&format!("{} amax {mag:e}", kern.name()), &x, &got, &want).unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tile boundaries and tails: every shape around the tiles of the Q16 and x8 matmuls.

/// Tokens of the boundary sweeps: every count up to 13 (the x86 Q16 tiles take 8 tokens, then
/// 4, then single ones; the x8 tiles 4, then a tail of 1 to 3), and around two 8-token tiles.
const SWEEP_TOKS: [usize; 16] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17];

/// Row lengths of the sweeps: one block (k-quants: one super-block), two, and many.
fn sweep_ks(ty: GgmlType) -> [usize; 3] {
    if ty.block_size() == 256 {
        [256, 512, 768]
    } else {
        [32, 64, 768]
    }
}

/// The inputs of a boundary sweep: `nrows` weight rows and `ntok` activation rows, the scalar
/// reference's output for all of them (`want[t * nrows + r]`) and each output's tolerance.
/// A smaller shape multiplies the first rows by the first tokens, whose outputs it must
/// reproduce: each one is a dot of one row with one token, whatever the tiling.
struct Sweep {
    ty: GgmlType,
    k: usize,
    nrows: usize,
    w: Vec<u8>,
    a: Vec<u8>,
    want: Vec<f32>,
    tol: Vec<f64>,
}

impl Sweep {
    fn new(ty: GgmlType, k: usize, nrows: usize, ntok: usize, seed: u64) -> Sweep {
        let w = weights(ty, k, nrows, seed);
        let x = acts(k, ntok, seed);
        let a = quantize(&x, k);
        let want = matmul(Kernels::scalar(), ty, k, &w, nrows, &a, ntok);
        let rb = row_size(ty, k);
        let parts: Vec<Vec<(f64, f64)>> = w
            .chunks_exact(rb)
            .map(|row| decode_parts_f64(ty, row))
            .collect();
        let mut tol = Vec::with_capacity(ntok * nrows);
        for xt in x.chunks_exact(k) {
            for p in &parts {
                let abs: f64 = p
                    .iter()
                    .zip(xt)
                    .map(|((p, o), &v)| (p.abs() + o.abs()) * (v as f64).abs())
                    .sum();
                tol.push(1e-6 * (1.0 + abs) * (k as f64).sqrt());
            }
        }
        Sweep {
            ty,
            k,
            nrows,
            w,
            a,
            want,
            tol,
        }
    }

    /// Checks the output of `kern` for the first `nrows x ntok` (`got[t * stride + r]`): within
    /// tolerance (the scalar table: bit for bit), and the `stride - nrows` floats after each
    /// token's outputs untouched (NaN).
    fn check(
        &self,
        kern: &Kernels,
        what: &str,
        nrows: usize,
        ntok: usize,
        got: &[f32],
        stride: usize,
    ) {
        let (ty, k) = (self.ty, self.k);
        for t in 0..ntok {
            for r in 0..nrows {
                let (g, w) = (got[t * stride + r], self.want[t * self.nrows + r]);
                let tol = self.tol[t * self.nrows + r];
                let ok = if kern.isa() == Isa::Scalar {
                    g.to_bits() == w.to_bits()
                } else {
                    ((g - w).abs() as f64) <= tol
                };
                assert!(
                    ok,
                    "{} {what} {ty} k={k} {nrows}x{ntok}: row {r} token {t}: {g} vs {w} (tol {tol:e})",
                    kern.name()
                );
            }
            let gap =
                &got[t * stride + nrows..][..(stride - nrows).min(got.len() - t * stride - nrows)];
            assert!(
                gap.iter().all(|v| v.is_nan()),
                "{} {what} {ty} k={k} {nrows}x{ntok}: wrote past row {nrows} of token {t}",
                kern.name()
            );
        }
    }
}

/// `matmul_q16` for rows 1..=17 (bands of 4 rows, then single rows) by [`SWEEP_TOKS`], one,
/// two and many blocks per row, every weight type: each table against the scalar reference.
#[test]
fn q16_matmul_tile_boundaries_match_the_reference() {
    for (i, ty) in TYPES.into_iter().enumerate() {
        for (j, k) in sweep_ks(ty).into_iter().enumerate() {
            let s = Sweep::new(ty, k, 17, 17, (10 * i + j) as u64);
            let (rb, ab) = (row_size(ty, k), q16_row_size(k));
            for kern in tables() {
                for nrows in 1..=17 {
                    for ntok in SWEEP_TOKS {
                        let stride = nrows + 1;
                        let mut got = vec![f32::NAN; ntok * stride];
                        kern.matmul_q16(
                            ty,
                            k,
                            &s.w[..nrows * rb],
                            nrows,
                            &s.a[..ntok * ab],
                            ntok,
                            &mut got,
                            stride,
                        );
                        s.check(kern, "q16", nrows, ntok, &got, stride);
                    }
                }
            }
        }
    }
}

/// x8: 1 to 5 groups of 8 rows (tiles of two groups when there are several tokens, then one)
/// by [`SWEEP_TOKS`], one, two and many packed units per row, every type. Every prefix of the
/// groups packs to the prefix of the whole packed matrix and unpacks to the original blocks;
/// each table's x8 matmul matches the unpacked scalar reference (the scalar x8 kernel bit for
/// bit).
#[test]
fn x8_tile_boundaries_match_the_unpacked_reference() {
    const GROUPS: usize = 5;
    for (i, ty) in X8_TYPES.into_iter().enumerate() {
        for (j, k) in sweep_ks(ty).into_iter().enumerate() {
            let nmax = 8 * GROUPS;
            let s = Sweep::new(ty, k, nmax, 17, (100 + 10 * i + j) as u64);
            let (rb, ab) = (row_size(ty, k), q16_row_size(k));
            let p = pack_x8(ty, k, &s.w, nmax);
            let (ub, bb) = (x8::unit_bytes(ty), ty.type_size() as usize);
            let mut blk = vec![0u8; bb];
            for r in 0..nmax {
                for b in 0..rb / bb {
                    let o = ((r / 8) * (rb / bb) + b) * ub;
                    x8::unpack_block(ty, &p[o..o + ub], r % 8, &mut blk);
                    assert_eq!(
                        blk,
                        s.w[r * rb + b * bb..][..bb],
                        "{ty} k={k}: row {r} block {b}"
                    );
                }
            }
            for groups in 1..=GROUPS {
                let nrows = 8 * groups;
                let size = x8::packed_size(ty, nrows, k);
                assert!(
                    pack_x8(ty, k, &s.w[..nrows * rb], nrows) == p[..size],
                    "{ty} k={k}: {nrows} rows pack differently"
                );
                for kern in tables() {
                    for ntok in SWEEP_TOKS {
                        let stride = nrows + 3;
                        let mut got = vec![f32::NAN; ntok * stride];
                        kern.matmul_q16_x8(
                            ty,
                            k,
                            &p[..size],
                            nrows,
                            &s.a[..ntok * ab],
                            ntok,
                            &mut got,
                            stride,
                        );
                        s.check(kern, "x8", nrows, ntok, &got, stride);
                    }
                }
            }
        }
    }
}

/// The AVX-512 x8 kernels (two groups per 512-bit vector, `vpdpwssd` with VNNI) do the AVX2
/// kernel's arithmetic lane for lane: the same exact integer block sums, scaled by the same
/// f32 operations in the same order. Their outputs must equal the AVX2 table's bit for bit,
/// for every type, 1 to 7 groups (pairs, pairs of pairs and an odd last group) and token
/// counts around the 4-token tiles. Reported NOT RUN where the host lacks the tables.
#[test]
fn x8_avx512_tables_equal_avx2_bit_for_bit() {
    let Some((avx2, wide)) = common::avx2_and_avx512_tables("x8") else {
        return;
    };
    const GROUPS: usize = 7;
    for (i, ty) in X8_TYPES.into_iter().enumerate() {
        for (j, k) in sweep_ks(ty).into_iter().enumerate() {
            let nmax = 8 * GROUPS;
            let seed = (300 + 10 * i + j) as u64;
            let w = weights(ty, k, nmax, seed);
            let x = acts(k, 17, seed);
            let a = quantize(&x, k);
            let ab = q16_row_size(k);
            for groups in 1..=GROUPS {
                let nrows = 8 * groups;
                let p = pack_x8(ty, k, &w[..nrows * row_size(ty, k)], nrows);
                for ntok in SWEEP_TOKS {
                    let run = |kern: &Kernels| {
                        let stride = nrows + 3;
                        let mut got = vec![f32::NAN; ntok * stride];
                        kern.matmul_q16_x8(
                            ty,
                            k,
                            &p,
                            nrows,
                            &a[..ntok * ab],
                            ntok,
                            &mut got,
                            stride,
                        );
                        got
                    };
                    let want = run(avx2);
                    for kern in &wide {
                        let what = format!("{} {ty} k={k} {nrows}x{ntok}", kern.name());
                        common::assert_same_bits(&run(kern), &want, &what);
                    }
                }
            }
        }
    }
    for kern in wide {
        println!("RAN kernels: x8 {} equals avx2 bit for bit", kern.name());
    }
}
