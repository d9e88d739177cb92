//! The operator's capability of the port: `inspect` reports a budget as the
//! next evaluation would see it and charges nothing; `reset` deletes a
//! budget (state and dedupe records), so the next request starts fresh;
//! both address exactly the key `evaluate` charges, and an operation only
//! where the policy is operation-scoped.

use shared_contract::{
    BudgetFailure, BudgetKey, BudgetState, EvaluationDedupPolicy, EvaluationId, PolicyScope,
};

use crate::factory::ProviderFactory;
use crate::rig::{
    CheckPolicy, DEFAULT_OPERATION, Rig, T0, fixed_window, gcra, ms, operation, set_outcome,
    sliding_counter, subject, token_bucket,
};

/// The budget of `who` under `policy`, under the checks' default operation
/// when the policy is operation-scoped.
pub(crate) fn budget(policy: &CheckPolicy, who: &str) -> BudgetKey {
    let on = match policy.policy().scope() {
        PolicyScope::Operation => Some(operation(DEFAULT_OPERATION)),
        PolicyScope::Subject => None,
    };
    BudgetKey::new(subject(who), policy.id().clone(), on)
}

/// What `inspect` must answer: the numbers of the next evaluation of cost
/// 1, without its charge.
pub(crate) fn state(
    policy: &CheckPolicy,
    remaining: u64,
    retry_ms: u64,
    reset_ms: u64,
    mark: Option<u64>,
) -> BudgetState {
    BudgetState {
        limit: policy.policy().limit(),
        remaining,
        reset_after: ms(reset_ms),
        retry_after: ms(retry_ms),
        mark: mark.map(|offset| T0 + offset),
        certainty: policy.certainty(),
        debt: 0,
    }
}

impl Rig<'_> {
    pub(crate) async fn expect_inspect(&self, what: &str, key: &BudgetKey, expected: BudgetState) {
        let actual = self.port().inspect(key).await;
        assert_eq!(actual, Ok(expected), "{what}: inspect {key:?} at {}", self.now());
    }

    pub(crate) async fn expect_reset(&self, what: &str, key: &BudgetKey) {
        let actual = self.port().reset(key).await;
        assert_eq!(actual, Ok(()), "{what}: reset {key:?} at {}", self.now());
    }
}

/// Inspect answers a fresh budget whole and a used one as it stands, for
/// every algorithm, and however often it is asked the next evaluation
/// charges from where the last one left off.
pub async fn inspect_never_charges(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5));
    let rig = Rig::start(factory, &[&fw, &sc, &tb, &g]).await;
    rig.at(250);
    // Nothing stored: whole budgets; a full bucket is already reset, and
    // so is a GCRA whose every cell conforms.
    rig.expect_inspect("fresh fw", &budget(&fw, "alice"), state(&fw, 3, 0, 750, None)).await;
    rig.expect_inspect("fresh sc", &budget(&sc, "alice"), state(&sc, 10, 0, 750, None)).await;
    rig.expect_inspect("fresh tb", &budget(&tb, "alice"), state(&tb, 5, 0, 0, None)).await;
    rig.expect_inspect("fresh g", &budget(&g, "alice"), state(&g, 5, 0, 0, None)).await;
    // T = 100 ms: d' = 100000 us, 4 left, the next cell beyond them 100 ms on.
    rig.expect("g", &g, "alice", 1, g.allowed(4, 100)).await;
    rig.expect("fw", &fw, "alice", 1, fw.allowed(2, 750)).await;
    rig.expect("sc", &sc, "alice", 1, sc.allowed(9, 750)).await;
    // A new bucket at T0 + 250: 4 tokens, full again at T0 + 350.
    rig.expect("tb", &tb, "alice", 1, tb.allowed(4, 100)).await;
    rig.at(300);
    for round in ["first", "second", "third"] {
        // The mark stays where the last charge put it: nothing was written.
        rig.expect_inspect(round, &budget(&fw, "alice"), state(&fw, 2, 0, 700, Some(250))).await;
        rig.expect_inspect(round, &budget(&sc, "alice"), state(&sc, 9, 0, 700, Some(250))).await;
        // k = floor(50 / 100) = 0: still 4 tokens, full at T0 + 350.
        rig.expect_inspect(round, &budget(&tb, "alice"), state(&tb, 4, 0, 50, Some(250))).await;
        // d = 50000: still 4, the next beyond them at 50 ms.
        rig.expect_inspect(round, &budget(&g, "alice"), state(&g, 4, 0, 50, Some(250))).await;
    }
    // fw 2 -> 1, sc est 1 -> 2, tb 4 -> 3 with reset T0 + 250 + 200 - (T0 + 300).
    rig.expect("fw after inspects", &fw, "alice", 1, fw.allowed(1, 700)).await;
    rig.expect("sc after inspects", &sc, "alice", 1, sc.allowed(8, 700)).await;
    rig.expect("tb after inspects", &tb, "alice", 1, tb.allowed(3, 150)).await;
    // g: d' = 150000: 3 left, reset 150000 - 100000 = 50000 us.
    rig.expect("g after inspects", &g, "alice", 1, g.allowed(3, 50)).await;
}

