//! The real `ca-skeleton serve` binary under HTTP load while its
//! redis-server is killed and restarted on the same port, or frozen with
//! SIGSTOP and thawed with SIGCONT. Every response must be a 200, a 429 or
//! a problem+json 503, none slower than the evaluation budget + 100 ms, no
//! connection dropped, the process alive throughout, and 200s back within
//! 2 s of the heal.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis_fixture::RedisServer;
use support::Serve;

const KEY: &str = "redis-faults-http-pseudonymizer-key-0123456789";
/// The configured evaluation budget, and what a response may take beyond it.
const BUDGET: Duration = Duration::from_millis(750);
const SLACK: Duration = Duration::from_millis(100);
const HEAL_BOUND: Duration = Duration::from_secs(2);
const CLIENTS: usize = 4;

/// The binary serving the redis provider against `redis`.
fn service(redis: &RedisServer) -> Serve {
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "redis"
default-policy = "api"
api-key-header = "x-api-key"
evaluation-budget = "{}ms"

[capabilities.rate-limit.policies.api]
algorithm = "fixed-window"
limit = 100000
window = "60s"

[pseudonymizer.keys]
1 = "{KEY}"

[redis]
enabled = true
urls = ["{}"]
command-timeout = "250ms"
connect-timeout = "250ms"
"#,
        BUDGET.as_millis(),
        redis.url()
    );
    Serve::start(&config, "info")
}

/// One response as the load loop saw it.
#[derive(Debug)]
struct Sample {
    at: Instant,
    elapsed: Duration,
    result: Result<(u16, String), String>,
}

/// `CLIENTS` clients, each with its own API key, calling `/api/hello`
/// until `stop` is set; every response is kept.
fn load(base: &str, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<Vec<Sample>>> {
    (0..CLIENTS)
        .map(|n| {
            let (url, stop) = (format!("{base}/api/hello"), Arc::clone(stop));
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .no_proxy()
                    .timeout(Duration::from_secs(5))
                    .build()
                    .unwrap();
                let mut samples = Vec::new();
                // Bounded: the flag ends it, and a cap guards a stuck flag.
                while !stop.load(Ordering::SeqCst) && samples.len() < 20_000 {
                    let started = Instant::now();
                    let sent = client.get(&url).header("x-api-key", format!("client-{n}")).send();
                    let result = match sent.await {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let kind = response
                                .headers()
                                .get("content-type")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_owned();
                            match response.bytes().await {
                                Ok(_) => Ok((status, kind)),
                                Err(error) => Err(format!("body: {error}")),
                            }
                        }
                        Err(error) => Err(format!("request: {error}")),
                    };
                    samples.push(Sample { at: started, elapsed: started.elapsed(), result });
                    // Pacing: a few hundred requests a second in all is load
                    // enough, and leaves the shared cores to the service.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                samples
            })
        })
        .collect()
}

/// Checks every sample and returns (worst latency, count per status, first
/// 200 after `healed`).
fn judge(samples: &[Sample], fault: Instant, healed: Instant) -> (Duration, [usize; 3], Duration) {
    let mut worst = Duration::ZERO;
    let mut counts = [0; 3];
    let mut first_ok_after_heal = None;
    let mut during_fault_503 = 0;
    for sample in samples {
        worst = worst.max(sample.elapsed);
        let (status, kind) = sample.result.as_ref().expect("no dropped connection, no error");
        assert!(
            sample.elapsed <= BUDGET + SLACK,
            "a response took {:?}, beyond {BUDGET:?} + {SLACK:?}: {sample:?}",
            sample.elapsed
        );
        match status {
            200 => {
                counts[0] += 1;
                if sample.at >= healed {
                    let after = sample.at + sample.elapsed - healed;
                    first_ok_after_heal =
                        Some(first_ok_after_heal.map_or(after, |f: Duration| f.min(after)));
                }
            }
            429 => counts[1] += 1,
            503 => {
                assert_eq!(kind, "application/problem+json", "{sample:?}");
                counts[2] += 1;
                if sample.at >= fault && sample.at < healed {
                    during_fault_503 += 1;
                }
            }
            other => panic!("status {other} is none of 200, 429, 503: {sample:?}"),
        }
    }
    assert!(during_fault_503 > 0, "the fault was felt: some 503 while it lasted");
    let recovery = first_ok_after_heal.expect("a 200 after the heal");
    assert!(recovery <= HEAL_BOUND, "200s came back {recovery:?} after the heal");
    (worst, counts, recovery)
}

/// Runs the load for `before`, applies `fault`, waits `down`, applies
/// `heal`, and keeps the load on for `after`.
async fn under_load(
    redis: &mut RedisServer,
    fault: impl FnOnce(&mut RedisServer),
    heal: impl FnOnce(&mut RedisServer),
    name: &str,
) {
    let mut service = service(redis);
    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(&service.base, &stop);
    // These sleeps are the fault schedule itself (how long each phase
    // lasts), not a wait for some event.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let faulted = Instant::now();
    tokio::task::block_in_place(|| fault(redis));
    tokio::time::sleep(Duration::from_millis(2000)).await;
    service.assert_alive();
    tokio::task::block_in_place(|| heal(redis));
    let healed = Instant::now();
    tokio::time::sleep(HEAL_BOUND + Duration::from_millis(1000)).await;
    stop.store(true, Ordering::SeqCst);
    let mut samples = Vec::new();
    for client in clients {
        samples.extend(client.await.unwrap());
    }
    service.assert_alive();
    let (worst, counts, recovery) = judge(&samples, faulted, healed);
    eprintln!(
        "{name}: {} responses (200: {}, 429: {}, 503: {}), worst {worst:?}, 200s back {recovery:?} after the heal",
        samples.len(),
        counts[0],
        counts[1],
        counts[2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_and_restarting_redis_under_load_fails_closed_and_heals() {
    let mut redis = RedisServer::start();
    under_load(&mut redis, RedisServer::stop, RedisServer::restart, "kill/restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freezing_and_thawing_redis_under_load_fails_closed_and_heals() {
    let mut redis = RedisServer::start();
    under_load(&mut redis, RedisServer::pause, RedisServer::resume, "sigstop/sigcont").await;
}

/// A Redis that refuses every write (out of memory) answers each request
/// with an error reply: 200 requests make one warning a second at most,
/// never one per request, since any client could send them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_error_replies_are_logged_once_a_second() {
    let redis = RedisServer::start();
    let serve = service(&redis);
    support::redis_cli(redis.port(), &["CONFIG", "SET", "maxmemory", "1"]);
    let client = reqwest::Client::new();
    let started = Instant::now();
    for n in 0..200 {
        let reply = client
            .get(format!("{}/api/hello", serve.base))
            .header("x-api-key", format!("key-{n}"))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 503);
    }
    let seconds = started.elapsed().as_secs() + 1;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines = serve.logs().into_iter().filter(|line| line.contains("redis error")).count();
    assert!((1..=usize::try_from(seconds).unwrap() + 1).contains(&lines), "{lines} in {seconds} s");
}
