//! In-flight leases (docs/algorithms.md "Concurrency (in-flight leases)"):
//! at most `max-in-flight` admitted requests of a key hold a lease at once;
//! `release` gives one back, idempotently; an unreleased lease is gone at
//! its `lease-ttl`; in a set the lease is taken in the same atomic step as
//! the rate policies; the same evaluation id is the same lease.

use futures::future::join_all;
use shared_contract::{
    EvaluationId, Lease, PolicyMode, RateLimitOutcomeExt, RateLimitRequest, ReleaseOutcome,
};

use crate::checks::admin::{budget, state};
use crate::factory::ProviderFactory;
use crate::rig::{
    CheckPolicy, DEFAULT_OPERATION, Rig, concurrency, fixed_window, ms, set_outcome, tally,
};

impl Rig<'_> {
    /// Releases the lease `request` took (or would have) and asserts what
    /// the provider answers.
    async fn expect_release(
        &self,
        what: &str,
        request: &RateLimitRequest<'_>,
        expected: ReleaseOutcome,
    ) {
        let actual = self.port().release(&Lease::of(request)).await;
        assert_eq!(actual, expected, "{what}: release at {}", self.now());
    }

    /// A request of cost 1 for `who` under `policy` with a fresh id.
    fn fresh(&self, policy: &CheckPolicy, who: &str) -> RateLimitRequest<'static> {
        self.request(policy.id(), who, 1, EvaluationId::random())
    }

    /// Asks `request` and asserts the whole outcome.
    async fn expect_request(
        &self,
        what: &str,
        request: &RateLimitRequest<'_>,
        expected: shared_contract::RateLimitOutcome,
    ) {
        let actual = self.ask(request.clone()).await;
        assert_eq!(actual, expected, "{what}: cost {} at {}", request.cost, self.now());
    }
}

/// Thirty requests at once against `max-in-flight = 20`: exactly twenty
/// hold a lease (remaining 19, 18, ..., 0 each once), ten are refused; the
/// twenty released at once each free their slot.
pub async fn leases_admit_exactly_max_in_flight_under_concurrent_evaluates(
    factory: &dyn ProviderFactory,
) {
    let cc = CheckPolicy::new(concurrency("cc", 20, 30_000, 1000));
    let rig = Rig::start(factory, &[&cc]).await;
    rig.at(0);
    let requests: Vec<_> = (0..30).map(|_| rig.fresh(&cc, "alice")).collect();
    let outcomes = join_all(requests.iter().map(|request| rig.ask(request.clone()))).await;
    let remaining_each_once: Vec<u64> = (0..20).collect();
    assert_eq!(tally(&outcomes), (remaining_each_once, 10), "{outcomes:?}");
    rig.expect_inspect("all held", &budget(&cc, "alice"), state(&cc, 0, 1000, 0, Some(0))).await;
    let held: Vec<Lease> = requests
        .iter()
        .zip(&outcomes)
        .filter(|(_, outcome)| outcome.is_allowed())
        .map(|(request, _)| Lease::of(request))
        .collect();
    let released = join_all(held.iter().map(|lease| rig.port().release(lease))).await;
    assert_eq!(released, [ReleaseOutcome::Released; 20]);
    rig.expect_inspect("all released", &budget(&cc, "alice"), state(&cc, 20, 0, 0, Some(0))).await;
}

/// Releasing a held lease frees its slot; releasing it again, releasing a
/// request that was refused, another subject's id, or a set without a
/// concurrency policy finds nothing and changes nothing.
pub async fn leases_release_frees_a_slot_and_is_idempotent(factory: &dyn ProviderFactory) {
    let cc = CheckPolicy::new(concurrency("cc", 2, 30_000, 1000));
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000));
    let rig = Rig::start(factory, &[&cc, &fw]).await;
    rig.at(0);
    let (a, b, c) = (rig.fresh(&cc, "alice"), rig.fresh(&cc, "alice"), rig.fresh(&cc, "alice"));
    rig.expect_request("a", &a, cc.allowed(1, 0)).await;
    rig.expect_request("b", &b, cc.allowed(0, 0)).await;
    rig.expect_request("c: no slot", &c, cc.denied(0, 1000, 0)).await;
    // Bob holds no lease of a's id: a release under his key touches nothing.
    let bobs = rig.request(cc.id(), "bob", 1, a.evaluation_id);
    rig.expect_release("a's id under bob", &bobs, ReleaseOutcome::NotHeld).await;
    rig.expect_release("a", &a, ReleaseOutcome::Released).await;
    rig.expect_release("a again", &a, ReleaseOutcome::NotHeld).await;
    rig.expect_release("c, refused", &c, ReleaseOutcome::NotHeld).await;
    rig.expect_inspect("one held", &budget(&cc, "alice"), state(&cc, 1, 0, 0, Some(0))).await;
    let d = rig.fresh(&cc, "alice");
    rig.expect_request("d takes a's slot", &d, cc.allowed(0, 0)).await;
    let rate_only = rig.fresh(&fw, "alice");
    rig.expect_request("rate only", &rate_only, fw.allowed(9, 1000)).await;
    rig.expect_release("a set without leases", &rate_only, ReleaseOutcome::NotHeld).await;
    rig.expect_inspect("b and d held", &budget(&cc, "alice"), state(&cc, 0, 1000, 0, Some(0)))
        .await;
}

