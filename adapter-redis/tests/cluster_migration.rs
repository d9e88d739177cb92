//! Slot migration and script loading on a real Redis Cluster (one cluster
//! for this binary; the tests use different masters and subjects): a slot
//! holding a subject moves to another master between evaluations
//! (`CLUSTER SETSLOT ... MIGRATING/IMPORTING`, `MIGRATE`, `SETSLOT NODE`)
//! and its count carries over, with `ASK` followed in the middle and `MOVED`
//! after; a master that never saw the scripts answers `NOSCRIPT` once and
//! the evaluation still succeeds.
//!
//! Every node has the least-privilege user of the ACL lane plus what the
//! cluster client needs (`CLUSTER SLOTS` for the slot map, `ASKING` for an
//! `ASK` redirect), and the adapters here log in as that user, so this lane
//! also proves the cluster's ACL rule, found by testing against these
//! servers with everything else denied.

mod support;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings, ScriptKind, Topology};
use redis_fixture::RedisCluster;
use secrecy::SecretString;
use shared_contract::{
    Algorithm, Clock, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, ManualClock,
    RateLimitFailure, RateLimitPolicy, RateLimitRequest, SubjectDigest,
};
use support::{RATE_LIMIT_PASSWORD, RATE_LIMIT_USER, rate_limit_rules};

const LIMIT: u64 = 10;

fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let cluster = RedisCluster::start();
        for port in cluster.ports() {
            // ACLs are per node: replicas too, for after a failover.
            // Without `+asking` in the cluster rule the ASK step below is
            // refused (checked by removing it).
            set_user(&cluster, port, RATE_LIMIT_USER, &rate_limit_rules(Topology::Cluster));
            set_user(
                &cluster,
                port,
                "standalone-rule-only",
                &rate_limit_rules(Topology::Standalone),
            );
        }
        cluster
    })
}

fn set_user(cluster: &RedisCluster, port: u16, name: &str, rules: &[String]) {
    let mut command = vec!["ACL", "SETUSER", name];
    command.extend(rules.iter().map(String::as_str));
    assert_eq!(cluster.cli(port, &command), "OK", "ACL SETUSER {name} on {port}");
}

fn subject(n: u8) -> SubjectDigest {
    SubjectDigest::parse(format!("v1:{}", format!("{n:02x}").repeat(16))).unwrap()
}

fn policy(id: &str) -> RateLimitPolicy {
    RateLimitPolicy::builder(
        id,
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: LIMIT,
            window: Duration::from_secs(3_600),
        }),
    )
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .unwrap()
}

fn adapter(policy: &RateLimitPolicy, clock: &ManualClock) -> RedisEdgeRateLimitAdapter {
    adapter_as(RATE_LIMIT_USER, policy, clock)
}

fn adapter_as(
    user: &str,
    policy: &RateLimitPolicy,
    clock: &ManualClock,
) -> RedisEdgeRateLimitAdapter {
    let settings = RedisSettings {
        topology: Topology::Cluster,
        urls: cluster().urls(),
        username: Some(user.to_owned()),
        password: Some(SecretString::from(RATE_LIMIT_PASSWORD)),
        command_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..RedisSettings::default()
    };
    RedisEdgeRateLimitAdapter::new(settings, [policy.clone()], Arc::new(clock.clone())).unwrap()
}

async fn remaining(
    adapter: &RedisEdgeRateLimitAdapter,
    clock: &ManualClock,
    policy: &RateLimitPolicy,
    who: &SubjectDigest,
) -> u64 {
    let request = RateLimitRequest {
        policies: shared_contract::PolicySet::single(policy.id().clone()).into(),
        subject: *who,
        operation: support::operation(),
        cost: 1,
        evaluation_id: EvaluationId::random(),
        deadline: clock.monotonic() + Duration::from_secs(5),
    };
    match adapter.evaluate(request).await {
        Ok(set) if set.allowed() => set.decisions()[0].remaining,
        other => panic!("expected an allowed decision, got {other:?}"),
    }
}

/// The first subject from `first` on whose key under `policy` hashes to a
/// slot `master` serves, with its key and slot. The slot is the subject's
/// alone (every policy of a subject shares it), so tests that run at once
/// on this cluster draw their subjects from disjoint ranges.
fn subject_on(
    adapter: &RedisEdgeRateLimitAdapter,
    policy: &RateLimitPolicy,
    master: u16,
    first: u8,
) -> (SubjectDigest, String, u16) {
    let cluster = cluster();
    (first..=u8::MAX)
        .map(subject)
        .find_map(|who| {
            let key = adapter.keys().counter_key(policy, &who, &support::operation());
            let slot = cluster.keyslot(&key);
            (cluster.owner_of_slot(slot) == master).then_some((who, key, slot))
        })
        .expect("some subject on every master")
}

fn script_loaded(port: u16, kind: ScriptKind) -> bool {
    let digest = redis::Script::new(kind.source()).get_hash().to_owned();
    cluster().cli(port, &["SCRIPT", "EXISTS", &digest]) == "1"
}

