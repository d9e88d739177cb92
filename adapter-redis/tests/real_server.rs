//! The Redis provider against a real redis-server: script-cache loss, keys of
//! the wrong type, a server that stops and comes back, constant-size state,
//! what a key holds, and its lifetime.

mod support;

use std::time::{Duration, Instant};

use adapter_redis::{RateLimitKeys, ScriptKind};
use redis::AsyncCommands;
use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, IncompatibleCategory,
    ManualClock, PolicyScope, PolicySet, RateLimitFailure, RateLimitOutcome, RateLimitOutcomeExt,
    RateLimitPolicy,
};
use support::{T0, adapter, inspector, request, request_with, subject};

fn fixed(id: &str, limit: u64, dedup: EvaluationDedupPolicy) -> RateLimitPolicy {
    RateLimitPolicy::builder(
        id,
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit,
            window: Duration::from_secs(1),
        }),
    )
    .evaluation_dedup(dedup)
    .build()
    .unwrap()
}

fn remaining(outcome: &RateLimitOutcome) -> u64 {
    match outcome {
        Ok(set) => set.decisions()[0].remaining,
        other => panic!("expected a decision, got {other:?}"),
    }
}

#[tokio::test]
async fn script_flush_between_two_evaluations_recovers_transparently() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let adapter =
        adapter(&server, &clock, vec![fixed("p", 3, EvaluationDedupPolicy::Disabled)], |_| {});
    let who = subject(1);
    assert_eq!(remaining(&adapter.evaluate(request(&clock, "p", &who)).await), 2);
    let mut redis = inspector(&server).await;
    let flushed: String = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut redis).await.unwrap();
    assert_eq!(flushed, "OK");
    // NOSCRIPT -> reload -> one retry: the caller sees only the next count.
    assert_eq!(remaining(&adapter.evaluate(request(&clock, "p", &who)).await), 1);
    // The retry loaded the script again: its SHA-1 is known to the server.
    let digest = redis::Script::new(
        ScriptKind::Single(shared_contract::AlgorithmKind::FixedWindow).source(),
    )
    .get_hash()
    .to_owned();
    let loaded: Vec<bool> =
        redis::cmd("SCRIPT").arg("EXISTS").arg(digest).query_async(&mut redis).await.unwrap();
    assert_eq!(loaded, [true]);
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_state_incompatible() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = fixed("p", 3, EvaluationDedupPolicy::enabled_defaults());
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let who = subject(2);
    let key = adapter.keys().counter_key(&policy, &who, &support::operation());
    let mut redis = inspector(&server).await;
    // A list is neither layout (a string without dedupe, a hash with it).
    let _: () = redis.rpush(&key, "value").await.unwrap();
    assert_eq!(
        adapter.evaluate(request(&clock, "p", &who)).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible })
    );
    // A hash whose state field no script wrote is corrupt state.
    let _: () = redis.del(&key).await.unwrap();
    let _: () = redis.hset(&key, "s", "garbage").await.unwrap();
    assert_eq!(
        adapter.evaluate(request(&clock, "p", &who)).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible })
    );
    // A string of a length no script writes is corrupt state: same answer.
    let _: () = redis.del(&key).await.unwrap();
    let _: () = redis.set(&key, "garbage").await.unwrap();
    assert_eq!(
        adapter.evaluate(request(&clock, "p", &who)).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible })
    );
    // Neither was touched.
    let kept: String = redis.get(&key).await.unwrap();
    assert_eq!(kept, "garbage");
}

#[tokio::test]
async fn a_stopped_server_gives_a_typed_outcome_in_time_and_a_restart_heals_without_rebuilding() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let adapter = adapter(
        &server,
        &clock,
        vec![fixed("p", 100, EvaluationDedupPolicy::enabled_defaults())],
        |settings| settings.command_timeout = Duration::from_millis(250),
    );
    let who = subject(3);
    assert!(adapter.evaluate(request(&clock, "p", &who)).await.is_allowed());
    assert!(adapter.is_ready().await);

    server.stop();
    let budget = Duration::from_millis(500);
    for _ in 0..3 {
        let started = Instant::now();
        let outcome =
            adapter.evaluate(request_with(&clock, "p", &who, EvaluationId::random(), budget)).await;
        let took = started.elapsed();
        assert!(
            matches!(
                outcome,
                Err(RateLimitFailure::Unavailable { .. })
                    | Err(RateLimitFailure::Indeterminate { .. })
            ),
            "{outcome:?}"
        );
        // The deadline bounds the wait; the slack covers a busy machine.
        assert!(took < budget + Duration::from_millis(500), "took {took:?}");
    }
    assert!(!adapter.is_ready().await);

    server.restart();
    // Same adapter: it reconnects and reloads its scripts by itself. Calls
    // right after its last failed connect are refused unsent for the
    // connect back-off (100 ms), never ambiguous; the first one after it
    // connects. The restarted server is empty, so the count starts again.
    let mut outcome = adapter.evaluate(request(&clock, "p", &who)).await;
    for _ in 0..50 {
        if !matches!(outcome, Err(RateLimitFailure::Unavailable { .. })) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        outcome = adapter.evaluate(request(&clock, "p", &who)).await;
    }
    assert_eq!(remaining(&outcome), 99, "{outcome:?}");
    assert!(adapter.is_ready().await);
}

