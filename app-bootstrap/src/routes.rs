//! The service's own API: the routes a fork replaces with its own. Every
//! route of [`api`] is served behind the rate-limit layer (the server
//! applies it to the whole router it is given), and [`ApiRoutes`] knows the
//! operations it serves, so a configured operation that names no route
//! stops start-up. Probes and metrics live in `server`, never rate limited.
//! The API's own problems (a bad query, no route, a method the route does
//! not take) are problem+json of type `<problem-type-base><category>`, as
//! the edge's are ([`ProblemBase`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use adapter_web::{BridgeSwitch, DEFAULT_PROBLEM_TYPE_BASE, RateLimitCost, RateLimitUsage};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query};
use axum::handler::Handler;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on};
use axum::{Extension, Router};
use problem_details::{ProblemDetails, ProblemType};
use serde::Deserialize;
use serde_json::json;
use shared_contract::MAX_COUNT;

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
        .get("/api/work", work)
        .post(COMPLETE, complete)
}

/// The demo route of usage-based limits: it reserves `reserve` units
/// ([`reserve`] sets them before the rate-limit layer) and reports `use`.
pub const COMPLETE: &str = "/api/complete";

/// The query of `POST /api/complete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteQuery {
    /// Units to reserve, at least 1 (at most the policy's `maximum-cost`).
    reserve: u64,
    /// Units the work used, settled against the reservation.
    #[serde(rename = "use")]
    used: u64,
}

/// Before the rate-limit layer: `POST /api/complete?reserve=R` reserves
/// `R` units (a whole number from 1) through [`RateLimitCost`], as a team's
/// own layer would set a request's cost. Any other request, or a query it
/// cannot read, is left as it came (the handler answers that query 400).
pub async fn reserve(mut request: axum::extract::Request) -> axum::extract::Request {
    if request.method() == Method::POST && request.uri().path() == COMPLETE {
        let query = Query::<CompleteQuery>::try_from_uri(request.uri());
        if let Ok(Query(CompleteQuery { reserve: reserved @ 1.., .. })) = query {
            request.extensions_mut().insert(RateLimitCost(reserved));
        }
    }
    request
}

/// `POST /api/complete?reserve=R&use=U`: the work is done, it used `U`
/// units; the edge settles `U` against the `R` reserved once this body is
/// sent. A query that is not two whole numbers (`R` from 1, `U` within a
/// counter's range) is a 400.
async fn complete(
    base: Option<Extension<ProblemBase>>,
    query: Result<Query<CompleteQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(CompleteQuery { reserve: reserved @ 1.., used: used @ ..=MAX_COUNT })) = query
    else {
        return problem(
            base,
            StatusCode::BAD_REQUEST,
            "invalid-query",
            &format!(
                "The query is reserve and use, whole numbers: reserve from 1, use at most \
                 {MAX_COUNT}."
            ),
        );
    };
    let mut response = axum::Json(json!({ "reserved": reserved, "used": used })).into_response();
    response.extensions_mut().insert(RateLimitUsage::new(used));
    response
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

/// The longest `GET /api/work` waits: `ms` above it is a 400.
pub const MAX_WORK_MS: u64 = 5000;
/// What `GET /api/work` waits when `ms` is left out.
pub const DEFAULT_WORK_MS: u64 = 200;

/// The query of `GET /api/work`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkQuery {
    /// Milliseconds to wait, `0..=MAX_WORK_MS`.
    ms: Option<u64>,
}

