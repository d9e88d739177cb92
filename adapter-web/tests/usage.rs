//! Usage-based limits through the layer (docs/algorithms.md "Settling
//! usage"), on the real memory provider: a request carrying a
//! `RateLimitCost` reserves it; the `RateLimitUsage` its handler reports is
//! settled once the response body ends, is dropped, or, streamed, at its
//! end. The numbers are the docs' fixed-window worked numbers (`L = 10`,
//! `W = 1000`, at `T0 + 100`).

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::{EdgeSettings, RateLimitCost, RateLimitLayer, RateLimitUsage, TransportBridge};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::middleware::map_request;
use axum::routing::get;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use shared_contract::{
    Algorithm, Clock, ManualClock, PolicyId, PolicyScope, PolicySet, RateLimitPolicy,
};
use support::{ChannelBody, UNTRUSTED_PEER, pseudonymizer};
use tokio::sync::mpsc;
use tower::ServiceExt;

const T0: u64 = 1_800_000_000_000;

/// What the handlers share with the test.
#[derive(Clone, Default)]
struct Shared {
    /// Handler runs.
    runs: Arc<AtomicUsize>,
    /// The next `/stream` body, and the usage handle it reports through.
    stream: Arc<Mutex<Option<(ChannelBody, RateLimitUsage)>>>,
}

/// `x-use: U` reports `U` at once; no header reports nothing.
async fn work(State(shared): State<Shared>, request: Request<Body>) -> Response<Body> {
    shared.runs.fetch_add(1, Ordering::SeqCst);
    let used = request.headers().get("x-use").map(|value| value.to_str().unwrap().parse());
    let mut response = Response::new(Body::from("done"));
    if let Some(used) = used {
        response.extensions_mut().insert(RateLimitUsage::new(used.unwrap()));
    }
    response
}

/// Streams the test's body, reporting through the test's handle.
async fn stream(State(shared): State<Shared>) -> Response<Body> {
    shared.runs.fetch_add(1, Ordering::SeqCst);
    let (body, usage) = shared.stream.lock().unwrap().take().expect("a body to stream");
    let mut response = Response::new(Body::new(body));
    response.extensions_mut().insert(usage);
    response
}

/// `x-reserve: R` reserves `R`, as a team's own layer would set a cost.
async fn reserve(mut request: Request<Body>) -> Request<Body> {
    let reserved = request.headers().get("x-reserve").map(|v| v.to_str().unwrap().parse());
    if let Some(reserved) = reserved {
        request.extensions_mut().insert(RateLimitCost(reserved.unwrap()));
    }
    request
}

struct Edge {
    router: Router,
    shared: Shared,
}

impl Edge {
    fn new(clock: &ManualClock) -> Self {
        let window = Duration::from_secs(1);
        let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 10, window });
        // One budget across both routes.
        let policy = RateLimitPolicy::builder("tokens", algorithm)
            .maximum_cost(5)
            .scope(PolicyScope::Subject)
            .build()
            .unwrap();
        let clock: Arc<dyn Clock> = Arc::new(clock.clone());
        let port = Arc::new(MemoryEdgeRateLimitAdapter::new([policy], Arc::clone(&clock)).unwrap());
        let settings = EdgeSettings {
            default_policies: PolicySet::single(PolicyId::new("tokens").unwrap()),
            operations: HashMap::new(),
            ..EdgeSettings::default()
        };
        let bridge = TransportBridge::new(port, pseudonymizer(), clock, settings);
        let shared = Shared::default();
        let router = Router::new()
            .route("/work", get(work))
            .route("/stream", get(stream))
            .with_state(shared.clone())
            .layer(RateLimitLayer::new(Arc::new(bridge)))
            .layer(map_request(reserve));
        Self { router, shared }
    }

    /// Sends `path` with `headers`; the response, body unread.
    async fn send(&self, path: &str, headers: &[(&str, &str)]) -> Response<Body> {
        let peer: SocketAddr = UNTRUSTED_PEER.parse().unwrap();
        let mut request = Request::get(path).extension(ConnectInfo(peer));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap()
    }

    /// Sends, reads the whole body, and answers the status and the
    /// `RateLimit` header.
    async fn call(&self, reserve: u64, used: Option<u64>) -> (StatusCode, String) {
        let reserve = reserve.to_string();
        let used = used.map(|used| used.to_string());
        let mut headers = vec![("x-reserve", reserve.as_str())];
        if let Some(used) = &used {
            headers.push(("x-use", used.as_str()));
        }
        let response = self.send("/work", &headers).await;
        let status = response.status();
        let header = response.headers().get("ratelimit").map(|v| v.to_str().unwrap().to_owned());
        response.into_body().collect().await.unwrap();
        (status, header.unwrap_or_default())
    }
}

