//! `EdgeSettings` (the keys of `capabilities.rate-limit`, with defaults) and `WebError`.

use crate::answer::{DEFAULT_PROBLEM_TYPE_BASE, problem_type, problem_type_names};
use http::HeaderName;
use ipnet::IpNet;
use serde::de::Error;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use shared_contract::{DEFAULT_FAILURE_RETRY_AFTER, PolicyId, PolicySet};
use std::collections::HashMap;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

/// How the edge resolves subjects, picks policies and answers failures.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct EdgeSettings {
    /// Time one evaluation may take: `deadline = now + budget`. Default 750 ms.
    #[serde(with = "humantime_serde")]
    pub evaluation_budget: Duration,
    /// `Retry-After` of every `503`, rounded up to whole seconds. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub failure_retry_after: Duration,
    /// Header that carries an API key.
    #[serde(serialize_with = "header_name_text", deserialize_with = "header_name")]
    pub api_key_header: Option<HeaderName>,
    /// Socket peers whose forwarding header is believed: CIDRs or bare
    /// addresses. Default: none; one covering a whole family is refused.
    #[serde(serialize_with = "networks_text", deserialize_with = "networks")]
    pub trusted_proxies: Vec<IpNet>,
    /// The one forwarding header the trusted proxies write. Default `x-forwarded-for`.
    pub client_ip_header: ClientIpHeader,
    /// Policy set of every operation not in `operations`. Default: [`DEFAULT_POLICY`].
    #[serde(skip)]
    pub default_policies: PolicySet,
    /// Policy set by operation id (`"GET /api/orders/{id}"`).
    #[serde(skip)]
    pub operations: HashMap<String, PolicySet>,
    /// IPv4 clients count per network of this many bits (`1..=32`). Default 32.
    pub client_ipv4_prefix: u8,
    /// IPv6 clients count per network of this many bits (`1..=128`). Default 64.
    pub client_ipv6_prefix: u8,
    /// Problem `type` URIs are this plus the category name.
    pub problem_type_base: String,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            evaluation_budget: Duration::from_millis(750),
            failure_retry_after: DEFAULT_FAILURE_RETRY_AFTER,
            api_key_header: None,
            trusted_proxies: Vec::new(),
            client_ip_header: ClientIpHeader::XForwardedFor,
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

/// The forwarding header a trusted proxy writes the client's address into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientIpHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, HAProxy, AWS ALB, Envoy).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`: `forwarded`.
    Forwarded,
}

impl ClientIpHeader {
    /// The header's name, as configured: `x-forwarded-for` or `forwarded`.
    pub const fn name(self) -> HeaderName {
        match self {
            Self::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            Self::Forwarded => http::header::FORWARDED,
        }
    }
}

impl<'de> Deserialize<'de> for ClientIpHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Header names are case-insensitive.
        let known = |text: &str| {
            let mut all = [Self::XForwardedFor, Self::Forwarded].into_iter();
            all.find(|header| text.eq_ignore_ascii_case(header.name().as_str()))
        };
        parsed(
            &String::deserialize(d)?,
            known,
            "a header the edge reads a client address from: \"x-forwarded-for\" or \
             \"forwarded\", the one your trusted proxies write",
        )
    }
}

/// The policy of every operation not mapped to a set, unless configured.
pub const DEFAULT_POLICY: &str = "default";

const IPV4_PREFIXES: RangeInclusive<u8> = 1..=32;
const IPV6_PREFIXES: RangeInclusive<u8> = 1..=128;

