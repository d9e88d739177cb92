//! `ca-skeleton-import envoy-ratelimit` as a user runs it: configurations
//! shaped like those of envoyproxy/ratelimit's README (written here) turn
//! into TOML that `check-config` accepts as it is (its checks, through
//! app-bootstrap's library); what cannot be converted is a warning on
//! stderr; bad YAML exits non-zero naming the file and line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use app_bootstrap::{AppConfig, BootstrapError, ConfigSources};

/// The binary with no variable of the test machine.
fn ca_skeleton_import() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ca-skeleton-import"));
    command.env_clear();
    command
}

/// Runs `command` to its end: its output, stdout and stderr as text.
fn run(command: &mut Command) -> (Output, String, String) {
    let output = command.output().expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stdout, stderr)
}

/// Writes `contents` to `dir/name` and gives its path.
fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write the file");
    path
}

/// What `ca-skeleton check-config --config <file>` checks, with no
/// variable of the test machine: the configuration loads, its operations
/// name served routes; its resolved TOML, or every problem.
fn check_config(file: PathBuf) -> Result<String, BootstrapError> {
    let config = AppConfig::load(&ConfigSources::file_only(file))?;
    config.check_operations(app_bootstrap::routes::api().operations())?;
    config.to_redacted_toml()
}

/// Per-address limits with an exception, a nested route limit in shadow
/// mode, an unlimited health check beside a limited bare key, and a
/// fixed value that envoyproxy/ratelimit never lets fall back.
const EDGE: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 20
  - key: remote_address
    value: 198.51.100.4
    rate_limit:
      unit: second
      requests_per_unit: 200
  - key: generic_key
    value: checkout
    descriptors:
      - key: remote_address
        shadow_mode: true
        rate_limit:
          unit: minute
          requests_per_unit: 30
  - key: generic_key
    value: health
    rate_limit:
      unlimited: true
  - key: generic_key
    rate_limit:
      unit: hour
      requests_per_unit: 5000
    descriptors:
      - key: remote_address
        rate_limit:
          unit: minute
          requests_per_unit: 600
";

/// A second domain: month and year windows, a replaced limit (its name
/// and the replacing rule's `replaces` carried over), a metric key.
const BILLING: &str = "\
domain: billing
descriptors:
  - key: account
    detailed_metric: true
    rate_limit:
      unit: month
      requests_per_unit: 100000
  - key: plan
    value: free
    descriptors:
      - key: account
        rate_limit:
          name: free_yearly
          unit: year
          requests_per_unit: 500000
  - key: plan
    value: trial
    descriptors:
      - key: account
        rate_limit:
          replaces:
            - name: free_yearly
          unit: week
          requests_per_unit: 700
";

