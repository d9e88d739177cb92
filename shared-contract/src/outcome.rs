//! `RateLimitOutcome`: the typed, fail-closed answer of every provider.

use std::fmt;
use std::time::Duration;

crate::named_enum! {
    /// Whether a policy can block.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub enum PolicyMode {
        /// A denial refuses the request.
        #[default]
        Enforce = "enforce",
        /// Charged on its own allow, never blocks, never shown to clients.
        Shadow = "shadow",
    }
}

use crate::bounds::MAX_POLICY_SET;

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
    /// Units left after this decision (after the charge when charged).
    pub remaining: u64,
    /// Wait until it would pass with no other traffic, ms (0 when allowed).
    pub retry_after_ms: u64,
    /// Milliseconds until the budget is whole again.
    pub reset_after_ms: u64,
    /// Whether this policy allows the request.
    pub allowed: bool,
    /// Replayed from a dedupe record: nothing was charged.
    pub replayed: bool,
}

crate::named_enum! {
    /// Where the decisions of a set came from: exactly one source.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub enum DecisionSource {
        /// The provider's store decided (the memory store, a Redis script).
        #[default]
        Store = "store",
        /// A provider's local cache of its store's refusals; nothing charged.
        LocalCache = "local-cache",
        /// The degraded mode's in-process limiter: the store could not decide.
        Degraded = "degraded",
    }
}

/// The decisions of a set: a set of one inline, a larger one boxed.
#[derive(Clone, PartialEq, Eq)]
enum Decisions {
    One(RateLimitDecision),
    Many(Box<[RateLimitDecision]>),
}

/// The decisions of a policy set, one per member in order.
#[derive(Clone)]
pub struct SetDecision {
    decisions: Decisions,
    allowed: bool,
    source: DecisionSource,
}

impl PartialEq for SetDecision {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed && self.decisions() == other.decisions()
    }
}

impl Eq for SetDecision {}

impl SetDecision {
    /// The set's answer from its members' modes and decisions, in order.
    pub fn of_members(members: impl IntoIterator<Item = (PolicyMode, RateLimitDecision)>) -> Self {
        let (mut replayed, mut enforced_allow) = (false, true);
        let decisions = {
            let mut members = members.into_iter().take(MAX_POLICY_SET).map(|(mode, decision)| {
                replayed |= decision.replayed;
                enforced_allow &= decision.allowed || mode == PolicyMode::Shadow;
                decision
            });
            let Some(first) = members.next() else {
                let decisions = Decisions::Many(Box::default());
                return Self { decisions, allowed: false, source: DecisionSource::Store };
            };
            // A larger set takes one allocation of its exact length.
            match members.next() {
                None => Decisions::One(first),
                Some(second) => {
                    Decisions::Many([first, second].into_iter().chain(members).collect())
                }
            }
        };
        Self { decisions, allowed: replayed || enforced_allow, source: DecisionSource::Store }
    }

    /// The answer of a set of one enforced policy (its decision decides).
    pub fn single(decision: RateLimitDecision) -> Self {
        Self::of_members([(PolicyMode::Enforce, decision)])
    }

    /// The same answer `elapsed_ms` later, a denial's wait still at least 1 ms.
    #[must_use]
    pub fn aged(&self, elapsed_ms: u64) -> Self {
        let age = |decision: &RateLimitDecision| RateLimitDecision {
            retry_after_ms: if decision.allowed {
                decision.retry_after_ms
            } else {
                decision.retry_after_ms.saturating_sub(elapsed_ms).max(1)
            },
            reset_after_ms: decision.reset_after_ms.saturating_sub(elapsed_ms),
            ..*decision
        };
        let decisions = match &self.decisions {
            Decisions::One(one) => Decisions::One(age(one)),
            Decisions::Many(many) => Decisions::Many(many.iter().map(age).collect()),
        };
        Self { decisions, ..*self }
    }

    /// The same answer, marked as given by a provider's local cache.
    #[must_use]
    pub fn from_cache(mut self) -> Self {
        self.source = DecisionSource::LocalCache;
        self
    }

    /// The same answer, marked as given by the degraded mode.
    #[must_use]
    pub fn from_degraded(mut self) -> Self {
        self.source = DecisionSource::Degraded;
        self
    }

    /// Where the answer came from.
    pub fn source(&self) -> DecisionSource {
        self.source
    }

