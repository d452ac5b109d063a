//! Prometheus metrics, written as text by hand: counters, gauges and two histograms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::error::ErrorKind;

/// Upper bounds (seconds) of the time-to-first-token buckets.
const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Upper bounds (tokens per second) of the per-request decode speed buckets.
const TPS_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

#[derive(Clone, Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// (bounds.len()) per-bucket counts, not cumulative.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, model: &str) {
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{model=\"{model}\",le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{model=\"{model}\",le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{{model=\"{model}\"}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{model=\"{model}\"}} {}", self.count);
    }
}

#[derive(Default)]
struct Inner {
    /// (route, status) → count.
    requests: BTreeMap<(String, u16), u64>,
    errors: BTreeMap<ErrorKind, u64>,
    /// Bytes of prompt text handed to a tokenizer.
    tokenized_bytes: u64,
    /// Per model.
    prompt_tokens: BTreeMap<String, u64>,
    completion_tokens: BTreeMap<String, u64>,
    /// (model, finish reason) → count.
    finished: BTreeMap<(String, &'static str), u64>,
    ttft: BTreeMap<String, Histogram>,
    tps: BTreeMap<String, Histogram>,
}

/// Per-model gauges read at scrape time.
pub struct ModelGauges {
    pub model: String,
    pub queued: usize,
    pub active: usize,
    pub loaded: bool,
    /// Requests waiting for room in the memory budget to load it.
    pub waiting_memory: usize,
}

/// The server's counters and histograms.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    pub fn request(&self, route: &str, status: u16, error: Option<ErrorKind>) {
        self.with(|m| {
            *m.requests.entry((route.to_string(), status)).or_default() += 1;
            if let Some(k) = error {
                *m.errors.entry(k).or_default() += 1;
            }
        });
    }

    /// `bytes` of prompt text about to be tokenized.
    pub fn tokenized(&self, bytes: usize) {
        self.with(|m| m.tokenized_bytes += bytes as u64);
    }

    /// Tokens an embedding request ran (counted as prompt tokens).
    pub fn embedded(&self, model: &str, tokens: usize) {
        self.with(|m| {
            *m.prompt_tokens.entry(model.to_string()).or_default() += tokens as u64;
        });
    }

    /// One finished sequence: tokens in and out, time to first token, decode speed.
    pub fn sequence(
        &self,
        model: &str,
        prompt_tokens: usize,
        completion_tokens: usize,
        finish: &'static str,
        ttft_s: Option<f64>,
        tokens_per_s: Option<f64>,
    ) {
        self.with(|m| {
            *m.prompt_tokens.entry(model.to_string()).or_default() += prompt_tokens as u64;
            *m.completion_tokens.entry(model.to_string()).or_default() += completion_tokens as u64;
            *m.finished.entry((model.to_string(), finish)).or_default() += 1;
            if let Some(t) = ttft_s {
                m.ttft
                    .entry(model.to_string())
                    .or_insert_with(|| Histogram::new(TTFT_BUCKETS))
                    .observe(t);
            }
            if let Some(r) = tokens_per_s {
                m.tps
                    .entry(model.to_string())
                    .or_insert_with(|| Histogram::new(TPS_BUCKETS))
                    .observe(r);
            }
        });
    }

    /// The Prometheus text exposition.
    pub fn render(&self, gauges: &[ModelGauges]) -> String {
        let mut out = String::new();
        self.with(|m| {
            let _ = writeln!(out, "# HELP flowrt_requests_total HTTP requests by route and status.");
            let _ = writeln!(out, "# TYPE flowrt_requests_total counter");
            for ((route, status), n) in &m.requests {
                let _ = writeln!(
                    out,
                    "flowrt_requests_total{{route=\"{}\",status=\"{status}\"}} {n}",
                    escape(route)
                );
            }
            let _ = writeln!(out, "# HELP flowrt_errors_total Error responses by kind.");
            let _ = writeln!(out, "# TYPE flowrt_errors_total counter");
            for (k, n) in &m.errors {
                let _ = writeln!(out, "flowrt_errors_total{{kind=\"{}\"}} {n}", k.as_str());
            }
            let _ = writeln!(out, "# HELP flowrt_tokenized_prompt_bytes_total Bytes of prompt text handed to a tokenizer (prompts refused by size are not).");
            let _ = writeln!(out, "# TYPE flowrt_tokenized_prompt_bytes_total counter");
            let _ = writeln!(out, "flowrt_tokenized_prompt_bytes_total {}", m.tokenized_bytes);
            let counters = [
                ("flowrt_prompt_tokens_total", "Prompt tokens processed.", &m.prompt_tokens),
                ("flowrt_completion_tokens_total", "Tokens generated.", &m.completion_tokens),
            ];
            for (name, help, map) in counters {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} counter");
                for (model, n) in map {
                    let _ = writeln!(out, "{name}{{model=\"{}\"}} {n}", escape(model));
                }
            }
            let _ = writeln!(out, "# HELP flowrt_sequences_total Finished sequences by finish reason.");
            let _ = writeln!(out, "# TYPE flowrt_sequences_total counter");
            for ((model, finish), n) in &m.finished {
                let _ = writeln!(
                    out,
                    "flowrt_sequences_total{{model=\"{}\",finish=\"{finish}\"}} {n}",
                    escape(model)
                );
            }
            let _ = writeln!(out, "# HELP flowrt_time_to_first_token_seconds From a request's arrival at its model's scheduler to its first sampled token.");
            let _ = writeln!(out, "# TYPE flowrt_time_to_first_token_seconds histogram");
            for (model, h) in &m.ttft {
                h.write(&mut out, "flowrt_time_to_first_token_seconds", &escape(model));
            }
            let _ = writeln!(out, "# HELP flowrt_decode_tokens_per_second Decode speed of each finished sequence after its first token.");
            let _ = writeln!(out, "# TYPE flowrt_decode_tokens_per_second histogram");
            for (model, h) in &m.tps {
                h.write(&mut out, "flowrt_decode_tokens_per_second", &escape(model));
            }
        });
        type Gauge = (&'static str, &'static str, fn(&ModelGauges) -> usize);
        let gauge_defs: [Gauge; 4] = [
            (
                "flowrt_queue_depth",
                "Requests waiting for a sequence slot.",
                |g| g.queued,
            ),
            (
                "flowrt_active_sequences",
                "Sequences being generated.",
                |g| g.active,
            ),
            (
                "flowrt_model_loaded",
                "1 when the model is resident.",
                |g| g.loaded as usize,
            ),
            (
                "flowrt_requests_waiting_for_memory",
                "Requests waiting for room in the memory budget (--max-memory) to load the model.",
                |g| g.waiting_memory,
            ),
        ];
        for (name, help, get) in gauge_defs {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for g in gauges {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(&g.model), get(g));
            }
        }
        out
    }
}

/// Escape a Prometheus label value.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
