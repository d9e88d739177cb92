//! Failover on a real Redis Cluster: under steady evaluations (plus four
//! tasks hammering the same subject) one master process is killed with
//! `SIGKILL`, as in a crash; while its
//! replica takes over, every evaluation returns a typed outcome within its
//! deadline; after the promotion, evaluations for that slot succeed again on
//! the same adapter. Prints the recovery time and how many acknowledged
//! increments the asynchronous replication lost (docs/operations.md quotes
//! them).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod failover;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings, Topology};
use failover::{Tally, counting_policy};
use redis_fixture::{NODE_TIMEOUT, RedisCluster};
use shared_contract::{ManualClock, RateLimitPolicy, SubjectDigest};

/// Pause between two rounds of steady traffic.
const TICK: Duration = Duration::from_millis(20);
/// Tasks evaluating the victim back to back across the failover.
const HAMMERS: usize = 4;
/// The longest a failover may take before the test gives up.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

fn subject(n: u8) -> SubjectDigest {
    SubjectDigest::parse(format!("v1:{}", format!("{n:02x}").repeat(16))).unwrap()
}

#[derive(Clone)]
struct Traffic {
    adapter: Arc<RedisEdgeRateLimitAdapter>,
    clock: ManualClock,
    policy: RateLimitPolicy,
}

impl Traffic {
    /// One evaluation of `who` (see [`Tally::evaluate`]).
    async fn evaluate(&self, who: &SubjectDigest, tally: &mut Tally) -> Option<u64> {
        tally.evaluate(&self.adapter, &self.clock, self.policy.id(), who).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_over_and_its_slots_serve_again_without_rebuilding() {
    let mut cluster = RedisCluster::start();
    let clock = ManualClock::new(1_800_000_000_000);
    let policy = counting_policy("failover");
    let settings = RedisSettings {
        topology: Topology::Cluster,
        urls: cluster.urls(),
        connect_timeout: Duration::from_millis(200),
        command_timeout: Duration::from_millis(200),
        ..RedisSettings::default()
    };
    let adapter =
        RedisEdgeRateLimitAdapter::new(settings, [policy.clone()], Arc::new(clock.clone()))
            .unwrap();
    let traffic = Traffic { adapter: Arc::new(adapter), clock, policy };
    let key_of = |who: &SubjectDigest| {
        traffic.adapter.keys().counter_key(
            &traffic.policy,
            who,
            &shared_contract::OperationDigest::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
        )
    };

    // A victim subject on the first master, a bystander on another one.
    let masters: Vec<u16> = cluster.masters().iter().map(|master| master.port).collect();
    let owner = |n: u8| cluster.owner_of_slot(cluster.keyslot(&key_of(&subject(n))));
    let victim = (0..=u8::MAX).find(|&n| owner(n) == masters[0]).map(subject).unwrap();
    let bystander = (0..=u8::MAX).find(|&n| owner(n) == masters[1]).map(subject).unwrap();
    let replica = cluster.replica_of(masters[0]);
    let slot = cluster.keyslot(&key_of(&victim));

    // Steady traffic before the failure: everything is a decision.
    let mut steady = Tally::default();
    for round in 1..=50 {
        assert_eq!(traffic.evaluate(&victim, &mut steady).await, Some(round));
        traffic.evaluate(&bystander, &mut Tally::default()).await.expect("healthy cluster");
        tokio::time::sleep(TICK).await;
    }

    // Hammer the victim back to back, and kill its master under the load.
    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..HAMMERS)
        .map(|_| {
            let (traffic, stop, victim) = (traffic.clone(), stop.clone(), victim);
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while !stop.load(Ordering::Relaxed) {
                    traffic.evaluate(&victim, &mut tally).await;
                }
                tally
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The fixture blocks; let the runtime move the other tasks off this worker.
    tokio::task::block_in_place(|| cluster.kill_node(masters[0]));
    let killed = Instant::now();
    let mut during = Tally::default();
    let mut bystander_tally = Tally::default();
    let recovery = loop {
        assert!(
            killed.elapsed() < RECOVERY_LIMIT,
            "no recovery within {RECOVERY_LIMIT:?}: {during:?}\n{}",
            cluster.logs()
        );
        traffic.evaluate(&bystander, &mut bystander_tally).await;
        if traffic.evaluate(&victim, &mut during).await.is_some() {
            break killed.elapsed();
        }
        tokio::time::sleep(TICK).await;
    };
    stop.store(true, Ordering::Relaxed);
    let mut hammered = Tally::default();
    for hammer in hammers {
        hammered.add(hammer.await.expect("a hammer task panicked"));
    }
    // The promoted replica now owns the slot, and the same adapter reached it.
    tokio::task::block_in_place(|| cluster.wait_until_settled(3));
    assert_eq!(cluster.owner_of_slot(slot), replica);

    let count = traffic.evaluate(&victim, &mut Tally::default()).await.expect("promoted") - 1;
    let (acknowledged, lost) = failover::lost(count, steady, hammered, during);

    // Afterwards every evaluation on that slot is a decision again.
    let mut after = Tally::default();
    for _ in 0..20 {
        traffic.evaluate(&victim, &mut after).await.expect("the promoted master answers");
    }
    assert_eq!(after.allowed, 20);

    // The old master comes back as a replica of its successor.
    tokio::task::block_in_place(|| {
        cluster.start_node(masters[0]);
        cluster.wait_until_settled(3);
    });
    assert_eq!(cluster.owner_of_slot(slot), replica);
    traffic.evaluate(&victim, &mut after).await.expect("still served after the rejoin");

    println!(
        "failover: recovery {recovery:?} after the master was killed with SIGKILL (cluster-node-timeout \
         {NODE_TIMEOUT:?}); victim, steady caller while failing over: {during:?}; victim, \
         {HAMMERS} back-to-back callers over the whole run: {hammered:?}; bystander on another \
         master while failing over: {bystander_tally:?}; increments acknowledged \
         {acknowledged}, count after promotion {count}, lost at least {lost}"
    );
}
