//! `RateLimitPolicy`: what a subject may do, validated once at construction.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Algorithm, Checks};
use crate::bounds::{MAX_GRACE, millis, whole_millis_problem};
use crate::dedup::EvaluationDedupPolicy;
use crate::error::{ContractError, PolicyField};
use crate::outcome::PolicyMode;

use serde::{Deserialize, Serialize};

/// A policy id: 1 to 64 of `[a-z0-9._-]`, safe in a key and a metric label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyId(Arc<str>);

impl PolicyId {
    /// Validates `id`.
    pub fn new(id: impl Into<String>) -> Result<Self, ContractError> {
        let id = id.into();
        match policy_id_problem(&id) {
            None => Ok(Self(id.into())),
            Some(problem) => Err(ContractError::InvalidPolicyId(problem)),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn policy_id_problem(id: &str) -> Option<String> {
    if id.is_empty() || id.len() > 64 {
        return Some(format!("must be 1 to 64 characters, got {}", id.len()));
    }
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b);
    if !id.bytes().all(allowed) {
        return Some(format!("{id:?} may only hold a-z, 0-9, '.', '_' and '-'"));
    }
    None
}

crate::named_enum! {
    /// What a provider does when it cannot decide: only fail-closed.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub enum FailurePolicy {
        /// Deny (answer 503) when no decision could be made.
        #[default]
        FailClosed = "fail-closed",
    }
}

crate::named_enum! {
    /// Whose budget a policy counts.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub enum PolicyScope {
        /// A budget per subject and operation.
        #[default]
        Operation = "operation",
        /// One budget per subject across every operation that lists the policy.
        Subject = "subject",
    }
}

/// A validated rate-limit policy. Build one with [`RateLimitPolicy::builder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitPolicy {
    id: PolicyId,
    revision: u32,
    algorithm: Algorithm,
    maximum_cost: u64,
    failure_policy: FailurePolicy,
    cleanup_grace: Duration,
    maximum_clock_regression: Duration,
    evaluation_dedup: EvaluationDedupPolicy,
    scope: PolicyScope,
    mode: PolicyMode,
}

impl RateLimitPolicy {
    /// Starts a policy with the only defaults: revision 1, maximum cost 1,
    /// fail-closed, grace and regression bound of 1 s, dedupe's defaults (off
    /// for a concurrency policy), operation scope and enforce mode.
    pub fn builder(
        id: impl Into<String>,
        algorithm: impl Into<Algorithm>,
    ) -> RateLimitPolicyBuilder {
        let algorithm = algorithm.into();
        let evaluation_dedup = if algorithm.holds_leases() {
            EvaluationDedupPolicy::Disabled
        } else {
            EvaluationDedupPolicy::enabled_defaults()
        };
        RateLimitPolicyBuilder {
            id: id.into(),
            policy: RateLimitPolicy {
                id: PolicyId(Arc::from("")),
                revision: 1,
                algorithm,
                maximum_cost: 1,
                failure_policy: FailurePolicy::FailClosed,
                cleanup_grace: Duration::from_secs(1),
                maximum_clock_regression: Duration::from_secs(1),
                evaluation_dedup,
                scope: PolicyScope::Operation,
                mode: PolicyMode::Enforce,
            },
        }
    }

    /// The policy id.
    pub fn id(&self) -> &PolicyId {
        &self.id
    }
    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }
    /// The limit or capacity.
    pub fn limit(&self) -> u64 {
        self.algorithm.limit()
    }
    /// Whether a request of `cost` may be evaluated (a lease is one slot).
    pub fn admits_cost(&self, cost: u64) -> bool {
        cost >= 1 && (self.algorithm.holds_leases() || cost <= self.maximum_cost)
    }
    /// `max(cleanup_grace, maximum_clock_regression)` in milliseconds.
    pub fn ttl_slack_millis(&self) -> u64 {
        millis(self.cleanup_grace.max(self.maximum_clock_regression))
    }
}

