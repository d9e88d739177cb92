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
    BudgetFailure, BudgetKey, BudgetState, Clock, EdgeRateLimitPort, Evaluation, Lease,
    ManualClock, PolicyId, PolicyMode, RateLimitDecision, RateLimitOutcome, RateLimitPolicy,
    RateLimitRequest, ReleaseOutcome, Releasing, SetDecision, SubjectDigest,
};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::ServiceExt;

/// The route template the operation id must use.
pub const ORDER_ROUTE: &str = "/api/orders/{id}";
/// Operation id of `GET /api/orders/{id}`.
pub const ORDER_OPERATION: &str = "GET /api/orders/{id}";

/// The crate's one fake port: answers each evaluation as it is told (one
/// outcome for every call, every policy of the set allowing, or what a real
/// provider it wraps answers), records what crossed it, and can hold each
/// evaluation at a gate until the test lets it through. A stand-in for a
/// provider's failure paths and for timing a real one cannot be asked for.
#[derive(Debug)]
pub struct ScriptedPort {
    answer: Arc<Mutex<Answer>>,
    policies: Vec<RateLimitPolicy>,
    inner: Option<Arc<dyn EdgeRateLimitPort>>,
    requests: Arc<Mutex<Vec<RateLimitRequest<'static>>>>,
    gate: Option<Arc<Gate>>,
    /// What every release answers; `None` forwards (or `NotHeld` without
    /// a provider behind).
    release_answer: Mutex<Option<ReleaseOutcome>>,
    releases: Mutex<Vec<Lease>>,
}

#[derive(Debug, Clone)]
enum Answer {
    /// This outcome, whatever the request.
    Outcome(RateLimitOutcome),
    /// A set decision admitting the request with this decision for each of
    /// its policies.
    EveryAllows(RateLimitDecision),
    /// The wrapped provider's answer.
    Forward,
}

/// Evaluations wait on `gate`; each one adds a permit to `entered` first.
#[derive(Debug)]
struct Gate {
    gate: Semaphore,
    entered: Semaphore,
}

impl ScriptedPort {
    /// Answers `outcome` to every evaluation.
    pub fn new(outcome: RateLimitOutcome, policies: Vec<RateLimitPolicy>) -> Self {
        Self::answering(Answer::Outcome(outcome), policies, None)
    }

    /// Admits every request, with `decision` for each policy of its set.
    pub fn every_allows(decision: RateLimitDecision, policies: Vec<RateLimitPolicy>) -> Self {
        Self::answering(Answer::EveryAllows(decision), policies, None)
    }

    /// Answers as `inner` does, with `inner`'s policies; operator calls go
    /// to `inner` too.
    pub fn forwarding(inner: Arc<dyn EdgeRateLimitPort>) -> Self {
        Self::answering(Answer::Forward, Vec::new(), Some(inner))
    }

    fn answering(
        answer: Answer,
        policies: Vec<RateLimitPolicy>,
        inner: Option<Arc<dyn EdgeRateLimitPort>>,
    ) -> Self {
        Self {
            answer: Arc::new(Mutex::new(answer)),
            policies,
            inner,
            requests: Arc::default(),
            gate: None,
            release_answer: Mutex::default(),
            releases: Mutex::default(),
        }
    }

    /// Holds every evaluation until [`ScriptedPort::open`] lets it through.
    pub fn gated(self) -> Self {
        let gate = Gate { gate: Semaphore::new(0), entered: Semaphore::new(0) };
        Self { gate: Some(Arc::new(gate)), ..self }
    }

    /// Waits until an evaluation has reached the gate.
    pub async fn entered(&self) {
        let gate = self.gate.as_ref().expect("a gated port");
        gate.entered.acquire().await.expect("the gate stays open").forget();
    }

    /// Lets one held evaluation through.
    pub fn open(&self) {
        self.gate.as_ref().expect("a gated port").gate.add_permits(1);
    }

    /// Answers `outcome` from now on.
    pub fn answer(&self, outcome: RateLimitOutcome) {
        *self.answer.lock().unwrap() = Answer::Outcome(outcome);
    }

