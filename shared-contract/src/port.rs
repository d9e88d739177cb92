//! `EdgeRateLimitPort`: the one trait every provider implements.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::outcome::RateLimitOutcome;
use crate::policy::{PolicyId, RateLimitPolicy};
use crate::request::RateLimitRequest;

/// A rate-limit provider, used as `Arc<dyn EdgeRateLimitPort>`.
///
/// The contract every implementation keeps (the `contract-tests` crate
/// checks it):
/// - `evaluate` MUST NOT panic and has no error type: every failure is a
///   typed [`RateLimitOutcome`].
/// - It MUST answer `Incompatible(UnknownPolicy)` for a policy it does not
///   hold and `Incompatible(CostExceedsMaximum)` for cost 0 or above the
///   policy's maximum, without reading or touching any state.
/// - It MUST answer `Unavailable(AdmissionRejected)` without touching state
///   when the deadline has already passed.
/// - It MUST apply the algorithms, the clock-regression bound and evaluation
///   dedupe exactly as `docs/algorithms.md` (DESIGN section 4) defines
///   them, so every provider gives the same answer for the same inputs.
/// - It MUST answer `Indeterminate` rather than a guess when a charge may or
///   may not have happened.
#[async_trait]
pub trait EdgeRateLimitPort: Send + Sync + Debug {
    /// Evaluates one request.
    async fn evaluate(&self, request: RateLimitRequest) -> RateLimitOutcome;

    /// The policy this provider holds under `id`, so the edge can describe
    /// it in response headers.
    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy>;

    /// Whether the provider can answer now (its backing store responds).
    /// Used by readiness probes; it MUST NOT consume budget.
    async fn is_ready(&self) -> bool;
}
