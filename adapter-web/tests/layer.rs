//! The layer on a real axum `Router`: every scenario runs twice, once
//! in-process with `tower::ServiceExt::oneshot` and once over a real TCP
//! listener with `reqwest`. The port is a scripted fake, so each outcome,
//! failure categories included, can be produced on demand.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use adapter_web::{EdgeSettings, Refusal, SubjectKind};
use axum::body::Body;
use http::{HeaderValue, StatusCode};
use ipnet::IpNet;
use shared_contract::{
    Algorithm, Certainty, IncompatibleCategory, ManualClock, PolicyId, RateLimitDecision,
    RateLimitOutcome, RateLimitPolicy, UnavailableCategory,
};
use support::{Harness, ORDER_OPERATION, ScriptedPort, Via};

const PROBLEMS: &str = "https://ca-skeleton.invalid/problems/";

fn policies() -> Vec<RateLimitPolicy> {
    let orders = Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(60) };
    let default = Algorithm::SlidingCounter { limit: 100, window: Duration::from_secs(1) };
    vec![
        RateLimitPolicy::builder("orders", orders).build().unwrap(),
        RateLimitPolicy::builder("default", default).build().unwrap(),
    ]
}

fn settings() -> EdgeSettings {
    let mut operations = HashMap::new();
    operations.insert(ORDER_OPERATION.to_owned(), PolicyId::new("orders").unwrap());
    EdgeSettings {
        failure_retry_after: Duration::from_millis(2500),
        operations,
        ..EdgeSettings::default()
    }
}

fn decision(
    allowed: bool,
    remaining: u64,
    retry_after_ms: u64,
    reset_after_ms: u64,
) -> RateLimitOutcome {
    RateLimitOutcome::Evaluated(RateLimitDecision {
        allowed,
        limit: 10,
        remaining,
        retry_after: Duration::from_millis(retry_after_ms),
        reset_after: Duration::from_millis(reset_after_ms),
        certainty: Certainty::Certain,
        replayed: false,
    })
}

fn allowed() -> RateLimitOutcome {
    decision(true, 7, 0, 1500)
}

async fn harness(
    outcome: RateLimitOutcome,
    settings: EdgeSettings,
    via: Via,
) -> (Harness, Arc<ScriptedPort>) {
    let port = Arc::new(ScriptedPort::new(outcome, policies()));
    (Harness::start(port.clone(), settings, via).await, port)
}

fn assert_problem(reply: &support::Reply, status: StatusCode, category: &str) {
    assert_eq!(reply.status, status);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    let body = reply.json();
    assert_eq!(body["type"], format!("{PROBLEMS}{category}"), "{body}");
    assert_eq!(body["status"], status.as_u16());
    assert!(body["title"].as_str().is_some_and(|t| !t.is_empty()), "{body}");
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
}

