//! Replica-acknowledged charges (`wait-replicas = 1`) on a real Redis
//! Cluster: `EVALSHA` and `WAIT` go to the master of the key's slot in one
//! pipeline, so `WAIT` counts that shard's replica.
//!
//! - A charge the replica acknowledged is allowed; with the replica frozen
//!   it is `Indeterminate` within its deadline; afterwards allowed again.
//! - The increments lost when a master crashes, with and without `WAIT`:
//!   the replica's link is cut first (the master gets a password its
//!   replica does not know, then drops the replica), so every charge made
//!   after that lives on the master alone. Then the master is killed with
//!   `SIGKILL` and the replica promoted. Without `WAIT` each of those
//!   charges was allowed and is lost; with `WAIT` none was allowed (they
//!   were `Indeterminate`), so no allowed charge is lost. The promoted
//!   replica has no replica of its own, so with `WAIT` it serves charges
//!   only once the old master rejoins as its replica. The test prints both
//!   (docs/operations.md quotes them).
//! - With one master's replica frozen, concurrent charges on that master
//!   (twice `wait-connections`) are each answered within `wait-timeout`
//!   and a little, and charges on another master are still allowed: a
//!   blocked `WAIT` holds one connection to its own master.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod failover;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings, Topology};
use failover::{Tally, counting_policy};
use redis_fixture::RedisCluster;
use shared_contract::{ManualClock, OperationDigest, RateLimitPolicy, SubjectDigest};

const WAIT_TIMEOUT: Duration = Duration::from_millis(100);
const HAMMERS: usize = 4;
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

fn subject(n: u8) -> SubjectDigest {
    SubjectDigest::parse(format!("v1:{}", format!("{n:02x}").repeat(16))).unwrap()
}

fn operation() -> OperationDigest {
    OperationDigest::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef)
}

fn policy() -> RateLimitPolicy {
    counting_policy("acked")
}

fn adapter(
    cluster: &RedisCluster,
    clock: &ManualClock,
    wait: bool,
) -> Arc<RedisEdgeRateLimitAdapter> {
    let settings = RedisSettings {
        topology: Topology::Cluster,
        urls: cluster.urls(),
        connect_timeout: Duration::from_millis(200),
        command_timeout: Duration::from_millis(300),
        wait_replicas: u32::from(wait),
        wait_timeout: WAIT_TIMEOUT,
        ..RedisSettings::default()
    };
    Arc::new(RedisEdgeRateLimitAdapter::new(settings, [policy()], Arc::new(clock.clone())).unwrap())
}

/// One evaluation of `who` (see [`Tally::evaluate`]).
async fn evaluate(
    adapter: &RedisEdgeRateLimitAdapter,
    clock: &ManualClock,
    who: &SubjectDigest,
    tally: &mut Tally,
) -> Option<u64> {
    tally.evaluate(adapter, clock, policy().id(), who).await
}

