//! A flood of one-shot subjects in a store sized to hold them all: once
//! their keys expire, both `purge_expired` and ordinary traffic reclaim
//! them. (A store too small for a flood refuses it: `tests/bound.rs`.)

mod support;

use std::time::Duration;

use std::num::NonZeroUsize;
use std::sync::Arc;

use adapter_memory::{MemoryEdgeRateLimitAdapter, MemoryStore};
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, HELD_LEASE_BYTES, ManualClock,
    RateLimitOutcomeExt,
};
use support::{T0, adapter, fixed, id, policy, request, subject};

const FLOOD: u64 = 1_000_000;
/// Fixed window of 1 s starting at T0, dedupe off, default grace and
/// regression bound of 1 s: every flood key expires at T0 + 1000 + 1000
/// (docs/algorithms.md, step 7). Dedupe is off to keep the flood quick in a
/// debug build; records die with their key either way.
const LIFETIME_MS: u64 = 2_000;

fn flood_adapter() -> (MemoryEdgeRateLimitAdapter, ManualClock) {
    let clock = ManualClock::new(T0);
    let flood = policy("flood", fixed(10, 1_000), EvaluationDedupPolicy::Disabled);
    // Room for the whole flood and the fresh subjects after it.
    let room = NonZeroUsize::new(2 * FLOOD as usize).expect("not 0");
    let store = MemoryStore::with_max_keys(room);
    let adapter = MemoryEdgeRateLimitAdapter::with_store(store, [flood], Arc::new(clock.clone()))
        .expect("adapter builds");
    (adapter, clock)
}

async fn flood(adapter: &MemoryEdgeRateLimitAdapter, clock: &ManualClock) {
    let policy = id("flood");
    for n in 0..FLOOD {
        let outcome = adapter.evaluate(request(clock, &policy, subject(n), u128::from(n))).await;
        assert!(outcome.is_allowed(), "{outcome:?}");
    }
    assert_eq!(adapter.store().live_entries(), 1_000_000);
}

#[tokio::test]
async fn purge_reclaims_a_million_expired_one_shot_subjects() {
    let (adapter, clock) = flood_adapter();
    flood(&adapter, &clock).await;
    assert_eq!(adapter.store().purge_expired(T0 + LIFETIME_MS - 1), 0);
    assert_eq!(adapter.store().live_entries(), 1_000_000);
    assert_eq!(adapter.store().purge_expired(T0 + LIFETIME_MS), 1_000_000);
    assert_eq!(adapter.store().live_entries(), 0);
}

#[tokio::test]
async fn ordinary_traffic_alone_reclaims_a_million_expired_subjects() {
    let (adapter, clock) = flood_adapter();
    flood(&adapter, &clock).await;
    clock.advance(Duration::from_millis(LIFETIME_MS));
    // A few thousand new subjects touch every shard; each shard's first
    // operation after the expiry finds it grown past its last sweep and
    // sweeps it. No purge_expired call.
    let policy = id("flood");
    let fresh = 4_000;
    for n in FLOOD..FLOOD + fresh {
        let outcome = adapter.evaluate(request(&clock, &policy, subject(n), u128::from(n))).await;
        assert!(outcome.is_allowed(), "{outcome:?}");
    }
    assert_eq!(adapter.store().live_entries(), 4_000);
}

/// Leases never released (an instance that crashed mid-request) hold no
/// memory past their TTL (+ the clock-regression bound): 100,000 subjects take one lease each of 1 s, and
/// one subject asks 10,000 times for 4 slots; the store holds exactly the
/// leases in flight, and nothing once the keys have expired.
#[tokio::test]
async fn unreleased_leases_are_bounded_and_reclaimed_after_their_ttl() {
    const SUBJECTS: u64 = 100_000;
    let leases = Algorithm::Concurrency(shared_contract::Concurrency {
        max_in_flight: 4,
        lease_ttl: Duration::from_millis(1_000),
        retry_after: Duration::from_millis(100),
    });
    let (adapter, clock) = adapter(vec![policy("leases", leases, EvaluationDedupPolicy::Disabled)]);
    let policy = id("leases");
    for n in 0..SUBJECTS {
        let outcome = adapter.evaluate(request(&clock, &policy, subject(n), u128::from(n))).await;
        assert!(outcome.is_allowed(), "{outcome:?}");
    }
    let hot = subject(SUBJECTS);
    let mut admitted = 0;
    for n in 0..10_000 {
        let request = request(&clock, &policy, hot, u128::from(SUBJECTS + n));
        admitted += u64::from(adapter.evaluate(request).await.is_allowed());
    }
    assert_eq!(admitted, 4, "4 in flight, the rest refused");
    let per_lease = u64::from(HELD_LEASE_BYTES);
    assert_eq!(adapter.store().stored_bytes(), (SUBJECTS + 4) * per_lease);
    // Each key lives to its lease's expiry (lease-ttl 1 s + the default
    // maximum-clock-regression 1 s) plus the 1 s grace: T0 + 3000.
    assert_eq!(adapter.store().purge_expired(T0 + 2_999), 0);
    assert_eq!(adapter.store().purge_expired(T0 + 3_000), 100_001);
    assert_eq!((adapter.store().live_entries(), adapter.store().stored_bytes()), (0, 0));
}
