//! `TransportBridge` against the crate's scripted port and a manual clock:
//! what crosses the port, how the set's outcome is read, what is logged and
//! counted.

mod support;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_web::{
    ApiKeyProblem, AuthenticatedPrincipal, DECISIONS_TOTAL, EVALUATION_SECONDS, EdgeSettings,
    RateLimitCost, Refusal, SubjectKind, TransportBridge, VersionedPseudonymizer, operation_digest,
};
use axum::extract::ConnectInfo;
use http::request::Parts;
use http::{HeaderValue, Request};
use secrecy::SecretSlice;
use shared_contract::{
    Algorithm, Clock, ManualClock, PolicyId, PolicyMode, PolicySet, RateLimitDecision,
    RateLimitFailure, RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest,
    UnavailableCategory,
};
use support::ScriptedPort;

fn allow(remaining: u64) -> RateLimitDecision {
    RateLimitDecision {
        allowed: true,
        remaining,
        retry_after_ms: 0,
        reset_after_ms: 1000,
        replayed: false,
    }
}

fn deny(retry_after_ms: u64) -> RateLimitDecision {
    RateLimitDecision { allowed: false, remaining: 0, retry_after_ms, ..allow(0) }
}

struct Fixture {
    port: Arc<ScriptedPort>,
    clock: ManualClock,
    bridge: TransportBridge,
    pseudonymizer: Arc<VersionedPseudonymizer>,
}

fn fixed_window(id: &str, mode: PolicyMode) -> RateLimitPolicy {
    let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit: 5,
        window: Duration::from_secs(1),
    });
    RateLimitPolicy::builder(id, algorithm).maximum_cost(5).mode(mode).build().unwrap()
}

const API_KEY_HEADER: http::HeaderName = http::HeaderName::from_static("x-api-key");

fn fixture(settings: EdgeSettings) -> Fixture {
    let policies = vec![
        fixed_window("default", PolicyMode::Enforce),
        fixed_window("burst", PolicyMode::Enforce),
        fixed_window("hourly", PolicyMode::Enforce),
        fixed_window("trial", PolicyMode::Shadow),
        fixed_window("trial-daily", PolicyMode::Shadow),
    ];
    let port = Arc::new(ScriptedPort::every_allows(allow(4), policies));
    let clock = ManualClock::new(1_700_000_000_000);
    let key = SecretSlice::from(vec![0x5a; 32]);
    let pseudonymizer = Arc::new(VersionedPseudonymizer::new([(1, key)], 1).unwrap());
    // These requests come from behind a layer that verified their API keys.
    let settings = EdgeSettings { api_key_header: Some(API_KEY_HEADER), ..settings };
    let bridge = TransportBridge::new(
        port.clone(),
        Arc::clone(&pseudonymizer),
        Arc::new(clock.clone()),
        settings,
    );
    Fixture { port, clock, bridge, pseudonymizer }
}

fn set(ids: &[&str]) -> PolicySet {
    PolicySet::new(ids.iter().map(|id| PolicyId::new(*id).unwrap())).unwrap()
}

/// Settings where the unmatched GET operation runs under `ids`.
fn mapped(ids: &[&str]) -> EdgeSettings {
    let operations = HashMap::from([("GET <unmatched>".to_owned(), set(ids))]);
    EdgeSettings { operations, ..EdgeSettings::default() }
}

const PEER: &str = "203.0.113.77:5100";

fn request() -> http::request::Builder {
    Request::get("/api/orders/42").extension(ConnectInfo(PEER.parse::<SocketAddr>().unwrap()))
}

fn parts(builder: http::request::Builder) -> Parts {
    builder.body(()).unwrap().into_parts().0
}

impl Fixture {
    fn requests(&self) -> Vec<RateLimitRequest<'static>> {
        self.port.requests()
    }

    fn answer(&self, outcome: RateLimitOutcome) {
        self.port.answer(outcome);
    }
}

