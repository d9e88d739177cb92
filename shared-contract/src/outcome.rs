//! `RateLimitOutcome`: the typed, fail-closed answer of every provider.

use std::fmt;
use std::time::Duration;

use crate::request::MAX_POLICY_SET;

/// Whether a decision is exact or an algorithm's estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Certainty {
    /// Exact for the algorithm's definition.
    Certain,
    /// An estimate by design (the sliding counter's weighted window).
    ApproximateAlgorithm,
}

/// What one policy of a set decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitDecision {
    /// Whether this policy allows the request. It was charged only when the
    /// set admitted the request too ([`SetDecision::allowed`]).
    pub allowed: bool,
    /// The policy's limit or capacity.
    pub limit: u64,
    /// Units left after this decision (after the charge when charged).
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

impl RateLimitDecision {
    /// A zeroed denial that fills the slots of a fixed array a set does not
    /// use (a set's decisions are kept inline, without allocating); never
    /// reported as anyone's decision.
    pub const UNUSED: Self = Self {
        allowed: false,
        limit: 0,
        remaining: 0,
        retry_after: Duration::ZERO,
        reset_after: Duration::ZERO,
        certainty: Certainty::Certain,
        replayed: false,
    };
}

/// Where the decisions of a set came from. One value, not a flag per
/// source: a set is answered by exactly one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DecisionSource {
    /// The provider's store decided (the memory store, a Redis script).
    #[default]
    Store,
    /// A provider's local cache of refusals its store gave (the Redis
    /// provider's denial cache); nothing was charged.
    LocalCache,
    /// The composition root's degraded mode: the store could not decide,
    /// and an in-process limiter holding each policy at
    /// `ceil(limit / instances)` did.
    Degraded,
}

impl DecisionSource {
    /// Every source, in declaration order.
    pub const ALL: [Self; 3] = [Self::Store, Self::LocalCache, Self::Degraded];

    /// Kebab-case name: `store`, `local-cache`, `degraded` (the last is
    /// the metric outcome of every decision of a degraded set).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::LocalCache => "local-cache",
            Self::Degraded => "degraded",
        }
    }
}

crate::impl_from_str_by_name!(DecisionSource);

/// The decisions of a policy set: one per policy, in the set's order, and
/// whether the request is admitted (every enforced policy allows it). A
/// fixed inline array, so an outcome is `Copy` and never allocates.
///
/// Equality compares the answer, not where it came from: a decision a
/// provider answered from a local cache ([`Self::cached`]) equals the one
/// its store would have given.
#[derive(Clone, Copy)]
pub struct SetDecision {
    allowed: bool,
    len: u8,
    source: DecisionSource,
    decisions: [RateLimitDecision; MAX_POLICY_SET],
}

impl PartialEq for SetDecision {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed && self.decisions() == other.decisions()
    }
}

impl Eq for SetDecision {}

impl SetDecision {
    /// The set's answer: `allowed` when every enforced policy allows, and
    /// one decision per policy in the set's order. At most
    /// [`MAX_POLICY_SET`] decisions are kept (a `PolicySet` holds no more).
    pub fn new(allowed: bool, decisions: &[RateLimitDecision]) -> Self {
        debug_assert!(decisions.len() <= MAX_POLICY_SET, "a policy set holds at most 8");
        let mut held = [RateLimitDecision::UNUSED; MAX_POLICY_SET];
        let len = decisions.len().min(MAX_POLICY_SET);
        held[..len].copy_from_slice(&decisions[..len]);
        Self { allowed, len: len as u8, source: DecisionSource::Store, decisions: held }
    }

    /// The same answer, marked as given by a provider's local cache without
    /// asking its store (the Redis provider's denial cache).
    #[must_use]
    pub fn from_cache(mut self) -> Self {
        self.source = DecisionSource::LocalCache;
        self
    }

    /// The same answer, marked as given by the degraded mode's in-process
    /// limiter because the provider's store could not decide.
    #[must_use]
    pub fn from_degraded(mut self) -> Self {
        self.source = DecisionSource::Degraded;
        self
    }

    /// Where the answer came from.
    pub fn source(&self) -> DecisionSource {
        self.source
    }

    /// True when the provider answered from a local cache, not its store;
    /// nothing was charged (only refusals are cached).
    pub fn cached(&self) -> bool {
        self.source == DecisionSource::LocalCache
    }

    /// The answer of a set of one policy (its decision decides).
    pub fn single(decision: RateLimitDecision) -> Self {
        Self::new(decision.allowed, &[decision])
    }

