//! The layer in front of the real in-process provider (`adapter-memory`),
//! so allowed and denied come from the algorithm, not a script. Expected
//! numbers follow docs/algorithms.md (fixed window, and "Policy sets" for
//! the spared runs of a refused set).

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::EdgeSettings;
use http::{Method, StatusCode};
use ipnet::IpNet;
use serde_json::json;
use shared_contract::{
    Algorithm, Clock, ManualClock, PolicyId, PolicyMode, PolicySet, RateLimitPolicy,
};
use support::{COST_HEADER, Harness, ORDER_OPERATION, Via, enabled};

/// A multiple of the 60 s window.
const T0: u64 = 1_700_000_040_000;

async fn a_fixed_window_allows_two_then_denies(via: Via) {
    let clock = ManualClock::new(T0 + 250);
    let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit: 2,
        window: Duration::from_secs(60),
    });
    let policy = RateLimitPolicy::builder("default", algorithm).build().unwrap();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let provider = Arc::new(MemoryEdgeRateLimitAdapter::new([policy], shared).unwrap());
    let keyed = EdgeSettings {
        api_key_header: Some(http::HeaderName::from_static("x-api-key")),
        ..EdgeSettings::default()
    };
    let harness = Harness::build(provider, clock, keyed, via, enabled).await;

    // ws = T0, reset_after = T0 + 60000 - (T0 + 250) = 59750 ms -> t=60.
    for remaining in [1, 0] {
        let reply = harness.get("/api/orders/7", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""default";q=2;w=60"#));
        let expected = format!(r#""default";r={remaining};t=60"#);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()));
    }
    // Third in the window: denied, retry_after = reset_after = 59750 ms.
    let reply = harness.get("/api/orders/7", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("60"));
    assert_eq!(reply.header("ratelimit"), Some(r#""default";r=0;t=60"#));
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(harness.calls(), 2);

    // Another API key is another bucket.
    let reply = harness.get("/api/orders/7", &[("x-api-key", "other-client")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    // The next window restores the budget.
    harness.clock.advance(Duration::from_secs(60));
    assert_eq!(harness.get("/api/orders/7", &[]).await.status, StatusCode::OK);
    assert_eq!(harness.calls(), 4);
}

/// A multiple of one hour, so every window of these tests starts at it.
const HOUR_T0: u64 = 472_223 * 3_600_000;

fn fixed(id: &str, limit: u64, window_secs: u64) -> shared_contract::RateLimitPolicyBuilder {
    let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit,
        window: Duration::from_secs(window_secs),
    });
    RateLimitPolicy::builder(id, algorithm)
}

/// A harness over a memory provider holding `policies`, its clock at
/// `now`, with `GET /api/orders/{id}` mapped to `set`.
async fn memory_harness(
    policies: Vec<RateLimitPolicy>,
    set: &[&str],
    now: u64,
    settings: EdgeSettings,
    via: Via,
) -> Harness {
    let clock = ManualClock::new(now);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let provider = Arc::new(MemoryEdgeRateLimitAdapter::new(policies, shared).unwrap());
    let set = PolicySet::new(set.iter().map(|id| PolicyId::new(*id).unwrap())).unwrap();
    let settings =
        EdgeSettings { operations: HashMap::from([(ORDER_OPERATION.to_owned(), set)]), ..settings };
    Harness::build(provider, clock, settings, via, enabled).await
}

async fn a_burst_and_sustained_pair_is_checked_together(via: Via) {
    let policies = vec![
        fixed("orders-burst", 2, 1).build().unwrap(),
        fixed("orders-hourly", 3, 3600).build().unwrap(),
    ];
    let set = ["orders-burst", "orders-hourly"];
    let harness = memory_harness(policies, &set, HOUR_T0 + 250, EdgeSettings::default(), via).await;
    let both_policies = r#""orders-burst";q=2;w=1, "orders-hourly";q=3;w=3600"#;

    // t = T0 + 250: the burst window ends in 750 ms (t=1), the hour in
    // 3_599_750 ms (t=3600).
    for (burst, hourly) in [(1, 2), (0, 1)] {
        let reply = harness.get("/api/orders/7", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit-policy"), Some(both_policies));
        let expected =
            format!(r#""orders-burst";r={burst};t=1, "orders-hourly";r={hourly};t=3600"#);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()));
    }
    // The burst is spent: refused, and the hourly budget is spared (r=1).
    let reply = harness.get("/api/orders/7", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.json()["violated-policies"], json!(["orders-burst"]));
    assert_eq!(reply.header("ratelimit-policy"), Some(both_policies));
    assert_eq!(
        reply.header("ratelimit"),
        Some(r#""orders-burst";r=0;t=1, "orders-hourly";r=1;t=3600"#)
    );
    // Next burst window (t = T0 + 1250): the refusal charged nothing, so
    // one unit of the hour is left, and this request takes it.
    harness.clock.advance(Duration::from_secs(1));
    let reply = harness.get("/api/orders/7", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("ratelimit"),
        Some(r#""orders-burst";r=1;t=1, "orders-hourly";r=0;t=3599"#)
    );
    // t = T0 + 2250: now the hour refuses, for the rest of it
    // (3_597_750 ms -> 3598 s), and the burst is spared whole.
    harness.clock.advance(Duration::from_secs(1));
    let reply = harness.get("/api/orders/7", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("3598"));
    assert_eq!(reply.json()["violated-policies"], json!(["orders-hourly"]));
    assert_eq!(
        reply.header("ratelimit"),
        Some(r#""orders-burst";r=2;t=1, "orders-hourly";r=0;t=3598"#)
    );
    assert_eq!(harness.calls(), 3);
}

/// docs/algorithms.md "Calendar window", worked numbers (b): limit 3 a
/// month in Berlin. The header's `w` is the period of the request's time,
/// January's 31 days and then February's 28, on one running edge.
async fn a_calendar_month_is_described_by_the_period_in_force(via: Via) {
    let monthly = RateLimitPolicy::builder(
        "monthly",
        Algorithm::CalendarWindow(shared_contract::CalendarWindow {
            limit: 3,
            period: shared_contract::CalendarPeriod::Month,
            time_zone: "Europe/Berlin".parse().unwrap(),
        }),
    )
    .build()
    .unwrap();
    let january_last_half_second = 1_801_436_399_500;
    let harness = memory_harness(
        vec![monthly],
        &["monthly"],
        january_last_half_second,
        EdgeSettings::default(),
        via,
    )
    .await;
    for remaining in [2, 1, 0] {
        let reply = harness.get("/api/orders/7", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""monthly";q=3;w=2678400"#));
        let expected = format!(r#""monthly";r={remaining};t=1"#);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()));
    }
    let reply = harness.get("/api/orders/7", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("1"));
    // February 1st, 00:00 in Berlin: a fresh count, and 28 days to its end.
    harness.clock.advance(Duration::from_millis(500));
    let reply = harness.get("/api/orders/7", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""monthly";q=3;w=2419200"#));
    assert_eq!(reply.header("ratelimit"), Some(r#""monthly";r=2;t=2419200"#));
}

async fn a_shadow_policy_that_would_deny_lets_the_request_through(via: Via) {
    let policies = vec![
        fixed("orders", 10, 60).build().unwrap(),
        fixed("orders-trial", 1, 60).mode(PolicyMode::Shadow).build().unwrap(),
    ];
    let harness = memory_harness(
        policies,
        &["orders", "orders-trial"],
        T0 + 250,
        EdgeSettings::default(),
        via,
    )
    .await;
    // The trial allows once, then would deny; neither shows, neither blocks.
    for remaining in [9, 8, 7] {
        let reply = harness.get("/api/orders/7", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""orders";q=10;w=60"#));
        let expected = format!(r#""orders";r={remaining};t=60"#);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()));
    }
    assert_eq!(harness.calls(), 3);
}

async fn the_cost_extension_charges_its_units(via: Via) {
    let policies = vec![fixed("orders", 10, 60).maximum_cost(5).build().unwrap()];
    let harness =
        memory_harness(policies, &["orders"], T0 + 250, EdgeSettings::default(), via).await;
    let reply = harness.get("/api/orders/7", &[(COST_HEADER, "4")]).await;
    assert_eq!(reply.header("ratelimit"), Some(r#""orders";r=6;t=60"#));
    let reply = harness.get("/api/orders/7", &[(COST_HEADER, "5")]).await;
    assert_eq!(reply.header("ratelimit"), Some(r#""orders";r=1;t=60"#));
    // 9 spent: 2 more do not fit, and the refusal keeps the one left.
    let reply = harness.get("/api/orders/7", &[(COST_HEADER, "2")]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("ratelimit"), Some(r#""orders";r=1;t=60"#));
    // Above the policy's maximum cost: nothing charged, fail-closed 503.
    let reply = harness.get("/api/orders/7", &[(COST_HEADER, "6")]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["type"], "https://ca-skeleton.invalid/problems/cost-exceeds-maximum");
    // No extension: cost 1 takes the last unit.
    let reply = harness.get("/api/orders/7", &[]).await;
    assert_eq!(reply.header("ratelimit"), Some(r#""orders";r=0;t=60"#));
    assert_eq!(harness.calls(), 3);
}

async fn addresses_of_one_ipv6_64_share_a_budget(via: Via) {
    // Behind a trusted proxy, so each request can come from another client.
    let (via, trusted): (Via, IpNet) = match via {
        Via::Oneshot(_) => {
            (Via::Oneshot("10.0.0.2:443".parse().unwrap()), "10.0.0.0/8".parse().unwrap())
        }
        Via::Tcp => (Via::Tcp, "127.0.0.1/32".parse().unwrap()),
    };
    let settings = EdgeSettings { trusted_proxies: vec![trusted], ..EdgeSettings::default() };
    let policies = vec![fixed("orders", 2, 60).build().unwrap()];
    let harness = memory_harness(policies, &["orders"], T0 + 250, settings, via).await;
    let from = |client: &'static str| [("x-forwarded-for", client)];
    let status = async |client| harness.get("/api/orders/7", &from(client)).await.status;
    // Three addresses of 2001:db8:1:2::/64 are one subject with two units.
    assert_eq!(status("2001:db8:1:2::a").await, StatusCode::OK);
    assert_eq!(status("2001:db8:1:2:ffff:eeee:dddd:b").await, StatusCode::OK);
    assert_eq!(status("2001:db8:1:2::c").await, StatusCode::TOO_MANY_REQUESTS);
    // The next /64 has its own budget.
    assert_eq!(status("2001:db8:1:3::a").await, StatusCode::OK);
    // An IPv4-mapped address and the plain IPv4 one are one subject.
    assert_eq!(status("::ffff:203.0.113.9").await, StatusCode::OK);
    assert_eq!(status("203.0.113.9").await, StatusCode::OK);
    assert_eq!(status("::ffff:203.0.113.9").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(harness.calls(), 5);
}

/// A HEAD is charged as the GET of its route: the same operation, so the
/// same policy set and the same budget (axum answers it with the GET
/// handler). The default set is generous, so a HEAD that escaped to it
/// would pass.
async fn a_head_is_charged_as_the_get_of_its_route(via: Via) {
    let policies = vec![
        fixed("tight", 2, 60).build().unwrap(),
        RateLimitPolicy::builder(
            "generous",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 1000,
                window: Duration::from_secs(60),
            }),
        )
        .build()
        .unwrap(),
    ];
    let settings = EdgeSettings {
        default_policies: PolicySet::single(PolicyId::new("generous").unwrap()),
        ..EdgeSettings::default()
    };
    let harness = memory_harness(policies, &["tight"], T0 + 250, settings, via).await;
    let reply = harness.get("/api/orders/7", &[]).await;
    assert_eq!(reply.header("ratelimit"), Some(r#""tight";r=1;t=60"#));
    let reply = harness.request(Method::HEAD, "/api/orders/7", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("ratelimit"), Some(r#""tight";r=0;t=60"#), "the GET's budget");
    for method in [Method::GET, Method::HEAD] {
        let reply = harness.request(method.clone(), "/api/orders/7", &[]).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{method}");
        assert_eq!(reply.header("retry-after"), Some("60"), "{method}");
    }
    assert_eq!(harness.calls(), 2);
    // A method the route does not serve (axum answers no OPTIONS itself)
    // is a 405 that runs no handler, charged as its own operation under
    // the default set: it neither spends nor escapes the GET's budget.
    for (method, remaining) in [(Method::OPTIONS, 999), (Method::DELETE, 999)] {
        let reply = harness.request(method.clone(), "/api/orders/7", &[]).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        let expected = format!(r#""generous";r={remaining};t=60"#);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()), "{method}");
    }
    assert_eq!(harness.calls(), 2);
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
    a_fixed_window_allows_two_then_denies,
    a_burst_and_sustained_pair_is_checked_together,
    a_calendar_month_is_described_by_the_period_in_force,
    a_shadow_policy_that_would_deny_lets_the_request_through,
    the_cost_extension_charges_its_units,
    addresses_of_one_ipv6_64_share_a_budget,
    a_head_is_charged_as_the_get_of_its_route,
);
