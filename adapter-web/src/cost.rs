//! `RateLimitCost`: how many units a request spends, set by a layer that
//! knows what the request costs.

/// The cost of a request, inserted as a request extension by a layer that
/// runs before the rate-limit layer (the same pattern as
/// [`crate::AuthenticatedPrincipal`]): an export that reads a thousand
/// rows can spend more than a lookup of one. Without it a request costs 1.
///
/// The cost is charged to every policy of the set that allows the request.
/// A cost of 0, or above a policy's `maximum-cost`, is answered by the
/// port as `Incompatible(CostExceedsMaximum)` (a `503`), with nothing
/// charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimitCost(pub u64);

impl RateLimitCost {
    /// What a request without the extension costs.
    pub const DEFAULT: Self = Self(1);
}

impl Default for RateLimitCost {
    fn default() -> Self {
        Self::DEFAULT
    }
}
