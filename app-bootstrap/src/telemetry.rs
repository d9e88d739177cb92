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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};
use tracing::{Instrument, Subscriber};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::OtlpConfig;
use crate::config::validate::export_header_problems;
use crate::error::BootstrapError;

/// Counter of span batches the collector did not take (unreachable,
/// refused, timed out). Their spans are lost; requests are not affected.
pub const TRACE_EXPORT_FAILURES_TOTAL: &str =
    adapter_web::metric_name!("trace_export_failures_total");
/// Counter of finished spans dropped before export because the queue
/// (`OTEL_BSP_MAX_QUEUE_SIZE` spans) was full: the collector takes spans
/// slower than the traffic makes them.
pub const TRACE_SPANS_DROPPED_TOTAL: &str = adapter_web::metric_name!("trace_spans_dropped_total");

/// The path OTLP/HTTP takes traces at, below the configured endpoint.
const TRACES_PATH: &str = "/v1/traces";
/// At most one "export failed" (or "spans dropped") log line per this long.
const LOG_AT_MOST_EVERY: Duration = Duration::from_secs(60);
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
/// The queue's size when `OTEL_BSP_MAX_QUEUE_SIZE` is unset (the SDK's
/// default, which the processor is then given explicitly).
const DEFAULT_MAX_QUEUE_SIZE: usize = 2048;
/// The variables the OTLP exporter adds export headers from: the traces
/// one when it is set, else the general one (never both).
const HEADER_VARIABLES: [&str; 2] =
    ["OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"];
/// SDK variables this build obeys (docs/operations.md, "Traces"): those
/// set are named at start, never with their values (a header may hold a
/// key).
const OBEYED_VARIABLES: [&str; 14] = [
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_MAX_CONCURRENT_EXPORTS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
];
/// SDK variables this build does not obey, each with what decides
/// instead: the configuration sets the value, so the SDK never reads the
/// variable (or the feature is not built). One set is named in a warning
/// at start, so an operator does not wonder why it has no effect.
const OVERRIDDEN_VARIABLES: [(&str, &str); 17] = [
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "telemetry.otlp.endpoint"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "telemetry.otlp.endpoint"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "telemetry.otlp.timeout"),
    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "telemetry.otlp.timeout"),
    ("OTEL_BSP_EXPORT_TIMEOUT", "telemetry.otlp.timeout"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "always http/protobuf"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "always http/protobuf"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "no compression is built in"),
    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "no compression is built in"),
    ("OTEL_SERVICE_NAME", "telemetry.otlp.service-name"),
    ("OTEL_TRACES_SAMPLER", "telemetry.otlp.sample-ratio"),
    ("OTEL_TRACES_SAMPLER_ARG", "telemetry.otlp.sample-ratio"),
    ("OTEL_PROPAGATORS", "always tracecontext (W3C traceparent and tracestate)"),
    ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "no client certificate (mTLS) is built in"),
    ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "no client certificate (mTLS) is built in"),
    ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "no client certificate (mTLS) is built in"),
    ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "no client certificate (mTLS) is built in"),
];

/// What is wrong with the batch variables of [`NONZERO_BATCH_VARIABLES`]
/// that `lookup` sets, each naming its variable: a value the SDK cannot
/// read as a whole number (it would drop it without a word and use its
/// default), or one it reads as zero (`0`, `00`, `+0`).
fn batch_variable_problems(lookup: impl Fn(&str) -> Option<String>) -> Vec<String> {
    NONZERO_BATCH_VARIABLES
        .into_iter()
        .filter_map(|name| {
            let value = lookup(name)?;
            match value.parse::<u64>() {
                Ok(0) => Some(format!("{name} must be more than 0 (or unset)")),
                Ok(_) => None,
                Err(_) => Some(format!("{name} must be a whole number above 0, got {value:?}")),
            }
        })
        .collect()
}

/// The variable that switches trace export off although an endpoint is
/// configured, if any: `OTEL_SDK_DISABLED=true` (the SDK's kill switch) or
/// `OTEL_TRACES_EXPORTER=none`. A value that is neither of theirs stops
/// start-up naming the variable, like a bad batch variable: a kill switch
/// misread either way is a surprise.
fn export_switched_off(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<&'static str>, String> {
    let disabled = lookup("OTEL_SDK_DISABLED").unwrap_or_default();
    let disabled = match disabled.trim().to_ascii_lowercase().as_str() {
        "true" => true,
        "false" | "" => false,
        _ => return Err(format!("OTEL_SDK_DISABLED must be true or false, got {disabled:?}")),
    };
    let exporter = lookup("OTEL_TRACES_EXPORTER").unwrap_or_default();
    let exporter = match exporter.trim().to_ascii_lowercase().as_str() {
        "none" => true,
        "otlp" | "" => false,
        _ => {
            return Err(format!(
                "OTEL_TRACES_EXPORTER must be otlp or none (no other exporter is built), \
                 got {exporter:?}"
            ));
        }
    };
    Ok(match (disabled, exporter) {
        (true, _) => Some("OTEL_SDK_DISABLED"),
        (false, true) => Some("OTEL_TRACES_EXPORTER"),
        (false, false) => None,
    })
}

