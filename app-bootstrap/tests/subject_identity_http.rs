//! Who a request counts against, from outside, through the real server
//! with the built-in `default` policy (5 a minute): what a client can
//! write (an API key nobody checked, its own `Forwarded`, junk left of its
//! address in `X-Forwarded-For`) never buys it a budget of its own, and a
//! `trusted-proxies` list that trusts every address stops start-up.
//!
//! The server runs on a manual clock inside one minute window, so "5 a
//! minute" is exactly five 200s and a 429.

mod support;

use std::net::IpAddr;
use std::time::Duration;

use app_bootstrap::{AppConfig, ConfigSources};
use support::{Running, TEST_KEY, ca_skeleton, load, run, write};

/// The built-in policy's limit per minute (README's first screen).
const DEFAULT_LIMIT: usize = 5;

/// The loopback address the tests' trusted proxy connects from; other
/// clients connect from other loopback addresses.
const PROXY: &str = "127.0.0.1";

/// The server as shipped, with an ephemeral port and a fixed key; `extra`
/// adds lines to `[capabilities.rate-limit]`.
fn config(extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[capabilities.rate-limit]\n{extra}\n\n\
         [pseudonymizer.keys]\n1 = \"{TEST_KEY}\"\n"
    )
}

fn client_from(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(source.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// `GET /api/hello` from `client` with `headers`: its status.
async fn hello(server: &Running, client: &reqwest::Client, headers: &[(&str, &str)]) -> u16 {
    let mut request = client.get(server.url("/api/hello"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap().status().as_u16()
}

/// Five 200s then a 429: the budget of one subject.
fn one_budget() -> Vec<u16> {
    let mut statuses = vec![200; DEFAULT_LIMIT];
    statuses.push(429);
    statuses
}

#[tokio::test]
async fn a_made_up_api_key_on_every_request_is_still_limited_by_ip_by_default() {
    let server = Running::start(&load(&config(""))).await;
    let client = client_from(PROXY);
    let mut statuses = Vec::new();
    for n in 0..=DEFAULT_LIMIT {
        let key = format!("made-up-key-{n}-{}", 7919 * (n + 1));
        statuses.push(hello(&server, &client, &[("x-api-key", &key)]).await);
    }
    assert_eq!(statuses, one_budget(), "a fresh key per request bought a fresh budget");
    server.stop().await;
}

#[tokio::test]
async fn a_configured_api_key_header_names_the_subject() {
    let server = Running::start(&load(&config("api-key-header = \"x-api-key\""))).await;
    let client = client_from(PROXY);
    let mut statuses = Vec::new();
    for _ in 0..=DEFAULT_LIMIT {
        statuses.push(hello(&server, &client, &[("x-api-key", "verified-key-1")]).await);
    }
    assert_eq!(statuses, one_budget());
    // Another key is another subject; without a key the client's IP is.
    assert_eq!(hello(&server, &client, &[("x-api-key", "verified-key-2")]).await, 200);
    assert_eq!(hello(&server, &client, &[]).await, 200);
    server.stop().await;
}

#[tokio::test]
async fn behind_a_proxy_that_writes_x_forwarded_for_a_client_s_own_forwarded_is_ignored() {
    let trusted = format!("trusted-proxies = [\"{PROXY}/32\"]");
    let server = Running::start(&load(&config(&trusted))).await;
    let proxy = client_from(PROXY);
    let mut statuses = Vec::new();
    for n in 0..=DEFAULT_LIMIT {
        // The proxy appended the client's address to X-Forwarded-For and
        // passed the client's own Forwarded through.
        let forwarded = format!("for=198.51.100.{}", n + 1);
        let headers = [("x-forwarded-for", "203.0.113.5"), ("forwarded", forwarded.as_str())];
        statuses.push(hello(&server, &proxy, &headers).await);
    }
    assert_eq!(statuses, one_budget(), "a spoofed Forwarded picked the subject");
    server.stop().await;
}

#[tokio::test]
async fn behind_a_proxy_that_writes_forwarded_a_client_s_own_x_forwarded_for_is_ignored() {
    let trusted = format!("trusted-proxies = [\"{PROXY}/32\"]\nclient-ip-header = \"forwarded\"");
    let server = Running::start(&load(&config(&trusted))).await;
    let proxy = client_from(PROXY);
    let mut statuses = Vec::new();
    for n in 0..=DEFAULT_LIMIT {
        let spoofed = format!("198.51.100.{}", n + 1);
        let headers = [("forwarded", "for=203.0.113.5"), ("x-forwarded-for", spoofed.as_str())];
        statuses.push(hello(&server, &proxy, &headers).await);
    }
    assert_eq!(statuses, one_budget(), "a spoofed X-Forwarded-For picked the subject");
    // The proxy's own requests (no header) still have their own budget.
    assert_eq!(hello(&server, &proxy, &[]).await, 200);
    server.stop().await;
}

#[tokio::test]
async fn junk_left_of_the_client_s_address_counts_against_that_client() {
    let trusted = format!("trusted-proxies = [\"{PROXY}/32\"]");
    let server = Running::start(&load(&config(&trusted))).await;
    let proxy = client_from(PROXY);
    let mut statuses = Vec::new();
    for _ in 0..DEFAULT_LIMIT {
        let headers = [("x-forwarded-for", "not-an-ip, 203.0.113.5")];
        statuses.push(hello(&server, &proxy, &headers).await);
    }
    // Those five were 203.0.113.5's: its budget is spent.
    statuses.push(hello(&server, &proxy, &[("x-forwarded-for", "203.0.113.5")]).await);
    assert_eq!(statuses, one_budget(), "the junk moved 203.0.113.5 out of its own budget");
    // Non-ASCII junk on the client's own line, the proxy's entry on its own
    // line: still 203.0.113.5.
    let junk_line = proxy
        .get(server.url("/api/hello"))
        .header("x-forwarded-for", reqwest::header::HeaderValue::from_bytes(b"\xff\xfe").unwrap())
        .header("x-forwarded-for", "203.0.113.5");
    assert_eq!(junk_line.send().await.unwrap().status().as_u16(), 429);
    // The proxy's budget, which every client behind it would share, was
    // never spent; nor was another client's.
    assert_eq!(hello(&server, &proxy, &[]).await, 200);
    assert_eq!(hello(&server, &proxy, &[("x-forwarded-for", "junk, 203.0.113.6")]).await, 200);
    server.stop().await;
}

const TRUSTS_EVERYONE: [&str; 4] = [
    "[\"0.0.0.0/0\"]",
    "[\"10.0.0.0/8\", \"::/0\"]",
    "[\"0.0.0.0/1\", \"128.0.0.0/1\"]",
    "[\"::/1\", \"8000::/1\"]",
];

#[test]
fn trusted_proxies_that_trust_every_address_stop_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for list in TRUSTS_EVERYONE {
        let path = write(dir.path(), "open.toml", &config(&format!("trusted-proxies = {list}")));
        let error = AppConfig::load(&ConfigSources::file_only(path.clone()))
            .map(|_| ())
            .expect_err(list)
            .to_string();
        assert!(error.contains("capabilities.rate-limit.trusted-proxies"), "{list}: {error}");
        assert!(error.contains("every"), "{list}: {error}");
        // The binary refuses it before serving.
        let (output, stdout, stderr) =
            run(ca_skeleton().arg("--config").arg(&path).arg("check-config"));
        assert!(!output.status.success(), "{list}: {stdout}{stderr}");
        assert!(stderr.contains("capabilities.rate-limit.trusted-proxies"), "{list}: {stderr}");
    }
}

#[test]
fn an_unknown_client_ip_header_stops_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "header.toml", &config("client-ip-header = \"x-real-ip\""));
    let error = AppConfig::load(&ConfigSources::file_only(path)).map(|_| ()).unwrap_err();
    let error = error.to_string();
    assert!(error.contains("capabilities.rate-limit.client-ip-header"), "{error}");
    assert!(error.contains("\"x-forwarded-for\" or \"forwarded\""), "{error}");
}
