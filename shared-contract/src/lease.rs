//! In-flight leases as the port speaks them: which to give back, and what it did.

use crate::evaluation::EvaluationId;
use crate::outcome::UnavailableCategory;
use crate::request::{OperationDigest, PolicySet, RateLimitRequest};
use crate::subject::SubjectDigest;

/// Payload bytes one held lease counts in every provider's account.
pub const HELD_LEASE_BYTES: u32 = 16 + 8;

/// What a release needs: the keys an admitted request took leases under, and its [`EvaluationId`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The admitted request's policy set (its rate policies are ignored).
    pub policies: PolicySet,
    /// The subject's pseudonym.
    pub subject: SubjectDigest,
    /// The operation, for the keys of operation-scoped policies.
    pub operation: OperationDigest,
    /// The lease id: the evaluation that took it.
    pub id: EvaluationId,
}

impl Lease {
    /// The lease `request` holds once it is admitted.
    pub fn of(request: &RateLimitRequest) -> Self {
        Self {
            policies: (*request.policies).clone(),
            subject: request.subject,
            operation: request.operation,
            id: request.evaluation_id,
        }
    }
}

/// What [`crate::EdgeRateLimitPort::release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseOutcome {
    /// The lease was held under at least one key and is gone: a slot is free.
    Released,
    /// No key held the lease (released, expired or never taken). Not a failure.
    NotHeld,
    /// The store did not answer and provably nothing ran.
    Unavailable {
        /// Why.
        category: UnavailableCategory,
    },
    /// The release may or may not have run; releasing again is safe.
    Indeterminate,
}

impl ReleaseOutcome {
    /// The outcome's name, for a metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotHeld => "not-held",
            Self::Unavailable { .. } => "unavailable",
            Self::Indeterminate => "indeterminate",
        }
    }

    /// Whether the lease may still be held until its TTL.
    pub const fn failed(self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Indeterminate)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::policy::PolicyId;

    #[test]
    fn a_lease_names_the_request_it_was_taken_by() {
        let request = RateLimitRequest {
            policies: PolicySet::single(PolicyId::new("exports").unwrap()).into(),
            subject: SubjectDigest::parse(format!("v1:{}", "ab".repeat(16))).unwrap(),
            operation: OperationDigest::from_u64(0x0123_4567_89ab_cdef),
            cost: 3,
            evaluation_id: EvaluationId::random(),
            deadline: Instant::now() + Duration::from_secs(1),
        };
        let lease = Lease::of(&request);
        assert_eq!(lease.id, request.evaluation_id);
        assert_eq!(lease.policies, request.policies);
        assert_eq!(lease.subject, request.subject);
        assert_eq!(lease.operation, request.operation);
    }

    #[test]
    fn only_unavailable_and_indeterminate_are_failures() {
        use ReleaseOutcome::{Indeterminate, NotHeld, Released, Unavailable};
        let unavailable = Unavailable { category: UnavailableCategory::UnavailableBeforeSend };
        let failed: Vec<_> = [Released, NotHeld, unavailable, Indeterminate]
            .into_iter()
            .map(|outcome| (outcome.name(), outcome.failed()))
            .collect();
        assert_eq!(
            failed,
            [
                ("released", false),
                ("not-held", false),
                ("unavailable", true),
                ("indeterminate", true)
            ]
        );
    }
}
