//! `MemoryEdgeRateLimitAdapter`: the in-process provider behind the port.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use shared_contract::{
    BudgetFailure, BudgetKey, BudgetState, Clock, DEFAULT_FAILURE_RETRY_AFTER, EdgeRateLimitPort,
    Evaluation, IncompatibleCategory, KeyRules, Lease, MAX_POLICY_SET, OperationDigest, PolicyId,
    PolicyScope, RateLimitFailure, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    ReleaseOutcome, Releasing, SetVerdict, SettleOutcome, Settlement, Settling,
    UnavailableCategory, evaluate_set, inspect_key, settle_set,
};

use crate::error::MemoryAdapterError;
use crate::map::same_bytes;
use crate::store::{KeySlot, MemoryStore, StoreFull};

/// The embedded provider: every algorithm over a sharded [`MemoryStore`].
/// Never blocks on I/O; a decision holds its subject's shard lock only while
/// it reads, decides and writes the keys of its policy set.
#[derive(Debug)]
pub struct MemoryEdgeRateLimitAdapter {
    store: MemoryStore,
    policies: PolicyTable,
    clock: Arc<dyn Clock>,
    failure_retry_after: Duration,
}

#[derive(Debug)]
struct PolicySlot {
    policy: RateLimitPolicy,
    namespace: u32,
    rules: KeyRules,
}

