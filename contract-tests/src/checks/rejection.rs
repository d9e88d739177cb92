//! Requests a provider must turn away before it reads any state
//! (docs/algorithms.md, "Order of an evaluation", steps 1 and 2), and the
//! port's two side methods, which must not touch budgets either.

use std::time::Duration;

use shared_contract::{
    Clock, EvaluationId, IncompatibleCategory, RateLimitFailure, RateLimitOutcome,
    UnavailableCategory,
};

use crate::factory::ProviderFactory;
use crate::rig::{CheckPolicy, Rig, fixed_window, policy_id, sliding_counter, token_bucket};

const UNKNOWN_POLICY: RateLimitOutcome =
    Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::UnknownPolicy });
const COST_EXCEEDS_MAXIMUM: RateLimitOutcome =
    Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::CostExceedsMaximum });

/// One policy of each algorithm at their check defaults (maximum cost as
/// given), and the answer of a first request of cost 1 at `T0` for each.
fn three(maximum_cost: u64) -> [CheckPolicy; 3] {
    [
        CheckPolicy::new(fixed_window("fw", 3, 1000).maximum_cost(maximum_cost)),
        CheckPolicy::new(sliding_counter("sc", 10, 1000).maximum_cost(maximum_cost)),
        CheckPolicy::new(token_bucket("tb", 5, 1, 100).maximum_cost(maximum_cost)),
    ]
}

/// A policy the provider does not hold is `Incompatible(UnknownPolicy)`,
/// and the held one is untouched.
pub async fn unknown_policy_is_incompatible(factory: &dyn ProviderFactory) {
    let [fw, _, _] = three(1);
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(0);
    let missing = policy_id("missing");
    let outcome = rig.ask(rig.request(&missing, "alice", 1, EvaluationId::random())).await;
    assert_eq!(outcome, UNKNOWN_POLICY, "unknown policy at {}", rig.now());
    // Ids match whole, never by prefix.
    let outcome =
        rig.ask(rig.request(&policy_id("fw.other"), "alice", 1, EvaluationId::random())).await;
    assert_eq!(outcome, UNKNOWN_POLICY, "an id that only shares a prefix");
    // fw: L = 3, W = 1000 at T0: remaining 2, 1, 0 with reset 1000.
    rig.expect("held policy", &fw, "alice", 1, fw.allowed(2, 1000)).await;
    rig.expect("held policy", &fw, "alice", 1, fw.allowed(1, 1000)).await;
    rig.expect("held policy", &fw, "alice", 1, fw.allowed(0, 1000)).await;
}

/// Cost 0 is `Incompatible(CostExceedsMaximum)` for every algorithm; the
/// full budget is still there afterwards and the evaluation id was not
/// recorded.
pub async fn cost_zero_is_incompatible_and_touches_nothing(factory: &dyn ProviderFactory) {
    let policies = three(1);
    let [fw, sc, tb] = &policies;
    let rig = Rig::start(factory, &[fw, sc, tb]).await;
    rig.at(0);
    // First charges at T0: fw 3 - 1 = 2 (reset 1000); sc 10 - 1 = 9 (reset
    // 1000); tb 5 - 1 = 4 (reset ceil(1 / 1) * 100 = 100).
    let fresh = [fw.allowed(2, 1000), sc.allowed(9, 1000), tb.allowed(4, 100)];
    for (policy, first) in policies.iter().zip(fresh) {
        let id = EvaluationId::random();
        rig.expect_id("cost 0", policy, "alice", 0, id, COST_EXCEEDS_MAXIMUM).await;
        rig.expect_id("same id, cost 1", policy, "alice", 1, id, first).await;
    }
}

/// A cost above the policy's maximum (even one within the limit) is
/// `Incompatible(CostExceedsMaximum)`; nothing is charged or recorded.
pub async fn cost_above_maximum_is_incompatible_and_touches_nothing(factory: &dyn ProviderFactory) {
    let policies = three(2);
    let [fw, sc, tb] = &policies;
    let rig = Rig::start(factory, &[fw, sc, tb]).await;
    rig.at(0);
    // Cost 2 at T0: fw 3 - 2 = 1; sc 10 - 2 = 8; tb 5 - 2 = 3 with
    // reset ceil(2 / 1) * 100 = 200.
    let fresh = [fw.allowed(1, 1000), sc.allowed(8, 1000), tb.allowed(3, 200)];
    for (policy, first) in policies.iter().zip(fresh) {
        let id = EvaluationId::random();
        rig.expect_id("cost 3 > maximum 2", policy, "alice", 3, id, COST_EXCEEDS_MAXIMUM).await;
        let over_limit = policy.policy().limit() + 1;
        rig.expect_id(
            "cost above the limit",
            policy,
            "alice",
            over_limit,
            id,
            COST_EXCEEDS_MAXIMUM,
        )
        .await;
        rig.expect_id("cost u64::MAX", policy, "alice", u64::MAX, id, COST_EXCEEDS_MAXIMUM).await;
        rig.expect_id("same id, cost 2", policy, "alice", 2, id, first).await;
    }
}

