//! `BridgeSwitch`: a replaced bridge is used by every request that starts
//! after the swap, and a request already being evaluated finishes on the
//! bridge it started with (its headers describe the old table).

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::{BridgeSwitch, EdgeSettings, RATELIMIT_POLICY, RateLimitLayer, TransportBridge};
use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, StatusCode};
use shared_contract::{
    Algorithm, BudgetFailure, BudgetKey, BudgetState, Clock, EdgeRateLimitPort, ManualClock,
    PolicyId, PolicySet, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
};
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// A port that holds every evaluation until the test lets it through.
#[derive(Debug)]
struct GatedPort {
    inner: MemoryEdgeRateLimitAdapter,
    gate: Semaphore,
    entered: Semaphore,
}

#[async_trait]
impl EdgeRateLimitPort for GatedPort {
    async fn evaluate(&self, request: RateLimitRequest) -> RateLimitOutcome {
        self.entered.add_permits(1);
        self.gate.acquire().await.expect("the gate stays open").forget();
        self.inner.evaluate(request).await
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.inner.policy(id)
    }

    async fn is_ready(&self) -> bool {
        true
    }

    // The operator's calls are not gated: only evaluations are held.
    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        self.inner.inspect(key).await
    }

    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        self.inner.reset(key).await
    }
}

fn bridge(port: Arc<dyn EdgeRateLimitPort>, clock: &Arc<dyn Clock>) -> Arc<TransportBridge> {
    let settings = EdgeSettings {
        default_policies: PolicySet::single(PolicyId::new("api").unwrap()),
        ..EdgeSettings::default()
    };
    settings.validate().unwrap();
    Arc::new(TransportBridge::new(port, support::pseudonymizer(), Arc::clone(clock), settings))
}

fn fixed_window(limit: u64, revision: u32) -> RateLimitPolicy {
    let algorithm = Algorithm::FixedWindow { limit, window: Duration::from_secs(60) };
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
    let old = Arc::new(GatedPort {
        inner: MemoryEdgeRateLimitAdapter::new([fixed_window(3, 1)], Arc::clone(&clock)).unwrap(),
        gate: Semaphore::new(0),
        entered: Semaphore::new(0),
    });
    let new = MemoryEdgeRateLimitAdapter::new([fixed_window(9, 2)], Arc::clone(&clock)).unwrap();
    let switch = BridgeSwitch::new(bridge(Arc::clone(&old) as _, &clock));
    let router = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .layer(RateLimitLayer::switched(switch.clone()));

    let started = tokio::spawn({
        let router = router.clone();
        async move { hello(&router).await }
    });
    old.entered.acquire().await.expect("the first request reaches the old port").forget();
    let replaced = switch.replace(bridge(Arc::new(new), &clock));
    assert!(Arc::ptr_eq(replaced.port(), &(Arc::clone(&old) as Arc<dyn EdgeRateLimitPort>)));

    // A request that starts now runs on the new table at once, while the
    // first one is still held on the old port.
    let (status, policy) = hello(&router).await;
    assert_eq!(status, StatusCode::OK);
    assert!(policy.contains(";q=9;"), "{policy}");
    assert!(!started.is_finished());

    old.gate.add_permits(1);
    let (status, policy) = started.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(policy.contains(";q=3;"), "the old table describes it: {policy}");
}
