//! The check rig: a fresh store scope, a manual clock at `T0` and a provider
//! built over both, plus the helpers every check uses to ask a question and
//! to state the answer the spec expects.

use std::sync::Arc;
use std::time::Duration;

use shared_contract::{
    Algorithm, Certainty, Clock, EdgeRateLimitPort, EvaluationId, ManualClock, OperationDigest,
    PolicyId, PolicyMode, PolicySet, RateLimitDecision, RateLimitFailure, RateLimitOutcome,
    RateLimitPolicy, RateLimitPolicyBuilder, RateLimitRequest, SetDecision, SubjectDigest,
};

use crate::factory::ProviderFactory;
use crate::scope::StoreScope;

/// Where every check's clock starts: a multiple of 3_600_000 ms (one hour),
/// so every window the checks use (1 ms up to one hour, dividing it) starts
/// exactly at `T0`. 1_800_000_000_000 / 3_600_000 = 500_000.
pub(crate) const T0: u64 = 1_800_000_000_000;

/// How far in the future every request's deadline lies.
const DEADLINE_BUDGET: Duration = Duration::from_secs(5);

/// Cleanup grace of every check policy. A real store expires keys in real
/// time, not on the manual clock, so the grace keeps each key alive for the
/// whole (real) duration of a check. The grace changes no answer: it only
/// lengthens how long a key outlives the moment its absence would mean the
/// same as its state.
const CHECK_GRACE: Duration = Duration::from_secs(60);

/// A subject digest (version 1, a 16-byte tag, `v1:<32 hex>`) derived
/// from a readable name (FNV-1a, 128 bit), so checks talk about "alice"
/// and providers see a pseudonym.
pub(crate) fn subject(name: &str) -> SubjectDigest {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let hash =
        name.bytes().fold(OFFSET, |hash, byte| (hash ^ u128::from(byte)).wrapping_mul(PRIME));
    match SubjectDigest::from_tag(1, &hash.to_be_bytes()) {
        Ok(digest) => digest,
        Err(error) => panic!("a 16-byte tag is valid by construction: {error}"),
    }
}

/// The operation of every request a check makes unless it names one: a
/// 64-bit digest, as the edge computes one (16 hex digits in a key).
pub(crate) fn operation(name: &str) -> OperationDigest {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    OperationDigest::from_u64(hash)
}

/// The operation single-policy checks run under.
pub(crate) const DEFAULT_OPERATION: &str = "GET /contract";

/// A policy id the checks know is valid.
pub(crate) fn policy_id(id: &str) -> PolicyId {
    match PolicyId::new(id) {
        Ok(id) => id,
        Err(error) => panic!("check policy id {id:?}: {error}"),
    }
}

/// Whole milliseconds.
pub(crate) const fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// A fixed-window policy with the check defaults.
pub(crate) fn fixed_window(id: &str, limit: u64, window_ms: u64) -> RateLimitPolicyBuilder {
    with_check_defaults(
        id,
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit, window: ms(window_ms) }),
    )
}

/// A sliding-counter policy with the check defaults.
pub(crate) fn sliding_counter(id: &str, limit: u64, window_ms: u64) -> RateLimitPolicyBuilder {
    with_check_defaults(
        id,
        Algorithm::SlidingCounter(shared_contract::SlidingCounter { limit, window: ms(window_ms) }),
    )
}

/// A token-bucket policy with the check defaults.
pub(crate) fn token_bucket(
    id: &str,
    capacity: u64,
    refill_tokens: u64,
    refill_period_ms: u64,
) -> RateLimitPolicyBuilder {
    with_check_defaults(
        id,
        Algorithm::TokenBucket(shared_contract::TokenBucket {
            capacity,
            refill_tokens,
            refill_period: ms(refill_period_ms),
        }),
    )
}

/// A GCRA policy with the check defaults: `limit` per `period_ms`, `burst`
/// at once.
pub(crate) fn gcra(id: &str, limit: u64, period_ms: u64, burst: u64) -> RateLimitPolicyBuilder {
    with_check_defaults(
        id,
        Algorithm::Gcra(shared_contract::Gcra { limit, period: ms(period_ms), burst }),
    )
}

/// A concurrency policy with the check defaults: `max_in_flight` leases at
/// once, each held at most `lease_ttl_ms`, a refusal telling `retry_ms`.
pub(crate) fn concurrency(
    id: &str,
    max_in_flight: u64,
    lease_ttl_ms: u64,
    retry_ms: u64,
) -> RateLimitPolicyBuilder {
    with_check_defaults(
        id,
        Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight,
            lease_ttl: ms(lease_ttl_ms),
            retry_after: ms(retry_ms),
        }),
    )
}

