//! RateLimit / RateLimit-Policy rendering for any policy the builder
//! accepts (id, algorithm, limit, window): an allowed response always
//! carries both headers as structured-field Lists naming the policy, and a
//! denial carries a whole-second Retry-After.
#![no_main]

use std::time::Duration;

use ca_skeleton_fuzz::{assert_ratelimit_list, router, send};
use libfuzzer_sys::fuzz_target;
use shared_contract::{Algorithm, RateLimitPolicy};

fuzz_target!(|data: &[u8]| {
    if data.len() < 17 {
        return;
    }
    let number = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    let (kind, limit, window) = (data[0] % 5, number(1), number(9));
    let Ok(id) = std::str::from_utf8(&data[17..]) else { return };
    // Small limits so denials come too; any window the builder accepts.
    let limit = limit % 4 + 1;
    let window = Duration::from_millis(window % (400 * 24 * 3600 * 1000));
    let algorithm = match kind {
        0 => Algorithm::FixedWindow(shared_contract::FixedWindow { limit, window }),
        1 => Algorithm::SlidingCounter(shared_contract::SlidingCounter { limit, window }),
        2 => Algorithm::TokenBucket(shared_contract::TokenBucket { capacity: limit, refill_tokens: 1, refill_period: window }),
        // No window: `RateLimit-Policy` without `w`; the lease TTL and the
        // retry-after from the same number, each in its own range.
        3 => Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: limit,
            lease_ttl: window,
            retry_after: Duration::from_millis(number(9) % 3_700_000),
        }),
        // The burst from the first byte's high bits: below, at or above the limit.
        _ => Algorithm::Gcra(shared_contract::Gcra { limit, period: window, burst: u64::from(data[0] >> 6) + 1 }),
    };
    let Ok(policy) = RateLimitPolicy::builder(id, algorithm).build() else { return };
    let router = router(policy.clone());
    for _ in 0..=limit {
        let Some(response) = send(&router, http::Request::get("/")) else { return };
        let headers = response.headers();
        match response.status().as_u16() {
            200 | 429 => {
                for name in ["ratelimit", "ratelimit-policy"] {
                    let value = headers.get(name).unwrap_or_else(|| panic!("no {name}"));
                    assert_ratelimit_list(name, value, policy.id());
                }
            }
            status => panic!("status {status} for {policy:?}"),
        }
        if response.status() == 429 {
            let retry = headers.get("retry-after").expect("a 429 has Retry-After");
            let seconds: u64 = retry.to_str().unwrap().parse().expect("whole seconds");
            assert!(seconds >= 1, "{seconds}");
        }
    }
});
