//! Failure mapping against a mock gateway: every row of docs/operations.md#what-each-redis-failure-becomes.

use std::sync::Mutex;

use mockall::Sequence;
use redis::Value;
use shared_contract::{
    EvaluationId, ManualClock, OperationDigest, PolicyScope, PolicySet, RateLimitOutcomeExt,
    ReleaseOutcome, SubjectDigest,
};

use super::*;
use crate::ScriptLaneSettings;
use crate::gateway::{LoadedScript, MockRedisGateway};

use crate::T0;

fn fixed_policy(dedup: EvaluationDedupPolicy) -> RateLimitPolicy {
    RateLimitPolicy::builder(
        "api.test",
        shared_contract::Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_secs(1),
        }),
    )
    .maximum_cost(2)
    .evaluation_dedup(dedup)
    .build()
    .unwrap()
}

fn adapter_with(
    gateway: MockRedisGateway,
    dedup: EvaluationDedupPolicy,
    settings: RedisSettings,
) -> (RedisEdgeRateLimitAdapter, ManualClock) {
    let clock = ManualClock::new(T0 + 250);
    let adapter = RedisEdgeRateLimitAdapter::with_gateway(
        settings,
        [fixed_policy(dedup)],
        Arc::new(clock.clone()),
        Arc::new(gateway),
    )
    .unwrap();
    (adapter, clock)
}

fn adapter(gateway: MockRedisGateway, dedup: EvaluationDedupPolicy) -> RedisEdgeRateLimitAdapter {
    adapter_with(gateway, dedup, RedisSettings::default()).0
}

/// The test operation as its keys print it.
const OPERATION: &str = "00112233445566778899aabbccddeeff";

fn request(
    clock_now: std::time::Instant,
    cost: u64,
    budget: Duration,
) -> RateLimitRequest<'static> {
    RateLimitRequest {
        policies: PolicySet::single(PolicyId::new("api.test").unwrap()).into(),
        subject: SubjectDigest::parse(format!("v1:{}", "ab".repeat(16))).unwrap(),
        operation: OperationDigest::from_u128(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff),
        cost,
        evaluation_id: EvaluationId::random(),
        deadline: clock_now + budget,
    }
}

/// A decided reply: the set's status, then per key its answer (0 denied,
/// 1 allowed, 2 replayed), remaining, reset_after and retry_after.
fn reply(status: &str, keys: &[[i64; 4]]) -> Value {
    let mut items = vec![Value::BulkString(status.as_bytes().to_vec())];
    items.extend(keys.iter().flatten().copied().map(Value::Int));
    Value::Array(items)
}

/// A `clock_unsafe` or `corrupt` reply: the status and one number.
fn failure(status: &str, number: i64) -> Value {
    Value::Array(vec![Value::BulkString(status.as_bytes().to_vec()), Value::Int(number)])
}

/// The key of `policy` for the test subject and operation.
fn key_of(policy: &str, scope: PolicyScope) -> String {
    let tail = match scope {
        PolicyScope::Operation => format!(":{OPERATION}"),
        PolicyScope::Subject => String::new(),
    };
    format!("ca:rl:{{v1:{}}}:{policy}:1{tail}", "ab".repeat(16))
}

fn owned(args: &[Arc<[u8]>]) -> Vec<Vec<u8>> {
    args.iter().map(|arg| arg.to_vec()).collect()
}

/// A gateway whose script is loaded once and whose EVALSHA answers `result`.
fn gateway_answering(
    result: impl Fn() -> Result<Value, GatewayFailure> + Send + 'static,
    times: usize,
) -> MockRedisGateway {
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|_, _, _| Ok("digest-1".to_owned()));
    gateway.expect_evalsha().times(times).returning(move |_, _, _, _| result());
    gateway
}

async fn evaluate_once(adapter: &RedisEdgeRateLimitAdapter, cost: u64) -> RateLimitOutcome {
    adapter.evaluate(request(adapter.clock.monotonic(), cost, Duration::from_millis(750))).await
}

const OFF: EvaluationDedupPolicy = EvaluationDedupPolicy::Disabled;
const ON: EvaluationDedupPolicy = EvaluationDedupPolicy::enabled_defaults();

fn before_send() -> RateLimitOutcome {
    Err(RateLimitFailure::Unavailable {
        category: UnavailableCategory::UnavailableBeforeSend,
        retry_after: Duration::from_secs(1),
    })
}

fn state_incompatible() -> RateLimitOutcome {
    Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible })
}

fn indeterminate() -> RateLimitOutcome {
    Err(RateLimitFailure::Indeterminate { retry_after: Duration::from_secs(1) })
}

