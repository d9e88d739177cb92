//! Traces: OpenTelemetry spans exported over OTLP/HTTP (`telemetry.otlp`).
//!
//! The pipeline is the SDK's: a batch span processor on the tokio runtime
//! feeding the OTLP/HTTP protobuf exporter, behind `tracing-opentelemetry`,
//! so the `tracing` spans of the edge (`rate_limit.decision`), the Redis
//! provider (`redis.script`) and this crate (`http.request`,
//! `admin.request`, `config.reload`) become OpenTelemetry spans. With no
//! endpoint nothing here is built, and no span is made on the hot path.
//!
//! An export failure never reaches a request: it is counted in
//! [`TRACE_EXPORT_FAILURES_TOTAL`] and logged at most once a minute.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
};
use tracing::{Instrument, Subscriber};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::OtlpConfig;
use crate::error::BootstrapError;

/// Counter of span batches the collector did not take (unreachable,
/// refused, timed out). Their spans are lost; requests are not affected.
pub const TRACE_EXPORT_FAILURES_TOTAL: &str =
    adapter_web::metric_name!("trace_export_failures_total");

/// The path OTLP/HTTP takes traces at, below the configured endpoint.
const TRACES_PATH: &str = "/v1/traces";
/// At most one "export failed" log line per this long.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);
/// The name of the tracer (the instrumentation scope) of every span.
const SCOPE: &str = "ca-skeleton";
/// The SDK's batch variables it takes as given: a zero queue panics the
/// processor ("mpsc bounded channel requires buffer > 0"), a zero batch
/// or concurrency never exports, a zero delay spins a core.
const NONZERO_BATCH_VARIABLES: [&str; 4] = [
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_MAX_CONCURRENT_EXPORTS",
    "OTEL_BSP_SCHEDULE_DELAY",
];

/// The variables of [`NONZERO_BATCH_VARIABLES`] that `lookup` sets to a
/// number the SDK reads as zero (`0`, `00`, `+0`).
fn zeroed_batch_variables(lookup: impl Fn(&str) -> Option<String>) -> Vec<&'static str> {
    NONZERO_BATCH_VARIABLES
        .into_iter()
        .filter(|name| lookup(name).and_then(|value| value.parse::<u64>().ok()) == Some(0))
        .collect()
}

/// The running trace pipeline; [`Tracing::shutdown`] flushes it.
#[derive(Debug, Clone)]
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Starts the pipeline `otlp` describes; `None` when it sets no
    /// endpoint. Call it inside the tokio runtime: the batch processor
    /// runs on it.
    pub fn start(otlp: &OtlpConfig) -> Result<Option<Self>, BootstrapError> {
        let Some(endpoint) = &otlp.endpoint else { return Ok(None) };
        let zeroed = zeroed_batch_variables(|name| std::env::var(name).ok());
        if !zeroed.is_empty() {
            return Err(BootstrapError::Wiring {
                component: "the OTLP batch span processor",
                reason: format!("{} must be more than 0 (or unset)", zeroed.join(", ")),
            });
        }
        let headers: HashMap<String, String> = otlp
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), value.expose().to_owned()))
            .collect();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/')))
            .with_timeout(otlp.timeout)
            .with_headers(headers)
            .build()
            .map_err(|error| BootstrapError::Wiring {
                component: "the OTLP span exporter",
                reason: error.to_string(),
            })?;
        // The processor's own export deadline sits past the client's, so a
        // slow collector fails in the client and is counted.
        let batch = BatchConfigBuilder::default()
            .with_max_export_timeout(otlp.timeout + Duration::from_secs(1))
            .build();
        let processor = BatchSpanProcessor::builder(Counted::new(exporter), Tokio)
            .with_batch_config(batch)
            .build();
        // The ratio is applied at the edge, before any span is made
        // ([`Sampling`]); what reaches the SDK is kept, except under a
        // caller's span that is not sampled.
        let sampler = Sampler::ParentBased(Box::new(Sampler::AlwaysOn));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            .with_resource(Resource::builder().with_service_name(otlp.service_name.clone()).build())
            .build();
        Ok(Some(Self { provider }))
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans of
    /// this pipeline. Thread ids, busy/idle times, source locations and
    /// targets are left out: they cost on every span and say little here.
    pub fn layer<S>(&self) -> OpenTelemetryLayer<S, SdkTracer>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(SCOPE))
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_location(false)
            .with_target(false)
    }

    /// Exports the spans still queued and stops the pipeline, waiting at
    /// most `budget` (what is left of the shutdown grace). The SDK blocks
    /// while it flushes, so that runs off the runtime's workers.
    pub async fn shutdown(self, budget: Duration) {
        let provider = self.provider;
        let flush = tokio::task::spawn_blocking(move || drain_then_shut_down(&provider, budget));
        match tokio::time::timeout(budget, flush).await {
            Ok(Ok(Ok(()))) => tracing::debug!("pending spans flushed"),
            Ok(Ok(Err(error))) => tracing::warn!(%error, "pending spans not flushed"),
            Ok(Err(error)) => tracing::warn!(%error, "the span flush stopped"),
            Err(_) => {
                tracing::warn!(?budget, "pending spans not flushed within the shutdown grace")
            }
        }
    }
}