/// The variable that switched trace export off (see
/// [`export_switched_off`]), for the start-up warning; `None` when export
/// is on or the variables are refused (start-up then stops anyway).
pub fn export_switched_off_by() -> Option<&'static str> {
    export_switched_off(|name| std::env::var(name).ok()).ok().flatten()
}

/// The queue size the SDK would read from `OTEL_BSP_MAX_QUEUE_SIZE` (an
/// unreadable value is ignored, as the SDK ignores it).
fn max_queue_size(lookup: impl Fn(&str) -> Option<String>) -> usize {
    lookup("OTEL_BSP_MAX_QUEUE_SIZE")
        .and_then(|value| value.parse::<usize>().ok())
        .filter(|size| *size > 0)
        .unwrap_or(DEFAULT_MAX_QUEUE_SIZE)
}

/// What is wrong with the export headers the SDK would add from
/// [`HEADER_VARIABLES`], checked by the rules of `telemetry.otlp.headers`,
/// each problem naming the variable: an entry that is not `name=value`
/// (the SDK would skip it without a word), a bad name or value, two names
/// that differ only in case, a name `configured` already has (which one
/// wins would not be obvious). A value is never quoted.
fn header_variable_problems(
    lookup: impl Fn(&str) -> Option<String>,
    configured: &[&str],
) -> Vec<String> {
    // The SDK reads the first variable that is set, even when it is empty.
    let Some((variable, text)) =
        HEADER_VARIABLES.into_iter().find_map(|name| Some((name, lookup(name)?)))
    else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    let mut seen: Vec<String> = configured.iter().map(|name| name.to_ascii_lowercase()).collect();
    // The SDK's reading: comma-separated `name=value`, each trimmed, the
    // value percent-decoded.
    for (at, entry) in text.split_terminator(',').map(str::trim).enumerate() {
        let entry_number = at + 1;
        let Some((name, value)) =
            entry.split_once('=').map(|(name, value)| (name.trim(), value.trim()))
        else {
            problems.push(format!("{variable}: entry {entry_number} is not name=value"));
            continue;
        };
        if name.is_empty() || value.is_empty() {
            problems.push(format!("{variable}: entry {entry_number} has an empty name or value"));
            continue;
        }
        let value = percent_decoded(value).unwrap_or_else(|| value.as_bytes().to_vec());
        let value = String::from_utf8_lossy(&value);
        for problem in export_header_problems(name, &value) {
            problems.push(format!("{variable}: header {name:?} {problem}"));
        }
        let lower = name.to_ascii_lowercase();
        if seen.contains(&lower) {
            problems.push(format!(
                "{variable}: header {name:?} is already set (by telemetry.otlp.headers or earlier \
                 in the variable; header names ignore case)"
            ));
        } else {
            seen.push(lower);
        }
    }
    problems
}

/// `value` with each `%XX` decoded, as the SDK decodes a header value;
/// `None` when an escape is malformed (the SDK then keeps the raw value).
fn percent_decoded(value: &str) -> Option<Vec<u8>> {
    let mut bytes = value.bytes();
    let mut decoded = Vec::with_capacity(value.len());
    while let Some(byte) = bytes.next() {
        if byte == b'%' {
            let digits = [bytes.next()?, bytes.next()?];
            let digits = std::str::from_utf8(&digits).ok()?;
            decoded.push(u8::from_str_radix(digits, 16).ok()?);
        } else {
            decoded.push(byte);
        }
    }
    Some(decoded)
}

/// The SDK variables that are set but not obeyed, each with what decides
/// instead.
fn overridden_variables(
    lookup: impl Fn(&str) -> Option<String>,
) -> Vec<(&'static str, &'static str)> {
    OVERRIDDEN_VARIABLES.into_iter().filter(|(name, _)| lookup(name).is_some()).collect()
}

/// The variables naming a PEM file of CA certificates that replaces every
/// other root for the collector (the OTLP exporter's standard ones): the
/// traces one when it is set, else the general one.
const CERTIFICATE_VARIABLES: [&str; 2] =
    ["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"];
/// The variables (read as OpenSSL reads them) that replace the OS store
/// for the whole process: the file and the directories, together.
const SSL_CERT_VARIABLES: [&str; 2] = ["SSL_CERT_FILE", "SSL_CERT_DIR"];

