//! Exactness through HTTP: 200 concurrent requests of one subject (one API
//! key) against a fixed window of 50 get exactly 50 answers of 200 and 150
//! of 429, on the memory provider, Redis standalone and Redis Cluster.

mod support;

use redis_fixture::{RedisCluster, RedisServer};
use support::{Running, TEST_KEY, load};

const LIMIT: usize = 50;
const REQUESTS: usize = 200;

/// A fixed window of [`LIMIT`] per 60 s; the budget is generous because
/// the point is the count, and 200 requests at once on a shared machine
/// must not turn into 503s from slowness.
fn config(provider: &str, redis: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "{provider}"
default-policy = "exact"
evaluation-budget = "5s"

[capabilities.rate-limit.policies.exact]
algorithm = "fixed-window"
limit = {LIMIT}
window = "60s"

[pseudonymizer.keys]
1 = "{TEST_KEY}"
{redis}
"#
    )
}

/// Fires [`REQUESTS`] requests at once with one API key; returns the count
/// of each status (200, 429, anything else).
async fn burst(server: &Running) -> (usize, usize, Vec<u16>) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(REQUESTS)
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .unwrap();
    let url = server.url("/api/hello");
    // Every request starts only once all are ready, so they overlap.
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(REQUESTS));
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let (client, url, start) = (client.clone(), url.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let response =
                    client.get(url).header("x-api-key", "one-subject").send().await.unwrap();
                response.status().as_u16()
            })
        })
        .collect();
    let (mut ok, mut denied, mut other) = (0, 0, Vec::new());
    for task in tasks {
        match task.await.unwrap() {
            200 => ok += 1,
            429 => denied += 1,
            status => other.push(status),
        }
    }
    (ok, denied, other)
}

async fn exactly_the_limit(toml: &str, name: &str) {
    let server = Running::start(&load(toml)).await;
    let (ok, denied, other) = burst(&server).await;
    eprintln!("{name}: {ok} x 200, {denied} x 429, others {other:?}");
    assert_eq!((ok, denied, other), (LIMIT, REQUESTS - LIMIT, Vec::new()), "{name}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_admits_exactly_the_limit_of_200_concurrent_requests() {
    exactly_the_limit(&config("memory", ""), "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_standalone_admits_exactly_the_limit_of_200_concurrent_requests() {
    let redis = RedisServer::start();
    let section = format!("[redis]\nenabled = true\nurls = [\"{}\"]\n", redis.url());
    exactly_the_limit(&config("redis", &section), "redis standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_admits_exactly_the_limit_of_200_concurrent_requests() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls().iter().map(|url| format!("\"{url}\"")).collect::<Vec<_>>().join(", ");
    let section = format!("[redis]\nenabled = true\ntopology = \"cluster\"\nurls = [{urls}]\n");
    exactly_the_limit(&config("redis", &section), "redis cluster").await;
}
