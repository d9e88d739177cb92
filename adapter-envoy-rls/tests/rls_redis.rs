//! The RLS through a real tonic client over TCP on the Redis provider,
//! standalone, against a private `redis-server`: every scenario, then
//! Redis killed (`UNAVAILABLE`, health `NOT_SERVING`), and a health `Watch`
//! following Redis down and up again.

mod support;

use std::sync::Arc;
use std::time::Duration;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use redis_fixture::RedisServer;
use shared_contract::{EdgeRateLimitPort, ManualClock, RateLimitPolicy};
use support::scenarios;
use support::*;

fn port(
    url: String,
    policies: Vec<RateLimitPolicy>,
    clock: ManualClock,
) -> Arc<dyn EdgeRateLimitPort> {
    let settings = RedisSettings {
        urls: vec![url],
        command_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..RedisSettings::default()
    };
    Arc::new(RedisEdgeRateLimitAdapter::new(settings, policies, Arc::new(clock)).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_on_redis_then_unavailable_once_redis_is_killed() {
    let mut server = RedisServer::start();
    let url = server.url();
    let factory = move |policies, clock| port(url.clone(), policies, clock);
    scenarios::all(&factory).await;
    // Every key is a pseudonym: no address a descriptor carried is in Redis.
    let keys = std::process::Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "--scan"])
        .output()
        .expect("redis-cli runs");
    let keys = String::from_utf8(keys.stdout).unwrap();
    assert!(keys.lines().count() >= 5, "{keys}");
    for raw in ["10.0.0.", "remote_address", "generic_key", "edge"] {
        assert!(!keys.contains(raw), "{raw} reached a key:\n{keys}");
    }

    let clock = scenarios::clock();
    let redis = port(server.url(), scenarios::policies(), clock.clone());
    let mut rls = Rls::start(engine(redis, Arc::new(clock), &scenarios::rules())).await;
    let ask = || request("edge", vec![descriptor(&[("remote_address", "10.2.0.1")], None)], 0);
    rls.ok(ask()).await;
    server.crash();
    let status = rls.ask(ask()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().starts_with("rate limit unavailable: "), "{status:?}");
    scenarios::health_is_serving_while_the_provider_is_ready(&rls, false).await;
}

/// A `Watch` stays open and streams each change of readiness: `SERVING`,
/// `NOT_SERVING` once Redis is killed, `SERVING` once it is back; only
/// changes, in order (whenever the listener notices them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_watch_follows_redis_down_and_up() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut server = RedisServer::start();
    let clock = scenarios::clock();
    let redis = port(server.url(), scenarios::policies(), clock.clone());
    let rls = Rls::start(engine(redis, Arc::new(clock), &scenarios::rules())).await;
    let mut health = rls.health().await;
    let mut watches = Vec::new();
    for service in ["", adapter_envoy_rls::RATE_LIMIT_SERVICE_NAME] {
        let request = HealthCheckRequest { service: service.to_owned() };
        watches.push(health.watch(request).await.unwrap().into_inner());
    }
    let next = async |watch: &mut tonic::Streaming<_>| -> ServingStatus {
        let message: tonic_health::pb::HealthCheckResponse =
            watch.message().await.unwrap().expect("the watch stays open");
        ServingStatus::try_from(message.status).unwrap()
    };
    for watch in &mut watches {
        assert_eq!(next(watch).await, ServingStatus::Serving);
    }
    server.crash();
    for watch in &mut watches {
        assert_eq!(next(watch).await, ServingStatus::NotServing);
    }
    server.restart();
    for watch in &mut watches {
        assert_eq!(next(watch).await, ServingStatus::Serving);
    }
    // An unknown service: SERVICE_UNKNOWN, the stream open (the gRPC
    // health protocol).
    let unknown = HealthCheckRequest { service: "other".to_owned() };
    let mut unknown = health.watch(unknown).await.unwrap().into_inner();
    assert_eq!(next(&mut unknown).await, ServingStatus::ServiceUnknown);
}
