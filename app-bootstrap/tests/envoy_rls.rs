//! The Envoy RLS listener of the real server, beside the HTTP one: one
//! policy, one counter series per front end, the same headers on both, a
//! reload of the rules, and the drain at shutdown.

mod support;

use std::sync::Arc;
use std::time::Duration;

use app_bootstrap::{AppConfig, Application, ConfigSources, ReloadReport};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use shared_contract::{Clock, ManualClock};
use support::{T0, TEST_KEY, counter};

fn file(domain: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[capabilities.rate-limit]
default-policy = "edge-ip"

[capabilities.rate-limit.policies.edge-ip]
algorithm = "fixed-window"
limit = 3
window = "60s"

[pseudonymizer.keys]
1 = "{TEST_KEY}"

[envoy-rls]
listen = "127.0.0.1:0"

[[envoy-rls.rules]]
domain = "{domain}"
descriptor = ["remote_address"]
policies = "edge-ip"

[[envoy-rls.rules]]
domain = "{domain}"
descriptor = ["generic_key=health"]
unlimited = true

[[envoy-rls.rules]]
domain = "{domain}"
descriptor = ["generic_key=banned"]
blocked = true
"#
    )
}

fn ask(domain: &str, address: &str) -> RateLimitRequest {
    let entry = Entry { key: "remote_address".to_owned(), value: address.to_owned() };
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor { entries: vec![entry], ..Default::default() }],
        hits_addend: 0,
    }
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    let found = response.response_headers_to_add.iter().find(|header| header.key == name);
    found.map(|header| header.value.as_str())
}