/// The roots an `https` collector is checked against. `ca_file`
/// (`telemetry.otlp.ca-file`) or else a certificate variable
/// ([`CERTIFICATE_VARIABLES`]) pins its file's CAs alone (both set is an
/// error: which one wins would be a guess);
/// otherwise the OS store as rustls-native-certs reads it, which
/// `SSL_CERT_FILE` / `SSL_CERT_DIR` replace (both are read when both are
/// set). A named file or directory that cannot be read, a named file with
/// no certificate, or no root at all is an error in the user's terms,
/// naming the variable.
fn trusted_roots(
    ca_file: Option<&str>,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<rustls::RootCertStore, String> {
    // An empty variable is an unset one (the OpenTelemetry convention).
    let lookup = |name: &str| lookup(name).filter(|value| !value.is_empty());
    let variable = CERTIFICATE_VARIABLES.into_iter().find_map(|name| Some((name, lookup(name)?)));
    match (ca_file, variable) {
        (Some(_), Some((variable, _))) => {
            return Err(format!(
                "telemetry.otlp.ca-file and {variable} both name the collector's CA file; keep one"
            ));
        }
        (Some(path), None) => {
            return pem_roots(path)
                .map_err(|problem| format!("telemetry.otlp.ca-file ({path}) {problem}"));
        }
        (None, Some((variable, path))) => {
            return pem_roots(&path).map_err(|problem| format!("{variable} ({path}) {problem}"));
        }
        (None, None) => {}
    }
    let named: Vec<&str> =
        SSL_CERT_VARIABLES.into_iter().filter(|name| lookup(name).is_some()).collect();
    if let Some(path) = lookup("SSL_CERT_FILE") {
        // Read alone first: the directories would hide a file with no
        // certificate in it (a typo, /dev/null).
        pem_roots(&path).map_err(|problem| format!("SSL_CERT_FILE ({path}) {problem}"))?;
    }
    let found = rustls_native_certs::load_native_certs();
    if !named.is_empty() && !found.errors.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(format!("{}: {}", named.join(" / "), errors.join("; ")));
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let place = if named.is_empty() {
            "the OS certificate store".to_owned()
        } else {
            named.join(" / ")
        };
        return Err(format!("no root certificate found in {place}"));
    }
    Ok(roots)
}

/// The CA certificates of the PEM file at `path`, or what is wrong with
/// it (said after the file's name).
pub(crate) fn pem_roots(path: &str) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let pem = std::fs::read(path).map_err(|error| format!("cannot be read: {error}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for (at, certificate) in CertificateDer::pem_slice_iter(&pem).enumerate() {
        let number = at + 1;
        let certificate = certificate
            .map_err(|error| format!("has a broken PEM certificate (number {number}): {error}"))?;
        roots.add(certificate).map_err(|error| {
            format!("has a certificate (number {number}) that is no usable CA: {error}")
        })?;
    }
    if roots.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned());
    }
    Ok(roots)
}

