//! Dedupe at the record cap (docs/algorithms.md, "Order of an evaluation", steps 4
//! and 6): the oldest records are evicted first, the oldest survivor still
//! replays, an evicted id charges again, and expiry still counts from each
//! record's own time. Expected values follow from the spec's rules alone.

mod support;

use std::time::Duration;

use shared_contract::{DEDUP_RECORD_BYTES, EdgeRateLimitPort, EvaluationDedupPolicy, PolicyId};
use support::{T0, adapter, decision, fixed, id, policy, request, subject};

const LIMIT: u64 = 10_000;

async fn charge(
    adapter: &adapter_memory::MemoryEdgeRateLimitAdapter,
    clock: &shared_contract::ManualClock,
    policy: &PolicyId,
    n: u128,
) -> shared_contract::RateLimitDecision {
    decision(adapter.evaluate(request(clock, policy, subject(1), n)).await)
}

/// `cap` records at most; `evaluations` charged with ids 1..=evaluations,
/// then every id is repeated once, newest first.
async fn at_the_cap(dedup: EvaluationDedupPolicy, cap: u128, evaluations: u128) {
    assert_eq!(u128::from(dedup.record_capacity()), cap);
    let (adapter, clock) = adapter(vec![policy("p", fixed(LIMIT, 60_000), dedup)]);
    let p = id("p");
    clock.set_epoch_millis(T0 + 250);
    for n in 1..=evaluations {
        let fresh = charge(&adapter, &clock, &p, n).await;
        assert_eq!((fresh.allowed, fresh.replayed), (true, false), "id {n}");
        assert_eq!(fresh.remaining, LIMIT - u64::try_from(n).unwrap());
    }
    let mut charged = u64::try_from(evaluations).unwrap();
    // The newest `cap` ids survive and replay what they answered, the
    // oldest survivor (evaluations - cap + 1) included; nothing is charged.
    for n in (evaluations - cap + 1..=evaluations).rev() {
        let again = charge(&adapter, &clock, &p, n).await;
        assert_eq!((again.allowed, again.replayed), (true, true), "id {n}");
        assert_eq!(again.remaining, LIMIT - u64::try_from(n).unwrap(), "id {n}");
        assert_eq!(again.reset_after_ms, 59_750);
    }
    // An evicted id is a new evaluation: it charges again, and its new
    // record evicts the oldest survivor in turn.
    let evicted = evaluations - cap;
    let again = charge(&adapter, &clock, &p, evicted).await;
    charged += 1;
    assert_eq!((again.allowed, again.replayed), (true, false));
    assert_eq!(again.remaining, LIMIT - charged);
    let oldest = evaluations - cap + 1;
    let gone = charge(&adapter, &clock, &p, oldest).await;
    charged += 1;
    assert_eq!((gone.replayed, gone.remaining), (false, LIMIT - charged), "the oldest went first");
    // The re-charged evicted id now replays its second answer.
    let replay = charge(&adapter, &clock, &p, evicted).await;
    assert_eq!((replay.replayed, replay.remaining), (true, LIMIT - charged + 1));
}

#[tokio::test]
async fn the_default_cap_of_256_evicts_the_oldest_first() {
    at_the_cap(EvaluationDedupPolicy::enabled_defaults(), 256, 300).await;
}

#[tokio::test]
async fn max_entries_caps_the_records() {
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_secs(5),
        max_entries: 20,
        max_stored_bytes: 65_536,
    };
    at_the_cap(dedup, 20, 57).await;
}

#[tokio::test]
async fn max_stored_bytes_caps_the_records() {
    // 13 records of 40 bytes fit in 13 * 40 + 39 bytes; a 14th does not.
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_secs(5),
        max_entries: 256,
        max_stored_bytes: 13 * DEDUP_RECORD_BYTES + 39,
    };
    at_the_cap(dedup, 13, 40).await;
}

#[tokio::test]
async fn at_the_cap_each_record_still_expires_at_its_own_ttl() {
    // Records 1..=30 at T0 + 250 + n ms (cap 20: 11..=30 survive), ttl 100 ms.
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_millis(100),
        max_entries: 20,
        max_stored_bytes: 65_536,
    };
    let (adapter, clock) = adapter(vec![policy("p", fixed(LIMIT, 60_000), dedup)]);
    let p = id("p");
    for n in 1..=30u64 {
        clock.set_epoch_millis(T0 + 250 + n);
        assert!(charge(&adapter, &clock, &p, u128::from(n)).await.allowed);
    }
    // At T0 + 250 + 120, records written at or before T0 + 250 + 20 are
    // expired (written_at + ttl <= t): 11..=20 no longer replay, 21..=30 do.
    clock.set_epoch_millis(T0 + 250 + 120);
    for n in (21..=30u64).rev() {
        let again = charge(&adapter, &clock, &p, u128::from(n)).await;
        assert!(again.replayed, "id {n}");
        assert_eq!(again.remaining, LIMIT - n);
    }
    let expired = charge(&adapter, &clock, &p, 15).await;
    assert_eq!((expired.replayed, expired.remaining), (false, LIMIT - 31));
}