/// How long to wait before asking a full queue again to flush.
const FULL_QUEUE_RETRY: Duration = Duration::from_millis(20);

/// Flushes, then shuts `provider` down, within `budget`. The SDK's batch
/// processor takes its flush and shutdown messages on the span queue
/// itself, with `try_send`: on a full queue (a slow collector) a plain
/// shutdown fails at once and drops every pending span. So the flush is
/// asked again while the queue is full, which the processor drains at the
/// collector's pace, until it fits or the budget is spent. Blocking.
fn drain_then_shut_down(provider: &SdkTracerProvider, budget: Duration) -> OTelSdkResult {
    let deadline = Instant::now() + budget;
    loop {
        match provider.force_flush() {
            // The SDK reports a full queue only in its error's text.
            Err(error)
                if error.to_string().contains("channel is full")
                    && Instant::now() + FULL_QUEUE_RETRY < deadline =>
            {
                std::thread::sleep(FULL_QUEUE_RETRY);
            }
            // Flushed, or an export failed (counted): the shutdown says.
            Ok(()) | Err(_) => break,
        }
    }
    provider.shutdown_with_timeout(deadline.saturating_duration_since(Instant::now()))
}

/// The OTLP exporter, with each failed export counted and logged at most
/// once a minute (a collector that is down fails every few seconds).
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    last_logged: Mutex<Option<Instant>>,
}

impl<E> Counted<E> {
    fn new(inner: E) -> Self {
        Self { inner, last_logged: Mutex::new(None) }
    }

