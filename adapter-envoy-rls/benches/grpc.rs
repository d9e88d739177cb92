//! The Envoy RLS over gRPC under load: a tonic client at concurrency 64
//! against the same listener answering `OK` with the limiter off
//! (`disabled`), on the memory provider, and (with `REDIS=1`) on a
//! private `redis-server`, side by side, `ROUNDS` times alternating.
//! Prints one line per run: decisions/s, p50 and p99 in microseconds.
//!
//! `cargo bench -p adapter-envoy-rls --bench grpc` (`SECS=5 ROUNDS=3
//! CONCURRENCY=64 REDIS=1`).
//!
//! `ADDR=127.0.0.1:8081` runs only the client, once, against a server
//! already listening there (`ca-skeleton --config config/bench.toml`, whose
//! `bench` rule matches these requests), so that server and client can be
//! pinned to different CPUs: `scripts/bench-rls.sh` does that. Its line
//! also counts the calls answered `OK` and `OVER_LIMIT`. In that mode
//! `ADDR` may list several servers, comma-separated (the connections go to
//! them in turn), `SUBJECTS` sets how many `remote_address` values the
//! calls spread over (1,000), and `REQUESTS=N` sends exactly N calls
//! instead of running for `SECS`: `scripts/bench-limitador.sh` uses these.

#![allow(missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adapter_envoy_rls::{RlsEngine, RlsRule, RlsSettings, RlsSwitch, RuleLimit};
use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use adapter_web::VersionedPseudonymizer;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use secrecy::SecretSlice;
use shared_contract::{
    Algorithm, Clock, EdgeRateLimitPort, PolicyId, PolicySet, RateLimitPolicy,
    SubjectPseudonymizer, SystemClock,
};

const SUBJECTS: u64 = 1000;
const CONNECTIONS: usize = 4;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn policy() -> RateLimitPolicy {
    // Never denies within a run: the allowed path, as the HTTP rows use.
    let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit: 1_000_000_000,
        window: Duration::from_secs(60),
    });
    RateLimitPolicy::builder("bench", algorithm).build().unwrap()
}

fn engine(port: Option<Arc<dyn EdgeRateLimitPort>>) -> RlsEngine {
    let pseudonymizer: Arc<dyn SubjectPseudonymizer> =
        Arc::new(VersionedPseudonymizer::new([(1, SecretSlice::from(vec![9u8; 32]))], 1).unwrap());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let settings = RlsSettings { evaluation_budget: Duration::from_millis(750) };
    let Some(port) = port else { return RlsEngine::disabled(pseudonymizer, clock, settings) };
    let rule = RlsRule {
        domain: "edge".to_owned(),
        pattern: vec![("remote_address".to_owned(), None)],
        subject: None,
        limit: RuleLimit::Policies(PolicySet::single(PolicyId::new("bench").unwrap())),
        name: None,
        replaces: Vec::new(),
        allow_override: false,
        charge_always: false,
    };
    RlsEngine::new(port, pseudonymizer, clock, settings, &[rule]).unwrap()
}

fn request(subject: usize) -> RateLimitRequest {
    let entry = Entry {
        key: "remote_address".to_owned(),
        value: format!("10.0.{}.{}", subject / 250, subject % 250),
    };
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor { entries: vec![entry], ..Default::default() }],
        hits_addend: 0,
    }
}

/// When a load stops: after a time, or after a number of calls in all.
#[derive(Clone, Copy)]
enum Stop {
    After(Duration),
    Calls(u64),
}

/// One load's figures: decisions/s, p50 and p99 (µs), calls answered `OK`
/// and `OVER_LIMIT`.
struct Figures {
    rate: f64,
    p50: u64,
    p99: u64,
    ok: u64,
    over: u64,
}

/// decisions/s, p50 and p99 (µs) of one run.
async fn run(engine: RlsEngine, concurrency: usize, duration: Duration) -> (f64, u64, u64) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(adapter_envoy_rls::serve(listener, RlsSwitch::new(engine), async {
        let _ = stopped.await;
    }));
    let figures = load(&[addr.to_string()], concurrency, SUBJECTS, Stop::After(duration)).await;
    let _ = stop.send(());
    let _ = server.await;
    (figures.rate, figures.p50, figures.p99)
}

