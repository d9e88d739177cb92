//! The bounds every policy and request is checked against, and the one
//! conversion to the milliseconds the algorithms count in: a leaf module,
//! so each module that checks a bound imports no other.

use std::time::Duration;

/// Largest limit, capacity, refill amount or cost a policy accepts.
pub const MAX_COUNT: u64 = 1_000_000_000;
/// Largest window or refill period: ten years.
pub const MAX_PERIOD: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Largest cleanup grace or clock-regression bound: one hour.
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(3600);
/// Largest `max-in-flight`: a lease set is held whole in one key.
pub const MAX_IN_FLIGHT: u64 = 10_000;
/// Longest `lease-ttl` of a concurrency policy: a day.
pub(crate) const MAX_LEASE_TTL: Duration = Duration::from_secs(24 * 3600);
/// Bound of the products an algorithm multiplies, so Lua's doubles are exact.
pub(crate) const MAX_EXACT_PRODUCT: u64 = 1 << 53;

/// Most policies one request evaluates together.
pub const MAX_POLICY_SET: usize = 8;

/// Whole milliseconds of a duration, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn whole_millis_problem(duration: Duration) -> Option<String> {
    (duration.subsec_nanos() % 1_000_000 != 0)
        .then(|| format!("must be whole milliseconds, got {duration:?}"))
}
