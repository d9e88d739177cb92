//! The edge's own per-request work, piece by piece, with the memory
//! provider behind it: the pseudonym (HMAC-SHA-256 of kind and identity),
//! and a whole `TransportBridge::evaluate` of a request with an API key
//! (subject resolution, pseudonym, request, the port, telemetry), for a set
//! of one policy and for a set of two. Policies are far from their limits,
//! so every decision is an allowed one, as most traffic is.
//!
//! The port's future never waits, so it is polled once with a no-op waker
//! instead of a runtime.

use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::{EdgeSettings, SubjectKind, TransportBridge, VersionedPseudonymizer};
use axum::extract::ConnectInfo;
use criterion::{Criterion, criterion_group, criterion_main};
use http::request::Parts;
use secrecy::SecretSlice;
use shared_contract::{Algorithm, Clock, PolicyId, PolicySet, RateLimitPolicy, SystemClock};

const KEYS: usize = 10_000;

fn pseudonymizer() -> Arc<VersionedPseudonymizer> {
    let key = SecretSlice::from(b"bench-pseudonymizer-key-0123456789abcdef".to_vec());
    Arc::new(VersionedPseudonymizer::new([(1, key)], 1).expect("a valid key"))
}

fn policy(id: &str) -> RateLimitPolicy {
    let algorithm =
        Algorithm::FixedWindow { limit: 1_000_000_000, window: Duration::from_secs(3600) };
    RateLimitPolicy::builder(id, algorithm).build().expect("a valid policy")
}

fn bridge(ids: &[&str]) -> TransportBridge {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let policies: Vec<_> = ids.iter().map(|id| policy(id)).collect();
    let port = MemoryEdgeRateLimitAdapter::new(policies, Arc::clone(&clock)).expect("policies");
    let set =
        PolicySet::new(ids.iter().map(|id| PolicyId::new(*id).expect("an id"))).expect("a set");
    let settings = EdgeSettings { default_policies: set, ..EdgeSettings::default() };
    TransportBridge::new(Arc::new(port), pseudonymizer(), clock, settings)
}

/// Requests of `KEYS` API keys from one peer, as the layer hands them over.
fn requests() -> Vec<Parts> {
    let peer: SocketAddr = "198.51.100.7:40000".parse().expect("an address");
    (0..KEYS)
        .map(|n| {
            let request = http::Request::get("/api/hello")
                .header("x-api-key", format!("bench-key-{n:05}"))
                .extension(ConnectInfo(peer))
                .body(())
                .expect("a request");
            request.into_parts().0
        })
        .collect()
}

fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the memory provider never waits"),
    }
}

fn edge(c: &mut Criterion) {
    let pseudonymizer = pseudonymizer();
    let identities: Vec<String> = (0..KEYS).map(|n| format!("bench-key-{n:05}")).collect();
    let mut next = 0;
    c.bench_function("pseudonym", |b| {
        b.iter(|| {
            next = (next + 1) % KEYS;
            black_box(pseudonymizer.pseudonymize(SubjectKind::ApiKey, &identities[next]))
        });
    });

    let requests = requests();
    for (name, ids) in
        [("bridge-one-policy", &["api"][..]), ("bridge-two-policies", &["burst", "daily"][..])]
    {
        let bridge = bridge(ids);
        let mut next = 0;
        c.bench_function(name, |b| {
            b.iter(|| {
                next = (next + 1) % KEYS;
                let evaluation = now(bridge.evaluate(&requests[next])).expect("no rejection");
                black_box(evaluation.admits())
            });
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    targets = edge
}
criterion_main!(benches);
