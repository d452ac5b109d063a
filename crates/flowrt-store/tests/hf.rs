//! The Hugging Face HTTPS source against a local HTTP server standing in for the hub
//! (127.0.0.1, plain HTTP; nothing here touches the network): a whole download, resume
//! after an interrupted transfer, a server that ignores `Range`, a wrong hash, a wrong
//! size, a 404, and registration of the pulled model.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use flowrt_store::{
    CatalogEntry, CatalogInfo, CatalogSource, FetchPolicy, HfFile, ModelSource, Progress, Store,
    StoreError,
};
use sha2::{Digest, Sha256};

const FILE: HfFile = HfFile {
    repo: "test-org/tiny-model",
    revision: "0123abcd",
    file: "tiny.Q4_0.gguf",
};
const URL_PATH: &str = "/test-org/tiny-model/resolve/0123abcd/tiny.Q4_0.gguf";

fn payload() -> Vec<u8> {
    (0..1_500_000u32).map(|i| (i * 7 % 253) as u8).collect()
}

fn entry_for(bytes: &[u8]) -> &'static CatalogEntry {
    Box::leak(Box::new(CatalogEntry {
        tag: "tiny:1m",
        aliases: &["tiny"],
        description: "test model on a fake hub",
        file_name: "tiny.Q4_0.gguf",
        sha256: Box::leak(hex::encode(Sha256::digest(bytes)).into_boxed_str()),
        size: bytes.len() as u64,
        source: CatalogSource::HuggingFace(FILE),
        info: CatalogInfo {
            architecture: "llama",
            context_length: 128,
            parameters: 1_000,
            quantization: "q4_0",
        },
    }))
}

/// How the fake hub answers.
#[derive(Clone, Default)]
struct Behaviour {
    /// The file it serves at `URL_PATH`.
    body: Vec<u8>,
    /// Announce the whole length but close after this many body bytes (once).
    cut_after: Option<usize>,
    /// Answer `Range` requests with the whole file (200).
    ignore_range: bool,
}

#[derive(Default)]
struct Hub {
    behaviour: Behaviour,
    /// `(path, Range header)` of every request.
    log: Vec<(String, Option<String>)>,
}

/// Starts the fake hub; returns its endpoint (`http://127.0.0.1:PORT`) and its state.
fn start_hub(behaviour: Behaviour) -> (String, Arc<Mutex<Hub>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let hub = Arc::new(Mutex::new(Hub {
        behaviour,
        log: Vec::new(),
    }));
    let state = hub.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let _ = serve(conn, &state);
        }
    });
    (endpoint, hub)
}

fn serve(mut conn: TcpStream, hub: &Mutex<Hub>) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string();
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    let (b, cut) = {
        let mut hub = hub.lock().unwrap();
        hub.log.push((path.clone(), range.clone()));
        let cut = hub.behaviour.cut_after.take();
        (hub.behaviour.clone(), cut)
    };
    if path != URL_PATH {
        let msg = "Entry not found";
        write!(
            conn,
            "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{msg}",
            msg.len()
        )?;
        return Ok(());
    }
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|_| !b.ignore_range);
    let len = b.body.len();
    let (head, body) = match start {
        Some(s) if s >= len => {
            let head = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            (head, &b.body[..0])
        }
        Some(s) => (
            format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {s}-{}/{len}\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                len - 1,
                len - s
            ),
            &b.body[s..],
        ),
        None => (
            format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"),
            &b.body[..],
        ),
    };
    conn.write_all(head.as_bytes())?;
    match cut {
        Some(n) => {
            conn.write_all(&body[..n.min(body.len())])?;
            conn.flush()?;
            // Drop the connection mid-body.
            conn.shutdown(std::net::Shutdown::Both)?;
        }
        None => conn.write_all(body)?,
    }
    Ok(())
}

/// Records messages and the last byte count.
#[derive(Default)]
struct Recorder {
    messages: Vec<String>,
    last: Option<(u64, u64)>,
}

impl Progress for Recorder {
    fn message(&mut self, msg: &str) {
        self.messages.push(msg.to_string());
    }
    fn bytes(&mut self, done: u64, total: u64) {
        self.last = Some((done, total));
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn downloads_checks_installs_and_registers() {
    let data = payload();
    let entry = entry_for(&data);
    let (endpoint, hub) = start_hub(Behaviour {
        body: data.clone(),
        ..Default::default()
    });
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path()).with_hf_endpoint(&endpoint);

    let mut rec = Recorder::default();
    let registered = store.pull(entry, &mut rec).unwrap();
    let path = store.models_dir().join("tiny.Q4_0.gguf");
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert_eq!(rec.last, Some((data.len() as u64, data.len() as u64)));
    assert_eq!(
        files_in(&store.models_dir()),
        ["tiny.Q4_0.gguf", "tiny.Q4_0.gguf.sha256"],
        "no .part file is left"
    );
    assert_eq!(hub.lock().unwrap().log, [(URL_PATH.to_string(), None)]);

    // Registered, with the URL it came from.
    assert_eq!(registered.tag, "tiny:1m");
    assert_eq!(registered.source, ModelSource::Catalog);
    assert_eq!(registered.origin, format!("{endpoint}{URL_PATH}"));
    assert_eq!(registered.sha256, entry.sha256);
    assert_eq!(registered.size_bytes, data.len() as u64);
    assert_eq!(registered.path, std::path::absolute(&path).unwrap());
    let registry = store.registry().unwrap();
    assert_eq!(registry.get("tiny:1m"), Some(registered.clone()));
    // The bare alias of a (test) catalog entry is not in the built-in catalog, so it
    // resolves by the single-registered-size rule.
    assert_eq!(registry.resolve_tag("tiny").unwrap(), registered);

    // Pulling again does not download again.
    store.pull(entry, &mut Recorder::default()).unwrap();
    assert_eq!(hub.lock().unwrap().log.len(), 1);
}

#[test]
fn an_interrupted_transfer_resumes_with_a_range_request() {
    let data = payload();
    let entry = entry_for(&data);
    let cut = 600_000;
    let (endpoint, hub) = start_hub(Behaviour {
        body: data.clone(),
        cut_after: Some(cut),
        ..Default::default()
    });
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path()).with_hf_endpoint(&endpoint);

