//! Loading and validation, each inside a `figment::Jail` so files and
//! variables stay inside the test.

use std::path::PathBuf;
use std::time::Duration;

use figment::Jail;
use shared_contract::{Algorithm, EvaluationDedupPolicy, PolicyMode, PolicyScope, RateLimitPolicy};

use super::*;

const KEY: &str = "0123456789abcdef0123456789abcdef-test-key";
/// An admin token of exactly the 32 bytes required.
const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef-xyz";

/// A valid memory setup with one policy named `api`.
const BASE: &str = r#"
[capabilities.rate-limit]
default-policy = "api"

[capabilities.rate-limit.policies.api]
algorithm = "fixed-window"
limit = 10
window = "60s"
"#;

fn load_file(jail: &mut Jail, contents: &str) -> Result<AppConfig, BootstrapError> {
    jail.create_file("app.toml", contents).expect("write config");
    AppConfig::load(&ConfigSources::new(Some(PathBuf::from("app.toml"))))
}

/// The problems as `(path, message)` pairs, failing when loading succeeds.
fn problems(result: Result<AppConfig, BootstrapError>) -> Vec<(String, String)> {
    match result {
        Ok(config) => panic!("expected problems, loaded {config:?}"),
        Err(BootstrapError::InvalidConfig(problems)) => {
            problems.iter().map(|p| (p.path.to_string(), p.message.clone())).collect()
        }
        Err(other) => panic!("expected InvalidConfig, got {other}"),
    }
}

fn paths(result: Result<AppConfig, BootstrapError>) -> Vec<String> {
    problems(result).into_iter().map(|(path, _)| path).collect()
}

#[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
fn jail(test: impl FnOnce(&mut Jail)) {
    Jail::expect_with(|jail| {
        // Variables of the machine running the tests must not leak in.
        jail.clear_env();
        test(jail);
        Ok(())
    });
}

#[test]
fn no_file_and_no_environment_give_the_memory_demo() {
    jail(|_| {
        let config = AppConfig::load(&ConfigSources::new(None)).unwrap();
        assert_eq!(config.server.listen, "127.0.0.1:8080".parse().unwrap());
        let rate_limit = &config.capabilities.rate_limit;
        assert_eq!(rate_limit.provider, ProviderConfig::Memory);
        // The edge's default policy id, not a second name for it.
        let edge = adapter_web::EdgeSettings::default();
        assert_eq!(rate_limit.default_policy, [edge.default_policies.ids()[0].as_str()]);
        assert_eq!(rate_limit.default_policy, [adapter_web::DEFAULT_POLICY]);
        assert_eq!(rate_limit.edge.evaluation_budget, Duration::from_millis(750));
        // No header names an API key unless configured: an unchecked key
        // would let a client pick its own budget.
        assert_eq!(rate_limit.edge.api_key_header, None);
        assert_eq!(rate_limit.edge.client_ip_header, adapter_web::ClientIpHeader::XForwardedFor);
        let demo = &rate_limit.policies[adapter_web::DEFAULT_POLICY];
        assert_eq!(
            *demo.algorithm(),
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 5,
                window: Duration::from_secs(60)
            })
        );
        assert!(config.pseudonymizer.keys.is_empty());
        assert!(!config.redis.enabled);
        assert_eq!(config.redis.settings.key_prefix, "ca:rl:");
        assert_eq!(config.rate_limit_policies().len(), 1);
    });
}

#[test]
fn a_file_sets_every_policy_field() {
    jail(|jail| {
        let config = load_file(
            jail,
            r#"
            [server]
            listen = "0.0.0.0:9000"

            [capabilities.rate-limit]
            default-policy = "bucket"
            evaluation-budget = "500ms"
            trusted-proxies = ["10.0.0.0/8", "192.168.1.1"]
            operations = { "POST /api/orders" = "bucket" }

            [capabilities.rate-limit.policies.bucket]
            algorithm = "token-bucket"
            capacity = 20
            refill-tokens = 2
            refill-period = "1s"
            revision = 3
            maximum-cost = 5
            failure-policy = "fail-closed"
            cleanup-grace = "2s"
            maximum-clock-regression = "3s"
            evaluation-dedup = { enabled = true, ttl = "10s", max-entries = 8, max-stored-bytes = 4096 }

            [capabilities.rate-limit.policies.sliding]
            algorithm = "sliding-counter"
            limit = 100
            window = "1m"
            evaluation-dedup.enabled = false
            "#,
        )
        .unwrap();
        assert_eq!(config.server.listen.port(), 9000);
        let rate_limit = &config.capabilities.rate_limit;
        assert_eq!(rate_limit.edge.evaluation_budget, Duration::from_millis(500));
        assert_eq!(rate_limit.edge.trusted_proxies.len(), 2);
        assert_eq!(rate_limit.operations["POST /api/orders"], ["bucket"]);
        assert_eq!(
            rate_limit.policies["bucket"],
            RateLimitPolicy::builder(
                "bucket",
                Algorithm::TokenBucket(shared_contract::TokenBucket {
                    capacity: 20,
                    refill_tokens: 2,
                    refill_period: Duration::from_secs(1),
                }),
            )
            .revision(3)
            .maximum_cost(5)
            .cleanup_grace(Duration::from_secs(2))
            .maximum_clock_regression(Duration::from_secs(3))
            .evaluation_dedup(EvaluationDedupPolicy::Enabled {
                ttl: Duration::from_secs(10),
                max_entries: 8,
                max_stored_bytes: 4096,
            })
            .build()
            .unwrap()
        );
        assert_eq!(
            rate_limit.policies["sliding"].evaluation_dedup(),
            EvaluationDedupPolicy::Disabled
        );
        // A policies table of the user's replaces the demo policy entirely.
        assert!(!rate_limit.policies.contains_key(adapter_web::DEFAULT_POLICY));
    });
}

#[test]
fn the_environment_overrides_the_file() {
    jail(|jail| {
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER", "redis");
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__POLICIES__API__LIMIT", "42");
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__EVALUATION_BUDGET", "250ms");
        jail.set_env("CA_SKELETON_REDIS__ENABLED", "true");
        jail.set_env("CA_SKELETON_REDIS__TOPOLOGY", "cluster");
        jail.set_env("CA_SKELETON_REDIS__URLS", "redis://10.0.0.1:7000,redis://10.0.0.2:7000");
        jail.set_env("CA_SKELETON_REDIS__SCRIPT_LANE__MAX_IN_FLIGHT", "8");
        jail.set_env("CA_SKELETON_PSEUDONYMIZER__KEYS__1", KEY);
        // The file's own name is not a configuration key.
        jail.set_env("CA_SKELETON_CONFIG", "ignored.toml");
        let config = load_file(jail, &format!("{BASE}\n[redis]\nenabled = false\n")).unwrap();
        let rate_limit = &config.capabilities.rate_limit;
        assert_eq!(rate_limit.provider, ProviderConfig::Redis);
        assert_eq!(rate_limit.edge.evaluation_budget, Duration::from_millis(250));
        assert_eq!(
            *rate_limit.policies["api"].algorithm(),
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 42,
                window: Duration::from_secs(60)
            })
        );
        assert!(config.redis.enabled);
        assert_eq!(config.redis.settings.topology, adapter_redis::Topology::Cluster);
        assert_eq!(config.redis.settings.urls, ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]);
        assert_eq!(config.redis.settings.script_lane.max_in_flight, 8);
        assert_eq!(config.pseudonymizer.keys[&1].expose(), KEY);
    });
}

#[test]
fn every_list_splits_on_commas_from_the_environment() {
    jail(|jail| {
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__DEFAULT_POLICY", "api, daily");
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__TRUSTED_PROXIES", "10.0.0.0/8,::1");
        // Each list in a topology that takes it: a dormant [redis] is checked too.
        jail.set_env("CA_SKELETON_REDIS__TOPOLOGY", "cluster");
        jail.set_env("CA_SKELETON_REDIS__URLS", "redis://10.0.0.1:7000,redis://10.0.0.2:7000");
        let file = format!(
            "{BASE}\n[capabilities.rate-limit.operations]\n\"GET /api/hello\" = \"daily,api\"\n\
             [capabilities.rate-limit.policies.daily]\nalgorithm = \"fixed-window\"\n\
             limit = 1000\nwindow = \"1d\"\n"
        );
        let config = load_file(jail, &file).unwrap();
        let rate_limit = &config.capabilities.rate_limit;
        assert_eq!(rate_limit.default_policy, ["api", "daily"]);
        // A file's string reads the same way as a variable's.
        assert_eq!(rate_limit.operations["GET /api/hello"], ["daily", "api"]);
        let proxies: Vec<String> =
            rate_limit.edge.trusted_proxies.iter().map(ToString::to_string).collect();
        assert_eq!(proxies, ["10.0.0.0/8", "::1/128"]);
        assert_eq!(config.redis.settings.urls, ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]);
        jail.clear_env();
        jail.set_env("CA_SKELETON_REDIS__TOPOLOGY", "sentinel");
        jail.set_env("CA_SKELETON_REDIS__SENTINELS", "10.0.0.1:26379,10.0.0.2:26379");
        let config = load_file(jail, BASE).unwrap();
        assert_eq!(config.redis.settings.sentinels, ["10.0.0.1:26379", "10.0.0.2:26379"]);
    });
}

#[test]
fn an_empty_policy_map_is_rejected() {
    jail(|jail| {
        let result = load_file(jail, "[capabilities.rate-limit.policies]\n");
        assert_eq!(paths(result), ["capabilities.rate-limit.policies"]);
    });
}

#[test]
fn a_default_policy_outside_the_map_is_rejected() {
    jail(|jail| {
        let file = BASE.replace(r#"default-policy = "api""#, r#"default-policy = "missing""#);
        let problems = problems(load_file(jail, &file));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "capabilities.rate-limit.default-policy");
        assert!(problems[0].1.contains("\"missing\"") && problems[0].1.contains("api"));
    });
}

#[test]
fn an_unknown_algorithm_is_rejected() {
    jail(|jail| {
        let problems = problems(load_file(jail, &BASE.replace("fixed-window", "leaky-bucket")));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "capabilities.rate-limit.policies.api.algorithm");
        assert!(problems[0].1.contains("\"leaky-bucket\""), "{problems:?}");
    });
}

#[test]
fn a_failure_policy_other_than_fail_closed_is_rejected() {
    jail(|jail| {
        let file = format!("{BASE}failure-policy = \"fail-open\"\n");
        assert_eq!(
            paths(load_file(jail, &file)),
            ["capabilities.rate-limit.policies.api.failure-policy"]
        );
    });
}

#[test]
fn unknown_keys_are_each_reported_with_a_suggestion() {
    jail(|jail| {
        let file = format!("{BASE}windw = \"30s\"\n[servr]\nlisten = \"127.0.0.1:1\"\n");
        let problems = problems(load_file(jail, &file));
        let paths: Vec<_> = problems.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(paths, ["servr", "capabilities.rate-limit.policies.api.windw"]);
        assert!(problems[0].1.contains("did you mean `server`"), "{problems:?}");
        assert!(problems[1].1.contains("did you mean `window`"), "{problems:?}");
    });
}

