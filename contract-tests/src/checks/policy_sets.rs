//! Policy-set checks (docs/algorithms.md, "Policy sets"): a request is
//! admitted iff every enforced policy of its set allows it; then every
//! allowing policy is charged, shadow ones too; an enforced denial charges
//! nothing anywhere; a shadow policy never blocks; a repeat replays the
//! whole set; subject scope shares one key across operations.

use shared_contract::{
    EvaluationId, IncompatibleCategory, PolicyMode, PolicyScope, RateLimitFailure,
    UnavailableCategory,
};

use crate::factory::ProviderFactory;
use crate::rig::{CheckPolicy, Rig, fixed_window, ms, set_outcome, token_bucket};

/// Burst 2 per second beside 5 per minute: a denial by either policy
/// charges the other nothing, and the set is admitted again once both
/// allow.
pub async fn policy_set_is_admitted_only_when_every_enforced_policy_allows(
    factory: &dyn ProviderFactory,
) {
    let burst = CheckPolicy::new(fixed_window("burst", 2, 1000));
    let sustained = CheckPolicy::new(fixed_window("sustained", 5, 60_000));
    let rig = Rig::start(factory, &[&burst, &sustained]).await;
    let set = [&burst, &sustained];
    let ask = |id| rig.set_request(&set, "GET /orders", "alice", 1, id);
    rig.at(250);
    // Windows start at T0: resets 1000 - 250 = 750 and 60_000 - 250 = 59_750.
    let both = |b, s| set_outcome(true, &[burst.allows(b, 750), sustained.allows(s, 59_750)]);
    rig.expect_set("first", ask(EvaluationId::random()), both(1, 4)).await;
    rig.expect_set("second", ask(EvaluationId::random()), both(0, 3)).await;
    let refused = set_outcome(false, &[burst.denies(0, 750, 750), sustained.allows(3, 59_750)]);
    rig.expect_set("the burst denies; sustained stays at 3", ask(EvaluationId::random()), refused)
        .await;
    rig.at(1000);
    // The burst window turned; sustained goes 3 -> 2, so the refusal charged it nothing.
    let next = set_outcome(true, &[burst.allows(1, 1000), sustained.allows(2, 59_000)]);
    rig.expect_set("next burst window", ask(EvaluationId::random()), next).await;
    let next = set_outcome(true, &[burst.allows(0, 1000), sustained.allows(1, 59_000)]);
    rig.expect_set("burst drained", ask(EvaluationId::random()), next).await;
    rig.at(2000);
    let last = set_outcome(true, &[burst.allows(1, 1000), sustained.allows(0, 58_000)]);
    rig.expect_set("sustained drained", ask(EvaluationId::random()), last).await;
    // Now the second policy denies: the burst budget stays at 1, uncharged.
    let refused = set_outcome(false, &[burst.allows(1, 1000), sustained.denies(0, 58_000, 58_000)]);
    rig.expect_set("sustained denies", ask(EvaluationId::random()), refused).await;
    let refused = set_outcome(false, &[burst.allows(1, 1000), sustained.denies(0, 58_000, 58_000)]);
    rig.expect_set("and again, burst still at 1", ask(EvaluationId::random()), refused).await;
}

/// A refused set spares a token bucket that allows: its refill is written
/// as a denial writes it, its tokens are not taken.
pub async fn policy_set_refusal_takes_no_token(factory: &dyn ProviderFactory) {
    let gate = CheckPolicy::new(fixed_window("gate", 1, 1000));
    let tokens = CheckPolicy::new(token_bucket("tokens", 3, 1, 60_000));
    let rig = Rig::start(factory, &[&gate, &tokens]).await;
    let set = [&gate, &tokens];
    let ask = || rig.set_request(&set, "POST /orders", "alice", 1, EvaluationId::random());
    rig.at(0);
    // A full bucket at T0 gives one token: 2 left, full again one period on.
    let first = set_outcome(true, &[gate.allows(0, 1000), tokens.allows(2, 60_000)]);
    rig.expect_set("first", ask(), first).await;
    rig.at(10);
    // Refused by the gate: 2 tokens stand, full at T0 + 60_000.
    let refused = set_outcome(false, &[gate.denies(0, 990, 990), tokens.allows(2, 59_990)]);
    rig.expect_set("the gate denies", ask(), refused).await;
    rig.at(1000);
    // 2 -> 1: the refusal took nothing; full after two periods from T0.
    let next = set_outcome(true, &[gate.allows(0, 1000), tokens.allows(1, 119_000)]);
    rig.expect_set("next gate window", ask(), next).await;
}

