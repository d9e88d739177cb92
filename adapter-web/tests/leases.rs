//! In-flight leases through the layer (docs/algorithms.md, "Concurrency
//! (in-flight leases)"), on the real memory provider: a request admitted
//! under a concurrency policy holds its slot until its response body has
//! been sent or dropped, however the request ends: body read to its end,
//! body dropped unread, handler cancelled, handler panicking, client gone.
//! The scripted port stands in only for what a real provider cannot be
//! asked to do: fail a release, or answer `Indeterminate`.
//!
//! Every wait here is for an event (a handler entered, a slot held or
//! free), never a measured time.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::{BridgeSwitch, EdgeSettings, RateLimitLayer, SubjectKind, TransportBridge};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::routing::get;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use shared_contract::{
    Algorithm, BudgetKey, Clock, EdgeRateLimitPort, ManualClock, PolicyId, PolicyScope, PolicySet,
    RateLimitFailure, RateLimitPolicy, ReleaseOutcome, SubjectDigest, UnavailableCategory,
};
use std::io::Write;
use support::{ChannelBody, ScriptedPort, UNTRUSTED_PEER, pseudonymizer};

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tower::ServiceExt;

const T0: u64 = 1_700_000_040_000;

/// `exports`: at most `max_in_flight` per subject across every route, a
/// refusal telling clients 2.5 s (3 on the wire).
fn exports(max_in_flight: u64) -> RateLimitPolicy {
    let algorithm = Algorithm::Concurrency(shared_contract::Concurrency {
        max_in_flight,
        lease_ttl: Duration::from_secs(30),
        retry_after: Duration::from_millis(2500),
    });
    RateLimitPolicy::builder("exports", algorithm).scope(PolicyScope::Subject).build().unwrap()
}

/// What the handlers share with the test.
#[derive(Clone)]
struct Handlers {
    /// `/hold` sends here once it runs, then never answers.
    entered: mpsc::UnboundedSender<()>,
    /// The body the next `/stream` answers with.
    stream: Arc<Mutex<Option<ChannelBody>>>,
}

async fn quick() -> &'static str {
    "done"
}

async fn hold(State(handlers): State<Handlers>) -> &'static str {
    handlers.entered.send(()).unwrap();
    std::future::pending::<()>().await;
    unreachable!("a held request never answers")
}

async fn streamed(State(handlers): State<Handlers>) -> Response<Body> {
    let body = handlers.stream.lock().unwrap().take().expect("a body to stream");
    Response::new(Body::new(body))
}

async fn panics() -> &'static str {
    panic!("the handler panicked on purpose")
}

struct Leases {
    provider: Arc<dyn EdgeRateLimitPort>,
    router: Router,
    /// The bridge in force, to reload.
    switch: BridgeSwitch,
    entered: mpsc::UnboundedReceiver<()>,
    stream: Arc<Mutex<Option<ChannelBody>>>,
    subject: SubjectDigest,
}

impl Leases {
    /// The layer over `port`, every route under the set `exports`.
    fn over(port: Arc<dyn EdgeRateLimitPort>, clock: ManualClock) -> Self {
        Self::over_set(port, clock, &["exports"])
    }

    /// The layer over `port`, every route under the set `set`.
    fn over_set(port: Arc<dyn EdgeRateLimitPort>, clock: ManualClock, set: &[&str]) -> Self {
        let set = PolicySet::new(set.iter().map(|id| PolicyId::new(*id).unwrap())).unwrap();
        let settings = EdgeSettings {
            default_policies: set,
            operations: HashMap::new(),
            api_key_header: Some(http::HeaderName::from_static("x-api-key")),
            ..EdgeSettings::default()
        };
        let pseudonymizer = pseudonymizer();
        let peer: SocketAddr = UNTRUSTED_PEER.parse().unwrap();
        let subject = pseudonymizer
            .pseudonymize(SubjectKind::ClientIp, &support::network_at_defaults(peer.ip()));
        let shared: Arc<dyn Clock> = Arc::new(clock);
        let bridge = TransportBridge::new(Arc::clone(&port), pseudonymizer, shared, settings);
        let (entered_tx, entered) = mpsc::unbounded_channel();
        let stream = Arc::new(Mutex::new(None));
        let handlers = Handlers { entered: entered_tx, stream: Arc::clone(&stream) };
        let layer = RateLimitLayer::new(Arc::new(bridge));
        let switch = layer.switch().expect("an enabled layer").clone();
        let router = Router::new()
            .route("/quick", get(quick))
            .route("/hold", get(hold))
            .route("/stream", get(streamed))
            .route("/panic", get(panics))
            .with_state(handlers)
            .layer(layer);
        Self { provider: port, router, switch, entered, stream, subject }
    }

