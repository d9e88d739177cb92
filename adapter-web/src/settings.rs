//! `EdgeSettings`: plain configuration of the edge. Its serde names are the
//! keys of `capabilities.rate-limit`, its `Default` their defaults.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use shared_contract::{DEFAULT_FAILURE_RETRY_AFTER, PolicyId, PolicySet};

use crate::error::WebError;
use crate::problem::{problem_type, problem_type_names};

/// How the edge resolves subjects, picks policies and answers failures.
///
/// The policy sets are not read from these keys: the application checks
/// `default-policy` and `operations` against its policy table and fills
/// them in.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct EdgeSettings {
    /// Time one evaluation may take: `deadline = now + budget`. Default 750 ms.
    #[serde(with = "humantime_serde")]
    pub evaluation_budget: Duration,
    /// `Retry-After` of every `503`, rounded up to whole seconds. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub failure_retry_after: Duration,
    /// Header that carries an API key. Default `x-api-key`.
    #[serde(with = "header_name")]
    pub api_key_header: HeaderName,
    /// Socket peers whose forwarding headers are believed: CIDRs, or bare
    /// addresses (one host). Default: none.
    #[serde(with = "networks")]
    pub trusted_proxies: Vec<IpNet>,
    /// Policy set of every operation not in `operations`. Default: the set
    /// of the one policy [`DEFAULT_POLICY`].
    #[serde(skip)]
    pub default_policies: PolicySet,
    /// Policy set by operation id (`"GET /api/orders/{id}"`), each in
    /// configured order.
    #[serde(skip)]
    pub operations: HashMap<String, PolicySet>,
    /// IPv4 clients are counted per network of this many leading bits
    /// (`1..=32`). Default 32: one address, one subject.
    pub client_ipv4_prefix: u8,
    /// IPv6 clients are counted per network of this many leading bits
    /// (`1..=128`). Default 64: one host usually holds a whole /64 and can
    /// rotate addresses inside it at will, so counting per address would
    /// give it 2^64 budgets.
    pub client_ipv6_prefix: u8,
    /// Problem `type` URIs are this plus the category name. Default
    /// `https://ca-skeleton.invalid/problems/`: `.invalid` can never belong
    /// to someone else; a service sets its own documentation URL.
    pub problem_type_base: String,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            evaluation_budget: Duration::from_millis(750),
            failure_retry_after: DEFAULT_FAILURE_RETRY_AFTER,
            api_key_header: HeaderName::from_static("x-api-key"),
            trusted_proxies: Vec::new(),
            default_policies: PolicySet::single(
                PolicyId::new(DEFAULT_POLICY).expect("DEFAULT_POLICY is a valid policy id"),
            ),
            operations: HashMap::new(),
            client_ipv4_prefix: 32,
            client_ipv6_prefix: 64,
            problem_type_base: DEFAULT_PROBLEM_TYPE_BASE.to_owned(),
        }
    }
}

/// The policy of every operation not mapped to a set of its own, unless
/// configured: also the id of the policy a configuration without policies
/// serves with.
pub const DEFAULT_POLICY: &str = "default";

/// The default [`EdgeSettings::problem_type_base`].
pub const DEFAULT_PROBLEM_TYPE_BASE: &str = "https://ca-skeleton.invalid/problems/";

/// Valid [`EdgeSettings::client_ipv4_prefix`] values.
const IPV4_PREFIXES: RangeInclusive<u8> = 1..=32;
/// Valid [`EdgeSettings::client_ipv6_prefix`] values.
const IPV6_PREFIXES: RangeInclusive<u8> = 1..=128;

