//! Settling usage (docs/algorithms.md, "Settling usage"): a request's
//! reservation settled with what it used, `d = u - c`. The excess is charged
//! whatever remains, the rest given back to the reservation's budget while
//! it is current; once per settle; the worked numbers are the docs'.

use futures::future::join_all;
use shared_contract::{
    CalendarPeriod, Clock, EvaluationDedupPolicy, EvaluationId, IncompatibleCategory, MAX_COUNT,
    RateLimitFailure, RateLimitRequest, SettleOutcome, Settled, Settlement, UnavailableCategory,
};

use crate::checks::admin::budget;
use crate::factory::ProviderFactory;
use crate::rig::{
    CheckPolicy, DEFAULT_OPERATION, Rig, T0, calendar_window, concurrency, fixed_window, gcra,
    sliding_counter, token_bucket,
};

const APPLIED: SettleOutcome = Ok(Settled::Applied);

impl Rig<'_> {
    /// The debt the admin inspect shows for `who` under `policy`.
    async fn debt(&self, policy: &CheckPolicy, who: &str) -> u64 {
        match self.port().inspect(&budget(policy, who)).await {
            Ok(state) => state.debt,
            Err(failure) => panic!("inspect {who} under {}: {failure:?}", policy.id()),
        }
    }

    /// Settles `request` (its cost the reservation) with `used`.
    async fn settle(&self, request: RateLimitRequest<'_>, used: u64) -> SettleOutcome {
        self.port().settle(Settlement { request, used }).await
    }

    /// Reserves `cost` under `policy` with a fresh id, asserting the
    /// decision, and returns the request to settle it with.
    async fn reserve(
        &self,
        what: &str,
        policy: &CheckPolicy,
        who: &str,
        cost: u64,
        expected: shared_contract::RateLimitOutcome,
    ) -> RateLimitRequest<'static> {
        let id = EvaluationId::random();
        self.expect_id(what, policy, who, cost, id, expected).await;
        self.request(policy.id(), who, cost, id)
    }
}

/// Fixed window `L = 10`, `W = 1000`: a refund, its repeat, an excess that
/// refuses until the window ends, and a refund after its window gives nothing.
pub async fn settle_fixed_window_worked_numbers(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000).maximum_cost(5));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(100);
    let small = rig.reserve("reserve 5", &fw, "alice", 5, fw.allowed(5, 900)).await;
    assert_eq!(rig.settle(small.clone(), 2).await, APPLIED, "u = 2 gives 3 back");
    rig.expect("count 3", &fw, "alice", 1, fw.allowed(7, 900)).await;
    assert_eq!(rig.settle(small, 2).await, Ok(Settled::Repeated), "the same settle again");
    rig.expect("nothing given twice", &fw, "alice", 1, fw.allowed(6, 900)).await;
    let big = rig.reserve("reserve 5 more", &fw, "alice", 5, fw.allowed(1, 900)).await;
    assert_eq!(rig.settle(big, 12).await, APPLIED, "u = 12 charges 7 past the limit");
    rig.expect("count 16 refuses", &fw, "alice", 1, fw.denied(0, 900, 900)).await;
    assert_eq!(rig.debt(&fw, "alice").await, 6, "16 of 10");
    rig.at(1000);
    assert_eq!(rig.debt(&fw, "alice").await, 0, "a new window owes nothing");
    rig.expect("the next window", &fw, "alice", 1, fw.allowed(9, 1000)).await;
    rig.at(1100);
    let late = rig.reserve("reserve at 1100", &fw, "alice", 5, fw.allowed(4, 900)).await;
    rig.at(2000);
    assert_eq!(rig.settle(late, 0).await, APPLIED, "its window has ended");
    rig.expect("nothing came back", &fw, "alice", 1, fw.allowed(9, 1000)).await;
}

/// Sliding counter `L = 10`, `W = 1000`: a debt of the current window
/// weighs in the next one as any count does.
pub async fn settle_sliding_counter_debt_weighs_in_the_next_window(factory: &dyn ProviderFactory) {
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000).maximum_cost(4));
    let rig = Rig::start(factory, &[&sc]).await;
    rig.at(0);
    let reserved = rig.reserve("reserve 4", &sc, "alice", 4, sc.allowed(6, 1000)).await;
    assert_eq!(rig.settle(reserved, 10).await, APPLIED);
    // n = 10: x' = 1000 - floor(9999 / 10) = 1, retry 1000 + 1.
    rig.expect("n = 10 refuses", &sc, "alice", 1, sc.denied(0, 1001, 1000)).await;
    rig.at(1500);
    // p = 10, e = 500: est = 5.
    rig.expect("half the debt left", &sc, "alice", 1, sc.allowed(4, 500)).await;
    assert_eq!(rig.debt(&sc, "alice").await, 0, "est 6 of 10");
}