#[test]
fn every_duration_has_an_upper_bound_named_by_its_key() {
    let file = |budget: &str, retry: &str, connect: &str, command: &str| {
        format!(
            r#"
            [capabilities.rate-limit]
            default-policy = "api"
            evaluation-budget = "{budget}"
            failure-retry-after = "{retry}"
            [capabilities.rate-limit.policies.api]
            algorithm = "fixed-window"
            limit = 10
            window = "60s"
            [pseudonymizer.keys]
            1 = "{KEY}"
            [redis]
            enabled = true
            connect-timeout = "{connect}"
            command-timeout = "{command}"
            "#
        )
    };
    jail(|jail| {
        // Valid before the bounds, and every request was then 503.
        let huge = "300000000000y";
        let listed = problems(load_file(jail, &file(huge, huge, huge, huge)));
        let got = "got 300000000000years";
        assert_eq!(
            listed,
            [
                ("capabilities.rate-limit.evaluation-budget", format!("must be at most 1m, {got}")),
                (
                    "capabilities.rate-limit.failure-retry-after",
                    format!("must be at most 1h, {got}")
                ),
                ("redis.connect-timeout", format!("must be at most 1m, {got}")),
                ("redis.command-timeout", format!("must be at most 1m, {got}")),
            ]
            .map(|(path, message)| (path.to_owned(), message))
        );
        // The bounds themselves pass.
        load_file(jail, &file("60s", "1h", "60s", "60s")).expect("every bound is valid");
    });
}

#[test]
fn an_unknown_environment_key_is_reported_too() {
    jail(|jail| {
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDR", "redis");
        assert_eq!(
            paths(AppConfig::load(&ConfigSources::new(None))),
            ["capabilities.rate-limit.providr"]
        );
    });
}

#[test]
fn bad_durations_are_rejected_with_their_path() {
    jail(|jail| {
        let file =
            BASE.replace(r#"window = "60s""#, r#"window = "60 parsecs""#) + "cleanup-grace = 5\n";
        let problems = problems(load_file(jail, &file));
        let paths: Vec<_> = problems.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "capabilities.rate-limit.policies.api.window",
                "capabilities.rate-limit.policies.api.cleanup-grace",
            ]
        );
        assert!(problems[1].1.contains("no unit"), "{problems:?}");
    });
}

#[test]
fn contract_rules_name_the_policy_field() {
    jail(|jail| {
        let file = r#"
            [capabilities.rate-limit]
            default-policy = "api"
            [capabilities.rate-limit.policies.api]
            algorithm = "fixed-window"
            limit = 0
            window = "1500us"
            revision = 0
            evaluation-dedup = { ttl = "0s" }
            [capabilities.rate-limit.policies.cost]
            algorithm = "token-bucket"
            capacity = 3
            refill-tokens = 1
            refill-period = "1s"
            maximum-cost = 4
            [capabilities.rate-limit.policies.Bad]
            algorithm = "fixed-window"
            limit = 1
            window = "1s"
        "#;
        let mut found = paths(load_file(jail, file));
        found.sort();
        assert_eq!(
            found,
            [
                "capabilities.rate-limit.policies.Bad",
                "capabilities.rate-limit.policies.api.evaluation-dedup.ttl",
                "capabilities.rate-limit.policies.api.limit",
                "capabilities.rate-limit.policies.api.revision",
                "capabilities.rate-limit.policies.api.window",
                "capabilities.rate-limit.policies.cost.maximum-cost",
            ]
        );
    });
}

#[test]
fn algorithm_parameters_must_match_the_algorithm() {
    jail(|jail| {
        let file = r#"
            [capabilities.rate-limit]
            default-policy = "api"
            [capabilities.rate-limit.policies.api]
            algorithm = "token-bucket"
            capacity = 3
            refill-period = "1s"
            window = "1s"
        "#;
        assert_eq!(
            paths(load_file(jail, file)),
            [
                "capabilities.rate-limit.policies.api.window",
                "capabilities.rate-limit.policies.api.refill-tokens",
            ]
        );
    });
}

#[test]
fn a_gcra_policy_reads_limit_period_and_burst_which_defaults_to_the_limit() {
    jail(|jail| {
        let file = r#"
            [capabilities.rate-limit]
            default-policy = "search"
            [capabilities.rate-limit.policies.search]
            algorithm = "gcra"
            limit = 10
            period = "1s"
            burst = 5
            [capabilities.rate-limit.policies.steady]
            algorithm = "gcra"
            limit = 4
            period = "1m"
        "#;
        let config = load_file(jail, file).unwrap();
        let policies = &config.capabilities.rate_limit.policies;
        let gcra =
            |limit, period, burst| Algorithm::Gcra(shared_contract::Gcra { limit, period, burst });
        assert_eq!(policies["search"].algorithm(), &gcra(10, Duration::from_secs(1), 5));
        assert_eq!(policies["steady"].algorithm(), &gcra(4, Duration::from_secs(60), 4));

        let bad = r#"
            [capabilities.rate-limit]
            default-policy = "search"
            [capabilities.rate-limit.policies.search]
            algorithm = "gcra"
            limit = 10
            window = "1s"
            burst = 0
            [capabilities.rate-limit.policies.cost]
            algorithm = "gcra"
            limit = 10
            period = "1s"
            burst = 2
            maximum-cost = 3
            [capabilities.rate-limit.policies.bucket]
            algorithm = "token-bucket"
            capacity = 3
            refill-tokens = 1
            refill-period = "1s"
            burst = 3
        "#;
        let mut found = paths(load_file(jail, bad));
        found.sort();
        assert_eq!(
            found,
            [
                "capabilities.rate-limit.policies.bucket.burst",
                "capabilities.rate-limit.policies.cost.maximum-cost",
                "capabilities.rate-limit.policies.search.period",
                "capabilities.rate-limit.policies.search.window",
            ]
        );
    });
}

#[test]
fn a_gcra_problem_is_reported_once_on_the_key_written() {
    jail(|jail| {
        // An outside pass: a left-out burst is the limit, so a bad
        // limit also showed a `burst` problem the user never wrote; and a
        // bad burst beside `maximum-cost = 0` said "must be in 1..=0".
        let file = r#"
            [capabilities.rate-limit]
            default-policy = "nought"
            [capabilities.rate-limit.policies.nought]
            algorithm = "gcra"
            limit = 0
            period = "1s"
            [capabilities.rate-limit.policies.both]
            algorithm = "gcra"
            limit = 10
            period = "1s"
            burst = 0
            maximum-cost = 0
        "#;
        let mut found = problems(load_file(jail, file));
        found.sort();
        let at = |key: &str| format!("capabilities.rate-limit.policies.{key}");
        let keys: Vec<_> = found.iter().map(|(path, _)| path.clone()).collect();
        assert_eq!(keys, [at("both.burst"), at("both.maximum-cost"), at("nought.limit")]);
        assert_eq!(found[1].1, "must be at least 1, got 0", "{found:#?}");
        assert!(found.iter().all(|(_, message)| !message.contains("1..=0")), "{found:#?}");
    });
}

#[test]
fn the_redis_provider_needs_the_redis_switch() {
    jail(|jail| {
        let file =
            format!("{BASE}\n[pseudonymizer.keys]\n1 = \"{KEY}\"\n[redis]\nenabled = false\n")
                .replace("default-policy", "provider = \"redis\"\ndefault-policy");
        assert_eq!(paths(load_file(jail, &file)), ["redis.enabled"]);
    });
}

#[test]
fn the_redis_provider_needs_a_configured_pseudonymizer_key() {
    jail(|jail| {
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__PROVIDER", "redis");
        jail.set_env("CA_SKELETON_REDIS__ENABLED", "true");
        let problems = problems(load_file(jail, BASE));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "pseudonymizer.keys");
        assert!(problems[0].1.contains("every instance"), "{problems:?}");
    });
}

#[test]
fn every_problem_is_listed_at_once() {
    jail(|jail| {
        let file = r#"
            [capabilities.rate-limit]
            provider = "redis"
            default-policy = "nope"
            evaluation-budget = "soon"
            [capabilities.rate-limit.policies.api]
            algorithm = "fixed-windw"
            limit = 5
            window = "1s"
            [redis]
            key-prefx = "x"
        "#;
        let error = load_file(jail, file).unwrap_err();
        let text = error.to_string();
        for path in [
            "capabilities.rate-limit.evaluation-budget:",
            "capabilities.rate-limit.policies.api.algorithm:",
            "capabilities.rate-limit.default-policy:",
            "redis.key-prefx:",
            "redis.enabled:",
            "pseudonymizer.keys:",
        ] {
            assert!(text.contains(path), "{path} missing from:\n{text}");
        }
        assert!(text.starts_with("invalid configuration (6 problems):"), "{text}");
    });
}

#[test]
fn keys_can_come_from_a_named_variable() {
    jail(|jail| {
        jail.set_env("PSEUDO_KEY_2", KEY);
        let file = format!(
            "{BASE}\n[pseudonymizer]\nactive-version = 2\nkeys = {{ 2 = {{ env = \"PSEUDO_KEY_2\" }} }}\n"
        );
        let config = load_file(jail, &file).unwrap();
        let key = &config.pseudonymizer.keys[&2];
        assert_eq!(key.source(), &SecretSource::Env("PSEUDO_KEY_2".into()));
        assert_eq!(key.expose(), KEY);
    });
}

#[test]
fn key_problems_name_the_key_and_never_echo_it() {
    jail(|jail| {
        let file = format!(
            "{BASE}\n[pseudonymizer]\nactive-version = 3\n[pseudonymizer.keys]\n1 = \"short-secret\"\n2 = {{ env = \"UNSET_VAR\" }}\n"
        );
        let error = load_file(jail, &file).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("pseudonymizer.keys.2.env: environment variable UNSET_VAR is not set"),
            "{text}"
        );
        assert!(text.contains("pseudonymizer.keys.1: must be at least 32 bytes, got 12"), "{text}");
        assert!(text.contains("pseudonymizer.active-version:"), "{text}");
        assert!(!text.contains("short-secret"), "{text}");
    });
}

/// A string where another type goes is named by its key and type, never
/// echoed: an export header written `"k=v"`, or a secret set to the wrong
/// variable, would be printed and logged (found from outside).
#[test]
fn a_string_of_the_wrong_type_is_never_echoed() {
    jail(|jail| {
        jail.set_env("CA_SKELETON_PSEUDONYMIZER__ACTIVE_VERSION", "env-secret-value");
        let file = format!("{BASE}\n[telemetry.otlp]\nheaders = \"x-api-key=file-secret-value\"\n");
        let text = load_file(jail, &file).unwrap_err().to_string();
        assert!(text.contains("telemetry.otlp.headers: invalid type: found a string"), "{text}");
        assert!(
            text.contains("pseudonymizer.active-version: invalid type: found a string"),
            "{text}"
        );
        assert!(!text.contains("secret-value"), "{text}");
    });
}

#[test]
fn a_digits_only_secret_from_the_environment_must_be_quoted() {
    jail(|jail| {
        // Short enough to read as an integer; the message must not echo it.
        jail.set_env("CA_SKELETON_PSEUDONYMIZER__KEYS__1", "1234567890");
        let problems = problems(load_file(jail, BASE));
        assert_eq!(problems[0].0, "pseudonymizer.keys.1");
        assert!(problems[0].1.contains("quote it"), "{problems:?}");
        assert!(!problems[0].1.contains("1234567890"), "{problems:?}");
        jail.set_env("CA_SKELETON_PSEUDONYMIZER__KEYS__1", "\"123456789012345678901234567890123\"");
        let config = load_file(jail, BASE).unwrap();
        assert_eq!(config.pseudonymizer.keys[&1].expose(), "123456789012345678901234567890123");
    });
}

