//! Redis memory per subject at scale: on a private
//! redis-server (a free loopback port, never 6379), `INFO memory`
//! `used_memory` before and after one decision for each of N subjects
//! (1,000,000 unless `REDIS_SCALE_SUBJECTS` says otherwise) through the real
//! adapter, the growth divided by N, for a fixed window with dedupe off and
//! on, GCRA, and a concurrency lease taken and released; then the floor:
//! the same N key names (the fixed window's, so the same length) written by
//! a plain `SET key value PX ttl`, the value as long as the real key's state
//! and the TTL its `PTTL` right after the fill. The server is flushed
//! (`FLUSHALL SYNC`) before each case; one decision on a subject outside the
//! N first loads the scripts, so their cache is not in the growth.
//!
//! Dedupe on holds one record per key here (one decision each); its bound is
//! the record cap, so the example also prints `MEMORY USAGE` of one key
//! charged 256 times (the default cap) beside the same key with one record.
//!
//! Subjects are shaped like the edge's pseudonyms (`v1:` and 64 hex
//! digits); windows are a day so nothing expires while a million fill
//! (GCRA at one unit per day with a burst of 100, for its key lives only
//! until the theoretical arrival time).
//!
//! `cargo run --release -p adapter-redis --example redis_scale` prints
//! space-separated records that `scripts/bench.sh` reads:
//! `redis-mem <case> <subjects> <bytes_per_subject> <key_len> <type> <state_len> <pttl_ms> <memory_usage>`
//! and `redis-cap <case> <records> <memory_usage>`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use redis::aio::MultiplexedConnection;
use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, Lease, OperationDigest,
    PolicyId, PolicySet, RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest, ReleaseOutcome,
    SubjectDigest, SystemClock,
};

const TASKS: usize = 64;
/// Keys per pipeline when writing the floor.
const PIPELINE: usize = 1_000;
/// A day: fixed windows end at multiples of their length since the epoch,
/// so a shorter one can end mid-fill and drop the first keys.
const WINDOW: Duration = Duration::from_secs(24 * 3600);

fn subject(n: usize) -> SubjectDigest {
    let mixed = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    SubjectDigest::parse(format!("v1:{mixed:032x}{n:032x}")).expect("valid digest")
}

fn operation() -> OperationDigest {
    OperationDigest::from_u64(0x0000_0000_0000_00aa)
}

fn request(policy: &PolicyId, subject: SubjectDigest) -> RateLimitRequest<'static> {
    RateLimitRequest {
        policies: PolicySet::single(policy.clone()).into(),
        subject,
        operation: operation(),
        cost: 1,
        evaluation_id: EvaluationId::random(),
        deadline: Instant::now() + Duration::from_secs(10),
    }
}

/// One decision, the lease given back when the policy holds leases.
async fn decide(adapter: &RedisEdgeRateLimitAdapter, policy: &RateLimitPolicy, who: SubjectDigest) {
    let request = request(policy.id(), who);
    let lease = policy.algorithm().holds_leases().then(|| Lease::of(&request));
    let outcome = adapter.evaluate(request).await;
    assert!(outcome.is_allowed(), "{outcome:?}");
    if let Some(lease) = lease {
        assert_eq!(adapter.release(&lease).await, ReleaseOutcome::Released);
    }
}

async fn used_memory(redis: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query_async(redis).await.unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory has used_memory")
}

async fn flush(redis: &mut MultiplexedConnection) {
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query_async(redis).await.unwrap();
}

/// A key's type, its state's length (a string's, a hash's `s` field's, a
/// sorted set's members), `PTTL` and `MEMORY USAGE ... SAMPLES 0`.
async fn look(redis: &mut MultiplexedConnection, key: &str) -> (String, usize, i64, usize) {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(redis).await.unwrap();
    if kind == "none" {
        return (kind, 0, -2, 0);
    }
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
    let state: usize = state.query_async(redis).await.unwrap();
    let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(redis).await.unwrap();
    let usage: usize = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(redis)
        .await
        .unwrap();
    (kind, state, pttl, usage)
}

fn adapter(server: &RedisServer, policy: &RateLimitPolicy) -> Arc<RedisEdgeRateLimitAdapter> {
    let settings = RedisSettings {
        urls: vec![server.url()],
        command_timeout: Duration::from_secs(10),
        ..RedisSettings::default()
    };
    Arc::new(
        RedisEdgeRateLimitAdapter::new(settings, [policy.clone()], Arc::new(SystemClock)).unwrap(),
    )
}

/// What one case left: the growth per subject and a look at subject 0's key.
struct Filled {
    per_subject: f64,
    key: String,
    kind: String,
    state: usize,
    pttl: i64,
    usage: usize,
}

