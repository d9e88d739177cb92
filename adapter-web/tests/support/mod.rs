//! Test harness: a real axum `Router` behind `RateLimitLayer`, driven
//! either in-process with `tower::ServiceExt::oneshot` (with `ConnectInfo`
//! inserted by hand) or over a real TCP listener with `reqwest`.

#![allow(dead_code, unreachable_pub, reason = "each test binary uses a different part")]

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_web::{
    EdgeSettings, RateLimitCost, RateLimitLayer, SubjectKind, TransportBridge,
    VersionedPseudonymizer,
};
use async_trait::async_trait;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, State};
use axum::middleware::map_request;
use axum::routing::get;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use ipnet::{Ipv4Net, Ipv6Net};
use secrecy::SecretSlice;
use shared_contract::{
    BudgetFailure, BudgetKey, BudgetState, Clock, EdgeRateLimitPort, ManualClock, PolicyId,
    RateLimitOutcome, RateLimitPolicy, RateLimitRequest, SubjectDigest,
};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::ServiceExt;

/// The route template the operation id must use.
pub const ORDER_ROUTE: &str = "/api/orders/{id}";
/// Operation id of `GET /api/orders/{id}`.
pub const ORDER_OPERATION: &str = "GET /api/orders/{id}";

/// A port that answers every request with the outcome it is told to and
/// records what crossed it. A stand-in for a provider's failure paths.
#[derive(Debug)]
pub struct ScriptedPort {
    outcome: Mutex<RateLimitOutcome>,
    policies: Vec<RateLimitPolicy>,
    requests: Mutex<Vec<RateLimitRequest>>,
}

impl ScriptedPort {
    pub fn new(outcome: RateLimitOutcome, policies: Vec<RateLimitPolicy>) -> Self {
        Self { outcome: Mutex::new(outcome), policies, requests: Mutex::new(Vec::new()) }
    }

    pub fn answer(&self, outcome: RateLimitOutcome) {
        *self.outcome.lock().unwrap() = outcome;
    }

    pub fn requests(&self) -> Vec<RateLimitRequest> {
        self.requests.lock().unwrap().clone()
    }

    pub fn subjects(&self) -> Vec<SubjectDigest> {
        self.requests().into_iter().map(|request| request.subject).collect()
    }
}

#[async_trait]
impl EdgeRateLimitPort for ScriptedPort {
    async fn evaluate(&self, request: RateLimitRequest) -> RateLimitOutcome {
        self.requests.lock().unwrap().push(request);
        *self.outcome.lock().unwrap()
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.policies.iter().find(|policy| policy.id() == id)
    }

    async fn is_ready(&self) -> bool {
        true
    }

    // Operator calls: the edge never asks for it.
    async fn inspect(&self, _: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        Err(BudgetFailure::Unavailable)
    }

    async fn reset(&self, _: &BudgetKey) -> Result<(), BudgetFailure> {
        Err(BudgetFailure::Unavailable)
    }
}

/// How requests reach the router.
#[derive(Debug, Clone, Copy)]
pub enum Via {
    /// `oneshot` on the router, with this `ConnectInfo` peer.
    Oneshot(SocketAddr),
    /// A real listener on 127.0.0.1 and a real HTTP client; the peer is
    /// 127.0.0.1.
    Tcp,
}

/// The default in-process peer: an address no test trusts.
pub const UNTRUSTED_PEER: &str = "198.51.100.7:40000";

pub fn oneshot() -> Via {
    Via::Oneshot(UNTRUSTED_PEER.parse().unwrap())
}

/// What came back.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

pub struct Harness {
    pub port: Arc<dyn EdgeRateLimitPort>,
    pub pseudonymizer: Arc<VersionedPseudonymizer>,
    pub clock: ManualClock,
    /// How many times the handler ran.
    pub calls: Arc<AtomicUsize>,
    router: Router,
    via: Via,
    base_url: Option<String>,
    client: reqwest::Client,
    server: Option<JoinHandle<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

pub fn pseudonymizer() -> Arc<VersionedPseudonymizer> {
    let key = SecretSlice::from(b"integration-test-key-of-32-bytes".to_vec());
    Arc::new(VersionedPseudonymizer::new([(1, key)], 1).unwrap())
}

async fn order(State(calls): State<Arc<AtomicUsize>>, Path(id): Path<String>) -> String {
    calls.fetch_add(1, Ordering::SeqCst);
    format!("order {id}")
}

async fn fallback(State(calls): State<Arc<AtomicUsize>>) -> (StatusCode, &'static str) {
    calls.fetch_add(1, Ordering::SeqCst);
    (StatusCode::NOT_FOUND, "no such route")
}

/// Test header whose number an upstream layer turns into a
/// [`RateLimitCost`] extension, as a real cost-aware layer would.
pub const COST_HEADER: &str = "x-test-cost";

async fn cost_from_header(mut request: Request<Body>) -> Request<Body> {
    let cost =
        request.headers().get(COST_HEADER).and_then(|value| value.to_str().ok()?.parse().ok());
    if let Some(cost) = cost {
        request.extensions_mut().insert(RateLimitCost(cost));
    }
    request
}

/// The identity text of a client address at the default prefixes: its
/// /32 (IPv4, IPv4-mapped IPv6 included) or /64 (IPv6) network.
pub fn network_at_defaults(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => Ipv4Net::new(v4, 32).unwrap().trunc().to_string(),
        IpAddr::V6(v6) => Ipv6Net::new(v6, 64).unwrap().trunc().to_string(),
    }
}

