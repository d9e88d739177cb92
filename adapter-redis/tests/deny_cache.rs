//! The local denial cache against a real redis-server: a cached refusal
//! makes no Redis call (counted with `INFO commandstats`), its waits shrink
//! on the decision's clock, it ends at its retry-after, a higher cost is
//! refused in process and a lower one asks Redis, a new revision, a clock
//! stepping back, an admitted id's repeat and `forget` all reach Redis; and
//! a differential run: two instances over one Redis, one caching, give the
//! same admissions as two that do not (docs/algorithms.md, "Local denial
//! cache").

mod support;

use std::time::Duration;

use adapter_redis::RedisEdgeRateLimitAdapter;
use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, BudgetKey, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, ManualClock,
    PolicyId, PolicyMode, PolicySet, RateLimitDecision, RateLimitOutcome, RateLimitOutcomeExt,
    RateLimitPolicy, SetDecision,
};
use support::{T0, adapter, inspector, operation, request, request_with, subject};
use uuid::Uuid;

fn fixed(id: &str, limit: u64, revision: u32, dedup: EvaluationDedupPolicy) -> RateLimitPolicy {
    RateLimitPolicy::builder(
        id,
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit,
            window: Duration::from_secs(1),
        }),
    )
    .revision(revision)
    .maximum_cost(limit.min(3))
    .evaluation_dedup(dedup)
    .build()
    .unwrap()
}

/// `EVALSHA` calls the server has run so far.
async fn script_calls(server: &RedisServer) -> u64 {
    let mut redis = inspector(server).await;
    let stats: String =
        redis::cmd("INFO").arg("commandstats").query_async(&mut redis).await.unwrap();
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

fn set(outcome: RateLimitOutcome) -> SetDecision {
    match outcome {
        Ok(set) => set,
        other => panic!("expected a decision, got {other:?}"),
    }
}

fn only(set: SetDecision) -> RateLimitDecision {
    set.decisions()[0]
}

async fn ask(
    adapter: &RedisEdgeRateLimitAdapter,
    clock: &ManualClock,
    policy: &str,
    who: u8,
    cost: u64,
) -> SetDecision {
    let mut asked = request(clock, policy, &subject(who));
    asked.cost = cost;
    set(adapter.evaluate(asked).await)
}

#[tokio::test]
async fn a_cached_refusal_makes_no_redis_call_and_its_waits_shrink_until_it_ends() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let policy = fixed("p", 3, 1, EvaluationDedupPolicy::enabled_defaults());
    let adapter = adapter(&server, &clock, vec![policy], |_| {});
    for _ in 0..3 {
        assert!(ask(&adapter, &clock, "p", 1, 1).await.allowed());
    }
    let first = ask(&adapter, &clock, "p", 1, 1).await;
    assert!(!first.allowed() && !first.cached());
    assert_eq!(only(first).retry_after_ms, 750);
    let calls = script_calls(&server).await;
    clock.set_epoch_millis(T0 + 600);
    let cached = ask(&adapter, &clock, "p", 1, 1).await;
    assert!(!cached.allowed() && cached.cached());
    let decision = only(cached);
    assert_eq!(decision.remaining, 0);
    assert_eq!(decision.retry_after_ms, 400);
    assert_eq!(decision.reset_after_ms, 400);
    clock.set_epoch_millis(T0 + 999);
    assert_eq!(only(ask(&adapter, &clock, "p", 1, 1).await).retry_after_ms, 1);
    assert_eq!(script_calls(&server).await, calls, "cached refusals ask nothing of Redis");
    // At the retry-after the window has ended: Redis answers, and admits.
    clock.set_epoch_millis(T0 + 1000);
    let fresh = ask(&adapter, &clock, "p", 1, 1).await;
    assert!(fresh.allowed() && !fresh.cached());
    assert_eq!(script_calls(&server).await, calls + 1);
}

