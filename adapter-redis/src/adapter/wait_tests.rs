//! `wait-replicas` against a mock gateway: which answers stand, and what is
//! (not) sent again. The real servers' side is in `tests/wait.rs`.

use redis::Value;
use shared_contract::{
    EvaluationId, ManualClock, OperationDigest, PolicySet, RateLimitOutcomeExt, SubjectDigest,
};

use super::*;
use crate::gateway::{Acknowledged, MockRedisGateway, WaitFor};

use crate::T0;

fn waiting_adapter(gateway: MockRedisGateway) -> RedisEdgeRateLimitAdapter {
    let policy = RateLimitPolicy::builder(
        "api.test",
        shared_contract::Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 3,
            window: Duration::from_secs(1),
        }),
    )
    .evaluation_dedup(EvaluationDedupPolicy::enabled_defaults())
    .build()
    .unwrap();
    let settings = RedisSettings {
        wait_replicas: 2,
        wait_timeout: Duration::from_millis(40),
        ..RedisSettings::default()
    };
    let clock = ManualClock::new(T0 + 250);
    RedisEdgeRateLimitAdapter::with_gateway(settings, [policy], Arc::new(clock), Arc::new(gateway))
        .unwrap()
}

async fn evaluate(adapter: &RedisEdgeRateLimitAdapter) -> RateLimitOutcome {
    adapter
        .evaluate(RateLimitRequest {
            policies: PolicySet::single(PolicyId::new("api.test").unwrap()).into(),
            subject: SubjectDigest::parse(format!("v1:{}", "ab".repeat(16))).unwrap(),
            operation: OperationDigest::from_u128(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff),
            cost: 1,
            evaluation_id: EvaluationId::random(),
            deadline: adapter.clock.monotonic() + Duration::from_millis(750),
        })
        .await
}

/// A single-key reply: status, then answer (0 denied, 1 allowed, 2
/// replayed), remaining, reset_after, retry_after.
fn reply(status: &str, answer: [i64; 4]) -> Value {
    let mut items = vec![Value::BulkString(status.as_bytes().to_vec())];
    items.extend(answer.map(Value::Int));
    Value::Array(items)
}

/// A gateway that loads once and answers `times` pipelines with `reply`
/// and `replicas`; plain `EVALSHA` is never expected.
fn answering(
    reply: Value,
    replicas: Result<u64, GatewayFailure>,
    times: usize,
) -> MockRedisGateway {
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(1).returning(|_, _, _| Ok("digest".to_owned()));
    gateway.expect_evalsha_then_wait().times(times).returning(move |_, _, _, wait, timeout| {
        assert_eq!(wait, WaitFor { replicas: 2, timeout_ms: 40 });
        assert!(timeout <= Duration::from_millis(250), "{timeout:?}");
        Ok(Acknowledged { reply: reply.clone(), replicas })
    });
    gateway
}

fn indeterminate() -> RateLimitOutcome {
    Err(RateLimitFailure::Indeterminate { retry_after: Duration::from_secs(1) })
}

#[tokio::test]
async fn an_acknowledged_charge_is_allowed() {
    let adapter = waiting_adapter(answering(reply("allowed", [1, 2, 750, 0]), Ok(2), 1));
    assert!(evaluate(&adapter).await.is_allowed());
}

#[tokio::test]
async fn too_few_acknowledgements_are_indeterminate_and_not_replayed() {
    // Dedupe is on, yet exactly one call: a retry could only replay the
    // charge, and a replay proves nothing about the replicas.
    let adapter = waiting_adapter(answering(reply("allowed", [1, 2, 750, 0]), Ok(1), 1));
    assert_eq!(evaluate(&adapter).await, indeterminate());
    let refused = answering(reply("allowed", [1, 2, 750, 0]), Err(GatewayFailure::Refused), 1);
    assert_eq!(evaluate(&waiting_adapter(refused)).await, indeterminate());
}

#[tokio::test]
async fn a_denial_stands_whatever_the_count() {
    let adapter = waiting_adapter(answering(reply("denied", [0, 0, 750, 750]), Ok(0), 1));
    let outcome = evaluate(&adapter).await;
    assert!(matches!(&outcome, Ok(set) if !set.allowed()), "{outcome:?}");
}

#[tokio::test]
async fn noscript_reloads_and_sends_the_pipeline_again() {
    let mut gateway = MockRedisGateway::new();
    gateway.expect_script_load().times(2).returning(|_, _, _| Ok("digest".to_owned()));
    let mut first = true;
    gateway.expect_evalsha_then_wait().times(2).returning(move |_, _, _, _, _| {
        if std::mem::take(&mut first) {
            Err(GatewayFailure::NoScript)
        } else {
            Ok(Acknowledged { reply: reply("allowed", [1, 2, 750, 0]), replicas: Ok(2) })
        }
    });
    assert!(evaluate(&waiting_adapter(gateway)).await.is_allowed());
}
