//! Arbitrary `Forwarded` and `X-Forwarded-For` values from a trusted peer,
//! through the real layer behind proxies that write either header: never a
//! panic, never a 5xx from parsing (the provider is the memory one, so a
//! 5xx could only come from the edge), and an allowed response carries
//! well-formed RateLimit headers.
#![no_main]

use std::sync::OnceLock;

use axum::Router;
use adapter_web::ClientIpHeader;
use ca_skeleton_fuzz::{assert_ratelimit_list, default_policy, router_behind, send};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static BEHIND_X_FORWARDED_FOR: OnceLock<Router> = OnceLock::new();
    static BEHIND_FORWARDED: OnceLock<Router> = OnceLock::new();
    // The first byte says where the input splits into the two headers, and
    // its low bit which one the edge reads.
    let Some((&split, rest)) = data.split_first() else { return };
    let router = if split & 1 == 0 {
        BEHIND_X_FORWARDED_FOR
            .get_or_init(|| router_behind(default_policy(), ClientIpHeader::XForwardedFor))
    } else {
        BEHIND_FORWARDED.get_or_init(|| router_behind(default_policy(), ClientIpHeader::Forwarded))
    };
    let (forwarded, xff) = rest.split_at(usize::from(split).min(rest.len()));
    let mut request = http::Request::get("/");
    if let Ok(value) = http::HeaderValue::from_bytes(forwarded) {
        request = request.header("forwarded", value);
    }
    if let Ok(value) = http::HeaderValue::from_bytes(xff) {
        request = request.header("x-forwarded-for", value);
    }
    let Some(response) = send(router, request) else { return };
    let status = response.status();
    assert!(status == 200 || status == 429 || status.is_client_error(), "status {status}");
    if status == 200 {
        let policy = default_policy();
        for name in ["ratelimit", "ratelimit-policy"] {
            let value = response.headers().get(name).unwrap_or_else(|| panic!("no {name}"));
            assert_ratelimit_list(name, value, policy.id());
        }
    }
});
