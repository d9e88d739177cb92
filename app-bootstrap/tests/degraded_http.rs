//! Degraded mode through two real `ca-skeleton serve`
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
//! - what each instance admitted locally is written back to Redis (which
//!   restarted empty) with its next decision of the subject: once both
//!   have decided the probe subject, Redis refuses it for the rest of the
//!   window (the fleet's local admissions are the limit);
//! - the local counts are kept on leaving: in the second outage, in the
//!   same window, the subject whose share the first outage spent gets none.
//!
//! With degraded mode off, `redis_faults_http` is the fail-closed lane.
//!
//! `window_redis_returns_in` drives the decorator itself over a real
//! redis-server with a manual clock, for the window Redis returns in.
//!
//! Beyond one standalone server and one fixed window, each through the real
//! binary against real servers, with only 200/429 (or Envoy's `OK` /
//! `OVER_LIMIT`) and exactly the instance's share admitted while Redis is
//! away, then Redis' answers again:
//! - a Redis Cluster with one shard down (master and replica killed): only
//!   the subjects on that shard are decided locally; then the whole
//!   cluster down;
//! - a Sentinel group with no master reachable (both data nodes frozen);
//! - GCRA and token bucket policies (their burst and capacity shared);
//! - the Envoy RLS front end (`[envoy-rls]`), and with degraded mode off
//!   its `UNAVAILABLE`.
//!
//! Waits for Redis to come back are polled with a bound that only guards a
//! hang (a cluster must settle first); no assertion is on time, except the
//! 2 s bound in the standalone test.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use app_bootstrap::degraded::LEAVE_AFTER;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use redis_fixture::{MASTER_NAME, RedisServer};
use redis_fixture::{RedisCluster, RedisSentinel};
use support::Serve;

const KEY: &str = "degraded-http-pseudonymizer-key-0123456789abcdef";
/// The policy's limit, and how many instances share it while Redis is away.
const LIMIT: u64 = 40;
const INSTANCES: u64 = 2;
/// `LIMIT` as Envoy's `limit_remaining` counts.
const LIMIT_U32: u32 = 40;
/// ceil(LIMIT / INSTANCES): what one instance admits per window alone.
const SHARE: u64 = LIMIT.div_ceil(INSTANCES);
/// Requests the probe sends to each instance per outage: more than a share.
const PROBES: u64 = 30;
/// The bound on getting back on Redis after its restart; polled.
const BACK_ON_REDIS: Duration = Duration::from_secs(2);
const LOAD_CLIENTS_PER_INSTANCE: usize = 2;
/// Requests per load subject: above a share, below the limit, so every
/// refusal the load meets is the local limiter's.
const PER_LOAD_KEY: usize = 30;
/// How long the load runs on the local limiters before the probes.
const OUTAGE: Duration = Duration::from_millis(1500);

/// The bound on waiting for Redis to answer again after a cluster or a
/// Sentinel group came back: a guard against a hang, not a measurement.
const PATIENCE: Duration = Duration::from_secs(60);

/// An instance's configuration: the `[redis]` lines `redis` (where Redis
/// is), degraded mode `enabled` for `INSTANCES`, the `policies` tables
/// (their default is `api`), and `extra` sections after `[redis]`. Redis
/// calls get 250 ms, so a frozen server is given up on soon.
fn config(redis: &str, enabled: bool, policies: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "redis"
default-policy = "api"
api-key-header = "x-api-key"

[capabilities.rate-limit.degraded]
enabled = {enabled}
instances = {INSTANCES}

{policies}
[pseudonymizer.keys]
1 = "{KEY}"

[redis]
enabled = true
{redis}
command-timeout = "250ms"
connect-timeout = "250ms"
{extra}"#
    )
}

/// The policy `api`: `LIMIT` per window. The window is ten years long, so
/// no window boundary passes during a run (the next one is 2030-01-01) and
/// "per window" is the whole test.
fn fixed_window() -> String {
    format!(
        "[capabilities.rate-limit.policies.api]\nalgorithm = \"fixed-window\"\n\
         limit = {LIMIT}\nwindow = \"3650days\"\n"
    )
}

/// The `[redis]` lines of a standalone server.
fn standalone(redis: &RedisServer) -> String {
    format!("urls = [\"{}\"]", redis.url())
}