/// The client alone: `concurrency` callers over `CONNECTIONS` channels,
/// spread over `addrs` in turn.
async fn load(addrs: &[String], concurrency: usize, subjects: u64, stop: Stop) -> Figures {
    let mut channels = Vec::new();
    for connection in 0..CONNECTIONS.max(addrs.len()) {
        let addr = &addrs[connection % addrs.len()];
        channels.push(RateLimitServiceClient::connect(format!("http://{addr}")).await.unwrap());
    }
    // Calls handed out so far, for `Stop::Calls`: each caller takes the next.
    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let mut client = channels[worker % channels.len()].clone();
        let issued = Arc::clone(&issued);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 16);
            let (mut ok, mut over) = (0, 0);
            let mut subject = worker as u64;
            loop {
                let more = match stop {
                    Stop::After(duration) => started.elapsed() < duration,
                    Stop::Calls(calls) => issued.fetch_add(1, Ordering::Relaxed) < calls,
                };
                if !more {
                    break;
                }
                let asked = Instant::now();
                let answer = client.should_rate_limit(request((subject % subjects) as usize)).await;
                latencies.push(u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX));
                match answer.map(|answer| answer.into_inner().overall_code()) {
                    Ok(Code::Ok) => ok += 1,
                    Ok(Code::OverLimit) => over += 1,
                    other => panic!("{other:?}"),
                }
                subject += concurrency as u64;
            }
            (latencies, ok, over)
        }));
    }
    let mut latencies = Vec::new();
    let (mut ok, mut over) = (0, 0);
    for task in tasks {
        let (more, oks, overs) = task.await.unwrap();
        latencies.extend(more);
        ok += oks;
        over += overs;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Figures { rate: latencies.len() as f64 / elapsed, p50: at(0.50), p99: at(0.99), ok, over }
}

fn main() {
    let secs = env("SECS", 5);
    let rounds = env("ROUNDS", 3);
    let concurrency = usize::try_from(env("CONCURRENCY", 64)).unwrap();
    let duration = Duration::from_secs(secs);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    if let Ok(addr) = std::env::var("ADDR") {
        let addrs: Vec<String> = addr.split(',').map(str::to_owned).collect();
        let stop = match env("REQUESTS", 0) {
            0 => Stop::After(duration),
            calls => Stop::Calls(calls),
        };
        let figures = runtime.block_on(load(&addrs, concurrency, env("SUBJECTS", SUBJECTS), stop));
        let Figures { rate, p50, p99, ok, over } = figures;
        println!(
            "{addr} c={concurrency}: {rate:.0}/s p50 {p50} us p99 {p99} us ok {ok} over {over}"
        );
        return;
    }
    let redis = (env("REDIS", 0) == 1).then(redis_fixture::RedisServer::start);
    runtime.block_on(async {
        let mut ratios = Vec::new();
        for round in 1..=rounds {
            let disabled = run(engine(None), concurrency, duration).await;
            let memory: Arc<dyn EdgeRateLimitPort> =
                Arc::new(MemoryEdgeRateLimitAdapter::new([policy()], Arc::new(SystemClock)).unwrap());
            let limited = run(engine(Some(memory)), concurrency, duration).await;
            let ratio = limited.0 / disabled.0;
            ratios.push(ratio);
            println!(
                "round {round} c={concurrency}: disabled {:.0}/s p50 {} us p99 {} us | memory {:.0}/s p50 {} us p99 {} us | memory/disabled {ratio:.3}",
                disabled.0, disabled.1, disabled.2, limited.0, limited.1, limited.2
            );
            if let Some(server) = &redis {
                let settings = RedisSettings { urls: vec![server.url()], ..RedisSettings::default() };
                let port: Arc<dyn EdgeRateLimitPort> = Arc::new(
                    RedisEdgeRateLimitAdapter::new(settings, [policy()], Arc::new(SystemClock)).unwrap(),
                );
                let redis = run(engine(Some(port)), concurrency, duration).await;
                println!(
                    "round {round} c={concurrency}: redis {:.0}/s p50 {} us p99 {} us",
                    redis.0, redis.1, redis.2
                );
            }
        }
        ratios.sort_by(f64::total_cmp);
        println!("median memory/disabled over {rounds} rounds: {:.3}", ratios[ratios.len() / 2]);
    });
}
