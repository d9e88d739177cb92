//! No raw subject leaves the edge, and hostile headers cost nothing: the
//! real binary on the redis provider, logging our crates at trace level,
//! serves clients identified by IP (two loopback source addresses), by API
//! key, and a flood of 10,000 distinct spoofed `X-Forwarded-For` /
//! `Forwarded` values from an untrusted peer, plus 64 KiB and non-UTF-8
//! header values. Then every Redis key and value, every log line and the
//! `/metrics` text are scanned for the raw subjects.

mod support;

use std::net::IpAddr;
use std::time::Duration;

use redis_fixture::RedisServer;
use support::Serve;

const KEY: &str = "security-http-pseudonymizer-key-0123456789";
const API_KEYS: [&str; 2] = ["sec-api-key-alpha-4f1c9e", "sec-api-key-bravo-77d2a0"];
const IP_CLIENTS: [&str; 2] = ["127.0.0.2", "127.0.0.3"];
const SPOOFING_PEER: &str = "127.0.0.4";
const SPOOFED: u32 = 10_000;

fn client(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(source.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The spoofed hop of request `n`: addresses in TEST-NET-3 / TEST-NET-2
/// that no other part of the run produces.
fn spoofed(n: u32) -> (String, String) {
    let (high, low) = (n / 256, n % 256);
    (format!("203.0.{high}.{low}"), format!("for=\"198.51.{high}.{low}\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_raw_subject_reaches_redis_logs_or_metrics_and_spoofed_hops_make_no_bucket() {
    let redis = RedisServer::start();
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "redis"
default-policy = "api"
api-key-header = "x-api-key"

# Ten years: windows align to multiples of their length since the epoch,
# so the next boundary is 2030-01-01. With "60s" a minute boundary passing
# during the flood (tens of seconds on a busy machine) expired the early
# subjects' keys before they were counted (1 key of 5, once in 12 runs).
[capabilities.rate-limit.policies.api]
algorithm = "fixed-window"
limit = 100000
window = "3650days"

[pseudonymizer.keys]
1 = "{KEY}"

[redis]
enabled = true
urls = ["{}"]
"#,
        redis.url()
    );
    let mut serve = Serve::start(
        &config,
        "info,app_bootstrap=trace,adapter_web=trace,adapter_redis=trace,adapter_memory=trace",
    );
    let hello = format!("{}/api/hello", serve.base);

    for ip in IP_CLIENTS {
        for _ in 0..5 {
            assert_eq!(client(ip).get(&hello).send().await.unwrap().status(), 200);
        }
    }
    let by_key = client("127.0.0.1");
    for key in API_KEYS {
        for _ in 0..5 {
            let reply = by_key.get(&hello).header("x-api-key", key).send().await.unwrap();
            assert_eq!(reply.status(), 200);
        }
    }

    // The flood: one untrusted peer, a new forwarded hop each time.
    let before_kib = serve.rss_kib();
    let spoofer = client(SPOOFING_PEER);
    let tasks: Vec<_> = (0..8_u32)
        .map(|lane| {
            let (spoofer, hello) = (spoofer.clone(), hello.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for n in (lane..SPOOFED).step_by(8) {
                    let (xff, forwarded) = spoofed(n);
                    let reply = spoofer
                        .get(&hello)
                        .header("x-forwarded-for", xff)
                        .header("forwarded", forwarded)
                        .send()
                        .await
                        .unwrap();
                    statuses.push(reply.status().as_u16());
                }
                statuses
            })
        })
        .collect();
    for task in tasks {
        let statuses = task.await.unwrap();
        assert!(statuses.iter().all(|&s| s == 200), "an untrusted hop changes nothing");
    }
    let after_kib = serve.rss_kib();

    // Oversized and non-UTF-8 values: a typed 4xx or ignored, never a 5xx.
    let big = "a".repeat(64 * 1024);
    let odd = reqwest::header::HeaderValue::from_bytes(b"\xff\xfe\x80key").unwrap();
    let hostile = [
        ("x-api-key", reqwest::header::HeaderValue::from_str(&big).unwrap()),
        ("x-forwarded-for", reqwest::header::HeaderValue::from_str(&big).unwrap()),
        ("x-api-key", odd.clone()),
        ("x-forwarded-for", odd.clone()),
        ("forwarded", odd),
    ];
    let mut hostile_statuses = Vec::new();
    for (name, value) in hostile {
        let reply = spoofer.get(&hello).header(name, value).send().await.unwrap();
        let status = reply.status();
        assert!(status.is_success() || status.is_client_error(), "{name}: {status}");
        hostile_statuses.push((name, status.as_u16()));
    }
    serve.assert_alive();

    // One key per real subject: two IPs, two API keys, the spoofing peer.
    let cli = |args: &[&str]| {
        let port = redis.port().to_string();
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port, "--raw"])
            .args(args)
            .output()
            .expect("redis-cli runs");
        assert!(out.status.success(), "redis-cli {args:?}");
        out.stdout
    };
    let listed = String::from_utf8(cli(&["KEYS", "*"])).unwrap();
    let keys: Vec<&str> = listed.lines().filter(|line| !line.is_empty()).collect();
    // One key per subject, each holding its dedupe records (dedupe is on
    // by default): five in all.
    assert_eq!(keys.len(), 5, "no bucket per spoofed value: {keys:?}");
    let mut stored = listed.clone().into_bytes();
    for key in &keys {
        stored.extend(cli(&["HGETALL", key]));
    }
    let metrics =
        reqwest::get(format!("{}/metrics", serve.base)).await.unwrap().text().await.unwrap();
    let logs = serve.logs().join("\n");

    let mut raw: Vec<String> =
        API_KEYS.iter().chain(&IP_CLIENTS).map(|s| (*s).to_owned()).collect();
    raw.push(SPOOFING_PEER.to_owned());
    // Every spoofed hop shares these prefixes, so one search covers them all.
    raw.extend(["203.0.".to_owned(), "198.51.".to_owned()]);
    for subject in &raw {
        let needle = subject.as_bytes();
        assert!(!stored.windows(needle.len()).any(|w| w == needle), "{subject} in Redis");
        assert!(!metrics.contains(subject.as_str()), "{subject} in /metrics");
        assert!(!logs.contains(subject.as_str()), "{subject} in the logs");
    }
    eprintln!(
        "security: {} log lines, {} Redis keys, RSS {before_kib} KiB -> {after_kib} KiB over {SPOOFED} spoofed hops, hostile headers {hostile_statuses:?}",
        serve.logs().len(),
        keys.len()
    );
    // Bounded: the flood made no per-value state, so at most allocator
    // slack and connection buffers remain.
    assert!(after_kib < before_kib + 32 * 1024, "RSS {before_kib} KiB -> {after_kib} KiB");
}
