//! The inbound HTTP edge: who a request counts against, the keyed HMAC
//! pseudonym that is all a provider sees of it, the bridge that asks the
//! `EdgeRateLimitPort`, and the tower layer that maps every outcome to HTTP.
//!
//! This crate depends on `shared-contract` and the HTTP stack only. It must
//! never import a provider (`adapter-redis`, `adapter-memory`) or
//! `app-bootstrap`; providers reach it as `Arc<dyn EdgeRateLimitPort>`.

#![forbid(unsafe_code)]

mod answer;
mod bridge;
mod identity;
mod layer;
mod lease;
mod settings;
mod telemetry;
mod usage;

pub use answer::{
    ApiKeyProblem, BridgeEvaluation, DEFAULT_PROBLEM_TYPE_BASE, IdentityProblem, MAX_API_KEY_BYTES,
    RATELIMIT, RATELIMIT_POLICY, Refusal,
};
pub use bridge::{
    METHODS, RateLimitCost, TransportBridge, UNMATCHED_ROUTE, charged_digest, operation_digest,
};
pub use identity::{
    AuthenticatedPrincipal, MIN_KEY_BYTES, SubjectKind, VersionedPseudonymizer, canonical_identity,
};
pub use layer::{BridgeSwitch, RateLimitLayer, RateLimitService, ResponseFuture};
pub use lease::LeaseReleases;
pub use settings::{ClientIpHeader, DEFAULT_POLICY, EdgeSettings, WebError};
pub use telemetry::{
    DECISIONS_TOTAL, EVALUATION_SECONDS, FRONT_HTTP, LEASE_RELEASE_FAILURES_TOTAL, METRIC_PREFIX,
    SETTLES_TOTAL, metric_name,
};
pub use usage::RateLimitUsage;