#[test]
fn secrets_are_redacted_in_check_config_output_and_in_debug() {
    jail(|jail| {
        jail.set_env("REDIS_PASSWORD_VAR", "pw-from-env-var");
        let file = format!(
            r#"{BASE}
            [pseudonymizer.keys]
            1 = "{KEY}"
            [redis]
            enabled = true
            urls = ["redis://app:url-password@127.0.0.1:7001"]
            username = "app"
            password = {{ env = "REDIS_PASSWORD_VAR" }}
            "#
        );
        let config = load_file(jail, &file).unwrap();
        let rendered = config.to_redacted_toml().unwrap();
        let debug = format!("{config:?}");
        for output in [&rendered, &debug] {
            for secret in [KEY, "pw-from-env-var", "url-password"] {
                assert!(!output.contains(secret), "{secret} leaked into:\n{output}");
            }
            assert!(output.contains("[REDACTED]"), "{output}");
            assert!(output.contains("REDIS_PASSWORD_VAR"), "{output}");
        }
        assert!(rendered.contains("redis://app:[REDACTED]@127.0.0.1:7001"), "{rendered}");
        // The password the redis crate reads from a unix socket URL's query.
        let unix = file.replace(
            "redis://app:url-password@127.0.0.1:7001",
            "unix:///run/redis.sock?pass=url-password",
        );
        let config = load_file(jail, &unix).unwrap();
        for output in [config.to_redacted_toml().unwrap(), format!("{config:?}")] {
            assert!(!output.contains("url-password"), "leaked into:\n{output}");
            assert!(output.contains("unix:///run/redis.sock?pass=[REDACTED]"), "{output}");
        }
    });
}

#[test]
fn the_rendered_configuration_loads_back_to_the_same_values() {
    jail(|jail| {
        let file = format!(
            "{BASE}\n[capabilities.rate-limit.policies.slow]\nalgorithm = \"sliding-counter\"\nlimit = 7\nwindow = \"90s\"\n"
        );
        let config = load_file(jail, &file).unwrap();
        let rendered = config.to_redacted_toml().unwrap();
        let again = load_file(jail, &rendered).unwrap();
        assert_eq!(again.capabilities.rate_limit.policies, config.capabilities.rate_limit.policies);
        assert_eq!(again.server, config.server);
    });
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    jail(|_| {
        let error = AppConfig::load(&ConfigSources::new(Some("nowhere.toml".into()))).unwrap_err();
        assert!(error.to_string().contains("nowhere.toml"), "{error}");
    });
}

/// Every key a file can hold, each away from its default: what
/// `check-config` renders must load back to the same configuration, so a
/// key the reader knows but the renderer forgets (or the reverse) fails.
const EVERY_KEY: &str = r#"
[server]
listen = "0.0.0.0:9001"
shutdown-grace = "25s"
header-read-timeout = "4s"

[capabilities.rate-limit]
provider = "redis"
default-policy = "sliding"
evaluation-budget = "400ms"
failure-retry-after = "3s"
api-key-header = "x-client-key"
trusted-proxies = ["10.0.0.0/8"]
client-ip-header = "forwarded"
problem-type-base = "https://errors.example.com/rate-limit/"
client-ipv4-prefix = 24
client-ipv6-prefix = 56
operations = { "GET /api/hello" = "bucket", "POST /api/orders" = ["bucket", "sliding"] }

[capabilities.rate-limit.policies.sliding]
algorithm = "sliding-counter"
limit = 40
window = "90s"
revision = 2
maximum-cost = 4
failure-policy = "fail-closed"
cleanup-grace = "2s"
maximum-clock-regression = "4s"
evaluation-dedup = { enabled = true, ttl = "9s", max-entries = 16, max-stored-bytes = 2048 }
scope = "subject"
mode = "shadow"

[capabilities.rate-limit.policies.bucket]
algorithm = "token-bucket"
capacity = 30
refill-tokens = 3
refill-period = "2s"
evaluation-dedup = { enabled = false }

[pseudonymizer]
active-version = 4
keys = { 4 = { env = "EVERY_KEY_PSEUDONYM" } }

[redis]
enabled = true
topology = "sentinel"
urls = []
username = "limiter"
password = { env = "EVERY_KEY_PASSWORD" }
key-prefix = "svc:rl:"
connect-timeout = "2s"
command-timeout = "120ms"
script-lane = { max-in-flight = 32 }
sentinels = ["10.0.0.1:26379", "10.0.0.2:26379"]
master-name = "limits"
sentinel-username = "watcher"
sentinel-password = { env = "EVERY_KEY_SENTINEL_PASSWORD" }
wait-replicas = 2
wait-timeout = "40ms"
wait-connections = 4
deny-cache = { enabled = false, max-entries = 500, max-age = "250ms" }

[admin]
listen = "127.0.0.1:9091"
token = { env = "EVERY_KEY_ADMIN_TOKEN" }

[envoy-rls]
listen = "127.0.0.1:9081"
[[envoy-rls.rules]]
domain = "edge"
descriptor = ["remote_address"]
policies = "bucket"
[[envoy-rls.rules]]
domain = "edge"
descriptor = ["generic_key=checkout", "remote_address", "path"]
subject = ["remote_address", "path"]
policies = ["sliding", "bucket"]
"#;

/// [`EVERY_KEY`] on a cluster: the keys a Sentinel file leaves empty.
fn every_cluster_key() -> String {
    let sentinel_only = [
        "sentinels = [\"10.0.0.1:26379\", \"10.0.0.2:26379\"]\n",
        "master-name = \"limits\"\n",
        "sentinel-username = \"watcher\"\n",
        "sentinel-password = { env = \"EVERY_KEY_SENTINEL_PASSWORD\" }\n",
    ];
    let mut file = EVERY_KEY.replace("topology = \"sentinel\"", "topology = \"cluster\"").replace(
        "urls = []",
        "urls = [\"redis://10.0.0.1:7000\", \"redis://u:secret@10.0.0.2:7000\"]",
    );
    for line in sentinel_only {
        assert!(file.contains(line), "{line}");
        file = file.replace(line, "");
    }
    file
}

/// The variables [`EVERY_KEY`]'s secrets are read from.
fn set_every_key_secrets(jail: &mut Jail) {
    jail.set_env("EVERY_KEY_PSEUDONYM", KEY);
    jail.set_env("EVERY_KEY_PASSWORD", "every-key-password");
    jail.set_env("EVERY_KEY_ADMIN_TOKEN", ADMIN_TOKEN);
    jail.set_env("EVERY_KEY_SENTINEL_PASSWORD", "every-key-sentinel-password");
}

#[test]
fn what_check_config_renders_loads_back_to_the_same_configuration() {
    jail(|jail| {
        set_every_key_secrets(jail);
        for file in [EVERY_KEY.to_owned(), every_cluster_key()] {
            let config = load_file(jail, &file).unwrap();
            let rendered = config.to_redacted_toml().unwrap();
            let again = load_file(jail, &rendered).unwrap();
            // Debug prints every field (secrets by their source only).
            assert_eq!(format!("{again:?}"), format!("{config:?}"), "rendered:\n{rendered}");
        }
        let config = load_file(jail, EVERY_KEY).unwrap();
        // And none of them is at its default, so a dropped key would show.
        let defaults = AppConfig::load(&ConfigSources::new(None)).unwrap();
        for (field, loaded, default) in [
            ("server", format!("{:?}", config.server), format!("{:?}", defaults.server)),
            ("redis", format!("{:?}", config.redis), format!("{:?}", defaults.redis)),
            ("admin", format!("{:?}", config.admin), format!("{:?}", defaults.admin)),
            ("envoy-rls", format!("{:?}", config.envoy_rls), format!("{:?}", defaults.envoy_rls)),
        ] {
            assert_ne!(loaded, default, "{field} is at its default");
        }
    });
}

#[test]
fn unset_keys_take_the_owners_defaults() {
    jail(|_| {
        let config = AppConfig::load(&ConfigSources::new(None)).unwrap();
        let rate_limit = &config.capabilities.rate_limit;
        let edge = adapter_web::EdgeSettings::default();
        assert_eq!(rate_limit.edge.evaluation_budget, edge.evaluation_budget);
        assert_eq!(rate_limit.edge.failure_retry_after, edge.failure_retry_after);
        assert_eq!(rate_limit.edge.api_key_header, edge.api_key_header);
        assert_eq!(rate_limit.edge.client_ip_header, edge.client_ip_header);
        assert_eq!(rate_limit.edge.problem_type_base, edge.problem_type_base);
        let settings = config.redis.provider_settings(edge.failure_retry_after);
        let owner = adapter_redis::RedisSettings::default();
        assert_eq!(format!("{settings:?}"), format!("{owner:?}"));
        let demo = &rate_limit.policies[adapter_web::DEFAULT_POLICY];
        let builder_default =
            RateLimitPolicy::builder(adapter_web::DEFAULT_POLICY, demo.algorithm().clone())
                .build()
                .unwrap();
        assert_eq!(*demo, builder_default);
    });
}

#[test]
fn redis_rules_come_from_the_provider_with_their_key_paths() {
    jail(|jail| {
        let file = format!(
            "{BASE}\n[pseudonymizer.keys]\n1 = \"{KEY}\"\n[redis]\nenabled = true\ntopology = \"cluster\"\n\
             urls = [\"redis://127.0.0.1:7000\", \"http://127.0.0.1:7001\"]\nkey-prefix = \"\"\n\
             command-timeout = \"0ms\"\nscript-lane = {{ max-in-flight = 0 }}\n\
             deny-cache = {{ max-entries = 0, size = 3 }}\n"
        )
        .replace("default-policy", "provider = \"redis\"\ndefault-policy");
        assert_eq!(
            paths(load_file(jail, &file)),
            [
                // Read first, so reported first: an unknown key.
                "redis.deny-cache.size",
                "redis.urls.1",
                "redis.key-prefix",
                "redis.command-timeout",
                "redis.script-lane.max-in-flight",
                "redis.deny-cache.max-entries",
            ]
        );
    });
}

#[test]
fn sentinel_and_wait_rules_come_from_the_provider_with_their_key_paths() {
    jail(|jail| {
        let base = format!("{BASE}\n[pseudonymizer.keys]\n1 = \"{KEY}\"\n")
            .replace("default-policy", "provider = \"redis\"\ndefault-policy");
        let file = format!(
            "{base}[redis]\nenabled = true\ntopology = \"sentinel\"\n\
             sentinels = [\"10.0.0.1:26379\", \"nowhere\"]\nmaster-name = \"\"\n\
             sentinel-username = \"watcher\"\nwait-replicas = 1\nwait-timeout = \"250ms\"\n\
             wait-connections = 0\n"
        );
        assert_eq!(
            paths(load_file(jail, &file)),
            [
                "redis.sentinels.1",
                "redis.master-name",
                "redis.sentinel-password",
                "redis.wait-timeout",
                "redis.wait-connections",
            ]
        );
        // Sentinel takes no URL; no sentinel at all is named too.
        let file = format!(
            "{base}[redis]\nenabled = true\ntopology = \"sentinel\"\nurls = [\"redis://h:1\"]\n"
        );
        assert_eq!(paths(load_file(jail, &file)), ["redis.urls", "redis.sentinels"]);
        // And a sentinel list on another topology is not silently ignored.
        let file = format!("{base}[redis]\nenabled = true\nsentinels = [\"h:1\"]\n");
        assert_eq!(paths(load_file(jail, &file)), ["redis.sentinels"]);
    });
}