/// A subject whose slot the master on `master` serves.
fn subject_on(
    cluster: &RedisCluster,
    adapter: &RedisEdgeRateLimitAdapter,
    master: u16,
) -> SubjectDigest {
    (0..=u8::MAX)
        .map(subject)
        .find(|who| {
            let key = adapter.keys().counter_key(&policy(), who, &operation());
            cluster.owner_of_slot(cluster.keyslot(&key)) == master
        })
        .expect("a subject on every master")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_stands_once_the_slot_s_replica_acknowledged_it() {
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    let clock = ManualClock::new(1_800_000_000_000);
    let adapter = adapter(&cluster, &clock, true);
    let master = cluster.masters()[0].port;
    let replica = cluster.replica_of(master);
    let who = subject_on(&cluster, &adapter, master);
    let mut tally = Tally::default();
    assert_eq!(evaluate(&adapter, &clock, &who, &mut tally).await, Some(1));

    tokio::task::block_in_place(|| cluster.pause_node(replica));
    let started = Instant::now();
    assert_eq!(evaluate(&adapter, &clock, &who, &mut tally).await, None);
    assert_eq!(tally.indeterminate, 1, "{tally:?}");
    assert!(started.elapsed() >= WAIT_TIMEOUT, "answered before WAIT could time out");
    tokio::task::block_in_place(|| cluster.resume_node(replica));

    // The unacknowledged charge did run: the count moves past it.
    let waited = Instant::now();
    let count = loop {
        if let Some(count) = evaluate(&adapter, &clock, &who, &mut tally).await {
            break count;
        }
        assert!(waited.elapsed() < Duration::from_secs(10), "never acknowledged again: {tally:?}");
    };
    assert!(count >= 3, "count {count}: the unacknowledged charges ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_holds_its_own_master_s_connections_only() {
    const CONCURRENT: usize = 16;
    /// Scheduling on a busy machine; a charge queued behind a blocked
    /// `WAIT` would take a whole `WAIT_TIMEOUT` more.
    const FEW_MS: Duration = Duration::from_millis(50);
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    let clock = ManualClock::new(1_800_000_000_000);
    let adapter = adapter(&cluster, &clock, true);
    let (frozen, healthy) = (cluster.masters()[0].port, cluster.masters()[1].port);
    let replica = cluster.replica_of(frozen);
    // Distinct subjects on each master.
    let on = |master| -> Vec<SubjectDigest> {
        (0..=u8::MAX)
            .map(subject)
            .filter(|who| {
                let key = adapter.keys().counter_key(&policy(), who, &operation());
                cluster.owner_of_slot(cluster.keyslot(&key)) == master
            })
            .take(CONCURRENT)
            .collect()
    };
    let (blocked, free) = (on(frozen), on(healthy));
    assert_eq!(blocked.len(), CONCURRENT);
    let all = async |subjects: &[SubjectDigest]| {
        let calls: Vec<_> = subjects
            .iter()
            .map(|who| {
                let (adapter, clock, who) = (adapter.clone(), clock.clone(), *who);
                tokio::spawn(async move {
                    let mut tally = Tally::default();
                    let started = Instant::now();
                    evaluate(&adapter, &clock, &who, &mut tally).await;
                    (tally, started.elapsed())
                })
            })
            .collect();
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.expect("an evaluation panicked"));
        }
        answers
    };
    // Healthy: the pool's connections open and the masters are read.
    for (tally, _) in all(&blocked).await.into_iter().chain(all(&free).await) {
        assert_eq!(tally.allowed, 1, "{tally:?}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A master with every client blocked checks WAIT timeouts `hz` times a
    // second (10 by default: up to 100 ms late); 100 makes it 10 ms.
    assert_eq!(cluster.cli(frozen, &["CONFIG", "SET", "hz", "100"]), "OK");

    tokio::task::block_in_place(|| cluster.pause_node(replica));
    let (stuck, served) = tokio::join!(all(&blocked), all(&free));
    tokio::task::block_in_place(|| cluster.resume_node(replica));
    let mut refused = Tally::default();
    for (tally, took) in &stuck {
        assert_eq!(tally.allowed, 0, "a charge its replica never saw was allowed");
        assert!(*took <= WAIT_TIMEOUT + FEW_MS, "answered after {took:?}: {tally:?}");
        refused.add(*tally);
    }
    for (tally, _) in &served {
        assert_eq!(tally.allowed, 1, "the other master's charges were held up: {tally:?}");
    }
    let slowest = stuck.iter().map(|(_, took)| *took).max().unwrap_or_default();
    println!(
        "{CONCURRENT} concurrent charges on a master with its replica frozen: {refused:?}, \
         slowest after {slowest:?} (wait-timeout {WAIT_TIMEOUT:?}); {CONCURRENT} on another \
         master all allowed"
    );
}

/// Cuts the replica link of the master on `port` (it now needs a password
/// its replica lacks) and returns the master's process id.
async fn cut_replication(port: u16) -> String {
    let url = format!("redis://127.0.0.1:{port}");
    let mut master =
        redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut master).await.unwrap();
    let pid = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("process_id:"))
        .expect("INFO names the process id")
        .to_owned();
    // This connection stays logged in; new ones (the replica's) need it.
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("gap-password")
        .query_async(&mut master)
        .await
        .unwrap();
    let _killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut master)
        .await
        .unwrap();
    pid
}

