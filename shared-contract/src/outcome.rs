//! `RateLimitOutcome`: the typed, fail-closed answer of every provider.

use std::time::Duration;

/// Whether a decision is exact or an algorithm's estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Certainty {
    /// Exact for the algorithm's definition.
    Certain,
    /// An estimate by design (the sliding counter's weighted window).
    ApproximateAlgorithm,
}

/// A decision the provider made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitDecision {
    /// Whether the request is admitted (and its cost charged).
    pub allowed: bool,
    /// The policy's limit or capacity.
    pub limit: u64,
    /// Units left after this decision.
    pub remaining: u64,
    /// Zero when allowed; at least 1 ms when denied: the wait after which
    /// the same request would pass if no other traffic came.
    pub retry_after: Duration,
    /// Time until the budget is whole again (window end, or full bucket).
    pub reset_after: Duration,
    /// Exact or approximate.
    pub certainty: Certainty,
    /// True when this answer was replayed from a dedupe record and nothing
    /// was charged.
    pub replayed: bool,
}

/// Why no decision was made, with nothing consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnavailableCategory {
    /// The deadline had passed, or no lane capacity came before it.
    AdmissionRejected,
    /// The command provably never reached the store (connect failure,
    /// NOPERM, closed pool).
    UnavailableBeforeSend,
    /// The caller clock ran backwards beyond the policy's bound; nothing
    /// was mutated.
    ClockUnsafe,
}

/// Why the request and the provider do not fit together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IncompatibleCategory {
    /// The provider has no policy of that id.
    UnknownPolicy,
    /// Cost 0 or above the policy's maximum cost.
    CostExceedsMaximum,
    /// Stored state of the wrong type or shape, or a reply of an unknown
    /// shape.
    StateIncompatible,
}

/// The answer of [`crate::EdgeRateLimitPort::evaluate`]. Every variant but an
/// allowed `Evaluated` means the request must not pass (fail-closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitOutcome {
    /// A decision, allowed or denied.
    Evaluated(RateLimitDecision),
    /// No decision, and provably nothing consumed.
    Unavailable {
        /// Why.
        category: UnavailableCategory,
        /// When trying again makes sense.
        retry_after: Duration,
    },
    /// The request cannot be evaluated by this provider as configured.
    Incompatible {
        /// Why.
        category: IncompatibleCategory,
    },
    /// The command may have run and consumed budget (timeout or connection
    /// loss after send, unreadable reply).
    Indeterminate {
        /// When trying again makes sense.
        retry_after: Duration,
    },
}

impl RateLimitOutcome {
    /// True only for an allowed decision.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Evaluated(decision) if decision.allowed)
    }

    /// A kebab-case name of the outcome for metrics labels and problem
    /// types: `allowed`, `denied`, or the failure category.
    pub fn category_name(&self) -> &'static str {
        match self {
            Self::Evaluated(decision) if decision.allowed => "allowed",
            Self::Evaluated(_) => "denied",
            Self::Unavailable { category, .. } => category.name(),
            Self::Incompatible { category } => category.name(),
            Self::Indeterminate { .. } => "indeterminate",
        }
    }
}

impl UnavailableCategory {
    /// Kebab-case name: `admission-rejected`, `unavailable-before-send`,
    /// `clock-unsafe`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::AdmissionRejected => "admission-rejected",
            Self::UnavailableBeforeSend => "unavailable-before-send",
            Self::ClockUnsafe => "clock-unsafe",
        }
    }
}

impl IncompatibleCategory {
    /// Kebab-case name: `unknown-policy`, `cost-exceeds-maximum`,
    /// `state-incompatible`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::UnknownPolicy => "unknown-policy",
            Self::CostExceedsMaximum => "cost-exceeds-maximum",
            Self::StateIncompatible => "state-incompatible",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool) -> RateLimitDecision {
        RateLimitDecision {
            allowed,
            limit: 1,
            remaining: 0,
            retry_after: Duration::ZERO,
            reset_after: Duration::ZERO,
            certainty: Certainty::Certain,
            replayed: false,
        }
    }

    #[test]
    fn only_an_allowed_decision_admits() {
        assert!(RateLimitOutcome::Evaluated(decision(true)).is_allowed());
        assert!(!RateLimitOutcome::Evaluated(decision(false)).is_allowed());
        let failures = [
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: Duration::ZERO,
            },
            RateLimitOutcome::Incompatible { category: IncompatibleCategory::UnknownPolicy },
            RateLimitOutcome::Indeterminate { retry_after: Duration::ZERO },
        ];
        for outcome in failures {
            assert!(!outcome.is_allowed());
        }
    }

    #[test]
    fn category_names_are_kebab_case() {
        assert_eq!(RateLimitOutcome::Evaluated(decision(false)).category_name(), "denied");
        assert_eq!(
            RateLimitOutcome::Indeterminate { retry_after: Duration::ZERO }.category_name(),
            "indeterminate"
        );
        assert_eq!(UnavailableCategory::UnavailableBeforeSend.name(), "unavailable-before-send");
        assert_eq!(IncompatibleCategory::StateIncompatible.name(), "state-incompatible");
    }
}
