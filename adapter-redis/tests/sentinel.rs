//! The Sentinel topology on a real group (a master, one replica, three
//! sentinels), as least-privilege users:
//!
//! - every rule `ca-skeleton redis-acl` prints is needed: without `+role`
//!   on the data nodes or without `+role`/`+sentinel|masters` on the
//!   sentinels no master is found (typed `UnavailableBeforeSend`, nothing
//!   sent), and without `+wait` a charge runs but cannot be acknowledged
//!   (`Indeterminate`);
//! - with `wait-replicas = 1`, a charge the replica acknowledged is
//!   allowed; with the replica frozen (`SIGSTOP`) the same charge is
//!   `Indeterminate` within its deadline, a denial still a denial, and once
//!   the replica runs again charges are allowed again;
//! - with the replica frozen, concurrent charges (twice `wait-connections`)
//!   are each answered within `wait-timeout` and a little: a blocked `WAIT`
//!   holds one connection of the pool, not the charges behind it.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings, Topology};
use redis_fixture::RedisSentinel;
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationId, ManualClock, RateLimitFailure, RateLimitOutcome,
    RateLimitOutcomeExt, RateLimitPolicy, UnavailableCategory,
};
use support::{RATE_LIMIT_PASSWORD, SENTINEL_PASSWORD, acl_line, request_with, subject};

const WAIT_TIMEOUT: Duration = Duration::from_millis(200);
const BUDGET: Duration = Duration::from_millis(750);
/// Scheduling slack on a busy CI machine beyond the deadline.
const SLACK: Duration = Duration::from_millis(250);

fn policy() -> RateLimitPolicy {
    RateLimitPolicy::builder(
        "p",
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_secs(3_600),
        }),
    )
    .build()
    .unwrap()
}

/// The rules of `rules` without `rule`.
fn without(rules: Vec<String>, rule: &str) -> Vec<String> {
    assert!(rules.iter().any(|held| held == rule), "{rule} is not in {rules:?}");
    rules.into_iter().filter(|held| held != rule).collect()
}

/// The data users (full, no `+role`, no `+wait`) and the sentinel users
/// (full, no `+role`, no `+sentinel|masters`), all from the printed rules.
fn group() -> RedisSentinel {
    let waiting = RedisSettings {
        topology: Topology::Sentinel,
        wait_replicas: 1,
        ..RedisSettings::default()
    };
    let data = adapter_redis::acl::user_rules_for(&waiting);
    let sentinel = adapter_redis::acl::sentinel_user_rules();
    RedisSentinel::start_with_acl(
        &[
            acl_line("data", RATE_LIMIT_PASSWORD, &data),
            acl_line("data-no-role", RATE_LIMIT_PASSWORD, &without(data.clone(), "+role")),
            acl_line("data-no-wait", RATE_LIMIT_PASSWORD, &without(data, "+wait")),
        ],
        &[
            acl_line("sentinel", SENTINEL_PASSWORD, &sentinel),
            acl_line("sentinel-no-role", SENTINEL_PASSWORD, &without(sentinel.clone(), "+role")),
            acl_line(
                "sentinel-no-masters",
                SENTINEL_PASSWORD,
                &without(sentinel, "+sentinel|masters"),
            ),
        ],
    )
}

fn adapter(
    group: &RedisSentinel,
    clock: &ManualClock,
    data_user: &str,
    sentinel_user: &str,
) -> RedisEdgeRateLimitAdapter {
    let settings = RedisSettings {
        username: Some(data_user.to_owned()),
        sentinel_username: Some(sentinel_user.to_owned()),
        wait_replicas: 1,
        wait_timeout: WAIT_TIMEOUT,
        command_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        ..support::sentinel_settings(group)
    };
    RedisEdgeRateLimitAdapter::new(settings, [policy()], Arc::new(clock.clone())).unwrap()
}

