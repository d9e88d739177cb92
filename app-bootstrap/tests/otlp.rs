//! Traces end to end: the real `ca-skeleton serve` binary exports to an
//! in-test OTLP/HTTP receiver (axum, decoding `ExportTraceServiceRequest`
//! with `opentelemetry-proto`). One request with a W3C `traceparent` gives
//! the request span and the decision span in that trace (and on Redis the
//! script span), with the attributes docs/operations.md lists; no raw API
//! key or client IP is anywhere in the exported bytes. With the receiver
//! down, requests are served and the failure counter rises.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use redis_fixture::RedisServer;
use sha2::{Digest, Sha256};
use support::Serve;

const KEY: &str = "otlp-test-pseudonymizer-key-0123456789abcdef";
const API_KEY: &str = "otlp-raw-api-key-never-exported";
const POLICY: &str = "otlp-burst";
/// The caller's trace and its span, as a W3C `traceparent` names them.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN_ID: &str = "00f067aa0ba902b7";

/// Every export request the receiver took: the raw body, and decoded.
#[derive(Debug, Default, Clone)]
struct Received {
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl Received {
    fn spans(&self) -> Vec<Span> {
        let bodies = self.bodies.lock().unwrap().clone();
        bodies
            .iter()
            .flat_map(|body| {
                let request = ExportTraceServiceRequest::decode(body.as_ref())
                    .expect("an OTLP/HTTP protobuf body");
                request.resource_spans
            })
            .flat_map(|resource| resource.scope_spans)
            .flat_map(|scope| scope.spans)
            .collect()
    }

    fn bytes(&self) -> Vec<u8> {
        self.bodies.lock().unwrap().iter().flat_map(|body| body.to_vec()).collect()
    }

    fn service_names(&self) -> Vec<String> {
        let bodies = self.bodies.lock().unwrap().clone();
        bodies
            .iter()
            .flat_map(|body| {
                ExportTraceServiceRequest::decode(body.as_ref()).unwrap().resource_spans
            })
            .filter_map(|resource| resource.resource)
            .flat_map(|resource| resource.attributes)
            .filter(|attribute| attribute.key == "service.name")
            .filter_map(|attribute| match attribute.value?.value? {
                AnyValue::StringValue(name) => Some(name),
                _ => None,
            })
            .collect()
    }
}

/// An OTLP/HTTP receiver on a free loopback port, on its own runtime
/// thread: `POST /v1/traces` keeps the body and answers 200 with an empty
/// `ExportTraceServiceResponse`.
fn receiver() -> (String, Received) {
    receiver_taking(Duration::ZERO)
}

/// [`receiver`], answering each export only after `delay` (a slow but
/// alive collector).
fn receiver_taking(delay: Duration) -> (String, Received) {
    let received = Received::default();
    let state = received.clone();
    let (bound, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            bound.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new()
                .route(
                    "/v1/traces",
                    post(move |State(received): State<Received>, body: Bytes| async move {
                        tokio::time::sleep(delay).await;
                        received.bodies.lock().unwrap().push(body);
                        ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
                    }),
                )
                .with_state(state);
            axum::serve(listener, app).await.unwrap();
        });
    });
    (format!("http://{}", address.recv().unwrap()), received)
}

fn config(provider: &str, endpoint: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "{provider}"
default-policy = "{POLICY}"

[capabilities.rate-limit.policies.{POLICY}]
algorithm = "fixed-window"
limit = 100
window = "60s"

[pseudonymizer.keys]
1 = "{KEY}"

[telemetry.otlp]
endpoint = "{endpoint}"
service-name = "otlp-test-service"
{extra}
"#
    )
}

/// HMAC-SHA-256 written out from RFC 2104 over `sha2`, so the expected
/// pseudonym comes from the spec, not from the code under test.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut padded = [0_u8; BLOCK];
    padded[..key.len()].copy_from_slice(key);
    let inner: Vec<u8> = padded.iter().map(|b| b ^ 0x36).chain(message.iter().copied()).collect();
    let inner = Sha256::digest(inner);
    let outer: Vec<u8> = padded.iter().map(|b| b ^ 0x5c).chain(inner.iter().copied()).collect();
    Sha256::digest(outer).into()
}

