//! The `ca-skeleton` binary itself: exit codes, the global `--config`
//! option, `check-config`, `bench`'s JSON line, `serve` with no
//! configuration at all, stopped by SIGTERM, and what a half-sent request
//! can no longer hold up: the shutdown, or a connection past the
//! header-read timeout.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{ca_skeleton, run, write};

const KEY: &str = "binary-test-pseudonymizer-key-0123456789";

const BAD: &str = r#"
[capabilities.rate-limit]
default-policy = "api"
[capabilities.rate-limit.policies.api]
algorithm = "leaky-bucket"
limit = 5
window = "1s"
"#;

#[test]
fn check_config_with_a_bad_file_exits_non_zero_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(dir.path(), "bad.toml", BAD);
    // `--config` is global: before or after the subcommand, or the variable.
    let mut before = ca_skeleton();
    before.arg("--config").arg(&bad).arg("check-config");
    let mut after = ca_skeleton();
    after.arg("check-config").arg("--config").arg(&bad);
    let mut variable = ca_skeleton();
    variable.env("CA_SKELETON_CONFIG", &bad).arg("check-config");
    for mut command in [before, after, variable] {
        let (output, stdout, stderr) = run(&mut command);
        assert!(!output.status.success(), "{stdout}{stderr}");
        assert!(
            stderr.contains("capabilities.rate-limit.policies.api.algorithm"),
            "the key is not named:\n{stderr}"
        );
        assert!(stdout.is_empty(), "nothing is printed as valid: {stdout}");
    }
}

/// A misspelled operation would silently fall back to the default set, so
/// both `serve` and `check-config` refuse it, naming the key.
#[test]
fn an_operation_that_names_no_served_route_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let typo = write(
        dir.path(),
        "typo.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\n[capabilities.rate-limit.operations]\n\"GET /api/helo\" = \"default\"\n",
    );
    for subcommand in ["serve", "check-config"] {
        let (output, stdout, stderr) =
            run(ca_skeleton().arg("--config").arg(&typo).arg(subcommand));
        assert!(!output.status.success(), "{subcommand}: {stdout}{stderr}");
        assert!(
            stderr.contains(r#"capabilities.rate-limit.operations."GET /api/helo""#),
            "{subcommand}: the key is not named:\n{stderr}"
        );
        assert!(
            stderr.contains("GET /api/hello"),
            "{subcommand}: the served routes are listed:\n{stderr}"
        );
    }
}

#[test]
fn check_config_prints_the_resolved_configuration_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        dir.path(),
        "good.toml",
        &format!(
            "[pseudonymizer.keys]\n1 = \"{KEY}\"\n[redis]\npassword = {{ env = \"BINARY_TEST_PASSWORD\" }}\n"
        ),
    );
    let (output, stdout, stderr) = run(ca_skeleton()
        .env("BINARY_TEST_PASSWORD", "password-from-the-environment")
        .env("CA_SKELETON_SERVER__LISTEN", "127.0.0.1:9999")
        .args(["check-config", "--config"])
        .arg(&good));
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains(r#"listen = "127.0.0.1:9999""#), "{stdout}");
    assert!(stdout.contains(r#"1 = "[REDACTED]""#), "{stdout}");
    assert!(stdout.contains("BINARY_TEST_PASSWORD"), "{stdout}");
    for secret in [KEY, "password-from-the-environment"] {
        assert!(!stdout.contains(secret) && !stderr.contains(secret), "{secret} leaked");
    }
}

/// `check-config` of `path` with the variables the examples name set.
fn check_example(path: &Path) -> (Output, String, String) {
    run(ca_skeleton()
        .env("RATE_LIMIT_PSEUDONYMIZER_KEY", KEY)
        .env("RATE_LIMIT_ADMIN_TOKEN", "example-admin-token-0123456789abcdef")
        .env("REDIS_PASSWORD", "example-password")
        .env("REDIS_SENTINEL_PASSWORD", "example-password")
        .arg("check-config")
        .arg("--config")
        .arg(path))
}

/// Every ```` ```toml ```` block of the README and of docs/*.md, as
/// (`file:line`, block). A block fenced otherwise (```` ```toml Cargo.toml
/// ````, a manifest) is not a configuration and is left out.
fn toml_snippets() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut snippets = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let mut open: Option<(usize, String)> = None;
        for (index, line) in text.lines().enumerate() {
            match (&mut open, line.trim_end()) {
                (None, "```toml") => open = Some((index + 1, String::new())),
                (Some((start, _)), "```") => {
                    let start = *start;
                    let (_, block) = open.take().unwrap();
                    snippets.push((format!("{name}:{start}"), block));
                }
                (Some((_, block)), _) => {
                    block.push_str(line);
                    block.push('\n');
                }
                (None, _) => {}
            }
        }
        assert!(open.is_none(), "{name}: a ```toml block is never closed");
    }
    snippets
}

