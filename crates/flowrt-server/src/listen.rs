//! The connection loop `flowrt serve` runs the [`crate::app`] router in: HTTP/1.1 over a TCP
//! listener, with a bound on how long a client may take to send a request header, and a
//! shutdown that drains open connections within a bound.
//!
//! `axum::serve` has no header-read timeout: a client that sent half a request header and
//! stopped held its connection (a task and a socket) forever, and held the exit after
//! SIGTERM. Here every connection is served by hyper's HTTP/1 connection with its
//! `header_read_timeout` on a Tokio timer.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The default `--header-timeout`.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How [`serve`] treats connections.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// How long a connection may take to send a complete request header, counted from the
    /// moment the server waits for one: from accept, and on a kept-alive connection from the
    /// end of the previous response (so an idle kept-alive connection is also closed after
    /// this long). A connection over the bound is closed without an answer. `None`: no bound.
    pub header_timeout: Option<Duration>,
    /// After the shutdown signal, how long open connections may run on (an idle or half-sent
    /// one is closed at once or at its header timeout; one with a request in flight gets to
    /// finish it) before [`serve`] returns and leaves them to be cut off.
    pub shutdown_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            header_timeout: Some(DEFAULT_HEADER_TIMEOUT),
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

/// How [`serve`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Every connection closed within the shutdown timeout.
    Drained,
    /// The shutdown timeout passed with `open` connections still open; their tasks end
    /// when the runtime does.
    CutOff { open: usize },
}

/// Serves `app` on `listener` until `signal` completes, then stops accepting, asks every
/// open connection to close after its request in flight (idle ones close at once), and
/// waits for them at most `options.shutdown_timeout`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: ServeOptions,
    signal: impl Future<Output = ()>,
) -> Stopped {
    // `stop` tells the connections to shut down; each connection task holds a receiver of
    // `open`, so the sender sees when the last one has ended.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (open_tx, open_rx) = watch::channel(());
    let mut signal = std::pin::pin!(signal);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(conn) => conn,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors, say: wait for connections to close instead
                    // of spinning on the error.
                    tracing::error!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            () = &mut signal => break,
        };
        // Streamed tokens go out as small writes; without this, Nagle's algorithm can hold
        // one back until the previous one is acknowledged.
        let _ = stream.set_nodelay(true);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(options.header_timeout);
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = stopping(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!("connection from {peer}: {e}");
            }
            drop(open);
        });
    }
    drop(listener);
    drop(open_rx);
    let _ = stop_tx.send(true);
    match tokio::time::timeout(options.shutdown_timeout, open_tx.closed()).await {
        Ok(()) => Stopped::Drained,
        Err(_) => Stopped::CutOff {
            open: open_tx.receiver_count(),
        },
    }
}

/// Completes when `stop` turns true (or its sender is gone).
async fn stopping(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, not held across the caller's awaits.
    let _ = stop.wait_for(|stop| *stop).await.map(|_| ());
}

/// Errors of one connection that the listener itself survives.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
