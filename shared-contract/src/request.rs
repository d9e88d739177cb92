//! `RateLimitRequest`: may this subject spend this cost under this set now?

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::bounds::MAX_POLICY_SET;
use crate::error::ContractError;
use crate::evaluation::EvaluationId;
use crate::outcome::{IncompatibleCategory, RateLimitFailure};
use crate::policy::{PolicyId, RateLimitPolicy};
use crate::subject::SubjectDigest;

/// The policies of one request in configured order, shared.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PolicySet(Arc<[PolicyId]>);

impl PolicySet {
    /// Validates `ids`: 1 to [`MAX_POLICY_SET`], no id twice.
    pub fn new(ids: impl IntoIterator<Item = PolicyId>) -> Result<Self, ContractError> {
        let ids: Arc<[PolicyId]> = ids.into_iter().collect();
        let invalid = |why: String| Err(ContractError::InvalidPolicySet(why));
        if ids.is_empty() {
            return invalid("must name at least one policy".to_owned());
        }
        if ids.len() > MAX_POLICY_SET {
            return invalid(format!("at most {MAX_POLICY_SET} policies, got {}", ids.len()));
        }
        let twice = ids.iter().enumerate().find(|(at, id)| ids[..*at].contains(id));
        if let Some((_, id)) = twice {
            return invalid(format!("{id} is listed twice"));
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

/// A digest of the operation, so no route reaches a key; it prints its width.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OperationDigest(Bits);

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Bits {
    Narrow(u64),
    Wide { high: u64, low: u64 },
}

impl OperationDigest {
    /// A 64-bit digest, printed as 16 hex digits.
    pub const fn from_u64(bits: u64) -> Self {
        Self(Bits::Narrow(bits))
    }

    /// A 128-bit digest, printed as 32 hex digits.
    pub const fn from_u128(bits: u128) -> Self {
        // The halves of a u128: the casts keep exactly 64 bits each.
        Self(Bits::Wide { high: (bits >> 64) as u64, low: bits as u64 })
    }

    /// Its bits, and whether it is the 128-bit form (a store may pack them).
    pub const fn bits(self) -> (u128, bool) {
        match self.0 {
            Bits::Narrow(bits) => (bits as u128, false),
            Bits::Wide { high, low } => (((high as u128) << 64) | low as u128, true),
        }
    }
}

impl fmt::Display for OperationDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Bits::Narrow(bits) => write!(f, "{bits:016x}"),
            Bits::Wide { high, low } => write!(f, "{high:016x}{low:016x}"),
        }
    }
}

impl fmt::Debug for OperationDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperationDigest({self})")
    }
}

/// One rate-limit evaluation request. It borrows the policy set its caller
/// holds (a front's configured set), so asking copies no shared pointer;
/// `RateLimitRequest<'static>` owns its set, for a provider that waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitRequest<'a> {
    /// The policies to evaluate together, in configured order.
    pub policies: Cow<'a, PolicySet>,
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

impl From<PolicySet> for Cow<'_, PolicySet> {
    fn from(set: PolicySet) -> Self {
        Cow::Owned(set)
    }
}

impl<'a> From<&'a PolicySet> for Cow<'a, PolicySet> {
    fn from(set: &'a PolicySet) -> Self {
        Cow::Borrowed(set)
    }
}

impl PartialEq<PolicySet> for Cow<'_, PolicySet> {
    fn eq(&self, other: &PolicySet) -> bool {
        **self == *other
    }
}

impl PartialEq<Cow<'_, PolicySet>> for PolicySet {
    fn eq(&self, other: &Cow<'_, PolicySet>) -> bool {
        *self == **other
    }
}

impl RateLimitRequest<'_> {
    /// The same request owning its set: what a future that outlives the call holds.
    pub fn into_owned(self) -> RateLimitRequest<'static> {
        let Self { policies, subject, operation, cost, evaluation_id, deadline } = self;
        let policies = Cow::Owned(policies.into_owned());
        RateLimitRequest { policies, subject, operation, cost, evaluation_id, deadline }
    }

    /// Step 1 of docs/algorithms.md, reading no state: every policy known to
    /// `lookup` and admitting the cost ([`RateLimitPolicy::admits_cost`]); a
    /// refusal is the outcome to answer, unknown policies first.
    pub fn resolve<'p, T>(
        &self,
        lookup: impl Fn(&PolicyId) -> Option<&'p T>,
        policy_of: impl Fn(&T) -> &RateLimitPolicy,
    ) -> Result<SetEntries<'p, T>, RateLimitFailure> {
        let entries = self.known(lookup)?;
        if !entries.iter().all(|entry| policy_of(entry).admits_cost(self.cost)) {
            return Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::CostExceedsMaximum,
            });
        }
        Ok(entries)
    }

    /// Every policy of the set known to `lookup`, whatever the cost.
    ///
    /// # Errors
    /// `Incompatible(UnknownPolicy)` for one it does not know.
    pub fn known<'p, T>(
        &self,
        lookup: impl Fn(&PolicyId) -> Option<&'p T>,
    ) -> Result<SetEntries<'p, T>, RateLimitFailure> {
        let mut entries = [None; MAX_POLICY_SET];
        for (slot, id) in entries.iter_mut().zip(self.policies.ids()) {
            *slot = Some(lookup(id).ok_or(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::UnknownPolicy,
            })?);
        }
        Ok(SetEntries { entries, len: self.policies.len().min(MAX_POLICY_SET) })
    }
}

