//! Measures, on a private redis-server, the `MEMORY USAGE` of one subject's
//! key and the server CPU per decision (`INFO commandstats`, evalsha
//! `usec_per_call`) for each algorithm with dedupe on and off (a
//! concurrency policy has no dedupe: its leases, never released here, are
//! its state).
//!
//! `cargo run -p adapter-redis --example redis_footprint`
//! prints one markdown table.

use std::sync::Arc;
use std::time::Duration;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, OperationDigest, PolicyId,
    PolicySet, RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest, SubjectDigest, SystemClock,
};

const CHARGED: usize = 10;
/// Enough charges within the dedupe TTL to fill the default record capacity.
const FULL: usize = 256;
const DECISIONS: usize = 20_000;
const TASKS: usize = 32;
const SUBJECTS: usize = 1_000;

fn subject(n: usize) -> SubjectDigest {
    SubjectDigest::parse(format!("v1:{n:064x}")).expect("valid digest")
}

/// The operation of every request (a digest, never a route).
fn operation() -> OperationDigest {
    OperationDigest::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef)
}

fn request(policy: &str, subject: SubjectDigest) -> RateLimitRequest<'static> {
    RateLimitRequest {
        policies: PolicySet::single(PolicyId::new(policy).expect("valid id")).into(),
        subject,
        operation: operation(),
        cost: 1,
        evaluation_id: EvaluationId::random(),
        deadline: std::time::Instant::now() + Duration::from_secs(5),
    }
}

async fn info_usec_per_call(redis: &mut redis::aio::MultiplexedConnection) -> (u64, f64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(redis).await.unwrap();
    let line = info.lines().find(|line| line.starts_with("cmdstat_evalsha:")).unwrap_or_default();
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|part| part.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .unwrap_or("0")
            .to_owned()
    };
    (field("calls").parse().unwrap_or(0), field("usec_per_call").parse().unwrap_or(0.0))
}

/// The state's size and `MEMORY USAGE` (all of it: `SAMPLES 0`) of a key:
/// a string's length, a hash's state field's (its records beside it), a
/// lease set's members (the mark and the leases).
async fn footprint(redis: &mut redis::aio::MultiplexedConnection, key: &str) -> (usize, usize) {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(redis).await.unwrap();
    let mut state = match kind.as_str() {
        "string" => redis::cmd("STRLEN"),
        "hash" => redis::cmd("HSTRLEN"),
        "zset" => redis::cmd("ZCARD"),
        other => panic!("{key} is a {other}"),
    };
    state.arg(key);
    if kind == "hash" {
        state.arg("s");
    }
    let strlen: usize = state.query_async(redis).await.unwrap();
    let usage: usize = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(redis)
        .await
        .unwrap();
    (strlen, usage)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = RedisServer::start();
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let version: String = redis::cmd("INFO").arg("server").query_async(&mut redis).await.unwrap();
    let version = version.lines().find(|l| l.starts_with("redis_version:")).unwrap_or_default();
    println!(
        "<!-- {version}, {CHARGED} charged evaluations per key; CPU over {DECISIONS} decisions, {TASKS} tasks, {SUBJECTS} subjects -->"
    );
    println!(
        "| algorithm | dedupe | state after {CHARGED} | MEMORY USAGE after {CHARGED} | \
         state after {FULL} | MEMORY USAGE after {FULL} | evalsha usec/call |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    let window = Duration::from_secs(60);
    let algorithms = [
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 1_000_000, window }),
        Algorithm::SlidingCounter(shared_contract::SlidingCounter { limit: 1_000_000, window }),
        Algorithm::TokenBucket(shared_contract::TokenBucket {
            capacity: 1_000_000,
            refill_tokens: 1_000,
            refill_period: Duration::from_secs(1),
        }),
        Algorithm::Gcra(shared_contract::Gcra {
            limit: 1_000_000,
            period: window,
            burst: 1_000_000,
        }),
        Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: shared_contract::MAX_IN_FLIGHT,
            lease_ttl: window,
            retry_after: Duration::from_secs(1),
        }),
    ];
    for algorithm in algorithms {
        let dedupe: &[_] = if algorithm.holds_leases() {
            &[("off", EvaluationDedupPolicy::Disabled)]
        } else {
            &[
                ("off", EvaluationDedupPolicy::Disabled),
                ("on (defaults)", EvaluationDedupPolicy::enabled_defaults()),
            ]
        };
        for &(label, dedup) in dedupe {
            let id = format!("{}-{}", algorithm.name(), if label == "off" { "off" } else { "on" });
            let policy = RateLimitPolicy::builder(&id, algorithm.clone())
                .evaluation_dedup(dedup)
                .build()
                .unwrap();
            let settings = RedisSettings {
                urls: vec![server.url()],
                command_timeout: Duration::from_secs(2),
                ..RedisSettings::default()
            };
            let adapter = Arc::new(
                RedisEdgeRateLimitAdapter::new(settings, [policy.clone()], Arc::new(SystemClock))
                    .unwrap(),
            );
            let who = subject(0);
            for _ in 0..CHARGED {
                assert!(adapter.evaluate(request(&id, who)).await.is_allowed());
            }
            let key = adapter.keys().counter_key(&policy, &who, &operation());
            let (strlen, usage) = footprint(&mut redis, &key).await;
            for _ in CHARGED..FULL {
                assert!(adapter.evaluate(request(&id, who)).await.is_allowed());
            }
            let (full_strlen, full_usage) = footprint(&mut redis, &key).await;

            let _: () =
                redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut redis).await.unwrap();
            let tasks: Vec<_> = (0..TASKS)
                .map(|task| {
                    let adapter = adapter.clone();
                    let id = id.clone();
                    tokio::spawn(async move {
                        for n in 0..DECISIONS / TASKS {
                            let who = subject(1 + (task * 7919 + n) % SUBJECTS);
                            let outcome = adapter.evaluate(request(&id, who)).await;
                            assert!(outcome.is_allowed(), "{outcome:?}");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            let (calls, usec) = info_usec_per_call(&mut redis).await;
            assert_eq!(calls, (DECISIONS / TASKS * TASKS) as u64);
            println!(
                "| {} | {label} | {strlen} | {usage} | {full_strlen} | {full_usage} | {usec:.2} |",
                algorithm.name()
            );
        }
    }
}
