//! `RateLimit-Policy` and `RateLimit` response headers (IETF httpapi
//! ratelimit-headers draft): structured-field lists built with `sfv`, so the
//! policy id is always a correctly quoted string.

use axum::body::Bytes;
use http::HeaderValue;
use sfv::{Integer, KeyRef, ListSerializer, StringRef};
use shared_contract::{PolicyId, RateLimitDecision, RateLimitPolicy, write_limit_item};

pub(crate) use shared_contract::whole_seconds_up;

/// `"<policy id>";q=<limit>;w=<window seconds>` for each policy, in the
/// order given (GCRA: `q=<burst>;w=<burst x T>`, T its emission interval;
/// concurrency: `q=<max-in-flight>` and no `w`, it has no window); `None`
/// for no policy (the header is then left out).
/// `now` is the caller time (epoch ms), read only for a window whose
/// length moves with it (a calendar month).
pub(crate) fn policy_header<'a>(
    policies: impl IntoIterator<Item = &'a RateLimitPolicy>,
    now: impl Fn() -> u64,
) -> Option<HeaderValue> {
    list(policies.into_iter().map(|policy| {
        let window = policy.algorithm().quota_window(&now).map(|w| ("w", whole_seconds_up(w)));
        (policy.id(), [Some(("q", policy.limit())), window].into_iter().flatten())
    }))
}

/// `"<policy id>";r=<remaining>;t=<seconds until the budget is whole>` for
/// each policy, in the order given (GCRA: until the next cell beyond the
/// remaining ones conforms, docs/algorithms.md#gcra); no `t` for a policy
/// that does not reset (`resets` false: concurrency, whose slot frees when
/// a request ends); `None` for no policy.
///
/// Written by hand (`shared_contract::write_limit_item`, which every
/// front end shares), not through `sfv` as the policy header is: this one
/// is made per request (the serializer's checks and copies cost about a
/// fifth of the layer; docs/benchmarks.md), and a policy id is validated
/// to `[a-z0-9._-]`, which an sf-string holds without escapes. The output
/// is exactly what `sfv` writes (a test compares them).
pub(crate) fn limit_header<'a>(
    decisions: impl IntoIterator<Item = (&'a PolicyId, &'a RateLimitDecision, bool)>,
) -> Option<HeaderValue> {
    let mut text = Vec::with_capacity(64);
    for (policy_id, decision, resets) in decisions {
        write_limit_item(&mut text, policy_id, decision, resets);
    }
    if text.is_empty() {
        return None;
    }
    HeaderValue::from_maybe_shared(Bytes::from(text)).ok()
}