/// The length of a key's state and how many record fields it holds beside
/// it (two per record): a string is state alone; with dedupe on the key is
/// a hash of its state (field `s`) and its records.
async fn footprint(redis: &mut redis::aio::MultiplexedConnection, key: &str) -> (usize, usize) {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(redis).await.unwrap();
    match kind.as_str() {
        "string" => (redis.strlen(key).await.unwrap(), 0),
        "hash" => {
            let state: usize =
                redis::cmd("HSTRLEN").arg(key).arg("s").query_async(redis).await.unwrap();
            let fields: usize = redis.hlen(key).await.unwrap();
            (state, fields - 1)
        }
        other => panic!("{key} is a {other}"),
    }
}

/// Runs one subject through `windows` windows, evaluating `per_window` times
/// in each window that `active` picks, and returns the key's state length
/// and record fields (two per record) after window 10 and at the end.
async fn key_length_over_windows(
    policy: RateLimitPolicy,
    windows: u64,
    active: impl Fn(u64) -> bool,
) -> ((usize, usize), (usize, usize)) {
    let server = RedisServer::start();
    let period = shared_contract::millis(policy.algorithm().quota_window(|| T0).unwrap());
    let clock = ManualClock::new(T0);
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let who = subject(4);
    let key = adapter.keys().counter_key(&policy, &who, &support::operation());
    let mut redis = inspector(&server).await;
    let mut at_ten = (0, 0);
    for window in 0..windows {
        if active(window) {
            for offset in [100, 400] {
                clock.set_epoch_millis(T0 + window * period + offset);
                let outcome = adapter.evaluate(request(&clock, policy.id().as_str(), &who)).await;
                assert!(outcome.is_allowed(), "window {window}: {outcome:?}");
            }
        }
        if window == 10 {
            at_ten = footprint(&mut redis, &key).await;
        }
    }
    (at_ten, footprint(&mut redis, &key).await)
}

/// Each algorithm with its header size: one tag byte, then the mark and two
/// (sliding counter: three) doubles.
fn all_algorithms(dedup: EvaluationDedupPolicy) -> Vec<(RateLimitPolicy, usize)> {
    let window = Duration::from_secs(1);
    [
        (Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 10, window }), 25),
        (Algorithm::SlidingCounter(shared_contract::SlidingCounter { limit: 10, window }), 33),
        (
            Algorithm::TokenBucket(shared_contract::TokenBucket {
                capacity: 10,
                refill_tokens: 5,
                refill_period: Duration::from_millis(500),
            }),
            25,
        ),
        (Algorithm::Gcra(shared_contract::Gcra { limit: 10, period: window, burst: 10 }), 17),
        (
            Algorithm::CalendarWindow(shared_contract::CalendarWindow {
                limit: 10,
                period: shared_contract::CalendarPeriod::Day,
                time_zone: shared_contract::CalendarZone::default(),
            }),
            25,
        ),
    ]
    .into_iter()
    .map(|(algorithm, header)| {
        let policy = RateLimitPolicy::builder(algorithm.name(), algorithm)
            .evaluation_dedup(dedup)
            .build()
            .unwrap();
        (policy, header)
    })
    .collect()
}

#[tokio::test]
async fn state_stays_constant_size_after_1000_windows_of_steady_traffic() {
    for (policy, header) in all_algorithms(EvaluationDedupPolicy::Disabled) {
        let (at_ten, at_end) = key_length_over_windows(policy.clone(), 1000, |_| true).await;
        // The state is the header alone: mark plus the algorithm's numbers,
        // and no records.
        assert_eq!((at_ten, at_end), ((header, 0), (header, 0)), "{}", policy.id());
    }
    // With dedupe the records come and go with traffic, but the state keeps
    // its size and the records never outgrow max_entries, window 10 or
    // window 1000.
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_millis(500),
        max_entries: 4,
        max_stored_bytes: 4096,
    };
    for (policy, header) in all_algorithms(dedup) {
        for windows in [1000, 1001] {
            let (at_ten, at_end) = key_length_over_windows(policy.clone(), windows, |_| true).await;
            for (state, fields) in [at_ten, at_end] {
                // The header and the records trailer (newest and oldest
                // written_at, oldest and next seq, the expiry last set).
                assert_eq!(state, header + 40, "{}", policy.id());
                // This window's two records (written 300 ms apart, TTL
                // 500 ms) are live, an id field and a seq field each;
                // expired ones wait for an append at the cap to sweep them.
                assert!((2 * 2..=2 * 4).contains(&fields), "{}: {fields}", policy.id());
            }
        }
    }
}