/// The exporter's HTTP client: hyper, with rustls for an `https` endpoint
/// (ring for the crypto, no OpenSSL) trusting [`trusted_roots`]; plain TCP
/// for `http`.
fn http_client(
    endpoint: &axum::http::Uri,
    otlp: &OtlpConfig,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<HyperClient<HttpsConnector<HttpConnector>>, BootstrapError> {
    let provider = rustls::crypto::ring::default_provider();
    // An http endpoint never starts TLS: no root is ever consulted.
    let roots = if endpoint.scheme() == Some(&axum::http::uri::Scheme::HTTPS) {
        trusted_roots(otlp.ca_file.as_deref(), lookup).map_err(|reason| BootstrapError::Wiring {
            component: "the OTLP exporter's TLS roots",
            reason,
        })?
    } else {
        rustls::RootCertStore::empty()
    };
    let config = rustls::ClientConfig::builder_with_provider(provider.into())
        .with_safe_default_protocol_versions()
        .map_err(|error| BootstrapError::Wiring {
            component: "the OTLP exporter's HTTP client",
            reason: error.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let builder = HttpsConnectorBuilder::new().with_tls_config(config);
    Ok(HyperClient::new(builder.https_or_http().enable_http1().build(), otlp.timeout, None))
}

/// The running trace pipeline; [`Tracing::shutdown`] flushes it.
#[derive(Debug, Clone)]
pub struct Tracing {
    provider: SdkTracerProvider,
    queue: Arc<Queue>,
}

impl Tracing {
    /// Starts the pipeline `otlp` describes; `None` when it sets no
    /// endpoint. Call it inside the tokio runtime: the batch processor
    /// runs on it.
    pub fn start(otlp: &OtlpConfig) -> Result<Option<Self>, BootstrapError> {
        let Some(endpoint) = &otlp.endpoint else { return Ok(None) };
        let lookup = |name: &str| std::env::var(name).ok();
        let switched_off = export_switched_off(lookup).map_err(|reason| {
            BootstrapError::Wiring { component: "the OTLP span exporter", reason }
        })?;
        if switched_off.is_some() {
            // Named in a warning once logging is installed
            // ([`export_switched_off_by`]).
            return Ok(None);
        }
        let batch_problems = batch_variable_problems(lookup);
        if !batch_problems.is_empty() {
            return Err(BootstrapError::Wiring {
                component: "the OTLP batch span processor",
                reason: batch_problems.join("; "),
            });
        }
        let configured: Vec<&str> = otlp.headers.keys().map(String::as_str).collect();
        let problems = header_variable_problems(lookup, &configured);
        if !problems.is_empty() {
            return Err(BootstrapError::Wiring {
                component: "the OTLP export headers",
                reason: problems.join("; "),
            });
        }
        let url = format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/'));
        let uri = url.parse::<axum::http::Uri>().map_err(|_| BootstrapError::Wiring {
            component: "the OTLP span exporter",
            reason: "telemetry.otlp.endpoint is not a URL".to_owned(),
        })?;
        let headers: HashMap<String, String> = otlp
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), value.expose().to_owned()))
            .collect();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(http_client(&uri, otlp, lookup)?)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(otlp.timeout)
            .with_headers(headers)
            .build()
            .map_err(|error| BootstrapError::Wiring {
                component: "the OTLP span exporter",
                reason: error.to_string(),
            })?;
        let queue = Arc::new(Queue::new(max_queue_size(lookup)));
        // The processor's own export deadline sits past the client's, so a
        // slow collector fails in the client and is counted.
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(queue.capacity)
            .with_max_export_timeout(otlp.timeout + Duration::from_secs(1))
            .build();
        let exporter = Counted::new(exporter, Arc::clone(&queue));
        let processor =
            BatchSpanProcessor::builder(exporter, Tokio).with_batch_config(batch).build();
        let processor = Bounded { inner: processor, queue: Arc::clone(&queue) };
        // The ratio is applied at the edge, before any span is made
        // ([`Sampling`]); what reaches the SDK is kept, except under a
        // caller's span that is not sampled.
        let sampler = Sampler::ParentBased(Box::new(Sampler::AlwaysOn));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            .with_resource(Resource::builder().with_service_name(otlp.service_name.clone()).build())
            .build();
        Ok(Some(Self { provider, queue }))
    }

    /// Logs the SDK variables that are set: those obeyed by name (never a
    /// value), each of those not obeyed with what decides instead. Call it
    /// once logging is installed (after [`Tracing::start`], whose layer it
    /// needs).
    pub fn log_variables(&self) {
        let lookup = |name: &str| std::env::var_os(name).map(|_| String::new());
        let obeyed: Vec<&str> =
            OBEYED_VARIABLES.into_iter().filter(|name| lookup(name).is_some()).collect();
        if !obeyed.is_empty() {
            tracing::info!(variables = ?obeyed, "OpenTelemetry variables in effect");
        }
        for (variable, instead) in overridden_variables(lookup) {
            tracing::warn!(variable, instead, "an OpenTelemetry variable is set but not obeyed");
        }
    }

    /// Registers the pipeline's counters at 0, so `/metrics` shows them
    /// before the first failure or drop. Call it once the metrics recorder
    /// is installed.
    pub(crate) fn register_metrics(&self) {
        metrics::counter!(TRACE_EXPORT_FAILURES_TOTAL).increment(0);
        metrics::counter!(TRACE_SPANS_DROPPED_TOTAL).increment(0);
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
        let (provider, queue) = (self.provider, self.queue);
        let flush =
            tokio::task::spawn_blocking(move || drain_then_shut_down(&provider, &queue, budget));
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

/// How long to wait before looking again whether a full queue has room
/// for the flush.
const FULL_QUEUE_RETRY: Duration = Duration::from_millis(20);

/// Flushes, then shuts `provider` down, within `budget`. The SDK's batch
/// processor takes its flush and shutdown messages on the span queue
/// itself, with `try_send`: on a full queue (a slow collector) a plain
/// shutdown fails at once and drops every pending span. So the flush is
/// asked only once [`Queue`] (which counts what the SDK's queue holds) has
/// room, which the processor makes at the collector's pace, or the budget
/// is spent. Blocking.
fn drain_then_shut_down(
    provider: &SdkTracerProvider,
    queue: &Queue,
    budget: Duration,
) -> OTelSdkResult {
    let deadline = Instant::now() + budget;
    loop {
        // A failure with room in the queue is not "full" (the pipeline is
        // closed, or an export failed and was counted): the shutdown says.
        if !queue.is_full() && (provider.force_flush().is_ok() || !queue.is_full()) {
            break;
        }
        if Instant::now() + FULL_QUEUE_RETRY >= deadline {
            break;
        }
        std::thread::sleep(FULL_QUEUE_RETRY);
    }
    provider.shutdown_with_timeout(deadline.saturating_duration_since(Instant::now()))
}

/// A warning that is logged at most once per [`LOG_AT_MOST_EVERY`] (a
/// collector that is down fails every few seconds).
#[derive(Debug, Default)]
struct Throttled(Mutex<Option<Instant>>);

impl Throttled {
    /// Whether a line may be logged now (and then not for a while).
    fn due(&self) -> bool {
        let now = Instant::now();
        let mut last = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let due = last.is_none_or(|at| now.duration_since(at) >= LOG_AT_MOST_EVERY);
        if due {
            *last = Some(now);
        }
        due
    }
}

/// The spans finished and not yet handed to the exporter, against the
/// capacity of the SDK's queue. The SDK drops a span that does not fit
/// without a count anyone can read (its own is private and logged only at
/// shutdown), so [`Bounded`] drops it first, here, counted and logged.
#[derive(Debug)]
struct Queue {
    queued: AtomicUsize,
    capacity: usize,
    drop_logged: Throttled,
}

impl Queue {
    fn new(capacity: usize) -> Self {
        Self { queued: AtomicUsize::new(0), capacity, drop_logged: Throttled::default() }
    }

    /// Takes a place for one span; `false` when the queue is full.
    fn admit(&self) -> bool {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued < self.capacity).then_some(queued + 1)
            })
            .is_ok()
    }

    /// `spans` left the queue for the exporter.
    fn release(&self, spans: usize) {
        let _ = self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
            Some(queued.saturating_sub(spans))
        });
    }

    fn is_full(&self) -> bool {
        self.queued.load(Ordering::Acquire) >= self.capacity
    }

    fn dropped(&self) {
        metrics::counter!(TRACE_SPANS_DROPPED_TOTAL).increment(1);
        if self.drop_logged.due() {
            tracing::warn!(
                capacity = self.capacity,
                "the span queue is full; finished spans are dropped (counted in \
                 {TRACE_SPANS_DROPPED_TOTAL}, logged at most once a minute)"
            );
        }
    }
}

