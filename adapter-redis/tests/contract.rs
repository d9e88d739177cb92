//! Runs the provider-neutral contract suite against a real redis-server
//! twice: at the default settings, the local denial cache on, and with the
//! cache off. One private server for this test binary, one key prefix per
//! scope (and per run).

mod support;

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use contract_tests::{ProviderFactory, StoreScope};
use redis_fixture::RedisServer;
use shared_contract::{EdgeRateLimitPort, ManualClock, RateLimitPolicy};

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// Builds a fresh adapter (its own connection, on the calling test's
/// runtime) whose keys live under `ca:rl:t:<scope>:` (`ca:rl:t:nc-<scope>:`
/// with the cache off), so checks never share state and two builds over one
/// scope do.
struct RedisFactory {
    deny_cache: bool,
}

#[async_trait]
impl ProviderFactory for RedisFactory {
    async fn build(
        &self,
        scope: &StoreScope,
        clock: ManualClock,
        policies: Vec<RateLimitPolicy>,
    ) -> Arc<dyn EdgeRateLimitPort> {
        let scope = if self.deny_cache { scope.to_string() } else { format!("nc-{scope}") };
        let prefix = support::scope_prefix(&scope);
        let deny_cache = self.deny_cache;
        let adapter = support::adapter(server(), &clock, policies, |settings| {
            settings.key_prefix = prefix;
            assert!(settings.deny_cache.enabled, "the defaults cache refusals");
            settings.deny_cache.enabled = deny_cache;
        });
        Arc::new(adapter)
    }
}

/// The defaults: refusals of fixed-window sets are cached.
mod deny_cache_on {
    use super::RedisFactory;

    contract_tests::contract_suite!(RedisFactory { deny_cache: true });
}

/// Every refusal asks Redis.
mod deny_cache_off {
    use super::RedisFactory;

    contract_tests::contract_suite!(RedisFactory { deny_cache: false });
}
