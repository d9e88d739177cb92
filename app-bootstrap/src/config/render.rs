//! The resolved configuration as TOML for `check-config`, in the same keys
//! a file uses, with every secret replaced by `[REDACTED]`.

use std::collections::BTreeMap;

use serde::Serializer;
use shared_contract::{PolicyField, RateLimitPolicy};
use toml::{Table, Value};

use adapter_redis::RedisField;

use super::AppConfig;
use super::secret::{REDACTED, fingerprint, fingerprinted};
use crate::error::BootstrapError;

pub(super) fn to_redacted_toml(config: &AppConfig) -> Result<String, BootstrapError> {
    let root = to_table(config, Secrets::Redacted);
    toml::to_string(&root).map_err(|error| BootstrapError::ConfigSource(error.to_string()))
}

/// How a secret value is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Secrets {
    /// As `check-config` prints it: `[REDACTED]` or its `{ env = .. }`.
    Redacted,
    /// As a SHA-256 fingerprint of the value, so two configurations can be
    /// compared (a reload tells a changed password from an unchanged one)
    /// without holding the secret in the table. Never printed.
    Fingerprinted,
}

/// The configuration as one TOML table, in the keys a file uses. Each
/// secret renders through its own `Serialize`.
pub(crate) fn to_table(config: &AppConfig, secrets: Secrets) -> Table {
    match secrets {
        Secrets::Redacted => sections(config, secrets),
        Secrets::Fingerprinted => fingerprinted(|| sections(config, secrets)),
    }
}

fn sections(config: &AppConfig, secrets: Secrets) -> Table {
    // Every section is a struct of strings, numbers, lists and tables,
    // which TOML always holds.
    let mut root = Table::try_from(config).expect("the configuration is a TOML table");
    // A URL, which may carry a password, is fingerprinted whole (so a
    // changed one is seen) or redacted for printing.
    let urls = config.redis.settings.urls.iter().map(|url| match secrets {
        Secrets::Redacted => Value::from(redact_url(url)),
        Secrets::Fingerprinted => fingerprint(url).into(),
    });
    if let Some(Value::Table(redis)) = root.get_mut("redis") {
        redis.insert(RedisField::Urls.key().into(), Value::Array(urls.collect()));
    }
    root
}

/// One policy as its table under `capabilities.rate-limit.policies`.
pub(crate) fn policy_table(policy: &RateLimitPolicy) -> Value {
    let mut table = Table::new();
    table.insert(PolicyField::Algorithm.key().into(), policy.algorithm().name().into());
    // The algorithm's own keys, as its serde derive names them.
    if let Ok(Value::Table(parameters)) = Value::try_from(policy.algorithm()) {
        table.extend(parameters);
    }
    // The common keys, those the algorithm refuses left out.
    if let Ok(Value::Table(keys)) = Value::try_from(policy.keys()) {
        table.extend(keys);
    }
    table.into()
}

/// A list of names: one as a string, as a file usually writes it; several
/// as an array.
pub(crate) fn list<S: Serializer>(names: &[String], serializer: S) -> Result<S::Ok, S::Error> {
    match names {
        [one] => serializer.serialize_str(one),
        many => serializer.collect_seq(many),
    }
}

pub(crate) fn some_list<S: Serializer>(
    names: &Option<Vec<String>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    list(names.as_deref().unwrap_or_default(), serializer)
}

/// `operations`: each operation's policy set as [`list`] writes it.
pub(crate) fn lists<S: Serializer>(
    lists: &BTreeMap<String, Vec<String>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(lists.iter().map(|(key, names)| (key, policy_set(names))))
}

/// `policies`: each policy as its table.
pub(crate) fn policies<S: Serializer>(
    policies: &BTreeMap<String, RateLimitPolicy>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(policies.iter().map(|(id, policy)| (id, policy_table(policy))))
}

fn policy_set(ids: &[String]) -> Value {
    match ids {
        [one] => one.clone().into(),
        many => Value::Array(many.iter().map(|id| Value::from(id.clone())).collect()),
    }
}