    fn failed(&self, spans: usize, error: &dyn fmt::Display) {
        metrics::counter!(TRACE_EXPORT_FAILURES_TOTAL).increment(1);
        let now = Instant::now();
        let mut last = self.last_logged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_none_or(|at| now.duration_since(at) >= FAILURE_LOG_EVERY) {
            *last = Some(now);
            tracing::warn!(
                %error, spans,
                "trace export failed; spans are dropped (counted in {TRACE_EXPORT_FAILURES_TOTAL}, \
                 logged at most once a minute)"
            );
        }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(error) = &result {
            self.failed(spans, error);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Which listener a request span belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listener {
    /// The public API and probes: `http.request` spans.
    Public,
    /// The operator listener: `admin.request` spans.
    Admin,
}

/// The head-sampling decision of `telemetry.otlp.sample-ratio`, made per
/// request before any span exists, so an unsampled request costs a header
/// look-up and a random number, and no span at all (nor a decision or
/// script span under it). Parent-based: a caller's `traceparent` decides
/// by its sampled flag; without one, the ratio does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sampling {
    ratio: f64,
}

impl Sampling {
    pub(crate) fn new(ratio: f64) -> Self {
        Self { ratio }
    }

    /// The caller's context when the request is traced, `None` when not.
    fn traced(self, headers: &axum::http::HeaderMap) -> Option<opentelemetry::Context> {
        if headers.contains_key("traceparent") {
            let parent = TraceContextPropagator::new()
                .extract(&opentelemetry_http::HeaderExtractor(headers));
            let ids = parent.span().span_context().clone();
            if ids.is_valid() {
                return ids.is_sampled().then_some(parent);
            }
        }
        let kept = self.ratio >= 1.0 || (self.ratio > 0.0 && rand::random::<f64>() < self.ratio);
        kept.then(opentelemetry::Context::new)
    }
}

/// Middleware (`axum::middleware::from_fn_with_state`): one server span
/// per sampled request, joined to the caller's trace when it sends a W3C
/// `traceparent` (and `tracestate`). Named `"<METHOD> <route template>"`
/// as the HTTP conventions say, never with the raw path.
pub(crate) async fn public_span(
    State(sampling): State<Sampling>,
    request: Request,
    next: Next,
) -> Response {
    request_span(Listener::Public, sampling, request, next).await
}

/// [`public_span`] for the admin listener.
pub(crate) async fn admin_span(
    State(sampling): State<Sampling>,
    request: Request,
    next: Next,
) -> Response {
    request_span(Listener::Admin, sampling, request, next).await
}

async fn request_span(
    listener: Listener,
    sampling: Sampling,
    request: Request,
    next: Next,
) -> Response {
    let Some(parent) = sampling.traced(request.headers()) else {
        return next.run(request).await;
    };
    let (method, in_name) = span_method(request.method());
    let route = request.extensions().get::<MatchedPath>().map(|path| path.as_str().to_owned());
    let name = match &route {
        Some(route) => format!("{in_name} {route}"),
        None => in_name.to_owned(),
    };
    let route = route.as_deref().unwrap_or_default();
    let span = match listener {
        Listener::Public => tracing::info_span!(
            "http.request",
            otel.name = name,
            otel.kind = "server",
            http.request.method = method,
            http.route = route,
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        ),
        Listener::Admin => tracing::info_span!(
            "admin.request",
            otel.name = name,
            otel.kind = "server",
            http.request.method = method,
            http.route = route,
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        ),
    };
    if parent.span().span_context().is_valid() {
        // Fails only when no OpenTelemetry layer is installed (a test's
        // in-process server): the span then has no trace to join anyway.
        let _ = span.set_parent(parent);
    }
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    // Signed: the OpenTelemetry layer turns an unsigned value into text.
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// The method as the OpenTelemetry HTTP conventions export it: a standard
/// method as itself, any other as `http.request.method = "_OTHER"` in a
/// span named `HTTP <route>`. A client picks an extension method freely
/// (long, hostile), so its raw name is never exported (no
/// `http.request.method_original`). Returns (attribute, name prefix).
fn span_method(method: &axum::http::Method) -> (&'static str, &'static str) {
    use axum::http::Method;
    let known = match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => return ("_OTHER", "HTTP"),
    };
    (known, known)
}

/// The JSON log line format with the active span's `trace_id` and
/// `span_id` (W3C hex) added at the top level, so a log line and its trace
/// join. Installed only when traces are exported; without an active span
/// the line is the plain JSON one.
#[derive(Debug)]
pub(crate) struct WithTraceIds<F>(pub(crate) F);

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    N: for<'writer> FormatFields<'writer> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        // Entering a span makes its OpenTelemetry context current.
        let context = opentelemetry::Context::current();
        let span = context.span();
        let ids = span.span_context();
        if !ids.is_valid() {
            return self.0.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.trim_end().strip_suffix('}') {
            Some(open) => writeln!(
                writer,
                "{open},\"trace_id\":\"{}\",\"span_id\":\"{}\"}}",
                ids.trace_id(),
                ids.span_id()
            ),
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::zeroed_batch_variables;

    #[test]
    fn a_batch_variable_read_as_zero_is_named_and_others_are_not() {
        let zeroed = zeroed_batch_variables(|name| match name {
            "OTEL_BSP_MAX_QUEUE_SIZE" => Some("0".to_owned()),
            "OTEL_BSP_SCHEDULE_DELAY" => Some("+0".to_owned()),
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" => Some("16".to_owned()),
            _ => Some("not a number".to_owned()),
        });
        assert_eq!(zeroed, ["OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_SCHEDULE_DELAY"]);
        assert!(zeroed_batch_variables(|_| None).is_empty());
    }
}
