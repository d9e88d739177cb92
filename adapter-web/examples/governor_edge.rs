//! The yardstick of the edge benchmark: axum with the `tower_governor`
//! layer keyed by the API-key header `scripts/bench-http.lua` sends, and
//! the same server without the layer, so `wrk` measures what a stock
//! keyed limiter costs its own server in the run that measures ours.
//!
//! ```text
//! cargo build --release -p adapter-web --example governor_edge
//! target/release/examples/governor_edge governor 127.0.0.1:8081
//! target/release/examples/governor_edge plain 127.0.0.1:8082
//! ```
//!
//! `GET /api/hello` answers `{"message":"hello"}` as `ca-skeleton serve`'s
//! does, on the same multi-thread runtime. The quota (a cell a nanosecond,
//! a burst of a billion) never refuses, as `config/bench.toml`'s `fixed`
//! policy does not; with the layer, every response carries governor's
//! `x-ratelimit-limit` and `x-ratelimit-remaining` headers, as ours carries
//! `RateLimit-Policy` and `RateLimit`.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use http::Request;
use tower_governor::GovernorError;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

/// The header `scripts/bench-http.lua` sends (the edge's default
/// `api-key-header`).
const API_KEY: &str = "x-api-key";

/// The API key as sent, the key of governor's keyed limiter: what a
/// `tower_governor` user writes for per-key limits.
#[derive(Debug, Clone, Copy)]
struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = String;

    fn extract<T>(&self, request: &Request<T>) -> Result<String, GovernorError> {
        request
            .headers()
            .get(API_KEY)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

async fn hello() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({ "message": "hello" }))
}

fn router(governed: bool) -> Router {
    let api = Router::new().route("/api/hello", get(hello));
    if !governed {
        return api;
    }
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .key_extractor(ApiKey)
        .use_headers()
        .finish()
        .expect("a nonzero period and burst");
    api.layer(GovernorLayer::new(config))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: governor_edge governor|plain ADDRESS";
    let governed = match args.next().as_deref() {
        Some("governor") => true,
        Some("plain") => false,
        _ => return Err(usage.into()),
    };
    let address: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(address).await?;
        let app = router(governed).into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).await?;
        Ok(())
    })
}