/// `GET /api/work?ms=N`: waits N ms (default [`DEFAULT_WORK_MS`], at most
/// [`MAX_WORK_MS`]) and answers, so a request stays in flight long enough
/// to show an in-flight (concurrency) limit. A query that is not one whole
/// `ms` in range is a 400 problem+json, never a 500.
async fn work(
    base: Option<Extension<ProblemBase>>,
    query: Result<Query<WorkQuery>, QueryRejection>,
) -> Response {
    let Some(ms) = work_ms(query) else {
        return bad_work_query(base);
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    axum::Json(json!({ "worked-ms": ms })).into_response()
}

/// The milliseconds `GET /api/work` was asked to wait; `None` for a query
/// it cannot take.
fn work_ms(query: Result<Query<WorkQuery>, QueryRejection>) -> Option<u64> {
    let Query(WorkQuery { ms }) = query.ok()?;
    Some(ms.unwrap_or(DEFAULT_WORK_MS)).filter(|ms| *ms <= MAX_WORK_MS)
}

fn bad_work_query(base: Option<Extension<ProblemBase>>) -> Response {
    problem(
        base,
        StatusCode::BAD_REQUEST,
        "invalid-query",
        &format!(
            "The only query parameter is ms, a whole number of milliseconds from 0 to \
             {MAX_WORK_MS} (default {DEFAULT_WORK_MS})."
        ),
    )
}

/// Where the API's own problem types start: `problem-type-base` as the
/// edge in force has it (so a reload that changes it applies here too), or
/// as configured when nothing limits. The server puts it on every request
/// as an extension; a router served without it (a unit test) answers with
/// [`DEFAULT_PROBLEM_TYPE_BASE`].
#[derive(Debug, Clone)]
pub enum ProblemBase {
    /// The edge's settings in force.
    Edge(BridgeSwitch),
    /// A base fixed at start-up.
    Fixed(Arc<str>),
}

impl ProblemBase {
    /// `<base><category>` as a problem type; the default base's when the
    /// configured one does not form a URI with it (validation refuses
    /// such a base at start-up).
    pub fn problem_type(&self, category: &str) -> Option<ProblemType> {
        let of =
            |base: &str| format!("{base}{category}").parse::<Uri>().ok().map(ProblemType::from);
        let configured = match self {
            Self::Edge(switch) => of(&switch.current().settings().problem_type_base),
            Self::Fixed(base) => of(base),
        };
        configured.or_else(|| of(DEFAULT_PROBLEM_TYPE_BASE))
    }
}

/// A problem+json answer of type `<problem-type-base><category>`.
fn problem(
    base: Option<Extension<ProblemBase>>,
    status: StatusCode,
    category: &str,
    detail: &str,
) -> Response {
    let base = base.map_or_else(
        || ProblemBase::Fixed(Arc::from(DEFAULT_PROBLEM_TYPE_BASE)),
        |Extension(base)| base,
    );
    let mut problem = ProblemDetails::from_status_code(status).with_detail(detail);
    problem.r#type = base.problem_type(category);
    problem.into_response()
}

/// The API's answer to a path no route serves: `404` problem+json. The
/// server puts it behind the rate-limit layer, so such a request is
/// charged as `"<METHOD> <unmatched>"`.
pub async fn not_found(base: Option<Extension<ProblemBase>>) -> Response {
    problem(base, StatusCode::NOT_FOUND, "not-found", "No route serves this path.")
}

/// The API's answer to a method a route does not take: `405`
/// problem+json (axum adds the `Allow` header).
pub async fn method_not_allowed(base: Option<Extension<ProblemBase>>) -> Response {
    problem(
        base,
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "This route does not take this method; see the Allow header.",
    )
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
                "GET /api/work",
                "HEAD /api/hello",
                "HEAD /api/orders/{id}",
                "HEAD /api/work",
                "POST /api/complete",
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

    async fn get(uri: &str) -> (StatusCode, Option<String>, serde_json::Value) {
        use tower::ServiceExt;
        let request = axum::http::Request::get(uri).body(axum::body::Body::empty()).unwrap();
        let response = api().into_router().oneshot(request).await.unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .map(|value| value.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, content_type, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn work_waits_the_ms_asked_and_defaults_to_200() {
        let (status, _, body) = get("/api/work?ms=0").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, json!({ "worked-ms": 0 }));
        let (status, _, body) = get("/api/work").await;
        assert_eq!((status, body), (StatusCode::OK, json!({ "worked-ms": 200 })));
        // The longest wait is taken, one more is not (read, not waited).
        let query = |text: &str| {
            let uri: axum::http::Uri = format!("/api/work?{text}").parse().unwrap();
            Query::<WorkQuery>::try_from_uri(&uri)
        };
        assert_eq!(work_ms(query("ms=5000")), Some(MAX_WORK_MS));
        assert_eq!(work_ms(query("ms=5001")), None);
    }

    #[tokio::test]
    async fn a_bad_work_query_is_a_400_problem_never_a_500() {
        for query in [
            "ms=5001",
            "ms=abc",
            "ms=-1",
            "ms=1.5",
            "ms=",
            "ms=99999999999999999999999",
            "ms=1&ms=2",
            "ms=1&other=2",
            "%ff=1",
        ] {
            let (status, content_type, body) = get(&format!("/api/work?{query}")).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
            assert_eq!(content_type.as_deref(), Some("application/problem+json"), "{query}");
            assert_eq!(body["status"], 400, "{query}");
            let expected = format!("{DEFAULT_PROBLEM_TYPE_BASE}invalid-query");
            assert_eq!(body["type"], expected.as_str(), "{query}");
        }
    }
}