/// The SDK's batch processor behind [`Queue`]: a sampled span that would
/// not fit is dropped here, counted; the rest go on to the SDK, whose
/// queue (of the same capacity) then always has room for them.
#[derive(Debug)]
struct Bounded<P> {
    inner: P,
    queue: Arc<Queue>,
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        // The SDK ignores an unsampled span; only a sampled one is queued.
        if !span.span_context.is_sampled() || self.queue.admit() {
            self.inner.on_end(span);
        } else {
            self.queue.dropped();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, with each failed export counted and logged at most
/// once a minute, and each batch taken off [`Queue`]'s count.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queue: Arc<Queue>,
    failure_logged: Throttled,
}

impl<E> Counted<E> {
    fn new(inner: E, queue: Arc<Queue>) -> Self {
        Self { inner, queue, failure_logged: Throttled::default() }
    }

    fn failed(&self, spans: usize, error: &dyn fmt::Display) {
        metrics::counter!(TRACE_EXPORT_FAILURES_TOTAL).increment(1);
        if self.failure_logged.due() {
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
        // Out of the queue from now, whatever the export does.
        self.queue.release(spans);
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
/// script span under it). A caller's `traceparent` decides by its sampled
/// flag, and the span joins its trace (its `tracestate` with it), only
/// when `telemetry.otlp.trust-remote-parent` is on; otherwise the ratio
/// decides and a traced request starts a trace of its own, linked to the
/// caller's span by its ids alone: at a public edge any client writes
/// those headers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sampling {
    ratio: f64,
    trust_remote_parent: bool,
}

/// The longest trusted `tracestate` exported (W3C Trace Context asks
/// that at least 512 characters be passed on); a longer one is dropped
/// whole.
const MAX_TRACESTATE_BYTES: usize = 512;

/// How a traced request's span relates to the caller's trace.
enum Traced {
    /// A child of the caller's span (a trusted caller, or none: an empty
    /// context makes a root).
    Child(opentelemetry::Context),
    /// A root span with a link to the untrusted caller's span: its trace
    /// and span ids, sampled flag and `tracestate` left out.
    LinkedRoot(opentelemetry::trace::SpanContext),
}

impl Sampling {
    pub(crate) fn new(otlp: &OtlpConfig) -> Self {
        Self { ratio: otlp.sample_ratio, trust_remote_parent: otlp.trust_remote_parent }
    }

    /// How the request is traced, `None` when it is not.
    fn traced(self, headers: &axum::http::HeaderMap) -> Option<Traced> {
        let caller = headers
            .contains_key("traceparent")
            .then(|| TraceContextPropagator::new().extract(&CallerHeaders::new(headers)))
            .filter(|parent| parent.span().span_context().is_valid());
        match caller {
            Some(parent) if self.trust_remote_parent => {
                let ids = parent.span().span_context().clone();
                if !ids.is_sampled() {
                    return None;
                }
                if ids.trace_state().header().len() <= MAX_TRACESTATE_BYTES {
                    return Some(Traced::Child(parent));
                }
                // Joined without the state: a trusted hop can still relay a
                // client's oversized list, and every span would carry it.
                let bare = opentelemetry::trace::SpanContext::new(
                    ids.trace_id(),
                    ids.span_id(),
                    ids.trace_flags(),
                    true,
                    opentelemetry::trace::TraceState::NONE,
                );
                Some(Traced::Child(opentelemetry::Context::new().with_remote_span_context(bare)))
            }
            Some(parent) => self.keeps_new_trace().then(|| {
                let ids = parent.span().span_context().clone();
                Traced::LinkedRoot(opentelemetry::trace::SpanContext::new(
                    ids.trace_id(),
                    ids.span_id(),
                    opentelemetry::trace::TraceFlags::default(),
                    true,
                    opentelemetry::trace::TraceState::NONE,
                ))
            }),
            None => self.keeps_new_trace().then(|| Traced::Child(opentelemetry::Context::new())),
        }
    }

    /// Whether a trace that no trusted caller started is kept (the ratio's
    /// draw).
    pub(crate) fn keeps_new_trace(self) -> bool {
        self.ratio >= 1.0 || (self.ratio > 0.0 && rand::random::<f64>() < self.ratio)
    }

    /// The span `make` builds, joined to (or, untrusted, linked to) the
    /// caller's trace that `headers` name; `None`, and no span made at
    /// all, when the call is not traced.
    pub(crate) fn span_for(
        self,
        headers: &axum::http::HeaderMap,
        make: impl FnOnce() -> tracing::Span,
    ) -> Option<tracing::Span> {
        let traced = self.traced(headers)?;
        let span = make();
        match traced {
            Traced::Child(parent) => {
                if parent.span().span_context().is_valid() {
                    // Fails only when no OpenTelemetry layer is installed (a
                    // test's in-process server): the span then has no trace
                    // to join anyway.
                    let _ = span.set_parent(parent);
                }
            }
            Traced::LinkedRoot(caller) => span.add_link(caller),
        }
        Some(span)
    }
}

/// The Envoy front end's calls: the adapter makes the span, this decides
/// whether there is one and joins it to the caller's trace (from the
/// call's gRPC metadata, which are HTTP/2 headers).
impl adapter_envoy_rls::CallTracing for Sampling {
    fn call_span(
        &self,
        headers: &axum::http::HeaderMap,
        make: &dyn Fn() -> tracing::Span,
    ) -> Option<tracing::Span> {
        self.span_for(headers, make)
    }
}

/// A request's headers as the W3C propagator reads them, with its
/// `tracestate` lines combined into one list in their order (W3C Trace
/// Context: several `tracestate` headers are one list, as HTTP combines
/// any list header); the SDK's extractor reads only the first line.
struct CallerHeaders<'a> {
    headers: HeaderExtractor<'a>,
    tracestate: Option<String>,
}

impl<'a> CallerHeaders<'a> {
    fn new(headers: &'a axum::http::HeaderMap) -> Self {
        let headers = HeaderExtractor(headers);
        let tracestate =
            headers.get_all("tracestate").filter(|lines| lines.len() > 1).map(|lines| {
                let lines: Vec<&str> =
                    lines.into_iter().map(str::trim).filter(|line| !line.is_empty()).collect();
                lines.join(",")
            });
        Self { headers, tracestate }
    }
}

impl Extractor for CallerHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match &self.tracestate {
            Some(combined) if key.eq_ignore_ascii_case("tracestate") => Some(combined),
            _ => self.headers.get(key),
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.headers.keys()
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
    // Built only for a traced request: an untraced one costs no string.
    let make = || {
        let (method, in_name) = span_method(request.method());
        let route = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
        let name = match route {
            Some(route) => format!("{in_name} {route}"),
            None => in_name.to_owned(),
        };
        let route = route.unwrap_or_default();
        match listener {
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
        }
    };
    let Some(span) = sampling.span_for(request.headers(), make) else {
        return next.run(request).await;
    };
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
    use opentelemetry::propagation::{Extractor, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;

    use super::{
        CallerHeaders, Queue, Sampling, Traced, batch_variable_problems, export_switched_off,
        header_variable_problems, max_queue_size, percent_decoded, trusted_roots,
    };
    use crate::config::OtlpConfig;

    fn sampling(sample_ratio: f64, trust_remote_parent: bool) -> Sampling {
        Sampling::new(&OtlpConfig { sample_ratio, trust_remote_parent, ..OtlpConfig::default() })
    }

    fn caller(flags: &str, tracestate: &str) -> axum::http::HeaderMap {
        let mut headers = axum::http::HeaderMap::new();
        let parent = format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}");
        headers.insert("traceparent", parent.parse().unwrap());
        headers.insert("tracestate", tracestate.parse().unwrap());
        headers
    }

