//! Runs the provider-neutral contract suite against a real redis-server:
//! one private server for this test binary, one key prefix per scope.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use adapter_redis::fixture::RedisServer;
use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use async_trait::async_trait;
use contract_tests::{ProviderFactory, StoreScope};
use shared_contract::{EdgeRateLimitPort, ManualClock, RateLimitPolicy};

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// Builds a fresh adapter (its own connection, on the calling test's
/// runtime) whose keys live under `ca:rl:t:<scope>:`, so checks never share
/// state and two builds over one scope do.
struct RedisFactory;

#[async_trait]
impl ProviderFactory for RedisFactory {
    async fn build(
        &self,
        scope: &StoreScope,
        clock: ManualClock,
        policies: Vec<RateLimitPolicy>,
    ) -> Arc<dyn EdgeRateLimitPort> {
        let settings = RedisSettings {
            urls: vec![server().url()],
            key_prefix: format!("ca:rl:t:{}:", scope.as_str()),
            // Generous: the suite checks semantics, and CI machines are busy.
            command_timeout: Duration::from_secs(2),
            ..RedisSettings::default()
        };
        match RedisEdgeRateLimitAdapter::new(settings, policies, Arc::new(clock)) {
            Ok(adapter) => Arc::new(adapter),
            Err(error) => panic!("the redis adapter rejected the check's settings: {error}"),
        }
    }
}

contract_tests::contract_suite!(RedisFactory);
