//! `RateLimitKeys`: the physical Redis key of one subject under one policy.

use shared_contract::{RateLimitPolicy, SubjectDigest};

/// Builds `<prefix>{<policy_id>:<revision>:<subject digest>}`.
///
/// The braces are a Redis Cluster hash tag: any auxiliary key of the same
/// subject must reuse [`RateLimitKeys::hash_tag`] so it lands in the same
/// slot. A new policy revision gives a new key, so it never reads an older
/// revision's counters. Only the pseudonym enters the key, never a raw
/// identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitKeys {
    prefix: String,
}

impl RateLimitKeys {
    /// Keys under `prefix` (validated by the settings: no braces, no
    /// whitespace).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self { prefix: prefix.into() }
    }

    /// The configured prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The hash tag of a subject, braces included.
    pub fn hash_tag(policy: &RateLimitPolicy, subject: &SubjectDigest) -> String {
        format!("{{{}:{}:{}}}", policy.id(), policy.revision(), subject.as_str())
    }

    /// The counter key that holds state, mark and dedupe records.
    pub fn counter_key(&self, policy: &RateLimitPolicy, subject: &SubjectDigest) -> String {
        format!("{}{}", self.prefix, Self::hash_tag(policy, subject))
    }
}

impl Default for RateLimitKeys {
    fn default() -> Self {
        Self::new(crate::settings::DEFAULT_KEY_PREFIX)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::Algorithm;

    use super::*;

    #[test]
    fn key_is_prefix_then_braced_policy_revision_and_pseudonym() {
        let policy = RateLimitPolicy::builder(
            "api.orders",
            Algorithm::FixedWindow { limit: 3, window: Duration::from_secs(1) },
        )
        .revision(7)
        .build()
        .unwrap();
        let subject = SubjectDigest::parse(format!("v2:{}", "0f".repeat(16))).unwrap();
        let key = RateLimitKeys::default().counter_key(&policy, &subject);
        assert_eq!(key, format!("ca:rl:{{api.orders:7:v2:{}}}", "0f".repeat(16)));
        assert!(key.ends_with(&RateLimitKeys::hash_tag(&policy, &subject)));
        assert_eq!(RateLimitKeys::new("x:").counter_key(&policy, &subject)[..3], *"x:{");
    }
}