#[tokio::test]
async fn state_stays_constant_size_with_traffic_every_third_window() {
    for (policy, header) in all_algorithms(EvaluationDedupPolicy::Disabled) {
        let (at_ten, at_end) =
            key_length_over_windows(policy.clone(), 1000, |window| window % 3 == 0).await;
        // Window 10 is idle; the key still holds window 9's state.
        assert_eq!((at_ten, at_end), ((header, 0), (header, 0)), "{}", policy.id());
    }
}

#[tokio::test]
async fn keys_hold_pseudonym_policy_revision_and_operation_digest_and_nothing_else_of_the_subject()
{
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let window = Duration::from_secs(1);
    let orders = RateLimitPolicy::builder(
        "api.orders",
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 5, window }),
    )
    .revision(3)
    .build()
    .unwrap();
    let daily = RateLimitPolicy::builder(
        "api.daily",
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 50, window }),
    )
    .scope(PolicyScope::Subject)
    .build()
    .unwrap();
    let adapter = adapter(&server, &clock, vec![orders.clone(), daily.clone()], |_| {});
    let who = subject(0xab);
    let mut set = request(&clock, "api.orders", &who);
    set.policies = PolicySet::new([orders.id().clone(), daily.id().clone()]).unwrap().into();
    assert!(adapter.evaluate(set).await.is_allowed());
    let mut redis = inspector(&server).await;
    let mut keys: Vec<String> = redis.keys("*").await.unwrap();
    keys.sort_unstable();
    // The subject alone in the hash tag; the operation digest only on the
    // operation-scoped policy's key (docs/operations.md#key-layout-and-the-slot-rule).
    let scoped = format!("ca:rl:{{{who}}}:api.orders:3:{}", support::OPERATION);
    let shared = format!("ca:rl:{{{who}}}:api.daily:1");
    // Nothing else: with dedupe on (the default) each key holds its
    // records.
    assert_eq!(keys, [shared.clone(), scoped.clone()]);
    assert_eq!(adapter.keys().counter_key(&orders, &who, &support::operation()), scoped);
    assert_eq!(adapter.keys().counter_key(&daily, &who, &support::operation()), shared);
    assert_eq!(RateLimitKeys::hash_tag(&who), format!("{{{who}}}"));
    // The values hold numbers and evaluation ids only, not the pseudonym.
    for key in [&scoped, &shared] {
        let records: Vec<Vec<u8>> =
            redis::cmd("HGETALL").arg(key).query_async(&mut redis).await.unwrap();
        // The state and one record: its id field and its seq field.
        assert_eq!(records.len(), 2 * 3, "{key}");
        for item in records {
            let pseudonym = who.to_string();
            assert!(!item.windows(pseudonym.len()).any(|w| w == pseudonym.as_bytes()));
        }
    }
}

