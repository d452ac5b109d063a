//! Chunked prefill in the scheduler's batched step, on SmolLM2 with tiny batches: a long prompt
//! admitted while another sequence decodes is fed over several steps, the decoding sequence
//! gets a token at every one of them, and both answers equal what each produces alone with an
//! unchunked batch; a sequence cancelled mid-prefill frees its slot and leaves what was fed
//! reusable; with more decodes than the batch holds, they take turns.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{smollm2, N_CTX};
use flowrt_engine::{
    BatchStepper, EngineError, EngineOptions, Fed, FinishReason, LoadedModel, OnFed, SlotWork,
    StepEngine,
};
use flowrt_sample::SamplerConfig;
use flowrt_server::scheduler::{Event, Job, Scheduler, SchedulerConfig, Summary};
use flowrt_server::Metrics;
use tokio::sync::mpsc;

/// What one step did with one sequence: (slot, tokens given, tokens fed, got logits).
type StepLog = Vec<(usize, usize, usize, bool)>;

/// A [`BatchStepper`] that records every step.
struct Recorder {
    inner: BatchStepper,
    steps: Arc<Mutex<Vec<StepLog>>>,
}

impl StepEngine for Recorder {
    fn slots(&self) -> usize {
        self.inner.slots()
    }
    fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }
    fn cached_prefix(&self, slot: usize, prompt: &[u32]) -> usize {
        self.inner.cached_prefix(slot, prompt)
    }
    fn truncate(&mut self, slot: usize, n: usize) {
        self.inner.truncate(slot, n);
    }
    fn step(&mut self, work: &[SlotWork<'_>], on_fed: &mut OnFed<'_>) {
        let mut log = StepLog::new();
        self.inner
            .step(work, &mut |i, fed: Result<Fed<'_>, EngineError>| {
                let w = work[i];
                match &fed {
                    Ok(Fed::All(_)) => log.push((w.slot, w.tokens.len(), w.tokens.len(), true)),
                    Ok(Fed::Part(n)) => log.push((w.slot, w.tokens.len(), *n, false)),
                    Err(e) => panic!("slot {} failed: {e}", w.slot),
                }
                on_fed(i, fed);
            });
        assert_eq!(log.len(), work.len(), "one report per work item");
        self.steps.lock().unwrap().push(log);
    }
}

fn opts(max_batch: usize) -> EngineOptions {
    EngineOptions {
        threads: 2,
        n_ctx: Some(N_CTX),
        max_batch,
        ..EngineOptions::default()
    }
}

fn scheduler(
    model: &Arc<LoadedModel>,
    max_batch: usize,
    slots: usize,
) -> (Scheduler, Arc<Mutex<Vec<StepLog>>>) {
    let steps = Arc::new(Mutex::new(Vec::new()));
    let engine = Recorder {
        inner: BatchStepper::new(model, &opts(max_batch), slots).unwrap(),
        steps: steps.clone(),
    };
    let s = Scheduler::spawn(
        "smollm2".into(),
        model.clone(),
        Box::new(engine),
        &SchedulerConfig {
            queue: 4,
            retry_after_s: 1,
        },
        Arc::new(Metrics::default()),
    )
    .unwrap();
    (s, steps)
}

fn submit(s: &Scheduler, prompt: &[u32], max_tokens: usize) -> mpsc::UnboundedReceiver<Event> {
    let (tx, rx) = mpsc::unbounded_channel();
    s.submit(Job {
        prompt: prompt.to_vec(),
        max_tokens,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        stop: Vec::new(),
        logprobs: None,
        ignore_eos: true,
        constraint: None,
        keep_special: false,
        events: tx,
    })
    .unwrap();
    rx
}

/// The job's summary (panics if it fails or takes over 120 s).
fn wait_done(rx: &mut mpsc::UnboundedReceiver<Event>) -> Summary {
    let t0 = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(Event::Text { .. }) => {}
            Ok(Event::Done(s)) => return s,
            Ok(Event::Failed(e)) => panic!("the job failed: {e:?}"),
            Err(mpsc::error::TryRecvError::Empty) => {
                assert!(t0.elapsed() < Duration::from_secs(120), "the job finished");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("the scheduler dropped the job: {e}"),
        }
    }
}

/// The tokens `prompt` generates alone, in one slot with an unchunked (256-token) batch.
fn alone(model: &Arc<LoadedModel>, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let (s, _) = scheduler(model, 256, 1);
    wait_done(&mut submit(&s, prompt, max_tokens)).tokens
}

