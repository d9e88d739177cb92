//! `RateLimitKeys`: the physical Redis key of one subject under one policy.

use shared_contract::{OperationDigest, PolicyScope, RateLimitPolicy, SubjectDigest};

/// Builds `<prefix>{<subject pseudonym>}:<policy_id>:<revision>` for a
/// subject-scoped policy, with `:<operation digest>` appended for an
/// operation-scoped one.
///
/// The braces are a Redis Cluster hash tag holding the subject alone, so
/// every key of one subject (every policy of a set, whatever its scope)
/// lands in one slot and a policy set is one atomic script call. A new
/// policy revision gives a new key, so it never reads an older revision's
/// counters. Only the pseudonym and the operation digest enter the key,
/// never a raw identity, route or path.
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

    /// The hash tag of a subject, braces included: the same for every
    /// policy and operation.
    pub fn hash_tag(subject: &SubjectDigest) -> String {
        format!("{{{subject}}}")
    }

    /// The counter key that holds state, mark and dedupe records of
    /// `subject` under `policy`, for `operation` when the policy is
    /// operation-scoped (a subject-scoped policy ignores it).
    pub fn counter_key(
        &self,
        policy: &RateLimitPolicy,
        subject: &SubjectDigest,
        operation: &OperationDigest,
    ) -> String {
        let operation = match policy.scope() {
            PolicyScope::Operation => Some(operation),
            PolicyScope::Subject => None,
        };
        self.budget_key(policy, subject, operation)
    }

    /// The counter key of one budget (`shared_contract::BudgetKey`):
    /// `operation` is the one an operation-scoped policy's key ends with,
    /// `None` for a subject-scoped policy (checked by
    /// `BudgetKey::operation_for`). The same key [`Self::counter_key`]
    /// gives for a request.
    pub fn budget_key(
        &self,
        policy: &RateLimitPolicy,
        subject: &SubjectDigest,
        operation: Option<&OperationDigest>,
    ) -> String {
        // The digests print as `v<version>:<hex>` and hex: the texts keys
        // have always held, so stored state keeps its keys.
        let (prefix, id, revision) = (&self.prefix, policy.id().as_str(), policy.revision());
        match operation {
            Some(operation) => format!("{prefix}{{{subject}}}:{id}:{revision}:{operation}"),
            None => format!("{prefix}{{{subject}}}:{id}:{revision}"),
        }
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

    fn policy(id: &str, scope: PolicyScope) -> RateLimitPolicy {
        RateLimitPolicy::builder(
            id,
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 3,
                window: Duration::from_secs(1),
            }),
        )
        .revision(7)
        .scope(scope)
        .build()
        .unwrap()
    }

    #[test]
    fn key_is_prefix_braced_pseudonym_policy_revision_and_the_operation_when_scoped_to_it() {
        let subject = SubjectDigest::parse(format!("v2:{}", "0f".repeat(16))).unwrap();
        let operation = OperationDigest::from_u64(0x0123_4567_89ab_cdef);
        let keys = RateLimitKeys::default();
        let scoped =
            keys.counter_key(&policy("api.orders", PolicyScope::Operation), &subject, &operation);
        assert_eq!(
            scoped,
            format!("ca:rl:{{v2:{}}}:api.orders:7:0123456789abcdef", "0f".repeat(16))
        );
        let shared =
            keys.counter_key(&policy("api.daily", PolicyScope::Subject), &subject, &operation);
        assert_eq!(shared, format!("ca:rl:{{v2:{}}}:api.daily:7", "0f".repeat(16)));
        // An Envoy RLS rule's 128-bit operation and the edge's 256-bit
        // pseudonym keep their whole texts.
        let rule = OperationDigest::from_u128(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff);
        let edge = SubjectDigest::parse(format!("v12:{}", "a5".repeat(32))).unwrap();
        assert_eq!(
            keys.counter_key(&policy("api.orders", PolicyScope::Operation), &edge, &rule),
            format!(
                "ca:rl:{{v12:{}}}:api.orders:7:00112233445566778899aabbccddeeff",
                "a5".repeat(32)
            )
        );
        // Another operation: its own operation-scoped key, the same subject-scoped one.
        let other = OperationDigest::from_u64(0xfedc_ba98_7654_3210);
        assert_ne!(
            keys.counter_key(&policy("api.orders", PolicyScope::Operation), &subject, &other),
            scoped
        );
        assert_eq!(
            keys.counter_key(&policy("api.daily", PolicyScope::Subject), &subject, &other),
            shared
        );
        // One hash tag for every key of the subject: one Cluster slot.
        let tag = RateLimitKeys::hash_tag(&subject);
        assert_eq!(tag, format!("{{v2:{}}}", "0f".repeat(16)));
        for key in [&scoped, &shared] {
            assert_eq!(key.find('{').map(|at| &key[at..at + tag.len()]), Some(tag.as_str()));
        }
        let prefixed = RateLimitKeys::new("x:").counter_key(
            &policy("p", PolicyScope::Subject),
            &subject,
            &operation,
        );
        assert_eq!(prefixed[..3], *"x:{");
    }
}
