//! Reads the merged figment tree into the typed model, applying built-in
//! defaults and recording every problem (unknown keys, wrong types, bad
//! durations, bad names) under its full key path instead of stopping at the
//! first, as a derived `Deserialize` would.
//!
//! Each key is named once, at the reader call that reads it: a table knows
//! the keys asked of it, and everything else in it is reported as unknown.
//! Defaults come from the owners (the policy builder, `EdgeSettings`,
//! `RedisSettings`), never from copies here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use adapter_redis::{RedisField, RedisSettings, Topology};
use adapter_web::{DEFAULT_POLICY, EdgeSettings};
use figment::value::{Dict, Value};
use shared_contract::{
    Algorithm, AlgorithmKind, EvaluationDedupPolicy, FailurePolicy, FixedWindow, PolicyField,
    PolicyMode, PolicyScope, RateLimitPolicy,
};

mod owned;
mod values;

use self::values::{Table, kind, quoted};
use super::problems::{ConfigProblems, KeyPath};
use super::{
    AdminConfig, AppConfig, CapabilitiesConfig, DegradedConfig, EnvoyRlsConfig, MemoryConfig,
    OtlpConfig, ProviderKind, PseudonymizerConfig, RateLimitConfig, RedisConfig, RlsRuleConfig,
    ServerConfig, TelemetryConfig,
};

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
    let root_value = Value::from(tree.clone());
    let mut root = reader.table(Some(&root_value), KeyPath::root());
    let server = root.get("server");
    let capabilities = root.get("capabilities");
    let pseudonymizer = root.get("pseudonymizer");
    let redis = root.get("redis");
    let memory = root.get("memory");
    let admin = root.get("admin");
    let telemetry = root.get("telemetry");
    let envoy_rls = root.get("envoy-rls");
    reader.close(root);

    let server = reader.table(server, KeyPath::root().child("server"));
    let (dict, path) = (server.dict(), server.path().clone());
    server.close_read();
    let server: ServerConfig = reader.owned(dict, &path, &[]);

    let mut capabilities = reader.table(capabilities, KeyPath::root().child("capabilities"));
    let rate_limit = capabilities.get("rate-limit");
    reader.close(capabilities);
    let (rate_limit, declared) = reader.rate_limit(rate_limit);

    let pseudonymizer = reader.pseudonymizer(pseudonymizer);
    let redis = reader.redis(redis);
    let memory = reader.memory(memory);
    let admin = reader.admin(admin);
    let telemetry = reader.telemetry(telemetry);
    let envoy_rls = reader.envoy_rls(envoy_rls);

    let config = AppConfig {
        server,
        capabilities: CapabilitiesConfig { rate_limit },
        pseudonymizer,
        redis,
        memory,
        admin,
        telemetry,
        envoy_rls,
    };
    (config, declared)
}

struct Reader<'p> {
    problems: &'p mut ConfigProblems,
}

