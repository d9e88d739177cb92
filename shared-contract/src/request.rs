//! `RateLimitRequest`: one question a caller asks a provider.

use std::fmt;
use std::time::Instant;

use uuid::Uuid;

use crate::policy::PolicyId;
use crate::subject::SubjectDigest;

/// A server-generated id for one evaluation. A provider with dedupe enabled
/// answers a repeat of the same id from its record instead of charging again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EvaluationId(Uuid);

impl EvaluationId {
    /// A fresh random id (UUID v4). Never derive one from client input.
    pub fn random() -> Self {
        Self(Uuid::new_v4())
    }

    /// Wraps an existing UUID (tests, replays).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The UUID.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }

    /// The 16 bytes of the UUID, the form a provider stores.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl fmt::Display for EvaluationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One rate-limit evaluation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitRequest {
    /// The policy to evaluate under.
    pub policy_id: PolicyId,
    /// The pseudonymous subject.
    pub subject: SubjectDigest,
    /// Units to charge, 1 ..= the policy's maximum cost.
    pub cost: u64,
    /// Server-generated id of this evaluation.
    pub evaluation_id: EvaluationId,
    /// Monotonic instant after which an answer is useless.
    pub deadline: Instant,
}
