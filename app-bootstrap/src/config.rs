//! The configuration model: what `ca-skeleton` reads, after defaults, the
//! TOML file and the environment have been layered and every rule checked.
//!
//! Loading lives in `sources`, the typed reading of the merged tree in
//! `read`, the cross-field rules in `validate`, and the redacted rendering
//! for `check-config` in `render`.

mod problems;
mod read;
pub(crate) mod render;
mod secret;
pub(crate) mod sources;
#[cfg(test)]
mod tests;
pub(crate) mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use adapter_redis::RedisSettings;
use adapter_web::EdgeSettings;
use serde::{Deserialize, Serialize};
use shared_contract::RateLimitPolicy;

pub use problems::{ConfigProblem, ConfigProblems, KeyPath};
pub use secret::{SecretSource, SecretValue};
pub use sources::{CONFIG_FILE_ENV, ConfigSources, ENV_PREFIX};
pub(crate) use validate::is_operation;

use crate::error::BootstrapError;

/// The whole resolved configuration. Its `Serialize` is what `check-config`
/// prints (`render`): the keys a file uses, every secret redacted.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct AppConfig {
    /// `server.*`: the HTTP listener.
    pub server: ServerConfig,
    /// `capabilities.*`: which provider backs each capability.
    pub capabilities: CapabilitiesConfig,
    /// `pseudonymizer.*`: the HMAC keys that turn subjects into digests.
    pub pseudonymizer: PseudonymizerConfig,
    /// `redis.*`: the Redis connection, used by the `redis` provider.
    pub redis: RedisConfig,
    /// `memory.*`: the in-process store of the `memory` provider and of
    /// degraded mode.
    pub memory: MemoryConfig,
    /// `admin.*`: the operator listener, off unless `admin.listen` is set.
    pub admin: AdminConfig,
    /// `envoy-rls.*`: Envoy's Rate Limit Service over gRPC, off unless
    /// `envoy-rls.listen` is set.
    pub envoy_rls: EnvoyRlsConfig,
    /// `telemetry.*`: trace export, off unless `telemetry.otlp.endpoint`
    /// is set.
    pub telemetry: TelemetryConfig,
}

/// `telemetry.*`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// `telemetry.otlp.*`: OpenTelemetry traces over OTLP/HTTP.
    pub otlp: OtlpConfig,
}

/// `telemetry.otlp.*`: where and how spans are exported. Its serde names
/// are the keys, its `Default` the defaults; the headers are secrets, read
/// with their sources by the configuration layer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct OtlpConfig {
    /// `endpoint`: the collector's OTLP/HTTP base URL, `http` or `https`
    /// (rustls, trusting a pinned CA file or the OS store: see
    /// `telemetry::trusted_roots`); spans go to `<endpoint>/v1/traces`.
    /// `None` (the default) exports nothing, and the edge makes no span at
    /// all.
    pub endpoint: Option<String>,
    /// `ca-file`: a PEM file of the CA certificates an `https` collector is
    /// checked against, replacing every other root (a private collector's
    /// CA). Read when the configuration is checked and at start.
    pub ca_file: Option<String>,
    /// `service-name`: the resource attribute `service.name`.
    pub service_name: String,
    /// `sample-ratio`: the share of new traces kept, `0.0..=1.0`. Parent
    /// based only with `trust-remote-parent`: then a request whose
    /// `traceparent` is sampled is always kept, one whose `traceparent` is
    /// not sampled never.
    #[serde(deserialize_with = "ratio")]
    pub sample_ratio: f64,
    /// `trust-remote-parent`: whether a caller's `traceparent` and
    /// `tracestate` are trusted (off by default: at a public edge any
    /// client writes them). On, a request joins the caller's trace, keeps
    /// its `tracestate` and is traced as its sampled flag says; off, the
    /// ratio decides and a traced request is a trace of its own with a
    /// link to the caller's span ids.
    pub trust_remote_parent: bool,
    /// `timeout`: how long one export may take before it counts as failed.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// `headers.<name>`: extra headers of every export request (an API key
    /// of a hosted collector), inline or `{ env = "VAR" }`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, SecretValue>,
}

