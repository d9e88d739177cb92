//! The provider-neutral contract suite as the least-privilege user, on a
//! redis-server whose default user is off and whose rate-limit user has
//! exactly the rule `ca-skeleton redis-acl` prints (see `support`): the
//! adapter needs nothing beyond it. Scope prefixes `ca:rl:t:<scope>:` stay
//! inside the user's `~ca:rl:*` key pattern.

mod support;

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use contract_tests::{ProviderFactory, StoreScope};
use redis_fixture::RedisServer;
use shared_contract::{EdgeRateLimitPort, ManualClock, RateLimitPolicy};
use support::{RATE_LIMIT_PASSWORD, RATE_LIMIT_USER, acl_server, login};

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| acl_server(&[]))
}

struct AclFactory;

#[async_trait]
impl ProviderFactory for AclFactory {
    async fn build(
        &self,
        scope: &StoreScope,
        clock: ManualClock,
        policies: Vec<RateLimitPolicy>,
    ) -> Arc<dyn EdgeRateLimitPort> {
        let prefix = support::scope_prefix(scope.as_str());
        let adapter = support::adapter(server(), &clock, policies, |settings| {
            login(RATE_LIMIT_USER, RATE_LIMIT_PASSWORD)(settings);
            settings.key_prefix = prefix;
        });
        Arc::new(adapter)
    }
}

contract_tests::contract_suite!(AclFactory);
