//! Chat templates rendered in a child process whose memory is capped.
//!
//! A chat template comes from a model file, and minijinja bounds its instructions (fuel),
//! its recursion and what it prints, but not the memory its operators build: a loop of
//! thirty `{% set s = s ~ s %}` makes an 8 GiB string within a few dozen instructions, and no
//! hook inside minijinja sees it. So a program that renders templates from files it does not
//! trust calls [`install`] once; every render in the process then runs in a worker process
//! (the same executable, started with [`WORKER_ARG`]) whose address space is capped at
//! [`MAX_RENDER_MEMORY`] and which the parent kills when it overruns
//! [`crate::RENDER_TIME_LIMIT`]. A render that runs out of memory fails with
//! [`TextError::TemplateMemory`]; the worker is replaced, and the parent's memory never held
//! the template's garbage.
//!
//! Workers are kept for reuse (a render costs a pipe round trip; starting one costs a few
//! milliseconds). Without [`install`] (libraries, tests) templates render in-process, bounded
//! by fuel, output size and the clock only. Unix only: elsewhere [`install`] reports that it
//! cannot cap memory and rendering stays in-process.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ChatTemplate;
use crate::TextError;

/// The first argument that turns the executable given to [`install`] into a render worker;
/// its `main` hands over to [`worker_main`] when it sees it.
pub const WORKER_ARG: &str = "__flowrt-template-worker";

/// The address space a render worker may use: the executable, the request (bounded by the
/// caller: the server's body limit), the template's values and the output (at most
/// [`crate::MAX_RENDERED_BYTES`]).
pub const MAX_RENDER_MEMORY: u64 = 1 << 30;

/// How long past [`crate::RENDER_TIME_LIMIT`] the parent waits for an answer before it kills
/// the worker (the worker's own clock stops most slow renders; operators alone do not read
/// it).
const KILL_GRACE: Duration = Duration::from_secs(2);

/// Idle workers kept for reuse.
const MAX_IDLE: usize = 4;

static SANDBOX: OnceLock<Sandbox> = OnceLock::new();

/// Render every chat template of this process in workers started from `exe` (normally
/// `std::env::current_exe()`), whose `main` must call [`worker_main`] when its first argument
/// is [`WORKER_ARG`]. The first call wins; later calls are ignored. Fails where memory cannot
/// be capped (not Unix).
pub fn install(exe: impl Into<PathBuf>) -> Result<(), TextError> {
    if !cfg!(unix) {
        return Err(TextError::TemplateWorker {
            message: "rendering chat templates in a memory-capped process needs Unix; templates render in-process".into(),
        });
    }
    let _ = SANDBOX.set(Sandbox {
        exe: exe.into(),
        idle: Mutex::new(Vec::new()),
    });
    Ok(())
}

/// Whether [`install`] has been called: chat templates render in capped workers.
pub fn installed() -> bool {
    SANDBOX.get().is_some()
}

pub(super) fn get() -> Option<&'static Sandbox> {
    SANDBOX.get()
}

/// One render, as the parent sends it.
#[derive(Serialize)]
pub(super) struct RequestRef<'a> {
    pub source: &'a str,
    pub bos: &'a str,
    pub eos: &'a str,
    pub messages: &'a [serde_json::Value],
    pub tools: Option<&'a serde_json::Value>,
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
    pub add_generation_prompt: bool,
}

/// One render, as the worker reads it.
#[derive(Deserialize)]
struct Request {
    source: String,
    bos: String,
    eos: String,
    messages: Vec<serde_json::Value>,
    tools: Option<serde_json::Value>,
    kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    add_generation_prompt: bool,
}

/// The worker's answer: the prompt, or the error as the parent rebuilds it.
#[derive(Serialize, Deserialize)]
enum Response {
    Ok(String),
    Syntax(String),
    Render(String),
    TooLong(usize),
    Timeout(Duration),
    Input { what: String, message: String },
    Other(String),
}

impl Response {
    fn from_result(r: Result<String, TextError>) -> Self {
        match r {
            Ok(s) => Self::Ok(s),
            Err(TextError::TemplateSyntax(e)) => Self::Syntax(error_chain(&e)),
            Err(TextError::TemplateRender(e)) => Self::Render(error_chain(&e)),
            Err(TextError::TemplateTooLong { limit }) => Self::TooLong(limit),
            Err(TextError::TemplateTimeout { limit }) => Self::Timeout(limit),
            Err(TextError::TemplateInput { what, message }) => Self::Input {
                what: what.to_string(),
                message,
            },
            Err(e) => Self::Other(e.to_string()),
        }
    }

    fn into_result(self) -> Result<String, TextError> {
        match self {
            Self::Ok(s) => Ok(s),
            Self::Syntax(m) => Err(TextError::TemplateFailed {
                what: "does not compile",
                message: m,
            }),
            Self::Render(m) => Err(TextError::TemplateFailed {
                what: "failed",
                message: m,
            }),
            Self::TooLong(limit) => Err(TextError::TemplateTooLong { limit }),
            Self::Timeout(limit) => Err(TextError::TemplateTimeout { limit }),
            Self::Input { what, message } => Err(TextError::TemplateInput {
                what: input_what(&what),
                message,
            }),
            Self::Other(message) => Err(TextError::TemplateWorker { message }),
        }
    }
}

/// minijinja's message with its causes, as `Display` of the error shows them in-process.
fn error_chain(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// The renderer's input errors name one of a few fixed things.
fn input_what(s: &str) -> &'static str {
    match s {
        "template variable" => "template variable",
        "rendered prompt" => "rendered prompt",
        "message" => "message",
        _ => "template input",
    }
}