/// Reads a ratio (`telemetry.otlp.sample-ratio`) as a number, integer or
/// not, so that a value of another type is refused saying what the key
/// takes ("expected a number from 0.0 to 1.0") rather than Rust's `f64`.
/// The range itself is checked with the other values (`validate`).
fn ratio<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    struct Ratio;
    impl serde::de::Visitor<'_> for Ratio {
        type Value = f64;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("a number from 0.0 to 1.0")
        }

        fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<f64, E> {
            Ok(value)
        }

        #[allow(clippy::cast_precision_loss)] // Any integer but 0 and 1 is refused anyway.
        fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<f64, E> {
            Ok(value as f64)
        }

        #[allow(clippy::cast_precision_loss)] // Any integer but 0 and 1 is refused anyway.
        fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<f64, E> {
            Ok(value as f64)
        }
    }
    deserializer.deserialize_f64(Ratio)
}

/// `degraded.instances`: a number out of range names the range the key
/// accepts, 1 to `u32::MAX` (0 reads; validation says why it is no fleet).
fn instances<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u32>, D::Error> {
    struct Instances;
    impl serde::de::Visitor<'_> for Instances {
        type Value = Option<u32>;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("a whole number")
        }

        fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Self::Value, E> {
            u32::try_from(value).map(Some).map_err(|_| E::custom(out_of_range()))
        }

        fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Self::Value, E> {
            u64::try_from(value)
                .map_err(|_| E::custom(out_of_range()))
                .and_then(|v| self.visit_u64(v))
        }

        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(E::custom(out_of_range()))
        }
    }
    fn out_of_range() -> String {
        format!("must be a whole number from 1 to {}", u32::MAX)
    }
    deserializer.deserialize_any(Instances)
}

impl Default for OtlpConfig {
    /// No export; `ca-skeleton`, every trace kept, 2 s per export.
    fn default() -> Self {
        Self {
            endpoint: None,
            ca_file: None,
            service_name: "ca-skeleton".to_owned(),
            sample_ratio: 1.0,
            trust_remote_parent: false,
            timeout: Duration::from_secs(2),
            headers: BTreeMap::new(),
        }
    }
}

impl OtlpConfig {
    /// The longest `timeout`.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
}

/// `envoy-rls.*`: the gRPC listener of Envoy's Rate Limit Service and the
/// rules that map a descriptor to a policy set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvoyRlsConfig {
    /// `listen`: the gRPC socket address; `None` (the default) keeps the
    /// listener off. Applied only by a restart.
    pub listen: Option<SocketAddr>,
    /// `rules`: in order; a descriptor matches the first rule of its
    /// domain whose pattern fits.
    pub rules: Vec<RlsRuleConfig>,
}

