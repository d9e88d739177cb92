//! End to end over a real TCP listener with the `memory` provider and with
//! `disabled`: the binary's router, layer, probes and metrics, wired by the
//! capability switch exactly as `serve` wires them.

mod support;

use reqwest::StatusCode;
use support::{
    COMPLETION_UNITS, GCRA_ORDERS, IN_FLIGHT_WORK, Running, completion_reserves_then_settles,
    counter, fixed_window_config, gcra_burst_then_429, load, three_allowed_then_429,
    two_in_flight_then_429,
};

#[tokio::test]
async fn memory_limits_each_route_until_429_and_metrics_count_the_429s() {
    let config = load(&fixed_window_config("e2e-memory", "memory", ""));
    let server = Running::start(&config).await;

    three_allowed_then_429(&server, "e2e-memory", "/api/hello").await;
    // Another order id is the same operation (the route template), so the
    // same bucket: still denied.
    let other_id = server.get("/api/orders/1").await;
    assert_eq!(other_id.status, StatusCode::OK);
    three_allowed_after_one(&server).await;

    let metrics = server.metrics().await;
    let denied = r#"ca_skeleton_rate_limit_decisions_total{policy="e2e-memory",algorithm="fixed-window",outcome="denied",mode="enforce",cached="false",front="http"}"#;
    let allowed = r#"ca_skeleton_rate_limit_decisions_total{policy="e2e-memory",algorithm="fixed-window",outcome="allowed",mode="enforce",cached="false",front="http"}"#;
    assert_eq!(counter(&metrics, denied), 2, "{metrics}");
    assert_eq!(counter(&metrics, allowed), 6, "{metrics}");
    assert!(metrics.contains("ca_skeleton_rate_limit_evaluation_seconds_bucket"), "{metrics}");
    // No subject (the client IP here) is a label.
    assert!(!metrics.contains("127.0.0.1"), "{metrics}");

    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(server.get("/readyz").await.status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn a_service_s_own_routes_are_served_behind_the_layer() {
    // What a fork does: hand its own routes to the server, nothing else.
    let api = app_bootstrap::routes::ApiRoutes::new()
        .get("/v1/widgets", || async { "widgets" })
        .delete("/v1/widgets/{id}", || async { "gone" });
    let config = load(&fixed_window_config("e2e-own-routes", "memory", ""));
    let server = Running::start_with(&config, api).await;

    three_allowed_then_429(&server, "e2e-own-routes", "/v1/widgets").await;
    // The demo routes are not served once a service brings its own.
    assert_eq!(server.get("/api/hello").await.status, StatusCode::NOT_FOUND);
    // Probes stay outside the layer however often they are called.
    for _ in 0..5 {
        assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
    }
    server.stop().await;
}

/// `GET /api/orders/{id}` had one call; two more pass and the fourth is
/// denied, whatever the id.
async fn three_allowed_after_one(server: &Running) {
    assert_eq!(server.get("/api/orders/2").await.status, StatusCode::OK);
    assert_eq!(server.get("/api/orders/3").await.status, StatusCode::OK);
    let denied = server.get("/api/orders/4").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), Some("60"));
}