/// Each `Copy` field of a policy: its getter, and its builder's setter.
macro_rules! fields {
    ($($(#[$doc:meta])* $field:ident: $type:ty;)+) => {
        impl RateLimitPolicy {
            $($(#[$doc])* pub fn $field(&self) -> $type { self.$field })+
        }

        impl RateLimitPolicyBuilder {
            $(#[doc = concat!("Sets [`RateLimitPolicy::", stringify!($field), "`].")]
            pub fn $field(mut self, $field: $type) -> Self {
                self.policy.$field = $field;
                self
            })+
        }
    };
}

fields! {
    /// The revision (at least 1); a new revision never reads an older one's counters.
    revision: u32;
    /// The largest cost one request may carry ([`Self::admits_cost`]).
    maximum_cost: u64;
    /// What happens when no decision can be made.
    failure_policy: FailurePolicy;
    /// Extra key lifetime after the state stops mattering (whole ms, at most [`MAX_GRACE`]).
    cleanup_grace: Duration;
    /// How far a caller clock may lag a key's newest write (whole ms, at most [`MAX_GRACE`]).
    maximum_clock_regression: Duration;
    /// The evaluation dedupe settings.
    evaluation_dedup: EvaluationDedupPolicy;
    /// Whose budget it counts.
    scope: PolicyScope;
    /// Whether it can block.
    mode: PolicyMode;
}

/// Builds a [`RateLimitPolicy`]; `build` checks every rule at once.
#[derive(Debug, Clone)]
pub struct RateLimitPolicyBuilder {
    id: String,
    /// The policy as set so far; `build` gives it its id.
    policy: RateLimitPolicy,
}

impl RateLimitPolicyBuilder {
    /// Checks every rule and returns the policy, or every violation found.
    pub fn build(self) -> Result<RateLimitPolicy, ContractError> {
        let Self { id, policy } = self;
        let mut checks = Checks::default();
        let mut reject = |field, problem| checks.reject(field, problem);
        if let Some(problem) = policy_id_problem(&id) {
            reject(PolicyField::Id, problem);
        }
        if policy.revision == 0 {
            reject(PolicyField::Revision, "must be at least 1".into());
        }
        let limit_ok = policy.algorithm.check(&mut checks);
        let limit = policy.algorithm.limit();
        let mut reject = |field, problem| checks.reject(field, problem);
        let (name, cost) = (policy.algorithm.name(), policy.maximum_cost);
        if policy.algorithm.holds_leases() {
            // A lease is one slot whatever the cost, and its id is the dedupe.
            if cost != 1 {
                let problem = format!(
                    "does not apply to a {name} policy (a lease is one slot whatever the cost): leave it unset, got {cost}"
                );
                reject(PolicyField::MaximumCost, problem);
            }
            if policy.evaluation_dedup != EvaluationDedupPolicy::Disabled {
                let problem = format!(
                    "does not apply to a {name} policy (its lease id is its dedupe): leave it unset"
                );
                reject(PolicyField::EvaluationDedup, problem);
            }
        } else if cost == 0 || (limit_ok && cost > limit) {
            // With the limit out of range the bound is unknown: no `1..=0`.
            let range = if limit_ok { format!("in 1..={limit}") } else { "at least 1".into() };
            reject(PolicyField::MaximumCost, format!("must be {range}, got {cost}"));
        }
        for (field, grace) in [
            (PolicyField::CleanupGrace, policy.cleanup_grace),
            (PolicyField::MaximumClockRegression, policy.maximum_clock_regression),
        ] {
            if grace > MAX_GRACE {
                reject(field, format!("must be at most {MAX_GRACE:?}, got {grace:?}"));
            } else if let Some(problem) = whole_millis_problem(grace) {
                reject(field, problem);
            }
        }
        if !policy.algorithm.holds_leases() {
            policy.evaluation_dedup.check(&mut checks);
        }
        if !checks.violations.is_empty() {
            return Err(ContractError::InvalidPolicy(checks.violations));
        }
        Ok(RateLimitPolicy { id: PolicyId(id.into()), ..policy })
    }
}

/// A policy's configuration keys beside `algorithm` and the algorithm's
/// own: their serde names are the keys (what a file writes and
/// `check-config` prints), and one left out keeps the builder's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PolicyKeys {
    /// [`RateLimitPolicy::revision`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u32>,
    /// [`RateLimitPolicy::maximum_cost`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maximum_cost: Option<u64>,
    /// [`RateLimitPolicy::failure_policy`].
    #[serde(default, skip_serializing_if = "Option::is_none", with = "named")]
    pub failure_policy: Option<FailurePolicy>,
    /// [`RateLimitPolicy::cleanup_grace`].
    #[serde(default, skip_serializing_if = "Option::is_none", with = "some_duration")]
    pub cleanup_grace: Option<Duration>,
    /// [`RateLimitPolicy::maximum_clock_regression`].
    #[serde(default, skip_serializing_if = "Option::is_none", with = "some_duration")]
    pub maximum_clock_regression: Option<Duration>,
    /// [`RateLimitPolicy::scope`].
    #[serde(default, skip_serializing_if = "Option::is_none", with = "named")]
    pub scope: Option<PolicyScope>,
    /// [`RateLimitPolicy::mode`].
    #[serde(default, skip_serializing_if = "Option::is_none", with = "named")]
    pub mode: Option<PolicyMode>,
    /// [`RateLimitPolicy::evaluation_dedup`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evaluation_dedup: Option<DedupKeys>,
}

/// `evaluation-dedup`: `enabled` (default true) and the bounds, each left
/// out at [`EvaluationDedupPolicy::enabled_defaults`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct DedupKeys {
    /// Whether dedupe is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Record lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "some_duration")]
    pub ttl: Option<Duration>,
    /// Records kept per key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u32>,
    /// Record payload bytes kept per key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_stored_bytes: Option<u32>,
}

impl DedupKeys {
    fn policy(&self) -> EvaluationDedupPolicy {
        let EvaluationDedupPolicy::Enabled { ttl, max_entries, max_stored_bytes } =
            EvaluationDedupPolicy::enabled_defaults()
        else {
            unreachable!("enabled_defaults is Enabled");
        };
        if !self.enabled.unwrap_or(true) {
            return EvaluationDedupPolicy::Disabled;
        }
        EvaluationDedupPolicy::Enabled {
            ttl: self.ttl.unwrap_or(ttl),
            max_entries: self.max_entries.unwrap_or(max_entries),
            max_stored_bytes: self.max_stored_bytes.unwrap_or(max_stored_bytes),
        }
    }
}

impl RateLimitPolicyBuilder {
    /// Sets every key `keys` holds.
    #[must_use]
    pub fn keys(mut self, keys: &PolicyKeys) -> Self {
        let policy = &mut self.policy;
        policy.revision = keys.revision.unwrap_or(policy.revision);
        policy.maximum_cost = keys.maximum_cost.unwrap_or(policy.maximum_cost);
        policy.failure_policy = keys.failure_policy.unwrap_or(policy.failure_policy);
        policy.cleanup_grace = keys.cleanup_grace.unwrap_or(policy.cleanup_grace);
        policy.maximum_clock_regression =
            keys.maximum_clock_regression.unwrap_or(policy.maximum_clock_regression);
        policy.scope = keys.scope.unwrap_or(policy.scope);
        policy.mode = keys.mode.unwrap_or(policy.mode);
        if let Some(dedup) = &keys.evaluation_dedup {
            policy.evaluation_dedup = dedup.policy();
        }
        self
    }
}

impl RateLimitPolicy {
    /// Every key of the policy but those its algorithm refuses, so that
    /// what is printed loads again.
    pub fn keys(&self) -> PolicyKeys {
        let refused = self.algorithm.kind().refused_common_keys();
        let applies = |field| !refused.contains(&field);
        let evaluation_dedup = match self.evaluation_dedup {
            EvaluationDedupPolicy::Disabled => {
                DedupKeys { enabled: Some(false), ..DedupKeys::default() }
            }
            EvaluationDedupPolicy::Enabled { ttl, max_entries, max_stored_bytes } => DedupKeys {
                enabled: Some(true),
                ttl: Some(ttl),
                max_entries: Some(max_entries),
                max_stored_bytes: Some(max_stored_bytes),
            },
        };
        PolicyKeys {
            revision: Some(self.revision),
            maximum_cost: Some(self.maximum_cost).filter(|_| applies(PolicyField::MaximumCost)),
            failure_policy: Some(self.failure_policy),
            cleanup_grace: Some(self.cleanup_grace),
            maximum_clock_regression: Some(self.maximum_clock_regression),
            scope: Some(self.scope),
            mode: Some(self.mode),
            evaluation_dedup: Some(evaluation_dedup)
                .filter(|_| applies(PolicyField::EvaluationDedup)),
        }
    }
}

/// A named enum's name, kept or left out.
mod named {
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::name::{Named, UnknownName};

    pub(super) fn serialize<S: Serializer, T: Named>(
        value: &Option<T>,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => to.serialize_str(value.name()),
            None => to.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D, T>(from: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: FromStr<Err = UnknownName>,
    {
        String::deserialize(from)?.parse().map(Some).map_err(serde::de::Error::custom)
    }
}

/// A duration kept or left out, as [`crate::duration`] reads and writes it.
mod some_duration {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => crate::duration::serialize(value, to),
            None => to.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        from: D,
    ) -> Result<Option<Duration>, D::Error> {
        crate::duration::deserialize(from).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{
        AlgorithmKind, Concurrency, FixedWindow, Gcra, SlidingCounter, TokenBucket,
    };
    use crate::bounds::MAX_COUNT;

    fn fixed(limit: u64, window_ms: u64) -> Algorithm {
        Algorithm::FixedWindow(FixedWindow { limit, window: Duration::from_millis(window_ms) })
    }

    fn fields(result: Result<RateLimitPolicy, ContractError>) -> Vec<PolicyField> {
        let error = result.expect_err("policy should be rejected");
        error.violations().iter().map(|v| v.field).collect()
    }

    #[test]
    fn fail_closed_is_the_only_failure_policy() {
        // Exhaustive: a new failure policy fails to compile here until ALL
        // and this test learn it.
        match FailurePolicy::default() {
            FailurePolicy::FailClosed => {}
        }
        assert_eq!(FailurePolicy::ALL, [FailurePolicy::FailClosed]);
        assert_eq!("fail-closed".parse::<FailurePolicy>(), Ok(FailurePolicy::FailClosed));
        assert!("fail-open".parse::<FailurePolicy>().is_err());
    }

    #[test]
    fn defaults_build_and_match_the_documented_values() {
        let policy = RateLimitPolicy::builder("api.default_1-x", fixed(10, 1000)).build().unwrap();
        assert_eq!(policy.revision(), 1);
        assert_eq!(policy.maximum_cost(), 1);
        assert_eq!(policy.cleanup_grace(), Duration::from_secs(1));
        assert_eq!(policy.maximum_clock_regression(), Duration::from_secs(1));
        assert_eq!(policy.evaluation_dedup(), EvaluationDedupPolicy::enabled_defaults());
        assert_eq!(policy.failure_policy(), FailurePolicy::FailClosed);
        assert_eq!(policy.scope(), PolicyScope::Operation);
        assert_eq!(policy.mode(), PolicyMode::Enforce);
    }

    #[test]
    fn scopes_and_modes_are_listed_and_named() {
        for scope in PolicyScope::ALL {
            // Exhaustive: a new scope fails to compile until ALL lists it.
            match scope {
                PolicyScope::Operation | PolicyScope::Subject => {}
            }
            assert_eq!(scope.name().parse(), Ok(scope));
        }
        for mode in PolicyMode::ALL {
            match mode {
                PolicyMode::Enforce | PolicyMode::Shadow => {}
            }
            assert_eq!(mode.name().parse(), Ok(mode));
        }
        assert_eq!((PolicyScope::ALL.len(), PolicyMode::ALL.len()), (2, 2));
        assert!("global".parse::<PolicyScope>().is_err());
        assert!("dry-run".parse::<PolicyMode>().is_err());
    }

    #[test]
    fn id_charset_and_length_are_enforced() {
        for bad in ["", "Upper", "has space", "a/b", "ключ", &"a".repeat(65)] {
            assert_eq!(
                fields(RateLimitPolicy::builder(bad, fixed(1, 1)).build()),
                [PolicyField::Id]
            );
            assert!(PolicyId::new(bad).is_err());
        }
        assert!(RateLimitPolicy::builder("a".repeat(64), fixed(1, 1)).build().is_ok());
    }

    #[test]
    fn revision_zero_is_rejected() {
        let result = RateLimitPolicy::builder("p", fixed(1, 1)).revision(0).build();
        assert_eq!(fields(result), [PolicyField::Revision]);
    }

    #[test]
    fn limit_and_window_bounds_name_their_field() {
        assert_eq!(
            fields(RateLimitPolicy::builder("p", fixed(0, 10)).build()),
            [PolicyField::Parameter("limit")]
        );
        assert_eq!(
            fields(RateLimitPolicy::builder("p", fixed(5, 0)).build()),
            [PolicyField::Parameter("window")]
        );
        let sub_ms = Algorithm::SlidingCounter(SlidingCounter {
            limit: 5,
            window: Duration::from_micros(1500),
        });
        assert_eq!(
            fields(RateLimitPolicy::builder("p", sub_ms).build()),
            [PolicyField::Parameter("window")]
        );
        let bucket = Algorithm::TokenBucket(TokenBucket {
            capacity: 0,
            refill_tokens: 0,
            refill_period: Duration::ZERO,
        });
        assert_eq!(
            fields(RateLimitPolicy::builder("p", bucket).build()),
            [
                PolicyField::Parameter("capacity"),
                PolicyField::Parameter("refill-period"),
                PolicyField::Parameter("refill-tokens")
            ]
        );
    }

    #[test]
    fn inexact_products_are_rejected_for_sliding_and_bucket() {
        let day = Duration::from_secs(86_400);
        let sliding = Algorithm::SlidingCounter(SlidingCounter { limit: MAX_COUNT, window: day });
        assert_eq!(
            fields(RateLimitPolicy::builder("p", sliding).build()),
            [PolicyField::Parameter("limit")]
        );
        // The fixed window never multiplies, so the same numbers are fine there.
        let fixed = Algorithm::FixedWindow(FixedWindow { limit: MAX_COUNT, window: day });
        assert!(RateLimitPolicy::builder("p", fixed).maximum_cost(1).build().is_ok());
    }

    fn gcra(limit: u64, period_ms: u64, burst: u64) -> Algorithm {
        Algorithm::Gcra(Gcra { limit, period: Duration::from_millis(period_ms), burst })
    }

    #[test]
    fn gcra_fields_are_checked_and_named() {
        assert_eq!(
            fields(RateLimitPolicy::builder("p", gcra(0, 0, 0)).maximum_cost(1).build()),
            [
                PolicyField::Parameter("limit"),
                PolicyField::Parameter("burst"),
                PolicyField::Parameter("period")
            ]
        );
        // The cost is bounded by the burst, not by the steady-rate limit.
        let over = RateLimitPolicy::builder("p", gcra(10, 1000, 5)).maximum_cost(6).build();
        assert_eq!(fields(over), [PolicyField::MaximumCost]);
        assert!(RateLimitPolicy::builder("p", gcra(10, 1000, 5)).maximum_cost(5).build().is_ok());
        // A year per request, a burst of 10^9: b x T is 3.15e22 us, far past 2^52.
        let year = 365 * 24 * 3600 * 1000;
        let inexact = RateLimitPolicy::builder("p", gcra(1, year, MAX_COUNT)).build();
        assert_eq!(fields(inexact), [PolicyField::Parameter("burst")]);
        // 1 per 4.5e12 us (just above 2^52 / 1000 ms), burst 1000: rejected;
        // burst 1000 at T = 4.5e9 us (75 minutes): fine.
        assert_eq!(
            fields(RateLimitPolicy::builder("p", gcra(1, 4_503_599_628, 1000)).build()),
            [PolicyField::Parameter("burst")]
        );
        assert!(RateLimitPolicy::builder("p", gcra(1, 4_500_000, 1000)).build().is_ok());
    }

    #[test]
    fn gcra_emission_interval_is_whole_microseconds_rounded_up() {
        let interval = |algorithm| match algorithm {
            Algorithm::Gcra(gcra) => gcra.emission_interval_micros(),
            _ => unreachable!(),
        };
        assert_eq!(interval(gcra(10, 1000, 5)), 100_000);
        assert_eq!(interval(gcra(3, 1000, 3)), 333_334);
        assert_eq!(interval(gcra(1_000_000_000, 1, 1)), 1);
        assert_eq!(gcra(10, 1000, 5).limit(), 5, "the burst is the most spent at once");
    }

    #[test]
    fn maximum_cost_must_lie_within_the_limit() {
        let over = RateLimitPolicy::builder("p", fixed(3, 10)).maximum_cost(4).build();
        assert_eq!(fields(over), [PolicyField::MaximumCost]);
        let zero = RateLimitPolicy::builder("p", fixed(3, 10)).maximum_cost(0).build();
        assert_eq!(fields(zero), [PolicyField::MaximumCost]);
        assert!(RateLimitPolicy::builder("p", fixed(3, 10)).maximum_cost(3).build().is_ok());
    }

    #[test]
    fn grace_and_regression_are_bounded() {
        let result = RateLimitPolicy::builder("p", fixed(3, 10))
            .cleanup_grace(MAX_GRACE + Duration::from_millis(1))
            .maximum_clock_regression(Duration::from_nanos(10))
            .build();
        assert_eq!(
            fields(result),
            [PolicyField::CleanupGrace, PolicyField::MaximumClockRegression]
        );
    }

    #[test]
    fn every_violation_is_reported_with_its_key() {
        let error = RateLimitPolicy::builder("BAD", fixed(0, 0))
            .revision(0)
            .maximum_cost(0)
            .build()
            .unwrap_err();
        let text = error.to_string();
        for key in ["id:", "revision:", "limit:", "window:", "maximum-cost:"] {
            assert!(text.contains(key), "{key} missing from {text}");
        }
    }

    #[test]
    fn ttl_slack_is_the_larger_of_grace_and_regression() {
        let policy = RateLimitPolicy::builder("p", fixed(3, 10))
            .cleanup_grace(Duration::from_millis(250))
            .maximum_clock_regression(Duration::from_millis(900))
            .build()
            .unwrap();
        assert_eq!(policy.ttl_slack_millis(), 900);
    }

    fn problems(result: Result<RateLimitPolicy, ContractError>) -> Vec<(PolicyField, String)> {
        match result {
            Ok(_) => Vec::new(),
            Err(error) => error.violations().iter().map(|v| (v.field, v.problem.clone())).collect(),
        }
    }

    #[test]
    fn a_gcra_burst_must_cover_a_whole_millisecond_of_cells() {
        // An outside pass: 10000 per 1s is T = 100 us; the clock
        // counts whole ms, so burst 1 admits 1 a ms where 10 are due.
        let short = problems(RateLimitPolicy::builder("p", gcra(10_000, 1000, 1)).build());
        assert_eq!(short.len(), 1, "{short:?}");
        assert_eq!(short[0].0, PolicyField::Parameter("burst"));
        assert!(short[0].1.contains("1 ms") && short[0].1.contains("= 10"), "{short:?}");
        let nine = RateLimitPolicy::builder("p", gcra(10_000, 1000, 9)).build();
        assert_eq!(fields(nine), [PolicyField::Parameter("burst")]);
        assert!(RateLimitPolicy::builder("p", gcra(10_000, 1000, 10)).build().is_ok());
        // T = 333334 us covers a ms on its own; T = 1 us needs 1000.
        assert!(RateLimitPolicy::builder("p", gcra(3, 1000, 1)).build().is_ok());
        let micro = RateLimitPolicy::builder("p", gcra(1000, 1, 999)).build();
        assert_eq!(fields(micro), [PolicyField::Parameter("burst")]);
        assert!(RateLimitPolicy::builder("p", gcra(1000, 1, 1000)).build().is_ok());
    }

    #[test]
    fn a_gcra_interval_rounded_up_by_more_than_one_percent_is_refused() {
        // 2000 per 1 ms rounds T up to 1 us: 1000 a ms, half the rate.
        let half = problems(RateLimitPolicy::builder("p", gcra(2000, 1, 2000)).build());
        assert_eq!(half.len(), 1, "{half:?}");
        assert_eq!(half[0].0, PolicyField::Parameter("limit"));
        assert!(half[0].1.contains("T = 1 us"), "{half:?}");
        // 49 per 1 ms: T = 21 us, 1029 us for 49 cells (2.9 % slower).
        assert_eq!(
            fields(RateLimitPolicy::builder("p", gcra(49, 1, 49)).build()),
            [PolicyField::Parameter("limit")]
        );
        // 199 per 10 ms: T = 51 us, 10149 us (1.49 %); 101 per 10 ms:
        // T = 100 us, 10100 us (exactly 1 %, kept); 3 per 1s: 0.0002 %.
        assert_eq!(
            fields(RateLimitPolicy::builder("p", gcra(199, 10, 199)).build()),
            [PolicyField::Parameter("limit")]
        );
        assert!(RateLimitPolicy::builder("p", gcra(101, 10, 101)).build().is_ok());
        assert!(RateLimitPolicy::builder("p", gcra(3, 1000, 3)).build().is_ok());
    }

    fn concurrency(max_in_flight: u64, lease_ttl_ms: u64, retry_after_ms: u64) -> Algorithm {
        Algorithm::Concurrency(Concurrency {
            max_in_flight,
            lease_ttl: Duration::from_millis(lease_ttl_ms),
            retry_after: Duration::from_millis(retry_after_ms),
        })
    }

    #[test]
    fn a_concurrency_policy_bounds_each_of_its_keys_and_names_it() {
        let ok = RateLimitPolicy::builder("exports", concurrency(2, 30_000, 1000)).build().unwrap();
        assert_eq!((ok.limit(), ok.algorithm().name()), (2, "concurrency"));
        assert_eq!(ok.evaluation_dedup(), EvaluationDedupPolicy::Disabled, "no dedupe by default");
        assert_eq!(ok.algorithm().certainty(), crate::Certainty::Certain);
        // The extremes of each range pass: 1..=10000, 1 ms..=24 h, 1 ms..=1 h.
        assert!(RateLimitPolicy::builder("p", concurrency(1, 1, 1)).build().is_ok());
        let day = 24 * 3600 * 1000;
        assert!(RateLimitPolicy::builder("p", concurrency(10_000, day, 3_600_000)).build().is_ok());
        let over = RateLimitPolicy::builder("p", concurrency(10_001, day + 1, 3_600_001)).build();
        let found = problems(over);
        let keys: Vec<_> = found.iter().map(|(field, _)| field.key()).collect();
        assert_eq!(keys, ["max-in-flight", "lease-ttl", "retry-after"], "{found:?}");
        assert!(found[0].1.contains("1..=10000"), "{found:?}");
        let zero = RateLimitPolicy::builder("p", concurrency(0, 0, 0)).build();
        assert_eq!(
            fields(zero),
            [
                PolicyField::Parameter("max-in-flight"),
                PolicyField::Parameter("lease-ttl"),
                PolicyField::Parameter("retry-after")
            ]
        );
        let fraction = Algorithm::Concurrency(Concurrency {
            max_in_flight: 2,
            lease_ttl: Duration::from_micros(1500),
            retry_after: Duration::from_micros(2500),
        });
        assert_eq!(
            fields(RateLimitPolicy::builder("p", fraction).build()),
            [PolicyField::Parameter("lease-ttl"), PolicyField::Parameter("retry-after")]
        );
    }

    #[test]
    fn a_concurrency_policy_takes_no_maximum_cost_and_no_dedupe() {
        let both = RateLimitPolicy::builder("p", concurrency(2, 30_000, 1000))
            .maximum_cost(2)
            .evaluation_dedup(EvaluationDedupPolicy::enabled_defaults())
            .build();
        let found = problems(both);
        assert_eq!(
            found.iter().map(|(field, _)| *field).collect::<Vec<_>>(),
            [PolicyField::MaximumCost, PolicyField::EvaluationDedup]
        );
        assert!(found.iter().all(|(_, problem)| problem.contains("does not apply")), "{found:?}");
        assert_eq!(
            AlgorithmKind::Concurrency.refused_common_keys(),
            [PolicyField::MaximumCost, PolicyField::EvaluationDedup]
        );
        assert_eq!(
            AlgorithmKind::Concurrency.parameters(),
            ["max-in-flight", "lease-ttl", "retry-after"]
        );
        // Any cost from 1 is admitted: a lease is one slot whatever the cost.
        let policy = RateLimitPolicy::builder("p", concurrency(2, 30_000, 1000)).build().unwrap();
        assert!(policy.admits_cost(1) && policy.admits_cost(MAX_COUNT) && !policy.admits_cost(0));
        let fixed = RateLimitPolicy::builder("f", fixed(3, 10)).maximum_cost(2).build().unwrap();
        assert!(fixed.admits_cost(2) && !fixed.admits_cost(3) && !fixed.admits_cost(0));
    }

    #[test]
    fn a_maximum_cost_beside_a_bad_limit_names_no_empty_range() {
        let result = RateLimitPolicy::builder("p", gcra(10, 1000, 0)).maximum_cost(0).build();
        let found = problems(result);
        assert_eq!(
            found,
            [
                (PolicyField::Parameter("burst"), format!("must be in 1..={MAX_COUNT}, got 0")),
                (PolicyField::MaximumCost, "must be at least 1, got 0".to_owned()),
            ]
        );
        let fixed_zero =
            problems(RateLimitPolicy::builder("p", fixed(0, 10)).maximum_cost(0).build());
        assert!(fixed_zero.iter().all(|(_, problem)| !problem.contains("1..=0")), "{fixed_zero:?}");
    }
}
