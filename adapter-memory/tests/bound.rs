//! The store's key bound (`memory.max-keys`): a flood of distinct subjects
//! fills the store and no further. Full, it drops only keys that are
//! expired or whose budget is whole again (their absence means the same as
//! their state), then refuses a request that needs a new key with
//! `Unavailable(AdmissionRejected)`, which the edge answers fail-closed.
//! A key in use is never dropped to make room, so an exhausted subject is
//! never handed a fresh budget; existing subjects are decided as before.

mod support;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use adapter_memory::{MemoryEdgeRateLimitAdapter, MemoryStore};
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, ManualClock, PolicyId, PolicySet,
    RateLimitFailure, RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy, UnavailableCategory,
};
use support::{T0, decision, fixed, id, policy, request, subject};

/// The failure retry-after the tests configure, to tell it from defaults.
const FAILURE_RETRY_AFTER: Duration = Duration::from_secs(3);

/// An adapter over a store of `shards` shards holding at most `max_keys`.
fn bounded(
    shards: usize,
    max_keys: usize,
    policies: Vec<RateLimitPolicy>,
) -> (MemoryEdgeRateLimitAdapter, ManualClock) {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_shards_and_max_keys(shards, NonZeroUsize::new(max_keys).unwrap());
    let adapter = MemoryEdgeRateLimitAdapter::with_store(store, policies, Arc::new(clock.clone()))
        .expect("adapter builds")
        .with_failure_retry_after(FAILURE_RETRY_AFTER);
    (adapter, clock)
}

/// The refusal of a request whose key would be new in a full store.
const FULL: RateLimitOutcome = Err(RateLimitFailure::Unavailable {
    category: UnavailableCategory::AdmissionRejected,
    retry_after: FAILURE_RETRY_AFTER,
});

async fn ask(
    adapter: &MemoryEdgeRateLimitAdapter,
    clock: &ManualClock,
    policy: &PolicyId,
    n: u64,
) -> RateLimitOutcome {
    // Evaluation ids are unique per call, so dedupe never replays.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let evaluation = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    adapter.evaluate(request(clock, policy, subject(n), u128::from(evaluation))).await
}

/// The demo policy's shape: 5 a minute, dedupe at its defaults.
fn five_a_minute(name: &str) -> RateLimitPolicy {
    policy(name, fixed(5, 60_000), EvaluationDedupPolicy::enabled_defaults())
}

#[tokio::test]
async fn an_exhausted_victim_stays_refused_through_and_after_a_flood_that_fills_the_store() {
    const MAX_KEYS: usize = 1_000;
    let (adapter, clock) = bounded(1, MAX_KEYS, vec![five_a_minute("p")]);
    let p = id("p");
    let victim = u64::MAX;
    clock.set_epoch_millis(T0 + 1_000);
    for remaining in (0..5).rev() {
        let allowed = decision(ask(&adapter, &clock, &p, victim).await);
        assert_eq!((allowed.allowed, allowed.remaining), (true, remaining));
    }
    assert!(!decision(ask(&adapter, &clock, &p, victim).await).allowed, "the sixth is refused");
    // 10,000 one-shot subjects inside the same minute: the first 999 fill
    // the store beside the victim, every later one is refused fail-closed.
    let mut admitted = 0;
    for n in 0..10_000 {
        clock.set_epoch_millis(T0 + 1_000 + n / 1_000);
        let outcome = ask(&adapter, &clock, &p, n).await;
        if outcome.is_allowed() {
            admitted += 1;
        } else {
            assert_eq!(outcome, FULL, "subject {n}");
        }
        if n % 500 == 0 {
            let refused = decision(ask(&adapter, &clock, &p, victim).await);
            assert!(!refused.allowed, "the victim during the flood, at subject {n}");
            assert_eq!(refused.remaining, 0);
            assert!(adapter.store().live_entries() <= MAX_KEYS);
        }
    }
    assert_eq!(admitted, MAX_KEYS - 1);
    assert_eq!(adapter.store().refused_keys(), 10_000 - (MAX_KEYS as u64 - 1));
    // After the flood, until the victim's minute ends, it stays refused.
    clock.set_epoch_millis(T0 + 59_999);
    let after = decision(ask(&adapter, &clock, &p, victim).await);
    assert_eq!((after.allowed, after.remaining), (false, 0));
    assert_eq!(after.retry_after_ms, 1);
    assert_eq!(adapter.store().live_entries(), MAX_KEYS);
}