#[tokio::test]
async fn unknown_policy_oversized_cost_and_expired_deadline_never_reach_the_gateway() {
    // No expectations: any gateway call fails the test.
    let adapter = adapter(MockRedisGateway::new(), ON);
    let now = adapter.clock.monotonic();
    // One unknown policy anywhere in the set, even after a known one.
    for ids in [&["api.other"][..], &["api.test", "api.other"]] {
        let mut unknown = request(now, 1, Duration::from_millis(750));
        unknown.policies =
            PolicySet::new(ids.iter().map(|id| PolicyId::new(*id).unwrap())).unwrap().into();
        assert_eq!(
            adapter.evaluate(unknown).await,
            Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::UnknownPolicy })
        );
    }
    for cost in [0, 3] {
        assert_eq!(
            adapter.evaluate(request(now, cost, Duration::from_millis(750))).await,
            Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::CostExceedsMaximum
            })
        );
    }
    let mut expired = request(now, 1, Duration::ZERO);
    expired.deadline = now;
    assert_eq!(
        adapter.evaluate(expired).await,
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::AdmissionRejected,
            retry_after: Duration::from_secs(1),
        })
    );
}

#[tokio::test]
async fn an_allowed_reply_becomes_a_certain_decision_and_the_digest_is_cached() {
    let adapter = adapter(gateway_answering(|| Ok(reply("allowed", &[[1, 2, 750, 0]])), 2), OFF);
    let expected = Ok(SetDecision::single(RateLimitDecision {
        allowed: true,
        remaining: 2,
        retry_after_ms: 0,
        reset_after_ms: 750,
        replayed: false,
    }));
    // Two evaluations, one SCRIPT LOAD (the mock allows exactly one).
    assert_eq!(evaluate_once(&adapter, 1).await, expected);
    assert_eq!(evaluate_once(&adapter, 1).await, expected);
}

#[tokio::test]
async fn a_denial_carries_at_least_one_millisecond_of_retry_after() {
    let adapter = adapter(gateway_answering(|| Ok(reply("denied", &[[0, 0, 750, 0]])), 1), OFF);
    let Ok(set) = evaluate_once(&adapter, 1).await else {
        panic!("expected a decision");
    };
    let decision = set.decisions()[0];
    assert!(!decision.allowed && !set.allowed());
    assert_eq!(decision.retry_after_ms, 1);
}

#[tokio::test]
async fn the_script_arguments_carry_caller_time_cost_bounds_and_evaluation_id() {
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|source, key, _| {
        // A set of one runs its algorithm's single-key script.
        assert_eq!(
            source,
            ScriptKind::Single(shared_contract::AlgorithmKind::FixedWindow).source()
        );
        // Loaded where the key lives (in a cluster, the key's slot owner).
        assert_eq!(key, key_of("api.test", PolicyScope::Operation));
        Ok("digest-1".to_owned())
    });
    let sink = seen.clone();
    gateway.expect_evalsha().times(1).returning(move |script, keys, args, _| {
        // The digest travels with its source (a cluster's ASK target loads it).
        assert_eq!(
            *script,
            LoadedScript {
                digest: "digest-1".into(),
                source: ScriptKind::Single(shared_contract::AlgorithmKind::FixedWindow).source()
            }
        );
        // The counter key alone: with dedupe on it holds the records too.
        assert_eq!(keys, [key_of("api.test", PolicyScope::Operation)]);
        *sink.lock().unwrap() = owned(args);
        Ok(reply("allowed", &[[1, 1, 750, 0]]))
    });
    let adapter = adapter(gateway, ON);
    let request = request(adapter.clock.monotonic(), 2, Duration::from_millis(750));
    let id = request.evaluation_id;
    let _ = adapter.evaluate(request).await;
    let args = seen.lock().unwrap().clone();
    let text = |i: usize| String::from_utf8(args[i].clone()).unwrap();
    // now, cost, id; kind, regression, slack, dedupe ttl, capacity, limit, window
    assert_eq!(args.len(), 10);
    assert_eq!(text(0), (T0 + 250).to_string());
    assert_eq!(text(1), "2");
    assert_eq!(args[2], id.as_bytes().to_vec());
    assert_eq!(text(3), "F");
    assert_eq!(
        (text(4), text(5), text(6), text(7)),
        ("1000".into(), "1000".into(), "5000".into(), "256".into())
    );
    assert_eq!((text(8), text(9)), ("3".into(), "1000".into()));
}

