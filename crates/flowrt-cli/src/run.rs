//! `flowrt run`: one answer, or an interactive chat.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use flowrt_engine::{
    generate, ConstraintSpec, EngineError, FinishReason, GenerateOptions, GenerationStats,
    LoadedModel, Session,
};
use flowrt_sample::SamplerConfig;
use flowrt_text::ChatMessage;

use crate::common::{load_model, EngineArgs};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A .gguf file or a catalog tag (e.g. smollm2:135m).
    pub model: String,
    /// The prompt. Without it, an interactive chat starts.
    pub prompt: Option<String>,
    /// Plain completion of the prompt, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// System message for chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Drop tokens less likely than P times the most likely one (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty for repeating recent tokens (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repeat penalty looks at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (same seed, same output).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Most tokens to generate per answer.
    #[arg(long = "max-tokens", short = 'n', default_value_t = 512)]
    pub max_tokens: usize,
    /// Stop when the answer contains this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print timings to stderr after each answer.
    #[arg(long)]
    pub stats: bool,
    /// Keep generating past end-of-generation tokens (up to --max-tokens).
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// After each answer, print to stderr the token ids fed to the model
    /// (`prompt token ids: …`) and those generated (`generated token ids: …`), space-separated.
    #[arg(long = "print-token-ids")]
    pub print_token_ids: bool,
    /// Constrain the answer to this JSON Schema (a file); only a complete, conforming answer
    /// is printed.
    #[arg(long = "json-schema", value_name = "FILE", conflicts_with_all = ["json", "stop", "grammar", "regex"])]
    pub json_schema: Option<PathBuf>,
    /// Constrain the answer to a JSON object (any keys and values).
    #[arg(long, conflicts_with_all = ["stop", "grammar", "regex"])]
    pub json: bool,
    /// Constrain the answer to a grammar in llguidance's Lark dialect (a file; `start` is
    /// the whole answer; `%json { schema }` embeds a JSON Schema).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["stop", "regex"])]
    pub grammar: Option<PathBuf>,
    /// Constrain the answer to match this regular expression (the whole answer).
    #[arg(long, value_name = "REGEX", conflicts_with = "stop")]
    pub regex: Option<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl RunArgs {
    fn generate_options(&self) -> Result<GenerateOptions> {
        let constraint = match (&self.json_schema, self.json, &self.grammar, &self.regex) {
            (Some(path), ..) => Some(ConstraintSpec::JsonSchema(read_schema(path)?)),
            (None, true, ..) => Some(ConstraintSpec::JsonObject),
            (None, false, Some(path), _) => Some(ConstraintSpec::Lark(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the grammar {}", path.display()))?,
            )),
            (None, false, None, Some(re)) => Some(ConstraintSpec::Regex(re.clone())),
            (None, false, None, None) => None,
        };
        Ok(GenerateOptions {
            max_tokens: self.max_tokens,
            sampler: SamplerConfig {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                repeat_last_n: self.repeat_last_n,
                seed: self.seed,
                ..SamplerConfig::default()
            },
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            constraint,
        })
    }
}

/// A JSON Schema file, parsed (whether the engine can honour it is checked when it compiles).
fn read_schema(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the JSON schema {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let gen = args.generate_options()?;
    gen.sampler.validate().context("sampling parameters")?;
    let (model, opts) = load_model(&args.model, &args.engine)?;
    let mut session = Session::new(&model, &opts)?;
    let result = run_prompt_or_chat(&mut session, &model, &args, &gen);
    // The trace is written even when a step failed: that is when it is most wanted.
    args.engine.write_trace(&session)?;
    result?;
    Ok(ExitCode::SUCCESS)
}

fn run_prompt_or_chat(
    session: &mut Session,
    model: &LoadedModel,
    args: &RunArgs,
    gen: &GenerateOptions,
) -> Result<()> {
    match &args.prompt {
        Some(prompt) => {
            let tokens = if args.raw {
                model.tokenizer.encode(prompt, true, true)?
            } else {
                let mut messages = Vec::new();
                if let Some(s) = &args.system {
                    messages.push(ChatMessage::new("system", s));
                }
                messages.push(ChatMessage::new("user", prompt));
                render_chat(model, &messages)?
            };
            let stats = answer(session, model, &tokens, gen)?;
            if args.stats {
                print_stats(&stats);
            }
            if args.print_token_ids {
                print_token_ids(&tokens, &stats.tokens);
            }
        }
        None => chat(session, model, args, gen)?,
    }
    Ok(())
}

fn render_chat(model: &LoadedModel, messages: &[ChatMessage]) -> Result<Vec<u32>> {
    let template = model
        .template
        .as_ref()
        .ok_or_else(|| EngineError::NoChatTemplate(model.path.clone()))?;
    // As the server does: message text never becomes control tokens (see `ChatPrompt`).
    let opts = flowrt_text::RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let prompt = template.render_prompt(messages, &opts, &model.tokenizer)?;
    Ok(model.tokenizer.encode_chat(&prompt)?)
}

/// Generate and stream one answer to stdout; returns its statistics.
fn answer(
    session: &mut Session,
    model: &LoadedModel,
    tokens: &[u32],
    gen: &GenerateOptions,
) -> Result<GenerationStats> {
    let mut out = std::io::stdout().lock();
    if gen.constraint.is_some() {
        // Constrained: print the answer only once it is complete (and so conforms).
        let mut text = String::new();
        let stats = generate(session, &model.tokenizer, tokens, gen, &mut |t| {
            text.push_str(t);
            true
        })?;
        if stats.finish != FinishReason::Stop {
            anyhow::bail!(
                "the constrained answer was not complete after {} tokens ({}); raise --max-tokens",
                stats.generated_tokens,
                finish_name(stats.finish)
            );
        }
        writeln!(out, "{text}")?;
        return Ok(stats);
    }
    let mut write_err = None;
    let stats = generate(
        session,
        &model.tokenizer,
        tokens,
        gen,
        &mut |text| match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                write_err = Some(e);
                false
            }
        },
    )?;
    if let Some(e) = write_err {
        return Err(e.into());
    }
    writeln!(out)?;
    Ok(stats)
}

