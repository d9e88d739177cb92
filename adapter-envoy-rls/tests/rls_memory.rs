//! The RLS through a real tonic client over TCP, on the memory provider:
//! every scenario, and what only a scripted provider can show (deadline,
//! failures, reload, health).

mod support;

use std::sync::Arc;
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use async_trait::async_trait;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use shared_contract::{
    BudgetFailure, BudgetKey, BudgetState, Clock, EdgeRateLimitPort, Evaluation, Lease,
    ManualClock, PolicyId, RateLimitFailure, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    ReleaseOutcome, Releasing, UnavailableCategory,
};
use support::scenarios::{self, Counting, PortFactory};
use support::*;

fn memory(policies: Vec<RateLimitPolicy>, clock: ManualClock) -> Arc<dyn EdgeRateLimitPort> {
    Arc::new(MemoryEdgeRateLimitAdapter::new(policies, Arc::new(clock)).unwrap())
}

const MEMORY: &PortFactory = &memory;

#[tokio::test]
async fn every_scenario_on_the_memory_provider() {
    scenarios::all(MEMORY).await;
}

/// Answers every evaluation with `outcome` and is ready or not.
#[derive(Debug)]
struct Failing {
    inner: Arc<dyn EdgeRateLimitPort>,
    outcome: RateLimitOutcome,
    ready: bool,
}

#[async_trait]
impl EdgeRateLimitPort for Failing {
    fn evaluate(&self, _: RateLimitRequest) -> Evaluation {
        Evaluation::ready(self.outcome.clone())
    }
    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.inner.policy(id)
    }
    async fn is_ready(&self) -> bool {
        self.ready
    }
    async fn inspect(&self, _: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        Err(BudgetFailure::Unavailable)
    }
    async fn reset(&self, _: &BudgetKey) -> Result<(), BudgetFailure> {
        Err(BudgetFailure::Unavailable)
    }
    fn release(&self, _: &Lease) -> Releasing {
        Releasing::ready(ReleaseOutcome::Unavailable {
            category: UnavailableCategory::UnavailableBeforeSend,
        })
    }
}

async fn failing(outcome: RateLimitOutcome, ready: bool) -> Rls {
    let clock = scenarios::clock();
    let inner = memory(scenarios::policies(), clock.clone());
    let port = Arc::new(Failing { inner, outcome, ready });
    Rls::start(engine(port, Arc::new(clock), &scenarios::rules())).await
}

fn ip(
    address: &str,
) -> envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    descriptor(&[("remote_address", address)], None)
}

#[tokio::test]
async fn failures_are_unavailable_or_failed_precondition_never_an_answer() {
    use shared_contract::IncompatibleCategory;
    let retry_after = Duration::from_secs(1);
    for (outcome, code, category) in [
        (
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::UnavailableBeforeSend,
                retry_after,
            }),
            tonic::Code::Unavailable,
            "unavailable-before-send",
        ),
        (
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after,
            }),
            tonic::Code::Unavailable,
            "clock-unsafe",
        ),
        (
            Err(RateLimitFailure::Indeterminate { retry_after }),
            tonic::Code::Unavailable,
            "indeterminate",
        ),
        (
            Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::StateIncompatible,
            }),
            tonic::Code::FailedPrecondition,
            "state-incompatible",
        ),
    ] {
        let mut rls = failing(outcome, true).await;
        let status = rls.ask(request("edge", vec![ip("10.1.0.1")], 0)).await.unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(category), "{status:?}");
        // A look fails closed too.
        let look = descriptor(&[("remote_address", "10.1.0.1")], Some(0));
        let status = rls.ask(request("edge", vec![look], 0)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
}

#[tokio::test]
async fn a_policy_the_provider_does_not_hold_fails_the_precondition() {
    let clock = scenarios::clock();
    let port = memory(scenarios::policies(), clock.clone());
    let rules = [rule("edge", &["remote_address"], None, &["missing"])];
    let mut rls = Rls::start(engine(port, Arc::new(clock), &rules)).await;
    let status = rls.ask(request("edge", vec![ip("10.1.0.2")], 0)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("unknown-policy"), "{status:?}");
}

