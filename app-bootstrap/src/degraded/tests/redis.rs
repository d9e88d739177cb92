//! The decorator over a real redis-server that is killed before a window
//! and restarted inside it (empty, as the fixture's server keeps no data),
//! with the window moved by a manual clock that Redis' scripts read too:
//! the limit of 10 per 6 s holds in the window Redis returns in, for one
//! instance, for one instance whose Redis restarts every 0.5 s, and for a
//! fleet of two over one Redis within the bound docs/operations.md states.

use std::time::Instant;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use redis_fixture::RedisServer;
use shared_contract::{EvaluationId, ManualClock, OperationDigest, PolicySet, SubjectDigest};

use super::super::*;

/// A window start: a whole multiple of the 6 s window.
const T0: u64 = 1_700_000_040_000;
const LIMIT: u64 = 10;
const WINDOW: Duration = Duration::from_secs(6);
/// A guard against a hang while Redis comes back; no assertion on time.
const PATIENCE: Duration = Duration::from_secs(20);

fn policy() -> RateLimitPolicy {
    RateLimitPolicy::builder("api", Algorithm::FixedWindow { limit: LIMIT, window: WINDOW })
        .build()
        .unwrap()
}

/// One instance of a fleet of `instances`: the Redis provider on `redis`
/// behind degraded mode, both on `clock`.
fn instance(redis: &RedisServer, clock: &ManualClock, instances: u32) -> DegradedPort {
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let settings = RedisSettings {
        urls: vec![redis.url()],
        connect_timeout: Duration::from_millis(250),
        command_timeout: Duration::from_millis(250),
        ..RedisSettings::default()
    };
    let primary = RedisEdgeRateLimitAdapter::new(settings, [policy()], Arc::clone(&clock)).unwrap();
    let instances = NonZeroU32::new(instances).unwrap();
    let mode = Arc::new(DegradedMode::new(MemoryStore::new(), instances, Arc::clone(&clock)));
    let local = MemoryEdgeRateLimitAdapter::with_store(
        mode.store().clone(),
        [scaled(&policy(), instances).unwrap()],
        clock,
    )
    .unwrap();
    DegradedPort::new(Arc::new(primary), Arc::new(local), mode)
}

/// Decisions of one subject through the instances, counted.
struct Probe {
    clock: ManualClock,
    admitted: u64,
    from_redis: u64,
}

impl Probe {
    fn new(clock: &ManualClock) -> Self {
        Self { clock: clock.clone(), admitted: 0, from_redis: 0 }
    }

    /// One request of cost 1 through `port`: whether Redis decided it
    /// (itself, or its denial cache), not the local limiter.
    async fn ask(&mut self, port: &DegradedPort) -> bool {
        let request = RateLimitRequest {
            policies: PolicySet::single(PolicyId::new("api").unwrap()),
            subject: SubjectDigest::parse(format!("v1:{}", "cd".repeat(16))).unwrap(),
            operation: OperationDigest::new("00000000000000c1").unwrap(),
            cost: 1,
            evaluation_id: EvaluationId::random(),
            deadline: self.clock.monotonic() + Duration::from_millis(750),
        };
        match port.evaluate(request).await {
            RateLimitOutcome::Evaluated(set) => {
                self.admitted += u64::from(set.allowed());
                let redis = set.source() != DecisionSource::Degraded;
                self.from_redis += u64::from(redis);
                redis
            }
            other @ (RateLimitOutcome::Unavailable { .. }
            | RateLimitOutcome::Incompatible { .. }
            | RateLimitOutcome::Indeterminate { .. }) => {
                panic!("degraded mode answers every request: {other:?}")
            }
        }
    }