#[tokio::test]
async fn no_raw_subject_crosses_the_port() {
    let fixture = fixture(EdgeSettings::default());
    let raw_ip = "203.0.113.77";
    let raw_key = "live-key-0123456789";
    let raw_principal = "alice@example.com";
    fixture.bridge.evaluate(&parts(request())).await.unwrap();
    fixture.bridge.evaluate(&parts(request().header("x-api-key", raw_key))).await.unwrap();
    let with_principal = request().extension(AuthenticatedPrincipal(raw_principal.into()));
    fixture.bridge.evaluate(&parts(with_principal)).await.unwrap();

    let requests = fixture.requests();
    assert_eq!(requests.len(), 3);
    for request in &requests {
        let crossed = format!("{request:?} {} {}", request.subject, request.operation);
        for raw in [raw_ip, raw_key, raw_principal, "alice", "GET", "unmatched"] {
            assert!(!crossed.contains(raw), "{raw} crossed the port in {crossed}");
        }
    }
    // Each request carries exactly the pseudonym of its subject (the IP as
    // its /32 network), whatever the operation.
    let expected = [
        (SubjectKind::ClientIp, "203.0.113.77/32"),
        (SubjectKind::ApiKey, raw_key),
        (SubjectKind::Principal, raw_principal),
    ]
    .map(|(kind, identity)| fixture.pseudonymizer.pseudonymize(kind, identity));
    let subjects: Vec<_> = requests.iter().map(|r| r.subject).collect();
    assert_eq!(subjects, expected);
}

#[tokio::test]
async fn every_request_gets_a_fresh_evaluation_id_and_cost_one() {
    let fixture = fixture(EdgeSettings::default());
    fixture.bridge.evaluate(&parts(request())).await.unwrap();
    fixture.bridge.evaluate(&parts(request())).await.unwrap();
    let requests = fixture.requests();
    assert_ne!(requests[0].evaluation_id, requests[1].evaluation_id);
    assert!(requests.iter().all(|r| r.cost == 1));
}

#[tokio::test]
async fn a_cost_extension_sets_the_cost() {
    let fixture = fixture(EdgeSettings::default());
    fixture.bridge.evaluate(&parts(request().extension(RateLimitCost(5)))).await.unwrap();
    fixture.bridge.evaluate(&parts(request().extension(RateLimitCost::default()))).await.unwrap();
    let costs: Vec<_> = fixture.requests().iter().map(|r| r.cost).collect();
    assert_eq!(costs, [5, 1]);
}

#[tokio::test]
async fn an_idempotency_key_changes_nothing() {
    let fixture = fixture(EdgeSettings::default());
    for _ in 0..2 {
        let builder = request()
            .header("idempotency-key", "same-key")
            .header("x-request-id", "same-id")
            .header("ratelimit-evaluation-id", "00000000-0000-4000-8000-000000000000");
        fixture.bridge.evaluate(&parts(builder)).await.unwrap();
    }
    fixture.bridge.evaluate(&parts(request())).await.unwrap();
    let requests = fixture.requests();
    // Same header twice: still two different server-made ids.
    assert_ne!(requests[0].evaluation_id, requests[1].evaluation_id);
    for request in &requests {
        assert_ne!(request.evaluation_id.to_string(), "00000000-0000-4000-8000-000000000000");
        assert_eq!(request.evaluation_id.as_uuid().get_version_num(), 4);
    }
    // Everything else is what the request without the headers produced.
    let without_id =
        |r: &RateLimitRequest| ((*r.policies).clone(), r.subject, r.operation, r.cost, r.deadline);
    assert_eq!(without_id(&requests[0]), without_id(&requests[2]));
    assert_eq!(without_id(&requests[1]), without_id(&requests[2]));
}