async fn allowed_runs_the_handler_with_ratelimit_headers(via: Via) {
    let (harness, port) = harness(allowed(), settings(), via).await;
    let reply = harness.get("/api/orders/42", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "order 42");
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""orders";q=10;w=60"#));
    assert_eq!(reply.header("ratelimit"), Some(r#""orders";r=7;t=2"#));
    assert_eq!(reply.header("retry-after"), None);
    assert_eq!(harness.calls(), 1);
    let request = &port.requests()[0];
    assert_eq!(request.policy_id.as_str(), "orders");
    assert_eq!(request.subject, harness.ip_digest(&harness.peer_ip(), ORDER_OPERATION));
}

async fn denied_answers_429_without_running_the_handler(via: Via) {
    let (harness, _port) = harness(decision(false, 0, 2300, 59_100), settings(), via).await;
    let reply = harness.get("/api/orders/42", &[]).await;
    assert_problem(&reply, StatusCode::TOO_MANY_REQUESTS, "denied");
    assert_eq!(reply.header("retry-after"), Some("3"));
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""orders";q=10;w=60"#));
    assert_eq!(reply.header("ratelimit"), Some(r#""orders";r=0;t=60"#));
    assert_eq!(reply.json()["title"], "Too Many Requests");
    assert_eq!(harness.calls(), 0);
}

async fn every_failure_category_answers_503_and_fails_closed(via: Via) {
    let (harness, port) = harness(allowed(), settings(), via).await;
    let long = Duration::from_secs(40);
    let failures = [
        (
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::AdmissionRejected,
                retry_after: long,
            },
            "admission-rejected",
        ),
        (
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::UnavailableBeforeSend,
                retry_after: long,
            },
            "unavailable-before-send",
        ),
        (
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: long,
            },
            "clock-unsafe",
        ),
        (RateLimitOutcome::Indeterminate { retry_after: long }, "indeterminate"),
        (
            RateLimitOutcome::Incompatible { category: IncompatibleCategory::UnknownPolicy },
            "unknown-policy",
        ),
        (
            RateLimitOutcome::Incompatible { category: IncompatibleCategory::CostExceedsMaximum },
            "cost-exceeds-maximum",
        ),
        (
            RateLimitOutcome::Incompatible { category: IncompatibleCategory::StateIncompatible },
            "state-incompatible",
        ),
    ];
    for (outcome, category) in failures {
        port.answer(outcome);
        let reply = harness.get("/api/orders/42", &[]).await;
        assert_problem(&reply, StatusCode::SERVICE_UNAVAILABLE, category);
        // The configured 2.5 s, rounded up; never the provider's own hint.
        assert_eq!(reply.header("retry-after"), Some("3"), "{category}");
        assert_eq!(reply.header("ratelimit"), None, "{category}");
        assert_eq!(reply.header("ratelimit-policy"), None, "{category}");
    }
    assert_eq!(harness.calls(), 0);
    // The layer still lets the next allowed request through.
    port.answer(allowed());
    assert_eq!(harness.get("/api/orders/42", &[]).await.status, StatusCode::OK);
    assert_eq!(harness.calls(), 1);
}

async fn the_route_template_not_the_raw_path_names_the_bucket(via: Via) {
    let (harness, port) = harness(allowed(), settings(), via).await;
    harness.get("/api/orders/1", &[]).await;
    harness.get("/api/orders/2?x=y", &[]).await;
    harness.get("/nowhere/1", &[]).await;
    let fallback = harness.get("/nowhere/2", &[]).await;
    assert_eq!(fallback.status, StatusCode::NOT_FOUND);
    let peer = harness.peer_ip();
    let orders = harness.ip_digest(&peer, ORDER_OPERATION);
    let unmatched = harness.ip_digest(&peer, "GET <unmatched>");
    assert_eq!(port.subjects(), [orders.clone(), orders, unmatched.clone(), unmatched]);
    let policies: Vec<_> = port.requests().into_iter().map(|r| r.policy_id.to_string()).collect();
    assert_eq!(policies, ["orders", "orders", "default", "default"]);
}

async fn spoofed_forwarding_from_an_untrusted_peer_changes_nothing(via: Via) {
    let (harness, port) = harness(allowed(), settings(), via).await;
    harness.get("/api/orders/1", &[]).await;
    harness.get("/api/orders/1", &[("x-forwarded-for", "203.0.113.9")]).await;
    harness.get("/api/orders/1", &[("forwarded", "for=203.0.113.9")]).await;
    let own = harness.ip_digest(&harness.peer_ip(), ORDER_OPERATION);
    assert_eq!(port.subjects(), [own.clone(), own.clone(), own]);
}

async fn forwarding_from_a_trusted_proxy_is_honoured(via: Via) {
    // In-process the proxy is 10.0.0.2; over TCP it is the loopback peer.
    let (via, trusted): (Via, IpNet) = match via {
        Via::Oneshot(_) => {
            (Via::Oneshot("10.0.0.2:443".parse().unwrap()), "10.0.0.0/8".parse().unwrap())
        }
        Via::Tcp => (Via::Tcp, "127.0.0.1/32".parse().unwrap()),
    };
    let settings = EdgeSettings { trusted_proxies: vec![trusted], ..settings() };
    let (harness, port) = harness(allowed(), settings, via).await;
    harness.get("/api/orders/1", &[("x-forwarded-for", "203.0.113.9")]).await;
    // The client-written left part is ignored; the proxy's entry counts.
    harness.get("/api/orders/1", &[("x-forwarded-for", "6.6.6.6, 203.0.113.9")]).await;
    harness.get("/api/orders/1", &[("forwarded", r#"for="[2001:db8::9]:5000""#)]).await;
    // Malformed from a trusted proxy: the proxy itself is the subject.
    harness.get("/api/orders/1", &[("x-forwarded-for", "not-an-address")]).await;
    let client = harness.ip_digest("203.0.113.9", ORDER_OPERATION);
    let v6 = harness.ip_digest("2001:db8::9", ORDER_OPERATION);
    let proxy = harness.ip_digest(&harness.peer_ip(), ORDER_OPERATION);
    assert_eq!(port.subjects(), [client.clone(), client, v6, proxy]);
}

async fn an_oversized_api_key_is_refused_with_400(via: Via) {
    let (harness, port) = harness(allowed(), settings(), via).await;
    let oversized = "k".repeat(257);
    let reply = harness.get("/api/orders/1", &[("x-api-key", &oversized)]).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, "invalid-api-key");
    assert!(!reply.text().contains(&oversized));
    assert_eq!(harness.calls(), 0);
    assert!(port.requests().is_empty());
    // 256 bytes is the limit, and the key is the subject.
    let longest = "k".repeat(256);
    let reply = harness.get("/api/orders/1", &[("x-api-key", &longest)]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let expected =
        harness.pseudonymizer.pseudonymize(SubjectKind::ApiKey, &longest, ORDER_OPERATION);
    assert_eq!(port.subjects(), [expected]);
}

async fn a_disabled_layer_passes_requests_straight_through(via: Via) {
    let port = Arc::new(ScriptedPort::new(decision(false, 0, 1000, 1000), policies()));
    let harness = Harness::start_disabled(port.clone(), via).await;
    let reply = harness.get("/api/orders/5", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "order 5");
    assert_eq!(reply.header("ratelimit"), None);
    assert_eq!(harness.calls(), 1);
    assert!(port.requests().is_empty());
}

async fn a_refusal_shaper_reshapes_but_never_admits(via: Via) {
    let port = Arc::new(ScriptedPort::new(decision(false, 0, 2300, 59_100), policies()));
    let shaped = |bridge| {
        support::enabled(bridge).with_refusal_shaper(|refusal, mut response| {
            let reason = match refusal {
                Refusal::Outcome(evaluation) => evaluation.outcome.category_name(),
                Refusal::Rejected(rejection) => rejection.category_name(),
            };
            let status = response.status();
            *response.body_mut() = Body::from(format!("{} {reason}", status.as_u16()));
            response.headers_mut().insert("content-type", HeaderValue::from_static("text/plain"));
            response
        })
    };
    let clock = ManualClock::new(1_700_000_000_000);
    let harness = Harness::build(port.clone(), clock, settings(), via, shaped).await;
    let denied = harness.get("/api/orders/1", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.text(), "429 denied");
    assert_eq!(denied.header("retry-after"), Some("3"));
    assert_eq!(denied.header("ratelimit"), Some(r#""orders";r=0;t=60"#));
    port.answer(RateLimitOutcome::Indeterminate { retry_after: Duration::ZERO });
    assert_eq!(harness.get("/api/orders/1", &[]).await.text(), "503 indeterminate");
    let oversized = "k".repeat(257);
    let reply = harness.get("/api/orders/1", &[("x-api-key", &oversized)]).await;
    assert_eq!(reply.text(), "400 invalid-api-key");
    assert_eq!(harness.calls(), 0);
    // Allowed requests never meet the shaper.
    port.answer(allowed());
    assert_eq!(harness.get("/api/orders/1", &[]).await.text(), "order 1");
}

macro_rules! over_both_transports {
    ($($scenario:ident),* $(,)?) => {
        mod oneshot {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::support::oneshot()).await;
                }
            )*
        }
        mod tcp {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::Via::Tcp).await;
                }
            )*
        }
    };
}

over_both_transports!(
    allowed_runs_the_handler_with_ratelimit_headers,
    denied_answers_429_without_running_the_handler,
    every_failure_category_answers_503_and_fails_closed,
    the_route_template_not_the_raw_path_names_the_bucket,
    spoofed_forwarding_from_an_untrusted_peer_changes_nothing,
    forwarding_from_a_trusted_proxy_is_honoured,
    an_oversized_api_key_is_refused_with_400,
    a_disabled_layer_passes_requests_straight_through,
    a_refusal_shaper_reshapes_but_never_admits,
);
