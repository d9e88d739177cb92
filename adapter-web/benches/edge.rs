//! The edge's own per-request work, piece by piece, with the memory
//! provider behind it: the pseudonym (HMAC-SHA-256 of kind and identity),
//! a fresh evaluation id, the digest of an operation, one policy's metric
//! updates (as `metrics` macros with their label lists and as registered
//! handles), a whole `TransportBridge::evaluate` of a request with an API
//! key (subject resolution, pseudonym, request, the port, telemetry) for a
//! set of one policy and of two, and the whole layer around a handler that
//! answers at once (the bridge, the decision headers, the response future),
//! beside the same stack with the layer disabled, and with an in-flight
//! (concurrency) policy whose lease each response gives back. Policies are far from
//! their limits, so every decision is an allowed one, as most traffic is.
//!
//! The cases run twice: first with no metrics recorder (the `metrics` calls
//! are then no-ops), then, after `metrics-exporter-prometheus` is installed
//! as the global recorder as `ca-skeleton serve` does, with `/prometheus`
//! appended to their names.
//!
//! The memory provider answers at once, so the bridge's and the layer's
//! futures are ready at their first poll: polled once with a no-op waker
//! instead of a runtime.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::{
    EdgeSettings, RateLimitLayer, SubjectKind, TransportBridge, VersionedPseudonymizer,
    operation_digest,
};
use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{Criterion, criterion_group, criterion_main};
use http::request::Parts;
use http::{Request, Response};
use metrics::SharedString;
use secrecy::SecretSlice;
use shared_contract::{
    Algorithm, Clock, EvaluationId, PolicyId, PolicySet, RateLimitPolicy, SystemClock,
};
use tower::{Layer, Service};

const KEYS: usize = 10_000;

fn pseudonymizer() -> Arc<VersionedPseudonymizer> {
    let key = SecretSlice::from(b"bench-pseudonymizer-key-0123456789abcdef".to_vec());
    Arc::new(VersionedPseudonymizer::new([(1, key)], 1).expect("a valid key"))
}

fn policy(id: &str) -> RateLimitPolicy {
    let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit: 1_000_000_000,
        window: Duration::from_secs(3600),
    });
    RateLimitPolicy::builder(id, algorithm).build().expect("a valid policy")
}

fn bridge(ids: &[&str]) -> TransportBridge {
    bridge_of(ids.iter().map(|id| policy(id)).collect())
}

/// An in-flight limit far above what one caller holds: every request takes
/// a lease, and gives it back when its response is dropped.
fn in_flight(id: &str) -> RateLimitPolicy {
    let algorithm = Algorithm::Concurrency(shared_contract::Concurrency {
        max_in_flight: 10_000,
        lease_ttl: Duration::from_secs(60),
        retry_after: Duration::from_secs(1),
    });
    RateLimitPolicy::builder(id, algorithm).build().expect("a valid policy")
}

fn bridge_of(policies: Vec<RateLimitPolicy>) -> TransportBridge {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let ids: Vec<PolicyId> = policies.iter().map(|policy| policy.id().clone()).collect();
    let port = MemoryEdgeRateLimitAdapter::new(policies, Arc::clone(&clock)).expect("policies");
    let set = PolicySet::new(ids).expect("a set");
    // One subject per key, as behind a layer that verified them.
    let api_key_header = Some(http::HeaderName::from_static("x-api-key"));
    let settings =
        EdgeSettings { default_policies: set, api_key_header, ..EdgeSettings::default() };
    TransportBridge::new(Arc::new(port), pseudonymizer(), clock, settings)
}

fn peer() -> ConnectInfo<SocketAddr> {
    ConnectInfo("198.51.100.7:40000".parse().expect("an address"))
}

fn request(n: usize) -> Request<()> {
    http::Request::get("/api/hello")
        .header("x-api-key", format!("bench-key-{n:05}"))
        .extension(peer())
        .body(())
        .expect("a request")
}

/// Requests of `KEYS` API keys from one peer, as the layer hands them over.
fn requests() -> Vec<Parts> {
    (0..KEYS).map(|n| request(n).into_parts().0).collect()
}

fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the memory provider never waits"),
    }
}

