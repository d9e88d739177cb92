//! Outcome -> HTTP: which status, headers and problem+json body each
//! answer of the port (and each edge rejection) becomes.
//!
//! | outcome | status | headers |
//! | --- | --- | --- |
//! | allowed | handler's | `RateLimit-Policy`, `RateLimit` |
//! | denied | 429 | `Retry-After` (decision, whole s up), `RateLimit-Policy`, `RateLimit` |
//! | `Unavailable`, `Indeterminate`, `Incompatible` | 503 | `Retry-After` (configured) |
//! | invalid API key | 400 | none |
//! | no peer address | 500 | none |

use axum::body::Body;
use axum::response::IntoResponse;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, Uri};
use problem_details::{ProblemDetails, ProblemType};
use shared_contract::{IncompatibleCategory, RateLimitOutcome, UnavailableCategory};

use crate::bridge::BridgeEvaluation;
use crate::ratelimit_headers::{limit_header, policy_header, whole_seconds_up};
use crate::rejection::EdgeRejection;
use crate::settings::{DEFAULT_PROBLEM_TYPE_BASE, EdgeSettings};

/// `RateLimit-Policy` header name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` header name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Every problem type suffix the edge can produce: the outcome categories
/// and the edge's own rejections, from their enums.
pub(crate) fn problem_type_names() -> impl Iterator<Item = &'static str> {
    RateLimitOutcome::category_names().chain(EdgeRejection::CATEGORY_NAMES)
}

/// `base + category` as a problem type, if it is a URI.
pub(crate) fn problem_type(base: &str, category: &str) -> Option<ProblemType> {
    format!("{base}{category}").parse::<Uri>().ok().map(ProblemType::from)
}

/// The `RateLimit-Policy` and `RateLimit` headers of an evaluated outcome;
/// empty for failures, which carry no decision.
pub(crate) fn decision_headers(evaluation: &BridgeEvaluation) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let RateLimitOutcome::Evaluated(decision) = &evaluation.outcome else {
        return headers;
    };
    if let Some(value) = evaluation.policy.as_ref().and_then(policy_header) {
        headers.insert(RATELIMIT_POLICY, value);
    }
    if let Some(value) = limit_header(&evaluation.policy_id, decision) {
        headers.insert(RATELIMIT, value);
    }
    headers
}

/// The response that replaces the handler's, or `None` when the request is
/// allowed and the handler should run.
pub(crate) fn refusal(
    evaluation: &BridgeEvaluation,
    settings: &EdgeSettings,
) -> Option<Response<Body>> {
    let outcome = &evaluation.outcome;
    let unavailable = "Rate Limit Unavailable";
    let (status, title, retry_after, detail) = match outcome {
        RateLimitOutcome::Evaluated(decision) if decision.allowed => return None,
        RateLimitOutcome::Evaluated(decision) => {
            let seconds = whole_seconds_up(decision.retry_after);
            let detail = format!(
                "Too many requests under rate limit policy \"{}\"; retry after {seconds} s.",
                evaluation.policy_id
            );
            (StatusCode::TOO_MANY_REQUESTS, "Too Many Requests", seconds, detail)
        }
        RateLimitOutcome::Unavailable { category, .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            unavailable,
            failure_seconds(settings),
            unavailable_detail(*category).to_owned(),
        ),
        RateLimitOutcome::Incompatible { category } => (
            StatusCode::SERVICE_UNAVAILABLE,
            unavailable,
            failure_seconds(settings),
            incompatible_detail(*category).to_owned(),
        ),
        RateLimitOutcome::Indeterminate { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            unavailable,
            failure_seconds(settings),
            "The rate limit decision could not be confirmed; the request was not served."
                .to_owned(),
        ),
    };
    let mut response = problem(settings, status, outcome.category_name(), title, detail);
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    headers.extend(decision_headers(evaluation));
    Some(response)
}

/// The response to a request refused before evaluation.
pub(crate) fn rejection_response(
    rejection: &EdgeRejection,
    settings: &EdgeSettings,
) -> Response<Body> {
    let title = match rejection {
        EdgeRejection::InvalidApiKey(_) => "Invalid API Key",
        EdgeRejection::MissingPeerAddress => "Client Address Unavailable",
    };
    problem(
        settings,
        rejection.status(),
        rejection.category_name(),
        title,
        rejection.detail().into_owned(),
    )
}

fn failure_seconds(settings: &EdgeSettings) -> u64 {
    whole_seconds_up(settings.failure_retry_after)
}

const fn unavailable_detail(category: UnavailableCategory) -> &'static str {
    match category {
        UnavailableCategory::AdmissionRejected => {
            "The rate limiter could not take the request before its deadline."
        }
        UnavailableCategory::UnavailableBeforeSend => "The rate limit store could not be reached.",
        UnavailableCategory::ClockUnsafe => {
            "The server clock is behind the stored rate limit state; the request was not counted."
        }
    }
}

const fn incompatible_detail(category: IncompatibleCategory) -> &'static str {
    match category {
        IncompatibleCategory::UnknownPolicy => {
            "The rate limit policy of this operation is not configured."
        }
        IncompatibleCategory::CostExceedsMaximum => {
            "The request costs more than its rate limit policy allows."
        }
        IncompatibleCategory::StateIncompatible => {
            "The stored rate limit state cannot be read by this server."
        }
    }
}

fn problem(
    settings: &EdgeSettings,
    status: StatusCode,
    category: &str,
    title: &str,
    detail: String,
) -> Response<Body> {
    // `EdgeSettings::validate` rejects a base that does not form a URI; a
    // bridge built without validating still answers with a usable type.
    let r#type = problem_type(&settings.problem_type_base, category)
        .or_else(|| problem_type(DEFAULT_PROBLEM_TYPE_BASE, category));
    let mut problem =
        ProblemDetails::from_status_code(status).with_title(title).with_detail(detail);
    problem.r#type = r#type;
    problem.into_response()
}
