//! Hot reload of the policies against a real server over TCP: a valid file
//! swaps the table, a new revision starts fresh counters, an invalid file
//! or a limit changed without a new revision changes nothing, restart-only
//! keys are reported; on the memory provider and on a spawned Redis; and
//! the binary reloads on SIGHUP.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use app_bootstrap::{AppConfig, Application, ConfigSources, ReloadReport, Reloader};
use redis_fixture::RedisServer;
use reqwest::StatusCode;
use shared_contract::{Clock, ManualClock};
use support::{Serve, TEST_KEY, counter};

/// A fixed window of `limit` per 60 s, revision `revision`, as the default
/// policy `reloaded`; `extra` adds sections.
fn config(limit: u64, revision: u32, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
default-policy = "reloaded"

[capabilities.rate-limit.policies.reloaded]
algorithm = "fixed-window"
limit = {limit}
window = "60s"
revision = {revision}

[pseudonymizer.keys]
1 = "{TEST_KEY}"
{extra}
"#
    )
}

struct Served {
    base: String,
    reloader: Reloader,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn start(toml: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reload.toml");
        std::fs::write(&path, toml).unwrap();
        let sources = ConfigSources::file_only(path.clone());
        let config = AppConfig::load(&sources).expect("the first file loads");
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_700_000_000_250));
        let application = Application::build_with(&config, app_bootstrap::routes::api(), clock)
            .await
            .expect("the application builds")
            .reload_from(sources);
        let reloader = application.reloader().expect("a reloader").clone();
        let base = format!("http://{}", application.local_addr());
        let task = tokio::spawn(async move {
            application.run_until(std::future::pending()).await.unwrap();
        });
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        Self { base, reloader, client, _dir: dir, path, task }
    }

    async fn rewrite_and_reload(&self, toml: &str) -> ReloadReport {
        std::fs::write(&self.path, toml).unwrap();
        self.reloader.reload().await
    }

    async fn hello(&self) -> (StatusCode, String) {
        let response = self.client.get(format!("{}/api/hello", self.base)).send().await.unwrap();
        let policy = response
            .headers()
            .get("ratelimit-policy")
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (response.status(), policy)
    }

    async fn allowed_then_denied(&self, allowed: usize) {
        for n in 0..allowed {
            assert_eq!(self.hello().await.0, StatusCode::OK, "request {n} of {allowed}");
        }
        assert_eq!(self.hello().await.0, StatusCode::TOO_MANY_REQUESTS);
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn restart_required_keys(report: &ReloadReport) -> &[String] {
    match report {
        ReloadReport::Applied { restart_required, .. }
        | ReloadReport::Unchanged { restart_required } => restart_required,
        ReloadReport::Rejected { problems } => panic!("rejected: {problems:?}"),
    }
}

fn problems(report: &ReloadReport) -> &[String] {
    match report {
        ReloadReport::Rejected { problems } => problems,
        ReloadReport::Applied { .. } | ReloadReport::Unchanged { .. } => {
            panic!("expected a rejection, got {report:?}")
        }
    }
}

/// The reload rules, in one sequence over one server, so each step starts
/// from what the previous one left in force.
async fn the_reload_rules_hold(extra: &str) {
    let served = Served::start(&config(3, 1, extra)).await;
    served.allowed_then_denied(3).await;

    // A new revision with a new limit: fresh counters, the new limit.
    let report = served.rewrite_and_reload(&config(5, 2, extra)).await;
    let ReloadReport::Applied { changed, restart_required } = &report else {
        panic!("applied: {report:?}")
    };
    assert_eq!(
        changed,
        &[
            "capabilities.rate-limit.policies.reloaded.limit",
            "capabilities.rate-limit.policies.reloaded.revision"
        ]
    );
    assert!(restart_required.is_empty(), "{report:?}");
    let (status, policy) = served.hello().await;
    assert_eq!(status, StatusCode::OK, "revision 2 starts with a full budget");
    assert!(policy.contains("q=5"), "{policy}");
    served.allowed_then_denied(4).await;

    // The limit changed under the same revision: refused, naming why.
    let report = served.rewrite_and_reload(&config(50, 2, extra)).await;
    assert_eq!(
        problems(&report),
        ["capabilities.rate-limit.policies.reloaded.revision: limit changed but revision is \
          still 2: raise revision so the new limit starts fresh counters"]
    );
    // A new algorithm under the same revision: refused, and what to do is
    // to raise the revision (a restart would meet the same counters).
    let token_bucket = config(5, 2, extra).replace(
        "algorithm = \"fixed-window\"\nlimit = 5\nwindow = \"60s\"",
        "algorithm = \"token-bucket\"\ncapacity = 5\nrefill-tokens = 1\nrefill-period = \"1s\"",
    );
    let report = served.rewrite_and_reload(&token_bucket).await;
    assert_eq!(
        problems(&report),
        ["capabilities.rate-limit.policies.reloaded.algorithm: cannot change from fixed-window \
          to token-bucket under revision 2: its counters mean nothing to another algorithm; \
          raise revision, or give the new limit a new policy id"]
    );
    // A revision going back: refused.
    let report = served.rewrite_and_reload(&config(5, 1, extra)).await;
    assert!(problems(&report)[0].contains("went back from 2 to 1"), "{report:?}");
    // An invalid file: every problem named, nothing changes.
    let invalid = config(5, 9, extra)
        .replace("window = \"60s\"", "window = \"sixty\"")
        .replace("default-policy = \"reloaded\"", "default-policy = \"reloaded\"\nbogus = 1");
    let report = served.rewrite_and_reload(&invalid).await;
    let listed = problems(&report);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().any(|p| p.starts_with("capabilities.rate-limit.bogus")), "{listed:?}");
    assert!(
        listed.iter().any(|p| p.starts_with("capabilities.rate-limit.policies.reloaded.window"))
    );
    // The table of revision 2 is still in force, its counter still spent.
    let (status, policy) = served.hello().await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(policy.contains("q=5"), "{policy}");

    // An edge-only key: applied, and the counters are the same ones (the
    // new port shares the provider's state).
    let budget = config(5, 2, &format!("{extra}\n")).replace(
        "default-policy = \"reloaded\"",
        "default-policy = \"reloaded\"\nevaluation-budget = \"600ms\"",
    );
    let report = served.rewrite_and_reload(&budget).await;
    assert!(
        matches!(&report, ReloadReport::Applied { changed, .. }
            if changed == &["capabilities.rate-limit.evaluation-budget"]),
        "{report:?}"
    );
    assert_eq!(served.hello().await.0, StatusCode::TOO_MANY_REQUESTS, "still spent");

    // A restart-only key: reported, nothing else changes; every time.
    let moved = budget.replace("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\"");
    for _ in 0..2 {
        let report = served.rewrite_and_reload(&moved).await;
        assert!(matches!(report, ReloadReport::Unchanged { .. }), "{report:?}");
        assert_eq!(restart_required_keys(&report), ["server.listen"]);
    }
    // The mode alone may change under the same revision (a shadow rollout
    // promoted keeps its counters): shadow, the spent budget no longer blocks.
    let shadow = moved.replace("revision = 2", "revision = 2\nmode = \"shadow\"");
    let report = served.rewrite_and_reload(&shadow).await;
    assert!(matches!(report, ReloadReport::Applied { .. }), "{report:?}");
    assert_eq!(served.hello().await.0, StatusCode::OK, "a shadow policy never blocks");

    let metrics = served.client.get(format!("{}/metrics", served.base)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(counter(&metrics, "ca_skeleton_config_reloads_total{result=\"rejected\"}") >= 4);
}

/// Every metric the service exports starts with the one prefix named for
/// the service: decisions, evaluation times and reloads alike.
#[tokio::test]
async fn every_exported_metric_starts_with_the_service_prefix() {
    let toml = config(1, 1, "");
    let served = Served::start(&toml).await;
    served.allowed_then_denied(1).await;
    let report = served.rewrite_and_reload(&toml).await;
    assert!(matches!(report, ReloadReport::Unchanged { .. }), "{report:?}");

    let metrics = served.client.get(format!("{}/metrics", served.base)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    let exported: BTreeSet<&str> = metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|family| family.split(' ').next())
        .collect();
    assert_eq!(adapter_web::METRIC_PREFIX, "ca_skeleton_");
    for name in [
        "ca_skeleton_rate_limit_decisions_total",
        "ca_skeleton_rate_limit_evaluation_seconds",
        "ca_skeleton_config_reloads_total",
    ] {
        assert!(exported.contains(name), "{name} missing from {exported:?}");
    }
    let foreign: Vec<_> =
        exported.iter().filter(|name| !name.starts_with(adapter_web::METRIC_PREFIX)).collect();
    assert!(foreign.is_empty(), "metrics without the service prefix: {foreign:?}");
}

#[tokio::test]
async fn an_empty_file_is_refused_and_the_policies_in_force_stay() {
    let served = Served::start(&config(3, 1, "")).await;
    for empty in ["", "\n  \n"] {
        let report = served.rewrite_and_reload(empty).await;
        assert!(problems(&report)[0].contains("the file is empty"), "{report:?}");
    }
    served.allowed_then_denied(3).await;
}

#[tokio::test]
async fn a_file_that_names_no_policies_is_refused_and_the_policies_in_force_stay() {
    let served = Served::start(&config(3, 1, "")).await;
    // Comments alone, a copy cut before the table, and the table's header
    // alone: each would load as the built-in policy (5 a minute, looser
    // than these 3).
    let whole = config(3, 1, "");
    let before_table = &whole[..whole.find("[capabilities.rate-limit]").expect("the table")];
    let header = format!("{before_table}[capabilities.rate-limit]\n");
    for partial in ["# a configuration being written\n", before_table, &header] {
        let report = served.rewrite_and_reload(partial).await;
        assert!(
            problems(&report)[0].contains("names no policies ([capabilities.rate-limit.policies])"),
            "{partial:?}: {report:?}"
        );
    }
    // The policies' header alone is no valid file at all.
    let empty = format!("{header}[capabilities.rate-limit.policies]\n");
    let report = served.rewrite_and_reload(&empty).await;
    assert!(problems(&report)[0].contains("must define at least one policy"), "{report:?}");
    served.allowed_then_denied(3).await;
}

#[tokio::test]
async fn memory_reloads_follow_the_rules() {
    the_reload_rules_hold("").await;
}

#[tokio::test]
async fn redis_reloads_follow_the_rules_over_the_same_connection() {
    let redis = RedisServer::start();
    let extra = format!(
        "[redis]\nenabled = true\nurls = [\"{}\"]\nkey-prefix = \"reload:\"\n",
        redis.url()
    );
    the_reload_rules_hold_on_redis(&extra, &redis).await;
}

/// Connections the server has accepted so far, this one included.
fn connections_received(redis: &RedisServer) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "INFO", "stats"])
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats has total_connections_received")
}