/// Every configuration snippet of the docs loads as written, by itself,
/// with the routes `serve` serves.
#[test]
fn every_toml_snippet_of_the_docs_passes_check_config() {
    let snippets = toml_snippets();
    assert!(snippets.iter().any(|(at, _)| at.starts_with("README.md")), "{snippets:?}");
    let dir = tempfile::tempdir().unwrap();
    let mut failed = Vec::new();
    for (at, snippet) in &snippets {
        let path = write(dir.path(), "snippet.toml", snippet);
        let (output, _, stderr) = check_example(&path);
        if !output.status.success() {
            failed.push(format!("{at} does not load by itself:\n{snippet}{stderr}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn the_example_files_pass_check_config() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    // Every file there, so one added later is checked without being listed.
    let mut names: Vec<String> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".toml"))
        .collect();
    names.sort();
    assert!(names.len() >= 5 && names.contains(&"bench.toml".to_owned()), "{names:?}");
    for name in &names {
        let (output, stdout, stderr) = check_example(&examples.join(name));
        assert!(output.status.success(), "{name}:\n{stderr}");
        assert!(!stdout.contains(KEY) && !stdout.contains("example-password"), "{name}:\n{stdout}");
    }
}

#[test]
fn bench_prints_exactly_one_parseable_json_line() {
    let (output, stdout, stderr) = run(ca_skeleton().args([
        "bench",
        "--duration",
        "2s",
        "--concurrency",
        "4",
        "--subjects",
        "50",
    ]));
    assert!(output.status.success(), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let report: serde_json::Value = serde_json::from_str(lines[0]).expect("one JSON object");
    assert_eq!(report["provider"], "memory");
    assert_eq!(report["runtime"], "multi-thread");
    assert_eq!(report["algorithm"], "fixed-window");
    assert_eq!(report["concurrency"], 4);
    assert_eq!(report["subjects"], 50);
    let decisions = report["decisions"].as_u64().unwrap();
    let allowed = report["allowed"].as_u64().unwrap();
    let denied = report["denied"].as_u64().unwrap();
    assert!(decisions > 0);
    // The demo policy allows 5 per subject per minute; 50 subjects: at most
    // 500 over two minute windows, and a 2 s run sees one or two windows.
    assert!((250..=500).contains(&allowed), "{report}");
    assert_eq!(allowed + denied, decisions, "{report}");
    assert_eq!(report["outcomes"]["allowed"].as_u64(), Some(allowed));
    for field in ["decisions_per_sec", "p50_us", "p99_us"] {
        assert!(report[field].as_f64().is_some_and(|v| v > 0.0), "{field}: {report}");
    }
}

#[test]
fn bench_runs_on_the_current_thread_runtime_when_asked() {
    let (output, stdout, stderr) = run(ca_skeleton().args([
        "bench",
        "--duration",
        "1s",
        "--concurrency",
        "4",
        "--runtime",
        "current-thread",
    ]));
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(report["runtime"], "current-thread");
    assert!(report["decisions"].as_u64().is_some_and(|n| n > 0), "{report}");

    let (output, stdout, stderr) = run(ca_skeleton().args(["bench", "--runtime", "single"]));
    assert!(!output.status.success() && stdout.is_empty());
    assert!(stderr.contains("multi-thread") && stderr.contains("current-thread"), "{stderr}");
}

/// One caller, one subject, one slot: only a lease given back after each
/// decision lets the next one in.
#[test]
fn bench_gives_back_each_lease_it_takes() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "bench.toml",
        "[capabilities.rate-limit]\ndefault-policy = \"one\"\n\
         [capabilities.rate-limit.policies.one]\nalgorithm = \"concurrency\"\n\
         max-in-flight = 1\nlease-ttl = \"1h\"\nretry-after = \"1s\"\n",
    );
    let (output, stdout, stderr) = run(ca_skeleton().arg("--config").arg(&config).args([
        "bench",
        "--duration",
        "1s",
        "--concurrency",
        "1",
        "--subjects",
        "1",
    ]));
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(report["algorithm"], "concurrency");
    let decisions = report["decisions"].as_u64().unwrap();
    assert!(decisions > 1, "{report}");
    assert_eq!(report["allowed"].as_u64(), Some(decisions), "{report}");
    assert_eq!(report["denied"].as_u64(), Some(0), "{report}");
}

#[test]
fn bench_refuses_an_unknown_policy() {
    let (output, _, stderr) =
        run(ca_skeleton().args(["bench", "--duration", "1s", "--policy", "nope"]));
    assert!(!output.status.success());
    assert!(stderr.contains("\"nope\" is not configured"), "{stderr}");
}

#[test]
fn bench_refuses_a_duration_past_a_day_instead_of_panicking() {
    let (output, _, stderr) = run(ca_skeleton().args(["bench", "--duration", "300000000000y"]));
    assert_eq!(output.status.code(), Some(2), "a usage error: {stderr}");
    assert!(stderr.contains("--duration") && stderr.contains("at most 1day"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn redis_acl_prints_the_rule() {
    let (output, stdout, _) = run(ca_skeleton().arg("redis-acl"));
    assert!(output.status.success());
    assert!(stdout.starts_with("ACL SETUSER ca-rate-limit reset on "), "{stdout}");
    assert!(stdout.contains("~ca:rl:*"), "{stdout}");
}

/// `redis-acl` reads `[redis]` alone: the pseudonymizer key and the admin
/// token may name variables the machine printing the rule does not have.
#[test]
fn redis_acl_needs_only_the_redis_section_and_its_password() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "acl.toml",
        r#"
[capabilities.rate-limit]
provider = "redis"
[pseudonymizer.keys]
1 = { env = "RATE_LIMIT_PSEUDONYMIZER_KEY" }
[admin]
listen = "127.0.0.1:9091"
token = { env = "RATE_LIMIT_ADMIN_TOKEN" }
[redis]
enabled = true
username = "edge"
password = { env = "REDIS_PASSWORD" }
key-prefix = "acl:"
"#,
    );
    let (output, stdout, stderr) = run(ca_skeleton()
        .env("REDIS_PASSWORD", "hunter2")
        .arg("--config")
        .arg(&file)
        .arg("redis-acl"));
    assert!(output.status.success(), "{stderr}");
    // sha256("hunter2")
    let hash = "f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7";
    assert!(stdout.starts_with(&format!("ACL SETUSER edge reset on #{hash} ~acl:* ")), "{stdout}");
    // A broken [redis] is still refused, naming the key.
    let bad = write(
        dir.path(),
        "bad.toml",
        "[redis]
key-prefix = \"a{b}\"\n",
    );
    let (output, _, stderr) = run(ca_skeleton().arg("--config").arg(&bad).arg("redis-acl"));
    assert!(!output.status.success());
    assert!(stderr.contains("redis.key-prefix"), "{stderr}");
}

/// With no file and no variables, `ca-skeleton` (no subcommand) serves the
/// memory demo with a generated key (and says so), never logs a subject,
/// and SIGTERM stops it cleanly.
#[test]
fn serve_is_the_default_and_stops_on_sigterm() {
    const API_KEY: &str = "binary-test-api-key-value";
    let mut child = ca_skeleton()
        // Our crates at their most verbose: still no subject in any line.
        .env("RUST_LOG", "info,app_bootstrap=trace,adapter_web=trace,adapter_memory=trace")
        .env("CA_SKELETON_SERVER__LISTEN", "127.0.0.1:0")
        // The key is a subject only where a header is configured to carry one.
        .env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__API_KEY_HEADER", "x-api-key")
        .args(["--log-format", "json"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut warned = false;
    let address = loop {
        let line = lines.next().expect("a log line before listening").unwrap();
        let event: serde_json::Value = serde_json::from_str(&line).expect("JSON logs");
        let message = event["fields"]["message"].as_str().unwrap_or_default();
        warned |= event["level"] == "WARN" && message.contains("generated a random one");
        if message == "ca-skeleton listening" {
            assert_eq!(event["fields"]["provider"], "memory");
            break event["fields"]["address"].as_str().unwrap().to_owned();
        }
    };
    assert!(warned, "the generated key is announced");

    let base = format!("http://{address}");
    let statuses = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            let healthz = client.get(format!("{base}/healthz")).send().await.unwrap();
            let mut statuses = vec![healthz.status().as_u16()];
            // Six calls with an API key: the demo policy allows five.
            for _ in 0..6 {
                let reply = client
                    .get(format!("{base}/api/hello"))
                    .header("x-api-key", API_KEY)
                    .send()
                    .await
                    .unwrap();
                statuses.push(reply.status().as_u16());
            }
            statuses
        })
    })
    .join()
    .unwrap();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 429]);

    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "serve did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "graceful shutdown exits 0, got {exit}");

    // The rest of the log, up to the shutdown: no API key, no client address.
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|line| line.contains("shutdown signal received")), "{rest:#?}");
    for line in &rest {
        assert!(!line.contains(API_KEY), "a log line holds the API key: {line}");
        assert!(!line.contains("127.0.0.1"), "a log line holds an address: {line}");
    }
}

