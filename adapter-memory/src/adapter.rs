//! `MemoryEdgeRateLimitAdapter`: the in-process provider behind the port.

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shared_contract::{
    Clock, EdgeRateLimitPort, IncompatibleCategory, KeyRules, PolicyId, RateLimitOutcome,
    RateLimitPolicy, RateLimitRequest, UnavailableCategory,
};

use crate::error::MemoryAdapterError;
use crate::store::MemoryStore;

/// The embedded rate-limit provider: the three algorithms over a sharded
/// in-process [`MemoryStore`], with the same clock-regression and dedupe
/// semantics as every other provider. Never blocks on I/O; a decision holds
/// one shard lock, only while it reads, decides and writes its key.
#[derive(Debug)]
pub struct MemoryEdgeRateLimitAdapter {
    store: MemoryStore,
    policies: HashMap<PolicyId, PolicySlot>,
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
    /// An adapter over a fresh [`MemoryStore`].
    ///
    /// # Errors
    /// [`MemoryAdapterError::DuplicatePolicy`] when two policies share an id,
    /// [`MemoryAdapterError::NoPolicies`] when there is none.
    pub fn new(
        policies: impl IntoIterator<Item = RateLimitPolicy>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, MemoryAdapterError> {
        Self::with_store(MemoryStore::new(), policies, clock)
    }

    /// An adapter over an existing store, whose counters it shares with
    /// every other adapter built over that store.
    ///
    /// # Errors
    /// As [`MemoryEdgeRateLimitAdapter::new`].
    pub fn with_store(
        store: MemoryStore,
        policies: impl IntoIterator<Item = RateLimitPolicy>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, MemoryAdapterError> {
        let mut slots = HashMap::new();
        for policy in policies {
            match slots.entry(policy.id().clone()) {
                MapEntry::Occupied(taken) => {
                    return Err(MemoryAdapterError::DuplicatePolicy(taken.key().clone()));
                }
                MapEntry::Vacant(free) => {
                    let namespace = store.namespace(policy.id(), policy.revision());
                    let rules = KeyRules::of(&policy);
                    free.insert(PolicySlot { policy, namespace, rules });
                }
            }
        }
        if slots.is_empty() {
            return Err(MemoryAdapterError::NoPolicies);
        }
        Ok(Self { store, policies: slots, clock, failure_retry_after: Duration::from_secs(1) })
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

    /// The whole evaluation; synchronous because nothing in it waits.
    fn decide(&self, request: &RateLimitRequest) -> RateLimitOutcome {
        let Some(slot) = self.policies.get(&request.policy_id) else {
            return RateLimitOutcome::Incompatible {
                category: IncompatibleCategory::UnknownPolicy,
            };
        };
        if request.cost == 0 || request.cost > slot.policy.maximum_cost() {
            return RateLimitOutcome::Incompatible {
                category: IncompatibleCategory::CostExceedsMaximum,
            };
        }
        if self.clock.monotonic() >= request.deadline {
            return RateLimitOutcome::Unavailable {
                category: UnavailableCategory::AdmissionRejected,
                retry_after: self.failure_retry_after,
            };
        }
        let now = self.clock.epoch_millis();
        self.store.with_entry(slot.namespace, request.subject.as_str(), now, |entry| {
            entry.evaluate(&slot.rules, now, request.cost, request.evaluation_id)
        })
    }
}

#[async_trait]
impl EdgeRateLimitPort for MemoryEdgeRateLimitAdapter {
    async fn evaluate(&self, request: RateLimitRequest) -> RateLimitOutcome {
        self.decide(&request)
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.policies.get(id).map(|slot| &slot.policy)
    }

    /// Always ready: the store is this process's memory.
    async fn is_ready(&self) -> bool {
        true
    }
}