#[tokio::test]
async fn a_higher_cost_is_refused_in_process_and_a_lower_cost_asks_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let adapter =
        adapter(&server, &clock, vec![fixed("p", 3, 1, EvaluationDedupPolicy::Disabled)], |_| {});
    assert_eq!(only(ask(&adapter, &clock, "p", 1, 2).await).remaining, 1);
    assert!(!ask(&adapter, &clock, "p", 1, 2).await.cached(), "Redis refuses cost 2");
    let calls = script_calls(&server).await;
    let higher = ask(&adapter, &clock, "p", 1, 3).await;
    assert!(!higher.allowed() && higher.cached());
    assert_eq!(script_calls(&server).await, calls);
    // Cost 1 still fits: Redis admits it, which drops the refusal, so the
    // next cost-2 request sees the budget as it is now.
    let lower = ask(&adapter, &clock, "p", 1, 1).await;
    assert!(lower.allowed() && !lower.cached());
    let again = ask(&adapter, &clock, "p", 1, 2).await;
    assert!(!again.allowed() && !again.cached());
    assert_eq!(only(again).remaining, 0);
    assert_eq!(script_calls(&server).await, calls + 2);
}

#[tokio::test]
async fn a_token_bucket_refusal_always_asks_redis() {
    // Its refusal writes the refill and the mark, which only Redis can.
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let bucket = RateLimitPolicy::builder(
        "b",
        Algorithm::TokenBucket(shared_contract::TokenBucket {
            capacity: 2,
            refill_tokens: 1,
            refill_period: Duration::from_millis(100),
        }),
    )
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap();
    let adapter = adapter(&server, &clock, vec![bucket], |_| {});
    assert!(ask(&adapter, &clock, "b", 1, 1).await.allowed());
    assert!(ask(&adapter, &clock, "b", 1, 1).await.allowed());
    let calls = script_calls(&server).await;
    for at in [0, 30, 60] {
        clock.set_epoch_millis(T0 + at);
        let refused = ask(&adapter, &clock, "b", 1, 1).await;
        assert!(!refused.allowed() && !refused.cached());
        assert_eq!(only(refused).retry_after_ms, 100 - at);
    }
    assert_eq!(script_calls(&server).await, calls + 3);
}

#[tokio::test]
async fn a_gcra_refusal_always_asks_redis() {
    // Its retry-after grows with the cost: a cached answer could not serve
    // a higher cost (docs/algorithms.md#gcra).
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let gcra = RateLimitPolicy::builder(
        "g",
        Algorithm::Gcra(shared_contract::Gcra {
            limit: 10,
            period: Duration::from_secs(1),
            burst: 2,
        }),
    )
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap();
    let adapter = adapter(&server, &clock, vec![gcra], |_| {});
    assert!(ask(&adapter, &clock, "g", 1, 1).await.allowed());
    assert!(ask(&adapter, &clock, "g", 1, 1).await.allowed());
    let calls = script_calls(&server).await;
    for at in [0, 30, 60] {
        clock.set_epoch_millis(T0 + at);
        let refused = ask(&adapter, &clock, "g", 1, 1).await;
        assert!(!refused.allowed() && !refused.cached());
        // T = 100 ms: the next cell conforms at T0 + 100.
        assert_eq!(only(refused).retry_after_ms, 100 - at);
    }
    assert_eq!(script_calls(&server).await, calls + 3);
}

#[tokio::test]
async fn a_concurrency_refusal_always_asks_redis_and_a_release_frees_the_slot_at_once() {
    // A release on any instance frees a slot at any moment: no refusal of
    // a set with a concurrency policy stays true for a stretch of time.
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let leases = RateLimitPolicy::builder(
        "c",
        Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 1,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_millis(700),
        }),
    )
    .build()
    .unwrap();
    let window = fixed("w", 1, 1, EvaluationDedupPolicy::Disabled);
    let adapter = adapter(&server, &clock, vec![leases, window], |_| {});
    let held = request(&clock, "c", &subject(1));
    let lease = shared_contract::Lease::of(&held);
    assert!(set(adapter.evaluate(held).await).allowed());
    assert!(ask(&adapter, &clock, "w", 1, 1).await.allowed());
    let both = PolicySet::new([PolicyId::new("w").unwrap(), PolicyId::new("c").unwrap()]).unwrap();
    let calls = script_calls(&server).await;
    for at in [0, 30, 60] {
        clock.set_epoch_millis(T0 + at);
        let refused = ask(&adapter, &clock, "c", 1, 1).await;
        assert!(!refused.allowed() && !refused.cached());
        assert_eq!(only(refused).retry_after_ms, 700);
        let mut in_set = request(&clock, "c", &subject(1));
        in_set.policies = both.clone().into();
        let refused = set(adapter.evaluate(in_set).await);
        assert!(!refused.allowed() && !refused.cached());
    }
    assert_eq!(script_calls(&server).await, calls + 6);
    assert_eq!(adapter.release(&lease).await, shared_contract::ReleaseOutcome::Released);
    assert!(ask(&adapter, &clock, "c", 1, 1).await.allowed());
}