/// A lease never released is gone at `t + lease-ttl +
/// maximum-clock-regression` (1 s + the default 1 s here): the slot is free
/// from then on, and releasing it then finds nothing.
pub async fn leases_unreleased_are_reclaimed_after_their_ttl(factory: &dyn ProviderFactory) {
    let cc = CheckPolicy::new(concurrency("cc", 1, 1000, 250));
    let rig = Rig::start(factory, &[&cc]).await;
    rig.at(0);
    let a = rig.fresh(&cc, "alice");
    rig.expect_request("a", &a, cc.allowed(0, 0)).await;
    rig.at(1999);
    rig.expect_request("1 ms before a expires", &rig.fresh(&cc, "alice"), cc.denied(0, 250, 0))
        .await;
    rig.at(2000);
    rig.expect_inspect("a expired", &budget(&cc, "alice"), state(&cc, 1, 0, 0, Some(0))).await;
    let b = rig.fresh(&cc, "alice");
    rig.expect_request("b at a's expiry", &b, cc.allowed(0, 0)).await;
    rig.expect_release("a, expired", &a, ReleaseOutcome::NotHeld).await;
    rig.expect_release("b", &b, ReleaseOutcome::Released).await;
}

/// Two instances on one store whose clocks differ by less than
/// `maximum-clock-regression`: A's clock reads 0 when it takes both slots
/// (lease-ttl 1 s, bound 1 s); B's clock runs 900 ms ahead, so 300 ms later
/// it reads 1200, past `t_A + lease-ttl`, while A still holds both. A lease
/// counts until `lease-ttl + maximum-clock-regression` after it was taken
/// (2000 here), so a clock ahead by up to the bound never drops a lease
/// another instance still holds: B is refused, then admitted into the slot
/// A gives back, and an unreleased lease is reclaimed at 2000.
pub async fn leases_hold_against_a_clock_ahead_inside_the_bound(factory: &dyn ProviderFactory) {
    let cc = CheckPolicy::new(concurrency("cc", 2, 1000, 100).maximum_clock_regression(ms(1000)));
    let rig = Rig::start(factory, &[&cc]).await;
    rig.at(0);
    let (a1, a2) = (rig.fresh(&cc, "alice"), rig.fresh(&cc, "alice"));
    rig.expect_request("A's first, clock 0", &a1, cc.allowed(1, 0)).await;
    rig.expect_request("A's second, clock 0", &a2, cc.allowed(0, 0)).await;
    rig.at(1200);
    rig.expect_request("B, clock 900 ms ahead", &rig.fresh(&cc, "alice"), cc.denied(0, 100, 0))
        .await;
    rig.at(400);
    rig.expect_release("A gives its first back, clock 400", &a1, ReleaseOutcome::Released).await;
    rig.at(1300);
    let b = rig.fresh(&cc, "alice");
    rig.expect_request("B into the freed slot", &b, cc.allowed(0, 0)).await;
    rig.at(1999);
    rig.expect_request("a2 held until 2000", &rig.fresh(&cc, "alice"), cc.denied(0, 100, 0)).await;
    rig.at(2000);
    rig.expect_request("a2 reclaimed at 2000", &rig.fresh(&cc, "alice"), cc.allowed(0, 0)).await;
}