    /// Asks through `port` until Redis decides (every answer counted).
    async fn until_redis(&mut self, port: &DegradedPort) {
        let since = Instant::now();
        while !self.ask(port).await {
            assert!(since.elapsed() < PATIENCE, "Redis not back after {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Redis answers once (the connection is up), then is killed before the
/// window of `T0`, and the clock moves inside that window.
async fn killed_before_the_window(
    redis: &mut RedisServer,
    clock: &ManualClock,
    ports: &[&DegradedPort],
) {
    let mut before = Probe::new(clock);
    for port in ports {
        before.until_redis(port).await;
    }
    tokio::task::block_in_place(|| redis.crash());
    clock.advance(Duration::from_millis(1_050));
    assert_eq!(clock.epoch_millis(), T0 + 50, "inside the window");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_back_inside_the_window_counts_what_one_instance_admitted_locally() {
    let mut redis = RedisServer::start();
    let clock = ManualClock::new(T0 - 1_000);
    let port = instance(&redis, &clock, 1);
    killed_before_the_window(&mut redis, &clock, &[&port]).await;

    let mut window = Probe::new(&clock);
    for _ in 0..12 {
        window.ask(&port).await;
    }
    assert_eq!((window.admitted, window.from_redis), (LIMIT, 0), "the share, locally");
    tokio::task::block_in_place(|| redis.restart());
    window.until_redis(&port).await;
    for _ in 0..12 {
        window.ask(&port).await;
    }
    assert!(window.from_redis >= 13, "Redis decided after its return");
    assert_eq!(window.admitted, LIMIT, "the window Redis returns in stays at the limit");
    // Written back once: the next window has the whole limit on Redis.
    clock.advance(WINDOW);
    let mut next = Probe::new(&clock);
    for _ in 0..12 {
        next.ask(&port).await;
    }
    assert_eq!((next.admitted, next.from_redis), (LIMIT, 12));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_every_half_second_adds_nothing_to_the_share() {
    let mut redis = RedisServer::start();
    let clock = ManualClock::new(T0 - 1_000);
    let port = instance(&redis, &clock, 1);
    killed_before_the_window(&mut redis, &clock, &[&port]).await;

    // Five cycles of 0.5 s down and 0.5 s up (restarted empty each time),
    // three requests in each half, all inside the one window.
    let mut window = Probe::new(&clock);
    for _ in 0..5 {
        for _ in 0..3 {
            window.ask(&port).await;
        }
        clock.advance(Duration::from_millis(500));
        tokio::task::block_in_place(|| redis.restart());
        window.until_redis(&port).await;
        for _ in 0..2 {
            window.ask(&port).await;
        }
        clock.advance(Duration::from_millis(500));
        tokio::task::block_in_place(|| redis.crash());
    }
    assert!(clock.epoch_millis() < T0 + WINDOW.as_millis() as u64, "one window");
    assert!(window.from_redis >= 15, "Redis decided in every up half");
    assert_eq!(window.admitted, LIMIT, "one instance's share, however often Redis restarts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_two_counts_both_shares_in_the_window_redis_returns_in() {
    let mut redis = RedisServer::start();
    let clock = ManualClock::new(T0 - 1_000);
    let (a, b) = (instance(&redis, &clock, 2), instance(&redis, &clock, 2));
    killed_before_the_window(&mut redis, &clock, &[&a, &b]).await;

    let share = LIMIT.div_ceil(2);
    let mut window = Probe::new(&clock);
    for port in [&a, &b] {
        for _ in 0..share + 2 {
            window.ask(port).await;
        }
    }
    assert_eq!(window.admitted, 2 * share, "each instance its share, locally");
    tokio::task::block_in_place(|| redis.restart());
    // Requests alternate between the instances once Redis is back. Each
    // writes its local admissions back with its first Redis decision, so
    // Redis can admit only what the other had not written back yet: A's
    // first request (A's share written, B's not yet) is the one admission
    // beyond the limit the bound allows here.
    window.until_redis(&a).await;
    window.until_redis(&b).await;
    for _ in 0..6 {
        window.ask(&a).await;
        window.ask(&b).await;
    }
    assert!(window.from_redis >= 14, "Redis decided after its return");
    assert!(
        window.admitted <= LIMIT + 1,
        "the fleet's bound: the limit plus what Redis admitted before B wrote back: {}",
        window.admitted
    );
    // Both shares are in Redis now: it refuses the rest of the window.
    let mut after = Probe::new(&clock);
    for port in [&a, &b, &a, &b] {
        assert!(after.ask(port).await);
    }
    assert_eq!(after.admitted, 0, "Redis counts both shares");
}
