//! A whole provider in one file, built only on public items of
//! `shared-contract`, passing the whole contract suite. It is the example
//! docs/adding-a-provider.md walks through: copy it into a new crate and
//! replace `CasStore` with a real compare-and-set store (a PostgreSQL row
//! with a version column, a DynamoDB item with a condition expression).
//!
//! The provider does what the port asks in the order of docs/algorithms.md:
//! the set's policies and cost, deadline, then a compare-and-set loop around
//! the shared decision step `evaluate_set`: load every key of the set ->
//! step -> compare-and-set every new state with the version it was loaded
//! at, all or nothing -> on a conflict, load again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use contract_tests::{ProviderFactory, StoreScope};
use shared_contract::{
    BudgetFailure, BudgetKey, BudgetState, Clock, EdgeRateLimitPort, Evaluation, KeyRules,
    KeyState, Lease, ManualClock, OperationDigest, PolicyId, PolicyScope, RateLimitFailure,
    RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest, ReleaseOutcome,
    Releasing, SetEntries, SetMember, SettleOutcome, Settlement, Settling, SubjectDigest,
    UnavailableCategory, evaluate_set, inspect_key, settle_set,
};

// ---- The store: what a real backend gives you --------------------------

/// One stored key: its state, the version it was written at and its
/// absolute expiry (epoch ms). A real store would serialize `KeyState`
/// field by field (see `KeyState`, `AlgorithmState`, `DedupRecords::iter`).
#[derive(Debug)]
struct Stored {
    version: u64,
    state: KeyState,
    expires_at: u64,
}

/// A compare-and-set key-value store: one mutex around a map, standing in
/// for a database. Versions start at 1; 0 means "absent".
#[derive(Debug, Default)]
struct CasStore {
    keys: Mutex<HashMap<String, Stored>>,
}

impl CasStore {
    fn keys(&self) -> MutexGuard<'_, HashMap<String, Stored>> {
        // A panicking test thread must not take the other checks with it.
        self.keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The key's version and state. A key past its expiry at `now` reads as
    /// absent but keeps its version, so a write over it is still checked.
    fn get(&self, key: &str, now: u64) -> (u64, Option<KeyState>) {
        let (version, live) = self.get_with_expiry(key, now);
        (version, live.map(|(state, _)| state))
    }

    /// [`Self::get`] with the key's expiry, for a write that must keep it
    /// (a release).
    fn get_with_expiry(&self, key: &str, now: u64) -> (u64, Option<(KeyState, u64)>) {
        match self.keys().get(key) {
            Some(stored) if stored.expires_at > now => {
                (stored.version, Some((stored.state.clone(), stored.expires_at)))
            }
            Some(stored) => (stored.version, None),
            None => (0, None),
        }
    }

    /// Writes `state` only if the key is still at `expected`; false when
    /// another writer came first.
    fn compare_and_set(&self, key: &str, expected: u64, state: KeyState, expires_at: u64) -> bool {
        self.compare_and_set_all(vec![Write { key: key.to_owned(), expected, state, expires_at }])
    }

    /// Makes the key read as absent (an operator's reset). The version
    /// still moves on, as every write's does: an evaluation that loaded
    /// the key before the reset must lose its compare-and-set, and a plain
    /// delete back to version 0 could let it win once the key is written
    /// again (ABA). A database would write a tombstone row or keep a
    /// version counter beside the key.
    fn reset(&self, key: &str) {
        if let Some(stored) = self.keys().get_mut(key) {
            stored.version += 1;
            stored.expires_at = 0;
        }
    }

    /// Writes every one of `writes` only if each key is still at its
    /// expected version: all or nothing, as a transaction would.
    fn compare_and_set_all(&self, writes: Vec<Write>) -> bool {
        let mut keys = self.keys();
        let current = |key: &str| keys.get(key).map_or(0, |stored| stored.version);
        if writes.iter().any(|write| current(&write.key) != write.expected) {
            return false;
        }
        for Write { key, expected, state, expires_at } in writes {
            keys.insert(key, Stored { version: expected + 1, state, expires_at });
        }
        true
    }
}