/// The signals process `pid` catches: `SigCgt` of `/proc/<pid>/status`,
/// bit `n - 1` for signal `n`.
fn caught_signals(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or(0)
}

/// A SIGTERM at any point of `serve`'s start-up stops it with exit 0: from
/// the moment `main` caught SIGHUP (its first act; SIGTERM is caught just
/// before it), through reading the configuration, building, binding, to
/// serving. Before, SIGTERM was caught only once the server served: one
/// sent earlier killed the process (signal 15, no graceful exit), and one
/// falling between the runtime installing its handler and listening on it
/// was lost (the process served on).
#[test]
fn a_sigterm_at_any_point_of_start_up_stops_serve() {
    const SIGHUP_BIT: u64 = 1 << (1 - 1);
    for round in 0..3 {
        for after_main_ms in [0, 1, 2, 5, 10, 20, 40, 80] {
            let mut child = ca_skeleton()
                .env("CA_SKELETON_SERVER__LISTEN", "127.0.0.1:0")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("serve starts");
            let pid = child.id();
            // `main` runs once SIGHUP is caught (bounded: a few seconds).
            let mut polls = 0;
            while caught_signals(pid) & SIGHUP_BIT == 0 {
                polls += 1;
                assert!(polls < 5_000, "main never caught SIGHUP");
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(after_main_ms));
            let killed = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            assert!(killed.unwrap().success());
            let deadline = Instant::now() + Duration::from_secs(10);
            let exit = loop {
                if let Some(exit) = child.try_wait().unwrap() {
                    break exit;
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    panic!("round {round}: SIGTERM {after_main_ms} ms after main was ignored");
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            assert!(
                exit.success(),
                "round {round}: SIGTERM {after_main_ms} ms after main: {exit}, not a clean stop"
            );
        }
    }
}

/// `serve` on ephemeral public and admin ports with `server` keys added.
fn serve_with(server: &str) -> support::Serve {
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{server}\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         token = \"binary-test-admin-token-0123456789\"\n[pseudonymizer.keys]\n1 = \"{KEY}\"\n"
    );
    support::Serve::start(&config, "info")
}

/// A connection that sent the start of a request and no blank line.
fn half_sent(address: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).expect("the listener accepts");
    stream.write_all(b"GET /api/hello HTTP/1.1\r\nHost: x\r\n").unwrap();
    stream
}