/// One `[[envoy-rls.rules]]` table, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlsRuleConfig {
    /// `domain`: the `domain` of Envoy's request; not empty.
    pub domain: String,
    /// `descriptor`: the entry keys in order; `"key=value"` fixes a value.
    #[serde(deserialize_with = "read::list")]
    pub descriptor: Vec<String>,
    /// `subject`: the entries whose values are the subject (one key or a
    /// list, empty for one budget for all); `None` means every entry
    /// without a fixed value, and every wildcard entry.
    #[serde(default, deserialize_with = "read::some_list")]
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "render::some_list")]
    pub subject: Option<Vec<String>>,
    /// `policies`: one policy id or a list of up to 8, as operations take;
    /// empty when `unlimited`.
    #[serde(default, deserialize_with = "read::list")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "render::list")]
    pub policies: Vec<String>,
    /// `unlimited`: `true` answers the rule's descriptors `OK` without a
    /// provider call (envoyproxy/ratelimit's `unlimited`); a rule has
    /// `policies` or one of `unlimited`, `blocked` and `not-limited`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unlimited: bool,
    /// `blocked`: `true` answers the rule's descriptors `OVER_LIMIT` and
    /// refuses the call without a provider call (`requests_per_unit: 0`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocked: bool,
    /// `not-limited`: `true` answers the rule's descriptors as no rule
    /// does (`OK`, no limit), and no later rule is tried.
    #[serde(default, rename = "not-limited", skip_serializing_if = "std::ops::Not::not")]
    pub not_limited: bool,
    /// `name`: what other rules' `replaces` call this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `replaces`: the names of the rules this one replaces when a call
    /// matches both (envoyproxy/ratelimit's `replaces`).
    #[serde(default, deserialize_with = "read::list")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "render::list")]
    pub replaces: Vec<String>,
    /// `allow-override`: `true` honours a descriptor's `limit` override
    /// (set by Envoy's route configuration) as a fixed window of its own
    /// instead of `policies`; off, it is ignored and counted. Only on a
    /// rule with `policies`.
    #[serde(default, rename = "allow-override", skip_serializing_if = "std::ops::Not::not")]
    pub allow_override: bool,
    /// `charge`: `"when-allowed"` (the default) charges a descriptor's hits
    /// only when its set admits them; `"always"` takes them as usage
    /// reported after the fact (Envoy's `apply_on_stream_done`): charged
    /// whatever remains, into debt, and answered `OK`. Only on a rule with
    /// `policies`.
    #[serde(default, skip_serializing_if = "RuleCharge::is_default")]
    pub charge: RuleCharge,
}

/// When an RLS rule's descriptors are charged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleCharge {
    /// When the set admits them: a refusal charges nothing.
    #[default]
    WhenAllowed,
    /// Always: usage already spent, charged past the limit if need be.
    Always,
}

impl RuleCharge {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl RlsRuleConfig {
    /// The pattern's entries: each key with its fixed value, if any.
    pub fn entries(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.descriptor.iter().map(|entry| match entry.split_once('=') {
            Some((key, value)) => (key, Some(value)),
            None => (entry.as_str(), None),
        })
    }

    /// The keys whose values are the subject: `subject` as written, or
    /// every entry without a fixed value or with a wildcard, in pattern order.
    pub fn subject_keys(&self) -> Vec<&str> {
        match &self.subject {
            Some(keys) => keys.iter().map(String::as_str).collect(),
            None => self
                .entries()
                .filter(|(_, value)| counts_apart(*value))
                .map(|(key, _)| key)
                .collect(),
        }
    }

    /// `unlimited`, `blocked` and `not-limited`, those set: how the rule
    /// answers without policies.
    pub fn answers(&self) -> Vec<&'static str> {
        let keys = [("unlimited", self.unlimited), ("blocked", self.blocked)];
        let keys = keys.into_iter().chain([("not-limited", self.not_limited)]);
        keys.filter(|(_, set)| *set).map(|(key, _)| key).collect()
    }
}

/// Whether an entry with this fixed value (if any) tells subjects apart:
/// none, or a wildcard, whose every matching value counts on its own.
pub(crate) fn counts_apart(value: Option<&str>) -> bool {
    value.is_none_or(|value| value.contains('*'))
}

/// `admin.*`: the operator listener (inspect and reset a budget, look up
/// a pseudonym). Off by default; it never shares the public port.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// `listen`: the admin socket address; `None` (the default) keeps the
    /// listener off.
    pub listen: Option<SocketAddr>,
    /// `token`: the bearer token, inline or `{ env = "VAR" }`; at least
    /// [`MIN_ADMIN_TOKEN_BYTES`] bytes, required when `listen` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<SecretValue>,
}

/// Shortest admin token accepted: 256 bits, as random as a pseudonymizer
/// key, so guessing is never the way in.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 32;