/// One key's new state, conditional on the version it was loaded at.
#[derive(Debug)]
struct Write {
    key: String,
    expected: u64,
    state: KeyState,
    expires_at: u64,
}

// ---- The provider: EdgeRateLimitPort over the store ---------------------

/// A policy and its rules compiled once for the step.
#[derive(Debug)]
struct Slot {
    policy: RateLimitPolicy,
    rules: KeyRules,
}

#[derive(Debug)]
struct CasProvider {
    store: Arc<CasStore>,
    policies: HashMap<PolicyId, Slot>,
    clock: Arc<dyn Clock>,
}

/// What `Unavailable(AdmissionRejected)` tells the caller to wait.
const FAILURE_RETRY_AFTER: Duration = Duration::from_secs(1);

impl CasProvider {
    fn new(store: Arc<CasStore>, policies: Vec<RateLimitPolicy>, clock: Arc<dyn Clock>) -> Self {
        let policies = policies
            .into_iter()
            .map(|policy| {
                let rules = KeyRules::of(&policy);
                (policy.id().clone(), Slot { policy, rules })
            })
            .collect();
        Self { store, policies, clock }
    }

    /// A reload: the new policy table over this provider's store and clock,
    /// so every budget carries over. app-bootstrap keeps what this needs
    /// (the store) in its `ProviderState` and calls this from
    /// `port_with_policies`.
    fn with_policies(&self, policies: Vec<RateLimitPolicy>) -> Self {
        Self::new(Arc::clone(&self.store), policies, Arc::clone(&self.clock))
    }
}

impl CasProvider {
    /// The key of one policy for this request: per subject, plus the
    /// operation for an operation-scoped policy; a new revision starts
    /// afresh.
    fn key(policy: &RateLimitPolicy, request: &RateLimitRequest) -> String {
        let operation = match policy.scope() {
            PolicyScope::Subject => None,
            PolicyScope::Operation => Some(&request.operation),
        };
        Self::key_of(policy, &request.subject, operation)
    }

    /// The one key layout `evaluate`, `inspect` and `reset` share.
    fn key_of(
        policy: &RateLimitPolicy,
        subject: &SubjectDigest,
        operation: Option<&OperationDigest>,
    ) -> String {
        let (id, revision) = (policy.id(), policy.revision());
        match operation {
            None => format!("{subject}:{id}:{revision}"),
            Some(operation) => format!("{subject}:{id}:{revision}:{operation}"),
        }
    }

    /// The whole evaluation; nothing in it waits.
    fn decide(&self, request: &RateLimitRequest) -> RateLimitOutcome {
        // Step 1 of docs/algorithms.md for the whole set reads no state.
        let slots = request.resolve(|id| self.policies.get(id), |slot| &slot.policy)?;
        self.before(request.deadline)?;
        let (cost, id) = (request.cost, request.evaluation_id);
        self.commit(&slots, request, |members, now| evaluate_set(members, now, cost, id)).into()
    }

    /// A settle runs the same way over the same keys, with the settle step.
    fn settle_now(&self, settlement: &Settlement) -> SettleOutcome {
        settlement.check()?;
        let request = &settlement.request;
        let slots = request.known(|id| self.policies.get(id))?;
        self.before(request.deadline)?;
        self.commit(&slots, request, |members, now| settle_set(members, now, settlement)).into()
    }

