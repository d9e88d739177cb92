//! Two instances on one redis-server whose clocks disagree. Within
//! `maximum-clock-regression` the lagging one is evaluated at the key's mark
//! (never ClockUnsafe, never a fresh window it did not live in), so together
//! they never admit more than the limit; beyond it the lagging one gets
//! ClockUnsafe, writes nothing, and still nothing is over-admitted.

mod support;

use std::time::Duration;

use adapter_redis::RedisEdgeRateLimitAdapter;
use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, Clock, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, ManualClock,
    OperationDigest, PolicyId, PolicySet, RateLimitFailure, RateLimitOutcome, RateLimitPolicy,
    RateLimitRequest, SubjectDigest, UnavailableCategory,
};
use support::{T0, adapter, subject};

const LIMIT: u64 = 10;
const WINDOW: Duration = Duration::from_secs(60);
const BOUND: Duration = Duration::from_secs(1);

// These two helpers are the only places that build a request or read a
// decision: a set of one policy, under one operation.

fn request(clock: &ManualClock, subject: &SubjectDigest) -> RateLimitRequest<'static> {
    RateLimitRequest {
        policies: PolicySet::single(PolicyId::new("skew").unwrap()).into(),
        subject: *subject,
        operation: OperationDigest::from_u64(0x0000_0000_0000_00f1),
        cost: 1,
        evaluation_id: EvaluationId::random(),
        deadline: clock.monotonic() + Duration::from_secs(5),
    }
}

fn allowed(outcome: &RateLimitOutcome) -> Option<bool> {
    match outcome {
        Ok(set) => Some(set.allowed()),
        Err(RateLimitFailure::Unavailable { .. })
        | Err(RateLimitFailure::Incompatible { .. })
        | Err(RateLimitFailure::Indeterminate { .. }) => None,
    }
}

fn policy() -> RateLimitPolicy {
    RateLimitPolicy::builder(
        "skew",
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit: LIMIT, window: WINDOW }),
    )
    .maximum_clock_regression(BOUND)
    .evaluation_dedup(EvaluationDedupPolicy::enabled_defaults())
    .build()
    .unwrap()
}

/// Two adapters on `server`, with clocks at `leading` and `leading - lag`.
fn pair(
    server: &RedisServer,
    leading: u64,
    lag: Duration,
) -> [(RedisEdgeRateLimitAdapter, ManualClock); 2] {
    let lagging = leading - u64::try_from(lag.as_millis()).unwrap();
    [leading, lagging].map(|at| {
        let clock = ManualClock::new(at);
        (adapter(server, &clock, vec![policy()], |_| {}), clock)
    })
}

/// Interleaves `calls` calls of each instance on one subject; returns the
/// allowed count of each and the outcomes that were no decision.
async fn interleave(
    pair: &[(RedisEdgeRateLimitAdapter, ManualClock)],
    who: &SubjectDigest,
    calls: usize,
) -> ([u64; 2], Vec<(usize, RateLimitOutcome)>) {
    let mut admitted = [0; 2];
    assert!(pair.len() <= 2);
    let mut undecided = Vec::new();
    for _ in 0..calls {
        for (n, (adapter, clock)) in pair.iter().enumerate() {
            let outcome = adapter.evaluate(request(clock, who)).await;
            match allowed(&outcome) {
                Some(true) => admitted[n] += 1,
                Some(false) => {}
                None => undecided.push((n, outcome)),
            }
        }
    }
    (admitted, undecided)
}

#[tokio::test]
async fn skew_within_the_bound_is_never_clock_unsafe_and_never_over_admits() {
    let server = RedisServer::start();
    // The leader is 100 ms into a new window; a laggard up to the bound
    // behind still reads the previous one. Evaluated at its own time it
    // would see a window start other than the stored one, count 0, and
    // admit a second limit; at the key's mark it shares the leader's window.
    for (n, lag) in [0_u64, 1, 500, 900, 1000].into_iter().enumerate() {
        let pair = pair(&server, T0 + 60_100, Duration::from_millis(lag));
        let who = subject(u8::try_from(n).unwrap() + 1);
        let (alone, undecided) = interleave(&pair[..1], &who, 4).await;
        assert_eq!((alone[0], undecided.len()), (4, 0), "lag {lag} ms");
        let (together, undecided) = interleave(&pair, &who, 10).await;
        assert!(undecided.is_empty(), "lag {lag} ms within the bound: {undecided:?}");
        assert_eq!(4 + together[0] + together[1], LIMIT, "lag {lag} ms: exactly the limit");
        assert!(together[1] > 0, "lag {lag} ms: the laggard shares the window, it is not shut out");
    }
}