#[tokio::test]
async fn noscript_once_reloads_and_retries_once_then_succeeds() {
    let mut gateway = MockRedisGateway::new();
    let mut order = Sequence::new();
    gateway
        .expect_script_load()
        .times(1)
        .in_sequence(&mut order)
        .returning(|_, _, _| Ok("old".to_owned()));
    gateway
        .expect_evalsha()
        .withf(|script, _, _, _| &*script.digest == "old")
        .times(1)
        .in_sequence(&mut order)
        .returning(|_, _, _, _| Err(GatewayFailure::NoScript));
    gateway
        .expect_script_load()
        .times(1)
        .in_sequence(&mut order)
        .returning(|_, _, _| Ok("new".to_owned()));
    gateway
        .expect_evalsha()
        .withf(|script, _, _, _| &*script.digest == "new")
        .times(1)
        .in_sequence(&mut order)
        .returning(|_, _, _, _| Ok(reply("allowed", &[[1, 2, 750, 0]])));
    let adapter = adapter(gateway, ON);
    assert!(evaluate_once(&adapter, 1).await.is_allowed());
    assert_eq!(
        adapter
            .scripts
            .cached_digest(ScriptKind::Single(shared_contract::AlgorithmKind::FixedWindow))
            .as_deref(),
        Some("new")
    );
}

#[tokio::test]
async fn noscript_twice_is_unavailable_before_send() {
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(2).returning(|_, _, _| Ok("digest".to_owned()));
    gateway.expect_evalsha().times(2).returning(|_, _, _, _| Err(GatewayFailure::NoScript));
    let adapter = adapter(gateway, ON);
    assert_eq!(evaluate_once(&adapter, 1).await, before_send());
}

#[tokio::test]
async fn connect_failure_and_noperm_are_unavailable_before_send() {
    for failure in [GatewayFailure::NotSent, GatewayFailure::Refused] {
        // Dedupe on: these are definite, so no retry may happen (times 1).
        let adapter = adapter(gateway_answering(move || Err(failure), 1), ON);
        assert_eq!(evaluate_once(&adapter, 1).await, before_send(), "{failure:?}");
    }
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|_, _, _| Err(GatewayFailure::Refused));
    assert_eq!(evaluate_once(&adapter(gateway, ON), 1).await, before_send());
}

#[tokio::test]
async fn a_script_load_that_times_out_sent_no_evaluation() {
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|_, _, _| Err(GatewayFailure::TimedOut));
    assert_eq!(evaluate_once(&adapter(gateway, OFF), 1).await, before_send());
}

#[tokio::test]
async fn wrongtype_script_errors_and_corrupt_state_are_state_incompatible() {
    for failure in [GatewayFailure::WrongType, GatewayFailure::ScriptError] {
        let adapter = adapter(gateway_answering(move || Err(failure), 1), ON);
        assert_eq!(evaluate_once(&adapter, 1).await, state_incompatible(), "{failure:?}");
    }
    let adapter = adapter(gateway_answering(|| Ok(failure("corrupt", 1)), 1), ON);
    assert_eq!(evaluate_once(&adapter, 1).await, state_incompatible());
}

#[tokio::test]
async fn timeout_connection_loss_and_undecodable_replies_are_indeterminate() {
    let cases: [fn() -> Result<Value, GatewayFailure>; 4] = [
        || Err(GatewayFailure::TimedOut),
        || Err(GatewayFailure::ConnectionLost),
        || Ok(Value::Array(vec![Value::BulkString(b"allowed".to_vec())])),
        || Ok(reply("granted", &[[1, 1, 1, 0]])),
    ];
    for case in cases {
        // Dedupe off: no retry, exactly one EVALSHA.
        let adapter = adapter(gateway_answering(case, 1), OFF);
        assert_eq!(evaluate_once(&adapter, 1).await, indeterminate());
    }
}

/// Each script call's arguments.
type SentArgs = Arc<Mutex<Vec<Vec<Vec<u8>>>>>;

/// A gateway whose first EVALSHA fails with `first` (the script may have
/// run) and whose second answers `then`, noting each call's arguments.
fn failing_once(first: GatewayFailure, then: Value) -> (MockRedisGateway, SentArgs) {
    let seen = SentArgs::default();
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|_, _, _| Ok("digest".to_owned()));
    let sink = seen.clone();
    gateway.expect_evalsha().times(2).returning(move |_, _, args, _| {
        let mut calls = sink.lock().unwrap();
        calls.push(owned(args));
        if calls.len() == 1 { Err(first) } else { Ok(then.clone()) }
    });
    (gateway, seen)
}

#[tokio::test]
async fn with_dedupe_an_indeterminate_is_retried_once_with_the_same_evaluation_id() {
    let (gateway, seen) =
        failing_once(GatewayFailure::ConnectionLost, reply("allowed", &[[2, 2, 750, 0]]));
    let adapter = adapter(gateway, ON);
    let Ok(set) = evaluate_once(&adapter, 1).await else {
        panic!("expected the replayed decision");
    };
    assert!(set.allowed() && set.replayed());
    let calls = seen.lock().unwrap();
    assert_eq!(calls[0], calls[1], "the retry must resend the same evaluation");
}