/// Token bucket `C = 10`, `r = 1`, `P = 100`: tokens below zero are a
/// debt the refill pays; a refund fills the bucket back.
pub async fn settle_token_bucket_debt_and_refund(factory: &dyn ProviderFactory) {
    let tb = CheckPolicy::new(token_bucket("tb", 10, 1, 100).maximum_cost(5));
    let rig = Rig::start(factory, &[&tb]).await;
    rig.at(0);
    let reserved = rig.reserve("reserve 5", &tb, "alice", 5, tb.allowed(5, 500)).await;
    assert_eq!(rig.settle(reserved, 12).await, APPLIED);
    rig.expect("tokens -2", &tb, "alice", 1, tb.denied(0, 300, 1200)).await;
    assert_eq!(rig.debt(&tb, "alice").await, 2);
    rig.at(300);
    rig.expect("three periods paid it", &tb, "alice", 1, tb.allowed(0, 1000)).await;
    rig.at(0);
    let refunded = rig.reserve("reserve 4", &tb, "bob", 4, tb.allowed(6, 400)).await;
    assert_eq!(rig.settle(refunded, 1).await, APPLIED);
    rig.expect("9 tokens back", &tb, "bob", 1, tb.allowed(8, 200)).await;
}

/// GCRA `L = 10`, `P = 1000`, `b = 5`: a refund takes cells off the
/// schedule; an excess pushes the theoretical arrival time past the burst.
pub async fn settle_gcra_moves_the_schedule(factory: &dyn ProviderFactory) {
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5).maximum_cost(5));
    let rig = Rig::start(factory, &[&g]).await;
    rig.at(0);
    let reserved = rig.reserve("reserve 3", &g, "alice", 3, g.allowed(2, 100)).await;
    assert_eq!(rig.settle(reserved, 1).await, APPLIED);
    rig.expect("tat = T0 + 100 ms", &g, "alice", 1, g.allowed(3, 100)).await;
    let burst = rig.reserve("reserve 5", &g, "bob", 5, g.allowed(0, 100)).await;
    assert_eq!(rig.settle(burst, 8).await, APPLIED);
    rig.expect("tat = T0 + 800 ms", &g, "bob", 1, g.denied(0, 400, 400)).await;
    assert_eq!(rig.debt(&g, "bob").await, 3, "300000 us past b T");
    rig.at(400);
    rig.expect("the schedule paid it", &g, "bob", 1, g.allowed(0, 100)).await;
}

/// Calendar window, 10 a month in Berlin: a reservation of January
/// settled in February gives nothing back.
pub async fn settle_calendar_window_refund_after_the_month_gives_nothing(
    factory: &dyn ProviderFactory,
) {
    let month =
        CheckPolicy::new(calendar_window("monthly", 10, CalendarPeriod::Month).maximum_cost(5));
    let rig = Rig::start(factory, &[&month]).await;
    // 2027-01-31T23:59:59 and 2027-02-01T00:00:01 in Berlin.
    rig.at(1_801_436_399_000 - T0);
    let reserved = rig.reserve("January", &month, "alice", 5, month.allowed(5, 1000)).await;
    rig.at(1_801_436_401_000 - T0);
    assert_eq!(rig.settle(reserved, 0).await, APPLIED);
    rig.expect("February's own", &month, "alice", 1, month.allowed(9, 2_419_199_000)).await;
}

/// A settle whose reservation left no live record changes nothing: an id
/// never seen, a reservation under a policy without dedupe, one reset.
pub async fn settle_of_an_unknown_reservation_changes_nothing(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000).maximum_cost(5));
    let plain = CheckPolicy::new(
        fixed_window("fw-plain", 10, 1000)
            .maximum_cost(5)
            .evaluation_dedup(EvaluationDedupPolicy::Disabled),
    );
    let rig = Rig::start(factory, &[&fw, &plain]).await;
    rig.at(100);
    let never = rig.request(fw.id(), "alice", 5, EvaluationId::random());
    assert_eq!(rig.settle(never, 0).await, Ok(Settled::UnknownReservation));
    rig.expect("untouched", &fw, "alice", 1, fw.allowed(9, 900)).await;
    let unrecorded = rig.reserve("no dedupe", &plain, "alice", 5, plain.allowed(5, 900)).await;
    assert_eq!(rig.settle(unrecorded, 0).await, Ok(Settled::UnknownReservation));
    rig.expect("it stands as charged", &plain, "alice", 1, plain.allowed(4, 900)).await;
}

/// A reservation of 0 settles none: `u` is charged as it stands, past the
/// limit, once however often it is sent.
pub async fn settle_without_a_reservation_charges_past_the_limit_once(
    factory: &dyn ProviderFactory,
) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(100);
    let after = rig.request(fw.id(), "alice", 0, EvaluationId::random());
    assert_eq!(rig.settle(after.clone(), 12).await, APPLIED, "12 of 10");
    assert_eq!(rig.settle(after, 12).await, Ok(Settled::Repeated));
    rig.expect("in debt", &fw, "alice", 1, fw.denied(0, 900, 900)).await;
    rig.at(1000);
    rig.expect("the next window", &fw, "alice", 1, fw.allowed(9, 1000)).await;
}

