//! Decision metrics of the RLS front end: the HTTP edge's decision counter
//! and evaluation histogram with `front="envoy-rls"`, each member's handles registered once and
//! kept, so a request bumps counters without building labels; and two
//! counters of its own.

use std::sync::{Arc, LazyLock, OnceLock};

use std::time::Duration;

use metrics::{Counter, Histogram, SharedString};
use shared_contract::{
    DECISIONS_TOTAL, DecisionSource, EVALUATION_SECONDS, FRONT_ENVOY_RLS, PolicyMode,
    RateLimitFailure, RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy,
    RateLimitRequest as PortRequest, metric_name,
};
use tracing::Span;

/// Counter of descriptors that matched no rule (or named an unknown
/// domain, or matched a rule that does not limit them): answered `OK`
/// without a provider call. No labels: a domain or
/// a value a client sends never becomes a label.
pub const UNMATCHED_DESCRIPTORS_TOTAL: &str = metric_name!("envoy_rls_unmatched_descriptors_total");
/// Counter of descriptors that matched an `unlimited = true` rule:
/// answered `OK` without a provider call. No labels, as unmatched.
pub const UNLIMITED_DESCRIPTORS_TOTAL: &str = metric_name!("envoy_rls_unlimited_descriptors_total");
/// Counter of descriptors that matched a blocking rule: answered
/// `OVER_LIMIT` without a provider call. No labels, as unmatched.
pub const BLOCKED_DESCRIPTORS_TOTAL: &str = metric_name!("envoy_rls_blocked_descriptors_total");
/// Counter of descriptors whose `limit` override was ignored: their rule
/// does not set `allow_override`, or its engine holds as many effective
/// limits as it may (`MAX_HELD_OVERRIDES`).
pub const LIMIT_OVERRIDES_IGNORED_TOTAL: &str =
    metric_name!("envoy_rls_limit_overrides_ignored_total");

/// Every `outcome` label a member is counted under (the outcome
/// categories, and `degraded`); its positions index the member's counters.
static OUTCOMES: LazyLock<Box<[&'static str]>> = LazyLock::new(|| {
    RateLimitFailure::outcome_names().chain([DecisionSource::Degraded.name()]).collect()
});

/// The metric handles of one policy of a rule.
#[derive(Debug)]
pub(crate) struct MemberMetrics {
    policy: SharedString,
    algorithm: &'static str,
    mode: &'static str,
    /// Two per outcome (not cached, then cached), and one for a label
    /// missing from [`OUTCOMES`] (none is).
    decisions: Box<[OnceLock<Counter>]>,
    /// The HTTP edge's evaluation histogram, `front="envoy-rls"`.
    evaluation: OnceLock<Histogram>,
}

impl MemberMetrics {
    pub(crate) fn new(policy: &str, described: Option<&RateLimitPolicy>) -> Self {
        Self {
            policy: SharedString::from(Arc::<str>::from(policy)),
            algorithm: described.map_or("unknown", |policy| policy.algorithm().name()),
            mode: described.map_or(PolicyMode::Enforce, RateLimitPolicy::mode).name(),
            decisions: (0..=OUTCOMES.len() * 2).map(|_| OnceLock::new()).collect(),
            evaluation: OnceLock::new(),
        }
    }

    fn count(&self, outcome: &'static str, cached: bool) {
        let register = || {
            metrics::counter!(
                DECISIONS_TOTAL,
                "policy" => self.policy.clone(),
                "algorithm" => self.algorithm,
                "outcome" => outcome,
                "mode" => self.mode,
                "cached" => if cached { "true" } else { "false" },
                "front" => FRONT_ENVOY_RLS,
            )
        };
        let slot = match OUTCOMES.iter().position(|known| *known == outcome) {
            Some(position) => position * 2 + usize::from(cached),
            None => OUTCOMES.len() * 2,
        };
        // The spare slot is shared, so it is never kept for one label.
        if slot == OUTCOMES.len() * 2 {
            register().increment(1);
            return;
        }
        self.decisions[slot].get_or_init(register).increment(1);
    }