/// `v1:<hex>` of frame("api-key") ‖ frame(key) (docs/ARCHITECTURE.md,
/// "Pseudonym framing").
fn api_key_pseudonym(identity: &str) -> String {
    let mut message = Vec::new();
    for part in ["api-key", identity] {
        message.extend(u32::try_from(part.len()).unwrap().to_be_bytes());
        message.extend(part.as_bytes());
    }
    format!("v1:{}", hex::encode(hmac_sha256(KEY.as_bytes(), &message)))
}

/// GETs `/api/hello` on `base`: once with the API key and the caller's
/// `traceparent`, once with neither (the client IP is then the subject).
/// Returns both statuses.
fn two_requests(base: &str) -> Vec<u16> {
    let base = base.to_owned();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            let traced = client
                .get(format!("{base}/api/hello"))
                .header("x-api-key", API_KEY)
                .header("traceparent", format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01"))
                .header("tracestate", "vendor=opaque")
                .send()
                .await
                .unwrap();
            let by_ip = client.get(format!("{base}/api/hello")).send().await.unwrap();
            vec![traced.status().as_u16(), by_ip.status().as_u16()]
        })
    })
    .join()
    .unwrap()
}

/// SIGTERM, then the exit (which flushes the pending spans first).
fn stop(serve: &mut Serve) {
    let pid = serve.child.id().to_string();
    let killed = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(exit) = serve.child.try_wait().unwrap() {
            assert!(exit.success(), "serve exits 0 after SIGTERM, got {exit}");
            return;
        }
        assert!(Instant::now() < deadline, "serve did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn attributes(span: &Span) -> HashMap<String, AnyValue> {
    span.attributes
        .iter()
        .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?.value?)))
        .collect()
}

fn string(value: &str) -> AnyValue {
    AnyValue::StringValue(value.to_owned())
}

/// The spans of the caller's trace, checked: the request span is a child
/// of the caller's span, the decision span a child of the request span.
/// Returns (request, decision, the rest of the trace).
fn checked_trace(received: &Received) -> (Span, Span, Vec<Span>) {
    let trace_id = hex::decode(TRACE_ID).unwrap();
    let all = received.spans();
    let mut trace: Vec<Span> =
        all.iter().filter(|span| span.trace_id == trace_id).cloned().collect();
    let at = trace
        .iter()
        .position(|span| span.name == "GET /api/hello")
        .unwrap_or_else(|| panic!("no request span in the trace: {all:#?}"));
    let request = trace.remove(at);
    assert_eq!(request.parent_span_id, hex::decode(PARENT_SPAN_ID).unwrap());
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(request.trace_state, "vendor=opaque");
    let attrs = attributes(&request);
    assert_eq!(attrs.get("http.request.method"), Some(&string("GET")), "{attrs:?}");
    assert_eq!(attrs.get("http.route"), Some(&string("/api/hello")), "{attrs:?}");
    assert_eq!(attrs.get("http.response.status_code"), Some(&AnyValue::IntValue(200)), "{attrs:?}");

    let at = trace
        .iter()
        .position(|span| span.name == "rate_limit.decision")
        .unwrap_or_else(|| panic!("no decision span in the trace: {trace:#?}"));
    let decision = trace.remove(at);
    assert_eq!(decision.parent_span_id, request.span_id);
    let attrs = attributes(&decision);
    for (key, value) in [
        ("rate_limit.policies", string(POLICY)),
        ("rate_limit.operation", string("GET /api/hello")),
        ("rate_limit.outcome", string("allowed")),
        ("rate_limit.admitted", AnyValue::BoolValue(true)),
        ("rate_limit.cached", AnyValue::BoolValue(false)),
        ("rate_limit.subject", string(&api_key_pseudonym(API_KEY))),
    ] {
        assert_eq!(attrs.get(key), Some(&value), "{key} in {attrs:?}");
    }
    (request, decision, trace)
}