    #[test]
    fn an_untrusted_caller_forces_nothing_and_is_linked_without_its_state() {
        let sampled = caller("01", "vendor=opaque");
        assert!(sampling(0.0, false).traced(&sampled).is_none());
        let Some(Traced::LinkedRoot(link)) = sampling(1.0, false).traced(&sampled) else {
            panic!("a root span linked to the caller");
        };
        assert_eq!(link.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(link.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(link.trace_state().header(), "");
        // Unsampled by the caller: the ratio still decides.
        assert!(matches!(
            sampling(1.0, false).traced(&caller("00", "a=1")),
            Some(Traced::LinkedRoot(_))
        ));
    }

    #[test]
    fn a_trusted_caller_decides_and_an_oversized_state_is_dropped() {
        assert!(sampling(1.0, true).traced(&caller("00", "a=1")).is_none());
        let joined = |tracestate: &str| match sampling(0.0, true).traced(&caller("01", tracestate))
        {
            Some(Traced::Child(parent)) => {
                parent.span().span_context().trace_state().header().clone()
            }
            _ => panic!("a child of the trusted caller's span"),
        };
        assert_eq!(joined("vendor=opaque"), "vendor=opaque");
        // Two members the SDK takes (a value is at most 256 bytes): 512
        // bytes in all are kept, 513 dropped.
        let at_bound = format!("a={},b={}", "x".repeat(254), "y".repeat(253));
        assert_eq!(at_bound.len(), 512);
        assert_eq!(joined(&at_bound), at_bound);
        assert_eq!(joined(&format!("a={},b={}", "x".repeat(254), "y".repeat(254))), "");
    }

    fn only(name: &'static str, value: &'static str) -> impl Fn(&str) -> Option<String> {
        move |asked: &str| (asked == name).then(|| value.to_owned())
    }

    #[test]
    fn the_header_variable_is_held_to_the_rules_of_the_configured_headers() {
        const GENERAL: &str = "OTEL_EXPORTER_OTLP_HEADERS";
        let good = only(GENERAL, " x-team = blue , api-key=a%20b%3Dc ");
        assert!(header_variable_problems(good, &[]).is_empty());
        let bad = only(GENERAL, "novalue,=v,Host=h,x-a=1,X-A=2,x-b=%0A,x-c=caf\u{e9}");
        let problems = header_variable_problems(bad, &[]);
        assert_eq!(problems.len(), 6, "{problems:#?}");
        assert!(problems.iter().all(|problem| problem.starts_with(GENERAL)), "{problems:#?}");
        for named in ["entry 1 ", "entry 2 ", "\"Host\"", "\"X-A\"", "\"x-b\"", "\"x-c\""] {
            assert!(
                problems.iter().any(|problem| problem.contains(named)),
                "{named}: {problems:#?}"
            );
        }
        // A name the configuration has: which one wins would be a guess.
        let twin = header_variable_problems(only(GENERAL, "X-Key=1"), &["x-key"]);
        assert_eq!(twin.len(), 1, "{twin:#?}");
    }

    #[test]
    fn the_traces_header_variable_wins_as_in_the_sdk_even_when_empty() {
        let lookup = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS" => Some(String::new()),
            "OTEL_EXPORTER_OTLP_HEADERS" => Some("host=h".to_owned()),
            _ => None,
        };
        assert!(header_variable_problems(lookup, &[]).is_empty());
        let traces = only("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "te=x");
        let problems = header_variable_problems(traces, &[]);
        assert!(problems[0].starts_with("OTEL_EXPORTER_OTLP_TRACES_HEADERS"), "{problems:#?}");
    }

    #[test]
    fn percent_escapes_decode_like_the_sdk() {
        assert_eq!(percent_decoded("a%20b%2c").as_deref(), Some(&b"a b,"[..]));
        assert_eq!(percent_decoded("100%"), None);
        assert_eq!(percent_decoded("%zz"), None);
    }

    #[test]
    fn several_tracestate_lines_are_one_list_in_order() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap(),
        );
        headers.append("tracestate", "a=1".parse().unwrap());
        headers.append("tracestate", " ".parse().unwrap());
        headers.append("tracestate", "b=2,c=3".parse().unwrap());
        let caller = CallerHeaders::new(&headers);
        assert_eq!(caller.get("TraceState"), Some("a=1,b=2,c=3"));
        let context = TraceContextPropagator::new().extract(&caller);
        assert_eq!(context.span().span_context().trace_state().header(), "a=1,b=2,c=3");
        // One line is read as it is.
        headers.remove("tracestate");
        headers.insert("tracestate", "a=1".parse().unwrap());
        assert_eq!(CallerHeaders::new(&headers).get("tracestate"), Some("a=1"));
    }

