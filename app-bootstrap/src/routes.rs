//! The service's own API: the routes a fork replaces with its own. Every
//! route returned by [`api`] is served behind the rate-limit layer (the
//! server applies it to the whole router it is given); probes and metrics
//! live in `server` and are never rate limited.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

/// The demo API under `/api`: what a fresh checkout serves.
pub fn api() -> Router {
    Router::new()
        .route("/api/hello", get(hello))
        .route("/api/orders/{id}", get(order))
        .route("/api/orders", post(create_order))
}

async fn hello() -> Json<serde_json::Value> {
    Json(json!({ "message": "hello" }))
}

async fn order(Path(id): Path<String>) -> Json<serde_json::Value> {
    Json(json!({ "id": id, "status": "open" }))
}

async fn create_order() -> (StatusCode, Json<serde_json::Value>) {
    let id = uuid::Uuid::new_v4().to_string();
    (StatusCode::CREATED, Json(json!({ "id": id, "status": "created" })))
}
