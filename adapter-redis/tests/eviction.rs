//! A Redis that may evict counters re-grants spent budgets: the provider
//! reads `maxmemory-policy` (`INFO memory`) on each new connection and logs
//! one warning naming it when it can evict; `noeviction` is silent. Against
//! real servers, as the least-privilege user too.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, ManualClock, RateLimitPolicy,
};
use support::{
    ADMIN_PASSWORD, ADMIN_USER, RATE_LIMIT_PASSWORD, RATE_LIMIT_USER, T0, acl_server, adapter,
    connect_as, inspector, login,
};
use tracing::subscriber::DefaultGuard;

/// The warning's words, as operators grep for them.
const WARNING: &str = "maxmemory-policy can evict";
/// The debug line of a server that never evicts.
const SAFE: &str = "redis maxmemory-policy noeviction";

/// Every log line of this thread's tasks (the tests run on one thread).
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Lines {
    fn capture(&self) -> DefaultGuard {
        let lines = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || lines.clone())
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn count(&self, needle: &str) -> usize {
        self.text().matches(needle).count()
    }

    /// Waits until `needle` has been logged `times` times (the check runs on
    /// a task of its own); fails with the log after 10 s.
    async fn wait_for(&self, needle: &str, times: usize) {
        for _ in 0..1_000 {
            if self.count(needle) >= times {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{needle:?} not logged {times} times:\n{}", self.text());
    }
}

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn policy() -> RateLimitPolicy {
    RateLimitPolicy::builder(
        "p",
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 5,
            window: Duration::from_secs(1),
        }),
    )
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap()
}

#[tokio::test]
async fn a_server_started_with_allkeys_lru_is_named_in_one_warning() {
    let lines = Lines::default();
    let _capture = lines.capture();
    let server = RedisServer::start_with_args(&["--maxmemory-policy", "allkeys-lru"]);
    let clock = ManualClock::new(T0);
    let adapter = adapter(&server, &clock, vec![policy()], |_| {});
    assert!(adapter.is_ready().await);
    lines.wait_for(WARNING, 1).await;
    let text = lines.text();
    assert!(text.contains("maxmemory_policy=\"allkeys-lru\""), "{text}");
    assert!(adapter.is_ready().await);
    assert_eq!(lines.count(WARNING), 1, "once per connection, not per call:\n{text}");
}

#[tokio::test]
async fn noeviction_is_silent() {
    let lines = Lines::default();
    let _capture = lines.capture();
    let server = RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]);
    let clock = ManualClock::new(T0);
    let adapter = adapter(&server, &clock, vec![policy()], |_| {});
    assert!(adapter.is_ready().await);
    lines.wait_for(SAFE, 1).await;
    assert_eq!(lines.count("WARN"), 0, "{}", lines.text());
}

#[tokio::test]
async fn the_least_privilege_user_reads_the_policy_without_config_get() {
    let lines = Lines::default();
    let _capture = lines.capture();
    let server = acl_server(&[]);
    let mut admin = connect_as(&server, ADMIN_USER, ADMIN_PASSWORD).await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("volatile-lru")
        .query_async(&mut admin)
        .await
        .unwrap();
    let clock = ManualClock::new(T0);
    let adapter =
        adapter(&server, &clock, vec![policy()], login(RATE_LIMIT_USER, RATE_LIMIT_PASSWORD));
    assert!(adapter.is_ready().await);
    lines.wait_for(WARNING, 1).await;
    assert!(lines.text().contains("maxmemory_policy=\"volatile-lru\""), "{}", lines.text());
}

#[tokio::test]
async fn a_reconnect_reads_the_policy_again() {
    let lines = Lines::default();
    let _capture = lines.capture();
    let mut server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let adapter = adapter(&server, &clock, vec![policy()], |_| {});
    assert!(adapter.is_ready().await);
    lines.wait_for(SAFE, 1).await;
    server.restart();
    let mut redis = inspector(&server).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lfu")
        .query_async(&mut redis)
        .await
        .unwrap();
    // The first call finds the old connection closed; a later one reconnects.
    for _ in 0..100 {
        if adapter.is_ready().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lines.wait_for(WARNING, 1).await;
    assert!(lines.text().contains("maxmemory_policy=\"allkeys-lfu\""), "{}", lines.text());
}

/// On a cluster `INFO` goes to every master: the one that can evict is
/// named, the others are not.
#[tokio::test]
async fn each_cluster_master_is_checked() {
    let lines = Lines::default();
    let _capture = lines.capture();
    let cluster = redis_fixture::RedisCluster::start();
    let masters = cluster.masters();
    assert!(masters.len() >= 2, "{}", cluster.logs());
    let evicting = masters[0].port;
    let set = cluster.cli(evicting, &["CONFIG", "SET", "maxmemory-policy", "volatile-lfu"]);
    assert_eq!(set.trim(), "OK");
    let clock = ManualClock::new(T0);
    let adapter = adapter_redis::RedisEdgeRateLimitAdapter::new(
        adapter_redis::RedisSettings {
            topology: adapter_redis::Topology::Cluster,
            urls: cluster.urls(),
            command_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            ..adapter_redis::RedisSettings::default()
        },
        vec![policy()],
        Arc::new(clock.clone()),
    )
    .unwrap();
    assert!(adapter.is_ready().await);
    lines.wait_for(SAFE, masters.len() - 1).await;
    lines.wait_for(WARNING, 1).await;
    let text = lines.text();
    assert!(text.contains("maxmemory_policy=\"volatile-lfu\""), "{text}");
    assert_eq!(lines.count(WARNING), 1, "{text}");
}
