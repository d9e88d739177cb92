//! Rules that span keys: the policy map and its references, the provider
//! switch against the Redis switch and the pseudonymizer keys. The rules of
//! the edge and Redis settings belong to their owners (`EdgeSettings`,
//! `RedisSettings`); here their problems get their full key paths.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use adapter_redis::{RedisField, SettingsProblem};
use adapter_web::{MIN_KEY_BYTES, WebError};
use humantime_serde::re::humantime::format_duration;
use shared_contract::MAX_POLICY_SET;

use super::problems::{ConfigProblems, KeyPath};
use super::read::Declared;
use super::{
    AppConfig, MIN_ADMIN_TOKEN_BYTES, OtlpConfig, ProviderConfig, RuleCharge, ServerConfig,
};

/// The longest `evaluation-budget`: one request's deadline, far past any
/// useful one and far inside what `Instant + Duration` holds.
pub(crate) const MAX_EVALUATION_BUDGET: Duration = Duration::from_secs(60);
/// The longest `failure-retry-after`: a 503's `Retry-After`.
pub(crate) const MAX_FAILURE_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// The longest `redis.connect-timeout` and `redis.command-timeout`.
pub(crate) const MAX_REDIS_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn validate(config: &AppConfig, declared: &Declared, problems: &mut ConfigProblems) {
    server(config, problems);
    policy_references(config, declared, problems);
    edge_settings(config, problems);
    let edge = &config.capabilities.rate_limit.edge;
    at_most(
        KeyPath::rate_limit("evaluation-budget"),
        edge.evaluation_budget,
        MAX_EVALUATION_BUDGET,
        problems,
    );
    at_most(
        KeyPath::rate_limit("failure-retry-after"),
        edge.failure_retry_after,
        MAX_FAILURE_RETRY_AFTER,
        problems,
    );
    provider_switch(config, problems);
    degraded(config, problems);
    memory(config, problems);
    pseudonymizer(config, problems);
    admin(config, problems);
    otlp(&config.telemetry.otlp, problems);
    envoy_rls(config, declared, problems);
    // Checked while off too, as every dormant section is: switching it on
    // must not be the moment a typo in it is found.
    redis(config, problems);
}