async fn the_reload_rules_hold_on_redis(extra: &str, redis: &RedisServer) {
    let toml = |limit, revision| {
        config(limit, revision, extra).replace(
            "default-policy = \"reloaded\"",
            "provider = \"redis\"\ndefault-policy = \"reloaded\"",
        )
    };
    let served = Served::start(&toml(3, 1)).await;
    served.allowed_then_denied(3).await;
    let before = connections_received(redis);
    let report = served.rewrite_and_reload(&toml(5, 2)).await;
    assert!(matches!(report, ReloadReport::Applied { .. }), "{report:?}");
    served.allowed_then_denied(5).await;
    // Only the second redis-cli connected: the new port kept the connection.
    assert_eq!(connections_received(redis), before + 1);
    let report = served.rewrite_and_reload(&toml(6, 2)).await;
    assert_eq!(problems(&report).len(), 1, "{report:?}");
    assert_eq!(served.hello().await.0, StatusCode::TOO_MANY_REQUESTS);
}

/// `keep` as the default policy; with `demo` (a `[...policies.demo]` body)
/// `GET /api/hello` is limited by `demo`, without it by `keep`.
/// `rate_limit` adds lines to `[capabilities.rate-limit]`, `extra` sections.
fn removable(demo: Option<&str>, rate_limit: &str, extra: &str) -> String {
    let (operations, demo) = match demo {
        Some(body) => (
            "operations = { \"GET /api/hello\" = \"demo\" }",
            format!("[capabilities.rate-limit.policies.demo]\n{body}"),
        ),
        None => ("", String::new()),
    };
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
default-policy = "keep"
{rate_limit}
{operations}

[capabilities.rate-limit.policies.keep]
algorithm = "fixed-window"
limit = 100
window = "60s"

{demo}

[pseudonymizer.keys]
1 = "{TEST_KEY}"
{extra}
"#
    )
}