/// A calendar-window policy with the check defaults: `limit` per calendar
/// `period` in Europe/Berlin (the zone of the worked numbers).
pub(crate) fn calendar_window(
    id: &str,
    limit: u64,
    period: shared_contract::CalendarPeriod,
) -> RateLimitPolicyBuilder {
    let time_zone = "Europe/Berlin".parse().expect("a zone of the bundled database");
    with_check_defaults(
        id,
        Algorithm::CalendarWindow(shared_contract::CalendarWindow { limit, period, time_zone }),
    )
}

fn with_check_defaults(id: &str, algorithm: Algorithm) -> RateLimitPolicyBuilder {
    RateLimitPolicy::builder(id, algorithm).cleanup_grace(CHECK_GRACE)
}

/// A validated policy plus the expected-answer builders for it.
#[derive(Debug, Clone)]
pub(crate) struct CheckPolicy(RateLimitPolicy);

impl CheckPolicy {
    /// Validates a check's policy; a check with an invalid policy is a bug
    /// in the suite, so it panics.
    pub(crate) fn new(builder: RateLimitPolicyBuilder) -> Self {
        match builder.build() {
            Ok(policy) => Self(policy),
            Err(error) => panic!("check policy must be valid: {error}"),
        }
    }

    pub(crate) fn id(&self) -> &PolicyId {
        self.0.id()
    }

    pub(crate) fn policy(&self) -> &RateLimitPolicy {
        &self.0
    }

    /// Only the sliding counter is approximate (docs/algorithms.md#sliding-counter).
    pub(crate) fn certainty(&self) -> Certainty {
        self.0.algorithm().certainty()
    }

    fn decision(
        &self,
        allowed: bool,
        remaining: u64,
        retry_ms: u64,
        reset_ms: u64,
    ) -> RateLimitDecision {
        RateLimitDecision {
            allowed,
            remaining,
            retry_after_ms: retry_ms,
            reset_after_ms: reset_ms,
            replayed: false,
        }
    }

    /// A charged evaluation.
    pub(crate) fn allowed(&self, remaining: u64, reset_ms: u64) -> RateLimitOutcome {
        single(self.allows(remaining, reset_ms))
    }

    /// A denial.
    pub(crate) fn denied(&self, remaining: u64, retry_ms: u64, reset_ms: u64) -> RateLimitOutcome {
        single(self.denies(remaining, retry_ms, reset_ms))
    }

    /// A replay of a recorded charge: the recorded remaining and reset-after.
    pub(crate) fn replayed(&self, remaining: u64, reset_ms: u64) -> RateLimitOutcome {
        single(self.replays(remaining, reset_ms))
    }

    /// This policy's decision inside a set: it allows (charged when the set
    /// is admitted, its budget as it stands otherwise).
    pub(crate) fn allows(&self, remaining: u64, reset_ms: u64) -> RateLimitDecision {
        self.decision(true, remaining, 0, reset_ms)
    }

    /// This policy's decision inside a set: it denies.
    pub(crate) fn denies(&self, remaining: u64, retry_ms: u64, reset_ms: u64) -> RateLimitDecision {
        self.decision(false, remaining, retry_ms, reset_ms)
    }

    /// This policy's decision inside a set: replayed from its record.
    pub(crate) fn replays(&self, remaining: u64, reset_ms: u64) -> RateLimitDecision {
        RateLimitDecision { replayed: true, ..self.decision(true, remaining, 0, reset_ms) }
    }
}

/// One check's world: its scope, its clock and the provider under test.
pub(crate) struct Rig<'f> {
    factory: &'f dyn ProviderFactory,
    scope: StoreScope,
    clock: ManualClock,
    port: Arc<dyn EdgeRateLimitPort>,
}

impl<'f> Rig<'f> {
    /// A provider holding `policies` over a fresh scope, clock at `T0`.
    pub(crate) async fn start(factory: &'f dyn ProviderFactory, policies: &[&CheckPolicy]) -> Self {
        let scope = StoreScope::fresh();
        let clock = ManualClock::new(T0);
        let port = factory.build(&scope, clock.clone(), owned(policies)).await;
        Self { factory, scope, clock, port }
    }

    /// Replaces the provider with one holding `policies` over the same scope
    /// and clock, as a redeploy with a new configuration would.
    pub(crate) async fn rebuild(&mut self, policies: &[&CheckPolicy]) {
        self.port = self.factory.build(&self.scope, self.clock.clone(), owned(policies)).await;
    }

    /// Sets the wall clock to `T0 + offset_ms` (the monotonic clock, which
    /// deadlines use, stays where it is).
    pub(crate) fn at(&self, offset_ms: u64) {
        self.clock.set_epoch_millis(T0 + offset_ms);
    }

