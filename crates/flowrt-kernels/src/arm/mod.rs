//! aarch64 tables. Advanced SIMD (NEON) is part of the aarch64 baseline, so the NEON table is
//! always available there.

// Tails index two slices in step.
#![allow(clippy::needless_range_loop)]

mod attn;
mod neon;
pub(crate) mod x8;

use std::sync::OnceLock;

use crate::Kernels;

/// The intrinsics the NEON files use (one place to point it at).
use core::arch::aarch64 as arch;

pub(crate) fn table() -> Option<&'static Kernels> {
    static NEON: OnceLock<Option<Kernels>> = OnceLock::new();
    NEON.get_or_init(|| std::arch::is_aarch64_feature_detected!("neon").then(neon::build))
        .as_ref()
}