/// A release removes its own lease only, and moves no mark: a lease
/// expired at the release's clock is still live for a caller whose clock
/// lags inside the bound, and still counts.
pub async fn leases_release_leaves_every_other_lease_even_an_expired_one(
    factory: &dyn ProviderFactory,
) {
    let cc = CheckPolicy::new(concurrency("cc", 2, 50, 30).maximum_clock_regression(ms(20)));
    let rig = Rig::start(factory, &[&cc]).await;
    rig.at(0);
    rig.expect_request("a, until 50 + 20 = 70", &rig.fresh(&cc, "alice"), cc.allowed(1, 0)).await;
    rig.at(45);
    let b = rig.fresh(&cc, "alice");
    rig.expect_request("b, until 115; mark 45", &b, cc.allowed(0, 0)).await;
    rig.at(75);
    rig.expect_release("b, when a has expired", &b, ReleaseOutcome::Released).await;
    // 5 ms behind the mark: t := 45, where a is live (70 > 45): one slot.
    rig.at(40);
    rig.expect_request("c at the mark", &rig.fresh(&cc, "alice"), cc.allowed(0, 0)).await;
}

/// In a set with a rate policy the lease is taken in the same atomic step:
/// a request the rate policy refuses holds no lease, and one refused for
/// lack of a lease charges no rate policy.
pub async fn leases_in_a_set_are_taken_atomically_with_rate_policies(
    factory: &dyn ProviderFactory,
) {
    let fw1 = CheckPolicy::new(fixed_window("fw1", 1, 1000));
    let cc2 = CheckPolicy::new(concurrency("cc2", 2, 30_000, 1000));
    let fw10 = CheckPolicy::new(fixed_window("fw10", 10, 1000));
    let cc1 = CheckPolicy::new(concurrency("cc1", 1, 30_000, 500));
    let rig = Rig::start(factory, &[&fw1, &cc2, &fw10, &cc1]).await;
    rig.at(250);
    let ask = |set: &[&CheckPolicy]| {
        rig.set_request(set, DEFAULT_OPERATION, "alice", 1, EvaluationId::random())
    };
    // Refused by the rate policy: the concurrency member allows, spared.
    let a = ask(&[&fw1, &cc2]);
    rig.expect_request("a", &a, set_outcome(true, &[fw1.allows(0, 750), cc2.allows(1, 0)])).await;
    let b = ask(&[&fw1, &cc2]);
    let refused = set_outcome(false, &[fw1.denies(0, 750, 750), cc2.allows(1, 0)]);
    rig.expect_request("b, over the rate", &b, refused).await;
    rig.expect_inspect("only a's lease", &budget(&cc2, "alice"), state(&cc2, 1, 0, 0, Some(250)))
        .await;
    rig.expect_release("b held none", &b, ReleaseOutcome::NotHeld).await;
    // Refused for lack of a lease: the rate member allows, uncharged.
    let c = ask(&[&fw10, &cc1]);
    rig.expect_request("c", &c, set_outcome(true, &[fw10.allows(9, 750), cc1.allows(0, 0)])).await;
    let d = ask(&[&fw10, &cc1]);
    let refused = set_outcome(false, &[fw10.allows(9, 750), cc1.denies(0, 500, 0)]);
    rig.expect_request("d, no slot", &d, refused).await;
    rig.expect_inspect(
        "d charged nothing",
        &budget(&fw10, "alice"),
        state(&fw10, 9, 0, 750, Some(250)),
    )
    .await;
    rig.expect_release("c", &c, ReleaseOutcome::Released).await;
    let e = ask(&[&fw10, &cc1]);
    rig.expect_request("e", &e, set_outcome(true, &[fw10.allows(8, 750), cc1.allows(0, 0)])).await;
}

/// The same evaluation id again while its lease is live is a replay: the
/// same lease, no second slot, nothing charged anywhere in its set. Once
/// released, the id asks for a slot like any other.
pub async fn leases_replay_of_an_evaluation_returns_the_same_lease(factory: &dyn ProviderFactory) {
    let cc = CheckPolicy::new(concurrency("cc", 2, 30_000, 1000));
    let fw = CheckPolicy::new(fixed_window("fw", 5, 1000));
    let rig = Rig::start(factory, &[&cc, &fw]).await;
    rig.at(0);
    let x = rig.fresh(&cc, "alice");
    rig.expect_request("x", &x, cc.allowed(1, 0)).await;
    rig.at(10);
    rig.expect_request("x again", &x, cc.replayed(1, 0)).await;
    rig.expect_request("b", &rig.fresh(&cc, "alice"), cc.allowed(0, 0)).await;
    rig.expect_request("c: no third slot", &rig.fresh(&cc, "alice"), cc.denied(0, 1000, 0)).await;
    rig.expect_release("x", &x, ReleaseOutcome::Released).await;
    rig.expect_request("x once released asks anew", &x, cc.allowed(0, 0)).await;
    // In a set with a deduped rate policy, both replay and neither charges.
    let y = rig.set_request(&[&fw, &cc], DEFAULT_OPERATION, "bob", 1, EvaluationId::random());
    rig.expect_request("y", &y, set_outcome(true, &[fw.allows(4, 990), cc.allows(1, 0)])).await;
    let replayed = set_outcome(true, &[fw.replays(4, 990), cc.replays(1, 0)]);
    rig.expect_request("y again", &y, replayed).await;
    rig.expect_inspect("one lease", &budget(&cc, "bob"), state(&cc, 1, 0, 0, Some(10))).await;
    rig.expect_inspect("one unit", &budget(&fw, "bob"), state(&fw, 4, 0, 990, Some(10))).await;
}

