//! Rules that span keys: the policy map and its references, the provider
//! switch against the Redis switch and the pseudonymizer keys, and the
//! bounds of the edge and Redis settings.

use std::time::Duration;

use adapter_web::MIN_KEY_BYTES;
use axum::http::HeaderName;

use super::problems::{ConfigProblems, KeyPath};
use super::read::Declared;
use super::{AppConfig, ProviderKind, RedisTopology};

/// Longest key prefix the Redis provider accepts.
const MAX_KEY_PREFIX: usize = 64;

pub(crate) fn validate(config: &AppConfig, declared: &Declared, problems: &mut ConfigProblems) {
    policy_references(config, declared, problems);
    edge_settings(config, problems);
    provider_switch(config, problems);
    pseudonymizer(config, problems);
    if config.redis.enabled || config.capabilities.rate_limit.provider == ProviderKind::Redis {
        redis(config, problems);
    }
}

fn policy_references(config: &AppConfig, declared: &Declared, problems: &mut ConfigProblems) {
    let rate_limit = &config.capabilities.rate_limit;
    // An unreadable policies table already has its problem.
    let Some(ids) = &declared.policy_ids else { return };
    if ids.is_empty() {
        problems.push(
            KeyPath::rate_limit("policies"),
            "must define at least one policy (add [capabilities.rate-limit.policies.<id>])",
        );
        return;
    }
    let defined = ids.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
    if !ids.contains(&rate_limit.default_policy) {
        problems.push(
            KeyPath::rate_limit("default-policy"),
            format!(
                "{:?} is not a policy in capabilities.rate-limit.policies (defined: {defined})",
                rate_limit.default_policy
            ),
        );
    }
    for (operation, policy) in &rate_limit.operations {
        let path = KeyPath::rate_limit("operations").child(operation);
        if !is_operation(operation) {
            problems.push(
                path.clone(),
                "an operation is a method and a route template, like \"GET /api/orders/{id}\"",
            );
        }
        if !ids.contains(policy) {
            problems.push(
                path,
                format!("{policy:?} is not a policy in capabilities.rate-limit.policies (defined: {defined})"),
            );
        }
    }
}

/// `METHOD /route`: an upper-case method, one space, a path from `/`.
fn is_operation(operation: &str) -> bool {
    operation.split_once(' ').is_some_and(|(method, route)| {
        !method.is_empty()
            && method.bytes().all(|b| b.is_ascii_uppercase())
            && route.starts_with('/')
            && !route.contains(' ')
    })
}

fn edge_settings(config: &AppConfig, problems: &mut ConfigProblems) {
    let rate_limit = &config.capabilities.rate_limit;
    positive(rate_limit.evaluation_budget, KeyPath::rate_limit("evaluation-budget"), problems);
    positive(rate_limit.failure_retry_after, KeyPath::rate_limit("failure-retry-after"), problems);
    if HeaderName::from_bytes(rate_limit.api_key_header.as_bytes()).is_err() {
        problems.push(
            KeyPath::rate_limit("api-key-header"),
            format!("{:?} is not a valid HTTP header name", rate_limit.api_key_header),
        );
    }
    if rate_limit.problem_type_base.is_empty() {
        problems.push(KeyPath::rate_limit("problem-type-base"), "must not be empty");
    }
}

fn provider_switch(config: &AppConfig, problems: &mut ConfigProblems) {
    if config.capabilities.rate_limit.provider != ProviderKind::Redis {
        return;
    }
    if !config.redis.enabled {
        problems.push(
            KeyPath::root().dotted("redis.enabled"),
            "must be true when capabilities.rate-limit.provider = \"redis\" (the global Redis switch is off)",
        );
    }
    if config.pseudonymizer.keys.is_empty() {
        problems.push(
            KeyPath::root().dotted("pseudonymizer.keys"),
            "the redis provider needs a configured key, so every instance pseudonymizes alike \
             (add [pseudonymizer.keys] 1 = { env = \"VAR\" })",
        );
    }
}

fn pseudonymizer(config: &AppConfig, problems: &mut ConfigProblems) {
    let pseudonymizer = &config.pseudonymizer;
    if pseudonymizer.keys.is_empty() {
        return;
    }
    if !pseudonymizer.keys.contains_key(&pseudonymizer.active_version) {
        let defined = pseudonymizer.keys.keys().map(u32::to_string).collect::<Vec<_>>().join(", ");
        problems.push(
            KeyPath::root().dotted("pseudonymizer.active-version"),
            format!(
                "{} is not a version in pseudonymizer.keys (defined: {defined})",
                pseudonymizer.active_version
            ),
        );
    }
    for (version, key) in &pseudonymizer.keys {
        if key.len() < MIN_KEY_BYTES {
            problems.push(
                KeyPath::root().dotted("pseudonymizer.keys").child(&version.to_string()),
                format!("must be at least {MIN_KEY_BYTES} bytes, got {}", key.len()),
            );
        }
    }
}

fn redis(config: &AppConfig, problems: &mut ConfigProblems) {
    let redis = &config.redis;
    let path = KeyPath::root().child("redis");
    match redis.topology {
        RedisTopology::Standalone if redis.urls.len() != 1 => problems.push(
            path.child("urls"),
            format!("standalone takes exactly one redis:// URL, got {}", redis.urls.len()),
        ),
        RedisTopology::Cluster if redis.urls.is_empty() => {
            problems.push(path.child("urls"), "a cluster needs at least one seed node URL");
        }
        RedisTopology::Standalone | RedisTopology::Cluster => {}
    }
    for (index, url) in redis.urls.iter().enumerate() {
        let known = ["redis://", "rediss://", "unix://", "redis+unix://"];
        if !known.iter().any(|scheme| url.starts_with(scheme)) {
            // The URL may carry a password, so only its scheme is echoed.
            let scheme = url.split_once("://").map_or("none", |(scheme, _)| scheme);
            problems.push(
                path.child("urls").child(&index.to_string()),
                format!("must start with redis://, rediss:// or unix:// (scheme: {scheme})"),
            );
        }
    }
    let prefix = &redis.key_prefix;
    let prefix_path = path.child("key-prefix");
    if prefix.is_empty() || prefix.len() > MAX_KEY_PREFIX {
        problems.push(
            prefix_path.clone(),
            format!("must be 1 to {MAX_KEY_PREFIX} bytes (the ACL key pattern is <key-prefix>*), got {}", prefix.len()),
        );
    }
    if prefix.chars().any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control()) {
        problems.push(
            prefix_path,
            "must not contain '{', '}', spaces or control characters: the subject's hash tag must be the only one in a key",
        );
    }
    positive(redis.connect_timeout, path.child("connect-timeout"), problems);
    positive(redis.command_timeout, path.child("command-timeout"), problems);
    if redis.script_lane_max_in_flight == 0 {
        problems.push(path.dotted("script-lane.max-in-flight"), "must be at least 1");
    }
}

fn positive(duration: Duration, path: KeyPath, problems: &mut ConfigProblems) {
    if duration < Duration::from_millis(1) {
        problems.push(path, format!("must be at least 1ms, got {duration:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_a_method_and_a_route() {
        assert!(is_operation("GET /api/orders/{id}"));
        assert!(is_operation("POST /api/orders"));
        for bad in ["get /x", "GET", "GET api", "GET /a b", " /x"] {
            assert!(!is_operation(bad), "{bad}");
        }
    }
}
