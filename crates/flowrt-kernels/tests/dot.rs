//! vec_dot and matmul: every table the host runs against the scalar reference, and the scalar
//! reference against exact f64 math on dequantised values.

mod common;

use common::*;
use flowrt_dtype::GgmlType;
use flowrt_kernels::{row_size, Kernels};
use proptest::prelude::*;
use rand::Rng;

fn check_dot(ty: GgmlType, k: usize, w: &[u8], a: &[u8]) -> Result<(), TestCaseError> {
    let (want, abs) = dot_f64(ty, w, a);
    let tol = dot_tol(terms(ty, k), abs);
    let scalar = Kernels::scalar().vec_dot(ty, k, w, a);
    prop_assert!(
        (scalar as f64 - want).abs() <= tol,
        "scalar {ty} k={k}: {scalar} vs exact {want} (tol {tol})"
    );
    for kern in tables() {
        let got = kern.vec_dot(ty, k, w, a);
        prop_assert!(
            (got as f64 - want).abs() <= tol && (got - scalar).abs() as f64 <= 2.0 * tol,
            "{} {ty} k={k}: {got} vs scalar {scalar}, exact {want} (tol {tol})",
            kern.name()
        );
    }
    Ok(())
}

/// Fills a matmul's inputs, runs every table, compares each output with the scalar vec_dot and
/// checks that the gaps between tokens' outputs are untouched.
fn check_matmul(
    rng: &mut TestRng,
    ty: GgmlType,
    k: usize,
    nrows: usize,
    ntok: usize,
    gap: usize,
) -> Result<(), TestCaseError> {
    check_matmul_shapes(rng, ty, k, &[nrows], &[ntok], gap)
}

/// [`check_matmul`] for every shape `rows x toks`: the inputs are `max(rows)` weight rows and
/// `max(toks)` activation rows, each shape multiplies the first `nrows` by the first `ntok` of
/// them, so the references (exact f64 dot, bound, scalar vec_dot) are computed once per pair.
fn check_matmul_shapes(
    rng: &mut TestRng,
    ty: GgmlType,
    k: usize,
    rows: &[usize],
    toks: &[usize],
    gap: usize,
) -> Result<(), TestCaseError> {
    let at = Kernels::vec_dot_type(ty);
    let (rmax, tmax) = (*rows.iter().max().unwrap(), *toks.iter().max().unwrap());
    let wrows: Vec<Vec<u8>> = (0..rmax).map(|_| random_weight_row(rng, ty, k)).collect();
    let arows: Vec<Vec<u8>> = (0..tmax).map(|_| random_act_row(rng, at, k)).collect();
    let (w, a) = (wrows.concat(), arows.concat());
    let (wb, ab) = (row_size(ty, k), row_size(at, k));
    assert_eq!(w.len(), rmax * wb);
    // (exact, tolerance, scalar vec_dot) of weight row r and activation row t, at [t][r].
    let refs: Vec<Vec<(f64, f64, f32)>> = arows
        .iter()
        .map(|arow| {
            wrows
                .iter()
                .map(|wrow| {
                    let (want, abs) = dot_f64(ty, wrow, arow);
                    let scalar = Kernels::scalar().vec_dot(ty, k, wrow, arow);
                    (want, dot_tol(terms(ty, k), abs), scalar)
                })
                .collect()
        })
        .collect();
    let sentinel = f32::from_bits(0x7FC0_1234);
    for kern in tables() {
        for &nrows in rows {
            for &ntok in toks {
                let stride = nrows + gap;
                let mut out = vec![sentinel; (ntok - 1) * stride + nrows + gap];
                kern.matmul(
                    ty,
                    k,
                    &w[..nrows * wb],
                    nrows,
                    &a[..ntok * ab],
                    ntok,
                    &mut out,
                    stride,
                );
                for t in 0..ntok {
                    for r in 0..nrows {
                        let got = out[t * stride + r];
                        let (want, tol, scalar) = refs[t][r];
                        prop_assert!(
                            (got as f64 - want).abs() <= tol && (got - scalar).abs() as f64 <= 2.0 * tol,
                            "{} {ty} k={k} {nrows}x{ntok} r={r} t={t}: {got} vs scalar {scalar}, exact {want}",
                            kern.name()
                        );
                    }
                    for g in 0..gap {
                        prop_assert_eq!(out[t * stride + nrows + g].to_bits(), sentinel.to_bits());
                    }
                }
            }
        }
    }
    Ok(())
}

