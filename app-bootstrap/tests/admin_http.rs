//! The admin listener over real TCP with reqwest, on the memory provider
//! and on a spawned `redis-server` (never 6379): the bearer token, inspect
//! without charging, reset until the next request passes, the pseudonym
//! lookup giving the pseudonym the edge counts under, input errors, the
//! lookup's own limit, and no admin route on the public port.

mod support;

use std::net::SocketAddr;

use adapter_web::{SubjectKind, VersionedPseudonymizer};
use redis_fixture::RedisServer;
use reqwest::{Method, StatusCode};
use secrecy::SecretSlice;
use serde_json::{Value, json};
use support::{Running, TEST_KEY, fixed_window_config, load};

/// Exactly the 32 bytes the token needs.
const TOKEN: &str = "admin-e2e-token-0123456789abcdef";
const POLICY: &str = "admin-e2e";
/// The demo route's operation, URL-encoded for `?operation=`.
const HELLO: &str = "GET%20/api/hello";

fn admin_section() -> String {
    format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n")
}

/// The API key these tests send names the subject.
fn memory_config() -> String {
    fixed_window_config(POLICY, "memory", &admin_section()).replacen(
        "[capabilities.rate-limit]\n",
        "[capabilities.rate-limit]\napi-key-header = \"x-api-key\"\n",
        1,
    )
}

fn redis_config(redis: &RedisServer) -> String {
    let extra = format!(
        "[redis]\nenabled = true\nurls = [\"{}\"]\nkey-prefix = \"admin-e2e:\"\n{}",
        redis.url(),
        admin_section()
    );
    fixed_window_config(POLICY, "redis", &extra)
}

/// A reqwest client for both listeners.
struct Admin {
    client: reqwest::Client,
    base: String,
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|_| panic!("JSON: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// A problem+json answer of `status` whose type ends in `admin/<category>`.
    fn assert_problem(&self, status: StatusCode, category: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(self.header("content-type"), Some("application/problem+json"), "{self:?}");
        let kind = self.json()["type"].as_str().unwrap_or_default().to_owned();
        assert!(kind.ends_with(&format!("admin/{category}")), "{kind}");
    }
}

impl Admin {
    fn of(address: SocketAddr) -> Self {
        let client = reqwest::Client::builder().no_proxy().build().expect("an HTTP client");
        Self { client, base: format!("http://{address}") }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the listener answers");
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.text().await.expect("a readable body");
        Answer { status, headers, body }
    }

    async fn pseudonym(&self, kind: &str, identity: &str) -> String {
        let body = json!({ "kind": kind, "identity": identity });
        let answer = self.send(Method::POST, "/admin/pseudonym", Some(TOKEN), Some(body)).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(answer.json()["kind"], kind);
        answer.json()["pseudonym"].as_str().expect("a pseudonym").to_owned()
    }

    async fn inspect(&self, pseudonym: &str) -> Answer {
        let path = format!("/admin/subjects/{pseudonym}/policies/{POLICY}?operation={HELLO}");
        self.send(Method::GET, &path, Some(TOKEN), None).await
    }