/// Inspect counts the live leases and writes nothing; reset drops every
/// lease of the key, so a release of one then finds nothing.
pub async fn leases_inspect_and_reset_of_a_concurrency_budget(factory: &dyn ProviderFactory) {
    let cc = CheckPolicy::new(concurrency("cc", 2, 30_000, 1000));
    let rig = Rig::start(factory, &[&cc]).await;
    let key = budget(&cc, "alice");
    rig.at(100);
    rig.expect_inspect("fresh", &key, state(&cc, 2, 0, 0, None)).await;
    let a = rig.fresh(&cc, "alice");
    rig.expect_request("a", &a, cc.allowed(1, 0)).await;
    rig.expect_inspect("a held", &key, state(&cc, 1, 0, 0, Some(100))).await;
    rig.expect_request("b", &rig.fresh(&cc, "alice"), cc.allowed(0, 0)).await;
    rig.expect_inspect("full", &key, state(&cc, 0, 1000, 0, Some(100))).await;
    rig.expect_inspect("inspect took nothing", &key, state(&cc, 0, 1000, 0, Some(100))).await;
    rig.expect_reset("reset", &key).await;
    rig.expect_inspect("after reset", &key, state(&cc, 2, 0, 0, None)).await;
    rig.expect_release("a after reset", &a, ReleaseOutcome::NotHeld).await;
    let c = rig.fresh(&cc, "alice");
    rig.expect_request("c", &c, cc.allowed(1, 0)).await;
    // lease-ttl 30 s + maximum-clock-regression 1 s (the default) after 100.
    rig.at(31_100);
    rig.expect_inspect("c expired", &key, state(&cc, 2, 0, 0, Some(100))).await;
}

/// A shadow concurrency policy takes a real lease on its own allow and
/// never refuses the set; at its limit it takes none.
pub async fn leases_of_a_shadow_policy_are_real_but_never_deny(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000));
    let cc = CheckPolicy::new(concurrency("cc", 1, 30_000, 1000).mode(PolicyMode::Shadow));
    let rig = Rig::start(factory, &[&fw, &cc]).await;
    rig.at(0);
    let ask =
        || rig.set_request(&[&fw, &cc], DEFAULT_OPERATION, "alice", 1, EvaluationId::random());
    let a = ask();
    rig.expect_request("a", &a, set_outcome(true, &[fw.allows(9, 1000), cc.allows(0, 0)])).await;
    let b = ask();
    let would_deny = set_outcome(true, &[fw.allows(8, 1000), cc.denies(0, 1000, 0)]);
    rig.expect_request("b", &b, would_deny).await;
    rig.expect_inspect("one lease", &budget(&cc, "alice"), state(&cc, 0, 1000, 0, Some(0))).await;
    rig.expect_release("b took none", &b, ReleaseOutcome::NotHeld).await;
    rig.expect_release("a", &a, ReleaseOutcome::Released).await;
}

/// A reload that gives the policy a new revision starts a fresh lease set;
/// a lease of the old revision is not released through the new one (it
/// expires at its TTL).
pub async fn leases_of_an_old_revision_are_not_released_through_a_new_one(
    factory: &dyn ProviderFactory,
) {
    let old = CheckPolicy::new(concurrency("cc", 2, 30_000, 1000));
    let new = CheckPolicy::new(concurrency("cc", 2, 30_000, 1000).revision(2));
    let mut rig = Rig::start(factory, &[&old]).await;
    rig.at(0);
    let a = rig.fresh(&old, "alice");
    rig.expect_request("a", &a, old.allowed(1, 0)).await;
    rig.rebuild(&[&new]).await;
    rig.expect_release("a through revision 2", &a, ReleaseOutcome::NotHeld).await;
    rig.expect_request("revision 2 is fresh", &rig.fresh(&new, "alice"), new.allowed(1, 0)).await;
    rig.rebuild(&[&old]).await;
    rig.expect_release("a through revision 1", &a, ReleaseOutcome::Released).await;
}
