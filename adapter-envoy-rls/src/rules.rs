//! Rules: a domain and a descriptor pattern mapped to a policy set, and
//! the matching of a request's descriptor to the first rule that fits.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use shared_contract::{
    EdgeRateLimitPort, MAX_POLICY_SET, OperationDigest, PolicyId, PolicyMode, PolicyScope,
    PolicySet, RateLimitPolicy, SubjectDigest,
};

use crate::error::RlsError;
use crate::telemetry::MemberMetrics;

/// The subject kind of a descriptor subject, the first frame of its
/// pseudonym: a descriptor subject never shares a bucket with an HTTP
/// principal, API key or IP of the same text.
pub const DESCRIPTOR_SUBJECT_KIND: &str = "descriptor";

/// One rule as configured: the `domain`, the `pattern` (each entry key in
/// order, with its fixed value if any), the entries whose values are the
/// subject, and the policy set a matching descriptor runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsRule {
    /// Envoy's `domain`.
    pub domain: String,
    /// The entry keys in order; `Some(value)` fixes an entry's value. A
    /// fixed value holding `*` is a wildcard (envoyproxy/ratelimit's): each
    /// `*` matches any run of characters, and the value matched is the
    /// entry's, part of the subject like an entry without a fixed value.
    pub pattern: Vec<(String, Option<String>)>,
    /// The keys whose values are the subject; `None` means every entry
    /// without a fixed value or with a wildcard.
    pub subject: Option<Vec<String>>,
    /// What a matching descriptor runs under.
    pub limit: RuleLimit,
    /// The rule's name, for other rules' `replaces`.
    pub name: Option<String>,
    /// The names of the rules this one replaces: when a call matches both,
    /// the replaced rule's descriptors are neither checked nor charged
    /// (answered as no rule), envoyproxy/ratelimit's `replaces`.
    pub replaces: Vec<String>,
    /// Whether a descriptor's `limit` override is honoured: it then runs
    /// under a fixed window of that size instead of the rule's policies
    /// (`crate::limit_override`). Only a rule with policies takes it.
    pub allow_override: bool,
    /// Whether a matching descriptor's hits are usage reported after the
    /// fact (Envoy's `apply_on_stream_done`): charged whatever remains, into
    /// debt, and answered `OK`. A descriptor of 0 hits is still a look.
    pub charge_always: bool,
}

/// What a rule's matching descriptors run under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleLimit {
    /// The policies, in configured order.
    Policies(PolicySet),
    /// None: envoyproxy/ratelimit's `unlimited`. A matching descriptor is
    /// answered `OK` with `limit_remaining` 4294967295 without a provider
    /// call, and a later rule it would also fit is never reached (the first
    /// matching rule wins).
    Unlimited,
    /// None, answered as a descriptor no rule matches (`OK`, no limit): a
    /// later rule it would also fit is never reached. What
    /// envoyproxy/ratelimit answers where its lookup stops without a limit.
    NotLimited,
    /// Every matching descriptor is `OVER_LIMIT`, without a provider call:
    /// envoyproxy/ratelimit's `requests_per_unit: 0`. The call is refused
    /// before any set runs, so nothing of it is charged.
    Blocked,
}

/// How a rule without policies answers its descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answered {
    Unlimited,
    NotLimited,
    Blocked,
}

/// The digest a rule's operation-scoped policies are keyed by: SHA-256 over
/// `envoy-rls`, the domain and each pattern entry as written (`key` or
/// `key=value`), each length-framed; its first 16 bytes as a big-endian
/// 128-bit number (32 hex digits in a key). No raw descriptor value a
/// client sends reaches it, only the configured pattern.
pub fn rule_operation(domain: &str, pattern: &[(String, Option<String>)]) -> OperationDigest {
    let mut hash = Sha256::new();
    let mut frame = |part: &[u8]| {
        hash.update(u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
        hash.update(part);
    };
    frame(b"envoy-rls");
    frame(domain.as_bytes());
    for (key, value) in pattern {
        match value {
            Some(value) => frame(format!("{key}={value}").as_bytes()),
            None => frame(key.as_bytes()),
        }
    }
    let digest: [u8; 32] = hash.finalize().into();
    let (first, _) = digest.split_first_chunk::<16>().unwrap_or((&[0; 16], &[]));
    OperationDigest::from_u128(u128::from_be_bytes(*first))
}

/// One policy of a rule as the port holds it, with its metric handles.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) id: PolicyId,
    /// `None` when the port does not hold it (the port then answers
    /// `UnknownPolicy`, and the request fails closed).
    pub(crate) policy: Option<RateLimitPolicy>,
    pub(crate) metrics: MemberMetrics,
}

