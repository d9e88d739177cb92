//! The converter on configurations shaped like the examples of
//! envoyproxy/ratelimit's README (written here), with the TOML expected
//! from the mapping rules of docs/operations.md.

use std::path::PathBuf;

use figment::Jail;

use super::*;
use app_bootstrap::{AppConfig, ConfigSources};

fn import(text: &str) -> Imported {
    match convert(&[Source { name: "rl.yaml", text }]) {
        Ok(imported) => imported,
        Err(error) => panic!("expected an import, got {error}"),
    }
}

/// The problems of a refused import.
fn refused(text: &str) -> Vec<String> {
    match convert(&[Source { name: "rl.yaml", text }]) {
        Ok(imported) => panic!("expected problems, got\n{}", imported.toml),
        Err(ImportError { problems }) => problems,
    }
}

/// One `[[envoy-rls.rules]]` entry as the output spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Out {
    domain: String,
    descriptor: Vec<String>,
    /// The policy id, or `None` for an `unlimited = true` rule.
    policy: Option<String>,
}

fn rule(domain: &str, descriptor: &[&str], policy: Option<&str>) -> Out {
    Out {
        domain: domain.to_owned(),
        descriptor: descriptor.iter().map(|entry| (*entry).to_owned()).collect(),
        policy: policy.map(str::to_owned),
    }
}

/// What [`parsed`] gives as the policy of a `blocked = true` rule: no id
/// can be it.
const BLOCKED: &str = "<blocked>";

/// The output read back as TOML: its rules, in order, and its policies.
fn parsed(imported: &Imported) -> (Vec<Out>, toml::Table) {
    let table: toml::Table = toml::from_str(&imported.toml)
        .unwrap_or_else(|error| panic!("not TOML: {error}\n{}", imported.toml));
    let rules = table["envoy-rls"]
        .get("rules")
        .and_then(toml::Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let rules = rules
        .iter()
        .map(|rule| {
            // A rule has one of the four keys, never two: its policy, or
            // none (`unlimited`, `not-limited`), or BLOCKED.
            let keys = ["policies", "unlimited", "not-limited", "blocked"];
            let set: Vec<&str> = keys.into_iter().filter(|key| rule.get(*key).is_some()).collect();
            let policy = match set[..] {
                ["policies"] => Some(rule["policies"].as_str().unwrap().to_owned()),
                [answer] => {
                    assert_eq!(rule[answer].as_bool(), Some(true));
                    (answer == "blocked").then(|| BLOCKED.to_owned())
                }
                _ => panic!("a rule with {set:?}"),
            };
            Out {
                domain: rule["domain"].as_str().unwrap().to_owned(),
                descriptor: rule["descriptor"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|entry| entry.as_str().unwrap().to_owned())
                    .collect(),
                policy,
            }
        })
        .collect();
    let policies = table["capabilities"]["rate-limit"]["policies"].as_table().unwrap().clone();
    (rules, policies)
}

/// `(algorithm, limit, window, mode)` of one policy.
fn policy(policies: &toml::Table, id: &str) -> (String, i64, String, Option<String>) {
    let policy = policies.get(id).unwrap_or_else(|| panic!("no policy {id:?} in {policies:?}"));
    (
        policy["algorithm"].as_str().unwrap().to_owned(),
        policy["limit"].as_integer().unwrap(),
        policy["window"].as_str().unwrap().to_owned(),
        policy.get("mode").and_then(toml::Value::as_str).map(str::to_owned),
    )
}

fn fixed(limit: i64, window: &str) -> (String, i64, String, Option<String>) {
    ("fixed-window".to_owned(), limit, window.to_owned(), None)
}

/// What the first matching rule answers for a request descriptor, as the
/// rules section of docs/envoy-rls.md matches: same keys in the same order, equal
/// fixed values. `None`: no rule, not limited.
fn first_match<'r>(rules: &'r [Out], domain: &str, request: &[(&str, &str)]) -> Option<&'r Out> {
    rules.iter().find(|rule| {
        rule.domain == domain
            && rule.descriptor.len() == request.len()
            && rule.descriptor.iter().zip(request).all(|(entry, (key, value))| {
                match entry.split_once('=') {
                    Some((fixed_key, fixed_value)) => {
                        fixed_key == *key && wildcard_fits(fixed_value, value)
                    }
                    None => entry == key,
                }
            })
    })
}

/// docs/envoy-rls.md's wildcard: each `*` any run of characters, the
/// parts in order, the first a prefix and the last a suffix that never
/// overlap (no `*`: equal).
fn wildcard_fits(pattern: &str, value: &str) -> bool {
    let Some((head, last)) = pattern.rsplit_once('*') else { return pattern == value };
    let mut parts = head.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(rest) = value.strip_prefix(first).and_then(|rest| rest.strip_suffix(last)) else {
        return false;
    };
    let mut rest = rest;
    parts.all(|part| rest.find(part).map(|at| rest = &rest[at + part.len()..]).is_some())
}

const HEADER: &str = "\
# Each rate_limit is a fixed-window policy of its own (windows aligned to
# the epoch, as there; a month is 30 days and a year 365 days, as
# envoyproxy/ratelimit counts them) and a rule whose descriptor is the
# path of keys, `key=value` where a value fixes the entry. A descriptor
# matches the first rule with its keys and values: the order below is
# envoyproxy/ratelimit's precedence: an exact value, then a wildcard
# (`*`), then the bare key. A descriptor's `limit` override, which
# envoyproxy/ratelimit honours everywhere, is ignored here unless its
# rule sets `allow-override = true` (`--allow-override DOMAIN`): the
# YAML cannot say which domains Envoy sends overrides for
# (docs/envoy-rls.md, \"Rules\").
";

const DEFAULT_POLICY: &str = "
# The HTTP edge's built-in policy, restated: a policies table replaces the
# built-in one. Drop it when merging into a configuration with its own
# default-policy.
[capabilities.rate-limit.policies.default]
algorithm = \"fixed-window\"
limit = 5
window = \"1m\"
";

/// README example 2's shape: a limit nested under a fixed value, and a
/// bare key at the top.
const TEXTS: &str = "\
# A promotion may text a number 3 times a day; anything, 40 times.
domain: sms
descriptors:
  - key: campaign
    value: promo
    descriptors:
      - key: phone
        rate_limit:
          unit: day
          requests_per_unit: 3
  - key: phone
    rate_limit:
      unit: day
      requests_per_unit: 40
";