    /// Answered from a local cache (only refusals are): nothing charged.
    pub fn cached(&self) -> bool {
        self.source == DecisionSource::LocalCache
    }

    /// Whether the request is admitted (every allowing policy charged).
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// One decision per policy, in the set's order.
    pub fn decisions(&self) -> &[RateLimitDecision] {
        match &self.decisions {
            Decisions::One(one) => std::slice::from_ref(one),
            Decisions::Many(many) => many,
        }
    }

    /// Replayed from dedupe records: nothing charged anywhere.
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

crate::named_enum! {
    /// Why no decision was made, with nothing consumed.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum UnavailableCategory {
        /// The deadline had passed, or no lane capacity came before it.
        AdmissionRejected = "admission-rejected",
        /// The command provably never reached the store.
        UnavailableBeforeSend = "unavailable-before-send",
        /// The caller clock ran backwards beyond the policy's bound.
        ClockUnsafe = "clock-unsafe",
    }
}

crate::named_enum! {
    /// Why the request and the provider do not fit together.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum IncompatibleCategory {
        /// The provider lacks a policy of the set.
        UnknownPolicy = "unknown-policy",
        /// Cost 0 or above the maximum cost of a policy of the set.
        CostExceedsMaximum = "cost-exceeds-maximum",
        /// Stored state or a reply of an unknown type or shape.
        StateIncompatible = "state-incompatible",
    }
}

/// The `Retry-After` of a failed outcome unless configured.
pub const DEFAULT_FAILURE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why a provider made no decision: the request must not pass (fail-closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitFailure {
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
    /// The command may have run and consumed budget (lost after send).
    Indeterminate {
        /// When trying again makes sense.
        retry_after: Duration,
    },
}

impl RateLimitFailure {
    /// Its category's kebab-case name, or `indeterminate`.
    pub const fn category_name(&self) -> &'static str {
        match self {
            Self::Unavailable { category, .. } => category.name(),
            Self::Incompatible { category } => category.name(),
            Self::Indeterminate { .. } => "indeterminate",
        }
    }

    /// Every name [`RateLimitOutcomeExt::category_name`] can return, once.
    pub fn outcome_names() -> impl Iterator<Item = &'static str> {
        let unavailable = UnavailableCategory::ALL.map(UnavailableCategory::name);
        let incompatible = IncompatibleCategory::ALL.map(IncompatibleCategory::name);
        let outcomes = ["allowed", "denied"].into_iter().chain(unavailable);
        outcomes.chain(["indeterminate"]).chain(incompatible)
    }
}

/// The answer of [`crate::EdgeRateLimitPort::evaluate`].
pub type RateLimitOutcome = Result<SetDecision, RateLimitFailure>;

/// What a front asks of a [`RateLimitOutcome`].
pub trait RateLimitOutcomeExt {
    /// True only for an allowed decision.
    fn is_allowed(&self) -> bool;

    /// `allowed`, `denied`, or the failure category's name.
    fn category_name(&self) -> &'static str;
}

impl RateLimitOutcomeExt for RateLimitOutcome {
    fn is_allowed(&self) -> bool {
        self.as_ref().is_ok_and(SetDecision::allowed)
    }

    fn category_name(&self) -> &'static str {
        match self {
            Ok(decision) if decision.allowed() => "allowed",
            Ok(_) => "denied",
            Err(failure) => failure.category_name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool) -> RateLimitDecision {
        RateLimitDecision {
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms: 0,
            allowed,
            replayed: false,
        }
    }

    fn failure_outcome(failure: RateLimitFailure) -> RateLimitOutcome {
        Err(failure)
    }

