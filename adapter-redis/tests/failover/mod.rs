//! What the failover tests (Cluster, Sentinel, WAIT) share: one
//! evaluation's budget, and the only outcomes a failover may give, tallied.

#![allow(dead_code, unreachable_pub, reason = "each test binary uses a different part")]

use std::time::{Duration, Instant};

use adapter_redis::RedisEdgeRateLimitAdapter;
use shared_contract::{
    Algorithm, Clock, EdgeRateLimitPort, EvaluationId, ManualClock, OperationDigest, PolicyId,
    PolicySet, RateLimitFailure, RateLimitPolicy, RateLimitRequest, SubjectDigest,
    UnavailableCategory,
};

/// A limit no test reaches: every charge stays visible as a count.
pub const LIMIT: u64 = 1_000_000;
/// Each evaluation's deadline, as the HTTP edge would give it.
pub const BUDGET: Duration = Duration::from_millis(500);
/// Scheduling slack on a busy CI machine beyond the deadline.
pub const SLACK: Duration = Duration::from_millis(250);

/// The policy every failover test counts with: a one-hour fixed window of
/// [`LIMIT`], cost 1, dedupe at its defaults, so each charge stays visible
/// as a count for the whole test.
pub fn counting_policy(id: &str) -> RateLimitPolicy {
    RateLimitPolicy::builder(
        id,
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: LIMIT,
            window: Duration::from_secs(3_600),
        }),
    )
    .build()
    .unwrap()
}

/// The increments acknowledged across a failover and those it lost, from
/// the `count` the promoted master
/// holds after the `steady`, `hammered` and `during` traffic. The count
/// carries over less what asynchronous replication lost, and an increment
/// that ran but answered Indeterminate may add to it: never more than
/// every charge that may have run.
pub fn lost(count: u64, steady: Tally, hammered: Tally, during: Tally) -> (u64, u64) {
    let acknowledged = steady.allowed + hammered.allowed + during.allowed;
    let maybe_ran = hammered.indeterminate + during.indeterminate;
    assert!(
        count <= acknowledged + maybe_ran,
        "count {count} exceeds every charge that may have run"
    );
    (acknowledged, acknowledged.saturating_sub(count))
}

/// Tallies of the outcomes seen, by kind.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub allowed: u64,
    pub before_send: u64,
    pub indeterminate: u64,
}

impl Tally {
    pub fn add(&mut self, other: Tally) {
        self.allowed += other.allowed;
        self.before_send += other.before_send;
        self.indeterminate += other.indeterminate;
    }

    /// One evaluation of `policy` (limit [`LIMIT`]) for `subject`: it must
    /// come back within its deadline (plus slack) as a decision,
    /// `UnavailableBeforeSend` or `Indeterminate`, never a hang, a panic or
    /// another category. Returns the count after an allowed decision.
    pub async fn evaluate(
        &mut self,
        adapter: &RedisEdgeRateLimitAdapter,
        clock: &ManualClock,
        policy: &PolicyId,
        subject: &SubjectDigest,
    ) -> Option<u64> {
        let request = RateLimitRequest {
            policies: PolicySet::single(policy.clone()).into(),
            subject: *subject,
            operation: OperationDigest::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
            cost: 1,
            evaluation_id: EvaluationId::random(),
            deadline: clock.monotonic() + BUDGET,
        };
        let started = Instant::now();
        let outcome = adapter.evaluate(request).await;
        let took = started.elapsed();
        assert!(took <= BUDGET + SLACK, "an evaluation took {took:?}: {outcome:?}");
        match outcome {
            Ok(set) if set.allowed() => {
                self.allowed += 1;
                Some(LIMIT - set.decisions()[0].remaining)
            }
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::UnavailableBeforeSend,
                ..
            }) => {
                self.before_send += 1;
                None
            }
            Err(RateLimitFailure::Indeterminate { .. }) => {
                self.indeterminate += 1;
                None
            }
            other => panic!("an unexpected outcome during failover: {other:?}"),
        }
    }
}