/// What [`RateLimitRequest::resolve`] found for each policy, in order.
#[derive(Debug)]
pub struct SetEntries<'p, T> {
    entries: [Option<&'p T>; MAX_POLICY_SET],
    len: usize,
}

impl<'p, T> SetEntries<'p, T> {
    /// The entries in the set's order.
    pub fn iter(&self) -> impl Iterator<Item = &'p T> + '_ {
        self.entries[..self.len].iter().flatten().copied()
    }

    /// How many (the set's length).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a set holds at least one policy.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> PolicyId {
        PolicyId::new(name).unwrap()
    }

    /// A request of `cost` under the set `ids`.
    fn request(ids: &[&str], cost: u64) -> RateLimitRequest<'static> {
        RateLimitRequest {
            policies: PolicySet::new(ids.iter().map(|name| id(name))).unwrap().into(),
            subject: crate::SubjectDigest::parse(format!("v1:{}", "ab".repeat(16))).unwrap(),
            operation: OperationDigest::from_u64(0x0123_4567_89ab_cdef),
            cost,
            evaluation_id: EvaluationId::random(),
            deadline: Instant::now(),
        }
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
    fn operation_digests_print_as_lowercase_hex_of_their_width() {
        assert_eq!(
            OperationDigest::from_u64(0x0123_4567_89ab_cdef).to_string(),
            "0123456789abcdef"
        );
        assert_eq!(OperationDigest::from_u64(0xaa).to_string(), "00000000000000aa");
        let wide = OperationDigest::from_u128(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff);
        assert_eq!(wide.to_string(), "00112233445566778899aabbccddeeff");
        assert_eq!(OperationDigest::from_u128(0xaa).to_string(), format!("{}aa", "0".repeat(30)));
        assert_eq!(format!("{wide:?}"), "OperationDigest(00112233445566778899aabbccddeeff)");
        // One number at two widths: two operations (two key texts).
        assert_ne!(OperationDigest::from_u64(0xaa), OperationDigest::from_u128(0xaa));
    }

    #[test]
    fn resolving_a_set_refuses_unknown_policies_before_costs() {
        use std::collections::HashMap;
        use std::time::Duration;

        let policy = |name: &str, maximum_cost| {
            let window = Duration::from_secs(1);
            RateLimitPolicy::builder(
                name,
                crate::Algorithm::FixedWindow(crate::FixedWindow { limit: 5, window }),
            )
            .maximum_cost(maximum_cost)
            .build()
            .unwrap()
        };
        let held: HashMap<PolicyId, RateLimitPolicy> = [policy("wide", 5), policy("narrow", 2)]
            .into_iter()
            .map(|p| (p.id().clone(), p))
            .collect();
        let resolve = |ids: &[&str], cost| {
            let resolved = request(ids, cost).resolve(|id| held.get(id), |policy| policy);
            resolved
                .map(|entries| {
                    entries.iter().map(|policy| policy.id().as_str().to_owned()).collect::<Vec<_>>()
                })
                .map_err(|refusal| refusal.category_name())
        };
        assert_eq!(
            resolve(&["narrow", "wide"], 2),
            Ok(vec!["narrow".to_owned(), "wide".to_owned()])
        );
        assert_eq!(resolve(&["wide", "narrow"], 3), Err("cost-exceeds-maximum"));
        assert_eq!(resolve(&["wide"], 0), Err("cost-exceeds-maximum"));
        // Unknown wins over a cost that fits nothing.
        assert_eq!(resolve(&["wide", "missing"], 9), Err("unknown-policy"));
    }

    #[test]
    fn a_concurrency_policy_leaves_the_cost_check_to_the_rate_policies_of_its_set() {
        use std::collections::HashMap;
        use std::time::Duration;

        let leases = crate::Algorithm::Concurrency(crate::Concurrency {
            max_in_flight: 2,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
        });
        let window = Duration::from_secs(1);
        let rate = crate::Algorithm::FixedWindow(crate::FixedWindow { limit: 5, window });
        let held: HashMap<PolicyId, RateLimitPolicy> = [
            RateLimitPolicy::builder("exports", leases).build().unwrap(),
            RateLimitPolicy::builder("rate", rate).maximum_cost(3).build().unwrap(),
        ]
        .into_iter()
        .map(|p| (p.id().clone(), p))
        .collect();
        let fits = |ids: &[&str], cost| {
            request(ids, cost)
                .resolve(|id| held.get(id), |policy| policy)
                .map(|_| ())
                .map_err(|r| r.category_name())
        };
        assert_eq!(fits(&["exports"], 7), Ok(()), "a lease is one slot whatever the cost");
        assert_eq!(fits(&["exports", "rate"], 3), Ok(()));
        assert_eq!(fits(&["exports", "rate"], 4), Err("cost-exceeds-maximum"));
        assert_eq!(fits(&["exports"], 0), Err("cost-exceeds-maximum"));
    }
}
