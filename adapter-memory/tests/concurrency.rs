//! Many tasks racing on one key admit exactly the limit: the shard lock
//! makes each read-decide-write atomic.

mod support;

use std::sync::Arc;
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, ManualClock, RateLimitOutcomeExt,
};
use support::{adapter, fixed, id, policy, request, subject};

const TASKS: u64 = 64;
const PER_TASK: u64 = 50;

/// Runs TASKS x PER_TASK evaluations of one subject on a multi-threaded
/// runtime, with the clock frozen, and returns how many were allowed.
async fn race(adapter: MemoryEdgeRateLimitAdapter, clock: ManualClock, policy: &str) -> u64 {
    let adapter = Arc::new(adapter);
    let policy = id(policy);
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (adapter, clock, policy) = (Arc::clone(&adapter), clock.clone(), policy.clone());
        tasks.push(tokio::spawn(async move {
            let mut allowed = 0;
            for n in 0..PER_TASK {
                let evaluation = u128::from(task * PER_TASK + n);
                let outcome =
                    adapter.evaluate(request(&clock, &policy, subject(9), evaluation)).await;
                allowed += u64::from(outcome.is_allowed());
                tokio::task::yield_now().await;
            }
            allowed
        }));
    }
    let mut allowed = 0;
    for task in tasks {
        allowed += task.await.expect("task finished");
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tasks_on_one_key_admit_exactly_the_fixed_window_limit() {
    let (adapter, clock) = adapter(vec![policy(
        "race",
        fixed(1_000, 60_000),
        EvaluationDedupPolicy::enabled_defaults(),
    )]);
    assert_eq!(race(adapter, clock, "race").await, 1_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tasks_on_one_key_admit_exactly_the_token_bucket_capacity() {
    let bucket = Algorithm::TokenBucket(shared_contract::TokenBucket {
        capacity: 700,
        refill_tokens: 1,
        refill_period: Duration::from_secs(60),
    });
    let (adapter, clock) = adapter(vec![policy("race", bucket, EvaluationDedupPolicy::Disabled)]);
    assert_eq!(race(adapter, clock, "race").await, 700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tasks_on_one_key_admit_exactly_the_sliding_counter_limit() {
    let sliding = Algorithm::SlidingCounter(shared_contract::SlidingCounter {
        limit: 900,
        window: Duration::from_secs(60),
    });
    let (adapter, clock) = adapter(vec![policy("race", sliding, EvaluationDedupPolicy::Disabled)]);
    assert_eq!(race(adapter, clock, "race").await, 900);
}
