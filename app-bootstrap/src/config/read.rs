//! Reads the merged tree into the typed model: each table deserializes into
//! the type that uses it. A value that does not read is recorded under its
//! key path, dropped, and the rest read again, so every problem of a table
//! is listed at once and a bad value never turns into a silent default.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::time::Duration;

use adapter_redis::{RedisField, RedisSettings, Topology};
use adapter_web::{DEFAULT_POLICY, EdgeSettings};
use figment::error::{Actual, Error, Kind};
use figment::value::{Dict, Value};
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize};
use shared_contract::{
    AlgorithmKind, FixedWindow, PolicyField, PolicyKeys, RateLimitPolicy, UnknownName,
};

use super::problems::{ConfigProblems, KeyPath};
use super::{
    AdminConfig, AppConfig, CapabilitiesConfig, DegradedConfig, EnvoyRlsConfig, MemoryConfig,
    ProviderConfig, PseudonymizerConfig, RateLimitConfig, RedisConfig, ServerConfig,
    TelemetryConfig,
};

/// What the reader saw that validation needs beyond the typed model.
#[derive(Debug, Default)]
pub(crate) struct Declared {
    /// Every policy id declared, including those whose table had problems;
    /// `None` when the policies table itself was unreadable.
    pub(crate) policy_ids: Option<BTreeSet<String>>,
}

/// The root table; `capabilities` and `redis` are read on their own (their
/// owners' keys sit beside the application's in one table).
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct Root {
    server: ServerConfig,
    capabilities: IgnoredAny,
    pseudonymizer: PseudonymizerConfig,
    redis: IgnoredAny,
    memory: MemoryConfig,
    admin: AdminConfig,
    telemetry: TelemetryConfig,
    envoy_rls: EnvoyRlsConfig,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct Capabilities {
    rate_limit: IgnoredAny,
}

/// `capabilities.rate-limit`'s own keys; the rest are [`EdgeSettings`]'.
#[derive(Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct RateLimitKeys {
    #[serde(deserialize_with = "list")]
    default_policy: Vec<String>,
    #[serde(deserialize_with = "list_map")]
    operations: BTreeMap<String, Vec<String>>,
    degraded: DegradedConfig,
}

impl Default for RateLimitKeys {
    fn default() -> Self {
        Self {
            default_policy: vec![DEFAULT_POLICY.to_owned()],
            operations: BTreeMap::new(),
            degraded: DegradedConfig::default(),
        }
    }
}

const RATE_LIMIT_KEYS: [&str; 5] =
    ["provider", "default-policy", "operations", "degraded", "policies"];

/// `[redis]`'s own keys; the rest are [`RedisSettings`]'.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
struct RedisKeys {
    enabled: bool,
    password: Option<super::SecretValue>,
    sentinel_password: Option<super::SecretValue>,
}

const REDIS_KEYS: [&str; 3] = ["enabled", "password", "sentinel-password"];

/// Reads `tree`, recording each problem; a table that does not read is left
/// at its default so reading continues and every problem is found.
pub(crate) fn read_config(tree: &Dict, problems: &mut ConfigProblems) -> (AppConfig, Declared) {
    let mut reader = Reader { problems };
    let root = Value::from(tree.clone());
    let at = KeyPath::root();
    let read: Root = reader.typed(&root, &at, &[], Value::deserialize).unwrap_or_default();
    let capabilities = tree.get("capabilities");
    let rate_limit = capabilities.and_then(|value| {
        reader.typed::<Capabilities>(value, &at.child("capabilities"), &[], Value::deserialize)?;
        value.as_dict()?.get("rate-limit")
    });
    let (rate_limit, declared) = reader.rate_limit(rate_limit);
    let redis = reader.redis(tree.get("redis"));
    let config = AppConfig {
        server: read.server,
        capabilities: CapabilitiesConfig { rate_limit },
        pseudonymizer: read.pseudonymizer,
        redis,
        memory: read.memory,
        admin: read.admin,
        telemetry: read.telemetry,
        envoy_rls: read.envoy_rls,
    };
    (config, declared)
}

struct Reader<'p> {
    problems: &'p mut ConfigProblems,
}

