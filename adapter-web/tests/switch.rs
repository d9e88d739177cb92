//! `BridgeSwitch`: a replaced bridge is used by every request that starts
//! after the swap, and a request already being evaluated finishes on the
//! bridge it started with (its headers describe the old table).

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::{BridgeSwitch, EdgeSettings, RATELIMIT_POLICY, RateLimitLayer, TransportBridge};
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, StatusCode};
use shared_contract::{
    Algorithm, Clock, EdgeRateLimitPort, ManualClock, PolicyId, PolicySet, RateLimitPolicy,
};
use support::ScriptedPort;
use tower::ServiceExt;

fn bridge(port: Arc<dyn EdgeRateLimitPort>, clock: &Arc<dyn Clock>) -> Arc<TransportBridge> {
    let settings = EdgeSettings {
        default_policies: PolicySet::single(PolicyId::new("api").unwrap()),
        ..EdgeSettings::default()
    };
    settings.validate().unwrap();
    Arc::new(TransportBridge::new(port, support::pseudonymizer(), Arc::clone(clock), settings))
}

fn fixed_window(limit: u64, revision: u32) -> RateLimitPolicy {
    let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit,
        window: Duration::from_secs(60),
    });
    RateLimitPolicy::builder("api", algorithm).revision(revision).build().unwrap()
}

async fn hello(router: &Router) -> (StatusCode, String) {
    let peer: SocketAddr = support::UNTRUSTED_PEER.parse().unwrap();
    let request = Request::get("/hello").extension(ConnectInfo(peer)).body(Body::empty()).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let policy = response.headers()[RATELIMIT_POLICY].to_str().unwrap().to_owned();
    (response.status(), policy)
}

#[tokio::test]
async fn a_request_finishes_on_the_bridge_it_started_with() {
    let manual = ManualClock::new(1_700_000_000_000);
    let clock: Arc<dyn Clock> = Arc::new(manual);
    let old_table = MemoryEdgeRateLimitAdapter::new([fixed_window(3, 1)], Arc::clone(&clock));
    let old = Arc::new(ScriptedPort::forwarding(Arc::new(old_table.unwrap())).gated());
    let new = MemoryEdgeRateLimitAdapter::new([fixed_window(9, 2)], Arc::clone(&clock)).unwrap();
    let switch = BridgeSwitch::new(bridge(Arc::clone(&old) as _, &clock));
    let router = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .layer(RateLimitLayer::switched(switch.clone()));

    let started = tokio::spawn({
        let router = router.clone();
        async move { hello(&router).await }
    });
    old.entered().await;
    let replaced = switch.replace(bridge(Arc::new(new), &clock));
    assert!(Arc::ptr_eq(replaced.port(), &(Arc::clone(&old) as Arc<dyn EdgeRateLimitPort>)));

    // A request that starts now runs on the new table at once, while the
    // first one is still held on the old port.
    let (status, policy) = hello(&router).await;
    assert_eq!(status, StatusCode::OK);
    assert!(policy.contains(";q=9;"), "{policy}");
    assert!(!started.is_finished());

    old.open();
    let (status, policy) = started.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(policy.contains(";q=3;"), "the old table describes it: {policy}");
}
