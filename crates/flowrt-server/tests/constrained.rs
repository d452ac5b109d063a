//! Constrained jobs through the scheduler's continuous batching on SmolLM2: sequences with
//! different constraints (and one without) share the batch, each answer follows its own
//! constraint, and a job whose `max_tokens` comes before its output is complete reports
//! Length.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{smollm2, N_CTX};
use flowrt_engine::BatchStepper;
use flowrt_engine::{ConstraintSpec, EngineOptions, FinishReason, LoadedModel};
use flowrt_sample::SamplerConfig;
use flowrt_server::scheduler::{Event, Job, Scheduler, SchedulerConfig, Summary};
use flowrt_server::Metrics;
use flowrt_text::ChatMessage;
use serde_json::{json, Value};
use tokio::sync::mpsc;

fn scheduler(model: &Arc<LoadedModel>, slots: usize) -> Scheduler {
    let opts = EngineOptions {
        threads: 2,
        n_ctx: Some(N_CTX),
        max_batch: 64,
        ..EngineOptions::default()
    };
    Scheduler::spawn(
        "smollm2".into(),
        model.clone(),
        Box::new(BatchStepper::new(model, &opts, slots).unwrap()),
        &SchedulerConfig {
            queue: 8,
            retry_after_s: 1,
        },
        Arc::new(Metrics::default()),
    )
    .unwrap()
}

fn chat(model: &LoadedModel, prompt: &str) -> Vec<u32> {
    let text = model
        .template
        .as_ref()
        .unwrap()
        .render(&[ChatMessage::new("user", prompt)], true)
        .unwrap();
    model.tokenizer.encode(&text, false, true).unwrap()
}

fn submit(
    s: &Scheduler,
    model: &LoadedModel,
    prompt: &str,
    spec: Option<&ConstraintSpec>,
    max_tokens: usize,
    seed: u64,
) -> mpsc::UnboundedReceiver<Event> {
    let (tx, rx) = mpsc::unbounded_channel();
    s.submit(Job {
        prompt: chat(model, prompt),
        max_tokens,
        sampler: SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(seed),
            ..SamplerConfig::default()
        },
        stop: Vec::new(),
        logprobs: Some(2),
        ignore_eos: false,
        constraint: spec.map(|s| model.guide().unwrap().compile(s).unwrap()),
        keep_special: false,
        events: tx,
    })
    .unwrap();
    rx
}

/// The job's whole text, logprob count and summary (panics if it fails or takes over 120 s).
fn wait_done(rx: &mut mpsc::UnboundedReceiver<Event>) -> (String, usize, Summary) {
    let t0 = Instant::now();
    let (mut text, mut n_logprobs) = (String::new(), 0);
    loop {
        match rx.try_recv() {
            Ok(Event::Text { text: t, logprobs }) => {
                text.push_str(&t);
                n_logprobs += logprobs.len();
            }
            Ok(Event::Done(s)) => return (text, n_logprobs, s),
            Ok(Event::Failed(e)) => panic!("the job failed: {e:?}"),
            Err(mpsc::error::TryRecvError::Empty) => {
                assert!(t0.elapsed() < Duration::from_secs(120), "the job finished");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("the scheduler dropped the job: {e}"),
        }
    }
}

#[test]
fn constrained_jobs_in_one_batch_each_follow_their_own_constraint() {
    let model = Arc::new(LoadedModel::load(&smollm2()).unwrap());
    let s = scheduler(&model, 4);
    let person = ConstraintSpec::JsonSchema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    }));
    let flags = ConstraintSpec::JsonSchema(json!({
        "type": "array",
        "items": {"type": "boolean"},
        "minItems": 2,
        "maxItems": 2
    }));
    for seed in 0..2 {
        // Submitted together: admitted into the same steps.
        let mut rx_person = submit(
            &s,
            &model,
            "Describe a person as JSON.",
            Some(&person),
            80,
            seed,
        );
        let mut rx_flags = submit(
            &s,
            &model,
            "Two yes/no answers as JSON.",
            Some(&flags),
            80,
            seed,
        );
        let mut rx_free = submit(&s, &model, "Tell me a story.", None, 24, seed);
        let (p, p_lp, p_sum) = wait_done(&mut rx_person);
        let (f, _, f_sum) = wait_done(&mut rx_flags);
        let (free, _, free_sum) = wait_done(&mut rx_free);
        eprintln!("seed {seed}: {p} | {f} | {free:?}");

        assert_eq!(p_sum.finish, FinishReason::Stop, "seed {seed}: {p}");
        let v: Value = serde_json::from_str(&p).unwrap_or_else(|e| panic!("{e}: {p}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 2, "{p}");
        let name = o["name"].as_str().unwrap();
        assert!((1..=12).contains(&name.chars().count()), "{p}");
        assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{p}");
        // One logprob per generated token, from the raw logits (finite: the model's own view).
        assert_eq!(p_lp, p_sum.completion_tokens);
        assert!(p_sum.constraint_compile_time > Duration::ZERO);

        assert_eq!(f_sum.finish, FinishReason::Stop, "seed {seed}: {f}");
        let v: Value = serde_json::from_str(&f).unwrap_or_else(|e| panic!("{e}: {f}"));
        let a = v.as_array().unwrap();
        assert!(a.len() == 2 && a.iter().all(Value::is_boolean), "{f}");

        // The unconstrained one is not forced into JSON.
        assert_eq!(free_sum.constraint_compile_time, Duration::ZERO);
        assert!(serde_json::from_str::<Value>(&free).is_err(), "{free}");
    }
}

#[test]
fn max_tokens_before_the_constraint_completes_is_length() {
    let model = Arc::new(LoadedModel::load(&smollm2()).unwrap());
    let s = scheduler(&model, 2);
    let spec = ConstraintSpec::JsonSchema(json!({
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 50}},
        "required": ["items"],
        "additionalProperties": false
    }));
    let mut rx = submit(&s, &model, "List fruits as JSON.", Some(&spec), 6, 1);
    let mut rx_obj = submit(
        &s,
        &model,
        "Say hi as JSON.",
        Some(&ConstraintSpec::JsonObject),
        200,
        1,
    );
    let (text, _, sum) = wait_done(&mut rx);
    assert_eq!(sum.finish, FinishReason::Length, "{text}");
    assert_eq!(sum.completion_tokens, 6);
    assert!(text.starts_with("{\"items\": ["), "{text}");
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");
    let (obj, _, sum) = wait_done(&mut rx_obj);
    assert_eq!(sum.finish, FinishReason::Stop, "{obj}");
    assert!(
        serde_json::from_str::<Value>(&obj).unwrap().is_object(),
        "{obj}"
    );
}
