//! `flowrt serve` end to end: started on loopback (a free port), driven over HTTP. Greedy
//! answers equal `flowrt run`'s; the official `openai` and `ollama` Python clients work
//! against it (installed into `.venv-clients`), and `anthropic` (into `.venv-anthropic`);
//! SIGTERM shuts it down cleanly.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flowrt_testkit::models::smollm2;

/// Pinned client versions the end-to-end test installs.
const OPENAI_VERSION: &str = "3.57.0";
const OLLAMA_VERSION: &str = "0.6.3";
const ANTHROPIC_VERSION: &str = "2.15.0";
const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A running `flowrt serve`, killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[&str]) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flowrt"));
    cmd.arg("serve").arg(smollm2()).args(extra);
    start(cmd)
}

/// Start `cmd` (a `flowrt serve` without its listening options) on a free port and wait
/// until it is healthy.
fn start(cmd: Command) -> Server {
    start_ctx(cmd, "1024")
}

/// [`start`] with a context length of `ctx`.
fn start_ctx(mut cmd: Command, ctx: &str) -> Server {
    let mut child = cmd
        .args([
            "--port",
            "0",
            "--ctx-len",
            ctx,
            "--threads",
            "2",
            "--parallel",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting flowrt serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("flowrt serve exited before listening")
            .unwrap();
        if let Some(a) = line.strip_prefix("flowrt serve: listening on http://") {
            break a.to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let server = Server { child, addr };
    for _ in 0..600 {
        if http(&server.addr, "GET", "/health", "").0 == 200 {
            return server;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("flowrt serve did not become healthy");
}

/// One HTTP/1.1 request; returns (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn flowrt_run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .arg("run")
        .arg(smollm2())
        .args(args)
        .args(["--temperature", "0", "--ctx-len", "1024", "--threads", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8(out.stdout).unwrap();
    s.strip_suffix('\n').unwrap_or(&s).to_string()
}

#[test]
fn greedy_answers_through_the_server_equal_flowrt_run() {
    let server = serve(&[]);
    let prompt = "Give me three tips for sleeping well.";
    let want = flowrt_run(&[prompt, "--max-tokens", "48"]);
    let body = serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 48});
    let (status, text) = http(
        &server.addr,
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
    );
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["model"], MODEL);
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        want
    );

    let raw = "Once upon a time";
    let want = flowrt_run(&[raw, "--raw", "--max-tokens", "32"]);
    let body =
        serde_json::json!({"model": MODEL, "prompt": raw, "temperature": 0, "max_tokens": 32});
    let (status, text) = http(&server.addr, "POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want);
}

#[cfg(unix)]
#[test]
fn sigterm_shuts_down_cleanly() {
    let mut server = serve(&[]);
    let pid = server.child.id().to_string();
    let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(st.success());
    for _ in 0..100 {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("flowrt serve did not stop within 10 s of SIGTERM");
}

/// The venv with the pinned clients, created on first use.
fn client_python() -> PathBuf {
    let root = repo_root();
    let venv = root.join(".venv-clients");
    let py = venv.join("bin/python");
    let check = format!(
        "import openai, ollama, importlib.metadata as m; assert openai.__version__ == '{OPENAI_VERSION}' and m.version('ollama') == '{OLLAMA_VERSION}'"
    );
    if py.is_file()
        && Command::new(&py)
            .args(["-c", &check])
            .status()
            .is_ok_and(|s| s.success())
    {
        return py;
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let st = Command::new(&python).args(["-m", "venv"]).arg(&venv).status().unwrap_or_else(|e| {
        panic!("this test needs Python 3 (with venv and pip) to install the openai and ollama clients: running `{python}` failed: {e}")
    });
    assert!(
        st.success(),
        "`{python} -m venv {}` failed; install python3-venv",
        venv.display()
    );
    let st = Command::new(&py)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!("openai=={OPENAI_VERSION}"))
        .arg(format!("ollama=={OLLAMA_VERSION}"))
        .status()
        .unwrap();
    assert!(
        st.success(),
        "installing openai=={OPENAI_VERSION} and ollama=={OLLAMA_VERSION} into {} failed",
        venv.display()
    );
    py
}

#[test]
fn official_openai_and_ollama_clients_work() {
    clients_pass(&[], &[]);
}

/// The client checks against `serve --backend vulkan` (lavapipe where there is no GPU), with
/// one grammar-constrained answer standing for the structured-output and tool checks.
#[test]
fn official_clients_work_with_the_vulkan_backend() {
    let out = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .args(["devices", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if v["vulkan"]["devices"]
        .as_array()
        .is_none_or(|d| d.is_empty())
    {
        flowrt_testkit::coverage::not_run(
            "serve",
            "client checks on --backend vulkan",
            &format!("no Vulkan device: {}", v["vulkan"]),
        );
        return;
    }
    // The structured-output and tool checks are the server's grammar and parsers, the same
    // on every backend, and take minutes on lavapipe: one constrained answer stands for them.
    clients_pass(&["--backend", "vulkan"], &["--one-constrained"]);
    flowrt_testkit::coverage::ran("serve", "client checks on --backend vulkan");
}

/// `scripts/e2e_clients.py` (with `flags`) against a `flowrt serve` with `extra` options.
fn clients_pass(extra: &[&str], flags: &[&str]) {
    let py = client_python();
    let server = serve(extra);
    let script = repo_root().join("scripts/e2e_clients.py");
    let out = Command::new(py)
        .arg(script)
        .arg(format!("http://{}", server.addr))
        .arg(MODEL)
        .args(flags)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all client checks passed"), "{stdout}");
}

/// The venv with the pinned `anthropic` client (`.venv-anthropic`), created on first use the
/// way [`client_python`] creates its own.
fn anthropic_python() -> PathBuf {
    let venv = repo_root().join(".venv-anthropic");
    let py = venv.join("bin/python");
    let check = format!("import anthropic; assert anthropic.__version__ == '{ANTHROPIC_VERSION}'");
    let ok = |py: &Path| {
        Command::new(py)
            .args(["-c", &check])
            .status()
            .is_ok_and(|s| s.success())
    };
    if py.is_file() && ok(&py) {
        return py;
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let st = Command::new(&python).args(["-m", "venv"]).arg(&venv).status().unwrap_or_else(|e| {
        panic!("this test needs Python 3 (with venv and pip) to install the anthropic client: running `{python}` failed: {e}")
    });
    assert!(
        st.success(),
        "`{python} -m venv {}` failed; install python3-venv",
        venv.display()
    );
    let st = Command::new(&py)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!("anthropic=={ANTHROPIC_VERSION}"))
        .status()
        .unwrap();
    assert!(
        st.success() && ok(&py),
        "installing anthropic=={ANTHROPIC_VERSION} into {} failed",
        venv.display()
    );
    py
}

/// The official `anthropic` client against `flowrt serve --api-key` (sent as `x-api-key`):
/// `messages.create`, `messages.stream` (the same greedy text), stop sequences,
/// `count_tokens`, and its NotFoundError, BadRequestError and AuthenticationError.
#[test]
fn official_anthropic_client_works() {
    let py = anthropic_python();
    let server = serve(&["--api-key", "s3cret"]);
    let out = Command::new(py)
        .arg(repo_root().join("scripts/e2e_anthropic_client.py"))
        .arg(format!("http://{}", server.addr))
        .arg(MODEL)
        .arg("s3cret")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "anthropic client checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("all anthropic client checks passed"),
        "{stdout}"
    );
}

/// `flowrt` with `home` as its store; nothing may be fetched.
fn flowrt_in(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flowrt"));
    c.env("FLOWRT_HOME", home)
        .env_remove("FLOWRT_API_KEY")
        .env("FLOWRT_PYTHON", "/nonexistent/python")
        .env("FLOWRT_HF_ENDPOINT", "http://127.0.0.1:9");
    c
}

/// A flowrt home with SmolLM2 registered as `mine:1` by `flowrt add`; returns its SHA-256.
fn home_with_mine() -> (tempfile::TempDir, String) {
    let home = tempfile::tempdir().unwrap();
    let out = flowrt_in(home.path())
        .args(["add", "mine:1"])
        .arg(smollm2())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = flowrt_in(home.path())
        .args(["list", "--json"])
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sha = list[0]["sha256"].as_str().unwrap().to_string();
    (home, sha)
}

fn chat_body(model: &str) -> String {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 2}).to_string()
}

#[test]
fn without_model_arguments_it_serves_every_registered_model_by_its_tag() {
    let (home, sha) = home_with_mine();
    let mut cmd = flowrt_in(home.path());
    cmd.arg("serve");
    let server = start(cmd);
    let (status, text) = http(&server.addr, "GET", "/v1/models", "");
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{text}");
    assert_eq!(data[0]["id"], "mine:1");
    assert_eq!(data[0]["sha256"], sha.as_str());
    assert_eq!(data[0]["source"], "local");
    assert_eq!(data[0]["loaded"], false, "loaded lazily");

    let (status, text) = http(
        &server.addr,
        "POST",
        "/v1/chat/completions",
        &chat_body("mine"),
    );
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["model"], "mine:1");

    // A catalog model that is not registered in this home is not served.
    let (status, text) = http(
        &server.addr,
        "POST",
        "/v1/chat/completions",
        &chat_body("smollm2:135m"),
    );
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("model_not_found"), "{text}");
}

#[test]
fn a_registered_model_argument_is_served_under_its_tag() {
    let (home, sha) = home_with_mine();
    let mut cmd = flowrt_in(home.path());
    cmd.args(["serve", "mine"]);
    let server = start(cmd);
    let (status, text) = http(&server.addr, "GET", "/v1/models/mine", "");
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["id"], "mine:1");
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(v["source"], "local");
    assert_eq!(v["format"], "gguf");
}