#[tokio::test]
async fn the_deadline_is_now_plus_the_budget() {
    let settings =
        EdgeSettings { evaluation_budget: Duration::from_millis(750), ..EdgeSettings::default() };
    let fixture = fixture(settings);
    fixture.clock.advance(Duration::from_secs(3));
    let now = fixture.clock.monotonic();
    fixture.bridge.evaluate(&parts(request())).await.unwrap();
    assert_eq!(fixture.requests()[0].deadline, now + Duration::from_millis(750));
}

#[tokio::test]
async fn operations_map_to_sets_and_the_default_set_covers_the_rest() {
    let fixture = fixture(mapped(&["hourly", "burst", "unknown"]));
    let mapped = fixture.bridge.evaluate(&parts(request())).await.unwrap();
    assert_eq!(mapped.policies, set(&["hourly", "burst", "unknown"]));
    // Described in the set's order; the port does not hold "unknown".
    let described: Vec<_> =
        mapped.described.iter().map(|p| p.as_ref().map(|p| p.id().as_str())).collect();
    assert_eq!(described, [Some("hourly"), Some("burst"), None]);
    let post = parts(request().method("POST"));
    let default = fixture.bridge.evaluate(&post).await.unwrap();
    assert_eq!(default.policies, set(&["default"]));
    let sent: Vec<_> = fixture.requests().into_iter().map(|r| r.policies).collect();
    assert_eq!(sent, [set(&["hourly", "burst", "unknown"]), set(&["default"])]);
}

#[tokio::test]
async fn the_operation_crosses_the_port_as_its_digest() {
    let fixture = fixture(mapped(&["burst"]));
    // A configured operation (digest made when the bridge was built) and
    // an unmapped one (digest made per request) are digested alike.
    fixture.bridge.evaluate(&parts(request())).await.unwrap();
    fixture.bridge.evaluate(&parts(request().method("POST"))).await.unwrap();
    let operations: Vec<_> =
        fixture.requests().into_iter().map(|r| r.operation.to_string()).collect();
    assert_eq!(
        operations,
        [
            operation_digest("GET <unmatched>").to_string(),
            operation_digest("POST <unmatched>").to_string()
        ]
    );
    // Values from python3 hashlib (see bridge.rs).
    assert_eq!(operations[0], "8c13b2e43046bcc7");
}

#[tokio::test]
async fn a_set_of_shadow_policies_admits_even_when_the_provider_fails() {
    let fixture = fixture(mapped(&["trial", "trial-daily"]));
    fixture.answer(Err(RateLimitFailure::Unavailable {
        category: UnavailableCategory::UnavailableBeforeSend,
        retry_after: Duration::from_secs(1),
    }));
    let shadow_only = fixture.bridge.evaluate(&parts(request())).await.unwrap();
    assert!(!shadow_only.outcome.is_allowed());
    assert!(!shadow_only.enforces());
    assert!(shadow_only.admits());
    // One enforced policy beside them, and the same failure fails closed.
    let mixed = fixture.bridge.evaluate(&parts(request().method("POST"))).await.unwrap();
    assert!(mixed.enforces());
    assert!(!mixed.admits());
}

#[tokio::test]
async fn only_enforced_denials_are_violations() {
    let fixture = fixture(mapped(&["burst", "trial", "hourly"]));
    // burst denies, trial (shadow) would deny, hourly allows: refused.
    let decisions = [deny(300), deny(9000), allow(3)];
    fixture.answer(Ok(support::set_of(false, &decisions)));
    let refused = fixture.bridge.evaluate(&parts(request())).await.unwrap();
    assert!(!refused.admits());
    let violated: Vec<_> = refused.violated_policies().iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(violated, ["burst"]);
    let enforced: Vec<_> = refused.enforced_decisions().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(enforced, ["burst", "hourly"]);
    // Only the shadow policy would deny: admitted.
    let decisions = [allow(4), deny(9000), allow(3)];
    fixture.answer(Ok(support::set_of(true, &decisions)));
    let admitted = fixture.bridge.evaluate(&parts(request())).await.unwrap();
    assert!(admitted.admits());
    assert!(admitted.violated_policies().is_empty());
}