/// An exhausted budget inspects as the next denial answers: nothing left,
/// and the wait after which a request of cost 1 passes.
pub async fn inspect_of_an_exhausted_budget_reports_its_retry_after(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5));
    let rig = Rig::start(factory, &[&fw, &tb, &g]).await;
    rig.at(250);
    rig.drain(&fw, "alice", 3).await;
    rig.drain(&tb, "alice", 5).await;
    rig.drain(&g, "alice", 5).await;
    // d = 500000: the next cell conforms 100 ms on, for retry and reset.
    rig.expect_inspect("g drained", &budget(&g, "alice"), state(&g, 0, 100, 100, Some(250))).await;
    rig.expect("g denial agrees", &g, "alice", 1, g.denied(0, 100, 100)).await;
    rig.expect_inspect("fw drained", &budget(&fw, "alice"), state(&fw, 0, 750, 750, Some(250)))
        .await;
    // Empty at T0 + 250: one token after 100 ms, full after 500 ms.
    rig.expect_inspect("tb drained", &budget(&tb, "alice"), state(&tb, 0, 100, 500, Some(250)))
        .await;
    rig.expect("fw denial agrees", &fw, "alice", 1, fw.denied(0, 750, 750)).await;
    rig.expect("tb denial agrees", &tb, "alice", 1, tb.denied(0, 100, 500)).await;
}

/// After a reset the whole budget is back at once (within the window that
/// exhausted it), for every algorithm, and no other budget moved: not the
/// subject's other policies, not another subject's.
pub async fn reset_restores_the_full_budget(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5));
    let rig = Rig::start(factory, &[&fw, &sc, &tb, &g]).await;
    rig.at(250);
    rig.drain(&fw, "alice", 3).await;
    rig.drain(&fw, "bob", 3).await;
    rig.drain(&sc, "alice", 10).await;
    rig.drain(&tb, "alice", 5).await;
    rig.drain(&g, "alice", 5).await;
    rig.expect("fw exhausted", &fw, "alice", 1, fw.denied(0, 750, 750)).await;
    rig.expect_reset("fw", &budget(&fw, "alice")).await;
    rig.expect_inspect("fw after reset", &budget(&fw, "alice"), state(&fw, 3, 0, 750, None)).await;
    rig.expect("fw starts fresh", &fw, "alice", 1, fw.allowed(2, 750)).await;
    // Only that budget: bob and alice's other policies are still exhausted.
    rig.expect("bob untouched", &fw, "bob", 1, fw.denied(0, 750, 750)).await;
    let sc_left = rig.decide(&sc, "alice", 1).await;
    assert!(!sc_left.allowed, "a reset of fw left sc alone: {sc_left:?}");
    rig.expect("tb untouched", &tb, "alice", 1, tb.denied(0, 100, 500)).await;
    rig.expect("g untouched", &g, "alice", 1, g.denied(0, 100, 100)).await;
    rig.expect_reset("sc", &budget(&sc, "alice")).await;
    rig.expect_reset("tb", &budget(&tb, "alice")).await;
    rig.expect_reset("g", &budget(&g, "alice")).await;
    rig.expect("sc starts fresh", &sc, "alice", 1, sc.allowed(9, 750)).await;
    rig.expect("tb starts fresh", &tb, "alice", 1, tb.allowed(4, 100)).await;
    rig.expect("g starts fresh", &g, "alice", 1, g.allowed(4, 100)).await;
}

/// Resetting a budget that holds nothing, or resetting twice, is fine and
/// leaves a fresh budget; an unknown policy is refused by both methods.
pub async fn reset_of_an_absent_budget_is_fine(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(250);
    rig.expect_reset("never used", &budget(&fw, "alice")).await;
    rig.expect_reset("again", &budget(&fw, "alice")).await;
    rig.expect("fresh", &fw, "alice", 1, fw.allowed(2, 750)).await;
    rig.expect_reset("used", &budget(&fw, "alice")).await;
    rig.expect_reset("used, again", &budget(&fw, "alice")).await;
    rig.expect("fresh again", &fw, "alice", 1, fw.allowed(2, 750)).await;
    let unknown = BudgetKey::new(subject("alice"), crate::rig::policy_id("nope"), None);
    assert_eq!(rig.port().inspect(&unknown).await, Err(BudgetFailure::UnknownPolicy));
    assert_eq!(rig.port().reset(&unknown).await, Err(BudgetFailure::UnknownPolicy));
}