impl Member {
    /// A policy the port does not know counts as enforced, so the unknown
    /// fails closed.
    pub(crate) fn enforced(&self) -> bool {
        self.policy.as_ref().is_none_or(|policy| policy.mode() == PolicyMode::Enforce)
    }

    /// Unknown counts as operation-scoped: it never joins another rule's set.
    pub(crate) fn operation_scoped(&self) -> bool {
        self.policy.as_ref().is_none_or(|policy| policy.scope() == PolicyScope::Operation)
    }
}

/// A rule prepared once, when the engine is built.
#[derive(Debug)]
pub(crate) struct PreparedRule {
    /// Its position in the configured list (a set's operation names it).
    pub(crate) index: usize,
    pub(crate) domain: Box<str>,
    keys: Box<[Box<str>]>,
    values: Box<[Value]>,
    /// Positions in the pattern of the subject entries, in pattern order.
    pub(crate) subject: Box<[usize]>,
    pub(crate) members: Box<[Member]>,
    /// The members' ids as a set: a step of this rule alone asks with it
    /// as is (a shared pointer, no copy).
    pub(crate) policies: PolicySet,
    pub(crate) operation: OperationDigest,
    /// Whether any member is operation-scoped.
    pub(crate) operation_scoped: bool,
    /// Whether a descriptor's `limit` override is honoured.
    pub(crate) allow_override: bool,
    /// Whether its hits are charged whatever remains ([`RlsRule::charge_always`]).
    pub(crate) charge_always: bool,
}

impl PreparedRule {
    /// The rule with `member` as its only policy: what a descriptor with a
    /// `limit` override runs under (same subject, same operation).
    pub(crate) fn with_member(&self, member: Member) -> Self {
        Self {
            index: self.index,
            domain: self.domain.clone(),
            keys: self.keys.clone(),
            values: self.values.clone(),
            subject: self.subject.clone(),
            policies: PolicySet::single(member.id.clone()),
            operation_scoped: member.operation_scoped(),
            members: Box::new([member]),
            operation: self.operation,
            allow_override: false,
            charge_always: false,
        }
    }
}

/// What a descriptor matched: the first rule of its domain that fits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Match<'r> {
    Limited(&'r PreparedRule),
    /// A rule without policies: its index and how it answers.
    Answered(usize, Answered),
}

impl Match<'_> {
    /// The rule's index in the configured list.
    pub(crate) fn index(&self) -> usize {
        match self {
            Self::Limited(rule) => rule.index,
            Self::Answered(index, _) => *index,
        }
    }
}

/// A rule of the table: limited (prepared with its members) or not.
#[derive(Debug)]
enum Entry {
    Limited(PreparedRule),
    /// A rule without policies: its index, its keys and values, its answer.
    Answered {
        index: usize,
        keys: Box<[Box<str>]>,
        values: Box<[Value]>,
        answer: Answered,
    },
}

impl Entry {
    fn matches(&self, entries: &[(&str, &str)]) -> bool {
        let (keys, values) = match self {
            Self::Limited(rule) => (&rule.keys, &rule.values),
            Self::Answered { keys, values, .. } => (keys, values),
        };
        fits(keys, values, entries)
    }

    fn as_match(&self) -> Match<'_> {
        match self {
            Self::Limited(rule) => Match::Limited(rule),
            Self::Answered { index, answer, .. } => Match::Answered(*index, *answer),
        }
    }
}

/// Whether `entries` have the pattern's keys, in order, and values it takes.
fn fits(keys: &[Box<str>], values: &[Value], entries: &[(&str, &str)]) -> bool {
    keys.len() == entries.len()
        && keys
            .iter()
            .zip(values)
            .zip(entries)
            .all(|((key, value), (k, v))| **key == **k && value.matches(v))
}

/// What a pattern entry takes as its value.
#[derive(Debug, Clone)]
enum Value {
    /// No fixed value: any, and the subject's.
    Any,
    /// A fixed value, equal to the letter.
    Exact(Box<str>),
    /// A fixed value with `*`, split at each: any value that starts with the
    /// first part, ends with the last and holds the others between, in
    /// order, without overlap (envoyproxy/ratelimit's `wildcardMatch`). The
    /// value matched is the subject's.
    Wildcard(Box<[Box<str>]>),
}