#[test]
fn nested_descriptors_become_paths_of_keys_each_with_its_policy() {
    let imported = import(TEXTS);
    let expected = format!(
        "# Converted by `ca-skeleton-import envoy-ratelimit` from rl.yaml.
{HEADER}# Everything was converted.

[envoy-rls]
# The gRPC listener is off until `listen` is set, e.g.
# listen = \"127.0.0.1:8081\"

# sms: campaign=promo > phone: 3 per day
[[envoy-rls.rules]]
domain = \"sms\"
descriptor = [\"campaign=promo\", \"phone\"]
policies = \"sms.campaign_promo.phone\"

# sms: phone: 40 per day
[[envoy-rls.rules]]
domain = \"sms\"
descriptor = [\"phone\"]
policies = \"sms.phone\"

# sms: campaign=promo > phone: 3 per day
[capabilities.rate-limit.policies.\"sms.campaign_promo.phone\"]
algorithm = \"fixed-window\"
limit = 3
window = \"1d\"                       # day
maximum-cost = 3                    # a hits_addend up to the limit, as there

# sms: phone: 40 per day
[capabilities.rate-limit.policies.\"sms.phone\"]
algorithm = \"fixed-window\"
limit = 40
window = \"1d\"                       # day
maximum-cost = 40                   # a hits_addend up to the limit, as there
{DEFAULT_POLICY}"
    );
    assert_eq!(imported.toml, expected);
    assert_eq!(imported.warnings, Vec::<String>::new());
}

/// README example 1's shape: one key, two fixed values.
#[test]
fn fixed_values_of_one_key_are_rules_of_their_own() {
    let imported = import(
        "domain: db
descriptors:
  - key: table
    value: orders
    rate_limit: { unit: second, requests_per_unit: 200 }
  - key: table
    value: invoices
    rate_limit: { unit: minute, requests_per_unit: 50 }
",
    );
    let (rules, policies) = parsed(&imported);
    assert_eq!(
        rules,
        [
            rule("db", &["table=orders"], Some("db.table_orders")),
            rule("db", &["table=invoices"], Some("db.table_invoices")),
        ]
    );
    assert_eq!(policy(&policies, "db.table_orders"), fixed(200, "1s"));
    assert_eq!(policy(&policies, "db.table_invoices"), fixed(50, "1m"));
}

/// README example 3's shape with a limit that can be expressed: the
/// fixed value is tried before the bare key, whichever the file lists first.
#[test]
fn a_fixed_value_comes_before_its_bare_key_whatever_the_file_order() {
    let imported = import(
        "domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: remote_address
    value: 192.0.2.7
    rate_limit: { unit: second, requests_per_unit: 1 }
",
    );
    let (rules, _) = parsed(&imported);
    assert_eq!(
        rules,
        [
            rule("edge", &["remote_address=192.0.2.7"], Some("edge.remote_address_192.0.2.7")),
            rule("edge", &["remote_address"], Some("edge.remote_address")),
        ]
    );
    let chosen = |ip| first_match(&rules, "edge", &[("remote_address", ip)]).unwrap();
    assert_eq!(chosen("192.0.2.7").policy.as_deref(), Some("edge.remote_address_192.0.2.7"));
    assert_eq!(chosen("192.0.2.8").policy.as_deref(), Some("edge.remote_address"));
}

/// README example 3 as written there: 0 requests a second blocks an
/// address. A policy's limit is at least 1, and leaving the rule out would
/// let the address through at the bare key's limit, so the import stops.
#[test]
fn zero_requests_per_unit_is_a_rule_that_refuses_every_request() {
    let imported = import(
        "domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: remote_address
    value: 192.0.2.7
    rate_limit:
      unit: second
      requests_per_unit: 0
",
    );
    let (rules, _) = parsed(&imported);
    assert_eq!(
        rules,
        [
            rule("edge", &["remote_address=192.0.2.7"], Some(BLOCKED)),
            rule("edge", &["remote_address"], Some("edge.remote_address")),
        ]
    );
    assert!(imported.toml.contains("# requests_per_unit 0: every request refused, as there\n"));
}

/// README example 4's shape: a request matches a rule of its own depth
/// only, and a placeholder level (no rate_limit) is no rule.
#[test]
fn a_rule_has_the_depth_of_its_descriptor() {
    let imported = import(
        "domain: depth
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: region
        rate_limit: { unit: hour, requests_per_unit: 300 }
",
    );
    let (rules, _) = parsed(&imported);
    assert_eq!(
        rules,
        [rule("depth", &["tenant=acme", "region"], Some("depth.tenant_acme.region"))]
    );
    assert!(first_match(&rules, "depth", &[("tenant", "acme")]).is_none());
    assert!(first_match(&rules, "depth", &[("tenant", "acme"), ("region", "eu")]).is_some());
}

/// README example 5's shape: an unlimited descriptor is a rule of its own,
/// so it is answered as envoyproxy/ratelimit answers it (OK, remaining
/// 4294967295), not as a descriptor no rule matches (remaining 0).
#[test]
fn unlimited_alone_is_an_unlimited_rule() {
    let imported = import(
        "domain: internal
descriptors:
  - key: directory
    rate_limit:
      unlimited: true
  - key: billing
    rate_limit: { unit: minute, requests_per_unit: 120 }
",
    );
    let (rules, policies) = parsed(&imported);
    assert_eq!(
        rules,
        [
            rule("internal", &["directory"], None),
            rule("internal", &["billing"], Some("internal.billing"))
        ]
    );
    // The built-in HTTP policy and the one limited rule's.
    assert_eq!(policies.keys().collect::<Vec<_>>(), ["default", "internal.billing"]);
}

/// An unlimited value of a limited bare key must stay a rule, or the bare
/// key's limit would apply to it: an `unlimited = true` rule, no policy.
#[test]
fn unlimited_before_a_limit_it_shadows_is_a_never_denying_rule() {
    let imported = import(
        "domain: internal
descriptors:
  - key: client
    rate_limit: { unit: minute, requests_per_unit: 120 }
  - key: client
    value: probe
    rate_limit: { unlimited: true }
",
    );
    let (rules, policies) = parsed(&imported);
    assert_eq!(
        rules,
        [
            rule("internal", &["client=probe"], None),
            rule("internal", &["client"], Some("internal.client"))
        ]
    );
    // No policy stands for the unlimited rule: the default and the limit.
    assert_eq!(policies.keys().collect::<Vec<_>>(), ["default", "internal.client"]);
    assert!(imported.toml.contains(
        "# internal: client=probe: unlimited\n# unlimited: answered OK\n[[envoy-rls.rules]]\n\
         domain = \"internal\"\ndescriptor = [\"client=probe\"]\nunlimited = true\n"
    ));
}

/// envoyproxy/ratelimit refuses a unit beside `unlimited`; so does the import,
/// naming the line where the unit is.
#[test]
fn an_unlimited_rate_limit_with_a_unit_is_refused() {
    let problems = refused(
        "domain: internal
descriptors:
  - key: directory
    rate_limit: { unlimited: true, unit: second }
",
    );
    assert_eq!(
        problems,
        ["rl.yaml:4: internal > directory: an unlimited rate_limit sets unit \"second\""]
    );
}

/// README example 6's shape.
#[test]
fn shadow_mode_makes_a_shadow_policy() {
    let imported = import(
        "domain: auth
descriptors:
  - key: service
    descriptors:
      - key: client
        value: mobile
        shadow_mode: true
        rate_limit: { unit: second, requests_per_unit: 15 }
      - key: client
        value: web
        rate_limit: { unit: second, requests_per_unit: 30 }
",
    );
    let (rules, policies) = parsed(&imported);
    assert_eq!(
        rules,
        [
            rule("auth", &["service", "client=mobile"], Some("auth.service.client_mobile")),
            rule("auth", &["service", "client=web"], Some("auth.service.client_web")),
        ]
    );
    let (_, limit, window, mode) = policy(&policies, "auth.service.client_mobile");
    assert_eq!((limit, window.as_str(), mode.as_deref()), (15, "1s", Some("shadow")));
    assert_eq!(policy(&policies, "auth.service.client_web"), fixed(30, "1s"));
}

/// README example 7's shape: the replacing rule names the rule it replaces
/// (docs/envoy-rls.md, "Rules"), and no warning is left.
#[test]
fn replaces_names_the_rule_it_replaces() {
    let imported = import(
        "domain: quota
descriptors:
  - key: plan
    value: basic
    descriptors:
      - key: account
        value: a-17
        rate_limit:
          name: account_basic
          unit: second
          requests_per_unit: 4
  - key: plan
    value: pro
    descriptors:
      - key: account
        value: a-17
        rate_limit:
          replaces:
            - name: account_basic
          unit: second
          requests_per_unit: 9
",
    );
    assert!(imported.warnings.is_empty(), "{:?}", imported.warnings);
    assert!(imported.toml.contains(
        "[[envoy-rls.rules]]\ndomain = \"quota\"\ndescriptor = [\"plan=basic\", \"account=a-17\"]\n\
         name = \"account_basic\"\n"
    ));
    assert!(imported.toml.contains(
        "[[envoy-rls.rules]]\ndomain = \"quota\"\ndescriptor = [\"plan=pro\", \"account=a-17\"]\n\
         replaces = [\"account_basic\"]\n"
    ));
    let (rules, _) = parsed(&imported);
    assert_eq!(rules.len(), 2);
}

/// README example 8's shape, and the other metric-only keys.
#[test]
fn metric_options_and_metadata_are_warnings() {
    let imported = import(
        "domain: metrics
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: user
    value: admin
    value_to_metric: true
    metadata:
      team: core
    rate_limit: { unit: minute, requests_per_unit: 20 }
",
    );
    assert_eq!(
        imported.warnings,
        [
            "rl.yaml:3: metrics > user: detailed_metric is not converted: decision metrics \
             here carry the policy id, never a descriptor value",
            "rl.yaml:6: metrics > user=admin: value_to_metric is not converted: decision \
             metrics here carry the policy id, never a descriptor value",
            "rl.yaml:6: metrics > user=admin: metadata is not converted: it has no equivalent",
        ]
    );
    let (rules, _) = parsed(&imported);
    assert_eq!(rules.len(), 2);
}

/// envoyproxy/ratelimit's `test/config/wildcard.yaml` and the answers of
/// its `TestWildcardConfig` (`test/config/config_test.go`): an exact value
/// before a wildcard, a wildcard before the bare key, middle and multiple
/// `*`; each value a wildcard matches its own budget (the default subject).
#[test]
fn wildcard_values_import_in_envoyproxy_ratelimits_precedence() {
    let imported = import(
        "domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: noWild
    value: foo
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: noVal
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: midWild
    value: bar*b
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: multiWild
    value: foo*bar*baz
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: { unit: minute, requests_per_unit: 20 }
",
    );
    let (rules, _) = parsed(&imported);
    let limited = |request: &[(&str, &str)]| {
        first_match(&rules, "test-domain", request).and_then(|rule| rule.policy.clone()).is_some()
    };
    for request in [
        &[("wild", "foo1")][..],
        &[("wild", "foo2")],
        &[("noVal", "foo1")],
        &[("midWild", "barab")],
        &[("midWild", "bar123b")],
        &[("midWild", "barb")],
        &[("multiWild", "foo123bar456baz")],
        &[("multiWild", "foobarbaz")],
        &[("nestedWild", "val1"), ("wild", "goo2")],
    ] {
        assert!(limited(request), "{request:?}");
    }
    for request in [
        &[("wild", "bar")][..],
        &[("noWild", "foo1")],
        &[("midWild", "bara")],
        &[("midWild", "xbarb")],
        &[("multiWild", "foo123baz")],
        &[("multiWild", "bar456baz")],
    ] {
        assert!(!limited(request), "{request:?}");
    }
    assert!(!imported.toml.contains("subject ="), "every matched value counts apart");
}

/// envoyproxy/ratelimit's `test/config/share_threshold.yaml` shapes: an
/// exact value before a shared wildcard, and a shared wildcard above a
/// bare key: the wildcard is left out of the subject, so every value it
/// matches spends one budget, the bare key's value still its own.
#[test]
fn a_shared_wildcard_is_left_out_of_the_subject() {
    let imported = import(
        "domain: test-domain
descriptors:
  - key: file
    value: test1
    rate_limit: { unit: minute, requests_per_unit: 50 }
  - key: file
    value: test*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: route
    value: api/*
    share_threshold: true
    descriptors:
      - key: method
        rate_limit: { unit: minute, requests_per_unit: 60 }
",
    );
    let (rules, _) = parsed(&imported);
    let policy = |request: &[(&str, &str)]| {
        first_match(&rules, "test-domain", request).and_then(|rule| rule.policy.clone())
    };
    assert_eq!(policy(&[("file", "test1")]), Some("test-domain.file_test1".to_owned()));
    let shared = policy(&[("file", "test2")]).expect("the wildcard limits test2");
    assert_eq!(policy(&[("file", "test3")]), Some(shared));
    assert!(policy(&[("route", "api/v1"), ("method", "GET")]).is_some());
    let table: toml::Table = toml::from_str(&imported.toml).unwrap();
    let subjects: Vec<Option<&toml::Value>> = table["envoy-rls"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| rule.get("subject"))
        .collect();
    let list = |keys: &[&str]| toml::Value::Array(keys.iter().map(|k| (*k).into()).collect());
    assert_eq!(subjects, [None, Some(&list(&[])), Some(&list(&["method"]))]);
}

/// `share_threshold` without a wildcard is refused, as envoyproxy/ratelimit
/// refuses it.
#[test]
fn share_threshold_without_a_wildcard_stops_the_import() {
    let problems = refused(
        "domain: d
descriptors:
  - key: file
    value: exact
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
",
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("share_threshold needs a wildcard value"), "{problems:?}");
}

#[test]
fn every_unit_is_a_fixed_window_with_month_30_days_and_year_365() {
    let units = ["second", "MINUTE", "Hour", "day", "week", "month", "year"];
    let mut text = "domain: units\ndescriptors:\n".to_owned();
    for unit in units {
        text += &format!(
            "  - key: k\n    value: {}\n    rate_limit: {{ unit: {unit}, requests_per_unit: 7 }}\n",
            unit.to_lowercase()
        );
    }
    let imported = import(&text);
    let (_, policies) = parsed(&imported);
    let windows: Vec<String> = units
        .iter()
        .map(|unit| policy(&policies, &format!("units.k_{}", unit.to_lowercase())).2)
        .collect();
    assert_eq!(windows, ["1s", "1m", "1h", "1d", "7d", "30d", "365d"]);
    assert!(imported.toml.contains(
        "window = \"30d\"                      # month: 30 days, as envoyproxy/ratelimit counts it\n"
    ));
    assert!(imported.toml.contains(
        "window = \"365d\"                     # year: 365 days, as envoyproxy/ratelimit counts it\n"
    ));
}

/// envoyproxy/ratelimit's own `test/config/misspelled_key.yaml` and
/// `misspelled_key2.yaml`: it refuses an unknown key, and so does the
/// import, naming file, line and key, rather than lose the limit behind it.
#[test]
fn unknown_keys_are_refused_naming_file_line_and_key() {
    let misspelled = "domain: test-domain
descriptors:
  - key: key1
    value: value1
    ratelimit:
      unit: day
      requests_per_unit: 5
";
    assert_eq!(
        refused(misspelled),
        ["rl.yaml:5: test-domain > key1=value1: unknown key \"ratelimit\" (did you mean \
          \"rate_limit\"?): envoyproxy/ratelimit refuses it too"]
    );
    let misspelled2 = "domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: day
      requestsperunit: 5
";
    let problems = refused(misspelled2);
    assert!(
        problems.contains(
            &"rl.yaml:7: test-domain > key1=value1: unknown key \
              \"rate_limit.requestsperunit\" (did you mean \"requests_per_unit\"?): \
              envoyproxy/ratelimit refuses it too"
                .to_owned()
        ),
        "{problems:?}"
    );
    let problems = refused(
        "domain: typo
descriptor:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 3 }
descriptors:
  - key: user
    shadowmode: true
    rate_limit:
      unit: second
      requests_per_unit: 3
      burst: 9
",
    );
    assert_eq!(
        problems,
        [
            "rl.yaml:2: typo: unknown key \"descriptor\" (did you mean \"descriptors\"?): \
             envoyproxy/ratelimit refuses it too",
            "rl.yaml:7: typo > user: unknown key \"shadowmode\" (did you mean \
             \"shadow_mode\"?): envoyproxy/ratelimit refuses it too",
            "rl.yaml:11: typo > user: unknown key \"rate_limit.burst\": envoyproxy/ratelimit \
             refuses it too",
        ]
    );
}

/// A key envoyproxy/ratelimit knows, where it does not read it, is dropped
/// there without a word: the import refuses one that may carry or change
/// a limit, and warns about one that cannot (a name, a metric option).
#[test]
fn a_misplaced_key_is_refused_when_it_may_hold_a_limit_else_a_warning() {
    let problems = refused(
        "domain: moved
descriptors:
  - key: user
    requests_per_unit: 5
    unit: second
    rate_limit:
      unit: minute
      requests_per_unit: 10
      shadow_mode: true
",
    );
    assert_eq!(
        problems,
        [
            "rl.yaml:4: moved > user: key \"requests_per_unit\" belongs in a rate_limit: \
             envoyproxy/ratelimit ignores it here, and a limit with it",
            "rl.yaml:5: moved > user: key \"unit\" belongs in a rate_limit: \
             envoyproxy/ratelimit ignores it here, and a limit with it",
            "rl.yaml:9: moved > user: key \"rate_limit.shadow_mode\" belongs in a descriptor: \
             envoyproxy/ratelimit ignores it here, and a limit with it",
        ]
    );
    let imported = import(
        "domain: moved
descriptors:
  - key: user
    name: per-user
    rate_limit:
      unit: minute
      requests_per_unit: 10
      detailed_metric: true
",
    );
    assert_eq!(
        imported.warnings,
        [
            "rl.yaml:4: moved > user: key \"name\" belongs in a rate_limit: ignored here, as \
             envoyproxy/ratelimit ignores it",
            "rl.yaml:8: moved > user: key \"rate_limit.detailed_metric\" belongs in a \
             descriptor: ignored here, as envoyproxy/ratelimit ignores it",
        ]
    );
    let (_, policies) = parsed(&imported);
    assert_eq!(policy(&policies, "moved.user"), fixed(10, "1m"));
}

/// `unit_multiplier` (the window is that many units) is honoured: 5 a
/// minute written as 60 x second stays 5 a minute, never 5 a second.
#[test]
#[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
fn unit_multiplier_is_the_number_of_units_in_the_window() {
    let imported = import(
        "domain: um
descriptors:
  - key: user
    rate_limit: { unit: second, unit_multiplier: 60, requests_per_unit: 5 }
  - key: team
    rate_limit: { unit: day, unit_multiplier: 3, requests_per_unit: 7 }
  - key: org
    rate_limit: { unit: month, unit_multiplier: 2, requests_per_unit: 9 }
  - key: app
    rate_limit: { unit: hour, unit_multiplier: 1, requests_per_unit: 4 }
",
    );
    assert_eq!(imported.warnings, Vec::<String>::new());
    let (_, policies) = parsed(&imported);
    assert_eq!(policy(&policies, "um.user"), fixed(5, "60s"));
    assert_eq!(policy(&policies, "um.team"), fixed(7, "3d"));
    assert_eq!(policy(&policies, "um.org"), fixed(9, "60d"));
    assert_eq!(policy(&policies, "um.app"), fixed(4, "1h"));
    assert!(imported.toml.contains("# um: user: 5 per 60 seconds\n"), "{}", imported.toml);
    Jail::expect_with(|jail| {
        jail.create_file("app.toml", &imported.toml)?;
        let config = AppConfig::load(&ConfigSources::new(Some(PathBuf::from("app.toml"))))
            .unwrap_or_else(|error| panic!("{error}\n{}", imported.toml));
        let policies = &config.capabilities.rate_limit.policies;
        assert_eq!(
            policies["um.user"].algorithm(),
            &shared_contract::Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 5,
                window: std::time::Duration::from_secs(60)
            })
        );
        Ok(())
    });
}

/// A multiplier of 0 (envoyproxy/ratelimit's proposal refuses it too) or one
/// that makes a window longer than a policy can hold stops the import.
#[test]
fn a_unit_multiplier_no_window_can_hold_is_refused() {
    let problems = refused(
        "domain: um
descriptors:
  - key: user
    rate_limit: { unit: second, unit_multiplier: 0, requests_per_unit: 5 }
  - key: team
    rate_limit: { unit: year, unit_multiplier: 11, requests_per_unit: 5 }
",
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("rl.yaml:3: um > user: unit_multiplier 0"), "{problems:?}");
    assert!(
        problems[1].starts_with("rl.yaml:5: um > team: unit_multiplier 11 x year is longer than"),
        "{problems:?}"
    );
}

/// envoyproxy/ratelimit admits any `hits_addend` up to what is left of the
/// limit: each imported policy's `maximum-cost` is its limit, so a charge
/// of more than 1 is evaluated, not refused.
#[test]
#[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
fn each_policy_takes_a_hits_addend_up_to_its_limit() {
    // The "messaging" example of envoyproxy/ratelimit's README: 5 a day.
    let imported = import(
        "domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
",
    );
    Jail::expect_with(|jail| {
        jail.create_file("app.toml", &imported.toml)?;
        let config = AppConfig::load(&ConfigSources::new(Some(PathBuf::from("app.toml"))))
            .unwrap_or_else(|error| panic!("{error}\n{}", imported.toml));
        let policy =
            &config.capabilities.rate_limit.policies["messaging.message_type_marketing.to_number"];
        assert_eq!(policy.maximum_cost(), 5);
        assert!(policy.admits_cost(2) && policy.admits_cost(5) && !policy.admits_cost(6));
        Ok(())
    });
}

#[test]
fn bad_yaml_names_its_line() {
    let problems = refused(
        "domain: broken
descriptors:
  - key: user
      value: deeper
",
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("rl.yaml: "), "{problems:?}");
    assert!(problems[0].contains("line 4"), "{problems:?}");
}

#[test]
fn a_mistyped_value_names_its_line_and_column() {
    let problems = refused(
        "domain: typed
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: lots
",
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("line 6, column 26"), "{problems:?}");
}

/// What a user reads: the line and column, then what is wrong in the
/// terms of the file (its keys, its values), never the YAML reader's
/// internals ("invalid u32", "budget breached: Nodes { .. }").
#[test]
fn yaml_errors_say_what_is_wrong_in_the_users_terms() {
    let limit = |value: &str| {
        format!(
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {{ unit: second, requests_per_unit: {value} }}\n"
        )
    };
    let number = |found: &str| {
        format!(
            "rl.yaml: line 4, column 52: requests_per_unit must be a whole number from 0 to \
             4294967295, found {found}"
        )
    };
    let cases = [
        (limit("-4"), number("-4")),
        (limit("99999999999"), number("99999999999")),
        (limit("lots"), number("\"lots\"")),
        (limit("1.5"), number("1.5")),
        // A float that is whole still reads as a float.
        (
            limit("!!float 1.0"),
            number("1.0").replace("column 52", "column 60"), // past the tag
        ),
        (limit("1e3"), number("1000.0")),
        (
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: { unit: !!int 3, requests_per_unit: 1 }\n"
                .to_owned(),
            "rl.yaml: line 4, column 31: a tagged value (`!!int`, `!!str`, ...) where plain text \
             is expected: remove the tag"
                .to_owned(),
        ),
        (
            "domain: edge\ndescriptors:\n  - &a\n    key: k\n    descriptors: [*a]\n".to_owned(),
            "rl.yaml: line 5, column 19: an alias (`*name`) inside the list or map it names: it \
             would repeat for ever"
                .to_owned(),
        ),
        (
            "domain: edge\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n".to_owned(),
            "rl.yaml: line 4, column 18: expected true or false, found \"maybe\"".to_owned(),
        ),
        (
            "domain: edge\ndescriptors: 5\n".to_owned(),
            "rl.yaml: line 2, column 14: expected a list (`- ` items)".to_owned(),
        ),
        (
            "domain: [1, 2]\n".to_owned(),
            "rl.yaml: line 1, column 9: expected a single value, not a list or keys and values"
                .to_owned(),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(refused(&text), [expected], "{text}");
    }
    // Past the reader's limits, where the reader says where.
    let ten = |item: &str| [item; 10].join(",");
    let mut bomb = format!("domain: edge\na0: &a0 [{}]\n", ten("\"x\""));
    for level in 1..12 {
        bomb.push_str(&format!("a{level}: &a{level} [{}]\n", ten(&format!("*a{}", level - 1))));
    }
    bomb.push_str("descriptors: *a11\n");
    let deep = format!("domain: edge\ndescriptors: {}{}\n", "[".repeat(5000), "]".repeat(5000));
    for (text, what) in [
        (
            bomb,
            "aliases (`*name`) repeat more than 1000000 YAML nodes (keys, values, lists and \
             maps), the most one file may hold: write the descriptors out",
        ),
        (deep, "nested deeper than 64 levels of lists and maps"),
    ] {
        let problems = refused(&text);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("rl.yaml: line "), "{problems:?}");
        assert!(problems[0].ends_with(&format!(": {what}")), "{problems:?}");
    }
}

/// A file past the reader's node budget is refused naming the limit,
/// [`MAX_YAML_NODES`], and what to do; one nested too deep names its own.
#[test]
fn a_file_past_the_node_budget_is_refused_naming_the_limit() {
    // The reader's own error at a small budget (a million nodes take a
    // debug build most of a minute to read), in the words `convert` uses.
    let text = format!("domain: edge\ndescriptors: [{}]\n", "{},".repeat(20));
    let error = serde_saphyr::from_str_with_options::<IgnoredAny>(&text, yaml_options(10))
        .expect_err("past 10 nodes");
    // Node 11: the root map, two keys, two values (the list), then the
    // sixth `{}`, at column 15 + 5 * 3.
    assert_eq!(
        yaml_problem(&error),
        "line 2, column 30: more than 1000000 YAML nodes (keys, values, lists and maps), the \
         most one file may hold: split the domain's descriptors over several files"
    );
    // Nesting past the depth limit, through `convert`.
    let mut deep = "domain: edge\ndescriptors:\n".to_owned();
    for level in 0..40 {
        let pad = "  ".repeat(level * 2);
        deep.push_str(&format!("{pad}- key: k{level}\n{pad}  descriptors:\n"));
    }
    let problems = refused(&deep);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].ends_with(": nested deeper than 64 levels of lists and maps"),
        "{problems:?}"
    );
}

/// Control characters of the YAML (an escape sequence in a key, a value, a
/// domain, an unknown key, the file name) are escaped in every problem and
/// warning, as they are in the TOML's comments: stderr gets no raw one.
#[test]
fn control_characters_are_escaped_in_every_problem_and_warning() {
    let text = "domain: \"ed\\e[31mge\"
descriptors:
  - key: \"a\\a\"
    value: \"\\e]0;title\\a\"
    detailed_metric: true
    \"odd\\ekey\": 1
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: \"b\\e\"
    rate_limit: { unit: \"sec\\eond\", requests_per_unit: 1 }
";
    let result = convert(&[Source { name: "r\u{1b}l.yaml", text }]);
    let Err(ImportError { problems }) = result else {
        panic!("expected problems, got {result:?}");
    };
    let mut converter = Converter::default();
    converter.file(&Source { name: "r\u{1b}l.yaml", text }, &mut HashMap::new());
    converter.end_file();
    let warnings = converter.warnings;
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for message in problems.iter().chain(&warnings) {
        assert!(!message.chars().any(char::is_control), "{message:?}");
        assert!(message.starts_with("r\\u{1b}l.yaml"), "{message}");
    }
    assert!(problems.iter().any(|p| p.contains("ed\\u{1b}[31mge > b\\u{1b}: ")), "{problems:?}");
    assert!(problems.iter().any(|p| p.contains("odd\\u{1b}key")), "{problems:?}");
    assert!(warnings.iter().any(|w| w.contains("a\\u{7}=\\u{1b}]0;title\\u{7}")), "{warnings:?}");
}

/// The invisible format and separator characters (bidi overrides and
/// isolates, zero-width ones, line and paragraph separators, the BOM) are
/// escaped as control characters are: in every problem, every warning and
/// every comment of the TOML.
#[test]
fn invisible_format_characters_are_escaped_in_problems_warnings_and_comments() {
    const INVISIBLE: [char; 17] = [
        '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}', '\u{2067}',
        '\u{2068}', '\u{2069}', '\u{200b}', '\u{200c}', '\u{200d}', '\u{200e}', '\u{200f}',
        '\u{2028}', '\u{2029}', '\u{feff}',
    ];
    let shown = |text: &str| !text.chars().any(|c| INVISIBLE.contains(&c));
    let every: String = INVISIBLE.iter().collect();
    // A value holding each, a detailed_metric warning that names it.
    let good = format!(
        "domain: \"ed\u{202e}ge\"\ndescriptors:\n  - key: k\n    value: \"v{every}\"\n    \
         detailed_metric: true\n    rate_limit: {{ unit: second, requests_per_unit: 1 }}\n"
    );
    let imported = convert(&[Source { name: "r\u{2067}l.yaml", text: &good }]).unwrap();
    assert!(!imported.warnings.is_empty());
    for warning in &imported.warnings {
        assert!(shown(warning), "{warning:?}");
    }
    let comments: Vec<&str> =
        imported.toml.lines().filter(|line| line.trim_start().starts_with('#')).collect();
    assert!(comments.iter().any(|line| line.contains("ed\\u{202e}ge")), "{comments:#?}");
    assert!(
        comments.iter().any(|line| line.contains("\\u{2028}\\u{2029}\\u{feff}")),
        "{comments:#?}"
    );
    for line in comments {
        assert!(shown(line), "{line:?}");
    }
    // A problem names the file, the domain and the unit as they are, escaped.
    let bad = "domain: \"ed\u{202e}ge\"\ndescriptors:\n  - key: \"b\u{200b}\"\n    \
               rate_limit: { unit: \"sec\u{2028}ond\", requests_per_unit: 1 }\n";
    let result = convert(&[Source { name: "r\u{2067}l.yaml", text: bad }]);
    let Err(ImportError { problems }) = result else {
        panic!("expected problems, got {result:?}");
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(shown(&problems[0]), "{problems:?}");
    assert!(problems[0].starts_with("r\\u{2067}l.yaml"), "{problems:?}");
    assert!(problems[0].contains("ed\\u{202e}ge > b\\u{200b}"), "{problems:?}");
}

#[test]
fn every_problem_of_every_file_is_reported_at_once() {
    let first = "domain: many
descriptors:
  - key: a
    rate_limit: { unit: fortnight, requests_per_unit: 1 }
  - key: b
    rate_limit: { requests_per_unit: 1 }
  - value: orphan
  - key: c
    value: x
  - key: c
    value: x
";
    let second = "descriptors: []\n";
    let third = "domain: many\n";
    let result = convert(&[
        Source { name: "one.yaml", text: first },
        Source { name: "two.yaml", text: second },
        Source { name: "three.yaml", text: third },
    ]);
    let Err(ImportError { problems }) = result else {
        panic!("expected problems, got {result:?}");
    };
    assert_eq!(
        problems,
        [
            "one.yaml:4: many > a: invalid rate_limit unit \"fortnight\": expected one of second, \
             minute, hour, day, week, month, year",
            "one.yaml:5: many > b: rate_limit has no unit",
            "one.yaml:7: many: a descriptor has no key",
            "one.yaml:10: many: descriptor c=x is repeated (first at line 8)",
            "two.yaml:1: no domain: the file sets no `domain`",
            "three.yaml:1: domain \"many\" is already defined in one.yaml",
        ]
    );
}

/// After a fixed value matched, envoyproxy/ratelimit looks for the next
/// entries under that value only: `tier=gold` with a `route` entry finds
/// nothing under gold and is not limited, though the bare `tier` has a
/// `route` limit. The first-match rules say the same with `unlimited` rules.
#[test]
fn a_fixed_value_never_falls_back_to_the_bare_keys_limits() {
    let imported = import(
        "domain: shop
descriptors:
  - key: tier
    value: gold
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: tier
    rate_limit: { unit: hour, requests_per_unit: 1000 }
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 10 }
      - key: route
        rate_limit: { unit: second, requests_per_unit: 5 }
",
    );
    let (rules, _) = parsed(&imported);
    assert_eq!(
        rules,
        [
            rule("shop", &["tier=gold", "user"], Some("shop.tier_gold.user")),
            rule("shop", &["tier=gold"], None),
            rule("shop", &["tier=gold", "route"], None),
            rule("shop", &["tier"], Some("shop.tier")),
            rule("shop", &["tier", "user"], Some("shop.tier.user")),
            rule("shop", &["tier", "route"], Some("shop.tier.route")),
        ]
    );
    // What envoyproxy/ratelimit answers for each, from its README's
    // matching rules: the policy, or None for OK.
    type Request<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Request<'_>, Option<&str>); 6] = [
        (&[("tier", "gold"), ("user", "u1")], Some("shop.tier_gold.user")),
        (&[("tier", "gold"), ("route", "/cart")], None),
        (&[("tier", "gold")], None),
        (&[("tier", "silver"), ("route", "/cart")], Some("shop.tier.route")),
        (&[("tier", "silver"), ("user", "u1")], Some("shop.tier.user")),
        (&[("tier", "silver")], Some("shop.tier")),
    ];
    for (request, expected) in cases {
        let answer = first_match(&rules, "shop", request).and_then(|rule| rule.policy.as_deref());
        assert_eq!(answer, expected, "{request:?}");
    }
    assert!(imported.toml.contains(
        "# envoyproxy/ratelimit answers OK here: after tier=gold it looks only under that \
         value, never under the bare \"tier\"\n"
    ));
}

/// README's whitelisting: a fixed value with neither a limit nor children
/// is matched and not limited, so its bare key's limit never applies to it.
#[test]
fn a_bare_placeholder_value_is_not_limited_by_its_bare_key() {
    let imported = import(
        "domain: allow
descriptors:
  - key: client
    value: monitoring
  - key: client
    rate_limit: { unit: second, requests_per_unit: 2 }
",
    );
    let (rules, _) = parsed(&imported);
    assert_eq!(
        rules,
        [
            rule("allow", &["client=monitoring"], None),
            rule("allow", &["client"], Some("allow.client"))
        ]
    );
}

#[test]
fn policy_ids_are_valid_unique_and_deterministic() {
    let long = "v".repeat(80);
    let text = format!(
        "domain: Ids
descriptors:
  - key: a
    value: b
    rate_limit: {{ unit: second, requests_per_unit: 1 }}
  - key: a_b
    rate_limit: {{ unit: second, requests_per_unit: 2 }}
  - key: path
    value: /Cart?x=1
    rate_limit: {{ unit: second, requests_per_unit: 3 }}
  - key: long
    value: {long}
    rate_limit: {{ unit: second, requests_per_unit: 4 }}
"
    );
    let imported = import(&text);
    let (rules, policies) = parsed(&imported);
    let ids: Vec<String> = rules.iter().map(|rule| rule.policy.clone().unwrap()).collect();
    for id in &ids {
        assert!(shared_contract::PolicyId::new(id.as_str()).is_ok(), "{id:?}");
        assert!(policies.contains_key(id), "{id:?}");
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 4, "{ids:?}");
    // `Ids.a_b` twice (key a value b, key a_b) and lossy or long keys: a
    // readable prefix and 8 hex digits.
    let hashed = |id: &str, prefix: &str| {
        id.len() == prefix.len() + 9
            && id.starts_with(prefix)
            && id.as_bytes()[prefix.len()] == b'-'
            && id[prefix.len() + 1..].bytes().all(|b| b.is_ascii_hexdigit())
    };
    assert!(hashed(&ids[0], "ids.a_b"), "{ids:?}");
    assert!(hashed(&ids[1], "ids.a_b"), "{ids:?}");
    assert!(hashed(&ids[2], "ids.path_-cart-x-1"), "{ids:?}");
    assert!(hashed(&ids[3], &format!("ids.long_{}", "v".repeat(46))), "{ids:?}");
    assert_eq!(import(&text), imported, "the same input gives the same output");
}

#[test]
fn a_limit_above_the_largest_is_lowered_to_it_with_a_warning() {
    let imported = import(
        "domain: big
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 4000000000 }
",
    );
    assert_eq!(
        imported.warnings,
        ["rl.yaml:3: big > k: requests_per_unit 4000000000 is above the largest limit, \
          1000000000: converted as 1000000000"]
    );
    let (_, policies) = parsed(&imported);
    assert_eq!(policy(&policies, "big.k"), fixed(1_000_000_000, "1s"));
}

#[test]
fn quota_mode_is_enforced_with_a_warning() {
    let imported = import(
        "domain: q
descriptors:
  - key: k
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 8 }
",
    );
    assert_eq!(imported.warnings.len(), 1, "{:?}", imported.warnings);
    assert!(imported.warnings[0].starts_with("rl.yaml:3: q > k: quota_mode is not converted"));
    let (_, policies) = parsed(&imported);
    assert_eq!(policy(&policies, "q.k"), fixed(8, "1h"));
}

/// The printed TOML loads as it is, rules and policies.
#[test]
#[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
fn the_printed_toml_loads_as_configuration() {
    let imported = import(TEXTS);
    Jail::expect_with(|jail| {
        jail.create_file("app.toml", &imported.toml)?;
        let config = AppConfig::load(&ConfigSources::new(Some(PathBuf::from("app.toml"))))
            .unwrap_or_else(|error| panic!("{error}\n{}", imported.toml));
        let policies = &config.capabilities.rate_limit.policies;
        assert_eq!(
            policies.keys().collect::<Vec<_>>(),
            ["default", "sms.campaign_promo.phone", "sms.phone"]
        );
        assert_eq!(
            policies["sms.phone"].algorithm(),
            &shared_contract::Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 40,
                window: std::time::Duration::from_secs(86_400)
            })
        );
        let rules: Vec<(&str, &[String], &[String])> = config
            .envoy_rls
            .rules
            .iter()
            .map(|rule| {
                (rule.domain.as_str(), rule.descriptor.as_slice(), rule.policies.as_slice())
            })
            .collect();
        assert_eq!(
            rules,
            [
                (
                    "sms",
                    &["campaign=promo".to_owned(), "phone".to_owned()][..],
                    &["sms.campaign_promo.phone".to_owned()][..]
                ),
                ("sms", &["phone".to_owned()][..], &["sms.phone".to_owned()][..]),
            ]
        );
        assert_eq!(config.envoy_rls.listen, None);
        Ok(())
    });
}

/// A value that holds a line break cannot end a comment and start a line
/// of TOML: the comments escape it, the strings keep it.
#[test]
#[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
fn a_line_break_in_a_value_stays_inside_its_comment_and_string() {
    let imported = import(
        "domain: inject
descriptors:
  - key: k
    value: \"x\\n[server]\\nlisten = 1\"
    rate_limit: { unit: second, requests_per_unit: 1 }
",
    );
    assert!(imported.toml.contains("# inject: k=x\\n[server]\\nlisten = 1: 1 per second\n"));
    let (rules, _) = parsed(&imported);
    assert_eq!(rules[0].descriptor, ["k=x\n[server]\nlisten = 1"]);
    Jail::expect_with(|jail| {
        jail.create_file("app.toml", &imported.toml)?;
        let config = AppConfig::load(&ConfigSources::new(Some(PathBuf::from("app.toml"))))
            .unwrap_or_else(|error| panic!("{error}\n{}", imported.toml));
        assert_eq!(config.envoy_rls.rules.len(), 1);
        Ok(())
    });
}

/// The restated default policy is the one a configuration without a
/// `policies` table gets, under the same id.
#[test]
#[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
fn the_restated_default_policy_is_the_built_in_one() {
    Jail::expect_with(|jail| {
        jail.create_file("empty.toml", "")?;
        let config = AppConfig::load(&ConfigSources::file_only(PathBuf::from("empty.toml")))
            .unwrap_or_else(|error| panic!("{error}"));
        let policies = &config.capabilities.rate_limit.policies;
        assert_eq!(policies.keys().collect::<Vec<_>>(), [crate::DEFAULT_POLICY]);
        assert_eq!(policies[crate::DEFAULT_POLICY], built_in_policy());
        Ok(())
    });
}

/// A key may repeat along a path, as in envoyproxy/ratelimit's
/// `test/config/share_threshold.yaml`: the rule's entries match by position.
#[test]
fn a_key_twice_in_one_path_is_a_rule_of_both() {
    let imported = import(
        "domain: twice
descriptors:
  - key: header
    descriptors:
      - key: header
        rate_limit: { unit: second, requests_per_unit: 1 }
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: { unit: minute, requests_per_unit: 300 }
",
    );
    let (rules, _) = parsed(&imported);
    let descriptors: Vec<&[String]> = rules.iter().map(|rule| &rule.descriptor[..]).collect();
    assert_eq!(descriptors, [&["header", "header"][..], &["files=top/*", "files=nested/*"][..]]);
    // Both shared: one budget for every pair of values they match.
    assert!(
        imported
            .toml
            .contains("descriptor = [\"files=top/*\", \"files=nested/*\"]\nsubject = []\n"),
        "{}",
        imported.toml
    );
}

/// A subject names keys, each standing for all its entries: a repeated
/// key shared at one entry and counted apart at another cannot be said.
#[test]
fn a_repeated_key_both_shared_and_counted_apart_is_refused() {
    let problems = refused(
        "domain: twice
descriptors:
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        rate_limit: { unit: minute, requests_per_unit: 300 }
",
    );
    assert_eq!(
        problems,
        ["rl.yaml:7: twice > files=top/* > files=nested/*: key \"files\" repeats in the path, \
          shared (share_threshold) at one entry and counted apart at another: a rule's subject \
          names a key for all its entries"]
    );
}

/// Random descriptor trees: for every request descriptor, the first rule
/// that matches gives what envoyproxy/ratelimit's lookup gives (its
/// `GetLimit`: per entry the `key_value` node, else the bare `key` node,
/// never back up; a limit only at the request's last entry).
mod matches_envoy {
    use proptest::prelude::*;

    use super::{first_match, import, parsed};

    #[derive(Debug, Clone, Copy)]
    enum Limit {
        Requests(u32),
        Unlimited,
    }

    #[derive(Debug, Clone)]
    struct Node {
        key: String,
        value: Option<String>,
        limit: Option<Limit>,
        children: Vec<Node>,
    }

    impl Node {
        fn entry(&self) -> String {
            match &self.value {
                Some(value) => format!("{}={value}", self.key),
                None => self.key.clone(),
            }
        }
    }

    /// Keys `k<depth><i>`, so no key repeats along a path; values `v0`, `v1`
    /// (requests also send `v2`, which no descriptor names).
    fn level(depth: usize) -> BoxedStrategy<Vec<Node>> {
        let limit = prop_oneof![
            1 => Just(None),
            3 => (1u32..9).prop_map(|n| Some(Limit::Requests(n))),
            1 => Just(Some(Limit::Unlimited)),
        ];
        let children = if depth < 2 { level(depth + 1) } else { Just(Vec::new()).boxed() };
        let node = (0..2usize, prop::option::of(0..2usize), limit, children).prop_map(
            move |(key, value, limit, children)| Node {
                key: format!("k{depth}{key}"),
                value: value.map(|value| format!("v{value}")),
                limit,
                children,
            },
        );
        prop::collection::vec(node, 0..4)
            .prop_map(|mut nodes| {
                let mut seen = Vec::new();
                nodes.retain(|node| {
                    let id = (node.key.clone(), node.value.clone());
                    let fresh = !seen.contains(&id);
                    seen.push(id);
                    fresh
                });
                nodes
            })
            .boxed()
    }

    fn yaml(nodes: &[Node], indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        for node in nodes {
            out.push_str(&format!("{pad}- key: {}\n", node.key));
            if let Some(value) = &node.value {
                out.push_str(&format!("{pad}  value: {value}\n"));
            }
            match node.limit {
                Some(Limit::Requests(n)) => out.push_str(&format!(
                    "{pad}  rate_limit: {{ unit: second, requests_per_unit: {n} }}\n"
                )),
                Some(Limit::Unlimited) => {
                    out.push_str(&format!("{pad}  rate_limit: {{ unlimited: true }}\n"));
                }
                None => {}
            }
            if !node.children.is_empty() {
                out.push_str(&format!("{pad}  descriptors:\n"));
                yaml(&node.children, indent + 4, out);
            }
        }
    }

    /// envoyproxy/ratelimit's answer: the path of the limiting descriptor,
    /// or `None` for OK (no match, no limit, or unlimited).
    fn envoy(mut level: &[Node], request: &[(String, String)]) -> Option<Vec<String>> {
        let mut path = Vec::new();
        for (at, (key, value)) in request.iter().enumerate() {
            let node = level
                .iter()
                .find(|node| node.key == *key && node.value.as_ref() == Some(value))
                .or_else(|| level.iter().find(|node| node.key == *key && node.value.is_none()))?;
            path.push(node.entry());
            if at == request.len() - 1 {
                return matches!(node.limit, Some(Limit::Requests(_))).then_some(path);
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }

    /// Every request of 1 to 3 entries over the keys and values above.
    fn requests() -> Vec<Vec<(String, String)>> {
        let mut all: Vec<Vec<(String, String)>> = vec![Vec::new()];
        let mut out = Vec::new();
        for depth in 0..3 {
            let mut next = Vec::new();
            for request in &all {
                for key in 0..2 {
                    for value in 0..3 {
                        let mut longer = request.clone();
                        longer.push((format!("k{depth}{key}"), format!("v{value}")));
                        next.push(longer);
                    }
                }
            }
            out.extend(next.iter().cloned());
            all = next;
        }
        out
    }

    proptest! {
        #[test]
        fn the_first_matching_rule_answers_as_envoyproxy_ratelimit(tree in level(0)) {
            let mut text = "domain: p\ndescriptors:\n".to_owned();
            yaml(&tree, 2, &mut text);
            let (rules, _) = parsed(&import(&text));
            for request in requests() {
                let pairs: Vec<(&str, &str)> =
                    request.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
                let ours = first_match(&rules, "p", &pairs)
                    .filter(|rule| rule.policy.is_some())
                    .map(|rule| rule.descriptor.clone());
                prop_assert_eq!(ours, envoy(&tree, &request), "request {:?}\n{}", request, text);
            }
        }
    }
}
