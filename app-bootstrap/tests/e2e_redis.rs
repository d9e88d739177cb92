//! End to end over a real TCP listener with the `redis` provider against a
//! `redis-server` this test spawns on a free port (never 6379).

mod support;

use std::time::{Duration, Instant};

use adapter_redis::fixture::RedisServer;
use reqwest::StatusCode;
use support::{Running, counter, fixed_window_config, load, three_allowed_then_429};

fn redis_config(id: &str, redis: &RedisServer) -> String {
    let extra =
        format!("[redis]\nenabled = true\nurls = [\"{}\"]\nkey-prefix = \"e2e:\"\n", redis.url());
    fixed_window_config(id, "redis", &extra)
}

#[tokio::test]
async fn redis_limits_until_429_and_metrics_count_the_429s() {
    let redis = RedisServer::start();
    let config = load(&redis_config("e2e-redis", &redis));
    let server = Running::start(&config).await;

    assert_eq!(server.get("/readyz").await.status, StatusCode::OK);
    three_allowed_then_429(&server, "e2e-redis", "/api/hello").await;
    let again = server.get("/api/hello").await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);

    let metrics = server.metrics().await;
    let denied = |cached: &str| {
        let series = format!(
            r#"ca_rate_limit_decisions_total{{policy="e2e-redis",algorithm="fixed-window",outcome="denied",mode="enforce",cached="{cached}"}}"#
        );
        counter(&metrics, &series)
    };
    // The first 429 came from Redis; the second from the local denial
    // cache (on by default), within the first one's retry-after.
    assert_eq!((denied("false"), denied("true")), (1, 1), "{metrics}");
    assert!(!metrics.contains("127.0.0.1"), "{metrics}");
    server.stop().await;
}

#[tokio::test]
async fn readyz_is_503_while_redis_is_down_and_200_after_it_restarts() {
    let mut redis = RedisServer::start();
    let config = load(&redis_config("e2e-ready", &redis));
    let server = Running::start(&config).await;
    assert_eq!(server.get("/readyz").await.status, StatusCode::OK);
    assert_eq!(server.get("/api/hello").await.status, StatusCode::OK);

    redis.stop();
    assert_eq!(server.get("/readyz").await.status, StatusCode::SERVICE_UNAVAILABLE);
    // Fail-closed: no decision, no handler; Retry-After is the configured
    // failure retry-after (1 s by default).
    let refused = server.get("/api/hello").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    // Liveness does not depend on the provider.
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);

    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = server.get("/readyz").await.status;
        if status == StatusCode::OK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {status} after the restart:\n{}",
            redis.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(server.get("/api/hello").await.status, StatusCode::OK);
    server.stop().await;
}
