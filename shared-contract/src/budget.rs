//! Budgets as an operator sees them: which budget ([`BudgetKey`]), its
//! state now ([`BudgetState`]), and why a provider could not answer
//! ([`BudgetFailure`]). The port's `inspect` and `reset` speak these.

use std::time::Duration;

use crate::outcome::Certainty;
use crate::policy::{PolicyId, PolicyScope, RateLimitPolicy};
use crate::request::OperationDigest;
use crate::subject::SubjectDigest;

/// One budget: a subject's key under one policy, and for an
/// operation-scoped policy under one operation. It names exactly the key
/// `evaluate` charges for the same subject, policy and operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetKey {
    /// The subject's pseudonym.
    pub subject: SubjectDigest,
    /// The policy.
    pub policy: PolicyId,
    /// The operation: required for an operation-scoped policy, refused for
    /// a subject-scoped one (its budget is shared by every operation).
    pub operation: Option<OperationDigest>,
}

impl BudgetKey {
    /// A budget key; whether `operation` fits the policy's scope is checked
    /// by [`Self::operation_for`] once the policy is known.
    pub fn new(
        subject: SubjectDigest,
        policy: PolicyId,
        operation: Option<OperationDigest>,
    ) -> Self {
        Self { subject, policy, operation }
    }

    /// The operation part of this budget's key under `policy`: `Some` for
    /// an operation-scoped policy, `None` for a subject-scoped one.
    ///
    /// # Errors
    /// [`BudgetFailure::OperationRequired`] when the policy is
    /// operation-scoped and no operation is given;
    /// [`BudgetFailure::OperationNotApplicable`] when it is subject-scoped
    /// and one is (a guess at which key was meant would be wrong either way).
    pub fn operation_for(
        &self,
        policy: &RateLimitPolicy,
    ) -> Result<Option<&OperationDigest>, BudgetFailure> {
        match (policy.scope(), &self.operation) {
            (PolicyScope::Operation, Some(operation)) => Ok(Some(operation)),
            (PolicyScope::Operation, None) => Err(BudgetFailure::OperationRequired),
            (PolicyScope::Subject, None) => Ok(None),
            (PolicyScope::Subject, Some(_)) => Err(BudgetFailure::OperationNotApplicable),
        }
    }
}

/// A budget as its provider holds it now, computed from the stored state by
/// the same step `evaluate` runs, without charging or writing anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetState {
    /// The policy's limit or capacity.
    pub limit: u64,
    /// Units a request could spend now.
    pub remaining: u64,
    /// Time until the budget is whole again (window end, or full bucket).
    pub reset_after: Duration,
    /// Zero when a request of cost 1 would pass now; otherwise the wait
    /// after which it would, if no other traffic came.
    pub retry_after: Duration,
    /// The highest effective time (epoch ms) at which the state was
    /// written; `None` when nothing is stored (a fresh budget).
    pub mark: Option<u64>,
    /// Exact or the sliding counter's estimate.
    pub certainty: Certainty,
}

/// Why `inspect` or `reset` gave no answer. Nothing was changed, except
/// where [`BudgetFailure::Indeterminate`] says it may have been.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetFailure {
    /// The provider holds no policy of that id.
    UnknownPolicy,
    /// The policy is operation-scoped: name the operation.
    OperationRequired,
    /// The policy is subject-scoped: its budget has no operation.
    OperationNotApplicable,
    /// The stored state is not the policy's (another algorithm, or
    /// unreadable).
    StateIncompatible,
    /// The store did not answer and provably nothing ran.
    Unavailable,
    /// The command may or may not have run (a timeout after sending). A
    /// reset is idempotent: asking again is safe.
    Indeterminate,
}

impl BudgetFailure {
    /// Every failure, in declaration order.
    pub const ALL: [Self; 6] = [
        Self::UnknownPolicy,
        Self::OperationRequired,
        Self::OperationNotApplicable,
        Self::StateIncompatible,
        Self::Unavailable,
        Self::Indeterminate,
    ];

    /// Kebab-case name, as a problem type ends: `unknown-policy`,
    /// `operation-required`, `operation-not-applicable`,
    /// `state-incompatible`, `unavailable`, `indeterminate`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::UnknownPolicy => "unknown-policy",
            Self::OperationRequired => "operation-required",
            Self::OperationNotApplicable => "operation-not-applicable",
            Self::StateIncompatible => "state-incompatible",
            Self::Unavailable => "unavailable",
            Self::Indeterminate => "indeterminate",
        }
    }
}

crate::impl_from_str_by_name!(BudgetFailure);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    fn policy(scope: PolicyScope) -> RateLimitPolicy {
        RateLimitPolicy::builder(
            "p",
            Algorithm::FixedWindow(crate::FixedWindow { limit: 1, window: Duration::from_secs(1) }),
        )
        .scope(scope)
        .build()
        .unwrap()
    }

    fn key(operation: Option<u64>) -> BudgetKey {
        BudgetKey::new(
            SubjectDigest::parse(format!("v1:{}", "ab".repeat(16))).unwrap(),
            PolicyId::new("p").unwrap(),
            operation.map(OperationDigest::from_u64),
        )
    }

    #[test]
    fn the_operation_must_match_the_policy_scope() {
        let scoped = policy(PolicyScope::Operation);
        let shared = policy(PolicyScope::Subject);
        let with = key(Some(0x0123_4567_89ab_cdef));
        let without = key(None);
        assert_eq!(with.operation_for(&scoped), Ok(with.operation.as_ref()));
        assert_eq!(without.operation_for(&scoped), Err(BudgetFailure::OperationRequired));
        assert_eq!(without.operation_for(&shared), Ok(None));
        assert_eq!(with.operation_for(&shared), Err(BudgetFailure::OperationNotApplicable));
    }

    /// Every failure through an exhaustive successor match: a new one
    /// fails to compile here until chained in, then fails unless listed.
    fn after(failure: Option<BudgetFailure>) -> Option<BudgetFailure> {
        use BudgetFailure::{
            Indeterminate, OperationNotApplicable, OperationRequired, StateIncompatible,
            Unavailable, UnknownPolicy,
        };
        match failure {
            None => Some(UnknownPolicy),
            Some(UnknownPolicy) => Some(OperationRequired),
            Some(OperationRequired) => Some(OperationNotApplicable),
            Some(OperationNotApplicable) => Some(StateIncompatible),
            Some(StateIncompatible) => Some(Unavailable),
            Some(Unavailable) => Some(Indeterminate),
            Some(Indeterminate) => None,
        }
    }

    #[test]
    fn every_failure_is_listed_and_its_name_parses_back() {
        let chained: Vec<_> = std::iter::successors(after(None), |f| after(Some(*f))).collect();
        assert_eq!(chained, BudgetFailure::ALL);
        for failure in BudgetFailure::ALL {
            assert_eq!(failure.name().parse(), Ok(failure));
        }
    }
}