    pub(crate) fn clock(&self) -> &ManualClock {
        &self.clock
    }

    pub(crate) fn port(&self) -> &dyn EdgeRateLimitPort {
        &*self.port
    }

    /// A request with the deadline 5 s ahead of the monotonic clock.
    pub(crate) fn request(
        &self,
        policy: &PolicyId,
        who: &str,
        cost: u64,
        id: EvaluationId,
    ) -> RateLimitRequest<'static> {
        RateLimitRequest {
            policies: PolicySet::single(policy.clone()).into(),
            subject: subject(who),
            operation: operation(DEFAULT_OPERATION),
            cost,
            evaluation_id: id,
            deadline: self.clock.monotonic() + DEADLINE_BUDGET,
        }
    }

    /// A request under the set `policies` (in that order) for the operation
    /// named `on`, with the deadline 5 s ahead.
    pub(crate) fn set_request(
        &self,
        policies: &[&CheckPolicy],
        on: &str,
        who: &str,
        cost: u64,
        id: EvaluationId,
    ) -> RateLimitRequest<'static> {
        let ids = policies.iter().map(|policy| policy.id().clone());
        let policies = match PolicySet::new(ids) {
            Ok(set) => set,
            Err(error) => panic!("a check's policy set must be valid: {error}"),
        };
        RateLimitRequest {
            policies: policies.into(),
            subject: subject(who),
            operation: operation(on),
            cost,
            evaluation_id: id,
            deadline: self.clock.monotonic() + DEADLINE_BUDGET,
        }
    }

    /// Asks under a set with the given id and asserts the whole outcome.
    pub(crate) async fn expect_set(
        &self,
        what: &str,
        request: RateLimitRequest<'_>,
        expected: RateLimitOutcome,
    ) {
        let ids: Vec<_> = request.policies.ids().iter().map(PolicyId::as_str).collect();
        let actual = self.ask(request.clone()).await;
        assert_eq!(actual, expected, "{what}: set {ids:?} cost {} at {}", request.cost, self.now());
    }

    pub(crate) async fn ask(&self, request: RateLimitRequest<'_>) -> RateLimitOutcome {
        self.port.evaluate(request).await
    }

    /// Asks with a fresh evaluation id and asserts the whole outcome.
    pub(crate) async fn expect(
        &self,
        what: &str,
        policy: &CheckPolicy,
        who: &str,
        cost: u64,
        expected: RateLimitOutcome,
    ) {
        self.expect_id(what, policy, who, cost, EvaluationId::random(), expected).await;
    }

    /// Asks with the given evaluation id and asserts the whole outcome.
    pub(crate) async fn expect_id(
        &self,
        what: &str,
        policy: &CheckPolicy,
        who: &str,
        cost: u64,
        id: EvaluationId,
        expected: RateLimitOutcome,
    ) {
        let actual = self.ask(self.request(policy.id(), who, cost, id)).await;
        assert_eq!(
            actual,
            expected,
            "{what}: {who} cost {cost} under {} at {}",
            policy.id(),
            self.now()
        );
    }

    /// Asks with a fresh id and returns the decision, whatever it is.
    pub(crate) async fn decide(
        &self,
        policy: &CheckPolicy,
        who: &str,
        cost: u64,
    ) -> RateLimitDecision {
        let outcome = self.ask(self.request(policy.id(), who, cost, EvaluationId::random())).await;
        match outcome {
            Ok(set) => one_decision(&set),
            Err(RateLimitFailure::Unavailable { .. })
            | Err(RateLimitFailure::Incompatible { .. })
            | Err(RateLimitFailure::Indeterminate { .. }) => panic!(
                "{who} cost {cost} under {} at {}: expected a decision, got {outcome:?}",
                policy.id(),
                self.now()
            ),
        }
    }

    /// Charges `count` requests of cost 1, each of which must be allowed.
    pub(crate) async fn drain(&self, policy: &CheckPolicy, who: &str, count: u64) {
        for n in 1..=count {
            let decision = self.decide(policy, who, 1).await;
            assert!(
                decision.allowed,
                "request {n} of {count} for {who} at {}: {decision:?}",
                self.now()
            );
        }
    }

    /// The wall clock as `T0+<ms>` for failure messages.
    pub(crate) fn now(&self) -> String {
        let offset = i128::from(self.clock.epoch_millis()) - i128::from(T0);
        format!("T0{offset:+}ms")
    }
}

/// The outcome of a set of one policy: its decision decides.
fn single(decision: RateLimitDecision) -> RateLimitOutcome {
    Ok(SetDecision::single(decision))
}