/// Every credential the redis crate reads from a URL, redacted: the
/// password of the userinfo (`redis://user:password@host`, `rediss://`,
/// `valkey://`) and the `pass` query parameter (`unix:///run/redis.sock?
/// pass=...`, which the crate reads on every unix scheme; `password` too,
/// should one be written). User names are not secret and stay, as
/// `redis.username` does; so do `db`, `protocol` and the fragment.
pub(crate) fn redact_url(url: &str) -> String {
    let (url, fragment) = match url.split_once('#') {
        Some((url, fragment)) => (url, Some(fragment)),
        None => (url, None),
    };
    let (before_query, query) = match url.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (url, None),
    };
    // The query is read with or without `//`: the redis crate takes
    // `unix:/path?pass=..` as it takes `unix:///path?pass=..`.
    let mut out = match before_query.split_once("://") {
        // The last `@` before the query ends the userinfo; a password
        // holding a raw `/` (the url crate would refuse it) is still cut
        // out whole.
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _password)) => format!("{scheme}://{user}:{REDACTED}@{host}"),
                None => before_query.to_owned(),
            },
            None => before_query.to_owned(),
        },
        None => before_query.to_owned(),
    };
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query.split('&').map(redact_query_pair).collect();
        out.push_str(&pairs.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// `pass=secret` -> `pass=[REDACTED]`; the name is compared decoded, as
/// the redis crate decodes it (`p%61ss` is `pass`), and in any case (the
/// crate reads only `pass`, but `PASS=` was meant as one too). A pair whose
/// `=` is itself encoded (`pass%3Dsecret`) is redacted whole.
fn redact_query_pair(pair: &str) -> String {
    let raw_name = pair.split_once('=').map_or(pair, |(name, _)| name);
    let name = form_urlencoded::parse(raw_name.as_bytes())
        .next()
        .map(|(name, _)| name.to_ascii_lowercase())
        .unwrap_or_default();
    let is_secret = |name: &str| name == "pass" || name == "password";
    if is_secret(&name) {
        format!("{raw_name}={REDACTED}")
    } else if name.split_once('=').is_some_and(|(name, _)| is_secret(name)) {
        REDACTED.to_owned()
    } else {
        pair.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_redacted_and_the_rest_kept() {
        assert_eq!(
            redact_url("redis://app:s3cret@10.0.0.1:6379/0"),
            "redis://app:[REDACTED]@10.0.0.1:6379/0"
        );
        assert_eq!(redact_url("redis://:s3cret@host"), "redis://:[REDACTED]@host");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact_url("redis://user@host"), "redis://user@host");
    }

    #[test]
    fn every_credential_form_the_redis_crate_reads_is_redacted() {
        for (url, redacted) in [
            ("unix:///run/redis.sock?pass=s3cretPW", "unix:///run/redis.sock?pass=[REDACTED]"),
            (
                "redis+unix:///run/redis.sock?db=2&user=app&pass=s3cretPW&protocol=resp3",
                "redis+unix:///run/redis.sock?db=2&user=app&pass=[REDACTED]&protocol=resp3",
            ),
            ("valkey+unix:///s.sock?p%61ss=s3cretPW", "valkey+unix:///s.sock?p%61ss=[REDACTED]"),
            (
                "rediss://app:s3cretPW@host:6380/0#insecure",
                "rediss://app:[REDACTED]@host:6380/0#insecure",
            ),
            ("valkeys://:s3cretPW@host", "valkeys://:[REDACTED]@host"),
            (
                "redis://app:s3cretPW@host/0?pass=s3cretPW",
                "redis://app:[REDACTED]@host/0?pass=[REDACTED]",
            ),
            ("redis://app:s3c/retPW@host", "redis://app:[REDACTED]@host"),
            ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1"),
            // The crate reads the query without `//` too.
            ("unix:/run/redis.sock?pass=s3cretPW", "unix:/run/redis.sock?pass=[REDACTED]"),
            ("/run/redis.sock?PASS=s3cretPW", "/run/redis.sock?PASS=[REDACTED]"),
            ("unix:///s.sock?pass%3Ds3cretPW&db=1", "unix:///s.sock?[REDACTED]&db=1"),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
            assert!(!redact_url(url).contains("s3cretPW"), "{url}");
        }
    }
}