    /// Whether the request is admitted and every allowing policy charged.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// One decision per policy, in the set's order.
    pub fn decisions(&self) -> &[RateLimitDecision] {
        &self.decisions[..usize::from(self.len)]
    }

    /// True when the answer came from dedupe records and nothing was
    /// charged anywhere.
    pub fn replayed(&self) -> bool {
        self.decisions().iter().any(|decision| decision.replayed)
    }
}

impl fmt::Debug for SetDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetDecision")
            .field("allowed", &self.allowed)
            .field("source", &self.source)
            .field("decisions", &self.decisions())
            .finish()
    }
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
    /// The provider lacks a policy of the set.
    UnknownPolicy,
    /// Cost 0 or above the maximum cost of a policy of the set.
    CostExceedsMaximum,
    /// Stored state of the wrong type or shape, or a reply of an unknown
    /// shape.
    StateIncompatible,
}

/// The `Retry-After` of an outcome no decision could be made for, unless
/// configured (`capabilities.rate-limit.failure-retry-after`): the one
/// default the edge and every provider share.
pub const DEFAULT_FAILURE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The answer of [`crate::EdgeRateLimitPort::evaluate`]. Every variant but an
/// allowed `Evaluated` means the request must not pass (fail-closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "moved once per request; inline decisions keep it Copy and free of allocation"
)]
pub enum RateLimitOutcome {
    /// The set's decisions, admitted or refused.
    Evaluated(SetDecision),
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
        matches!(self, Self::Evaluated(decision) if decision.allowed())
    }

    /// A kebab-case name of the outcome for metrics labels and problem
    /// types: `allowed`, `denied`, or the failure category.
    pub fn category_name(&self) -> &'static str {
        match self {
            Self::Evaluated(decision) if decision.allowed() => "allowed",
            Self::Evaluated(_) => "denied",
            Self::Unavailable { category, .. } => category.name(),
            Self::Incompatible { category } => category.name(),
            Self::Indeterminate { .. } => "indeterminate",
        }
    }

    /// Every name [`Self::category_name`] can return, each once.
    pub fn category_names() -> impl Iterator<Item = &'static str> {
        let unavailable = UnavailableCategory::ALL.into_iter().map(UnavailableCategory::name);
        let incompatible = IncompatibleCategory::ALL.into_iter().map(IncompatibleCategory::name);
        ["allowed", "denied"]
            .into_iter()
            .chain(unavailable)
            .chain(["indeterminate"])
            .chain(incompatible)
    }
}

impl UnavailableCategory {
    /// Every category, in declaration order.
    pub const ALL: [Self; 3] =
        [Self::AdmissionRejected, Self::UnavailableBeforeSend, Self::ClockUnsafe];

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

crate::impl_from_str_by_name!(UnavailableCategory);

impl IncompatibleCategory {
    /// Every category, in declaration order.
    pub const ALL: [Self; 3] =
        [Self::UnknownPolicy, Self::CostExceedsMaximum, Self::StateIncompatible];

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

crate::impl_from_str_by_name!(IncompatibleCategory);

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
        assert!(RateLimitOutcome::Evaluated(SetDecision::single(decision(true))).is_allowed());
        assert!(!RateLimitOutcome::Evaluated(SetDecision::single(decision(false))).is_allowed());
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
        assert_eq!(
            RateLimitOutcome::Evaluated(SetDecision::single(decision(false))).category_name(),
            "denied"
        );
        assert_eq!(
            RateLimitOutcome::Indeterminate { retry_after: Duration::ZERO }.category_name(),
            "indeterminate"
        );
        assert_eq!(UnavailableCategory::UnavailableBeforeSend.name(), "unavailable-before-send");
        assert_eq!(IncompatibleCategory::StateIncompatible.name(), "state-incompatible");
    }

    /// Every category of each enum, found through an exhaustive successor
    /// match: a new category fails to compile here until it is chained in,
    /// and then fails the tests below unless `ALL` lists it.
    fn chain<T: Copy>(after: fn(Option<T>) -> Option<T>) -> Vec<T> {
        std::iter::successors(after(None), |item| after(Some(*item))).collect()
    }

    fn after_unavailable(category: Option<UnavailableCategory>) -> Option<UnavailableCategory> {
        use UnavailableCategory::{AdmissionRejected, ClockUnsafe, UnavailableBeforeSend};
        match category {
            None => Some(AdmissionRejected),
            Some(AdmissionRejected) => Some(UnavailableBeforeSend),
            Some(UnavailableBeforeSend) => Some(ClockUnsafe),
            Some(ClockUnsafe) => None,
        }
    }

