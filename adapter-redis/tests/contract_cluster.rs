//! The provider-neutral contract suite against a real Redis Cluster (three
//! masters, one replica each; one cluster for this test binary, one key
//! prefix per scope), plus the cluster's own promises: the suite's keys are
//! spread over every master, every key a script touches for one subject
//! hashes to one slot, and no script raises `CROSSSLOT`.
//!
//! The Cluster hash tag is the subject alone, and the suite names almost
//! only two subjects, so its keys would fall into two slots. Each scope's
//! provider therefore sees its own pseudonym of every subject
//! ([`ScopedSubjects`]): the same subject stays the same subject inside a
//! check, and the checks' keys spread over every master.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use adapter_redis::{RateLimitKeys, RedisEdgeRateLimitAdapter, RedisSettings, Topology};
use async_trait::async_trait;
use contract_tests::{ProviderFactory, StoreScope};
use redis_fixture::RedisCluster;
use shared_contract::{
    Algorithm, BudgetFailure, BudgetKey, BudgetState, EdgeRateLimitPort, Evaluation,
    EvaluationDedupPolicy, Lease, ManualClock, PolicyId, PolicyScope, RateLimitOutcomeExt,
    RateLimitPolicy, RateLimitRequest, ReleaseOutcome, Releasing, Settlement, Settling,
    SubjectDigest,
};

fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

fn settings(scope: &str) -> RedisSettings {
    RedisSettings {
        topology: Topology::Cluster,
        urls: cluster().urls(),
        key_prefix: format!("ca:rl:t:{scope}:"),
        // Generous: the suite checks semantics, and CI machines are busy.
        command_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..RedisSettings::default()
    }
}

/// Builds a fresh cluster adapter (its own cluster connection, on the
/// calling test's runtime) whose keys live under `ca:rl:t:<scope>:`. With
/// `seen`, the provider also records the key of every request it evaluates.
#[derive(Default)]
struct ClusterFactory {
    seen: Option<Arc<Mutex<BTreeSet<String>>>>,
    /// Scopes in the order first built. With `seen`, the pseudonyms of a
    /// scope are salted with its ordinal here instead of the scope itself:
    /// a scope holds the pid and the start time, so salted by it the slot
    /// layout changed every run and the spread check below passed only by
    /// luck (it failed once in five runs with no key on one master). By
    /// ordinal the layout is the same on every run, one scope keeps one
    /// mapping across rebuilds (the revision check rebuilds), and the key
    /// prefix still keeps the scopes apart.
    scopes: Mutex<Vec<String>>,
}

#[async_trait]
impl ProviderFactory for ClusterFactory {
    async fn build(
        &self,
        scope: &StoreScope,
        clock: ManualClock,
        policies: Vec<RateLimitPolicy>,
    ) -> Arc<dyn EdgeRateLimitPort> {
        let adapter = match RedisEdgeRateLimitAdapter::new(
            settings(scope.as_str()),
            policies,
            Arc::new(clock),
        ) {
            Ok(adapter) => adapter,
            Err(error) => panic!("the redis adapter rejected the check's settings: {error}"),
        };
        let inner: Arc<dyn EdgeRateLimitPort> = match &self.seen {
            None => Arc::new(adapter),
            Some(seen) => Arc::new(KeyRecorder { adapter, seen: seen.clone() }),
        };
        // Outermost, so the recorder notes the keys the adapter really uses.
        let salt = match self.seen {
            None => scope.as_str().to_owned(),
            Some(_) => {
                let mut scopes = self.scopes.lock().unwrap();
                let ordinal = match scopes.iter().position(|known| known == scope.as_str()) {
                    Some(ordinal) => ordinal,
                    None => {
                        scopes.push(scope.as_str().to_owned());
                        scopes.len() - 1
                    }
                };
                format!("spread-{ordinal}")
            }
        };
        Arc::new(ScopedSubjects { scope: salt, inner })
    }
}

