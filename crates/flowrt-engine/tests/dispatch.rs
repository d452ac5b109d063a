//! The dispatcher against a misbehaving device (issue: bounded runlists with deadlines).
//!
//! The model is the 42-layer, 16:2-GQA Llama fixture (MiniCPM5-2B's depth and GQA ratio in
//! miniature). The device is the CPU backend wrapped by `FaultBackend`, which hangs or faults
//! where it is told to.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flowrt_cpu::CpuBackend;
use flowrt_dispatch::{DispatchOptions, FaultBackend, FaultScope, FaultSpec, Inject, StuckGate};
use flowrt_engine::{EngineError, EngineOptions, KvPrecision, LoadedModel, Session};

const DEADLINE: Duration = Duration::from_millis(150);

fn model() -> LoadedModel {
    LoadedModel::load(&common::fixture("families/llama-42l")).unwrap()
}

fn opts(max_layers: Option<usize>, retry: bool) -> EngineOptions {
    EngineOptions {
        threads: 2,
        kv: KvPrecision::F32,
        dispatch: DispatchOptions {
            max_runlist_layers: max_layers,
            deadline: Some(DEADLINE),
            retry,
            ..DispatchOptions::default()
        },
        ..EngineOptions::default()
    }
}

/// A session on the CPU wrapped by a fault-injecting backend, and the handle to its faults.
fn faulty(m: &LoadedModel, o: &EngineOptions, spec: FaultSpec) -> (Session, Arc<Mutex<FaultSpec>>) {
    let (s, handle, _) = faulty_gated(m, o, spec);
    (s, handle)
}

/// [`faulty`], with the gate that releases stuck calls.
fn faulty_gated(
    m: &LoadedModel,
    o: &EngineOptions,
    spec: FaultSpec,
) -> (Session, Arc<Mutex<FaultSpec>>, StuckGate) {
    let cpu =
        CpuBackend::from_settings(m.model.clone(), &o.backend_settings(m.n_ctx(o).unwrap(), 1))
            .unwrap();
    let fb = FaultBackend::new(cpu, spec);
    let handle = fb.spec_handle();
    let gate = fb.stuck_gate();
    (
        Session::with_backend(m, o, Box::new(fb)).unwrap(),
        handle,
        gate,
    )
}

/// 38 prompt tokens, as in the thread.
fn prompt() -> Vec<u32> {
    (0..38).map(|i| (i * 7 + 3) % 300).collect()
}

/// Logits after the prompt and after one decode token, on the plain CPU backend in one runlist.
fn reference(m: &LoadedModel) -> (Vec<f32>, Vec<f32>) {
    let mut s = Session::new(m, &opts(None, false)).unwrap();
    let a = s.feed(&prompt()).unwrap().to_vec();
    let b = s.feed(&[42]).unwrap().to_vec();
    (a, b)
}

/// The thread's device: runlists of more than 36 layers hang on decode.
fn thread_device() -> FaultSpec {
    FaultSpec {
        max_depth: Some((36, FaultScope::Decode)),
        ..FaultSpec::default()
    }
}

/// Reproduction of the MiniCPM5 port thread: monolithic dispatch of all 42 layers passes
/// prefill and fails on the first decode token; 21 + 21 layers decode, with logits equal to the
/// unchunked CPU run bit for bit.
#[test]
fn minicpm5_thread_monolithic_decode_fails_and_21_plus_21_succeeds() {
    let m = model();
    let (want_prefill, want_decode) = reference(&m);

    // Monolithic, no retries: what the closed runtime did.
    let (mut s, _) = faulty(&m, &opts(None, false), thread_device());
    assert_eq!(s.dispatcher().runlist_count(), 1);
    let got = s.feed(&prompt()).expect("prefill passes").to_vec();
    assert_eq!(got, want_prefill);
    let t0 = Instant::now();
    let e = s.feed(&[42]).unwrap_err();
    let waited = t0.elapsed();
    let msg = e.to_string();
    assert!(matches!(e, EngineError::Dispatch(_)), "{e:?}");
    assert!(
        msg.contains("runlist 1/1")
            && msg.contains("layers 0–41")
            && msg.contains("missed its deadline"),
        "{msg}"
    );
    assert!(
        waited >= DEADLINE,
        "the hang is detected at the deadline, not before"
    );
    assert_eq!(
        s.n_past(),
        38,
        "a failed step leaves the sequence where it was"
    );

    // 21 + 21: decode succeeds and matches exactly.
    let (mut s, _) = faulty(&m, &opts(Some(21), false), thread_device());
    assert_eq!(s.dispatcher().runlist_count(), 2);
    assert_eq!(s.feed(&prompt()).unwrap(), &want_prefill[..]);
    assert_eq!(s.feed(&[42]).unwrap(), &want_decode[..]);
}