/// One phase: charge `who` on `master`, cut its replica off, hammer it,
/// kill the master, and count what the promoted replica holds. Returns
/// (acknowledged, count after promotion, outcomes after the cut).
async fn crash_after_a_replication_gap(
    cluster: &mut RedisCluster,
    adapter: &Arc<RedisEdgeRateLimitAdapter>,
    clock: &ManualClock,
    master: u16,
) -> (u64, u64, Tally) {
    let who = subject_on(cluster, adapter, master);
    let replica = cluster.replica_of(master);
    let mut before = Tally::default();
    for round in 1..=50 {
        assert_eq!(evaluate(adapter, clock, &who, &mut before).await, Some(round));
    }
    let pid = cut_replication(master).await;
    let link_down = Instant::now();
    while !cluster.cli(replica, &["INFO", "replication"]).contains("master_link_status:down") {
        assert!(link_down.elapsed() < Duration::from_secs(5), "the replica link stayed up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..HAMMERS)
        .map(|_| {
            let (adapter, clock, who, stop) = (adapter.clone(), clock.clone(), who, stop.clone());
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while !stop.load(Ordering::Relaxed) {
                    evaluate(&adapter, &clock, &who, &mut tally).await;
                }
                tally
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Command::new("kill").args(["-KILL", &pid]).status().expect("run kill");
    assert!(killed.success());
    stop.store(true, Ordering::Relaxed);
    let mut after_cut = Tally::default();
    for hammer in hammers {
        after_cut.add(hammer.await.expect("a hammer task panicked"));
    }
    let key = adapter.keys().counter_key(&policy(), &who, &operation());
    tokio::task::block_in_place(|| {
        cluster.stop_node(master);
        cluster.wait_until_settled(3);
        assert_eq!(cluster.owner_of_slot(cluster.keyslot(&key)), replica);
        // The promoted replica has no replica of its own, so with WAIT its
        // charges stay Indeterminate until one joins: the old master does,
        // restarted (without the password) as its replica.
        cluster.start_node(master);
        cluster.wait_until_settled(3);
    });
    let promoted = Instant::now();
    let count = loop {
        assert!(promoted.elapsed() < RECOVERY_LIMIT, "never served again");
        if let Some(count) = evaluate(adapter, clock, &who, &mut Tally::default()).await {
            break count - 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    (before.allowed + after_cut.allowed, count, after_cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_no_allowed_charge_is_lost_when_a_lagging_master_crashes() {
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    let clock = ManualClock::new(1_800_000_000_000);
    let masters: Vec<u16> = cluster.masters().iter().map(|master| master.port).collect();

    let plain = adapter(&cluster, &clock, false);
    let (acknowledged, count, tally) =
        crash_after_a_replication_gap(&mut cluster, &plain, &clock, masters[0]).await;
    let lost_without = acknowledged.saturating_sub(count);
    assert!(
        lost_without > 0,
        "the gap lost nothing without WAIT: {acknowledged} vs {count}, {tally:?}"
    );
    println!(
        "without WAIT: {acknowledged} charges allowed, {count} on the promoted replica, \
         {lost_without} lost; after the cut: {tally:?}"
    );

    let waiting = adapter(&cluster, &clock, true);
    let (acknowledged, count, tally) =
        crash_after_a_replication_gap(&mut cluster, &waiting, &clock, masters[1]).await;
    assert_eq!(tally.allowed, 0, "a charge the replica never saw was allowed: {tally:?}");
    assert!(count >= acknowledged, "{acknowledged} allowed, {count} kept: lost some");
    println!(
        "with WAIT (1 replica, {WAIT_TIMEOUT:?}): {acknowledged} charges allowed, {count} on the \
         promoted replica, 0 lost; after the cut: {tally:?}"
    );
}
