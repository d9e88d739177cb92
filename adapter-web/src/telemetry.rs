//! Decision metrics through the `metrics` facade. Labels carry the policy,
//! its algorithm, the outcome and the policy's mode, never a subject.

use std::time::Duration;

use metrics::SharedString;
use shared_contract::{PolicyMode, RateLimitOutcome, RateLimitPolicy};

/// Counter of decisions, one per policy of each evaluated set: labels
/// `policy`, `algorithm`, `outcome`, `mode` (`enforce` or `shadow`) and
/// `cached` (`true` when the provider answered from its local denial cache
/// without asking its store).
pub const DECISIONS_TOTAL: &str = "ca_rate_limit_decisions_total";
/// Histogram of port evaluation time in seconds, one observation per policy
/// of the set (the set is one evaluation, so each sees the same time):
/// labels `policy`, `algorithm`.
pub const EVALUATION_SECONDS: &str = "ca_rate_limit_evaluation_seconds";

/// The `algorithm` label when the port does not hold the policy.
const UNKNOWN_ALGORITHM: &str = "unknown";

fn algorithm(policy: Option<&RateLimitPolicy>) -> &'static str {
    policy.map_or(UNKNOWN_ALGORITHM, |policy| policy.algorithm().name())
}

/// A policy the port does not hold counts as enforced (it fails closed).
fn mode(policy: Option<&RateLimitPolicy>) -> &'static str {
    policy.map_or(PolicyMode::Enforce, RateLimitPolicy::mode).name()
}

/// Counts an evaluated set: for each policy, `outcome` is its own decision
/// (`allowed` or `denied`, so a shadow policy that would deny is counted
/// `denied` with `mode="shadow"`), or the failure category when the set
/// failed as a whole. `labels` and `described` follow the set's order.
pub(crate) fn record_evaluation(
    labels: &[SharedString],
    described: &[Option<RateLimitPolicy>],
    outcome: &RateLimitOutcome,
    elapsed: Duration,
) {
    let (decisions, cached) = match outcome {
        RateLimitOutcome::Evaluated(set) => (set.decisions(), set.cached()),
        RateLimitOutcome::Unavailable { .. }
        | RateLimitOutcome::Incompatible { .. }
        | RateLimitOutcome::Indeterminate { .. } => (&[][..], false),
    };
    let cached = if cached { "true" } else { "false" };
    for (index, (label, policy)) in labels.iter().zip(described).enumerate() {
        let policy = policy.as_ref();
        let outcome = match decisions.get(index) {
            Some(decision) if decision.allowed => "allowed",
            Some(_) => "denied",
            None => outcome.category_name(),
        };
        metrics::counter!(
            DECISIONS_TOTAL,
            "policy" => label.clone(),
            "algorithm" => algorithm(policy),
            "outcome" => outcome,
            "mode" => mode(policy),
            "cached" => cached,
        )
        .increment(1);
        metrics::histogram!(EVALUATION_SECONDS, "policy" => label.clone(), "algorithm" => algorithm(policy))
            .record(elapsed.as_secs_f64());
    }
}

/// Counts a request refused before evaluation once per policy of its set.
pub(crate) fn record_rejection(
    labels: &[SharedString],
    described: &[Option<RateLimitPolicy>],
    outcome: &'static str,
) {
    for (label, policy) in labels.iter().zip(described) {
        let policy = policy.as_ref();
        metrics::counter!(
            DECISIONS_TOTAL,
            "policy" => label.clone(),
            "algorithm" => algorithm(policy),
            "outcome" => outcome,
            "mode" => mode(policy),
            "cached" => "false",
        )
        .increment(1);
    }
}
