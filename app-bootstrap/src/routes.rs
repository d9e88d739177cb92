//! The service's own API: the routes a fork replaces with its own. Every
//! route of [`api`] is served behind the rate-limit layer (the server
//! applies it to the whole router it is given), and [`ApiRoutes`] knows the
//! operations it serves, so a configured operation that names no route
//! stops start-up. Probes and metrics live in `server`, never rate limited.

use std::collections::BTreeSet;

use axum::Router;
use axum::extract::Path;
use axum::handler::Handler;
use axum::http::{Method, StatusCode};
use axum::routing::{MethodFilter, on};
use serde_json::json;

/// An API router plus the operations it serves (`"GET /api/orders/{id}"`,
/// the method and the route template, as the rate-limit layer names them).
#[derive(Debug, Default)]
pub struct ApiRoutes {
    router: Router,
    operations: BTreeSet<String>,
}

impl ApiRoutes {
    /// No routes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `handler` for `GET path`, and so for `HEAD path` too (axum
    /// answers a HEAD with the GET handler, body dropped): both are
    /// operations it serves, and the layer charges a HEAD as the GET.
    pub fn get<H, T>(self, path: &str, handler: H) -> Self
    where
        H: Handler<T, ()>,
        T: 'static,
    {
        let mut routes = self.on(Method::GET, MethodFilter::GET, path, handler);
        routes.operations.insert(format!("{} {path}", Method::HEAD));
        routes
    }

    /// Serves `handler` for `POST path`.
    pub fn post<H, T>(self, path: &str, handler: H) -> Self
    where
        H: Handler<T, ()>,
        T: 'static,
    {
        self.on(Method::POST, MethodFilter::POST, path, handler)
    }

    /// Serves `handler` for `PUT path`.
    pub fn put<H, T>(self, path: &str, handler: H) -> Self
    where
        H: Handler<T, ()>,
        T: 'static,
    {
        self.on(Method::PUT, MethodFilter::PUT, path, handler)
    }

    /// Serves `handler` for `PATCH path`.
    pub fn patch<H, T>(self, path: &str, handler: H) -> Self
    where
        H: Handler<T, ()>,
        T: 'static,
    {
        self.on(Method::PATCH, MethodFilter::PATCH, path, handler)
    }

    /// Serves `handler` for `DELETE path`.
    pub fn delete<H, T>(self, path: &str, handler: H) -> Self
    where
        H: Handler<T, ()>,
        T: 'static,
    {
        self.on(Method::DELETE, MethodFilter::DELETE, path, handler)
    }

    fn on<H, T>(mut self, method: Method, filter: MethodFilter, path: &str, handler: H) -> Self
    where
        H: Handler<T, ()>,
        T: 'static,
    {
        self.router = self.router.route(path, on(filter, handler));
        self.operations.insert(format!("{method} {path}"));
        self
    }

    /// The operations served, as `"<METHOD> <route template>"`.
    pub fn operations(&self) -> &BTreeSet<String> {
        &self.operations
    }

    /// The router, for the server to put behind the layer.
    pub fn into_router(self) -> Router {
        self.router
    }
}

/// The demo API under `/api`: what a fresh checkout serves.
pub fn api() -> ApiRoutes {
    ApiRoutes::new()
        .get("/api/hello", hello)
        .get("/api/orders/{id}", order)
        .post("/api/orders", create_order)
}

async fn hello() -> axum::Json<serde_json::Value> {
    axum::Json(json!({ "message": "hello" }))
}

async fn order(Path(id): Path<String>) -> axum::Json<serde_json::Value> {
    axum::Json(json!({ "id": id, "status": "open" }))
}

async fn create_order() -> (StatusCode, axum::Json<serde_json::Value>) {
    let id = uuid::Uuid::new_v4().to_string();
    (StatusCode::CREATED, axum::Json(json!({ "id": id, "status": "created" })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_api_names_each_operation_by_method_and_template() {
        let served: Vec<_> = api().operations().iter().cloned().collect();
        assert_eq!(
            served,
            [
                "GET /api/hello",
                "GET /api/orders/{id}",
                "HEAD /api/hello",
                "HEAD /api/orders/{id}",
                "POST /api/orders"
            ]
        );
    }

    #[test]
    fn two_methods_on_one_path_are_two_operations() {
        let routes = ApiRoutes::new().post("/x", || async {}).delete("/x", || async {});
        assert_eq!(routes.operations().len(), 2);
        assert!(routes.operations().contains("DELETE /x"));
    }
}