impl Reader<'_> {
    /// `value` read by `read`. Each error is recorded at its key path and
    /// the value at fault dropped before reading again; a missing key ends
    /// it (nothing is left to read past it). `known` are keys of the table
    /// read elsewhere, named among the expected ones of an unknown key.
    fn typed<T>(
        &mut self,
        value: &Value,
        at: &KeyPath,
        known: &[&str],
        read: impl Fn(&Value) -> Result<T, Error>,
    ) -> Option<T> {
        let mut value = value.clone();
        // Items dropped from each list so far, to name later ones by their
        // index as written.
        let mut dropped: BTreeMap<Vec<String>, usize> = BTreeMap::new();
        loop {
            let error = match read(&value) {
                Ok(read) => return Some(read),
                Err(error) => error,
            };
            let keys = error.path.clone();
            let written = as_written(&keys, &dropped);
            let path = written.iter().fold(at.clone(), |path, key| path.child(key));
            match &error.kind {
                // The table is dropped whole: nothing in it reads without the key.
                Kind::MissingField(field) => {
                    // A key dropped for its own problem is not missing too.
                    if !self.problems.iter().any(|problem| problem.path == path.child(field)) {
                        self.problems.push(path.child(field), "missing: the table needs it");
                    }
                }
                Kind::UnknownVariant(name, expected) => {
                    let expected: Vec<&str> = expected.to_vec();
                    self.problems
                        .push(path, UnknownName { expected, got: name.clone() }.to_string());
                }
                Kind::UnknownField(key, expected) => {
                    let mut expected: Vec<&str> = expected.to_vec();
                    // `known` are keys of this table, not of one inside it.
                    for key in known.iter().filter(|_| keys.len() == 1) {
                        if !expected.contains(key) {
                            expected.push(key);
                        }
                    }
                    self.problems.push(path, unknown(key, &expected));
                }
                kind => {
                    if !self.items_alone(&value, &keys, &path, &read) {
                        self.problems.push(path, described(kind));
                    }
                }
            }
            if keys.is_empty() || !remove(&mut value, &keys, &mut dropped) {
                return None;
            }
        }
    }

    /// When the value at `keys` is a list, each item is tried alone and
    /// each one that does not read is named by its index; true if any was.
    fn items_alone<T>(
        &mut self,
        value: &Value,
        keys: &[String],
        path: &KeyPath,
        read: &impl Fn(&Value) -> Result<T, Error>,
    ) -> bool {
        let Some(Value::Array(tag, items)) = find(value, keys) else { return false };
        // Empty, a list of the wrong type is still refused: then the list
        // is at fault, not an item.
        let mut empty = value.clone();
        if let Some(list) = find_mut(&mut empty, keys) {
            *list = Value::Array(*tag, Vec::new());
        }
        if read(&empty).is_err() {
            return false;
        }
        let mut named = false;
        for (index, item) in items.iter().enumerate() {
            let mut alone = value.clone();
            if let Some(list) = find_mut(&mut alone, keys) {
                *list = Value::Array(*tag, vec![item.clone()]);
            }
            if let Err(error) = read(&alone) {
                self.problems.push(path.child(&index.to_string()), described(&error.kind));
                named = true;
            }
        }
        named
    }

    fn rate_limit(&mut self, value: Option<&Value>) -> (RateLimitConfig, Declared) {
        let at = KeyPath::root().dotted("capabilities.rate-limit");
        let dict = value.and_then(Value::as_dict).cloned().unwrap_or_default();
        // `provider` and the provider's own table are its config's.
        let name = dict.get("provider").and_then(Value::as_str).map(str::to_owned);
        let provider_keys: Vec<&str> = ["provider"].into_iter().chain(name.as_deref()).collect();
        let (provider, dict) = split(&dict, &provider_keys);
        let provider = match provider.is_empty() {
            true => Some(ProviderConfig::default()),
            false => self.typed(&provider.into(), &at, &[], Value::deserialize),
        };
        let (own, rest) = split(&dict, &RATE_LIMIT_KEYS);
        let edge: EdgeSettings = self
            .typed(
                &defaults_split::<EdgeSettings>(rest.into()),
                &at,
                &RATE_LIMIT_KEYS,
                Value::deserialize,
            )
            .unwrap_or_default();
        let mut keys_only = own.clone();
        keys_only.remove("policies");
        let keys: RateLimitKeys =
            self.typed(&keys_only.into(), &at, &[], Value::deserialize).unwrap_or_default();
        let (policies, declared) = self.policies(own.get("policies"), &at.child("policies"));
        let config = RateLimitConfig {
            provider: provider.unwrap_or_default(),
            default_policy: keys.default_policy,
            edge,
            operations: keys.operations,
            policies,
            degraded: keys.degraded,
        };
        (config, declared)
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
            let demo = BTreeMap::from([(DEFAULT_POLICY.to_owned(), demo_policy())]);
            return (demo, Declared { policy_ids: Some(ids) });
        };
        let Some(dict) = value.as_dict() else {
            self.problems
                .push(path.clone(), format!("expected a table of policies, found {}", kind(value)));
            return (BTreeMap::new(), Declared { policy_ids: None });
        };
        let mut policies = BTreeMap::new();
        for (id, table) in dict {
            let Some(table) = table.as_dict() else {
                self.problems
                    .push(path.child(id), format!("expected a table, found {}", kind(table)));
                continue;
            };
            if let Some(policy) = self.policy(id, table, &path.child(id)) {
                policies.insert(id.clone(), policy);
            }
        }
        (policies, Declared { policy_ids: Some(dict.keys().cloned().collect()) })
    }

    /// One policy: its algorithm from `algorithm` and the algorithm's own
    /// keys, every other key from [`PolicyKeys`], built and checked by the
    /// contract's policy builder (each rule it finds broken under its key).
    #[allow(clippy::result_large_err, reason = "figment's error is what its values give")]
    fn policy(&mut self, id: &str, table: &Dict, path: &KeyPath) -> Option<RateLimitPolicy> {
        let algorithm_key = PolicyField::Algorithm.key();
        let every_parameter: Vec<&'static str> =
            AlgorithmKind::ALL.iter().flat_map(|kind| kind.parameters()).copied().collect();
        let kind = match table.get(algorithm_key) {
            None => {
                let names: Vec<_> = AlgorithmKind::ALL.iter().map(|kind| kind.name()).collect();
                self.problems.push(
                    path.child(algorithm_key),
                    format!("missing: choose one of {}", quoted(&names)),
                );
                None
            }
            Some(value) => match value.deserialize::<String>() {
                Ok(name) => AlgorithmKind::from_str(&name)
                    .map_err(|error| {
                        self.problems.push(path.child(algorithm_key), error.to_string())
                    })
                    .ok(),
                Err(error) => {
                    self.problems.push(path.child(algorithm_key), error.kind.to_string());
                    None
                }
            },
        };
        let own: &[&str] = kind.map_or(&[], |kind| kind.parameters());
        let refused = kind.map_or(&[][..], |kind| kind.refused_common_keys());
        if let Some(kind) = kind {
            for key in table.keys().filter(|key| {
                every_parameter.contains(&key.as_str()) && !own.contains(&key.as_str())
            }) {
                self.problems.push(path.child(key), format!("does not apply to {kind}; remove it"));
            }
            for key in
                refused.iter().map(|field| field.key()).filter(|key| table.contains_key(*key))
            {
                self.problems.push(
                    path.child(key),
                    format!(
                        "does not apply to {kind} (docs/algorithms.md: a lease is one slot \
                         whatever the cost, and its id is its dedupe); remove it"
                    ),
                );
            }
        }
        let mut parameters = Dict::new();
        let mut rest = Dict::new();
        for (key, value) in table {
            if own.contains(&key.as_str()) {
                parameters.insert(key.clone(), value.clone());
            } else if key != algorithm_key
                && !every_parameter.contains(&key.as_str())
                && !refused.iter().any(|field| field.key() == key)
            {
                rest.insert(key.clone(), value.clone());
            }
        }
        let mut known = vec![algorithm_key];
        known.extend(own);
        let mut algorithm = None;
        if let Some(kind) = kind {
            let mut complete = true;
            for key in own.iter().filter(|key| !kind.defaulted().contains(key)) {
                if !parameters.contains_key(*key) {
                    self.problems.push(path.child(key), format!("missing: {kind} needs it"));
                    complete = false;
                }
            }
            algorithm = self
                .typed(&parameters.into(), path, &known, |value| kind.deserialize(value))
                .filter(|_| complete);
        }
        let keys: Option<PolicyKeys> = self.typed(&rest.into(), path, &known, Value::deserialize);
        let (kind, algorithm) = (kind?, algorithm?);
        // A parameter left out takes its default from another (a GCRA
        // burst is its limit): it fails only when that one does, whose
        // problem is already listed on the key the user wrote.
        let defaulted: Vec<&str> =
            kind.defaulted().iter().copied().filter(|key| !table.contains_key(*key)).collect();
        let builder = RateLimitPolicy::builder(id, algorithm).keys(&keys?);
        match builder.build() {
            Ok(policy) => Some(policy),
            Err(error) => {
                let defaulted = |field: PolicyField| defaulted.contains(&field.key());
                for violation in error.violations().iter().filter(|v| !defaulted(v.field)) {
                    // A bad id is the policy table's own key.
                    let at = if violation.field == PolicyField::Id {
                        path.clone()
                    } else {
                        path.dotted(violation.field.key())
                    };
                    self.problems.push(at, violation.problem.clone());
                }
                if error.violations().is_empty() {
                    self.problems.push(path.clone(), error.to_string());
                }
                None
            }
        }
    }

    /// `[redis]`: the switch and the two passwords are the application's;
    /// every other key is [`RedisSettings`]' own.
    fn redis(&mut self, value: Option<&Value>) -> RedisConfig {
        let at = KeyPath::root().child("redis");
        let dict = value.and_then(Value::as_dict).cloned().unwrap_or_default();
        let (own, rest) = split(&dict, &REDIS_KEYS);
        let urls_given = rest.contains_key(RedisField::Urls.key());
        let mut settings: RedisSettings = self
            .typed(
                &defaults_split::<RedisSettings>(rest.into()),
                &at,
                &REDIS_KEYS,
                Value::deserialize,
            )
            .unwrap_or_default();
        let keys: RedisKeys =
            self.typed(&own.into(), &at, &[], Value::deserialize).unwrap_or_default();
        // The sentinels name the master: no URL unless one is given (which
        // validation then refuses).
        if settings.topology == Topology::Sentinel && !urls_given {
            settings.urls.clear();
        }
        RedisConfig {
            enabled: keys.enabled,
            settings,
            password: keys.password,
            sentinel_password: keys.sentinel_password,
        }
    }
}

