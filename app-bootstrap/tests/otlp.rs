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
/// A trace a caller did not sample (flags `00`).
const UNSAMPLED_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
/// The key that lets a caller's `traceparent` decide and be joined (off by
/// default): what the tests of the caller's trace set.
const TRUSTED: &str = "trust-remote-parent = true\n";

/// Every export request the receiver took: the raw body, and decoded;
/// the `x-team` header of each.
#[derive(Debug, Default, Clone)]
struct Received {
    bodies: Arc<Mutex<Vec<Bytes>>>,
    teams: Arc<Mutex<Vec<Option<String>>>>,
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
    spawn_receiver(delay, None)
}

/// [`receiver`] over TLS with `identity` (an `https://` endpoint).
fn tls_receiver(identity: &TlsIdentity) -> (String, Received) {
    spawn_receiver(Duration::ZERO, Some(identity.server_config()))
}

fn spawn_receiver(delay: Duration, tls: Option<Arc<rustls::ServerConfig>>) -> (String, Received) {
    let received = Received::default();
    let state = received.clone();
    let (bound, address) = std::sync::mpsc::channel();
    let scheme = if tls.is_some() { "https" } else { "http" };
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            bound.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new()
                .route(
                    "/v1/traces",
                    post(
                        move |State(received): State<Received>,
                              headers: axum::http::HeaderMap,
                              body: Bytes| async move {
                            tokio::time::sleep(delay).await;
                            let team = headers.get("x-team").and_then(|team| team.to_str().ok());
                            received.teams.lock().unwrap().push(team.map(str::to_owned));
                            received.bodies.lock().unwrap().push(body);
                            ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
                        },
                    ),
                )
                .with_state(state);
            let Some(tls) = tls else {
                axum::serve(listener, app).await.unwrap();
                return;
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(tls);
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // A client that does not trust the certificate ends here.
                    let Ok(stream) = acceptor.accept(tcp).await else { return };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
    });
    (format!("{scheme}://{}", address.recv().unwrap()), received)
}

/// A self-signed certificate for 127.0.0.1 and localhost, its key, and
/// its PEM in a file (what `SSL_CERT_FILE` names for the binary).
struct TlsIdentity {
    certificate: rcgen::CertifiedKey<rcgen::KeyPair>,
    _dir: tempfile::TempDir,
    pem_file: std::path::PathBuf,
}

impl TlsIdentity {
    fn new() -> Self {
        let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        let certificate = rcgen::generate_simple_self_signed(names).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pem_file = dir.path().join("collector-ca.pem");
        std::fs::write(&pem_file, certificate.cert.pem()).unwrap();
        Self { certificate, _dir: dir, pem_file }
    }

    fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            self.certificate.signing_key.serialize_der().into(),
        );
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![self.certificate.cert.der().clone()], key)
            .unwrap();
        Arc::new(config)
    }

    fn pem_file(&self) -> &str {
        self.pem_file.to_str().unwrap()
    }
}

