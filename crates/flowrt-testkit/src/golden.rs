//! Bounds of golden tests (flowrt against HF transformers, teacher-forced): one helper used by
//! every golden test, so each path asserts what it achieves on every metric.
//!
//! Each bound is set from a measured value with a margin that covers the summation-order
//! differences between kernel tables and hosts, and no more: the test files document the
//! measured value beside each bound, and `docs/testing.md` lists the mutations each bound
//! catches (an RMSNorm epsilon x10, a RoPE base x1.01, an attention scale x(1 + 1e-3)).

/// What a teacher-forced comparison measured (the fields of flowrt's `VerifyReport`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agreement {
    pub positions: usize,
    pub top1: f64,
    /// Mean over positions of KL(reference ‖ flowrt).
    pub mean_kl: f64,
    pub max_kl: f64,
    pub max_abs_logit_err: f64,
}

/// Bounds for one path of one model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    /// Positions compared, exactly (a fixture that lost prompts must not pass quietly).
    pub positions: usize,
    pub min_top1: f64,
    pub max_mean_kl: f64,
    pub max_max_kl: f64,
    pub max_abs_logit_err: f64,
}

/// Asserts `got` within `bounds`, naming every metric that is out of bounds (and printing all
/// of them either way, so a passing run shows its margins).
pub fn check(what: &str, got: &Agreement, bounds: &Bounds) {
    let summary = format!(
        "{what}: {} positions, top-1 {:.4} (>= {:.4}), mean KL {:.3e} (<= {:.1e}), max KL {:.3e} \
         (<= {:.1e}), max |logit err| {:.3e} (<= {:.1e})",
        got.positions,
        got.top1,
        bounds.min_top1,
        got.mean_kl,
        bounds.max_mean_kl,
        got.max_kl,
        bounds.max_max_kl,
        got.max_abs_logit_err,
        bounds.max_abs_logit_err
    );
    eprintln!("{summary}");
    let mut out = Vec::new();
    if got.positions != bounds.positions {
        out.push(format!(
            "positions {} != {}",
            got.positions, bounds.positions
        ));
    }
    // `within` is false for NaN, so a NaN metric fails.
    let within = |x: f64, max: f64| x <= max;
    if !within(bounds.min_top1, got.top1) {
        out.push(format!("top-1 {} < {}", got.top1, bounds.min_top1));
    }
    if !within(got.mean_kl, bounds.max_mean_kl) {
        out.push(format!(
            "mean KL {:e} > {:e}",
            got.mean_kl, bounds.max_mean_kl
        ));
    }
    if !within(got.max_kl, bounds.max_max_kl) {
        out.push(format!("max KL {:e} > {:e}", got.max_kl, bounds.max_max_kl));
    }
    if !within(got.max_abs_logit_err, bounds.max_abs_logit_err) {
        out.push(format!(
            "max |logit err| {:e} > {:e}",
            got.max_abs_logit_err, bounds.max_abs_logit_err
        ));
    }
    assert!(out.is_empty(), "{what}: {}\n{summary}", out.join("; "));
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bounds = Bounds {
        positions: 10,
        min_top1: 1.0,
        max_mean_kl: 1e-6,
        max_max_kl: 1e-5,
        max_abs_logit_err: 1e-3,
    };
    const OK: Agreement = Agreement {
        positions: 10,
        top1: 1.0,
        mean_kl: 1e-7,
        max_kl: 1e-6,
        max_abs_logit_err: 1e-4,
    };

    #[test]
    fn within_bounds_passes() {
        check("ok", &OK, &B);
    }

    #[test]
    fn each_metric_out_of_bounds_fails() {
        let bad = [
            Agreement { positions: 9, ..OK },
            Agreement { top1: 0.9, ..OK },
            Agreement {
                mean_kl: 2e-6,
                ..OK
            },
            Agreement { max_kl: 2e-5, ..OK },
            Agreement {
                max_abs_logit_err: 2e-3,
                ..OK
            },
            Agreement {
                mean_kl: f64::NAN,
                ..OK
            },
            Agreement {
                top1: f64::NAN,
                ..OK
            },
        ];
        for a in bad {
            let r = std::panic::catch_unwind(|| check("bad", &a, &B));
            assert!(r.is_err(), "{a:?} passed");
        }
    }
}