impl Value {
    fn of(fixed: Option<&str>) -> Self {
        match fixed {
            None => Self::Any,
            Some(fixed) if fixed.contains('*') => {
                Self::Wildcard(fixed.split('*').map(Into::into).collect())
            }
            Some(fixed) => Self::Exact(fixed.into()),
        }
    }

    /// Whether the entry's value is in the subject.
    fn in_subject(&self) -> bool {
        !matches!(self, Self::Exact(_))
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(fixed) => **fixed == *value,
            Self::Wildcard(parts) => {
                let [first, middle @ .., last] = &parts[..] else { return false };
                // The last part is looked for after the first, so the two never overlap.
                let Some(mut rest) = value.strip_prefix(&**first) else { return false };
                let Some(inner) = rest.strip_suffix(&**last) else { return false };
                rest = inner;
                middle.iter().all(|part| match rest.find(&**part) {
                    Some(at) => {
                        rest = &rest[at + part.len()..];
                        true
                    }
                    None => false,
                })
            }
        }
    }
}

/// Every rule, by domain, in configured order.
#[derive(Debug, Default)]
pub(crate) struct Rules {
    by_domain: HashMap<Box<str>, Vec<Entry>>,
    /// Each rule's name and the names it replaces, by its index; empty
    /// when no rule replaces another (no call pays for the check).
    naming: Box<[Naming]>,
}

/// A rule's name and the names of the rules it replaces.
type Naming = (Option<Box<str>>, Box<[Box<str>]>);

impl Rules {
    pub(crate) fn new(rules: &[RlsRule], port: &dyn EdgeRateLimitPort) -> Result<Self, RlsError> {
        let mut by_domain: HashMap<Box<str>, Vec<Entry>> = HashMap::new();
        for (index, rule) in rules.iter().enumerate() {
            check(index, rule, rules)?;
            let keys: Box<[Box<str>]> =
                rule.pattern.iter().map(|(key, _)| key.as_str().into()).collect();
            let values: Box<[Value]> =
                rule.pattern.iter().map(|(_, fixed)| Value::of(fixed.as_deref())).collect();
            let subject = match &rule.subject {
                None => (0..values.len()).filter(|&at| values[at].in_subject()).collect(),
                // A key the pattern repeats (a nested `files` under
                // `files`) names every entry of it that counts apart.
                Some(keys) => {
                    let mut at = std::collections::BTreeSet::new();
                    for key in keys {
                        let mut named = (0..values.len())
                            .filter(|&at| rule.pattern[at].0 == *key && values[at].in_subject())
                            .peekable();
                        if named.peek().is_none() {
                            return Err(RlsError::BadSubject { rule: index, key: key.clone() });
                        }
                        at.extend(named);
                    }
                    at.into_iter().collect()
                }
            };
            let policies = match &rule.limit {
                RuleLimit::Policies(policies) => policies,
                fixed => {
                    let answer = match fixed {
                        RuleLimit::NotLimited => Answered::NotLimited,
                        RuleLimit::Blocked => Answered::Blocked,
                        RuleLimit::Unlimited | RuleLimit::Policies(_) => Answered::Unlimited,
                    };
                    let entry = Entry::Answered { index, keys, values, answer };
                    by_domain.entry(rule.domain.as_str().into()).or_default().push(entry);
                    continue;
                }
            };
            let members: Box<[Member]> = policies
                .ids()
                .iter()
                .map(|id| {
                    let policy = port.policy(id).cloned();
                    let metrics = MemberMetrics::new(id.as_str(), policy.as_ref());
                    Member { id: id.clone(), policy, metrics }
                })
                .collect();
            let prepared = PreparedRule {
                index,
                domain: rule.domain.as_str().into(),
                keys,
                values,
                subject,
                operation_scoped: members.iter().any(Member::operation_scoped),
                members,
                policies: policies.clone(),
                operation: rule_operation(&rule.domain, &rule.pattern),
                allow_override: rule.allow_override,
                charge_always: rule.charge_always,
            };
            by_domain
                .entry(rule.domain.as_str().into())
                .or_default()
                .push(Entry::Limited(prepared));
        }
        let replacing = rules.iter().any(|rule| !rule.replaces.is_empty());
        let naming = rules.iter().filter(|_| replacing).map(|rule| {
            let replaces = rule.replaces.iter().map(|name| name.as_str().into()).collect();
            (rule.name.as_deref().map(Into::into), replaces)
        });
        Ok(Self { by_domain, naming: naming.collect() })
    }