impl EdgeSettings {
    /// Every rule the types cannot hold that is broken; empty when the settings can work.
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
        // The whole address space of a family, when the proxies add up to it.
        let aggregated = IpNet::aggregate(&self.trusted_proxies);
        if let Some(everything) = aggregated.into_iter().find(|net| net.prefix_len() == 0) {
            problems.push(WebError::TrustedProxiesCoverEveryAddress(everything));
        }
        // A peer is compared in its canonical form (IPv4 for a mapped one):
        // such an entry would silently trust no one.
        let mapped: IpNet = "::ffff:0:0/96".parse().expect("a valid network");
        if let Some(net) = self.trusted_proxies.iter().find(|net| mapped.contains(*net)) {
            problems.push(WebError::TrustedProxyIsMappedIpv4(*net));
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

    /// The IPv4 prefix in force, clamped so resolution never fails.
    pub(crate) fn ipv4_prefix(&self) -> u8 {
        self.client_ipv4_prefix.clamp(*IPV4_PREFIXES.start(), *IPV4_PREFIXES.end())
    }

    /// The IPv6 prefix in force, clamped.
    pub(crate) fn ipv6_prefix(&self) -> u8 {
        self.client_ipv6_prefix.clamp(*IPV6_PREFIXES.start(), *IPV6_PREFIXES.end())
    }
}

/// `parse(text)`, or an error that names the text and what it is not.
fn parsed<T, E: Error>(text: &str, parse: impl Fn(&str) -> Option<T>, not: &str) -> Result<T, E> {
    parse(text).ok_or_else(|| E::custom(format!("{text:?} is not {not}")))
}

fn header_name_text<S: Serializer>(name: &Option<HeaderName>, s: S) -> Result<S::Ok, S::Error> {
    name.as_ref().map(HeaderName::as_str).serialize(s)
}

fn header_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<HeaderName>, D::Error> {
    let name = |text: &str| HeaderName::from_bytes(text.as_bytes()).ok();
    let text = Option::<String>::deserialize(d)?;
    text.map(|text| parsed(&text, name, "a valid HTTP header name")).transpose()
}

fn networks_text<S: Serializer>(nets: &[IpNet], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(nets.iter().map(ToString::to_string))
}

/// Networks as text; a bare address reads as the network of that one host.
fn networks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let network =
        |text: &str| text.parse().ok().or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from));
    let cidr = "a CIDR like \"10.0.0.0/8\" or an IP address";
    Vec::<String>::deserialize(d)?.iter().map(|text| parsed(text, network, cidr)).collect()
}

/// Edge configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebError {
    /// A pseudonymizer key shorter than the HMAC-SHA-256 output size.
    #[error(
        "pseudonymizer key version {version} has {length} bytes; at least {minimum} are required"
    )]
    KeyTooShort {
        /// The key version.
        version: u32,
        /// Bytes the key has.
        length: usize,
        /// Bytes a key needs.
        minimum: usize,
    },
    /// The same key version configured twice.
    #[error("pseudonymizer key version {0} is configured more than once")]
    DuplicateKeyVersion(u32),
    /// The active key version has no key.
    #[error("pseudonymizer key version {0} is not configured")]
    UnknownKeyVersion(u32),
    /// `problem_type_base` is empty, or with a category name is not a URI.
    #[error("problem type base {base:?} does not form a valid URI with {category:?}")]
    InvalidProblemTypeBase {
        /// The configured base.
        base: String,
        /// The category that was appended (empty for an empty base).
        category: &'static str,
    },
    /// The evaluation budget is under a millisecond: every request would miss it.
    #[error("the evaluation budget must be at least 1ms, got {0:?}")]
    EvaluationBudgetTooShort(std::time::Duration),
    /// The failure retry-after is under a millisecond: clients would retry at once.
    #[error("the failure retry-after must be at least 1ms, got {0:?}")]
    FailureRetryAfterTooShort(std::time::Duration),
    /// `client_ipv4_prefix` is outside `1..=32`.
    #[error("the client IPv4 prefix must be 1 to 32 bits, got {0}")]
    ClientIpv4PrefixOutOfRange(u8),
    /// `client_ipv6_prefix` is outside `1..=128`.
    #[error("the client IPv6 prefix must be 1 to 128 bits, got {0}")]
    ClientIpv6PrefixOutOfRange(u8),
    /// `trusted_proxies` covers every address of a family.
    #[error(
        "the trusted proxies cover every address ({0}), so any client could name its own \
         address in a forwarding header: list only the networks your proxies connect from"
    )]
    TrustedProxiesCoverEveryAddress(ipnet::IpNet),
    /// A `trusted_proxies` entry written as IPv4-mapped IPv6, which no peer matches.
    #[error(
        "the trusted proxy {0} is an IPv4-mapped IPv6 network, which no peer matches (a peer \
         is compared as IPv4): write it as IPv4, like \"10.0.0.0/8\""
    )]
    TrustedProxyIsMappedIpv4(ipnet::IpNet),
}