/// A request whose deadline has come (or passed) is
/// `Unavailable(AdmissionRejected)`; nothing is charged or recorded.
pub async fn expired_deadline_is_admission_rejected_and_touches_nothing(
    factory: &dyn ProviderFactory,
) {
    let policies = three(1);
    let [fw, sc, tb] = &policies;
    let rig = Rig::start(factory, &[fw, sc, tb]).await;
    rig.at(0);
    let ids = [EvaluationId::random(), EvaluationId::random(), EvaluationId::random()];
    let mut stale = Vec::new();
    for (policy, id) in policies.iter().zip(ids) {
        let mut request = rig.request(policy.id(), "alice", 1, id);
        // `monotonic() >= deadline` is the rejection rule, so "now" is late.
        request.deadline = rig.clock().monotonic();
        assert_admission_rejected(rig.ask(request.clone()).await, policy, "deadline now");
        stale.push(request);
    }
    // Move the monotonic clock a second on; put the wall clock back at T0.
    rig.clock().advance(Duration::from_secs(1));
    rig.at(0);
    for (request, policy) in stale.into_iter().zip(&policies) {
        assert_admission_rejected(rig.ask(request).await, policy, "deadline a second ago");
    }
    let fresh = [fw.allowed(2, 1000), sc.allowed(9, 1000), tb.allowed(4, 100)];
    for ((policy, id), first) in policies.iter().zip(ids).zip(fresh) {
        rig.expect_id("same id, in time", policy, "alice", 1, id, first).await;
    }
}

fn assert_admission_rejected(outcome: RateLimitOutcome, policy: &CheckPolicy, what: &str) {
    // The retry-after is the provider's configured failure hint, not a
    // contract number, so only the category is pinned.
    assert!(
        matches!(
            outcome,
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::AdmissionRejected,
                ..
            })
        ),
        "{what} under {}: expected Unavailable(AdmissionRejected), got {outcome:?}",
        policy.id()
    );
}

/// `policy()` returns exactly the policies the provider was built with.
pub async fn policy_lookup_returns_the_held_policies(factory: &dyn ProviderFactory) {
    let policies = three(1);
    let [fw, sc, tb] = &policies;
    let rig = Rig::start(factory, &[fw, sc, tb]).await;
    for policy in &policies {
        assert_eq!(rig.port().policy(policy.id()), Some(policy.policy()), "{}", policy.id());
    }
    assert_eq!(rig.port().policy(&policy_id("missing")), None);
    let second = CheckPolicy::new(fixed_window("fw", 3, 1000).revision(2));
    let mut rig = rig;
    rig.rebuild(&[&second]).await;
    assert_eq!(rig.port().policy(second.id()).map(|p| p.revision()), Some(2));
    assert_eq!(rig.port().policy(sc.id()), None, "a rebuilt provider holds only its own policies");
}

/// The readiness probe answers true for a working provider and consumes no
/// budget.
pub async fn readiness_probe_consumes_nothing(factory: &dyn ProviderFactory) {
    let policies = three(1);
    let [fw, sc, tb] = &policies;
    let rig = Rig::start(factory, &[fw, sc, tb]).await;
    rig.at(0);
    for _ in 0..5 {
        assert!(rig.port().is_ready().await, "a freshly built provider must be ready");
    }
    rig.expect("after probes", fw, "alice", 1, fw.allowed(2, 1000)).await;
    rig.expect("after probes", sc, "alice", 1, sc.allowed(9, 1000)).await;
    rig.expect("after probes", tb, "alice", 1, tb.allowed(4, 100)).await;
}

/// The order of the early answers: policy and cost before the deadline,
/// the deadline before the clock bound (docs/algorithms.md, steps 1 to 3).
pub async fn rejections_follow_the_evaluation_order(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(
        fixed_window("fw", 3, 1000).maximum_clock_regression(Duration::from_millis(500)),
    );
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(1100);
    rig.expect("charge", &fw, "alice", 1, fw.allowed(2, 900)).await;
    let late = |policy: &shared_contract::PolicyId, cost: u64| {
        let mut request = rig.request(policy, "alice", cost, EvaluationId::random());
        request.deadline = rig.clock().monotonic();
        request
    };
    let outcome = rig.ask(late(&policy_id("missing"), 1)).await;
    assert_eq!(outcome, UNKNOWN_POLICY, "unknown policy with an expired deadline");
    let outcome = rig.ask(late(fw.id(), 0)).await;
    assert_eq!(outcome, COST_EXCEEDS_MAXIMUM, "cost 0 with an expired deadline");
    let outcome = rig.ask(late(fw.id(), 4)).await;
    assert_eq!(outcome, COST_EXCEEDS_MAXIMUM, "cost 4 with an expired deadline");
    rig.at(100);
    // 1000 ms behind the mark is beyond the bound, but the deadline comes first.
    assert_admission_rejected(rig.ask(late(fw.id(), 1)).await, &fw, "expired and behind");
    rig.at(1100);
    rig.expect("nothing charged", &fw, "alice", 1, fw.allowed(1, 900)).await;
}