#[tokio::test]
async fn key_lifetime_is_state_end_or_last_record_plus_the_larger_of_grace_and_regression() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let window = Duration::from_secs(1);
    let slack = |algorithm: Algorithm, id: &str, dedup| {
        RateLimitPolicy::builder(id, algorithm)
            .cleanup_grace(Duration::from_millis(250))
            .maximum_clock_regression(Duration::from_millis(900))
            .evaluation_dedup(dedup)
            .build()
            .unwrap()
    };
    let bucket = Algorithm::TokenBucket(shared_contract::TokenBucket {
        capacity: 5,
        refill_tokens: 1,
        refill_period: Duration::from_millis(100),
    });
    let off = EvaluationDedupPolicy::Disabled;
    // (policy, expected lifetime in ms) from docs/algorithms.md step 7, G = 900:
    let cases = [
        // fixed: state_end T0+1000 -> 750 + 900
        (
            slack(
                Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 3, window }),
                "fw",
                off,
            ),
            1650,
        ),
        // sliding: state_end T0+2000 -> 1750 + 900
        (
            slack(
                Algorithm::SlidingCounter(shared_contract::SlidingCounter { limit: 3, window }),
                "sc",
                off,
            ),
            2650,
        ),
        // bucket: 4 tokens left, full after one period from T0+250 -> 100 + 900
        (slack(bucket, "tb", off), 1000),
        // dedupe 5 s: the record outlives the window -> 5000 + 900
        (
            slack(
                Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 3, window }),
                "fwd",
                EvaluationDedupPolicy::enabled_defaults(),
            ),
            5900,
        ),
    ];
    let policies: Vec<_> = cases.iter().map(|(policy, _)| policy.clone()).collect();
    let adapter = adapter(&server, &clock, policies, |_| {});
    let mut redis = inspector(&server).await;
    let who = subject(5);
    for (policy, lifetime) in cases {
        assert!(adapter.evaluate(request(&clock, policy.id().as_str(), &who)).await.is_allowed());
        let pttl: i64 = redis
            .pttl(adapter.keys().counter_key(&policy, &who, &support::operation()))
            .await
            .unwrap();
        // PTTL counts down in real time from the lifetime the script set.
        assert!(
            (lifetime - 200..=lifetime).contains(&pttl),
            "{}: pttl {pttl}, want {lifetime}",
            policy.id()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_send_is_indeterminate_and_a_repeat_replays_the_charge_it_made() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let adapter = adapter(
        &server,
        &clock,
        vec![fixed("p", 3, EvaluationDedupPolicy::enabled_defaults())],
        |settings| settings.command_timeout = Duration::from_millis(100),
    );
    let who = subject(6);
    // Connect and load the script first, so only the EVALSHA meets the stall.
    assert_eq!(remaining(&adapter.evaluate(request(&clock, "p", &who)).await), 2);

    // Another client keeps the single-threaded server busy for 1.5 s.
    let patient = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut busy = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&patient)
        .await
        .unwrap();
    let stall = tokio::spawn(async move {
        let script = "local s = redis.call('TIME') \
                      local start = s[1] * 1000000 + s[2] \
                      while true do \
                        local t = redis.call('TIME') \
                        if t[1] * 1000000 + t[2] - start > 1500000 then return 1 end \
                      end";
        let _: i64 = redis::cmd("EVAL").arg(script).arg(0).query_async(&mut busy).await.unwrap();
    });
    // Give the stall a head start: its EVAL must reach the server first.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let id = EvaluationId::random();
    let outcome =
        adapter.evaluate(request_with(&clock, "p", &who, id, Duration::from_millis(400))).await;
    assert!(matches!(outcome, Err(RateLimitFailure::Indeterminate { .. })), "{outcome:?}");
    stall.await.unwrap();

    // The stalled EVALSHA ran once the server was free and charged once; its
    // retry (same id) replayed. A repeat now replays too, charging nothing.
    let repeat =
        adapter.evaluate(request_with(&clock, "p", &who, id, Duration::from_secs(2))).await;
    match repeat {
        Ok(set) => {
            assert!(set.allowed() && set.replayed(), "{set:?}");
            assert_eq!(set.decisions()[0].remaining, 1);
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(remaining(&adapter.evaluate(request(&clock, "p", &who)).await), 0);
}

/// A reset deletes the counter key, records and all, touches no other key,
/// and an inspect reads without writing: the key's value and TTL stay.
#[tokio::test]
async fn reset_deletes_the_counter_key_with_its_records_and_inspect_writes_nothing() {
    use shared_contract::BudgetKey;

    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let policy = fixed("p", 3, EvaluationDedupPolicy::enabled_defaults());
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let (who, other) = (subject(40), subject(41));
    for subject in [&who, &other] {
        assert_eq!(remaining(&adapter.evaluate(request(&clock, "p", subject)).await), 2);
    }
    let key = adapter.keys().counter_key(&policy, &who, &support::operation());
    let other_key = adapter.keys().counter_key(&policy, &other, &support::operation());
    let mut redis = inspector(&server).await;
    let probe = redis.clone();
    let exists = |keys: Vec<String>| {
        let mut redis = probe.clone();
        async move {
            let count: usize =
                redis::cmd("EXISTS").arg(keys).query_async(&mut redis).await.unwrap();
            count
        }
    };
    assert_eq!(exists(vec![key.clone()]).await, 1);

    let budget = BudgetKey::new(who, policy.id().clone(), Some(support::operation()));
    let hash = |redis: &mut redis::aio::MultiplexedConnection| {
        let mut redis = redis.clone();
        let key = key.clone();
        async move {
            let all: Vec<Vec<u8>> =
                redis::cmd("HGETALL").arg(&key).query_async(&mut redis).await.unwrap();
            all
        }
    };
    let value = hash(&mut redis).await;
    let ttl: i64 = redis.pttl(&key).await.unwrap();
    clock.set_epoch_millis(T0 + 600);
    let seen = adapter.inspect(&budget).await.unwrap();
    assert_eq!((seen.remaining, seen.mark), (2, Some(T0 + 250)));
    let after = hash(&mut redis).await;
    let ttl_after: i64 = redis.pttl(&key).await.unwrap();
    assert_eq!(after, value, "inspect wrote the key");
    assert!(ttl_after <= ttl, "inspect extended the key: {ttl} -> {ttl_after}");

    adapter.reset(&budget).await.unwrap();
    assert_eq!(exists(vec![key.clone()]).await, 0);
    assert_eq!(exists(vec![other_key.clone()]).await, 1);
    adapter.reset(&budget).await.unwrap();
    assert_eq!(remaining(&adapter.evaluate(request(&clock, "p", &who)).await), 2);
}

/// The operator's calls fail typed, never by panic: a key of a Redis type
/// no script writes is `StateIncompatible` to inspect and still resets (one `UNLINK` takes
/// any type); a stopped server is `Unavailable` to both.
#[tokio::test]
async fn inspect_and_reset_failures_are_typed() {
    use shared_contract::{BudgetFailure, BudgetKey};

    let mut server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = fixed("p", 3, EvaluationDedupPolicy::enabled_defaults());
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let who = subject(42);
    let key = adapter.keys().counter_key(&policy, &who, &support::operation());
    let mut redis = inspector(&server).await;
    let _: () = redis.rpush(&key, "v").await.unwrap();
    let budget = BudgetKey::new(who, policy.id().clone(), Some(support::operation()));
    assert_eq!(adapter.inspect(&budget).await, Err(BudgetFailure::StateIncompatible));
    assert_eq!(adapter.reset(&budget).await, Ok(()));
    assert_eq!(adapter.inspect(&budget).await.map(|state| state.remaining), Ok(3));
    server.stop();
    assert_eq!(adapter.inspect(&budget).await, Err(BudgetFailure::Unavailable));
    assert_eq!(adapter.reset(&budget).await, Err(BudgetFailure::Unavailable));
}

/// The policy's dedupe decides the key's type (a string without, a hash
/// with records beside the state); a restart that turned dedupe on or off
/// under the same revision reads the other type and converts it at its next
/// write, keeping the count.
#[tokio::test]
async fn a_key_written_with_dedupe_off_is_taken_over_with_dedupe_on_and_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let (off, on) = (
        fixed("p", 5, EvaluationDedupPolicy::Disabled),
        fixed("p", 5, EvaluationDedupPolicy::enabled_defaults()),
    );
    let without = adapter(&server, &clock, vec![off.clone()], |_| {});
    let with = adapter(&server, &clock, vec![on], |_| {});
    let who = subject(50);
    let key = without.keys().counter_key(&off, &who, &support::operation());
    let mut redis = inspector(&server).await;
    let kind = |redis: &mut redis::aio::MultiplexedConnection| {
        let mut redis = redis.clone();
        let key = key.clone();
        async move {
            let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut redis).await.unwrap();
            kind
        }
    };
    for expected in [4, 3] {
        assert_eq!(remaining(&without.evaluate(request(&clock, "p", &who)).await), expected);
    }
    assert_eq!(kind(&mut redis).await, "string");
    let id = EvaluationId::random();
    let charged = with.evaluate(request_with(&clock, "p", &who, id, Duration::from_secs(5))).await;
    assert_eq!(remaining(&charged), 2);
    assert_eq!(kind(&mut redis).await, "hash");
    match with.evaluate(request_with(&clock, "p", &who, id, Duration::from_secs(5))).await {
        Ok(set) => {
            assert!(set.decisions()[0].replayed);
            assert_eq!(set.decisions()[0].remaining, 2);
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(remaining(&without.evaluate(request(&clock, "p", &who)).await), 1);
    assert_eq!(kind(&mut redis).await, "string");
}

/// A key with dedupe records gets its lifetime from the same rule as every
/// key (docs/algorithms.md step 7), counted from the writer's clock. Redis
/// holds the expiry as an instant of its own clock, so each write asks for
/// its lifetime and a shorter ask never brings the expiry closer: here the
/// caller's clock runs 60 s while Redis's hardly moves, as a writer whose
/// clock is behind another's would see it.
#[tokio::test]
async fn a_dedupe_key_s_expiry_is_the_latest_any_write_asked_for() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_millis(500),
        max_entries: 256,
        max_stored_bytes: 65_536,
    };
    let window = Duration::from_secs(60);
    let policy = RateLimitPolicy::builder(
        "p",
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 100, window }),
    )
    .cleanup_grace(Duration::from_millis(250))
    .maximum_clock_regression(Duration::from_millis(900))
    .evaluation_dedup(dedup)
    .build()
    .unwrap();
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let who = subject(51);
    let key = adapter.keys().counter_key(&policy, &who, &support::operation());
    let mut redis = inspector(&server).await;
    let mut charge_at = async |at: u64| -> i64 {
        clock.set_epoch_millis(T0 + at);
        assert!(adapter.evaluate(request(&clock, "p", &who)).await.is_allowed());
        redis.pttl(&key).await.unwrap()
    };
    // The window's end (T0 + 60 s) outlives the record: 59,750 + 900 ms.
    let first = charge_at(250).await;
    assert!((60_450..=60_650).contains(&first), "{first}");
    // Ten seconds later by the caller's clock this write asks for 50,650
    // ms: the expiry already in place is later, and stays.
    let kept = charge_at(10_250).await;
    assert!(kept > first - 200 && kept <= first, "{first} -> {kept}");
    // In the next window the state lives to T0 + 120 s: 59,900 + 900 ms.
    let grown = charge_at(60_100).await;
    assert!((60_600..=60_800).contains(&grown), "{grown}");
}