impl MemoryEdgeRateLimitAdapter {
    /// An adapter over a fresh [`MemoryStore`]; errors as [`Self::with_store`].
    pub fn new(
        policies: impl IntoIterator<Item = RateLimitPolicy>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, MemoryAdapterError> {
        Self::with_store(MemoryStore::new(), policies, clock)
    }

    /// An adapter sharing the counters of `store`; refused when two policies
    /// share an id, or there is none.
    pub fn with_store(
        store: MemoryStore,
        policies: impl IntoIterator<Item = RateLimitPolicy>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, MemoryAdapterError> {
        let mut slots = HashMap::new();
        for policy in policies {
            let id = policy.id().clone();
            if slots.contains_key(&id) {
                return Err(MemoryAdapterError::DuplicatePolicy(id));
            }
            let namespace = store.namespace(&id, policy.revision(), policy.ttl_slack_millis());
            let rules = KeyRules::of(&policy);
            slots.insert(id, PolicySlot { policy, namespace, rules });
        }
        if slots.is_empty() {
            return Err(MemoryAdapterError::NoPolicies);
        }
        let policies = PolicyTable::new(slots.into_values());
        Ok(Self { store, policies, clock, failure_retry_after: DEFAULT_FAILURE_RETRY_AFTER })
    }

    /// Sets the retry-after of `Unavailable(AdmissionRejected)` (default 1 s).
    #[must_use]
    pub fn with_failure_retry_after(mut self, retry_after: Duration) -> Self {
        self.failure_retry_after = retry_after;
        self
    }

    /// The store this adapter counts in.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    /// A decision for two or more policies, out of line: a set of one
    /// should not set up the frame of its arrays.
    #[inline(never)]
    fn decide_set(&self, request: &RateLimitRequest) -> RateLimitOutcome {
        let slots = request.resolve(|id| self.policies.get(id), |slot| &slot.policy)?;
        let now = self.now_before(request.deadline)?;
        // A fixed array: slots past the set's length repeat its first, unused.
        let Some(first) = slots.iter().next() else { return incompatible(UNKNOWN) };
        let mut keys = [(first.key(request.operation), &first.rules); MAX_POLICY_SET];
        for (key, slot) in keys.iter_mut().zip(slots.iter()) {
            *key = (slot.key(request.operation), &slot.rules);
        }
        let decided = self.store.with_set(&request.subject, &keys[..slots.len()], now, |members| {
            evaluate_set(members, now, request.cost, request.evaluation_id)
        });
        self.answer(decided)
    }

    /// A decision for a set of one, the usual case: the checks of
    /// [`RateLimitRequest::resolve`] in its order without its array of eight.
    fn decide_one(&self, id: &PolicyId, request: &RateLimitRequest) -> RateLimitOutcome {
        let Some(slot) = self.policies.get(id) else { return incompatible(UNKNOWN) };
        if !slot.policy.admits_cost(request.cost) {
            return incompatible(IncompatibleCategory::CostExceedsMaximum);
        }
        self.decide_slot(slot, request)
    }

    /// The store's part of [`Self::decide_one`], out of line so an early
    /// refusal does not set up its frame.
    #[inline(never)]
    fn decide_slot(&self, slot: &PolicySlot, request: &RateLimitRequest) -> RateLimitOutcome {
        let now = self.now_before(request.deadline)?;
        let key = (slot.key(request.operation), &slot.rules);
        let decided = self.store.with_one(&request.subject, key, now, |members| {
            evaluate_set(members, now, request.cost, request.evaluation_id)
        });
        self.answer(decided)
    }

    /// [`EdgeRateLimitPort::settle`]'s work, over the keys a decision charges.
    fn settle_now(&self, settlement: &Settlement<'_>) -> SettleOutcome {
        settlement.check()?;
        let request = &settlement.request;
        let slots = request.known(|id| self.policies.get(id))?;
        let now = self.now_before(request.deadline)?;
        let Some(first) = slots.iter().next() else { return Err(UNKNOWN_POLICY) };
        let mut keys = [(first.key(request.operation), &first.rules); MAX_POLICY_SET];
        for (key, slot) in keys.iter_mut().zip(slots.iter()) {
            *key = (slot.key(request.operation), &slot.rules);
        }
        let settled = self.store.with_set(&request.subject, &keys[..slots.len()], now, |members| {
            settle_set(members, now, settlement)
        });
        settled.map_or_else(|StoreFull| Err(self.not_admitted()), Into::into)
    }

    /// The algorithms' time (epoch ms), from the clock read that also checks the deadline.
    fn now_before(&self, deadline: Instant) -> Result<u64, RateLimitFailure> {
        let (monotonic, now) = self.clock.read_both();
        if monotonic >= deadline {
            return Err(self.not_admitted());
        }
        Ok(now)
    }

    /// A full store with every key in use charges nothing and fails closed,
    /// as an evaluation not admitted in time.
    fn answer(&self, decided: Result<SetVerdict, StoreFull>) -> RateLimitOutcome {
        decided.map_or_else(|StoreFull| Err(self.not_admitted()), Into::into)
    }

    fn not_admitted(&self) -> RateLimitFailure {
        RateLimitFailure::Unavailable {
            category: UnavailableCategory::AdmissionRejected,
            retry_after: self.failure_retry_after,
        }
    }

    /// A budget's policy and the key slot a decision charges for it.
    fn budget_slot(&self, key: &BudgetKey) -> Result<(&PolicySlot, KeySlot), BudgetFailure> {
        let slot = self.policies.get(&key.policy).ok_or(BudgetFailure::UnknownPolicy)?;
        let operation = key.operation_for(&slot.policy)?.copied();
        Ok((slot, KeySlot::new(slot.namespace, operation)))
    }
}

const UNKNOWN: IncompatibleCategory = IncompatibleCategory::UnknownPolicy;
const UNKNOWN_POLICY: RateLimitFailure = RateLimitFailure::Incompatible { category: UNKNOWN };

fn incompatible(category: IncompatibleCategory) -> RateLimitOutcome {
    Err(RateLimitFailure::Incompatible { category })
}

impl PolicySlot {
    /// The slot of this policy's key for a request of `operation`.
    fn key(&self, operation: OperationDigest) -> KeySlot {
        let operation = match self.policy.scope() {
            PolicyScope::Operation => Some(operation),
            PolicyScope::Subject => None,
        };
        KeySlot::new(self.namespace, operation)
    }
}

/// The adapter's policies by id: up to [`SCANNED_POLICIES`] scanned
/// (cheaper than hashing the id on every decision), more through a map.
#[derive(Debug)]
struct PolicyTable {
    slots: Box<[PolicySlot]>,
    /// Positions in `slots`; empty when the table is scanned.
    index: HashMap<PolicyId, usize>,
}

const SCANNED_POLICIES: usize = 16;

impl PolicyTable {
    fn new(slots: impl IntoIterator<Item = PolicySlot>) -> Self {
        let slots: Box<[PolicySlot]> = slots.into_iter().collect();
        let index = if slots.len() > SCANNED_POLICIES {
            slots.iter().enumerate().map(|(at, slot)| (slot.policy.id().clone(), at)).collect()
        } else {
            HashMap::new()
        };
        Self { slots, index }
    }

    #[inline]
    fn get(&self, id: &PolicyId) -> Option<&PolicySlot> {
        if self.index.is_empty() {
            self.slots.iter().find(|slot| same_id(slot.policy.id(), id))
        } else {
            self.hashed(id)
        }
    }

    /// Out of line, so a scan's callers do not set up a hash look-up's frame.
    #[inline(never)]
    fn hashed(&self, id: &PolicyId) -> Option<&PolicySlot> {
        self.index.get(id).map(|&at| &self.slots[at])
    }
}

/// Id equality, the length first; an id cloned from the policy's own shares
/// its text, and the address says so without reading the bytes.
fn same_id(held: &PolicyId, asked: &PolicyId) -> bool {
    let (held, asked) = (held.as_str().as_bytes(), asked.as_str().as_bytes());
    held.len() == asked.len() && (std::ptr::eq(held, asked) || same_bytes(held, asked))
}

#[async_trait]
impl EdgeRateLimitPort for MemoryEdgeRateLimitAdapter {
    /// Answered at once: nothing in a decision waits.
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation {
        Evaluation::ready(match request.policies.ids() {
            [id] => self.decide_one(id, &request),
            _ => self.decide_set(&request),
        })
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.policies.get(id).map(|slot| &slot.policy)
    }

    /// Always ready: the store is this process's memory.
    async fn is_ready(&self) -> bool {
        true
    }

    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        let (slot, at) = self.budget_slot(key)?;
        let now = self.clock.epoch_millis();
        let state = self.store.peek(at, &key.subject, now);
        inspect_key(&slot.rules, state.as_ref(), now)
    }

    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        let (_, at) = self.budget_slot(key)?;
        self.store.remove(at, &key.subject);
        Ok(())
    }