/// A structured-field List of string items with integer parameters
/// (RFC 9651): `sfv` quotes and escapes each id, so no policy id can break
/// the header. `None` for an empty list or an unserializable id.
fn list<'a, P: IntoIterator<Item = (&'static str, u64)>>(
    entries: impl Iterator<Item = (&'a PolicyId, P)>,
) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for (policy_id, parameters) in entries {
        let mut entry = list.bare_item(StringRef::from_str(policy_id.as_str()).ok()?);
        for (key, value) in parameters {
            // Values past the structured-field integer range cannot occur with
            // validated policies; clamping keeps the header well-formed anyway.
            let value = Integer::try_from(value).unwrap_or(Integer::MAX);
            entry = entry.parameter(KeyRef::from_str(key).ok()?, value);
        }
    }
    HeaderValue::try_from(list.finish()?).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::{Algorithm, SF_INTEGER_MAX, whole_seconds_up_millis, write_policy_field};

    use super::*;

    /// Any time: no window here moves with it.
    const T0: u64 = 1_800_000_000_000;

    fn policy(algorithm: Algorithm) -> RateLimitPolicy {
        RateLimitPolicy::builder("orders.read", algorithm).build().unwrap()
    }

    #[test]
    fn policy_header_names_limit_and_window_in_seconds() {
        let fixed = policy(Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 100,
            window: Duration::from_secs(60),
        }));
        assert_eq!(policy_header([&fixed], || T0).unwrap(), r#""orders.read";q=100;w=60"#);
        // A 1.5 s window is announced as 2 s: never promise more than holds.
        let sliding = policy(Algorithm::SlidingCounter(shared_contract::SlidingCounter {
            limit: 10,
            window: Duration::from_millis(1500),
        }));
        assert_eq!(policy_header([&sliding], || T0).unwrap(), r#""orders.read";q=10;w=2"#);
        // Five tokens, two per 100 ms: three periods fill it, 300 ms -> 1 s.
        let bucket = policy(Algorithm::TokenBucket(shared_contract::TokenBucket {
            capacity: 5,
            refill_tokens: 2,
            refill_period: Duration::from_millis(100),
        }));
        assert_eq!(policy_header([&bucket], || T0).unwrap(), r#""orders.read";q=5;w=1"#);
        // GCRA: q is the burst, w the burst's cells at T = 1 s / 10 = 0.5 s,
        // rounded up to 1; 3 per second with a burst of 7: T = 333334 us,
        // 2.333338 s, 3 on the wire.
        let gcra = |limit, burst| {
            policy(Algorithm::Gcra(shared_contract::Gcra {
                limit,
                period: Duration::from_secs(1),
                burst,
            }))
        };
        assert_eq!(policy_header([&gcra(10, 5)], || T0).unwrap(), r#""orders.read";q=5;w=1"#);
        assert_eq!(policy_header([&gcra(3, 7)], || T0).unwrap(), r#""orders.read";q=7;w=3"#);
        assert_eq!(policy_header([&gcra(1, 30)], || T0).unwrap(), r#""orders.read";q=30;w=30"#);
        // README's example: 3 x 333334 us is 1.000002 s, rounded up to 2.
        assert_eq!(policy_header([&gcra(3, 3)], || T0).unwrap(), r#""orders.read";q=3;w=2"#);
    }

    #[test]
    fn limit_header_rounds_the_reset_up() {
        let decision = RateLimitDecision {
            allowed: true,
            remaining: 7,
            retry_after_ms: 0,
            reset_after_ms: 1001,
            replayed: false,
        };
        let id = PolicyId::new("orders.read").unwrap();
        assert_eq!(limit_header([(&id, &decision, true)]).unwrap(), r#""orders.read";r=7;t=2"#);
        let full = RateLimitDecision { reset_after_ms: 0, ..decision };
        assert_eq!(limit_header([(&id, &full, true)]).unwrap(), r#""orders.read";r=7;t=0"#);
    }

    #[test]
    fn a_concurrency_policy_shows_its_slots_without_a_window_or_a_reset() {
        let exports = policy(Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 2,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
        }));
        assert_eq!(policy_header([&exports], || T0).unwrap(), r#""orders.read";q=2"#);
        // One slot of two taken; no reset time, not even `t=0` ("whole now").
        let held = RateLimitDecision {
            allowed: true,
            remaining: 1,
            retry_after_ms: 0,
            reset_after_ms: 0,
            replayed: false,
        };
        let window = RateLimitDecision { reset_after_ms: 60_000, ..held };
        let hourly = PolicyId::new("hourly").unwrap();
        assert_eq!(
            limit_header([(exports.id(), &held, false), (&hourly, &window, true)]).unwrap(),
            r#""orders.read";r=1, "hourly";r=1;t=60"#
        );
    }

    #[test]
    fn a_set_is_one_list_in_the_order_given_and_no_policy_is_no_header() {
        // The burst + sustained pair of docs/algorithms.md, with its expected values.
        let burst = RateLimitPolicy::builder(
            "orders-burst",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 10,
                window: Duration::from_secs(1),
            }),
        )
        .build()
        .unwrap();
        let hourly = RateLimitPolicy::builder(
            "orders-hourly",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 1000,
                window: Duration::from_secs(3600),
            }),
        )
        .build()
        .unwrap();
        assert_eq!(
            policy_header([&burst, &hourly], || T0).unwrap(),
            r#""orders-burst";q=10;w=1, "orders-hourly";q=1000;w=3600"#
        );
        let decision = |remaining, reset_secs: u64| RateLimitDecision {
            allowed: true,
            remaining,
            retry_after_ms: 0,
            reset_after_ms: reset_secs * 1000,
            replayed: false,
        };
        let (first, second) = (decision(9, 1), decision(999, 3540));
        assert_eq!(
            limit_header([(burst.id(), &first, true), (hourly.id(), &second, true)]).unwrap(),
            r#""orders-burst";r=9;t=1, "orders-hourly";r=999;t=3540"#
        );
        assert_eq!(policy_header([], || T0), None);
    }

    /// docs/algorithms.md "Calendar window", worked numbers (b): a month in
    /// Berlin is January's 31 days at its last half second and February's
    /// 28 from its first instant; `w` follows the time given.
    #[test]
    fn a_calendar_windows_w_is_the_period_of_the_time_given() {
        let monthly = RateLimitPolicy::builder(
            "orders.read",
            Algorithm::CalendarWindow(shared_contract::CalendarWindow {
                limit: 3,
                period: shared_contract::CalendarPeriod::Month,
                time_zone: "Europe/Berlin".parse().unwrap(),
            }),
        )
        .build()
        .unwrap();
        let at = |now: u64| policy_header([&monthly], move || now).unwrap();
        assert_eq!(at(1_801_436_399_500), r#""orders.read";q=3;w=2678400"#);
        assert_eq!(at(1_801_436_400_000), r#""orders.read";q=3;w=2419200"#);
        assert_eq!(limit_header([]), None);
    }

    /// The `sfv` serialization the hand-written header must equal.
    fn limit_header_by_sfv<'a>(
        decisions: impl IntoIterator<Item = (&'a PolicyId, &'a RateLimitDecision, bool)>,
    ) -> Option<HeaderValue> {
        list(decisions.into_iter().map(|(policy_id, decision, resets)| {
            let reset = resets.then(|| ("t", whole_seconds_up_millis(decision.reset_after_ms)));
            (policy_id, [Some(("r", decision.remaining)), reset].into_iter().flatten())
        }))
    }

    #[test]
    fn the_shared_policy_field_is_what_sfv_writes() {
        let ids = ["a", "orders.read", "x-1_2.3"];
        let policies: Vec<RateLimitPolicy> = ids
            .iter()
            .map(|id| {
                let window = Duration::from_millis(1500);
                RateLimitPolicy::builder(
                    *id,
                    Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 7, window }),
                )
                .build()
                .unwrap()
            })
            .collect();
        let mut text = Vec::new();
        write_policy_field(&mut text, &policies);
        assert_eq!(policy_header(&policies, || T0).unwrap().as_bytes(), text.as_slice());
    }

    #[test]
    fn the_hand_written_limit_header_is_what_sfv_writes() {
        let ids: Vec<PolicyId> = ["a", "orders.read", "x-1_2.3", &"z".repeat(64)]
            .iter()
            .map(|id| PolicyId::new(*id).unwrap())
            .collect();
        let values = [0, 1, 9, 10, 99, 12_345, SF_INTEGER_MAX, SF_INTEGER_MAX + 1, u64::MAX];
        let mut decisions = Vec::new();
        for (n, &remaining) in values.iter().enumerate() {
            let reset_after_ms = [0, 1, 999, 1000, 1001, u64::MAX][n % 6];
            decisions.push(RateLimitDecision {
                allowed: true,
                remaining,
                retry_after_ms: 0,
                reset_after_ms,
                replayed: false,
            });
        }
        for len in 1..=ids.len() {
            for start in 0..decisions.len() {
                let set: Vec<_> = ids[..len]
                    .iter()
                    .enumerate()
                    // Every third member has no reset (a concurrency policy).
                    .map(|(i, id)| (id, &decisions[(start + i) % decisions.len()], i % 3 != 1))
                    .collect();
                let by_hand = limit_header(set.iter().copied());
                assert_eq!(by_hand, limit_header_by_sfv(set.iter().copied()), "{set:?}");
                assert!(by_hand.is_some());
            }
        }
    }
}