/// Records never outnumber max_entries, and expired ones are swept from
/// the oldest at every write: a subject whose records all expire between
/// its requests holds only its newest, and an append at the cap after they
/// all expired sweeps them at once.
#[tokio::test]
async fn dedupe_records_stay_within_the_cap_and_expired_ones_are_swept() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = |max_entries| {
        let dedup = EvaluationDedupPolicy::Enabled {
            ttl: Duration::from_secs(1),
            max_entries,
            max_stored_bytes: 65_536,
        };
        RateLimitPolicy::builder(
            format!("p{max_entries}"),
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 1_000,
                window: Duration::from_secs(1),
            }),
        )
        .evaluation_dedup(dedup)
        .build()
        .unwrap()
    };
    let (capped, roomy) = (policy(4), policy(256));
    let adapter = adapter(&server, &clock, vec![capped.clone(), roomy.clone()], |_| {});
    let who = subject(52);
    let mut redis = inspector(&server).await;
    let capped_key = adapter.keys().counter_key(&capped, &who, &support::operation());
    for _ in 0..10 {
        assert!(adapter.evaluate(request(&clock, "p4", &who)).await.is_allowed());
        let (_, fields) = footprint(&mut redis, &capped_key).await;
        assert!(fields <= 2 * 4, "{fields}");
    }
    clock.set_epoch_millis(T0 + 2_000);
    assert!(adapter.evaluate(request(&clock, "p4", &who)).await.is_allowed());
    assert_eq!(footprint(&mut redis, &capped_key).await.1, 2, "only the new record is left");

    let roomy_key = adapter.keys().counter_key(&roomy, &who, &support::operation());
    let mut most = 0;
    for n in 0..40 {
        clock.set_epoch_millis(T0 + 10_000 + n * 1_500);
        assert!(adapter.evaluate(request(&clock, "p256", &who)).await.is_allowed());
        most = most.max(footprint(&mut redis, &roomy_key).await.1 / 2);
    }
    assert_eq!(most, 1, "each write drops the records that expired before it");
}