#[tokio::test]
async fn a_rejected_request_never_reaches_the_port() {
    let fixture = fixture(EdgeSettings::default());
    let oversized = "k".repeat(257);
    let result = fixture.bridge.evaluate(&parts(request().header("x-api-key", oversized))).await;
    assert_eq!(result, Err(Refusal::InvalidApiKey(ApiKeyProblem::TooLong)));
    let not_ascii = HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
    let result = fixture.bridge.evaluate(&parts(request().header("x-api-key", not_ascii))).await;
    assert!(result.is_err());
    assert!(fixture.requests().is_empty());
}

type Labels = Vec<(String, String)>;
/// One counter increment: metric name, labels, amount.
type Increment = (String, Labels, u64);

/// Collects counter increments and histogram registrations by key.
#[derive(Debug, Default)]
struct CollectingRecorder {
    counters: Arc<Mutex<Vec<Increment>>>,
    histograms: Mutex<Vec<(String, Labels)>>,
}

#[derive(Debug)]
struct CollectingCounter {
    name: String,
    labels: Labels,
    counters: Arc<Mutex<Vec<Increment>>>,
}

impl metrics::CounterFn for CollectingCounter {
    fn increment(&self, value: u64) {
        self.counters.lock().unwrap().push((self.name.clone(), self.labels.clone(), value));
    }

    fn absolute(&self, _value: u64) {}
}

fn labels(key: &metrics::Key) -> Labels {
    key.labels().map(|label| (label.key().to_owned(), label.value().to_owned())).collect()
}

impl metrics::Recorder for CollectingRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(Arc::new(CollectingCounter {
            name: key.name().to_owned(),
            labels: labels(key),
            counters: Arc::clone(&self.counters),
        }))
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        self.histograms.lock().unwrap().push((key.name().to_owned(), labels(key)));
        metrics::Histogram::noop()
    }
}

fn pairs(items: &[(&str, &str)]) -> Labels {
    items.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

type Recorded = (Vec<Increment>, Vec<(String, Labels)>);

fn recorded(settings: EdgeSettings, drive: impl AsyncFnOnce(&Fixture)) -> Recorded {
    let recorder = CollectingRecorder::default();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let fixture = fixture(settings);
            drive(&fixture).await;
        });
    });
    let counters = recorder.counters.lock().unwrap().clone();
    let histograms = recorder.histograms.lock().unwrap().clone();
    (counters, histograms)
}

fn decision(policy: &str, outcome: &str, mode: &str) -> Increment {
    let labels = [("policy", policy), ("algorithm", "fixed-window"), ("outcome", outcome)];
    let mut labels = pairs(&labels);
    labels.push(("mode".to_owned(), mode.to_owned()));
    labels.push(("cached".to_owned(), "false".to_owned()));
    labels.push(("front".to_owned(), "http".to_owned()));
    (DECISIONS_TOTAL.to_owned(), labels, 1)
}

#[test]
fn metrics_carry_policy_algorithm_outcome_and_mode_but_no_subject() {
    let (counters, histograms) = recorded(EdgeSettings::default(), async |fixture| {
        fixture.bridge.evaluate(&parts(request().header("x-api-key", "live-key"))).await.unwrap();
        let oversized = "k".repeat(300);
        let rejected = parts(request().header("x-api-key", oversized));
        assert!(fixture.bridge.evaluate(&rejected).await.is_err());
    });
    assert_eq!(
        counters,
        [decision("default", "allowed", "enforce"), decision("default", "bad-request", "enforce")]
    );
    assert_eq!(
        histograms,
        [(
            EVALUATION_SECONDS.to_owned(),
            pairs(&[("policy", "default"), ("algorithm", "fixed-window"), ("front", "http")])
        )]
    );
    for (_, labels, _) in &counters {
        assert!(labels.iter().all(|(_, value)| !value.contains("live-key")));
    }
}