/// `(the keys of dict in keys, the others)`.
/// A type or value error, never with the text it found: a string in the
/// wrong place may be a secret (an export header written `"k=v"`, a key
/// given to the wrong variable), and the problem is printed and logged.
fn described(kind: &Kind) -> String {
    match kind {
        Kind::InvalidType(Actual::Str(_), expected) => {
            format!("invalid type: found a string, expected {expected}")
        }
        Kind::InvalidValue(Actual::Str(_), expected) => {
            format!("invalid value: a string, expected {expected}")
        }
        kind => kind.to_string(),
    }
}

fn split(dict: &Dict, keys: &[&str]) -> (Dict, Dict) {
    dict.iter()
        .map(|(key, value)| (key.clone(), value.clone()))
        .partition(|(key, _)| keys.contains(&key.as_str()))
}

/// `value` with each string where `T`'s default holds a list split on
/// commas: the form an environment variable carries a list in.
fn defaults_split<T: Serialize + Default>(mut value: Value) -> Value {
    fn walk(value: &mut Value, defaults: &Value) {
        let (Value::Dict(_, dict), Value::Dict(_, defaults)) = (value, defaults) else { return };
        for (key, value) in dict.iter_mut() {
            match (defaults.get(key), &*value) {
                (Some(Value::Array(..)), Value::String(tag, text)) => {
                    *value = Value::Array(
                        *tag,
                        split_list(text).map(|item| Value::String(*tag, item)).collect(),
                    );
                }
                (Some(defaults @ Value::Dict(..)), Value::Dict(..)) => walk(value, defaults),
                _ => {}
            }
        }
    }
    if let Ok(defaults) = Value::serialize(T::default()) {
        walk(&mut value, &defaults);
    }
    value
}