/// A value is a header alone or a header and the 40-byte records trailer;
/// a header with a 24-byte trailer (records kept in `<key>:dedupe`, a layout
/// never released) is corrupt like any other length, with dedupe on or off:
/// evaluate and inspect refuse it and leave it as it was.
#[tokio::test]
async fn a_header_with_a_24_byte_trailer_is_corrupt_state() {
    use shared_contract::{BudgetFailure, BudgetKey};

    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 300);
    let policies = vec![
        fixed("on", 5, EvaluationDedupPolicy::enabled_defaults()),
        fixed("off", 5, EvaluationDedupPolicy::Disabled),
    ];
    let adapter = adapter(&server, &clock, policies.clone(), |_| {});
    let who = subject(53);
    let mut redis = inspector(&server).await;
    // 'F', then mark, window start and count; then newest written_at, oldest
    // and next sequence number.
    #[allow(clippy::cast_precision_loss)] // whole numbers far below 2^53
    let doubles = [(T0 + 250) as f64, T0 as f64, 2.0, (T0 + 250) as f64, 0.0, 2.0];
    let mut value = vec![b'F'];
    for double in doubles {
        value.extend(double.to_le_bytes());
    }
    assert_eq!(value.len(), 25 + 24);
    for policy in &policies {
        let key = adapter.keys().counter_key(policy, &who, &support::operation());
        let _: () = redis.set(&key, &value).await.unwrap();
        assert_eq!(
            adapter.evaluate(request(&clock, policy.id().as_str(), &who)).await,
            Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::StateIncompatible
            }),
            "{}",
            policy.id()
        );
        let budget = BudgetKey::new(who, policy.id().clone(), Some(support::operation()));
        assert_eq!(adapter.inspect(&budget).await, Err(BudgetFailure::StateIncompatible));
        let kept: Vec<u8> = redis.get(&key).await.unwrap();
        assert_eq!(kept, value, "{}", policy.id());
    }
}

