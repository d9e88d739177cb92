//! No raw principal leaves the edge (the part the binary
//! cannot show: the demo has no auth layer). The real router
//! (`server::router`) on the redis provider over a private redis-server,
//! wrapped in a test-only outer layer standing in for an auth layer: it
//! turns `x-test-principal` into the `AuthenticatedPrincipal` extension.
//! Served over a real TCP listener with `ConnectInfo`, logging our crates
//! at trace into a buffer. Then every Redis key and value (SCAN + GET),
//! every log line and the `/metrics` text are scanned for the raw
//! principals, and each principal must own exactly its own keys, named as
//! docs/http-edge.md ("Pseudonym framing") and adapter-redis' key format
//! say, with the counts docs/algorithms.md (policy sets) gives.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_web::AuthenticatedPrincipal;
use app_bootstrap::RateLimitCapability;
use axum::extract::Request;
use axum::middleware::Next;
use redis_fixture::RedisServer;
use sha2::{Digest, Sha256};
use shared_contract::{Clock, ManualClock};

const KEY: &str = "principal-leak-pseudonymizer-key-0123456789";
/// Distinctive raw principals: any occurrence anywhere is a leak.
const ALICE: &str = "sec-principal-alice-93be1f@example.test";
const BRAVO: &str = "sec-principal-bravo-0c7d44@example.test";
const CHARLIE: &str = "sec-principal-charlie-e512aa@example.test";
/// Sent with every request too: the principal wins (subject precedence),
/// so this key must neither name a bucket nor show up anywhere.
const SHADOWED_API_KEY: &str = "sec-shadowed-api-key-5a61d3";
const OPERATION: &str = "GET /api/hello";

fn config(redis_url: &str) -> String {
    // A set of three: an enforced burst per operation, an enforced budget
    // per subject, and a shadow policy whose would-be denials log the
    // subject's pseudonym (the one log line meant to name a subject).
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "redis"
default-policy = ["p-burst", "p-daily", "p-shadow"]
api-key-header = "x-api-key"

[capabilities.rate-limit.policies.p-burst]
algorithm = "fixed-window"
limit = 3
window = "60s"

[capabilities.rate-limit.policies.p-daily]
algorithm = "fixed-window"
limit = 1000
window = "24h"
scope = "subject"

[capabilities.rate-limit.policies.p-shadow]
algorithm = "fixed-window"
limit = 2
window = "60s"
mode = "shadow"

[pseudonymizer.keys]
1 = "{KEY}"

[redis]
enabled = true
urls = ["{redis_url}"]
"#
    )
}

/// The test's stand-in for an auth layer.
async fn principal_from_header(mut request: Request, next: Next) -> axum::response::Response {
    let principal = request
        .headers()
        .get("x-test-principal")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    if let Some(principal) = principal {
        request.extensions_mut().insert(AuthenticatedPrincipal(principal));
    }
    next.run(request).await
}

/// HMAC-SHA-256 written out from RFC 2104 over `sha2`, so the expected
/// pseudonyms come from the spec, not from the code under test.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    assert!(key.len() <= BLOCK, "a longer key would be hashed first");
    let mut padded = [0_u8; BLOCK];
    padded[..key.len()].copy_from_slice(key);
    let inner: Vec<u8> = padded.iter().map(|b| b ^ 0x36).chain(message.iter().copied()).collect();
    let inner = Sha256::digest(inner);
    let outer: Vec<u8> = padded.iter().map(|b| b ^ 0x5c).chain(inner.iter().copied()).collect();
    Sha256::digest(outer).into()
}

/// `v1:<hex>` of frame("principal") ‖ frame(identity), frame = 4-byte
/// big-endian length ‖ bytes (docs/http-edge.md, "Pseudonym framing").
fn pseudonym(identity: &str) -> String {
    let mut message = Vec::new();
    for part in ["principal", identity] {
        message.extend(u32::try_from(part.len()).unwrap().to_be_bytes());
        message.extend(part.as_bytes());
    }
    format!("v1:{}", hex::encode(hmac_sha256(KEY.as_bytes(), &message)))
}

/// The keys of one principal: `ca:rl:{<pseudonym>}:<policy>:<revision 1>`,
/// plus `:<operation digest>` for the operation-scoped policies; the digest
/// is the hex of the first 8 bytes of SHA-256 over the operation text.
fn keys_of(identity: &str) -> [String; 3] {
    let tag = pseudonym(identity);
    let operation = hex::encode(&Sha256::digest(OPERATION)[..8]);
    [
        format!("ca:rl:{{{tag}}}:p-burst:1:{operation}"),
        format!("ca:rl:{{{tag}}}:p-daily:1"),
        format!("ca:rl:{{{tag}}}:p-shadow:1:{operation}"),
    ]
}

/// The log buffer the in-process subscriber writes JSON lines into.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn redis_cli(redis: &RedisServer, args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "--raw"])
        .args(args)
        .output()
        .expect("redis-cli runs");
    assert!(out.status.success(), "redis-cli {args:?}");
    out.stdout
}

