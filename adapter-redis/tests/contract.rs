//! Runs the provider-neutral contract suite against a real redis-server at
//! the default settings, the local denial cache on (`contract_no_deny_cache.rs`
//! runs it off): one private server for this test binary, one key prefix per
//! scope.

mod common;

use std::sync::{Arc, OnceLock};

use adapter_redis::fixture::RedisServer;
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
        let prefix = common::scope_prefix(scope.as_str());
        let adapter = common::adapter(server(), &clock, policies, |settings| {
            settings.key_prefix = prefix;
            assert!(settings.deny_cache.enabled, "the default run caches refusals");
        });
        Arc::new(adapter)
    }
}

contract_tests::contract_suite!(RedisFactory);
