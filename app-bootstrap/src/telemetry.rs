//! Traces over OTLP/HTTP (`telemetry.otlp`), from the SDK's builders: its
//! batch span processor (a thread of its own and a bounded queue: a slow
//! collector costs bounded memory and never blocks a request) feeding the
//! OTLP exporter, behind `tracing-opentelemetry`. The SDK reads its own
//! variables; a key wins over the variable for the same setting (export
//! headers from both are sent, the variable's on a name both set).

mod client;
mod log_line;
mod request;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter};
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::registry::LookupSpan;

pub(crate) use client::pem_roots;
pub(crate) use log_line::WithTraceIds;
pub(crate) use request::{Sampling, admin_span, public_span};

use crate::config::OtlpConfig;
use crate::error::BootstrapError;

/// Counter of span batches the collector did not take (unreachable,
/// refused, timed out). Their spans are lost; requests are not affected.
pub const TRACE_EXPORT_FAILURES_TOTAL: &str =
    adapter_web::metric_name!("trace_export_failures_total");

/// At most one "export failed" log line per this long.
const LOG_AT_MOST_EVERY: Duration = Duration::from_secs(60);
/// The variable that switches export off although an endpoint is set
/// (the SDK reads neither); any other value leaves it on, as the spec says.
fn switched_off(lookup: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    [("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "none")]
        .into_iter()
        .find(|(name, off)| lookup(name).is_some_and(|set| set.trim().eq_ignore_ascii_case(off)))
        .map(|(name, _)| name)
}

/// The variable that switched export off, for the start-up warning.
pub fn export_switched_off_by() -> Option<&'static str> {
    switched_off(|name| std::env::var(name).ok())
}

/// The OTLP exporter, each failed export counted and logged at most once
/// a minute (a collector that is down fails at every export).
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    last_logged: Mutex<Option<Instant>>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(error) = &result {
            metrics::counter!(TRACE_EXPORT_FAILURES_TOTAL).increment(1);
            let now = Instant::now();
            let mut last =
                self.last_logged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_none_or(|at| now.duration_since(at) >= LOG_AT_MOST_EVERY) {
                *last = Some(now);
                tracing::warn!(
                    %error, spans,
                    "trace export failed; spans are dropped (counted in \
                     {TRACE_EXPORT_FAILURES_TOTAL}, logged at most once a minute)"
                );
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The running trace pipeline; [`Tracing::shutdown`] flushes it.
#[derive(Debug, Clone)]
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Starts the pipeline `otlp` describes, inside the tokio runtime;
    /// `None` without an endpoint or when a variable switches export off.
    pub fn start(otlp: &OtlpConfig) -> Result<Option<Self>, BootstrapError> {
        let Some(endpoint) = &otlp.endpoint else { return Ok(None) };
        if export_switched_off_by().is_some() {
            return Ok(None);
        }
        let wiring = |(component, reason)| BootstrapError::Wiring { component, reason };
        let exporter_problem = |reason| wiring(("the OTLP span exporter", reason));
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        // The SDK's own error would print the URL (it may hold a credential).
        let uri = url
            .parse::<axum::http::Uri>()
            .map_err(|_| exporter_problem("telemetry.otlp.endpoint is not a URL".to_owned()))?;
        // The SDK's export thread waits this long between batches: 0 would
        // keep it spinning on a core for as long as the service runs.
        let delay = std::env::var("OTEL_BSP_SCHEDULE_DELAY");
        if delay.is_ok_and(|delay| delay.trim().parse::<u64>() == Ok(0)) {
            let reason = "OTEL_BSP_SCHEDULE_DELAY=0 would keep the export thread spinning; \
                          unset it or give the milliseconds between exports";
            return Err(exporter_problem(reason.to_owned()));
        }
        let headers =
            otlp.headers.iter().map(|(name, value)| (name.clone(), value.expose().to_owned()));
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client::for_collector(&uri, otlp).map_err(wiring)?)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(otlp.timeout)
            .with_headers(headers.collect())
            .build()
            .map_err(|error| exporter_problem(error.to_string()))?;
        // The ratio is applied before any span is made ([`Sampling`]).
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Counted { inner: exporter, last_logged: Mutex::default() })
            .with_sampler(Sampler::AlwaysOn)
            .with_resource(Resource::builder().with_service_name(otlp.service_name.clone()).build())
            .build();
        Ok(Some(Self { provider }))
    }

    /// Names the SDK's variables that are set, never their values (a
    /// header may hold a key).
    pub fn log_variables(&self) {
        let mut set: Vec<String> = std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .filter(|name| name.starts_with("OTEL_"))
            .collect();
        if !set.is_empty() {
            set.sort_unstable();
            tracing::info!(variables = ?set, "OpenTelemetry variables set");
        }
    }

    /// Shows the failure counter at 0 (once the recorder is installed).
    pub(crate) fn register_metrics(&self) {
        metrics::counter!(TRACE_EXPORT_FAILURES_TOTAL).increment(0);
    }

    /// The `tracing` layer making OpenTelemetry spans, without what costs
    /// on every span and says little here (threads, timings, locations).
    pub fn layer<S>(&self) -> OpenTelemetryLayer<S, SdkTracer>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("ca-skeleton"))
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_location(false)
            .with_target(false)
    }

    /// Exports the spans still queued (at the collector's pace: the
    /// processor takes the request on a channel of its own) and stops the
    /// pipeline within `budget`. The SDK blocks, so off the workers.
    pub async fn shutdown(self, budget: Duration) {
        let provider = self.provider;
        let flush = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(budget));
        match tokio::time::timeout(budget, flush).await {
            Ok(Ok(Ok(()))) => tracing::debug!("pending spans flushed"),
            result => tracing::warn!(?budget, ?result, "pending spans not all flushed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::switched_off;

    #[test]
    fn the_kill_switches_turn_export_off_and_other_values_leave_it_on() {
        let both = |disabled: &'static str, exporter: &'static str| {
            move |name: &str| match name {
                "OTEL_SDK_DISABLED" => Some(disabled.to_owned()),
                "OTEL_TRACES_EXPORTER" => Some(exporter.to_owned()),
                _ => None,
            }
        };
        assert_eq!(switched_off(|_| None), None);
        assert_eq!(switched_off(both("false", "otlp")), None);
        assert_eq!(switched_off(both("", "")), None);
        assert_eq!(switched_off(both("TRUE", "otlp")), Some("OTEL_SDK_DISABLED"));
        assert_eq!(switched_off(both("true", "none")), Some("OTEL_SDK_DISABLED"));
        assert_eq!(switched_off(both("false", " none")), Some("OTEL_TRACES_EXPORTER"));
        // Not `true`: false, as the spec reads a boolean variable.
        assert_eq!(switched_off(both("yes", "zipkin")), None);
    }
}