#[test]
fn unknown_names_list_the_names_from_their_enums() {
    jail(|jail| {
        let file = BASE.replace("default-policy", "provider = \"postgres\"\ndefault-policy")
            + "\n[redis]\ntopology = \"replicated\"\n";
        let problems = problems(load_file(jail, &file));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(problems[0].0, "capabilities.rate-limit.provider");
        assert!(problems[0].1.contains(r#""memory", "redis", "disabled""#), "{problems:?}");
        assert_eq!(problems[1].0, "redis.topology");
        assert!(problems[1].1.contains(r#""standalone", "cluster", "sentinel""#), "{problems:?}");
    });
}

/// Two policies for the set tests: a burst and an hourly budget.
const SETS: &str = r#"
[capabilities.rate-limit]
default-policy = ["burst", "hourly"]

[capabilities.rate-limit.policies.burst]
algorithm = "token-bucket"
capacity = 10
refill-tokens = 10
refill-period = "1s"

[capabilities.rate-limit.policies.hourly]
algorithm = "fixed-window"
limit = 1000
window = "1h"
scope = "subject"
mode = "shadow"
"#;

#[test]
fn a_policy_set_is_a_list_or_one_id_and_policies_carry_scope_and_mode() {
    jail(|jail| {
        let file = format!(
            "{SETS}\n[capabilities.rate-limit.operations]\n\"GET /api/hello\" = \"burst\"\n\
             \"POST /api/orders\" = [\"hourly\", \"burst\"]\n"
        );
        let config = load_file(jail, &file).unwrap();
        let rate_limit = &config.capabilities.rate_limit;
        assert_eq!(rate_limit.default_policy, ["burst", "hourly"]);
        assert_eq!(rate_limit.operations["GET /api/hello"], ["burst"]);
        assert_eq!(rate_limit.operations["POST /api/orders"], ["hourly", "burst"]);
        let hourly = &rate_limit.policies["hourly"];
        assert_eq!((hourly.scope(), hourly.mode()), (PolicyScope::Subject, PolicyMode::Shadow));
        let burst = &rate_limit.policies["burst"];
        assert_eq!((burst.scope(), burst.mode()), (PolicyScope::Operation, PolicyMode::Enforce));
    });
}

#[test]
fn every_policy_set_problem_is_named_at_once() {
    jail(|jail| {
        let nine: Vec<String> = (0..9).map(|n| format!("\"p{n}\"")).collect();
        let file = format!(
            "{SETS}\n[capabilities.rate-limit.operations]\n\"GET /empty\" = []\n\
             \"GET /twice\" = [\"burst\", \"burst\"]\n\"GET /unknown\" = [\"burst\", \"nope\"]\n\
             \"GET /many\" = [{}]\n",
            nine.join(", ")
        )
        .replace(
            "refill-period = \"1s\"",
            "refill-period = \"1s\"\nscope = \"global\"\nmode = \"dry-run\"",
        );
        let problems = problems(load_file(jail, &file));
        let paths: Vec<_> = problems.iter().map(|(path, _)| path.as_str()).collect();
        for expected in [
            "capabilities.rate-limit.operations.\"GET /empty\"",
            "capabilities.rate-limit.operations.\"GET /twice\"",
            "capabilities.rate-limit.operations.\"GET /unknown\"",
            "capabilities.rate-limit.operations.\"GET /many\"",
            "capabilities.rate-limit.policies.burst.scope",
            "capabilities.rate-limit.policies.burst.mode",
        ] {
            assert!(paths.contains(&expected), "{expected} missing from {problems:#?}");
        }
        let message = |path: &str| {
            problems
                .iter()
                .filter(|(at, _)| at.contains(path))
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join(" | ")
        };
        assert!(message("/empty").contains("at least one"), "{problems:#?}");
        assert!(message("/twice").contains("listed twice"), "{problems:#?}");
        assert!(message("/unknown").contains("\"nope\""), "{problems:#?}");
        assert!(message("/many").contains("at most 8"), "{problems:#?}");
        assert!(message("burst.scope").contains("\"operation\", \"subject\""), "{problems:#?}");
    });
}

#[test]
fn an_operation_that_names_no_served_route_is_refused() {
    jail(|jail| {
        let file = format!(
            "{SETS}\n[capabilities.rate-limit.operations]\n\"GET /api/hello\" = \"burst\"\n\
             \"GET /api/helo\" = \"burst\"\n"
        );
        let config = load_file(jail, &file).unwrap();
        let served = crate::routes::api().operations().clone();
        let error = config.check_operations(&served).unwrap_err();
        let BootstrapError::InvalidConfig(problems) = error else { panic!("{error}") };
        let found: Vec<_> =
            problems.iter().map(|p| (p.path.to_string(), p.message.clone())).collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "capabilities.rate-limit.operations.\"GET /api/helo\"");
        assert!(found[0].1.contains("GET /api/hello"), "the served routes are listed: {found:?}");
        // With its sources, the problem names the file and line (found from outside).
        let sources = ConfigSources::new(Some(PathBuf::from("app.toml")));
        let error = config.check_operations_from(&served, &sources).unwrap_err();
        let BootstrapError::InvalidConfig(problems) = error else { panic!("{error}") };
        let line = file.lines().position(|line| line.contains("helo")).unwrap() + 1;
        let source = problems.iter().next().and_then(|p| p.source.clone());
        assert_eq!(source.as_deref(), Some(format!("in app.toml, line {line}").as_str()));
    });
}

#[test]
fn a_head_mapping_is_accepted_where_the_router_serves_the_get() {
    jail(|jail| {
        let file = format!(
            "{SETS}\n[capabilities.rate-limit.operations]\n\"HEAD /api/orders/{{id}}\" = \"burst\"\n\
             \"HEAD /api/orders\" = \"burst\"\n"
        );
        let config = load_file(jail, &file).unwrap();
        let served = crate::routes::api().operations().clone();
        let error = config.check_operations(&served).unwrap_err();
        let BootstrapError::InvalidConfig(problems) = error else { panic!("{error}") };
        let found: Vec<_> = problems.iter().map(|p| p.path.to_string()).collect();
        // `/api/orders` serves only POST, so no HEAD either.
        assert_eq!(found, ["capabilities.rate-limit.operations.\"HEAD /api/orders\""]);
    });
}

#[test]
fn prefixes_default_to_a_host_for_ipv4_and_a_64_for_ipv6() {
    jail(|_| {
        let config = AppConfig::load(&ConfigSources::new(None)).unwrap();
        let rate_limit = &config.capabilities.rate_limit;
        assert_eq!(
            (rate_limit.edge.client_ipv4_prefix, rate_limit.edge.client_ipv6_prefix),
            (32, 64)
        );
    });
}

#[test]
fn prefixes_out_of_range_are_named_by_their_keys() {
    jail(|jail| {
        let file = BASE.replace(
            "default-policy",
            "client-ipv4-prefix = 33\nclient-ipv6-prefix = 0\ndefault-policy",
        );
        let mut found = paths(load_file(jail, &file));
        found.sort();
        assert_eq!(
            found,
            [
                "capabilities.rate-limit.client-ipv4-prefix",
                "capabilities.rate-limit.client-ipv6-prefix"
            ]
        );
    });
}

#[test]
fn a_file_only_source_ignores_the_environment() {
    jail(|jail| {
        jail.create_file("app.toml", BASE).expect("write config");
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__POLICIES__API__LIMIT", "42");
        let layered = AppConfig::load(&ConfigSources::new(Some("app.toml".into()))).unwrap();
        let alone = AppConfig::load(&ConfigSources::file_only("app.toml".into())).unwrap();
        let limit =
            |config: &AppConfig| match config.capabilities.rate_limit.policies["api"].algorithm() {
                Algorithm::FixedWindow(shared_contract::FixedWindow { limit, .. }) => *limit,
                other => panic!("a fixed window, not {other:?}"),
            };
        // The same file: the variable counts in one and not in the other.
        assert_eq!((limit(&layered), limit(&alone)), (42, 10));
    });
}

#[test]
fn the_admin_listener_is_off_by_default_and_needs_a_long_token_when_on() {
    jail(|jail| {
        let config = load_file(jail, BASE).unwrap();
        assert_eq!((config.admin.listen, config.admin.token.is_none()), (None, true));
        let listening = format!("{BASE}\n[admin]\nlisten = \"127.0.0.1:9091\"\n");
        let missing = problems(load_file(jail, &listening));
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert_eq!(missing[0].0, "admin.token");
        assert!(missing[0].1.starts_with("required when admin.listen is set"), "{missing:?}");
        let short = format!("{listening}token = \"{}\"\n", &ADMIN_TOKEN[..31]);
        let too_short = problems(load_file(jail, &short));
        assert_eq!(
            too_short,
            [("admin.token".to_owned(), "must be at least 32 bytes, got 31".to_owned())]
        );
        jail.set_env("ADMIN_TOKEN_VAR", ADMIN_TOKEN);
        let from_env = format!("{listening}token = {{ env = \"ADMIN_TOKEN_VAR\" }}\n");
        let config = load_file(jail, &from_env).unwrap();
        assert_eq!(config.admin.listen, Some("127.0.0.1:9091".parse().unwrap()));
        assert_eq!(
            config.admin.token.map(|token| token.expose().to_owned()),
            Some(ADMIN_TOKEN.into())
        );
    });
}

#[test]
fn the_admin_listener_never_takes_the_public_port() {
    jail(|jail| {
        let file = format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\n{BASE}\n[admin]\nlisten = \"127.0.0.1:8080\"\n\
             token = \"{ADMIN_TOKEN}\"\nport = 1\n"
        );
        assert_eq!(paths(load_file(jail, &file)), ["admin.port", "admin.listen"]);
    });
}

#[test]
fn an_admin_token_http_cannot_carry_stops_start_up_naming_the_key() {
    jail(|jail| {
        let listening = format!("{BASE}\n[admin]\nlisten = \"127.0.0.1:9091\"\n");
        // A file-based secret's trailing newline, a space inside, a
        // non-ASCII letter: none survives an `Authorization` header.
        for token in
            [format!("{ADMIN_TOKEN}\n"), format!("{ADMIN_TOKEN} x"), format!("{ADMIN_TOKEN}é")]
        {
            jail.set_env("ADMIN_TOKEN_VAR", &token);
            let file = format!("{listening}token = {{ env = \"ADMIN_TOKEN_VAR\" }}\n");
            let found = problems(load_file(jail, &file));
            assert_eq!(found.len(), 1, "{found:?}");
            assert_eq!(found[0].0, "admin.token");
            assert!(found[0].1.contains("visible ASCII"), "{found:?}");
            assert!(!found[0].1.contains(ADMIN_TOKEN), "the token is never printed: {found:?}");
            // The secret file hint only where a trailing newline is the cause.
            let hinted = found[0].1.contains("trailing newline");
            assert_eq!(hinted, token.ends_with('\n'), "{found:?}");
        }
        // Every visible ASCII character is carried as is.
        let visible = "!\"#$%&'()*+,-./0123456789:;<=>?@AZaz[]^_`{|}~";
        jail.set_env("ADMIN_TOKEN_VAR", visible);
        let file = format!("{listening}token = {{ env = \"ADMIN_TOKEN_VAR\" }}\n");
        let config = load_file(jail, &file).unwrap();
        assert_eq!(config.admin.token.map(|token| token.expose().to_owned()), Some(visible.into()));
    });
}

#[test]
fn the_listeners_timeouts_default_to_10s_and_must_be_above_zero_and_bounded() {
    jail(|jail| {
        let config = load_file(jail, BASE).unwrap();
        let server = &config.server;
        assert_eq!(
            (server.shutdown_grace, server.header_read_timeout),
            (Duration::from_secs(10), Duration::from_secs(10))
        );
        let set = |grace: &str, header: &str| {
            format!(
                "[server]\nshutdown-grace = \"{grace}\"\nheader-read-timeout = \"{header}\"\n{BASE}"
            )
        };
        let config = load_file(jail, &set("2s", "500ms")).unwrap();
        assert_eq!(
            (config.server.shutdown_grace, config.server.header_read_timeout),
            (Duration::from_secs(2), Duration::from_millis(500))
        );
        assert_eq!(
            problems(load_file(jail, &set("0s", "2h"))),
            [
                ("server.shutdown-grace".to_owned(), "must be more than 0".to_owned()),
                ("server.header-read-timeout".to_owned(), "must be at most 1h, got 2h".to_owned()),
            ]
        );
        jail.set_env("CA_SKELETON_SERVER__SHUTDOWN_GRACE", "10");
        assert_eq!(paths(load_file(jail, BASE)), ["server.shutdown-grace"]);
    });
}

/// The example files show a default as a comment, never as a value that
/// could drift from its owner's default.
#[test]
fn the_example_files_set_no_key_to_its_default() {
    jail(|_| {
        let defaults = AppConfig::load(&ConfigSources::new(None)).unwrap();
        let defaults = render::to_table(&defaults, render::Secrets::Redacted);
        let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
        let mut files = 0;
        for entry in std::fs::read_dir(&examples).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|extension| extension != "toml") {
                continue;
            }
            files += 1;
            let file: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
            let mut at_default = Vec::new();
            leaves_at_default(&file, &defaults, &mut Vec::new(), &mut at_default);
            assert_eq!(at_default, Vec::<String>::new(), "{}", path.display());
        }
        assert!(files >= 5, "{files} example files");
    });
}

