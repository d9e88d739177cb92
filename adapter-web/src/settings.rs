//! `EdgeSettings`: plain configuration of the edge.

use std::collections::HashMap;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;
use shared_contract::PolicyId;

use crate::error::WebError;
use crate::mapping::{problem_type, problem_type_names};

/// How the edge resolves subjects, picks policies and answers failures.
#[derive(Debug, Clone)]
pub struct EdgeSettings {
    /// Time one evaluation may take: `deadline = now + budget`. Default 750 ms.
    pub evaluation_budget: Duration,
    /// `Retry-After` of every `503`, rounded up to whole seconds. Default 1 s.
    pub failure_retry_after: Duration,
    /// Header that carries an API key. Default `x-api-key`.
    pub api_key_header: HeaderName,
    /// Socket peers whose forwarding headers are believed. Default: none.
    pub trusted_proxies: Vec<IpNet>,
    /// Policy of every operation not in `operations`. Default `default`.
    pub default_policy: PolicyId,
    /// Policy by operation id (`"GET /api/orders/{id}"`).
    pub operations: HashMap<String, PolicyId>,
    /// Problem `type` URIs are this plus the category name. Default
    /// `https://ca-skeleton.invalid/problems/`: `.invalid` can never belong
    /// to someone else; a service sets its own documentation URL.
    pub problem_type_base: String,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            evaluation_budget: Duration::from_millis(750),
            failure_retry_after: Duration::from_secs(1),
            api_key_header: HeaderName::from_static("x-api-key"),
            trusted_proxies: Vec::new(),
            default_policy: PolicyId::new("default").expect("\"default\" is a valid policy id"),
            operations: HashMap::new(),
            problem_type_base: DEFAULT_PROBLEM_TYPE_BASE.to_owned(),
        }
    }
}

/// The default [`EdgeSettings::problem_type_base`].
pub const DEFAULT_PROBLEM_TYPE_BASE: &str = "https://ca-skeleton.invalid/problems/";

impl EdgeSettings {
    /// Every rule the types cannot hold, broken: a budget and a failure
    /// retry-after of at least 1 ms, and a non-empty problem type base that
    /// forms a URI with every category name. Empty when the settings can
    /// work. Problem responses fall back to the default base per response
    /// when an unvalidated base does not form a URI.
    pub fn problems(&self) -> Vec<WebError> {
        let mut problems = Vec::new();
        if self.evaluation_budget < Duration::from_millis(1) {
            problems.push(WebError::EvaluationBudgetTooShort(self.evaluation_budget));
        }
        if self.failure_retry_after < Duration::from_millis(1) {
            problems.push(WebError::FailureRetryAfterTooShort(self.failure_retry_after));
        }
        let base = &self.problem_type_base;
        let unusable = if base.is_empty() {
            Some("")
        } else {
            problem_type_names().find(|category| problem_type(base, category).is_none())
        };
        if let Some(category) = unusable {
            problems.push(WebError::InvalidProblemTypeBase { base: base.clone(), category });
        }
        problems
    }

    /// The first of [`Self::problems`]. Call it at start-up.
    pub fn validate(&self) -> Result<(), WebError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_issue() {
        let settings = EdgeSettings::default();
        assert_eq!(settings.evaluation_budget, Duration::from_millis(750));
        assert_eq!(settings.failure_retry_after, Duration::from_secs(1));
        assert_eq!(settings.api_key_header, "x-api-key");
        assert!(settings.trusted_proxies.is_empty());
        assert!(settings.validate().is_ok());
    }

    #[test]
    fn validation_names_the_bad_setting() {
        let zero = EdgeSettings { evaluation_budget: Duration::ZERO, ..EdgeSettings::default() };
        assert_eq!(zero.validate(), Err(WebError::EvaluationBudgetTooShort(Duration::ZERO)));
        let bad_base =
            EdgeSettings { problem_type_base: "not a uri ".into(), ..EdgeSettings::default() };
        assert!(matches!(bad_base.validate(), Err(WebError::InvalidProblemTypeBase { .. })));
        let empty = EdgeSettings { problem_type_base: String::new(), ..EdgeSettings::default() };
        assert!(matches!(empty.validate(), Err(WebError::InvalidProblemTypeBase { .. })));
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let sub_millisecond = Duration::from_micros(500);
        let settings = EdgeSettings {
            evaluation_budget: sub_millisecond,
            failure_retry_after: Duration::ZERO,
            problem_type_base: String::new(),
            ..EdgeSettings::default()
        };
        assert_eq!(
            settings.problems(),
            [
                WebError::EvaluationBudgetTooShort(sub_millisecond),
                WebError::FailureRetryAfterTooShort(Duration::ZERO),
                WebError::InvalidProblemTypeBase { base: String::new(), category: "" },
            ]
        );
    }
}
