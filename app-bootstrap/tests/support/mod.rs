//! Shared helpers of the end-to-end tests: load a configuration from TOML
//! text without the test machine's variables, run the real server on an
//! ephemeral port, and talk to it over TCP.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use app_bootstrap::{AppConfig, Application, ConfigSources};
use reqwest::StatusCode;
use shared_contract::{Clock, ManualClock};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A multiple of every window used in the tests (60 s), so expected
/// numbers follow docs/algorithms.md from a known window start.
pub(crate) const T0: u64 = 1_700_000_040_000;

/// A key long enough for the pseudonymizer (32 bytes or more).
pub(crate) const TEST_KEY: &str = "e2e-pseudonymizer-key-0123456789abcdef";

/// Loads `toml` as the configuration file and nothing else, so nothing of
/// the machine running the tests leaks in. Not by clearing the environment
/// (`figment::Jail`): that is process-wide, and a test in the same binary
/// that looked up `redis-cli` or spawned `redis-server` meanwhile found no
/// `PATH` (the Redis Cluster test of `exactness_http` failed that way).
pub(crate) fn load(toml: &str) -> AppConfig {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("e2e.toml");
    std::fs::write(&path, toml).expect("the configuration file is written");
    AppConfig::load(&ConfigSources::file_only(path)).expect("the configuration loads")
}

/// A fixed window of 3 per 60 s named `id`, the default policy, served on
/// an ephemeral port. `extra` adds or overrides sections.
pub(crate) fn fixed_window_config(id: &str, provider: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "{provider}"
default-policy = "{id}"

[capabilities.rate-limit.policies.{id}]
algorithm = "fixed-window"
limit = 3
window = "60s"

[pseudonymizer.keys]
1 = "{TEST_KEY}"
{extra}
"#
    )
}

/// A server running in the background.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) address: SocketAddr,
    /// The admin listener's address, when `admin.listen` is set.
    pub(crate) admin: Option<SocketAddr>,
    pub(crate) clock: ManualClock,
    client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// One response, read whole.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: reqwest::header::HeaderMap,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

impl Running {
    /// Builds the application over a manual clock at `T0 + 250 ms` and
    /// serves it until [`Running::stop`] or drop.
    pub(crate) async fn start(config: &AppConfig) -> Self {
        Self::start_with(config, app_bootstrap::routes::api()).await
    }

    /// [`Running::start`] over the API routes `api` instead of the demo's.
    pub(crate) async fn start_with(
        config: &AppConfig,
        api: app_bootstrap::routes::ApiRoutes,
    ) -> Self {
        let clock = ManualClock::new(T0 + 250);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let application =
            Application::build_with(config, api, shared).await.expect("the application builds");
        let address = application.local_addr();
        assert_ne!(address.port(), 0, "the listener reports its real port");
        let admin = application.admin_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            application
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
                .expect("the server runs until stopped");
        });
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("an HTTP client");
        Self { address, admin, clock, client, stop: Some(stop), task: Some(task) }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        self.send(self.client.get(self.url(path))).await
    }

    pub(crate) async fn post(&self, path: &str) -> Reply {
        self.send(self.client.post(self.url(path))).await
    }

    pub(crate) async fn head(&self, path: &str) -> Reply {
        self.send(self.client.head(self.url(path))).await
    }

    pub(crate) async fn request(&self, method: reqwest::Method, path: &str) -> Reply {
        self.send(self.client.request(method, self.url(path))).await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = request.send().await.expect("the server answers");
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.text().await.expect("a readable body");
        Reply { status, headers, body }
    }

    /// The `/metrics` text.
    pub(crate) async fn metrics(&self) -> String {
        let reply = self.get("/metrics").await;
        assert_eq!(reply.status, StatusCode::OK);
        reply.body
    }

    /// Triggers graceful shutdown and waits for the server to finish.
    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("graceful shutdown finishes")
                .expect("the server task ends cleanly");
        }
    }
}