/// The listeners' timeouts: more than zero (zero would cut every drain,
/// or every request, at once) and at most [`ServerConfig::MAX_TIMEOUT`].
fn server(config: &AppConfig, problems: &mut ConfigProblems) {
    let server = &config.server;
    for (key, value) in [
        ("shutdown-grace", server.shutdown_grace),
        ("header-read-timeout", server.header_read_timeout),
    ] {
        let path = KeyPath::root().child("server").child(key);
        if value.is_zero() {
            problems.push(path, "must be more than 0");
        } else {
            at_most(path, value, ServerConfig::MAX_TIMEOUT, problems);
        }
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
    policy_set(&rate_limit.default_policy, ids, KeyPath::rate_limit("default-policy"), problems);
    for (operation, policies) in &rate_limit.operations {
        let path = KeyPath::rate_limit("operations").child(operation);
        if !is_operation(operation) {
            problems.push(
                path.clone(),
                "an operation is a method and a route template, like \"GET /api/orders/{id}\"",
            );
        }
        policy_set(policies, ids, path, problems);
    }
}

/// One operation's policy set: 1 to [`MAX_POLICY_SET`] declared ids, none
/// twice. Each problem names the set's key path.
fn policy_set(
    policies: &[String],
    ids: &BTreeSet<String>,
    path: KeyPath,
    problems: &mut ConfigProblems,
) {
    if policies.is_empty() {
        problems.push(path, "must name at least one policy");
        return;
    }
    if policies.len() > MAX_POLICY_SET {
        problems.push(
            path.clone(),
            format!(
                "at most {MAX_POLICY_SET} policies are checked together, got {}",
                policies.len()
            ),
        );
    }
    let defined = ids.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
    for (index, policy) in policies.iter().enumerate() {
        if policies[..index].contains(policy) {
            problems.push(path.clone(), format!("{policy:?} is listed twice"));
        } else if !ids.contains(policy) {
            // The built-in policy is there only while none is defined, so a
            // file that defines its own loses it: say so, or the missing
            // `default` reads like a typo.
            use adapter_web::DEFAULT_POLICY;
            let built_in = if policy == DEFAULT_POLICY {
                format!(
                    "; the built-in {DEFAULT_POLICY:?} policy applies only while no policy is \
                     defined, and defining any replaces it: set default-policy to one of \
                     yours or define {DEFAULT_POLICY:?}"
                )
            } else {
                String::new()
            };
            problems.push(
                path.clone(),
                format!("{policy:?} is not a policy in capabilities.rate-limit.policies (defined: {defined}){built_in}"),
            );
        }
    }
}

/// Every key of `operations` must name a route the server serves (method
/// and route template, as the router matches them): a typo would otherwise
/// fall back to the default set without a word.
pub(crate) fn served_operations(
    config: &AppConfig,
    served: &BTreeSet<String>,
    problems: &mut ConfigProblems,
) {
    let listed = served.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
    for operation in config.capabilities.rate_limit.operations.keys() {
        if !served.contains(operation) {
            problems.push(
                KeyPath::rate_limit("operations").child(operation),
                format!("names no route this server serves (served: {listed})"),
            );
        }
    }
}

/// `METHOD /route`: an upper-case method, one space, a path from `/`.
pub(crate) fn is_operation(operation: &str) -> bool {
    operation.split_once(' ').is_some_and(|(method, route)| {
        !method.is_empty()
            && method.bytes().all(|b| b.is_ascii_uppercase())
            && route.starts_with('/')
            && !route.contains(' ')
    })
}

fn edge_settings(config: &AppConfig, problems: &mut ConfigProblems) {
    // The rules of the fields the edge owns; policy ids are checked above.
    for problem in config.capabilities.rate_limit.edge.problems() {
        let path = match &problem {
            WebError::EvaluationBudgetTooShort(_) => KeyPath::rate_limit("evaluation-budget"),
            WebError::FailureRetryAfterTooShort(_) => KeyPath::rate_limit("failure-retry-after"),
            WebError::InvalidProblemTypeBase { .. } => KeyPath::rate_limit("problem-type-base"),
            WebError::ClientIpv4PrefixOutOfRange(_) => KeyPath::rate_limit("client-ipv4-prefix"),
            WebError::ClientIpv6PrefixOutOfRange(_) => KeyPath::rate_limit("client-ipv6-prefix"),
            WebError::TrustedProxiesCoverEveryAddress(_)
            | WebError::TrustedProxyIsMappedIpv4(_) => KeyPath::rate_limit("trusted-proxies"),
            WebError::KeyTooShort { version, .. } | WebError::DuplicateKeyVersion(version) => {
                KeyPath::root().dotted("pseudonymizer.keys").child(&version.to_string())
            }
            WebError::UnknownKeyVersion(_) => {
                KeyPath::root().dotted("pseudonymizer.active-version")
            }
        };
        problems.push(path, problem.to_string());
    }
}

/// The upper end of a duration's range. The lower ends and the policies'
/// durations are their owners' rules (`EdgeSettings`, `RedisSettings`, the
/// policy builder); these keys have none above, and a value near
/// `Duration::MAX` would overflow the deadline it sets.
fn at_most(path: KeyPath, value: Duration, max: Duration, problems: &mut ConfigProblems) {
    if value > max {
        problems.push(
            path,
            format!("must be at most {}, got {}", format_duration(max), format_duration(value)),
        );
    }
}

/// `telemetry.otlp`: an `http` or `https` URL with a host, a CA file with
/// a certificate in it, a ratio in
/// `0..=1`, a service name, a timeout above zero, and headers an HTTP
/// request can carry (a bad value is named by its key, never shown).
fn otlp(otlp: &OtlpConfig, problems: &mut ConfigProblems) {
    let at = |key: &str| KeyPath::root().dotted("telemetry.otlp").child(key);
    if let Some(problem) = otlp.endpoint.as_deref().and_then(endpoint_problem) {
        problems.push(at("endpoint"), problem);
    }
    if let Some(file) = &otlp.ca_file {
        if let Err(problem) = crate::telemetry::pem_roots(file) {
            problems.push(at("ca-file"), format!("{file:?} {problem}"));
        }
    }
    if !(0.0..=1.0).contains(&otlp.sample_ratio) {
        problems.push(
            at("sample-ratio"),
            format!("must be between 0.0 and 1.0, got {}", otlp.sample_ratio),
        );
    }
    if otlp.service_name.trim().is_empty() {
        problems.push(at("service-name"), "must not be empty");
    }
    if otlp.timeout.is_zero() {
        problems.push(at("timeout"), "must be more than 0");
    } else {
        at_most(at("timeout"), otlp.timeout, OtlpConfig::MAX_TIMEOUT, problems);
    }
    // Lower-cased name -> the name as written, to find case twins.
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for (name, value) in &otlp.headers {
        let path = at("headers").child(name);
        let lower = name.to_ascii_lowercase();
        for problem in export_header_problems(name, value.expose()) {
            problems.push(path.clone(), problem);
        }
        if let Some(first) = seen.get(&lower) {
            problems.push(
                path,
                format!(
                    "names the same header as telemetry.otlp.headers.{first} \
                     (header names ignore case)"
                ),
            );
        } else {
            seen.insert(lower, name);
        }
    }
}

/// What is wrong with one export header (`telemetry.otlp.headers.<name>`,
/// or an entry of `OTEL_EXPORTER_OTLP_HEADERS`): a name that is no HTTP
/// header name or one the client frames the request with, a value that is
/// not visible ASCII. The value is never quoted (it may be a key).
pub(crate) fn export_header_problems(name: &str, value: &str) -> Vec<&'static str> {
    let mut problems = Vec::new();
    if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        problems.push("is not a valid HTTP header name");
    } else if FRAMING_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        problems.push(
            "is set by the exporter's HTTP client (message framing); it cannot be overridden",
        );
    }
    if !value.bytes().all(|byte| (b' '..=b'~').contains(&byte)) {
        problems.push("the value must be visible ASCII (spaces allowed)");
    }
    problems
}