#[tokio::test]
async fn skew_beyond_the_bound_is_clock_unsafe_for_the_laggard_and_writes_nothing() {
    let server = RedisServer::start();
    for (n, lag) in [1001_u64, 5000].into_iter().enumerate() {
        let pair = pair(&server, T0 + 60_100, Duration::from_millis(lag));
        let who = subject(u8::try_from(n).unwrap() + 10);
        let (alone, _) = interleave(&pair[..1], &who, 3).await;
        assert_eq!(alone[0], 3);
        let (together, undecided) = interleave(&pair, &who, 10).await;
        // Only the laggard is refused, every time, with the typed outcome;
        // the leader gets exactly the rest of the limit, so the laggard
        // consumed nothing.
        assert_eq!(together, [LIMIT - 3, 0], "lag {lag} ms");
        assert_eq!(undecided.len(), 10, "lag {lag} ms: {undecided:?}");
        for (instance, outcome) in &undecided {
            assert_eq!(*instance, 1, "lag {lag} ms: the leader is never refused");
            assert!(
                matches!(
                    outcome,
                    Err(RateLimitFailure::Unavailable {
                        category: UnavailableCategory::ClockUnsafe,
                        ..
                    })
                ),
                "lag {lag} ms: {outcome:?}"
            );
        }
    }
}

/// The key's expiry follows every writer's own clock. A leader 1 s ahead
/// sets it from its time; the slower instance, refused until its clock
/// reaches the leader's mark, then charges at the same caller time the
/// leader wrote at, one real second later. The key must still live until
/// that instance's window ends (docs/operations.md: a skewed instance is
/// never over-admitted): were the expiry left where the leader put it, the
/// key would vanish mid-window and the window would admit a second limit.
#[tokio::test]
async fn a_slower_writer_keeps_the_key_until_its_own_window_ends() {
    const LIMIT: u64 = 5;
    let server = RedisServer::start();
    let window = Duration::from_secs(3);
    // Records live 500 ms, so the window's end (+ 100 ms slack) is what
    // the key must live to.
    let policy = RateLimitPolicy::builder(
        "skew",
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit: LIMIT, window }),
    )
    .maximum_clock_regression(Duration::from_millis(100))
    .cleanup_grace(Duration::from_millis(100))
    .evaluation_dedup(EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_millis(500),
        max_entries: 256,
        max_stored_bytes: 65_536,
    })
    .build()
    .unwrap();
    let instance = |at: u64| {
        let clock = ManualClock::new(at);
        // As in the report: no refusal answered in process, so every
        // request reaches the key.
        let tweak = |settings: &mut adapter_redis::RedisSettings| {
            settings.deny_cache.enabled = false;
        };
        (adapter(&server, &clock, vec![policy.clone()], tweak), clock)
    };
    let (leader, leader_clock) = instance(T0 + 1_100);
    let (slower, slower_clock) = instance(T0 + 100);
    let who = subject(30);
    let operation = OperationDigest::from_u64(0x0000_0000_0000_00f1);
    let key = leader.keys().counter_key(&policy, &who, &operation);
    let mut redis = support::inspector(&server).await;
    let mut admitted = 0;
    let first = leader.evaluate(request(&leader_clock, &who)).await;
    assert_eq!(allowed(&first), Some(true));
    admitted += 1;
    let outcome = slower.evaluate(request(&slower_clock, &who)).await;
    assert!(
        matches!(
            outcome,
            Err(RateLimitFailure::Unavailable { category: UnavailableCategory::ClockUnsafe, .. })
        ),
        "1 s behind a 100 ms bound: {outcome:?}"
    );
    // One real second on, the slower clock reads what the leader's read.
    tokio::time::sleep(Duration::from_secs(1)).await;
    slower_clock.set_epoch_millis(T0 + 1_100);
    for _ in 0..LIMIT {
        let outcome = slower.evaluate(request(&slower_clock, &who)).await;
        admitted += u64::from(allowed(&outcome) == Some(true));
    }
    assert_eq!(admitted, LIMIT, "the slower instance shares the leader's window");
    // Its window ends at T0 + 3 s, 1.9 s from its clock, plus 100 ms slack.
    let pttl: i64 = redis::AsyncCommands::pttl(&mut redis, &key).await.unwrap();
    assert!((1_800..=2_000).contains(&pttl), "pttl {pttl} ms after the slower instance's charge");
    // 1.4 s later, still inside its window: the window is spent.
    tokio::time::sleep(Duration::from_millis(1_400)).await;
    slower_clock.set_epoch_millis(T0 + 2_500);
    for _ in 0..LIMIT {
        let outcome = slower.evaluate(request(&slower_clock, &who)).await;
        admitted += u64::from(allowed(&outcome) == Some(true));
    }
    assert_eq!(admitted, LIMIT, "a window of {LIMIT} admitted {admitted}");
}

