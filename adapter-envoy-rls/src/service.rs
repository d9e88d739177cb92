//! The gRPC services: `envoy.service.ratelimit.v3.RateLimitService` over
//! the engine in force, `grpc.health.v1.Health` over the provider's
//! readiness, and the listener that serves both until shutdown.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures::{Stream, StreamExt};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codegen::http::HeaderMap;
use tonic::codegen::{Service, http};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};
use tower::util::MapRequestLayer;
use tracing::{Instrument, Span};

use crate::engine::RlsEngine;
use crate::error::RlsError;
use crate::wire::WireServer;

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
        let watch = request.extensions().get::<DeadlineWatch>().cloned();
        let mut unanswered = Unanswered { span: span.clone(), watch };
        let Some(span) = span else {
            let answer = engine.should_rate_limit(request.get_ref(), timeout).await;
            unanswered.watch = None;
            return answer.map(Response::new);
        };
        let answer =
            engine.should_rate_limit(request.get_ref(), timeout).instrument(span.clone()).await;
        unanswered.watch = None;
        record_status(&span, answer.as_ref().map_or_else(Status::code, |_| Code::Ok));
        answer.map(Response::new)
    }
}

/// The call's gRPC status on its span, and `ERROR` for the gRPC
/// conventions' server errors (a caller's mistake is not one).
fn record_status(span: &Span, code: Code) {
    span.record("rpc.grpc.status_code", code as i64);
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
}

/// A call whose answer is not given yet. Dropped unanswered, it was ended
/// from outside: by its deadline ([`answered_by`] answers `UNAVAILABLE`
/// then), whose status and warning it writes on and in the call's span so
/// the log line joins the trace; or by the client going away (`CANCELLED`).
struct Unanswered {
    /// The call's span, if it is traced.
    span: Option<Span>,
    /// `None` once answered (or when no [`Deadlined`] serves the call).
    watch: Option<DeadlineWatch>,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let Some(watch) = self.watch.take() else { return };
        let span = self.span.take().unwrap_or_else(Span::none);
        if !watch.passed() {
            // The client went away: no answer is sent, nothing failed here.
            record_status(&span, Code::Cancelled);
            return;
        }
        record_status(&span, Code::Unavailable);
        span.in_scope(warn_deadline_passed);
        watch.0.warned.store(true, Ordering::Release);
    }
}

fn warn_deadline_passed() {
    tracing::warn!(outcome = "indeterminate", "envoy rls deadline passed; failed closed");
}

/// Shared by [`Deadlined`] and the call it serves: whether the deadline
/// ended the call, and whether the call (in its span) said so already.
#[derive(Debug, Clone, Default)]
struct DeadlineWatch(Arc<DeadlineState>);

#[derive(Debug, Default)]
struct DeadlineState {
    passed: AtomicBool,
    warned: AtomicBool,
}

impl DeadlineWatch {
    fn passed(&self) -> bool {
        self.0.passed.load(Ordering::Acquire)
    }
}

/// When a call reached the server, stamped by [`stamp_arrival`].
#[derive(Debug, Clone, Copy)]
struct Arrival(Instant);

/// Stamps the call's arrival. tonic's server runs its own `grpc-timeout`
/// timer around every call (`GrpcTimeout`, outside any layer we add) and
/// answers `CANCELLED "Timeout expired"` when it fires first. It starts
/// that timer right after it hands the request to the layers inside it,
/// so a stamp taken here is never later than tonic's start, and a
/// deadline counted from it never ends after tonic's.
fn stamp_arrival<B>(mut request: http::Request<B>) -> http::Request<B> {
    request.extensions_mut().insert(Arrival(Instant::now()));
    request
}

/// The rate limit service with its evaluation deadline counted from the
/// call's arrival: from the request's first byte read to its answer, a
/// call that outlives `min(budget, grpc-timeout)` is answered
/// `UNAVAILABLE` by us (see [`answered_by`]), never `CANCELLED` by tonic.
#[derive(Debug, Clone)]
struct Deadlined<S> {
    inner: S,
    switch: RlsSwitch,
}

