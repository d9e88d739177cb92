//! The inbound gRPC edge for Envoy (and Istio, Gloo, Contour, Emissary):
//! Envoy's Rate Limit Service, `envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`, answered over the same `EdgeRateLimitPort` as the HTTP
//! edge, plus `grpc.health.v1` that is `SERVING` only while the provider is
//! ready.
//!
//! A request's descriptors are matched to [`RlsRule`]s; the descriptors
//! that resolve to one subject (a keyed pseudonym of the domain and the
//! subject entries, never the raw values) and one cost are evaluated as one
//! policy set, one atomic step of the provider: a denial charges none of
//! them. Sets of different subjects are asked in request order, and the
//! first one denied ends the evaluation.
//!
//! This crate depends on `shared-contract` and the gRPC stack only. It must
//! never import a provider or another inbound adapter (`adapter-web`): the
//! provider reaches it as `Arc<dyn EdgeRateLimitPort>`, the pseudonymizer
//! as `Arc<dyn SubjectPseudonymizer>`.

#![forbid(unsafe_code)]

mod engine;
mod error;
mod limit_override;
mod response;
mod rules;
mod service;
mod telemetry;
mod wire;

pub use engine::{DescriptorSubject, MAX_DESCRIPTORS, RlsEngine, RlsSettings};
pub use error::RlsError;
pub use limit_override::{MAX_HELD_OVERRIDES, OverridePorts};
pub use rules::{DESCRIPTOR_SUBJECT_KIND, RlsRule, RuleLimit, rule_operation};
pub use service::{
    CallTracing, EnvoyRateLimitService, ProviderHealth, RATE_LIMIT_SERVICE_NAME,
    READINESS_INTERVAL, RlsSwitch, grpc_timeout, serve, serve_traced,
};
pub use telemetry::{
    BLOCKED_DESCRIPTORS_TOTAL, LIMIT_OVERRIDES_IGNORED_TOTAL, UNLIMITED_DESCRIPTORS_TOTAL,
    UNMATCHED_DESCRIPTORS_TOTAL,
};