    #[test]
    fn the_queue_admits_up_to_its_capacity_and_frees_what_is_exported() {
        let queue = Queue::new(2);
        assert!(queue.admit() && queue.admit());
        assert!(queue.is_full() && !queue.admit());
        queue.release(1);
        assert!(!queue.is_full() && queue.admit());
        queue.release(5);
        assert!(!queue.is_full());
        assert_eq!(max_queue_size(|_| None), 2048);
        assert_eq!(max_queue_size(only("OTEL_BSP_MAX_QUEUE_SIZE", "16")), 16);
        assert_eq!(max_queue_size(only("OTEL_BSP_MAX_QUEUE_SIZE", "many")), 2048);
    }

    #[test]
    fn a_batch_variable_read_as_zero_or_unreadable_is_named_and_others_are_not() {
        let problems = batch_variable_problems(|name| match name {
            "OTEL_BSP_MAX_QUEUE_SIZE" => Some("0".to_owned()),
            "OTEL_BSP_SCHEDULE_DELAY" => Some("+0".to_owned()),
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" => Some("16".to_owned()),
            _ => Some("-5".to_owned()),
        });
        assert_eq!(
            problems,
            [
                "OTEL_BSP_MAX_QUEUE_SIZE must be more than 0 (or unset)",
                "OTEL_BSP_MAX_CONCURRENT_EXPORTS must be a whole number above 0, got \"-5\"",
                "OTEL_BSP_SCHEDULE_DELAY must be more than 0 (or unset)",
            ]
        );
        assert!(batch_variable_problems(|_| None).is_empty());
    }