impl EdgeSettings {
    /// Every rule the types cannot hold, broken: a budget and a failure
    /// retry-after of at least 1 ms, client prefixes in range, and a
    /// non-empty problem type base that forms a URI with every category
    /// name. Empty when the settings can work. Problem responses fall back to the default base per response
    /// when an unvalidated base does not form a URI.
    pub fn problems(&self) -> Vec<WebError> {
        let mut problems = Vec::new();
        if self.evaluation_budget < Duration::from_millis(1) {
            problems.push(WebError::EvaluationBudgetTooShort(self.evaluation_budget));
        }
        if self.failure_retry_after < Duration::from_millis(1) {
            problems.push(WebError::FailureRetryAfterTooShort(self.failure_retry_after));
        }
        if !IPV4_PREFIXES.contains(&self.client_ipv4_prefix) {
            problems.push(WebError::ClientIpv4PrefixOutOfRange(self.client_ipv4_prefix));
        }
        if !IPV6_PREFIXES.contains(&self.client_ipv6_prefix) {
            problems.push(WebError::ClientIpv6PrefixOutOfRange(self.client_ipv6_prefix));
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

    /// The IPv4 prefix in force. An unvalidated out-of-range value is
    /// clamped into `1..=32`, so subject resolution never fails per request.
    pub(crate) fn ipv4_prefix(&self) -> u8 {
        self.client_ipv4_prefix.clamp(*IPV4_PREFIXES.start(), *IPV4_PREFIXES.end())
    }

    /// The IPv6 prefix in force, clamped into `1..=128` like
    /// [`Self::ipv4_prefix`].
    pub(crate) fn ipv6_prefix(&self) -> u8 {
        self.client_ipv6_prefix.clamp(*IPV6_PREFIXES.start(), *IPV6_PREFIXES.end())
    }
}

/// `HeaderName` as its text.
mod header_name {
    use http::HeaderName;
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(name: &HeaderName, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(name.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<HeaderName, D::Error> {
        let text = String::deserialize(d)?;
        HeaderName::from_bytes(text.as_bytes())
            .map_err(|_| D::Error::custom(format!("{text:?} is not a valid HTTP header name")))
    }
}

/// Networks as text; a bare address reads as the network of that one host.
mod networks {
    use std::net::IpAddr;

    use ipnet::IpNet;
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(nets: &[IpNet], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(nets.iter().map(ToString::to_string))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|entry| {
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        D::Error::custom(format!(
                            "{entry:?} is not a CIDR like \"10.0.0.0/8\" or an IP address"
                        ))
                    })
            })
            .collect()
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
        assert_eq!(settings.default_policies.ids(), [PolicyId::new("default").unwrap()]);
        assert!(settings.operations.is_empty());
        assert_eq!((settings.client_ipv4_prefix, settings.client_ipv6_prefix), (32, 64));
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
    fn client_prefixes_are_checked_against_their_family() {
        let with = |v4, v6| EdgeSettings {
            client_ipv4_prefix: v4,
            client_ipv6_prefix: v6,
            ..EdgeSettings::default()
        };
        for (v4, v6) in [(1, 1), (32, 128), (24, 48)] {
            assert_eq!(with(v4, v6).problems(), [], "/{v4} and /{v6}");
        }
        assert_eq!(with(0, 64).problems(), [WebError::ClientIpv4PrefixOutOfRange(0)]);
        assert_eq!(with(33, 64).problems(), [WebError::ClientIpv4PrefixOutOfRange(33)]);
        assert_eq!(with(32, 0).problems(), [WebError::ClientIpv6PrefixOutOfRange(0)]);
        assert_eq!(with(32, 129).problems(), [WebError::ClientIpv6PrefixOutOfRange(129)]);
        // Unvalidated settings still resolve subjects, at the nearest valid prefix.
        assert_eq!((with(0, 200).ipv4_prefix(), with(0, 200).ipv6_prefix()), (1, 128));
        assert_eq!((with(40, 0).ipv4_prefix(), with(40, 0).ipv6_prefix()), (32, 1));
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let sub_millisecond = Duration::from_micros(500);
        let settings = EdgeSettings {
            evaluation_budget: sub_millisecond,
            failure_retry_after: Duration::ZERO,
            client_ipv4_prefix: 33,
            client_ipv6_prefix: 129,
            problem_type_base: String::new(),
            ..EdgeSettings::default()
        };
        assert_eq!(
            settings.problems(),
            [
                WebError::EvaluationBudgetTooShort(sub_millisecond),
                WebError::FailureRetryAfterTooShort(Duration::ZERO),
                WebError::ClientIpv4PrefixOutOfRange(33),
                WebError::ClientIpv6PrefixOutOfRange(129),
                WebError::InvalidProblemTypeBase { base: String::new(), category: "" },
            ]
        );
    }

    #[test]
    fn the_settings_read_from_their_kebab_case_keys() {
        let read: EdgeSettings = serde_json::from_value(serde_json::json!({
            "evaluation-budget": "300ms",
            "api-key-header": "x-client-key",
            "trusted-proxies": ["10.0.0.0/8", "192.168.1.1", "::1"],
            "client-ipv4-prefix": 24,
        }))
        .unwrap();
        assert_eq!(read.evaluation_budget, Duration::from_millis(300));
        assert_eq!(read.api_key_header, "x-client-key");
        let proxies: Vec<String> = read.trusted_proxies.iter().map(ToString::to_string).collect();
        // A bare address is the network of that one host.
        assert_eq!(proxies, ["10.0.0.0/8", "192.168.1.1/32", "::1/128"]);
        assert_eq!((read.client_ipv4_prefix, read.client_ipv6_prefix), (24, 64));
        // What is rendered reads back the same.
        let again: EdgeSettings =
            serde_json::from_value(serde_json::to_value(&read).unwrap()).unwrap();
        assert_eq!(format!("{again:?}"), format!("{read:?}"));
    }

    #[test]
    fn a_bad_value_is_named_and_an_unknown_key_refused() {
        let read = |json| serde_json::from_value::<EdgeSettings>(json).unwrap_err().to_string();
        let header = read(serde_json::json!({ "api-key-header": "x key" }));
        assert!(header.contains("\"x key\" is not a valid HTTP header name"), "{header}");
        let proxy = read(serde_json::json!({ "trusted-proxies": ["10.0.0.0/33"] }));
        assert!(proxy.contains("\"10.0.0.0/33\" is not a CIDR"), "{proxy}");
        // The policy sets are the application's to fill in, not keys here.
        assert!(read(serde_json::json!({ "default-policies": "api" })).contains("unknown field"));
    }
}