/// A subject-scoped policy is one budget for the subject whatever the
/// operation; an operation-scoped one counts each operation apart.
pub async fn policy_set_subject_scope_is_shared_across_operations(factory: &dyn ProviderFactory) {
    let per_operation = CheckPolicy::new(fixed_window("per-op", 10, 60_000));
    let daily = CheckPolicy::new(fixed_window("daily", 3, 60_000).scope(PolicyScope::Subject));
    let rig = Rig::start(factory, &[&per_operation, &daily]).await;
    let set = [&per_operation, &daily];
    let on = |operation, who| rig.set_request(&set, operation, who, 1, EvaluationId::random());
    rig.at(0);
    let admitted = |op, shared| {
        set_outcome(true, &[per_operation.allows(op, 60_000), daily.allows(shared, 60_000)])
    };
    rig.expect_set("a on /a", on("GET /a", "alice"), admitted(9, 2)).await;
    rig.expect_set("a on /b: its own per-op budget", on("GET /b", "alice"), admitted(9, 1)).await;
    rig.expect_set("a on /a again", on("GET /a", "alice"), admitted(8, 0)).await;
    let refused =
        set_outcome(false, &[per_operation.allows(9, 60_000), daily.denies(0, 60_000, 60_000)]);
    rig.expect_set("the shared budget is spent", on("GET /b", "alice"), refused).await;
    // Another set listing the policy sees the same spent budget.
    let alone = rig.set_request(&[&daily], "GET /c", "alice", 1, EvaluationId::random());
    rig.expect_set("a third operation", alone, daily.denied(0, 60_000, 60_000)).await;
    rig.expect_set("another subject", on("GET /b", "bob"), admitted(9, 2)).await;
}

/// A shadow policy is evaluated and charged on its own allow, never
/// blocks, and is charged nothing when an enforced policy refuses.
pub async fn policy_set_shadow_never_blocks_and_is_charged_only_on_its_own_allow(
    factory: &dyn ProviderFactory,
) {
    let enforced = CheckPolicy::new(fixed_window("enforced", 10, 1000));
    let shadow = CheckPolicy::new(fixed_window("shadow", 1, 1000).mode(PolicyMode::Shadow));
    let tight = CheckPolicy::new(fixed_window("tight", 1, 1000));
    let watch = CheckPolicy::new(fixed_window("watch", 5, 60_000).mode(PolicyMode::Shadow));
    let rig = Rig::start(factory, &[&enforced, &shadow, &tight, &watch]).await;
    rig.at(0);
    let pair = [&enforced, &shadow];
    let ask = |set: &[&CheckPolicy], who| {
        rig.set_request(set, "GET /orders", who, 1, EvaluationId::random())
    };
    let first = set_outcome(true, &[enforced.allows(9, 1000), shadow.allows(0, 1000)]);
    rig.expect_set("both allow", ask(&pair, "alice"), first).await;
    let second = set_outcome(true, &[enforced.allows(8, 1000), shadow.denies(0, 1000, 1000)]);
    rig.expect_set("the shadow denies and blocks nothing", ask(&pair, "alice"), second).await;
    let alone = set_outcome(true, &[shadow.denies(0, 1000, 1000)]);
    rig.expect_set("a set of the shadow alone", ask(&[&shadow], "alice"), alone).await;

    let guarded = [&tight, &watch];
    let first = set_outcome(true, &[tight.allows(0, 1000), watch.allows(4, 60_000)]);
    rig.expect_set("both allow", ask(&guarded, "bob"), first).await;
    let refused = set_outcome(false, &[tight.denies(0, 1000, 1000), watch.allows(4, 60_000)]);
    rig.expect_set("the enforced denies: the shadow is spared", ask(&guarded, "bob"), refused)
        .await;
    rig.at(1000);
    // 4 -> 3: the refusal charged the shadow nothing.
    let next = set_outcome(true, &[tight.allows(0, 1000), watch.allows(3, 59_000)]);
    rig.expect_set("next window", ask(&guarded, "bob"), next).await;
}

