//! Rules every decision of every algorithm keeps (docs/algorithms.md, the
//! paragraph after "Order of an evaluation"): the policy a provider
//! describes has `limit` `L` or `C` and certainty `ApproximateAlgorithm`
//! for the sliding counter only,
//! `retry_after` is 0 when allowed and at least 1 ms when denied, and a
//! denial's `retry_after` is the smallest wait after which the same request
//! passes with no other traffic.

use shared_contract::{Certainty, EvaluationId, RateLimitDecision, RateLimitOutcome};

use crate::factory::ProviderFactory;
use crate::rig::{
    CheckPolicy, Rig, concurrency, fixed_window, gcra, one_decision, sliding_counter, token_bucket,
};

/// Allowed, denied and replayed decisions all come with the policy the
/// provider describes, whose limit and certainty are the algorithm's (a
/// decision carries only what varies).
pub async fn decisions_report_limit_and_certainty(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    // A GCRA decision's limit is its burst, not its steady-rate limit.
    let g = CheckPolicy::new(gcra("g", 10, 1000, 4));
    // A concurrency decision's limit is its max-in-flight; its lease id
    // replays without a dedupe policy.
    let cc = CheckPolicy::new(concurrency("cc", 2, 30_000, 1000));
    let rig = Rig::start(factory, &[&fw, &sc, &tb, &g, &cc]).await;
    rig.at(0);
    let cases = [
        (&fw, 3, Certainty::Certain),
        (&sc, 10, Certainty::ApproximateAlgorithm),
        (&tb, 5, Certainty::Certain),
        (&g, 4, Certainty::Certain),
        (&cc, 2, Certainty::Certain),
    ];
    for (policy, limit, certainty) in cases {
        let id = EvaluationId::random();
        let mut seen = Vec::new();
        seen.push(decision_of(rig.ask(rig.request(policy.id(), "alice", 1, id)).await));
        seen.push(decision_of(rig.ask(rig.request(policy.id(), "alice", 1, id)).await));
        rig.drain(policy, "alice", limit - 1).await;
        seen.push(rig.decide(policy, "alice", 1).await);
        let kinds: Vec<(bool, bool)> = seen.iter().map(|d| (d.allowed, d.replayed)).collect();
        assert_eq!(kinds, [(true, false), (true, true), (false, false)], "{}", policy.id());
        let described = rig.port().policy(policy.id()).expect("the provider holds the policy");
        let algorithm = described.algorithm();
        assert_eq!(
            (described.limit(), algorithm.certainty()),
            (limit, certainty),
            "{}",
            policy.id()
        );
    }
}

fn decision_of(outcome: RateLimitOutcome) -> RateLimitDecision {
    match outcome {
        Ok(set) => one_decision(&set),
        Err(_) => panic!("expected a decision, got {outcome:?}"),
    }
}

/// A pseudo-random walk of requests with mixed costs and gaps. Every allowed
/// decision has `retry_after == 0`; every denial has `retry_after = r >= 1`
/// and is exact: the same request is still denied at `t + r - 1` (with a
/// 1 ms wait left) and passes at `t + r`.
pub async fn retry_after_is_zero_when_allowed_and_minimal_when_denied(
    factory: &dyn ProviderFactory,
) {
    let policies = [
        CheckPolicy::new(fixed_window("fw", 3, 100).maximum_cost(2)),
        CheckPolicy::new(sliding_counter("sc", 5, 100).maximum_cost(3)),
        CheckPolicy::new(token_bucket("tb", 4, 2, 30).maximum_cost(3)),
        // T = ceil(100000 / 3) = 33334 us: every wait is rounded up from
        // microseconds.
        CheckPolicy::new(gcra("g", 3, 100, 4).maximum_cost(3)),
    ];
    for policy in &policies {
        // One rig per policy, so each walk owns its clock.
        let rig = Rig::start(factory, &[policy]).await;
        let mut walk = Walk(0x9e37_79b9_7f4a_7c15);
        let mut t = 0;
        let mut denials = 0;
        for _ in 0..60 {
            let cost = 1 + walk.next() % policy.policy().maximum_cost();
            rig.at(t);
            let decision = rig.decide(policy, "alice", cost).await;
            if decision.allowed {
                assert_eq!(decision.retry_after_ms, 0, "allowed at {}: {decision:?}", rig.now());
                // Bursts: three times in four the next request comes at once.
                t += if walk.next() % 4 == 0 { walk.next() % 60 } else { 0 };
                continue;
            }
            denials += 1;
            let wait = decision.retry_after_ms;
            assert!(wait >= 1, "denied at {} with retry_after {wait} ms", rig.now());
            if wait > 1 {
                rig.at(t + wait - 1);
                let early = rig.decide(policy, "alice", cost).await;
                assert!(
                    !early.allowed && early.retry_after_ms == 1,
                    "cost {cost} denied at T0{t:+} with retry {wait} ms; 1 ms before that: {early:?}"
                );
            }
            t += wait;
            rig.at(t);
            let retry = rig.decide(policy, "alice", cost).await;
            assert!(
                retry.allowed,
                "cost {cost} retried after {wait} ms at {}: {retry:?}",
                rig.now()
            );
        }
        assert!(denials >= 5, "the walk under {} must hit the limit, got {denials}", policy.id());
    }
}

/// A xorshift64 step: a fixed, reproducible sequence of costs and gaps.
struct Walk(u64);

impl Walk {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_is_reproducible_and_varied() {
        let mut first = Walk(0x9e37_79b9_7f4a_7c15);
        let mut second = Walk(0x9e37_79b9_7f4a_7c15);
        let a: Vec<u64> = (0..100).map(|_| first.next() % 4).collect();
        let b: Vec<u64> = (0..100).map(|_| second.next() % 4).collect();
        assert_eq!(a, b);
        for residue in 0..4 {
            assert!(a.contains(&residue), "residue {residue} never drawn");
        }
    }
}