/// Redis's own clock (epoch ms, `TIME`): the healthy fleet's clocks follow it.
async fn redis_now(server: &RedisServer) -> u64 {
    let mut redis = support::inspector(server).await;
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut redis).await.unwrap();
    seconds * 1_000 + micros / 1_000
}

fn fixed(id: &str, limit: u64, window: Duration, dedupe: bool) -> RateLimitPolicy {
    let dedup = if dedupe {
        EvaluationDedupPolicy::enabled_defaults()
    } else {
        EvaluationDedupPolicy::Disabled
    };
    RateLimitPolicy::builder(
        id,
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit, window }),
    )
    .maximum_clock_regression(BOUND)
    .evaluation_dedup(dedup)
    .build()
    .unwrap()
}

fn outcome_set(outcome: &RateLimitOutcome) -> &shared_contract::SetDecision {
    match outcome {
        Ok(set) => set,
        other => panic!("expected a decision, got {other:?}"),
    }
}

/// An instance whose clock ran an hour ahead of Redis's serves two requests
/// of a subject and stops: an instance on Redis's time decides that subject
/// at once (the outlier's mark is one no healthy clock reaches, so its state
/// is set aside, never a lock for the rest of its window), and the outlier,
/// back again, is refused as clock-unsafe and writes nothing. Each script
/// path: one fixed window with dedupe on and off (10 s and 24 h), a set of
/// two, and a concurrency policy's lease key.
#[tokio::test]
async fn a_writer_ahead_of_redis_never_locks_a_subject_for_the_fleet_on_redis_time() {
    const HOUR: u64 = 3_600_000;
    let server = RedisServer::start();
    let leases = RateLimitPolicy::builder(
        "leases",
        Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 3,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
        }),
    )
    .maximum_clock_regression(BOUND)
    .build()
    .unwrap();
    let day = Duration::from_secs(86_400);
    let ten = Duration::from_secs(10);
    let cases: [(&str, Vec<RateLimitPolicy>, u64); 6] = [
        ("10 s, dedupe on", vec![fixed("a", 1_000, ten, true)], 999),
        ("10 s, dedupe off", vec![fixed("a", 1_000, ten, false)], 999),
        ("24 h, dedupe on", vec![fixed("a", 1_000, day, true)], 999),
        ("24 h, dedupe off", vec![fixed("a", 1_000, day, false)], 999),
        ("a set of two", vec![fixed("a", 1_000, ten, true), fixed("b", 500, day, false)], 999),
        ("a lease", vec![leases], 2),
    ];
    for (n, (case, policies, remaining)) in cases.into_iter().enumerate() {
        let who = subject(40 + u8::try_from(n).unwrap());
        let ids: Vec<PolicyId> = policies.iter().map(|policy| policy.id().clone()).collect();
        let ask = |clock: &ManualClock| {
            let mut asked = request(clock, &who);
            asked.policies = PolicySet::new(ids.iter().cloned()).unwrap().into();
            asked
        };
        let healthy_clock = ManualClock::new(redis_now(&server).await);
        let outlier_clock = ManualClock::new(healthy_clock.epoch_millis() + HOUR);
        let healthy = adapter(&server, &healthy_clock, policies.clone(), |_| {});
        let outlier = adapter(&server, &outlier_clock, policies, |_| {});
        for _ in 0..2 {
            assert_eq!(allowed(&outlier.evaluate(ask(&outlier_clock)).await), Some(true), "{case}");
        }
        // The outlier is gone: the fleet on Redis's time decides.
        let decided = healthy.evaluate(ask(&healthy_clock)).await;
        let set = outcome_set(&decided);
        assert!(set.allowed(), "{case}: {decided:?}");
        assert_eq!(set.decisions()[0].remaining, remaining, "{case}");
        // Back again, the outlier is refused, blamed on its own clock, and
        // writes nothing: the healthy instance's next answer follows its own.
        let refused = outlier.evaluate(ask(&outlier_clock)).await;
        assert!(
            matches!(
                refused,
                Err(RateLimitFailure::Unavailable {
                    category: UnavailableCategory::ClockUnsafe,
                    ..
                })
            ),
            "{case}: {refused:?}"
        );
        let next = healthy.evaluate(ask(&healthy_clock)).await;
        assert_eq!(outcome_set(&next).decisions()[0].remaining, remaining - 1, "{case}");
    }
}