/// The real server of the configuration at `path`, running until `stop`.
struct Server {
    http: String,
    rls: std::net::SocketAddr,
    admin: Option<std::net::SocketAddr>,
    reloader: app_bootstrap::Reloader,
    client: RateLimitServiceClient<tonic::transport::Channel>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(path: &std::path::Path) -> Server {
    let sources = ConfigSources::file_only(path.to_owned());
    let config = AppConfig::load(&sources).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0 + 250));
    let application = Application::build_with(&config, app_bootstrap::routes::api(), clock)
        .await
        .unwrap()
        .reload_from(sources);
    let reloader = application.reloader().unwrap().clone();
    let http = format!("http://{}", application.local_addr());
    let rls = application.rls_addr().expect("the RLS listener is bound");
    let admin = application.admin_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        application.run_until(async { drop(stopped.await) }).await.unwrap();
    });
    let client = RateLimitServiceClient::connect(format!("http://{rls}")).await.unwrap();
    Server { http, rls, admin, reloader, client, stop, task }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_beside_http_one_policy_two_fronts_reload_and_drain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rls.toml");
    std::fs::write(&path, file("edge")).unwrap();
    let Server { http, rls, reloader, mut client, stop, task, .. } = start(&path).await;
    assert_ne!(rls.port(), 0);
    let web = reqwest::Client::builder().no_proxy().build().unwrap();

    // Three allowed, then over the limit: 3 a minute, as configured.
    let mut codes = Vec::new();
    let mut last = None;
    for _ in 0..4 {
        let answer = client.should_rate_limit(ask("edge", "10.9.0.1")).await.unwrap().into_inner();
        codes.push(Code::try_from(answer.overall_code).unwrap());
        last = Some(answer);
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    // The same RateLimit-Policy the HTTP edge sends for the same policy.
    let refused = last.unwrap();
    let hello = web.get(format!("{http}/api/hello")).send().await.unwrap();
    let http_policy = hello.headers()["ratelimit-policy"].to_str().unwrap().to_owned();
    assert_eq!(header(&refused, "ratelimit-policy"), Some(http_policy.as_str()));
    assert_eq!(http_policy, r#""edge-ip";q=3;w=60"#);
    // At T0 + 250 ms in a 60 s window: 59.75 s, shown as 60, on both.
    assert_eq!(header(&refused, "retry-after"), Some("60"));
    assert_eq!(header(&refused, "ratelimit"), Some(r#""edge-ip";r=0;t=60"#));

    // One series per front end.
    let metrics = web.get(format!("{http}/metrics")).send().await.unwrap().text().await.unwrap();
    let series = |outcome: &str, front: &str| {
        counter(
            &metrics,
            &format!(
                r#"ca_skeleton_rate_limit_decisions_total{{policy="edge-ip",algorithm="fixed-window",outcome="{outcome}",mode="enforce",cached="false",front="{front}"}}"#
            ),
        )
    };
    assert_eq!(series("allowed", "envoy-rls"), 3, "{metrics}");
    assert_eq!(series("denied", "envoy-rls"), 1, "{metrics}");
    assert_eq!(series("allowed", "http"), 1, "{metrics}");
    // One evaluation-time histogram, a series per front end: the RLS's 4
    // evaluations, the HTTP edge's 1.
    let evaluations = |front: &str| {
        counter(
            &metrics,
            &format!(
                r#"ca_skeleton_rate_limit_evaluation_seconds_count{{policy="edge-ip",algorithm="fixed-window",front="{front}"}}"#
            ),
        )
    };
    assert_eq!(evaluations("envoy-rls"), 4, "{metrics}");
    assert_eq!(evaluations("http"), 1, "{metrics}");

    // A reload moves the rule to another domain: the old one is unmatched.
    std::fs::write(&path, file("edge-2")).unwrap();
    match reloader.reload().await {
        ReloadReport::Applied { changed, restart_required } => {
            assert_eq!(changed, ["envoy-rls.rules"]);
            assert!(restart_required.is_empty(), "{restart_required:?}");
        }
        other => panic!("{other:?}"),
    }
    let old = client.should_rate_limit(ask("edge", "10.9.0.1")).await.unwrap().into_inner();
    assert_eq!(Code::try_from(old.overall_code).unwrap(), Code::Ok);
    assert!(old.statuses[0].current_limit.is_none());
    // Under the new domain the subject is another (the domain is framed
    // into it): a fresh budget of 3.
    let new = client.should_rate_limit(ask("edge-2", "10.9.0.1")).await.unwrap().into_inner();
    assert_eq!(new.statuses[0].limit_remaining, 2);
    // The unmatched one was counted, and a limit override is ignored and
    // counted: 3 allowed for 10.9.0.2 under edge-2, whatever it asks for.
    let mut loose = ask("edge-2", "10.9.0.2");
    loose.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 1000, unit: 1 });
    let mut codes = Vec::new();
    for _ in 0..4 {
        let answer = client.should_rate_limit(loose.clone()).await.unwrap().into_inner();
        codes.push(Code::try_from(answer.overall_code).unwrap());
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    // An unlimited rule's descriptor: OK, no limit, the largest remaining, counted
    // apart.
    let mut health = ask("edge-2", "");
    health.descriptors[0].entries =
        vec![Entry { key: "generic_key".to_owned(), value: "health".to_owned() }];
    let answer = client.should_rate_limit(health).await.unwrap().into_inner();
    assert_eq!(Code::try_from(answer.overall_code).unwrap(), Code::Ok);
    assert!(answer.statuses[0].current_limit.is_none());
    assert_eq!(answer.statuses[0].limit_remaining, u32::MAX);
    // A blocked rule's descriptor: OVER_LIMIT, no provider call, counted apart.
    let mut banned = ask("edge-2", "");
    banned.descriptors[0].entries =
        vec![Entry { key: "generic_key".to_owned(), value: "banned".to_owned() }];
    let answer = client.should_rate_limit(banned).await.unwrap().into_inner();
    assert_eq!(Code::try_from(answer.overall_code).unwrap(), Code::OverLimit);
    let metrics = web.get(format!("{http}/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(counter(&metrics, "ca_skeleton_envoy_rls_unmatched_descriptors_total"), 1);
    assert_eq!(counter(&metrics, "ca_skeleton_envoy_rls_unlimited_descriptors_total"), 1);
    assert_eq!(counter(&metrics, "ca_skeleton_envoy_rls_blocked_descriptors_total"), 1);
    assert_eq!(counter(&metrics, "ca_skeleton_envoy_rls_limit_overrides_ignored_total"), 4);

    // Shutdown: the gRPC listener stops accepting and the server ends.
    drop(client);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), task).await.unwrap().unwrap();
    assert!(tokio::net::TcpStream::connect(rls).await.is_err(), "still accepting");
}

/// An operator finds an RLS rule's budget through the admin API as they
/// find an HTTP subject's: the lookup answers the descriptor's pseudonym
/// and rule (the raw values are never in the answer), and inspect / reset
/// take `?rule=N` for the rule's operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_lookup_inspect_and_reset_know_descriptor_subjects() {
    const TOKEN: &str = "admin-token-0123456789abcdef0123456789";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rls.toml");
    // admin-other is held, but no envoy-rls rule lists it.
    let admin = format!(
        "\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
         [capabilities.rate-limit.policies.admin-other]\nalgorithm = \"fixed-window\"\n\
         limit = 3\nwindow = \"60s\"\n"
    );
    // A policy of its own: the other test counts edge-ip's series in the
    // one recorder of the process.
    std::fs::write(&path, file("edge").replace("edge-ip", "admin-ip") + &admin).unwrap();
    let Server { admin, mut client, stop, task, .. } = start(&path).await;
    let admin = format!("http://{}/admin", admin.expect("the admin listener is bound"));
    let web = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut codes = Vec::new();
    for _ in 0..4 {
        let answer = client.should_rate_limit(ask("edge", "10.9.1.1")).await.unwrap().into_inner();
        codes.push(Code::try_from(answer.overall_code).unwrap());
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);

    let lookup = |body: serde_json::Value| {
        web.post(format!("{admin}/pseudonym")).bearer_auth(TOKEN).json(&body).send()
    };
    let entries = |key: &str, value: &str| serde_json::json!([{ "key": key, "value": value }]);
    let found = lookup(serde_json::json!({
        "kind": "descriptor", "domain": "edge", "entries": entries("remote_address", "10.9.1.1"),
    }))
    .await
    .unwrap();
    assert_eq!(found.status(), 200);
    let found: serde_json::Value = found.json().await.unwrap();
    assert_eq!((found["kind"].as_str(), found["rule"].as_u64()), (Some("descriptor"), Some(0)));
    assert!(!found.to_string().contains("10.9.1.1"), "{found}");
    let pseudonym = found["pseudonym"].as_str().unwrap().to_owned();

    // admin-ip counts per (subject, rule): the rule names the operation.
    let budget = format!("{admin}/subjects/{pseudonym}/policies/admin-ip?rule=0");
    let held: serde_json::Value =
        web.get(&budget).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
    assert_eq!((held["limit"].as_u64(), held["remaining"].as_u64()), (Some(3), Some(0)), "{held}");
    let reset = web.delete(&budget).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(reset.status(), 204);
    let answer = client.should_rate_limit(ask("edge", "10.9.1.1")).await.unwrap().into_inner();
    assert_eq!(Code::try_from(answer.overall_code).unwrap(), Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 2);

    // No budget: an unlimited rule's descriptor, an unmatched one, a rule
    // without policies; and a rule with an HTTP operation is refused.
    let unlimited = lookup(serde_json::json!({
        "kind": "descriptor", "domain": "edge", "entries": entries("generic_key", "health"),
    }))
    .await
    .unwrap();
    assert_eq!(unlimited.status(), 404);
    let unlimited = unlimited.text().await.unwrap();
    assert!(unlimited.contains("envoy-rls.rules.1, which is unlimited"), "{unlimited}");
    let unmatched = lookup(serde_json::json!({
        "kind": "descriptor", "domain": "other", "entries": entries("remote_address", "10.9.1.1"),
    }))
    .await
    .unwrap();
    assert_eq!(unmatched.status(), 404);
    let no_rule = format!("{admin}/subjects/{pseudonym}/policies/admin-ip?rule=1");
    assert_eq!(web.get(&no_rule).bearer_auth(TOKEN).send().await.unwrap().status(), 404);
    // A rule that does not list the policy: no call is charged under that
    // budget, so there is nothing to inspect or reset.
    let unlisted = format!("{admin}/subjects/{pseudonym}/policies/admin-other?rule=0");
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let refused = web.request(method, &unlisted).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(refused.status(), 404);
        let refused: serde_json::Value = refused.json().await.unwrap();
        assert!(refused["type"].as_str().unwrap().ends_with("admin/unknown-rule"), "{refused}");
        assert!(refused["detail"].as_str().unwrap().contains("admin-other"), "{refused}");
    }
    let both = format!("{budget}&operation=GET%20/api/hello");
    assert_eq!(web.get(&both).bearer_auth(TOKEN).send().await.unwrap().status(), 400);
    let mixed = lookup(serde_json::json!({
        "kind": "descriptor", "identity": "10.9.1.1", "domain": "edge", "entries": [],
    }))
    .await
    .unwrap();
    assert_eq!(mixed.status(), 400);

    drop(client);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), task).await.unwrap().unwrap();
}

