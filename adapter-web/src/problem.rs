//! Problem `type` URIs: every category the edge answers with, and the URI
//! a base makes of it. Below `settings` (which checks a base) and
//! `mapping` (which answers with it); imports neither.

use http::Uri;
use problem_details::ProblemType;
use shared_contract::RateLimitFailure;

use crate::rejection::EdgeRejection;

/// Every problem type suffix the edge can produce: the outcome categories
/// and the edge's own rejections, from their enums.
pub(crate) fn problem_type_names() -> impl Iterator<Item = &'static str> {
    RateLimitFailure::outcome_names().chain(EdgeRejection::CATEGORY_NAMES)
}

/// `base + category` as a problem type, if it is a URI.
pub(crate) fn problem_type(base: &str, category: &str) -> Option<ProblemType> {
    format!("{base}{category}").parse::<Uri>().ok().map(ProblemType::from)
}
