//! The capability switch: the configured provider becomes one
//! `Arc<dyn EdgeRateLimitPort>` (or nothing, for `disabled`), and the edge
//! layer is built over it. The only place that names every provider.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use adapter_envoy_rls::{OverridePorts, RlsEngine, RlsRule, RlsSettings, RuleLimit};
use adapter_memory::{MemoryEdgeRateLimitAdapter, MemoryStore};
use adapter_redis::RedisEdgeRateLimitAdapter;
use adapter_web::{EdgeSettings, RateLimitLayer, TransportBridge, VersionedPseudonymizer};
use rand::RngCore;
use secrecy::SecretSlice;
use shared_contract::{
    Clock, EdgeRateLimitPort, PolicyId, PolicySet, RateLimitPolicy, SubjectPseudonymizer,
};

use crate::config::{AppConfig, ProviderConfig, RuleCharge};
use crate::degraded::{self, DegradedMode, DegradedPort};
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
        provider: ProviderConfig,
        /// The provider.
        port: Arc<dyn EdgeRateLimitPort>,
        /// Background work the provider needs from the server, if any.
        upkeep: Option<Upkeep>,
        /// What a reload builds the next port from.
        state: ProviderState,
    },
    /// `provider = "disabled"`: nothing is limited.
    Disabled,
}

/// Counter of requests refused because the in-process store (the memory
/// provider's, or degraded mode's local counts) was full at
/// `memory.max-keys` and their key would have been new; no labels.
/// Counted by the upkeep, so within [`Upkeep::EVERY`] of the refusal.
pub const MEMORY_KEYS_REFUSED_TOTAL: &str =
    adapter_web::metric_name!("rate_limit_memory_keys_refused_total");

/// The memory provider's periodic purge. Traffic sweeps a busy shard, but
/// an instance gone quiet after a flood would keep the expired state until
/// traffic came back: the server runs this every [`Upkeep::EVERY`]. It
/// also counts and logs the requests a full store refused, so that line
/// comes at most once per run.
#[derive(Debug, Clone)]
pub struct Upkeep {
    store: MemoryStore,
    clock: Arc<dyn Clock>,
    /// The store's refusals already counted and logged.
    reported: Arc<AtomicU64>,
}

impl Upkeep {
    /// How often the server runs it.
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

    fn new(store: MemoryStore, clock: Arc<dyn Clock>) -> Self {
        Self { store, clock, reported: Arc::new(AtomicU64::new(0)) }
    }

    /// Removes every key expired at the clock's now (in a full store, every
    /// key whole again too); returns how many. Counts the requests the full
    /// store refused since the last run in [`MEMORY_KEYS_REFUSED_TOTAL`],
    /// with one warning when there were any.
    pub fn run(&self) -> usize {
        let purged = self.store.purge_expired(self.clock.epoch_millis());
        let refused = self.store.refused_keys();
        let new = refused.saturating_sub(self.reported.swap(refused, Ordering::Relaxed));
        // Incremented by 0 too: the series exists before the first refusal.
        metrics::counter!(MEMORY_KEYS_REFUSED_TOTAL).increment(new);
        if new > 0 {
            tracing::warn!(
                refused = new,
                max_keys = self.store.max_keys(),
                "the in-process rate-limit store is full: requests needing a new key (a new \
                 subject) were refused (HTTP 503, Envoy OVER_LIMIT) until keys expire or are \
                 whole again; memory.max-keys sizes it (docs/operations.md)"
            );
        }
        purged
    }
}

/// The state a provider keeps across a reload: a port built over a new
/// policy table from it shares the counters (memory) or the connection and
/// script lane (Redis) of the one it replaces.
#[derive(Debug, Clone)]
pub enum ProviderState {
    /// The memory provider's store.
    Memory(MemoryStore),
    /// The Redis provider.
    Redis {
        /// The Redis adapter first built.
        adapter: Arc<RedisEdgeRateLimitAdapter>,
        /// The degraded mode, when `capabilities.rate-limit.degraded` is
        /// enabled: its local counts and whether it is on.
        degraded: Option<Arc<DegradedMode>>,
    },
}