impl<S: NamedService> NamedService for Deadlined<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for Deadlined<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let arrival = request.extensions().get::<Arrival>().map_or_else(Instant::now, |at| at.0);
        let timeout = grpc_timeout_header(request.headers());
        let budget = self.switch.current().evaluation_deadline(timeout);
        // A budget too large for `Instant` fails closed, as the engine's.
        let deadline = arrival.checked_add(budget).unwrap_or(arrival);
        let watch = DeadlineWatch::default();
        request.extensions_mut().insert(watch.clone());
        Box::pin(answered_by(deadline, watch, self.inner.call(request)))
    }
}

/// `answer`, or, once `deadline` has passed, `UNAVAILABLE` with the
/// category `indeterminate` (the provider may have charged). tonic polls
/// the call before its own timer, so when that timer has fired this one's
/// deadline (never later) has passed too, the check of the time below
/// answers, and the client gets our status, not tonic's `CANCELLED`.
///
/// The call is dropped before the answer is returned, so what it records
/// when dropped (the decision counted `indeterminate`, the call span's
/// status and warning, see `Unanswered`) is in place when the client reads
/// the answer. A call that never reached the service (its request still
/// being read) warns here instead, outside any span.
async fn answered_by<E>(
    deadline: Instant,
    watch: DeadlineWatch,
    answer: impl Future<Output = Result<http::Response<tonic::body::Body>, E>>,
) -> Result<http::Response<tonic::body::Body>, E> {
    let mut answer = pin!(Some(answer));
    let mut timer = pin!(tokio::time::sleep_until(deadline));
    poll_fn(|cx| {
        if let Some(call) = answer.as_mut().as_pin_mut()
            && let Poll::Ready(answer) = call.poll(cx)
        {
            return Poll::Ready(answer);
        }
        if Instant::now() >= deadline || timer.as_mut().poll(cx).is_ready() {
            watch.0.passed.store(true, Ordering::Release);
            answer.set(None);
            if !watch.0.warned.load(Ordering::Acquire) {
                warn_deadline_passed();
            }
            let status = Status::unavailable("rate limit unavailable: indeterminate");
            return Poll::Ready(Ok(status.into_http()));
        }
        Poll::Pending
    })
    .await
}

/// The `grpc-timeout` a call sent (`<1..8 digits><H|M|S|m|u|n>`), read as
/// tonic's server reads it (its timer and this deadline must agree); one
/// that does not read is ignored (the budget holds).
pub fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    grpc_timeout_header(metadata.as_ref())
}

fn grpc_timeout_header(headers: &http::HeaderMap) -> Option<Duration> {
    let text = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.len() > 8 {
        return None;
    }
    // `u64::from_str`, as tonic's: it takes a leading `+` too.
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value * 3600),
        "M" => Duration::from_secs(value * 60),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

/// How often the listener asks the provider whether it is ready, so a
/// `Watch` sees a change without being asked: the interval of Envoy's
/// own health checks or shorter, one `PING` a second on Redis.
pub const READINESS_INTERVAL: Duration = Duration::from_secs(1);

/// `grpc.health.v1.Health`: `SERVING` only while the provider of the
/// engine in force is ready (the rule of `/readyz`). `Check` asks the
/// provider at each call; `Watch` streams the status as tonic-health's
/// [`HealthReporter`] holds it, which every `Check` and the listener's
/// readiness loop (every [`READINESS_INTERVAL`]) update, so a watcher gets
/// a new message whenever readiness changes, and only then.
/// The overall service (`""`) and [`RATE_LIMIT_SERVICE_NAME`] are known;
/// `Check` answers any other name `NOT_FOUND`, `Watch` `SERVICE_UNKNOWN`.
#[derive(Debug, Clone)]
pub struct ProviderHealth {
    switch: RlsSwitch,
    reporter: HealthReporter,
    /// What `reporter` was last told; held across the update, so two
    /// observers never set it out of order.
    reported: Arc<tokio::sync::Mutex<Reported>>,
}

/// What the watchers were last told.
#[derive(Debug, Default)]
struct Reported {
    /// `None` before the first observation.
    status: Option<tonic_health::ServingStatus>,
    /// The listener is shutting down: the watches have ended, and nothing
    /// is reported any more.
    closed: bool,
}