    /// Answers `outcome` to every release from now on (a store gone
    /// away, which a real provider cannot be asked to be), after asking
    /// the wrapped provider, so its slot is still freed.
    pub fn answer_release(&self, outcome: ReleaseOutcome) {
        *self.release_answer.lock().unwrap() = Some(outcome);
    }

    /// The leases given back through this port, in order.
    pub fn releases(&self) -> Vec<Lease> {
        self.releases.lock().unwrap().clone()
    }

    pub fn requests(&self) -> Vec<RateLimitRequest<'static>> {
        self.requests.lock().unwrap().clone()
    }

    pub fn subjects(&self) -> Vec<SubjectDigest> {
        self.requests().into_iter().map(|request| request.subject).collect()
    }
}

#[async_trait]
impl EdgeRateLimitPort for ScriptedPort {
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation {
        let (requests, answer) = (Arc::clone(&self.requests), Arc::clone(&self.answer));
        let inner = self.inner.clone();
        let answered = move |request: RateLimitRequest<'_>| {
            requests.lock().unwrap().push(request.clone().into_owned());
            let answer = answer.lock().unwrap().clone();
            match (answer, &inner) {
                (Answer::Outcome(outcome), _) => Evaluation::ready(outcome),
                (Answer::EveryAllows(decision), _) => {
                    let members =
                        request.policies.ids().iter().map(|_| (PolicyMode::Enforce, decision));
                    Evaluation::ready(Ok(SetDecision::of_members(members)))
                }
                (Answer::Forward, Some(inner)) => inner.evaluate(request),
                (Answer::Forward, None) => unreachable!("only `forwarding` forwards"),
            }
        };
        match &self.gate {
            None => answered(request),
            Some(gate) => {
                let (gate, request) = (Arc::clone(gate), request.into_owned());
                Evaluation::pending(async move {
                    gate.entered.add_permits(1);
                    gate.gate.acquire().await.expect("the gate stays open").forget();
                    answered(request).await
                })
            }
        }
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        match &self.inner {
            Some(inner) => inner.policy(id),
            None => self.policies.iter().find(|policy| policy.id() == id),
        }
    }

    async fn is_ready(&self) -> bool {
        true
    }

    // Operator calls are never gated; without a provider behind, the edge
    // never asks for them.
    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        match &self.inner {
            Some(inner) => inner.inspect(key).await,
            None => Err(BudgetFailure::Unavailable),
        }
    }

    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        match &self.inner {
            Some(inner) => inner.reset(key).await,
            None => Err(BudgetFailure::Unavailable),
        }
    }

    fn release(&self, lease: &Lease) -> Releasing {
        self.releases.lock().unwrap().push(lease.clone());
        let told = *self.release_answer.lock().unwrap();
        let Some(inner) = &self.inner else {
            return Releasing::ready(told.unwrap_or(ReleaseOutcome::NotHeld));
        };
        match inner.release(lease).into_ready() {
            Ok(answered) => Releasing::ready(told.unwrap_or(answered)),
            Err(waiting) => Releasing::pending(async move { told.unwrap_or(waiting.await) }),
        }
    }
}

/// A set's answer as a provider gives it: `admitted`, with one decision
/// per policy in order; a denial in an admitted set is a shadow policy's.
pub fn set_of(admitted: bool, decisions: &[RateLimitDecision]) -> SetDecision {
    let mode = |decision: &RateLimitDecision| {
        if admitted && !decision.allowed { PolicyMode::Shadow } else { PolicyMode::Enforce }
    };
    let set = SetDecision::of_members(decisions.iter().map(|decision| (mode(decision), *decision)));
    assert_eq!(set.allowed(), admitted, "a set admits as its members say");
    set
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
/// A response body the test writes: a frame per message, the end when the
/// sender is dropped.
pub struct ChannelBody(pub tokio::sync::mpsc::UnboundedReceiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|bytes| Ok(http_body::Frame::data(bytes))))
    }
}

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

/// Every log line of the code run while [`CapturedLogs::subscriber`] is
/// the default, as text.
#[derive(Debug, Clone, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    /// A subscriber writing every event, at every level, here.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
    }

    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap()).lines().map(str::to_owned).collect()
    }
}
