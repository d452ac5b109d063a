//! The web chat page in a real browser: Debian's Chromium driven by Playwright for Python
//! (`scripts/e2e_web.py`) against `flowrt serve --api-key` on loopback with SmolLM2 (and
//! all-MiniLM-L6-v2, which only embeds). Where
//! Chromium or Playwright cannot be had, the test says NOT RUN and why (flowrt-testkit's
//! coverage report); `scripts/test` installs Chromium as root with apt.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flowrt_testkit::coverage;
use flowrt_testkit::models::{minilm, smollm2};

/// Pinned Playwright the test installs into `.venv-web` (it drives the system Chromium; its
/// own browser download is never used).
const PLAYWRIGHT_VERSION: &str = "1.65.2";
const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const KEY: &str = "web-test-key";
const WHAT: &str = "web chat page in Chromium (scripts/e2e_web.py)";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `$FLOWRT_CHROMIUM`, else `chromium` or `chromium-browser` on the PATH.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLOWRT_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

/// `.venv-web` with the pinned Playwright, created on first use; `Err` says why not.
fn playwright_python() -> Result<PathBuf, String> {
    let venv = repo_root().join(".venv-web");
    let py = venv.join("bin/python");
    let check = format!(
        "import playwright.sync_api, importlib.metadata as m; assert m.version('playwright') == '{PLAYWRIGHT_VERSION}'"
    );
    let ok = |py: &Path| {
        Command::new(py)
            .args(["-c", &check])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if py.is_file() && ok(&py) {
        return Ok(py);
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .map_err(|e| format!("running `{python} -m venv` failed: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{python} -m venv {}` failed (install python3-venv): {}",
            venv.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let out = Command::new(&py)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!("playwright=={PLAYWRIGHT_VERSION}"))
        .output()
        .map_err(|e| format!("running pip failed: {e}"))?;
    if !out.status.success() || !ok(&py) {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "pip could not install playwright=={PLAYWRIGHT_VERSION} into {}: {}",
            venv.display(),
            err.lines().last().unwrap_or("").trim()
        ));
    }
    Ok(py)
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

fn health(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = write!(
        s,
        "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    );
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.starts_with("HTTP/1.1 200")
}

fn serve() -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .arg("serve")
        .arg(smollm2())
        .arg(minilm())
        .args(["--api-key", KEY, "--port", "0", "--ctx-len", "1024"])
        .args(["--threads", "2", "--parallel", "2"])
        .env_remove("FLOWRT_API_KEY")
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
    std::thread::spawn(move || for _ in lines {});
    let server = Server { child, addr };
    for _ in 0..600 {
        if health(&server.addr) {
            return server;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("flowrt serve did not become healthy");
}

#[test]
fn web_chat_page_works_in_chromium() {
    let Some(chromium) = chromium() else {
        coverage::not_run(
            "web",
            WHAT,
            "no chromium or chromium-browser on the PATH and no FLOWRT_CHROMIUM (as root on Debian, scripts/test installs the `chromium` package)",
        );
        return;
    };
    let py = match playwright_python() {
        Ok(py) => py,
        Err(why) => {
            coverage::not_run("web", WHAT, &why);
            return;
        }
    };
    let server = serve();
    let mut cmd = Command::new(py);
    cmd.arg(repo_root().join("scripts/e2e_web.py"))
        .arg(format!("http://{}", server.addr))
        .arg(MODEL)
        .arg(minilm().file_name().unwrap())
        .arg(KEY)
        .arg(&chromium);
    // Where to write a screenshot of the page with its answers (docs/web-chat.png).
    if let Some(shot) = std::env::var_os("FLOWRT_WEB_SCREENSHOT") {
        cmd.arg(shot);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained while it runs, so a chatty failure cannot fill a pipe and stall it.
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if started.elapsed() > Duration::from_secs(180) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(
        status.is_some_and(|s| s.success()) && stdout.contains("all web chat checks passed"),
        "the browser checks failed{}:\n{stdout}\n{stderr}",
        if status.is_none() {
            " (timed out after 180 s)"
        } else {
            ""
        }
    );
    println!("{stdout}");
    coverage::ran("web", WHAT);
}