/// `server.*`: its serde names are the keys, its `Default` the defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ServerConfig {
    /// `server.listen`: the socket address to bind.
    pub listen: SocketAddr,
    /// `server.shutdown-grace`: how long the connections open at SIGTERM
    /// may finish before they are cut and the process exits (the admin
    /// listener's too).
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// `server.header-read-timeout`: how long a connection may take to
    /// send a whole request head, and an idle keep-alive one to start its
    /// next, before it is closed (the admin listener's too).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
}

impl Default for ServerConfig {
    /// `127.0.0.1:8080`, 10 s to drain, 10 s for a request head.
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            shutdown_grace: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

impl ServerConfig {
    /// The longest either timeout may be: past it, a stuck client holds a
    /// connection (or a deploy) for longer than anyone waits on purpose.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
}

/// `capabilities.*`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CapabilitiesConfig {
    /// `capabilities.rate-limit.*`.
    pub rate_limit: RateLimitConfig,
}

/// `capabilities.rate-limit.provider`: which provider serves the edge,
/// with its own settings when it has some, in the table named after it
/// (`[capabilities.rate-limit.<provider>]`; a variant `Name { name:
/// NameSettings }`). A provider is a variant here and its arm in
/// `RateLimitCapability::build` (`capability.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ProviderConfig {
    /// The embedded in-process provider (one instance), sized by
    /// `[memory]`.
    #[default]
    Memory,
    /// The Redis provider (standalone, cluster or sentinel; many
    /// instances), connected by `[redis]`, which `redis-acl` and the
    /// global switch read too.
    Redis,
    /// No rate limiting: the layer passes every request through.
    Disabled,
}

impl ProviderConfig {
    /// The configuration name, as its `Serialize` writes it.
    pub fn name(&self) -> String {
        let table = toml::Table::try_from(self).unwrap_or_default();
        table.get("provider").and_then(toml::Value::as_str).unwrap_or_default().to_owned()
    }
}

/// `capabilities.rate-limit.*`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct RateLimitConfig {
    /// `provider`: `memory` (default), `redis` or `disabled`, and the
    /// provider's own table.
    #[serde(flatten)]
    pub provider: ProviderConfig,
    /// `default-policy`: the policy set of operations not named in
    /// `operations`, in order (one id, or a list of up to 8).
    #[serde(serialize_with = "render::list")]
    pub default_policy: Vec<String>,
    /// Every other key but `operations` and `policies`, as the edge owns
    /// it: the field, its rules and its default are written once, in
    /// [`EdgeSettings`]. Its policy sets stay at their defaults here; the
    /// ids as configured are `default_policy` and `operations`.
    #[serde(flatten)]
    pub edge: EdgeSettings,
    /// `operations`: `"METHOD /route/{template}"` -> its policy set, in
    /// order (one id, or a list of up to 8).
    #[serde(serialize_with = "render::lists")]
    pub operations: BTreeMap<String, Vec<String>>,
    /// `policies.<id>`: every policy the provider holds, built and checked
    /// by the contract's policy builder.
    #[serde(serialize_with = "render::policies")]
    pub policies: BTreeMap<String, RateLimitPolicy>,
    /// `degraded.*`: the opt-in local limit while Redis cannot decide.
    pub degraded: DegradedConfig,
}

/// `capabilities.rate-limit.degraded.*`: what the Redis provider does when
/// an evaluation ends `Unavailable` or `Indeterminate`. Off by default:
/// fail-closed (503). On, an in-process limiter holding each policy at
/// `ceil(limit / instances)` decides instead (`crate::degraded`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DegradedConfig {
    /// `enabled`: decide locally while Redis cannot (default false). Only
    /// with `provider = "redis"`: the memory provider has nothing to
    /// degrade from.
    pub enabled: bool,
    /// `instances`: how many instances share the traffic while Redis is
    /// away; each holds `ceil(limit / instances)`. No default that could
    /// be right for a fleet: required when `enabled` (missing is a
    /// problem, and so is 0).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "instances")]
    pub instances: Option<u32>,
}