#[test]
fn the_printed_toml_passes_check_config_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let edge = write(dir.path(), "edge.yaml", EDGE);
    let billing = write(dir.path(), "billing.yaml", BILLING);
    let (output, toml, stderr) =
        run(ca_skeleton_import().arg("envoy-ratelimit").arg(&edge).arg(&billing));
    assert!(output.status.success(), "{stderr}");
    // What cannot be converted is on stderr, one line each, with its line.
    let warnings: Vec<&str> = stderr.lines().filter(|line| line.starts_with("warning: ")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains("billing.yaml:3: billing > account: detailed_metric"), "{stderr}");

    let converted = write(dir.path(), "converted.toml", &toml);
    let resolved = check_config(converted)
        .unwrap_or_else(|problems| panic!("check-config refused the import:\n{problems}\n{toml}"));

    // check-config renders what it loaded: the rules, in envoyproxy/ratelimit's
    // precedence, and the windows.
    let resolved: toml::Table = toml::from_str(&resolved).unwrap();
    let rules: Vec<(String, String)> = resolved["envoy-rls"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| {
            let descriptor: Vec<&str> = rule["descriptor"]
                .as_array()
                .unwrap()
                .iter()
                .map(|entry| entry.as_str().unwrap())
                .collect();
            let answer =
                ["unlimited", "not-limited"].into_iter().find(|key| rule.get(*key).is_some());
            let policies = match (rule.get("policies"), answer) {
                (Some(toml::Value::String(one)), None) => one.clone(),
                (Some(toml::Value::Array(many)), None) => many[0].as_str().unwrap().to_owned(),
                (None, Some(answer)) => {
                    assert_eq!(rule[answer].as_bool(), Some(true));
                    format!("{answer} = true")
                }
                (policies, answer) => panic!("policies {policies:?}, {answer:?}"),
            };
            let replaces = rule.get("replaces").map(|names| format!(" replaces {names}"));
            (descriptor.join(" "), policies + &replaces.unwrap_or_default())
        })
        .collect();
    let expected = [
        ("remote_address=198.51.100.4", "edge.remote_address_198.51.100.4"),
        ("remote_address", "edge.remote_address"),
        ("generic_key=checkout remote_address", "edge.generic_key_checkout.remote_address"),
        // Not under the bare generic_key's limits, as there.
        ("generic_key=checkout", "not-limited = true"),
        ("generic_key=health", "unlimited = true"),
        ("generic_key=health remote_address", "not-limited = true"),
        ("generic_key", "edge.generic_key"),
        ("generic_key remote_address", "edge.generic_key.remote_address"),
        ("account", "billing.account"),
        ("plan=free account", "billing.plan_free.account"),
        ("plan=trial account", "billing.plan_trial.account replaces \"free_yearly\""),
    ];
    let expected: Vec<(String, String)> =
        expected.iter().map(|(d, p)| ((*d).to_owned(), (*p).to_owned())).collect();
    assert_eq!(rules, expected);
    let policies = &resolved["capabilities"]["rate-limit"]["policies"];
    let window = |id: &str| {
        let text = policies[id]["window"].as_str().unwrap();
        humantime_serde::re::humantime::parse_duration(text).unwrap().as_secs()
    };
    const DAY: u64 = 86_400;
    assert_eq!(window("billing.account"), 30 * DAY);
    assert_eq!(window("billing.plan_free.account"), 365 * DAY);
    assert_eq!(window("billing.plan_trial.account"), 7 * DAY);
    assert_eq!(window("edge.remote_address"), 1);
    assert_eq!(
        policies["edge.generic_key_checkout.remote_address"]["mode"].as_str(),
        Some("shadow")
    );
    // The unlimited rules need no policy.
    assert!(policies.get("unlimited").is_none());
}

#[test]
fn bad_yaml_exits_non_zero_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad =
        write(dir.path(), "bad.yaml", "domain: edge\ndescriptors:\n  - key: a\n      value: b\n");
    let (output, stdout, stderr) = run(ca_skeleton_import().arg("envoy-ratelimit").arg(&bad));
    assert!(!output.status.success());
    assert!(stdout.is_empty(), "nothing is printed: {stdout}");
    assert!(stderr.contains("bad.yaml: ") && stderr.contains("line 4"), "{stderr}");
}

/// An endless or huge input (`/dev/zero`, a FIFO, a wrong file) is refused
/// after a bounded read, naming the file, instead of taking the memory.
#[test]
fn an_input_past_16_mib_is_refused_naming_the_file() {
    let (output, stdout, stderr) =
        run(ca_skeleton_import().arg("envoy-ratelimit").arg("/dev/zero"));
    assert!(!output.status.success());
    assert!(stdout.is_empty(), "nothing is printed: {stdout}");
    assert!(stderr.contains("/dev/zero: larger than 16 MiB"), "{stderr}");
}

/// The fenced blocks of `markdown` whose info string is `language`.
fn blocks<'a>(markdown: &'a str, language: &str) -> Vec<&'a str> {
    let opening = format!("```{language}\n");
    markdown
        .split(opening.as_str())
        .skip(1)
        .map(|rest| &rest[..rest.find("```").expect("a closed block")])
        .collect()
}