impl Reader<'_> {
    fn rate_limit(&mut self, value: Option<&Value>) -> (RateLimitConfig, Declared) {
        const OWN: [&str; 5] = ["provider", "default-policy", "operations", "policies", "degraded"];
        let mut table = self.table(value, KeyPath::root().dotted("capabilities.rate-limit"));
        let [provider, default_policy, operations, policies, degraded] = OWN;
        let provider = self.field(&mut table, provider, Self::name::<ProviderKind>);
        let default_policy = self.field(&mut table, default_policy, Self::policy_list);
        let operations = table.get(operations);
        let policies = table.get(policies);
        let degraded = table.get(degraded);
        let dict = table.dict();
        let path = table.path().clone();
        // What `EdgeSettings` does not know is reported by `owned`, with
        // these keys among the expected ones.
        table.close_read();
        let edge: EdgeSettings = self.owned(dict, &path, &OWN);
        let operations = self.operations(operations, &path.child("operations"));
        let (policies, declared) = self.policies(policies, &path.child("policies"));
        let degraded = self.degraded(degraded, path.child("degraded"));

        let config = RateLimitConfig {
            provider: provider.unwrap_or(ProviderKind::Memory),
            default_policy: default_policy.unwrap_or_else(|| vec![DEFAULT_POLICY.to_owned()]),
            edge,
            operations,
            policies,
            degraded,
        };
        (config, declared)
    }

    /// `degraded.*`, each key read once: a bad `instances` is one problem
    /// (its own), and `enabled = true` without it is "missing" (no default
    /// can know a fleet's size).
    fn degraded(&mut self, value: Option<&Value>, path: KeyPath) -> DegradedConfig {
        let mut table = self.table(value, path);
        let enabled = self.field(&mut table, "enabled", Self::bool);
        let given = table.has("instances");
        let instances = self.field(&mut table, "instances", Self::instances);
        if enabled == Some(true) && !given {
            self.problem(
                &table.path().child("instances"),
                "missing: required when degraded mode is enabled, how many instances share \
                 the traffic while Redis is away (each admits ceil(limit / instances))",
            );
        }
        self.close(table);
        DegradedConfig { enabled: enabled.unwrap_or_default(), instances }
    }

    fn operations(
        &mut self,
        value: Option<&Value>,
        path: &KeyPath,
    ) -> BTreeMap<String, Vec<String>> {
        let mut operations = BTreeMap::new();
        let Some(value) = value else { return operations };
        let Value::Dict(_, dict) = value else {
            self.problem(
                path,
                format!(
                    "expected a table of \"METHOD /route\" = [\"policy-id\", ...], found {}",
                    kind(value)
                ),
            );
            return operations;
        };
        for (operation, policies) in dict {
            if let Some(policies) = self.policy_list(policies, &path.child(operation)) {
                operations.insert(operation.clone(), policies);
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
    ) -> (BTreeMap<String, RateLimitPolicy>, Declared) {
        let Some(value) = value else {
            let ids = BTreeSet::from([DEFAULT_POLICY.to_owned()]);
            return (
                BTreeMap::from([(DEFAULT_POLICY.to_owned(), demo_policy())]),
                Declared { policy_ids: Some(ids) },
            );
        };
        let Value::Dict(_, dict) = value else {
            self.problem(path, format!("expected a table of policies, found {}", kind(value)));
            return (BTreeMap::new(), Declared { policy_ids: None });
        };
        let mut policies = BTreeMap::new();
        for (id, policy) in dict {
            let table = self.table(Some(policy), path.child(id));
            if !table.is_present() {
                self.close(table);
                continue;
            }
            if let Some(policy) = self.policy(id, table) {
                policies.insert(id.clone(), policy);
            }
        }
        (policies, Declared { policy_ids: Some(dict.keys().cloned().collect()) })
    }

    /// One policy, built by the contract's builder: its defaults fill what
    /// the table leaves out, and each rule it finds broken is recorded under
    /// the field's key.
    fn policy(&mut self, id: &str, mut table: Table<'_>) -> Option<RateLimitPolicy> {
        let kind =
            self.field(&mut table, PolicyField::Algorithm.key(), Self::name::<AlgorithmKind>);
        let values = self.parameter_values(&mut table, kind);
        let revision = self.field(&mut table, PolicyField::Revision.key(), Self::u32);
        let maximum_cost = self.field(&mut table, PolicyField::MaximumCost.key(), Self::u64);
        let failure_policy =
            self.field(&mut table, PolicyField::FailurePolicy.key(), Self::name::<FailurePolicy>);
        let cleanup_grace = self.field(&mut table, PolicyField::CleanupGrace.key(), Self::duration);
        let regression =
            self.field(&mut table, PolicyField::MaximumClockRegression.key(), Self::duration);
        let scope = self.field(&mut table, PolicyField::Scope.key(), Self::name::<PolicyScope>);
        let mode = self.field(&mut table, PolicyField::Mode.key(), Self::name::<PolicyMode>);
        let dedup_value = table.get(PolicyField::EvaluationDedup.key());
        let path = table.path().clone();
        // A present key that did not read has its own problem already.
        let all_read = [
            (PolicyField::Algorithm.key(), kind.is_some()),
            (PolicyField::Revision.key(), revision.is_some()),
            (PolicyField::MaximumCost.key(), maximum_cost.is_some()),
            (PolicyField::FailurePolicy.key(), failure_policy.is_some()),
            (PolicyField::CleanupGrace.key(), cleanup_grace.is_some()),
            (PolicyField::MaximumClockRegression.key(), regression.is_some()),
            (PolicyField::Scope.key(), scope.is_some()),
            (PolicyField::Mode.key(), mode.is_some()),
        ]
        .iter()
        .all(|(key, read)| *read || !table.has(key));
        // Left out, the builder's default for the algorithm holds (none for
        // a concurrency policy); given, it must read whole.
        let dedup = dedup_value
            .map(|value| self.dedup(Some(value), path.child(PolicyField::EvaluationDedup.key())));

        let algorithm = match kind {
            None => {
                if !table.has(PolicyField::Algorithm.key()) {
                    let names: Vec<_> = AlgorithmKind::ALL.iter().map(|kind| kind.name()).collect();
                    self.problem(
                        &path.child(PolicyField::Algorithm.key()),
                        format!("missing: choose one of {}", quoted(&names)),
                    );
                }
                None
            }
            Some(kind) => self.parameters(&table, kind, values),
        };
        // A parameter left out takes its default from another (a GCRA
        // burst is its limit): it fails only when that one does, whose
        // problem is already listed on the key the user wrote.
        let defaulted: Vec<&str> = algorithm
            .iter()
            .flat_map(|algorithm| algorithm.kind().defaulted())
            .copied()
            .filter(|key| !table.has(key))
            .collect();
        self.close(table);
        let algorithm = algorithm?;
        // A key the algorithm refuses has its problem from `not_for`; it
        // is not handed to the builder to be refused a second time.
        let refused = algorithm.kind().refused_common_keys();
        let applies = |field: PolicyField| !refused.contains(&field);

        let mut builder = RateLimitPolicy::builder(id, algorithm);
        match dedup {
            Some(None) => return None,
            Some(Some(dedup)) if applies(PolicyField::EvaluationDedup) => {
                builder = builder.evaluation_dedup(dedup);
            }
            Some(Some(_)) | None => {}
        }
        if let Some(revision) = revision {
            builder = builder.revision(revision);
        }
        if let Some(maximum_cost) = maximum_cost.filter(|_| applies(PolicyField::MaximumCost)) {
            builder = builder.maximum_cost(maximum_cost);
        }
        if let Some(failure_policy) = failure_policy {
            builder = builder.failure_policy(failure_policy);
        }
        if let Some(grace) = cleanup_grace {
            builder = builder.cleanup_grace(grace);
        }
        if let Some(bound) = regression {
            builder = builder.maximum_clock_regression(bound);
        }
        if let Some(scope) = scope {
            builder = builder.scope(scope);
        }
        if let Some(mode) = mode {
            builder = builder.mode(mode);
        }
        // Built even when a field did not read, so its contract problems
        // are listed too; such a policy is not kept.
        match builder.build() {
            Ok(policy) => Some(policy).filter(|_| all_read),
            Err(error) => {
                let defaulted = |field: PolicyField| defaulted.contains(&field.key());
                for violation in error.violations().iter().filter(|v| !defaulted(v.field)) {
                    // A bad id is the policy table's own key.
                    let at = if violation.field == PolicyField::Id {
                        path.clone()
                    } else {
                        path.dotted(violation.field.key())
                    };
                    self.problem(&at, violation.problem.clone());
                }
                if error.violations().is_empty() {
                    self.problem(&path, error.to_string());
                }
                None
            }
        }
    }

    /// The algorithm's keys in the policy's table, each tried alone by the
    /// algorithm's own deserializer so that every one that does not read is
    /// a problem of its own (`false` beside them then). Every algorithm's
    /// keys become known to the table: another's is refused by
    /// [`Self::not_for`], not reported unknown.
    fn parameter_values(
        &mut self,
        table: &mut Table<'_>,
        kind: Option<AlgorithmKind>,
    ) -> (Dict, bool) {
        let mut own = Dict::new();
        for key in AlgorithmKind::ALL.iter().flat_map(|kind| kind.parameters()) {
            if let Some(value) = table.get(key) {
                if kind.is_some_and(|kind| kind.parameters().contains(key)) {
                    own.insert((*key).to_owned(), value.clone());
                }
            }
        }
        let mut all_read = true;
        let Some(kind) = kind else { return (own, all_read) };
        for (key, value) in own.iter().filter(|(_, value)| !matches!(value, Value::Empty(..))) {
            let alone = Value::from(Dict::from([(key.clone(), value.clone())]));
            // Alone, the algorithm's other keys are missing: not this key's problem.
            match kind.deserialize(&alone) {
                Err(error) if !matches!(error.kind, figment::error::Kind::MissingField(_)) => {
                    self.problem(&table.path().child(key), error.kind.to_string());
                    all_read = false;
                }
                Ok(_) | Err(_) => {}
            }
        }
        (own, all_read)
    }

    /// The algorithm from its keys ([`Self::parameter_values`]): each key
    /// it needs and the table leaves out is a problem of its own, and so is
    /// another algorithm's key.
    fn parameters(
        &mut self,
        table: &Table<'_>,
        kind: AlgorithmKind,
        (own, all_read): (Dict, bool),
    ) -> Option<Algorithm> {
        self.not_for(table, kind);
        let path = table.path().clone();
        let mut complete = true;
        for key in kind.parameters().iter().filter(|key| !kind.defaulted().contains(key)) {
            if !table.has(key) {
                self.problem(&path.child(key), format!("missing: {kind} needs it"));
                complete = false;
            }
        }
        if !(all_read && complete) {
            return None;
        }
        match kind.deserialize(&Value::from(own)) {
            Ok(algorithm) => Some(algorithm),
            Err(error) => {
                let at = error.path.iter().fold(path, |at, key| at.child(key));
                self.problem(&at, error.kind.to_string());
                None
            }
        }
    }

    /// Every other algorithm's parameter the table sets is a problem, and
    /// so is a common key the algorithm refuses (a concurrency policy's
    /// `maximum-cost` and `evaluation-dedup`).
    fn not_for(&mut self, table: &Table<'_>, algorithm: AlgorithmKind) {
        let own = algorithm.parameters();
        let mut foreign: Vec<&str> = Vec::new();
        for key in AlgorithmKind::ALL.iter().flat_map(|kind| kind.parameters()) {
            if !own.contains(key) && !foreign.contains(key) {
                foreign.push(key);
            }
        }
        for key in foreign.into_iter().filter(|key| table.has(key)) {
            self.problem(
                &table.path().child(key),
                format!("does not apply to {algorithm}; remove it"),
            );
        }
        let refused = algorithm.refused_common_keys().iter().map(|field| field.key());
        for key in refused.filter(|key| table.has(key)) {
            self.problem(
                &table.path().child(key),
                format!(
                    "does not apply to {algorithm} (docs/algorithms.md: a lease is one slot \
                     whatever the cost, and its id is its dedupe); remove it"
                ),
            );
        }
    }

    fn dedup(&mut self, value: Option<&Value>, path: KeyPath) -> Option<EvaluationDedupPolicy> {
        let mut table = self.table(value, path);
        let unreadable = value.is_some() && !table.is_present();
        let enabled = self.field(&mut table, PolicyField::DedupEnabled.leaf(), Self::bool);
        let ttl = self.field(&mut table, PolicyField::DedupTtl.leaf(), Self::duration);
        let max_entries = self.field(&mut table, PolicyField::DedupMaxEntries.leaf(), Self::u32);
        let max_stored_bytes =
            self.field(&mut table, PolicyField::DedupMaxStoredBytes.leaf(), Self::u32);
        // A bad value inside the table must not turn into a silent default.
        let all_read = [
            (PolicyField::DedupEnabled.leaf(), enabled.is_some()),
            (PolicyField::DedupTtl.leaf(), ttl.is_some()),
            (PolicyField::DedupMaxEntries.leaf(), max_entries.is_some()),
            (PolicyField::DedupMaxStoredBytes.leaf(), max_stored_bytes.is_some()),
        ]
        .iter()
        .all(|(key, read)| *read || !table.has(key));
        self.close(table);
        if unreadable || !all_read {
            return None;
        }
        let EvaluationDedupPolicy::Enabled {
            ttl: default_ttl,
            max_entries: default_entries,
            max_stored_bytes: default_bytes,
        } = EvaluationDedupPolicy::enabled_defaults()
        else {
            unreachable!("enabled_defaults is Enabled");
        };
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
        const OWN: [&str; 1] = ["keys"];
        let mut table = self.table(value, KeyPath::root().child("pseudonymizer"));
        let keys_value = table.get(OWN[0]);
        let (dict, path) = (table.dict(), table.path().clone());
        let keys_path = path.child(OWN[0]);
        table.close_read();
        let active_version = self.owned::<PseudonymizerConfig>(dict, &path, &OWN).active_version;
        let mut keys = BTreeMap::new();
        match keys_value {
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

    /// `[memory]`: every key is [`MemoryConfig`]'s own.
    fn memory(&mut self, value: Option<&Value>) -> MemoryConfig {
        let table = self.table(value, KeyPath::root().child("memory"));
        let (dict, path) = (table.dict(), table.path().clone());
        table.close_read();
        self.owned(dict, &path, &[])
    }

    /// `[admin]`: the token is read with its source, as every secret is;
    /// every other key is [`AdminConfig`]'s own.
    fn admin(&mut self, value: Option<&Value>) -> AdminConfig {
        const OWN: [&str; 1] = ["token"];
        let mut table = self.table(value, KeyPath::root().child("admin"));
        let token = self.field(&mut table, OWN[0], Self::secret);
        let (dict, path) = (table.dict(), table.path().clone());
        table.close_read();
        AdminConfig { token, ..self.owned(dict, &path, &OWN) }
    }

    /// `[telemetry]`: one table, `otlp`, whose headers are secrets read
    /// with their sources; every other key is [`OtlpConfig`]'s own.
    fn telemetry(&mut self, value: Option<&Value>) -> TelemetryConfig {
        let mut telemetry = self.table(value, KeyPath::root().child("telemetry"));
        let otlp = telemetry.get("otlp");
        self.close(telemetry);
        const OWN: [&str; 1] = ["headers"];
        let mut table = self.table(otlp, KeyPath::root().dotted("telemetry.otlp"));
        let headers_value = table.get(OWN[0]);
        let (dict, path) = (table.dict(), table.path().clone());
        let headers_path = path.child(OWN[0]);
        table.close_read();
        let mut otlp: OtlpConfig = self.owned(dict, &path, &OWN);
        match headers_value {
            None | Some(Value::Empty(..)) => {}
            Some(Value::Dict(_, dict)) => {
                for (name, header) in dict {
                    if let Some(secret) = self.secret(header, &headers_path.child(name)) {
                        otlp.headers.insert(name.clone(), secret);
                    }
                }
            }
            Some(other) => self.problem(
                &headers_path,
                format!("expected a table of header-name = \"value\", found {}", kind(other)),
            ),
        }
        TelemetryConfig { otlp }
    }

    /// `[envoy-rls]`: `listen` is [`EnvoyRlsConfig`]'s own; `rules` is an
    /// array of tables read here, each problem under its index.
    fn envoy_rls(&mut self, value: Option<&Value>) -> EnvoyRlsConfig {
        const OWN: [&str; 1] = ["rules"];
        let mut table = self.table(value, KeyPath::root().child("envoy-rls"));
        let rules_value = table.get(OWN[0]);
        let (dict, path) = (table.dict(), table.path().clone());
        let rules_path = path.child(OWN[0]);
        table.close_read();
        let listen = self.owned::<EnvoyRlsConfig>(dict, &path, &OWN).listen;
        let mut rules = Vec::new();
        match rules_value {
            None | Some(Value::Empty(..)) => {}
            Some(Value::Array(_, items)) => {
                for (index, item) in items.iter().enumerate() {
                    let table = self.table(Some(item), rules_path.child(&index.to_string()));
                    if !table.is_present() {
                        self.close(table);
                        continue;
                    }
                    if let Some(rule) = self.rls_rule(table) {
                        rules.push(rule);
                    }
                }
            }
            Some(other) => self.problem(
                &rules_path,
                format!("expected an array of tables ([[envoy-rls.rules]]), found {}", kind(other)),
            ),
        }
        EnvoyRlsConfig { listen, rules }
    }

    /// One `[[envoy-rls.rules]]` table; `None` when a key did not read or
    /// a required one is missing (each with its problem).
    fn rls_rule(&mut self, mut table: Table<'_>) -> Option<RlsRuleConfig> {
        let domain = self.field(&mut table, "domain", Self::string);
        let descriptor = self.field(&mut table, "descriptor", Self::string_list);
        let subject = self.field(&mut table, "subject", Self::string_list);
        let unlimited = self.field(&mut table, "unlimited", Self::bool);
        let policies_value = table.get("policies");
        let path = table.path().clone();
        let policies = match policies_value {
            None | Some(Value::Empty(..)) => None,
            Some(value) => self.policy_list(value, &path.child("policies")),
        };
        // A present key that did not read has its own problem already.
        for (key, read) in [("domain", domain.is_some()), ("descriptor", descriptor.is_some())] {
            if !read && !table.has(key) {
                self.problem(&path.child(key), "missing: every rule needs it");
            }
        }
        // A rule limits (`policies`) or does not (`unlimited = true`):
        // exactly one of the two.
        let limit = match (unlimited, table.has("policies")) {
            (Some(true), true) => {
                self.problem(
                    &path.child("policies"),
                    "an `unlimited = true` rule has no policies: remove one of the two keys",
                );
                None
            }
            (Some(true), false) => Some(Vec::new()),
            (Some(false) | None, false) if !table.has("unlimited") || unlimited.is_some() => {
                self.problem(
                    &path.child("policies"),
                    "missing: every rule needs `policies`, or `unlimited = true`",
                );
                None
            }
            (_, _) => policies,
        };
        let mut subject_ok = subject.is_some() || !table.has("subject");
        // An unlimited rule charges nothing, so a subject names nothing.
        if unlimited == Some(true) && table.has("subject") {
            self.problem(
                &path.child("subject"),
                "an `unlimited = true` rule charges no subject: remove the key",
            );
            subject_ok = false;
        }
        self.close(table);
        let (domain, descriptor, policies) = (domain?, descriptor?, limit?);
        let unlimited = unlimited.unwrap_or(false);
        subject_ok.then_some(RlsRuleConfig { domain, descriptor, subject, policies, unlimited })
    }

    /// `[redis]`: the switch and the two passwords are the application's;
    /// every other key is [`RedisSettings`]' own.
    fn redis(&mut self, value: Option<&Value>) -> RedisConfig {
        const OWN: [&str; 3] = ["enabled", "password", "sentinel-password"];
        let mut table = self.table(value, KeyPath::root().child("redis"));
        let [enabled, password, sentinel_password] = OWN;
        let enabled = self.field(&mut table, enabled, Self::bool);
        let password = self.field(&mut table, password, Self::secret);
        let sentinel_password = self.field(&mut table, sentinel_password, Self::secret);
        let dict = table.dict();
        let path = table.path().clone();
        // What `T` does not know is reported by `owned`, with these keys
        // among the expected ones.
        table.close_read();
        let mut settings: RedisSettings = self.owned(dict, &path, &OWN);
        // The sentinels name the master: no URL unless one is given (which
        // validation then refuses).
        let urls_given = dict.is_some_and(|dict| dict.contains_key(RedisField::Urls.key()));
        match settings.topology {
            Topology::Sentinel if !urls_given => settings.urls.clear(),
            Topology::Standalone | Topology::Cluster | Topology::Sentinel => {}
        }
        RedisConfig { enabled: enabled.unwrap_or_default(), settings, password, sentinel_password }
    }
}

/// Five requests per minute per subject and operation: small enough that a
/// newcomer's `curl` loop sees a 429 on the sixth call. Every other field
/// is the policy builder's default.
pub(crate) fn demo_policy() -> RateLimitPolicy {
    let five_a_minute = FixedWindow { limit: 5, window: Duration::from_secs(60) };
    RateLimitPolicy::builder(DEFAULT_POLICY, five_a_minute)
        .build()
        .expect("the demo policy is valid")
}