/// Rewrites each request's subject to a pseudonym of (scope, subject), so
/// that every scope spreads its subjects over other slots than the next.
/// The mapping is deterministic, so a subject keeps one pseudonym (and one
/// budget) for the whole check, and two subjects never share one.
struct ScopedSubjects {
    scope: String,
    inner: Arc<dyn EdgeRateLimitPort>,
}

impl std::fmt::Debug for ScopedSubjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopedSubjects").field("scope", &self.scope).finish_non_exhaustive()
    }
}

impl ScopedSubjects {
    /// `v1:` and 128 bits: two 64-bit FNV-1a hashes of scope and subject
    /// with different offset bases. FNV, not `DefaultHasher`, because its
    /// output is fixed by its definition, so a failing slot layout
    /// reproduces on every toolchain.
    fn pseudonym(&self, subject: &SubjectDigest) -> SubjectDigest {
        let fnv = |basis: u64| {
            let text = subject.to_string();
            let input = self.scope.bytes().chain([0]).chain(text.bytes());
            input.fold(basis, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        };
        let (high, low) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142));
        SubjectDigest::parse(format!("v1:{high:016x}{low:016x}"))
            .expect("v1: and 32 lowercase hex digits is a valid pseudonym")
    }
}

#[async_trait]
impl EdgeRateLimitPort for ScopedSubjects {
    fn evaluate(&self, mut request: RateLimitRequest) -> Evaluation {
        request.subject = self.pseudonym(&request.subject);
        self.inner.evaluate(request)
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.inner.policy(id)
    }

    async fn is_ready(&self) -> bool {
        self.inner.is_ready().await
    }

    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        let key = BudgetKey { subject: self.pseudonym(&key.subject), ..key.clone() };
        self.inner.inspect(&key).await
    }

    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        let key = BudgetKey { subject: self.pseudonym(&key.subject), ..key.clone() };
        self.inner.reset(&key).await
    }

    fn release(&self, lease: &Lease) -> Releasing {
        let lease = Lease { subject: self.pseudonym(&lease.subject), ..lease.clone() };
        self.inner.release(&lease)
    }

    fn settle(&self, mut settlement: Settlement<'_>) -> Settling {
        settlement.request.subject = self.pseudonym(&settlement.request.subject);
        self.inner.settle(settlement)
    }
}

/// Passes every call through and notes the key each evaluation touches.
#[derive(Debug)]
struct KeyRecorder {
    adapter: RedisEdgeRateLimitAdapter,
    seen: Arc<Mutex<BTreeSet<String>>>,
}

#[async_trait]
impl EdgeRateLimitPort for KeyRecorder {
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation {
        for id in request.policies.ids() {
            if let Some(policy) = self.adapter.policy(id) {
                let keys = self.adapter.keys();
                let key = keys.counter_key(policy, &request.subject, &request.operation);
                self.seen.lock().unwrap().insert(key);
            }
        }
        self.adapter.evaluate(request)
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.adapter.policy(id)
    }

    async fn is_ready(&self) -> bool {
        self.adapter.is_ready().await
    }

    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        self.adapter.inspect(key).await
    }

    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        self.adapter.reset(key).await
    }

    fn release(&self, lease: &Lease) -> Releasing {
        self.adapter.release(lease)
    }

    /// The same keys as the reservation's evaluation, already noted.
    fn settle(&self, settlement: Settlement<'_>) -> Settling {
        self.adapter.settle(settlement)
    }
}

mod suite {
    use super::ClusterFactory;

    contract_tests::contract_suite!(ClusterFactory::default());
}