/// Neither the API key nor the client's address, in any form a span could
/// hold it, is in the bytes the collector received.
fn assert_no_raw_subject(received: &Received) {
    let bytes = received.bytes();
    assert!(!bytes.is_empty(), "something was exported");
    for raw in [API_KEY, "127.0.0.1", "127.0.0.0"] {
        assert!(
            !bytes.windows(raw.len()).any(|window| window == raw.as_bytes()),
            "{raw} is in the exported bytes"
        );
    }
}

/// Log lines written inside the request carry its trace and span ids.
fn assert_log_lines_join(serve: &Serve, request: &Span) {
    let logs = serve.logs();
    let span_id = hex::encode(&request.span_id);
    let joined = logs.iter().filter_map(|line| serde_json::from_str(line).ok()).any(
        |event: serde_json::Value| {
            event["trace_id"] == TRACE_ID
                && event["span_id"] == span_id.as_str()
                && event["fields"]["message"] == "rate-limit decision"
        },
    );
    assert!(joined, "no log line with trace_id {TRACE_ID} span_id {span_id}: {logs:#?}");
}

#[test]
fn memory_exports_the_request_and_decision_spans_of_the_callers_trace() {
    let (endpoint, received) = receiver();
    let mut serve = Serve::start(&config("memory", &endpoint, ""), "info,adapter_web=trace");
    assert_eq!(two_requests(&serve.base), [200, 200]);
    stop(&mut serve);

    assert_no_raw_subject(&received);
    let (request, decision, rest) = checked_trace(&received);
    assert!(rest.is_empty(), "no other span in the trace on memory: {rest:#?}");
    assert!(decision.start_time_unix_nano >= request.start_time_unix_nano);
    assert_eq!(received.service_names().first().map(String::as_str), Some("otlp-test-service"));
    // The untraced request is a trace of its own, sampled at ratio 1.0.
    let requests =
        received.spans().into_iter().filter(|span| span.name == "GET /api/hello").count();
    assert_eq!(requests, 2, "both requests have a request span");
    assert_log_lines_join(&serve, &request);
}

#[test]
fn redis_exports_the_script_span_under_the_decision_span() {
    let redis = RedisServer::start();
    let extra =
        format!("[redis]\nenabled = true\nurls = [\"{}\"]\nkey-prefix = \"otlp:\"\n", redis.url());
    let (endpoint, received) = receiver();
    let mut serve = Serve::start(&config("redis", &endpoint, &extra), "info,adapter_web=trace");
    assert_eq!(two_requests(&serve.base), [200, 200]);
    stop(&mut serve);

    let (request, decision, rest) = checked_trace(&received);
    let script = rest
        .iter()
        .find(|span| span.name == "redis.script")
        .unwrap_or_else(|| panic!("no script span in the trace: {rest:#?}"));
    assert_eq!(script.parent_span_id, decision.span_id);
    assert_eq!(script.kind, SpanKind::Client as i32);
    let attrs = attributes(script);
    assert_eq!(attrs.get("redis.script"), Some(&string("fixed-window")), "{attrs:?}");
    assert_eq!(attrs.get("redis.keys"), Some(&AnyValue::IntValue(1)), "{attrs:?}");
    assert_eq!(attrs.get("redis.attempts"), Some(&AnyValue::IntValue(1)), "{attrs:?}");
    assert!(matches!(attrs.get("redis.duration_us"), Some(AnyValue::IntValue(_))), "{attrs:?}");
    // No key name: the prefix of every key is nowhere in the export.
    let bytes = received.bytes();
    assert!(!bytes.windows(5).any(|window| window == b"otlp:"), "a key name was exported");
    assert_no_raw_subject(&received);
    assert_log_lines_join(&serve, &request);
}