/// A device whose `cancel` drains the work a missed deadline left on its queue (as a GPU's
/// must) is given the failed runlist's limit again for it: here the drain ends 150 + 320 ms
/// after the runlist started, past its watchdog limit (150 ms deadline + 250 ms grace), and
/// the step still recovers at 21 layers instead of losing the device.
#[test]
fn a_cancel_that_drains_the_queue_gets_its_own_watchdog_limit() {
    let m = model();
    let (_, want_decode) = reference(&m);
    let (mut s, _) = faulty(
        &m,
        &opts(None, true),
        FaultSpec {
            slow_cancel: Some(Duration::from_millis(320)),
            ..thread_device()
        },
    );
    s.feed(&prompt()).unwrap();
    assert_eq!(s.feed(&[42]).unwrap(), &want_decode[..]);
    assert_eq!(s.dispatcher().depth(), Some(21));
    assert!(!s.dispatcher().device_lost());
}

/// With retries on (the default), monolithic dispatch recovers by itself: the failed decode
/// step is rerun at 21 layers per runlist, and later steps keep that depth.
#[test]
fn retry_at_half_depth_recovers_and_keeps_the_depth() {
    let m = model();
    let (_, want_decode) = reference(&m);
    let (mut s, _) = faulty(&m, &opts(None, true), thread_device());
    s.feed(&prompt()).unwrap();
    assert_eq!(s.feed(&[42]).unwrap(), &want_decode[..]);
    assert_eq!(s.dispatcher().depth(), Some(21));
    s.feed(&[43]).unwrap();
    assert_eq!(
        s.dispatcher().depth(),
        Some(21),
        "no new failure, no further halving"
    );
}

/// An injected hang at layer 17's attention, only in runlists deeper than 10 layers: caught at
/// the deadline, retried at 21 (still hangs) and 10 (succeeds), logits exact.
#[test]
fn depth_dependent_hang_is_caught_and_retried_until_it_passes() {
    let m = model();
    let (want_prefill, _) = reference(&m);
    let spec = FaultSpec {
        hang: Some(Inject {
            layer: 17,
            op: "attention",
            only_deeper_than: Some(10),
            scope: FaultScope::All,
        }),
        ..FaultSpec::default()
    };
    let (mut s, _) = faulty(&m, &opts(None, true), spec);
    assert_eq!(s.feed(&prompt()).unwrap(), &want_prefill[..]);
    assert_eq!(s.dispatcher().depth(), Some(10));
}

/// A persistent hang fails the request after retrying down to one layer per runlist, with an
/// error naming the layer and op; the session stays consistent and serves again once the
/// device is healthy.
#[test]
fn persistent_hang_fails_clearly_and_the_session_recovers() {
    let m = model();
    let (want_prefill, want_decode) = reference(&m);
    let (mut s, handle) = faulty(&m, &opts(None, true), FaultSpec::default());
    assert_eq!(s.feed(&prompt()).unwrap(), &want_prefill[..]);
    *handle.lock().unwrap() = FaultSpec {
        hang: Some(Inject {
            layer: 17,
            op: "attention",
            only_deeper_than: None,
            scope: FaultScope::Decode,
        }),
        ..FaultSpec::default()
    };
    let e = s.feed(&[42]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("layer 17")
            && msg.contains("`attention`")
            && msg.contains("missed its deadline"),
        "{msg}"
    );
    let EngineError::Dispatch(d) = &e else {
        panic!("{e:?}")
    };
    // 42 -> 21 -> 10 -> 5 -> 2 -> 1 layers per runlist: five earlier tries, then the last.
    let depths: Vec<_> = d.attempts.iter().map(|a| a.depth).collect();
    assert_eq!(depths, [None, Some(21), Some(10), Some(5), Some(2)]);
    assert_eq!(d.runlist.layers, Some((17, 17)));
    assert_eq!(d.error.layer(), Some(17));
    assert_eq!(s.n_past(), 38);

    // The device heals: the same session decodes, and its cache was not corrupted.
    *handle.lock().unwrap() = FaultSpec::default();
    assert_eq!(s.feed(&[42]).unwrap(), &want_decode[..]);
}