#[tokio::test]
async fn a_new_revision_starts_afresh_and_never_meets_the_old_refusal() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let first =
        adapter(&server, &clock, vec![fixed("p", 1, 1, EvaluationDedupPolicy::Disabled)], |_| {});
    assert!(ask(&first, &clock, "p", 1, 1).await.allowed());
    assert!(!ask(&first, &clock, "p", 1, 1).await.allowed());
    assert!(ask(&first, &clock, "p", 1, 1).await.cached());
    // The reloaded adapter holds revision 2: new keys, no cached refusal.
    let second =
        adapter(&server, &clock, vec![fixed("p", 1, 2, EvaluationDedupPolicy::Disabled)], |_| {});
    let fresh = ask(&second, &clock, "p", 1, 1).await;
    assert!(fresh.allowed() && !fresh.cached());
}

#[tokio::test]
async fn a_clock_stepping_back_drops_the_refusal_and_redis_decides() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let adapter =
        adapter(&server, &clock, vec![fixed("p", 1, 1, EvaluationDedupPolicy::Disabled)], |_| {});
    assert!(ask(&adapter, &clock, "p", 1, 1).await.allowed());
    clock.set_epoch_millis(T0 + 500);
    assert_eq!(only(ask(&adapter, &clock, "p", 1, 1).await).retry_after_ms, 500);
    let calls = script_calls(&server).await;
    // 100 ms back (inside the default bound): not the cached 600 ms, but
    // what Redis says at T0 + 400.
    clock.set_epoch_millis(T0 + 400);
    let behind = ask(&adapter, &clock, "p", 1, 1).await;
    assert!(!behind.allowed() && !behind.cached());
    assert_eq!(only(behind).retry_after_ms, 600);
    assert_eq!(script_calls(&server).await, calls + 1);
}

#[tokio::test]
async fn a_repeat_of_an_admitted_evaluation_still_replays() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let adapter = adapter(
        &server,
        &clock,
        vec![fixed("p", 1, 1, EvaluationDedupPolicy::enabled_defaults())],
        |_| {},
    );
    let who = subject(1);
    let x = EvaluationId::random();
    let long = Duration::from_secs(5);
    assert!(adapter.evaluate(request_with(&clock, "p", &who, x, long)).await.is_allowed());
    assert!(!adapter.evaluate(request(&clock, "p", &who)).await.is_allowed());
    assert!(set(adapter.evaluate(request(&clock, "p", &who)).await).cached());
    // The same evaluation again (its response was lost): Redis replays it.
    let replay = set(adapter.evaluate(request_with(&clock, "p", &who, x, long)).await);
    assert!(replay.allowed() && replay.replayed() && !replay.cached());
}

#[tokio::test]
async fn forget_sends_the_subject_back_to_redis_and_the_cache_can_be_off() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policies = || vec![fixed("p", 1, 1, EvaluationDedupPolicy::Disabled)];
    let on = adapter(&server, &clock, policies(), |_| {});
    assert!(ask(&on, &clock, "p", 1, 1).await.allowed());
    assert!(!ask(&on, &clock, "p", 1, 1).await.cached());
    assert!(ask(&on, &clock, "p", 1, 1).await.cached());
    assert_eq!(on.forget_cached_denials(&subject(2)), 0, "another subject keeps nothing");
    assert_eq!(on.forget_cached_denials(&subject(1)), 1);
    assert!(!ask(&on, &clock, "p", 1, 1).await.cached());

    let off = adapter(&server, &clock, policies(), |settings| {
        settings.deny_cache.enabled = false;
    });
    let calls = script_calls(&server).await;
    for _ in 0..3 {
        let refused = ask(&off, &clock, "p", 1, 1).await;
        assert!(!refused.allowed() && !refused.cached());
    }
    assert_eq!(script_calls(&server).await, calls + 3);
    assert_eq!(off.forget_cached_denials(&subject(1)), 0);
}