async fn evaluate(
    adapter: &RedisEdgeRateLimitAdapter,
    clock: &ManualClock,
    who: u8,
) -> RateLimitOutcome {
    let request = request_with(clock, "p", &subject(who), EvaluationId::random(), BUDGET);
    let started = Instant::now();
    let outcome = adapter.evaluate(request).await;
    assert!(started.elapsed() <= BUDGET + SLACK, "took {:?}: {outcome:?}", started.elapsed());
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_frozen_concurrent_charges_are_each_answered_within_the_wait_timeout() {
    /// Twice the pool: half of them find every connection held by a `WAIT`.
    const CONCURRENT: u8 = 16;
    /// Scheduling on a busy machine; one charge queued behind a blocked
    /// `WAIT` would take a whole `WAIT_TIMEOUT` more.
    const FEW_MS: Duration = Duration::from_millis(50);
    let mut group = tokio::task::block_in_place(group);
    let clock = ManualClock::new(support::T0);
    let adapter = Arc::new(adapter(&group, &clock, "data", "sentinel"));
    let replica = group.other_than(group.master_port());
    let all = async |adapter: &Arc<RedisEdgeRateLimitAdapter>| {
        let calls: Vec<_> = (0..CONCURRENT)
            .map(|who| {
                let (adapter, clock) = (Arc::clone(adapter), clock.clone());
                tokio::spawn(async move {
                    let started = Instant::now();
                    let outcome = evaluate(&adapter, &clock, 10 + who).await;
                    (outcome, started.elapsed())
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for call in calls {
            outcomes.push(call.await.expect("an evaluation panicked"));
        }
        outcomes
    };
    // Healthy: every connection of the pool opened, every charge allowed.
    for (outcome, _) in all(&adapter).await {
        assert!(outcome.is_allowed(), "{outcome:?}");
    }
    // A master with every client blocked checks WAIT timeouts `hz` times a
    // second (10 by default: up to 100 ms late); 100 makes it 10 ms.
    let master = group.master_port();
    assert_eq!(group.cli(master, &["CONFIG", "SET", "hz", "100"]), "OK");

    tokio::task::block_in_place(|| group.pause(replica));
    let outcomes = all(&adapter).await;
    tokio::task::block_in_place(|| group.resume(replica));
    let slowest = outcomes.iter().map(|(_, took)| *took).max().unwrap_or_default();
    for (outcome, took) in &outcomes {
        let refused = indeterminate(outcome)
            || *outcome
                == Err(RateLimitFailure::Unavailable {
                    category: UnavailableCategory::UnavailableBeforeSend,
                    retry_after: Duration::from_secs(1),
                });
        assert!(refused, "{outcome:?}");
        assert!(*took <= WAIT_TIMEOUT + FEW_MS, "answered after {took:?}: {outcome:?}");
    }
    println!(
        "wait: {CONCURRENT} concurrent charges with the replica frozen, slowest answered after \
         {slowest:?} (wait-timeout {WAIT_TIMEOUT:?})"
    );
}

fn denied(outcome: &RateLimitOutcome) -> bool {
    matches!(outcome, Ok(set) if !set.allowed())
}

fn indeterminate(outcome: &RateLimitOutcome) -> bool {
    matches!(outcome, Err(RateLimitFailure::Indeterminate { .. }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_printed_rule_is_needed_on_the_nodes_and_on_the_sentinels() {
    let group = tokio::task::block_in_place(group);
    let clock = ManualClock::new(support::T0);

    let full = adapter(&group, &clock, "data", "sentinel");
    assert!(full.is_ready().await);
    let outcome = evaluate(&full, &clock, 1).await;
    assert!(outcome.is_allowed(), "{outcome:?}");

    let not_found = Err(RateLimitFailure::Unavailable {
        category: UnavailableCategory::UnavailableBeforeSend,
        retry_after: Duration::from_secs(1),
    });
    for (data_user, sentinel_user) in [
        ("data-no-role", "sentinel"),
        ("data", "sentinel-no-role"),
        ("data", "sentinel-no-masters"),
    ] {
        let refused = adapter(&group, &clock, data_user, sentinel_user);
        assert!(!refused.is_ready().await, "{data_user} / {sentinel_user}");
        assert_eq!(evaluate(&refused, &clock, 2).await, not_found, "{data_user} / {sentinel_user}");
    }

    // WAIT is refused after the script ran: the charge may stand on the
    // master, so it is neither allowed nor "not sent".
    let no_wait = adapter(&group, &clock, "data-no-wait", "sentinel");
    let outcome = evaluate(&no_wait, &clock, 3).await;
    assert!(indeterminate(&outcome), "{outcome:?}");
    // ... and it did charge: two more fill the limit of 3 for the full user.
    for _ in 0..2 {
        assert!(evaluate(&full, &clock, 3).await.is_allowed());
    }
    assert!(denied(&evaluate(&full, &clock, 3).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_turns_charges_indeterminate_within_the_deadline_and_denials_stay() {
    let mut group = tokio::task::block_in_place(group);
    let clock = ManualClock::new(support::T0);
    let adapter = adapter(&group, &clock, "data", "sentinel");
    let master = group.master_port();
    let replica = group.other_than(master);

    // Acknowledged: allowed, and subject 2 is filled up to its limit.
    assert!(evaluate(&adapter, &clock, 1).await.is_allowed());
    for _ in 0..3 {
        assert!(evaluate(&adapter, &clock, 2).await.is_allowed());
    }

    tokio::task::block_in_place(|| group.pause(replica));
    let started = Instant::now();
    let outcome = evaluate(&adapter, &clock, 1).await;
    let took = started.elapsed();
    assert!(indeterminate(&outcome), "{outcome:?}");
    // The server's WAIT ran out, not the client's timeout.
    assert!(took >= WAIT_TIMEOUT, "answered in {took:?}, before WAIT could time out");
    // A denial charges nothing, so no acknowledgement is asked of it.
    assert!(denied(&evaluate(&adapter, &clock, 2).await));
    tokio::task::block_in_place(|| group.resume(replica));

    // The replica catches up and acknowledges again: allowed, without a
    // new connection or adapter.
    let waited = Instant::now();
    loop {
        let outcome = evaluate(&adapter, &clock, 4).await;
        if outcome.is_allowed() {
            break;
        }
        assert!(indeterminate(&outcome), "{outcome:?}");
        assert!(waited.elapsed() < Duration::from_secs(10), "the replica never acknowledged");
    }
    println!(
        "wait: a frozen replica made a charge Indeterminate after {took:?} (wait-timeout {WAIT_TIMEOUT:?})"
    );
}