/// A repeat of an evaluation id replays the whole set: recorded policies
/// answer their record, the others their budget as it stands, and nothing
/// is charged anywhere.
pub async fn policy_set_repeat_replays_the_whole_set(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 5, 1000));
    let shadow = CheckPolicy::new(fixed_window("shadow", 1, 1000).mode(PolicyMode::Shadow));
    let rig = Rig::start(factory, &[&fw, &shadow]).await;
    let set = [&fw, &shadow];
    let ask = |id| rig.set_request(&set, "GET /orders", "alice", 1, id);
    let (x, y) = (EvaluationId::random(), EvaluationId::random());
    rig.at(0);
    rig.expect_set("x", ask(x), set_outcome(true, &[fw.allows(4, 1000), shadow.allows(0, 1000)]))
        .await;
    let second = set_outcome(true, &[fw.allows(3, 1000), shadow.denies(0, 1000, 1000)]);
    rig.expect_set("y: the shadow denies, so it records nothing", ask(y), second).await;
    rig.at(300);
    let again = set_outcome(true, &[fw.replays(3, 1000), shadow.denies(0, 700, 700)]);
    rig.expect_set("y again replays; the shadow answers as it stands", ask(y), again).await;
    let again = set_outcome(true, &[fw.replays(4, 1000), shadow.replays(0, 1000)]);
    rig.expect_set("x again replays both records", ask(x), again).await;
    // 3 left: neither replay charged.
    let fresh = set_outcome(true, &[fw.allows(2, 700), shadow.denies(0, 700, 700)]);
    rig.expect_set("a fresh id", ask(EvaluationId::random()), fresh).await;
}

/// The cost must fit every policy of the set; one that does not is
/// `Incompatible(CostExceedsMaximum)` and charges nothing.
pub async fn policy_set_cost_fits_every_policy(factory: &dyn ProviderFactory) {
    let wide = CheckPolicy::new(fixed_window("wide", 5, 1000).maximum_cost(5));
    let narrow = CheckPolicy::new(fixed_window("narrow", 5, 1000).maximum_cost(2));
    let rig = Rig::start(factory, &[&wide, &narrow]).await;
    let set = [&wide, &narrow];
    let costing = |cost| rig.set_request(&set, "POST /bulk", "alice", cost, EvaluationId::random());
    rig.at(0);
    let too_much =
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::CostExceedsMaximum });
    rig.expect_set("above the narrow maximum", costing(3), too_much.clone()).await;
    rig.expect_set("zero", costing(0), too_much).await;
    // 5 - 2 = 3 on both: the refused costs charged nothing.
    let charged = set_outcome(true, &[wide.allows(3, 1000), narrow.allows(3, 1000)]);
    rig.expect_set("cost 2 charges 2 on each", costing(2), charged).await;
}

/// A caller clock beyond the bound of any key of the set is `ClockUnsafe`
/// and no key of the set changes.
pub async fn policy_set_clock_unsafe_on_any_key_changes_no_key(factory: &dyn ProviderFactory) {
    let shared = CheckPolicy::new(fixed_window("shared", 5, 60_000).scope(PolicyScope::Subject));
    let own = CheckPolicy::new(fixed_window("own", 5, 60_000));
    let rig = Rig::start(factory, &[&shared, &own]).await;
    let alone = [&shared];
    let set = [&own, &shared];
    rig.at(5000);
    let first = rig.set_request(&alone, "GET /x", "alice", 1, EvaluationId::random());
    rig.expect_set("the shared key's mark moves to T0+5000", first, shared.allowed(4, 55_000))
        .await;
    rig.at(3000);
    // 2000 ms behind the shared key, 1000 beyond the 1 s bound.
    let lagging = rig.set_request(&set, "GET /y", "alice", 1, EvaluationId::random());
    let unsafe_clock = Err(RateLimitFailure::Unavailable {
        category: UnavailableCategory::ClockUnsafe,
        retry_after: ms(1000),
    });
    rig.expect_set("one key is beyond the bound", lagging, unsafe_clock).await;
    rig.at(5000);
    // Neither key was charged: own 5 -> 4, shared 4 -> 3.
    let after = rig.set_request(&set, "GET /y", "alice", 1, EvaluationId::random());
    rig.expect_set(
        "both charge now",
        after,
        set_outcome(true, &[own.allows(4, 55_000), shared.allows(3, 55_000)]),
    )
    .await;
}

/// A set naming a policy the provider lacks is `Incompatible(UnknownPolicy)`
/// and charges nothing.
pub async fn policy_set_with_an_unknown_policy_is_incompatible(factory: &dyn ProviderFactory) {
    let known = CheckPolicy::new(fixed_window("known", 3, 1000));
    let missing = CheckPolicy::new(fixed_window("missing", 3, 1000));
    let rig = Rig::start(factory, &[&known]).await;
    rig.at(0);
    let unknown =
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::UnknownPolicy });
    for set in [[&known, &missing], [&missing, &known]] {
        let request = rig.set_request(&set, "GET /x", "alice", 1, EvaluationId::random());
        rig.expect_set("a missing policy", request, unknown.clone()).await;
    }
    rig.expect("the known policy was not charged", &known, "alice", 1, known.allowed(2, 1000))
        .await;
}
