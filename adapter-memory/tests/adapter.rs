//! Adapter behaviour the provider-neutral contract suite does not pin:
//! construction errors, shared stores across reloads, and that rejected
//! requests never create state.

mod support;

use std::sync::Arc;
use std::time::Duration;

use adapter_memory::{MemoryAdapterError, MemoryEdgeRateLimitAdapter, MemoryStore};
use shared_contract::{
    Algorithm, Certainty, Clock, EdgeRateLimitPort, EvaluationDedupPolicy, IncompatibleCategory,
    ManualClock, RateLimitFailure, RateLimitPolicy, UnavailableCategory,
};
use support::{T0, adapter, decision, fixed, id, policy, request, subject};

fn revision(id: &str, revision: u32, limit: u64) -> RateLimitPolicy {
    RateLimitPolicy::builder(id, fixed(limit, 60_000))
        .revision(revision)
        .evaluation_dedup(EvaluationDedupPolicy::Disabled)
        .build()
        .unwrap()
}

#[test]
fn duplicate_policy_ids_are_rejected() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let twice = vec![revision("orders", 1, 5), revision("orders", 2, 5)];
    let error = MemoryEdgeRateLimitAdapter::new(twice, clock).unwrap_err();
    assert_eq!(error, MemoryAdapterError::DuplicatePolicy(id("orders")));
    assert!(error.to_string().contains("`orders`"), "{error}");
}

#[test]
fn an_adapter_without_policies_is_rejected() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let error = MemoryEdgeRateLimitAdapter::new(Vec::new(), clock).unwrap_err();
    assert_eq!(error, MemoryAdapterError::NoPolicies);
}

#[tokio::test]
async fn rejected_requests_create_no_state() {
    let (adapter, clock) = adapter(vec![revision("p", 1, 5)]);
    let adapter = adapter.with_failure_retry_after(Duration::from_millis(1_500));
    let mut unknown = request(&clock, &id("p"), subject(1), 1);
    unknown.policies = shared_contract::PolicySet::single(id("other")).into();
    assert_eq!(
        adapter.evaluate(unknown).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::UnknownPolicy })
    );
    for cost in [0, 2] {
        let mut costly = request(&clock, &id("p"), subject(1), 2);
        costly.cost = cost;
        assert_eq!(
            adapter.evaluate(costly).await,
            Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::CostExceedsMaximum
            })
        );
    }
    let mut late = request(&clock, &id("p"), subject(1), 3);
    late.deadline = clock.monotonic();
    assert_eq!(
        adapter.evaluate(late).await,
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::AdmissionRejected,
            retry_after: Duration::from_millis(1_500),
        })
    );
    assert_eq!(adapter.store().live_entries(), 0);
    assert!(adapter.is_ready().await);
    assert_eq!(adapter.policy(&id("p")).map(RateLimitPolicy::revision), Some(1));
    assert!(adapter.policy(&id("other")).is_none());
}

#[tokio::test]
async fn a_reload_over_the_same_store_keeps_counters_but_a_new_revision_starts_afresh() {
    let store = MemoryStore::with_shards(4);
    let clock = ManualClock::new(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let first = MemoryEdgeRateLimitAdapter::with_store(
        store.clone(),
        vec![revision("p", 1, 5)],
        Arc::clone(&shared),
    )
    .unwrap();
    for n in 0..3 {
        let _ = first.evaluate(request(&clock, &id("p"), subject(1), n)).await;
    }
    // Same id and revision: the reloaded adapter continues the count.
    let reloaded = MemoryEdgeRateLimitAdapter::with_store(
        store.clone(),
        vec![revision("p", 1, 5), revision("q", 1, 5)],
        Arc::clone(&shared),
    )
    .unwrap();
    let same = decision(reloaded.evaluate(request(&clock, &id("p"), subject(1), 10)).await);
    assert_eq!(same.remaining, 1);
    // A new revision never reads the old counter.
    let bumped =
        MemoryEdgeRateLimitAdapter::with_store(store.clone(), vec![revision("p", 2, 5)], shared)
            .unwrap();
    let fresh = decision(bumped.evaluate(request(&clock, &id("p"), subject(1), 11)).await);
    assert_eq!(fresh.remaining, 4);
    assert_eq!(store.live_entries(), 2);
}

#[tokio::test]
async fn changing_the_algorithm_under_the_same_revision_is_state_incompatible() {
    let store = MemoryStore::with_shards(1);
    let clock = ManualClock::new(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let window = MemoryEdgeRateLimitAdapter::with_store(
        store.clone(),
        vec![revision("p", 1, 5)],
        Arc::clone(&shared),
    )
    .unwrap();
    let _ = window.evaluate(request(&clock, &id("p"), subject(1), 1)).await;
    let bucket = Algorithm::TokenBucket(shared_contract::TokenBucket {
        capacity: 5,
        refill_tokens: 1,
        refill_period: Duration::from_secs(1),
    });
    let changed = MemoryEdgeRateLimitAdapter::with_store(
        store,
        vec![policy("p", bucket, EvaluationDedupPolicy::Disabled)],
        shared,
    )
    .unwrap();
    assert_eq!(
        changed.evaluate(request(&clock, &id("p"), subject(1), 2)).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible })
    );
}

#[tokio::test]
async fn a_replay_is_described_with_the_algorithms_certainty() {
    let sliding = Algorithm::SlidingCounter(shared_contract::SlidingCounter {
        limit: 5,
        window: Duration::from_secs(1),
    });
    let (adapter, clock) =
        adapter(vec![policy("p", sliding, EvaluationDedupPolicy::enabled_defaults())]);
    let first = decision(adapter.evaluate(request(&clock, &id("p"), subject(1), 1)).await);
    let replay = decision(adapter.evaluate(request(&clock, &id("p"), subject(1), 1)).await);
    let described = adapter.policy(&id("p")).unwrap().algorithm().certainty();
    assert_eq!(described, Certainty::ApproximateAlgorithm);
    assert!(replay.replayed && !first.replayed);
    assert_eq!(replay.remaining, first.remaining);
}