/// `n` of a fixed-window value: tag `F`, then little-endian doubles mark,
/// `window_start`, `n` (docs/algorithms.md, "Stored state on Redis").
fn fixed_window_n(value: &[u8]) -> f64 {
    assert_eq!(value.first(), Some(&b'F'), "a fixed-window value starts with its tag");
    f64::from_le_bytes(value[17..25].try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_raw_principal_reaches_redis_logs_or_metrics_and_each_has_its_own_budget() {
    // One test in this binary, so the global subscriber and the global
    // metrics recorder see this run alone and the counts below are exact.
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "info,app_bootstrap=trace,adapter_web=trace,adapter_redis=trace,adapter_memory=trace",
        ))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .json()
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let redis = RedisServer::start();
    let config = support::load(&config(&redis.url()));
    // A manual clock at T0 + 250 ms: no window can roll over mid-test, so
    // the counts cannot depend on when the test happens to run.
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(support::T0 + 250));
    let capability = RateLimitCapability::build(&config, Arc::clone(&clock)).unwrap();
    let layer = capability.layer(&config, clock).unwrap();
    let metrics = app_bootstrap::server::metrics_handle().unwrap();
    let api = app_bootstrap::routes::api().into_router();
    // Added last, so outermost: it runs before the rate-limit layer, as an
    // auth layer would.
    let app = app_bootstrap::server::router(api, capability, layer, metrics)
        .layer(axum::middleware::from_fn(principal_from_header));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });

    let client =
        reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
    // Alice 4 (the 4th over p-burst's 3), Bravo 2, Charlie 1, all from one
    // peer with one API key: only the principal tells them apart.
    let plan = [(ALICE, 4), (BRAVO, 2), (CHARLIE, 1)];
    let mut statuses = Vec::new();
    for (principal, count) in plan {
        let mut own = Vec::new();
        for _ in 0..count {
            let reply = client
                .get(format!("{base}/api/hello"))
                .header("x-test-principal", principal)
                .header("x-api-key", SHADOWED_API_KEY)
                .send()
                .await
                .unwrap();
            own.push(reply.status().as_u16());
        }
        statuses.push(own);
    }
    // Had the peer or the API key been the subject, Bravo and Charlie
    // would have shared Alice's exhausted burst and got 429s.
    assert_eq!(statuses, [vec![200, 200, 200, 429], vec![200, 200], vec![200]]);

    // Every key, by SCAN: follow the cursor until the server says 0.
    let mut scanned = String::new();
    let mut cursor = "0".to_owned();
    loop {
        let page =
            String::from_utf8(redis_cli(&redis, &["SCAN", &cursor, "COUNT", "1000"])).unwrap();
        let mut lines = page.lines();
        cursor = lines.next().expect("SCAN answers its next cursor first").to_owned();
        for key in lines {
            scanned.push_str(key);
            scanned.push('\n');
        }
        if cursor == "0" {
            break;
        }
    }
    let mut found: Vec<&str> = scanned.lines().filter(|line| !line.is_empty()).collect();
    found.sort_unstable();
    // Each counter key holds its dedupe records (dedupe is on by default).
    let mut expected: Vec<String> = plan.iter().flat_map(|(p, _)| keys_of(p)).collect();
    expected.sort_unstable();
    assert_eq!(found, expected, "one key per principal per policy, nothing else");

    // Counts per docs/algorithms.md: a set not admitted charges nothing
    // (Alice's 4th), a fixed window that denies writes nothing (Alice's
    // shadow stays at its limit of 2).
    let mut stored = scanned.clone().into_bytes();
    let mut counts = Vec::new();
    for (principal, _) in plan {
        let mut own = Vec::new();
        for key in keys_of(principal) {
            let mut value = redis_cli(&redis, &["HGET", &key, "s"]);
            // --raw ends the reply with one newline of its own.
            assert_eq!(value.pop(), Some(b'\n'));
            own.push(fixed_window_n(&value));
            stored.extend(value);
            // The records' fields and values are scanned for raw subjects too.
            stored.extend(redis_cli(&redis, &["HGETALL", &key]));
        }
        counts.push(own);
    }
    assert_eq!(counts, [vec![3.0, 3.0, 2.0], vec![2.0, 2.0, 2.0], vec![1.0, 1.0, 1.0]]);

    let metrics = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let burst = |outcome: &str| {
        support::counter(
            &metrics,
            &format!(
                r#"ca_skeleton_rate_limit_decisions_total{{policy="p-burst",algorithm="fixed-window",outcome="{outcome}",mode="enforce",cached="false",front="http"}}"#
            ),
        )
    };
    assert_eq!((burst("allowed"), burst("denied")), (6, 1), "{metrics}");

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // One trace line per evaluated request.
    let decisions = lines.iter().filter(|l| l.contains("\"rate-limit decision\"")).count();
    assert_eq!(decisions, 7, "the capture saw trace level");
    // Alice's shadow would deny on her 3rd and 4th request, and each line
    // names her by pseudonym; Bravo and Charlie stay within 2.
    let shadow: Vec<&&str> =
        lines.iter().filter(|l| l.contains("shadow policy would deny")).collect();
    assert_eq!(shadow.len(), 2, "{shadow:?}");
    assert!(shadow.iter().all(|line| line.contains(&pseudonym(ALICE))), "{shadow:?}");

    for raw in [ALICE, BRAVO, CHARLIE, SHADOWED_API_KEY] {
        let needle = raw.as_bytes();
        assert!(!stored.windows(needle.len()).any(|w| w == needle), "{raw} in Redis");
        assert!(!metrics.contains(raw), "{raw} in /metrics");
        assert!(!text.contains(raw), "{raw} in the logs");
    }
    eprintln!(
        "principal scan: {} Redis keys ({} bytes with values), {} log lines, {} bytes of /metrics; statuses {statuses:?}",
        found.len(),
        stored.len(),
        lines.len(),
        metrics.len()
    );
    server.abort();
}