#[tokio::test]
async fn health_follows_the_providers_readiness() {
    let retry_after = Duration::from_secs(1);
    let down = Err(RateLimitFailure::Unavailable {
        category: UnavailableCategory::UnavailableBeforeSend,
        retry_after,
    });
    let rls = failing(down.clone(), false).await;
    scenarios::health_is_serving_while_the_provider_is_ready(&rls, false).await;
    let rls = failing(down, true).await;
    scenarios::health_is_serving_while_the_provider_is_ready(&rls, true).await;
}

#[tokio::test]
async fn the_deadline_is_the_budget_or_the_calls_timeout_whichever_is_shorter() {
    let clock = ManualClock::new(1_700_000_000_000);
    let port = Counting::new(memory(scenarios::policies(), clock.clone()));
    let mut rls =
        Rls::start(engine(port.clone(), Arc::new(clock.clone()), &scenarios::rules())).await;
    let now = clock.monotonic();
    rls.ok(request("edge", vec![ip("10.1.0.3")], 0)).await;
    assert_eq!(port.deadline.lock().unwrap().unwrap() - now, BUDGET);
    let mut timed = tonic::Request::new(request("edge", vec![ip("10.1.0.3")], 0));
    timed.set_timeout(Duration::from_millis(250));
    rls.client.should_rate_limit(timed).await.unwrap();
    assert_eq!(port.deadline.lock().unwrap().unwrap() - now, Duration::from_millis(250));
    let mut long = tonic::Request::new(request("edge", vec![ip("10.1.0.4")], 0));
    long.set_timeout(Duration::from_secs(30));
    rls.client.should_rate_limit(long).await.unwrap();
    assert_eq!(port.deadline.lock().unwrap().unwrap() - now, BUDGET);
}

/// Never answers an evaluation: only a deadline ends the call.
#[derive(Debug)]
struct Hanging(Arc<dyn EdgeRateLimitPort>);

#[async_trait]
impl EdgeRateLimitPort for Hanging {
    fn evaluate(&self, _: RateLimitRequest) -> Evaluation {
        Evaluation::pending(std::future::pending())
    }
    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.0.policy(id)
    }
    async fn is_ready(&self) -> bool {
        true
    }
    async fn inspect(&self, _: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        std::future::pending().await
    }
    async fn reset(&self, _: &BudgetKey) -> Result<(), BudgetFailure> {
        std::future::pending().await
    }
    fn release(&self, _: &Lease) -> Releasing {
        Releasing::pending(std::future::pending())
    }
}

/// A call of `request` over HTTP/2 without tonic's client, with the
/// `grpc-timeout` header `timeout`: tonic's client would end the call on
/// its own timer, which starts before the server's. The server's
/// `grpc-status` and `grpc-message`.
async fn call_with_timeout_header(
    addr: std::net::SocketAddr,
    request: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
    timeout: &str,
) -> (String, String) {
    let message = prost::Message::encode_to_vec(&request);
    let (status, message, _) = call_raw(addr, message, Some(timeout)).await;
    (status, message)
}