/// A policy removed by one reload and re-added by the next
/// is judged against what it was when it was served, not let through
/// because the table in force no longer holds it.
async fn a_removed_policy_comes_back_only_as_it_was_or_with_a_higher_revision(
    rate_limit: &str,
    extra: &str,
) {
    let fixed = |limit: u64, revision: u32| {
        format!(
            "algorithm = \"fixed-window\"\nlimit = {limit}\nwindow = \"60s\"\nrevision = {revision}\n"
        )
    };
    let bucket = |revision: u32| {
        format!(
            "algorithm = \"token-bucket\"\ncapacity = 5\nrefill-tokens = 1\n\
             refill-period = \"1h\"\nrevision = {revision}\n"
        )
    };
    let with = |body: &str| removable(Some(body), rate_limit, extra);
    let served = Served::start(&with(&fixed(3, 2))).await;
    served.allowed_then_denied(3).await;

    let report = served.rewrite_and_reload(&removable(None, rate_limit, extra)).await;
    assert!(matches!(report, ReloadReport::Applied { .. }), "{report:?}");
    assert_eq!(served.hello().await.0, StatusCode::OK, "GET /api/hello now under keep");

    // Re-added with another algorithm, another limit, or a lower revision:
    // each refused as it would have been had demo stayed in force.
    let report = served.rewrite_and_reload(&with(&bucket(2))).await;
    assert_eq!(
        problems(&report),
        ["capabilities.rate-limit.policies.demo.algorithm: cannot change from fixed-window to \
          token-bucket under revision 2 (served before it was removed): its counters mean \
          nothing to another algorithm; raise revision, or give the new limit a new policy id"]
    );
    let report = served.rewrite_and_reload(&with(&fixed(4, 2))).await;
    assert_eq!(
        problems(&report),
        ["capabilities.rate-limit.policies.demo.revision: limit changed but revision is still 2 \
          (served before it was removed): raise revision so the new limit starts fresh counters"]
    );
    for body in [fixed(4, 1), bucket(1)] {
        let report = served.rewrite_and_reload(&with(&body)).await;
        assert_eq!(
            problems(&report),
            ["capabilities.rate-limit.policies.demo.revision: went back from 2 to 1 (served \
              before it was removed): revisions only grow (the store may still hold the older \
              revision's counters)"]
        );
    }
    let (status, policy) = served.hello().await;
    assert_eq!(status, StatusCode::OK, "keep still in force");
    assert!(policy.contains("q=100"), "{policy}");

    // Re-added as it was: applied, on the counter it left (still spent).
    let report = served.rewrite_and_reload(&with(&fixed(3, 2))).await;
    assert!(matches!(report, ReloadReport::Applied { .. }), "{report:?}");
    assert_eq!(served.hello().await.0, StatusCode::TOO_MANY_REQUESTS, "the same counter");

    // Another algorithm with a higher revision: fresh keys, applied.
    let report = served.rewrite_and_reload(&with(&bucket(3))).await;
    assert!(matches!(report, ReloadReport::Applied { .. }), "{report:?}");
    served.allowed_then_denied(5).await;
    // And the fixed window of revision 2 can no longer come back.
    let report = served.rewrite_and_reload(&removable(None, rate_limit, extra)).await;
    assert!(matches!(report, ReloadReport::Applied { .. }), "{report:?}");
    let report = served.rewrite_and_reload(&with(&fixed(3, 2))).await;
    assert!(problems(&report)[0].contains("went back from 3 to 2"), "{report:?}");
}

