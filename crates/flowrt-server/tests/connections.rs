//! The connection loop ([`flowrt_server::serve`]) on a real loopback socket: a client that
//! sends half a request header and stops is closed at the header timeout, and neither it
//! nor an idle kept-alive connection holds the shutdown; complete requests are answered as
//! before (the router's Host check included). No model is needed: the server serves none.

use std::time::{Duration, Instant};

use flowrt_server::{app, serve, AppState, ServeOptions, ServerConfig, Stopped, LOOPBACK_HOSTS};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const HALF_HEADER: &[u8] = b"GET /health HTTP/1.1\r\nHost: localhost\r\n";

/// Reads what is there (0 at EOF), with tokio's readiness API (tokio's `io-util` is not
/// among the features the workspace builds).
async fn read(s: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        s.readable().await?;
        match s.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

async fn write_all(s: &TcpStream, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        s.writable().await.unwrap();
        match s.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => panic!("writing: {e}"),
        }
    }
}

/// A server on a free loopback port; send on the returned sender to shut it down.
async fn start(options: ServeOptions) -> (String, oneshot::Sender<()>, JoinHandle<Stopped>) {
    start_with(options, ServerConfig::default()).await
}

/// [`start`] with `config` (its allowed hosts set to loopback's).
async fn start_with(
    options: ServeOptions,
    config: ServerConfig,
) -> (String, oneshot::Sender<()>, JoinHandle<Stopped>) {
    let config = ServerConfig {
        allowed_hosts: Some(LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect()),
        ..config
    };
    let router = app(AppState::new(Vec::new(), config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, router, options, async move {
        let _ = rx.await;
    }));
    (addr, tx, server)
}

/// Sends the shutdown signal and waits for `serve` to return, at most `limit`: how it stopped
/// and how long after the signal.
async fn stop_and_wait(
    stop: oneshot::Sender<()>,
    server: JoinHandle<Stopped>,
    limit: Duration,
) -> (Stopped, Duration) {
    let t0 = Instant::now();
    stop.send(()).unwrap();
    let stopped = tokio::time::timeout(limit, server)
        .await
        .unwrap_or_else(|_| panic!("serve did not return within {limit:?} of the signal"))
        .unwrap();
    (stopped, t0.elapsed())
}

/// Reads until the server closes the connection (EOF or reset), at most `limit`; the
/// bytes read and how long it took, or `None` if the connection was still open at `limit`.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> Option<(Vec<u8>, Duration)> {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.checked_sub(t0.elapsed())?;
        match tokio::time::timeout(left, read(s, &mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some((got, t0.elapsed())),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One request on an open connection, answered with `Content-Length`: (status, body).
async fn request(s: &mut TcpStream, path: &str, host: &str) -> (u16, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
    write_all(s, req.as_bytes()).await;
    read_response(s).await
}

/// The next response on `s`, answered with `Content-Length`: (status, body).
async fn read_response(s: &mut TcpStream) -> (u16, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), read(s, &mut buf))
            .await
            .expect("no answer within 10 s")
            .unwrap();
        assert!(
            n > 0,
            "closed before answering: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().unwrap())
                })
                .expect("no Content-Length");
            if body.len() >= len {
                let status = head.split(' ').nth(1).unwrap().parse().unwrap();
                return (status, body.to_string());
            }
        }
    }
}

fn options(header_timeout: Option<Duration>, shutdown_timeout: Duration) -> ServeOptions {
    ServeOptions {
        header_timeout,
        shutdown_timeout,
    }
}

/// Issue 18: a connection that sent half a header and stopped was held open forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_header_is_closed_at_the_header_timeout() {
    let (addr, stop, server) = start(options(
        Some(Duration::from_millis(500)),
        Duration::from_secs(5),
    ))
    .await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    write_all(&s, HALF_HEADER).await;
    let (got, took) = read_until_closed(&mut s, Duration::from_secs(10))
        .await
        .expect("the half-sent header was still open after 10 s (header timeout 0.5 s)");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "closed after {took:?} (header timeout 0.5 s)"
    );
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    // The same happens to a connection that sends nothing at all.
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    let (_, took) = read_until_closed(&mut silent, Duration::from_secs(10))
        .await
        .expect("a silent connection was still open after 10 s (header timeout 0.5 s)");
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
    // And the server goes on answering.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(request(&mut s, "/health", "localhost").await.0, 200);
    stop.send(()).unwrap();
    assert_eq!(server.await.unwrap(), Stopped::Drained);
}

