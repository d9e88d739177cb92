//! Shared pieces of the fuzz targets: one runtime, and a router with the
//! real rate-limit layer over the memory provider, driven in process.
//!
//! The targets themselves cannot `forbid(unsafe_code)`: `fuzz_target!`
//! expands to an `#[unsafe(no_mangle)]` entry point. This library can.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::{
    ClientIpHeader, EdgeSettings, RateLimitLayer, TransportBridge, VersionedPseudonymizer,
};
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, Response};
use secrecy::SecretSlice;
use shared_contract::{Algorithm, Clock, ManualClock, PolicyId, PolicySet, RateLimitPolicy};
use tower::ServiceExt;

/// The socket peer of every request: inside the trusted proxy range, so
/// `Forwarded` / `X-Forwarded-For` are walked.
pub const PEER: &str = "10.1.2.3:4000";

/// A current-thread runtime shared by every run of a target.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
    })
}

/// The pseudonymizer every target uses (a fixed test key).
pub fn pseudonymizer() -> Arc<VersionedPseudonymizer> {
    let key = SecretSlice::from(b"fuzz-pseudonymizer-key-0123456789abcdef".to_vec());
    Arc::new(VersionedPseudonymizer::new([(1, key)], 1).expect("a valid key"))
}

/// `GET /` behind the rate-limit layer over the memory provider with
/// `policy` as the default, trusting proxies in 10.0.0.0/8 that write
/// `X-Forwarded-For`.
pub fn router(policy: RateLimitPolicy) -> Router {
    router_behind(policy, ClientIpHeader::XForwardedFor)
}

/// [`router`] behind trusted proxies that write `header`.
pub fn router_behind(policy: RateLimitPolicy, header: ClientIpHeader) -> Router {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_800_000_000_000));
    let settings = EdgeSettings {
        default_policies: PolicySet::single(policy.id().clone()),
        trusted_proxies: vec!["10.0.0.0/8".parse().expect("a CIDR")],
        client_ip_header: header,
        ..EdgeSettings::default()
    };
    let port = MemoryEdgeRateLimitAdapter::new([policy], Arc::clone(&clock)).expect("one policy");
    let bridge = TransportBridge::new(Arc::new(port), pseudonymizer(), clock, settings);
    Router::new().route("/", get(|| async { "ok" })).layer(RateLimitLayer::new(Arc::new(bridge)))
}

/// A generous fixed window named `fuzz`, so requests are allowed.
pub fn default_policy() -> RateLimitPolicy {
    let algorithm =
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 1_000_000_000, window: Duration::from_secs(60) });
    RateLimitPolicy::builder("fuzz", algorithm).build().expect("a valid policy")
}

/// Sends `request` (with the [`PEER`] connection info) through `router`.
pub fn send(router: &Router, request: http::request::Builder) -> Option<Response<Body>> {
    let peer: SocketAddr = PEER.parse().expect("an address");
    let request: Request<Body> = request.extension(ConnectInfo(peer)).body(Body::empty()).ok()?;
    runtime().block_on(router.clone().oneshot(request)).ok()
}

/// Panics unless `value` parses as a structured-field List (RFC 9651),
/// each member a string item `policy` — the shape of `RateLimit` and
/// `RateLimit-Policy`.
pub fn assert_ratelimit_list(name: &str, value: &http::HeaderValue, policy: &PolicyId) {
    let text = value.to_str().unwrap_or_else(|_| panic!("{name} is not visible ASCII"));
    let list = sfv::Parser::new(text)
        .parse::<sfv::List>()
        .unwrap_or_else(|error| panic!("{name}: {text:?} is no structured List: {error}"));
    assert!(!list.is_empty(), "{name} is empty");
    for member in &list {
        let sfv::ListEntry::Item(item) = member else { panic!("{name}: an inner list: {text}") };
        assert_eq!(
            item.bare_item.as_string().map(|s| s.as_str()),
            Some(policy.as_str()),
            "{name}: {text}"
        );
    }
}