/// A settle of exactly the reservation changes no count, and is recorded:
/// a later settle of the same reservation repeats it.
pub async fn settle_of_exactly_the_reservation_is_recorded(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000).maximum_cost(5));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(100);
    let reserved = rig.reserve("reserve 5", &fw, "alice", 5, fw.allowed(5, 900)).await;
    assert_eq!(rig.settle(reserved.clone(), 5).await, APPLIED, "d = 0");
    assert_eq!(rig.settle(reserved, 0).await, Ok(Settled::Repeated), "settled already");
    rig.expect("the 5 stand", &fw, "alice", 1, fw.allowed(4, 900)).await;
}

/// Concurrent copies of one settle apply once.
pub async fn settle_concurrent_repeats_apply_once(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000).maximum_cost(5));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(100);
    let reserved = rig.reserve("reserve 5", &fw, "alice", 5, fw.allowed(5, 900)).await;
    let settles = join_all((0..8).map(|_| rig.settle(reserved.clone(), 1))).await;
    let applied = settles.iter().filter(|outcome| **outcome == APPLIED).count();
    let repeated = settles.iter().filter(|outcome| **outcome == Ok(Settled::Repeated)).count();
    assert_eq!((applied, repeated), (1, 7), "eight copies of one settle: {settles:?}");
    rig.expect("4 given back once", &fw, "alice", 1, fw.allowed(8, 900)).await;
}

/// In a set, each key charged by the reservation settles; a concurrency
/// key keeps its lease and takes nothing.
pub async fn settle_in_a_set_leaves_a_concurrency_key_alone(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000).maximum_cost(5));
    let slots = CheckPolicy::new(concurrency("slots", 2, 30_000, 1000));
    let rig = Rig::start(factory, &[&fw, &slots]).await;
    rig.at(100);
    let id = EvaluationId::random();
    let reserved = rig.set_request(&[&fw, &slots], DEFAULT_OPERATION, "alice", 5, id);
    let outcome = rig.ask(reserved.clone()).await;
    assert!(outcome.as_ref().is_ok_and(|set| set.allowed()), "reserved: {outcome:?}");
    assert_eq!(rig.settle(reserved, 13).await, APPLIED);
    rig.expect("18 of 10", &fw, "alice", 1, fw.denied(0, 900, 900)).await;
    let lease = rig.decide(&slots, "alice", 1).await;
    assert_eq!((lease.allowed, lease.remaining), (true, 0), "the first lease is still held");
}

/// Refusals read no state: an unknown policy, a usage beyond a counter's
/// range, a deadline passed; a clock behind its bound is clock-unsafe.
pub async fn settle_refusals_touch_nothing(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000).maximum_cost(5));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(2000);
    let reserved = rig.reserve("reserve 5", &fw, "alice", 5, fw.allowed(5, 1000)).await;
    let unknown = RateLimitRequest {
        policies: shared_contract::PolicySet::single(crate::rig::policy_id("nope")).into(),
        ..reserved.clone()
    };
    assert_eq!(
        rig.settle(unknown, 0).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::UnknownPolicy })
    );
    assert_eq!(
        rig.settle(reserved.clone(), MAX_COUNT + 1).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::CostExceedsMaximum })
    );
    let late = RateLimitRequest { deadline: rig.clock().monotonic(), ..reserved.clone() };
    assert!(
        matches!(
            rig.settle(late, 0).await,
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::AdmissionRejected,
                ..
            })
        ),
        "a passed deadline"
    );
    // The check defaults' bound is 1000 ms: 1500 ms back is 500 beyond it.
    rig.at(500);
    assert!(
        matches!(
            rig.settle(reserved.clone(), 0).await,
            Err(RateLimitFailure::Unavailable { category: UnavailableCategory::ClockUnsafe, .. })
        ),
        "a clock behind its bound"
    );
    rig.at(2000);
    assert_eq!(rig.settle(reserved, 0).await, APPLIED, "none of those touched it");
    rig.expect("all 5 back", &fw, "alice", 1, fw.allowed(9, 1000)).await;
}

/// The bound: with `u <= c` what was admitted never passes `L`; with an
/// excess, by at most the excess.
pub async fn settle_admitted_usage_stays_within_the_bound(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000).maximum_cost(3));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(0);
    for (who, usage) in [("alice", [1, 3, 0, 2]), ("bob", [4, 5, 3, 6])] {
        let (mut used, mut excess) = (0, 0);
        for round in 0..12 {
            let id = EvaluationId::random();
            let decision = rig.ask(rig.request(fw.id(), who, 3, id)).await;
            if !decision.as_ref().is_ok_and(|set| set.allowed()) {
                continue;
            }
            let u = usage[round % usage.len()];
            assert_eq!(rig.settle(rig.request(fw.id(), who, 3, id), u).await, APPLIED);
            used += u;
            excess += u.saturating_sub(3);
        }
        assert!(used <= 10 + excess, "{who}: used {used}, excess {excess}");
        assert!(used >= 8, "{who}: the window admitted until it was full ({used})");
    }
}