#[tokio::test]
async fn with_dedupe_a_second_indeterminate_is_returned_as_is() {
    let adapter = adapter(gateway_answering(|| Err(GatewayFailure::TimedOut), 2), ON);
    assert_eq!(evaluate_once(&adapter, 1).await, indeterminate());
}

#[tokio::test]
async fn with_dedupe_a_retry_that_never_ran_keeps_the_first_indeterminate() {
    for second in [GatewayFailure::NotSent, GatewayFailure::Refused, GatewayFailure::WrongType] {
        let mut gateway = MockRedisGateway::new();
        let mut order = Sequence::new();
        gateway.expect_script_load().times(1).returning(|_, _, _| Ok("digest".to_owned()));
        gateway
            .expect_evalsha()
            .times(1)
            .in_sequence(&mut order)
            .returning(|_, _, _, _| Err(GatewayFailure::ConnectionLost));
        gateway
            .expect_evalsha()
            .times(1)
            .in_sequence(&mut order)
            .returning(move |_, _, _, _| Err(second));
        // The first attempt may have charged: "nothing consumed" would be a lie.
        assert_eq!(evaluate_once(&adapter(gateway, ON), 1).await, indeterminate(), "{second:?}");
    }
}

#[tokio::test]
async fn clock_unsafe_reply_is_unavailable_with_its_wait() {
    let adapter = adapter(gateway_answering(|| Ok(failure("clock_unsafe", 40)), 1), ON);
    assert_eq!(
        evaluate_once(&adapter, 1).await,
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::ClockUnsafe,
            retry_after: Duration::from_millis(40),
        })
    );
}

#[tokio::test]
async fn the_command_timeout_is_capped_by_the_deadline() {
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|_, _, timeout| {
        assert!(timeout <= Duration::from_millis(40), "{timeout:?}");
        Ok("digest".to_owned())
    });
    gateway.expect_evalsha().times(1).returning(|_, _, _, timeout| {
        assert!(timeout <= Duration::from_millis(40), "{timeout:?}");
        Ok(reply("allowed", &[[1, 2, 750, 0]]))
    });
    let adapter = adapter(gateway, OFF);
    let outcome =
        adapter.evaluate(request(adapter.clock.monotonic(), 1, Duration::from_millis(40))).await;
    assert!(outcome.is_allowed());
}

/// A gateway whose EVALSHA never answers, to hold a lane permit.
#[derive(Debug)]
struct StuckGateway;

#[async_trait]
impl RedisGateway for StuckGateway {
    async fn script_load(
        &self,
        _: &'static str,
        _: &str,
        _: Duration,
    ) -> Result<String, GatewayFailure> {
        Ok("digest".to_owned())
    }
    async fn evalsha(
        &self,
        _: &LoadedScript,
        _: &[String],
        _: &[Arc<[u8]>],
        timeout: Duration,
    ) -> Result<Value, GatewayFailure> {
        tokio::time::sleep(timeout).await;
        Err(GatewayFailure::TimedOut)
    }
    async fn evalsha_then_wait(
        &self,
        _: &LoadedScript,
        _: &[String],
        _: &[Arc<[u8]>],
        _: crate::gateway::WaitFor,
        timeout: Duration,
    ) -> Result<crate::gateway::Acknowledged, GatewayFailure> {
        tokio::time::sleep(timeout).await;
        Err(GatewayFailure::TimedOut)
    }
    async fn ping(&self, _: Duration) -> Result<(), GatewayFailure> {
        Ok(())
    }
}

#[tokio::test]
async fn no_lane_permit_before_the_deadline_is_admission_rejected() {
    let clock = ManualClock::new(T0);
    let settings = RedisSettings {
        script_lane: ScriptLaneSettings { max_in_flight: 1 },
        command_timeout: Duration::from_secs(5),
        ..RedisSettings::default()
    };
    let adapter = Arc::new(
        RedisEdgeRateLimitAdapter::with_gateway(
            settings,
            [fixed_policy(OFF)],
            Arc::new(clock.clone()),
            Arc::new(StuckGateway),
        )
        .unwrap(),
    );
    let holder = {
        let adapter = adapter.clone();
        let request = request(clock.monotonic(), 1, Duration::from_secs(5));
        tokio::spawn(async move { adapter.evaluate(request).await })
    };
    // Let the holder take the only permit.
    while adapter.lane.available_permits() > 0 {
        tokio::task::yield_now().await;
    }
    let outcome = adapter.evaluate(request(clock.monotonic(), 1, Duration::from_millis(30))).await;
    assert_eq!(
        outcome,
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::AdmissionRejected,
            retry_after: Duration::from_secs(1),
        })
    );
    holder.abort();
}