/// Expired records go at the key's next write, whatever the write
/// (docs/algorithms.md step 7): a token bucket's refusal writes its refill,
/// so a subject refused for a while sheds the records of its earlier
/// admissions, a bounded batch per write, instead of keeping them for the
/// bucket's whole lifetime.
#[tokio::test]
async fn a_refused_token_bucket_sheds_its_expired_records() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let bucket = Algorithm::TokenBucket(shared_contract::TokenBucket {
        capacity: 150,
        refill_tokens: 1,
        refill_period: Duration::from_secs(3_600),
    });
    let policy = RateLimitPolicy::builder("tb", bucket)
        .evaluation_dedup(EvaluationDedupPolicy::enabled_defaults())
        .build()
        .unwrap();
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let who = subject(54);
    let key = adapter.keys().counter_key(&policy, &who, &support::operation());
    let mut redis = inspector(&server).await;
    let mut admitted = 0;
    for _ in 0..200 {
        admitted += usize::from(adapter.evaluate(request(&clock, "tb", &who)).await.is_allowed());
    }
    assert_eq!(admitted, 150);
    assert_eq!(footprint(&mut redis, &key).await.1, 2 * 150, "one id and one seq field each");
    // Past the 5 s record ttl every record is expired; the bucket is empty
    // for hours, so each request is refused and writes the refill.
    clock.set_epoch_millis(T0 + 6_000);
    for _ in 0..100 {
        assert!(!adapter.evaluate(request(&clock, "tb", &who)).await.is_allowed());
    }
    assert_eq!(footprint(&mut redis, &key).await.1, 0, "expired records left in the hash");
}

/// `max-stored-bytes` bounds what a key stores on Redis: each record is
/// its two hash fields with their values (`DEDUP_RECORD_BYTES`), so the
/// field bytes stay within the bound, and `MEMORY USAGE` (which adds Redis's
/// own bookkeeping per field) within 2.6 times it (docs/algorithms.md). Run
/// with `--nocapture`, it prints the figures docs/benchmarks.md quotes.
#[tokio::test]
async fn stored_record_bytes_stay_within_max_stored_bytes() {
    use shared_contract::DEDUP_RECORD_BYTES;

    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let per_record = usize::try_from(DEDUP_RECORD_BYTES).unwrap();
    // (max-entries, ttl, charges, records held): the byte bound binding,
    // then the defaults, where the 256 entries bind first.
    let cases = [(65_536, 60, 1_800, 65_536 / per_record), (256, 5, 300, 256)];
    let mut redis = inspector(&server).await;
    for (n, (max_entries, ttl, charges, held)) in cases.into_iter().enumerate() {
        let bound = 65_536_usize;
        let dedup = EvaluationDedupPolicy::Enabled {
            ttl: Duration::from_secs(ttl),
            max_entries,
            max_stored_bytes: u32::try_from(bound).unwrap(),
        };
        let window = Duration::from_secs(60);
        let policy = RateLimitPolicy::builder(
            "p",
            Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 100_000, window }),
        )
        .evaluation_dedup(dedup)
        .build()
        .unwrap();
        let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
        let who = subject(60 + u8::try_from(n).unwrap());
        let key = adapter.keys().counter_key(&policy, &who, &support::operation());
        for _ in 0..charges {
            assert!(adapter.evaluate(request(&clock, "p", &who)).await.is_allowed());
        }
        let all: Vec<Vec<u8>> =
            redis::cmd("HGETALL").arg(&key).query_async(&mut redis).await.unwrap();
        let (mut stored, mut fields) = (0, 0);
        for pair in all.chunks(2) {
            if pair[0] != b"s" {
                stored += pair[0].len() + pair[1].len();
                fields += 1;
            }
        }
        // Two fields per record, each pair of them DEDUP_RECORD_BYTES.
        assert_eq!(fields / 2, held, "records held");
        assert_eq!(stored, held * per_record, "the count is what is stored");
        assert!(stored <= bound, "{stored} bytes of records against a bound of {bound}");
        // SAMPLES 0 counts every field; the default estimates from five.
        let usage: usize = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut redis)
            .await
            .unwrap();
        println!(
            "max-entries {max_entries}, max-stored-bytes {bound}: {held} records, {stored} B of \
             fields, MEMORY USAGE {usage} B"
        );
        assert!(usage <= bound * 13 / 5, "MEMORY USAGE {usage} against a bound of {bound}");
    }
}