#[test]
fn every_policy_of_a_set_is_counted_with_its_own_answer_and_mode() {
    let settings = mapped(&["burst", "trial", "hourly"]);
    let (counters, _) = recorded(settings, async |fixture| {
        // The shadow policy would deny; the enforced ones allow.
        let decisions = [allow(4), deny(9000), allow(3)];
        fixture.answer(Ok(support::set_of(true, &decisions)));
        assert!(fixture.bridge.evaluate(&parts(request())).await.unwrap().admits());
        fixture.answer(Err(RateLimitFailure::Indeterminate { retry_after: Duration::ZERO }));
        fixture.bridge.evaluate(&parts(request())).await.unwrap();
    });
    assert_eq!(
        counters,
        [
            decision("burst", "allowed", "enforce"),
            decision("trial", "denied", "shadow"),
            decision("hourly", "allowed", "enforce"),
            decision("burst", "indeterminate", "enforce"),
            decision("trial", "indeterminate", "shadow"),
            decision("hourly", "indeterminate", "enforce"),
        ]
    );
}

#[test]
fn a_set_the_degraded_mode_decided_counts_degraded_for_each_policy_admitted_or_not() {
    let settings = mapped(&["burst", "hourly"]);
    let (counters, _) = recorded(settings, async |fixture| {
        let admitted = support::set_of(true, &[allow(4), allow(3)]).from_degraded();
        fixture.answer(Ok(admitted));
        assert!(fixture.bridge.evaluate(&parts(request())).await.unwrap().admits());
        let refused = support::set_of(false, &[allow(2), deny(9000)]).from_degraded();
        fixture.answer(Ok(refused));
        assert!(!fixture.bridge.evaluate(&parts(request())).await.unwrap().admits());
        // Back on the store: allowed and denied again.
        fixture.answer(Ok(support::set_of(true, &[allow(1); 2])));
        fixture.bridge.evaluate(&parts(request())).await.unwrap();
    });
    assert_eq!(
        counters,
        [
            decision("burst", "degraded", "enforce"),
            decision("hourly", "degraded", "enforce"),
            decision("burst", "degraded", "enforce"),
            decision("hourly", "degraded", "enforce"),
            decision("burst", "allowed", "enforce"),
            decision("hourly", "allowed", "enforce"),
        ]
    );
}

/// Collects every event as one `LEVEL field=value ...` line.
#[derive(Debug, Default)]
struct CollectingSubscriber {
    lines: Arc<Mutex<Vec<String>>>,
}

struct LineVisitor<'a>(&'a mut String);

impl tracing::field::Visit for LineVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        use std::fmt::Write;
        write!(self.0, " {}={value:?}", field.name()).expect("writing to a String cannot fail");
    }
}

impl tracing::Subscriber for CollectingSubscriber {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut LineVisitor(&mut line));
        self.lines.lock().unwrap().push(line);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_shadow_policy_that_would_deny_logs_one_line_with_the_pseudonym_only() {
    let subscriber = CollectingSubscriber::default();
    let lines = Arc::clone(&subscriber.lines);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let pseudonym = tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let fixture = fixture(mapped(&["burst", "trial"]));
            let decisions = [allow(4), deny(9000)];
            fixture.answer(Ok(support::set_of(true, &decisions)));
            let request = request().header("x-api-key", "raw-key-never-logged");
            assert!(fixture.bridge.evaluate(&parts(request)).await.unwrap().admits());
            fixture.pseudonymizer.pseudonymize(SubjectKind::ApiKey, "raw-key-never-logged")
        })
    });
    let lines = lines.lock().unwrap().clone();
    let shadow: Vec<_> =
        lines.iter().filter(|line| line.contains("shadow policy would deny")).collect();
    assert_eq!(shadow.len(), 1, "{lines:?}");
    let line = shadow[0];
    assert!(line.starts_with("INFO"), "{line}");
    for expected in [
        format!("subject={:?}", pseudonym.to_string()),
        "policy=trial".to_owned(),
        r#"operation="GET <unmatched>""#.to_owned(),
    ] {
        assert!(line.contains(&expected), "{expected} missing in {line}");
    }
    for line in &lines {
        assert!(!line.contains("raw-key-never-logged") && !line.contains("203.0.113.77"), "{line}");
    }
}

