//! In-flight leases on a real redis-server (docs/algorithms.md,
//! "Concurrency (in-flight leases)" and "Stored state on Redis"): what a
//! lease key holds, that the acquire script removes expired leases, that a
//! release is one `EVALSHA` that removes that lease only, and that a key
//! of the wrong type is corrupt state on every path.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use redis::AsyncCommands;
use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, BudgetFailure, BudgetKey, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId,
    IncompatibleCategory, Lease, ManualClock, PolicyId, PolicySet, RateLimitFailure,
    RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest, ReleaseOutcome,
};
use support::{T0, adapter, inspector, operation, request, request_with, subject};

/// Leases live 1 s; the key's slack is the cleanup grace, 10 min, far
/// beyond a test's real duration, so Redis's own expiry never interferes.
const LEASE_TTL: u64 = 1_000;
const GRACE: Duration = Duration::from_secs(600);
/// How long a lease counts from its taking: its TTL plus the policy's
/// maximum clock regression (the default 1 s).
const LEASE_LIFE: u64 = LEASE_TTL + 1_000;

fn leases(id: &str, max_in_flight: u64) -> RateLimitPolicy {
    RateLimitPolicy::builder(
        id,
        Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight,
            lease_ttl: Duration::from_millis(LEASE_TTL),
            retry_after: Duration::from_millis(250),
        }),
    )
    .cleanup_grace(GRACE)
    .build()
    .unwrap()
}

fn fixed(id: &str, limit: u64) -> RateLimitPolicy {
    RateLimitPolicy::builder(
        id,
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit,
            window: Duration::from_secs(1),
        }),
    )
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap()
}

fn id(n: u128) -> EvaluationId {
    EvaluationId::from_uuid(uuid::Uuid::from_u128(n))
}

/// A lease key's members and scores, by member bytes.
async fn members(
    redis: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> BTreeMap<Vec<u8>, f64> {
    let pairs: Vec<(Vec<u8>, f64)> = redis.zrange_withscores(key, 0, -1).await.unwrap();
    pairs.into_iter().collect()
}

/// What `concurrency.lua` stores: each lease id (its 16 bytes) scored
/// by its `expires_at`, and the mark as the member `m` scored `-1 - mark`.
fn stored(mark: u64, held: &[(u128, u64)]) -> BTreeMap<Vec<u8>, f64> {
    let mut expected: BTreeMap<Vec<u8>, f64> = held
        .iter()
        .map(|&(n, expires_at)| (id(n).as_bytes().to_vec(), expires_at as f64))
        .collect();
    expected.insert(b"m".to_vec(), -1.0 - mark as f64);
    expected
}

fn lease_of(request: &RateLimitRequest) -> Lease {
    Lease::of(request)
}

async fn take(
    adapter: &impl EdgeRateLimitPort,
    clock: &ManualClock,
    policy: &str,
    n: u128,
) -> (RateLimitOutcome, Lease) {
    let request = request_with(clock, policy, &subject(1), id(n), Duration::from_secs(5));
    let lease = lease_of(&request);
    (adapter.evaluate(request).await, lease)
}

fn remaining(outcome: &RateLimitOutcome) -> u64 {
    match outcome {
        Ok(set) => set.decisions()[0].remaining,
        other => panic!("expected a decision, got {other:?}"),
    }
}

async fn calls(server: &RedisServer, command: &str) -> u64 {
    let mut redis = inspector(server).await;
    let stats: String =
        redis::cmd("INFO").arg("commandstats").query_async(&mut redis).await.unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

#[tokio::test]
async fn a_lease_key_is_a_sorted_set_of_binary_lease_ids_and_the_mark_under_the_pseudonym() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = leases("exports", 2);
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let (first, _) = take(&adapter, &clock, "exports", 1).await;
    assert_eq!(remaining(&first), 1);
    clock.set_epoch_millis(T0 + 10);
    assert_eq!(remaining(&take(&adapter, &clock, "exports", 2).await.0), 0);

    let mut redis = inspector(&server).await;
    let keys: Vec<String> = redis.keys("*").await.unwrap();
    let key = adapter.keys().counter_key(&policy, &subject(1), &operation());
    assert_eq!(
        keys,
        std::slice::from_ref(&key),
        "one key per (policy, revision, subject, operation)"
    );
    assert!(key.contains(&subject(1).to_string()), "the key names the pseudonym: {key}");
    let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut redis).await.unwrap();
    assert_eq!(kind, "zset");
    // Lease ids are evaluation ids, stored as their 16 bytes; the mark is
    // the second acquire's time.
    assert_eq!(
        members(&mut redis, &key).await,
        stored(T0 + 10, &[(1, T0 + LEASE_LIFE), (2, T0 + 10 + LEASE_LIFE)])
    );
    // The key lives until its latest lease expires plus the slack, counted
    // from the caller's time (here the lease's own time): at most that.
    let ttl: i64 = redis.pttl(&key).await.unwrap();
    let longest = i64::try_from(LEASE_LIFE + shared_contract::millis(GRACE)).unwrap();
    assert!(0 < ttl && ttl <= longest, "PTTL {ttl}");
}

