//! The inbound HTTP edge of the rate limiter: who a request counts against
//! (principal, API key or client IP, with a trusted-proxy walk), the keyed
//! HMAC pseudonym that is all a provider ever sees of that subject, the
//! transport bridge that builds a `RateLimitRequest` and asks the
//! `EdgeRateLimitPort`, and the tower layer that maps every outcome to
//! HTTP (`RateLimit` headers, `429`, `503` problem+json, fail-closed).
//!
//! This crate depends on `shared-contract` and the HTTP stack only. It must
//! never import a provider (`adapter-redis`, `adapter-memory`) or
//! `app-bootstrap`; providers reach it as `Arc<dyn EdgeRateLimitPort>`.

#![forbid(unsafe_code)]

mod bridge;
mod client_ip;
mod cost;
mod error;
mod future;
mod layer;
mod lease;
mod limiter;
mod mapping;
mod operation;
mod problem;
mod pseudonymizer;
mod ratelimit_headers;
mod refusal;
mod rejection;
mod service;
mod settings;
mod subject;
mod switch;
mod telemetry;

pub use bridge::{BridgeEvaluation, TransportBridge};
pub use cost::RateLimitCost;
pub use error::WebError;
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use lease::LeaseReleases;
pub use mapping::{RATELIMIT, RATELIMIT_POLICY};
pub use operation::{METHODS, UNMATCHED_ROUTE, charged_digest, operation_digest};
pub use pseudonymizer::{MIN_KEY_BYTES, VersionedPseudonymizer};
pub use refusal::Refusal;
pub use rejection::{ApiKeyProblem, EdgeRejection, MAX_API_KEY_BYTES};
pub use service::RateLimitService;
pub use settings::{ClientIpHeader, DEFAULT_POLICY, DEFAULT_PROBLEM_TYPE_BASE, EdgeSettings};
pub use subject::{AuthenticatedPrincipal, IdentityProblem, SubjectKind, canonical_identity};
pub use switch::BridgeSwitch;
pub use telemetry::{
    DECISIONS_TOTAL, EVALUATION_SECONDS, FRONT_HTTP, LEASE_RELEASE_FAILURES_TOTAL, METRIC_PREFIX,
    metric_name,
};
