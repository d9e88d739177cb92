//! The layer on a real axum `Router`: every scenario runs twice, once
//! in-process with `tower::ServiceExt::oneshot` and once over a real TCP
//! listener with `reqwest`. The port is a scripted fake, so each outcome,
//! failure categories included, can be produced on demand.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use adapter_web::{ClientIpHeader, EdgeSettings, SubjectKind, operation_digest};
use axum::body::Body;
use http::{HeaderValue, StatusCode};
use ipnet::IpNet;
use shared_contract::{
    Algorithm, IncompatibleCategory, ManualClock, PolicyId, PolicyMode, PolicySet,
    RateLimitDecision, RateLimitFailure, RateLimitOutcome, RateLimitPolicy, UnavailableCategory,
};
use support::{COST_HEADER, Harness, ORDER_OPERATION, ScriptedPort, Via};

const PROBLEMS: &str = "https://ca-skeleton.invalid/problems/";

fn fixed_window(id: &str, limit: u64, window_secs: u64, mode: PolicyMode) -> RateLimitPolicy {
    let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit,
        window: Duration::from_secs(window_secs),
    });
    RateLimitPolicy::builder(id, algorithm).maximum_cost(5).mode(mode).build().unwrap()
}

fn policies() -> Vec<RateLimitPolicy> {
    let default = Algorithm::SlidingCounter(shared_contract::SlidingCounter {
        limit: 100,
        window: Duration::from_secs(1),
    });
    vec![
        fixed_window("orders", 10, 60, PolicyMode::Enforce),
        RateLimitPolicy::builder("default", default).build().unwrap(),
        // The burst + sustained pair, and shadow policies.
        fixed_window("orders-burst", 10, 1, PolicyMode::Enforce),
        fixed_window("orders-hourly", 1000, 3600, PolicyMode::Enforce),
        fixed_window("orders-trial", 5, 60, PolicyMode::Shadow),
        fixed_window("shadow-daily", 50, 86_400, PolicyMode::Shadow),
    ]
}

fn set(ids: &[&str]) -> PolicySet {
    PolicySet::new(ids.iter().map(|id| PolicyId::new(*id).unwrap())).unwrap()
}

/// `GET /api/orders/{id}` runs under `ids`.
fn settings_with(ids: &[&str]) -> EdgeSettings {
    let operations = HashMap::from([(ORDER_OPERATION.to_owned(), set(ids))]);
    EdgeSettings {
        failure_retry_after: Duration::from_millis(2500),
        operations,
        // A layer before this one verified the keys these tests send.
        api_key_header: Some(http::HeaderName::from_static("x-api-key")),
        ..EdgeSettings::default()
    }
}

fn settings() -> EdgeSettings {
    settings_with(&["orders"])
}

fn policy_decision(
    allowed: bool,
    remaining: u64,
    retry_after_ms: u64,
    reset_after_ms: u64,
) -> RateLimitDecision {
    RateLimitDecision { allowed, remaining, retry_after_ms, reset_after_ms, replayed: false }
}

fn set_outcome(admitted: bool, decisions: &[RateLimitDecision]) -> RateLimitOutcome {
    Ok(support::set_of(admitted, decisions))
}

fn decision(
    allowed: bool,
    remaining: u64,
    retry_after_ms: u64,
    reset_after_ms: u64,
) -> RateLimitOutcome {
    set_outcome(allowed, &[policy_decision(allowed, remaining, retry_after_ms, reset_after_ms)])
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
    assert_eq!(request.policies, set(&["orders"]));
    assert_eq!(request.subject, harness.ip_digest(&harness.peer_ip()));
    assert_eq!(request.operation, operation_digest(ORDER_OPERATION));
    assert_eq!(request.cost, 1);
}