    /// Step 2: a passed deadline reads no state either.
    fn before(&self, deadline: Instant) -> Result<(), RateLimitFailure> {
        if self.clock.monotonic() >= deadline {
            return Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::AdmissionRejected,
                retry_after: FAILURE_RETRY_AFTER,
            });
        }
        Ok(())
    }

    /// Loads the set's keys, runs `step` over them at `now`, and writes
    /// every key it changed together, or none, deciding again on a conflict.
    fn commit<V>(
        &self,
        slots: &SetEntries<'_, Slot>,
        request: &RateLimitRequest,
        step: impl Fn(&mut [SetMember<'_>], u64) -> V,
    ) -> V {
        let keys: Vec<String> = slots.iter().map(|slot| Self::key(&slot.policy, request)).collect();
        let now = self.clock.epoch_millis();
        loop {
            let loaded: Vec<_> = keys.iter().map(|key| self.store.get(key, now)).collect();
            let mut members: Vec<_> = slots
                .iter()
                .zip(&loaded)
                .map(|(slot, (_, state))| SetMember::new(&slot.rules, state.clone()))
                .collect();
            let verdict = step(&mut members, now);
            let writes: Vec<Write> = members
                .into_iter()
                .zip(&keys)
                .zip(&loaded)
                .filter_map(|((member, key), (version, _))| {
                    let write = member.write?;
                    let state = member.state?;
                    Some(Write {
                        key: key.clone(),
                        expected: *version,
                        state,
                        expires_at: write.expires_at,
                    })
                })
                .collect();
            // A denial without a write, a replay or a refusal rests on what
            // was read; otherwise every key commits together or none does.
            if writes.is_empty() || self.store.compare_and_set_all(writes) {
                return verdict;
            }
            // Another evaluation wrote first: decide again on its state. A
            // real backend would also give up (Indeterminate or Unavailable)
            // once the request's deadline has passed.
        }
    }

    /// A budget's policy slot and key; the scope check reads no state.
    fn budget(&self, key: &BudgetKey) -> Result<(&Slot, String), BudgetFailure> {
        let slot = self.policies.get(&key.policy).ok_or(BudgetFailure::UnknownPolicy)?;
        let operation = key.operation_for(&slot.policy)?;
        Ok((slot, Self::key_of(&slot.policy, &key.subject, operation)))
    }
}

#[async_trait]
impl EdgeRateLimitPort for CasProvider {
    /// Answered at once: nothing here waits. A backend over the network
    /// answers `Evaluation::pending` with a future that owns what it needs.
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation {
        Evaluation::ready(self.decide(&request))
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.policies.get(id).map(|slot| &slot.policy)
    }

    /// Always ready: the store is in this process. A real backend pings it.
    async fn is_ready(&self) -> bool {
        true
    }

    /// Reads the key and runs the shared step spared: nothing is written.
    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        let (slot, key) = self.budget(key)?;
        let now = self.clock.epoch_millis();
        let (_, state) = self.store.get(&key, now);
        inspect_key(&slot.rules, state.as_ref(), now)
    }

    /// State and dedupe records live in one `KeyState`, so one reset
    /// forgets both.
    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        let (_, key) = self.budget(key)?;
        self.store.reset(&key);
        Ok(())
    }

    /// For each concurrency policy of the lease's set held now: load its
    /// key, drop the lease from `KeyState::leases`, and compare-and-set the
    /// key at the version it was loaded at, keeping its expiry; on a
    /// conflict, load again.
    fn release(&self, lease: &Lease) -> Releasing {
        let now = self.clock.epoch_millis();
        let mut released = false;
        let slots = lease.policies.ids().iter().filter_map(|id| self.policies.get(id));
        for slot in slots.filter(|slot| slot.rules.holds_leases()) {
            let operation = match slot.policy.scope() {
                PolicyScope::Subject => None,
                PolicyScope::Operation => Some(&lease.operation),
            };
            let key = Self::key_of(&slot.policy, &lease.subject, operation);
            loop {
                let (version, live) = self.store.get_with_expiry(&key, now);
                let Some((mut state, expires_at)) = live else { break };
                if !state.leases.release(lease.id, now) {
                    break;
                }
                if self.store.compare_and_set(&key, version, state, expires_at) {
                    released = true;
                    break;
                }
            }
        }
        Releasing::ready(if released { ReleaseOutcome::Released } else { ReleaseOutcome::NotHeld })
    }

    /// Answered at once, as an evaluation.
    fn settle(&self, settlement: Settlement) -> Settling {
        Settling::ready(self.settle_now(&settlement))
    }
}