/// The suite's keys land on every master, so the suite proves the provider
/// on all three shards, not on one by luck: a sample of its checks runs with
/// a recording factory, each key's slot is asked of the cluster
/// (`CLUSTER KEYSLOT`), and every master must own some of them and hold
/// data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_s_keys_are_spread_over_every_master() {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let factory = ClusterFactory { seen: Some(seen.clone()), ..ClusterFactory::default() };
    contract_tests::subjects_are_isolated(&factory).await;
    contract_tests::policies_are_isolated(&factory).await;
    contract_tests::policy_revisions_are_isolated(&factory).await;
    contract_tests::dedupe_records_are_per_subject_and_policy(&factory).await;
    contract_tests::dedupe_replay_works_for_every_algorithm(&factory).await;
    contract_tests::clock_regression_within_the_bound_applies_to_every_algorithm(&factory).await;
    let cluster = cluster();
    let keys = seen.lock().unwrap().clone();
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    for key in &keys {
        let slot = cluster.keyslot(key);
        *per_master.entry(cluster.owner_of_slot(slot)).or_default() += 1;
    }
    let masters: BTreeSet<u16> = cluster.masters().iter().map(|master| master.port).collect();
    assert_eq!(masters.len(), 3);
    assert_eq!(
        per_master.keys().copied().collect::<BTreeSet<_>>(),
        masters,
        "{} keys by master: {per_master:?}",
        keys.len()
    );
    for master in masters {
        assert!(cluster.dbsize(master) > 0, "master {master} holds no key");
    }
}

fn subject(n: u8) -> SubjectDigest {
    SubjectDigest::parse(format!("v1:{}", format!("{n:02x}").repeat(16))).unwrap()
}

/// Every key a script touches for one subject is `KEYS[1]`, the counter key
/// (the scripts call `GET`/`SET` on `KEYS[1]` only); any other key of the
/// subject must share its `{...}` hash tag, so they all hash to one slot.
/// The cluster itself computes the slots.
#[test]
fn every_key_of_one_subject_hashes_to_one_slot() {
    let cluster = cluster();
    let keys = RateLimitKeys::new("ca:rl:");
    for (n, algorithm) in [
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_secs(1),
        }),
        Algorithm::SlidingCounter(shared_contract::SlidingCounter {
            limit: 3,
            window: Duration::from_secs(1),
        }),
        Algorithm::TokenBucket(shared_contract::TokenBucket {
            capacity: 3,
            refill_tokens: 1,
            refill_period: Duration::from_secs(1),
        }),
        Algorithm::Gcra(shared_contract::Gcra {
            limit: 3,
            period: Duration::from_secs(1),
            burst: 3,
        }),
        Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 3,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
        }),
    ]
    .into_iter()
    .enumerate()
    {
        let policy = RateLimitPolicy::builder(format!("p{n}"), algorithm).build().unwrap();
        let who = subject(u8::try_from(n).unwrap());
        let tag = RateLimitKeys::hash_tag(&who);
        let counter = keys.counter_key(
            &policy,
            &who,
            &shared_contract::OperationDigest::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
        );
        let slot = cluster.keyslot(&counter);
        // The tag alone, another prefix, and a would-be auxiliary key.
        for related in [tag.clone(), format!("other:{tag}"), format!("{counter}:dedupe")] {
            assert_eq!(cluster.keyslot(&related), slot, "{related}");
        }
    }
    // Every key of a set shares the subject's tag: one slot whatever the
    // policy, scope or operation.
    let who = subject(9);
    let scoped = |id: &str, scope| {
        let window = Duration::from_secs(1);
        RateLimitPolicy::builder(
            id,
            Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 1, window }),
        )
        .scope(scope)
        .build()
        .unwrap()
    };
    let operation = shared_contract::OperationDigest::from_u64(0x0123_4567_89ab_cdef);
    let slot = cluster.keyslot(&RateLimitKeys::hash_tag(&who));
    for policy in [scoped("a", PolicyScope::Operation), scoped("b", PolicyScope::Subject)] {
        assert_eq!(cluster.keyslot(&keys.counter_key(&policy, &who, &operation)), slot);
    }
}

