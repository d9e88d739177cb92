//! In-flight leases end to end: the real `ca-skeleton serve` binary with the
//! memory provider (and on Redis for the shutdown),
//! `GET /api/work?ms=N` under a concurrency policy of `max-in-flight = 2`
//! (README, "Limit requests in flight").

mod support;

use std::time::Duration;

use reqwest::StatusCode;
use support::{Reply, Serve, TEST_KEY, counter, redis_cli};

fn config() -> String {
    config_with("", "memory", "")
}

/// The demo route under `max-in-flight = 2` on `provider`, with `server`
/// keys added and `sections` appended.
fn config_with(server: &str, provider: &str, sections: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
{server}
[capabilities.rate-limit]
provider = "{provider}"
default-policy = "e2e-api"

[capabilities.rate-limit.operations]
"GET /api/work" = "e2e-work"

[capabilities.rate-limit.policies.e2e-api]
algorithm = "fixed-window"
limit = 1000
window = "60s"

[capabilities.rate-limit.policies.e2e-work]
algorithm = "concurrency"
max-in-flight = 2
lease-ttl = "30s"
retry-after = "2s"

[pseudonymizer.keys]
1 = "{TEST_KEY}"
{sections}
"#
    )
}

async fn get(client: &reqwest::Client, url: String) -> Reply {
    let response = client.get(url).send().await.expect("the server answers");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.text().await.expect("a readable body");
    Reply { status, headers, body }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_requests_in_flight_pass_the_third_is_refused_and_a_finished_one_frees_its_slot() {
    let server = Serve::start(&config(), "info");
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client");
    let url = |path: &str| format!("{}{path}", server.base);

    // Three at once, each holding its slot for the longest wait the route
    // takes: whichever comes third finds both slots taken. The refusal
    // answers at once, while the two admitted ones still wait.
    let work = url("/api/work?ms=5000");
    let (a, b, c) = tokio::join!(
        get(&client, work.clone()),
        get(&client, work.clone()),
        get(&client, work.clone())
    );
    let mut replies = [a, b, c];
    replies.sort_by_key(|reply| reply.status);
    let statuses: Vec<_> = replies.iter().map(|reply| reply.status).collect();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    for admitted in &replies[..2] {
        assert_eq!(admitted.header("ratelimit-policy"), Some(r#""e2e-work";q=2"#));
        assert_eq!(admitted.body, r#"{"worked-ms":5000}"#);
    }
    let refused = &replies[2];
    assert_eq!(refused.header("retry-after"), Some("2"), "the policy's retry-after");
    assert_eq!(refused.header("ratelimit-policy"), Some(r#""e2e-work";q=2"#));
    assert_eq!(refused.header("ratelimit"), Some(r#""e2e-work";r=0"#));
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    assert!(refused.body.contains(r#""violated-policies":["e2e-work"]"#), "{}", refused.body);

    // Both finished: their slots are free again, one after the other.
    for _ in 0..3 {
        let reply = get(&client, url("/api/work?ms=0")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.header("ratelimit"), Some(r#""e2e-work";r=1"#));
    }
    // A bad wait is the handler's 400, and its slot is given back too.
    for _ in 0..3 {
        let reply = get(&client, url("/api/work?ms=5001")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    }

    let metrics = get(&client, url("/metrics")).await.body;
    let decisions = |outcome: &str| {
        counter(
            &metrics,
            &format!(
                r#"ca_skeleton_rate_limit_decisions_total{{policy="e2e-work",algorithm="concurrency",outcome="{outcome}",mode="enforce",cached="false",front="http"}}"#
            ),
        )
    };
    assert_eq!((decisions("allowed"), decisions("denied")), (8, 1), "{metrics}");
    // Registered at 0: no release failed.
    assert!(
        metrics.lines().any(|line| line == "ca_skeleton_rate_limit_lease_release_failures_total 0"),
        "{metrics}"
    );
}

/// SIGTERM while two requests hold their leases on Redis, with a shutdown
/// grace shorter than their work: the grace elapses, their connections are
/// cut, and the process waits for the two releases before it ends, so the
/// lease set holds its clock mark only (before, the runtime ended first and
/// both leases stayed until they expired).
#[test]
fn leases_of_connections_cut_at_shutdown_are_given_back() {
    use std::io::Write;
    let redis = redis_fixture::RedisServer::start();
    let redis_section =
        format!("[redis]\nenabled = true\nurls = [\"{}\"]\nkey-prefix = \"cut:\"\n", redis.url());
    let config = config_with("shutdown-grace = \"1s\"", "redis", &redis_section);
    let mut serve = Serve::start(&config, "info");
    let public = serve.base.trim_start_matches("http://").to_owned();
    // Two requests that work 5 s each, far past the grace.
    let held: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(&public).expect("the listener accepts");
            stream.write_all(b"GET /api/work?ms=5000 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            stream
        })
        .collect();
    // Both leases are taken: the set holds them and its mark.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let key = loop {
        assert!(std::time::Instant::now() < deadline, "the two leases were never taken");
        let keys = redis_cli(redis.port(), &["--scan", "--pattern", "cut:*e2e-work*"]);
        if let Some(key) = keys.lines().next() {
            if redis_cli(redis.port(), &["ZCARD", key]) == "3" {
                break key.to_owned();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &serve.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let exit = serve.child.wait().expect("serve exits");
    assert!(exit.success(), "{exit}");
    assert_eq!(redis_cli(redis.port(), &["ZCARD", &key]), "1", "the mark only: {key}");
    drop(held);
}
