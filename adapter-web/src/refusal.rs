//! Outcome -> HTTP (the table in docs/http-edge.md): the headers of an
//! admitted request, and the problem+json `Refusal` that replaces the
//! handler's answer, reshaped by the service's hook if it set one. Shadow
//! policies never show and never refuse.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use axum::body::Body;
use axum::response::IntoResponse;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use problem_details::ProblemDetails;
use shared_contract::{
    IncompatibleCategory, RateLimitFailure, RateLimitOutcomeExt, UnavailableCategory,
    whole_seconds_up, whole_seconds_up_millis,
};

use crate::bridge::{BridgeEvaluation, limit_header};
use crate::rejection::{EdgeRejection, problem_type};
use crate::settings::{DEFAULT_PROBLEM_TYPE_BASE, EdgeSettings};

/// `RateLimit-Policy` header name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` header name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The `RateLimit-Policy` and `RateLimit` headers of the enforced policies; none for a failure.
pub(crate) fn decision_headers(evaluation: &BridgeEvaluation) -> DecisionHeaders {
    let mut enforced = evaluation.enforced_decisions().peekable();
    if enforced.peek().is_none() {
        return DecisionHeaders::default();
    }
    DecisionHeaders { policy: evaluation.policy_header.clone(), limit: limit_header(enforced) }
}

/// A decision's two headers, held as values until the response is there: no
/// header map of their own to allocate and merge.
#[derive(Debug, Default)]
pub(crate) struct DecisionHeaders {
    policy: Option<HeaderValue>,
    limit: Option<HeaderValue>,
}

impl DecisionHeaders {
    /// Sets them on `headers`, replacing any of the same name.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some(value) = self.policy {
            headers.insert(RATELIMIT_POLICY, value);
        }
        if let Some(value) = self.limit {
            headers.insert(RATELIMIT, value);
        }
    }
}

impl Refusal<'_> {
    /// The default problem+json answer, with `Retry-After` and any decision headers.
    pub(crate) fn response(self, settings: &EdgeSettings) -> Response<Body> {
        let evaluation = match self {
            Self::Rejected(rejection) => {
                let (status, title) = rejection.status_and_title();
                return problem(settings, status, rejection.category_name())
                    .with_title(title)
                    .with_detail(rejection.detail())
                    .into_response();
            }
            Self::Outcome(evaluation) => evaluation,
        };
        let category = evaluation.outcome.category_name();
        let failure_seconds = whole_seconds_up(settings.failure_retry_after);
        let (mut response, retry_after) = match &evaluation.outcome {
            Ok(_) => {
                let violated = evaluation.violated_policies();
                // The request passes only once every denying policy allows it.
                let wait = violated.iter().map(|(_, decision)| decision.retry_after_ms).max();
                let seconds = wait.map_or(failure_seconds, whole_seconds_up_millis);
                let names: Vec<&str> = violated.iter().map(|(id, _)| id.as_str()).collect();
                let quoted: Vec<String> = names.iter().map(|name| format!("\"{name}\"")).collect();
                let detail = format!(
                    "Too many requests under rate limit {} {}; retry after {seconds} s.",
                    if names.len() == 1 { "policy" } else { "policies" },
                    quoted.join(", "),
                );
                let response = problem(settings, StatusCode::TOO_MANY_REQUESTS, category)
                    .with_title("Too Many Requests")
                    .with_detail(detail)
                    .with_extensions(BTreeMap::from([("violated-policies", names)]))
                    .into_response();
                (response, seconds)
            }
            Err(failure) => {
                let response = problem(settings, StatusCode::SERVICE_UNAVAILABLE, category)
                    .with_title("Rate Limit Unavailable")
                    .with_detail(failure_detail(failure))
                    .into_response();
                (response, failure_seconds)
            }
        };
        let headers = response.headers_mut();
        headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
        decision_headers(evaluation).apply(headers);
        response
    }
}

const fn failure_detail(failure: &RateLimitFailure) -> &'static str {
    use {IncompatibleCategory as I, UnavailableCategory as U};
    match failure {
        RateLimitFailure::Unavailable { category: U::AdmissionRejected, .. } => {
            "The rate limiter could not take the request before its deadline."
        }
        RateLimitFailure::Unavailable { category: U::UnavailableBeforeSend, .. } => {
            "The rate limit store could not be reached."
        }
        RateLimitFailure::Unavailable { category: U::ClockUnsafe, .. } => {
            "This server's clock disagrees with the rate limit store beyond the allowed skew; the request was not counted."
        }
        RateLimitFailure::Incompatible { category: I::UnknownPolicy } => {
            "The rate limit policy of this operation is not configured."
        }
        RateLimitFailure::Incompatible { category: I::CostExceedsMaximum } => {
            "The request costs more than its rate limit policy allows."
        }
        RateLimitFailure::Incompatible { category: I::StateIncompatible } => {
            "The stored rate limit state cannot be read by this server."
        }
        RateLimitFailure::Indeterminate { .. } => {
            "The rate limit decision could not be confirmed; the request was not served."
        }
    }
}

/// A problem+json body with its status and `type`.
fn problem(settings: &EdgeSettings, status: StatusCode, category: &str) -> ProblemDetails {
    // A bridge built from unvalidated settings still answers with a usable type.
    let r#type = problem_type(&settings.problem_type_base, category)
        .or_else(|| problem_type(DEFAULT_PROBLEM_TYPE_BASE, category));
    let mut problem = ProblemDetails::from_status_code(status);
    problem.r#type = r#type;
    problem
}

/// Why the edge answered instead of the handler.
#[derive(Debug, Clone, Copy)]
pub enum Refusal<'a> {
    /// The port's answer was not an allowed decision (`429` or `503`).
    Outcome(&'a BridgeEvaluation),
    /// The request was refused before evaluation (`400` or `500`).
    Rejected(&'a EdgeRejection),
}

type ShapeFn = dyn Fn(Refusal<'_>, Response<Body>) -> Response<Body> + Send + Sync;

/// Rewrites the default problem+json refusal; it cannot admit the request.
#[derive(Clone)]
pub(crate) struct RefusalShaper(pub(crate) Arc<ShapeFn>);

impl fmt::Debug for RefusalShaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RefusalShaper(..)")
    }
}
