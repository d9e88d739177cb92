//! Clock skew at the edge: two instances on one redis-server, one of them
//! behind the other by more than `maximum-clock-regression` (1 s by
//! default). The lagging one answers 503 problem+json of type clock-unsafe
//! and counts it in `ca_skeleton_rate_limit_decisions_total{outcome="clock-unsafe"}`,
//! the series docs/operations.md tells operators to alert on; within the
//! bound it serves normally.

mod support;

use redis_fixture::RedisServer;
use reqwest::StatusCode;
use support::{Running, T0, counter, fixed_window_config, load};

const UNSAFE: &str = r#"ca_skeleton_rate_limit_decisions_total{policy="skew",algorithm="fixed-window",outcome="clock-unsafe",mode="enforce",cached="false",front="http"}"#;

#[tokio::test]
async fn an_instance_lagging_beyond_the_bound_answers_503_clock_unsafe_and_counts_it() {
    let redis = RedisServer::start();
    let extra = format!("[redis]\nenabled = true\nurls = [\"{}\"]\n", redis.url());
    let config = load(&fixed_window_config("skew", "redis", &extra));
    let leader = Running::start(&config).await;
    let laggard = Running::start(&config).await;
    // Both clocks start at T0 + 250 ms; the leader runs 5 s ahead.
    leader.clock.set_epoch_millis(T0 + 5_250);
    assert_eq!(leader.get("/api/hello").await.status, StatusCode::OK);

    let refused = laggard.get("/api/hello").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{}", refused.body);
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert!(problem["type"].as_str().is_some_and(|t| t.ends_with("clock-unsafe")), "{problem}");
    assert_eq!(counter(&laggard.metrics().await, UNSAFE), 1);

    // 500 ms behind is inside the bound: served, from the leader's window.
    laggard.clock.set_epoch_millis(T0 + 4_750);
    let served = laggard.get("/api/hello").await;
    assert_eq!(served.status, StatusCode::OK, "{}", served.body);
    assert_eq!(served.header("ratelimit"), Some(r#""skew";r=1;t=55"#), "two of three charged");
    assert_eq!(counter(&laggard.metrics().await, UNSAFE), 1, "no new clock-unsafe");
    leader.stop().await;
    laggard.stop().await;
}