#[tokio::test]
async fn readiness_is_a_ping() {
    let mut up = MockRedisGateway::new();
    up.expect_ping().times(1).returning(|_| Ok(()));
    assert!(adapter(up, OFF).is_ready().await);
    let mut down = MockRedisGateway::new();
    down.expect_ping().times(1).returning(|_| Err(GatewayFailure::NotSent));
    assert!(!adapter(down, OFF).is_ready().await);
}

#[test]
fn duplicate_policies_are_refused_and_a_cluster_builds_without_connecting() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let duplicate = RedisEdgeRateLimitAdapter::with_gateway(
        RedisSettings::default(),
        [fixed_policy(ON), fixed_policy(OFF)],
        clock.clone(),
        Arc::new(MockRedisGateway::new()),
    );
    assert!(matches!(duplicate, Err(RedisAdapterError::DuplicatePolicy(_))));
    // Port 1: nothing listens there; construction must not try to connect.
    let cluster = RedisEdgeRateLimitAdapter::new(
        RedisSettings {
            topology: crate::Topology::Cluster,
            urls: vec!["redis://127.0.0.1:1".into(), "redis://127.0.0.1:2".into()],
            ..RedisSettings::default()
        },
        [fixed_policy(ON)],
        clock,
    );
    assert!(cluster.is_ok());
}

#[tokio::test]
async fn a_set_is_one_call_over_every_key_with_each_policy_s_block_and_its_answers_in_order() {
    let daily = RateLimitPolicy::builder(
        "api.daily",
        shared_contract::Algorithm::TokenBucket(shared_contract::TokenBucket {
            capacity: 100,
            refill_tokens: 10,
            refill_period: Duration::from_secs(60),
        }),
    )
    .scope(PolicyScope::Subject)
    .mode(shared_contract::PolicyMode::Shadow)
    .maximum_cost(5)
    .build()
    .unwrap();
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = seen.clone();
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|source, key, _| {
        assert_eq!(source, ScriptKind::PolicySet.source());
        assert_eq!(key, key_of("api.test", PolicyScope::Operation));
        Ok("set".to_owned())
    });
    gateway.expect_evalsha().times(1).returning(move |_, keys, args, _| {
        // Both keys, in the set's order, under the subject's one hash tag.
        assert_eq!(
            keys,
            [key_of("api.test", PolicyScope::Operation), key_of("api.daily", PolicyScope::Subject)]
        );
        *sink.lock().unwrap() = owned(args);
        // The fixed window refuses; the bucket would allow, uncharged.
        Ok(reply("denied", &[[0, 0, 750, 750], [1, 100, 0, 0]]))
    });
    let clock = ManualClock::new(T0 + 250);
    let adapter = RedisEdgeRateLimitAdapter::with_gateway(
        RedisSettings::default(),
        [fixed_policy(OFF), daily],
        Arc::new(clock.clone()),
        Arc::new(gateway),
    )
    .unwrap();
    let mut request = request(clock.monotonic(), 2, Duration::from_millis(750));
    let id = request.evaluation_id;
    request.policies =
        PolicySet::new(["api.test", "api.daily"].map(|policy| PolicyId::new(policy).unwrap()))
            .unwrap()
            .into();
    let Ok(set) = adapter.evaluate(request).await else {
        panic!("expected decisions");
    };
    assert!(!set.allowed());
    let [window, bucket] = set.decisions() else { panic!("two decisions") };
    assert_eq!((window.allowed, window.retry_after_ms), (false, 750));
    assert_eq!((bucket.allowed, bucket.remaining), (true, 100));
    assert_eq!(bucket.retry_after_ms, 0);
    // now, cost, id; the window's block; the shadow bucket's block ('b').
    let (now, id) = ((T0 + 250).to_string(), id.as_bytes().to_vec());
    let window_block = ["F", "1000", "1000", "0", "0", "3", "1000"];
    // The bucket keeps the default dedupe (5 s, 256 records).
    let bucket_block = ["b", "1000", "1000", "5000", "256", "100", "10", "60000"];
    let expected: Vec<Vec<u8>> = [now.as_bytes(), b"2", &id]
        .into_iter()
        .chain(window_block.iter().chain(&bucket_block).map(|arg| arg.as_bytes()))
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(*seen.lock().unwrap(), expected);
}