#[test]
fn without_model_arguments_and_nothing_registered_it_says_what_to_do() {
    let home = tempfile::tempdir().unwrap();
    let out = flowrt_in(home.path())
        .args(["serve", "--port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no model to serve"), "{err}");
    assert!(err.contains("flowrt pull"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The official clients' embedding calls (`client.embeddings.create`, base64 by default and
/// float; `ollama.embed`, `ollama.embeddings`) against `flowrt serve` of the tiny random BERT
/// give what `flowrt embed` gives.
#[test]
fn official_clients_embed() {
    let py = client_python();
    let bert = repo_root().join("tests/fixtures/embed/tiny-bert");
    let texts = ["hello", "A quick brown fox jumps over the lazy dog."];
    let out = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .arg("embed")
        .arg(&bert)
        .args(texts)
        .args(["--json", "-t", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut expected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    expected["texts"] = serde_json::json!(texts);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("expected.json");
    std::fs::write(&path, expected.to_string()).unwrap();

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flowrt"));
    cmd.arg("serve").arg(&bert);
    let server = start(cmd);
    let out = Command::new(py)
        .arg(repo_root().join("scripts/e2e_embed_clients.py"))
        .arg(format!("http://{}", server.addr))
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "embedding client checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("all embedding client checks passed"),
        "{stdout}"
    );
}

/// `--cors-origin` reaches the server: a preflight from that origin is answered (without the
/// API key), one from another origin is not; a value that is not an origin is refused.
#[test]
fn cors_origin_option_allows_that_origin_only() {
    let server = serve(&[
        "--lazy",
        "--api-key",
        "k",
        "--cors-origin",
        "http://app.example:8080",
    ]);
    let preflight = |origin: &str| {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n",
            server.addr
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        resp.to_ascii_lowercase()
    };
    let ok = preflight("http://app.example:8080");
    assert!(ok.starts_with("http/1.1 200"), "{ok}");
    assert!(
        ok.contains("access-control-allow-origin: http://app.example:8080"),
        "{ok}"
    );
    let other = preflight("http://evil.example");
    assert!(!other.contains("access-control-allow-origin"), "{other}");
    drop(server);

    let out = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .args(["serve", "--port", "0", "--cors-origin", "app.example"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cors-origin") && err.contains("is not an origin"),
        "{err}"
    );
}

/// Issue 18 (DNS rebinding): a loopback server answers only to loopback names in `Host`
/// unless `--allowed-host` adds one.
#[test]
fn a_loopback_server_refuses_foreign_host_names() {
    let server = serve(&["--lazy", "--allowed-host", "box.lan"]);
    let status = |host: &str| {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        resp
    };
    let port = server.addr.rsplit(':').next().unwrap();
    for host in [
        server.addr.clone(),
        format!("localhost:{port}"),
        format!("box.lan:{port}"),
    ] {
        let r = status(&host);
        assert!(r.starts_with("HTTP/1.1 200"), "{host}: {r}");
    }
    let r = status(&format!("evil.example:{port}"));
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    assert!(r.contains("--allowed-host"), "{r}");
}

/// Runs `cmd` (a `flowrt serve` that should refuse to start) for at most 10 s: its exit status
/// (`None` if it was still running, then killed, so that a server that starts anyway fails
/// the test instead of running on) and its stderr.
fn refused_at_start(cmd: &mut Command) -> (Option<std::process::ExitStatus>, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    (status, err)
}

/// Issue 18: `--api-key ""` (or an empty `FLOWRT_API_KEY`) silently served without
/// authentication. Both are refused at start, naming the option.
#[test]
fn an_empty_api_key_is_refused_at_start() {
    for (args, env, named) in [
        (vec!["--api-key", ""], None, "--api-key is empty"),
        (
            vec!["--api-key", "  "],
            Some("s3cret"),
            "--api-key is empty",
        ),
        (vec![], Some(""), "FLOWRT_API_KEY is empty"),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flowrt"));
        cmd.arg("serve")
            .arg(smollm2())
            .args(["--port", "0"])
            .args(&args);
        match env {
            Some(v) => cmd.env("FLOWRT_API_KEY", v),
            None => cmd.env_remove("FLOWRT_API_KEY"),
        };
        let (status, err) = refused_at_start(&mut cmd);
        assert!(
            status.is_some_and(|s| !s.success()),
            "{args:?} {env:?}: started: {err}"
        );
        assert!(err.contains(named), "{args:?} {env:?}: {err}");
    }
}

/// Send SIGTERM to `server` and wait for its exit (at most `limit`): (exit success, seconds).
#[cfg(unix)]
fn terminate(server: &mut Server, limit: Duration) -> (bool, f64) {
    let pid = server.child.id().to_string();
    let t0 = std::time::Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    while t0.elapsed() < limit {
        if let Some(status) = server.child.try_wait().unwrap() {
            return (status.success(), t0.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("flowrt serve did not stop within {limit:?} of SIGTERM");
}

/// Issue 18: SIGTERM waited without bound for open requests (an `ignore_eos` stream ran on
/// for 30 s+). With `--shutdown-timeout 2`, a stream still generating is cut off after 2 s
/// and the process exits 0.
#[cfg(unix)]
#[test]
fn sigterm_cuts_off_an_endless_stream_after_the_shutdown_timeout() {
    let mut server = serve(&["--shutdown-timeout", "2"]);
    let mut s = TcpStream::connect(&server.addr).unwrap();
    let body = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Count to a million."}}],"max_tokens":900,"ignore_eos":true,"stream":true}}"#
    );
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut first = [0u8; 512];
    let n = s.read(&mut first).unwrap();
    let head = String::from_utf8_lossy(&first[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        String::from_utf8_lossy(&rest).into_owned()
    });
    let (ok, secs) = terminate(&mut server, Duration::from_secs(20));
    assert!(ok, "exit status not 0");
    assert!(
        (1.5..5.0).contains(&secs),
        "stopped {secs:.1} s after SIGTERM (timeout 2 s)"
    );
    let rest = reader.join().unwrap();
    assert!(
        !rest.contains("[DONE]"),
        "the stream finished instead of being cut off"
    );
}

/// Issue 18: a connection that sends half a request header and stops held the shutdown
/// forever. It cannot hold it past `--shutdown-timeout`.
#[cfg(unix)]
#[test]
fn a_half_sent_header_does_not_block_the_exit() {
    let mut server = serve(&["--shutdown-timeout", "1"]);
    let mut s = TcpStream::connect(&server.addr).unwrap();
    write!(
        s,
        "GET /health HTTP/1.1\r\nHost: {}\r\nX-Slow: ",
        server.addr
    )
    .unwrap();
    s.flush().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (ok, secs) = terminate(&mut server, Duration::from_secs(20));
    assert!(ok, "exit status not 0");
    assert!(
        secs < 4.0,
        "stopped {secs:.1} s after SIGTERM (timeout 1 s)"
    );
    drop(s);
}

/// Issue 18: `--header-timeout` closes a connection that sent half a request header and
/// stopped, and such a connection holds the exit no longer than that, even with a long
/// `--shutdown-timeout`.
#[cfg(unix)]
#[test]
fn header_timeout_closes_a_half_sent_header_and_bounds_the_exit() {
    let mut server = serve(&["--header-timeout", "1", "--shutdown-timeout", "30"]);
    let half = |addr: &str| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let mut s = half(&server.addr);
    let t0 = std::time::Instant::now();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!(
            "expected the connection closed at the header timeout (1 s), got {other:?} after {:?}",
            t0.elapsed()
        ),
    }
    let took = t0.elapsed().as_secs_f64();
    assert!(
        (0.8..4.0).contains(&took),
        "closed after {took:.1} s (header timeout 1 s)"
    );
    let _held = half(&server.addr);
    std::thread::sleep(Duration::from_millis(200));
    let (ok, secs) = terminate(&mut server, Duration::from_secs(40));
    assert!(ok, "exit status not 0");
    assert!(
        secs < 4.0,
        "stopped {secs:.1} s after SIGTERM (header timeout 1 s, shutdown timeout 30 s)"
    );
}

#[test]
fn a_zero_or_malformed_header_timeout_is_refused() {
    for bad in ["0", "5x"] {
        let (status, err) = refused_at_start(
            Command::new(env!("CARGO_BIN_EXE_flowrt"))
                .args(["serve", "--header-timeout", bad, "--port", "0"])
                .arg(smollm2()),
        );
        assert!(
            status.is_some_and(|s| !s.success()),
            "--header-timeout {bad} was accepted: {err}"
        );
        assert!(err.contains("--header-timeout"), "{bad}: {err}");
    }
}

#[test]
fn a_chat_template_that_builds_gigabytes_is_refused_and_the_server_keeps_serving() {
    // The tiny Llama checkpoint with a template whose loop doubles a string forty times:
    // a few dozen instructions, terabytes if nothing stops it. The server renders templates
    // in a worker process whose memory is capped, so the request gets a 400 naming the
    // limit, the server's own memory never holds the string, and other requests go on.
    let dir = tempfile::Builder::new()
        .prefix("hostile")
        .tempdir()
        .unwrap();
    let src = repo_root().join("tests/fixtures/families/llama-untied");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e == "gguf") {
            continue;
        }
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let tc = dir.path().join("tokenizer_config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tc).unwrap()).unwrap();
    cfg["chat_template"] = serde_json::Value::from(
        "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    );
    std::fs::write(&tc, cfg.to_string()).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flowrt"));
    cmd.arg("serve").arg(dir.path());
    // The checkpoint's context is 128 positions.
    let server = start_ctx(cmd, "128");
    let model = dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let before = flowrt_testkit::peak_rss_kib(&server.child.id().to_string());
    for _ in 0..2 {
        let (status, body) = http(
            &server.addr,
            "POST",
            "/v1/chat/completions",
            &chat_body(&model),
        );
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("1024 MiB of memory"), "{body}");
        let (status, body) = http(
            &server.addr,
            "POST",
            "/v1/completions",
            &serde_json::json!({"model": model, "prompt": "hello", "max_tokens": 2}).to_string(),
        );
        assert_eq!(status, 200, "{body}");
    }
    let grew = flowrt_testkit::peak_rss_kib(&server.child.id().to_string()).saturating_sub(before);
    assert!(
        grew < 256 << 10,
        "the server's peak RSS grew by {grew} KiB while refusing the template"
    );
}