fn split_list(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(',').map(str::trim).filter(|item| !item.is_empty()).map(str::to_owned)
}

/// The keys of an error's path as the file wrote them: list indices count
/// the items dropped before.
fn as_written(keys: &[String], dropped: &BTreeMap<Vec<String>, usize>) -> Vec<String> {
    let mut written = Vec::with_capacity(keys.len());
    for (depth, key) in keys.iter().enumerate() {
        let before = dropped.get(&keys[..depth]).copied().unwrap_or(0);
        match key.parse::<usize>() {
            Ok(index) if before > 0 => written.push((index + before).to_string()),
            _ => written.push(key.clone()),
        }
    }
    written
}

fn find<'v>(value: &'v Value, keys: &[String]) -> Option<&'v Value> {
    keys.iter().try_fold(value, |value, key| match value {
        Value::Dict(_, dict) => dict.get(key),
        Value::Array(_, items) => items.get(key.parse::<usize>().ok()?),
        _ => None,
    })
}

fn find_mut<'v>(value: &'v mut Value, keys: &[String]) -> Option<&'v mut Value> {
    keys.iter().try_fold(value, |value, key| match value {
        Value::Dict(_, dict) => dict.get_mut(key),
        Value::Array(_, items) => items.get_mut(key.parse::<usize>().ok()?),
        _ => None,
    })
}

