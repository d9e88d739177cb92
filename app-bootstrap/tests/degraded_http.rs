//! Degraded mode (issue 20, part 3) through two real `ca-skeleton serve`
//! binaries sharing one redis-server, which is killed (SIGKILL) under load
//! and restarted on the same port, twice. With
//! `[capabilities.rate-limit.degraded] enabled = true, instances = 2`:
//! - every response is a 200 or a 429, never a 503, no connection dropped;
//! - while Redis is away each instance admits exactly ceil(limit / 2) of
//!   one subject's requests in the window (the fleet: the limit), refusing
//!   the rest with `Retry-After` and the `RateLimit` headers;
//! - each instance answers from Redis again before a deadline of 2 s after
//!   the restart (polled), logs one line entering and one leaving per
//!   outage (leaving once Redis has answered with no failure for
//!   `LEAVE_AFTER`, polled), and counts its degraded decisions under
//!   `outcome="degraded"`;
//! - the local counts are kept on leaving: in the second outage, in the
//!   same window, the subject whose share the first outage spent gets none.
//!
//! With degraded mode off, `redis_faults_http` is the fail-closed lane.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use app_bootstrap::degraded::LEAVE_AFTER;
use redis_fixture::RedisServer;
use support::Serve;

const KEY: &str = "degraded-http-pseudonymizer-key-0123456789abcdef";
/// The policy's limit, and how many instances share it while Redis is away.
const LIMIT: u64 = 40;
const INSTANCES: u64 = 2;
/// ceil(LIMIT / INSTANCES): what one instance admits per window alone.
const SHARE: u64 = LIMIT.div_ceil(INSTANCES);
/// Requests the probe sends to each instance per outage: more than a share.
const PROBES: u64 = 30;
/// The issue's bound on getting back on Redis after its restart; polled.
const BACK_ON_REDIS: Duration = Duration::from_secs(2);
const LOAD_CLIENTS_PER_INSTANCE: usize = 2;
/// Requests per load subject: above a share, below the limit, so every
/// refusal the load meets is the local limiter's.
const PER_LOAD_KEY: usize = 30;
/// How long the load runs on the local limiters before the probes.
const OUTAGE: Duration = Duration::from_millis(1500);

/// An instance of the fleet against `redis`. The window is ten years long,
/// so no window boundary passes during a run (the next one is 2030-01-01)
/// and "per window" is the whole test.
fn instance(redis: &RedisServer) -> Serve {
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "redis"
default-policy = "api"

[capabilities.rate-limit.degraded]
enabled = true
instances = {INSTANCES}

[capabilities.rate-limit.policies.api]
algorithm = "fixed-window"
limit = {LIMIT}
window = "3650days"

[pseudonymizer.keys]
1 = "{KEY}"

[redis]
enabled = true
urls = ["{}"]
command-timeout = "250ms"
connect-timeout = "250ms"
"#,
        redis.url()
    );
    Serve::start(&config, "info")
}

/// One response: status, `Retry-After`, and `r` of the `RateLimit` header.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    remaining: Option<u64>,
}

async fn ask(client: &reqwest::Client, base: &str, api_key: &str) -> Result<Answer, String> {
    let response = client
        .get(format!("{base}/api/hello"))
        .header("x-api-key", api_key)
        .send()
        .await
        .map_err(|error| format!("request: {error}"))?;
    let header = |name: &str| {
        response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned)
    };
    let retry_after = header("retry-after").and_then(|value| value.parse().ok());
    // `"api";r=<remaining>;t=<reset>`
    let remaining = header("ratelimit").and_then(|value| {
        let (_, rest) = value.split_once(";r=")?;
        rest.split(';').next()?.parse().ok()
    });
    let status = response.status().as_u16();
    response.bytes().await.map_err(|error| format!("body: {error}"))?;
    Ok(Answer { status, retry_after, remaining })
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build().unwrap()
}

