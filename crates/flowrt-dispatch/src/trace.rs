//! Chrome trace-event JSON (the format Perfetto and chrome://tracing open): one complete
//! ("X") event per runlist and per op, on the thread that ran it.

use std::cell::Cell;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use crate::backend::Batch;
use crate::cut::Runlist;

/// Most events one trace keeps; later ones are counted as dropped, so a long-running server
/// cannot grow a trace without bound.
pub const MAX_EVENTS: usize = 4_000_000;

#[derive(Clone, Debug)]
enum Args {
    Runlist {
        index: usize,
        count: usize,
        layers: Option<(usize, usize)>,
        tokens: usize,
        sequences: usize,
        ok: bool,
    },
    Op {
        group: usize,
        layer: Option<usize>,
    },
}

#[derive(Clone, Debug)]
struct Event {
    name: &'static str,
    ts_us: f64,
    dur_us: f64,
    tid: u32,
    args: Args,
}

/// Recorded spans, written out with [`Trace::write`].
#[derive(Debug)]
pub struct Trace {
    t0: Instant,
    events: Vec<Event>,
    dropped: u64,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

thread_local! {
    static THREAD_INDEX: Cell<u32> = const { Cell::new(0) };
}
static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);

/// A small stable number for the calling thread (1, 2, ...).
fn thread_index() -> u32 {
    THREAD_INDEX.with(|t| {
        if t.get() == 0 {
            t.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

impl Trace {
    pub fn new() -> Trace {
        Trace {
            t0: Instant::now(),
            events: Vec::with_capacity(1 << 12),
            dropped: 0,
        }
    }

    fn push(&mut self, name: &'static str, start: Instant, end: Instant, args: Args) {
        if self.events.len() >= MAX_EVENTS {
            self.dropped += 1;
            return;
        }
        let us = |t: Instant| t.saturating_duration_since(self.t0).as_secs_f64() * 1e6;
        self.events.push(Event {
            name,
            ts_us: us(start),
            dur_us: (end.saturating_duration_since(start)).as_secs_f64() * 1e6,
            tid: thread_index(),
            args,
        });
    }

    /// A runlist's span (submit to completion or failure).
    pub fn runlist(&mut self, rl: &Runlist, batch: &Batch, ok: bool, start: Instant, end: Instant) {
        self.push(
            "runlist",
            start,
            end,
            Args::Runlist {
                index: rl.index,
                count: rl.count,
                layers: rl.layers,
                tokens: batch.tokens.len(),
                sequences: batch.spans.len(),
                ok,
            },
        );
    }

    /// One op's span.
    pub fn op(
        &mut self,
        name: &'static str,
        group: usize,
        layer: Option<usize>,
        start: Instant,
        end: Instant,
    ) {
        self.push(name, start, end, Args::Op { group, layer });
    }

    /// Events recorded (and dropped past [`MAX_EVENTS`]).
    pub fn len(&self) -> usize {
        self.events.len()
    }
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The trace as Chrome trace-event JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let mut out = Vec::with_capacity(self.events.len() + 1);
        out.push(serde_json::json!({
            "name": "process_name", "ph": "M", "pid": 1, "tid": 0,
            "args": {"name": "flowrt"}
        }));
        for e in &self.events {
            let (cat, args) = match &e.args {
                Args::Runlist {
                    index,
                    count,
                    layers,
                    tokens,
                    sequences,
                    ok,
                } => (
                    "runlist",
                    serde_json::json!({
                        "index": index, "count": count,
                        "first_layer": layers.map(|l| l.0), "last_layer": layers.map(|l| l.1),
                        "tokens": tokens, "sequences": sequences, "ok": ok,
                    }),
                ),
                Args::Op { group, layer } => {
                    ("op", serde_json::json!({"group": group, "layer": layer}))
                }
            };
            out.push(serde_json::json!({
                "name": e.name, "cat": cat, "ph": "X", "pid": 1, "tid": e.tid,
                "ts": e.ts_us, "dur": e.dur_us, "args": args,
            }));
        }
        serde_json::json!({
            "traceEvents": out,
            "displayTimeUnit": "ms",
            "otherData": {"dropped_events": self.dropped},
        })
    }

    /// Write the trace to `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        serde_json::to_writer(&mut f, &self.to_json())?;
        f.flush()
    }
}
