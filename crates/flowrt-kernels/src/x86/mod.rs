//! x86-64 SIMD tables: AVX2 (+FMA+F16C), AVX-512 (F/BW/DQ/VL) and AVX-512 VNNI.
//!
//! Each table is built only after `is_x86_feature_detected!` confirmed every feature its
//! functions are compiled for (`#[target_feature]`), which is what makes calling them sound.
//! Nothing here is compiled with `target-cpu=native`.

#![deny(unsafe_op_in_unsafe_fn)]
// Tile kernels index accumulators by (row, token); index loops read better than iterator chains.
#![allow(clippy::needless_range_loop)]

pub(crate) mod avx2;
mod avx512;
mod elem;
pub(crate) mod q16;
mod q16k;
mod quant;
mod search;
pub(crate) mod x8;
pub(crate) mod x8_512;

use std::sync::OnceLock;

use crate::{Isa, Kernels};

fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

fn has_avx512() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vl")
}

fn has_avx512vnni() -> bool {
    has_avx512() && is_x86_feature_detected!("avx512vnni")
}

/// The table for `isa`, if this host can run it.
pub(crate) fn table(isa: Isa) -> Option<&'static Kernels> {
    static AVX2: OnceLock<Option<Kernels>> = OnceLock::new();
    static AVX512: OnceLock<Option<Kernels>> = OnceLock::new();
    static AVX512VNNI: OnceLock<Option<Kernels>> = OnceLock::new();
    match isa {
        Isa::Avx2 => AVX2
            .get_or_init(|| {
                // SAFETY: the host has AVX2, FMA and F16C.
                has_avx2().then(|| unsafe { avx2::build() }.with_matmul_paths())
            })
            .as_ref(),
        Isa::Avx512 => AVX512
            .get_or_init(|| {
                // SAFETY: the host has AVX2, FMA, F16C and AVX-512 F/BW/DQ/VL.
                has_avx512().then(|| unsafe { avx512::build(false) }.with_matmul_paths())
            })
            .as_ref(),
        Isa::Avx512Vnni => AVX512VNNI
            .get_or_init(|| {
                // SAFETY: as for AVX512, plus AVX-512 VNNI.
                has_avx512vnni().then(|| unsafe { avx512::build(true) }.with_matmul_paths())
            })
            .as_ref(),
        _ => None,
    }
}