    #[test]
    fn the_kill_switches_turn_export_off_and_other_values_are_refused() {
        let both = |disabled: &'static str, exporter: &'static str| {
            move |name: &str| match name {
                "OTEL_SDK_DISABLED" => Some(disabled.to_owned()),
                "OTEL_TRACES_EXPORTER" => Some(exporter.to_owned()),
                _ => None,
            }
        };
        assert_eq!(export_switched_off(|_| None), Ok(None));
        assert_eq!(export_switched_off(both("false", "otlp")), Ok(None));
        assert_eq!(export_switched_off(both("", "")), Ok(None));
        assert_eq!(export_switched_off(both("TRUE", "otlp")), Ok(Some("OTEL_SDK_DISABLED")));
        assert_eq!(export_switched_off(both("true", "none")), Ok(Some("OTEL_SDK_DISABLED")));
        assert_eq!(export_switched_off(both("false", " none")), Ok(Some("OTEL_TRACES_EXPORTER")));
        let refused = export_switched_off(both("yes", "otlp")).unwrap_err();
        assert!(refused.starts_with("OTEL_SDK_DISABLED "), "{refused}");
        let refused = export_switched_off(both("false", "zipkin")).unwrap_err();
        assert!(refused.starts_with("OTEL_TRACES_EXPORTER "), "{refused}");
    }

    #[test]
    fn the_ca_file_key_and_a_certificate_variable_together_are_refused_naming_both() {
        let lookup = only("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/collector-ca.pem");
        let refused = trusted_roots(Some("/etc/other-ca.pem"), lookup).unwrap_err();
        assert!(refused.contains("telemetry.otlp.ca-file"), "{refused}");
        assert!(refused.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{refused}");
        // An empty variable is an unset one: the key alone decides.
        let empty = only("OTEL_EXPORTER_OTLP_CERTIFICATE", "");
        let missing = trusted_roots(Some("/nonexistent/ca.pem"), empty).unwrap_err();
        assert!(
            missing.starts_with("telemetry.otlp.ca-file (/nonexistent/ca.pem) cannot be read"),
            "{missing}"
        );
    }
}