#[tokio::test]
async fn a_cost_above_any_maximum_of_the_set_never_reaches_the_gateway() {
    let wide = RateLimitPolicy::builder(
        "api.wide",
        shared_contract::Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 100,
            window: Duration::from_secs(1),
        }),
    )
    .maximum_cost(50)
    .build()
    .unwrap();
    let clock = ManualClock::new(T0);
    let adapter = RedisEdgeRateLimitAdapter::with_gateway(
        RedisSettings::default(),
        [fixed_policy(OFF), wide],
        Arc::new(clock.clone()),
        Arc::new(MockRedisGateway::new()),
    )
    .unwrap();
    // 3 fits api.wide (50) but not api.test (2).
    let mut request = request(clock.monotonic(), 3, Duration::from_millis(750));
    request.policies =
        PolicySet::new(["api.wide", "api.test"].map(|policy| PolicyId::new(policy).unwrap()))
            .unwrap()
            .into();
    assert_eq!(
        adapter.evaluate(request).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::CostExceedsMaximum })
    );
}

#[tokio::test]
async fn a_reply_for_another_number_of_keys_is_indeterminate() {
    let two = || Ok(reply("allowed", &[[1, 2, 750, 0], [1, 2, 750, 0]]));
    let adapter = adapter(gateway_answering(two, 1), OFF);
    assert_eq!(evaluate_once(&adapter, 1).await, indeterminate());
}

#[test]
fn a_number_argument_is_its_decimal_text() {
    for (n, text) in [(0, "0"), (7, "7"), (1_800_000_000_250, "1800000000250")] {
        assert_eq!(&*number(n), text.as_bytes(), "{n}");
    }
    assert_eq!(&*number(u64::MAX), u64::MAX.to_string().as_bytes());
}

/// A concurrency policy `id` (operation-scoped), enforced or shadow.
fn lease_policy(id: &str, mode: PolicyMode) -> RateLimitPolicy {
    RateLimitPolicy::builder(
        id,
        shared_contract::Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 2,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_millis(500),
        }),
    )
    .mode(mode)
    .build()
    .unwrap()
}

/// An adapter holding `api.test` (a fixed window without dedupe), the
/// concurrency policies `leases` and `shadow.leases`.
fn lease_adapter(gateway: MockRedisGateway, settings: RedisSettings) -> RedisEdgeRateLimitAdapter {
    RedisEdgeRateLimitAdapter::with_gateway(
        settings,
        [
            fixed_policy(OFF),
            lease_policy("leases", PolicyMode::Enforce),
            lease_policy("shadow.leases", PolicyMode::Shadow),
        ],
        Arc::new(ManualClock::new(T0 + 250)),
        Arc::new(gateway),
    )
    .unwrap()
}

/// A request for the set `ids`, in order.
fn set_request(ids: &[&str], id: EvaluationId) -> RateLimitRequest<'static> {
    RateLimitRequest {
        policies: PolicySet::new(ids.iter().map(|id| PolicyId::new(*id).unwrap())).unwrap().into(),
        evaluation_id: id,
        ..request(std::time::Instant::now(), 1, Duration::from_secs(5))
    }
}

#[tokio::test]
async fn an_indeterminate_under_an_enforced_concurrency_policy_is_retried_once_with_its_id() {
    // An admitted first attempt took the lease, so the retry replays it:
    // no second charge of the fixed window beside it.
    let (gateway, seen) =
        failing_once(GatewayFailure::TimedOut, reply("allowed", &[[1, 2, 750, 0], [2, 1, 0, 0]]));
    let adapter = lease_adapter(gateway, RedisSettings::default());
    let outcome = adapter.evaluate(set_request(&["api.test", "leases"], EvaluationId::random()));
    let Ok(set) = outcome.await else {
        panic!("expected the replayed decision");
    };
    assert!(set.allowed() && set.replayed());
    let calls = seen.lock().unwrap();
    assert_eq!(calls[0], calls[1], "the retry must resend the same evaluation");
}

#[tokio::test]
async fn an_indeterminate_under_a_shadow_concurrency_policy_alone_is_not_retried() {
    // A shadow policy that refused took no lease, so a retry could charge
    // the fixed window twice.
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|_, _, _| Ok("digest".to_owned()));
    gateway.expect_evalsha().times(1).returning(|_, _, _, _| Err(GatewayFailure::TimedOut));
    let adapter = lease_adapter(gateway, RedisSettings::default());
    let request = set_request(&["api.test", "shadow.leases"], EvaluationId::random());
    assert_eq!(adapter.evaluate(request).await, indeterminate());
}