/// The key paths of `file` whose value is the one in `defaults`.
fn leaves_at_default(
    file: &toml::Table,
    defaults: &toml::Table,
    path: &mut Vec<String>,
    out: &mut Vec<String>,
) {
    for (key, value) in file {
        let Some(default) = defaults.get(key) else { continue };
        path.push(key.clone());
        match (value, default) {
            (toml::Value::Table(file), toml::Value::Table(defaults)) => {
                leaves_at_default(file, defaults, path, out);
            }
            (value, default) if value == default => out.push(path.join(".")),
            _ => {}
        }
        path.pop();
    }
}

/// The Redis keys are read from the provider's own settings type: nested
/// keys come from the environment too, and each bad value is named by its
/// full key path, all at once.
#[test]
fn redis_keys_read_from_the_environment_and_each_bad_one_is_named() {
    jail(|jail| {
        jail.set_env("CA_SKELETON_REDIS__SCRIPT_LANE__MAX_IN_FLIGHT", "8");
        jail.set_env("CA_SKELETON_REDIS__DENY_CACHE__ENABLED", "false");
        jail.set_env("CA_SKELETON_REDIS__WAIT_TIMEOUT", "50ms");
        let config = AppConfig::load(&ConfigSources::new(None)).unwrap();
        let settings = &config.redis.settings;
        assert_eq!(settings.script_lane.max_in_flight, 8);
        assert!(!settings.deny_cache.enabled);
        assert_eq!(settings.wait_timeout, Duration::from_millis(50));
        jail.clear_env();
        let file = "[redis]\nconnect-timeout = 5\nwait-connections = \"many\"\nscript-lane = 3\n\
                    deny-cache = { enabled = \"yes\" }\nmaster-name = [1]\n";
        let mut named = paths(load_file(jail, file));
        named.sort();
        assert_eq!(
            named,
            [
                "redis.connect-timeout",
                "redis.deny-cache.enabled",
                "redis.master-name",
                "redis.script-lane",
                "redis.wait-connections",
            ]
        );
    });
}

/// The provider names each broken rule by its field; the key that field
/// gives is a key of the `[redis]` table as it is read and rendered, so a
/// problem is never reported at a key no file can hold.
#[test]
fn every_redis_field_names_a_key_of_the_redis_table() {
    use adapter_redis::RedisField;
    jail(|jail| {
        set_every_key_secrets(jail);
        let config = load_file(jail, EVERY_KEY).unwrap();
        let table = render::to_table(&config, render::Secrets::Redacted);
        let redis = table["redis"].as_table().unwrap();
        for field in [
            RedisField::Urls,
            RedisField::Url(0),
            RedisField::KeyPrefix,
            RedisField::ConnectTimeout,
            RedisField::CommandTimeout,
            RedisField::ScriptLaneMaxInFlight,
            RedisField::FailureRetryAfter,
            RedisField::Sentinels,
            RedisField::Sentinel(0),
            RedisField::MasterName,
            RedisField::SentinelPassword,
            RedisField::WaitTimeout,
            RedisField::WaitConnections,
            RedisField::DenyCacheMaxEntries,
            RedisField::DenyCacheMaxAge,
        ] {
            // Exhaustive: a new field fails to compile until it is listed.
            match field {
                // The edge's key, reported there.
                RedisField::FailureRetryAfter => continue,
                RedisField::Urls
                | RedisField::Url(_)
                | RedisField::KeyPrefix
                | RedisField::ConnectTimeout
                | RedisField::CommandTimeout
                | RedisField::ScriptLaneMaxInFlight
                | RedisField::Sentinels
                | RedisField::Sentinel(_)
                | RedisField::MasterName
                | RedisField::SentinelPassword
                | RedisField::WaitTimeout
                | RedisField::WaitConnections
                | RedisField::DenyCacheMaxEntries
                | RedisField::DenyCacheMaxAge => {}
            }
            let (tables, leaf) =
                field.key().rsplit_once('.').map_or((None, field.key()), |(t, l)| (Some(t), l));
            let holder = tables
                .into_iter()
                .flat_map(|t| t.split('.'))
                .try_fold(redis, |table, key| table.get(key).and_then(toml::Value::as_table));
            assert!(
                holder.is_some_and(|table| table.contains_key(leaf)),
                "{field:?}: {}",
                field.key()
            );
        }
    });
}

#[test]
fn every_edge_setting_is_a_rate_limit_key_read_and_rendered() {
    jail(|jail| {
        set_every_key_secrets(jail);
        let config = load_file(jail, EVERY_KEY).unwrap();
        let rendered: toml::Table = config.to_redacted_toml().unwrap().parse().unwrap();
        let limits = &rendered["capabilities"]["rate-limit"];
        let toml::Value::Table(defaults) =
            toml::Value::try_from(adapter_web::EdgeSettings::default()).unwrap()
        else {
            panic!("EdgeSettings renders as a table");
        };
        for (key, default) in &defaults {
            // EVERY_KEY sets each one away from its default.
            let value = limits.get(key).unwrap_or_else(|| panic!("{key} is not rendered"));
            assert_ne!(value, default, "{key} is at its default");
        }
    });
}

#[test]
fn an_admin_token_variable_that_is_not_set_is_named_by_its_env_key() {
    jail(|jail| {
        let file = format!(
            "{BASE}\n[admin]\nlisten = \"127.0.0.1:9091\"\ntoken = {{ env = \"UNSET_ADMIN_VAR\" }}\n"
        );
        assert_eq!(
            problems(load_file(jail, &file)),
            [
                (
                    "admin.token.env".to_owned(),
                    "environment variable UNSET_ADMIN_VAR is not set".to_owned()
                ),
                (
                    "admin.token".to_owned(),
                    "required when admin.listen is set (add token = { env = \"RATE_LIMIT_ADMIN_TOKEN\" })"
                        .to_owned()
                ),
            ]
        );
    });
}

#[test]
fn the_pseudonymizer_table_defaults_to_version_1_and_names_each_problem() {
    jail(|jail| {
        let config = load_file(jail, BASE).unwrap();
        assert_eq!(config.pseudonymizer.active_version, 1);
        let file =
            format!("{BASE}\n[pseudonymizer]\nactive-version = \"two\"\nactive-versoin = 2\n");
        let mut found = paths(load_file(jail, &file));
        found.sort();
        assert_eq!(found, ["pseudonymizer.active-version", "pseudonymizer.active-versoin"]);
    });
}

#[test]
fn trusted_proxies_that_trust_every_address_are_refused_by_key() {
    jail(|jail| {
        for list in
            [r#"["0.0.0.0/0"]"#, r#"["::/0", "10.0.0.0/8"]"#, r#"["0.0.0.0/1", "128.0.0.0/1"]"#]
        {
            let file = BASE
                .replace("default-policy", &format!("trusted-proxies = {list}\ndefault-policy"));
            let found = problems(load_file(jail, &file));
            assert_eq!(found.len(), 1, "{list}: {found:?}");
            assert_eq!(found[0].0, "capabilities.rate-limit.trusted-proxies", "{list}");
            assert!(found[0].1.contains("cover every address"), "{list}: {}", found[0].1);
        }
        // Half of the IPv4 space is a (wide) list of proxies, not everyone.
        let file =
            BASE.replace("default-policy", "trusted-proxies = [\"0.0.0.0/1\"]\ndefault-policy");
        assert!(load_file(jail, &file).is_ok());
    });
}

#[test]
fn the_client_ip_header_is_one_of_two_named_by_its_key() {
    jail(|jail| {
        for (value, expected) in [
            ("x-forwarded-for", adapter_web::ClientIpHeader::XForwardedFor),
            ("Forwarded", adapter_web::ClientIpHeader::Forwarded),
        ] {
            let file = BASE.replace(
                "default-policy",
                &format!("client-ip-header = \"{value}\"\ndefault-policy"),
            );
            let config = load_file(jail, &file).unwrap();
            assert_eq!(config.capabilities.rate_limit.edge.client_ip_header, expected);
        }
        let file =
            BASE.replace("default-policy", "client-ip-header = \"x-real-ip\"\ndefault-policy");
        let found = problems(load_file(jail, &file));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "capabilities.rate-limit.client-ip-header");
        assert!(found[0].1.contains("\"x-forwarded-for\" or \"forwarded\""), "{}", found[0].1);
    });
}

#[test]
fn a_bad_trusted_proxy_is_named_by_its_index() {
    jail(|jail| {
        let file = BASE.replace(
            "default-policy",
            "trusted-proxies = [\"10.0.0.0/8\", \"10.0.0.0/33\"]\ndefault-policy",
        );
        assert_eq!(
            problems(load_file(jail, &file)),
            [(
                "capabilities.rate-limit.trusted-proxies.1".to_owned(),
                "\"10.0.0.0/33\" is not a CIDR like \"10.0.0.0/8\" or an IP address".to_owned()
            )]
        );
    });
}