    /// Counts this member's part of an outcome: its own decision, or the
    /// failure's category.
    pub(crate) fn record(&self, outcome: &RateLimitOutcome, index: usize) {
        match outcome {
            // As the HTTP edge counts it: a degraded set's decisions are
            // `degraded`, whatever each said.
            Ok(set) if set.source() == DecisionSource::Degraded => {
                self.count(DecisionSource::Degraded.name(), false);
            }
            Ok(set) => {
                let allowed = set.decisions().get(index).is_some_and(|decision| decision.allowed);
                self.count(if allowed { "allowed" } else { "denied" }, set.cached());
            }
            Err(RateLimitFailure::Unavailable { .. })
            | Err(RateLimitFailure::Incompatible { .. })
            | Err(RateLimitFailure::Indeterminate { .. }) => {
                self.count(outcome.category_name(), false);
            }
        }
    }

    /// Records how long the port took to evaluate this member's set.
    pub(crate) fn observe(&self, elapsed: Duration) {
        self.evaluation
            .get_or_init(|| {
                metrics::histogram!(
                    EVALUATION_SECONDS,
                    "policy" => self.policy.clone(),
                    "algorithm" => self.algorithm,
                    "front" => FRONT_ENVOY_RLS,
                )
            })
            .record(elapsed.as_secs_f64());
    }

    /// Counts a look-only answer (`hits_addend` 0): `allowed` or `denied`.
    pub(crate) fn record_look(&self, allowed: bool) {
        self.count(if allowed { "allowed" } else { "denied" }, false);
    }
}

/// The counters of the front end itself, registered when the engine is
/// built (after the recorder is installed).
#[derive(Debug)]
pub(crate) struct FrontMetrics {
    pub(crate) unmatched: Counter,
    pub(crate) unlimited: Counter,
    pub(crate) blocked: Counter,
    pub(crate) overrides: Counter,
}

impl FrontMetrics {
    pub(crate) fn new() -> Self {
        Self {
            unmatched: metrics::counter!(UNMATCHED_DESCRIPTORS_TOTAL),
            unlimited: metrics::counter!(UNLIMITED_DESCRIPTORS_TOTAL),
            blocked: metrics::counter!(BLOCKED_DESCRIPTORS_TOTAL),
            overrides: metrics::counter!(LIMIT_OVERRIDES_IGNORED_TOTAL),
        }
    }
}

/// The `rate_limit.decision` span of one policy set's evaluation, as on
/// HTTP: a child of the call's span, `None` when the call has none (it is
/// not traced). The operation is the rule's digest and the subject its
/// pseudonym: no raw descriptor value ever reaches a span.
pub(crate) fn decision_span(request: &PortRequest) -> Option<Span> {
    // `is_known` would be true for "no span" too: the id says there is one.
    let traced =
        tracing::dispatcher::get_default(|dispatch| dispatch.current_span().id().is_some());
    traced.then(|| {
        let policies: Vec<&str> = request.policies.ids().iter().map(|id| id.as_str()).collect();
        let (operation, subject) = (request.operation.to_string(), request.subject.to_string());
        tracing::info_span!(
            "rate_limit.decision",
            rate_limit.operation = operation.as_str(),
            rate_limit.policies = policies.join(","),
            rate_limit.subject = subject.as_str(),
            rate_limit.outcome = tracing::field::Empty,
            rate_limit.admitted = tracing::field::Empty,
            rate_limit.cached = tracing::field::Empty,
        )
    })
}

/// The decision's attributes: its outcome category, whether the
/// descriptors pass (`enforces`: whether the set holds an enforced policy,
/// without which a failure passes), and whether the denial cache answered.
pub(crate) fn record_decision(span: &Span, outcome: &RateLimitOutcome, enforces: bool) {
    let cached = match outcome {
        Ok(set) => set.cached(),
        Err(RateLimitFailure::Unavailable { .. })
        | Err(RateLimitFailure::Incompatible { .. })
        | Err(RateLimitFailure::Indeterminate { .. }) => false,
    };
    span.record("rate_limit.outcome", outcome.category_name());
    span.record("rate_limit.admitted", outcome.is_allowed() || !enforces);
    span.record("rate_limit.cached", cached);
}