/// What is wrong with an OTLP endpoint, if anything. The URL is never
/// quoted (it may hold a user, a password or a token in its query): only
/// its scheme is named, like the `redis.urls` messages.
fn endpoint_problem(endpoint: &str) -> Option<String> {
    let uri = match endpoint.parse::<axum::http::Uri>() {
        Ok(uri) => uri,
        Err(error) => return Some(format!("not a URL: {error}")),
    };
    let scheme = uri.scheme_str().unwrap_or("none");
    let problem = if scheme != "http" && scheme != "https" {
        format!(
            "must be an http:// or https:// URL, like \"http://127.0.0.1:4318\" (scheme {scheme:?})"
        )
    } else if uri.authority().is_some_and(|authority| authority.as_str().contains('@')) {
        // It is logged at start; a credential goes in a header.
        "must carry no user or password; put a credential in telemetry.otlp.headers".to_owned()
    } else if uri.host().is_none_or(str::is_empty) {
        "must name a host, like \"http://127.0.0.1:4318\"".to_owned()
    } else if let Some(port) = written_port(&uri).filter(|port| port.parse::<u16>().is_err()) {
        // The URI parser takes any digits and then reports no port at all:
        // the client would dial the scheme's default port instead.
        format!("port {port:?} is not a port number (1 to 65535; OTLP/HTTP listens on 4318)")
    } else if uri.port_u16() == Some(0) {
        "port 0 is no collector's port; name the port it listens on (OTLP/HTTP: 4318)".to_owned()
    } else if uri.query().is_some() {
        "must have no query; /v1/traces is appended".to_owned()
    } else if endpoint.contains('#') {
        // The URI parser drops a fragment; /v1/traces would land after it.
        "must have no fragment (#); /v1/traces is appended".to_owned()
    } else {
        return None;
    };
    Some(problem)
}

/// The port as written after the host (`""` for a bare `:`), if any; the
/// host may be an IPv6 literal in brackets, whose colons are not a port's.
fn written_port(uri: &axum::http::Uri) -> Option<&str> {
    let (_, port) = uri.authority()?.as_str().rsplit_once(':')?;
    (!port.contains(']')).then_some(port)
}

