//! Evaluations that arrive together on one key are applied one at a time:
//! no lost update admits more than the limit. The requests are joined in
//! one task (this crate has no runtime to spawn on), so they interleave at
//! every await point of the provider.

use futures::future::join_all;
use shared_contract::EvaluationId;

use crate::factory::ProviderFactory;
use crate::rig::{
    CheckPolicy, Rig, concurrency, fixed_window, gcra, sliding_counter, tally, token_bucket,
};

/// Thirty concurrent requests against a budget of twenty, for every
/// algorithm (twenty leases in flight for a concurrency policy): exactly
/// twenty pass, with remaining 19, 18, ..., 0 each once.
pub async fn concurrent_evaluations_admit_exactly_the_limit(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 20, 1000));
    let sc = CheckPolicy::new(sliding_counter("sc", 20, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 20, 1, 1000));
    let g = CheckPolicy::new(gcra("g", 1, 1000, 20));
    let cc = CheckPolicy::new(concurrency("cc", 20, 30_000, 1000));
    let rig = Rig::start(factory, &[&fw, &sc, &tb, &g, &cc]).await;
    rig.at(0);
    // Each winner saw a distinct count: remaining 0, 1, ..., 19, and ten lost.
    let remaining_each_once: Vec<u64> = (0..20).collect();
    for policy in [&fw, &sc, &tb, &g, &cc] {
        let outcomes = join_all(
            (0..30).map(|_| rig.ask(rig.request(policy.id(), "alice", 1, EvaluationId::random()))),
        )
        .await;
        assert_eq!(
            tally(&outcomes),
            (remaining_each_once.clone(), 10),
            "{}: {outcomes:?}",
            policy.id()
        );
    }
}
