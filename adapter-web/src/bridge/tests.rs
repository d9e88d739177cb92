//! Bridge tests against a recording fake port and a manual clock.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::ConnectInfo;
use http::{HeaderValue, Request};
use secrecy::SecretSlice;
use shared_contract::{Algorithm, Certainty, ManualClock, RateLimitDecision};

use super::*;
use crate::subject::{AuthenticatedPrincipal, SubjectKind};

/// Records every request and answers each with the same allowed decision.
#[derive(Debug)]
struct RecordingPort {
    policy: RateLimitPolicy,
    requests: Mutex<Vec<RateLimitRequest>>,
}

#[async_trait]
impl EdgeRateLimitPort for RecordingPort {
    async fn evaluate(&self, request: RateLimitRequest) -> RateLimitOutcome {
        self.requests.lock().unwrap().push(request);
        RateLimitOutcome::Evaluated(RateLimitDecision {
            allowed: true,
            limit: 5,
            remaining: 4,
            retry_after: Duration::ZERO,
            reset_after: Duration::from_secs(1),
            certainty: Certainty::Certain,
            replayed: false,
        })
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        (self.policy.id() == id).then_some(&self.policy)
    }

    async fn is_ready(&self) -> bool {
        true
    }
}

struct Fixture {
    port: Arc<RecordingPort>,
    clock: ManualClock,
    bridge: TransportBridge,
    pseudonymizer: Arc<VersionedPseudonymizer>,
}

fn fixture(settings: EdgeSettings) -> Fixture {
    let algorithm = Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) };
    let policy = RateLimitPolicy::builder("default", algorithm).build().unwrap();
    let port = Arc::new(RecordingPort { policy, requests: Mutex::new(Vec::new()) });
    let clock = ManualClock::new(1_700_000_000_000);
    let key = SecretSlice::from(vec![0x5a; 32]);
    let pseudonymizer = Arc::new(VersionedPseudonymizer::new([(1, key)], 1).unwrap());
    let bridge = TransportBridge::new(
        port.clone(),
        Arc::clone(&pseudonymizer),
        Arc::new(clock.clone()),
        settings,
    );
    Fixture { port, clock, bridge, pseudonymizer }
}

const PEER: &str = "203.0.113.77:5100";

fn request() -> http::request::Builder {
    Request::get("/api/orders/42").extension(ConnectInfo(PEER.parse::<SocketAddr>().unwrap()))
}

fn parts(builder: http::request::Builder) -> Parts {
    builder.body(()).unwrap().into_parts().0
}

impl Fixture {
    fn requests(&self) -> Vec<RateLimitRequest> {
        self.port.requests.lock().unwrap().clone()
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
        let crossed = format!("{request:?} {}", request.subject);
        for raw in [raw_ip, raw_key, raw_principal, "alice"] {
            assert!(!crossed.contains(raw), "{raw} crossed the port in {crossed}");
        }
    }
    // Each request carries exactly the pseudonym of its subject.
    let operation = "GET <unmatched>";
    let expected = [
        (SubjectKind::ClientIp, raw_ip),
        (SubjectKind::ApiKey, raw_key),
        (SubjectKind::Principal, raw_principal),
    ]
    .map(|(kind, identity)| fixture.pseudonymizer.pseudonymize(kind, identity, operation));
    let subjects: Vec<_> = requests.iter().map(|r| r.subject.clone()).collect();
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
        |r: &RateLimitRequest| (r.policy_id.clone(), r.subject.clone(), r.cost, r.deadline);
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
async fn operations_map_to_policies_and_the_default_covers_the_rest() {
    let mut operations = HashMap::new();
    operations.insert("GET <unmatched>".to_owned(), PolicyId::new("unmatched").unwrap());
    let fixture = fixture(EdgeSettings { operations, ..EdgeSettings::default() });
    let mapped = fixture.bridge.evaluate(&parts(request())).await.unwrap();
    assert_eq!(mapped.policy_id.as_str(), "unmatched");
    assert_eq!(mapped.policy, None);
    let post = parts(request().method("POST"));
    let default = fixture.bridge.evaluate(&post).await.unwrap();
    assert_eq!(default.policy_id.as_str(), "default");
    assert_eq!(default.policy.as_ref().map(|p| p.id().as_str()), Some("default"));
}

#[tokio::test]
async fn a_rejected_request_never_reaches_the_port() {
    let fixture = fixture(EdgeSettings::default());
    let oversized = "k".repeat(257);
    let result = fixture.bridge.evaluate(&parts(request().header("x-api-key", oversized))).await;
    assert_eq!(result, Err(EdgeRejection::InvalidApiKey(crate::rejection::ApiKeyProblem::TooLong)));
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

#[test]
fn metrics_carry_policy_algorithm_and_outcome_but_no_subject() {
    let recorder = CollectingRecorder::default();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let fixture = fixture(EdgeSettings::default());
            fixture
                .bridge
                .evaluate(&parts(request().header("x-api-key", "live-key")))
                .await
                .unwrap();
            let oversized = "k".repeat(300);
            let rejected = parts(request().header("x-api-key", oversized));
            assert!(fixture.bridge.evaluate(&rejected).await.is_err());
        });
    });
    let counters = recorder.counters.lock().unwrap().clone();
    let decision = |outcome| {
        (
            crate::DECISIONS_TOTAL.to_owned(),
            pairs(&[("policy", "default"), ("algorithm", "fixed-window"), ("outcome", outcome)]),
            1,
        )
    };
    assert_eq!(counters, [decision("allowed"), decision("bad-request")]);
    let histograms = recorder.histograms.lock().unwrap().clone();
    assert_eq!(
        histograms,
        [(
            crate::EVALUATION_SECONDS.to_owned(),
            pairs(&[("policy", "default"), ("algorithm", "fixed-window")])
        )]
    );
}
