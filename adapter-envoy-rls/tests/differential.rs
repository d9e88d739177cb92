//! Differential property test: random descriptor requests through the RLS
//! (a real tonic client over TCP) and the equivalent HTTP requests through
//! adapter-web's tower layer, each front end on its own memory provider
//! with the same policies and one clock, reach the same decisions with the
//! same `RateLimit-Policy`, `RateLimit` and `Retry-After` headers.

mod support;

use std::sync::Arc;
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::{EdgeSettings, RateLimitCost, RateLimitLayer, TransportBridge};
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use http::{Request, StatusCode};
use proptest::prelude::*;
use shared_contract::{
    Algorithm, Clock, EdgeRateLimitPort, ManualClock, PolicyScope, RateLimitPolicy,
};
use support::*;
use tower::ServiceExt;

fn policies() -> Vec<RateLimitPolicy> {
    let build = |id: &str, algorithm, scope| {
        RateLimitPolicy::builder(id, algorithm).maximum_cost(3).scope(scope).build().unwrap()
    };
    vec![
        build(
            "window",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 5,
                window: Duration::from_secs(10),
            }),
            PolicyScope::Operation,
        ),
        build(
            "bucket",
            Algorithm::TokenBucket(shared_contract::TokenBucket {
                capacity: 4,
                refill_tokens: 1,
                refill_period: Duration::from_secs(2),
            }),
            PolicyScope::Subject,
        ),
        build(
            "sliding",
            Algorithm::SlidingCounter(shared_contract::SlidingCounter {
                limit: 6,
                window: Duration::from_secs(20),
            }),
            PolicyScope::Operation,
        ),
    ]
}

const SET: [&str; 3] = ["window", "bucket", "sliding"];

/// One step: who asks, at what cost (carried by the descriptor or by the
/// request), after how much time.
#[derive(Debug, Clone)]
struct Step {
    who: usize,
    cost: u64,
    on_descriptor: bool,
    advance_ms: u64,
}

fn step() -> impl Strategy<Value = Step> {
    (0..3usize, 1..=3u64, any::<bool>(), prop_oneof![Just(0u64), 1..2500u64, Just(11_000u64)])
        .prop_map(|(who, cost, on_descriptor, advance_ms)| Step {
            who,
            cost,
            on_descriptor,
            advance_ms,
        })
}

const KEYS: [&str; 3] = ["key-a", "key-b", "key-c"];

/// (admitted, RateLimit-Policy, RateLimit, Retry-After) of one front end.
type Seen = (bool, Option<String>, Option<String>, Option<String>);

async fn run(steps: Vec<Step>) {
    let clock = ManualClock::new(1_700_000_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let http_port: Arc<dyn EdgeRateLimitPort> =
        Arc::new(MemoryEdgeRateLimitAdapter::new(policies(), Arc::clone(&shared)).unwrap());
    let rls_port: Arc<dyn EdgeRateLimitPort> =
        Arc::new(MemoryEdgeRateLimitAdapter::new(policies(), Arc::clone(&shared)).unwrap());
    // The key names the subject at the edge, as the descriptor does at the RLS.
    let settings = EdgeSettings {
        default_policies: set(&SET),
        api_key_header: Some(http::HeaderName::from_static("x-api-key")),
        ..EdgeSettings::default()
    };
    settings.validate().unwrap();
    let bridge = TransportBridge::new(http_port, pseudonymizer(), Arc::clone(&shared), settings);
    let router = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(Arc::new(bridge)));
    let rules = [rule("d", &["api_key"], None, &SET)];
    let mut rls = Rls::start(engine(rls_port, Arc::clone(&shared), &rules)).await;

    for (index, step) in steps.into_iter().enumerate() {
        clock.advance(Duration::from_millis(step.advance_ms));
        let key = KEYS[step.who];
        let request = Request::get("/hello")
            .header("x-api-key", key)
            .extension(RateLimitCost(step.cost))
            .body(Body::empty())
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let text = |name: &str| {
            response.headers().get(name).map(|value| value.to_str().unwrap().to_owned())
        };
        let http: Seen = (
            response.status() == StatusCode::OK,
            text("ratelimit-policy"),
            text("ratelimit"),
            text("retry-after"),
        );
        assert!(
            matches!(response.status(), StatusCode::OK | StatusCode::TOO_MANY_REQUESTS),
            "{index}: {}",
            response.status()
        );

        let (hits, request_hits) = if step.on_descriptor {
            (Some(step.cost), 0)
        } else {
            // 1 is also what an unset request hits_addend (0) means.
            (None, if step.cost == 1 { 0 } else { u32::try_from(step.cost).unwrap() })
        };
        let answer = rls
            .ok(support::request("d", vec![descriptor(&[("api_key", key)], hits)], request_hits))
            .await;
        let owned = |name: &str| header(&answer, name).map(str::to_owned);
        let grpc: Seen = (
            overall(&answer) == Code::Ok,
            owned("ratelimit-policy"),
            owned("ratelimit"),
            owned("retry-after"),
        );
        assert_eq!(grpc, http, "step {index}: {step:?}");
        let status = &answer.statuses[0];
        assert_eq!(code(status) == Code::Ok, grpc.0, "step {index}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn rls_and_http_reach_the_same_decisions_and_headers(steps in prop::collection::vec(step(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(steps));
    }
}