#[tokio::test]
async fn the_acquire_script_removes_the_leases_expired_at_its_time() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = leases("exports", 3);
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let key = adapter.keys().counter_key(&policy, &subject(1), &operation());
    let mut redis = inspector(&server).await;
    let _ = take(&adapter, &clock, "exports", 1).await;
    clock.set_epoch_millis(T0 + 400);
    let _ = take(&adapter, &clock, "exports", 2).await;
    // At T0 + 2000 lease 1 has expired (expires_at <= t), lease 2 lives.
    clock.set_epoch_millis(T0 + LEASE_LIFE);
    assert_eq!(members(&mut redis, &key).await.len(), 3, "nothing removes a lease by itself");
    let (third, _) = take(&adapter, &clock, "exports", 3).await;
    // Two live after the acquire: one left of three.
    assert_eq!(remaining(&third), 1);
    assert_eq!(
        members(&mut redis, &key).await,
        stored(T0 + LEASE_LIFE, &[(2, T0 + 400 + LEASE_LIFE), (3, T0 + 2 * LEASE_LIFE)])
    );
    // A refusal writes nothing, expired leases included: fill the key, let
    // one expire, and be refused by the other policy of a set.
    let window = fixed("window", 1);
    let both = support::adapter(&server, &clock, vec![policy, window.clone()], |_| {});
    let set = PolicySet::new([PolicyId::new("window").unwrap(), PolicyId::new("exports").unwrap()])
        .unwrap();
    let ask = |n: u128| RateLimitRequest {
        policies: set.clone().into(),
        ..request_with(&clock, "exports", &subject(1), id(n), Duration::from_secs(5))
    };
    assert!(both.evaluate(ask(4)).await.is_allowed());
    clock.set_epoch_millis(T0 + 400 + LEASE_LIFE);
    let before = members(&mut redis, &key).await;
    assert!(!both.evaluate(ask(5)).await.is_allowed(), "the window refuses");
    assert_eq!(members(&mut redis, &key).await, before);
}