#[tokio::test]
async fn memory_a_removed_policy_is_judged_as_last_served() {
    a_removed_policy_comes_back_only_as_it_was_or_with_a_higher_revision("", "").await;
}

#[tokio::test]
async fn redis_a_removed_policy_is_judged_as_last_served() {
    let redis = RedisServer::start();
    let extra = format!(
        "[redis]\nenabled = true\nurls = [\"{}\"]\nkey-prefix = \"removed:\"\n",
        redis.url()
    );
    a_removed_policy_comes_back_only_as_it_was_or_with_a_higher_revision(
        "provider = \"redis\"",
        &extra,
    )
    .await;
}

/// Polls `check` every 20 ms for at most 10 s.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn hang_up(child: &std::process::Child) {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

fn write(path: &Path, toml: &str) {
    std::fs::write(path, toml).unwrap();
}

#[tokio::test]
async fn the_binary_reloads_on_sighup_and_keeps_its_table_on_a_bad_file() {
    let mut serve = Serve::start(&config(3, 1, ""), "app_bootstrap=info");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = serve.base.clone();
    let hello = async || {
        let response = client.get(format!("{base}/api/hello")).send().await.unwrap();
        let policy = response.headers().get("ratelimit-policy").cloned();
        (response.status(), policy.map(|p| p.to_str().unwrap().to_owned()).unwrap_or_default())
    };
    assert!(hello().await.1.contains("q=3"));

    write(&serve.config_path(), &config(7, 2, ""));
    hang_up(&serve.child);
    eventually("the reloaded limit", async || hello().await.1.contains("q=7")).await;
    // The swap comes before its log line: wait for the line too.
    eventually("the reload log line", async || {
        serve.logs().iter().any(|line| line.contains("configuration reloaded"))
    })
    .await;

    write(&serve.config_path(), "[capabilities.rate-limit]\nprovider = \"postgres\"\n");
    hang_up(&serve.child);
    eventually("the rejection log line", async || {
        serve.logs().iter().any(|line| line.contains("configuration reload rejected"))
    })
    .await;
    serve.assert_alive();
    assert!(hello().await.1.contains("q=7"), "the reloaded table stays in force");
}