/// A provider down fails every request closed: one WARN a second, not
/// one a request, the next one saying how many were held back.
#[test]
fn failing_closed_logs_one_line_a_second_with_the_count_held_back() {
    let subscriber = CollectingSubscriber::default();
    let lines = Arc::clone(&subscriber.lines);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let fixture = fixture(mapped(&["burst"]));
            fixture.answer(Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::UnavailableBeforeSend,
                retry_after: Duration::from_secs(1),
            }));
            for _ in 0..5 {
                assert!(!fixture.bridge.evaluate(&parts(request())).await.unwrap().admits());
            }
            fixture.clock.advance(Duration::from_secs(1));
            assert!(!fixture.bridge.evaluate(&parts(request())).await.unwrap().admits());
        })
    });
    let lines = lines.lock().unwrap().clone();
    let failed: Vec<_> =
        lines.iter().filter(|line| line.contains("rate limit failed closed")).collect();
    assert_eq!(failed.len(), 2, "{lines:?}");
    assert!(failed[0].starts_with("WARN") && failed[0].contains("suppressed=0"), "{}", failed[0]);
    assert!(failed[1].contains("suppressed=4"), "{}", failed[1]);
}

/// One span made: its name, its parent's name, its fields as text.
type MadeSpan = (String, Option<String>, String);

/// Every span made.
#[derive(Debug, Clone, Default)]
struct SpanLog(Arc<Mutex<Vec<MadeSpan>>>);

impl<S> tracing_subscriber::Layer<S> for SpanLog
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    fn on_new_span(
        &self,
        attributes: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        context: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let span = context.span(id).unwrap();
        let mut fields = String::new();
        attributes.record(&mut LineVisitor(&mut fields));
        let parent = span.parent().map(|parent| parent.name().to_owned());
        self.0.lock().unwrap().push((span.name().to_owned(), parent, fields));
    }
}

/// Traces off means no span around the request: the bridge then makes
/// none either. Inside a request's span it makes one decision span, its
/// child, naming the subject by its pseudonym only.
#[test]
fn a_decision_span_is_made_only_inside_a_span_and_names_the_pseudonym() {
    use tracing::Instrument;
    use tracing_subscriber::layer::SubscriberExt;

    let spans = SpanLog::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let pseudonym = tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let fixture = fixture(mapped(&["burst"]));
            fixture.answer(Ok(support::set_of(true, &[allow(4)])));
            let keyed = || parts(request().header("x-api-key", "raw-key-never-in-a-span"));
            assert!(fixture.bridge.evaluate(&keyed()).await.unwrap().admits());
            assert!(spans.0.lock().unwrap().is_empty(), "an untraced request made a span");
            let request_span = tracing::info_span!("http.request");
            let evaluated = fixture.bridge.evaluate(&keyed()).instrument(request_span).await;
            assert!(evaluated.unwrap().admits());
            fixture.pseudonymizer.pseudonymize(SubjectKind::ApiKey, "raw-key-never-in-a-span")
        })
    });
    let spans = spans.0.lock().unwrap().clone();
    let names: Vec<_> =
        spans.iter().map(|(name, parent, _)| (name.as_str(), parent.clone())).collect();
    assert_eq!(
        names,
        [("http.request", None), ("rate_limit.decision", Some("http.request".to_owned()))]
    );
    let fields = &spans[1].2;
    assert!(
        fields.contains(&format!("rate_limit.subject={:?}", pseudonym.to_string())),
        "{fields}"
    );
    assert!(fields.contains("rate_limit.policies=burst"), "{fields}");
    assert!(!fields.contains("raw-key-never-in-a-span") && !fields.contains("203.0.113.77"));
}