    async fn reset(&self, pseudonym: &str) -> Answer {
        let path = format!("/admin/subjects/{pseudonym}/policies/{POLICY}?operation={HELLO}");
        self.send(Method::DELETE, &path, Some(TOKEN), None).await
    }
}

fn admin_of(server: &Running) -> Admin {
    Admin::of(server.admin.expect("admin.listen is set, so the listener is bound"))
}

/// The edge's pseudonym of the test client (127.0.0.1, counted as
/// 127.0.0.1/32), computed here from the configured key.
fn edge_pseudonym_of_localhost() -> String {
    let key = SecretSlice::from(TEST_KEY.as_bytes().to_vec());
    let pseudonymizer = VersionedPseudonymizer::new([(1, key)], 1).unwrap();
    pseudonymizer.pseudonymize(SubjectKind::ClientIp, "127.0.0.1/32").to_string()
}

/// Inspect does not charge; an exhausted budget inspects as the next
/// denial answers; a reset lets the next request pass with the full budget
/// back; a reset is idempotent. The pseudonym lookup finds the budget the
/// edge charged, so it is the edge's pseudonym.
async fn inspect_and_reset(server: &Running) {
    let admin = admin_of(server);
    let pseudonym = admin.pseudonym("ip", "127.0.0.1").await;
    assert_eq!(pseudonym, edge_pseudonym_of_localhost());

    // Fresh: nothing stored.
    let fresh = admin.inspect(&pseudonym).await;
    assert_eq!(fresh.status, StatusCode::OK, "{}", fresh.body);
    assert_eq!(fresh.json()["remaining"], 3);
    assert_eq!(fresh.json()["mark"], Value::Null);

    assert_eq!(server.get("/api/hello").await.status, StatusCode::OK);
    for _ in 0..5 {
        let seen = admin.inspect(&pseudonym).await.json();
        assert_eq!((seen["remaining"].clone(), seen["limit"].clone()), (json!(2), json!(3)));
        assert_eq!(seen["reset-after-ms"], 59_750);
        assert_eq!(seen["retry-after-ms"], 0);
        assert_eq!(seen["algorithm"], "fixed-window");
        assert_eq!(seen["operation"], "GET /api/hello");
        assert_eq!(seen["mark"], support::T0 + 250);
    }
    // Two more pass (the inspects charged nothing), then 429.
    for remaining in [1, 0] {
        let reply = server.get("/api/hello").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let header = format!("\"{POLICY}\";r={remaining};t=60");
        assert_eq!(reply.header("ratelimit"), Some(header.as_str()));
    }
    assert_eq!(server.get("/api/hello").await.status, StatusCode::TOO_MANY_REQUESTS);
    let exhausted = admin.inspect(&pseudonym).await.json();
    assert_eq!(
        (exhausted["remaining"].clone(), exhausted["retry-after-ms"].clone()),
        (json!(0), json!(59_750))
    );

    let reset = admin.reset(&pseudonym).await;
    assert_eq!(reset.status, StatusCode::NO_CONTENT, "{}", reset.body);
    let reply = server.get("/api/hello").await;
    assert_eq!(reply.status, StatusCode::OK, "the next request passes after the reset");
    let header = format!("\"{POLICY}\";r=2;t=60");
    assert_eq!(reply.header("ratelimit"), Some(header.as_str()), "the full budget is back");
    assert_eq!(admin.reset(&pseudonym).await.status, StatusCode::NO_CONTENT);
    assert_eq!(admin.reset(&pseudonym).await.status, StatusCode::NO_CONTENT, "idempotent");
    assert_eq!(admin.inspect(&pseudonym).await.json()["remaining"], 3);
}

#[tokio::test]
async fn memory_inspect_does_not_charge_and_reset_restores_the_budget() {
    let server = Running::start(&load(&memory_config())).await;
    inspect_and_reset(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn redis_inspect_does_not_charge_and_reset_restores_the_budget() {
    let redis = RedisServer::start();
    let server = Running::start(&load(&redis_config(&redis))).await;
    inspect_and_reset(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn without_the_bearer_token_every_admin_request_is_401() {
    let server = Running::start(&load(&memory_config())).await;
    let admin = admin_of(&server);
    let pseudonym = edge_pseudonym_of_localhost();
    let inspect = format!("/admin/subjects/{pseudonym}/policies/{POLICY}?operation={HELLO}");
    let wrong = "admin-e2e-token-0123456789abcdeX";
    for token in
        [None, Some(wrong), Some(&TOKEN[..31]), Some(""), Some("admin-e2e-token-0123456789abcdef0")]
    {
        for (method, path) in [
            (Method::GET, inspect.as_str()),
            (Method::DELETE, inspect.as_str()),
            (Method::POST, "/admin/pseudonym"),
            (Method::POST, "/admin/reload"),
            (Method::GET, "/admin/nothing-here"),
        ] {
            let answer = admin.send(method.clone(), path, token, None).await;
            answer.assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
            assert_eq!(answer.header("www-authenticate"), Some("Bearer"), "{method} {path}");
        }
    }
    // Another scheme with the right token is refused too.
    let basic = admin
        .client
        .get(format!("{}{inspect}", admin.base))
        .header("authorization", format!("Basic {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), StatusCode::UNAUTHORIZED);
    // Nothing was charged or reset by any of it.
    assert_eq!(admin.inspect(&pseudonym).await.json()["remaining"], 3);
    // Built without configuration sources (no `reload_from`): nothing to
    // read again, so a reload is a 409, not a silent success.
    let reload = admin.send(Method::POST, "/admin/reload", Some(TOKEN), None).await;
    reload.assert_problem(StatusCode::CONFLICT, "reload-unavailable");
    server.stop().await;
}

#[tokio::test]
async fn admin_routes_are_never_on_the_public_port() {
    let server = Running::start(&load(&memory_config())).await;
    let public = Admin::of(server.address);
    let pseudonym = edge_pseudonym_of_localhost();
    let inspect = format!("/admin/subjects/{pseudonym}/policies/{POLICY}?operation={HELLO}");
    let lookup = json!({ "kind": "ip", "identity": "127.0.0.1" });
    for (method, path, body) in [
        (Method::GET, inspect.as_str(), None),
        (Method::DELETE, inspect.as_str(), None),
        (Method::POST, "/admin/pseudonym", Some(lookup)),
    ] {
        let answer = public.send(method.clone(), path, Some(TOKEN), body).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}: {}", answer.body);
        assert!(!answer.body.contains(&pseudonym), "{}", answer.body);
    }
    // And the public probes are not on the admin port.
    let admin = admin_of(&server);
    assert_ne!(server.admin, Some(server.address));
    let probe = admin.send(Method::GET, "/healthz", Some(TOKEN), None).await;
    probe.assert_problem(StatusCode::NOT_FOUND, "not-found");
    server.stop().await;
}

#[tokio::test]
async fn bad_input_is_400_and_an_unknown_policy_404() {
    let server = Running::start(&load(&memory_config())).await;
    let admin = admin_of(&server);
    let pseudonym = edge_pseudonym_of_localhost();
    let get = |path: String| {
        let admin = &admin;
        async move { admin.send(Method::GET, &path, Some(TOKEN), None).await }
    };
    get(format!("/admin/subjects/203.0.113.7/policies/{POLICY}?operation={HELLO}"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "invalid-request");
    get(format!("/admin/subjects/{pseudonym}/policies/Bad%20Id?operation={HELLO}"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "invalid-request");
    // Well formed, but no pseudonym this server makes: a truncated paste,
    // a padded one, a key version it has no key for.
    let text = pseudonym.to_string();
    let (version, tag) = text.split_once(':').unwrap();
    for made_up in [
        format!("{version}:{}", &tag[..32]),
        format!("{version}:{tag}00"),
        format!("v{}:{tag}", version[1..].parse::<u32>().unwrap() + 1),
    ] {
        get(format!("/admin/subjects/{made_up}/policies/{POLICY}?operation={HELLO}"))
            .await
            .assert_problem(StatusCode::BAD_REQUEST, "invalid-request");
    }
    get(format!("/admin/subjects/{pseudonym}/policies/{POLICY}?operation=hello"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "invalid-request");
    get(format!("/admin/subjects/{pseudonym}/policies/{POLICY}"))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, "operation-required");
    get(format!("/admin/subjects/{pseudonym}/policies/nope?operation={HELLO}"))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "unknown-policy");
    let delete = format!("/admin/subjects/{pseudonym}/policies/nope?operation={HELLO}");
    admin
        .send(Method::DELETE, &delete, Some(TOKEN), None)
        .await
        .assert_problem(StatusCode::NOT_FOUND, "unknown-policy");
    for body in [
        json!({ "kind": "email", "identity": "a@example.com" }),
        json!({ "kind": "ip", "identity": "not-an-ip" }),
        json!({ "kind": "api-key", "identity": "has a space" }),
        json!({ "kind": "principal", "identity": "" }),
        json!({ "kind": "ip" }),
        json!({ "kind": "ip", "identity": "127.0.0.1", "extra": 1 }),
    ] {
        let answer =
            admin.send(Method::POST, "/admin/pseudonym", Some(TOKEN), Some(body.clone())).await;
        answer.assert_problem(StatusCode::BAD_REQUEST, "invalid-request");
        // The refusal never echoes the identity.
        if let Some(identity) = body["identity"].as_str().filter(|identity| !identity.is_empty()) {
            assert!(!answer.body.contains(identity), "{}", answer.body);
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn an_api_key_lookup_finds_the_budget_that_key_is_charged_under() {
    let server = Running::start(&load(&memory_config())).await;
    let admin = admin_of(&server);
    let reply = reqwest::Client::new()
        .get(server.url("/api/hello"))
        .header("x-api-key", "customer-key-42")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    let pseudonym = admin.pseudonym("api-key", "customer-key-42").await;
    assert_eq!(admin.inspect(&pseudonym).await.json()["remaining"], 2);
    // The same text as a principal is another subject, untouched.
    let principal = admin.pseudonym("principal", "customer-key-42").await;
    assert_ne!(principal, pseudonym);
    assert_eq!(admin.inspect(&principal).await.json()["remaining"], 3);
    server.stop().await;
}

#[tokio::test]
async fn pseudonym_lookups_have_their_own_small_budget() {
    let server = Running::start(&load(&memory_config())).await;
    let admin = admin_of(&server);
    let lookups = app_bootstrap::admin::PSEUDONYM_LOOKUPS;
    for n in 0..lookups {
        admin.pseudonym("ip", &format!("198.51.100.{n}")).await;
    }
    let body = json!({ "kind": "ip", "identity": "198.51.100.200" });
    let refused = admin.send(Method::POST, "/admin/pseudonym", Some(TOKEN), Some(body)).await;
    refused.assert_problem(StatusCode::TOO_MANY_REQUESTS, "too-many-lookups");
    // The manual clock stands at T0 + 250 in a 60 s window.
    assert_eq!(refused.header("retry-after"), Some("60"));
    // Budget routes are not behind that limit.
    assert_eq!(admin.inspect(&edge_pseudonym_of_localhost()).await.status, StatusCode::OK);
    server.stop().await;
}

/// The real binary: a reset is one audit line naming the pseudonym, the
/// policy and the caller's address; a lookup is logged without the
/// identity, and no log line holds one.
#[tokio::test]
async fn a_reset_is_one_audit_line_and_no_line_holds_an_identity() {
    let serve = support::Serve::start(&memory_config(), "info");
    let admin = Admin::of(serve.admin_address());
    let secret_key = "customer-secret-key-7f3a";
    let reply = reqwest::Client::new()
        .get(format!("{}/api/hello", serve.base))
        .header("x-api-key", secret_key)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    let pseudonym = admin.pseudonym("api-key", secret_key).await;
    assert_eq!(admin.inspect(&pseudonym).await.json()["remaining"], 2);
    assert_eq!(admin.reset(&pseudonym).await.status, StatusCode::NO_CONTENT);
    // Log lines are read on a thread: wait for the audit line to arrive.
    let mut resets = Vec::new();
    for _ in 0..100 {
        resets = serve
            .logs()
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| event["fields"]["message"] == "admin budget reset")
            .collect();
        if !resets.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let [audit] = resets.as_slice() else { panic!("one audit line per reset: {resets:?}") };
    assert_eq!(audit["target"], "audit");
    assert_eq!(audit["fields"]["pseudonym"], pseudonym.as_str());
    assert_eq!(audit["fields"]["policy"], POLICY);
    assert_eq!(audit["fields"]["operation"], "GET /api/hello");
    assert_eq!(audit["fields"]["outcome"], "reset");
    let caller = audit["fields"]["caller"].as_str().unwrap_or_default();
    assert!(caller.starts_with("127.0.0.1:"), "{audit}");
    let logs = serve.logs();
    assert!(
        logs.iter().any(|line| line.contains("admin pseudonym lookup") && line.contains("api-key")),
        "{logs:#?}"
    );
    for line in &logs {
        assert!(!line.contains(secret_key), "an identity reached a log line: {line}");
        assert!(!line.contains(TOKEN), "the token reached a log line: {line}");
    }
}

/// The admin routes take the edge's bridge in force, so after a reload
/// they see the new policy table: a new revision's fresh budget, and a
/// policy added by the reload.
#[tokio::test]
async fn the_admin_routes_follow_a_reload() {
    use std::sync::Arc;

    use app_bootstrap::{AppConfig, Application, ConfigSources, ReloadReport};
    use shared_contract::{Clock, ManualClock};

    let file = |limit: u64, revision: u32, extra: &str| {
        let policy = format!(
            "[capabilities.rate-limit.policies.{POLICY}]\nalgorithm = \"fixed-window\"\n\
             limit = {limit}\nwindow = \"60s\"\nrevision = {revision}\n{extra}"
        );
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[capabilities.rate-limit]\ndefault-policy = \
             \"{POLICY}\"\n{policy}\n[pseudonymizer.keys]\n1 = \"{TEST_KEY}\"\n{}",
            admin_section()
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin-reload.toml");
    std::fs::write(&path, file(3, 1, "")).unwrap();
    let sources = ConfigSources::file_only(path.clone());
    let config = AppConfig::load(&sources).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(support::T0 + 250));
    let application = Application::build_with(&config, app_bootstrap::routes::api(), clock)
        .await
        .unwrap()
        .reload_from(sources);
    let reloader = application.reloader().expect("a reloader").clone();
    let public = format!("http://{}/api/hello", application.local_addr());
    let admin = Admin::of(application.admin_addr().expect("the admin listener"));
    let task = tokio::spawn(async move { application.run_until(std::future::pending()).await });

    assert_eq!(reqwest::get(&public).await.unwrap().status(), StatusCode::OK);
    let pseudonym = admin.pseudonym("ip", "127.0.0.1").await;
    let before = admin.inspect(&pseudonym).await.json();
    assert_eq!((before["remaining"].clone(), before["revision"].clone()), (json!(2), json!(1)));
    let extra = "[capabilities.rate-limit.policies.added]\nalgorithm = \"token-bucket\"\n\
                 capacity = 4\nrefill-tokens = 1\nrefill-period = \"1s\"\nscope = \"subject\"\n";
    // A limit changed without a new revision: 422 with the problem, as
    // `POST /admin/reload` reports it; nothing changes.
    std::fs::write(&path, file(9, 1, "")).unwrap();
    let refused = admin.send(Method::POST, "/admin/reload", Some(TOKEN), None).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.body);
    assert_eq!(refused.json()["result"], "rejected");
    assert!(refused.json()["problems"][0].as_str().unwrap().contains("raise revision"));
    assert_eq!(admin.inspect(&pseudonym).await.json()["limit"], 3);
    // The same route without the token is 401, like every admin route.
    let anonymous = admin.send(Method::POST, "/admin/reload", None, None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);

    std::fs::write(&path, file(5, 2, extra)).unwrap();
    let applied = admin.send(Method::POST, "/admin/reload", Some(TOKEN), None).await;
    assert_eq!(applied.status, StatusCode::OK, "{}", applied.body);
    assert_eq!(applied.json()["result"], "applied");
    // SIGHUP's path too: the reloader finds nothing more to apply.
    let report = reloader.reload().await;
    assert!(matches!(report, ReloadReport::Unchanged { .. }), "{report:?}");
    let after = admin.inspect(&pseudonym).await.json();
    assert_eq!(
        (after["remaining"].clone(), after["limit"].clone(), after["revision"].clone()),
        (json!(5), json!(5), json!(2)),
        "the new revision starts fresh, and admin sees it"
    );
    let added = format!("/admin/subjects/{pseudonym}/policies/added");
    let added = admin.send(Method::GET, &added, Some(TOKEN), None).await;
    assert_eq!(added.status, StatusCode::OK, "{}", added.body);
    assert_eq!(added.json()["remaining"], 4);
    task.abort();
}

/// The scheme is case-insensitive (RFC 7235 section 2.1), and one or more
/// spaces may follow it; the token itself is compared exactly.
#[tokio::test]
async fn the_bearer_scheme_is_matched_case_insensitively() {
    let server = Running::start(&load(&memory_config())).await;
    let admin = admin_of(&server);
    let inspect = format!(
        "{}/admin/subjects/{}/policies/{POLICY}?operation={HELLO}",
        admin.base,
        edge_pseudonym_of_localhost()
    );
    let send = async |authorization: String| {
        let request = admin.client.get(&inspect).header("authorization", authorization);
        request.send().await.expect("the listener answers").status()
    };
    for scheme in ["bearer", "BEARER", "bEaReR", "Bearer "] {
        assert_eq!(send(format!("{scheme} {TOKEN}")).await, StatusCode::OK, "{scheme}");
    }
    let lower = TOKEN.to_uppercase();
    for refused in [format!("bearer {lower}"), format!("bearer{TOKEN}"), format!("Bearerx {TOKEN}")]
    {
        assert_eq!(send(refused.clone()).await, StatusCode::UNAUTHORIZED, "{refused}");
    }
    server.stop().await;
}

/// A budget route names an operation the server serves, as the
/// configuration does: a path in place of the route template, or a route
/// not served, is a 404 naming the served operations, and a reset of it
/// answers that, not a 204 that changes nothing. A HEAD is the GET's budget.
#[tokio::test]
async fn an_operation_the_server_does_not_serve_is_404_and_resets_nothing() {
    let server = Running::start(&load(&memory_config())).await;
    let admin = admin_of(&server);
    for _ in 0..3 {
        assert_eq!(server.get("/api/hello").await.status, StatusCode::OK);
    }
    let pseudonym = edge_pseudonym_of_localhost();
    let at = |operation: &str| {
        format!("/admin/subjects/{pseudonym}/policies/{POLICY}?operation={operation}")
    };
    for operation in [
        "GET%20/api/hello/42",
        "GET%20/api/orders/42",
        "PUT%20/api/nope",
        "GET%20/admin/reload",
        // An extension method is charged as OTHER, never under its own name.
        "FOO%20/api/hello",
    ] {
        for method in [Method::GET, Method::DELETE] {
            let answer = admin.send(method.clone(), &at(operation), Some(TOKEN), None).await;
            answer.assert_problem(StatusCode::NOT_FOUND, "unknown-operation");
            let detail = answer.json()["detail"].as_str().unwrap_or_default().to_owned();
            assert!(detail.contains("GET /api/orders/{id}"), "{method} {operation}: {detail}");
        }
    }
    // Nothing was reset: the budget is still spent, and HEAD and GET of
    // the route are one budget.
    assert_eq!(server.get("/api/hello").await.status, StatusCode::TOO_MANY_REQUESTS);
    for operation in [HELLO, "HEAD%20/api/hello"] {
        let seen = admin.send(Method::GET, &at(operation), Some(TOKEN), None).await;
        assert_eq!(seen.status, StatusCode::OK, "{}", seen.body);
        assert_eq!(seen.json()["remaining"], 0, "{operation}");
    }
    let reset = admin.send(Method::DELETE, &at("HEAD%20/api/hello"), Some(TOKEN), None).await;
    assert_eq!(reset.status, StatusCode::NO_CONTENT, "{}", reset.body);
    assert_eq!(
        server.get("/api/hello").await.status,
        StatusCode::OK,
        "the reset of the HEAD is the GET's"
    );
    server.stop().await;
}

/// A method a route does not take is a 405 still charged under the
/// default set, so its budget is one an operator can see and reset: the
/// client it blocks is unblocked by the reset.
#[tokio::test]
async fn the_budget_of_a_method_a_route_does_not_take_can_be_inspected_and_reset() {
    let server = Running::start(&load(&memory_config())).await;
    let admin = admin_of(&server);
    let options = || server.request(Method::OPTIONS, "/api/hello");
    for _ in 0..3 {
        assert_eq!(options().await.status, StatusCode::METHOD_NOT_ALLOWED);
    }
    assert_eq!(options().await.status, StatusCode::TOO_MANY_REQUESTS);
    let pseudonym = edge_pseudonym_of_localhost();
    let at =
        format!("/admin/subjects/{pseudonym}/policies/{POLICY}?operation=OPTIONS%20/api/hello");
    let seen = admin.send(Method::GET, &at, Some(TOKEN), None).await;
    assert_eq!(seen.status, StatusCode::OK, "{}", seen.body);
    assert_eq!(seen.json()["remaining"], 0);
    let reset = admin.send(Method::DELETE, &at, Some(TOKEN), None).await;
    assert_eq!(reset.status, StatusCode::NO_CONTENT, "{}", reset.body);
    assert_eq!(options().await.status, StatusCode::METHOD_NOT_ALLOWED, "unblocked by the reset");
    server.stop().await;
}

/// Every admin error is problem+json: a method the route does not serve
/// (405, with `Allow`), a query that names `operation` twice and a path
/// segment that is not UTF-8 (400).
#[tokio::test]
async fn a_wrong_method_and_a_repeated_query_are_problem_json() {
    let server = Running::start(&load(&memory_config())).await;
    let admin = admin_of(&server);
    let pseudonym = edge_pseudonym_of_localhost();
    let budget = format!("/admin/subjects/{pseudonym}/policies/{POLICY}");
    for (method, path) in [
        (Method::PUT, budget.as_str()),
        (Method::POST, budget.as_str()),
        (Method::GET, "/admin/pseudonym"),
        (Method::GET, "/admin/reload"),
    ] {
        let answer = admin.send(method.clone(), path, Some(TOKEN), None).await;
        answer.assert_problem(StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed");
        assert!(answer.header("allow").is_some(), "{method} {path}: {answer:?}");
    }
    // Still behind the token: no route's methods leak to a stranger.
    let stranger = admin.send(Method::PUT, &budget, None, None).await;
    stranger.assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    let twice = format!("{budget}?operation={HELLO}&operation={HELLO}");
    // A segment that does not decode to UTF-8 is refused the same way.
    let not_utf8 = format!("/admin/subjects/%FF/policies/{POLICY}?operation={HELLO}");
    for method in [Method::GET, Method::DELETE] {
        for path in [&twice, &not_utf8] {
            let answer = admin.send(method.clone(), path, Some(TOKEN), None).await;
            answer.assert_problem(StatusCode::BAD_REQUEST, "invalid-request");
        }
    }
    server.stop().await;
}
