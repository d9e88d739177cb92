//! A key is one (policy id, policy revision, subject digest): budgets of
//! different keys never touch each other.

use shared_contract::{IncompatibleCategory, RateLimitFailure, RateLimitOutcome};

use crate::factory::ProviderFactory;
use crate::rig::{
    CheckPolicy, Rig, concurrency, fixed_window, gcra, sliding_counter, token_bucket,
};

/// Exhausting one subject leaves every other subject's budget whole, for
/// every algorithm.
pub async fn subjects_are_isolated(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5));
    let cc = CheckPolicy::new(concurrency("cc", 2, 30_000, 700));
    let rig = Rig::start(factory, &[&fw, &sc, &tb, &g, &cc]).await;
    rig.at(0);
    rig.drain(&cc, "alice", 2).await;
    rig.drain(&fw, "alice", 3).await;
    rig.drain(&sc, "alice", 10).await;
    rig.drain(&tb, "alice", 5).await;
    rig.drain(&g, "alice", 5).await;
    // Whole budgets for bob: fw 3 - 1, sc 10 - 1, tb 5 - 1 (reset 100).
    rig.expect("bob", &fw, "bob", 1, fw.allowed(2, 1000)).await;
    rig.expect("bob", &sc, "bob", 1, sc.allowed(9, 1000)).await;
    rig.expect("bob", &tb, "bob", 1, tb.allowed(4, 100)).await;
    rig.expect("bob", &g, "bob", 1, g.allowed(4, 100)).await;
    rig.expect("bob", &cc, "bob", 1, cc.allowed(1, 0)).await;
    // Alice stays exhausted: fw retry = reset = 1000; sc next window
    // x' = 1000 - floor(9999 / 10) = 1, retry 1001; tb retry 100, reset 500.
    rig.expect("alice", &fw, "alice", 1, fw.denied(0, 1000, 1000)).await;
    rig.expect("alice", &sc, "alice", 1, sc.denied(0, 1001, 1000)).await;
    rig.expect("alice", &tb, "alice", 1, tb.denied(0, 100, 500)).await;
    // g: d = 500000, the next cell 100 ms on.
    rig.expect("alice", &g, "alice", 1, g.denied(0, 100, 100)).await;
    // cc: both of alice's leases held, the configured retry-after.
    rig.expect("alice", &cc, "alice", 1, cc.denied(0, 700, 0)).await;
}

/// Two policies with the same parameters keep separate budgets for the same
/// subject.
pub async fn policies_are_isolated(factory: &dyn ProviderFactory) {
    let first = CheckPolicy::new(fixed_window("fw-a", 3, 1000));
    let second = CheckPolicy::new(fixed_window("fw-b", 3, 1000));
    let rig = Rig::start(factory, &[&first, &second]).await;
    rig.at(0);
    rig.drain(&first, "alice", 3).await;
    rig.expect("first exhausted", &first, "alice", 1, first.denied(0, 1000, 1000)).await;
    rig.expect("second whole", &second, "alice", 1, second.allowed(2, 1000)).await;
}

/// A new revision of a policy starts from a whole budget and never reads
/// the old revision's counters; going back finds the old state untouched.
pub async fn policy_revisions_are_isolated(factory: &dyn ProviderFactory) {
    let revision_1 = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let revision_2 = CheckPolicy::new(fixed_window("fw", 3, 1000).revision(2));
    let mut rig = Rig::start(factory, &[&revision_1]).await;
    rig.at(0);
    rig.drain(&revision_1, "alice", 3).await;
    rig.expect("revision 1 exhausted", &revision_1, "alice", 1, revision_1.denied(0, 1000, 1000))
        .await;
    rig.rebuild(&[&revision_2]).await;
    rig.expect("revision 2 whole", &revision_2, "alice", 1, revision_2.allowed(2, 1000)).await;
    rig.rebuild(&[&revision_1]).await;
    rig.expect("revision 1 again", &revision_1, "alice", 1, revision_1.denied(0, 1000, 1000)).await;
    rig.rebuild(&[&revision_2]).await;
    // Revision 2 kept its one charge: n = 2, remaining 1.
    rig.expect("revision 2 again", &revision_2, "alice", 1, revision_2.allowed(1, 1000)).await;
}

/// A policy that changes its algorithm but keeps its id and revision meets
/// state it cannot read (docs/algorithms.md, "Order of an evaluation", step
/// 3): `Incompatible(StateIncompatible)` for a subject with state, and that
/// state is left as it was; a subject without state is evaluated normally.
/// Changing the algorithm takes a new revision.
pub async fn algorithm_change_without_a_new_revision_is_state_incompatible(
    factory: &dyn ProviderFactory,
) {
    const STATE_INCOMPATIBLE: RateLimitOutcome =
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible });
    let fixed = CheckPolicy::new(fixed_window("p", 3, 1000));
    let bucket = CheckPolicy::new(token_bucket("p", 5, 1, 100));
    let sliding = CheckPolicy::new(sliding_counter("p", 10, 1000));
    let mut rig = Rig::start(factory, &[&fixed]).await;
    rig.at(0);
    rig.expect("fixed window charges", &fixed, "alice", 1, fixed.allowed(2, 1000)).await;
    rig.rebuild(&[&bucket]).await;
    rig.expect("bucket meets fixed-window state", &bucket, "alice", 1, STATE_INCOMPATIBLE).await;
    // No state: a full bucket of 5 gives one token, refilled after one period.
    rig.expect("bucket for a new subject", &bucket, "bob", 1, bucket.allowed(4, 100)).await;
    rig.rebuild(&[&sliding]).await;
    rig.expect("sliding meets fixed-window state", &sliding, "alice", 1, STATE_INCOMPATIBLE).await;
    rig.expect("sliding meets bucket state", &sliding, "bob", 1, STATE_INCOMPATIBLE).await;
    let cells = CheckPolicy::new(gcra("p", 10, 1000, 5));
    rig.rebuild(&[&cells]).await;
    rig.expect("gcra meets fixed-window state", &cells, "alice", 1, STATE_INCOMPATIBLE).await;
    rig.expect("gcra meets bucket state", &cells, "bob", 1, STATE_INCOMPATIBLE).await;
    rig.expect("gcra for a new subject", &cells, "carol", 1, cells.allowed(4, 100)).await;
    rig.rebuild(&[&bucket]).await;
    rig.expect("bucket meets gcra state", &bucket, "carol", 1, STATE_INCOMPATIBLE).await;
    let leases = CheckPolicy::new(concurrency("p", 2, 30_000, 1000));
    rig.rebuild(&[&leases]).await;
    rig.expect("leases meet fixed-window state", &leases, "alice", 1, STATE_INCOMPATIBLE).await;
    rig.expect("leases meet gcra state", &leases, "carol", 1, STATE_INCOMPATIBLE).await;
    rig.expect("leases for a new subject", &leases, "dave", 1, leases.allowed(1, 0)).await;
    rig.rebuild(&[&fixed]).await;
    // The fixed window kept its one charge: n = 2, remaining 1.
    rig.expect("fixed window untouched", &fixed, "alice", 1, fixed.allowed(1, 1000)).await;
    rig.expect("fixed window meets leases", &fixed, "dave", 1, STATE_INCOMPATIBLE).await;
}