/// The outcome of a set: `admitted`, with one decision per policy in order.
/// A set admitted despite a denial holds that denial under a shadow policy.
pub(crate) fn set_outcome(admitted: bool, decisions: &[RateLimitDecision]) -> RateLimitOutcome {
    let mode = |decision: &RateLimitDecision| {
        if admitted && !decision.allowed { PolicyMode::Shadow } else { PolicyMode::Enforce }
    };
    let set = SetDecision::of_members(decisions.iter().map(|decision| (mode(decision), *decision)));
    assert_eq!(set.allowed(), admitted, "an expected set admits as its members say");
    Ok(set)
}

fn owned(policies: &[&CheckPolicy]) -> Vec<RateLimitPolicy> {
    policies.iter().map(|policy| policy.policy().clone()).collect()
}

/// The decision of a set of one policy, which must agree with the set's
/// verdict.
pub(crate) fn one_decision(set: &SetDecision) -> RateLimitDecision {
    match set.decisions() {
        [decision] if decision.allowed == set.allowed() => *decision,
        other => {
            panic!("a set of one enforced policy answers with its one decision, got {other:?}")
        }
    }
}

/// The winners' `remaining` values of a batch, sorted, and how many were
/// denied, for the concurrency checks.
pub(crate) fn tally(outcomes: &[RateLimitOutcome]) -> (Vec<u64>, usize) {
    let mut remaining = Vec::new();
    let mut denied = 0;
    for outcome in outcomes {
        match outcome {
            Ok(set) if set.allowed() => {
                remaining.push(one_decision(set).remaining);
            }
            Ok(_) => denied += 1,
            Err(_) => panic!("a concurrent evaluation got no decision: {outcome:?}"),
        }
    }
    remaining.sort_unstable();
    (remaining, denied)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn t0_is_a_multiple_of_every_window_the_checks_use() {
        for window in [1, 10, 30, 100, 1_000, 10_000, 60_000, 3_600_000] {
            assert_eq!(T0 % window, 0, "window {window}");
        }
    }

    #[test]
    fn subjects_are_valid_distinct_and_stable() {
        let names = ["alice", "bob", "carol", "p7-e0", "p7-e250", "a", "b", ""];
        let digests: HashSet<String> = names.iter().map(|n| subject(n).to_string()).collect();
        assert_eq!(digests.len(), names.len());
        assert_eq!(subject("alice"), subject("alice"));
        let text = subject("alice").to_string();
        assert!(text.starts_with("v1:"));
        assert_eq!(text.len(), 3 + 32);
    }

    #[test]
    fn subject_of_the_empty_name_is_the_fnv_offset_basis() {
        // FNV-1a of no bytes is the offset basis itself.
        assert_eq!(subject("").to_string(), "v1:6c62272e07bb014262b821756295c58d");
    }

    #[test]
    fn check_policies_carry_the_check_grace() {
        let policy = CheckPolicy::new(fixed_window("fw", 3, 1000));
        assert_eq!(policy.policy().cleanup_grace(), CHECK_GRACE);
        assert_eq!(policy.policy().maximum_clock_regression(), Duration::from_secs(1));
    }

    #[test]
    fn expected_answers_carry_what_varies_and_their_policy_the_rest() {
        let fixed = CheckPolicy::new(fixed_window("fw", 3, 1000));
        let sliding = CheckPolicy::new(sliding_counter("sc", 10, 1000));
        let bucket = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
        let Ok(allowed) = fixed.allowed(2, 750) else {
            panic!("allowed() must build a decision");
        };
        let allowed = one_decision(&allowed);
        assert_eq!(
            allowed,
            RateLimitDecision {
                allowed: true,
                remaining: 2,
                retry_after_ms: 0,
                reset_after_ms: 750,
                replayed: false,
            }
        );
        let Ok(denied) = sliding.denied(0, 1, 750) else {
            panic!("denied() must build a decision");
        };
        let denied = one_decision(&denied);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 1);
        assert_eq!(sliding.policy().limit(), 10);
        assert_eq!(sliding.certainty(), Certainty::ApproximateAlgorithm);
        let Ok(replayed) = bucket.replayed(4, 100) else {
            panic!("replayed() must build a decision");
        };
        let replayed = one_decision(&replayed);
        assert!(replayed.allowed && replayed.replayed);
        assert_eq!((bucket.policy().limit(), bucket.certainty()), (5, Certainty::Certain));
    }

    #[test]
    fn tally_counts_winners_and_losers() {
        let policy = CheckPolicy::new(fixed_window("fw", 3, 1000));
        let outcomes = [
            policy.allowed(1, 10),
            policy.denied(0, 5, 5),
            policy.allowed(0, 10),
            policy.allowed(2, 10),
        ];
        assert_eq!(tally(&outcomes), (vec![0, 1, 2], 1));
    }
}