/// Every script runs on every master, with dedupe on and off, and
/// none answers `CROSSSLOT` (or any error): each evaluation is a decision,
/// and each lease's release (`lua/release.lua`, over a set's two lease
/// keys too) frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_script_raises_crossslot_on_any_master() {
    let cluster = cluster();
    let window = Duration::from_secs(1);
    let mut policies = Vec::new();
    for (suffix, dedup) in [
        ("off", EvaluationDedupPolicy::Disabled),
        ("on", EvaluationDedupPolicy::enabled_defaults()),
    ] {
        for (name, algorithm) in [
            ("fw", Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 100, window })),
            (
                "sc",
                Algorithm::SlidingCounter(shared_contract::SlidingCounter { limit: 100, window }),
            ),
            (
                "tb",
                Algorithm::TokenBucket(shared_contract::TokenBucket {
                    capacity: 100,
                    refill_tokens: 1,
                    refill_period: window,
                }),
            ),
            (
                "g",
                Algorithm::Gcra(shared_contract::Gcra { limit: 100, period: window, burst: 100 }),
            ),
        ] {
            policies.push(
                RateLimitPolicy::builder(format!("{name}-{suffix}"), algorithm)
                    .evaluation_dedup(dedup)
                    .build()
                    .unwrap(),
            );
        }
    }
    // A concurrency policy takes no dedupe: the lease id is its own. Two of
    // them, one subject-scoped, so a set's release spans two keys.
    for (name, scope) in [("c", PolicyScope::Operation), ("cs", PolicyScope::Subject)] {
        let leases = Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 100,
            lease_ttl: Duration::from_secs(30),
            retry_after: window,
        });
        policies.push(RateLimitPolicy::builder(name, leases).scope(scope).build().unwrap());
    }
    let clock = ManualClock::new(1_800_000_000_000);
    let adapter = RedisEdgeRateLimitAdapter::new(
        settings("crossslot"),
        policies.clone(),
        Arc::new(clock.clone()),
    )
    .unwrap();
    let mut masters_hit = BTreeSet::new();
    for policy in &policies {
        for n in 0..24 {
            let who = subject(n);
            let key = adapter.keys().counter_key(
                policy,
                &who,
                &shared_contract::OperationDigest::from_u128(
                    0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
                ),
            );
            masters_hit.insert(cluster.owner_of_slot(cluster.keyslot(&key)));
            let request = RateLimitRequest {
                policies: shared_contract::PolicySet::single(policy.id().clone()).into(),
                subject: who,
                operation: shared_contract::OperationDigest::from_u128(
                    0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
                ),
                cost: 1,
                evaluation_id: shared_contract::EvaluationId::random(),
                deadline: shared_contract::Clock::monotonic(&clock) + Duration::from_secs(5),
            };
            let lease = Lease::of(&request);
            let outcome = adapter.evaluate(request).await;
            assert!(outcome.is_allowed(), "{} subject {n}: {outcome:?}", policy.id());
            let released = adapter.release(&lease).await;
            let expected = if matches!(
                policy.algorithm(),
                Algorithm::Concurrency(shared_contract::Concurrency { .. })
            ) {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            };
            assert_eq!(released, expected, "{} subject {n}", policy.id());
        }
    }
    // The set of both lease policies and a fixed window: one policy-set
    // script, one release over both lease keys, on every master.
    for n in 0..24 {
        let who = subject(n);
        let set = shared_contract::PolicySet::new(
            ["fw-off", "c", "cs"].map(|id| shared_contract::PolicyId::new(id).unwrap()),
        )
        .unwrap();
        let request = RateLimitRequest {
            policies: set.into(),
            subject: who,
            operation: shared_contract::OperationDigest::from_u128(
                0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
            ),
            cost: 1,
            evaluation_id: shared_contract::EvaluationId::random(),
            deadline: shared_contract::Clock::monotonic(&clock) + Duration::from_secs(5),
        };
        let lease = Lease::of(&request);
        assert!(adapter.evaluate(request).await.is_allowed());
        assert_eq!(adapter.release(&lease).await, ReleaseOutcome::Released);
    }
    assert_eq!(masters_hit.len(), 3, "the subjects did not reach every master");
}
