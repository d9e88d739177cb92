//! The configuration model: what `ca-skeleton` reads, after defaults, the
//! TOML file and the environment have been layered and every rule checked.
//!
//! Loading lives in `sources`, the typed reading of the merged tree in
//! `read`, the cross-field rules in `validate`, and the redacted rendering
//! for `check-config` in `render`.

mod problems;
mod read;
mod render;
mod secret;
pub(crate) mod sources;
#[cfg(test)]
mod tests;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use shared_contract::{Algorithm, EvaluationDedupPolicy, PolicyField, RateLimitPolicy};

pub use problems::{ConfigProblem, ConfigProblems, KeyPath};
pub use secret::{SecretSource, SecretValue};
pub use sources::{CONFIG_FILE_ENV, ConfigSources, ENV_PREFIX};

use crate::error::BootstrapError;

/// The whole resolved configuration.
#[derive(Debug, Clone)]
pub struct AppConfig {
    /// `server.*`: the HTTP listener.
    pub server: ServerConfig,
    /// `capabilities.*`: which provider backs each capability.
    pub capabilities: CapabilitiesConfig,
    /// `pseudonymizer.*`: the HMAC keys that turn subjects into digests.
    pub pseudonymizer: PseudonymizerConfig,
    /// `redis.*`: the Redis connection, used by the `redis` provider.
    pub redis: RedisConfig,
}

/// `server.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// `server.listen`: the socket address to bind (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
}

/// `capabilities.*`.
#[derive(Debug, Clone)]
pub struct CapabilitiesConfig {
    /// `capabilities.rate-limit.*`.
    pub rate_limit: RateLimitConfig,
}

/// Which rate-limit provider serves the edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// The embedded in-process provider (one instance).
    Memory,
    /// The Redis provider (standalone or cluster; many instances).
    Redis,
    /// No rate limiting: the layer passes every request through.
    Disabled,
}

impl ProviderKind {
    /// The configuration name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redis => "redis",
            Self::Disabled => "disabled",
        }
    }
}

/// `capabilities.rate-limit.*`.
#[derive(Debug, Clone)]
pub struct RateLimitConfig {
    /// `provider`: `memory` (default), `redis` or `disabled`.
    pub provider: ProviderKind,
    /// `default-policy`: the policy of operations not named in `operations`.
    pub default_policy: String,
    /// `evaluation-budget`: the deadline of one evaluation (default 750 ms).
    pub evaluation_budget: Duration,
    /// `failure-retry-after`: `Retry-After` of a 503 when no decision could
    /// be made (default 1 s).
    pub failure_retry_after: Duration,
    /// `api-key-header`: the header whose value identifies an API client
    /// (default `x-api-key`).
    pub api_key_header: String,
    /// `trusted-proxies`: peers whose `Forwarded`/`X-Forwarded-For` count.
    pub trusted_proxies: Vec<IpNet>,
    /// `operations`: `"METHOD /route/{template}"` -> policy id.
    pub operations: BTreeMap<String, String>,
    /// `policies.<id>`: every policy the provider holds.
    pub policies: BTreeMap<String, PolicyConfig>,
    /// `problem-type-base`: the URI prefix of problem+json `type` values.
    pub problem_type_base: String,
}

/// `capabilities.rate-limit.policies.<id>.*`, already checked against the
/// contract rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyConfig {
    /// `algorithm` with its parameters (`limit`, `window`, `capacity`,
    /// `refill-tokens`, `refill-period`).
    pub algorithm: Algorithm,
    /// `revision` (default 1).
    pub revision: u32,
    /// `maximum-cost` (default 1).
    pub maximum_cost: u64,
    /// `cleanup-grace` (default 1 s).
    pub cleanup_grace: Duration,
    /// `maximum-clock-regression` (default 1 s).
    pub maximum_clock_regression: Duration,
    /// `evaluation-dedup.*` (default enabled, 5 s, 256 entries, 65,536 bytes).
    pub evaluation_dedup: EvaluationDedupPolicy,
}