fn export_failures(base: &str) -> u64 {
    let url = format!("{base}/metrics");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let body = runtime.block_on(async {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        client.get(url).send().await.unwrap().text().await.unwrap()
    });
    body.lines()
        .find_map(|line| line.strip_prefix("ca_skeleton_trace_export_failures_total "))
        .map_or(0, |value| value.trim().parse().unwrap())
}

fn wait_for_failures(base: &str, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while export_failures(base) < at_least {
        assert!(Instant::now() < deadline, "the failure counter stays below {at_least}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `OTEL_BSP_MAX_QUEUE_SIZE=0` made the SDK panic in the batch processor
/// (issue 21, D2): start-up now stops naming the variable.
#[test]
fn a_zero_batch_queue_from_the_environment_stops_start_up_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("otlp.toml");
    std::fs::write(&path, config("memory", "http://127.0.0.1:4318", "")).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ca-skeleton"))
        .env_clear()
        .env("RUST_LOG", "warn")
        .env("OTEL_BSP_MAX_QUEUE_SIZE", "0")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "start-up must stop: {stderr}");
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    assert!(stderr.contains("OTEL_BSP_MAX_QUEUE_SIZE"), "names the variable: {stderr}");
}

#[test]
fn with_the_receiver_down_requests_are_served_and_failures_are_counted_and_logged_once() {
    // A port nothing listens on any more: every export is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let endpoint = format!("http://{closed}");
    // The SDK's standard variable: export every 50 ms, not every 5 s.
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let serve = Serve::start_with_env(&config("memory", &endpoint, ""), "info", &env);
    for round in 1..=2 {
        assert_eq!(two_requests(&serve.base), [200, 200], "round {round}");
        wait_for_failures(&serve.base, round);
    }
    let warned: Vec<String> = serve
        .logs()
        .into_iter()
        .filter(|line| line.contains("trace export failed") && line.contains("\"WARN\""))
        .collect();
    assert_eq!(warned.len(), 1, "logged once a minute at most: {warned:#?}");
}

#[test]
fn an_admin_call_and_the_reload_it_asks_for_have_their_own_spans() {
    const TOKEN: &str = "otlp-test-admin-token-0123456789abcdef";
    let (endpoint, received) = receiver();
    let extra = format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n");
    let mut serve = Serve::start(&config("memory", &endpoint, &extra), "info");
    let admin = serve.admin_address();
    let status = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            let reply = client
                .post(format!("http://{admin}/admin/reload"))
                .bearer_auth(TOKEN)
                .header("traceparent", format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01"))
                .send()
                .await
                .unwrap();
            reply.status().as_u16()
        })
    })
    .join()
    .unwrap();
    assert_eq!(status, 200);
    stop(&mut serve);

    let trace_id = hex::decode(TRACE_ID).unwrap();
    let trace: Vec<Span> =
        received.spans().into_iter().filter(|span| span.trace_id == trace_id).collect();
    let call = trace
        .iter()
        .find(|span| span.name == "POST /admin/reload")
        .unwrap_or_else(|| panic!("no admin span in the trace: {trace:#?}"));
    assert_eq!(call.parent_span_id, hex::decode(PARENT_SPAN_ID).unwrap());
    assert_eq!(call.kind, SpanKind::Server as i32);
    assert_eq!(attributes(call).get("http.response.status_code"), Some(&AnyValue::IntValue(200)));
    let reload = trace
        .iter()
        .find(|span| span.name == "config.reload")
        .unwrap_or_else(|| panic!("no reload span in the trace: {trace:#?}"));
    assert_eq!(reload.parent_span_id, call.span_id);
    assert_eq!(attributes(reload).get("result"), Some(&string("unchanged")));
}