/// The plain enabled layer.
pub fn enabled(bridge: Arc<TransportBridge>) -> RateLimitLayer {
    RateLimitLayer::new(bridge)
}

impl Harness {
    pub async fn start(port: Arc<dyn EdgeRateLimitPort>, settings: EdgeSettings, via: Via) -> Self {
        Self::build(port, ManualClock::new(1_700_000_000_000), settings, via, enabled).await
    }

    pub async fn start_disabled(port: Arc<dyn EdgeRateLimitPort>, via: Via) -> Self {
        let clock = ManualClock::new(1_700_000_000_000);
        Self::build(port, clock, EdgeSettings::default(), via, |_| RateLimitLayer::disabled()).await
    }

    pub async fn build(
        port: Arc<dyn EdgeRateLimitPort>,
        clock: ManualClock,
        settings: EdgeSettings,
        via: Via,
        make_layer: impl FnOnce(Arc<TransportBridge>) -> RateLimitLayer,
    ) -> Self {
        settings.validate().unwrap();
        let pseudonymizer = pseudonymizer();
        let clock_handle: Arc<dyn Clock> = Arc::new(clock.clone());
        let bridge = TransportBridge::new(
            Arc::clone(&port),
            Arc::clone(&pseudonymizer),
            clock_handle,
            settings,
        );
        let layer = make_layer(Arc::new(bridge));
        let calls = Arc::new(AtomicUsize::new(0));
        let router = Router::new()
            .route(ORDER_ROUTE, get(order))
            .fallback(fallback)
            .with_state(Arc::clone(&calls))
            .layer(layer)
            // Added last, so it runs first: the cost is set upstream.
            .layer(map_request(cost_from_header));
        let (base_url, server) = match via {
            Via::Oneshot(_) => (None, None),
            Via::Tcp => {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let address = listener.local_addr().unwrap();
                let app = router.clone().into_make_service_with_connect_info::<SocketAddr>();
                let server = tokio::spawn(async move {
                    axum::serve(listener, app).await.unwrap();
                });
                (Some(format!("http://{address}")), Some(server))
            }
        };
        let client =
            reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
        Self { port, pseudonymizer, clock, calls, router, via, base_url, client, server }
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The client address the router sees.
    pub fn peer_ip(&self) -> String {
        match self.via {
            Via::Oneshot(peer) => peer.ip().to_string(),
            Via::Tcp => "127.0.0.1".to_owned(),
        }
    }

    /// The pseudonym of a client address, at the default prefixes.
    pub fn ip_digest(&self, ip: &str) -> SubjectDigest {
        let network = network_at_defaults(ip.parse().unwrap());
        self.pseudonymizer.pseudonymize(SubjectKind::ClientIp, &network)
    }

    /// The pseudonym of a client network written out (`"2001:db8::/64"`).
    pub fn network_digest(&self, network: &str) -> SubjectDigest {
        self.pseudonymizer.pseudonymize(SubjectKind::ClientIp, network)
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.request(Method::GET, path, headers).await
    }

    /// A request of any method, as [`Self::get`] sends a GET.
    pub async fn request(&self, method: Method, path: &str, headers: &[(&str, &str)]) -> Reply {
        match self.via {
            Via::Oneshot(peer) => {
                let mut request = Request::builder().method(method).uri(path);
                for (name, value) in headers {
                    request = request.header(*name, *value);
                }
                let request = request.extension(ConnectInfo(peer)).body(Body::empty()).unwrap();
                let response = self.router.clone().oneshot(request).await.unwrap();
                let (parts, body) = response.into_parts();
                let body = body.collect().await.unwrap().to_bytes();
                Reply { status: parts.status, headers: parts.headers, body }
            }
            Via::Tcp => {
                let url = format!("{}{path}", self.base_url.as_deref().unwrap());
                let mut request = self.client.request(method, url);
                for (name, value) in headers {
                    request = request.header(*name, *value);
                }
                let response = request.send().await.unwrap();
                let status = response.status();
                let headers = response.headers().clone();
                let body = response.bytes().await.unwrap();
                Reply { status, headers, body }
            }
        }
    }
}