/// An operation-scoped policy keeps one budget per operation, so inspect
/// and reset need the operation and touch only its budget; a
/// subject-scoped policy has one budget, and naming an operation for it is
/// refused rather than guessed at.
pub async fn budget_operation_must_fit_the_policy_scope(factory: &dyn ProviderFactory) {
    let scoped = CheckPolicy::new(fixed_window("scoped", 3, 1000));
    let shared = CheckPolicy::new(fixed_window("shared", 5, 1000).scope(PolicyScope::Subject));
    let rig = Rig::start(factory, &[&scoped, &shared]).await;
    rig.at(250);
    let set = [&scoped, &shared];
    let on = |route| rig.set_request(&set, route, "alice", 1, EvaluationId::random());
    let both = |a, b| set_outcome(true, &[scoped.allows(a, 750), shared.allows(b, 750)]);
    rig.expect_set("GET /a", on("GET /a"), both(2, 4)).await;
    rig.expect_set("GET /a", on("GET /a"), both(1, 3)).await;
    rig.expect_set("GET /b", on("GET /b"), both(2, 2)).await;
    let of = |route: Option<&str>, policy: &CheckPolicy| {
        BudgetKey::new(subject("alice"), policy.id().clone(), route.map(operation))
    };
    let refused = [
        (of(None, &scoped), BudgetFailure::OperationRequired),
        (of(Some("GET /a"), &shared), BudgetFailure::OperationNotApplicable),
    ];
    for (key, failure) in &refused {
        assert_eq!(rig.port().inspect(key).await, Err(*failure), "inspect {key:?}");
        assert_eq!(rig.port().reset(key).await, Err(*failure), "reset {key:?}");
    }
    let a = of(Some("GET /a"), &scoped);
    let b = of(Some("GET /b"), &scoped);
    rig.expect_inspect("GET /a", &a, state(&scoped, 1, 0, 750, Some(250))).await;
    rig.expect_inspect("GET /b", &b, state(&scoped, 2, 0, 750, Some(250))).await;
    rig.expect_inspect("shared", &of(None, &shared), state(&shared, 2, 0, 750, Some(250))).await;
    rig.expect_reset("GET /a", &a).await;
    rig.expect_inspect("GET /a reset", &a, state(&scoped, 3, 0, 750, None)).await;
    rig.expect_inspect("GET /b kept", &b, state(&scoped, 2, 0, 750, Some(250))).await;
    rig.expect_inspect("shared kept", &of(None, &shared), state(&shared, 2, 0, 750, Some(250)))
        .await;
    rig.expect_reset("shared", &of(None, &shared)).await;
    rig.expect_set("GET /b after both resets", on("GET /b"), both(1, 4)).await;
}

/// A reset deletes the budget's dedupe records with its state: the next
/// request starts fresh, so an evaluation id charged before the reset
/// charges again (and is recorded again) instead of replaying an answer
/// about a budget that no longer exists.
pub async fn reset_forgets_the_dedupe_records(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(
        fixed_window("fw", 3, 1000).evaluation_dedup(EvaluationDedupPolicy::enabled_defaults()),
    );
    let rig = Rig::start(factory, &[&fw]).await;
    let x = EvaluationId::random();
    rig.at(250);
    rig.expect_id("first", &fw, "alice", 1, x, fw.allowed(2, 750)).await;
    rig.expect("second", &fw, "alice", 1, fw.allowed(1, 750)).await;
    rig.expect_id("a repeat replays", &fw, "alice", 1, x, fw.replayed(2, 750)).await;
    rig.expect_reset("reset", &budget(&fw, "alice")).await;
    rig.at(300);
    rig.expect_id("after the reset x charges", &fw, "alice", 1, x, fw.allowed(2, 700)).await;
    rig.expect_id("and is recorded again", &fw, "alice", 1, x, fw.replayed(2, 700)).await;
    rig.expect("a new id", &fw, "alice", 1, fw.allowed(1, 700)).await;
}

/// Inspect evaluates at the key's mark when the caller's clock lags it
/// (inside the bound), as `evaluate` would, and at the window end the
/// whole budget is back without anything being written.
pub async fn inspect_follows_the_clock_without_writing(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(600);
    rig.drain(&fw, "alice", 3).await;
    // 400 ms behind the mark (bound 1 s): seen from the mark at T0 + 600.
    rig.at(200);
    rig.expect_inspect("lagging", &budget(&fw, "alice"), state(&fw, 0, 400, 400, Some(600))).await;
    // The next window: the budget is whole, the old mark still stored.
    rig.at(1000);
    rig.expect_inspect("next window", &budget(&fw, "alice"), state(&fw, 3, 0, 1000, Some(600)))
        .await;
    rig.expect("next window charges", &fw, "alice", 1, fw.allowed(2, 1000)).await;
}