impl ProviderState {
    /// A port over the policies of `config`, sharing this state.
    pub fn port_with_policies(
        &self,
        config: &AppConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn EdgeRateLimitPort>, BootstrapError> {
        self.port_holding(config, config.rate_limit_policies(), clock)
    }

    /// A port over `policies`, sharing this state (and, in degraded mode,
    /// holding each at its share).
    fn port_holding(
        &self,
        config: &AppConfig,
        policies: Vec<RateLimitPolicy>,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn EdgeRateLimitPort>, BootstrapError> {
        Ok(match self {
            Self::Memory(store) => {
                let adapter =
                    MemoryEdgeRateLimitAdapter::with_store(store.clone(), policies, clock)
                        .map_err(|error| wiring("the memory provider", error))?;
                let retry_after = config.capabilities.rate_limit.edge.failure_retry_after;
                Arc::new(adapter.with_failure_retry_after(retry_after))
            }
            Self::Redis { adapter, degraded } => {
                let redis: Arc<dyn EdgeRateLimitPort> = Arc::new(
                    adapter
                        .with_policies(policies.iter().cloned())
                        .map_err(|error| wiring("the redis provider", error))?,
                );
                match degraded {
                    None => redis,
                    Some(mode) => Arc::new(degraded_port(config, redis, &policies, mode, clock)?),
                }
            }
        })
    }
}

/// The Redis port `redis` behind the degraded mode `mode`: a memory
/// provider over the mode's store holds each of `policies` at its share.
fn degraded_port(
    config: &AppConfig,
    redis: Arc<dyn EdgeRateLimitPort>,
    policies: &[RateLimitPolicy],
    mode: &Arc<DegradedMode>,
    clock: Arc<dyn Clock>,
) -> Result<DegradedPort, BootstrapError> {
    let local_policies = policies
        .iter()
        .map(|policy| degraded::scaled(policy, mode.instances()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| wiring("the degraded mode", error))?;
    let local = MemoryEdgeRateLimitAdapter::with_store(mode.store().clone(), local_policies, clock)
        .map_err(|error| wiring("the degraded mode", error))?
        .with_failure_retry_after(config.capabilities.rate_limit.edge.failure_retry_after);
    Ok(DegradedPort::new(redis, Arc::new(local), Arc::clone(mode)))
}

impl RateLimitCapability {
    /// Builds the configured provider. Redis connects lazily, so this
    /// succeeds while the server is down (readiness reports it).
    pub fn build(config: &AppConfig, clock: Arc<dyn Clock>) -> Result<Self, BootstrapError> {
        let provider = config.capabilities.rate_limit.provider.clone();
        let (port, upkeep, state): (Arc<dyn EdgeRateLimitPort>, _, _) = match provider {
            ProviderConfig::Disabled => return Ok(Self::Disabled),
            ProviderConfig::Memory => {
                let adapter = memory_provider(config, Arc::clone(&clock))?;
                let store = adapter.store().clone();
                let upkeep = Upkeep::new(store.clone(), clock);
                (Arc::new(adapter), Some(upkeep), ProviderState::Memory(store))
            }
            ProviderConfig::Redis => {
                let adapter = Arc::new(redis_provider(config, Arc::clone(&clock))?);
                let degraded = &config.capabilities.rate_limit.degraded;
                // Validation refuses `enabled` with no or 0 instances.
                let instances =
                    degraded.instances.and_then(NonZeroU32::new).filter(|_| degraded.enabled);
                let Some(instances) = instances else {
                    let state =
                        ProviderState::Redis { adapter: Arc::clone(&adapter), degraded: None };
                    return Ok(Self::Enabled { provider, port: adapter, upkeep: None, state });
                };
                let store = MemoryStore::with_max_keys(config.memory.max_keys());
                let mode = Arc::new(DegradedMode::new(store, instances, Arc::clone(&clock)));
                let policies = config.rate_limit_policies();
                let redis: Arc<dyn EdgeRateLimitPort> = Arc::clone(&adapter) as _;
                let port = degraded_port(config, redis, &policies, &mode, Arc::clone(&clock))?;
                // The local counts expire as the memory provider's do.
                let upkeep = Upkeep::new(mode.store().clone(), clock);
                let state = ProviderState::Redis { adapter, degraded: Some(mode) };
                (Arc::new(port) as _, Some(upkeep), state)
            }
        };
        Ok(Self::Enabled { provider, port, upkeep, state })
    }

    /// The provider's background work, if it has any.
    pub fn upkeep(&self) -> Option<&Upkeep> {
        match self {
            Self::Enabled { upkeep, .. } => upkeep.as_ref(),
            Self::Disabled => None,
        }
    }

    /// The state a reload builds the next port from, when there is a
    /// provider.
    pub fn state(&self) -> Option<&ProviderState> {
        match self {
            Self::Enabled { state, .. } => Some(state),
            Self::Disabled => None,
        }
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
    let store = MemoryStore::with_max_keys(config.memory.max_keys());
    let adapter =
        MemoryEdgeRateLimitAdapter::with_store(store, config.rate_limit_policies(), clock)
            .map_err(|error| wiring("the memory provider", error))?;
    Ok(adapter.with_failure_retry_after(config.capabilities.rate_limit.edge.failure_retry_after))
}

fn redis_provider(
    config: &AppConfig,
    clock: Arc<dyn Clock>,
) -> Result<RedisEdgeRateLimitAdapter, BootstrapError> {
    let settings =
        config.redis.provider_settings(config.capabilities.rate_limit.edge.failure_retry_after);
    RedisEdgeRateLimitAdapter::new(settings, config.rate_limit_policies(), clock)
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

/// The Envoy RLS engine of `config` over `port` (`None`: the provider is
/// `disabled`, and every descriptor is answered `OK`), naming subjects with
/// the HTTP edge's pseudonymizer.
pub fn rls_engine(
    config: &AppConfig,
    provider: Option<(Arc<dyn EdgeRateLimitPort>, &ProviderState)>,
    pseudonymizer: Arc<dyn SubjectPseudonymizer>,
    clock: Arc<dyn Clock>,
) -> Result<RlsEngine, BootstrapError> {
    let settings =
        RlsSettings { evaluation_budget: config.capabilities.rate_limit.edge.evaluation_budget };
    let Some((port, state)) = provider else {
        return Ok(RlsEngine::disabled(pseudonymizer, clock, settings));
    };
    let mut rules = Vec::with_capacity(config.envoy_rls.rules.len());
    for rule in &config.envoy_rls.rules {
        let limit = if rule.unlimited {
            RuleLimit::Unlimited
        } else if rule.blocked {
            RuleLimit::Blocked
        } else if rule.not_limited {
            RuleLimit::NotLimited
        } else {
            let ids = rule.policies.iter().map(|id| PolicyId::new(id.as_str()));
            let policies = ids
                .collect::<Result<Vec<_>, _>>()
                .and_then(PolicySet::new)
                .map_err(|error| wiring("the envoy rls rules", error))?;
            RuleLimit::Policies(policies)
        };
        let pattern =
            rule.entries().map(|(key, value)| (key.to_owned(), value.map(str::to_owned))).collect();
        rules.push(RlsRule {
            domain: rule.domain.clone(),
            pattern,
            subject: rule.subject.clone(),
            limit,
            name: rule.name.clone(),
            replaces: rule.replaces.clone(),
            allow_override: rule.allow_override,
            charge_always: rule.charge == RuleCharge::Always,
        });
    }
    let overrides = rules.iter().any(|rule| rule.allow_override).then(|| {
        let (state, config, clock) = (state.clone(), config.clone(), Arc::clone(&clock));
        // The port of one effective limit, over the provider's store: the
        // engine builds each once and keeps it.
        let ports: OverridePorts = Arc::new(move |policy| {
            let port = state.port_holding(&config, vec![policy], Arc::clone(&clock));
            port.inspect_err(|error| tracing::warn!(%error, "a limit override's port failed")).ok()
        });
        ports
    });
    let engine = RlsEngine::new(port, pseudonymizer, clock, settings, &rules)
        .map_err(|error| wiring("the envoy rls rules", error))?;
    Ok(match overrides {
        Some(ports) => engine.with_overrides(ports),
        None => engine,
    })
}

/// The edge settings of `capabilities.rate-limit`.
pub fn edge_settings(config: &AppConfig) -> Result<EdgeSettings, BootstrapError> {
    let rate_limit = &config.capabilities.rate_limit;
    let policy_set = |ids: &[String]| {
        let ids = ids.iter().map(|id| PolicyId::new(id.as_str())).collect::<Result<Vec<_>, _>>();
        ids.and_then(PolicySet::new).map_err(|error| wiring("the edge settings", error))
    };
    let mut operations = HashMap::new();
    for (operation, ids) in &rate_limit.operations {
        operations.insert(operation.clone(), policy_set(ids)?);
    }
    let settings = EdgeSettings {
        default_policies: policy_set(&rate_limit.default_policy)?,
        operations,
        ..rate_limit.edge.clone()
    };
    settings.validate().map_err(|error| wiring("the edge settings", error))?;
    Ok(settings)
}

fn wiring(component: &'static str, error: impl std::fmt::Display) -> BootstrapError {
    BootstrapError::Wiring { component, reason: error.to_string() }
}

#[cfg(test)]
mod tests {
    use shared_contract::{Algorithm, Clock, ManualClock, PolicyId, RateLimitOutcomeExt};

    use super::*;
    use crate::config::ConfigSources;

    const KEY: &str = "capability-test-key-0123456789abcdef";

    #[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
    fn config(toml: &str) -> AppConfig {
        let mut loaded = None;
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("c.toml", toml)?;
            loaded = Some(
                AppConfig::load(&ConfigSources::new(Some("c.toml".into())))
                    .map_err(|e| e.to_string())?,
            );
            Ok(())
        });
        loaded.expect("loaded")
    }

    fn clock() -> Arc<dyn Clock> {
        Arc::new(ManualClock::new(1_700_000_000_000))
    }

    #[tokio::test]
    async fn memory_is_the_default_and_holds_the_configured_policies() {
        let config = config("");
        let capability = RateLimitCapability::build(&config, clock()).unwrap();
        let RateLimitCapability::Enabled { provider, port, upkeep, .. } = &capability else {
            panic!("memory must be enabled");
        };
        assert_eq!(*provider, ProviderConfig::Memory);
        let demo = port
            .policy(&PolicyId::new(adapter_web::DEFAULT_POLICY).unwrap())
            .expect("the demo policy");
        assert_eq!(
            *demo.algorithm(),
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 5,
                window: std::time::Duration::from_secs(60)
            })
        );
        assert!(capability.is_ready().await);
        assert!(capability.layer(&config, clock()).unwrap().switch().is_some());
        assert!(upkeep.is_some(), "the memory provider is purged in the background");
    }

    #[tokio::test]
    async fn the_upkeep_purges_what_expired_on_the_provider_s_clock() {
        let manual = ManualClock::new(1_700_000_000_000);
        let capability = RateLimitCapability::build(&config(""), Arc::new(manual.clone())).unwrap();
        let (Some(port), Some(upkeep)) = (capability.port(), capability.upkeep()) else {
            panic!("memory has a port and an upkeep");
        };
        let request = shared_contract::RateLimitRequest {
            policies: PolicySet::single(PolicyId::new(adapter_web::DEFAULT_POLICY).unwrap()).into(),
            subject: shared_contract::SubjectDigest::parse(format!("v1:{}", "ab".repeat(16)))
                .unwrap(),
            operation: shared_contract::OperationDigest::from_u64(0x0000_0000_0000_00c1),
            cost: 1,
            evaluation_id: shared_contract::EvaluationId::random(),
            deadline: manual.monotonic() + std::time::Duration::from_secs(5),
        };
        assert!(port.evaluate(request).await.is_allowed());
        assert_eq!(upkeep.run(), 0, "nothing has expired yet");
        // The demo window (60 s) and the dedupe record (5 s) end within a
        // minute, plus the 1 s grace.
        manual.advance(std::time::Duration::from_secs(62));
        assert_eq!(upkeep.run(), 1);
    }

    /// A request of the demo policy for subject `n`.
    fn demo_request(clock: &ManualClock, n: u8) -> shared_contract::RateLimitRequest<'static> {
        shared_contract::RateLimitRequest {
            policies: PolicySet::single(PolicyId::new(adapter_web::DEFAULT_POLICY).unwrap()).into(),
            subject: shared_contract::SubjectDigest::parse(format!("v1:{}", hex::encode([n; 16])))
                .unwrap(),
            operation: shared_contract::OperationDigest::from_u64(0x0000_0000_0000_00c1),
            cost: 1,
            evaluation_id: shared_contract::EvaluationId::random(),
            deadline: clock.monotonic() + std::time::Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn memory_max_keys_bounds_the_store_and_the_upkeep_counts_its_refusals() {
        assert_eq!(MEMORY_KEYS_REFUSED_TOTAL, "ca_skeleton_rate_limit_memory_keys_refused_total");
        let manual = ManualClock::new(1_700_000_000_000);
        // One key: one shard of one (a larger bound is split over shards).
        let config = config("[memory]\nmax-keys = 1\n");
        assert_eq!(config.memory.max_keys, 1);
        let capability = RateLimitCapability::build(&config, Arc::new(manual.clone())).unwrap();
        let (Some(port), Some(upkeep)) = (capability.port(), capability.upkeep()) else {
            panic!("memory has a port and an upkeep");
        };
        assert_eq!(upkeep.store.max_keys(), 1);
        // One subject fills it; another is refused fail-closed, twice.
        assert!(port.evaluate(demo_request(&manual, 1)).await.is_allowed());
        for _ in 0..2 {
            let refused = port.evaluate(demo_request(&manual, 3)).await;
            assert!(
                matches!(
                    refused,
                    Err(shared_contract::RateLimitFailure::Unavailable {
                        category: shared_contract::UnavailableCategory::AdmissionRejected,
                        ..
                    })
                ),
                "{refused:?}"
            );
        }
        // The held subjects are decided as before.
        assert!(port.evaluate(demo_request(&manual, 1)).await.is_allowed());
        assert_eq!(upkeep.store.refused_keys(), 2);
        upkeep.run();
        assert_eq!(upkeep.reported.load(Ordering::Relaxed), 2, "counted once");
        upkeep.run();
        assert_eq!(upkeep.reported.load(Ordering::Relaxed), 2);
        // The default when the table is absent.
        let default = RateLimitCapability::build(&self::config(""), clock()).unwrap();
        let bound = default.upkeep().map(|upkeep| upkeep.store.max_keys());
        assert!(bound.is_some_and(|keys| keys <= adapter_memory::DEFAULT_MAX_KEYS));
    }

    #[test]
    #[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
    fn memory_max_keys_of_0_stops_start_up_naming_the_key() {
        let mut problem = None;
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("c.toml", "[memory]\nmax-keys = 0\n")?;
            problem = AppConfig::load(&ConfigSources::new(Some("c.toml".into())))
                .err()
                .map(|error| error.to_string());
            Ok(())
        });
        let problem = problem.expect("refused");
        assert!(problem.contains("memory.max-keys: must be at least 1"), "{problem}");
    }

