//! A flood of one-shot subjects must not grow memory without bound: once
//! their keys expire, both `purge_expired` and ordinary traffic reclaim them.

mod support;

use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use shared_contract::{EdgeRateLimitPort, EvaluationDedupPolicy, ManualClock};
use support::{T0, adapter, fixed, id, policy, request, subject};

const FLOOD: u64 = 1_000_000;
/// Fixed window of 1 s starting at T0, dedupe off, default grace and
/// regression bound of 1 s: every flood key expires at T0 + 1000 + 1000
/// (docs/algorithms.md, step 7). Dedupe is off to keep the flood quick in a
/// debug build; records die with their key either way.
const LIFETIME_MS: u64 = 2_000;

fn flood_adapter() -> (MemoryEdgeRateLimitAdapter, ManualClock) {
    adapter(vec![policy("flood", fixed(10, 1_000), EvaluationDedupPolicy::Disabled)])
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
