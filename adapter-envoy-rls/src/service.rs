//! The gRPC services: `envoy.service.ratelimit.v3.RateLimitService` over
//! the engine in force, `grpc.health.v1.Health` over the provider's
//! readiness, and the listener that serves both until shutdown.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures::Stream;
use shared_contract::{RateLimitOutcome, RateLimitRequest as PortRequest};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codegen::http::HeaderMap;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tracing::{Instrument, Span};

use crate::engine::RlsEngine;
use crate::error::RlsError;

/// The service name Envoy's `grpc_service` calls, and a health check may
/// name.
pub const RATE_LIMIT_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The engine in force, swapped whole on reload: a call takes it once and
/// keeps it to its answer, so it runs under one rule table, old or new.
#[derive(Debug, Clone)]
pub struct RlsSwitch(Arc<ArcSwap<RlsEngine>>);

impl RlsSwitch {
    /// A switch holding `engine`.
    pub fn new(engine: RlsEngine) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(engine)))
    }

    /// The engine in force.
    pub fn current(&self) -> Arc<RlsEngine> {
        self.0.load_full()
    }

    /// Puts `engine` in force for every call that starts from now on.
    pub fn replace(&self, engine: RlsEngine) {
        self.0.store(Arc::new(engine));
    }
}

/// Whether a call is traced, and how its span joins the caller's trace:
/// supplied by the composition root, the one crate that knows a trace
/// format. This crate makes plain `tracing` spans and never reads
/// `traceparent` itself.
pub trait CallTracing: Send + Sync + std::fmt::Debug {
    /// The span `make` builds, joined to the trace the call's metadata
    /// (`headers`) names; `None`, and no span made, when the call is not
    /// traced.
    fn call_span(&self, headers: &HeaderMap, make: &dyn Fn() -> Span) -> Option<Span>;
}

/// `ShouldRateLimit` over the engine in force.
#[derive(Debug, Clone)]
pub struct EnvoyRateLimitService {
    switch: RlsSwitch,
    tracing: Option<Arc<dyn CallTracing>>,
}

impl EnvoyRateLimitService {
    /// The service over `switch`.
    pub fn new(switch: RlsSwitch) -> Self {
        Self { switch, tracing: None }
    }

    /// The service, each traced call in a span that `tracing` joins to the
    /// caller's trace.
    #[must_use]
    pub fn traced_by(mut self, tracing: Option<Arc<dyn CallTracing>>) -> Self {
        self.tracing = tracing;
        self
    }
}

#[tonic::async_trait]
impl RateLimitService for EnvoyRateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let timeout = grpc_timeout(request.metadata());
        let engine = self.switch.current();
        let span = self.tracing.as_ref().and_then(|tracing| {
            tracing.call_span(request.metadata().as_ref(), &|| {
                tracing::info_span!(
                    "rls.call",
                    otel.name = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                    otel.kind = "server",
                    rpc.system = "grpc",
                    rpc.service = RATE_LIMIT_SERVICE_NAME,
                    rpc.method = "ShouldRateLimit",
                    rpc.grpc.status_code = tracing::field::Empty,
                    otel.status_code = tracing::field::Empty,
                )
            })
        });
        let Some(span) = span else {
            return engine.should_rate_limit(request.get_ref(), timeout).await.map(Response::new);
        };
        let answer =
            engine.should_rate_limit(request.get_ref(), timeout).instrument(span.clone()).await;
        let code = answer.as_ref().map_or_else(Status::code, |_| Code::Ok);
        span.record("rpc.grpc.status_code", code as i64);
        // The gRPC conventions' server errors; a caller's mistake is not.
        let server_error = matches!(
            code,
            Code::Unknown
                | Code::DeadlineExceeded
                | Code::Unimplemented
                | Code::Internal
                | Code::Unavailable
                | Code::DataLoss
        );
        if server_error {
            span.record("otel.status_code", "ERROR");
        }
        answer.map(Response::new)
    }
}

