//! Budgets as an operator sees them through the port's `inspect` and `reset`.

use std::time::Duration;

use crate::outcome::Certainty;
use crate::policy::{PolicyId, PolicyScope, RateLimitPolicy};
use crate::request::OperationDigest;
use crate::subject::SubjectDigest;

/// One budget: exactly the key `evaluate` charges for the same inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetKey {
    /// The subject's pseudonym.
    pub subject: SubjectDigest,
    /// The policy.
    pub policy: PolicyId,
    /// Required for an operation-scoped policy, refused for a subject-scoped one.
    pub operation: Option<OperationDigest>,
}

impl BudgetKey {
    /// A budget key; [`Self::operation_for`] checks its operation.
    pub fn new(
        subject: SubjectDigest,
        policy: PolicyId,
        operation: Option<OperationDigest>,
    ) -> Self {
        Self { subject, policy, operation }
    }

    /// The operation part of this budget's key under `policy`.
    ///
    /// # Errors
    /// `OperationRequired` or `OperationNotApplicable` when the operation
    /// does not fit the policy's scope (a guess would be wrong either way).
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

/// A budget now, computed by the step `evaluate` runs, charging nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetState {
    /// The policy's limit or capacity.
    pub limit: u64,
    /// Units a request could spend now.
    pub remaining: u64,
    /// Time until the budget is whole again.
    pub reset_after: Duration,
    /// Zero when a request of cost 1 would pass now, else its wait.
    pub retry_after: Duration,
    /// The key's mark (epoch ms); `None` for a fresh budget.
    pub mark: Option<u64>,
    /// Exact or the sliding counter's estimate.
    pub certainty: Certainty,
    /// Units charged past the limit still owed (a settle's excess): later
    /// requests are refused until the window, refill or schedule pays them.
    pub debt: u64,
}

crate::named_enum! {
    /// Why `inspect` or `reset` gave no answer; nothing changed unless `Indeterminate`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum BudgetFailure {
        /// The provider holds no policy of that id.
        UnknownPolicy = "unknown-policy",
        /// The policy is operation-scoped: name the operation.
        OperationRequired = "operation-required",
        /// The policy is subject-scoped: its budget has no operation.
        OperationNotApplicable = "operation-not-applicable",
        /// The stored state is another algorithm's, or unreadable.
        StateIncompatible = "state-incompatible",
        /// The store did not answer and provably nothing ran.
        Unavailable = "unavailable",
        /// The command may or may not have run; a reset may be asked again.
        Indeterminate = "indeterminate",
    }
}

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
