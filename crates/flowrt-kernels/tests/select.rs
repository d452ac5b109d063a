//! Table selection.

use flowrt_dtype::GgmlType;
use flowrt_kernels::{Isa, KernelError, Kernels};

#[test]
fn select_scalar_works() {
    let k = Kernels::select(Some("scalar")).unwrap();
    assert_eq!(k.isa(), Isa::Scalar);
    assert_eq!(k.name(), "scalar");
    assert!(std::ptr::eq(k, Kernels::scalar()));
}

#[test]
fn select_bogus_errors_clearly() {
    let err = Kernels::select(Some("bogus")).unwrap_err();
    assert_eq!(
        err,
        KernelError::UnknownIsa {
            name: "bogus".into()
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("bogus") && msg.contains("avx512vnni"), "{msg}");
}

#[test]
fn select_unavailable_names_missing_features() {
    for isa in Isa::ALL {
        let available = Kernels::available().iter().any(|k| k.isa() == isa);
        match Kernels::select(Some(isa.name())) {
            Ok(k) => {
                assert!(available);
                assert_eq!(k.isa(), isa);
            }
            Err(e) => {
                assert!(!available);
                assert!(matches!(e, KernelError::Unsupported { .. }), "{e}");
                assert!(e.to_string().contains(isa.name()), "{e}");
            }
        }
    }
}

/// A table compiled only for another architecture is "not built" here, not "missing CPU
/// features": on x86-64 the NEON table used to be reported as needing the `neon` feature.
#[test]
fn tables_of_other_architectures_are_not_built() {
    let other: &[Isa] = if cfg!(target_arch = "x86_64") {
        &[Isa::Neon]
    } else if cfg!(target_arch = "aarch64") {
        &[Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni]
    } else {
        &[Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni, Isa::Neon]
    };
    for &isa in other {
        match Kernels::select(Some(isa.name())) {
            Err(KernelError::Unsupported { missing, .. }) => assert_eq!(
                missing,
                format!("not built for {}", std::env::consts::ARCH),
                "{}",
                isa.name()
            ),
            other => panic!("{}: {other:?}", isa.name()),
        }
    }
}

#[test]
fn available_starts_with_scalar_and_best_is_default() {
    let all = Kernels::available();
    assert_eq!(all[0].isa(), Isa::Scalar);
    let best = Kernels::select(None).unwrap();
    assert!(std::ptr::eq(best, *all.last().unwrap()));
    println!(
        "available: {:?}",
        all.iter().map(|k| k.name()).collect::<Vec<_>>()
    );
    println!("cpu features: {:?}", Kernels::cpu_features());
}

#[test]
fn vec_dot_types_and_support() {
    assert_eq!(Kernels::vec_dot_type(GgmlType::Q4_0), GgmlType::Q8_0);
    assert_eq!(Kernels::vec_dot_type(GgmlType::Q8_0), GgmlType::Q8_0);
    assert_eq!(Kernels::vec_dot_type(GgmlType::Q4_1), GgmlType::Q8_1);
    assert_eq!(Kernels::vec_dot_type(GgmlType::Q5_0), GgmlType::Q8_0);
    assert_eq!(Kernels::vec_dot_type(GgmlType::Mxfp4), GgmlType::Q8_0);
    assert_eq!(Kernels::vec_dot_type(GgmlType::Q5_1), GgmlType::Q8_1);
    for t in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        assert_eq!(Kernels::vec_dot_type(t), GgmlType::Q8K);
    }
    for t in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        assert_eq!(Kernels::vec_dot_type(t), GgmlType::F32);
    }
    for t in GgmlType::ALL {
        let want = matches!(
            t,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::Q4K
                | GgmlType::Q5K
                | GgmlType::Q6K
                | GgmlType::Mxfp4
        );
        assert_eq!(Kernels::supports(t), want, "{t}");
        let q16 = want && !matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        assert_eq!(Kernels::supports_q16(t), q16, "{t}");
        let conv = want || matches!(t, GgmlType::Q8_1 | GgmlType::Q8K);
        assert_eq!(Kernels::supports_conversion(t), conv, "{t}");
    }
}

#[test]
fn isa_names_round_trip() {
    for isa in Isa::ALL {
        assert_eq!(Isa::from_name(isa.name()), Some(isa));
    }
    assert_eq!(Isa::from_name("AVX2"), Some(Isa::Avx2));
    assert_eq!(Isa::from_name("sse"), None);
}
