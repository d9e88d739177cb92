//! Reads the merged figment tree into the typed model, applying built-in
//! defaults and recording every problem (unknown keys, wrong types, bad
//! durations, bad names) under its full key path instead of stopping at the
//! first, as a derived `Deserialize` would.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use adapter_web::DEFAULT_PROBLEM_TYPE_BASE;
use figment::value::{Dict, Value};
use shared_contract::{Algorithm, EvaluationDedupPolicy};

mod values;

use self::values::{kind, quoted};
use super::problems::{ConfigProblems, KeyPath};
use super::{
    AppConfig, CapabilitiesConfig, PolicyConfig, ProviderKind, PseudonymizerConfig,
    RateLimitConfig, RedisConfig, RedisTopology, ServerConfig,
};

/// The policy a fresh checkout serves with when no policy is configured.
pub(crate) const DEMO_POLICY: &str = "demo";
const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

const ROOT_KEYS: &[&str] = &["server", "capabilities", "pseudonymizer", "redis"];
const SERVER_KEYS: &[&str] = &["listen"];
const CAPABILITIES_KEYS: &[&str] = &["rate-limit"];
const RATE_LIMIT_KEYS: &[&str] = &[
    "provider",
    "default-policy",
    "evaluation-budget",
    "failure-retry-after",
    "api-key-header",
    "trusted-proxies",
    "operations",
    "policies",
    "problem-type-base",
];
const POLICY_KEYS: &[&str] = &[
    "algorithm",
    "limit",
    "window",
    "capacity",
    "refill-tokens",
    "refill-period",
    "revision",
    "maximum-cost",
    "failure-policy",
    "cleanup-grace",
    "maximum-clock-regression",
    "evaluation-dedup",
];
const DEDUP_KEYS: &[&str] = &["enabled", "ttl", "max-entries", "max-stored-bytes"];
const PSEUDONYMIZER_KEYS: &[&str] = &["active-version", "keys"];
const REDIS_KEYS: &[&str] = &[
    "enabled",
    "topology",
    "urls",
    "username",
    "password",
    "key-prefix",
    "connect-timeout",
    "command-timeout",
    "script-lane",
];
const SCRIPT_LANE_KEYS: &[&str] = &["max-in-flight"];
const ALGORITHMS: &[&str] = &["fixed-window", "sliding-counter", "token-bucket"];

/// What the reader saw that validation needs beyond the typed model.
#[derive(Debug, Default)]
pub(crate) struct Declared {
    /// Every policy id declared, including those whose table had problems;
    /// `None` when the policies table itself was unreadable.
    pub(crate) policy_ids: Option<BTreeSet<String>>,
}

/// Reads `tree`, recording each problem; bad values fall back to their
/// default so reading continues and every problem is found.
pub(crate) fn read_config(tree: &Dict, problems: &mut ConfigProblems) -> (AppConfig, Declared) {
    let mut reader = Reader { problems };
    let root = KeyPath::root();
    reader.unknown_keys(tree, &root, ROOT_KEYS);

    let server_path = root.child("server");
    let server = reader.table(tree.get("server"), &server_path, SERVER_KEYS);
    let listen = reader.field(server, &server_path, "listen", Reader::socket_addr);
    let listen = listen.unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default"));

    let capabilities_path = root.child("capabilities");
    let capabilities =
        reader.table(tree.get("capabilities"), &capabilities_path, CAPABILITIES_KEYS);
    let (rate_limit, declared) = reader.rate_limit(capabilities.and_then(|c| c.get("rate-limit")));

    let pseudonymizer = reader.pseudonymizer(tree.get("pseudonymizer"));
    let redis = reader.redis(tree.get("redis"));

    let config = AppConfig {
        server: ServerConfig { listen },
        capabilities: CapabilitiesConfig { rate_limit },
        pseudonymizer,
        redis,
    };
    (config, declared)
}

struct Reader<'p> {
    problems: &'p mut ConfigProblems,
}