/// A variable of the rate-limit table does not make a file without its
/// policies look whole: the file is asked alone.
#[tokio::test]
async fn a_variable_of_the_table_does_not_let_a_file_without_policies_through() {
    let trusted = [("CA_SKELETON_CAPABILITIES__RATE_LIMIT__TRUSTED_PROXIES", "10.0.0.1")];
    let mut serve = Serve::start_with_env(&config(3, 1, ""), "app_bootstrap=info", &trusted);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("{}/api/hello", serve.base);
    let policy = async || {
        let response = client.get(&url).send().await.unwrap();
        response.headers().get("ratelimit-policy").map(|p| p.to_str().unwrap().to_owned())
    };
    assert!(policy().await.unwrap_or_default().contains("q=3"));
    write(&serve.config_path(), "# being rewritten\n");
    hang_up(&serve.child);
    eventually("the rejection log line", async || {
        serve.logs().iter().any(|line| line.contains("configuration reload rejected"))
    })
    .await;
    serve.assert_alive();
    assert!(policy().await.unwrap_or_default().contains("q=3"), "the table in force stays");
}

/// Threads of process `pid` (Linux `/proc`); 0 once it is gone.
fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| line.strip_prefix("Threads:")?.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The status line of `GET /api/hello` over a plain socket.
fn hello_status(address: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connects");
    stream.write_all(b"GET /api/hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply.lines().next().unwrap_or_default().to_owned()
}

/// SIGHUPs from the moment the runtime has threads (before
/// the configuration is read) until the port serves, in ten start-ups: the
/// process survives every one, serves, and applies them as a reload.
#[test]
fn a_sighup_while_the_server_starts_is_never_fatal() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.toml");
    write(&path, &config(3, 1, ""));
    for run in 0..10 {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ca-skeleton"))
            .env_clear()
            .env("RUST_LOG", "app_bootstrap=info")
            .args(["--log-format", "json", "--config"])
            .arg(&path)
            .arg("serve")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("serve starts");
        let (lines, logged) = std::sync::mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let until = Instant::now() + Duration::from_secs(10);
        // Before `main` runs nothing can catch a signal; its runtime's
        // threads say it has, and the configuration is not read yet.
        while threads(child.id()) < 2 {
            assert!(Instant::now() < until, "run {run}: the runtime never started");
            assert!(child.try_wait().unwrap().is_none(), "run {run}: exited before its runtime");
        }
        let mut seen = Vec::new();
        let address = loop {
            hang_up(&child);
            if let Some(status) = child.try_wait().unwrap() {
                panic!("run {run}: a SIGHUP during start-up ended the process: {status}");
            }
            let listening = logged.try_iter().find_map(|line| {
                let event: serde_json::Value = serde_json::from_str(&line).ok()?;
                seen.push(line);
                (event["fields"]["message"] == "ca-skeleton listening")
                    .then(|| event["fields"]["address"].as_str().unwrap().to_owned())
            });
            if let Some(address) = listening {
                break address;
            }
            assert!(Instant::now() < until, "run {run}: never listened");
        };
        assert_eq!(hello_status(&address), "HTTP/1.1 200 OK", "run {run}");
        // What came during start-up is applied once it serves.
        while !seen.iter().any(|line| line.contains("SIGHUP received")) {
            assert!(Instant::now() < until, "run {run}: no reload for the queued SIGHUP");
            seen.extend(logged.recv_timeout(Duration::from_secs(1)).ok());
        }
        assert!(child.try_wait().unwrap().is_none(), "run {run}: exited");
        let _ = child.kill();
        let _ = child.wait();
    }
}
