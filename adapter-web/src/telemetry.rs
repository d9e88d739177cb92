//! Decision metrics through the `metrics` facade.

use std::fmt;
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram, SharedString};
use shared_contract::{
    DecisionSource, PolicyId, PolicyMode, RateLimitFailure, RateLimitOutcome, RateLimitOutcomeExt,
    RateLimitPolicy,
};

use crate::answer::Refusal;

pub use shared_contract::{
    DECISIONS_TOTAL, EVALUATION_SECONDS, FRONT_HTTP, SETTLES_TOTAL, metric_name,
};

/// The prefix of every metric the service exports.
pub const METRIC_PREFIX: &str = metric_name!("");

/// Counter of in-flight lease releases that failed or were still running
/// at shutdown; registered at 0 when a bridge is built.
pub const LEASE_RELEASE_FAILURES_TOTAL: &str =
    metric_name!("rate_limit_lease_release_failures_total");

/// The `outcome` label of every decision the degraded mode made.
const DEGRADED: &str = DecisionSource::Degraded.name();

/// Every `outcome` label, whose positions index a member's counters.
static OUTCOMES: LazyLock<Box<[&'static str]>> = LazyLock::new(|| {
    RateLimitFailure::outcome_names()
        .chain([DEGRADED])
        .chain(Refusal::BEFORE_EVALUATION.map(|r| r.outcome_label()))
        .collect()
});

/// The metric handles of one member of a policy set, each registered on first use.
#[derive(Debug)]
pub(crate) struct MemberMetrics {
    policy: SharedString,
    algorithm: &'static str,
    mode: &'static str,
    /// Two slots per entry of [`OUTCOMES`]: not cached, then cached.
    decisions: Box<[OnceLock<Counter>]>,
    evaluation: OnceLock<Histogram>,
}

impl MemberMetrics {
    /// The handles of member `policy` as the port holds it (`None` when it does not).
    pub(crate) fn new(policy: &str, described: Option<&RateLimitPolicy>) -> Self {
        Self {
            // Registering a handle bumps a count, never copies the id.
            policy: SharedString::from(std::sync::Arc::<str>::from(policy)),
            algorithm: described.map_or("unknown", |policy| policy.algorithm().name()),
            // A policy the port does not hold counts as enforced (it fails closed).
            mode: described.map_or(PolicyMode::Enforce, RateLimitPolicy::mode).name(),
            decisions: OUTCOMES.iter().flat_map(|_| [OnceLock::new(), OnceLock::new()]).collect(),
            evaluation: OnceLock::new(),
        }
    }

    fn count_decision(&self, outcome: &'static str, cached: bool) {
        let register = || {
            metrics::counter!(
                DECISIONS_TOTAL,
                "policy" => self.policy.clone(),
                "algorithm" => self.algorithm,
                "outcome" => outcome,
                "mode" => self.mode,
                "cached" => if cached { "true" } else { "false" },
                "front" => FRONT_HTTP,
            )
        };
        let slot = OUTCOMES.iter().position(|known| *known == outcome);
        match slot.and_then(|slot| self.decisions.get(slot * 2 + usize::from(cached))) {
            Some(handle) => handle.get_or_init(register).increment(1),
            // A label missed in OUTCOMES is still counted, without a kept handle.
            None => register().increment(1),
        }
    }

    fn observe(&self, elapsed: Duration) {
        self.evaluation
            .get_or_init(|| {
                metrics::histogram!(
                    EVALUATION_SECONDS,
                    "policy" => self.policy.clone(),
                    "algorithm" => self.algorithm,
                    "front" => FRONT_HTTP,
                )
            })
            .record(elapsed.as_secs_f64());
    }
}

/// Counts an evaluated set: each policy's decision, `degraded`, or the failure.
pub(crate) fn record_evaluation(
    members: &[MemberMetrics],
    outcome: &RateLimitOutcome,
    elapsed: Duration,
) {
    let decisions = outcome.as_ref().map_or(&[][..], |set| set.decisions());
    let source = outcome.as_ref().map_or(DecisionSource::Store, |set| set.source());
    let (degraded, cached) =
        (source == DecisionSource::Degraded, source == DecisionSource::LocalCache);
    for (index, member) in members.iter().enumerate() {
        let outcome = match decisions.get(index) {
            Some(_) if degraded => DEGRADED,
            Some(decision) if decision.allowed => "allowed",
            Some(_) => "denied",
            None => outcome.category_name(),
        };
        member.count_decision(outcome, cached);
        member.observe(elapsed);
    }
}

/// Counts a request refused before evaluation once per policy of its set.
pub(crate) fn record_rejection(members: &[MemberMetrics], outcome: &'static str) {
    for member in members {
        member.count_decision(outcome, false);
    }
}

/// Policy ids joined with commas, formatted only when a log line is kept.
pub(crate) struct PolicyIds<'a>(pub(crate) &'a [PolicyId]);

impl fmt::Display for PolicyIds<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.0.iter().map(PolicyId::as_str);
        f.write_str(ids.next().unwrap_or_default())?;
        ids.try_for_each(|id| write!(f, ",{id}"))
    }
}
