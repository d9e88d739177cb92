//! The provider-neutral contract suite as the least-privilege user, on a
//! redis-server whose default user is off and whose rate-limit user has
//! exactly the rule `ca-skeleton redis-acl` prints (see `common`): the
//! adapter needs nothing beyond it. Scope prefixes `ca:rl:t:<scope>:` stay
//! inside the user's `~ca:rl:*` key pattern.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use adapter_redis::fixture::RedisServer;
use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use async_trait::async_trait;
use common::{RATE_LIMIT_PASSWORD, RATE_LIMIT_USER, acl_server};
use contract_tests::{ProviderFactory, StoreScope};
use secrecy::SecretString;
use shared_contract::{EdgeRateLimitPort, ManualClock, RateLimitPolicy};

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
        let settings = RedisSettings {
            urls: vec![server().url()],
            username: Some(RATE_LIMIT_USER.to_owned()),
            password: Some(SecretString::from(RATE_LIMIT_PASSWORD)),
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

contract_tests::contract_suite!(AclFactory);