/// Failed calls and error replies the server has counted (`INFO
/// commandstats` and `errorstats`), so a test can show a script raised
/// none: operators alert on them.
async fn error_counts(redis: &mut redis::aio::MultiplexedConnection) -> (u64, String) {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(redis).await.unwrap();
    let failed = info
        .lines()
        .filter_map(|line| line.split("failed_calls=").nth(1))
        .map(|rest| rest.split(',').next().unwrap().trim().parse::<u64>().unwrap())
        .sum();
    let errors: String = redis::cmd("INFO").arg("errorstats").query_async(redis).await.unwrap();
    let errors = errors.lines().filter(|line| line.starts_with("errorstat_")).collect();
    (failed, errors)
}

/// An operator's inspect reads the key the way it is stored, asking its
/// type first, so inspecting a hash (dedupe on, the default), a string
/// (dedupe off) or an absent key raises no error on the server.
#[tokio::test]
async fn inspect_raises_no_error_on_the_server_whatever_the_key_s_type() {
    use shared_contract::BudgetKey;

    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let (on, off) = (
        fixed("on", 3, EvaluationDedupPolicy::enabled_defaults()),
        fixed("off", 3, EvaluationDedupPolicy::Disabled),
    );
    let adapter = adapter(&server, &clock, vec![on.clone(), off.clone()], |_| {});
    let (who, nobody) = (subject(56), subject(57));
    for policy in ["on", "off"] {
        assert_eq!(remaining(&adapter.evaluate(request(&clock, policy, &who)).await), 2);
    }
    let mut redis = inspector(&server).await;
    let before = error_counts(&mut redis).await;
    for policy in [&on, &off] {
        for subject in [&who, &nobody] {
            let budget = BudgetKey::new(*subject, policy.id().clone(), Some(support::operation()));
            let seen = adapter.inspect(&budget).await.unwrap();
            assert_eq!(seen.remaining, if subject == &who { 2 } else { 3 });
        }
    }
    assert_eq!(error_counts(&mut redis).await, before, "inspect raised an error on the server");
}

/// An admin reset deletes with `UNLINK`, so a key at a large record cap is
/// freed off Redis's main thread rather than blocking it.
#[tokio::test]
async fn reset_unlinks_the_key() {
    use shared_contract::BudgetKey;

    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let policy = fixed("p", 3, EvaluationDedupPolicy::enabled_defaults());
    let adapter = adapter(&server, &clock, vec![policy.clone()], |_| {});
    let who = subject(58);
    assert!(adapter.evaluate(request(&clock, "p", &who)).await.is_allowed());
    let mut redis = inspector(&server).await;
    let calls = |info: &str, command: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse::<u64>().unwrap())
    };
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut redis).await.unwrap();
    let budget = BudgetKey::new(who, policy.id().clone(), Some(support::operation()));
    adapter.reset(&budget).await.unwrap();
    let info: String =
        redis::cmd("INFO").arg("commandstats").query_async(&mut redis).await.unwrap();
    assert_eq!((calls(&info, "unlink"), calls(&info, "del")), (1, 0), "{info}");
    let key = adapter.keys().counter_key(&policy, &who, &support::operation());
    let exists: usize = redis.exists(&key).await.unwrap();
    assert_eq!(exists, 0);
}

/// A policy whose dedupe was turned off across a restart (same revision)
/// reads a hash where it expects a string: that read fails with
/// `WRONGTYPE` inside the script, which the server counts. The first such
/// read converts the key (its state kept, its expiry kept), so a subject
/// that is only refused afterwards, which writes nothing, raises no more.
#[tokio::test]
async fn a_hash_read_by_a_dedupe_off_policy_is_converted_at_once() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0 + 250);
    let (on, off) = (
        fixed("p", 2, EvaluationDedupPolicy::enabled_defaults()),
        fixed("p", 2, EvaluationDedupPolicy::Disabled),
    );
    let with = adapter(&server, &clock, vec![on], |settings| settings.deny_cache.enabled = false);
    let without =
        adapter(&server, &clock, vec![off.clone()], |settings| settings.deny_cache.enabled = false);
    let who = subject(59);
    for expected in [1, 0] {
        assert_eq!(remaining(&with.evaluate(request(&clock, "p", &who)).await), expected);
    }
    let key = without.keys().counter_key(&off, &who, &support::operation());
    let mut redis = inspector(&server).await;
    let ttl: i64 = redis.pttl(&key).await.unwrap();
    let (failed, _) = error_counts(&mut redis).await;
    for _ in 0..5 {
        let outcome = without.evaluate(request(&clock, "p", &who)).await;
        assert!(!outcome.is_allowed(), "the count survived the change: {outcome:?}");
    }
    assert_eq!(error_counts(&mut redis).await.0, failed + 1, "one WRONGTYPE, then none");
    let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut redis).await.unwrap();
    assert_eq!(kind, "string");
    let kept: i64 = redis.pttl(&key).await.unwrap();
    assert!(kept <= ttl && kept > ttl - 200, "expiry kept: {ttl} -> {kept}");
}