async fn denied_answers_429_without_running_the_handler(via: Via) {
    let (harness, _port) = harness(decision(false, 0, 2300, 59_100), settings(), via).await;
    let reply = harness.get("/api/orders/42", &[]).await;
    assert_problem(&reply, StatusCode::TOO_MANY_REQUESTS, "denied");
    assert_eq!(reply.header("retry-after"), Some("3"));
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""orders";q=10;w=60"#));
    assert_eq!(reply.header("ratelimit"), Some(r#""orders";r=0;t=60"#));
    assert_eq!(reply.json()["title"], "Too Many Requests");
    assert_eq!(reply.json()["violated-policies"], serde_json::json!(["orders"]));
    assert_eq!(harness.calls(), 0);
}

async fn every_failure_category_answers_503_and_fails_closed(via: Via) {
    let (harness, port) = harness(allowed(), settings(), via).await;
    let long = Duration::from_secs(40);
    let failures = [
        (
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::AdmissionRejected,
                retry_after: long,
            }),
            "admission-rejected",
        ),
        (
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::UnavailableBeforeSend,
                retry_after: long,
            }),
            "unavailable-before-send",
        ),
        (
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: long,
            }),
            "clock-unsafe",
        ),
        (Err(RateLimitFailure::Indeterminate { retry_after: long }), "indeterminate"),
        (
            Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::UnknownPolicy }),
            "unknown-policy",
        ),
        (
            Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::CostExceedsMaximum,
            }),
            "cost-exceeds-maximum",
        ),
        (
            Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::StateIncompatible,
            }),
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
    // One subject whatever the route: the pseudonym holds no operation.
    let peer = harness.ip_digest(&harness.peer_ip());
    assert_eq!(port.subjects(), [peer, peer, peer, peer]);
    let orders = operation_digest(ORDER_OPERATION);
    let unmatched = operation_digest("GET <unmatched>");
    let operations: Vec<_> = port.requests().into_iter().map(|r| r.operation).collect();
    assert_eq!(operations, [orders, orders, unmatched, unmatched]);
    let sets: Vec<_> = port.requests().into_iter().map(|r| r.policies).collect();
    assert_eq!(sets, [set(&["orders"]), set(&["orders"]), set(&["default"]), set(&["default"])]);
}