/// The value of the counter line `name{labels}` in a Prometheus text, 0
/// when absent.
pub(crate) fn counter(metrics: &str, name_and_labels: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Three allowed with RateLimit headers (remaining 2, 1, 0), then a 429
/// with `Retry-After`, for the fixed window of 3 per 60 s at `T0 + 250`:
/// reset_after = T0 + 60000 - (T0 + 250) = 59750 ms, shown as 60 s.
pub(crate) async fn three_allowed_then_429(server: &Running, id: &str, path: &str) {
    for remaining in [2, 1, 0] {
        let reply = server.get(path).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.header("ratelimit-policy"), Some(format!(r#""{id}";q=3;w=60"#).as_str()));
        assert_eq!(
            reply.header("ratelimit"),
            Some(format!(r#""{id}";r={remaining};t=60"#).as_str())
        );
    }
    let reply = server.get(path).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
    assert_eq!(reply.header("retry-after"), Some("60"));
    assert_eq!(reply.header("ratelimit"), Some(format!(r#""{id}";r=0;t=60"#).as_str()));
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
}

/// Config lines mapping `POST /api/orders` to a GCRA of 1 per 10 s with a
/// burst of 2 (docs/algorithms.md#gcra), to append to a configuration.
/// README "Limit what requests use, not how many": 1,000 units a minute,
/// a request reserving up to 100.
pub(crate) const COMPLETION_UNITS: &str = r#"
[capabilities.rate-limit.operations]
"POST /api/complete" = "e2e-units"

[capabilities.rate-limit.policies.e2e-units]
algorithm = "fixed-window"
limit = 1000
window = "60s"
maximum-cost = 100
evaluation-dedup = { ttl = "60s" }
"#;

/// Under [`COMPLETION_UNITS`]: each request reserves, then settles what it
/// used once its body is sent (the README's numbers); the next request is
/// sent once the server has counted the settle, which runs after the
/// response.
pub(crate) async fn completion_reserves_then_settles(server: &Running) {
    const APPLIED: &str = r#"ca_skeleton_rate_limit_settles_total{outcome="applied",front="http"}"#;
    let remaining = |reply: &Reply| {
        let header = reply.header("ratelimit").expect("a RateLimit header").to_owned();
        header.split(';').find_map(|f| f.strip_prefix("r=").map(str::to_owned)).unwrap()
    };
    let settled = counter(&server.metrics().await, APPLIED);
    for (at, (query, expected)) in [
        // 100 reserved.
        ("reserve=100&use=10", "900"),
        // 90 came back: 10 used, then 100 reserved.
        ("reserve=100&use=500", "890"),
        // 500 used, 400 past its reservation: 510 used, then 100 reserved.
        ("reserve=100&use=0", "390"),
    ]
    .into_iter()
    .enumerate()
    {
        let reply = server.post(&format!("/api/complete?{query}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{query}: {}", reply.body);
        assert_eq!(remaining(&reply), expected, "{query}");
        let wanted = settled + u64::try_from(at).unwrap() + 1;
        let waited = std::time::Instant::now();
        while counter(&server.metrics().await, APPLIED) < wanted {
            assert!(waited.elapsed() < Duration::from_secs(10), "{query} was never settled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let first = server.post("/api/complete?reserve=1&use=1").await;
    assert_eq!(first.body, r#"{"reserved":1,"used":1}"#);
    // A reservation above maximum-cost is refused before the work.
    let over = server.post("/api/complete?reserve=101&use=1").await;
    assert_eq!(over.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(over.body.contains("cost-exceeds-maximum"), "{}", over.body);
    let bad = server.post("/api/complete?reserve=0&use=1").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

pub(crate) const GCRA_ORDERS: &str = r#"
[capabilities.rate-limit.operations]
"POST /api/orders" = "e2e-gcra"

[capabilities.rate-limit.policies.e2e-gcra]
algorithm = "gcra"
limit = 1
period = "10s"
burst = 2
"#;

/// Under [`GCRA_ORDERS`] and the server's manual clock: `T` = 10 s, so
/// `q=2;w=20`; two orders pass (remaining 1 then 0, the next cell 10 s on
/// each time) and the third is refused for 10 s.
pub(crate) async fn gcra_burst_then_429(server: &Running) {
    for remaining in [1, 0] {
        let reply = server.post("/api/orders").await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""e2e-gcra";q=2;w=20"#));
        let expected = format!(r#""e2e-gcra";r={remaining};t=10"#);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()));
    }
    let reply = server.post("/api/orders").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
    assert_eq!(reply.header("retry-after"), Some("10"));
    assert_eq!(reply.header("ratelimit"), Some(r#""e2e-gcra";r=0;t=10"#));
}

/// A concurrency policy on `GET /api/work`: two requests in flight at once
/// (README, "Limit requests in flight").
pub(crate) const IN_FLIGHT_WORK: &str = r#"
[capabilities.rate-limit.operations]
"GET /api/work" = "e2e-in-flight"

[capabilities.rate-limit.policies.e2e-in-flight]
algorithm = "concurrency"
max-in-flight = 2
lease-ttl = "30s"
retry-after = "2s"
"#;

/// Under [`IN_FLIGHT_WORK`]: of three requests held in flight at once, two
/// pass and the third is refused at once with the policy's retry-after and
/// `q=2` without a window. Once the two have finished, their leases are
/// given back: each request after them finds a slot (`r=1`, its own lease
/// taken). A release runs after the response's last bytes, so a request
/// may come before it lands: a 429 is asked again, a bounded number of
/// times, never a 429 for good.
pub(crate) async fn two_in_flight_then_429(server: &Running) {
    let (a, b, c) = tokio::join!(
        server.get("/api/work?ms=1500"),
        server.get("/api/work?ms=1500"),
        server.get("/api/work?ms=1500")
    );
    let mut replies = [a, b, c];
    replies.sort_by_key(|reply| reply.status);
    let statuses: Vec<_> = replies.iter().map(|reply| reply.status).collect();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    let mut remaining: Vec<_> =
        replies[..2].iter().map(|reply| reply.header("ratelimit")).collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        [Some(r#""e2e-in-flight";r=0"#), Some(r#""e2e-in-flight";r=1"#)],
        "each admitted request counts the leases held with its own"
    );
    let refused = &replies[2];
    assert_eq!(refused.header("retry-after"), Some("2"), "{}", refused.body);
    assert_eq!(refused.header("ratelimit-policy"), Some(r#""e2e-in-flight";q=2"#));
    assert_eq!(refused.header("ratelimit"), Some(r#""e2e-in-flight";r=0"#));
    for _ in 0..3 {
        // A lease is given back after its response is sent (a task of its
        // own), so the next request may still see it held for a moment.
        let settled = |reply: &Reply| {
            reply.status != StatusCode::TOO_MANY_REQUESTS
                && reply.header("ratelimit") == Some(r#""e2e-in-flight";r=1"#)
        };
        let mut reply = server.get("/api/work?ms=0").await;
        for _ in 0..100 {
            if settled(&reply) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            reply = server.get("/api/work?ms=0").await;
        }
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "a finished request's slot is free: {}",
            reply.body
        );
        assert_eq!(reply.header("ratelimit"), Some(r#""e2e-in-flight";r=1"#));
    }
}

/// The real `ca-skeleton serve` binary, started with the TOML `config` and
/// `RUST_LOG=rust_log`, JSON logs; its address comes from the "listening"
/// line, and every log line is kept (read on a thread, so a full pipe never
/// blocks the process). Killed on drop. `rust_log` must let
/// `app_bootstrap` log at info, or the "listening" line never comes.
#[derive(Debug)]
pub(crate) struct Serve {
    pub(crate) child: std::process::Child,
    pub(crate) base: String,
    logs: Arc<std::sync::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Serve {
    pub(crate) fn start(config: &str, rust_log: &str) -> Self {
        Self::start_with_env(config, rust_log, &[])
    }

    /// [`Self::start`] with the variables `env` set as well.
    pub(crate) fn start_with_env(config: &str, rust_log: &str, env: &[(&str, &str)]) -> Self {
        use std::io::{BufRead, BufReader};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.toml");
        std::fs::write(&path, config).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ca-skeleton"))
            .env_clear()
            .env("RUST_LOG", rust_log)
            .envs(env.iter().copied())
            .args(["--log-format", "json", "--config"])
            .arg(&path)
            .arg("serve")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("serve starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let address = loop {
            let line = lines.next().expect("a log line before listening").unwrap();
            let event: serde_json::Value = serde_json::from_str(&line).expect("JSON logs");
            logs.lock().unwrap().push(line);
            if event["fields"]["message"] == "ca-skeleton listening" {
                break event["fields"]["address"].as_str().unwrap().to_owned();
            }
        };
        let kept = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        Self { child, base: format!("http://{address}"), logs, _dir: dir }
    }

    /// The configuration file it was started with (rewrite it to reload).
    pub(crate) fn config_path(&self) -> std::path::PathBuf {
        self._dir.path().join("serve.toml")
    }

    /// Every log line so far.
    pub(crate) fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// The admin listener's address, from its start-up line (the server
    /// logs it once `admin.listen` is bound).
    pub(crate) fn admin_address(&self) -> SocketAddr {
        self.logged_address("admin listener on")
    }

    /// The Envoy RLS listener's address, from its start-up line
    /// (`envoy-rls.listen`).
    pub(crate) fn rls_address(&self) -> SocketAddr {
        self.logged_address("envoy rls listener on")
    }

    /// The `address` of the first log line saying `message`.
    fn logged_address(&self, message: &str) -> SocketAddr {
        for _ in 0..250 {
            let found = self.logs().iter().find_map(|line| {
                let event: serde_json::Value = serde_json::from_str(line).ok()?;
                (event["fields"]["message"] == message)
                    .then(|| event["fields"]["address"].as_str()?.parse().ok())?
            });
            if let Some(address) = found {
                return address;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no {message:?} line with an address: {:#?}", self.logs())
    }

    /// Panics when the process has exited.
    pub(crate) fn assert_alive(&mut self) {
        assert!(self.child.try_wait().unwrap().is_none(), "serve exited");
    }

    /// Resident memory of the process in KiB (Linux `/proc`).
    pub(crate) fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The built `ca-skeleton` binary.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ca-skeleton");

/// The binary with no variable of the test machine (no stray
/// `CA_SKELETON_*`), logs quiet unless asked.
pub(crate) fn ca_skeleton() -> std::process::Command {
    let mut command = std::process::Command::new(BIN);
    command.env_clear().env("RUST_LOG", "warn");
    command
}

/// Runs `command` to its end: its output, stdout and stderr as text.
pub(crate) fn run(command: &mut std::process::Command) -> (std::process::Output, String, String) {
    let output = command.output().expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stdout, stderr)
}

/// Writes `contents` to `dir/name` and gives its path.
pub(crate) fn write(dir: &std::path::Path, name: &str, contents: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write the file");
    path
}

/// `redis-cli` against the Redis on `port` (a fixture's), its trimmed answer.
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}
