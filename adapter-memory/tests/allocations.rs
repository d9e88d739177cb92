//! A decision of the memory provider allocates nothing on the heap once its
//! subject's key exists: counted by a counting global allocator over 10,000
//! decisions of a fixed-window policy, through the public port, the answer
//! taken at once as a front takes it.
//!
//! With evaluation dedupe on (the default), an admitted decision keeps a
//! record in its key, in a queue that grows (amortized, doubling) up to the
//! policy's record capacity: a key allocates while its queue grows, never
//! once it holds its capacity, which is what the second case counts.

mod support;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use shared_contract::{
    EdgeRateLimitPort, EvaluationDedupPolicy, RateLimitPolicy, RateLimitRequest, SubjectDigest,
};
use support::{adapter, fixed, request, subject};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

const DECISIONS: u64 = 10_000;

/// Heap blocks allocated while `run` runs.
fn allocations(run: impl FnOnce()) -> u64 {
    let before = dhat::HeapStats::get().total_blocks;
    run();
    dhat::HeapStats::get().total_blocks - before
}

/// Heap blocks `DECISIONS` decisions allocate, over `subjects` subjects in
/// turn, once `warm` decisions of each have stored its key (a new key takes
/// its slot in the store, which may grow it). Every decision is admitted.
/// The requests are built beforehand: a front builds its own.
fn decisions_allocate(policy: RateLimitPolicy, subjects: u64, warm: u64) -> u64 {
    let id = policy.id().clone();
    let (adapter, clock) = adapter(vec![policy]);
    let subjects: Vec<SubjectDigest> = (0..subjects).map(subject).collect();
    let requests = |ids: std::ops::Range<u64>| -> Vec<RateLimitRequest> {
        let who = |n: u64| subjects[usize::try_from(n).unwrap() % subjects.len()];
        ids.map(|n| request(&clock, &id, who(n), u128::from(n))).collect()
    };
    let warm = warm * subjects.len() as u64;
    for request in requests(0..warm) {
        assert!(decide(&adapter, request), "the warm-up is admitted");
    }
    let measured = requests(warm..warm + DECISIONS);
    let mut allowed = 0;
    let allocated = allocations(|| {
        for request in measured {
            allowed += u64::from(decide(&adapter, request));
        }
    });
    assert_eq!(allowed, DECISIONS, "every decision is admitted");
    allocated
}

/// One decision as the fronts take it: ready, not polled.
fn decide(adapter: &MemoryEdgeRateLimitAdapter, request: RateLimitRequest) -> bool {
    let answer = adapter.evaluate(request).into_ready().expect("the memory provider never waits");
    answer.expect("a decision").allowed()
}

/// A fixed window that admits everything here: a million a minute.
fn fixed_window() -> shared_contract::RateLimitPolicyBuilder {
    RateLimitPolicy::builder("p", fixed(1_000_000, 60_000))
}

#[test]
fn a_fixed_window_decision_allocates_nothing() {
    // One profiler at a time: both cases in one test.
    let _profiler = dhat::Profiler::builder().testing().build();
    let off = fixed_window().evaluation_dedup(EvaluationDedupPolicy::Disabled).build().unwrap();
    assert_eq!(decisions_allocate(off, DECISIONS, 1), 0, "dedupe off, 10,000 subjects");
    // The defaults: dedupe on, 256 records a key; ten subjects, each key
    // already at its record capacity.
    let defaults = fixed_window().build().unwrap();
    assert_eq!(defaults.evaluation_dedup().record_capacity(), 256);
    assert_eq!(decisions_allocate(defaults, 10, 260), 0, "dedupe on, keys at their capacity");
}