#[tokio::test]
async fn a_release_sends_the_lease_keys_of_the_set_its_id_and_the_caller_time() {
    /// Each call's keys and arguments.
    type Calls = Vec<(Vec<String>, Vec<Vec<u8>>)>;
    let seen: Arc<Mutex<Calls>> = Arc::default();
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|source, _, _| {
        assert_eq!(source, ScriptKind::Release.source());
        Ok("digest".to_owned())
    });
    let sink = seen.clone();
    gateway.expect_evalsha().times(2).returning(move |_, keys, args, _| {
        let mut calls = sink.lock().unwrap();
        calls.push((keys.to_vec(), owned(args)));
        Ok(Value::Int(if calls.len() == 1 { 2 } else { 0 }))
    });
    let adapter = lease_adapter(gateway, RedisSettings::default());
    let id = EvaluationId::random();
    let lease = Lease::of(&set_request(&["leases", "api.test", "shadow.leases"], id));
    assert_eq!(adapter.release(&lease).await, ReleaseOutcome::Released);
    assert_eq!(adapter.release(&lease).await, ReleaseOutcome::NotHeld);
    let calls = seen.lock().unwrap();
    // The rate policy's key is not among them.
    let keys = vec![
        key_of("leases", PolicyScope::Operation),
        key_of("shadow.leases", PolicyScope::Operation),
    ];
    let args = vec![id.as_bytes().to_vec(), (T0 + 250).to_string().into_bytes()];
    assert_eq!(calls[0], (keys, args));
}

#[tokio::test]
async fn a_release_without_a_concurrency_policy_held_never_reaches_the_gateway() {
    // The mock has no expectations: any call fails the test.
    let adapter = lease_adapter(MockRedisGateway::new(), RedisSettings::default());
    for ids in [&["api.test"][..], &["gone.leases"]] {
        let lease = Lease {
            policies: PolicySet::new(ids.iter().map(|id| PolicyId::new(*id).unwrap())).unwrap(),
            ..Lease::of(&request(std::time::Instant::now(), 1, Duration::from_secs(1)))
        };
        assert_eq!(adapter.release(&lease).await, ReleaseOutcome::NotHeld, "{ids:?}");
    }
}

#[tokio::test]
async fn a_release_maps_each_gateway_failure_to_unavailable_or_indeterminate() {
    let before_send =
        ReleaseOutcome::Unavailable { category: UnavailableCategory::UnavailableBeforeSend };
    let cases = [
        (Err(GatewayFailure::NotSent), before_send),
        (Err(GatewayFailure::Refused), before_send),
        (Err(GatewayFailure::TimedOut), ReleaseOutcome::Indeterminate),
        (Err(GatewayFailure::ConnectionLost), ReleaseOutcome::Indeterminate),
        (Err(GatewayFailure::UnexpectedReply), ReleaseOutcome::Indeterminate),
        (Err(GatewayFailure::ScriptError), ReleaseOutcome::Indeterminate),
        (Err(GatewayFailure::WrongType), ReleaseOutcome::Indeterminate),
        (Ok(Value::Int(3)), ReleaseOutcome::Indeterminate),
        (Ok(Value::Nil), ReleaseOutcome::Indeterminate),
    ];
    for (answer, expected) in cases {
        let mut gateway = MockRedisGateway::new();
        gateway.expect_script_load().times(1).returning(|_, _, _| Ok("digest".to_owned()));
        let sent = answer.clone();
        gateway.expect_evalsha().times(1).returning(move |_, _, _, _| sent.clone());
        let adapter = lease_adapter(gateway, RedisSettings::default());
        let lease = Lease::of(&set_request(&["leases"], EvaluationId::random()));
        assert_eq!(adapter.release(&lease).await, expected, "{answer:?}");
    }
    // NOSCRIPT twice: the script never ran.
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(2).returning(|_, _, _| Ok("digest".to_owned()));
    gateway.expect_evalsha().times(2).returning(|_, _, _, _| Err(GatewayFailure::NoScript));
    let adapter = lease_adapter(gateway, RedisSettings::default());
    let lease = Lease::of(&set_request(&["leases"], EvaluationId::random()));
    assert_eq!(adapter.release(&lease).await, before_send);
}

#[tokio::test]
async fn a_release_that_finds_no_lane_permit_within_the_command_timeout_is_admission_rejected() {
    let settings = RedisSettings {
        script_lane: ScriptLaneSettings { max_in_flight: 1 },
        command_timeout: Duration::from_millis(50),
        ..RedisSettings::default()
    };
    let adapter = Arc::new(
        RedisEdgeRateLimitAdapter::with_gateway(
            settings,
            [fixed_policy(OFF), lease_policy("leases", PolicyMode::Enforce)],
            Arc::new(ManualClock::new(T0)),
            Arc::new(StuckGateway),
        )
        .unwrap(),
    );
    // The only permit, held for the whole release: a call holding it would
    // give it back at its own command timeout, racing the release's wait.
    let held = Arc::clone(&adapter.lane).try_acquire_owned().unwrap();
    let lease = Lease::of(&set_request(&["leases"], EvaluationId::random()));
    assert_eq!(
        adapter.release(&lease).await,
        ReleaseOutcome::Unavailable { category: UnavailableCategory::AdmissionRejected }
    );
    drop(held);
}