fn wait_steps(steps: &Mutex<Vec<StepLog>>, n: usize) {
    let t0 = Instant::now();
    while steps.lock().unwrap().len() < n {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the scheduler stepped"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_long_prompt_is_fed_in_chunks_without_stalling_a_decoding_sequence() {
    const BATCH: usize = 8;
    let model = Arc::new(LoadedModel::load(&smollm2()).unwrap());
    let tok = &model.tokenizer;
    let prompt_a = tok.encode("The capital of France is", true, true).unwrap();
    let prompt_b = tok
        .encode(
            "Once upon a time, in a small village by the sea, there lived an old fisherman \
             who went out every morning before dawn. One day he caught a fish that could speak, \
             and the fish said to him:",
            true,
            true,
        )
        .unwrap();
    assert!(
        prompt_b.len() > 4 * BATCH,
        "B's prompt ({} tokens) spans several batches",
        prompt_b.len()
    );
    let (max_a, max_b) = (48, 12);

    let (s, steps) = scheduler(&model, BATCH, 2);
    let mut rx_a = submit(&s, &prompt_a, max_a);
    // A is prefilled and decoding before B arrives.
    wait_steps(&steps, 3);
    let mut rx_b = submit(&s, &prompt_b, max_b);
    let b = wait_done(&mut rx_b);
    let a = wait_done(&mut rx_a);
    assert_eq!(a.finish, FinishReason::Length);
    assert_eq!(b.finish, FinishReason::Length);
    assert_eq!((b.prompt_tokens, b.reused_tokens), (prompt_b.len(), 0));

    let steps = steps.lock().unwrap().clone();
    // Every step is one pass within the batch.
    for (k, log) in steps.iter().enumerate() {
        let fed: usize = log.iter().map(|e| e.2).sum();
        assert!(fed <= BATCH, "step {k} fed {fed} tokens: {log:?}");
    }
    // A is the first sequence's slot; B's is the other one.
    let slot_a = steps[0][0].0;
    let b_steps: Vec<&StepLog> = steps
        .iter()
        .filter(|log| log.iter().any(|e| e.0 != slot_a))
        .collect();
    let first_b = b_steps
        .iter()
        .position(|log| log.iter().any(|e| e.0 != slot_a && e.3))
        .expect("B got logits");
    // B's prompt took a step per 7 tokens (A's decode takes one token of each), and every
    // one of those steps gave A its next token.
    assert_eq!(
        first_b + 1,
        prompt_b.len().div_ceil(BATCH - 1),
        "{b_steps:?}"
    );
    for log in &b_steps[..=first_b] {
        assert!(
            log.iter()
                .any(|&(slot, n, fed, all)| slot == slot_a && n == 1 && fed == 1 && all),
            "A got a token at every step of B's prefill: {log:?}"
        );
    }
    assert!(b.prefill_time > Duration::ZERO);

    // Chunking changes no result.
    assert_eq!(b.tokens, alone(&model, &prompt_b, max_b), "B alone");
    assert_eq!(a.tokens, alone(&model, &prompt_a, max_a), "A alone");
}

#[test]
fn a_sequence_cancelled_mid_prefill_frees_its_slot_and_a_later_one_reuses_what_was_fed() {
    const BATCH: usize = 8;
    let model = Arc::new(LoadedModel::load(&smollm2()).unwrap());
    let prompt = model
        .tokenizer
        .encode(
            "A long prompt that is fed over several steps of eight tokens each, so that \
             its client can go away before the prompt has been fed to the end. It goes on \
             for a while longer, with a list of things to say nothing much about: the weather, \
             the sea, the mountains in the distance, the price of bread in the market, and \
             the old question of whether the chicken or the egg came first.",
            true,
            true,
        )
        .unwrap();
    assert!(prompt.len() > 8 * BATCH, "{} tokens", prompt.len());
    let (s, steps) = scheduler(&model, BATCH, 1);
    let rx = submit(&s, &prompt, 8);
    wait_steps(&steps, 2);
    drop(rx);
    // With its one slot free again, the same prompt runs to the end, reusing the cached part.
    let again = wait_done(&mut submit(&s, &prompt, 8));
    assert!(
        again.reused_tokens >= 2 * BATCH,
        "reused {}",
        again.reused_tokens
    );
    assert!(
        again.reused_tokens < prompt.len() - 1,
        "cancelled before the prompt was fed: reused {}",
        again.reused_tokens
    );
    let steps = steps.lock().unwrap().clone();
    assert!(steps.iter().take(2).all(|log| !log[0].3), "{steps:?}");
    assert_eq!(again.tokens, alone(&model, &prompt, 8));
}

#[test]
fn with_more_sequences_than_the_batch_holds_every_one_takes_its_turn() {
    let model = Arc::new(LoadedModel::load(&smollm2()).unwrap());
    // One-token prompts, so that all three decode together.
    let prompts: Vec<Vec<u32>> = ["Hello", "The", "One"]
        .iter()
        .map(|p| model.tokenizer.encode(p, false, false).unwrap()[..1].to_vec())
        .collect();
    let (s, steps) = scheduler(&model, 2, 3);
    let mut rxs: Vec<_> = prompts.iter().map(|p| submit(&s, p, 16)).collect();
    let outs: Vec<Summary> = rxs.iter_mut().map(wait_done).collect();
    // Three decodes, room for two: no decode is left out two steps running.
    let steps = steps.lock().unwrap().clone();
    let mut waited = [0usize; 3];
    for log in &steps {
        assert!(log.iter().map(|e| e.2).sum::<usize>() <= 2, "{log:?}");
        for &(slot, n, fed, _) in log {
            waited[slot] = if n == 1 && fed == 0 {
                waited[slot] + 1
            } else {
                0
            };
            assert!(
                waited[slot] < 2,
                "slot {slot} waited twice in a row: {steps:?}"
            );
        }
    }
    for (p, out) in prompts.iter().zip(&outs) {
        assert_eq!(out.tokens, alone(&model, p, 16));
    }
}