    /// The layer over a memory provider holding `exports(max_in_flight)`.
    fn memory(max_in_flight: u64) -> Self {
        let clock = ManualClock::new(T0);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let provider = MemoryEdgeRateLimitAdapter::new([exports(max_in_flight)], shared).unwrap();
        Self::over(Arc::new(provider), clock)
    }

    fn request(path: &str) -> Request<Body> {
        let peer: SocketAddr = UNTRUSTED_PEER.parse().unwrap();
        Request::get(path).extension(ConnectInfo(peer)).body(Body::empty()).unwrap()
    }

    /// The response of `path`, its body not read.
    async fn send(&self, path: &str) -> Response<Body> {
        self.router.clone().oneshot(Self::request(path)).await.unwrap()
    }

    /// The leases the subject holds now, as the provider counts them.
    async fn held(&self) -> u64 {
        let key = BudgetKey::new(self.subject, PolicyId::new("exports").unwrap(), None);
        let state = self.provider.inspect(&key).await.unwrap();
        state.limit - state.remaining
    }

    /// The admitted response of `/stream` and the sender of its body.
    async fn stream(&self) -> (mpsc::UnboundedSender<Bytes>, Response<Body>) {
        let (chunks, body) = mpsc::unbounded_channel();
        *self.stream.lock().unwrap() = Some(ChannelBody(body));
        let response = self.send("/stream").await;
        assert_eq!(response.status(), StatusCode::OK);
        (chunks, response)
    }

    /// Waits until a `/hold` handler runs.
    async fn entered(&mut self) {
        self.entered.recv().await.unwrap();
    }

    /// The status of a `/quick` whose body is read whole.
    async fn quick_status(&self) -> StatusCode {
        let response = self.send("/quick").await;
        let status = response.status();
        response.into_body().collect().await.unwrap();
        status
    }

    /// Waits until the subject holds `leases`: the release may run as a
    /// task. Fails if it never comes.
    async fn until_held(&self, leases: u64) {
        let settled = async {
            while self.held().await != leases {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), settled).await.is_err() {
            panic!("the subject never held {leases} leases (holds {})", self.held().await);
        }
    }
}