#[test]
fn degraded_mode_is_off_by_default_and_reads_over_redis() {
    jail(|jail| {
        let config = load_file(jail, BASE).unwrap();
        assert_eq!(
            config.capabilities.rate_limit.degraded,
            DegradedConfig { enabled: false, instances: None }
        );
        let file = format!(
            "{BASE}\n[capabilities.rate-limit.degraded]\nenabled = true\ninstances = 4\n\
             [pseudonymizer.keys]\n1 = \"{KEY}\"\n[redis]\nenabled = true\n"
        )
        .replace("default-policy", "provider = \"redis\"\ndefault-policy");
        let config = load_file(jail, &file).unwrap();
        assert_eq!(
            config.capabilities.rate_limit.degraded,
            DegradedConfig { enabled: true, instances: Some(4) }
        );
        // check-config shows it.
        let rendered = config.to_redacted_toml().unwrap();
        assert!(rendered.contains("[capabilities.rate-limit.degraded]"), "{rendered}");
    });
}

/// The example section: two rules of one domain, the second with
/// a fixed entry and an explicit subject.
const RLS: &str = r#"
[capabilities.rate-limit.policies.per-ip]
algorithm = "fixed-window"
limit = 10
window = "1s"

[capabilities.rate-limit.policies.checkout-burst]
algorithm = "token-bucket"
capacity = 5
refill-tokens = 1
refill-period = "1s"

[envoy-rls]
listen = "127.0.0.1:8081"

[[envoy-rls.rules]]
domain = "edge"
descriptor = ["remote_address"]
policies = "per-ip"

[[envoy-rls.rules]]
domain = "edge"
descriptor = ["generic_key=checkout", "remote_address"]
subject = "remote_address"
policies = ["checkout-burst", "per-ip"]
"#;

#[test]
fn the_envoy_rls_section_is_off_by_default_and_reads_its_rules_in_order() {
    jail(|jail| {
        let defaults = AppConfig::load(&ConfigSources::new(None)).unwrap();
        assert_eq!(defaults.envoy_rls, EnvoyRlsConfig::default());
        assert_eq!(defaults.envoy_rls.listen, None);
        let file = format!("{BASE}{RLS}");
        let config = load_file(jail, &file).unwrap();
        let rls = &config.envoy_rls;
        assert_eq!(rls.listen, Some("127.0.0.1:8081".parse().unwrap()));
        assert_eq!(rls.rules.len(), 2);
        assert_eq!(rls.rules[0].domain, "edge");
        assert_eq!(rls.rules[0].policies, ["per-ip"]);
        assert_eq!(rls.rules[0].subject, None);
        assert_eq!(rls.rules[0].subject_keys(), ["remote_address"]);
        let second = &rls.rules[1];
        assert_eq!(
            second.entries().collect::<Vec<_>>(),
            [("generic_key", Some("checkout")), ("remote_address", None)]
        );
        assert_eq!(second.subject_keys(), ["remote_address"]);
        assert_eq!(second.policies, ["checkout-burst", "per-ip"]);
        // check-config renders the section, and it loads back the same.
        let rendered = config.to_redacted_toml().unwrap();
        assert!(rendered.contains("[envoy-rls]"), "{rendered}");
        assert!(rendered.contains("[[envoy-rls.rules]]"), "{rendered}");
        let again = load_file(jail, &rendered).unwrap();
        assert_eq!(again.envoy_rls, config.envoy_rls);
    });
}

#[test]
fn telemetry_otlp_is_off_by_default_and_read_with_secret_headers() {
    jail(|jail| {
        let config = load_file(jail, BASE).unwrap();
        assert_eq!(config.telemetry.otlp.endpoint, None);
        jail.set_env("OTLP_TEST_KEY", "hosted-collector-api-key");
        let file = format!(
            "{BASE}[telemetry.otlp]\nendpoint = \"http://collector.example:4318\"\n\
             service-name = \"edge\"\nsample-ratio = 0.25\ntimeout = \"500ms\"\n\
             headers = {{ x-api-key = {{ env = \"OTLP_TEST_KEY\" }}, x-team = \"edge\" }}\n"
        );
        let config = load_file(jail, &file).unwrap();
        let otlp = &config.telemetry.otlp;
        assert_eq!(otlp.endpoint.as_deref(), Some("http://collector.example:4318"));
        assert_eq!(otlp.service_name, "edge");
        assert_eq!(otlp.sample_ratio, 0.25);
        assert_eq!(otlp.timeout, Duration::from_millis(500));
        assert_eq!(otlp.headers["x-api-key"].expose(), "hosted-collector-api-key");
        assert_eq!(otlp.headers["x-api-key"].source(), &SecretSource::Env("OTLP_TEST_KEY".into()));
        let printed = config.to_redacted_toml().unwrap();
        assert!(!printed.contains("hosted-collector-api-key"), "{printed}");
        assert!(printed.contains("[telemetry.otlp]"), "{printed}");
        // TLS to a hosted collector (rustls).
        let file = format!("{BASE}[telemetry.otlp]\nendpoint = \"https://collector.example\"\n");
        let config = load_file(jail, &file).unwrap();
        assert_eq!(config.telemetry.otlp.endpoint.as_deref(), Some("https://collector.example"));
    });
}

#[test]
fn degraded_mode_without_redis_or_instances_stops_start_up_naming_both_keys() {
    jail(|jail| {
        let file = format!("{BASE}\n[capabilities.rate-limit.degraded]\nenabled = true\n");
        let problems = problems(load_file(jail, &file));
        let paths: Vec<_> = problems.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(
            paths,
            [
                // Read first, so reported first.
                "capabilities.rate-limit.degraded.instances",
                "capabilities.rate-limit.degraded.enabled",
            ]
        );
        assert!(problems[0].1.starts_with("missing"), "{problems:?}");
        assert!(problems[1].1.contains("provider = \"memory\""), "{problems:?}");
        // The same on `disabled`; and a bad value or an unknown key is named.
        let file = format!(
            "{BASE}\n[capabilities.rate-limit.degraded]\nenabled = true\ninstances = -2\nshare = 1\n"
        )
        .replace("default-policy", "provider = \"disabled\"\ndefault-policy");
        assert_eq!(
            self::paths(load_file(jail, &file)),
            [
                // Once each, in reading order: the bad value, the unknown
                // key, then the rule.
                "capabilities.rate-limit.degraded.instances",
                "capabilities.rate-limit.degraded.share",
                "capabilities.rate-limit.degraded.enabled",
            ]
        );
    });
}

#[test]
fn every_envoy_rls_problem_is_named_by_its_key_at_once() {
    jail(|jail| {
        let file = format!(
            r#"{BASE}
[envoy-rls]
listen = "localhost:80:80"
[[envoy-rls.rules]]
domain = ""
descriptor = ["remote_address", "", "remote_address"]
policies = ["api", "nope"]
[[envoy-rls.rules]]
domain = "edge"
descriptor = ["generic_key=checkout", "remote_address"]
subject = ["generic_key", "path"]
policies = "api"
[[envoy-rls.rules]]
domain = "edge"
descriptor = ["generic_key=checkout", "remote_address"]
policies = []
[[envoy-rls.rules]]
domain = "edge"
descriptor = []
polices = "api"
"#
        );
        let found = problems(load_file(jail, &file));
        let paths: Vec<&str> = found.iter().map(|(path, _)| path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "envoy-rls.listen",
                "envoy-rls.rules.3.polices",
                "envoy-rls.rules.0.domain",
                "envoy-rls.rules.0.descriptor.1",
                "envoy-rls.rules.0.policies",
                "envoy-rls.rules.1.subject",
                "envoy-rls.rules.1.subject",
                "envoy-rls.rules.2.policies",
                "envoy-rls.rules.2.descriptor",
                "envoy-rls.rules.3.descriptor",
                "envoy-rls.rules.3.policies",
            ],
            "{found:#?}"
        );
        let message = |at: usize| found[at].1.as_str();
        assert!(message(3).contains("must not be empty"), "{}", message(3));
        assert!(message(4).contains("\"nope\" is not a policy"), "{}", message(4));
        assert!(message(5).contains("\"generic_key\" has a fixed value"), "{}", message(5));
        assert!(message(6).contains("\"path\" is not an entry"), "{}", message(6));
        assert!(message(8).contains("envoy-rls.rules.1"), "{}", message(8));
    });
}

#[test]
fn an_unlimited_rule_has_no_policies_and_a_rule_has_one_of_the_two() {
    jail(|jail| {
        let rule = |body: &str| {
            format!(
                "{BASE}[[envoy-rls.rules]]\ndomain = \"edge\"\n\
                 descriptor = [\"generic_key=health\", \"remote_address\"]\n{body}"
            )
        };
        let config = load_file(jail, &rule("unlimited = true\n")).unwrap();
        let read = &config.envoy_rls.rules[0];
        assert!(read.unlimited);
        assert!(read.policies.is_empty());
        // check-config renders it, and it loads back the same.
        let rendered = config.to_redacted_toml().unwrap();
        assert!(rendered.contains("unlimited = true"), "{rendered}");
        assert_eq!(load_file(jail, &rendered).unwrap().envoy_rls, config.envoy_rls);
        let limited = load_file(jail, &rule("unlimited = false\npolicies = \"api\"\n")).unwrap();
        assert!(!limited.envoy_rls.rules[0].unlimited);
        for (body, message) in [
            ("unlimited = true\npolicies = \"api\"\n", "has no policies"),
            ("unlimited = false\n", "`policies`, or `unlimited = true`"),
            ("", "`policies`, or `unlimited = true`"),
        ] {
            let found = problems(load_file(jail, &rule(body)));
            assert_eq!(found.len(), 1, "{body}: {found:?}");
            assert_eq!(found[0].0, "envoy-rls.rules.0.policies", "{body}");
            assert!(found[0].1.contains(message), "{body}: {found:?}");
        }
        // A value that does not read is named once, under its own key.
        assert_eq!(
            paths(load_file(jail, &rule("unlimited = \"yes\"\n"))),
            ["envoy-rls.rules.0.unlimited"]
        );
        // An unlimited rule charges nothing: a subject has no meaning there.
        let subject = "unlimited = true\nsubject = [\"remote_address\"]\n";
        let found = problems(load_file(jail, &rule(subject)));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "envoy-rls.rules.0.subject");
        assert!(found[0].1.contains("`unlimited = true`"), "{found:?}");
    });
}

