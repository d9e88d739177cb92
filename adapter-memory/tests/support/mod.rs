//! Helpers shared by this crate's integration tests.

#![allow(dead_code, reason = "each test binary uses a different subset of these helpers")]

use std::sync::Arc;
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use shared_contract::{
    Algorithm, Clock, EvaluationDedupPolicy, EvaluationId, ManualClock, OperationDigest, PolicyId,
    PolicySet, RateLimitDecision, RateLimitFailure, RateLimitOutcome, RateLimitPolicy,
    RateLimitRequest, SubjectDigest,
};
use uuid::Uuid;

/// A start time that is a multiple of every window the tests use.
pub(crate) const T0: u64 = 1_800_000_000_000;

/// The digest of test subject `n`: `v1:` and 32 hex digits of `n`. Built by
/// hand because `format!` dominates a million-subject flood in debug builds.
pub(crate) fn subject(n: u64) -> SubjectDigest {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digest = String::with_capacity(35);
    digest.push_str("v1:0000000000000000");
    for shift in (0..16).rev() {
        digest.push(char::from(HEX[usize::try_from((n >> (shift * 4)) & 0xf).unwrap()]));
    }
    SubjectDigest::parse(digest).expect("valid digest")
}

/// A policy with dedupe off unless `dedup` says otherwise.
pub(crate) fn policy(
    id: &str,
    algorithm: Algorithm,
    dedup: EvaluationDedupPolicy,
) -> RateLimitPolicy {
    RateLimitPolicy::builder(id, algorithm).evaluation_dedup(dedup).build().expect("valid policy")
}

/// Fixed window `limit` per `window_ms`.
pub(crate) fn fixed(limit: u64, window_ms: u64) -> Algorithm {
    Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit,
        window: Duration::from_millis(window_ms),
    })
}

/// A request for `subject` with a unique evaluation id `id` and a deadline
/// one second after the clock's monotonic now.
pub(crate) fn request(
    clock: &ManualClock,
    policy: &PolicyId,
    subject: SubjectDigest,
    id: u128,
) -> RateLimitRequest<'static> {
    RateLimitRequest {
        policies: PolicySet::single(policy.clone()).into(),
        subject,
        operation: OperationDigest::from_u64(0x0000_0000_0000_00aa),
        cost: 1,
        evaluation_id: EvaluationId::from_uuid(Uuid::from_u128(id)),
        deadline: clock.monotonic() + Duration::from_secs(1),
    }
}

/// A policy id.
pub(crate) fn id(id: &str) -> PolicyId {
    PolicyId::new(id).expect("valid id")
}

/// An adapter over a fresh store with a manual clock at `T0`.
pub(crate) fn adapter(policies: Vec<RateLimitPolicy>) -> (MemoryEdgeRateLimitAdapter, ManualClock) {
    let clock = ManualClock::new(T0);
    let adapter =
        MemoryEdgeRateLimitAdapter::new(policies, Arc::new(clock.clone())).expect("adapter builds");
    (adapter, clock)
}

/// The decision of a decided outcome; anything else fails the test.
pub(crate) fn decision(outcome: RateLimitOutcome) -> RateLimitDecision {
    match outcome {
        Ok(set) => match set.decisions() {
            [decision] => *decision,
            other => panic!("a set of one policy has one decision, got {other:?}"),
        },
        other @ (Err(RateLimitFailure::Unavailable { .. })
        | Err(RateLimitFailure::Incompatible { .. })
        | Err(RateLimitFailure::Indeterminate { .. })) => {
            panic!("expected a decision, got {other:?}")
        }
    }
}