/// A device fault (not a hang) is reported at once with its layer and op.
#[test]
fn injected_fault_names_layer_and_op() {
    let m = model();
    let spec = FaultSpec {
        fault: Some(Inject {
            layer: 30,
            op: "matmul_down",
            only_deeper_than: None,
            scope: FaultScope::All,
        }),
        ..FaultSpec::default()
    };
    let (mut s, _) = faulty(&m, &opts(Some(21), false), spec);
    let t0 = Instant::now();
    let e = s.feed(&prompt()).unwrap_err().to_string();
    assert!(
        t0.elapsed() < DEADLINE * 10,
        "a fault does not wait for a deadline"
    );
    assert!(
        e.contains("runlist 2/2")
            && e.contains("layers 21–41")
            && e.contains("layer 30")
            && e.contains("`matmul_down`")
            && e.contains("injected fault"),
        "{e}"
    );
}

/// Bad input is never retried: it is an error of the request, not of the device.
#[test]
fn bad_input_is_not_retried() {
    let m = model();
    let (mut s, _) = faulty(&m, &opts(None, true), FaultSpec::default());
    let e = s.feed(&[1, 2, 100_000]).unwrap_err();
    let EngineError::Dispatch(d) = &e else {
        panic!("{e:?}")
    };
    assert!(d.attempts.is_empty());
    assert!(e.to_string().contains("100000"), "{e}");
}

/// The trace holds one span per runlist and, inside each, one span per op of its groups, in
/// plan order.
#[test]
fn trace_has_every_runlist_and_op_span_in_order() {
    let m = model();
    let o = EngineOptions {
        trace: true,
        ..opts(Some(21), false)
    };
    let mut s = Session::new(&m, &o).unwrap();
    s.feed(&prompt()).unwrap();
    s.feed(&[42]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    s.trace().unwrap().write(&path).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events: Vec<&serde_json::Value> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect();
    let runlists: Vec<_> = events.iter().filter(|e| e["cat"] == "runlist").collect();
    // Two steps (prefill, decode) of two runlists each.
    assert_eq!(runlists.len(), 4);
    let plan = &m.plan;
    let mut expected_ops = Vec::new();
    for (k, rl) in runlists.iter().enumerate() {
        assert_eq!(rl["args"]["index"], k % 2);
        assert_eq!(rl["args"]["ok"], true);
        let (first, last) = if k % 2 == 0 { (0, 20) } else { (21, 41) };
        assert_eq!(rl["args"]["first_layer"], first);
        assert_eq!(rl["args"]["last_layer"], last);
        let (t0, t1) = (
            rl["ts"].as_f64().unwrap(),
            rl["ts"].as_f64().unwrap() + rl["dur"].as_f64().unwrap(),
        );
        let ops: Vec<(String, u64)> = events
            .iter()
            .filter(|e| e["cat"] == "op")
            .filter(|e| {
                let ts = e["ts"].as_f64().unwrap();
                ts >= t0 && ts <= t1
            })
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["args"]["group"].as_u64().unwrap(),
                )
            })
            .collect();
        expected_ops.clear();
        let groups = if k % 2 == 0 {
            0..43
        } else {
            43..plan.groups.len()
        };
        for g in groups {
            for op in &plan.groups[g].ops {
                expected_ops.push((op.name().to_string(), g as u64));
            }
        }
        assert_eq!(ops, expected_ops, "runlist {k}");
        let tid = rl["tid"].clone();
        assert!(events
            .iter()
            .filter(|e| e["cat"] == "op")
            .all(|e| e["tid"] == tid));
    }
}

/// The CPU backend's own deadline check (no fault injected): a runlist whose deadline passes
/// stops before its next op, and the error says how long it had run, where it stopped and
/// that it is a timeout.
#[test]
fn cpu_runlist_past_its_deadline_reports_how_long_it_ran() {
    let m = model();
    let o = EngineOptions {
        dispatch: DispatchOptions {
            deadline: Some(Duration::from_nanos(1)),
            retry: false,
            ..DispatchOptions::default()
        },
        ..opts(None, false)
    };
    let mut s = Session::new(&m, &o).unwrap();
    let t0 = Instant::now();
    let e = s.feed(&prompt()).unwrap_err();
    let elapsed = t0.elapsed();
    let msg = e.to_string();
    assert!(msg.contains("missed its deadline"), "{msg}");
    let EngineError::Dispatch(d) = &e else {
        panic!("{e:?}")
    };
    let flowrt_dispatch::DeviceError::Timeout { waited, op, .. } = &d.error else {
        panic!("{:?}", d.error)
    };
    assert!(op.is_some(), "the op that was due is named: {msg}");
    assert!(
        *waited > Duration::ZERO && *waited <= elapsed,
        "waited {waited:?} is the runlist's running time (the call took {elapsed:?}): {msg}"
    );
    assert_eq!(
        s.n_past(),
        0,
        "a failed step leaves the sequence where it was"
    );
}