/// GETs `/api/hello` once per entry, with that `traceparent` when given.
fn requests_with(base: &str, traceparents: &[Option<String>]) -> Vec<u16> {
    let (base, traceparents) = (base.to_owned(), traceparents.to_vec());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            let mut statuses = Vec::new();
            for traceparent in traceparents {
                let mut request = client.get(format!("{base}/api/hello"));
                if let Some(traceparent) = traceparent {
                    request = request.header("traceparent", traceparent);
                }
                statuses.push(request.send().await.unwrap().status().as_u16());
            }
            statuses
        })
    })
    .join()
    .unwrap()
}

#[test]
fn at_ratio_zero_only_a_sampled_traceparent_is_traced() {
    let (endpoint, received) = receiver();
    let mut serve = Serve::start(&config("memory", &endpoint, "sample-ratio = 0.0\n"), "info");
    let unsampled_trace = "0af7651916cd43dd8448eb211c80319c";
    let traceparents = [
        None,
        Some(format!("00-{unsampled_trace}-b7ad6b7169203331-00")),
        Some(format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01")),
        None,
    ];
    assert_eq!(requests_with(&serve.base, &traceparents), [200; 4]);
    stop(&mut serve);

    let spans = received.spans();
    let trace_id = hex::decode(TRACE_ID).unwrap();
    let mut names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["GET /api/hello", "rate_limit.decision"], "{spans:#?}");
    assert!(spans.iter().all(|span| span.trace_id == trace_id), "{spans:#?}");
}

/// Issue 21, D5: a method outside the standard ones is exported as
/// `_OTHER` (OpenTelemetry HTTP conventions) in a span named
/// `HTTP <route>`; the raw method, which a client chooses freely, is in no
/// exported byte.
#[test]
fn an_extension_method_is_exported_as_other_and_never_raw() {
    const METHOD: &str = "XHOSTILEMETHODNAME";
    let (endpoint, received) = receiver();
    let mut serve = Serve::start(&config("memory", &endpoint, ""), "info");
    let base = serve.base.clone();
    let status = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            let method = reqwest::Method::from_bytes(METHOD.as_bytes()).unwrap();
            let reply = client
                .request(method, format!("{base}/api/hello"))
                .header("traceparent", format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01"))
                .send()
                .await
                .unwrap();
            reply.status().as_u16()
        })
    })
    .join()
    .unwrap();
    stop(&mut serve);

    let trace_id = hex::decode(TRACE_ID).unwrap();
    let spans = received.spans();
    let request = spans
        .iter()
        .find(|span| {
            span.trace_id == trace_id && span.parent_span_id == hex::decode(PARENT_SPAN_ID).unwrap()
        })
        .unwrap_or_else(|| panic!("no request span (status {status}): {spans:#?}"));
    assert_eq!(request.name, "HTTP /api/hello");
    let attrs = attributes(request);
    assert_eq!(attrs.get("http.request.method"), Some(&string("_OTHER")), "{attrs:?}");
    let bytes = received.bytes();
    assert!(
        !bytes.windows(METHOD.len()).any(|window| window == METHOD.as_bytes()),
        "the raw method is in the exported bytes"
    );
}

/// Issue 21, D1: at SIGTERM with a slow but alive collector and a full
/// queue, the SDK's shutdown message did not fit in the queue and every
/// pending span was dropped at once although grace remained. The flush now
/// keeps exporting until the queue is through (or the grace ends).
#[test]
fn a_full_queue_is_still_exported_at_shutdown_to_a_slow_collector() {
    let (endpoint, received) = receiver_taking(Duration::from_millis(150));
    // One span per export, a queue of 4: the queue is full at SIGTERM.
    let env = [("OTEL_BSP_MAX_QUEUE_SIZE", "4"), ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")];
    let mut serve = Serve::start_with_env(&config("memory", &endpoint, ""), "info", &env);
    for round in 0..5 {
        assert_eq!(two_requests(&serve.base), [200, 200], "round {round}");
    }
    stop(&mut serve);
    let exported = received.spans().len();
    // The one in the collector's hands at SIGTERM and the 4 queued.
    assert!(exported >= 5, "only {exported} spans exported; logs: {:#?}", serve.logs());
}
