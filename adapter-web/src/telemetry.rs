//! Decision metrics through the `metrics` facade. Labels carry the policy,
//! its algorithm and the outcome category, never a subject.

use std::time::Duration;

use shared_contract::{PolicyId, RateLimitOutcome, RateLimitPolicy};

/// Counter of decisions: labels `policy`, `algorithm`, `outcome`.
pub const DECISIONS_TOTAL: &str = "ca_rate_limit_decisions_total";
/// Histogram of port evaluation time in seconds: labels `policy`, `algorithm`.
pub const EVALUATION_SECONDS: &str = "ca_rate_limit_evaluation_seconds";

/// The `algorithm` label when the port does not hold the policy.
const UNKNOWN_ALGORITHM: &str = "unknown";

fn algorithm(policy: Option<&RateLimitPolicy>) -> &'static str {
    policy.map_or(UNKNOWN_ALGORITHM, |policy| policy.algorithm().name())
}

pub(crate) fn record_evaluation(
    policy_id: &PolicyId,
    policy: Option<&RateLimitPolicy>,
    outcome: &RateLimitOutcome,
    elapsed: Duration,
) {
    let (policy_label, algorithm) = (policy_id.to_string(), algorithm(policy));
    metrics::counter!(
        DECISIONS_TOTAL,
        "policy" => policy_label.clone(),
        "algorithm" => algorithm,
        "outcome" => outcome.category_name(),
    )
    .increment(1);
    metrics::histogram!(EVALUATION_SECONDS, "policy" => policy_label, "algorithm" => algorithm)
        .record(elapsed.as_secs_f64());
}

pub(crate) fn record_rejection(
    policy_id: &PolicyId,
    policy: Option<&RateLimitPolicy>,
    outcome: &'static str,
) {
    metrics::counter!(
        DECISIONS_TOTAL,
        "policy" => policy_id.to_string(),
        "algorithm" => algorithm(policy),
        "outcome" => outcome,
    )
    .increment(1);
}