async fn spoofed_forwarding_from_an_untrusted_peer_changes_nothing(via: Via) {
    let (harness, port) = harness(allowed(), settings(), via).await;
    harness.get("/api/orders/1", &[]).await;
    harness.get("/api/orders/1", &[("x-forwarded-for", "203.0.113.9")]).await;
    harness.get("/api/orders/1", &[("forwarded", "for=203.0.113.9")]).await;
    let own = harness.ip_digest(&harness.peer_ip());
    assert_eq!(port.subjects(), [own, own, own]);
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
    let forwarded =
        EdgeSettings { client_ip_header: ClientIpHeader::Forwarded, ..settings.clone() };
    let (harness, port) = harness(allowed(), settings, via).await;
    harness.get("/api/orders/1", &[("x-forwarded-for", "203.0.113.9")]).await;
    // The client-written left part is ignored; the proxy's entry counts.
    harness.get("/api/orders/1", &[("x-forwarded-for", "6.6.6.6, 203.0.113.9")]).await;
    harness.get("/api/orders/1", &[("x-forwarded-for", "not-an-address, 203.0.113.9")]).await;
    // Proxies that write X-Forwarded-For pass a client's Forwarded through.
    harness.get("/api/orders/1", &[("forwarded", r#"for="[2001:db8::9]:5000""#)]).await;
    // Malformed from a trusted proxy: the proxy itself is the subject.
    harness.get("/api/orders/1", &[("x-forwarded-for", "not-an-address")]).await;
    let client = harness.network_digest("203.0.113.9/32");
    let proxy = harness.ip_digest(&harness.peer_ip());
    assert_eq!(port.subjects(), [client, client, client, proxy, proxy]);

    // Behind proxies that write Forwarded, it is the one header read.
    let (harness, port) = self::harness(allowed(), forwarded, via).await;
    harness
        .get(
            "/api/orders/1",
            &[("forwarded", r#"for="[2001:db8::9]:5000""#), ("x-forwarded-for", "203.0.113.9")],
        )
        .await;
    harness.get("/api/orders/1", &[("x-forwarded-for", "203.0.113.9")]).await;
    let v6 = harness.network_digest("2001:db8::/64");
    let proxy = harness.ip_digest(&harness.peer_ip());
    assert_eq!(port.subjects(), [v6, proxy]);
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
    let expected = harness.pseudonymizer.pseudonymize(SubjectKind::ApiKey, &longest);
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
            let reason = refusal.category_name();
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
    port.answer(Err(RateLimitFailure::Indeterminate { retry_after: Duration::ZERO }));
    assert_eq!(harness.get("/api/orders/1", &[]).await.text(), "503 indeterminate");
    let oversized = "k".repeat(257);
    let reply = harness.get("/api/orders/1", &[("x-api-key", &oversized)]).await;
    assert_eq!(reply.text(), "400 invalid-api-key");
    assert_eq!(harness.calls(), 0);
    // Allowed requests never meet the shaper.
    port.answer(allowed());
    assert_eq!(harness.get("/api/orders/1", &[]).await.text(), "order 1");
}

async fn a_set_lists_every_enforced_policy_in_configured_order(via: Via) {
    let settings = settings_with(&["orders-burst", "orders-trial", "orders-hourly"]);
    let (harness, port) = harness(allowed(), settings, via).await;
    // The burst + sustained values: the burst window ends in 1 s, the hour in 3540 s.
    port.answer(set_outcome(
        true,
        &[
            policy_decision(true, 9, 0, 1000),
            policy_decision(true, 4, 0, 60_000),
            policy_decision(true, 999, 0, 3_540_000),
        ],
    ));
    let reply = harness.get("/api/orders/42", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some(r#""orders-burst";q=10;w=1, "orders-hourly";q=1000;w=3600"#)
    );
    assert_eq!(
        reply.header("ratelimit"),
        Some(r#""orders-burst";r=9;t=1, "orders-hourly";r=999;t=3540"#)
    );
    assert_eq!(
        port.requests()[0].policies,
        set(&["orders-burst", "orders-trial", "orders-hourly"])
    );
    assert_eq!(harness.calls(), 1);
}

async fn a_denied_set_names_its_violations_and_waits_for_the_longest(via: Via) {
    let settings = settings_with(&["orders-burst", "orders-trial", "orders-hourly"]);
    let (harness, port) = harness(allowed(), settings, via).await;
    // Both enforced policies deny (0.4 s and 2.3 s); the shadow one would
    // deny for two hours, which must change nothing the client sees.
    port.answer(set_outcome(
        false,
        &[
            policy_decision(false, 0, 400, 400),
            policy_decision(false, 0, 7_200_000, 7_200_000),
            policy_decision(false, 0, 2300, 3_540_000),
        ],
    ));
    let reply = harness.get("/api/orders/42", &[]).await;
    assert_problem(&reply, StatusCode::TOO_MANY_REQUESTS, "denied");
    // The largest of the denying enforced policies, 2.3 s, rounded up.
    assert_eq!(reply.header("retry-after"), Some("3"));
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["orders-burst", "orders-hourly"])
    );
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some(r#""orders-burst";q=10;w=1, "orders-hourly";q=1000;w=3600"#)
    );
    assert_eq!(
        reply.header("ratelimit"),
        Some(r#""orders-burst";r=0;t=1, "orders-hourly";r=0;t=3540"#)
    );
    assert!(!reply.text().contains("orders-trial"), "{}", reply.text());
    assert_eq!(harness.calls(), 0);

    // Only the burst denies: it alone is named, and its wait counts.
    port.answer(set_outcome(
        false,
        &[
            policy_decision(false, 0, 400, 400),
            policy_decision(true, 3, 0, 60_000),
            policy_decision(true, 998, 0, 3_540_000),
        ],
    ));
    let reply = harness.get("/api/orders/42", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.json()["violated-policies"], serde_json::json!(["orders-burst"]));
    assert_eq!(harness.calls(), 0);
}

async fn a_shadow_policy_never_blocks_and_never_shows(via: Via) {
    let (harness, port) = harness(allowed(), settings_with(&["orders", "orders-trial"]), via).await;
    // The shadow policy would deny; the enforced one allows: served.
    port.answer(set_outcome(
        true,
        &[policy_decision(true, 7, 0, 1500), policy_decision(false, 0, 30_000, 30_000)],
    ));
    let reply = harness.get("/api/orders/42", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "order 42");
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""orders";q=10;w=60"#));
    assert_eq!(reply.header("ratelimit"), Some(r#""orders";r=7;t=2"#));
    assert_eq!(reply.header("retry-after"), None);
    assert_eq!(harness.calls(), 1);
}

async fn a_set_of_shadow_policies_sends_no_headers_and_survives_provider_failure(via: Via) {
    let (harness, port) =
        harness(allowed(), settings_with(&["orders-trial", "shadow-daily"]), via).await;
    let would_deny = policy_decision(false, 0, 30_000, 30_000);
    let answers = [
        set_outcome(
            true,
            &[policy_decision(true, 4, 0, 60_000), policy_decision(true, 49, 0, 1000)],
        ),
        // Nothing enforced, so the set is admitted even when both would deny.
        set_outcome(true, &[would_deny, would_deny]),
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::UnavailableBeforeSend,
            retry_after: Duration::from_secs(40),
        }),
        Err(RateLimitFailure::Indeterminate { retry_after: Duration::from_secs(40) }),
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible }),
    ];
    for (served, answer) in answers.into_iter().enumerate() {
        port.answer(answer.clone());
        let reply = harness.get("/api/orders/42", &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{answer:?}");
        assert_eq!(reply.text(), "order 42");
        for header in ["ratelimit-policy", "ratelimit", "retry-after"] {
            assert_eq!(reply.header(header), None, "{header} for {answer:?}");
        }
        assert_eq!(harness.calls(), served + 1);
    }
    // One enforced policy in the set, and the same failure fails closed.
    let (harness, port) = harness_with_port(settings_with(&["orders-trial", "orders"]), via).await;
    port.answer(Err(RateLimitFailure::Indeterminate { retry_after: Duration::from_secs(40) }));
    let reply = harness.get("/api/orders/42", &[]).await;
    assert_problem(&reply, StatusCode::SERVICE_UNAVAILABLE, "indeterminate");
    assert_eq!(harness.calls(), 0);
}

async fn harness_with_port(settings: EdgeSettings, via: Via) -> (Harness, Arc<ScriptedPort>) {
    harness(allowed(), settings, via).await
}

async fn an_upstream_cost_extension_is_the_cost_asked(via: Via) {
    let (harness, port) = harness(allowed(), settings(), via).await;
    harness.get("/api/orders/1", &[(COST_HEADER, "3")]).await;
    harness.get("/api/orders/1", &[]).await;
    let costs: Vec<_> = port.requests().into_iter().map(|r| r.cost).collect();
    assert_eq!(costs, [3, 1]);
}

async fn ipv6_clients_count_per_network_and_mapped_ipv4_as_ipv4(via: Via) {
    // Behind a trusted proxy, so the client addresses can vary per request
    // over both transports; the prefix applies after the walk.
    let (via, trusted): (Via, IpNet) = match via {
        Via::Oneshot(_) => {
            (Via::Oneshot("10.0.0.2:443".parse().unwrap()), "10.0.0.0/8".parse().unwrap())
        }
        Via::Tcp => (Via::Tcp, "127.0.0.1/32".parse().unwrap()),
    };
    let clients = [
        "2001:db8:1:2::a",
        "2001:db8:1:2:ffff:eeee:dddd:b",
        "2001:db8:1:3::a",
        "::ffff:203.0.113.9",
        "203.0.113.9",
    ];
    let defaults = EdgeSettings { trusted_proxies: vec![trusted], ..settings() };
    let (harness, port) = harness(allowed(), defaults, via).await;
    for client in clients {
        harness.get("/api/orders/1", &[("x-forwarded-for", client)]).await;
    }
    let same_64 = harness.network_digest("2001:db8:1:2::/64");
    let next_64 = harness.network_digest("2001:db8:1:3::/64");
    let v4 = harness.network_digest("203.0.113.9/32");
    assert_eq!(port.subjects(), [same_64, same_64, next_64, v4, v4]);

    // Wider prefixes: a /56 holds both /64s, a /24 the IPv4 neighbours.
    let wide = EdgeSettings {
        trusted_proxies: vec![trusted],
        client_ipv6_prefix: 56,
        client_ipv4_prefix: 24,
        ..settings()
    };
    let (harness, port) = harness_with_port(wide, via).await;
    for client in ["2001:db8:1:2::a", "2001:db8:1:3::a", "::ffff:203.0.113.9", "203.0.113.200"] {
        harness.get("/api/orders/1", &[("x-forwarded-for", client)]).await;
    }
    let v6 = harness.network_digest("2001:db8:1::/56");
    let v4 = harness.network_digest("203.0.113.0/24");
    assert_eq!(port.subjects(), [v6, v6, v4, v4]);
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
    a_set_lists_every_enforced_policy_in_configured_order,
    a_denied_set_names_its_violations_and_waits_for_the_longest,
    a_shadow_policy_never_blocks_and_never_shows,
    a_set_of_shadow_policies_sends_no_headers_and_survives_provider_failure,
    an_upstream_cost_extension_is_the_cost_asked,
    ipv6_clients_count_per_network_and_mapped_ipv4_as_ipv4,
);
