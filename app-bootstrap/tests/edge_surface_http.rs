//! The public listener's edges over real TCP: a path no route serves is
//! rate limited as `"<METHOD> <unmatched>"` while the probes never are;
//! the API's own refusals (404, 405, a bad query) are problem+json with a
//! type from `problem-type-base`; a client that half-closes after its
//! request still gets the answer; and the admin API refuses a request that
//! carries two `Authorization` headers.

mod support;

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use support::{Reply, Running, TEST_KEY, load};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const POLICY: &str = "surface";
const BASE: &str = "https://errors.example.com/rate-limit/";
/// Exactly the 32 bytes the admin token needs.
const TOKEN: &str = "surface-e2e-token-0123456789abcd";

/// A fixed window of 3 per 60 s, the default policy, with its own
/// problem type base and the admin listener on.
fn config() -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
provider = "memory"
default-policy = "{POLICY}"
problem-type-base = "{BASE}"

[capabilities.rate-limit.policies.{POLICY}]
algorithm = "fixed-window"
limit = 3
window = "60s"

[pseudonymizer.keys]
1 = "{TEST_KEY}"

[admin]
listen = "127.0.0.1:0"
token = "{TOKEN}"
"#
    )
}

/// A problem+json answer of `status` whose type is `BASE` + `category`.
fn assert_problem(reply: &Reply, status: StatusCode, category: &str) {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"), "{reply:?}");
    let body: Value = serde_json::from_str(&reply.body).expect("a JSON body");
    assert_eq!(body["type"], format!("{BASE}{category}").as_str(), "{}", reply.body);
    assert_eq!(body["status"], status.as_u16(), "{}", reply.body);
}

#[tokio::test]
async fn a_path_no_route_serves_is_limited_as_unmatched_and_the_probes_never_are() {
    let server = Running::start(&load(&config())).await;
    // Three per 60 s (the default policy), counted for `GET <unmatched>`:
    // every path no route serves shares that one budget.
    for (remaining, path) in [(2, "/nothing"), (1, "/api/nothing"), (0, "/healthz/more")] {
        let reply = server.get(path).await;
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""surface";q=3;w=60"#), "{path}");
        let expected = format!(r#""surface";r={remaining};t=60"#);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()), "{path}");
        assert_problem(&reply, StatusCode::NOT_FOUND, "not-found");
    }
    let refused = server.get("/yet-another").await;
    assert_problem(&refused, StatusCode::TOO_MANY_REQUESTS, "denied");
    assert_eq!(refused.header("retry-after"), Some("60"));
    // Another method is another operation, with its own budget.
    let post = server.post("/nothing").await;
    assert_problem(&post, StatusCode::NOT_FOUND, "not-found");
    assert_eq!(post.header("ratelimit"), Some(r#""surface";r=2;t=60"#));
    // The probes stay outside the layer: never charged, never refused.
    for _ in 0..5 {
        for probe in ["/healthz", "/readyz", "/metrics"] {
            let reply = server.get(probe).await;
            assert_eq!(reply.status, StatusCode::OK, "{probe}: {}", reply.body);
            assert_eq!(reply.header("ratelimit"), None, "{probe}");
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn the_apis_own_refusals_are_problem_json_with_the_configured_type() {
    let server = Running::start(&load(&config())).await;
    let bad_query = server.get("/api/work?ms=abc").await;
    assert_problem(&bad_query, StatusCode::BAD_REQUEST, "invalid-query");
    // A method the route does not take: 405 with `Allow`, behind the layer
    // (charged as `DELETE /api/hello`, the default policy).
    let wrong_method = server.request(Method::DELETE, "/api/hello").await;
    assert_problem(&wrong_method, StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed");
    let allow = wrong_method.header("allow").expect("an Allow header");
    assert!(allow.contains("GET") && allow.contains("HEAD"), "{allow}");
    assert_eq!(wrong_method.header("ratelimit"), Some(r#""surface";r=2;t=60"#));
    // A probe's wrong method is problem+json too, and not charged.
    let probe = server.post("/healthz").await;
    assert_problem(&probe, StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed");
    assert_eq!(probe.header("ratelimit"), None);
    server.stop().await;
}

/// Sends `request` on a fresh connection, shuts the sending side
/// (`shutdown(SHUT_WR)`), and reads until the server closes.
async fn half_closed_exchange(server: &Running, request: &str) -> String {
    let mut stream = TcpStream::connect(server.address).await.expect("a connection");
    stream.write_all(request.as_bytes()).await.expect("the request is sent");
    stream.shutdown().await.expect("the sending side is shut");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes")
        .expect("the answer is read");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let server = Running::start(&load(&config())).await;
    let answer =
        half_closed_exchange(&server, "GET /api/hello HTTP/1.1\r\nHost: edge\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
    assert!(answer.contains(r#"{"message":"hello"}"#), "{answer:?}");
    // A handler that takes a while answers too, after the client's FIN.
    let answer =
        half_closed_exchange(&server, "GET /api/work?ms=100 HTTP/1.1\r\nHost: edge\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
    assert!(answer.contains(r#"{"worked-ms":100}"#), "{answer:?}");
    server.stop().await;
}

#[tokio::test]
async fn two_authorization_headers_on_the_admin_api_are_refused() {
    let server = Running::start(&load(&config())).await;
    let admin = server.admin.expect("admin.listen is set");
    let client = reqwest::Client::builder().no_proxy().build().expect("an HTTP client");
    let url = format!("http://{admin}/admin/reload");
    let bearer = format!("Bearer {TOKEN}");
    let wrong = "Bearer surface-e2e-token-0123456789abcX".to_owned();
    // The right token twice, or first or second beside a wrong one: one
    // request, two credentials, so which one counts is never guessed.
    for (first, second) in [(&bearer, &bearer), (&bearer, &wrong), (&wrong, &bearer)] {
        let response = client
            .post(&url)
            .header("authorization", first)
            .header("authorization", second)
            .send()
            .await
            .expect("the listener answers");
        let status = response.status();
        let content_type = response.headers().get("content-type").cloned();
        let body: Value = response.json().await.expect("a JSON body");
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(content_type.unwrap(), "application/problem+json");
        assert_eq!(body["type"], format!("{BASE}admin/duplicate-authorization").as_str());
    }
    // One header with the token still passes (the harness has no
    // configuration sources to reload: 409, past the token check).
    let response = client.post(&url).header("authorization", &bearer).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    server.stop().await;
}