fn print_stats(s: &GenerationStats) {
    let decode_tok_s = if s.generated_tokens > 1 {
        (s.generated_tokens - 1) as f64 / s.decode_time.as_secs_f64()
    } else {
        0.0
    };
    let finish = finish_name(s.finish);
    eprintln!(
        "[prompt {} tokens ({} reused), prefill {:.1} ms; {} generated, {:.1} tok/s; time to first token {:.1} ms; finish: {finish}; seed {}]",
        s.prompt_tokens,
        s.reused_tokens,
        s.prefill_time.as_secs_f64() * 1e3,
        s.generated_tokens,
        decode_tok_s,
        s.time_to_first_token.as_secs_f64() * 1e3,
        s.seed
    );
}

/// The `--print-token-ids` lines: what the model was fed, then what it generated (with
/// `--ignore-eos`, end-of-generation tokens included).
fn print_token_ids(prompt: &[u32], generated: &[u32]) {
    let join = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    eprintln!("prompt token ids: {}", join(prompt));
    eprintln!("generated token ids: {}", join(generated));
}

fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ContextFull => "context full",
        FinishReason::Cancelled => "cancelled",
    }
}

/// Interactive multi-turn chat on stdin/stdout. The session keeps its cache between turns;
/// each turn feeds only what the previous turns did not.
fn chat(
    session: &mut Session,
    model: &LoadedModel,
    args: &RunArgs,
    gen: &GenerateOptions,
) -> Result<()> {
    if model.template.is_none() && !args.raw {
        return Err(EngineError::NoChatTemplate(model.path.clone()).into());
    }
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "flowrt chat with {} — /reset clears the conversation, /exit or Ctrl-D quits.",
            model.path.display()
        );
    }
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(ChatMessage::new("system", s));
    }
    let base = messages.len();
    let stdin = std::io::stdin();
    let mut line = String::new();
    let mut transcript = String::new();
    loop {
        if interactive {
            eprint!("> ");
        }
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let input = line.trim_end_matches(['\n', '\r']);
        match input.trim() {
            "" => continue,
            "/exit" | "/quit" | "/bye" => break,
            "/reset" => {
                messages.truncate(base);
                transcript.clear();
                session.reset();
                continue;
            }
            _ => {}
        }
        let tokens = if args.raw {
            transcript.push_str(input);
            model.tokenizer.encode(&transcript, true, true)?
        } else {
            messages.push(ChatMessage::new("user", input));
            render_chat(model, &messages)?
        };
        let mut answer_text = String::new();
        let mut out = std::io::stdout().lock();
        let mut write_err = None;
        let result = generate(session, &model.tokenizer, &tokens, gen, &mut |text| {
            answer_text.push_str(text);
            match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
                Ok(()) => true,
                Err(e) => {
                    write_err = Some(e);
                    false
                }
            }
        });
        if let Some(e) = write_err {
            return Err(e.into());
        }
        writeln!(out)?;
        match result {
            Ok(stats) => {
                if args.stats {
                    print_stats(&stats);
                }
                if args.print_token_ids {
                    print_token_ids(&tokens, &stats.tokens);
                }
                if stats.finish == FinishReason::ContextFull {
                    eprintln!("(the context is full: /reset to start over)");
                }
                if gen.constraint.is_some() && stats.finish != FinishReason::Stop {
                    eprintln!(
                        "(the constrained answer is incomplete: {}; raise --max-tokens)",
                        finish_name(stats.finish)
                    );
                }
            }
            Err(e @ EngineError::PromptTooLong { .. }) => {
                eprintln!("error: {e}\n(the conversation no longer fits the context: /reset to start over)");
                if !args.raw {
                    messages.pop();
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        if args.raw {
            transcript.push_str(&answer_text);
        } else {
            messages.push(ChatMessage::new("assistant", &answer_text));
        }
    }
    Ok(())
}
