//! The capability switch: the configured provider becomes one
//! `Arc<dyn EdgeRateLimitPort>` (or nothing, for `disabled`), and the edge
//! layer is built over it. The only place that names every provider.

use std::collections::HashMap;
use std::sync::Arc;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings, Topology};
use adapter_web::{EdgeSettings, RateLimitLayer, TransportBridge, VersionedPseudonymizer};
use axum::http::HeaderName;
use rand::RngCore;
use secrecy::SecretSlice;
use shared_contract::{Clock, EdgeRateLimitPort, PolicyId};

use crate::config::{AppConfig, ProviderKind, RedisTopology};
use crate::error::BootstrapError;

/// Key version of a key made up at start.
const GENERATED_KEY_VERSION: u32 = 1;
/// Bytes of a key made up at start.
const GENERATED_KEY_BYTES: usize = 32;

/// The rate-limit capability as configured: a provider behind the port, or
/// off.
#[derive(Debug, Clone)]
pub enum RateLimitCapability {
    /// Requests are evaluated through this provider.
    Enabled {
        /// `memory` or `redis`.
        provider: ProviderKind,
        /// The provider.
        port: Arc<dyn EdgeRateLimitPort>,
    },
    /// `provider = "disabled"`: nothing is limited.
    Disabled,
}

impl RateLimitCapability {
    /// Builds the configured provider. Redis connects lazily, so this
    /// succeeds while the server is down (readiness reports it).
    pub fn build(config: &AppConfig, clock: Arc<dyn Clock>) -> Result<Self, BootstrapError> {
        let provider = config.capabilities.rate_limit.provider;
        let port: Arc<dyn EdgeRateLimitPort> = match provider {
            ProviderKind::Disabled => return Ok(Self::Disabled),
            ProviderKind::Memory => Arc::new(memory_provider(config, clock)?),
            ProviderKind::Redis => Arc::new(redis_provider(config, clock)?),
        };
        Ok(Self::Enabled { provider, port })
    }

    /// The provider, when there is one.
    pub fn port(&self) -> Option<&Arc<dyn EdgeRateLimitPort>> {
        match self {
            Self::Enabled { port, .. } => Some(port),
            Self::Disabled => None,
        }
    }

    /// The edge layer over this capability: evaluating, or pass-through.
    pub fn layer(
        &self,
        config: &AppConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<RateLimitLayer, BootstrapError> {
        let port = match self {
            Self::Disabled => return Ok(RateLimitLayer::disabled()),
            Self::Enabled { port, .. } => Arc::clone(port),
        };
        let pseudonymizer = Arc::new(pseudonymizer(config)?);
        let bridge = TransportBridge::new(port, pseudonymizer, clock, edge_settings(config)?);
        Ok(RateLimitLayer::new(Arc::new(bridge)))
    }

    /// Whether the provider answers now; `disabled` is always ready.
    pub async fn is_ready(&self) -> bool {
        match self {
            Self::Enabled { port, .. } => port.is_ready().await,
            Self::Disabled => true,
        }
    }
}

fn memory_provider(
    config: &AppConfig,
    clock: Arc<dyn Clock>,
) -> Result<MemoryEdgeRateLimitAdapter, BootstrapError> {
    let policies = config.rate_limit_policies()?;
    let adapter = MemoryEdgeRateLimitAdapter::new(policies, clock)
        .map_err(|error| wiring("the memory provider", error))?;
    Ok(adapter.with_failure_retry_after(config.capabilities.rate_limit.failure_retry_after))
}

fn redis_provider(
    config: &AppConfig,
    clock: Arc<dyn Clock>,
) -> Result<RedisEdgeRateLimitAdapter, BootstrapError> {
    let redis = &config.redis;
    let settings = RedisSettings {
        topology: match redis.topology {
            RedisTopology::Standalone => Topology::Standalone,
            RedisTopology::Cluster => Topology::Cluster,
        },
        urls: redis.urls.clone(),
        username: redis.username.clone(),
        password: redis.password.as_ref().map(|password| password.expose().into()),
        key_prefix: redis.key_prefix.clone(),
        connect_timeout: redis.connect_timeout,
        command_timeout: redis.command_timeout,
        script_lane_max_in_flight: redis.script_lane_max_in_flight,
        failure_retry_after: config.capabilities.rate_limit.failure_retry_after,
    };
    RedisEdgeRateLimitAdapter::new(settings, config.rate_limit_policies()?, clock)
        .map_err(|error| wiring("the redis provider", error))
}

/// The configured keys, or (memory provider only; validation refuses it
/// for redis) a random key made up now, with a warning: pseudonyms then
/// change at every restart and differ between instances.
pub fn pseudonymizer(config: &AppConfig) -> Result<VersionedPseudonymizer, BootstrapError> {
    let settings = &config.pseudonymizer;
    if settings.keys.is_empty() {
        let mut key = vec![0_u8; GENERATED_KEY_BYTES];
        rand::rng().fill_bytes(&mut key);
        tracing::warn!(
            version = GENERATED_KEY_VERSION,
            "no pseudonymizer key configured: generated a random one for this process; \
             rate-limit state does not survive a restart and is not shared between instances \
             (set [pseudonymizer.keys] for production)"
        );
        return VersionedPseudonymizer::new(
            [(GENERATED_KEY_VERSION, SecretSlice::from(key))],
            GENERATED_KEY_VERSION,
        )
        .map_err(|error| wiring("the pseudonymizer", error));
    }
    let keys = settings.keys.iter().map(|(version, key)| (*version, key.to_key_bytes()));
    VersionedPseudonymizer::new(keys, settings.active_version)
        .map_err(|error| wiring("the pseudonymizer", error))
}

/// The edge settings of `capabilities.rate-limit`.
pub fn edge_settings(config: &AppConfig) -> Result<EdgeSettings, BootstrapError> {
    let rate_limit = &config.capabilities.rate_limit;
    let policy_id =
        |id: &str| PolicyId::new(id).map_err(|error| wiring("the edge settings", error));
    let mut operations = HashMap::new();
    for (operation, id) in &rate_limit.operations {
        operations.insert(operation.clone(), policy_id(id)?);
    }
    let settings = EdgeSettings {
        evaluation_budget: rate_limit.evaluation_budget,
        failure_retry_after: rate_limit.failure_retry_after,
        api_key_header: HeaderName::from_bytes(rate_limit.api_key_header.as_bytes())
            .map_err(|error| wiring("the edge settings", error))?,
        trusted_proxies: rate_limit.trusted_proxies.clone(),
        default_policy: policy_id(&rate_limit.default_policy)?,
        operations,
        problem_type_base: rate_limit.problem_type_base.clone(),
    };
    settings.validate().map_err(|error| wiring("the edge settings", error))?;
    Ok(settings)
}

fn wiring(component: &'static str, error: impl std::fmt::Display) -> BootstrapError {
    BootstrapError::Wiring { component, reason: error.to_string() }
}
