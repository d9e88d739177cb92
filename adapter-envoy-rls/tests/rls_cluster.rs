//! The RLS through a real tonic client over TCP on the Redis provider in
//! Cluster mode (a private six-node cluster): every scenario. The subject
//! is the hash tag of every key of a set, so the two-descriptor set is one
//! script on one slot.

mod support;

use std::sync::Arc;
use std::time::Duration;

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings, Topology};
use redis_fixture::RedisCluster;
use shared_contract::EdgeRateLimitPort;
use support::scenarios;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_on_redis_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let factory = move |policies, clock| {
        let settings = RedisSettings {
            topology: Topology::Cluster,
            urls: urls.clone(),
            command_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            ..RedisSettings::default()
        };
        let adapter = RedisEdgeRateLimitAdapter::new(settings, policies, Arc::new(clock)).unwrap();
        Arc::new(adapter) as Arc<dyn EdgeRateLimitPort>
    };
    scenarios::all(&factory).await;
}