#[tokio::test]
async fn a_release_is_one_evalsha_that_removes_that_lease_and_nothing_else() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = leases("exports", 2);
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let key = adapter.keys().counter_key(&policy, &subject(1), &operation());
    let mut redis = inspector(&server).await;
    let (_, first) = take(&adapter, &clock, "exports", 1).await;
    clock.set_epoch_millis(T0 + 10);
    let _ = take(&adapter, &clock, "exports", 2).await;
    let full = take(&adapter, &clock, "exports", 3).await.0;
    assert!(!full.is_allowed());
    let scripts = calls(&server, "evalsha").await;
    let ttl: i64 = redis.pttl(&key).await.unwrap();

    assert_eq!(adapter.release(&first).await, ReleaseOutcome::Released);
    assert_eq!(calls(&server, "evalsha").await, scripts + 1, "one script call");
    assert_eq!(calls(&server, "eval").await, 0, "never EVAL");
    // Lease 2 and the mark stay, and the expiry does not move.
    assert_eq!(members(&mut redis, &key).await, stored(T0 + 10, &[(2, T0 + 10 + LEASE_LIFE)]));
    let after: i64 = redis.pttl(&key).await.unwrap();
    assert!(0 < after && after <= ttl, "PTTL {ttl} then {after}");
    // Idempotent: nothing is held any more.
    assert_eq!(adapter.release(&first).await, ReleaseOutcome::NotHeld);
    assert!(take(&adapter, &clock, "exports", 3).await.0.is_allowed(), "the slot is free");
    // A lease past its expiry is not held: its release frees nothing, and
    // the lease is gone from the key.
    let (_, second) = take(&adapter, &clock, "exports", 2).await;
    clock.set_epoch_millis(T0 + 10 + LEASE_LIFE);
    assert_eq!(adapter.release(&second).await, ReleaseOutcome::NotHeld);
    assert!(!members(&mut redis, &key).await.contains_key(id(2).as_bytes().as_slice()));
}

#[tokio::test]
async fn a_release_of_a_set_without_a_concurrency_policy_asks_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let adapter = adapter(&server, &clock, vec![fixed("window", 3)], |_| {});
    let request = request(&clock, "window", &subject(1));
    let lease = lease_of(&request);
    assert!(adapter.evaluate(request).await.is_allowed());
    let scripts = calls(&server, "evalsha").await;
    assert_eq!(adapter.release(&lease).await, ReleaseOutcome::NotHeld);
    assert_eq!(calls(&server, "evalsha").await, scripts);
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_corrupt_state_for_leases_and_left_alone() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = leases("exports", 2);
    let window = fixed("window", 3);
    let adapter = adapter(&server, &clock, vec![policy.clone(), window.clone()], |_| {});
    let key = adapter.keys().counter_key(&policy, &subject(1), &operation());
    let mut redis = inspector(&server).await;
    let incompatible =
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible });
    let budget = BudgetKey::new(subject(1), PolicyId::new("exports").unwrap(), Some(operation()));

    // A string (another algorithm's state) under the lease key.
    let _: () = redis.set(&key, "garbage").await.unwrap();
    let (outcome, lease) = take(&adapter, &clock, "exports", 1).await;
    assert_eq!(outcome, incompatible);
    assert_eq!(adapter.release(&lease).await, ReleaseOutcome::NotHeld);
    assert_eq!(adapter.inspect(&budget).await, Err(BudgetFailure::StateIncompatible));
    let kept: String = redis.get(&key).await.unwrap();
    assert_eq!(kept, "garbage");
    // In a set, the same.
    let set = PolicySet::new([PolicyId::new("window").unwrap(), PolicyId::new("exports").unwrap()])
        .unwrap();
    let in_set = RateLimitRequest {
        policies: set.into(),
        ..request_with(&clock, "exports", &subject(1), id(2), Duration::from_secs(5))
    };
    assert_eq!(adapter.evaluate(in_set).await, incompatible);

    // A lease set under a rate policy's key.
    let rate_key = adapter.keys().counter_key(&window, &subject(1), &operation());
    let _: () = redis.zadd(&rate_key, "m", -1).await.unwrap();
    assert_eq!(adapter.evaluate(request(&clock, "window", &subject(1))).await, incompatible);
    let rate_budget =
        BudgetKey::new(subject(1), PolicyId::new("window").unwrap(), Some(operation()));
    assert_eq!(adapter.inspect(&rate_budget).await, Err(BudgetFailure::StateIncompatible));

    // A reset drops either, whatever its type.
    adapter.reset(&budget).await.unwrap();
    adapter.reset(&rate_budget).await.unwrap();
    let left: Vec<String> = redis.keys("*").await.unwrap();
    assert_eq!(left, Vec::<String>::new());
}