/// A settle reply: the status, then its number if it has one.
fn settle_reply(status: &str, number: Option<i64>) -> Value {
    let mut items = vec![Value::BulkString(status.as_bytes().to_vec())];
    items.extend(number.map(Value::Int));
    Value::Array(items)
}

async fn settle_once(
    adapter: &RedisEdgeRateLimitAdapter,
    reserved: u64,
    used: u64,
) -> shared_contract::SettleOutcome {
    let request = request(adapter.clock.monotonic(), reserved, Duration::from_millis(750));
    adapter.settle(shared_contract::Settlement { request, used }).await
}

#[tokio::test]
async fn a_settle_maps_each_reply_and_failure() {
    use shared_contract::Settled;
    let cases: [(Result<Value, GatewayFailure>, shared_contract::SettleOutcome); 8] = [
        (Ok(settle_reply("applied", Some(1))), Ok(Settled::Applied)),
        (Ok(settle_reply("applied", Some(0))), Ok(Settled::Applied)),
        (Ok(settle_reply("repeated", None)), Ok(Settled::Repeated)),
        (Ok(settle_reply("unknown", None)), Ok(Settled::UnknownReservation)),
        (
            Ok(failure("clock_unsafe", 40)),
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: Duration::from_millis(40),
            }),
        ),
        (Ok(failure("corrupt", 1)), Err(state_incompatible().unwrap_err())),
        (Err(GatewayFailure::ScriptError), Err(state_incompatible().unwrap_err())),
        (Err(GatewayFailure::Refused), Err(before_send().unwrap_err())),
    ];
    for (answer, expected) in cases {
        let adapter = adapter(gateway_answering(move || answer.clone(), 1), ON);
        assert_eq!(settle_once(&adapter, 2, 1).await, expected);
    }
}

#[tokio::test]
async fn a_settle_that_may_have_run_is_sent_once_more_and_its_record_answers() {
    use shared_contract::Settled;
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|_, _, _| Ok("digest-1".to_owned()));
    let mut sequence = Sequence::new();
    let sent = Arc::new(Mutex::new(Vec::new()));
    for answer in [Err(GatewayFailure::TimedOut), Ok(settle_reply("repeated", None))] {
        let sent = sent.clone();
        gateway.expect_evalsha().times(1).in_sequence(&mut sequence).returning(
            move |_, keys, args, _| {
                sent.lock().unwrap().push((keys.to_vec(), owned(args)));
                answer.clone()
            },
        );
    }
    let adapter = adapter(gateway, ON);
    assert_eq!(settle_once(&adapter, 2, 1).await, Ok(Settled::Repeated));
    let sent = sent.lock().unwrap();
    assert_eq!(sent[0], sent[1], "the same call twice");
    let (keys, args) = &sent[0];
    assert_eq!(keys, &[key_of("api.test", PolicyScope::Operation)]);
    // Time, reserved, the settle's id, the reservation's id, used, then the block.
    assert_eq!(
        (args[1].as_slice(), args[4].as_slice(), args[5].as_slice()),
        (&b"2"[..], &b"1"[..], &b"F"[..])
    );
    assert_eq!(args[2][6] ^ args[3][6], 0xB0, "the settle's id is the reservation's, flipped");
}

#[tokio::test]
async fn an_after_the_fact_charge_without_dedupe_is_not_sent_twice() {
    let adapter = adapter(gateway_answering(|| Err(GatewayFailure::ConnectionLost), 1), OFF);
    assert_eq!(settle_once(&adapter, 0, 3).await, Err(indeterminate().unwrap_err()));
}

#[tokio::test]
async fn a_settle_past_a_counters_range_or_its_deadline_never_reaches_the_gateway() {
    let adapter = adapter(MockRedisGateway::new(), ON);
    assert_eq!(
        settle_once(&adapter, 1, shared_contract::MAX_COUNT + 1).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::CostExceedsMaximum })
    );
    let late = request(adapter.clock.monotonic(), 1, Duration::ZERO);
    assert!(matches!(
        adapter.settle(shared_contract::Settlement { request: late, used: 0 }).await,
        Err(RateLimitFailure::Unavailable { category: UnavailableCategory::AdmissionRejected, .. })
    ));
}