/// An instance of the fleet against `redis`, degraded mode on, `api` a
/// fixed window.
fn instance(redis: &RedisServer) -> Serve {
    Serve::start(&config(&standalone(redis), true, &fixed_window(), ""), "info")
}

/// One response: status, `Retry-After`, and `r` of the `RateLimit` header.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    remaining: Option<u64>,
}

/// `GET /api/hello` on `base` as `api_key`.
async fn ask(client: &reqwest::Client, base: &str, api_key: &str) -> Result<Answer, String> {
    ask_at(client, &hello(base), api_key).await
}

fn hello(base: &str) -> String {
    format!("{base}/api/hello")
}

/// `GET url` as `api_key`.
async fn ask_at(client: &reqwest::Client, url: &str, api_key: &str) -> Result<Answer, String> {
    let response = client
        .get(url)
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

/// `PROBES` requests of `subject` to `url` while Redis is away: `share`
/// admitted (what is left of the instance's share in the window), the rest
/// refused with the headers. `case` names the situation in failures.
async fn probe_outage(client: &reqwest::Client, url: &str, subject: &str, case: &str, share: u64) {
    let mut admitted = 0;
    for n in 0..PROBES {
        let answer = ask_at(client, url, subject).await.unwrap();
        match answer.status {
            200 => {
                admitted += 1;
                assert!(admitted <= share, "{case}: more than {share} admitted: {answer:?}");
                assert_eq!(answer.remaining, Some(share - admitted), "{case}: {answer:?}");
            }
            429 => {
                assert_eq!(answer.remaining, Some(0), "{case}: {answer:?}");
                let retry_after = answer.retry_after.expect("a 429 says when to retry");
                assert!(retry_after >= 1, "{case}: {answer:?}");
            }
            _ => panic!("{case}, probe {n} of {url}: {answer:?} is neither 200 nor 429"),
        }
    }
    assert_eq!(admitted, share, "{case}: {share} admitted of {url}");
}

/// Polls `base` until an answer is Redis': each poll a fresh subject, so
/// Redis' first count (`LIMIT - 1`) shows a remaining the local share
/// never does. Fails past `BACK_ON_REDIS` after `restarted`.
async fn back_on_redis(client: &reqwest::Client, base: &str, restarted: Instant) -> Duration {
    for n in 0.. {
        let answer = ask(client, base, &format!("returned-{n}")).await.unwrap();
        assert!(matches!(answer.status, 200 | 429), "{answer:?}");
        if answer.remaining.is_some_and(|remaining| remaining >= SHARE) {
            break;
        }
        assert!(restarted.elapsed() < BACK_ON_REDIS, "{base} not back on Redis: {answer:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    restarted.elapsed()
}

/// Polls `url` as `subject`, whose local share is spent, until the answer
/// is Redis': a 200, which the local limiter no longer gives it (Redis,
/// given the share back, still has room: `LIMIT` is twice `SHARE`); every
/// answer meanwhile a 429. Fails past `patience` after `since`.
async fn back_on_redis_within(
    client: &reqwest::Client,
    url: &str,
    subject: &str,
    since: Instant,
    patience: Duration,
) -> Duration {
    loop {
        let answer = ask_at(client, url, subject).await.unwrap();
        assert!(matches!(answer.status, 200 | 429), "{answer:?}");
        if answer.status == 200 {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < patience,
            "{url} not back on Redis after {patience:?}: {answer:?}"
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

/// The decisions `base`'s instance counted `outcome="degraded"` from the
/// front end `front` (`http` or `envoy-rls`).
async fn degraded_decisions(client: &reqwest::Client, base: &str, front: &str) -> u64 {
    let metrics = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("ca_skeleton_rate_limit_decisions_total")
                && line.contains("outcome=\"degraded\"")
                && line.contains(&format!("front=\"{front}\""))
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
    // The connect-failure lines the rule allows: one a second per outage,
    // plus the first (lengths as measured here: a bound, not a timing).
    let mut connect_warnings_allowed = 0;
    for outage in 1..=2 {
        tokio::task::block_in_place(|| redis.crash());
        let crashed = Instant::now();
        // The outage's length under load, part of the fault schedule (as in
        // `redis_faults_http`), not a wait for some event.
        tokio::time::sleep(OUTAGE).await;
        // The first outage spends each instance's share of the probe; the
        // second, in the same window, has none left to give it.
        let share = if outage == 1 { SHARE } else { 0 };
        for base in &bases {
            let case = format!("outage {outage} on {base}");
            probe_outage(&client, &hello(base), "probe", &case, share).await;
        }
        for serve in &mut fleet {
            serve.assert_alive();
        }
        tokio::task::block_in_place(|| redis.restart());
        let restarted = Instant::now();
        connect_warnings_allowed += crashed.elapsed().as_secs() + 1;
        for base in &bases {
            let back = back_on_redis(&client, base, restarted).await;
            eprintln!("outage {outage}: {base} back on Redis {back:?} after the restart");
        }
        if outage == 1 {
            // Each instance writes its share of the probe back with its
            // first Redis decision of it: Redis admits at most the first
            // instance's (before the other's share is in), then is full.
            let mut admitted = 0;
            for round in 0..3 {
                for base in &bases {
                    let answer = ask(&client, base, "probe").await.unwrap();
                    assert!(matches!(answer.status, 200 | 429), "{answer:?}");
                    if answer.status == 200 {
                        admitted += 1;
                        assert_eq!(round, 0, "Redis full once both wrote back: {answer:?}");
                    }
                }
            }
            assert!(admitted <= 1, "{admitted} admitted by Redis after both shares");
            eprintln!("outage 1: the probe written back; {admitted} admitted by Redis after");
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
        // One connect attempt at a time, each failure logged at most once
        // a second with how many were not (before: one line per request).
        let warnings =
            log_lines(serve, "redis connect failed") + log_lines(serve, "redis connect timed out");
        assert!(warnings >= 2, "each outage logs its failed connects: {:#?}", serve.logs());
        let allowed = usize::try_from(connect_warnings_allowed).unwrap();
        assert!(warnings <= allowed, "{warnings} connect warnings, at most {allowed} allowed");
        eprintln!("{base}: {warnings} connect warnings over both outages");
        let connect_lines = serve.logs().into_iter().filter(|line| line.contains("redis connect"));
        let counted = connect_lines.filter(|line| line.contains("\"suppressed\":")).count();
        assert_eq!(counted, warnings, "each with `suppressed`");
        assert_eq!(log_lines(serve, "redis connected again"), 2, "one line at each recovery");
        let degraded = degraded_decisions(&client, base, "http").await;
        assert!(degraded >= PROBES * 2, "outcome=\"degraded\" counted {degraded}");
    }
    eprintln!(
        "load: {} answers ({} refused), none 503; probes: {SHARE} of {PROBES} admitted per \
         instance in outage 1, 0 in outage 2",
        answers.len(),
        refused
    );
}

/// The `[redis]` lines of `cluster`.
fn cluster_lines(cluster: &RedisCluster) -> String {
    let urls = cluster.urls().iter().map(|url| format!("\"{url}\"")).collect::<Vec<_>>().join(", ");
    format!("topology = \"cluster\"\nurls = [{urls}]")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_shard_down_and_then_the_whole_cluster_down_are_answered_by_degraded_mode() {
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    let serve = Serve::start(&config(&cluster_lines(&cluster), true, &fixed_window(), ""), "info");
    let client = client();
    let url = hello(&serve.base);

    // One shard down: its master and its replica killed, so no failover.
    let master = cluster.masters()[0].port;
    let shard = [master, cluster.replica_of(master)];
    tokio::task::block_in_place(|| shard.iter().for_each(|&port| cluster.kill_node(port)));
    // Where a subject lives shows in its first answer: Redis counts down
    // from the limit, the local limiter from the share.
    let (mut on_redis, mut degraded) = (Vec::new(), Vec::new());
    for n in 0..40 {
        let subject = format!("shard-{n}");
        let answer = ask_at(&client, &url, &subject).await.unwrap();
        assert_eq!(answer.status, 200, "{subject}: {answer:?}");
        match answer.remaining {
            Some(remaining) if remaining == LIMIT - 1 => on_redis.push(subject),
            Some(remaining) if remaining == SHARE - 1 => degraded.push(subject),
            _ => panic!("{subject}: {answer:?} is neither Redis' count nor the share"),
        }
    }
    // A third of the slots is down: 40 subjects all on one side would be
    // about one chance in ten million.
    assert!(!on_redis.is_empty(), "no subject on a live shard was answered by Redis");
    assert!(!degraded.is_empty(), "no subject on the dead shard was answered locally");
    let subject = &degraded[0];
    probe_outage(&client, &url, subject, "one shard down", SHARE - 1).await;
    tokio::task::block_in_place(|| {
        shard.iter().for_each(|&port| cluster.start_node(port));
        cluster.wait_until_settled(3);
    });
    let back = back_on_redis_within(&client, &url, subject, Instant::now(), PATIENCE).await;
    eprintln!(
        "one shard down: {} of 40 subjects local; back on Redis {back:?} after settling",
        degraded.len()
    );

    // The whole cluster down: every subject is decided locally.
    let ports = cluster.ports();
    tokio::task::block_in_place(|| ports.iter().for_each(|&port| cluster.kill_node(port)));
    probe_outage(&client, &url, "whole", "the whole cluster down", SHARE).await;
    probe_outage(&client, &url, &on_redis[0], "the whole cluster down", SHARE).await;
    tokio::task::block_in_place(|| {
        ports.iter().for_each(|&port| cluster.start_node(port));
        cluster.wait_until_settled(3);
    });
    let back = back_on_redis_within(&client, &url, "whole", Instant::now(), PATIENCE).await;
    eprintln!("whole cluster down: back on Redis {back:?} after settling");
    let degraded = degraded_decisions(&client, &serve.base, "http").await;
    assert!(degraded >= 3 * PROBES, "outcome=\"degraded\" counted {degraded}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_sentinel_master_reachable_degraded_mode_answers_until_one_is() {
    let mut group = tokio::task::block_in_place(RedisSentinel::start);
    let sentinels =
        group.sentinel_addresses().iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>();
    let lines = format!(
        "topology = \"sentinel\"\nsentinels = [{}]\nmaster-name = \"{MASTER_NAME}\"",
        sentinels.join(", ")
    );
    let serve = Serve::start(&config(&lines, true, &fixed_window(), ""), "info");
    let client = client();
    let url = hello(&serve.base);
    let first = ask_at(&client, &url, "probe").await.unwrap();
    assert_eq!((first.status, first.remaining), (200, Some(LIMIT - 1)), "Redis decides first");

    // Both data nodes frozen: the master times out, and the sentinels
    // name a master that is down with no replica to promote.
    let data = group.data_ports();
    data.iter().for_each(|&port| group.pause(port));
    probe_outage(&client, &url, "probe", "no master reachable", SHARE).await;
    data.iter().for_each(|&port| group.resume(port));
    let back = back_on_redis_within(&client, &url, "probe", Instant::now(), PATIENCE).await;
    eprintln!("sentinel: back on Redis {back:?} after the data nodes resumed");
    let degraded = degraded_decisions(&client, &serve.base, "http").await;
    assert!(degraded >= PROBES, "outcome=\"degraded\" counted {degraded}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_and_token_bucket_policies_are_degraded_to_their_share_of_burst_and_capacity() {
    // `api` (GET /api/hello) a GCRA whose burst is the limit, and
    // GET /api/orders/{id} a token bucket; both refill once in ten years,
    // so the burst and the capacity are all a window gives.
    let policies = format!(
        r#"[capabilities.rate-limit.operations]
"GET /api/orders/{{id}}" = "bucket"

[capabilities.rate-limit.policies.api]
algorithm = "gcra"
limit = {LIMIT}
period = "3650days"
burst = {LIMIT}

[capabilities.rate-limit.policies.bucket]
algorithm = "token-bucket"
capacity = {LIMIT}
refill-tokens = 1
refill-period = "3650days"
"#
    );
    let mut redis = RedisServer::start();
    let serve = Serve::start(&config(&standalone(&redis), true, &policies, ""), "info");
    let client = client();
    let urls = [hello(&serve.base), format!("{}/api/orders/1", serve.base)];
    for url in &urls {
        let first = ask_at(&client, url, "probe").await.unwrap();
        assert_eq!((first.status, first.remaining), (200, Some(LIMIT - 1)), "{url}: Redis first");
    }
    tokio::task::block_in_place(|| redis.crash());
    for (url, case) in urls.iter().zip(["GCRA", "token bucket"]) {
        // The shared burst (GCRA) and capacity (token bucket): SHARE.
        probe_outage(&client, url, "probe", case, SHARE).await;
    }
    tokio::task::block_in_place(|| redis.restart());
    let restarted = Instant::now();
    for url in &urls {
        back_on_redis_within(&client, url, "probe", restarted, PATIENCE).await;
    }
}

/// An `[envoy-rls]` listener whose one rule limits each `remote_address`
/// by `api`.
const RLS: &str = r#"
[envoy-rls]
listen = "127.0.0.1:0"

[[envoy-rls.rules]]
domain = "edge"
descriptor = ["remote_address"]
policies = "api"
"#;

/// One `ShouldRateLimit` of `address` under the rule of [`RLS`]: the
/// overall code and the remaining of its one status, or the gRPC error.
async fn rls_ask(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    address: &str,
) -> Result<(Code, u32), tonic::Status> {
    rls_call(client, address, None).await
}

/// [`rls_ask`] with the descriptor's own `hits_addend` 0: a look, which
/// charges nothing.
async fn rls_look(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    address: &str,
) -> Result<(Code, u32), tonic::Status> {
    rls_call(client, address, Some(0)).await
}

/// [`rls_ask`] with the descriptor's `hits_addend` set to `hits`, if any.
async fn rls_call(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    address: &str,
    hits: Option<u64>,
) -> Result<(Code, u32), tonic::Status> {
    let entry = Entry { key: "remote_address".to_owned(), value: address.to_owned() };
    let descriptor = RateLimitDescriptor {
        entries: vec![entry],
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..Default::default()
    };
    let request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![descriptor],
        hits_addend: 0,
    };
    let answer = client.should_rate_limit(request).await?.into_inner();
    let remaining = answer.statuses.first().map_or(0, |status| status.limit_remaining);
    Ok((Code::try_from(answer.overall_code).unwrap(), remaining))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_front_end_degrades_too_and_is_unavailable_with_degraded_mode_off() {
    let mut redis = RedisServer::start();
    let on = Serve::start(&config(&standalone(&redis), true, &fixed_window(), RLS), "info");
    let off = Serve::start(&config(&standalone(&redis), false, &fixed_window(), RLS), "info");
    let connect =
        |serve: &Serve| RateLimitServiceClient::connect(format!("http://{}", serve.rls_address()));
    let (mut on_rls, mut off_rls) = (connect(&on).await.unwrap(), connect(&off).await.unwrap());
    // Redis decides on both (each instance its own address).
    assert_eq!(rls_ask(&mut on_rls, "10.7.0.1").await.unwrap(), (Code::Ok, LIMIT_U32 - 1));
    assert_eq!(rls_ask(&mut off_rls, "10.7.0.2").await.unwrap(), (Code::Ok, LIMIT_U32 - 1));

    tokio::task::block_in_place(|| redis.crash());
    let mut admitted = 0;
    for n in 0..PROBES {
        let answer = rls_ask(&mut on_rls, "10.7.0.1").await;
        match answer {
            Ok((Code::Ok, remaining)) => {
                admitted += 1;
                assert_eq!(u64::from(remaining), SHARE - admitted, "call {n}");
            }
            Ok((Code::OverLimit, remaining)) => assert_eq!(remaining, 0, "call {n}"),
            other => panic!("call {n} with degraded mode on: {other:?}, not OK or OVER_LIMIT"),
        }
    }
    assert_eq!(admitted, SHARE, "the instance's share of the limit");
    // A look-only descriptor is answered by the local limiter too: the
    // share spent, and a fresh subject's whole share, charging nothing.
    assert_eq!(rls_look(&mut on_rls, "10.7.0.1").await.unwrap(), (Code::OverLimit, 0));
    for _ in 0..2 {
        let fresh = rls_look(&mut on_rls, "10.7.0.3").await.unwrap();
        assert_eq!(fresh, (Code::Ok, u32::try_from(SHARE).unwrap()));
    }
    for n in 0..5 {
        let status = rls_ask(&mut off_rls, "10.7.0.2").await.expect_err("degraded mode is off");
        assert_eq!(status.code(), tonic::Code::Unavailable, "call {n}: {status:?}");
    }
    let status = rls_look(&mut off_rls, "10.7.0.2").await.expect_err("degraded mode is off");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    tokio::task::block_in_place(|| redis.restart());
    let restarted = Instant::now();
    // Back on Redis (restarted empty, given the share back): an `OK`,
    // which the local limiter no longer gives that address.
    loop {
        if let Ok((Code::Ok, remaining)) = rls_ask(&mut on_rls, "10.7.0.1").await {
            assert_eq!(u64::from(remaining), LIMIT - SHARE - 1, "the share written back");
            break;
        }
        assert!(restarted.elapsed() < PATIENCE, "degraded-on instance not back on Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    loop {
        match rls_ask(&mut off_rls, "10.7.0.2").await {
            Ok(answer) => {
                assert_eq!(answer.0, Code::Ok);
                break;
            }
            Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}"),
        }
        assert!(restarted.elapsed() < PATIENCE, "degraded-off instance not back on Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = client();
    let degraded = degraded_decisions(&client, &on.base, "envoy-rls").await;
    assert!(degraded >= PROBES, "outcome=\"degraded\" front=\"envoy-rls\" counted {degraded}");
    assert_eq!(degraded_decisions(&client, &off.base, "envoy-rls").await, 0);
}

/// The decorator itself (no binary) over a real redis-server that is
/// killed before a window and restarted inside it (empty, as the fixture's
/// server keeps no data), the window moved by a manual clock that Redis'
/// scripts read too: the limit of 10 per 6 s holds in the window Redis
/// returns in, for one instance, for one instance whose Redis restarts
/// every 0.5 s, and for a fleet of two over one Redis within the bound
/// docs/operations.md states.
mod window_redis_returns_in {
    use std::num::NonZeroU32;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use adapter_memory::{MemoryEdgeRateLimitAdapter, MemoryStore};
    use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
    use app_bootstrap::degraded::{DegradedMode, DegradedPort, scaled};
    use redis_fixture::RedisServer;
    use shared_contract::{
        Algorithm, Clock, DecisionSource, EdgeRateLimitPort, EvaluationId, ManualClock,
        OperationDigest, PolicyId, PolicySet, RateLimitFailure, RateLimitPolicy, RateLimitRequest,
        SubjectDigest,
    };

    /// A window start: a whole multiple of the 6 s window.
    const T0: u64 = 1_700_000_040_000;
    const LIMIT: u64 = 10;
    const WINDOW: Duration = Duration::from_secs(6);
    /// A guard against a hang while Redis comes back; no assertion on time.
    const PATIENCE: Duration = Duration::from_secs(20);

    fn policy() -> RateLimitPolicy {
        RateLimitPolicy::builder(
            "api",
            Algorithm::FixedWindow(shared_contract::FixedWindow { limit: LIMIT, window: WINDOW }),
        )
        .build()
        .unwrap()
    }

    /// One instance of a fleet of `instances`: the Redis provider on `redis`
    /// behind degraded mode, both on `clock`.
    fn instance(redis: &RedisServer, clock: &ManualClock, instances: u32) -> DegradedPort {
        let clock: Arc<dyn Clock> = Arc::new(clock.clone());
        let settings = RedisSettings {
            urls: vec![redis.url()],
            connect_timeout: Duration::from_millis(250),
            command_timeout: Duration::from_millis(250),
            ..RedisSettings::default()
        };
        let primary =
            RedisEdgeRateLimitAdapter::new(settings, [policy()], Arc::clone(&clock)).unwrap();
        let instances = NonZeroU32::new(instances).unwrap();
        let mode = Arc::new(DegradedMode::new(MemoryStore::new(), instances, Arc::clone(&clock)));
        let local = MemoryEdgeRateLimitAdapter::with_store(
            mode.store().clone(),
            [scaled(&policy(), instances).unwrap()],
            clock,
        )
        .unwrap();
        DegradedPort::new(Arc::new(primary), Arc::new(local), mode)
    }

    /// Decisions of one subject through the instances, counted.
    struct Probe {
        clock: ManualClock,
        admitted: u64,
        from_redis: u64,
    }

    impl Probe {
        fn new(clock: &ManualClock) -> Self {
            Self { clock: clock.clone(), admitted: 0, from_redis: 0 }
        }

        /// One request of cost 1 through `port`: whether Redis decided it
        /// (itself, or its denial cache), not the local limiter.
        async fn ask(&mut self, port: &DegradedPort) -> bool {
            let request = RateLimitRequest {
                policies: PolicySet::single(PolicyId::new("api").unwrap()).into(),
                subject: SubjectDigest::parse(format!("v1:{}", "cd".repeat(16))).unwrap(),
                operation: OperationDigest::from_u64(0x0000_0000_0000_00c1),
                cost: 1,
                evaluation_id: EvaluationId::random(),
                deadline: self.clock.monotonic() + Duration::from_millis(750),
            };
            match port.evaluate(request).await {
                Ok(set) => {
                    self.admitted += u64::from(set.allowed());
                    let redis = set.source() != DecisionSource::Degraded;
                    self.from_redis += u64::from(redis);
                    redis
                }
                other @ (Err(RateLimitFailure::Unavailable { .. })
                | Err(RateLimitFailure::Incompatible { .. })
                | Err(RateLimitFailure::Indeterminate { .. })) => {
                    panic!("degraded mode answers every request: {other:?}")
                }
            }
        }

        /// Asks through `port` until Redis decides (every answer counted).
        async fn until_redis(&mut self, port: &DegradedPort) {
            let since = Instant::now();
            while !self.ask(port).await {
                assert!(since.elapsed() < PATIENCE, "Redis not back after {PATIENCE:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Redis answers once (the connection is up), then is killed before the
    /// window of `T0`, and the clock moves inside that window.
    async fn killed_before_the_window(
        redis: &mut RedisServer,
        clock: &ManualClock,
        ports: &[&DegradedPort],
    ) {
        let mut before = Probe::new(clock);
        for port in ports {
            before.until_redis(port).await;
        }
        tokio::task::block_in_place(|| redis.crash());
        clock.advance(Duration::from_millis(1_050));
        assert_eq!(clock.epoch_millis(), T0 + 50, "inside the window");
    }

    /// One instance on a new Redis, killed before the window of `T0`.
    async fn one_instance_killed_before_the_window() -> (RedisServer, ManualClock, DegradedPort) {
        let mut redis = RedisServer::start();
        let clock = ManualClock::new(T0 - 1_000);
        let port = instance(&redis, &clock, 1);
        killed_before_the_window(&mut redis, &clock, &[&port]).await;
        (redis, clock, port)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_back_inside_the_window_counts_what_one_instance_admitted_locally() {
        let (mut redis, clock, port) = one_instance_killed_before_the_window().await;

        let mut window = Probe::new(&clock);
        for _ in 0..12 {
            window.ask(&port).await;
        }
        assert_eq!((window.admitted, window.from_redis), (LIMIT, 0), "the share, locally");
        tokio::task::block_in_place(|| redis.restart());
        window.until_redis(&port).await;
        for _ in 0..12 {
            window.ask(&port).await;
        }
        assert!(window.from_redis >= 13, "Redis decided after its return");
        assert_eq!(window.admitted, LIMIT, "the window Redis returns in stays at the limit");
        // Written back once: the next window has the whole limit on Redis.
        clock.advance(WINDOW);
        let mut next = Probe::new(&clock);
        for _ in 0..12 {
            next.ask(&port).await;
        }
        assert_eq!((next.admitted, next.from_redis), (LIMIT, 12));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_restarted_every_half_second_adds_nothing_to_the_share() {
        let (mut redis, clock, port) = one_instance_killed_before_the_window().await;

        // Five cycles of 0.5 s down and 0.5 s up (restarted empty each time),
        // three requests in each half, all inside the one window.
        let mut window = Probe::new(&clock);
        for _ in 0..5 {
            for _ in 0..3 {
                window.ask(&port).await;
            }
            clock.advance(Duration::from_millis(500));
            tokio::task::block_in_place(|| redis.restart());
            window.until_redis(&port).await;
            for _ in 0..2 {
                window.ask(&port).await;
            }
            clock.advance(Duration::from_millis(500));
            tokio::task::block_in_place(|| redis.crash());
        }
        assert!(clock.epoch_millis() < T0 + WINDOW.as_millis() as u64, "one window");
        assert!(window.from_redis >= 15, "Redis decided in every up half");
        assert_eq!(window.admitted, LIMIT, "one instance's share, however often Redis restarts");
    }

    /// `callers` requests of the probe's subject at once through `port`,
    /// counted as [`Probe::ask`] counts them.
    async fn at_once(window: &mut Probe, port: &DegradedPort, callers: usize) {
        let mut asks = Vec::new();
        for _ in 0..callers {
            let (port, mut probe) = (port.clone(), Probe::new(&window.clock));
            asks.push(tokio::spawn(async move {
                probe.ask(&port).await;
                (probe.admitted, probe.from_redis)
            }));
        }
        for ask in asks {
            let (admitted, from_redis) = ask.await.unwrap();
            window.admitted += admitted;
            window.from_redis += from_redis;
        }
    }

    /// Asks for a subject other than the probe's until Redis decides it.
    async fn another_subject_until_redis(port: &DegradedPort, clock: &ManualClock) {
        let since = Instant::now();
        loop {
            let request = RateLimitRequest {
                policies: PolicySet::single(PolicyId::new("api").unwrap()).into(),
                subject: SubjectDigest::parse(format!("v1:{}", "ef".repeat(16))).unwrap(),
                operation: OperationDigest::from_u64(0x0000_0000_0000_00c1),
                cost: 1,
                evaluation_id: EvaluationId::random(),
                deadline: clock.monotonic() + Duration::from_millis(750),
            };
            if port
                .evaluate(request)
                .await
                .is_ok_and(|set| set.source() != DecisionSource::Degraded)
            {
                return;
            }
            assert!(since.elapsed() < PATIENCE, "Redis not back after {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_of_a_subject_add_nothing_to_the_share_while_redis_restarts_empty()
    {
        let (mut redis, clock, port) = one_instance_killed_before_the_window().await;

        // As above, with eight requests at once each time, the first eight
        // after each restart too: one of them writes the local admissions
        // back while the others wait for it. Another subject's request
        // first, until Redis decides it, so the connection is back without
        // a write-back of the probe's subject.
        let mut window = Probe::new(&clock);
        for _ in 0..5 {
            at_once(&mut window, &port, 8).await;
            clock.advance(Duration::from_millis(500));
            tokio::task::block_in_place(|| redis.restart());
            another_subject_until_redis(&port, &clock).await;
            for _ in 0..3 {
                at_once(&mut window, &port, 8).await;
            }
            clock.advance(Duration::from_millis(500));
            tokio::task::block_in_place(|| redis.crash());
        }
        assert!(clock.epoch_millis() < T0 + WINDOW.as_millis() as u64, "one window");
        assert!(window.from_redis >= 15, "Redis decided in every up half");
        assert_eq!(window.admitted, LIMIT, "one instance's share, however often Redis restarts");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fleet_of_two_counts_both_shares_in_the_window_redis_returns_in() {
        let mut redis = RedisServer::start();
        let clock = ManualClock::new(T0 - 1_000);
        let (a, b) = (instance(&redis, &clock, 2), instance(&redis, &clock, 2));
        killed_before_the_window(&mut redis, &clock, &[&a, &b]).await;

        let share = LIMIT.div_ceil(2);
        let mut window = Probe::new(&clock);
        for port in [&a, &b] {
            for _ in 0..share + 2 {
                window.ask(port).await;
            }
        }
        assert_eq!(window.admitted, 2 * share, "each instance its share, locally");
        tokio::task::block_in_place(|| redis.restart());
        // Requests alternate between the instances once Redis is back. Each
        // writes its local admissions back with its first Redis decision, so
        // Redis can admit only what the other had not written back yet: A's
        // first request (A's share written, B's not yet) is the one admission
        // beyond the limit the bound allows here.
        window.until_redis(&a).await;
        window.until_redis(&b).await;
        for _ in 0..6 {
            window.ask(&a).await;
            window.ask(&b).await;
        }
        assert!(window.from_redis >= 14, "Redis decided after its return");
        assert!(
            window.admitted <= LIMIT + 1,
            "the fleet's bound: the limit plus what Redis admitted before B wrote back: {}",
            window.admitted
        );
        // Both shares are in Redis now: it refuses the rest of the window.
        let mut after = Probe::new(&clock);
        for port in [&a, &b, &a, &b] {
            assert!(after.ask(port).await);
        }
        assert_eq!(after.admitted, 0, "Redis counts both shares");
    }
}