#[tokio::test]
async fn expired_and_whole_keys_are_dropped_first_and_keys_in_use_never() {
    // Slack max(cleanup-grace, maximum-clock-regression) = 1 s (defaults):
    // a "second" key charged at T0 is whole again at T0 + 1000 (its
    // window's end) and expires at T0 + 2000; a "minute" key charged at T0
    // is whole again only at T0 + 60 000.
    let second = policy("second", fixed(5, 1_000), EvaluationDedupPolicy::Disabled);
    let minute = policy("minute", fixed(5, 60_000), EvaluationDedupPolicy::Disabled);
    let (adapter, clock) = bounded(1, 4, vec![second, minute]);
    let (s, m) = (id("second"), id("minute"));
    for n in [1, 2] {
        assert!(ask(&adapter, &clock, &m, n).await.is_allowed());
    }
    for n in [3, 4] {
        assert!(ask(&adapter, &clock, &s, n).await.is_allowed());
    }
    // Full, and nothing whole yet: a new subject is refused.
    clock.set_epoch_millis(T0 + 999);
    assert_eq!(ask(&adapter, &clock, &m, 5).await, FULL);
    // At T0 + 1000 the "second" keys are whole (not yet expired): dropped
    // to make room for two new subjects; the "minute" keys stay.
    clock.set_epoch_millis(T0 + 1_000);
    for n in [5, 6] {
        assert!(ask(&adapter, &clock, &m, n).await.is_allowed(), "subject {n}");
    }
    assert_eq!(ask(&adapter, &clock, &m, 7).await, FULL);
    assert_eq!(adapter.store().live_entries(), 4);
    // The kept keys hold their counts: one charged, a second one now.
    for n in [1, 2, 5, 6] {
        assert_eq!(decision(ask(&adapter, &clock, &m, n).await).remaining, 3, "subject {n}");
    }
    // A dropped key was whole: its subject asks afresh, and needs a slot.
    assert_eq!(ask(&adapter, &clock, &s, 3).await, FULL);
    // Once the minute ends, every key is whole again and makes room.
    clock.set_epoch_millis(T0 + 60_000);
    assert!(ask(&adapter, &clock, &s, 3).await.is_allowed());
}

#[tokio::test]
async fn new_subjects_are_refused_fail_closed_and_existing_ones_decided_as_before() {
    let (adapter, clock) = bounded(1, 3, vec![five_a_minute("p")]);
    let p = id("p");
    for n in 0..3 {
        assert!(ask(&adapter, &clock, &p, n).await.is_allowed());
    }
    for n in 3..10 {
        assert_eq!(ask(&adapter, &clock, &p, n).await, FULL, "subject {n}");
    }
    assert_eq!(adapter.store().refused_keys(), 7);
    // A refused subject was not charged: nothing of it is held.
    let operation = shared_contract::OperationDigest::from_u64(0x0000_0000_0000_00aa);
    let key = shared_contract::BudgetKey::new(subject(3), p.clone(), Some(operation));
    assert_eq!(adapter.inspect(&key).await.unwrap().remaining, 5);
    // The three held subjects spend the rest of their budget as usual.
    for n in 0..3 {
        for remaining in (0..4).rev() {
            let allowed = decision(ask(&adapter, &clock, &p, n).await);
            assert_eq!((allowed.allowed, allowed.remaining), (true, remaining), "subject {n}");
        }
        assert!(!decision(ask(&adapter, &clock, &p, n).await).allowed);
    }
    assert_eq!(adapter.store().live_entries(), 3);
}

#[tokio::test]
async fn a_policy_set_needs_a_slot_for_each_of_its_new_keys() {
    let a = policy("a", fixed(5, 60_000), EvaluationDedupPolicy::Disabled);
    let b = policy("b", fixed(5, 60_000), EvaluationDedupPolicy::Disabled);
    let (adapter, clock) = bounded(1, 5, vec![a, b]);
    let set = PolicySet::new(vec![id("a"), id("b")]).unwrap();
    let both = |n: u64| {
        let mut asked = request(&clock, &id("a"), subject(n), u128::from(n) + 100);
        asked.policies = set.clone().into();
        adapter.evaluate(asked)
    };
    // Two keys each: subjects 1 and 2 fill four slots.
    assert!(both(1).await.is_allowed());
    assert!(both(2).await.is_allowed());
    // One slot left, two keys needed: refused, and nothing written.
    assert_eq!(both(3).await, FULL);
    assert_eq!(adapter.store().live_entries(), 4);
    // One new key fits in the slot left.
    assert!(ask(&adapter, &clock, &id("a"), 3).await.is_allowed());
    assert_eq!(both(4).await, FULL);
    // Subject 3 now holds `a` and needs a slot for `b`: none is left.
    assert_eq!(both(3).await, FULL);
    // Held subjects' sets are decided as before.
    let again = both(1).await;
    let Ok(set) = again else { panic!("{again:?}") };
    assert!(set.allowed());
    assert!(set.decisions().iter().all(|decision| decision.remaining == 3));
    assert_eq!(adapter.store().live_entries(), 5);
}