impl Reader<'_> {
    fn rate_limit(&mut self, value: Option<&Value>) -> (RateLimitConfig, Declared) {
        let path = KeyPath::root().dotted("capabilities.rate-limit");
        let table = self.table(value, &path, RATE_LIMIT_KEYS);

        let provider = self.field(table, &path, "provider", |reader, value, path| {
            let name = reader.string(value, path)?;
            match name.as_str() {
                "memory" => Some(ProviderKind::Memory),
                "redis" => Some(ProviderKind::Redis),
                "disabled" => Some(ProviderKind::Disabled),
                _ => {
                    reader.problem(
                        path,
                        format!("must be \"memory\", \"redis\" or \"disabled\", got {name:?}"),
                    );
                    None
                }
            }
        });
        let default_policy = self.field(table, &path, "default-policy", Self::string);
        let evaluation_budget = self.field(table, &path, "evaluation-budget", Self::duration);
        let failure_retry_after = self.field(table, &path, "failure-retry-after", Self::duration);
        let api_key_header = self.field(table, &path, "api-key-header", Self::string);
        let trusted_proxies = self.field(table, &path, "trusted-proxies", Self::networks);
        let problem_type_base = self.field(table, &path, "problem-type-base", Self::string);
        let operations =
            self.operations(table.and_then(|t| t.get("operations")), &path.child("operations"));
        let (policies, declared) =
            self.policies(table.and_then(|t| t.get("policies")), &path.child("policies"));

        let config = RateLimitConfig {
            provider: provider.unwrap_or(ProviderKind::Memory),
            default_policy: default_policy.unwrap_or_else(|| DEMO_POLICY.to_owned()),
            evaluation_budget: evaluation_budget.unwrap_or(Duration::from_millis(750)),
            failure_retry_after: failure_retry_after.unwrap_or(Duration::from_secs(1)),
            api_key_header: api_key_header.unwrap_or_else(|| "x-api-key".to_owned()),
            trusted_proxies: trusted_proxies.unwrap_or_default(),
            operations,
            policies,
            problem_type_base: problem_type_base
                .unwrap_or_else(|| DEFAULT_PROBLEM_TYPE_BASE.to_owned()),
        };
        (config, declared)
    }

    fn operations(&mut self, value: Option<&Value>, path: &KeyPath) -> BTreeMap<String, String> {
        let mut operations = BTreeMap::new();
        let Some(value) = value else { return operations };
        let Value::Dict(_, dict) = value else {
            self.problem(
                path,
                format!(
                    "expected a table of \"METHOD /route\" = \"policy-id\", found {}",
                    kind(value)
                ),
            );
            return operations;
        };
        for (operation, policy) in dict {
            if let Some(policy) = self.string(policy, &path.child(operation)) {
                operations.insert(operation.clone(), policy);
            }
        }
        operations
    }

    /// The policy map. With no `policies` table at all the demo policy is
    /// used; an explicit empty table is left empty for validation to reject.
    fn policies(
        &mut self,
        value: Option<&Value>,
        path: &KeyPath,
    ) -> (BTreeMap<String, PolicyConfig>, Declared) {
        let Some(value) = value else {
            let ids = BTreeSet::from([DEMO_POLICY.to_owned()]);
            return (
                BTreeMap::from([(DEMO_POLICY.to_owned(), demo_policy())]),
                Declared { policy_ids: Some(ids) },
            );
        };
        let Value::Dict(_, dict) = value else {
            self.problem(path, format!("expected a table of policies, found {}", kind(value)));
            return (BTreeMap::new(), Declared { policy_ids: None });
        };
        let mut policies = BTreeMap::new();
        for (id, policy) in dict {
            let policy_path = path.child(id);
            let Some(table) = self.table(Some(policy), &policy_path, POLICY_KEYS) else {
                continue;
            };
            if let Some(policy) = self.policy(table, &policy_path) {
                // Contract rules (bounds, id charset, cost <= limit, ...).
                if policy.build(id, self.problems).is_some() {
                    policies.insert(id.clone(), policy);
                }
            }
        }
        (policies, Declared { policy_ids: Some(dict.keys().cloned().collect()) })
    }

    fn policy(&mut self, table: &Dict, path: &KeyPath) -> Option<PolicyConfig> {
        let has = |key: &str| table.contains_key(key);
        let table = Some(table);
        let algorithm_name = self.field(table, path, "algorithm", Self::string);
        let limit = self.field(table, path, "limit", Self::u64);
        let window = self.field(table, path, "window", Self::duration);
        let capacity = self.field(table, path, "capacity", Self::u64);
        let refill_tokens = self.field(table, path, "refill-tokens", Self::u64);
        let refill_period = self.field(table, path, "refill-period", Self::duration);
        let revision = self.field(table, path, "revision", Self::u32);
        let maximum_cost = self.field(table, path, "maximum-cost", Self::u64);
        let cleanup_grace = self.field(table, path, "cleanup-grace", Self::duration);
        let regression = self.field(table, path, "maximum-clock-regression", Self::duration);
        let failure_ok = match self.field(table, path, "failure-policy", Self::string) {
            Some(name) if name == "fail-closed" => true,
            Some(name) => {
                self.problem(
                    &path.child("failure-policy"),
                    format!("must be \"fail-closed\" (the only failure policy), got {name:?}"),
                );
                false
            }
            // Absent is the default; present but not a string is recorded.
            None => !has("failure-policy"),
        };
        let dedup = self
            .dedup(table.and_then(|t| t.get("evaluation-dedup")), &path.child("evaluation-dedup"));

        let algorithm = match algorithm_name.as_deref() {
            None => {
                if !has("algorithm") {
                    self.problem(
                        &path.child("algorithm"),
                        format!("missing: choose one of {}", quoted(ALGORITHMS)),
                    );
                }
                None
            }
            Some(name @ ("fixed-window" | "sliding-counter")) => {
                self.not_for(table, path, name, &["capacity", "refill-tokens", "refill-period"]);
                let limit = self.required(limit, table, path, "limit", name);
                let window = self.required(window, table, path, "window", name);
                match (name, limit, window) {
                    ("fixed-window", Some(limit), Some(window)) => {
                        Some(Algorithm::FixedWindow { limit, window })
                    }
                    (_, Some(limit), Some(window)) => {
                        Some(Algorithm::SlidingCounter { limit, window })
                    }
                    _ => None,
                }
            }
            Some(name @ "token-bucket") => {
                self.not_for(table, path, name, &["limit", "window"]);
                let capacity = self.required(capacity, table, path, "capacity", name);
                let refill_tokens =
                    self.required(refill_tokens, table, path, "refill-tokens", name);
                let refill_period =
                    self.required(refill_period, table, path, "refill-period", name);
                match (capacity, refill_tokens, refill_period) {
                    (Some(capacity), Some(refill_tokens), Some(refill_period)) => {
                        Some(Algorithm::TokenBucket { capacity, refill_tokens, refill_period })
                    }
                    _ => None,
                }
            }
            Some(other) => {
                self.problem(
                    &path.child("algorithm"),
                    format!("must be one of {}, got {other:?}", quoted(ALGORITHMS)),
                );
                None
            }
        };
        let defaults = PolicyDefaults::new();
        Some(PolicyConfig {
            algorithm: algorithm?,
            revision: revision.unwrap_or(defaults.revision),
            maximum_cost: maximum_cost.unwrap_or(defaults.maximum_cost),
            cleanup_grace: cleanup_grace.unwrap_or(defaults.grace),
            maximum_clock_regression: regression.unwrap_or(defaults.grace),
            evaluation_dedup: dedup?,
        })
        .filter(|_| failure_ok)
    }

    /// A parameter the algorithm needs; records "missing" only when the key
    /// is absent (a present but bad value already has its own problem).
    fn required<T>(
        &mut self,
        value: Option<T>,
        table: Option<&Dict>,
        path: &KeyPath,
        key: &str,
        algorithm: &str,
    ) -> Option<T> {
        if value.is_none() && !table.is_some_and(|t| t.contains_key(key)) {
            self.problem(&path.child(key), format!("missing: {algorithm} needs it"));
        }
        value
    }

    fn not_for(&mut self, table: Option<&Dict>, path: &KeyPath, algorithm: &str, keys: &[&str]) {
        for key in keys.iter().filter(|key| table.is_some_and(|t| t.contains_key(**key))) {
            self.problem(&path.child(key), format!("does not apply to {algorithm}; remove it"));
        }
    }

    fn dedup(&mut self, value: Option<&Value>, path: &KeyPath) -> Option<EvaluationDedupPolicy> {
        let table = self.table(value, path, DEDUP_KEYS);
        if value.is_some() && table.is_none() {
            return None;
        }
        let enabled = self.field(table, path, "enabled", Self::bool);
        let ttl = self.field(table, path, "ttl", Self::duration);
        let max_entries = self.field(table, path, "max-entries", Self::u32);
        let max_stored_bytes = self.field(table, path, "max-stored-bytes", Self::u32);
        let EvaluationDedupPolicy::Enabled {
            ttl: default_ttl,
            max_entries: default_entries,
            max_stored_bytes: default_bytes,
        } = EvaluationDedupPolicy::enabled_defaults()
        else {
            unreachable!("enabled_defaults is Enabled");
        };
        // A bad value inside the table must not turn into a silent default.
        let all_read = [
            ("enabled", enabled.is_some()),
            ("ttl", ttl.is_some()),
            ("max-entries", max_entries.is_some()),
            ("max-stored-bytes", max_stored_bytes.is_some()),
        ]
        .iter()
        .all(|(key, read)| *read || !table.is_some_and(|t| t.contains_key(*key)));
        if !all_read {
            return None;
        }
        Some(if enabled.unwrap_or(true) {
            EvaluationDedupPolicy::Enabled {
                ttl: ttl.unwrap_or(default_ttl),
                max_entries: max_entries.unwrap_or(default_entries),
                max_stored_bytes: max_stored_bytes.unwrap_or(default_bytes),
            }
        } else {
            EvaluationDedupPolicy::Disabled
        })
    }

    fn pseudonymizer(&mut self, value: Option<&Value>) -> PseudonymizerConfig {
        let path = KeyPath::root().child("pseudonymizer");
        let table = self.table(value, &path, PSEUDONYMIZER_KEYS);
        let active_version = self.field(table, &path, "active-version", Self::u32).unwrap_or(1);
        let mut keys = BTreeMap::new();
        let keys_path = path.child("keys");
        match table.and_then(|t| t.get("keys")) {
            None | Some(Value::Empty(..)) => {}
            Some(Value::Dict(_, dict)) => {
                for (version, key) in dict {
                    let key_path = keys_path.child(version);
                    let Ok(number) = version.parse::<u32>() else {
                        self.problem(&key_path, "a key version is a whole number (1, 2, ...)");
                        continue;
                    };
                    if let Some(secret) = self.secret(key, &key_path) {
                        keys.insert(number, secret);
                    }
                }
            }
            Some(other) => self.problem(
                &keys_path,
                format!("expected a table of version = \"key\", found {}", kind(other)),
            ),
        }
        PseudonymizerConfig { active_version, keys }
    }

    fn redis(&mut self, value: Option<&Value>) -> RedisConfig {
        let path = KeyPath::root().child("redis");
        let table = self.table(value, &path, REDIS_KEYS);
        let defaults = RedisConfig::default();
        let topology = self.field(table, &path, "topology", |reader, value, path| {
            let name = reader.string(value, path)?;
            match name.as_str() {
                "standalone" => Some(RedisTopology::Standalone),
                "cluster" => Some(RedisTopology::Cluster),
                _ => {
                    reader.problem(
                        path,
                        format!("must be \"standalone\" or \"cluster\", got {name:?}"),
                    );
                    None
                }
            }
        });
        let lane_path = path.child("script-lane");
        let lane =
            self.table(table.and_then(|t| t.get("script-lane")), &lane_path, SCRIPT_LANE_KEYS);
        let max_in_flight = self.field(lane, &lane_path, "max-in-flight", Self::u32);
        RedisConfig {
            enabled: self.field(table, &path, "enabled", Self::bool).unwrap_or(defaults.enabled),
            topology: topology.unwrap_or(defaults.topology),
            urls: self.field(table, &path, "urls", Self::string_list).unwrap_or(defaults.urls),
            username: self.field(table, &path, "username", Self::string),
            password: self.field(table, &path, "password", Self::secret),
            key_prefix: self
                .field(table, &path, "key-prefix", Self::string)
                .unwrap_or(defaults.key_prefix),
            connect_timeout: self
                .field(table, &path, "connect-timeout", Self::duration)
                .unwrap_or(defaults.connect_timeout),
            command_timeout: self
                .field(table, &path, "command-timeout", Self::duration)
                .unwrap_or(defaults.command_timeout),
            script_lane_max_in_flight: max_in_flight
                .map_or(defaults.script_lane_max_in_flight, |n| n as usize),
        }
    }
}

struct PolicyDefaults {
    revision: u32,
    maximum_cost: u64,
    grace: Duration,
}

impl PolicyDefaults {
    // The contract builder's own defaults, so the file and the builder agree.
    fn new() -> Self {
        Self { revision: 1, maximum_cost: 1, grace: Duration::from_secs(1) }
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            topology: RedisTopology::Standalone,
            urls: vec!["redis://127.0.0.1:6379".to_owned()],
            username: None,
            password: None,
            key_prefix: "ca:rl:".to_owned(),
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_millis(250),
            script_lane_max_in_flight: 256,
        }
    }
}

/// Five requests per minute per subject and operation: small enough that a
/// newcomer's `curl` loop sees a 429 on the sixth call.
fn demo_policy() -> PolicyConfig {
    let defaults = PolicyDefaults::new();
    PolicyConfig {
        algorithm: Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(60) },
        revision: defaults.revision,
        maximum_cost: defaults.maximum_cost,
        cleanup_grace: defaults.grace,
        maximum_clock_regression: defaults.grace,
        evaluation_dedup: EvaluationDedupPolicy::enabled_defaults(),
    }
}