fn remaining(header: &str) -> u64 {
    let r = header.split(';').find_map(|field| field.strip_prefix("r=")).expect("an r field");
    r.parse().unwrap()
}

#[tokio::test]
async fn a_reported_usage_settles_against_its_reservation_once_the_body_ends() {
    let clock = ManualClock::new(T0 + 100);
    let edge = Edge::new(&clock);
    // The header shows the budget after the reservation: 10 - 5.
    let (status, header) = edge.call(5, Some(2)).await;
    assert_eq!((status, remaining(&header)), (StatusCode::OK, 5));
    // u = 2 gave 3 back: count 2, then this request's 1.
    assert_eq!(remaining(&edge.call(1, None).await.1), 7);
    assert_eq!(remaining(&edge.call(1, None).await.1), 6, "no report: the 1 stands");
    assert_eq!(remaining(&edge.call(5, Some(12)).await.1), 1, "count 9");
    // u = 12 charged 7 past the limit: count 16.
    let (status, _) = edge.call(1, None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let runs = edge.shared.runs.load(Ordering::SeqCst);
    assert_eq!(runs, 4, "a refused reservation runs no handler");
    clock.advance(Duration::from_millis(900));
    assert_eq!(remaining(&edge.call(1, None).await.1), 9, "the next window");
}

/// A report beyond a counter's range is charged as the most a settle
/// charges (10^9), never as nothing.
#[tokio::test]
async fn a_report_beyond_the_range_is_charged_as_its_most() {
    let clock = ManualClock::new(T0 + 100);
    let edge = Edge::new(&clock);
    assert_eq!(remaining(&edge.call(5, Some(u64::MAX - 1)).await.1), 5);
    let (status, _) = edge.call(1, None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "in debt");
}

#[tokio::test]
async fn a_streamed_body_settles_at_its_end_and_a_dropped_one_what_was_reported() {
    let clock = ManualClock::new(T0 + 100);
    let edge = Edge::new(&clock);
    let (frames, body) = mpsc::unbounded_channel();
    let usage = RateLimitUsage::unreported();
    *edge.shared.stream.lock().unwrap() = Some((ChannelBody(body), usage.clone()));
    let response = edge.send("/stream", &[("x-reserve", "5")]).await;
    let mut body = response.into_body();
    for _ in 0..3 {
        frames.send(Bytes::from_static(b"token")).unwrap();
        usage.add(1);
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(remaining(&edge.call(1, None).await.1), 4, "not settled while streaming");
    drop(frames);
    assert!(body.frame().await.is_none(), "the stream ended");
    // 3 of 5 used: 2 back, count 4.
    assert_eq!(remaining(&edge.call(1, None).await.1), 5);

    // Dropped early: what was reported by then (1 of 5) is settled.
    let (frames, body) = mpsc::unbounded_channel();
    let usage = RateLimitUsage::unreported();
    *edge.shared.stream.lock().unwrap() = Some((ChannelBody(body), usage.clone()));
    let response = edge.send("/stream", &[("x-reserve", "5")]).await;
    frames.send(Bytes::from_static(b"token")).unwrap();
    usage.add(1);
    drop(response);
    // Count 5 + 5 reserved - 4 given back = 6, then this 1.
    assert_eq!(remaining(&edge.call(1, None).await.1), 3);

    // Dropped before any report: the reservation stands.
    let (_frames, body) = mpsc::unbounded_channel();
    *edge.shared.stream.lock().unwrap() = Some((ChannelBody(body), RateLimitUsage::unreported()));
    drop(edge.send("/stream", &[("x-reserve", "2")]).await);
    assert_eq!(remaining(&edge.call(1, None).await.1), 0, "7 + 2 + 1");
}