/// `memory.*`: the in-process store the `memory` provider counts in, and
/// degraded mode's local counts. Its serde names are the keys, its
/// `Default` the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct MemoryConfig {
    /// `max-keys`: the most keys (one per subject, policy and operation)
    /// the store holds, at least 1. Full, it drops keys that are expired
    /// or whole again, then refuses a request needing a new key (503,
    /// fail-closed); a key in use is never dropped.
    pub max_keys: usize,
}

impl Default for MemoryConfig {
    /// [`adapter_memory::DEFAULT_MAX_KEYS`].
    fn default() -> Self {
        Self { max_keys: adapter_memory::DEFAULT_MAX_KEYS }
    }
}

impl MemoryConfig {
    /// `max-keys` as the store takes it; validation refuses 0.
    pub fn max_keys(&self) -> std::num::NonZeroUsize {
        std::num::NonZeroUsize::new(self.max_keys).unwrap_or(std::num::NonZeroUsize::MIN)
    }
}

/// `pseudonymizer.*`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct PseudonymizerConfig {
    /// `active-version`: the key version that pseudonymizes new requests.
    pub active_version: u32,
    /// `keys.<version>`: key material, inline or `{ env = "VAR" }`. Empty
    /// means "none configured".
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        serialize_with = "by_version",
        deserialize_with = "versions"
    )]
    pub keys: BTreeMap<u32, SecretValue>,
}

impl Default for PseudonymizerConfig {
    /// Version 1 active, no key configured.
    fn default() -> Self {
        Self { active_version: 1, keys: BTreeMap::new() }
    }
}

/// The keys by their version as a table key, which is a string.
fn by_version<S: serde::Serializer>(
    keys: &BTreeMap<u32, SecretValue>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(keys.iter().map(|(version, key)| (version.to_string(), key)))
}

/// The keys by their version, written as a table key (a string).
fn versions<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<u32, SecretValue>, D::Error> {
    /// A version as a table key: refused there, so the problem names it.
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    struct Version(u32);
    impl<'de> Deserialize<'de> for Version {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let text = String::deserialize(deserializer)?;
            let whole = "a key version is a whole number (1, 2, ...)";
            text.parse().map(Self).map_err(|_| serde::de::Error::custom(whole))
        }
    }
    let keys = BTreeMap::<Version, SecretValue>::deserialize(deserializer)?;
    Ok(keys.into_iter().map(|(Version(version), key)| (version, key)).collect())
}

/// `redis.*`: the global switch, the provider's own settings, and the two
/// secrets with where they came from. `Debug` hides passwords, including
/// one inside a URL.
#[derive(Clone, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct RedisConfig {
    /// `enabled`: the global Redis switch (default false).
    pub enabled: bool,
    /// Every other key, as the provider owns it: the field, its rules and
    /// its default are written once, in [`RedisSettings`]. Its secrets stay
    /// empty here; `password` and `sentinel_password` hold them with their
    /// source, for `check-config`.
    #[serde(flatten)]
    pub settings: RedisSettings,
    /// `password`: inline or `{ env = "VAR" }`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<SecretValue>,
    /// `sentinel-password`: inline or `{ env = "VAR" }`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinel_password: Option<SecretValue>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls = self.settings.urls.iter().map(|url| render::redact_url(url)).collect();
        let settings = RedisSettings { urls, ..self.settings.clone() };
        f.debug_struct("RedisConfig")
            .field("enabled", &self.enabled)
            .field("settings", &settings)
            .field("password", &self.password)
            .field("sentinel_password", &self.sentinel_password)
            .finish()
    }
}