/// `pseudonymizer.*`.
#[derive(Debug, Clone, Default)]
pub struct PseudonymizerConfig {
    /// `active-version`: the key version that pseudonymizes new requests
    /// (default 1).
    pub active_version: u32,
    /// `keys.<version>`: key material, inline or `{ env = "VAR" }`. Empty
    /// means "none configured".
    pub keys: BTreeMap<u32, SecretValue>,
}

/// Redis deployment shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server (or a primary with replicas behind one address).
    Standalone,
    /// Redis Cluster.
    Cluster,
}

impl RedisTopology {
    /// The configuration name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Standalone => "standalone",
            Self::Cluster => "cluster",
        }
    }
}

/// `redis.*`. `Debug` hides passwords, including one inside a URL.
#[derive(Clone)]
pub struct RedisConfig {
    /// `enabled`: the global Redis switch (default false).
    pub enabled: bool,
    /// `topology`: `standalone` (default) or `cluster`.
    pub topology: RedisTopology,
    /// `urls`: `redis://host:port` addresses (cluster: seed nodes).
    pub urls: Vec<String>,
    /// `username`: the ACL user, if any.
    pub username: Option<String>,
    /// `password`: inline or `{ env = "VAR" }`.
    pub password: Option<SecretValue>,
    /// `key-prefix`: prepended to every key (default `ca:rl:`).
    pub key_prefix: String,
    /// `connect-timeout` (default 1 s).
    pub connect_timeout: Duration,
    /// `command-timeout` (default 250 ms).
    pub command_timeout: Duration,
    /// `script-lane.max-in-flight`: script calls in flight at once
    /// (default 256).
    pub script_lane_max_in_flight: usize,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|url| render::redact_url(url)).collect();
        f.debug_struct("RedisConfig")
            .field("enabled", &self.enabled)
            .field("topology", &self.topology)
            .field("urls", &urls)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("key_prefix", &self.key_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("script_lane_max_in_flight", &self.script_lane_max_in_flight)
            .finish()
    }
}

impl AppConfig {
    /// Layers defaults, the TOML file and the environment, reads the result
    /// and checks every rule. The error lists every problem found, each
    /// naming its full key path.
    pub fn load(sources: &ConfigSources) -> Result<Self, BootstrapError> {
        let tree = sources.merged_tree()?;
        let mut problems = ConfigProblems::default();
        let (config, declared) = read::read_config(&tree, &mut problems);
        validate::validate(&config, &declared, &mut problems);
        if problems.is_empty() { Ok(config) } else { Err(BootstrapError::InvalidConfig(problems)) }
    }

    /// The configured policies as contract values.
    pub fn rate_limit_policies(&self) -> Result<Vec<RateLimitPolicy>, BootstrapError> {
        let mut problems = ConfigProblems::default();
        let policies = self
            .capabilities
            .rate_limit
            .policies
            .iter()
            .filter_map(|(id, policy)| policy.build(id, &mut problems))
            .collect();
        if problems.is_empty() {
            Ok(policies)
        } else {
            Err(BootstrapError::InvalidConfig(problems))
        }
    }

    /// The configuration as TOML with every secret replaced by
    /// `[REDACTED]`: what `check-config` prints.
    pub fn to_redacted_toml(&self) -> Result<String, BootstrapError> {
        render::to_redacted_toml(self)
    }
}

impl PolicyConfig {
    /// Builds the contract policy, recording each violated rule under its
    /// full key path.
    pub(crate) fn build(&self, id: &str, problems: &mut ConfigProblems) -> Option<RateLimitPolicy> {
        let path = KeyPath::policy(id);
        let built = RateLimitPolicy::builder(id, self.algorithm)
            .revision(self.revision)
            .maximum_cost(self.maximum_cost)
            .cleanup_grace(self.cleanup_grace)
            .maximum_clock_regression(self.maximum_clock_regression)
            .evaluation_dedup(self.evaluation_dedup)
            .build();
        match built {
            Ok(policy) => Some(policy),
            Err(error) => {
                for violation in error.violations() {
                    // A bad id is the policy table's own key.
                    let at = if violation.field == PolicyField::Id {
                        path.clone()
                    } else {
                        path.dotted(violation.field.key())
                    };
                    problems.push(at, violation.problem.clone());
                }
                if error.violations().is_empty() {
                    problems.push(path, error.to_string());
                }
                None
            }
        }
    }
}