#[tokio::test]
async fn operations_map_a_route_to_its_own_policy() {
    let extra = r#"
[capabilities.rate-limit.operations]
"POST /api/orders" = "e2e-writes"

[capabilities.rate-limit.policies.e2e-writes]
algorithm = "token-bucket"
capacity = 1
refill-tokens = 1
refill-period = "10s"
"#;
    let config = load(&fixed_window_config("e2e-reads", "memory", extra));
    let server = Running::start(&config).await;
    let created = server.post("/api/orders").await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(created.header("ratelimit-policy"), Some(r#""e2e-writes";q=1;w=10"#));
    // Capacity 1, one token per 10 s: the second waits the full period.
    let denied = server.post("/api/orders").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), Some("10"));
    // Reads still use the default policy.
    assert_eq!(server.get("/api/hello").await.status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn a_gcra_policy_limits_its_route_through_the_layer() {
    let config = load(&fixed_window_config("e2e-default", "memory", GCRA_ORDERS));
    let server = Running::start(&config).await;
    gcra_burst_then_429(&server).await;
    // The default policy is untouched.
    assert_eq!(server.get("/api/hello").await.status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_limit_holds_its_route_through_the_layer() {
    let config = load(&fixed_window_config("e2e-default", "memory", IN_FLIGHT_WORK));
    let server = Running::start(&config).await;
    two_in_flight_then_429(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn disabled_limits_nothing() {
    let config = load(&fixed_window_config("e2e-disabled", "disabled", ""));
    let server = Running::start(&config).await;
    for _ in 0..10 {
        let reply = server.get("/api/hello").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit"), None);
    }
    assert_eq!(server.post("/api/orders").await.status, StatusCode::CREATED);
    assert_eq!(server.get("/readyz").await.status, StatusCode::OK);
    let metrics = server.metrics().await;
    assert!(!metrics.contains(r#"policy="e2e-disabled""#), "{metrics}");
    server.stop().await;
}

/// The setup: a generous default and a tight `GET /api/orders/{id}`.
fn generous_default_tight_orders(operations: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
[capabilities.rate-limit]
default-policy = "generous"
[capabilities.rate-limit.policies.generous]
algorithm = "fixed-window"
limit = 1000
window = "60s"
[capabilities.rate-limit.policies.tight]
algorithm = "fixed-window"
limit = 2
window = "60s"
[capabilities.rate-limit.policies.heads]
algorithm = "fixed-window"
limit = 100
window = "60s"
[capabilities.rate-limit.operations]
"GET /api/orders/{{id}}" = "tight"
{operations}
[pseudonymizer.keys]
1 = "{}"
"#,
        support::TEST_KEY
    )
}

/// A HEAD (what `curl -I` sends) spends the GET's budget: GET, GET, then
/// HEAD is a 429, and so is every later HEAD, where it used to pass under
/// the generous default every time.
#[tokio::test]
async fn a_head_spends_the_budget_of_the_get_of_its_route() {
    let server = Running::start(&load(&generous_default_tight_orders(""))).await;
    for _ in 0..2 {
        assert_eq!(server.get("/api/orders/42").await.status, StatusCode::OK);
    }
    for _ in 0..3 {
        let head = server.head("/api/orders/42").await;
        assert_eq!(head.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(head.header("ratelimit"), Some(r#""tight";r=0;t=60"#));
    }
    server.stop().await;
}

/// A HEAD mapped itself is accepted at start-up (the router serves it) and
/// runs under its own set, while an operation-scoped policy both list is
/// still the GET's budget.
#[tokio::test]
async fn a_mapped_head_runs_its_own_set_and_shares_the_get_s_budget() {
    let mapped = r#""HEAD /api/orders/{id}" = ["tight", "heads"]"#;
    let server = Running::start(&load(&generous_default_tight_orders(mapped))).await;
    let head = server.head("/api/orders/42").await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.header("ratelimit"), Some(r#""tight";r=1;t=60, "heads";r=99;t=60"#));
    let get = server.get("/api/orders/7").await;
    assert_eq!(get.header("ratelimit"), Some(r#""tight";r=0;t=60"#), "one budget");
    assert_eq!(server.head("/api/orders/42").await.status, StatusCode::TOO_MANY_REQUESTS);
    server.stop().await;
}

/// README "Limit what requests use, not how many", on memory.
#[tokio::test]
async fn the_completion_route_reserves_then_settles_what_it_used() {
    let config = load(&fixed_window_config("e2e-default", "memory", COMPLETION_UNITS));
    let server = Running::start(&config).await;
    completion_reserves_then_settles(&server).await;
    server.stop().await;
}
