//! Serving one listener's connections (the public one and the admin one
//! alike): hyper's HTTP/1 connection with a header-read timeout, so a
//! client that never finishes its request head is closed, and a shutdown
//! that waits at most a grace for the open connections before it cuts
//! them, so no client can hold the process past it.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

/// How long a listener's connections may take (`server.*`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// `server.header-read-timeout`.
    pub(crate) header_read_timeout: Duration,
    /// `server.shutdown-grace`.
    pub(crate) shutdown_grace: Duration,
}

/// Serves `router` on `listener` until `shutdown` completes; then stops
/// accepting, lets each open connection finish its request in flight
/// (idle ones close at once) for up to `shutdown_grace`, and cuts the rest,
/// logging how many. `name` tells the listeners apart in that line.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    name: &'static str,
) {
    let mut http = http1::Builder::new();
    // Without a timer hyper enforces no header-read timeout at all.
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    // A client may shut down its sending side once its request is sent
    // (`shutdown(SHUT_WR)`) and still read the answer: without this hyper
    // takes the read side's end for the client gone and closes unanswered.
    http.half_close(true);
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let connection = connection(&http, stream, peer, router.clone(), stopping.clone());
                    connections.spawn(connection);
                }
                Err(error) => accept_failed(&error, name).await,
            },
            // Reaps the finished ones, so the set holds only open connections.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop.send(true);
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.shutdown_grace, drained).await.is_err() {
        while connections.try_join_next().is_some() {}
        let cut = connections.len();
        connections.shutdown().await;
        tracing::warn!(
            listener = name,
            cut,
            grace = ?limits.shutdown_grace,
            "shutdown grace elapsed; connections cut"
        );
    }
}

/// One connection: HTTP/1 with upgrades, the peer address as axum's
/// `ConnectInfo` (what the edge counts a client IP by), and a graceful
/// close once `stopping` turns true.
fn connection(
    http: &http1::Builder,
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    mut stopping: watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send + 'static {
    let service = router.map_request(move |mut request: axum::http::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    });
    let connection = http
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
        .with_upgrades();
    async move {
        let mut connection = std::pin::pin!(connection);
        tokio::select! {
            // A header-read timeout or a client gone is no server error.
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection closed with an error");
                }
                return;
            }
            _ = stopping.wait_for(|stop| *stop) => connection.as_mut().graceful_shutdown(),
        }
        if let Err(error) = connection.await {
            tracing::debug!(%error, "connection closed with an error while draining");
        }
    }
}

/// An accept that failed: a connection the client gave up on is skipped;
/// anything else (out of file descriptors, say) is logged and waited out,
/// so the loop does not spin, as `axum::serve` does.
async fn accept_failed(error: &io::Error, name: &'static str) {
    match error.kind() {
        io::ErrorKind::ConnectionRefused
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::ConnectionReset => {}
        _ => {
            tracing::error!(listener = name, %error, "accept failed; retrying in 1 s");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
