//! End to end over a real TCP listener with the `redis` provider against a
//! `redis-server` this test spawns on a free port (never 6379).

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use redis_fixture::RedisServer;
use reqwest::StatusCode;
use support::{
    COMPLETION_UNITS, GCRA_ORDERS, IN_FLIGHT_WORK, Running, TEST_KEY,
    completion_reserves_then_settles, counter, fixed_window_config, gcra_burst_then_429, load,
    redis_cli, three_allowed_then_429, two_in_flight_then_429,
};

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
            r#"ca_skeleton_rate_limit_decisions_total{{policy="e2e-redis",algorithm="fixed-window",outcome="denied",mode="enforce",cached="{cached}",front="http"}}"#
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
async fn a_gcra_policy_limits_its_route_on_redis() {
    let redis = RedisServer::start();
    let config = load(&format!("{}{GCRA_ORDERS}", redis_config("e2e-redis-default", &redis)));
    let server = Running::start(&config).await;
    gcra_burst_then_429(&server).await;
    server.stop().await;
}

/// README "Limit what requests use, not how many", on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_completion_route_reserves_then_settles_on_redis() {
    let redis = RedisServer::start();
    let config = load(&format!("{}{COMPLETION_UNITS}", redis_config("e2e-redis-default", &redis)));
    let server = Running::start(&config).await;
    completion_reserves_then_settles(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_limit_holds_its_route_on_redis() {
    let redis = RedisServer::start();
    let config = load(&format!("{}{IN_FLIGHT_WORK}", redis_config("e2e-redis-default", &redis)));
    let server = Running::start(&config).await;
    two_in_flight_then_429(&server).await;
    server.stop().await;
    // Every lease was given back: the lease set holds its clock mark only.
    let cli = |args: &[&str]| redis_cli(redis.port(), args);
    let keys = cli(&["--scan", "--pattern", "e2e:*e2e-in-flight*"]);
    let key = keys.lines().next().expect("the in-flight policy's key");
    assert_eq!(cli(&["ZCARD", key]), "1", "{key}");
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

/// The label matchers of the two `ca_skeleton_rate_limit_decisions_total` selectors
/// of docs/operations.md's "share of denials Redis never saw".
fn documented_share() -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md");
    let text = std::fs::read_to_string(docs).unwrap();
    let at = text.find("is the share of denials Redis never saw").expect("the query is documented");
    let block = &text[text[..at].rfind("```text").expect("its block")..at];
    let selectors: Vec<BTreeMap<String, String>> = block
        .split("ca_skeleton_rate_limit_decisions_total{")
        .skip(1)
        .map(|rest| {
            let labels = &rest[..rest.find('}').unwrap()];
            labels
                .split(',')
                .map(|pair| {
                    let (name, value) = pair.split_once('=').unwrap();
                    (name.trim().to_owned(), value.trim().trim_matches('"').to_owned())
                })
                .collect()
        })
        .collect();
    let [numerator, denominator] = <[_; 2]>::try_from(selectors).expect("two selectors");
    (numerator, denominator)
}

/// The sum of every `ca_skeleton_rate_limit_decisions_total` series of `policies`
/// that `matchers` select.
fn sum(metrics: &str, policies: &[&str], matchers: &BTreeMap<String, String>) -> u64 {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("ca_skeleton_rate_limit_decisions_total{"))
        .filter_map(|rest| {
            let (labels, value) = rest.split_once("} ")?;
            let labels: BTreeMap<&str, &str> = labels
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(name, value)| (name, value.trim_matches('"')))
                .collect();
            let selected = policies.contains(labels.get("policy")?)
                && matchers
                    .iter()
                    .all(|(name, value)| labels.get(name.as_str()) == Some(&value.as_str()));
            selected.then(|| value.trim().parse::<u64>().ok()).flatten()
        })
        .sum()
}

/// The documented query gives the true share when a
/// cached refusal of a set also answers a member that allowed.
#[tokio::test]
async fn the_documented_share_of_cached_denials_is_the_true_share() {
    let redis = RedisServer::start();
    let config = load(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
[capabilities.rate-limit]
provider = "redis"
default-policy = ["share-tight", "share-loose"]
[capabilities.rate-limit.policies.share-tight]
algorithm = "fixed-window"
limit = 1
window = "60s"
[capabilities.rate-limit.policies.share-loose]
algorithm = "fixed-window"
limit = 1000
window = "60s"
[pseudonymizer.keys]
1 = "{TEST_KEY}"
[redis]
enabled = true
urls = ["{}"]
key-prefix = "share:"
"#,
        redis.url()
    ));
    let server = Running::start(&config).await;
    assert_eq!(server.get("/api/hello").await.status, StatusCode::OK);
    // One refusal from Redis, then nine from the denial cache.
    for _ in 0..10 {
        assert_eq!(server.get("/api/hello").await.status, StatusCode::TOO_MANY_REQUESTS);
    }
    let metrics = server.metrics().await;
    let (numerator, denominator) = documented_share();
    let policies = ["share-tight", "share-loose"];
    let share = (sum(&metrics, &policies, &numerator), sum(&metrics, &policies, &denominator));
    assert_eq!(share, (9, 10), "9 of the 10 denials never reached Redis:\n{metrics}");
    server.stop().await;
}