/// SIGTERM, then how long the process took to exit, and how.
fn terminate(
    serve: &mut support::Serve,
    patience: Duration,
) -> (std::process::ExitStatus, Duration) {
    let killed = Command::new("kill").args(["-TERM", &serve.child.id().to_string()]).status();
    assert!(killed.unwrap().success());
    let sent = Instant::now();
    loop {
        if let Some(exit) = serve.child.try_wait().unwrap() {
            return (exit, sent.elapsed());
        }
        assert!(sent.elapsed() < patience, "serve still runs {patience:?} after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client that never finishes its request no longer keeps SIGTERM from
/// completing: after `server.shutdown-grace` the process exits, and each
/// listener logs how many connections it cut. The header-read timeout is
/// set far out, so it is the grace that ends them.
#[test]
fn a_half_sent_request_holds_the_shutdown_no_longer_than_the_grace() {
    let mut serve = serve_with("shutdown-grace = \"1s\"\nheader-read-timeout = \"60s\"\n");
    let public: SocketAddr = serve.base.trim_start_matches("http://").parse().unwrap();
    let held = [half_sent(public), half_sent(serve.admin_address())];
    // Both are being read, not just queued.
    std::thread::sleep(Duration::from_millis(200));
    let (exit, took) = terminate(&mut serve, Duration::from_secs(6));
    assert!(exit.success(), "a bounded drain is still a clean exit: {exit}");
    assert!(took >= Duration::from_millis(900), "it waited for the grace first: {took:?}");
    assert!(took < Duration::from_secs(4), "grace 1 s plus a margin: {took:?}");
    // The reader thread may still be taking the last lines.
    std::thread::sleep(Duration::from_millis(200));
    let cut: Vec<serde_json::Value> = serve
        .logs()
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["fields"]["message"] == "shutdown grace elapsed; connections cut")
        .collect();
    let mut listeners: Vec<String> = cut
        .iter()
        .map(|event| format!("{} {}", event["fields"]["listener"], event["fields"]["cut"]))
        .collect();
    listeners.sort();
    assert_eq!(listeners, [r#""admin" 1"#, r#""public" 1"#], "{cut:?}");
    drop(held);
}

/// A slow-loris connection, on either listener, is closed once
/// `server.header-read-timeout` passes without a whole request head.
#[test]
fn a_connection_that_never_finishes_its_headers_is_closed_after_the_timeout() {
    let serve = serve_with("header-read-timeout = \"1s\"\n");
    let public: SocketAddr = serve.base.trim_start_matches("http://").parse().unwrap();
    for address in [public, serve.admin_address()] {
        let mut stream = half_sent(address);
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let started = Instant::now();
        let mut answer = Vec::new();
        // Closed: end of stream (after a 408, if hyper sends one) or a reset.
        let closed = match stream.read_to_end(&mut answer) {
            Ok(_) => true,
            Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
        };
        let took = started.elapsed();
        assert!(closed, "{address}: still open after {took:?}");
        assert!(
            took >= Duration::from_millis(900),
            "{address}: closed before the timeout: {took:?}"
        );
        let answer = String::from_utf8_lossy(&answer);
        assert!(!answer.contains("200 OK"), "{address}: the half request was served: {answer}");
    }
}