/// A rule with `allow-override = true` through the real server (the memory
/// provider's store): a descriptor's `limit` runs under its own fixed
/// window (docs/envoy-rls.md, "Rules"), 2 a minute here against the rule's
/// 3, with `current_limit` naming it; its counter is the store's, so a
/// reload that rebuilds the engine keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_limit_override_has_its_own_budget_that_a_reload_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rls.toml");
    // A policy id of its own: the metrics registry is the process's, and
    // another test here counts `edge-ip`'s decisions.
    let allowing = file("edge").replace("edge-ip", "sized-ip").replacen(
        "policies = \"sized-ip\"\n",
        "policies = \"sized-ip\"\nallow-override = true\n",
        1,
    );
    std::fs::write(&path, &allowing).unwrap();
    let Server { reloader, mut client, stop, task, .. } = start(&path).await;
    let mut sized = ask("edge", "10.9.1.1");
    let minute = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit::Minute as i32;
    sized.descriptors[0].limit = Some(RateLimitOverride { requests_per_unit: 2, unit: minute });
    let mut ask_sized = async || {
        let answer = client.should_rate_limit(sized.clone()).await.unwrap().into_inner();
        let limit = answer.statuses[0].current_limit.clone().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit),
            ("envoy-override.2-per-minute", 2)
        );
        Code::try_from(answer.overall_code).unwrap()
    };
    assert_eq!(ask_sized().await, Code::Ok);
    // A reload that adds a rule builds a new engine.
    let more = "[[envoy-rls.rules]]\ndomain = \"edge\"\ndescriptor = [\"generic_key=free\"]\nunlimited = true\n";
    std::fs::write(&path, format!("{allowing}\n{more}")).unwrap();
    match reloader.reload().await {
        ReloadReport::Applied { changed, .. } => assert_eq!(changed, ["envoy-rls.rules"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(ask_sized().await, Code::Ok);
    assert_eq!(ask_sized().await, Code::OverLimit);
    // The rule's own 3 a minute for the same address is whole.
    let mut codes = Vec::new();
    for _ in 0..4 {
        let answer = client.should_rate_limit(ask("edge", "10.9.1.1")).await.unwrap().into_inner();
        codes.push(Code::try_from(answer.overall_code).unwrap());
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    drop(client);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), task).await.unwrap().unwrap();
}
