//! The calendar window's Lua function on a real redis-server, with the
//! bounds a caller passes (the next period's branch included, which no
//! caller on one clock reaches): the prelude, its tag, the file and a small
//! driver that runs it on one key, with the worked numbers of
//! docs/algorithms.md "Calendar window" (b), a month end in Europe/Berlin,
//! limit 3; and the same branch through the adapter's own script, with a
//! mark another instance wrote ahead within the clock-regression bound.

use std::sync::Arc;
use std::time::Duration;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use redis::AsyncCommands;
use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, CalendarPeriod, CalendarWindow, Clock, EdgeRateLimitPort, EvaluationId, ManualClock,
    OperationDigest, PolicyId, PolicySet, RateAlgorithm, RateLimitPolicy, RateLimitRequest,
    SubjectDigest,
};

const PRELUDE: &str = include_str!("../lua/prelude.lua");

/// ARGV[1..3] are the prelude's (time, cost, evaluation id); then charge
/// (1 or 0), limit, period start, period end, next period's end. `t` is
/// the effective time: the caller's here, as no mark is judged.
const DRIVER: &str = "
local raw = redis.call('GET', KEYS[1])
local allowed, remaining, reset_after, retry_after, state, state_end =
  calendar_window(raw, now, ARGV[4] == '1', ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0, ARGV[8] + 0)
if state then redis.call('SET', KEYS[1], state) end
return {allowed and 1 or 0, remaining, reset_after, retry_after, state_end or -1}
";

// docs/algorithms.md "Calendar window", worked numbers (b).
const JANUARY_LAST_HALF_SECOND: u64 = 1_801_436_399_500;
const JANUARY: (u64, u64) = (1_798_758_000_000, 1_801_436_400_000);
const FEBRUARY_FIRST: u64 = 1_801_436_400_000;
const FEBRUARY_2027: (u64, u64) = (1_801_436_400_000, 1_803_855_600_000);

struct Run {
    script: redis::Script,
    connection: redis::aio::MultiplexedConnection,
}

impl Run {
    /// One run at `t` with the bounds a caller computed: allowed,
    /// remaining, reset_after, retry_after, state_end (-1: nothing written).
    async fn at(&mut self, t: u64, charge: bool, bounds: (u64, u64), next_end: u64) -> [i64; 5] {
        self.script
            .key("k")
            .arg(t)
            .arg(1)
            .arg([7u8; 16].as_slice())
            .arg(if charge { "1" } else { "0" })
            .arg(3)
            .arg(bounds.0)
            .arg(bounds.1)
            .arg(next_end)
            .invoke_async(&mut self.connection)
            .await
            .unwrap()
    }

    /// The stored state: tag, mark, period start, count.
    async fn state(&mut self) -> (u8, f64, f64, f64) {
        let raw: Vec<u8> = self.connection.get("k").await.unwrap();
        assert_eq!(raw.len(), 25, "the header is as long as the fixed window's");
        let double = |at: usize| f64::from_le_bytes(raw[at..at + 8].try_into().unwrap());
        (raw[0], double(1), double(9), double(17))
    }
}

#[tokio::test]
async fn a_month_end_in_berlin_counts_as_the_docs_say() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut run = Run {
        script: redis::Script::new(&format!(
            "{PRELUDE}\nlocal CALENDAR_WINDOW = {}\n{}\n{DRIVER}",
            CalendarWindow::TAG,
            CalendarWindow::LUA.source
        )),
        connection: client.get_multiplexed_async_connection().await.unwrap(),
    };
    let t = JANUARY_LAST_HALF_SECOND;
    for remaining in [2, 1, 0] {
        assert_eq!(
            run.at(t, true, JANUARY, FEBRUARY_2027.1).await,
            [1, remaining, 500, 0, JANUARY.1 as i64]
        );
    }
    assert_eq!(run.state().await, (b'P', t as f64, JANUARY.0 as f64, 3.0));
    // The fourth is denied and writes nothing; so does a spared run.
    assert_eq!(run.at(t, true, JANUARY, FEBRUARY_2027.1).await, [0, 0, 500, 500, -1]);
    assert_eq!(run.state().await, (b'P', t as f64, JANUARY.0 as f64, 3.0));

    // February 1st, 00:00: a new period, the count restarts.
    let next = run.at(FEBRUARY_FIRST, true, FEBRUARY_2027, 0).await;
    assert_eq!(next, [1, 2, 2_419_200_000, 0, FEBRUARY_2027.1 as i64]);
    assert_eq!(run.state().await, (b'P', FEBRUARY_FIRST as f64, FEBRUARY_2027.0 as f64, 1.0));
    let spared = run.at(FEBRUARY_FIRST, false, FEBRUARY_2027, 0).await;
    assert_eq!(spared, [1, 2, 2_419_200_000, 0, -1]);

    // A caller still in January whose key's mark is in February (effective
    // time 300 ms past January's end) counts in February, as a caller at
    // that time would: its charge adds to February's count.
    let ahead = FEBRUARY_FIRST + 300;
    let late = run.at(ahead, true, JANUARY, FEBRUARY_2027.1).await;
    assert_eq!(late, [1, 1, 2_419_199_700, 0, FEBRUARY_2027.1 as i64]);
    assert_eq!(run.state().await, (b'P', ahead as f64, FEBRUARY_2027.0 as f64, 2.0));
}

/// docs/algorithms.md "Calendar window" (b): a caller at 23:59:59.5 on
/// January 31st whose key holds a mark 300 ms into February counts in
/// February, through the script the adapter runs for a set of one.
#[tokio::test]
async fn a_mark_of_the_next_month_counts_there_through_the_adapter() {
    let server = RedisServer::start();
    let clock = ManualClock::new(FEBRUARY_FIRST + 300);
    let calendar = CalendarWindow {
        limit: 3,
        period: CalendarPeriod::Month,
        time_zone: "Europe/Berlin".parse().unwrap(),
    };
    let policy = RateLimitPolicy::builder("monthly", Algorithm::CalendarWindow(calendar))
        .maximum_clock_regression(Duration::from_secs(1))
        .build()
        .unwrap();
    let settings = RedisSettings { urls: vec![server.url()], ..RedisSettings::default() };
    let redis =
        RedisEdgeRateLimitAdapter::new(settings, [policy], Arc::new(clock.clone())).unwrap();
    let request = |clock: &ManualClock| RateLimitRequest {
        policies: PolicySet::single(PolicyId::new("monthly").unwrap()).into(),
        subject: SubjectDigest::parse(format!("v1:{}", "ab".repeat(16))).unwrap(),
        operation: OperationDigest::from_u64(1),
        cost: 1,
        evaluation_id: EvaluationId::random(),
        deadline: clock.monotonic() + Duration::from_secs(5),
    };
    let ahead = redis.evaluate(request(&clock)).await.unwrap();
    assert_eq!(ahead.decisions()[0].remaining, 2, "the one request counted in February");
    clock.set_epoch_millis(JANUARY_LAST_HALF_SECOND);
    let late = redis.evaluate(request(&clock)).await.unwrap();
    let decision = late.decisions()[0];
    assert!(decision.allowed);
    assert_eq!((decision.remaining, decision.reset_after_ms), (1, 2_419_199_700));
}