    #[test]
    fn only_an_allowed_decision_admits() {
        assert!(Ok(SetDecision::single(decision(true))).is_allowed());
        assert!(!Ok(SetDecision::single(decision(false))).is_allowed());
        let failures = [
            RateLimitFailure::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: Duration::ZERO,
            },
            RateLimitFailure::Incompatible { category: IncompatibleCategory::UnknownPolicy },
            RateLimitFailure::Indeterminate { retry_after: Duration::ZERO },
        ];
        for failure in failures {
            assert!(!failure_outcome(failure).is_allowed());
        }
    }

    #[test]
    fn category_names_are_kebab_case() {
        assert_eq!(Ok(SetDecision::single(decision(false))).category_name(), "denied");
        assert_eq!(
            failure_outcome(RateLimitFailure::Indeterminate { retry_after: Duration::ZERO })
                .category_name(),
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
            Ok(SetDecision::single(decision(true))),
            Ok(SetDecision::single(decision(false))),
            Err(RateLimitFailure::Indeterminate { retry_after: Duration::ZERO }),
        ];
        outcomes.extend(chain(after_unavailable).into_iter().map(|category| {
            Err(RateLimitFailure::Unavailable { category, retry_after: Duration::ZERO })
        }));
        outcomes.extend(
            chain(after_incompatible)
                .into_iter()
                .map(|category| Err(RateLimitFailure::Incompatible { category })),
        );
        // Exhaustive over the failure variants: a new one must be added above.
        for outcome in &outcomes {
            match outcome {
                Ok(_)
                | Err(RateLimitFailure::Unavailable { .. })
                | Err(RateLimitFailure::Incompatible { .. })
                | Err(RateLimitFailure::Indeterminate { .. }) => {}
            }
        }
        let mut from_outcomes: Vec<_> =
            outcomes.iter().map(RateLimitOutcomeExt::category_name).collect();
        let mut listed: Vec<_> = RateLimitFailure::outcome_names().collect();
        from_outcomes.sort_unstable();
        listed.sort_unstable();
        assert_eq!(from_outcomes, listed);
        listed.dedup();
        assert_eq!(listed.len(), outcomes.len(), "a name is used twice");
    }

    #[test]
    fn a_set_is_admitted_by_its_members_and_keeps_every_decision_in_order() {
        use PolicyMode::{Enforce, Shadow};
        let allow = decision(true);
        let deny = RateLimitDecision { retry_after_ms: 5, ..decision(false) };
        let set = SetDecision::of_members([(Enforce, allow), (Enforce, deny)]);
        assert!(!set.allowed());
        assert_eq!(set.decisions(), [allow, deny]);
        assert!(!set.replayed() && !set.cached());
        // A shadow member's denial does not refuse the set.
        assert!(SetDecision::of_members([(Enforce, allow), (Shadow, deny)]).allowed());
        // Nor does anything when a member replays: the set was admitted.
        let replay = RateLimitDecision { replayed: true, ..allow };
        assert!(SetDecision::of_members([(Enforce, replay), (Enforce, deny)]).allowed());
        // An empty set is never admitted.
        assert!(!SetDecision::of_members([]).allowed());
        // Where an answer came from is not part of it.
        assert!(set.clone().from_cache().cached());
        assert_eq!(set.clone().from_cache(), set);
        assert_eq!(set.source(), DecisionSource::Store);
        let degraded = set.clone().from_degraded();
        assert_eq!(degraded.source(), DecisionSource::Degraded);
        assert!(!degraded.cached(), "a degraded answer is not the denial cache's");
        assert_eq!(degraded, set);
        let replayed = SetDecision::single(replay);
        assert!(replayed.replayed() && replayed.allowed());
        assert!(
            SetDecision::single(deny).decisions()[0] == deny
                && !SetDecision::single(deny).allowed()
        );
    }

    #[test]
    fn an_aged_answer_waits_less_and_a_denial_at_least_a_millisecond() {
        let deny =
            RateLimitDecision { retry_after_ms: 300, reset_after_ms: 900, ..decision(false) };
        let allow = RateLimitDecision { reset_after_ms: 200, ..decision(true) };
        let set =
            SetDecision::of_members([(PolicyMode::Enforce, deny), (PolicyMode::Shadow, allow)])
                .from_cache();
        let aged = set.aged(250);
        assert_eq!(
            aged.decisions()[0],
            RateLimitDecision { retry_after_ms: 50, reset_after_ms: 650, ..deny }
        );
        assert_eq!(aged.decisions()[1], RateLimitDecision { reset_after_ms: 0, ..allow });
        assert_eq!(set.aged(1_000).decisions()[0].retry_after_ms, 1);
        assert!(aged.cached() && !aged.allowed());
    }

    #[test]
    fn a_decision_and_its_outcome_are_small() {
        assert!(size_of::<SetDecision>() <= 64, "{}", size_of::<SetDecision>());
        assert!(size_of::<RateLimitOutcome>() <= 64, "{}", size_of::<RateLimitOutcome>());
    }
}