async fn fill(
    server: &RedisServer,
    redis: &mut MultiplexedConnection,
    policy: &RateLimitPolicy,
    subjects: usize,
) -> Filled {
    flush(redis).await;
    let adapter = adapter(server, policy);
    decide(&adapter, policy, subject(usize::MAX / 2)).await;
    let before = used_memory(redis).await;
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (adapter, policy) = (Arc::clone(&adapter), policy.clone());
            tokio::spawn(async move {
                for n in (task..subjects).step_by(TASKS) {
                    decide(&adapter, &policy, subject(n)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let after = used_memory(redis).await;
    let key = adapter.keys().counter_key(policy, &subject(0), &operation());
    let (kind, state, pttl, usage) = look(redis, &key).await;
    Filled {
        per_subject: after.saturating_sub(before) as f64 / subjects as f64,
        key,
        kind,
        state,
        pttl,
        usage,
    }
}

fn print(case: &str, subjects: usize, filled: &Filled) {
    println!(
        "redis-mem {case} {subjects} {:.1} {} {} {} {} {}",
        filled.per_subject,
        filled.key.len(),
        filled.kind,
        filled.state,
        filled.pttl,
        filled.usage
    );
}

fn policy(id: &str, algorithm: Algorithm, dedup: EvaluationDedupPolicy) -> RateLimitPolicy {
    RateLimitPolicy::builder(id, algorithm).evaluation_dedup(dedup).build().unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let subjects: usize = std::env::var("REDIS_SCALE_SUBJECTS")
        .ok()
        .map(|v| v.parse().expect("REDIS_SCALE_SUBJECTS is a count"))
        .unwrap_or(1_000_000);
    let server = RedisServer::start();
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // FLUSHALL SYNC of a million keys outlasts the client's default timeout.
    redis.set_response_timeout(Duration::from_secs(120));
    let version: String = redis::cmd("INFO").arg("server").query_async(&mut redis).await.unwrap();
    let version = version.lines().find(|l| l.starts_with("redis_version:")).unwrap_or_default();
    println!("# {version}, {subjects} subjects, one decision each, {TASKS} tasks");

    let limit = 1_000_000_000;
    let fixed = Algorithm::FixedWindow(shared_contract::FixedWindow { limit, window: WINDOW });
    // Same id for dedupe off and on: the keys have the same length.
    let off = policy("fixed", fixed.clone(), EvaluationDedupPolicy::Disabled);
    let on = policy("fixed", fixed, EvaluationDedupPolicy::enabled_defaults());
    // GCRA's key lives until its theoretical arrival time: one unit per
    // window (a burst of 100) keeps it for the whole fill.
    let gcra = policy(
        "fixed",
        Algorithm::Gcra(shared_contract::Gcra { limit: 1, period: WINDOW, burst: 100 }),
        EvaluationDedupPolicy::Disabled,
    );
    let leases = policy(
        "fixed",
        Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 10_000,
            lease_ttl: WINDOW,
            retry_after: Duration::from_secs(1),
        }),
        EvaluationDedupPolicy::Disabled,
    );

    let filled_off = fill(&server, &mut redis, &off, subjects).await;
    print("dedupe-off", subjects, &filled_off);
    let filled_on = fill(&server, &mut redis, &on, subjects).await;
    print("dedupe-on", subjects, &filled_on);
    print("gcra", subjects, &fill(&server, &mut redis, &gcra, subjects).await);
    print("lease-acquire-release", subjects, &fill(&server, &mut redis, &leases, subjects).await);

    // Dedupe on at its bound: one key charged once, then up to its record
    // cap (on a flushed server: the last case left a lease set there).
    flush(&mut redis).await;
    let cap = on.evaluation_dedup().record_capacity() as usize;
    let adapter_on = adapter(&server, &on);
    decide(&adapter_on, &on, subject(0)).await;
    let (_, _, _, at_one) = look(&mut redis, &filled_on.key).await;
    for _ in 1..cap {
        decide(&adapter_on, &on, subject(0)).await;
    }
    let (_, _, _, at_cap) = look(&mut redis, &filled_on.key).await;
    println!("redis-cap dedupe-on 1 {at_one}");
    println!("redis-cap dedupe-on {cap} {at_cap}");

    // The floor: the dedupe-off keys, written as plain strings.
    flush(&mut redis).await;
    let value = "0".repeat(filled_off.state.max(1));
    let ttl = filled_off.pttl.max(1);
    let before = used_memory(&mut redis).await;
    for start in (0..subjects).step_by(PIPELINE) {
        let mut pipe = redis::pipe();
        for n in start..(start + PIPELINE).min(subjects) {
            let key = adapter_on.keys().counter_key(&off, &subject(n), &operation());
            pipe.cmd("SET").arg(key).arg(&value).arg("PX").arg(ttl).ignore();
        }
        let _: () = pipe.query_async(&mut redis).await.unwrap();
    }
    let after = used_memory(&mut redis).await;
    let (kind, state, pttl, usage) = look(&mut redis, &filled_off.key).await;
    let floor = Filled {
        per_subject: after.saturating_sub(before) as f64 / subjects as f64,
        key: filled_off.key.clone(),
        kind,
        state,
        pttl,
        usage,
    };
    print("floor-set", subjects, &floor);
}