/// A call whose message is `message`, bytes as given, with a
/// `grpc-timeout` header if any: `grpc-status`, `grpc-message` and the
/// answer's message bytes.
async fn call_raw(
    addr: std::net::SocketAddr,
    message: Vec<u8>,
    timeout: Option<&str>,
) -> (String, String, Vec<u8>) {
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The body goes out at once, not held by Nagle's algorithm until the
    // server's delayed ACK of the headers (some 40 ms, past a short
    // deadline), as Envoy's own upstream connections do.
    stream.set_nodelay(true).unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    // The gRPC frame: not compressed, the length, the message.
    let mut frame = vec![0];
    frame.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend(message);
    let mut call = http::Request::post(format!(
        "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    if let Some(timeout) = timeout {
        call = call.header("grpc-timeout", timeout);
    }
    let call = call.body(http_body_util::Full::new(std::io::Cursor::new(frame))).unwrap();
    let response = sender.send_request(call).await.unwrap();
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let answer = collected.to_bytes().get(5..).map(<[u8]>::to_vec).unwrap_or_default();
    let read = |name: &str| {
        let value = parts.headers.get(name).or_else(|| trailers.get(name));
        value.map(|value| value.to_str().unwrap().to_owned()).unwrap_or_default()
    };
    (read("grpc-status"), read("grpc-message"), answer)
}

/// Envoy copies request header bytes into descriptor values as they come,
/// and a proto3 string that is not UTF-8 would fail the whole call, which
/// Envoy's default lets through (found from outside). Such a value is
/// limited as any other, its bytes that are not UTF-8 kept apart
/// (docs/envoy-rls.md, "What the caller controls"): per-ip's 2 a minute.
#[tokio::test]
async fn a_descriptor_value_that_is_not_utf8_is_limited_as_any_other() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    let clock = scenarios::clock();
    let port = memory(scenarios::policies(), clock.clone());
    let rls = Rls::start(engine(port, Arc::new(clock), &scenarios::rules())).await;
    // Encoded with a placeholder of the same length, then its bytes swapped.
    let with = |bytes: [u8; 2]| {
        let message = prost::Message::encode_to_vec(&request("edge", vec![ip("10.3.0.~~")], 0));
        let at = message.windows(2).position(|w| w == b"~~").unwrap();
        let mut message = message;
        message[at..at + 2].copy_from_slice(&bytes);
        message
    };
    let mut codes = Vec::new();
    for bytes in [[0xff, 0xfe], [0xff, 0xfe], [0xff, 0xfe], [0xfe, 0xff]] {
        let (status, message, answer) = call_raw(rls.addr, with(bytes), None).await;
        assert_eq!(status, "0", "{message}");
        let answer: RateLimitResponse = prost::Message::decode(answer.as_slice()).unwrap();
        codes.push(overall(&answer));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit, Code::Ok]);
}

