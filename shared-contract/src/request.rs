//! `RateLimitRequest`: one question a caller asks a provider — may this
//! subject spend this cost under every policy of this set, now?

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use uuid::Uuid;

use crate::error::ContractError;
use crate::policy::PolicyId;
use crate::subject::SubjectDigest;

/// Most policies one request evaluates together.
pub const MAX_POLICY_SET: usize = 8;

/// A server-generated id for one evaluation. A provider with dedupe enabled
/// answers a repeat of the same id from its record instead of charging again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EvaluationId(Uuid);

impl EvaluationId {
    /// A fresh random id (UUID v4). Never derive one from client input.
    pub fn random() -> Self {
        Self(Uuid::new_v4())
    }

    /// Wraps an existing UUID (tests, replays).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The UUID.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }

    /// The 16 bytes of the UUID, the form a provider stores.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl fmt::Display for EvaluationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The policies of one request, in configured order: 1 to
/// [`MAX_POLICY_SET`] distinct ids. Shared, not copied: every request
/// carries one, so a clone must not allocate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PolicySet(Arc<[PolicyId]>);

impl PolicySet {
    /// Validates `ids`: at least one, at most [`MAX_POLICY_SET`], no id
    /// twice.
    pub fn new(ids: impl IntoIterator<Item = PolicyId>) -> Result<Self, ContractError> {
        let ids: Arc<[PolicyId]> = ids.into_iter().collect();
        let invalid = |why: String| Err(ContractError::InvalidPolicySet(why));
        if ids.is_empty() {
            return invalid("must name at least one policy".to_owned());
        }
        if ids.len() > MAX_POLICY_SET {
            return invalid(format!("at most {MAX_POLICY_SET} policies, got {}", ids.len()));
        }
        for (index, id) in ids.iter().enumerate() {
            if ids[..index].contains(id) {
                return invalid(format!("{id} is listed twice"));
            }
        }
        Ok(Self(ids))
    }

    /// The set of one policy.
    pub fn single(id: PolicyId) -> Self {
        Self(Arc::from([id]))
    }

    /// The ids, in configured order.
    pub fn ids(&self) -> &[PolicyId] {
        &self.0
    }

    /// How many policies the set holds (1 ..= [`MAX_POLICY_SET`]).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a set holds at least one policy.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A digest of the operation (method and route template), the part of an
/// operation-scoped policy's key that tells operations apart: 16 to 64
/// lowercase hex digits, so no route or path ever reaches a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperationDigest(Arc<str>);

impl OperationDigest {
    /// Validates the hex form.
    pub fn new(hex: impl Into<String>) -> Result<Self, ContractError> {
        let hex = hex.into();
        if !(16..=64).contains(&hex.len()) {
            return Err(ContractError::InvalidOperationDigest(format!(
                "must be 16 to 64 hex digits, got {}",
                hex.len()
            )));
        }
        if !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(ContractError::InvalidOperationDigest("must be lowercase hex".to_owned()));
        }
        Ok(Self(hex.into()))
    }

    /// The digest as text, as it appears in a storage key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OperationDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One rate-limit evaluation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitRequest {
    /// The policies to evaluate together, in configured order.
    pub policies: PolicySet,
    /// The pseudonymous subject.
    pub subject: SubjectDigest,
    /// The operation, for the keys of operation-scoped policies.
    pub operation: OperationDigest,
    /// Units to charge, 1 ..= every policy's maximum cost.
    pub cost: u64,
    /// Server-generated id of this evaluation.
    pub evaluation_id: EvaluationId,
    /// Monotonic instant after which an answer is useless.
    pub deadline: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> PolicyId {
        PolicyId::new(name).unwrap()
    }

    #[test]
    fn a_set_holds_one_to_eight_distinct_policies_in_order() {
        let set = PolicySet::new([id("burst"), id("hourly")]).unwrap();
        assert_eq!(set.ids(), [id("burst"), id("hourly")]);
        assert_eq!(PolicySet::single(id("a")).len(), 1);
        assert!(PolicySet::new([]).is_err());
        assert!(PolicySet::new([id("a"), id("b"), id("a")]).is_err());
        let nine = (0..9).map(|n| id(&format!("p{n}")));
        assert!(PolicySet::new(nine).is_err());
        let eight = (0..8).map(|n| id(&format!("p{n}")));
        assert_eq!(PolicySet::new(eight).unwrap().len(), MAX_POLICY_SET);
    }

    #[test]
    fn operation_digests_are_lowercase_hex() {
        assert!(OperationDigest::new("0123456789abcdef").is_ok());
        for bad in ["0123456789abcde", "0123456789ABCDEF", "GET /api/orders/{id}", ""] {
            assert!(OperationDigest::new(bad).is_err(), "{bad}");
        }
        assert!(OperationDigest::new("a".repeat(65)).is_err());
    }
}