/// The workers of this process.
pub(super) struct Sandbox {
    exe: PathBuf,
    idle: Mutex<Vec<Worker>>,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stderr: Option<ChildStderr>,
    /// Lines the worker writes, read by a thread of their own so that the parent can wait
    /// with a deadline.
    lines: mpsc::Receiver<std::io::Result<String>>,
}

impl Worker {
    fn spawn(exe: &std::path::Path) -> Result<Self, TextError> {
        let mut child = Command::new(exe)
            .arg(WORKER_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| TextError::TemplateWorker {
                message: format!("cannot start {} {WORKER_ARG}: {e}", exe.display()),
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take();
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name("template-worker-reader".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| TextError::TemplateWorker {
                message: format!("cannot start a reader thread: {e}"),
            })?;
        Ok(Self {
            child,
            stdin,
            stderr,
            lines,
        })
    }

    /// The worker is gone or must go: reap it and say why.
    fn died(mut self, killed_for_time: bool) -> TextError {
        if killed_for_time {
            let _ = self.child.kill();
            let _ = self.child.wait();
            return TextError::TemplateTimeout {
                limit: crate::RENDER_TIME_LIMIT,
            };
        }
        // Give a worker that is crashing a moment to finish dying, then make sure it is gone.
        let status = match wait_for(&mut self.child, Duration::from_secs(2)) {
            Some(s) => s,
            None => {
                let _ = self.child.kill();
                match self.child.wait() {
                    Ok(s) => s,
                    Err(e) => {
                        return TextError::TemplateWorker {
                            message: format!("the render worker stopped answering: {e}"),
                        }
                    }
                }
            }
        };
        let mut err = String::new();
        if let Some(e) = self.stderr.take() {
            let _ = e.take(4096).read_to_string(&mut err);
        }
        if err.contains("memory allocation of") {
            return TextError::TemplateMemory {
                limit: MAX_RENDER_MEMORY,
            };
        }
        TextError::TemplateWorker {
            message: format!(
                "the render worker ended ({status}){}",
                if err.trim().is_empty() {
                    String::new()
                } else {
                    format!(": {}", err.trim())
                }
            ),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing stdin ends an idle worker's loop; a busy one is killed.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = std::time::Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if std::time::Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Sandbox {
    pub(super) fn render(&self, req: &RequestRef<'_>) -> Result<String, TextError> {
        let mut line = serde_json::to_vec(req).map_err(|e| TextError::TemplateInput {
            what: "template input",
            message: e.to_string(),
        })?;
        line.push(b'\n');
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut w = match idle {
            Some(w) => w,
            None => Worker::spawn(&self.exe)?,
        };
        if w.stdin
            .write_all(&line)
            .and_then(|_| w.stdin.flush())
            .is_err()
        {
            return Err(w.died(false));
        }
        let answer = match w.lines.recv_timeout(crate::RENDER_TIME_LIMIT + KILL_GRACE) {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => return Err(w.died(false)),
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(w.died(true)),
        };
        let resp: Response =
            serde_json::from_str(&answer).map_err(|e| TextError::TemplateWorker {
                message: format!("unreadable answer from the render worker: {e}"),
            })?;
        if let Ok(mut v) = self.idle.lock() {
            if v.len() < MAX_IDLE {
                v.push(w);
            }
        }
        resp.into_result()
    }
}

/// The worker's `main`: caps its address space at [`MAX_RENDER_MEMORY`], then renders one
/// request per line of stdin until stdin closes. An allocation past the cap aborts the
/// process (Rust's allocation-failure handler), which the parent reports as
/// [`TextError::TemplateMemory`].
pub fn worker_main() -> ! {
    if let Err(e) = cap_memory(MAX_RENDER_MEMORY) {
        eprintln!("flowrt template worker: cannot cap memory: {e}");
        std::process::exit(3);
    }
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut cached: Option<(String, String, String, ChatTemplate)> = None;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let resp = match serde_json::from_str::<Request>(&line) {
            Ok(req) => {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    render_request(&mut cached, req)
                }));
                match result {
                    Ok(r) => Response::from_result(r),
                    Err(_) => {
                        cached = None;
                        Response::Other("the renderer panicked".into())
                    }
                }
            }
            Err(e) => Response::Other(format!("unreadable request: {e}")),
        };
        let ok = serde_json::to_writer(&mut stdout, &resp).is_ok()
            && stdout.write_all(b"\n").is_ok()
            && stdout.flush().is_ok();
        if !ok {
            break;
        }
    }
    std::process::exit(0)
}

fn render_request(
    cached: &mut Option<(String, String, String, ChatTemplate)>,
    req: Request,
) -> Result<String, TextError> {
    let hit =
        matches!(cached, Some((s, b, e, _)) if *s == req.source && *b == req.bos && *e == req.eos);
    if !hit {
        *cached = None;
        let t = ChatTemplate::new(&req.source, &req.bos, &req.eos)?;
        *cached = Some((req.source, req.bos, req.eos, t));
    }
    let (_, _, _, t) = cached.as_ref().expect("set above");
    t.render_local(
        &req.messages,
        req.tools.as_ref(),
        req.kwargs.as_ref(),
        req.add_generation_prompt,
    )
}

#[cfg(unix)]
fn cap_memory(bytes: u64) -> std::io::Result<()> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    setrlimit(
        Resource::As,
        Rlimit {
            current: Some(bytes),
            maximum: Some(bytes),
        },
    )
    .map_err(std::io::Error::from)
}

#[cfg(not(unix))]
fn cap_memory(_bytes: u64) -> std::io::Result<()> {
    Err(std::io::Error::other("not supported on this platform"))
}