/// The README's worked example: its YAML converts to the TOML it shows
/// (comments aside), and that passes check-config as it is.
#[test]
fn the_readme_example_prints_the_toml_it_shows() {
    let readme = include_str!("../README.md");
    let (yaml, toml) = (blocks(readme, "yaml"), blocks(readme, "toml"));
    assert_eq!((yaml.len(), toml.len()), (1, 1), "one worked example");
    let dir = tempfile::tempdir().unwrap();
    let edge = write(dir.path(), "edge.yaml", yaml[0]);
    let (output, printed, stderr) = run(ca_skeleton_import().arg("envoy-ratelimit").arg(&edge));
    assert!(output.status.success(), "{stderr}");
    let printed: toml::Table = toml::from_str(&printed).unwrap();
    let shown: toml::Table = toml::from_str(toml[0]).unwrap();
    assert_eq!(printed, shown);
    let shown = write(dir.path(), "shown.toml", toml[0]);
    if let Err(problems) = check_config(shown) {
        panic!("check-config refused the README's TOML:\n{problems}");
    }
}

/// envoyproxy/ratelimit's wildcard, `share_threshold`, `requests_per_unit:
/// 0` and `replaces` import into a configuration `check-config` takes.
#[test]
fn wildcards_shared_budgets_blocks_and_replaces_pass_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = write(
        dir.path(),
        "files.yaml",
        "domain: files
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: path
    value: /api/*
    rate_limit: { unit: minute, requests_per_unit: 20, name: api }
  - key: path
    value: /api/admin
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: tenant
    value: t*prod
    rate_limit: { unit: minute, requests_per_unit: 60, replaces: [{ name: api }] }
",
    );
    let (output, toml, stderr) = run(ca_skeleton_import().arg("envoy-ratelimit").arg(&yaml));
    assert!(output.status.success(), "{stderr}");
    let converted = write(dir.path(), "converted.toml", &toml);
    let resolved = check_config(converted)
        .unwrap_or_else(|problems| panic!("check-config refused the import:\n{problems}\n{toml}"));
    for line in ["subject = []", "blocked = true", "name = \"api\"", "replaces = \"api\""] {
        assert!(resolved.contains(line), "{line}: {resolved}");
    }
}

/// `--allow-override DOMAIN` sets `allow-override = true` on that domain's
/// limited rules only (an unlimited or blocked rule has no limit to
/// override), and the output still passes check-config; a domain no file
/// defines stops the import naming it.
#[test]
fn allow_override_marks_the_limited_rules_of_the_domains_named() {
    let dir = tempfile::tempdir().unwrap();
    let edge = write(dir.path(), "edge.yaml", EDGE);
    let billing = write(dir.path(), "billing.yaml", BILLING);
    let (output, toml, stderr) = run(ca_skeleton_import()
        .args(["envoy-ratelimit", "--allow-override", "edge"])
        .arg(&edge)
        .arg(&billing));
    assert!(output.status.success(), "{stderr}");
    let converted = write(dir.path(), "converted.toml", &toml);
    let resolved = check_config(converted).unwrap_or_else(|p| panic!("{p}\n{toml}"));
    let resolved: toml::Table = toml::from_str(&resolved).unwrap();
    let rules = resolved["envoy-rls"]["rules"].as_array().unwrap();
    for rule in rules {
        let allows = rule.get("allow-override").and_then(toml::Value::as_bool) == Some(true);
        let limited = rule.get("policies").is_some();
        let edge = rule["domain"].as_str() == Some("edge");
        assert_eq!(allows, edge && limited, "{rule}");
    }
    assert!(rules.iter().any(|rule| rule.get("allow-override").is_some()));

    let (output, stdout, stderr) =
        run(ca_skeleton_import().args(["envoy-ratelimit", "--allow-override", "edgy"]).arg(&edge));
    assert!(!output.status.success() && stdout.is_empty());
    assert!(stderr.contains("--allow-override edgy: no file defines this domain"), "{stderr}");
}