    #[tokio::test]
    async fn disabled_has_no_port_and_a_pass_through_layer() {
        let config = config("[capabilities.rate-limit]\nprovider = \"disabled\"\n");
        let capability = RateLimitCapability::build(&config, clock()).unwrap();
        assert!(capability.port().is_none());
        assert!(capability.is_ready().await);
        assert!(capability.layer(&config, clock()).unwrap().switch().is_none());
    }

    #[tokio::test]
    async fn redis_builds_without_a_server_and_is_not_ready() {
        // A port nobody listens on: bind, note it, close it.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let config = config(&format!(
            "[capabilities.rate-limit]\nprovider = \"redis\"\n[pseudonymizer.keys]\n1 = \"{KEY}\"\n\
             [redis]\nenabled = true\nurls = [\"redis://{closed}\"]\n"
        ));
        let capability = RateLimitCapability::build(&config, clock()).unwrap();
        let RateLimitCapability::Enabled { provider, .. } = &capability else {
            panic!("redis must be enabled");
        };
        assert_eq!(*provider, ProviderConfig::Redis);
        assert!(!capability.is_ready().await);
    }

    /// Redis with degraded mode over `limit` per minute at `revision`, four
    /// instances, at a port nobody listens on.
    fn degraded_over_a_closed_port(
        closed: std::net::SocketAddr,
        limit: u64,
        revision: u32,
    ) -> AppConfig {
        config(&format!(
            "[capabilities.rate-limit]\nprovider = \"redis\"\ndefault-policy = \"api\"\n\
             [capabilities.rate-limit.degraded]\nenabled = true\ninstances = 4\n\
             [capabilities.rate-limit.policies.api]\nalgorithm = \"fixed-window\"\n\
             limit = {limit}\nwindow = \"60s\"\nrevision = {revision}\n\
             [pseudonymizer.keys]\n1 = \"{KEY}\"\n\
             [redis]\nenabled = true\nurls = [\"redis://{closed}\"]\n"
        ))
    }

    async fn admitted_of(port: &dyn EdgeRateLimitPort, clock: &ManualClock, asked: u32) -> u32 {
        let mut admitted = 0;
        for _ in 0..asked {
            let request = shared_contract::RateLimitRequest {
                policies: PolicySet::single(PolicyId::new("api").unwrap()).into(),
                subject: shared_contract::SubjectDigest::parse(format!("v1:{}", "cd".repeat(16)))
                    .unwrap(),
                operation: shared_contract::OperationDigest::from_u64(0x0000_0000_0000_00c1),
                cost: 1,
                evaluation_id: shared_contract::EvaluationId::random(),
                deadline: clock.monotonic() + std::time::Duration::from_secs(1),
            };
            let outcome = port.evaluate(request).await;
            let Ok(set) = outcome else {
                panic!("degraded mode answers every request: {outcome:?}");
            };
            assert_eq!(set.source(), shared_contract::DecisionSource::Degraded);
            admitted += u32::from(set.allowed());
        }
        admitted
    }

    #[tokio::test]
    async fn degraded_redis_limits_locally_and_a_reload_moves_the_local_limit_with_the_table() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let manual = ManualClock::new(1_700_000_040_000);
        let clock: Arc<dyn Clock> = Arc::new(manual.clone());
        let config = degraded_over_a_closed_port(closed, 10, 1);
        let capability = RateLimitCapability::build(&config, Arc::clone(&clock)).unwrap();
        let (Some(port), Some(state)) = (capability.port(), capability.state()) else {
            panic!("redis has a port and a state");
        };
        assert!(capability.upkeep().is_some(), "the local counts are purged in the background");
        assert!(capability.is_ready().await, "degraded: ready while Redis is not");
        // ceil(10 / 4) = 3.
        assert_eq!(admitted_of(&**port, &manual, 5).await, 3);
        // The same table again (a reload of another key): the same counts.
        let same = state.port_with_policies(&config, Arc::clone(&clock)).unwrap();
        assert_eq!(admitted_of(&*same, &manual, 2).await, 0);
        // A new revision at 20: ceil(20 / 4) = 5, on fresh counters.
        let raised = degraded_over_a_closed_port(closed, 20, 2);
        let reloaded = state.port_with_policies(&raised, Arc::clone(&clock)).unwrap();
        assert_eq!(reloaded.policy(&PolicyId::new("api").unwrap()).unwrap().limit(), 20);
        assert_eq!(admitted_of(&*reloaded, &manual, 7).await, 5);
    }

    #[tokio::test]
    async fn degraded_mode_counts_in_a_store_of_memory_max_keys() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let config = config(&format!(
            "[capabilities.rate-limit]\nprovider = \"redis\"\n\
             [capabilities.rate-limit.degraded]\nenabled = true\ninstances = 2\n\
             [memory]\nmax-keys = 4\n[pseudonymizer.keys]\n1 = \"{KEY}\"\n\
             [redis]\nenabled = true\nurls = [\"redis://{closed}\"]\n"
        ));
        let capability = RateLimitCapability::build(&config, clock()).unwrap();
        let Some(ProviderState::Redis { degraded: Some(mode), .. }) = capability.state() else {
            panic!("redis with degraded mode");
        };
        assert_eq!(mode.store().max_keys(), 4);
    }

    #[test]
    fn a_configured_key_is_used_and_none_generates_one() {
        let configured =
            config(&format!("[pseudonymizer]\nactive-version = 7\nkeys = {{ 7 = \"{KEY}\" }}\n"));
        assert_eq!(pseudonymizer(&configured).unwrap().active_version(), 7);
        let generated = pseudonymizer(&config("")).unwrap();
        assert_eq!(generated.active_version(), GENERATED_KEY_VERSION);
    }

    #[test]
    fn edge_settings_follow_the_configuration() {
        let config = config(
            "[capabilities.rate-limit]\ndefault-policy = \"demo\"\napi-key-header = \"X-Client-Key\"\n\
             evaluation-budget = \"300ms\"\ntrusted-proxies = \"10.0.0.0/8\"\n\
             operations = { \"GET /api/hello\" = \"demo\" }\n\
             [capabilities.rate-limit.policies.demo]\nalgorithm = \"fixed-window\"\nlimit = 5\n\
             window = \"60s\"\n",
        );
        let settings = edge_settings(&config).unwrap();
        let header = settings.api_key_header.as_ref().map(axum::http::HeaderName::as_str);
        assert_eq!(header, Some("x-client-key"));
        assert_eq!(settings.evaluation_budget, std::time::Duration::from_millis(300));
        assert_eq!(settings.trusted_proxies, ["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]);
        assert_eq!(settings.operations["GET /api/hello"].ids()[0].as_str(), "demo");
        assert_eq!(settings.default_policies.ids()[0].as_str(), "demo");
    }
}
