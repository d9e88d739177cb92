//! Failover on a real Sentinel group: under steady evaluations (plus four
//! tasks hammering the same subject) the master process is killed with
//! `SIGKILL`, as in a crash; while the sentinels agree it is down and
//! promote the replica, every evaluation returns a typed outcome within its
//! deadline; after the promotion the same adapter asks the sentinels again
//! and serves from the new master. Prints the recovery time and how many
//! acknowledged increments the asynchronous replication lost
//! (docs/operations.md quotes them).
//!
//! The same crash with the old master restarted (a plain master, empty)
//! after the sentinels held it down and before they promoted the replica:
//! the adapter may reconnect to it while it is still named, and must leave
//! it as soon as the sentinels name the promoted replica, not when they
//! get round to demoting it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod failover;

use failover::{Tally, counting_policy};

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings, Topology};
use redis_fixture::{DOWN_AFTER, MASTER_NAME, RedisSentinel};
use shared_contract::{ManualClock, RateLimitPolicy, SubjectDigest};

/// Pause between two rounds of steady traffic.
const TICK: Duration = Duration::from_millis(20);
/// Tasks evaluating the subject back to back across the failover.
const HAMMERS: usize = 4;
/// The longest a failover may take before the test gives up.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);
/// The adapter's command timeout, which is also how often it asks the
/// sentinels which master they name while charges flow.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);
/// When the killed master comes back in the quick-restart test: after the
/// sentinels hold it down ([`DOWN_AFTER`]), before they promote the replica.
const RESTART_AFTER: Duration = Duration::from_millis(1_600);

#[derive(Clone)]
struct Traffic {
    adapter: Arc<RedisEdgeRateLimitAdapter>,
    clock: ManualClock,
    policy: RateLimitPolicy,
    subject: SubjectDigest,
}

impl Traffic {
    /// The subject `v1:<byte × 16>` under [`counting_policy`] `id`, through
    /// an adapter that finds the master by asking `group`'s sentinels.
    fn through(group: &RedisSentinel, id: &str, byte: &str) -> Self {
        let clock = ManualClock::new(1_800_000_000_000);
        let policy = counting_policy(id);
        let settings = RedisSettings {
            topology: Topology::Sentinel,
            urls: vec![],
            sentinels: group.sentinel_addresses(),
            master_name: MASTER_NAME.to_owned(),
            connect_timeout: Duration::from_millis(200),
            command_timeout: COMMAND_TIMEOUT,
            ..RedisSettings::default()
        };
        let adapter =
            RedisEdgeRateLimitAdapter::new(settings, [policy.clone()], Arc::new(clock.clone()))
                .unwrap();
        let subject = SubjectDigest::parse(format!("v1:{}", byte.repeat(16))).unwrap();
        Self { adapter: Arc::new(adapter), clock, policy, subject }
    }

    /// 50 evaluations a tick apart on the healthy group, each counting one
    /// more: the tally the failover then adds to.
    async fn warm_up(&self) -> Tally {
        let mut steady = Tally::default();
        for round in 1..=50 {
            assert_eq!(self.evaluate(&mut steady).await, Some(round));
            tokio::time::sleep(TICK).await;
        }
        steady
    }

