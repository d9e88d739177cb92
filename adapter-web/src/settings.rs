//! `EdgeSettings`: plain configuration of the edge.

use std::collections::HashMap;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;
use shared_contract::PolicyId;

use crate::error::WebError;
use crate::mapping::problem_type;

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
    /// Checks what the types cannot: a non-zero budget, and a problem type
    /// base that forms a URI with every category name. Call it at start-up;
    /// [`crate::TransportBridge::new`] falls back to the default base when
    /// the configured one is unusable.
    pub fn validate(&self) -> Result<(), WebError> {
        if self.evaluation_budget.is_zero() {
            return Err(WebError::ZeroEvaluationBudget);
        }
        crate::mapping::ALL_CATEGORIES.iter().try_for_each(|category| {
            problem_type(&self.problem_type_base, category).map(drop).ok_or_else(|| {
                WebError::InvalidProblemTypeBase { base: self.problem_type_base.clone(), category }
            })
        })
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
        assert_eq!(zero.validate(), Err(WebError::ZeroEvaluationBudget));
        let bad_base =
            EdgeSettings { problem_type_base: "not a uri ".into(), ..EdgeSettings::default() };
        assert!(matches!(bad_base.validate(), Err(WebError::InvalidProblemTypeBase { .. })));
    }
}
