//! The layer in front of the real in-process provider (`adapter-memory`),
//! so allowed and denied come from the algorithm, not a script. Expected
//! numbers follow docs/algorithms.md (fixed window).

mod support;

use std::sync::Arc;
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_web::EdgeSettings;
use http::StatusCode;
use shared_contract::{Algorithm, Clock, ManualClock, RateLimitPolicy};
use support::{Harness, Via, enabled};

/// A multiple of the 60 s window.
const T0: u64 = 1_700_000_040_000;

async fn a_fixed_window_allows_two_then_denies(via: Via) {
    let clock = ManualClock::new(T0 + 250);
    let algorithm = Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(60) };
    let policy = RateLimitPolicy::builder("default", algorithm).build().unwrap();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let provider = Arc::new(MemoryEdgeRateLimitAdapter::new([policy], shared).unwrap());
    let harness = Harness::build(provider, clock, EdgeSettings::default(), via, enabled).await;

    // ws = T0, reset_after = T0 + 60000 - (T0 + 250) = 59750 ms -> t=60.
    for remaining in [1, 0] {
        let reply = harness.get("/api/orders/7", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""default";q=2;w=60"#));
        let expected = format!(r#""default";r={remaining};t=60"#);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()));
    }
    // Third in the window: denied, retry_after = reset_after = 59750 ms.
    let reply = harness.get("/api/orders/7", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("60"));
    assert_eq!(reply.header("ratelimit"), Some(r#""default";r=0;t=60"#));
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(harness.calls(), 2);

    // Another API key is another bucket.
    let reply = harness.get("/api/orders/7", &[("x-api-key", "other-client")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    // The next window restores the budget.
    harness.clock.advance(Duration::from_secs(60));
    assert_eq!(harness.get("/api/orders/7", &[]).await.status, StatusCode::OK);
    assert_eq!(harness.calls(), 4);
}

#[tokio::test]
async fn over_oneshot() {
    a_fixed_window_allows_two_then_denies(support::oneshot()).await;
}

#[tokio::test]
async fn over_tcp() {
    a_fixed_window_allows_two_then_denies(Via::Tcp).await;
}