/// Load on every instance until `stop`: each client its own API keys, a new
/// one every `PER_LOAD_KEY` requests, so the load keeps reaching Redis (or
/// the local limiter) rather than the denial cache, and meets both
/// admissions and local refusals; every answer kept.
fn load(bases: &[String], stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<Vec<Answer>>> {
    let mut clients = Vec::new();
    for (index, base) in bases.iter().enumerate() {
        for n in 0..LOAD_CLIENTS_PER_INSTANCE {
            let (base, stop) = (base.clone(), Arc::clone(stop));
            clients.push(tokio::spawn(async move {
                let client = client();
                let mut answers = Vec::new();
                // Bounded: the flag ends it, and a cap guards a stuck flag.
                while !stop.load(Ordering::SeqCst) && answers.len() < 20_000 {
                    let key = format!("load-{index}-{n}-{}", answers.len() / PER_LOAD_KEY);
                    answers.push(ask(&client, &base, &key).await.expect("no dropped connection"));
                    // Pacing: load enough, and the shared cores stay usable.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                answers
            }));
        }
    }
    clients
}

/// `PROBES` requests of the probe subject to `base` while Redis is away:
/// `share` admitted (the rest of the instance's share in the window), the
/// rest refused with the headers.
async fn probe_outage(client: &reqwest::Client, base: &str, outage: usize, share: u64) {
    let mut admitted = 0;
    for n in 0..PROBES {
        let answer = ask(client, base, "probe").await.unwrap();
        match answer.status {
            200 => {
                admitted += 1;
                assert!(
                    admitted <= share,
                    "outage {outage}: more than {share} admitted: {answer:?}"
                );
                assert_eq!(answer.remaining, Some(share - admitted), "outage {outage}: {answer:?}");
            }
            429 => {
                assert_eq!(answer.remaining, Some(0), "outage {outage}: {answer:?}");
                let retry_after = answer.retry_after.expect("a 429 says when to retry");
                assert!(retry_after >= 1, "outage {outage}: {answer:?}");
            }
            _ => panic!("outage {outage}, probe {n} on {base}: {answer:?} is neither 200 nor 429"),
        }
    }
    assert_eq!(admitted, share, "outage {outage}: {share} admitted on {base}");
}

/// Polls `base` until the probe's answer is Redis': a remaining the local
/// share never shows. Fails past `BACK_ON_REDIS` after `restarted`.
async fn back_on_redis(client: &reqwest::Client, base: &str, restarted: Instant) -> Duration {
    loop {
        let answer = ask(client, base, "probe").await.unwrap();
        assert!(matches!(answer.status, 200 | 429), "{answer:?}");
        if answer.remaining.is_some_and(|remaining| remaining >= SHARE) {
            return restarted.elapsed();
        }
        assert!(
            restarted.elapsed() < BACK_ON_REDIS,
            "{base} not back on Redis {BACK_ON_REDIS:?} after the restart: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn log_lines(serve: &Serve, message: &str) -> usize {
    serve.logs().iter().filter(|line| line.contains(message)).count()
}

/// Polls `serve`'s log until it has left degraded mode `times` times (the
/// load keeps Redis answering). Fails past a deadline of `BACK_ON_REDIS`
/// plus the hold after `restarted`.
async fn left(serve: &Serve, times: usize, restarted: Instant) {
    let deadline = BACK_ON_REDIS + LEAVE_AFTER;
    while log_lines(serve, "leaving degraded mode") < times {
        assert!(restarted.elapsed() < deadline, "not left {deadline:?} after the restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn degraded_decisions(client: &reqwest::Client, base: &str) -> u64 {
    let metrics = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("ca_skeleton_rate_limit_decisions_total")
                && line.contains("outcome=\"degraded\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_redis_under_load_with_degraded_mode_admits_a_share_per_instance_and_never_503() {
    let mut redis = RedisServer::start();
    let mut fleet = [instance(&redis), instance(&redis)];
    let bases: Vec<String> = fleet.iter().map(|serve| serve.base.clone()).collect();
    let client = client();
    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(&bases, &stop);

    // Redis decides: the probe's first requests are counted there.
    for base in &bases {
        let answer = ask(&client, base, "probe").await.unwrap();
        assert_eq!(answer.status, 200);
        assert!(answer.remaining.unwrap() >= SHARE, "Redis' count: {answer:?}");
    }
    for outage in 1..=2 {
        tokio::task::block_in_place(|| redis.crash());
        // The outage's length under load, part of the fault schedule (as in
        // `redis_faults_http`), not a wait for some event.
        tokio::time::sleep(OUTAGE).await;
        // The first outage spends each instance's share of the probe; the
        // second, in the same window, has none left to give it.
        let share = if outage == 1 { SHARE } else { 0 };
        for base in &bases {
            probe_outage(&client, base, outage, share).await;
        }
        for serve in &mut fleet {
            serve.assert_alive();
        }
        tokio::task::block_in_place(|| redis.restart());
        let restarted = Instant::now();
        for base in &bases {
            let back = back_on_redis(&client, base, restarted).await;
            eprintln!("outage {outage}: {base} back on Redis {back:?} after the restart");
        }
        for serve in &fleet {
            left(serve, outage, restarted).await;
            eprintln!("outage {outage}: left {:?} after the restart", restarted.elapsed());
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for client in clients {
        answers.extend(client.await.unwrap());
    }
    for serve in &mut fleet {
        serve.assert_alive();
    }
    let refused = answers.iter().filter(|answer| answer.status == 429).count();
    for answer in &answers {
        assert!(matches!(answer.status, 200 | 429), "under load: {answer:?}");
    }
    // Redis never refuses a load subject (30 of 40): these are local.
    assert!(refused > 0, "the load met the local limit while Redis was away");
    for (serve, base) in fleet.iter().zip(&bases) {
        // One line entering and one leaving per outage.
        assert_eq!(log_lines(serve, "entering degraded mode"), 2, "{:#?}", serve.logs());
        assert_eq!(log_lines(serve, "leaving degraded mode"), 2, "{:#?}", serve.logs());
        let degraded = degraded_decisions(&client, base).await;
        assert!(degraded >= PROBES * 2, "outcome=\"degraded\" counted {degraded}");
    }
    eprintln!(
        "load: {} answers ({} refused), none 503; probes: {SHARE} of {PROBES} admitted per \
         instance in outage 1, 0 in outage 2",
        answers.len(),
        refused
    );
}