/// xorshift64: a fixed pseudo-random sequence per seed.
struct Steps(u64);

impl Steps {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// The policies of the differential run: a fixed window and a token bucket
/// with dedupe on, a sliding counter, a shadow fixed window, a GCRA, a
/// concurrency policy whose leases expire (only sets of fixed windows are
/// cached; the others must not be).
fn mixed() -> Vec<RateLimitPolicy> {
    let window = Duration::from_millis(400);
    let build = |id: &str, algorithm, mode| {
        RateLimitPolicy::builder(id, algorithm)
            .maximum_cost(3)
            .mode(mode)
            .maximum_clock_regression(Duration::from_millis(200))
            .cleanup_grace(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    vec![
        build(
            "fw",
            Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 5, window }),
            PolicyMode::Enforce,
        ),
        build(
            "tb",
            Algorithm::TokenBucket(shared_contract::TokenBucket {
                capacity: 4,
                refill_tokens: 1,
                refill_period: Duration::from_millis(70),
            }),
            PolicyMode::Enforce,
        ),
        build(
            "sc",
            Algorithm::SlidingCounter(shared_contract::SlidingCounter { limit: 6, window }),
            PolicyMode::Enforce,
        ),
        build(
            "sh",
            Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 3, window }),
            PolicyMode::Shadow,
        ),
        build(
            "g",
            Algorithm::Gcra(shared_contract::Gcra {
                limit: 7,
                period: Duration::from_millis(100),
                burst: 4,
            }),
            PolicyMode::Enforce,
        ),
        // No maximum cost: a lease is one slot whatever the cost.
        RateLimitPolicy::builder(
            "c",
            Algorithm::Concurrency(shared_contract::Concurrency {
                max_in_flight: 2,
                lease_ttl: Duration::from_millis(150),
                retry_after: Duration::from_millis(50),
            }),
        )
        .maximum_clock_regression(Duration::from_millis(200))
        .cleanup_grace(Duration::from_secs(60))
        .build()
        .unwrap(),
    ]
}

// Fixed windows alone twice as often as any other set, so the run still
// meets over 100 cached answers beside the concurrency set.
const SETS: [&[&str]; 9] = [
    &["fw"],
    &["fw"],
    &["tb"],
    &["fw", "sh"],
    &["tb", "fw"],
    &["sc", "fw"],
    &["sh", "fw"],
    &["fw", "g"],
    &["fw", "c"],
];

/// One step of a run: which instance asks, for whom, what and when.
#[derive(Clone, Copy, Debug)]
struct Step {
    instance: usize,
    subject: u8,
    set: usize,
    cost: u64,
    at: u64,
    /// Repeats the evaluation id of step `n` (with its subject, set and
    /// cost) instead of a fresh one.
    repeat: Option<usize>,
}

fn steps(seed: u64, count: usize) -> Vec<Step> {
    let mut rng = Steps(seed);
    let mut at = T0 + 100;
    let mut made: Vec<Step> = Vec::with_capacity(count);
    for _ in 0..count {
        // Forward by 0 to 15 ms. Never back: a cached token-bucket refusal
        // does not move the key's mark as Redis's refusal does (a refusal
        // need not), so after a step back the two runs' keys would answer
        // at different effective times; the step back has its own test.
        at += rng.next(16);
        let step = if !made.is_empty() && rng.next(12) == 0 {
            // A repeat goes to the instance that made the original, as at
            // the edge, where an id never leaves the instance that made it
            // (an id admitted elsewhere is the documented exception:
            // docs/algorithms.md, "Local denial cache").
            let n = usize::try_from(rng.next(made.len() as u64)).unwrap();
            Step { at, repeat: Some(n), ..made[n] }
        } else {
            Step {
                instance: usize::try_from(rng.next(2)).unwrap(),
                subject: u8::try_from(rng.next(2)).unwrap(),
                set: usize::try_from(rng.next(SETS.len() as u64)).unwrap(),
                cost: 1 + rng.next(3),
                at,
                repeat: None,
            }
        };
        made.push(step);
    }
    made
}