    /// The limited rule at `index` of the configured list, if that one is.
    pub(crate) fn limited(&self, index: usize) -> Option<&PreparedRule> {
        self.by_domain.values().flatten().find_map(|entry| match entry {
            Entry::Limited(rule) if rule.index == index => Some(rule),
            Entry::Limited(_) | Entry::Answered { .. } => None,
        })
    }

    /// Whether a rule replaces another: calls then check [`Self::replaced`].
    pub(crate) fn replacing(&self) -> bool {
        !self.naming.is_empty()
    }

    /// Whether the rule at `index` is replaced by one of `matched` (the
    /// indexes of the rules a call's descriptors matched).
    pub(crate) fn replaced(&self, index: usize, matched: &[usize]) -> bool {
        let Some(Some(name)) = self.naming.get(index).map(|(name, _)| name.as_deref()) else {
            return false;
        };
        matched.iter().any(|&by| {
            self.naming.get(by).is_some_and(|(_, replaces)| replaces.iter().any(|r| **r == *name))
        })
    }

    /// The first rule of `domain` whose pattern fits `entries`.
    pub(crate) fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Match<'_>> {
        let rules = self.by_domain.get(domain)?;
        rules.iter().find(|rule| rule.matches(entries)).map(Entry::as_match)
    }
}

fn check(index: usize, rule: &RlsRule, rules: &[RlsRule]) -> Result<(), RlsError> {
    if rule.domain.is_empty() {
        return Err(RlsError::EmptyDomain { rule: index });
    }
    // envoyproxy/ratelimit refuses both.
    for replaced in &rule.replaces {
        if replaced.is_empty() || rule.name.as_ref() == Some(replaced) {
            return Err(RlsError::BadReplaces { rule: index, name: replaced.clone() });
        }
    }
    if rule.pattern.is_empty() {
        return Err(RlsError::EmptyPattern { rule: index });
    }
    // A key may repeat, as envoyproxy/ratelimit's nested descriptors may
    // (`files` under `files`): entries match by position.
    for (entry, (key, _)) in rule.pattern.iter().enumerate() {
        if key.is_empty() {
            return Err(RlsError::EmptyKey { rule: index, entry });
        }
    }
    let first = rules[..index]
        .iter()
        .position(|other| other.domain == rule.domain && other.pattern == rule.pattern);
    match first {
        Some(first) => Err(RlsError::DuplicateRule { rule: index, first }),
        None => Ok(()),
    }
}

/// One descriptor as resolved: its rule, subject and cost, and the
/// members of its rule that take part (a shadow policy that cannot admit
/// the cost is left out: it never denies).
pub(crate) struct Resolved<'e> {
    pub(crate) rule: &'e PreparedRule,
    pub(crate) subject: SubjectDigest,
    pub(crate) cost: u64,
    pub(crate) members: Vec<&'e Member>,
    /// The port of its `limit` override, if it runs under one.
    pub(crate) port: Option<&'e dyn EdgeRateLimitPort>,
}

/// One atomic step: a policy set of one subject, or one look.
pub(crate) struct Step<'e> {
    /// The port of a `limit` override; `None` for the engine's own.
    pub(crate) port: Option<&'e dyn EdgeRateLimitPort>,
    pub(crate) subject: SubjectDigest,
    pub(crate) cost: u64,
    /// The rule whose operation the set is keyed by.
    pub(crate) rule: &'e PreparedRule,
    /// Whether `rule` holds operation-scoped members of the set.
    pub(crate) operation_bound: bool,
    pub(crate) members: Vec<&'e Member>,
    /// The descriptors it answers: each one's index and rule.
    pub(crate) descriptors: Vec<(usize, &'e PreparedRule)>,
}