/// The `rate_limit.decision` span of one policy set's evaluation, as on
/// HTTP: a child of the call's span, `None` when the call has none (it is
/// not traced). The operation is the rule's digest and the subject its
/// pseudonym: no raw descriptor value ever reaches a span.
pub(crate) fn decision_span(request: &PortRequest) -> Option<Span> {
    // `is_known` would be true for "no span" too: the id says there is one.
    let traced =
        tracing::dispatcher::get_default(|dispatch| dispatch.current_span().id().is_some());
    traced.then(|| {
        let policies: Vec<&str> = request.policies.ids().iter().map(|id| id.as_str()).collect();
        tracing::info_span!(
            "rate_limit.decision",
            rate_limit.operation = request.operation.as_str(),
            rate_limit.policies = policies.join(","),
            rate_limit.subject = request.subject.as_str(),
            rate_limit.outcome = tracing::field::Empty,
            rate_limit.admitted = tracing::field::Empty,
            rate_limit.cached = tracing::field::Empty,
        )
    })
}

/// The decision's attributes: its outcome category, whether the
/// descriptors pass (`enforces`: whether the set holds an enforced policy,
/// without which a failure passes), and whether the denial cache answered.
pub(crate) fn record_decision(span: &Span, outcome: &RateLimitOutcome, enforces: bool) {
    let cached = match outcome {
        RateLimitOutcome::Evaluated(set) => set.cached(),
        RateLimitOutcome::Unavailable { .. }
        | RateLimitOutcome::Incompatible { .. }
        | RateLimitOutcome::Indeterminate { .. } => false,
    };
    span.record("rate_limit.outcome", outcome.category_name());
    span.record("rate_limit.admitted", outcome.is_allowed() || !enforces);
    span.record("rate_limit.cached", cached);
}

/// The `grpc-timeout` a call sent (`<1..8 digits><H|M|S|m|u|n>`), if it
/// sent one that reads; a malformed one is ignored (the budget holds).
pub fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let text = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value.checked_mul(3600)?),
        "M" => Duration::from_secs(value.checked_mul(60)?),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

/// `grpc.health.v1.Health`: `SERVING` only while the provider of the
/// engine in force is ready (the rule of `/readyz`), asked at each check.
/// The overall service (`""`) and [`RATE_LIMIT_SERVICE_NAME`] are known;
/// any other name is `NOT_FOUND`.
#[derive(Debug, Clone)]
pub struct ProviderHealth {
    switch: RlsSwitch,
}

impl ProviderHealth {
    /// Health over the provider of `switch`'s engine.
    pub fn new(switch: RlsSwitch) -> Self {
        Self { switch }
    }

    async fn status(&self, service: &str) -> Result<HealthCheckResponse, Status> {
        if !service.is_empty() && service != RATE_LIMIT_SERVICE_NAME {
            return Err(Status::not_found("unknown service"));
        }
        // Off (`disabled`) is always ready, as `/readyz` says.
        let engine = self.switch.current();
        let ready = match engine.port() {
            Some(port) => port.is_ready().await,
            None => true,
        };
        let status = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
        Ok(HealthCheckResponse { status: status.into() })
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for ProviderHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.status(&request.get_ref().service).await.map(Response::new)
    }

    type WatchStream = WatchStream;

    /// The status now, once; the stream then ends and a client asks again
    /// (what the protocol tells it to do on any end but `UNIMPLEMENTED`).
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let status = self.status(&request.get_ref().service).await;
        let stream: WatchStream = Box::pin(futures::stream::once(async move { status }));
        Ok(Response::new(stream))
    }
}

/// Serves both services on `listener` until `shutdown` completes, then
/// stops accepting and lets the calls in flight finish (the caller bounds
/// that drain, as it bounds the HTTP listener's).
///
/// # Errors
/// The transport's failure, as text.
pub async fn serve(
    listener: TcpListener,
    switch: RlsSwitch,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RlsError> {
    serve_traced(listener, switch, None, shutdown).await
}

/// [`serve`], each call traced as `tracing` decides (see [`CallTracing`]).
///
/// # Errors
/// The transport's failure, as text.
pub async fn serve_traced(
    listener: TcpListener,
    switch: RlsSwitch,
    tracing: Option<Arc<dyn CallTracing>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RlsError> {
    let service = EnvoyRateLimitService::new(switch.clone()).traced_by(tracing);
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(service))
        .add_service(HealthServer::new(ProviderHealth::new(switch)))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
        .map_err(|error| RlsError::Transport(error.to_string()))
}