/// Runs `steps` through two instances over one Redis (keys under
/// `prefix`), the first caching refusals when `cache` says so.
async fn run(
    server: &RedisServer,
    prefix: &str,
    cache: bool,
    steps: &[Step],
) -> Vec<RateLimitOutcome> {
    let clock = ManualClock::new(T0);
    let instance = |caching: bool| {
        adapter(server, &clock, mixed(), |settings| {
            settings.key_prefix = prefix.to_owned();
            settings.deny_cache.enabled = caching;
        })
    };
    let instances = [instance(cache), instance(false)];
    let ids: Vec<EvaluationId> = (0..steps.len())
        .map(|n| EvaluationId::from_uuid(Uuid::from_u128(u128::try_from(n).unwrap() + 1)))
        .collect();
    let mut outcomes = Vec::with_capacity(steps.len());
    for (n, step) in steps.iter().enumerate() {
        clock.set_epoch_millis(step.at);
        let id = ids[step.repeat.unwrap_or(n)];
        let mut asked = request_with(
            &clock,
            SETS[step.set][0],
            &subject(step.subject),
            id,
            Duration::from_secs(5),
        );
        asked.policies =
            PolicySet::new(SETS[step.set].iter().map(|id| PolicyId::new(*id).unwrap()))
                .unwrap()
                .into();
        asked.cost = step.cost;
        outcomes.push(instances[step.instance].evaluate(asked).await);
    }
    outcomes
}

/// The wait a refused set's 429 would carry: the largest retry-after of its
/// denying enforced policies (every policy of these sets but `sh` enforces).
fn retry_after(set: &SetDecision, step: &Step) -> u64 {
    SETS[step.set]
        .iter()
        .zip(set.decisions())
        .filter(|(id, decision)| **id != "sh" && !decision.allowed)
        .map(|(_, decision)| decision.retry_after_ms)
        .max()
        .unwrap_or_default()
}

#[tokio::test]
async fn with_the_cache_on_an_instance_admits_exactly_what_it_would_with_it_off() {
    let server = RedisServer::start();
    let mut cached_total = 0;
    for seed in 1..=6u64 {
        let steps = steps(0x9e37_79b9_7f4a_7c15 ^ seed, 300);
        let on = run(&server, &format!("ca:rl:diff:{seed}:on:"), true, &steps).await;
        let off = run(&server, &format!("ca:rl:diff:{seed}:off:"), false, &steps).await;
        for (n, ((with, without), step)) in on.iter().zip(&off).zip(&steps).enumerate() {
            let (with, without) = (set(with.clone()), set(without.clone()));
            assert_eq!(
                with.allowed(),
                without.allowed(),
                "seed {seed} step {n} {step:?}: cached {} {with:?} vs {without:?}",
                with.cached()
            );
            if with.cached() {
                cached_total += 1;
                // Other traffic only lengthens a wait: the cached one is
                // never longer than Redis's.
                assert!(
                    retry_after(&with, step) <= retry_after(&without, step),
                    "seed {seed} step {n} {step:?}: {with:?} vs {without:?}"
                );
            } else {
                assert_eq!(with, without, "seed {seed} step {n} {step:?}");
            }
        }
    }
    assert!(cached_total > 100, "the runs must exercise the cache: {cached_total} cached answers");
}

#[tokio::test]
async fn an_admin_reset_forgets_the_subject_s_cached_refusal_on_this_instance() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = fixed("p", 1, 1, EvaluationDedupPolicy::Disabled);
    let instance = adapter(&server, &clock, vec![policy], |_| {});
    assert!(ask(&instance, &clock, "p", 1, 1).await.allowed());
    assert!(!ask(&instance, &clock, "p", 1, 1).await.cached());
    assert!(ask(&instance, &clock, "p", 1, 1).await.cached(), "the refusal is cached");
    let budget = shared_contract::BudgetKey::new(
        subject(1),
        PolicyId::new("p").unwrap(),
        Some(support::operation()),
    );
    instance.reset(&budget).await.expect("the reset runs");
    // Redis answers again, from a fresh budget.
    let after = ask(&instance, &clock, "p", 1, 1).await;
    assert!(after.allowed() && !after.cached(), "{after:?}");
}