    fn after_incompatible(category: Option<IncompatibleCategory>) -> Option<IncompatibleCategory> {
        use IncompatibleCategory::{CostExceedsMaximum, StateIncompatible, UnknownPolicy};
        match category {
            None => Some(UnknownPolicy),
            Some(UnknownPolicy) => Some(CostExceedsMaximum),
            Some(CostExceedsMaximum) => Some(StateIncompatible),
            Some(StateIncompatible) => None,
        }
    }

    fn after_source(source: Option<DecisionSource>) -> Option<DecisionSource> {
        use DecisionSource::{Degraded, LocalCache, Store};
        match source {
            None => Some(Store),
            Some(Store) => Some(LocalCache),
            Some(LocalCache) => Some(Degraded),
            Some(Degraded) => None,
        }
    }

    #[test]
    fn every_source_is_listed_and_its_name_parses_back() {
        assert_eq!(chain(after_source), DecisionSource::ALL);
        for source in DecisionSource::ALL {
            assert_eq!(source.name().parse(), Ok(source));
        }
        assert_eq!(DecisionSource::Degraded.name(), "degraded");
    }

    #[test]
    fn every_category_is_listed_and_its_name_parses_back() {
        assert_eq!(chain(after_unavailable), UnavailableCategory::ALL);
        assert_eq!(chain(after_incompatible), IncompatibleCategory::ALL);
        for category in UnavailableCategory::ALL {
            assert_eq!(category.name().parse(), Ok(category));
        }
        for category in IncompatibleCategory::ALL {
            assert_eq!(category.name().parse(), Ok(category));
        }
        assert!("denied".parse::<UnavailableCategory>().is_err());
    }

    #[test]
    fn category_names_hold_every_outcome_once() {
        let mut outcomes = vec![
            RateLimitOutcome::Evaluated(SetDecision::single(decision(true))),
            RateLimitOutcome::Evaluated(SetDecision::single(decision(false))),
            RateLimitOutcome::Indeterminate { retry_after: Duration::ZERO },
        ];
        outcomes.extend(chain(after_unavailable).into_iter().map(|category| {
            RateLimitOutcome::Unavailable { category, retry_after: Duration::ZERO }
        }));
        outcomes.extend(
            chain(after_incompatible)
                .into_iter()
                .map(|category| RateLimitOutcome::Incompatible { category }),
        );
        // Exhaustive over the outcome variants: a new one must be added above.
        for outcome in &outcomes {
            match outcome {
                RateLimitOutcome::Evaluated(_)
                | RateLimitOutcome::Unavailable { .. }
                | RateLimitOutcome::Incompatible { .. }
                | RateLimitOutcome::Indeterminate { .. } => {}
            }
        }
        let mut from_outcomes: Vec<_> =
            outcomes.iter().map(RateLimitOutcome::category_name).collect();
        let mut listed: Vec<_> = RateLimitOutcome::category_names().collect();
        from_outcomes.sort_unstable();
        listed.sort_unstable();
        assert_eq!(from_outcomes, listed);
        listed.dedup();
        assert_eq!(listed.len(), outcomes.len(), "a name is used twice");
    }

    #[test]
    fn a_set_is_admitted_as_its_provider_says_and_keeps_every_decision_in_order() {
        let allow = decision(true);
        let deny = RateLimitDecision { retry_after: Duration::from_millis(5), ..decision(false) };
        let set = SetDecision::new(false, &[allow, deny]);
        assert!(!set.allowed());
        assert_eq!(set.decisions(), [allow, deny]);
        assert!(!set.replayed() && !set.cached());
        // Where an answer came from is not part of it.
        assert!(set.from_cache().cached());
        assert_eq!(set.from_cache(), set);
        assert_eq!(set.source(), DecisionSource::Store);
        let degraded = set.from_degraded();
        assert_eq!(degraded.source(), DecisionSource::Degraded);
        assert!(!degraded.cached(), "a degraded answer is not the denial cache's");
        assert_eq!(degraded, set);
        let replayed = SetDecision::new(true, &[RateLimitDecision { replayed: true, ..allow }]);
        assert!(replayed.replayed() && replayed.allowed());
        assert!(
            SetDecision::single(deny).decisions()[0] == deny
                && !SetDecision::single(deny).allowed()
        );
    }
}