/// A shadow policy never refuses a set, a full store neither (found from
/// outside): with no slot for its new key it is decided on a fresh budget
/// and left unstored, while the enforced policy decides; an enforced
/// policy's new key still needs its slot.
#[tokio::test]
async fn a_shadow_policys_new_key_without_a_slot_leaves_the_set_to_the_enforced_ones() {
    let a = policy("a", fixed(5, 60_000), EvaluationDedupPolicy::Disabled);
    let shadow = RateLimitPolicy::builder("s", fixed(2, 60_000))
        .mode(shared_contract::PolicyMode::Shadow)
        .evaluation_dedup(EvaluationDedupPolicy::Disabled)
        .build()
        .unwrap();
    let (adapter, clock) = bounded(1, 4, vec![a, shadow]);
    let set = PolicySet::new(vec![id("a"), id("s")]).unwrap();
    let both = |n: u64, evaluation: u128| {
        let mut asked = request(&clock, &id("a"), subject(n), evaluation);
        asked.policies = set.clone().into();
        adapter.evaluate(asked)
    };
    // Subject 1 takes `a` alone; subjects 2 to 4 fill the other slots.
    assert!(ask(&adapter, &clock, &id("a"), 1).await.is_allowed());
    for n in 2..=4 {
        assert!(ask(&adapter, &clock, &id("a"), n).await.is_allowed());
    }
    assert_eq!(adapter.store().live_entries(), 4);
    // Subject 1's set needs a slot for `s` only: decided by `a`, 5 - 2 = 3
    // left; `s` on a fresh budget (2 - 1), not stored.
    for (evaluation, left) in [(900, 3), (901, 2)] {
        let Ok(decided) = both(1, evaluation).await else { panic!("decided") };
        assert!(decided.allowed());
        assert_eq!(decided.decisions()[0].remaining, left);
        assert_eq!(decided.decisions()[1].remaining, 1, "a fresh shadow budget each time");
    }
    assert_eq!(adapter.store().live_entries(), 4);
    // Subject 5 needs `a`'s key too: refused.
    assert_eq!(both(5, 902).await, FULL);
}

/// In-flight leases count under their key: a flood of distinct subjects
/// taking leases is bounded by the same key bound, and each key holds at
/// most `max-in-flight` leases.
#[tokio::test]
async fn a_flood_of_distinct_subjects_never_holds_more_keys_than_the_bound() {
    const FLOOD: u64 = 200_000;
    const MAX_KEYS: usize = 20_000;
    let leases = Algorithm::Concurrency(shared_contract::Concurrency {
        max_in_flight: 2,
        lease_ttl: Duration::from_secs(30),
        retry_after: Duration::from_secs(1),
    });
    let policies =
        vec![five_a_minute("rate"), policy("leases", leases, EvaluationDedupPolicy::Disabled)];
    let (adapter, clock) = bounded(16, MAX_KEYS, policies);
    let store = adapter.store().clone();
    assert_eq!(store.max_keys(), MAX_KEYS, "16 shards of 1,250");
    let (rate, leased) = (id("rate"), id("leases"));
    let mut admitted = 0;
    for n in 0..FLOOD {
        // Half the flood takes leases, half spends a rate budget.
        let policy = if n % 2 == 0 { &rate } else { &leased };
        let outcome = ask(&adapter, &clock, policy, n).await;
        match outcome {
            Ok(set) if set.allowed() => admitted += 1,
            other => assert_eq!(other, FULL, "subject {n}"),
        }
        if n % 1_000 == 0 {
            assert!(store.live_entries() <= MAX_KEYS, "{} at {n}", store.live_entries());
        }
    }
    // The keys of a minute's window and of 30 s leases are neither
    // expired nor whole inside this second: the store fills and stops.
    assert_eq!(store.live_entries(), MAX_KEYS);
    assert_eq!(admitted, MAX_KEYS);
    assert_eq!(store.refused_keys(), FLOOD - MAX_KEYS as u64);
}