// ---- The contract suite -------------------------------------------------

/// One store per scope: providers built over the same scope share state, a
/// new scope starts empty (the `ProviderFactory` contract).
#[derive(Default)]
struct CasFactory {
    stores: Mutex<HashMap<StoreScope, Arc<CasStore>>>,
}

#[async_trait]
impl ProviderFactory for CasFactory {
    async fn build(
        &self,
        scope: &StoreScope,
        clock: ManualClock,
        policies: Vec<RateLimitPolicy>,
    ) -> Arc<dyn EdgeRateLimitPort> {
        let store = {
            let mut stores = self.stores.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            Arc::clone(stores.entry(scope.clone()).or_default())
        };
        Arc::new(CasProvider::new(store, policies, Arc::new(clock)))
    }
}

contract_tests::contract_suite!(CasFactory::default());

/// The loop above is only as safe as the store's compare-and-set: a write
/// at a stale version must be refused, and an expired key keeps its version.
#[test]
fn the_store_refuses_a_write_at_a_stale_version() {
    use shared_contract::{AlgorithmState, DedupRecords, Leases};

    let store = CasStore::default();
    let state = |count| KeyState {
        mark: 10,
        algorithm: AlgorithmState::FixedWindow(shared_contract::FixedWindowState {
            window_start: 0,
            count,
        }),
        records: DedupRecords::default(),
        leases: Leases::default(),
    };
    assert_eq!(store.get("k", 10), (0, None));
    assert!(store.compare_and_set("k", 0, state(1), 100));
    // A second writer that loaded the absent key loses.
    assert!(!store.compare_and_set("k", 0, state(9), 100));
    assert_eq!(store.get("k", 10), (1, Some(state(1))));
    // Past its expiry the key reads as absent, still at version 1.
    assert_eq!(store.get("k", 100), (1, None));
    assert!(!store.compare_and_set("k", 0, state(1), 200));
    assert!(store.compare_and_set("k", 1, state(1), 200));
    // A reset reads as absent and moves the version on: a writer that
    // loaded before it (version 2) loses, as does one that saw it absent
    // before it was ever written (version 0).
    store.reset("k");
    assert_eq!(store.get("k", 10), (3, None));
    assert!(!store.compare_and_set("k", 2, state(5), 200));
    assert!(!store.compare_and_set("k", 0, state(5), 200));
    assert!(store.compare_and_set("k", 3, state(1), 200));
}

/// A reload keeps every budget: the provider built by `with_policies` over
/// a new policy table reads the counters the old one wrote, and a policy
/// only the new table holds is evaluated afresh.
#[tokio::test]
async fn a_reload_keeps_every_budget() {
    use shared_contract::{Algorithm, EvaluationId, PolicySet};

    let policy = |id: &str| {
        let algorithm = Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 1,
            window: Duration::from_secs(60),
        });
        RateLimitPolicy::builder(id, algorithm).build().expect("a valid policy")
    };
    let clock = ManualClock::new(1_000);
    let request = |id: &str| RateLimitRequest {
        policies: PolicySet::single(PolicyId::new(id).expect("a valid id")).into(),
        subject: SubjectDigest::parse(format!("v1:{:032x}", 7)).expect("a valid digest"),
        operation: OperationDigest::from_u64(0x0123_4567_89ab_cdef),
        cost: 1,
        evaluation_id: EvaluationId::random(),
        deadline: clock.monotonic() + Duration::from_secs(5),
    };
    let before =
        CasProvider::new(Arc::new(CasStore::default()), vec![policy("p")], Arc::new(clock.clone()));
    assert!(before.evaluate(request("p")).await.is_allowed(), "the one request p allows");
    let after = before.with_policies(vec![policy("p"), policy("q")]);
    assert!(!after.evaluate(request("p")).await.is_allowed(), "p's count survived the reload");
    assert!(after.evaluate(request("q")).await.is_allowed(), "q starts afresh");
}
