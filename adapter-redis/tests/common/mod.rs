//! Helpers shared by the real-server tests.

#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::sync::Arc;
use std::time::Duration;

use adapter_redis::fixture::RedisServer;
use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use shared_contract::{
    EvaluationId, ManualClock, PolicyId, RateLimitPolicy, RateLimitRequest, SubjectDigest,
};

/// A multiple of every window and period the tests use.
pub const T0: u64 = 1_800_000_000_000;

pub fn subject(n: u8) -> SubjectDigest {
    SubjectDigest::parse(format!("v1:{}", format!("{n:02x}").repeat(16))).unwrap()
}

pub fn adapter(
    server: &RedisServer,
    clock: &ManualClock,
    policies: Vec<RateLimitPolicy>,
    tweak: impl FnOnce(&mut RedisSettings),
) -> RedisEdgeRateLimitAdapter {
    let mut settings = RedisSettings {
        urls: vec![server.url()],
        command_timeout: Duration::from_secs(2),
        ..RedisSettings::default()
    };
    tweak(&mut settings);
    RedisEdgeRateLimitAdapter::new(settings, policies, Arc::new(clock.clone())).unwrap()
}

pub fn request(clock: &ManualClock, policy: &str, subject: &SubjectDigest) -> RateLimitRequest {
    request_with(clock, policy, subject, EvaluationId::random(), Duration::from_secs(5))
}

pub fn request_with(
    clock: &ManualClock,
    policy: &str,
    subject: &SubjectDigest,
    evaluation_id: EvaluationId,
    budget: Duration,
) -> RateLimitRequest {
    use shared_contract::Clock;
    RateLimitRequest {
        policy_id: PolicyId::new(policy).unwrap(),
        subject: subject.clone(),
        cost: 1,
        evaluation_id,
        deadline: clock.monotonic() + budget,
    }
}

/// A plain connection for inspecting and sabotaging the server's keys.
pub async fn inspector(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
}