/// Drops the value at `keys`; false when there is none.
fn remove(value: &mut Value, keys: &[String], dropped: &mut BTreeMap<Vec<String>, usize>) -> bool {
    let Some((last, parent)) = keys.split_last() else { return false };
    match find_mut(value, parent) {
        Some(Value::Dict(_, dict)) => dict.remove(last).is_some(),
        Some(Value::Array(_, items)) => match last.parse::<usize>() {
            Ok(index) if index < items.len() => {
                items.remove(index);
                *dropped.entry(parent.to_vec()).or_default() += 1;
                true
            }
            _ => false,
        },
        _ => false,
    }
}

/// An unknown key's problem, with the closest expected key as a hint.
fn unknown(key: &str, expected: &[&str]) -> String {
    let hint = expected
        .iter()
        .map(|candidate| (edit_distance(key, candidate), *candidate))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, near)| format!("did you mean `{near}`? "))
        .unwrap_or_default();
    format!("unknown key ({hint}expected one of: {})", expected.join(", "))
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// What kind of value this is, without its content (it may be a secret).
fn kind(value: &Value) -> &'static str {
    match value {
        Value::String(..) | Value::Char(..) => "a string",
        Value::Bool(..) => "a boolean",
        Value::Num(..) => "a number",
        Value::Empty(..) => "an empty value",
        Value::Dict(..) => "a table",
        Value::Array(..) => "an array",
    }
}

fn quoted(names: &[&str]) -> String {
    names.iter().map(|name| format!("{name:?}")).collect::<Vec<_>>().join(", ")
}

/// A list of names: an array, or one string of comma-separated names (the
/// form an environment variable carries; a name never holds a comma).
pub(crate) fn list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct List;
    impl<'de> serde::de::Visitor<'de> for List {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a name or a list of names")
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
            Ok(split_list(text).collect())
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut names = Vec::new();
            while let Some(name) = seq.next_element()? {
                names.push(name);
            }
            Ok(names)
        }
    }
    deserializer.deserialize_any(List)
}

pub(crate) fn some_list<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<String>>, D::Error> {
    list(deserializer).map(Some)
}

fn list_map<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    struct Names(#[serde(deserialize_with = "list")] Vec<String>);
    let map = BTreeMap::<String, Names>::deserialize(deserializer)?;
    Ok(map.into_iter().map(|(key, Names(names))| (key, names)).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_key_is_told_the_closest_known_one() {
        assert_eq!(edit_distance("window", "window"), 0);
        assert_eq!(edit_distance("windw", "window"), 1);
        assert_eq!(edit_distance("limt", "limit"), 1);
        let expected = ["algorithm", "limit", "window", "capacity", "refill-period"];
        assert!(unknown("windwo", &expected).starts_with("unknown key (did you mean `window`?"));
        assert!(unknown("zzzzzzzz", &expected).starts_with("unknown key (expected one of: "));
    }
}