#[cfg(test)]
mod settings_tests {
    use super::*;

    #[test]
    fn defaults_match_the_issue() {
        let settings = EdgeSettings::default();
        assert_eq!(settings.evaluation_budget, Duration::from_millis(750));
        assert_eq!(settings.failure_retry_after, Duration::from_secs(1));
        assert_eq!(settings.api_key_header, None);
        assert!(settings.trusted_proxies.is_empty());
        assert_eq!(settings.client_ip_header, ClientIpHeader::XForwardedFor);
        assert_eq!(settings.default_policies.ids(), [PolicyId::new("default").unwrap()]);
        assert!(settings.operations.is_empty());
        assert_eq!((settings.client_ipv4_prefix, settings.client_ipv6_prefix), (32, 64));
        assert!(settings.validate().is_ok());
    }

    #[test]
    fn a_trusted_proxy_written_as_mapped_ipv6_is_refused() {
        for text in ["::ffff:10.0.0.1/128", "::ffff:0:0/96", "::ffff:192.0.2.0/120"] {
            let net: IpNet = text.parse().unwrap();
            let settings = EdgeSettings { trusted_proxies: vec![net], ..EdgeSettings::default() };
            assert_eq!(settings.validate(), Err(WebError::TrustedProxyIsMappedIpv4(net)), "{text}");
        }
        for text in ["10.0.0.1/32", "2001:db8::/32", "::1/128", "64:ff9b::/96"] {
            let net: IpNet = text.parse().unwrap();
            let settings = EdgeSettings { trusted_proxies: vec![net], ..EdgeSettings::default() };
            assert_eq!(settings.validate(), Ok(()), "{text}");
        }
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
    fn a_proxy_list_that_trusts_every_address_is_refused() {
        let with = |nets: &[&str]| EdgeSettings {
            trusted_proxies: nets.iter().map(|net| net.parse().unwrap()).collect(),
            ..EdgeSettings::default()
        };
        for (everyone, family) in [
            (&["0.0.0.0/0"][..], "0.0.0.0/0"),
            (&["::/0"], "::/0"),
            (&["10.0.0.0/8", "::/0"], "::/0"),
            (&["0.0.0.0/1", "128.0.0.0/1"], "0.0.0.0/0"),
            (&["::/1", "8000::/1", "10.0.0.0/8"], "::/0"),
        ] {
            let family: IpNet = family.parse().unwrap();
            assert_eq!(
                with(everyone).problems(),
                [WebError::TrustedProxiesCoverEveryAddress(family)],
                "{everyone:?}"
            );
        }
        for some in [&["0.0.0.0/1"][..], &["10.0.0.0/8", "2000::/3"], &["64:ff9b::/96"], &[]] {
            assert_eq!(with(some).problems(), [], "{some:?}");
        }
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
            "client-ip-header": "Forwarded",
            "client-ipv4-prefix": 24,
        }))
        .unwrap();
        assert_eq!(read.evaluation_budget, Duration::from_millis(300));
        assert_eq!(read.api_key_header, Some(HeaderName::from_static("x-client-key")));
        assert_eq!(read.client_ip_header, ClientIpHeader::Forwarded);
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
        let source = read(serde_json::json!({ "client-ip-header": "x-real-ip" }));
        assert!(source.contains("\"x-real-ip\" is not a header"), "{source}");
        assert!(source.contains("\"x-forwarded-for\" or \"forwarded\""), "{source}");
        // The policy sets are the application's to fill in, not keys here.
        assert!(read(serde_json::json!({ "default-policies": "api" })).contains("unknown field"));
    }
}
