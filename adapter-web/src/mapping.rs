//! Outcome -> HTTP: which status, headers and problem+json body each
//! answer of the port (and each edge rejection) becomes.
//!
//! | outcome | status | headers |
//! | --- | --- | --- |
//! | allowed | handler's | `RateLimit-Policy`, `RateLimit` (enforced policies) |
//! | denied | 429 | `Retry-After` (largest of the denying enforced, whole s up), `RateLimit-Policy`, `RateLimit`; body names `violated-policies` |
//! | `Unavailable`, `Indeterminate`, `Incompatible` | 503 | `Retry-After` (configured) |
//! | any failure, set of shadow policies only | handler's | none |
//! | invalid API key | 400 | none |
//! | no peer address | 500 | none |
//!
//! Shadow policies never show: not in headers, not in a body, and they
//! never turn an answer into a refusal.

use std::collections::BTreeMap;
use std::fmt;

use axum::body::Body;
use axum::response::IntoResponse;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use problem_details::ProblemDetails;
use shared_contract::{
    IncompatibleCategory, RateLimitFailure, RateLimitOutcomeExt, UnavailableCategory,
    whole_seconds_up_millis,
};

use crate::bridge::BridgeEvaluation;
use crate::problem::problem_type;
use crate::ratelimit_headers::{limit_header, whole_seconds_up};
use crate::rejection::EdgeRejection;
use crate::settings::{DEFAULT_PROBLEM_TYPE_BASE, EdgeSettings};

/// `RateLimit-Policy` header name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` header name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The `RateLimit-Policy` and `RateLimit` headers of an evaluated outcome,
/// listing the set's enforced policies in configured order; none for
/// failures, which carry no decision, and for a set without an enforced
/// policy.
pub(crate) fn decision_headers(evaluation: &BridgeEvaluation) -> DecisionHeaders {
    let mut enforced = evaluation.enforced_limits().peekable();
    if enforced.peek().is_none() {
        return DecisionHeaders::default();
    }
    DecisionHeaders {
        // The bridge made it once for the set: the enforced policies it holds.
        policy: evaluation.policy_header.clone(),
        limit: limit_header(enforced),
    }
}

/// The two headers of a decision, held as values until the response is
/// there: no header map of their own to allocate, hash and merge.
#[derive(Debug, Default)]
pub(crate) struct DecisionHeaders {
    policy: Option<HeaderValue>,
    limit: Option<HeaderValue>,
}

impl DecisionHeaders {
    /// Sets them on `headers`, replacing any of the same name: the limiter
    /// is the authority on its own headers.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some(value) = self.policy {
            headers.insert(RATELIMIT_POLICY, value);
        }
        if let Some(value) = self.limit {
            headers.insert(RATELIMIT, value);
        }
    }
}

/// The problem+json extension member of a `429`: the ids of the enforced
/// policies that denied, in configured order (draft-ietf-httpapi-ratelimit-headers
/// `violated-policies`).
const VIOLATED_POLICIES: &str = "violated-policies";

/// The response that replaces the handler's, or `None` when the handler
/// should run: the set was admitted, or it holds no enforced policy.
pub(crate) fn refusal(
    evaluation: &BridgeEvaluation,
    settings: &EdgeSettings,
) -> Option<Response<Body>> {
    if evaluation.admits() {
        return None;
    }
    let outcome = &evaluation.outcome;
    let category = outcome.category_name();
    let unavailable = "Rate Limit Unavailable";
    let (status, title, retry_after, detail) = match outcome {
        Ok(_) => {
            let violated = evaluation.violated_policies();
            // The request passes only once every denying policy allows it.
            // A refused set always has a denying enforced policy (its
            // admission follows its members); the failure retry-after
            // covers a port that describes the set's policies otherwise.
            let wait = violated.iter().map(|(_, decision)| decision.retry_after_ms).max();
            let seconds = wait.map_or_else(
                || whole_seconds_up(settings.failure_retry_after),
                whole_seconds_up_millis,
            );
            let names: Vec<&str> = violated.iter().map(|(id, _)| id.as_str()).collect();
            let detail = format!(
                "Too many requests under rate limit {} {}; retry after {seconds} s.",
                if names.len() == 1 { "policy" } else { "policies" },
                Quoted(&names),
            );
            let extension = BTreeMap::from([(VIOLATED_POLICIES, names)]);
            let mut response = problem(settings, StatusCode::TOO_MANY_REQUESTS, category)
                .with_title("Too Many Requests")
                .with_detail(detail)
                .with_extensions(extension)
                .into_response();
            finish(&mut response, seconds, evaluation);
            return Some(response);
        }
        Err(RateLimitFailure::Unavailable { category, .. }) => (
            StatusCode::SERVICE_UNAVAILABLE,
            unavailable,
            failure_seconds(settings),
            unavailable_detail(*category),
        ),
        Err(RateLimitFailure::Incompatible { category }) => (
            StatusCode::SERVICE_UNAVAILABLE,
            unavailable,
            failure_seconds(settings),
            incompatible_detail(*category),
        ),
        Err(RateLimitFailure::Indeterminate { .. }) => (
            StatusCode::SERVICE_UNAVAILABLE,
            unavailable,
            failure_seconds(settings),
            "The rate limit decision could not be confirmed; the request was not served.",
        ),
    };
    let mut response =
        problem(settings, status, category).with_title(title).with_detail(detail).into_response();
    finish(&mut response, retry_after, evaluation);
    Some(response)
}

fn finish(response: &mut Response<Body>, retry_after: u64, evaluation: &BridgeEvaluation) {
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    decision_headers(evaluation).apply(headers);
}

/// `"a", "b"` for a detail sentence.
struct Quoted<'a>(&'a [&'a str]);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, name) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "\"{name}\"")?;
        }
        Ok(())
    }
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
    problem(settings, rejection.status(), rejection.category_name())
        .with_title(title)
        .with_detail(rejection.detail().into_owned())
        .into_response()
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
            "This server's clock disagrees with the rate limit store beyond the allowed skew; the request was not counted."
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

/// A problem+json body with its status and `type`; the caller adds title,
/// detail and any extension member.
fn problem(settings: &EdgeSettings, status: StatusCode, category: &str) -> ProblemDetails {
    // `EdgeSettings::validate` rejects a base that does not form a URI; a
    // bridge built without validating still answers with a usable type.
    let r#type = problem_type(&settings.problem_type_base, category)
        .or_else(|| problem_type(DEFAULT_PROBLEM_TYPE_BASE, category));
    let mut problem = ProblemDetails::from_status_code(status);
    problem.r#type = r#type;
    problem
}