/// A handler that answers at once, so the layer's own work is what remains.
#[derive(Debug, Clone, Copy)]
struct Answer;

impl Service<Request<Body>> for Answer {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        ready(Ok(Response::new(Body::empty())))
    }
}

/// Each case of one pass; `suffix` names the recorder in place.
fn pass(c: &mut Criterion, suffix: &str) {
    let pseudonymizer = pseudonymizer();
    let identities: Vec<String> = (0..KEYS).map(|n| format!("bench-key-{n:05}")).collect();
    let mut next = 0;
    c.bench_function(&format!("pseudonym{suffix}"), |b| {
        b.iter(|| {
            next = (next + 1) % KEYS;
            black_box(pseudonymizer.pseudonymize(SubjectKind::ApiKey, &identities[next]))
        });
    });
    c.bench_function(&format!("evaluation-id{suffix}"), |b| {
        b.iter(|| black_box(EvaluationId::random()));
    });
    c.bench_function(&format!("operation-digest{suffix}"), |b| {
        b.iter(|| black_box(operation_digest(black_box("GET /api/hello"))));
    });

    // One policy's metric updates per request, as the bridge made them
    // before handles: a counter and a histogram looked up by name and labels.
    let label = SharedString::from(Arc::<str>::from("api"));
    c.bench_function(&format!("metrics-macros{suffix}"), |b| {
        b.iter(|| {
            metrics::counter!(
                adapter_web::DECISIONS_TOTAL,
                "policy" => label.clone(),
                "algorithm" => "fixed-window",
                "outcome" => "allowed",
                "mode" => "enforce",
            )
            .increment(1);
            metrics::histogram!(adapter_web::EVALUATION_SECONDS, "policy" => label.clone(), "algorithm" => "fixed-window")
                .record(black_box(0.000_001));
        });
    });
    let counter = metrics::counter!(
        adapter_web::DECISIONS_TOTAL,
        "policy" => label.clone(),
        "algorithm" => "fixed-window",
        "outcome" => "allowed",
        "mode" => "enforce",
    );
    let histogram = metrics::histogram!(adapter_web::EVALUATION_SECONDS, "policy" => label.clone(), "algorithm" => "fixed-window");
    c.bench_function(&format!("metrics-handles{suffix}"), |b| {
        b.iter(|| {
            counter.increment(1);
            histogram.record(black_box(0.000_001));
        });
    });

    let requests = requests();
    for (name, ids) in
        [("bridge-one-policy", &["api"][..]), ("bridge-two-policies", &["burst", "daily"][..])]
    {
        let bridge = bridge(ids);
        let mut next = 0;
        c.bench_function(&format!("{name}{suffix}"), |b| {
            b.iter(|| {
                next = (next + 1) % KEYS;
                let evaluation = now(bridge.evaluate(&requests[next])).expect("no rejection");
                black_box(evaluation.admits())
            });
        });
    }

    // The whole layer: each iteration builds its request (the same work in
    // both cases), so `layer-one-policy` minus `layer-disabled` is the
    // limiter's cost per request. `layer-in-flight` takes a lease and,
    // when the response is dropped, gives it back (the memory provider's
    // release runs at once, inside the runtime entered here).
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    let _entered = runtime.enter();
    for (name, layer) in [
        ("layer-disabled", RateLimitLayer::disabled()),
        ("layer-one-policy", RateLimitLayer::new(Arc::new(bridge(&["api"])))),
        ("layer-in-flight", RateLimitLayer::new(Arc::new(bridge_of(vec![in_flight("work")])))),
    ] {
        let mut service = layer.layer(Answer);
        let mut next = 0;
        c.bench_function(&format!("{name}{suffix}"), |b| {
            b.iter(|| {
                next = (next + 1) % KEYS;
                let (parts, ()) = request(next).into_parts();
                let response = now(service.call(Request::from_parts(parts, Body::empty())));
                let response = response.expect("infallible");
                assert!(response.status().is_success(), "every request is admitted");
                black_box(response.headers().len())
            });
        });
    }
}

fn edge(c: &mut Criterion) {
    pass(c, "");
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the first and only recorder");
    pass(c, "/prometheus");
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = edge
}
criterion_main!(benches);