/// Headers the exporter's HTTP client writes to frame the request (or the
/// connection): an export header of the same name would corrupt it.
const FRAMING_HEADERS: [&str; 9] = [
    "connection",
    "content-length",
    "content-type",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

fn provider_switch(config: &AppConfig, problems: &mut ConfigProblems) {
    if config.capabilities.rate_limit.provider != ProviderConfig::Redis {
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

/// The degraded mode: only over Redis (the memory provider decides every
/// request itself, and `disabled` decides none), and only with the number
/// of instances that share the traffic, which no default can know.
fn degraded(config: &AppConfig, problems: &mut ConfigProblems) {
    let rate_limit = &config.capabilities.rate_limit;
    let degraded = &rate_limit.degraded;
    if !degraded.enabled {
        return;
    }
    let path = KeyPath::rate_limit("degraded");
    let unreadable = problems.iter().any(|problem| problem.path == path.child("instances"));
    if degraded.instances.is_none() && !unreadable {
        problems.push(
            path.child("instances"),
            "missing: required when degraded mode is enabled, how many instances share \
             the traffic while Redis is away (each admits ceil(limit / instances))",
        );
    }
    if degraded.instances == Some(0) {
        problems.push(
            path.child("instances"),
            "must be at least 1 when degraded mode is enabled: how many instances share the \
             traffic while Redis is away (each admits ceil(limit / instances))",
        );
    }
    match &rate_limit.provider {
        ProviderConfig::Redis => {}
        provider => problems.push(
            path.child("enabled"),
            format!(
                "must be false with capabilities.rate-limit.provider = \"{}\": degraded mode \
                 decides locally while Redis cannot, and there is no Redis to degrade from",
                provider.name()
            ),
        ),
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

/// The admin listener: a token of at least [`MIN_ADMIN_TOKEN_BYTES`] of
/// visible ASCII whenever it listens, and never the public port.
fn admin(config: &AppConfig, problems: &mut ConfigProblems) {
    let admin = &config.admin;
    let token = KeyPath::root().dotted("admin.token");
    match (&admin.listen, &admin.token) {
        (Some(_), None) => problems.push(
            token,
            "required when admin.listen is set (add token = { env = \"RATE_LIMIT_ADMIN_TOKEN\" })",
        ),
        (_, Some(secret)) if secret.len() < MIN_ADMIN_TOKEN_BYTES => problems.push(
            token,
            format!("must be at least {MIN_ADMIN_TOKEN_BYTES} bytes, got {}", secret.len()),
        ),
        (None | Some(_), _) => {}
    }
    // An `Authorization` header carries visible ASCII only; a token with a
    // newline (a secret file's last line), a space or a non-ASCII letter
    // would pass here and fail every call. Refused, not trimmed: the
    // operator's clients send what the secret holds.
    let secret = admin.token.as_ref().map(|secret| secret.expose().as_bytes());
    if let Some(bytes) = secret {
        if let Some(at) = bytes.iter().position(|byte| !byte.is_ascii_graphic()) {
            problems.push(
                KeyPath::root().dotted("admin.token"),
                format!(
                    "must be visible ASCII without spaces, as an Authorization header carries it; \
                     byte {} of {} is not{}",
                    at + 1,
                    bytes.len(),
                    // Only where it is the likely cause.
                    if bytes[at..].iter().all(|byte| matches!(byte, b'\n' | b'\r')) {
                        " (a trailing newline from a secret file?)"
                    } else {
                        ""
                    }
                ),
            );
        }
    }
    // Port 0 asks for a free port, so two of them never collide.
    let shared =
        admin.listen.filter(|listen| listen.port() != 0 && *listen == config.server.listen);
    if let Some(listen) = shared {
        problems.push(
            KeyPath::root().dotted("admin.listen"),
            format!("must differ from server.listen ({listen}): admin routes never share the public port"),
        );
    }
}

/// `[envoy-rls]`: each rule's domain, pattern, subject and policy set,
/// and no two rules with the same domain and pattern (the second could
/// never match). The listen address is read (and refused) by its owner.
fn envoy_rls(config: &AppConfig, declared: &Declared, problems: &mut ConfigProblems) {
    let rls = &config.envoy_rls;
    let rules_path = KeyPath::root().dotted("envoy-rls.rules");
    if let Some(listen) = rls.listen.filter(|listen| listen.port() != 0) {
        for (key, other) in
            [("server.listen", Some(config.server.listen)), ("admin.listen", config.admin.listen)]
        {
            if other == Some(listen) {
                problems.push(
                    KeyPath::root().dotted("envoy-rls.listen"),
                    format!("must differ from {key} ({listen})"),
                );
            }
        }
    }
    let mut seen: Vec<(&str, &[String], usize)> = Vec::new();
    for (index, rule) in rls.rules.iter().enumerate() {
        let path = rules_path.child(&index.to_string());
        if rule.domain.is_empty() {
            problems.push(path.child("domain"), "must not be empty");
        }
        let descriptor = path.child("descriptor");
        if rule.descriptor.is_empty() {
            problems.push(descriptor.clone(), "must name at least one entry key");
        }
        let entries: Vec<(&str, Option<&str>)> = rule.entries().collect();
        for (at, (key, value)) in entries.iter().enumerate() {
            let entry = descriptor.child(&at.to_string());
            if key.is_empty() {
                problems
                    .push(entry, "an entry key must not be empty (write \"key\" or \"key=value\")");
            } else if value.is_some_and(str::is_empty) {
                problems.push(entry, format!("the fixed value of {key:?} is empty"));
            }
        }
        // An empty list is one budget for every descriptor the rule matches.
        if let Some(subject) = &rule.subject {
            let at = path.child("subject");
            for (position, key) in subject.iter().enumerate() {
                // A repeated key (nested descriptors) names each of its
                // entries that counts apart.
                let mut named = entries.iter().filter(|(entry, _)| entry == key);
                let first = named.clone().next();
                match named.find(|(_, value)| crate::config::counts_apart(*value)).or(first) {
                    None => problems.push(
                        at.clone(),
                        format!("{key:?} is not an entry of this rule's descriptor"),
                    ),
                    Some((_, value)) if !crate::config::counts_apart(*value) => problems.push(
                        at.clone(),
                        format!("{key:?} has a fixed value, so it cannot tell subjects apart"),
                    ),
                    Some(_) if subject[..position].contains(key) => {
                        problems.push(at.clone(), format!("{key:?} is listed twice"));
                    }
                    Some(_) => {}
                }
            }
        }
        // A rule limits (`policies`) or answers without them (`unlimited`,
        // `blocked` or `not-limited` = true): exactly one of these; a rule
        // without policies charges no subject.
        let answers = rule.answers();
        let unread = ["unlimited", "blocked", "not-limited"];
        let unread = unread.iter().any(|key| problems.iter().any(|p| p.path == path.child(key)));
        match (answers.as_slice(), rule.policies.is_empty()) {
            ([answer], false) => problems.push(
                path.child("policies"),
                format!("an `{answer} = true` rule has no policies: remove one of the two keys"),
            ),
            // A key that did not read has its own problem.
            ([], true) if !unread => problems.push(
                path.child("policies"),
                "missing: every rule needs `policies`, or `unlimited = true` (or `blocked`, \
                 `not-limited`)",
            ),
            ([], false) => {
                if let Some(ids) = &declared.policy_ids {
                    policy_set(&rule.policies, ids, path.child("policies"), problems);
                }
            }
            ([first, second, ..], _) => problems.push(
                path.child(second),
                format!("a rule takes one of `unlimited`, `blocked` and `not-limited`; it sets `{first}` too"),
            ),
            ([_] | [], true) => {}
        }
        if let (Some(answer), Some(_)) = (answers.first(), &rule.subject) {
            problems.push(
                path.child("subject"),
                format!("an `{answer} = true` rule charges no subject: remove the key"),
            );
        }
        // envoyproxy/ratelimit refuses both.
        for (at, replaced) in rule.replaces.iter().enumerate() {
            if replaced.is_empty() || rule.name.as_ref() == Some(replaced) {
                problems.push(
                    path.child("replaces").child(&at.to_string()),
                    "must name another rule (not empty, not this rule's `name`)",
                );
            }
        }
        if let (true, Some(answer)) = (rule.allow_override, answers.first()) {
            problems.push(
                path.child("allow-override"),
                format!("an `{answer} = true` rule has no limit to override: remove the key"),
            );
        }
        if let (RuleCharge::Always, Some(answer)) = (rule.charge, answers.first()) {
            problems.push(
                path.child("charge"),
                format!("an `{answer} = true` rule charges nothing: remove the key"),
            );
        }
        if rule.name.as_deref() == Some("") {
            problems.push(path.child("name"), "must not be empty");
        }
        // Envoy's API has no call that ends a request, so a lease taken
        // through it could never be given back.
        let policies = &config.capabilities.rate_limit.policies;
        for id in &rule.policies {
            if policies.get(id).is_some_and(|policy| policy.algorithm().holds_leases()) {
                problems.push(
                    path.child("policies"),
                    format!(
                        "{id:?} is a concurrency policy: Envoy's rate limit API has no call \
                         that ends a request, so its lease could never be released; limit \
                         in-flight requests on the HTTP edge instead"
                    ),
                );
            }
        }
        match seen.iter().find(|(domain, pattern, _)| {
            *domain == rule.domain && *pattern == rule.descriptor.as_slice()
        }) {
            Some((_, _, first)) => problems.push(
                descriptor,
                format!("the same domain and pattern as envoy-rls.rules.{first}, which always matches first"),
            ),
            None => seen.push((&rule.domain, &rule.descriptor, index)),
        }
    }
}

/// `memory.max-keys`: 0 would refuse every subject, and so would a bound
/// below the keys of one subject's largest policy set (a key a policy),
/// while the in-process store counts (the memory provider, degraded mode).
fn memory(config: &AppConfig, problems: &mut ConfigProblems) {
    let path = KeyPath::root().child("memory").child("max-keys");
    let max_keys = config.memory.max_keys;
    if max_keys == 0 {
        problems.push(
            path,
            "must be at least 1: the most keys (subject, policy, operation) the in-process \
             store holds",
        );
        return;
    }
    let rate_limit = &config.capabilities.rate_limit;
    let counts = rate_limit.provider == ProviderConfig::Memory || rate_limit.degraded.enabled;
    let sets = [(KeyPath::rate_limit("default-policy"), &rate_limit.default_policy)].into_iter();
    let sets = sets.chain(
        rate_limit
            .operations
            .iter()
            .map(|(operation, set)| (KeyPath::rate_limit("operations").child(operation), set)),
    );
    let rules = KeyPath::root().dotted("envoy-rls.rules");
    let sets =
        sets.chain(config.envoy_rls.rules.iter().enumerate().map(|(index, rule)| {
            (rules.child(&index.to_string()).child("policies"), &rule.policies)
        }));
    if let Some((set, largest)) = sets.max_by_key(|(_, set)| set.len()).filter(|_| counts)
        && largest.len() > max_keys
    {
        problems.push(
            path,
            format!(
                "must be at least {}: {set} keeps that many keys for one subject, so a \
                 smaller store would refuse every request it limits",
                largest.len()
            ),
        );
    }
}

pub(crate) fn redis(config: &AppConfig, problems: &mut ConfigProblems) {
    let path = KeyPath::root().child("redis");
    let failure_retry_after = config.capabilities.rate_limit.edge.failure_retry_after;
    for SettingsProblem { field, problem } in
        config.redis.provider_settings(failure_retry_after).problems()
    {
        // The edge's own rule reports this key; once is enough.
        if field == RedisField::FailureRetryAfter {
            continue;
        }
        let at = path.dotted(field.key());
        let at = match field.index() {
            Some(index) => at.child(&index.to_string()),
            None => at,
        };
        problems.push(at, problem);
    }
    // `wait-timeout` is below `command-timeout` whenever it is used.
    at_most(
        path.child("connect-timeout"),
        config.redis.settings.connect_timeout,
        MAX_REDIS_TIMEOUT,
        problems,
    );
    at_most(
        path.child("command-timeout"),
        config.redis.settings.command_timeout,
        MAX_REDIS_TIMEOUT,
        problems,
    );
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