/// Runs `f` on a thread and returns what it returns, failing the test when it takes longer than
/// `limit`: a hang must fail the test, not stall the suite.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("hung: did not return within {limit:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("panicked (see above)"),
    }
}

/// Stuck at layer 17's attention on decode steps: `wait` never returns until released.
fn stuck_at_17() -> FaultSpec {
    FaultSpec {
        stuck: Some(Inject {
            layer: 17,
            op: "attention",
            only_deeper_than: None,
            scope: FaultScope::Decode,
        }),
        ..FaultSpec::default()
    }
}

/// Regression (issue 20): deadlines depended on the backend's cooperation, so a backend whose
/// `wait` never returns (a stuck device, a driver bug) hung the request forever. Now the
/// dispatcher's watchdog gives up at the deadline plus its grace: the step fails naming the
/// runlist, is not retried (the backend is still held by the stuck call), the device is
/// marked lost and later steps fail at once; when the backend comes back late it is taken
/// back, and it serves again with exact logits.
#[test]
fn stuck_wait_is_abandoned_by_the_watchdog_and_a_late_device_is_taken_back() {
    let m = model();
    let (want_prefill, want_decode) = reference(&m);
    const GRACE: Duration = Duration::from_millis(100);
    let o = EngineOptions {
        dispatch: DispatchOptions {
            watchdog_grace: Some(GRACE),
            ..opts(None, true).dispatch
        },
        ..opts(None, true)
    };
    let (mut s, handle, gate) = faulty_gated(&m, &o, FaultSpec::default());
    assert_eq!(s.feed(&prompt()).unwrap(), &want_prefill[..]);
    *handle.lock().unwrap() = stuck_at_17();

    let t0 = Instant::now();
    let (mut s, r) = within(Duration::from_secs(20), move || {
        let r = s.feed(&[42]).map(|l| l.to_vec());
        (s, r)
    });
    let e = r.unwrap_err();
    let waited = t0.elapsed();
    let msg = e.to_string();
    assert!(
        waited >= DEADLINE + GRACE && waited < DEADLINE + GRACE + Duration::from_secs(2),
        "the watchdog gives up at the deadline plus its grace, took {waited:?}: {msg}"
    );
    assert!(
        msg.contains("runlist 1/1")
            && msg.contains("layers 0–41")
            && msg.contains("did not return")
            && msg.contains("considered lost"),
        "{msg}"
    );
    let EngineError::Dispatch(d) = &e else {
        panic!("{e:?}")
    };
    assert!(
        matches!(d.error, flowrt_dispatch::DeviceError::Lost { .. }),
        "{:?}",
        d.error
    );
    assert!(d.attempts.is_empty(), "a lost device is not retried");
    assert!(s.dispatcher().device_lost());
    assert_eq!(
        s.n_past(),
        38,
        "a failed step leaves the sequence where it was"
    );

    // While the backend stays stuck, steps fail at once and say why.
    let t0 = Instant::now();
    let msg = s.feed(&[42]).unwrap_err().to_string();
    assert!(t0.elapsed() < DEADLINE, "took {:?}", t0.elapsed());
    assert!(
        msg.contains("the device is lost") && msg.contains("has not returned"),
        "{msg}"
    );

    // The device comes back late: the next step takes it back, and decodes exactly.
    *handle.lock().unwrap() = FaultSpec::default();
    gate.release();
    let t0 = Instant::now();
    let got = loop {
        match s.feed(&[42]) {
            Ok(l) => break l.to_vec(),
            Err(e) if t0.elapsed() < Duration::from_secs(5) => {
                assert!(e.to_string().contains("the device is lost"), "{e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("the released backend was not taken back: {e}"),
        }
    };
    assert_eq!(got, want_decode);
    assert!(!s.dispatcher().device_lost());
    assert_eq!(s.n_past(), 39);
}

/// A session whose backend never comes back can still be dropped: the drop does not wait for
/// the stuck call.
#[test]
fn session_with_a_backend_stuck_forever_drops_without_waiting() {
    let m = model();
    let o = EngineOptions {
        dispatch: DispatchOptions {
            watchdog_grace: Some(Duration::from_millis(50)),
            ..opts(None, false).dispatch
        },
        ..opts(None, false)
    };
    let (mut s, _, _gate) = faulty_gated(&m, &o, stuck_at_17());
    s.feed(&prompt()).unwrap();
    let (s, r) = within(Duration::from_secs(20), move || {
        let r = s.feed(&[42]).map(|l| l.to_vec());
        (s, r)
    });
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("considered lost"), "{msg}");
    let t0 = Instant::now();
    within(Duration::from_secs(20), move || drop(s));
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
}