impl Step<'_> {
    /// Whether the descriptor `resolved` may join: same subject and cost,
    /// no second rule's operation-scoped policy, at most 8 policies.
    pub(crate) fn admits(&self, resolved: &Resolved<'_>) -> bool {
        if self.cost == 0 || self.cost != resolved.cost || self.subject != resolved.subject {
            return false;
        }
        // An override's policy lives in its own port: a step of its own.
        if self.port.is_some() || resolved.port.is_some() {
            return false;
        }
        let rule = resolved.rule;
        if rule.operation_scoped && self.operation_bound && rule.index != self.rule.index {
            return false;
        }
        let added = resolved.members.iter().filter(|member| !self.holds(&member.id)).count();
        self.members.len() + added <= MAX_POLICY_SET
    }

    pub(crate) fn holds(&self, id: &PolicyId) -> bool {
        self.members.iter().any(|member| member.id == *id)
    }

    /// The budget `member` is kept under in this step: the subject, and
    /// for an operation-scoped policy the rule's operation.
    pub(crate) fn budget_of(&self, member: &Member) -> (SubjectDigest, Option<OperationDigest>) {
        let operation = member.operation_scoped().then_some(self.rule.operation);
        (self.subject, operation)
    }

    pub(crate) fn enforces(&self) -> bool {
        self.members.iter().any(|member| member.enforced())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(domain: &str, pattern: &[(&str, Option<&str>)], subject: Option<&[&str]>) -> RlsRule {
        RlsRule {
            domain: domain.to_owned(),
            pattern: pattern.iter().map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned))).collect(),
            subject: subject.map(|keys| keys.iter().map(|key| (*key).to_owned()).collect()),
            limit: RuleLimit::Policies(PolicySet::single(PolicyId::new("p").unwrap())),
            name: None,
            replaces: Vec::new(),
            allow_override: false,
            charge_always: false,
        }
    }

    fn policy() -> RateLimitPolicy {
        let window = std::time::Duration::from_secs(1);
        let algorithm =
            shared_contract::Algorithm::from(shared_contract::FixedWindow { limit: 1, window });
        RateLimitPolicy::builder("p", algorithm).build().unwrap()
    }

    #[test]
    fn every_rule_problem_is_refused_with_its_index() {
        let ip = [("remote_address", None)];
        let cases = [
            (vec![rule("", &ip, None)], RlsError::EmptyDomain { rule: 0 }),
            (vec![rule("d", &[], None)], RlsError::EmptyPattern { rule: 0 }),
            (
                vec![rule("d", &[("a", None), ("", None)], None)],
                RlsError::EmptyKey { rule: 0, entry: 1 },
            ),
            (
                vec![rule("d", &[("a", Some("x"))], Some(&["a"]))],
                RlsError::BadSubject { rule: 0, key: "a".to_owned() },
            ),
            (
                vec![rule("d", &ip, None), rule("d", &ip, Some(&["remote_address"]))],
                RlsError::DuplicateRule { rule: 1, first: 0 },
            ),
            (
                vec![RlsRule {
                    name: Some("self".to_owned()),
                    replaces: vec!["self".to_owned()],
                    ..rule("d", &ip, None)
                }],
                RlsError::BadReplaces { rule: 0, name: "self".to_owned() },
            ),
            (
                vec![RlsRule { replaces: vec![String::new()], ..rule("d", &ip, None) }],
                RlsError::BadReplaces { rule: 0, name: String::new() },
            ),
        ];
        let clock = std::sync::Arc::new(shared_contract::ManualClock::new(0));
        let port = adapter_memory::MemoryEdgeRateLimitAdapter::new([policy()], clock).unwrap();
        for (rules, expected) in cases {
            assert_eq!(Rules::new(&rules, &port).unwrap_err(), expected);
        }
        let fine =
            [rule("d", &ip, None), rule("d", &[("a", Some("x")), ("b", None)], Some(&["b"]))];
        let rules = Rules::new(&fine, &port).unwrap();
        let Some(Match::Limited(second)) = rules.find("d", &[("a", "x"), ("b", "y")]) else {
            panic!("the second rule matches");
        };
        assert_eq!((second.index, &*second.subject), (1, &[1][..]));
        assert!(rules.find("d", &[("a", "z"), ("b", "y")]).is_none());
        assert!(rules.find("other", &[("remote_address", "y")]).is_none());
    }

    /// The cases of envoyproxy/ratelimit's `TestWildcardConfig`
    /// (`test/config/config_test.go`, over `test/config/wildcard.yaml`).
    #[test]
    fn a_wildcard_value_matches_as_envoyproxy_ratelimits_does() {
        let takes = |pattern: &str, value: &str| Value::of(Some(pattern)).matches(value);
        assert!(takes("foo*", "foo1") && takes("foo*", "foo2") && takes("foo*", "foo"));
        assert!(!takes("foo*", "bar"));
        assert!(!takes("foo", "foo1"), "a value without * is exact");
        for (value, taken) in [("barab", true), ("bar123b", true), ("barb", true)] {
            assert_eq!(takes("bar*b", value), taken, "{value}");
        }
        for value in ["bara", "xbarb", "bab", "barxb1"] {
            assert!(!takes("bar*b", value), "{value}");
        }
        for value in ["foo123bar456baz", "foobarbaz"] {
            assert!(takes("foo*bar*baz", value), "{value}");
        }
        for value in ["foo123baz", "bar456baz", "foobaz", "foobazbar"] {
            assert!(!takes("foo*bar*baz", value), "{value}");
        }
        assert!(takes("*", "") && takes("*", "anything") && takes("a**b", "ab"));
        assert!(!takes("ab*ba", "aba"), "prefix and suffix never share a character");
    }

    #[test]
    fn a_wildcard_entry_is_in_the_subject_unless_named_otherwise() {
        let clock = std::sync::Arc::new(shared_contract::ManualClock::new(0));
        let port = adapter_memory::MemoryEdgeRateLimitAdapter::new([policy()], clock).unwrap();
        let rules = [
            rule("d", &[("wild", Some("foo*")), ("ip", None)], None),
            rule("d", &[("tenant", Some("t*")), ("ip", None)], Some(&["ip"])),
        ];
        let rules = Rules::new(&rules, &port).unwrap();
        let Some(Match::Limited(first)) = rules.find("d", &[("wild", "foo1"), ("ip", "x")]) else {
            panic!("the wildcard rule matches");
        };
        assert_eq!(&*first.subject, &[0, 1][..]);
        assert!(rules.find("d", &[("wild", "bar"), ("ip", "x")]).is_none());
        let Some(Match::Limited(second)) = rules.find("d", &[("tenant", "t9"), ("ip", "x")]) else {
            panic!("the second rule matches");
        };
        assert_eq!(&*second.subject, &[1][..]);
    }

    /// envoyproxy/ratelimit's nested descriptors may repeat a key
    /// (`test/config/share_threshold.yaml`: `files: top/*` holding
    /// `files: nested/*`): entries match by position, and a subject key
    /// names every entry of it that counts apart.
    #[test]
    fn a_key_may_repeat_and_a_subject_key_names_each_of_its_entries() {
        let clock = std::sync::Arc::new(shared_contract::ManualClock::new(0));
        let port = adapter_memory::MemoryEdgeRateLimitAdapter::new([policy()], clock).unwrap();
        let nested = [("files", Some("top/*")), ("files", Some("nested/*"))];
        let rules = [
            rule("d", &nested, Some(&[])),
            rule("e", &nested, None),
            rule("f", &[("files", Some("top")), ("files", None)], Some(&["files"])),
        ];
        let rules = Rules::new(&rules, &port).unwrap();
        let subject = |domain: &str, entries: &[(&str, &str)]| match rules.find(domain, entries) {
            Some(Match::Limited(rule)) => rule.subject.to_vec(),
            _ => panic!("{domain} matches"),
        };
        let top_nested = [("files", "top/a"), ("files", "nested/b")];
        assert_eq!(subject("d", &top_nested), Vec::<usize>::new(), "shared: one budget");
        assert_eq!(subject("e", &top_nested), [0, 1], "each value counts apart");
        assert!(rules.find("d", &[("files", "nested/b"), ("files", "top/a")]).is_none());
        assert_eq!(subject("f", &[("files", "top"), ("files", "x")]), [1]);
    }

    #[test]
    fn a_rules_operation_is_its_configured_pattern_and_nothing_else() {
        let pattern = |fixed: Option<&str>| {
            vec![("generic_key".to_owned(), fixed.map(str::to_owned)), ("ip".to_owned(), None)]
        };
        let checkout = rule_operation("edge", &pattern(Some("checkout")));
        assert_eq!(checkout, rule_operation("edge", &pattern(Some("checkout"))));
        assert_ne!(checkout, rule_operation("edge", &pattern(None)));
        assert_ne!(checkout, rule_operation("edge2", &pattern(Some("checkout"))));
        assert_eq!(checkout.to_string().len(), 32);
    }
}
