//! The IETF `RateLimit-Policy` and `RateLimit` fields every front writes.

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::clock::{Clock, SystemClock};
use crate::outcome::RateLimitDecision;
use crate::policy::{PolicyId, RateLimitPolicy};

/// Largest structured-field integer (RFC 9651: 15 decimal digits).
pub const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Appends `"<policy id>";q=<limit>;w=<window seconds>` for each policy,
/// comma-separated (no `w` for a policy without a window), at caller time
/// `now`, read only for a window that moves.
pub fn write_policy_field_at<'a>(
    text: &mut Vec<u8>,
    policies: impl IntoIterator<Item = &'a RateLimitPolicy>,
    now: impl Fn() -> u64,
) {
    for policy in policies {
        let quota = (b";q=", policy.limit());
        match policy.algorithm().quota_window(&now) {
            Some(window) => item(text, policy.id(), &[quota, (b";w=", whole_seconds_up(window))]),
            None => item(text, policy.id(), &[quota]),
        }
    }
}

/// Appends `"<policy id>";r=<remaining>;t=<seconds until whole>` per decision.
pub fn write_limit_field<'a>(
    text: &mut Vec<u8>,
    decisions: impl IntoIterator<Item = (&'a PolicyId, &'a RateLimitDecision)>,
) {
    for (policy_id, decision) in decisions {
        write_limit_item(text, policy_id, decision, true);
    }
}

/// Appends one item of the `RateLimit` field, with `;t=` only when `resets`
/// (a concurrency policy has no reset time; `t=0` would read "whole now").
pub fn write_limit_item(
    text: &mut Vec<u8>,
    policy_id: &PolicyId,
    decision: &RateLimitDecision,
    resets: bool,
) {
    let parameters =
        [(b";r=", decision.remaining), (b";t=", whole_seconds_up_millis(decision.reset_after_ms))];
    item(text, policy_id, if resets { &parameters } else { &parameters[..1] });
}

/// Appends `"<policy id>"` and its parameters, after a comma unless first.
fn item(text: &mut Vec<u8>, policy_id: &PolicyId, parameters: &[(&[u8; 3], u64)]) {
    if !text.is_empty() {
        text.extend_from_slice(b", ");
    }
    text.push(b'"');
    text.extend_from_slice(policy_id.as_str().as_bytes());
    text.push(b'"');
    for &(key, value) in parameters {
        text.extend_from_slice(key);
        // Clamped to the structured-field range; validated policies stay below.
        text.extend_from_slice(itoa::Buffer::new().format(value.min(SF_INTEGER_MAX)).as_bytes());
    }
}

/// [`Algorithm::quota_window`] now; `None` for an algorithm with no window.
pub fn quota_window(algorithm: &Algorithm) -> Option<Duration> {
    algorithm.quota_window(|| SystemClock.epoch_millis())
}

/// Whole seconds, rounded up: a client told less would be refused again.
pub fn whole_seconds_up(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// [`whole_seconds_up`] of a time in milliseconds, as decisions count.
pub const fn whole_seconds_up_millis(millis: u64) -> u64 {
    millis.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_fields_list_their_items_in_order_with_rounded_up_seconds() {
        let burst = RateLimitPolicy::builder(
            "orders-burst",
            Algorithm::FixedWindow(crate::FixedWindow {
                limit: 10,
                window: Duration::from_millis(1500),
            }),
        )
        .build()
        .unwrap();
        let bucket = RateLimitPolicy::builder(
            "b",
            Algorithm::TokenBucket(crate::TokenBucket {
                capacity: 5,
                refill_tokens: 2,
                refill_period: Duration::from_millis(100),
            }),
        )
        .build()
        .unwrap();
        let exports = RateLimitPolicy::builder(
            "exports",
            Algorithm::Concurrency(crate::Concurrency {
                max_in_flight: 2,
                lease_ttl: Duration::from_secs(30),
                retry_after: Duration::from_secs(1),
            }),
        )
        .build()
        .unwrap();
        let mut text = Vec::new();
        write_policy_field_at(&mut text, [&burst, &exports, &bucket], || 0);
        assert_eq!(text, br#""orders-burst";q=10;w=2, "exports";q=2, "b";q=5;w=1"#);
        let decision = RateLimitDecision {
            allowed: true,
            remaining: u64::MAX,
            retry_after_ms: 0,
            reset_after_ms: 1001,
            replayed: false,
        };
        let mut text = Vec::new();
        write_limit_field(&mut text, [(burst.id(), &decision)]);
        assert_eq!(text, br#""orders-burst";r=999999999999999;t=2"#);
    }
}
