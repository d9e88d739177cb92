//! The request span: whether a call is traced, and how it joins the
//! caller's W3C trace context.

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags, TraceState};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::OtlpConfig;

/// The longest trusted `tracestate` exported (the W3C minimum to pass on).
const MAX_TRACESTATE_BYTES: usize = 512;

/// Head sampling per call, before any span exists (an unsampled call
/// makes none). A caller's `traceparent` decides, and is joined, only with
/// `trust-remote-parent`; otherwise `sample-ratio` decides and the span is
/// a root linked to the caller's two ids (any client writes those headers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sampling {
    ratio: f64,
    trust_remote_parent: bool,
}

/// A traced call's span: a child of the context (a trusted caller's span,
/// or none), or a root linked to an untrusted caller's span.
enum Traced {
    Child(Context),
    LinkedRoot(SpanContext),
}

impl Sampling {
    pub(crate) fn new(otlp: &OtlpConfig) -> Self {
        Self { ratio: otlp.sample_ratio, trust_remote_parent: otlp.trust_remote_parent }
    }

    /// How the call is traced, `None` when it is not.
    fn traced(self, headers: &HeaderMap) -> Option<Traced> {
        let caller = headers
            .contains_key("traceparent")
            .then(|| TraceContextPropagator::new().extract(&CallerHeaders::new(headers)))
            .map(|parent| parent.span().span_context().clone())
            .filter(SpanContext::is_valid);
        let Some(ids) = caller else {
            return self.keeps_new_trace().then(|| Traced::Child(Context::new()));
        };
        let bare =
            |flags| SpanContext::new(ids.trace_id(), ids.span_id(), flags, true, TraceState::NONE);
        if !self.trust_remote_parent {
            return self.keeps_new_trace().then(|| Traced::LinkedRoot(bare(TraceFlags::default())));
        }
        if !ids.is_sampled() {
            return None;
        }
        // A trusted hop may relay a client's oversized list: not kept.
        let parent = if ids.trace_state().header().len() <= MAX_TRACESTATE_BYTES {
            ids.clone()
        } else {
            bare(ids.trace_flags())
        };
        Some(Traced::Child(Context::new().with_remote_span_context(parent)))
    }

    /// Whether a trace that no trusted caller started is kept.
    pub(crate) fn keeps_new_trace(self) -> bool {
        self.ratio >= 1.0 || (self.ratio > 0.0 && rand::random::<f64>() < self.ratio)
    }

    /// The span `make` builds, joined or linked to the caller's trace;
    /// `None`, and no span made, when not traced.
    pub(crate) fn span_for(
        self,
        headers: &HeaderMap,
        make: impl FnOnce() -> tracing::Span,
    ) -> Option<tracing::Span> {
        let traced = self.traced(headers)?;
        let span = make();
        match traced {
            // Fails only without an OpenTelemetry layer (a test server).
            Traced::Child(parent) if parent.has_active_span() => {
                let _ = span.set_parent(parent);
            }
            Traced::Child(_) => {}
            Traced::LinkedRoot(caller) => span.add_link(caller),
        }
        Some(span)
    }
}

/// The Envoy front end's calls (gRPC metadata are HTTP/2 headers).
impl adapter_envoy_rls::CallTracing for Sampling {
    fn call_span(
        &self,
        headers: &HeaderMap,
        make: &dyn Fn() -> tracing::Span,
    ) -> Option<tracing::Span> {
        self.span_for(headers, make)
    }
}

/// A request's headers with its `tracestate` lines as one list, in order
/// (W3C); the SDK's extractor reads only the first line.
struct CallerHeaders<'a> {
    headers: HeaderExtractor<'a>,
    tracestate: Option<String>,
}

impl<'a> CallerHeaders<'a> {
    fn new(headers: &'a HeaderMap) -> Self {
        let lines = headers.get_all("tracestate").iter().filter_map(|line| line.to_str().ok());
        let lines: Vec<&str> = lines.map(str::trim).filter(|line| !line.is_empty()).collect();
        let tracestate = (lines.len() > 1).then(|| lines.join(","));
        Self { headers: HeaderExtractor(headers), tracestate }
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

/// Middleware: one server span per sampled request, named `"<METHOD>
/// <route template>"` as the HTTP conventions say, never the raw path.
pub(crate) async fn public_span(
    State(sampling): State<Sampling>,
    request: Request,
    next: Next,
) -> Response {
    request_span(false, sampling, request, next).await
}

/// [`public_span`] for the admin listener (`admin.request` spans).
pub(crate) async fn admin_span(
    State(sampling): State<Sampling>,
    request: Request,
    next: Next,
) -> Response {
    request_span(true, sampling, request, next).await
}

async fn request_span(admin: bool, sampling: Sampling, request: Request, next: Next) -> Response {
    // Built only for a traced request: an untraced one costs no string.
    let make = || {
        let (method, in_name) = span_method(request.method());
        let route = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
        let name = route.map_or_else(|| in_name.to_owned(), |route| format!("{in_name} {route}"));
        let route = route.unwrap_or_default();
        macro_rules! span {
            ($name:literal) => {
                tracing::info_span!(
                    $name,
                    otel.name = name,
                    otel.kind = "server",
                    http.request.method = method,
                    http.route = route,
                    http.response.status_code = tracing::field::Empty,
                    otel.status_code = tracing::field::Empty,
                )
            };
        }
        if admin { span!("admin.request") } else { span!("http.request") }
    };
    let Some(span) = sampling.span_for(request.headers(), make) else {
        return next.run(request).await;
    };
    let response = next.run(request).instrument(span.clone()).await;
    // Signed: the OpenTelemetry layer turns an unsigned value into text.
    span.record("http.response.status_code", i64::from(response.status().as_u16()));
    if response.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// (attribute, name prefix) of a method per the HTTP conventions: any
/// but the standard ones is `_OTHER` in `HTTP <route>`, never its raw name.
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

#[cfg(test)]
mod tests {
    use opentelemetry::propagation::{Extractor, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;

    use super::{CallerHeaders, Sampling, Traced};
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
}