#[tokio::test]
async fn a_body_read_to_its_end_gives_the_slot_back_and_the_headers_show_no_window() {
    let leases = Leases::memory(2);
    let response = leases.send("/quick").await;
    assert_eq!(response.status(), StatusCode::OK);
    let header = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
    // q is max-in-flight, and there is no window to announce.
    assert_eq!(header("ratelimit-policy").as_deref(), Some(r#""exports";q=2"#));
    // One slot of two is taken while the response is out.
    assert_eq!(header("ratelimit").as_deref(), Some(r#""exports";r=1"#));
    assert_eq!(leases.held().await, 1);
    response.into_body().collect().await.unwrap();
    assert_eq!(leases.held().await, 0);
    for _ in 0..3 {
        assert_eq!(leases.quick_status().await, StatusCode::OK);
    }
    assert_eq!(leases.held().await, 0);
}

#[tokio::test]
async fn a_full_subject_is_refused_with_the_configured_retry_after_and_holds_nothing_more() {
    let mut leases = Leases::memory(1);
    let held = tokio::spawn(leases.router.clone().oneshot(Leases::request("/hold")));
    leases.entered().await;
    assert_eq!(leases.held().await, 1);

    let refused = leases.send("/quick").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let headers = refused.headers().clone();
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    // retry-after = "2500ms", rounded up to whole seconds.
    assert_eq!(headers["retry-after"], "3");
    assert_eq!(headers["ratelimit-policy"], r#""exports";q=1"#);
    assert_eq!(headers["ratelimit"], r#""exports";r=0"#);
    assert_eq!(problem["violated-policies"], json!(["exports"]));
    // The refusal took no lease: still only the held request's.
    assert_eq!(leases.held().await, 1);

    held.abort();
    leases.until_held(0).await;
    assert_eq!(leases.quick_status().await, StatusCode::OK);
}

#[tokio::test]
async fn a_streamed_body_gives_the_slot_back_at_its_end_before_it_is_dropped() {
    let leases = Leases::memory(1);
    let (chunks, response) = leases.stream().await;
    let mut body = response.into_body();
    chunks.send(Bytes::from_static(b"part one")).unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part one");
    // Mid-body the request is still in flight.
    assert_eq!(leases.held().await, 1);
    assert_eq!(leases.quick_status().await, StatusCode::TOO_MANY_REQUESTS);
    drop(chunks);
    assert!(body.frame().await.is_none(), "the body ends");
    // Sent whole: the slot is free though the body is not dropped yet.
    assert_eq!(leases.held().await, 0);
    assert_eq!(leases.quick_status().await, StatusCode::OK);
    drop(body);
    assert_eq!(leases.held().await, 0);
}

#[tokio::test]
async fn a_body_dropped_unread_gives_the_slot_back() {
    let leases = Leases::memory(1);
    let (chunks, response) = leases.stream().await;
    assert_eq!(leases.held().await, 1);
    // The client went away before the body: the server drops it.
    drop(response);
    assert_eq!(leases.held().await, 0);
    assert_eq!(leases.quick_status().await, StatusCode::OK);
    drop(chunks);
}

#[tokio::test]
async fn a_handler_cancelled_before_its_response_gives_the_slot_back() {
    let mut leases = Leases::memory(1);
    let mut pending = Box::pin(leases.router.clone().oneshot(Leases::request("/hold")));
    tokio::select! {
        _ = &mut pending => panic!("a held request never answers"),
        () = leases.entered() => {}
    }
    assert_eq!(leases.held().await, 1);
    // The future is dropped with no response (a timeout layer, a server
    // shutting down): the guard in its state gives the lease back.
    drop(pending);
    assert_eq!(leases.held().await, 0);
    assert_eq!(leases.quick_status().await, StatusCode::OK);
}

#[tokio::test]
async fn a_panicking_handler_gives_the_slot_back() {
    let leases = Leases::memory(1);
    let task = tokio::spawn(leases.router.clone().oneshot(Leases::request("/panic")));
    let error = task.await.expect_err("the handler panicked");
    assert!(error.is_panic());
    leases.until_held(0).await;
    assert_eq!(leases.quick_status().await, StatusCode::OK);
}

#[tokio::test]
async fn a_client_gone_mid_request_gives_the_slot_back() {
    let mut leases = Leases::memory(1);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = leases.router.clone().into_make_service_with_connect_info::<SocketAddr>();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // A plain socket: the kernel takes the connection and the bytes at
    // once, whatever the server task is doing.
    let mut client = std::net::TcpStream::connect(address).unwrap();
    client.write_all(b"GET /hold HTTP/1.1\r\nhost: test\r\n\r\n").unwrap();
    leases.entered().await;
    // Over TCP the peer is 127.0.0.1, another subject than the in-process one.
    let tcp_subject = pseudonymizer().pseudonymize(SubjectKind::ClientIp, "127.0.0.1/32");
    let tcp = Leases { subject: tcp_subject, ..leases };
    assert_eq!(tcp.held().await, 1);
    drop(client);
    tcp.until_held(0).await;
    server.abort();
}

/// A port that forwards to a memory provider but answers every release
/// with `release`: a store gone away, which the memory provider never is.
fn failing_release(release: ReleaseOutcome) -> (Arc<ScriptedPort>, Leases) {
    let clock = ManualClock::new(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let memory = MemoryEdgeRateLimitAdapter::new([exports(1)], shared).unwrap();
    let port = Arc::new(ScriptedPort::forwarding(Arc::new(memory)));
    port.answer_release(release);
    let leases = Leases::over(Arc::clone(&port) as _, clock);
    (port, leases)
}

#[test]
fn a_failed_release_is_counted_and_logged_without_the_raw_subject() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let logs = support::CapturedLogs::default();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let failures = |text: &str| {
        text.lines()
            .find_map(|line| {
                line.strip_prefix("ca_skeleton_rate_limit_lease_release_failures_total ")
            })
            .map(|value| value.trim().parse::<u64>().unwrap())
    };
    let _logging = tracing::subscriber::set_default(logs.subscriber());
    metrics::with_local_recorder(&recorder, || {
        let unavailable =
            ReleaseOutcome::Unavailable { category: UnavailableCategory::UnavailableBeforeSend };
        let (port, leases) = failing_release(unavailable);
        // Registered at 0 with the bridge, before any release.
        assert_eq!(failures(&handle.render()), Some(0), "{}", handle.render());
        runtime.block_on(async {
            let request = Request::get("/quick")
                .header("x-api-key", "raw-api-key-of-a-client")
                .extension(ConnectInfo(UNTRUSTED_PEER.parse::<SocketAddr>().unwrap()))
                .body(Body::empty())
                .unwrap();
            let response = leases.router.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            response.into_body().collect().await.unwrap();
        });
        assert_eq!(port.releases().len(), 1);
        assert_eq!(failures(&handle.render()), Some(1));

        // Not held is no failure.
        port.answer_release(ReleaseOutcome::NotHeld);
        runtime.block_on(async { leases.quick_status().await });
        assert_eq!(port.releases().len(), 2);
        assert_eq!(failures(&handle.render()), Some(1));
    });
    let lines = logs.lines();
    let failed: Vec<_> = lines.iter().filter(|line| line.contains("release failed")).collect();
    assert_eq!(failed.len(), 1, "{lines:#?}");
    assert!(failed[0].contains("exports"), "the policy is named: {failed:?}");
    assert!(failed[0].contains("unavailable"), "the outcome is named: {failed:?}");
    // An answer that failed says nothing of the store: a queued removal may
    // still have run (an Indeterminate one), so the slot only may stay taken.
    assert!(failed[0].contains("the slot may stay taken"), "{failed:?}");
    assert!(lines.iter().all(|line| !line.contains("raw-api-key-of-a-client")), "{lines:#?}");
}

#[tokio::test]
async fn an_indeterminate_answer_gives_back_what_it_may_have_taken_and_unavailable_nothing() {
    let clock = ManualClock::new(T0);
    let port = Arc::new(ScriptedPort::new(
        Err(RateLimitFailure::Indeterminate { retry_after: Duration::from_secs(1) }),
        vec![exports(1)],
    ));
    let leases = Leases::over(Arc::clone(&port) as _, clock);
    // 503: not served, and the lease it may hold is given back at once.
    let response = leases.send("/quick").await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let released = port.releases();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].id, port.requests()[0].evaluation_id);
    assert_eq!(released[0].policies, port.requests()[0].policies);

    // Unavailable provably wrote nothing: no release is asked for.
    port.answer(Err(RateLimitFailure::Unavailable {
        category: UnavailableCategory::UnavailableBeforeSend,
        retry_after: Duration::from_secs(1),
    }));
    assert_eq!(leases.send("/quick").await.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(port.releases().len(), 1);
}

/// A set without a concurrency policy gives nothing back (the bridge makes
/// no guard for it), and a request a rate policy refuses holds no lease.
#[tokio::test]
async fn only_an_admitted_request_of_a_set_with_a_concurrency_policy_gives_a_lease_back() {
    let once = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit: 1,
        window: Duration::from_secs(60),
    });
    let policies = || [exports(2), RateLimitPolicy::builder("once", once.clone()).build().unwrap()];
    let clock = ManualClock::new(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let memory = MemoryEdgeRateLimitAdapter::new(policies(), shared).unwrap();
    let port = Arc::new(ScriptedPort::forwarding(Arc::new(memory)));
    let rate_only = Leases::over_set(Arc::clone(&port) as _, clock, &["once"]);
    assert_eq!(rate_only.quick_status().await, StatusCode::OK);
    assert_eq!(rate_only.quick_status().await, StatusCode::TOO_MANY_REQUESTS);
    assert!(port.releases().is_empty(), "{:?}", port.releases());

    let clock = ManualClock::new(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let memory = MemoryEdgeRateLimitAdapter::new(policies(), shared).unwrap();
    let port = Arc::new(ScriptedPort::forwarding(Arc::new(memory)));
    let both = Leases::over_set(Arc::clone(&port) as _, clock, &["exports", "once"]);
    assert_eq!(both.quick_status().await, StatusCode::OK);
    assert_eq!(port.releases().len(), 1, "the admitted one gives its lease back");
    // Refused by `once`: no lease taken, none given back.
    let refused = both.send("/quick").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["ratelimit"], r#""exports";r=2, "once";r=0;t=60"#);
    drop(refused);
    assert_eq!(port.releases().len(), 1);
    assert_eq!(both.held().await, 0);
}

/// A reload while a request is in flight: the new table (a higher
/// `max-in-flight`, the same revision, so the same lease set) counts the
/// lease it holds, and the request gives it back through the provider it
/// was admitted by, into the store both share.
#[tokio::test]
async fn a_request_admitted_before_a_reload_gives_its_lease_back_after_it() {
    let clock = ManualClock::new(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let first = MemoryEdgeRateLimitAdapter::new([exports(1)], Arc::clone(&shared)).unwrap();
    let store = first.store().clone();
    let mut leases = Leases::over(Arc::new(first), clock);
    let mut pending = Box::pin(leases.router.clone().oneshot(Leases::request("/hold")));
    tokio::select! {
        _ = &mut pending => panic!("a held request never answers"),
        () = leases.entered() => {}
    }
    // The reloaded table, over the same store.
    let reloaded: Arc<dyn EdgeRateLimitPort> = Arc::new(
        MemoryEdgeRateLimitAdapter::with_store(store, [exports(3)], Arc::clone(&shared)).unwrap(),
    );
    let settings = leases.switch.current().settings().clone();
    let bridge = TransportBridge::new(Arc::clone(&reloaded), pseudonymizer(), shared, settings);
    leases.switch.replace(Arc::new(bridge));
    let reloaded = Leases { provider: reloaded, ..leases };
    assert_eq!(reloaded.held().await, 1, "the new table counts the held lease");
    let response = reloaded.send("/quick").await;
    assert_eq!(response.headers()["ratelimit-policy"], r#""exports";q=3"#);
    assert_eq!(response.headers()["ratelimit"], r#""exports";r=1"#);
    drop(response);
    assert_eq!(reloaded.held().await, 1);
    drop(pending);
    assert_eq!(reloaded.held().await, 0, "released through the provider it was admitted by");
}