    let err = store.fetch(entry, &mut |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, StoreError::Http { .. }) && msg.contains("resume") && msg.contains(URL_PATH),
        "{msg}"
    );
    let part = store.models_dir().join("tiny.Q4_0.gguf.part");
    let have = std::fs::metadata(&part).unwrap().len();
    assert!(have > 0 && have <= cut as u64, "{have}");
    assert!(!store.models_dir().join("tiny.Q4_0.gguf").exists());

    let mut rec = Recorder::default();
    let path = store.fetch_with(entry, &mut rec).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert!(!part.exists());
    let log = hub.lock().unwrap().log.clone();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[1].1.as_deref(), Some(format!("bytes={have}-").as_str()));
    assert!(
        rec.messages.iter().any(|m| m.contains("resuming")),
        "{:?}",
        rec.messages
    );
}

#[test]
fn a_server_that_ignores_range_makes_it_start_over() {
    let data = payload();
    let entry = entry_for(&data);
    let (endpoint, hub) = start_hub(Behaviour {
        body: data.clone(),
        ignore_range: true,
        ..Default::default()
    });
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path()).with_hf_endpoint(&endpoint);
    // A leftover part (here: the right first bytes).
    std::fs::create_dir_all(store.models_dir()).unwrap();
    let part = store.models_dir().join("tiny.Q4_0.gguf.part");
    std::fs::write(&part, &data[..1000]).unwrap();

    let path = store.fetch(entry, &mut |_| {}).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);
    let log = hub.lock().unwrap().log.clone();
    assert_eq!(log[0].1.as_deref(), Some("bytes=1000-"));
}

#[test]
fn wrong_bytes_are_refused_and_deleted() {
    let data = payload();
    let entry = entry_for(&data);
    let mut wrong = data.clone();
    wrong[777_777] ^= 1;
    let (endpoint, _hub) = start_hub(Behaviour {
        body: wrong,
        ..Default::default()
    });
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path()).with_hf_endpoint(&endpoint);
    match store.fetch(entry, &mut |_| {}) {
        Err(e @ StoreError::HashMismatch { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(entry.sha256) && msg.contains(URL_PATH),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        files_in(&store.models_dir()).is_empty(),
        "nothing is installed or kept"
    );
    assert!(store.registry().unwrap().list().is_empty());
}

#[test]
fn a_file_of_the_wrong_size_is_refused_before_downloading_it() {
    let data = payload();
    let entry = entry_for(&data);
    let (endpoint, _hub) = start_hub(Behaviour {
        body: data[..1000].to_vec(),
        ..Default::default()
    });
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path()).with_hf_endpoint(&endpoint);
    match store.fetch(entry, &mut |_| {}) {
        Err(e @ StoreError::SizeMismatch { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("1000") && msg.contains("1500000"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!store.models_dir().join("tiny.Q4_0.gguf").exists());
}

#[test]
fn not_found_is_a_clear_error() {
    let data = payload();
    let mut entry = entry_for(&data).clone();
    entry.source = CatalogSource::HuggingFace(HfFile {
        file: "missing.gguf",
        ..FILE
    });
    let entry: &'static CatalogEntry = Box::leak(Box::new(entry));
    let (endpoint, _hub) = start_hub(Behaviour {
        body: data,
        ..Default::default()
    });
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path()).with_hf_endpoint(&endpoint);
    match store.ensure(entry, FetchPolicy::IfMissing, &mut |_| {}) {
        Err(e @ StoreError::HttpStatus { status: 404, .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("missing.gguf") && msg.contains("404"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!store.models_dir().join("tiny.Q4_0.gguf").exists());
}

#[test]
fn no_server_is_a_clear_error() {
    // A port nothing listens on: bind, note the port, close.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let data = payload();
    let entry = entry_for(&data);
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path()).with_hf_endpoint(format!("http://127.0.0.1:{port}"));
    match store.fetch(entry, &mut |_| {}) {
        Err(e @ StoreError::Http { .. }) => {
            assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn endpoint_comes_from_the_environment() {
    // The only test in this binary that touches the environment.
    std::env::set_var("FLOWRT_HOME", "/tmp/flowrt-hf-env-test");
    std::env::set_var("FLOWRT_HF_ENDPOINT", "http://127.0.0.1:9");
    let store = Store::from_env().unwrap();
    assert_eq!(store.hf_endpoint(), "http://127.0.0.1:9");
    std::env::remove_var("FLOWRT_HF_ENDPOINT");
    assert_eq!(
        Store::from_env().unwrap().hf_endpoint(),
        "https://huggingface.co"
    );
    assert_eq!(
        FILE.url("https://huggingface.co/"),
        format!("https://huggingface.co{URL_PATH}")
    );
}