impl ProviderHealth {
    /// Health over the provider of `switch`'s engine.
    pub fn new(switch: RlsSwitch) -> Self {
        let reported = Arc::new(tokio::sync::Mutex::new(Reported::default()));
        Self { switch, reporter: HealthReporter::new(), reported }
    }

    /// Asks the provider now and reports the answer to the watchers if it
    /// changed. Off (`disabled`) is always ready, as `/readyz` says.
    async fn observe(&self) -> tonic_health::ServingStatus {
        use tonic_health::ServingStatus::{NotServing, Serving};
        let engine = self.switch.current();
        let ready = match engine.port() {
            Some(port) => port.is_ready().await,
            None => true,
        };
        let status = if ready { Serving } else { NotServing };
        let mut reported = self.reported.lock().await;
        if reported.closed {
            return NotServing;
        }
        if reported.status != Some(status) {
            for service in ["", RATE_LIMIT_SERVICE_NAME] {
                self.reporter.set_service_status(service, status).await;
            }
            reported.status = Some(status);
        }
        status
    }

    /// At shutdown: every watcher hears `NOT_SERVING`, then its stream
    /// ends, so the drain does not wait on open watches; a later `Check`
    /// answers `NOT_SERVING`.
    async fn close(&self) {
        let mut reported = self.reported.lock().await;
        reported.closed = true;
        let mut reporter = self.reporter.clone();
        for service in ["", RATE_LIMIT_SERVICE_NAME] {
            let status = tonic_health::ServingStatus::NotServing;
            reporter.set_service_status(service, status).await;
            // Dropping the sender ends the watches once they have read it.
            reporter.clear_service_status(service).await;
        }
    }

    /// Observes readiness every [`READINESS_INTERVAL`], for ever.
    async fn follow_readiness(&self) {
        let mut interval = tokio::time::interval(READINESS_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            self.observe().await;
        }
    }

    fn known(service: &str) -> Result<(), Status> {
        if service.is_empty() || service == RATE_LIMIT_SERVICE_NAME {
            Ok(())
        } else {
            Err(Status::not_found("unknown service"))
        }
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for ProviderHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Self::known(&request.get_ref().service)?;
        let status = ServingStatus::from(self.observe().await);
        Ok(Response::new(HealthCheckResponse { status: status.into() }))
    }

    type WatchStream = WatchStream;

    /// The status now, then each change, until the client ends the call.
    /// An unknown service gets `SERVICE_UNKNOWN` and the stream stays
    /// open (the health protocol: the service may be added later; here it
    /// never is), ending at shutdown with the others.
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let known = Self::known(&request.get_ref().service).is_ok();
        // The status the stream starts with is the provider's now.
        if self.observe().await == tonic_health::ServingStatus::NotServing
            && self.reported.lock().await.closed
        {
            return Err(Status::unavailable("the listener is shutting down"));
        }
        let statuses = HealthService::from_health_reporter(self.reporter.clone());
        if known {
            let stream = statuses.watch(request).await?.into_inner();
            return Ok(Response::new(Box::pin(stream)));
        }
        // The overall status's stream, of which only the end is kept.
        let overall = HealthCheckRequest { service: String::new() };
        let until_shutdown = statuses.watch(Request::new(overall)).await?.into_inner();
        let unknown = HealthCheckResponse { status: ServingStatus::ServiceUnknown.into() };
        let stream = futures::stream::once(std::future::ready(Ok(unknown)))
            .chain(until_shutdown.filter_map(|_| std::future::ready(None)));
        Ok(Response::new(Box::pin(stream)))
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
    let health = ProviderHealth::new(switch.clone());
    // Watchers are told of readiness while the listener serves; the loop
    // ends with it.
    let readiness = health.clone();
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = readiness.follow_readiness() => {}
        }
        readiness.close().await;
    };
    let service = EnvoyRateLimitService::new(switch.clone()).traced_by(tracing);
    tonic::transport::Server::builder()
        .layer(MapRequestLayer::new(stamp_arrival))
        .add_service(Deadlined { inner: WireServer::new(service), switch })
        .add_service(HealthServer::new(health))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
        .map_err(|error| RlsError::Transport(error.to_string()))
}