#[tokio::test]
async fn a_grpc_timeout_that_ends_mid_call_answers_unavailable_with_the_category() {
    // The test's runtime has one thread: the server's tasks count into
    // this recorder too.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let clock = scenarios::clock();
    let port = Arc::new(Hanging(memory(scenarios::policies(), clock.clone())));
    let look = descriptor(&[("remote_address", "10.1.0.7")], Some(0));
    let rls = Rls::start(engine(port, Arc::new(clock), &scenarios::rules())).await;
    // Long enough for each call to reach the provider before it ends.
    for (descriptors, timeout) in [(vec![ip("10.1.0.7")], "20m"), (vec![look], "20m")] {
        let (status, message) =
            call_with_timeout_header(rls.addr, request("edge", descriptors, 0), timeout).await;
        // 14 = UNAVAILABLE; tonic's own timer would answer 1 = CANCELLED.
        assert_eq!((status.as_str(), message.contains("indeterminate")), ("14", true), "{message}");
    }
    // Each ended call is a decision of its category (the provider may
    // have charged): the evaluation and the look, both of per-ip.
    let text = metrics.render();
    let sample = |prefix: &str, labels: &[&str]| {
        text.lines()
            .filter(|line| line.starts_with(prefix))
            .filter(|line| labels.iter().all(|label| line.contains(label)))
            .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    let indeterminate = [
        "policy=\"per-ip\"",
        "outcome=\"indeterminate\"",
        "cached=\"false\"",
        "front=\"envoy-rls\"",
    ];
    assert_eq!(sample("ca_skeleton_rate_limit_decisions_total{", &indeterminate), 2.0, "{text}");
    // The evaluation's time is observed; a look is no evaluation.
    let evaluated = ["policy=\"per-ip\"", "front=\"envoy-rls\""];
    assert_eq!(
        sample("ca_skeleton_rate_limit_evaluation_seconds_count{", &evaluated),
        1.0,
        "{text}"
    );
}

#[tokio::test]
async fn a_reload_puts_new_rules_in_force_over_the_same_counters() {
    let clock = scenarios::clock();
    let port = memory(scenarios::policies(), clock.clone());
    let mut rls =
        Rls::start(engine(port.clone(), Arc::new(clock.clone()), &scenarios::rules())).await;
    let path = || {
        request(
            "edge",
            vec![descriptor(&[("remote_address", "10.1.0.5"), ("path", "/a")], None)],
            0,
        )
    };
    assert_eq!(summary(&rls.ok(path()).await), [(Code::Ok, 0, None)]);
    rls.ok(request("edge", vec![ip("10.1.0.5")], 0)).await;
    // The new table limits the (remote_address, path) pattern by the IP
    // alone, under per-ip: it shares the counter the old rule charged.
    let mut rules = scenarios::rules();
    rules.push(rule("edge", &["remote_address", "path"], Some(&["remote_address"]), &["per-ip"]));
    rls.switch.replace(engine(port, Arc::new(clock), &rules));
    assert_eq!(summary(&rls.ok(path()).await), [(Code::Ok, 0, Some("per-ip".to_owned()))]);
    assert_eq!(overall(&rls.ok(path()).await), Code::OverLimit);
}

#[tokio::test]
async fn the_listener_drains_and_stops_on_shutdown() {
    let clock = scenarios::clock();
    let port = memory(scenarios::policies(), clock.clone());
    let mut rls = Rls::start(engine(port, Arc::new(clock), &scenarios::rules())).await;
    rls.ok(request("edge", vec![ip("10.1.0.6")], 0)).await;
    // An open health watch hears NOT_SERVING, then ends: it does not hold
    // the drain open.
    use tonic_health::pb::health_check_response::ServingStatus;
    let watching = tonic_health::pb::HealthCheckRequest { service: String::new() };
    let mut watch = rls.health().await.watch(watching).await.unwrap().into_inner();
    let status = |message: Option<tonic_health::pb::HealthCheckResponse>| {
        ServingStatus::try_from(message.expect("a status").status).unwrap()
    };
    assert_eq!(status(watch.message().await.unwrap()), ServingStatus::Serving);
    // An unknown service: SERVICE_UNKNOWN, and the stream stays open (the
    // gRPC health protocol), where Check answers NOT_FOUND.
    let mut health = rls.health().await;
    let unknown = tonic_health::pb::HealthCheckRequest { service: "other".to_owned() };
    let mut unknown_watch = health.watch(unknown.clone()).await.unwrap().into_inner();
    assert_eq!(status(unknown_watch.message().await.unwrap()), ServingStatus::ServiceUnknown);
    let checked = health.check(unknown).await.unwrap_err();
    assert_eq!(checked.code(), tonic::Code::NotFound);
    // The Check's answer came after anything the watch was sent on the
    // same connection: no end of the stream had come.
    use futures::FutureExt;
    assert!(unknown_watch.message().now_or_never().is_none(), "the watch ended");
    rls.stop();
    assert_eq!(status(watch.message().await.unwrap()), ServingStatus::NotServing);
    assert!(watch.message().await.unwrap().is_none(), "the watch ends");
    assert!(unknown_watch.message().await.unwrap().is_none(), "the unknown watch ends");
    let served = (&mut rls.served).await.unwrap();
    assert_eq!(served, Ok(()));
    assert!(tokio::net::TcpStream::connect(rls.addr).await.is_err(), "still accepting");
}

#[test]
fn grpc_timeouts_read_every_unit_and_refuse_the_malformed() {
    use adapter_envoy_rls::grpc_timeout;
    use tonic::metadata::MetadataMap;
    let read = |value: &str| {
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-timeout", value.parse().unwrap());
        grpc_timeout(&metadata)
    };
    assert_eq!(read("2H"), Some(Duration::from_secs(7200)));
    assert_eq!(read("3M"), Some(Duration::from_secs(180)));
    assert_eq!(read("4S"), Some(Duration::from_secs(4)));
    assert_eq!(read("250m"), Some(Duration::from_millis(250)));
    assert_eq!(read("7u"), Some(Duration::from_micros(7)));
    assert_eq!(read("9n"), Some(Duration::from_nanos(9)));
    // As tonic's server reads it: `u64::from_str` takes a leading `+`.
    assert_eq!(read("+5m"), Some(Duration::from_millis(5)));
    for bad in ["", "m", "123456789m", "1x", "-1S", "1.5S"] {
        assert_eq!(read(bad), None, "{bad:?}");
    }
    assert_eq!(grpc_timeout(&MetadataMap::new()), None);
}

/// A shadow policy whose `maximum-cost` is below the cost is left out of the
/// set (it could never admit it; counted `cost-exceeds-maximum`), and the
/// enforced policies beside it decide: the descriptor is neither failed nor
/// refused because of a policy that never denies.
#[tokio::test]
async fn a_shadow_policy_that_cannot_take_the_cost_does_not_decide() {
    let clock = scenarios::clock();
    let port = memory(scenarios::policies(), clock.clone());
    let mut rules = scenarios::rules();
    rules.push(rule(
        "edge",
        &["generic_key=mixed", "remote_address"],
        Some(&["remote_address"]),
        &["bulk", "trial"],
    ));
    let mut rls = Rls::start(engine(port, Arc::new(clock), &rules)).await;
    let mixed =
        |hits| descriptor(&[("generic_key", "mixed"), ("remote_address", "10.2.0.1")], Some(hits));
    let answer = rls.ok(request("edge", vec![mixed(5)], 0)).await;
    assert_eq!(overall(&answer), Code::Ok);
    assert_eq!(summary(&answer), [(Code::Ok, 5, Some("bulk".to_owned()))]);
    // bulk's own maximum-cost still refuses, charging nothing.
    let refused = rls.ok(request("edge", vec![mixed(11)], 0)).await;
    assert_eq!(summary(&refused), [(Code::OverLimit, 0, Some("bulk".to_owned()))]);
    assert_eq!(summary(&rls.ok(request("edge", vec![mixed(5)], 0)).await)[0].1, 0);
}

/// A provider that answers `cost-exceeds-maximum` (its policy differs from
/// the one the rules were prepared with) refuses the descriptor as the
/// rules' own check does: `OVER_LIMIT`, never an error status. Which policy
/// refused it the rules cannot tell, so the status names none.
#[tokio::test]
async fn a_providers_cost_refusal_is_over_limit() {
    use shared_contract::IncompatibleCategory;
    let category = IncompatibleCategory::CostExceedsMaximum;
    let mut rls = failing(Err(RateLimitFailure::Incompatible { category }), true).await;
    let answer = rls.ok(request("edge", vec![ip("10.1.0.2")], 0)).await;
    assert_eq!(overall(&answer), Code::OverLimit);
    assert_eq!(summary(&answer), [(Code::OverLimit, 0, None)]);
    assert_eq!(header(&answer, "retry-after"), None);
}

/// A set the provider does not admit (here the in-process store full of
/// live keys: one shard of two) is `OVER_LIMIT` with the wait, never an
/// error status Envoy's default would let through (docs/envoy-rls.md,
/// "What the caller controls"); a value already counted still is.
#[tokio::test]
async fn a_set_the_provider_does_not_admit_is_over_limit_with_the_wait() {
    use adapter_memory::MemoryStore;
    let clock = scenarios::clock();
    let store = MemoryStore::with_shards_and_max_keys(1, std::num::NonZeroUsize::new(2).unwrap());
    let adapter = MemoryEdgeRateLimitAdapter::with_store(
        store,
        scenarios::policies(),
        Arc::new(clock.clone()),
    )
    .unwrap()
    .with_failure_retry_after(Duration::from_secs(3));
    let port: Arc<dyn EdgeRateLimitPort> = Arc::new(adapter);
    let mut rls = Rls::start(engine(port, Arc::new(clock), &scenarios::rules())).await;
    for address in ["10.2.0.1", "10.2.0.2"] {
        let answer = rls.ok(request("edge", vec![ip(address)], 0)).await;
        assert_eq!(overall(&answer), Code::Ok, "{address}");
    }
    let full = rls.ok(request("edge", vec![ip("10.2.0.3")], 0)).await;
    assert_eq!(overall(&full), Code::OverLimit);
    assert_eq!(summary(&full), [(Code::OverLimit, 0, Some("per-ip".to_owned()))]);
    let reset = full.statuses[0].duration_until_reset.unwrap();
    assert_eq!((reset.seconds, reset.nanos), (3, 0));
    assert_eq!(header(&full, "retry-after"), Some("3"));
    let known = rls.ok(request("edge", vec![ip("10.2.0.1")], 0)).await;
    assert_eq!(overall(&known), Code::Ok, "a counted value is still answered");
}