    /// Removes the lease from the key of each concurrency policy of its set
    /// this adapter holds (a policy reloaded away has no key here).
    fn release(&self, lease: &Lease) -> Releasing {
        let held = lease.policies.ids().iter().filter_map(|id| self.policies.get(id));
        let slots =
            held.filter(|slot| slot.rules.holds_leases()).map(|slot| slot.key(lease.operation));
        let released =
            self.store.release(&lease.subject, slots, lease.id, self.clock.epoch_millis());
        Releasing::ready(if released { ReleaseOutcome::Released } else { ReleaseOutcome::NotHeld })
    }

    /// Answered at once, as a decision.
    fn settle(&self, settlement: Settlement<'_>) -> Settling {
        Settling::ready(self.settle_now(&settlement))
    }
}

#[cfg(test)]
mod tests {
    use shared_contract::{Algorithm, SystemClock};

    use super::*;

    #[test]
    fn id_bytes_compare_as_equality_does_at_every_length() {
        for n in 0..40 {
            let a: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(same_bytes(&a, &a.clone()), "{n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] = b'-';
                assert!(!same_bytes(&a, &b), "{n} differing at {at}");
            }
        }
    }

    #[test]
    fn the_policy_table_finds_every_policy_scanned_or_hashed() {
        let policy = |n: usize| {
            let window = Duration::from_secs(1);
            RateLimitPolicy::builder(
                format!("p{n}"),
                Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 5, window }),
            )
            .build()
            .unwrap()
        };
        for count in [1, SCANNED_POLICIES, SCANNED_POLICIES + 1] {
            let adapter =
                MemoryEdgeRateLimitAdapter::new((0..count).map(policy), Arc::new(SystemClock))
                    .unwrap();
            for n in 0..count {
                let id = PolicyId::new(format!("p{n}")).unwrap();
                assert_eq!(adapter.policy(&id).map(RateLimitPolicy::id), Some(&id), "{count}");
            }
            assert!(adapter.policy(&PolicyId::new("p").unwrap()).is_none());
        }
    }
}