impl AppConfig {
    /// Layers defaults, the TOML file and the environment, reads the result
    /// and checks every rule. The error lists every problem found, each
    /// naming its full key path.
    pub fn load(sources: &ConfigSources) -> Result<Self, BootstrapError> {
        let (figment, tree) = sources.merged_tree()?;
        let mut problems = ConfigProblems::default();
        let (config, declared) = read::read_config(&tree, &mut problems);
        validate::validate(&config, &declared, &mut problems);
        ConfigSources::locate(&figment, &tree, &mut problems);
        if problems.is_empty() { Ok(config) } else { Err(BootstrapError::InvalidConfig(problems)) }
    }

    /// The `[redis]` table alone, read and checked by its own rules: what
    /// `redis-acl` needs. The rest of the configuration is not read, so a
    /// pseudonymizer key or admin token given as `{ env = "VAR" }` need
    /// not be set on the machine that prints the rule.
    pub fn load_redis(sources: &ConfigSources) -> Result<RedisConfig, BootstrapError> {
        let (figment, mut tree) = sources.merged_tree()?;
        tree.retain(|key, _| key == "redis");
        let mut problems = ConfigProblems::default();
        let (config, _) = read::read_config(&tree, &mut problems);
        validate::redis(&config, &mut problems);
        ConfigSources::locate(&figment, &tree, &mut problems);
        if problems.is_empty() {
            Ok(config.redis)
        } else {
            Err(BootstrapError::InvalidConfig(problems))
        }
    }

    /// Checks that every key of `capabilities.rate-limit.operations` names
    /// an operation of `served` (as `"<METHOD> <route template>"`), listing
    /// each one that does not.
    pub fn check_operations(
        &self,
        served: &std::collections::BTreeSet<String>,
    ) -> Result<(), BootstrapError> {
        let mut problems = ConfigProblems::default();
        validate::served_operations(self, served, &mut problems);
        if problems.is_empty() { Ok(()) } else { Err(BootstrapError::InvalidConfig(problems)) }
    }

    /// [`Self::check_operations`], each problem with the file line or the
    /// variable `sources` gives its key (the check runs after loading,
    /// when the merged tree is gone, so it is read again, only on failure).
    pub fn check_operations_from(
        &self,
        served: &std::collections::BTreeSet<String>,
        sources: &ConfigSources,
    ) -> Result<(), BootstrapError> {
        let mut problems = match self.check_operations(served) {
            Err(BootstrapError::InvalidConfig(problems)) => problems,
            other => return other,
        };
        if let Ok((figment, tree)) = sources.merged_tree() {
            ConfigSources::locate(&figment, &tree, &mut problems);
        }
        Err(BootstrapError::InvalidConfig(problems))
    }

    /// The configured policies.
    pub fn rate_limit_policies(&self) -> Vec<RateLimitPolicy> {
        self.capabilities.rate_limit.policies.values().cloned().collect()
    }

    /// The configuration as TOML with every secret replaced by
    /// `[REDACTED]`: what `check-config` prints.
    pub fn to_redacted_toml(&self) -> Result<String, BootstrapError> {
        render::to_redacted_toml(self)
    }
}

impl RedisConfig {
    /// The Redis provider's settings: what it connects to and how patient
    /// it is, with the secrets and the edge's failure retry-after filled in.
    pub fn provider_settings(&self, failure_retry_after: Duration) -> RedisSettings {
        let expose = |secret: &Option<SecretValue>| secret.as_ref().map(|s| s.expose().into());
        RedisSettings {
            password: expose(&self.password),
            sentinel_password: expose(&self.sentinel_password),
            failure_retry_after,
            ..self.settings.clone()
        }
    }
}

#[cfg(test)]
mod names {
    use super::*;

    #[test]
    fn every_provider_is_named_by_its_serde_name() {
        for (provider, name) in [
            (ProviderConfig::Memory, "memory"),
            (ProviderConfig::Redis, "redis"),
            (ProviderConfig::Disabled, "disabled"),
        ] {
            assert_eq!(provider.name(), name);
        }
    }
}