fn config(provider: &str, endpoint: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "{provider}"
default-policy = "{POLICY}"
api-key-header = "x-api-key"

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

/// `v1:<hex>` of frame("api-key") ‖ frame(key) (docs/http-edge.md,
/// "Pseudonym framing").
fn api_key_pseudonym(identity: &str) -> String {
    pseudonym(&["api-key", identity])
}

/// `v1:<hex>` of the HMAC of `parts`, each a length-framed frame.
fn pseudonym(parts: &[&str]) -> String {
    let mut message = Vec::new();
    for part in parts {
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
                // Two lines of one list (W3C): the span carries both.
                .header("tracestate", "vendor=opaque")
                .header("tracestate", "other=two")
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
    assert_eq!(request.trace_state, "vendor=opaque,other=two");
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

/// The spans of the caller's trace (`TRACE_ID`).
fn callers_trace(received: &Received) -> Vec<Span> {
    let trace_id = hex::decode(TRACE_ID).unwrap();
    received.spans().into_iter().filter(|span| span.trace_id == trace_id).collect()
}

/// The span named `name` in `trace`, checked to be a server span and the
/// child of the caller's span.
fn server_span_under_the_caller<'a>(trace: &'a [Span], name: &str) -> &'a Span {
    let span = trace
        .iter()
        .find(|span| span.name == name)
        .unwrap_or_else(|| panic!("no {name} span in the trace: {trace:#?}"));
    assert_eq!(span.parent_span_id, hex::decode(PARENT_SPAN_ID).unwrap());
    assert_eq!(span.kind, SpanKind::Server as i32);
    span
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
    let joined = logs.iter().filter_map(|line| serde_json::from_str(line).ok()).find(
        |event: &serde_json::Value| {
            event["trace_id"] == TRACE_ID
                && event["span_id"] == span_id.as_str()
                && event["fields"]["message"] == "rate-limit decision"
        },
    );
    let Some(event) = joined else {
        panic!("no log line with trace_id {TRACE_ID} span_id {span_id}: {logs:#?}")
    };
    // The span it was written in, by name and fields, and the spans it runs in.
    assert_eq!(event["span"]["name"], "http.request", "{event}");
    assert_eq!(event["span"]["http.route"], "/api/hello", "{event}");
    assert_eq!(event["span"]["http.request.method"], "GET", "{event}");
    assert_eq!(event["spans"][0]["name"], "http.request", "{event}");
}

#[test]
fn memory_exports_the_request_and_decision_spans_of_the_callers_trace() {
    let (endpoint, received) = receiver();
    let mut serve = Serve::start(&config("memory", &endpoint, TRUSTED), "info,adapter_web=trace");
    // The counter is shown before anything failed.
    assert_eq!(metric(&serve.base, TRACE_EXPORT_FAILURES_TOTAL), Some(0));
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
    let extra = format!(
        "{TRUSTED}[redis]\nenabled = true\nurls = [\"{}\"]\nkey-prefix = \"otlp:\"\n",
        redis.url()
    );
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

const TRACE_EXPORT_FAILURES_TOTAL: &str = "ca_skeleton_trace_export_failures_total";

/// The value of the unlabelled counter `name` on `/metrics`, if shown.
fn metric(base: &str, name: &str) -> Option<u64> {
    let url = format!("{base}/metrics");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let body = runtime.block_on(async {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        client.get(url).send().await.unwrap().text().await.unwrap()
    });
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .map(|value| value.trim().parse().unwrap())
}

fn export_failures(base: &str) -> u64 {
    metric(base, TRACE_EXPORT_FAILURES_TOTAL).unwrap_or(0)
}

fn wait_for_failures(base: &str, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while export_failures(base) < at_least {
        assert!(Instant::now() < deadline, "the failure counter stays below {at_least}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `ca-skeleton serve` with `env` and an OTLP `endpoint`, expecting
/// it to stop at start-up; returns its stderr. One that serves instead is
/// killed after 20 s and fails the test.
fn start_up_refused_at(endpoint: &str, env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("otlp.toml");
    std::fs::write(&path, config("memory", endpoint, "")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ca-skeleton"))
        .env_clear()
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .arg("--config")
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let output = child.wait_with_output().unwrap();
            panic!("start-up went on: {}", String::from_utf8_lossy(&output.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "start-up must stop: {stderr}");
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    stderr
}

/// `OTEL_BSP_MAX_QUEUE_SIZE=0` made the SDK's processor panic on the
/// runtime; its own thread now keeps no span, and requests are served.
#[test]
fn a_zero_batch_queue_from_the_environment_keeps_no_span_and_serves() {
    let (endpoint, received) = receiver();
    let env = [("OTEL_BSP_MAX_QUEUE_SIZE", "0")];
    let mut serve = Serve::start_with_env(&config("memory", &endpoint, ""), "info", &env);
    assert_eq!(two_requests(&serve.base), [200, 200]);
    stop(&mut serve);
    assert!(received.spans().is_empty(), "a queue of 0 keeps no span");
    assert!(!serve.logs().iter().any(|line| line.contains("panicked")), "{:#?}", serve.logs());
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
    let extra = format!("{TRUSTED}[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n");
    let mut serve = Serve::start(&config("memory", &endpoint, &extra), "info");
    let admin = serve.admin_address();
    // The caller's trace, sampled; then another that is not.
    let traceparents = [
        format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01"),
        format!("00-{UNSAMPLED_TRACE_ID}-b7ad6b7169203331-00"),
    ];
    let statuses = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            let mut statuses = Vec::new();
            for traceparent in traceparents {
                let reply = client
                    .post(format!("http://{admin}/admin/reload"))
                    .bearer_auth(TOKEN)
                    .header("traceparent", traceparent)
                    .send()
                    .await
                    .unwrap();
                statuses.push(reply.status().as_u16());
            }
            statuses
        })
    })
    .join()
    .unwrap();
    assert_eq!(statuses, [200, 200]);
    stop(&mut serve);
    // The unsampled call's reload follows it: no span, not even a trace
    // of its own (it was exported as a new root before).
    let reloads = received.spans().into_iter().filter(|span| span.name == "config.reload").count();
    assert_eq!(reloads, 1, "only the sampled call's reload: {:#?}", received.spans());

    let trace = callers_trace(&received);
    let call = server_span_under_the_caller(&trace, "POST /admin/reload");
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
fn at_ratio_zero_only_a_trusted_sampled_traceparent_is_traced() {
    let (endpoint, received) = receiver();
    let extra = format!("sample-ratio = 0.0\n{TRUSTED}");
    let mut serve = Serve::start(&config("memory", &endpoint, &extra), "info");
    let traceparents = [
        None,
        Some(format!("00-{UNSAMPLED_TRACE_ID}-b7ad6b7169203331-00")),
        Some(format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01")),
        None,
    ];
    assert_eq!(requests_with(&serve.base, &traceparents), [200; 4]);
    // A reload on SIGHUP starts no trace at ratio 0 either.
    hang_up_and_wait_for_the_reload(&serve);
    stop(&mut serve);

    let spans = received.spans();
    let trace_id = hex::decode(TRACE_ID).unwrap();
    let mut names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["GET /api/hello", "rate_limit.decision"], "{spans:#?}");
    assert!(spans.iter().all(|span| span.trace_id == trace_id), "{spans:#?}");
}

/// At a public edge (the default, `trust-remote-parent` off) a client's
/// sampled `traceparent` does not force a trace: at ratio 0 nothing is
/// traced, whatever the client sends.
#[test]
fn at_ratio_zero_an_untrusted_sampled_traceparent_is_not_traced() {
    let (endpoint, received) = receiver();
    let mut serve = Serve::start(&config("memory", &endpoint, "sample-ratio = 0.0\n"), "info");
    let traceparents = [
        Some(format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01")),
        None,
        Some(format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01")),
    ];
    assert_eq!(requests_with(&serve.base, &traceparents), [200; 3]);
    stop(&mut serve);
    let spans = received.spans();
    assert!(spans.is_empty(), "nothing traced at ratio 0: {spans:#?}");
}

/// Untrusted (the default), a traced request is a trace of its own: the
/// caller's span is a link carrying its two ids and nothing else, and the
/// caller's `tracestate` is in no exported byte.
#[test]
fn an_untrusted_callers_trace_is_linked_not_joined_and_its_tracestate_not_exported() {
    const STATE: &str = "hostile=client-written-state";
    let (endpoint, received) = receiver();
    let mut serve = Serve::start(&config("memory", &endpoint, ""), "info");
    let base = serve.base.clone();
    let status = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            let reply = client
                .get(format!("{base}/api/hello"))
                .header("traceparent", format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01"))
                .header("tracestate", STATE)
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

    let spans = received.spans();
    let request = spans
        .iter()
        .find(|span| span.name == "GET /api/hello")
        .unwrap_or_else(|| panic!("no request span: {spans:#?}"));
    let trace_id = hex::decode(TRACE_ID).unwrap();
    assert_ne!(request.trace_id, trace_id, "a trace of its own: {request:#?}");
    assert!(request.parent_span_id.is_empty(), "a root span: {request:#?}");
    assert!(request.trace_state.is_empty(), "{request:#?}");
    assert_eq!(request.links.len(), 1, "{request:#?}");
    let link = &request.links[0];
    assert_eq!(link.trace_id, trace_id);
    assert_eq!(link.span_id, hex::decode(PARENT_SPAN_ID).unwrap());
    assert!(link.trace_state.is_empty(), "{link:#?}");
    assert!(link.attributes.is_empty(), "{link:#?}");
    assert!(spans.iter().all(|span| span.trace_id != trace_id), "no span joins: {spans:#?}");
    let bytes = received.bytes();
    assert!(!bytes.windows(STATE.len()).any(|window| window == STATE.as_bytes()));
}

/// SIGHUP, then waits for the reload's result line.
fn hang_up_and_wait_for_the_reload(serve: &Serve) {
    let pid = serve.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !serve.logs().iter().any(|line| line.contains("configuration reloaded")) {
        assert!(Instant::now() < deadline, "no reload after SIGHUP: {:#?}", serve.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// At ratio 1, a reload on SIGHUP is a trace of its own. The SDK's
/// variables: `OTEL_RESOURCE_ATTRIBUTES` is obeyed, an endpoint variable
/// is not (the key decides); both are named at start.
#[test]
fn a_reload_on_sighup_is_a_root_span_at_ratio_one() {
    let (endpoint, received) = receiver();
    let env = [
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=otlp-test"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
    ];
    let mut serve = Serve::start_with_env(&config("memory", &endpoint, ""), "info", &env);
    hang_up_and_wait_for_the_reload(&serve);
    stop(&mut serve);
    let named = serve.logs().into_iter().any(|line| {
        line.contains("OpenTelemetry variables set")
            && line.contains("OTEL_EXPORTER_OTLP_ENDPOINT")
            && line.contains("OTEL_RESOURCE_ATTRIBUTES")
    });
    assert!(named, "the variables are named: {:#?}", serve.logs());
    let bytes = received.bytes();
    let attribute = b"otlp-test";
    assert!(bytes.windows(attribute.len()).any(|window| window == attribute), "resource attribute");
    let spans = received.spans();
    let reload = spans
        .iter()
        .find(|span| span.name == "config.reload")
        .unwrap_or_else(|| panic!("no reload span: {spans:#?}"));
    assert!(reload.parent_span_id.is_empty(), "a root span: {reload:#?}");
    assert_eq!(attributes(reload).get("result"), Some(&string("unchanged")));
}

/// Where a key sets what an SDK variable would, the key wins (the SDK
/// lets the configuration override its variables): spans still reach the
/// configured collector, as protobuf, uncompressed, in time, under the
/// configured service name, sampled at the configured ratio. A header
/// variable adds its header.
#[test]
fn the_keys_win_over_the_sdks_variables() {
    let (endpoint, received) = receiver();
    let env = [
        ("OTEL_SERVICE_NAME", "from-the-variable"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "1"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_TRACES_SAMPLER", "always_off"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=blue"),
    ];
    let mut serve = Serve::start_with_env(&config("memory", &endpoint, TRUSTED), "info", &env);
    assert_eq!(two_requests(&serve.base), [200, 200]);
    stop(&mut serve);
    let (request, _decision, _) = checked_trace(&received);
    assert_eq!(request.name, "GET /api/hello");
    let names = received.service_names();
    assert!(names.iter().all(|name| name == "otlp-test-service"), "{names:?}");
    let teams = received.teams.lock().unwrap().clone();
    assert!(teams.iter().all(|team| team.as_deref() == Some("blue")), "{teams:?}");
}

/// A method outside the standard ones is exported as
/// `_OTHER` (OpenTelemetry HTTP conventions) in a span named
/// `HTTP <route>`; the raw method, which a client chooses freely, is in no
/// exported byte.
#[test]
fn an_extension_method_is_exported_as_other_and_never_raw() {
    const METHOD: &str = "XHOSTILEMETHODNAME";
    let (endpoint, received) = receiver();
    let mut serve = Serve::start(&config("memory", &endpoint, TRUSTED), "info");
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

/// At SIGTERM with a slow but alive collector and a full queue, the
/// pending spans are exported at the collector's pace (the processor takes
/// its shutdown on a channel of its own), within the grace.
#[test]
fn a_full_queue_is_still_exported_at_shutdown_to_a_slow_collector() {
    let (endpoint, received) = receiver_taking(Duration::from_millis(300));
    // One span per export, a queue of 4: the queue is full at SIGTERM.
    let env = [("OTEL_BSP_MAX_QUEUE_SIZE", "4"), ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")];
    let mut serve = Serve::start_with_env(&config("memory", &endpoint, ""), "info", &env);
    for round in 0..5 {
        assert_eq!(two_requests(&serve.base), [200, 200], "round {round}");
    }
    // 20 spans against a queue of 4 and one export every 300 ms: the
    // queue is full, and requests were served all the same.
    stop(&mut serve);
    let exported = received.spans().len();
    // The one in the collector's hands at SIGTERM and the 4 queued.
    assert!(exported >= 5, "only {exported} spans exported; logs: {:#?}", serve.logs());
}

/// Serves two requests exporting to `collector` over TLS with the extra
/// `telemetry.otlp` lines `extra` and the variables `env`; asserts the
/// collector got the caller's trace, and returns what it received.
fn spans_reach(collector: &TlsIdentity, extra: &str, env: &[(&str, &str)]) -> Received {
    let (endpoint, received) = tls_receiver(collector);
    assert!(endpoint.starts_with("https://"));
    let extra = format!("{TRUSTED}{extra}");
    let mut serve = Serve::start_with_env(&config("memory", &endpoint, &extra), "info", env);
    assert_eq!(two_requests(&serve.base), [200, 200]);
    stop(&mut serve);
    let (request, _decision, _) = checked_trace(&received);
    assert_eq!(request.name, "GET /api/hello");
    received
}

/// [`spans_reach`] to a collector the binary must not trust: each export
/// fails and is counted, and the collector gets no span.
fn no_span_reaches(collector: &TlsIdentity, extra: &str, env: &[(&str, &str)]) {
    let (endpoint, received) = tls_receiver(collector);
    let mut env = env.to_vec();
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "50"));
    let mut serve = Serve::start_with_env(&config("memory", &endpoint, extra), "info", &env);
    assert_eq!(two_requests(&serve.base), [200, 200]);
    wait_for_failures(&serve.base, 1);
    stop(&mut serve);
    assert!(received.spans().is_empty(), "an untrusted collector got spans");
}

/// An `https://` endpoint: rustls under the exporter's hyper client,
/// trusting what `SSL_CERT_FILE` names (it replaces the OS store). It was
/// refused at start-up (no TLS in the build). A certificate the binary
/// does not trust gets no span: each export fails and is counted.
#[test]
fn an_https_collector_gets_the_spans_and_an_untrusted_one_none() {
    let collector = TlsIdentity::new();
    let received = spans_reach(&collector, "", &[("SSL_CERT_FILE", collector.pem_file())]);
    assert_no_raw_subject(&received);
    let stranger = TlsIdentity::new();
    no_span_reaches(&collector, "", &[("SSL_CERT_FILE", stranger.pem_file())]);
}

/// An `https://` endpoint with no root certificate to trust (here
/// `SSL_CERT_FILE` names a file that does not exist) stops start-up,
/// naming where the roots come from.
#[test]
fn an_https_endpoint_without_roots_stops_start_up() {
    let missing = [("SSL_CERT_FILE", "/nonexistent/otlp-test-ca.pem")];
    let stderr = start_up_refused_at("https://127.0.0.1:4318", &missing);
    assert!(stderr.contains("TLS roots"), "names the roots: {stderr}");
}

/// `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE` (else
/// `OTEL_EXPORTER_OTLP_CERTIFICATE`) names a PEM file of CAs that replaces
/// every other root: its collector gets the spans, and a collector only
/// `SSL_CERT_FILE` trusts gets none (the variables were ignored).
#[test]
fn a_pinned_ca_trusts_its_collector_and_refuses_another() {
    let collector = TlsIdentity::new();
    spans_reach(&collector, "", &[("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", collector.pem_file())]);
    let stranger = TlsIdentity::new();
    let env = [
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", collector.pem_file()),
        ("SSL_CERT_FILE", stranger.pem_file()),
    ];
    no_span_reaches(&stranger, "", &env);
}

/// `telemetry.otlp.ca-file` pins a CA the same way, and
/// beats `SSL_CERT_FILE`: its collector gets the spans, another that only
/// `SSL_CERT_FILE` trusts gets none.
#[test]
fn a_ca_file_key_trusts_its_collector_and_refuses_another() {
    let collector = TlsIdentity::new();
    let pinned = format!("ca-file = {:?}", collector.pem_file());
    spans_reach(&collector, &pinned, &[]);
    let stranger = TlsIdentity::new();
    no_span_reaches(&stranger, &pinned, &[("SSL_CERT_FILE", stranger.pem_file())]);
}

/// What a refusal of the TLS roots must not print: Rust's Debug output.
fn assert_no_debug_output(stderr: &str) {
    for internal in ["Error {", "kind:", "Os {", "inner:"] {
        assert!(!stderr.contains(internal), "Debug output ({internal}): {stderr}");
    }
}

/// A pinned CA file that is missing or holds no certificate
/// stops start-up naming the variable and what is wrong, in words; so
/// does an `SSL_CERT_DIR` that does not exist.
#[test]
fn a_bad_ca_file_stops_start_up_naming_the_variable() {
    const HTTPS: &str = "https://127.0.0.1:4318";
    let collector = TlsIdentity::new();
    let not_pem = collector.pem_file.with_file_name("not-a-certificate.txt");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let not_pem = not_pem.to_str().unwrap();

    let missing = "/nonexistent/otlp-test-ca.pem";
    let stderr = start_up_refused_at(HTTPS, &[("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", missing)]);
    assert!(stderr.contains("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"), "{stderr}");
    assert!(stderr.contains(missing) && stderr.contains("cannot be read"), "{stderr}");
    assert_no_debug_output(&stderr);

    let stderr = start_up_refused_at(HTTPS, &[("OTEL_EXPORTER_OTLP_CERTIFICATE", not_pem)]);
    assert!(stderr.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{stderr}");
    assert!(stderr.contains("holds no PEM certificate"), "{stderr}");
    assert_no_debug_output(&stderr);

    let stderr = start_up_refused_at(HTTPS, &[("SSL_CERT_DIR", "/nonexistent/otlp-certs")]);
    assert!(stderr.contains("SSL_CERT_DIR") && stderr.contains("/nonexistent"), "{stderr}");
    assert_no_debug_output(&stderr);
}

/// A schedule delay of 0 would keep the SDK's export thread spinning on a
/// core: start-up stops, naming the variable.
#[test]
fn a_zero_schedule_delay_stops_start_up_naming_the_variable() {
    let stderr = start_up_refused_at("http://127.0.0.1:4318", &[("OTEL_BSP_SCHEDULE_DELAY", "0")]);
    assert!(stderr.contains("OTEL_BSP_SCHEDULE_DELAY=0"), "{stderr}");
    assert_no_debug_output(&stderr);
}

/// The SDK's kill switches were ignored. With
/// `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER=none`, and an
/// endpoint configured, requests are served, no span reaches the
/// collector, and a warning names the variable.
#[test]
fn the_sdk_kill_switches_turn_export_off_with_a_warning() {
    for switch in [("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "none")] {
        let (endpoint, received) = receiver();
        let env = [switch, ("OTEL_BSP_SCHEDULE_DELAY", "50")];
        let mut serve = Serve::start_with_env(&config("memory", &endpoint, ""), "info", &env);
        assert_eq!(two_requests(&serve.base), [200, 200], "{switch:?}");
        stop(&mut serve);
        assert!(received.spans().is_empty(), "{switch:?}: spans were exported");
        let warned = serve.logs().into_iter().any(|line| {
            line.contains("\"WARN\"")
                && line.contains("traces are not exported")
                && line.contains(switch.0)
        });
        assert!(warned, "{switch:?}: no warning naming it: {:#?}", serve.logs());
    }
}

/// The SDK's variables that are set are named at start, never their
/// values (a header or a key path may be a secret).
#[test]
fn sdk_variables_set_are_named_without_their_values() {
    let (endpoint, _received) = receiver();
    let env = [
        ("OTEL_PROPAGATORS", "b3"),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/run/secrets/client.key"),
        ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "/run/secrets/client.pem"),
    ];
    let mut serve = Serve::start_with_env(&config("memory", &endpoint, ""), "info", &env);
    stop(&mut serve);
    let named: Vec<String> = serve
        .logs()
        .into_iter()
        .filter(|line| line.contains("OpenTelemetry variables set"))
        .collect();
    for (variable, _) in env {
        let found = named.iter().any(|line| line.contains(variable));
        assert!(found, "{variable} not named: {named:#?}");
    }
    assert!(!named.iter().any(|line| line.contains("/run/secrets")), "{named:#?}");
}

/// The Envoy front end: a `ShouldRateLimit` call with a W3C `traceparent`
/// in its metadata gets a server span in the caller's trace (gRPC
/// conventions), and its policy set's decision span under it with the
/// attributes of the HTTP one; no descriptor value is exported.
#[test]
fn an_envoy_call_is_a_grpc_span_in_the_callers_trace_with_its_decision_span() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    const DOMAIN: &str = "otlp-edge";
    const ADDRESS: &str = "10.77.0.9";

    let (endpoint, received) = receiver();
    let rules = format!(
        "{TRUSTED}[envoy-rls]\nlisten = \"127.0.0.1:0\"\n\n[[envoy-rls.rules]]\ndomain = \"{DOMAIN}\"\n\
         descriptor = [\"remote_address\"]\npolicies = \"{POLICY}\"\n"
    );
    let mut serve = Serve::start(&config("memory", &endpoint, &rules), "info");
    let rls = serve.rls_address();
    let code = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let mut client =
                RateLimitServiceClient::connect(format!("http://{rls}")).await.unwrap();
            let entry = Entry { key: "remote_address".to_owned(), value: ADDRESS.to_owned() };
            let mut call = tonic::Request::new(RateLimitRequest {
                domain: DOMAIN.to_owned(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![entry],
                    ..Default::default()
                }],
                hits_addend: 1,
            });
            let traceparent = format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01");
            call.metadata_mut().insert("traceparent", traceparent.parse().unwrap());
            client.should_rate_limit(call).await.unwrap().into_inner().overall_code
        })
    })
    .join()
    .unwrap();
    assert_eq!(code, 1, "OK (envoy's code 1)");
    stop(&mut serve);

    let (call, decision) = rls_call_and_decision(&received);
    let attrs = attributes(&call);
    for (key, value) in [
        ("rpc.system", string("grpc")),
        ("rpc.service", string("envoy.service.ratelimit.v3.RateLimitService")),
        ("rpc.method", string("ShouldRateLimit")),
        ("rpc.grpc.status_code", AnyValue::IntValue(0)),
    ] {
        assert_eq!(attrs.get(key), Some(&value), "{key} in {attrs:?}");
    }
    let attrs = attributes(&decision);
    for (key, value) in [
        ("rate_limit.policies", string(POLICY)),
        ("rate_limit.operation", string(&rule_operation(DOMAIN, "remote_address"))),
        ("rate_limit.outcome", string("allowed")),
        ("rate_limit.admitted", AnyValue::BoolValue(true)),
        ("rate_limit.cached", AnyValue::BoolValue(false)),
        (
            "rate_limit.subject",
            string(&pseudonym(&["descriptor", DOMAIN, "remote_address", ADDRESS])),
        ),
    ] {
        assert_eq!(attrs.get(key), Some(&value), "{key} in {attrs:?}");
    }
    let bytes = received.bytes();
    assert!(
        !bytes.windows(ADDRESS.len()).any(|window| window == ADDRESS.as_bytes()),
        "a descriptor value is in the exported bytes"
    );
}

/// The RLS call's server span under the caller's span, and its policy
/// set's decision span under it.
fn rls_call_and_decision(received: &Received) -> (Span, Span) {
    let trace = callers_trace(received);
    let call = server_span_under_the_caller(
        &trace,
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    let decision = trace
        .iter()
        .find(|span| span.name == "rate_limit.decision")
        .unwrap_or_else(|| panic!("no decision span in the trace: {trace:#?}"));
    assert_eq!(decision.parent_span_id, call.span_id);
    (call.clone(), decision.clone())
}

/// A call its `grpc-timeout` ends while the provider (a paused Redis)
/// holds it: the call span carries status 14 and `ERROR`, its decision
/// span the outcome `indeterminate` (not admitted), and the warning joins
/// the trace (docs/operations.md "Traces").
#[test]
fn an_envoy_call_its_deadline_ends_is_an_error_span_with_an_indeterminate_decision() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
    const DOMAIN: &str = "otlp-edge";

    let mut redis = RedisServer::start();
    let (endpoint, received) = receiver();
    let extra = format!(
        "{TRUSTED}[redis]\nenabled = true\nurls = [\"{}\"]\nkey-prefix = \"otlp:\"\n\n\
         [envoy-rls]\nlisten = \"127.0.0.1:0\"\n\n[[envoy-rls.rules]]\ndomain = \"{DOMAIN}\"\n\
         descriptor = [\"remote_address\"]\npolicies = \"{POLICY}\"\n",
        redis.url()
    );
    let mut serve = Serve::start(&config("redis", &endpoint, &extra), "info");
    let rls = serve.rls_address();
    redis.pause();
    let status = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let stream = tokio::net::TcpStream::connect(rls).await.unwrap();
            // The body leaves when sent, not held by Nagle's algorithm.
            stream.set_nodelay(true).unwrap();
            let (mut sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(connection);
            let entry = Entry { key: "remote_address".to_owned(), value: "10.77.0.10".to_owned() };
            let descriptors =
                vec![RateLimitDescriptor { entries: vec![entry], ..Default::default() }];
            let message =
                RateLimitRequest { domain: DOMAIN.to_owned(), descriptors, hits_addend: 1 }
                    .encode_to_vec();
            // The gRPC frame: not compressed, the length, the message.
            let mut frame = vec![0];
            frame.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
            frame.extend(message);
            let (mut body, channel) = http_body_util::Channel::<Bytes>::new(1);
            let call = axum::http::Request::post(format!(
                "http://{rls}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", "300m")
            .header("traceparent", format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01"))
            .body(channel)
            .unwrap();
            let answer = tokio::spawn(sender.send_request(call));
            // The call's deadline counts from its headers, the provider's
            // from its body: sent later, the body makes sure the call's
            // deadline ends the call while the provider still waits.
            tokio::time::sleep(Duration::from_millis(100)).await;
            body.send_data(Bytes::from(frame)).await.unwrap();
            drop(body);
            let (parts, body) = answer.await.unwrap().unwrap().into_parts();
            let trailers = body.collect().await.unwrap().trailers().cloned().unwrap_or_default();
            let status = parts.headers.get("grpc-status").or_else(|| trailers.get("grpc-status"));
            status.map(|value| value.to_str().unwrap().to_owned())
        })
    })
    .join()
    .unwrap();
    // 14 = UNAVAILABLE, Envoy's `failure_mode_deny` decides.
    assert_eq!(status.as_deref(), Some("14"));
    redis.resume();
    stop(&mut serve);

    let (call, decision) = rls_call_and_decision(&received);
    let attrs = attributes(&call);
    assert_eq!(attrs.get("rpc.grpc.status_code"), Some(&AnyValue::IntValue(14)), "{attrs:?}");
    let status = call.status.as_ref().map(|status| status.code);
    assert_eq!(status, Some(StatusCode::Error as i32), "{call:?}");
    let attrs = attributes(&decision);
    assert_eq!(attrs.get("rate_limit.outcome"), Some(&string("indeterminate")), "{attrs:?}");
    assert_eq!(attrs.get("rate_limit.admitted"), Some(&AnyValue::BoolValue(false)), "{attrs:?}");
    let span_id = hex::encode(&call.span_id);
    let logs = serve.logs();
    let warned = logs.iter().filter_map(|line| serde_json::from_str(line).ok()).any(
        |event: serde_json::Value| {
            event["trace_id"] == TRACE_ID
                && event["span_id"] == span_id.as_str()
                && event["fields"]["message"] == "envoy rls deadline passed; failed closed"
        },
    );
    assert!(warned, "no deadline warning in the call's span: {logs:#?}");
}

/// A rule's operation digest as `rule_operation` documents it: SHA-256 over
/// `envoy-rls`, the domain and each pattern entry, each length-framed;
/// the first 128 bits in hex.
fn rule_operation(domain: &str, entry: &str) -> String {
    let mut hash = Sha256::new();
    for part in ["envoy-rls", domain, entry] {
        hash.update(u32::try_from(part.len()).unwrap().to_be_bytes());
        hash.update(part.as_bytes());
    }
    hex::encode(&hash.finalize()[..16])
}
