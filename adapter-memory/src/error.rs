//! The one error type of this crate: a provider that cannot be built.

use shared_contract::PolicyId;

/// Why a [`crate::MemoryEdgeRateLimitAdapter`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryAdapterError {
    /// Two policies share one id; which one applies would be a guess.
    #[error("rate-limit policy `{0}` is configured more than once")]
    DuplicatePolicy(PolicyId),
    /// No policy at all: every request would be `UnknownPolicy`.
    #[error("the memory rate-limit provider needs at least one policy")]
    NoPolicies,
}