/// Issue 18: a body sent a byte at a time (or not at all after its header) held the
/// connection and its buffer for as long as the client liked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_within_the_body_timeout_is_a_408() {
    let config = ServerConfig {
        body_timeout: Some(Duration::from_millis(500)),
        ..ServerConfig::default()
    };
    let (addr, stop, server) = start_with(
        options(Some(Duration::from_secs(10)), Duration::from_secs(5)),
        config,
    )
    .await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let t0 = Instant::now();
    write_all(
        &s,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":",
    )
    .await;
    let (status, body) = read_response(&mut s).await;
    let took = t0.elapsed();
    assert_eq!(status, 408, "{body}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "answered after {took:?} (body timeout 0.5 s)"
    );
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "request_timeout", "{body}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--body-timeout"),
        "{body}"
    );
    // A whole body in time is read as before (no model is served: a 404 naming it).
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let json = br#"{"model":"nope","messages":[{"role":"user","content":"hi"}]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        json.len()
    );
    write_all(&s, head.as_bytes()).await;
    write_all(&s, json).await;
    let (status, body) = read_response(&mut s).await;
    assert_eq!(status, 404, "{body}");
    stop.send(()).unwrap();
    assert_eq!(server.await.unwrap(), Stopped::Drained);
}

/// Complete requests are served as before: keep-alive within the bound, the router's Host
/// check, and a kept-alive connection idle past the header timeout is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_requests_are_answered_and_kept_alive_within_the_bound() {
    let (addr, stop, server) = start(options(
        Some(Duration::from_millis(800)),
        Duration::from_secs(5),
    ))
    .await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let (status, body) = request(&mut s, "/health", "localhost").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"status\":\"ok\""), "{body}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = request(&mut s, "/v1/models", "127.0.0.1:8001").await;
    assert_eq!(status, 200, "second request on the same connection: {body}");
    let (status, body) = request(&mut s, "/v1/models", "evil.example").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("Host"), "{body}");
    // Idle past the bound: closed.
    let (_, took) = read_until_closed(&mut s, Duration::from_secs(10))
        .await
        .expect("an idle kept-alive connection was still open after 10 s (header timeout 0.8 s)");
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
    stop.send(()).unwrap();
    assert_eq!(server.await.unwrap(), Stopped::Drained);
}

/// Issue 18: a half-sent header held the exit after SIGTERM. With a shutdown timeout far
/// longer than the header timeout, the shutdown ends at the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_does_not_wait_for_a_half_sent_header_beyond_the_header_timeout() {
    let (addr, stop, server) = start(options(
        Some(Duration::from_secs(1)),
        Duration::from_secs(20),
    ))
    .await;
    let mut half = TcpStream::connect(&addr).await.unwrap();
    write_all(&half, HALF_HEADER).await;
    // An idle kept-alive connection is closed at once by the shutdown.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(request(&mut idle, "/health", "localhost").await.0, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (stopped, took) = stop_and_wait(stop, server, Duration::from_secs(30)).await;
    assert_eq!(stopped, Stopped::Drained);
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after the signal (header timeout 1 s, shutdown timeout 20 s)"
    );
    assert!(read_until_closed(&mut idle, Duration::from_secs(1))
        .await
        .is_some());
    assert!(read_until_closed(&mut half, Duration::from_secs(1))
        .await
        .is_some());
}

/// Without a header timeout, the shutdown timeout still bounds the wait, and says how many
/// connections it cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_header_timeout_the_shutdown_timeout_bounds_the_exit() {
    let (addr, stop, server) = start(options(None, Duration::from_millis(700))).await;
    let half = TcpStream::connect(&addr).await.unwrap();
    write_all(&half, HALF_HEADER).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (stopped, took) = stop_and_wait(stop, server, Duration::from_secs(30)).await;
    assert_eq!(stopped, Stopped::CutOff { open: 1 });
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(3),
        "stopped {took:?} after the signal (shutdown timeout 0.7 s)"
    );
}

/// After the signal the listener is closed: new connections are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_shutdown_new_connections_are_refused() {
    let (addr, stop, server) = start(ServeOptions::default()).await;
    stop.send(()).unwrap();
    assert_eq!(server.await.unwrap(), Stopped::Drained);
    assert!(TcpStream::connect(&addr).await.is_err());
}

/// An idle kept-alive connection is closed by the shutdown at once, not at its header
/// timeout or the shutdown timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_closes_idle_kept_alive_connections_at_once() {
    let (addr, stop, server) = start(options(
        Some(Duration::from_secs(30)),
        Duration::from_secs(30),
    ))
    .await;
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(request(&mut idle, "/health", "localhost").await.0, 200);
    let (stopped, took) = stop_and_wait(stop, server, Duration::from_secs(60)).await;
    assert_eq!(stopped, Stopped::Drained);
    assert!(
        took < Duration::from_secs(2),
        "stopped {took:?} after the signal"
    );
    assert!(read_until_closed(&mut idle, Duration::from_secs(1))
        .await
        .is_some());
}
