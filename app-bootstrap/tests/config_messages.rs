//! Start-up problems a new user meets when they first write their own
//! policies: what the message says about the built-in `default` policy.

use app_bootstrap::{AppConfig, ConfigSources};

fn problems_of(toml: &str) -> String {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, toml).expect("the file is written");
    let error = AppConfig::load(&ConfigSources::file_only(path)).expect_err("a problem");
    error.to_string()
}

#[test]
fn defining_a_policy_without_naming_a_default_says_the_built_in_one_is_gone() {
    // No default-policy: it stays the built-in `default`, which the file's
    // own policies replaced.
    let problems = problems_of(
        r#"
[capabilities.rate-limit.policies.api]
algorithm = "fixed-window"
limit = 10
window = "60s"
"#,
    );
    assert!(problems.contains("capabilities.rate-limit.default-policy"), "{problems}");
    assert!(problems.contains(r#""default" is not a policy"#), "{problems}");
    assert!(
        problems
            .contains(r#"the built-in "default" policy applies only while no policy is defined"#),
        "{problems}"
    );
    assert!(problems.contains("defining any replaces it"), "{problems}");
}

#[test]
fn another_missing_policy_is_not_blamed_on_the_built_in_one() {
    let problems = problems_of(
        r#"
[capabilities.rate-limit]
default-policy = "apii"

[capabilities.rate-limit.policies.api]
algorithm = "fixed-window"
limit = 10
window = "60s"
"#,
    );
    assert!(problems.contains(r#""apii" is not a policy"#), "{problems}");
    assert!(!problems.contains("built-in"), "{problems}");
}