fn node_id(port: u16) -> String {
    let nodes = cluster().nodes();
    nodes.into_iter().find(|node| node.port == port).expect("a known node").id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrated_slot_keeps_its_count_and_evaluations_follow_ask_then_moved() {
    let cluster = cluster();
    let masters: Vec<u16> = cluster.masters().iter().map(|master| master.port).collect();
    let (source, target) = (masters[0], masters[2]);
    let clock = ManualClock::new(1_800_000_000_000);
    let policy = policy("migrating");
    let adapter = adapter(&policy, &clock);
    let (who, key, slot) = subject_on(&adapter, &policy, source, 0);

    for expected in [9, 8, 7] {
        assert_eq!(remaining(&adapter, &clock, &policy, &who).await, expected);
    }

    let (source_id, target_id) = (node_id(source), node_id(target));
    let slot_text = slot.to_string();
    let setslot = |port: u16, args: &[&str]| {
        let mut command = vec!["CLUSTER", "SETSLOT", slot_text.as_str()];
        command.extend_from_slice(args);
        assert_eq!(cluster.cli(port, &command), "OK", "SETSLOT {args:?} on {port}");
    };
    setslot(target, &["IMPORTING", &source_id]);
    setslot(source, &["MIGRATING", &target_id]);
    // The key is still on the source: it runs there.
    assert_eq!(remaining(&adapter, &clock, &policy, &who).await, 6);

    let migrated = cluster
        .cli(source, &["MIGRATE", "127.0.0.1", &target.to_string(), "", "0", "5000", "KEYS", &key]);
    assert_eq!(migrated, "OK");
    // The source no longer has the key and answers ASK; the target (which
    // never ran a script before) takes it after ASKING.
    assert!(!script_loaded(
        target,
        ScriptKind::Single(shared_contract::AlgorithmKind::FixedWindow)
    ));
    assert_eq!(remaining(&adapter, &clock, &policy, &who).await, 5);
    assert_eq!(cluster.cli(target, &["CLUSTER", "COUNTKEYSINSLOT", &slot_text]), "1");

    // Hand the slot over on every master; the source now answers MOVED.
    setslot(target, &["NODE", &target_id]);
    setslot(source, &["NODE", &target_id]);
    for &other in &masters[1..2] {
        setslot(other, &["NODE", &target_id]);
    }
    cluster.wait_until_settled(3);
    assert_eq!(cluster.owner_of_slot(slot), target);
    for expected in [4, 3] {
        assert_eq!(remaining(&adapter, &clock, &policy, &who).await, expected);
    }
    // Seven charges on one key, on two masters: the count carried over, and
    // the slot's only key lives on the target.
    let count_in_slot = |port| cluster.cli(port, &["CLUSTER", "COUNTKEYSINSLOT", &slot_text]);
    assert_eq!((count_in_slot(source), count_in_slot(target)), ("0".into(), "1".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_never_saw_the_script_answers_noscript_once_and_the_evaluation_succeeds() {
    let cluster = cluster();
    let masters: Vec<u16> = cluster.masters().iter().map(|master| master.port).collect();
    let clock = ManualClock::new(1_800_000_000_000);
    // A sliding counter: nothing else in this binary runs its script.
    let sliding = RateLimitPolicy::builder(
        "noscript",
        Algorithm::SlidingCounter(shared_contract::SlidingCounter {
            limit: LIMIT,
            window: Duration::from_secs(3_600),
        }),
    )
    .build()
    .unwrap();
    let adapter = adapter(&sliding, &clock);
    let (on_first, _, _) = subject_on(&adapter, &sliding, masters[0], 128);
    let (on_second, _, _) = subject_on(&adapter, &sliding, masters[1], 128);
    assert!(!script_loaded(
        masters[0],
        ScriptKind::Single(shared_contract::AlgorithmKind::SlidingCounter)
    ));
    assert!(!script_loaded(
        masters[1],
        ScriptKind::Single(shared_contract::AlgorithmKind::SlidingCounter)
    ));
    // A cache miss loads the script on the first subject's master only.
    assert_eq!(remaining(&adapter, &clock, &sliding, &on_first).await, 9);
    assert!(script_loaded(
        masters[0],
        ScriptKind::Single(shared_contract::AlgorithmKind::SlidingCounter)
    ));
    assert!(!script_loaded(
        masters[1],
        ScriptKind::Single(shared_contract::AlgorithmKind::SlidingCounter)
    ));
    // The cached digest meets a master without the script: NOSCRIPT, load
    // there, one retry; the caller sees only the decision.
    assert_eq!(remaining(&adapter, &clock, &sliding, &on_second).await, 9);
    assert!(script_loaded(
        masters[1],
        ScriptKind::Single(shared_contract::AlgorithmKind::SlidingCounter)
    ));
    assert_eq!(remaining(&adapter, &clock, &sliding, &on_second).await, 8);
}

/// The standalone rule alone cannot learn the slot map (`CLUSTER SLOTS` is
/// refused): the adapter answers `UnavailableBeforeSend` and charges nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_rule_alone_is_unavailable_before_send_on_a_cluster() {
    let clock = ManualClock::new(1_800_000_000_000);
    let policy = policy("standalone-rule");
    let adapter = adapter_as("standalone-rule-only", &policy, &clock);
    // A subject on the second master: the migration test, running at the
    // same time, asserts that its target (the third master) has never run
    // the fixed-window script, so this test must not run it there.
    let masters: Vec<u16> = cluster().masters().iter().map(|master| master.port).collect();
    let (who, _, _) = subject_on(&adapter, &policy, masters[1], 200);
    let request = RateLimitRequest {
        policies: shared_contract::PolicySet::single(policy.id().clone()).into(),
        subject: who,
        operation: support::operation(),
        cost: 1,
        evaluation_id: EvaluationId::random(),
        deadline: clock.monotonic() + Duration::from_secs(5),
    };
    assert!(matches!(
        adapter.evaluate(request).await,
        Err(RateLimitFailure::Unavailable {
            category: shared_contract::UnavailableCategory::UnavailableBeforeSend,
            ..
        })
    ));
    let full = adapter_as(RATE_LIMIT_USER, &policy, &clock);
    assert_eq!(remaining(&full, &clock, &policy, &who).await, LIMIT - 1);
}