/// docs/envoy-rls.md, "Rules": a rule blocks or does not limit instead
/// of `policies`, names itself for another's `replaces`, takes a wildcard
/// entry in its subject or an empty one (one budget for all).
#[test]
fn a_rule_blocks_or_does_not_limit_and_replaces_another_by_name() {
    jail(|jail| {
        let rule = |descriptor: &str, body: &str| {
            format!("[[envoy-rls.rules]]\ndomain = \"edge\"\ndescriptor = {descriptor}\n{body}")
        };
        let file = [
            rule("[\"tier=banned\"]", "blocked = true\n"),
            rule("[\"tier=free\"]", "not-limited = true\nname = \"free\"\n"),
            rule("[\"tier=gold*\", \"user\"]", "policies = \"api\"\nreplaces = [\"free\"]\n"),
            rule("[\"bucket=b*\", \"user\"]", "policies = \"api\"\nsubject = [\"bucket\"]\n"),
            rule("[\"files=f*\"]", "policies = \"api\"\nsubject = []\n"),
            rule("[\"files=top/*\", \"files\"]", "policies = \"api\"\nallow-override = true\n"),
        ]
        .concat();
        let config = load_file(jail, &format!("{BASE}{file}")).unwrap();
        let rules = &config.envoy_rls.rules;
        assert!(rules[0].blocked && rules[1].not_limited);
        assert_eq!(
            (rules[1].name.as_deref(), &rules[2].replaces[..]),
            (Some("free"), &["free".to_owned()][..])
        );
        assert_eq!(rules[2].subject_keys(), ["tier", "user"], "a wildcard counts apart");
        assert_eq!(rules[4].subject_keys(), Vec::<&str>::new());
        assert!(rules[5].allow_override && !rules[4].allow_override);
        assert_eq!(rules[5].subject_keys(), ["files", "files"], "a key may repeat");
        let rendered = config.to_redacted_toml().unwrap();
        assert_eq!(load_file(jail, &rendered).unwrap().envoy_rls, config.envoy_rls);

        let descriptor = "[\"tier=x\"]";
        for (body, path, message) in [
            ("blocked = true\nnot-limited = true\n", "not-limited", "one of `unlimited`"),
            ("blocked = true\npolicies = \"api\"\n", "policies", "has no policies"),
            ("not-limited = true\nsubject = []\n", "subject", "`not-limited = true`"),
            (
                "policies = \"api\"\nname = \"a\"\nreplaces = [\"a\"]\n",
                "replaces.0",
                "another rule",
            ),
            ("policies = \"api\"\nsubject = [\"tier\"]\n", "subject", "has a fixed value"),
            ("unlimited = true\nallow-override = true\n", "allow-override", "no limit to override"),
            ("blocked = true\ncharge = \"always\"\n", "charge", "charges nothing"),
            ("policies = \"api\"\ncharge = \"sometimes\"\n", "charge", "always"),
        ] {
            let found = problems(load_file(jail, &format!("{BASE}{}", rule(descriptor, body))));
            assert_eq!(found.len(), 1, "{body}: {found:?}");
            assert_eq!(found[0].0, format!("envoy-rls.rules.0.{path}"), "{body}");
            assert!(found[0].1.contains(message), "{body}: {found:?}");
        }
    });
}

/// A dormant `[redis]` table (the provider is memory, `redis.enabled`
/// false) is checked like any other, so switching it on is not when its
/// mistakes are found.
#[test]
fn a_redis_table_is_checked_while_redis_is_off() {
    jail(|jail| {
        let file = format!(
            "{BASE}[redis]\nkey-prefix = \"a{{b}} c\"\ncommand-timeout = \"0ms\"\n\
             [redis.deny-cache]\nmax-entries = 0\n"
        );
        let found = paths(load_file(jail, &file));
        for key in ["redis.key-prefix", "redis.command-timeout", "redis.deny-cache.max-entries"] {
            assert!(found.iter().any(|path| path == key), "{key}: {found:?}");
        }
    });
}

#[test]
fn bad_telemetry_values_are_each_named_by_their_key() {
    jail(|jail| {
        let file = format!(
            "{BASE}[telemetry.otlp]\nendpoint = \"ftp://collector:4318\"\nsample-ratio = 1.5\n\
             service-name = \" \"\ntimeout = \"0s\"\nheaders = {{ \"bad header\" = \"v\" }}\n\
             colour = \"blue\"\n"
        );
        let mut named = paths(load_file(jail, &file));
        named.sort();
        assert_eq!(
            named,
            [
                "telemetry.otlp.colour",
                "telemetry.otlp.endpoint",
                "telemetry.otlp.headers.\"bad header\"",
                "telemetry.otlp.sample-ratio",
                "telemetry.otlp.service-name",
                "telemetry.otlp.timeout",
            ]
        );
        for endpoint in [
            "not a url",
            "127.0.0.1:4318",
            "http://collector:4318/?a=b",
            "http://u:p@collector",
            "https://collector:4318/?token=x",
            "https://",
        ] {
            let file = format!("{BASE}[telemetry.otlp]\nendpoint = \"{endpoint}\"\n");
            assert_eq!(paths(load_file(jail, &file)), ["telemetry.otlp.endpoint"], "{endpoint}");
        }
        let file = format!("{BASE}[telemetry.otlp]\nsample-ratio = \"half\"\n");
        assert_eq!(paths(load_file(jail, &file)), ["telemetry.otlp.sample-ratio"]);
    });
}

/// `telemetry.otlp.ca-file` pins the collector's CA; a file
/// that is missing or holds no certificate is refused naming the key and
/// saying what is wrong (check-config catches a typo).
#[test]
fn a_ca_file_that_is_missing_or_holds_no_certificate_is_named_by_its_key() {
    jail(|jail| {
        let ca = rcgen::generate_simple_self_signed(vec!["collector".to_owned()]).unwrap();
        jail.create_file("ca.pem", &ca.cert.pem()).unwrap();
        jail.create_file("not-pem.txt", "not a certificate\n").unwrap();
        let with = |file: &str| {
            format!(
                "{BASE}[telemetry.otlp]\nendpoint = \"https://collector:4318\"\n\
                 ca-file = \"{file}\"\n"
            )
        };
        let config = load_file(jail, &with("ca.pem")).unwrap();
        assert_eq!(config.telemetry.otlp.ca_file.as_deref(), Some("ca.pem"));
        for (file, what) in
            [("missing.pem", "cannot be read"), ("not-pem.txt", "holds no PEM certificate")]
        {
            let named = problems(load_file(jail, &with(file)));
            assert_eq!(named.len(), 1, "{named:?}");
            assert_eq!(named[0].0, "telemetry.otlp.ca-file");
            assert!(named[0].1.contains(file) && named[0].1.contains(what), "{named:?}");
        }
    });
}

/// A `sample-ratio` that is no number said `expected f64`; it
/// now says what the key takes. An integer 0 or 1 is a ratio too.
#[test]
fn a_sample_ratio_that_is_no_number_says_what_the_key_takes() {
    jail(|jail| {
        for ratio in ["\"0.5\"", "true", "[0.5]"] {
            let file = format!("{BASE}[telemetry.otlp]\nsample-ratio = {ratio}\n");
            let error = load_file(jail, &file).unwrap_err().to_string();
            assert!(error.contains("telemetry.otlp.sample-ratio"), "{error}");
            assert!(error.contains("expected a number from 0.0 to 1.0"), "{ratio}: {error}");
            assert!(!error.contains("f64"), "{error}");
        }
        for (ratio, read) in [("0", 0.0), ("1", 1.0), ("0.25", 0.25)] {
            let file = format!("{BASE}[telemetry.otlp]\nsample-ratio = {ratio}\n");
            assert_eq!(load_file(jail, &file).unwrap().telemetry.otlp.sample_ratio, read);
        }
    });
}

#[test]
fn the_envoy_rls_listener_never_takes_another_listeners_port() {
    jail(|jail| {
        let file = format!("{BASE}\n[envoy-rls]\nlisten = \"127.0.0.1:8080\"\n");
        assert_eq!(paths(load_file(jail, &file)), ["envoy-rls.listen"]);
    });
}

/// `BASE` over Redis with degraded mode on and `instances` as given (none
/// when `None`): nothing else in it is a problem.
fn degraded_over_redis(instances: Option<&str>) -> String {
    let instances = instances.map(|value| format!("instances = {value}\n")).unwrap_or_default();
    format!(
        "{BASE}\n[capabilities.rate-limit.degraded]\nenabled = true\n{instances}\
         [pseudonymizer.keys]\n1 = \"{KEY}\"\n[redis]\nenabled = true\n"
    )
    .replace("default-policy", "provider = \"redis\"\ndefault-policy")
}

#[test]
fn a_bad_instances_value_is_one_problem_and_a_missing_one_is_named_missing() {
    const INSTANCES: &str = "capabilities.rate-limit.degraded.instances";
    jail(|jail| {
        assert!(load_file(jail, &degraded_over_redis(Some("4"))).is_ok());
        for bad in ["-1", "4.5", "\"4\"", "4294967296"] {
            let found = self::problems(load_file(jail, &degraded_over_redis(Some(bad))));
            assert_eq!(found.len(), 1, "instances = {bad}: {found:?}");
            assert_eq!(found[0].0, INSTANCES, "instances = {bad}: {found:?}");
            assert!(!found[0].1.contains("at least 1"), "instances = {bad}: {found:?}");
        }
        // A number out of range names the range accepted (the docs' 1 to
        // 4294967295), from a file or the environment.
        let range = "must be a whole number from 1 to 4294967295";
        for bad in ["-1", "2.5", "4294967296"] {
            let found = self::problems(load_file(jail, &degraded_over_redis(Some(bad))));
            assert_eq!(found, [(INSTANCES.to_owned(), range.to_owned())], "instances = {bad}");
        }
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__DEGRADED__INSTANCES", "3.0");
        let found = self::problems(load_file(jail, &degraded_over_redis(None)));
        assert_eq!(found, [(INSTANCES.to_owned(), range.to_owned())], "env 3.0");
        // From the environment: the same single problem.
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__DEGRADED__INSTANCES", "abc");
        let found = self::problems(load_file(jail, &degraded_over_redis(None)));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, INSTANCES);
        assert!(found[0].1.contains("expected a whole number"), "{found:?}");
        jail.set_env("CA_SKELETON_CAPABILITIES__RATE_LIMIT__DEGRADED__INSTANCES", "3");
        let config = load_file(jail, &degraded_over_redis(None)).unwrap();
        assert_eq!(config.capabilities.rate_limit.degraded.instances, Some(3));
        jail.clear_env();
        // Enabled with no instances: required, so missing.
        let found = self::problems(load_file(jail, &degraded_over_redis(None)));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, INSTANCES);
        assert!(found[0].1.starts_with("missing"), "{found:?}");
        // 0 is a number, but not a fleet.
        let found = self::problems(load_file(jail, &degraded_over_redis(Some("0"))));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].1.contains("at least 1"), "{found:?}");
    });
}

/// A header the HTTP client frames itself, two names
/// that differ only in case, and a value with a control byte each stop
/// start-up naming `telemetry.otlp.headers.<name>`.
#[test]
fn framing_headers_case_twins_and_control_bytes_in_export_headers_are_refused() {
    jail(|jail| {
        for name in [
            "content-length",
            "Transfer-Encoding",
            "host",
            "content-type",
            "connection",
            "te",
            "upgrade",
            "keep-alive",
            "proxy-connection",
        ] {
            let file = format!(
                "{BASE}[telemetry.otlp]\nendpoint = \"http://collector:4318\"\n\
                 headers = {{ {name} = \"1\" }}\n"
            );
            assert_eq!(
                paths(load_file(jail, &file)),
                [format!("telemetry.otlp.headers.{name}")],
                "{name}"
            );
        }
        let file = format!(
            "{BASE}[telemetry.otlp]\nendpoint = \"http://collector:4318\"\n\
             headers = {{ X-Api-Key = \"a\", x-api-key = \"b\" }}\n"
        );
        let named = paths(load_file(jail, &file));
        assert_eq!(named.len(), 1, "{named:?}");
        assert!(named[0].starts_with("telemetry.otlp.headers."), "{named:?}");
        let file = format!(
            "{BASE}[telemetry.otlp]\nendpoint = \"http://collector:4318\"\n\
             headers = {{ x-api-key = \"a\\tb\", x-team = \"caf\\u00e9\" }}\n"
        );
        let mut named = paths(load_file(jail, &file));
        named.sort();
        assert_eq!(named, ["telemetry.otlp.headers.x-api-key", "telemetry.otlp.headers.x-team"]);
        // A space inside a value is visible ASCII and stays allowed.
        let file = format!(
            "{BASE}[telemetry.otlp]\nendpoint = \"http://collector:4318\"\n\
             headers = {{ authorization = \"Bearer abc\" }}\n"
        );
        assert!(load_file(jail, &file).is_ok());
    });
}