    /// One evaluation of the subject (see [`Tally::evaluate`]).
    async fn evaluate(&self, tally: &mut Tally) -> Option<u64> {
        tally.evaluate(&self.adapter, &self.clock, self.policy.id(), &self.subject).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_by_the_replica_the_sentinels_promote() {
    let mut group = tokio::task::block_in_place(RedisSentinel::start);
    let traffic = Traffic::through(&group, "failover", "5e");
    let master = group.master_port();
    let replica = group.other_than(master);

    let steady = traffic.warm_up().await;

    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..HAMMERS)
        .map(|_| {
            let (traffic, stop) = (traffic.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while !stop.load(Ordering::Relaxed) {
                    traffic.evaluate(&mut tally).await;
                }
                tally
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| group.crash(master));
    let killed = Instant::now();
    let mut during = Tally::default();
    let recovery = loop {
        assert!(
            killed.elapsed() < RECOVERY_LIMIT,
            "no recovery within {RECOVERY_LIMIT:?}: {during:?}\n{}",
            group.logs()
        );
        if traffic.evaluate(&mut during).await.is_some() {
            break killed.elapsed();
        }
        tokio::time::sleep(TICK).await;
    };
    stop.store(true, Ordering::Relaxed);
    let mut hammered = Tally::default();
    for hammer in hammers {
        hammered.add(hammer.await.expect("a hammer task panicked"));
    }
    // The sentinels promoted the replica, and the adapter followed them.
    assert_eq!(tokio::task::block_in_place(|| group.wait_for_promotion(master)), replica);

    let count = traffic.evaluate(&mut Tally::default()).await.expect("promoted") - 1;
    let (acknowledged, lost) = failover::lost(count, steady, hammered, during);

    let mut after = Tally::default();
    for _ in 0..20 {
        traffic.evaluate(&mut after).await.expect("the promoted master answers");
    }
    assert_eq!(after.allowed, 20);

    println!(
        "sentinel failover: recovery {recovery:?} after the master was killed with SIGKILL \
         (down-after-milliseconds {DOWN_AFTER:?}, quorum 2 of 3); steady caller while failing \
         over: {during:?}; {HAMMERS} back-to-back callers over the whole run: {hammered:?}; \
         increments acknowledged {acknowledged}, count after promotion {count}, lost at least {lost}"
    );
}

/// Back-to-back evaluations of `traffic` on [`HAMMERS`] tasks until `stop`.
fn hammer(traffic: &Traffic, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<Tally>> {
    (0..HAMMERS)
        .map(|_| {
            let (traffic, stop) = (traffic.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while !stop.load(Ordering::Relaxed) {
                    traffic.evaluate(&mut tally).await;
                }
                tally
            })
        })
        .collect()
}

/// How many `EVALSHA` calls clients made on the node on `port` since it
/// started (`INFO commandstats`); replication never counts there.
fn evalsha_calls(group: &RedisSentinel, port: u16) -> u64 {
    let stats = group.cli(port, &["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.trim().strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a call count"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quickly_restarted_old_master_is_left_as_soon_as_the_sentinels_name_the_promoted_one() {
    let mut group = tokio::task::block_in_place(RedisSentinel::start);
    let traffic = Traffic::through(&group, "restart", "7a");
    let master = group.master_port();
    let replica = group.other_than(master);
    let steady = traffic.warm_up().await;
    let stop = Arc::new(AtomicBool::new(false));
    let hammers = hammer(&traffic, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;

    tokio::task::block_in_place(|| group.crash(master));
    let killed = Instant::now();
    tokio::time::sleep_until((killed + RESTART_AFTER).into()).await;
    // The timing of the report: held down, not yet replaced.
    let flags = tokio::task::block_in_place(|| group.master_flags());
    assert!(flags.iter().any(|flags| flags.contains("s_down")), "not held down yet: {flags:?}");
    assert_eq!(group.master_port(), master, "promoted before the restart:\n{}", group.logs());
    tokio::task::block_in_place(|| group.restart(master));
    let restarted = killed.elapsed();

    let promoted = tokio::task::block_in_place(|| group.wait_for_promotion(master));
    assert_eq!(promoted, replica);
    let named = killed.elapsed();
    // One round of asking the sentinels, and slack for the reconnect.
    tokio::time::sleep(COMMAND_TIMEOUT + Duration::from_millis(300)).await;
    let old_before = evalsha_calls(&group, master);
    let new_before = evalsha_calls(&group, replica);
    let mut after = Tally::default();
    for _ in 0..50 {
        traffic.evaluate(&mut after).await;
    }
    let old_after = evalsha_calls(&group, master);
    let new_after = evalsha_calls(&group, replica);
    stop.store(true, Ordering::Relaxed);
    let mut hammered = Tally::default();
    for hammer in hammers {
        hammered.add(hammer.await.expect("a hammer task panicked"));
    }
    let role = group.role(master);
    assert_eq!(
        old_after, old_before,
        "the old master ({role} now) still took charges after the sentinels named {replica}"
    );
    assert_eq!(after.allowed, 50, "the promoted master did not serve: {after:?}");
    assert!(new_after >= new_before + 50, "{new_before} -> {new_after} calls on {replica}");

    let count = traffic.evaluate(&mut Tally::default()).await.expect("promoted") - 1;
    let (acknowledged, lost) = failover::lost(count, steady, hammered, after);
    println!(
        "quick restart: old master back at {restarted:?} after SIGKILL, the sentinels named the \
         replica at {named:?}; increments allowed {acknowledged}, count on the promoted master \
         {count}, lost {lost}; {HAMMERS} back-to-back callers: {hammered:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_manual_failover_the_demoted_master_is_left_for_the_promoted_one() {
    let group = tokio::task::block_in_place(RedisSentinel::start);
    let traffic = Traffic::through(&group, "switch", "d3");
    let old = group.master_port();
    let mut tally = Tally::default();
    for round in 1..=10 {
        assert_eq!(traffic.evaluate(&mut tally).await, Some(round));
    }

    // Both processes keep running: the old master is demoted, not gone.
    tokio::task::block_in_place(|| group.failover());
    let new = tokio::task::block_in_place(|| group.wait_for_promotion(old));
    let demoted = Instant::now();
    while group.role(old) != "slave" {
        assert!(demoted.elapsed() < RECOVERY_LIMIT, "{old} was never demoted:\n{}", group.logs());
        tokio::time::sleep(TICK).await;
    }

    // Typed outcomes until the adapter reaches the new master, then the
    // count carries on there (the replica had every charge: it was in sync).
    let switched = Instant::now();
    let count = loop {
        assert!(switched.elapsed() < RECOVERY_LIMIT, "never served by {new}: {tally:?}");
        if let Some(count) = traffic.evaluate(&mut tally).await {
            break count;
        }
        tokio::time::sleep(TICK).await;
    };
    assert!(count > 10, "count {count}: the charges before the failover were lost");
    assert!(
        count <= 11 + tally.indeterminate,
        "count {count} exceeds what may have run: {tally:?}"
    );
    let info = group.role(new);
    assert_eq!(info, "master");
    println!("manual failover: served by {new} after {:?}, {tally:?}", switched.elapsed());
}