fn quant_k(rng: &mut TestRng, ty: GgmlType, ki: usize) -> usize {
    if ty.block_size() == 256 {
        return K_KS
            .get(ki)
            .copied()
            .unwrap_or_else(|| 256 * rng.random_range(1..=12));
    }
    QUANT_KS
        .get(ki)
        .copied()
        .unwrap_or_else(|| 32 * rng.random_range(1..=80))
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn quant_vec_dot_matches_reference(seed: u64, ki in 0..8usize, ti in 0..8usize) {
        let mut rng = rng(seed);
        let ty = QUANT_TYPES[ti];
        let k = quant_k(&mut rng, ty, ki);
        let w = random_weight_row(&mut rng, ty, k);
        let a = random_act_row(&mut rng, Kernels::vec_dot_type(ty), k);
        check_dot(ty, k, &w, &a)?;
    }

    #[test]
    fn float_vec_dot_matches_reference(seed: u64, ki in 0..10usize, ti in 0..3usize) {
        let mut rng = rng(seed);
        let (ty, k) = (FLOAT_TYPES[ti], FLOAT_KS[ki]);
        let w = random_weight_row(&mut rng, ty, k);
        let a = random_act_row(&mut rng, GgmlType::F32, k);
        check_dot(ty, k, &w, &a)?;
    }

    #[test]
    fn quant_matmul_matches_reference(
        seed: u64, ki in 0..8usize, ti in 0..8usize, nrows in 1..=9usize, ntok in 1..=9usize,
        gap in 0..3usize,
    ) {
        let mut rng = rng(seed);
        let k = quant_k(&mut rng, QUANT_TYPES[ti], ki);
        check_matmul(&mut rng, QUANT_TYPES[ti], k, nrows, ntok, gap)?;
    }

    #[test]
    fn float_matmul_matches_reference(
        seed: u64, ki in 0..10usize, ti in 0..3usize, nrows in 1..=9usize, ntok in 1..=9usize,
        gap in 0..3usize,
    ) {
        let mut rng = rng(seed);
        check_matmul(&mut rng, FLOAT_TYPES[ti], FLOAT_KS[ki], nrows, ntok, gap)?;
    }
}

/// Shapes large enough to cross the row blocks and token chunks of the tiled kernels.
#[test]
fn large_matmul_shapes_match_reference() {
    let mut rng = rng(7);
    for ty in QUANT_TYPES.into_iter().chain(FLOAT_TYPES) {
        for (k, nrows, ntok) in [(576usize, 101, 13), (64, 700, 5), (1536, 37, 2)] {
            // k-quant rows are whole 256-value super-blocks.
            let k = if ty.block_size() == 256 {
                k.div_ceil(256) * 256
            } else {
                k
            };
            check_matmul(&mut rng, ty, k, nrows, ntok, 1).unwrap();
        }
    }
}

/// Every shape around the tiles of the x86 matmuls: rows 1..=17 (decode tiles of 3 or 4 rows,
/// prefill tiles of 2 or 4, row blocks of about 16 KiB of weights) by tokens 1..=9 (chunks of
/// 4), for one, two and many blocks per row of every weight type. With many blocks a row
/// block holds only 4 to 12 rows, so the sweep also crosses row-block boundaries with partial
/// tiles on either side.
#[test]
fn matmul_tile_boundaries_match_reference() {
    let rows: Vec<usize> = (1..=17).collect();
    let toks: Vec<usize> = (1..=9).collect();
    let mut rng = rng(20);
    for ty in QUANT_TYPES.into_iter().chain(FLOAT_TYPES) {
        let ks: &[usize] = match ty.block_size() {
            256 => &[256, 512, 2304],
            32 => &[32, 64, 2304],
            // Float rows: under one 8-lane vector, one, two, and many with a tail of 3.
            _ => &[7, 8, 16, 1027],
        };
        for &k in ks {
            check_matmul_shapes(&mut rng, ty, k, &rows, &toks, 1).unwrap();
        }
    }
}

#[test]
fn empty_matmul_is_a_no_op() {
    for kern in tables() {
        let mut out = [1.0f32; 3];
        kern.matmul(GgmlType::Q4_1, 32, &[], 0, &[0; 36], 1, &mut out, 3);
        kern.matmul(GgmlType::Q8_0, 32, &[0; 34], 1, &[], 0, &mut out, 3);
        assert_eq!(out, [1.0; 3]);
    }
}

#[test]
#[should_panic(expected = "weights")]
fn matmul_rejects_short_weights() {
    let mut out = [0f32; 2];
    Kernels::detect().matmul(GgmlType::Q4_1, 32, &[0; 20], 2, &[0; 36], 1, &mut out, 2);
}

#[test]
#[should_panic(expected = "output")]
fn matmul_rejects_short_output() {
    let mut out = [0f32; 3];
    Kernels::detect().matmul(GgmlType::Q4_0, 32, &[0; 36], 2, &[0; 68], 2, &mut out, 2);
}