/// A wrong-scheme endpoint is named by its scheme; the URL
/// (its user, password, host or query) is never printed.
#[test]
fn a_wrong_scheme_endpoint_names_the_scheme_and_never_prints_the_url() {
    jail(|jail| {
        for endpoint in [
            "ftp://user:PASSW0RDSECRET@collector.example:4318/?token=QUERYSECRET",
            "ftp://collector.example:4318/?token=QUERYSECRET",
        ] {
            let file = format!("{BASE}[telemetry.otlp]\nendpoint = \"{endpoint}\"\n");
            let error = load_file(jail, &file).unwrap_err().to_string();
            assert!(error.contains("telemetry.otlp.endpoint"), "{error}");
            assert!(error.contains("\"ftp\""), "names the scheme: {error}");
            for secret in ["PASSW0RDSECRET", "QUERYSECRET", "collector.example", "user"] {
                assert!(!error.contains(secret), "{secret} printed: {error}");
            }
        }
    });
}

/// An endpoint without a host, with port 0 or with a
/// fragment stops start-up naming the key; so does a port past 65535 or
/// an empty one (the URI parser reads no port, and the client would dial
/// port 80 or 443 instead).
#[test]
fn an_endpoint_without_a_host_with_port_zero_or_a_fragment_is_refused() {
    jail(|jail| {
        for endpoint in [
            "http://:14318",
            "http://collector:0",
            "http://127.0.0.1:99999",
            "https://[::1]:65536",
            "http://collector:",
            "http://collector:4318#frag",
            "http://collector:4318/otlp#",
        ] {
            let file = format!("{BASE}[telemetry.otlp]\nendpoint = \"{endpoint}\"\n");
            assert_eq!(paths(load_file(jail, &file)), ["telemetry.otlp.endpoint"], "{endpoint}");
        }
        let file = format!("{BASE}[telemetry.otlp]\nendpoint = \"http://127.0.0.1:99999\"\n");
        let error = load_file(jail, &file).unwrap_err().to_string();
        assert!(error.contains("\"99999\" is not a port number"), "{error}");
        for good in
            ["http://collector:4318/otlp/", "https://[::1]:4318", "http://[::1]", "http://c:65535"]
        {
            let file = format!("{BASE}[telemetry.otlp]\nendpoint = \"{good}\"\n");
            assert!(load_file(jail, &file).is_ok(), "{good}");
        }
    });
}

/// A concurrency policy `exports` of 2 in flight.
const EXPORTS: &str = r#"
[capabilities.rate-limit.policies.exports]
algorithm = "concurrency"
max-in-flight = 2
lease-ttl = "30s"
retry-after = "1500ms"
"#;

/// `algorithm = "concurrency"` with its three keys,
/// `check-config` printing exactly those (no `maximum-cost`, no
/// `evaluation-dedup`, which it refuses), and the print loading back.
#[test]
fn a_concurrency_policy_reads_its_three_keys_and_prints_them_alone() {
    jail(|jail| {
        let file = format!("[capabilities.rate-limit]\ndefault-policy = \"exports\"\n{EXPORTS}");
        let config = load_file(jail, &file).unwrap();
        let policy = &config.capabilities.rate_limit.policies["exports"];
        assert_eq!(
            *policy.algorithm(),
            Algorithm::Concurrency(shared_contract::Concurrency {
                max_in_flight: 2,
                lease_ttl: Duration::from_secs(30),
                retry_after: Duration::from_millis(1500),
            })
        );
        assert_eq!(policy.evaluation_dedup(), EvaluationDedupPolicy::Disabled);
        let rendered = config.to_redacted_toml().unwrap();
        let table: toml::Table = rendered.parse().unwrap();
        let printed =
            table["capabilities"]["rate-limit"]["policies"]["exports"].as_table().unwrap();
        let keys: Vec<&str> = printed.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "algorithm",
                "cleanup-grace",
                "failure-policy",
                "lease-ttl",
                "max-in-flight",
                "maximum-clock-regression",
                "mode",
                "retry-after",
                "revision",
                "scope"
            ],
            "{rendered}"
        );
        assert_eq!(printed["retry-after"].as_str(), Some("1s 500ms"));
        let again = load_file(jail, &rendered).unwrap();
        assert_eq!(again.capabilities.rate_limit.policies["exports"], *policy);
    });
}

#[test]
fn every_concurrency_problem_is_named_by_its_key_at_once() {
    jail(|jail| {
        let file = r#"
            [capabilities.rate-limit]
            default-policy = "bare"
            [capabilities.rate-limit.policies.bare]
            algorithm = "concurrency"
            [capabilities.rate-limit.policies.wide]
            algorithm = "concurrency"
            max-in-flight = 0
            lease-ttl = "25h"
            retry-after = "2h"
            limit = 5
            window = "1s"
            maximum-cost = 1
            evaluation-dedup = { enabled = false }
            [capabilities.rate-limit.policies.odd]
            algorithm = "concurrency"
            max-in-flight = 10001
            lease-ttl = "1500us"
            retry-after = "1s"
            [capabilities.rate-limit.policies.bare-number]
            algorithm = "concurrency"
            max-in-flight = 2
            lease-ttl = "30s"
            retry-after = 5
            [capabilities.rate-limit.policies.window]
            algorithm = "fixed-window"
            limit = 5
            window = "1s"
            max-in-flight = 2
            retry-after = "1s"
        "#;
        let mut found = problems(load_file(jail, file));
        found.sort();
        let at = |key: &str| format!("capabilities.rate-limit.policies.{key}");
        let keys: Vec<_> = found.iter().map(|(path, _)| path.clone()).collect();
        assert_eq!(
            keys,
            [
                at("bare-number.retry-after"),
                at("bare.lease-ttl"),
                at("bare.max-in-flight"),
                at("bare.retry-after"),
                at("odd.lease-ttl"),
                at("odd.max-in-flight"),
                at("wide.evaluation-dedup"),
                at("wide.lease-ttl"),
                at("wide.limit"),
                at("wide.max-in-flight"),
                at("wide.maximum-cost"),
                at("wide.retry-after"),
                at("wide.window"),
                at("window.max-in-flight"),
                at("window.retry-after"),
            ],
            "{found:#?}"
        );
        let message = |key: &str| &found.iter().find(|(path, _)| *path == at(key)).unwrap().1;
        assert_eq!(message("bare.max-in-flight"), "missing: concurrency needs it");
        assert!(message("wide.maximum-cost").starts_with("does not apply to concurrency"));
        assert!(message("wide.evaluation-dedup").starts_with("does not apply to concurrency"));
        assert!(message("wide.max-in-flight").contains("1..=10000"), "{found:#?}");
        assert!(message("odd.max-in-flight").contains("10001"), "{found:#?}");
        assert!(message("odd.lease-ttl").contains("whole milliseconds"), "{found:#?}");
        assert!(message("bare-number.retry-after").contains("no unit"), "{found:#?}");
        assert!(message("window.retry-after").starts_with("does not apply to fixed-window"));
    });
}

/// Envoy's rate limit API has no call that ends a request, so a lease
/// taken through it could never be released.
#[test]
fn an_envoy_rls_rule_naming_a_concurrency_policy_stops_start_up() {
    jail(|jail| {
        let rules = r#"
            [[envoy-rls.rules]]
            domain = "edge"
            descriptor = ["remote_address"]
            policies = "api"
            [[envoy-rls.rules]]
            domain = "edge"
            descriptor = ["generic_key=export", "remote_address"]
            policies = ["api", "exports"]
        "#;
        let file = format!("{BASE}{EXPORTS}{rules}");
        let found = problems(load_file(jail, &file));
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].0, "envoy-rls.rules.1.policies");
        assert!(found[0].1.starts_with("\"exports\" is a concurrency policy"), "{found:#?}");
    });
}

#[test]
fn every_problem_names_its_source_the_file_and_line_or_the_variable() {
    jail(|jail| {
        jail.set_env("CA_SKELETON_MEMORY__MAX_KEYS", "0");
        let file = format!("{BASE}windw = \"30s\"\n");
        let error = load_file(jail, &file).unwrap_err();
        let BootstrapError::InvalidConfig(problems) = error else { panic!("{error}") };
        let sources: Vec<(String, Option<String>)> =
            problems.iter().map(|p| (p.path.to_string(), p.source.clone())).collect();
        assert_eq!(
            sources,
            [
                (
                    "capabilities.rate-limit.policies.api.windw".to_owned(),
                    Some("in app.toml, line 9".to_owned())
                ),
                (
                    "memory.max-keys".to_owned(),
                    Some("from CA_SKELETON_MEMORY__MAX_KEYS".to_owned())
                ),
            ]
        );
        assert!(problems.to_string().contains("(from CA_SKELETON_MEMORY__MAX_KEYS)"));
    });
}

#[test]
fn a_table_named_after_a_provider_that_takes_none_is_an_unknown_key() {
    jail(|jail| {
        let file = format!("{BASE}\n[capabilities.rate-limit.memory]\nmax-keys = 3\n");
        assert_eq!(paths(load_file(jail, &file)), ["capabilities.rate-limit.memory"]);
    });
}

#[test]
fn a_key_version_that_is_no_number_is_named_by_its_key() {
    jail(|jail| {
        let file = format!("{BASE}\n[pseudonymizer.keys]\nfirst = \"{KEY}\"\n");
        let found = problems(load_file(jail, &file));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "pseudonymizer.keys.first");
        assert!(found[0].1.contains("whole number"), "{found:?}");
    });
}

/// A store smaller than one subject's largest policy set would refuse
/// every request the set limits (found from outside: accepted, then 503
/// on every request); checked only while the store counts.
#[test]
fn max_keys_below_the_largest_policy_set_is_refused_while_the_store_counts() {
    jail(|jail| {
        let policies = ["a", "b", "c"].map(|id| {
            format!(
                "[capabilities.rate-limit.policies.{id}]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"60s\"\n"
            )
        });
        let file = |max_keys: usize, provider: &str| {
            format!(
                "[capabilities.rate-limit]\nprovider = \"{provider}\"\ndefault-policy = [\"a\", \"b\", \"c\"]\n\
                 {}\n[memory]\nmax-keys = {max_keys}\n[redis]\nenabled = true\n\
                 [pseudonymizer.keys]\n1 = \"{}\"\n",
                policies.concat(),
                "k".repeat(32)
            )
        };
        let found = problems(load_file(jail, &file(2, "memory")));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "memory.max-keys");
        assert!(
            found[0].1.starts_with(
                "must be at least 3: capabilities.rate-limit.default-policy keeps that many keys"
            ),
            "{found:?}"
        );
        assert!(load_file(jail, &file(3, "memory")).is_ok());
        // The Redis provider without degraded mode keeps no key here.
        assert!(load_file(jail, &file(2, "redis")).is_ok());
    });
}