#[tokio::test]
async fn a_reloaded_policy_table_starts_with_an_empty_cache() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = || fixed("p", 1, 1, EvaluationDedupPolicy::Disabled);
    let before = adapter(&server, &clock, vec![policy()], |_| {});
    assert!(ask(&before, &clock, "p", 1, 1).await.allowed());
    assert!(!ask(&before, &clock, "p", 1, 1).await.cached());
    assert!(ask(&before, &clock, "p", 1, 1).await.cached());
    // The same revision, now shadow (a reload may change the mode alone):
    // a cached refusal would still block, so the new table caches afresh.
    let shadow = RateLimitPolicy::builder(
        "p",
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 1,
            window: Duration::from_secs(1),
        }),
    )
    .maximum_cost(1)
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .mode(PolicyMode::Shadow)
    .build()
    .unwrap();
    let after = before.with_policies([shadow]).unwrap();
    let decision = ask(&after, &clock, "p", 1, 1).await;
    assert!(decision.allowed() && !decision.cached(), "a shadow policy never blocks");
}

/// Two instances over one Redis, 3 an hour and 3 a day: after a reset
/// through one instance, the other's cached refusal of the subject is
/// served at most `deny-cache.max-age` (1 s by default) after Redis decided
/// it, then Redis is asked again and admits; until then the cache still
/// answers in process (its benefit for a subject over its limit).
#[tokio::test]
async fn a_reset_through_another_instance_reaches_this_ones_cache_within_its_max_age() {
    let server = RedisServer::start();
    for (n, window) in [(1_u8, 3_600), (2, 86_400)] {
        let clock = ManualClock::new(T0 + 250);
        let policy = RateLimitPolicy::builder(
            "w",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 3,
                window: Duration::from_secs(window),
            }),
        )
        .evaluation_dedup(EvaluationDedupPolicy::Disabled)
        .build()
        .unwrap();
        let resetting = adapter(&server, &clock, vec![policy.clone()], |_| {});
        let caching = adapter(&server, &clock, vec![policy], |_| {});
        for _ in 0..3 {
            assert!(ask(&caching, &clock, "w", n, 1).await.allowed());
        }
        let refused = ask(&caching, &clock, "w", n, 1).await;
        assert!(!refused.allowed() && !refused.cached());
        let budget = BudgetKey::new(subject(n), PolicyId::new("w").unwrap(), Some(operation()));
        resetting.reset(&budget).await.unwrap();
        let calls = script_calls(&server).await;
        clock.set_epoch_millis(T0 + 250 + 999);
        let cached = ask(&caching, &clock, "w", n, 1).await;
        assert!(!cached.allowed() && cached.cached(), "served in process within the max age");
        assert_eq!(script_calls(&server).await, calls);
        clock.set_epoch_millis(T0 + 250 + 1_000);
        let fresh = ask(&caching, &clock, "w", n, 1).await;
        assert!(fresh.allowed() && !fresh.cached(), "{window} s window: the reset reached it");
        assert_eq!(only(fresh).remaining, 2);
    }
}
/// A shorter `deny-cache.max-age` cuts a cached refusal sooner.
#[tokio::test]
async fn the_max_age_is_configurable() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = RateLimitPolicy::builder(
        "w",
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 1,
            window: Duration::from_secs(3_600),
        }),
    )
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap();
    let caching = adapter(&server, &clock, vec![policy], |settings| {
        settings.deny_cache.max_age = Duration::from_millis(200);
    });
    assert!(ask(&caching, &clock, "w", 1, 1).await.allowed());
    assert!(!ask(&caching, &clock, "w", 1, 1).await.cached());
    clock.set_epoch_millis(T0 + 199);
    assert!(ask(&caching, &clock, "w", 1, 1).await.cached());
    let calls = script_calls(&server).await;
    clock.set_epoch_millis(T0 + 200);
    let asked = ask(&caching, &clock, "w", 1, 1).await;
    assert!(!asked.allowed() && !asked.cached(), "Redis asked again, and still refuses");
    assert_eq!(only(asked).retry_after_ms, 3_600_000 - 200);
    assert_eq!(script_calls(&server).await, calls + 1);
}
