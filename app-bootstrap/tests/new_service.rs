// template-only:file (a generated service does not carry its generator's test)
//! `scripts/new-service.sh`: a service generated into a temp dir carries its
//! own name where the template had its own, holds none of the template's
//! names and is committed; bad names and a used directory are refused, and
//! a name the renames miss fails the generation. Building the generated
//! workspace is `.ci/run`'s step, not this test's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What the template calls itself, in every spelling the script renames.
const TEMPLATE_NAMES: [&str; 4] = ["ca-skeleton", "ca_skeleton", "ca:rl:", "ca-rate-limit"];

fn template() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_owned()
}

/// Runs `script NAME DEST`, with a git identity and no commit signing, so
/// the first commit is made whatever the machine's git configuration says.
fn generate_with(script: &Path, name: &str, dest: &Path) -> Output {
    Command::new("bash")
        .arg(script)
        .arg(name)
        .arg(dest)
        .env("GIT_AUTHOR_NAME", "new-service test")
        .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
        .env("GIT_COMMITTER_NAME", "new-service test")
        .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "commit.gpgsign")
        .env("GIT_CONFIG_VALUE_0", "false")
        .output()
        .expect("bash runs")
}

fn generate(name: &str, dest: &Path) -> Output {
    generate_with(&template().join("scripts/new-service.sh"), name, dest)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Every file under `root` except git's own, as (path from `root`, text).
fn files(root: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|name| name == ".git") {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
                found.push((relative, text));
            }
        }
    }
    found.sort();
    found
}

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git").arg("-C").arg(dir).args(args).output().expect("git runs");
    assert!(output.status.success(), "git {args:?}: {}", stderr(&output));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn a_generated_service_carries_its_name_and_none_of_the_templates() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("acme-edge");
    let output = generate("acme-edge", &dest);
    assert!(output.status.success(), "{}", stderr(&output));

    let files = files(&dest);
    for (path, text) in &files {
        let (path_lower, text_lower) = (path.to_lowercase(), text.to_lowercase());
        for old in TEMPLATE_NAMES.iter().chain(&["template-only"]) {
            assert!(!path_lower.contains(old), "{path}: its path holds {old}");
            let line = text_lower.lines().position(|line| line.contains(old));
            assert!(line.is_none(), "{path}:{}: holds {old}", line.unwrap_or_default() + 1);
        }
    }
    let text = |path: &str| {
        files
            .iter()
            .find(|(found, _)| found == path)
            .map(|(_, text)| text.as_str())
            .unwrap_or_else(|| panic!("{path} missing from the generated service"))
    };
    let anywhere = |wanted: &str| files.iter().any(|(_, text)| text.contains(wanted));

    // The binary, the env prefix, the metric prefix, the key prefix, the
    // ACL user, the README: each named for the service.
    assert!(text("app-bootstrap/Cargo.toml").contains("name = \"acme-edge\""));
    assert!(anywhere("\"ACME_EDGE_\""), "no ACME_EDGE_ env prefix");
    assert!(anywhere("concat!(\"acme_edge_\""), "no acme_edge_ metric prefix");
    assert!(anywhere("\"acme-edge:rl:\""), "no acme-edge:rl: key prefix");
    assert!(anywhere("\"acme-edge-rate-limit\""), "no acme-edge-rate-limit ACL user");
    assert!(text("README.md").starts_with("# acme-edge\n"), "{}", text("README.md"));

    // What only the template needs is left out; the rest is there.
    let readme = text("README.md");
    assert!(!readme.contains("Start your own service"), "{readme}");
    assert!(!text(".ci/run").contains("new-service"));
    assert!(text(".ci/run").contains("cargo test --workspace --locked"));
    assert!(text(".github/workflows/ci.yml").contains("bash .ci/run"));
    let template_only = ["scripts/new-service.sh", "app-bootstrap/tests/new_service.rs"];
    for gone in template_only {
        assert!(files.iter().all(|(path, _)| path != gone), "{gone} was copied");
    }
    let tracked = git(&template(), &["ls-files"]);
    let kept: Vec<&str> = tracked
        .lines()
        .filter(|path| !template_only.contains(path) && template().join(path).exists())
        .collect();
    for path in &kept {
        assert!(dest.join(path).exists(), "{path} was not copied");
    }
    assert_eq!(files.len(), kept.len(), "only the tracked files are copied");

    // Committed whole: a clean work tree with one commit.
    assert_eq!(git(&dest, &["status", "--porcelain"]), "");
    assert_eq!(git(&dest, &["rev-list", "--count", "HEAD"]).trim(), "1");
}

#[test]
fn bad_names_and_a_used_destination_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let too_long = "a".repeat(21);
    for name in [
        "",
        "Acme-edge",
        "acme_edge",
        "-acme",
        "acme-",
        "acme--edge",
        "1acme",
        "acme.edge",
        too_long.as_str(),
        "match",
        "ca-skeleton-two",
        "ca",
        "app-bootstrap",
        // Their variable prefixes would read the template's own secret
        // variables (REDIS_PASSWORD) or the toolchain's as configuration.
        "redis",
        "rate-limit",
        "rust",
        // ... or OpenTelemetry's, the TLS roots', the proxies' or
        // Kubernetes' own variables.
        "otel",
        "ssl",
        "http",
        "no",
        "kubernetes",
    ] {
        let dest = dir.path().join("refused");
        let output = generate(name, &dest);
        assert_eq!(output.status.code(), Some(1), "{name:?}: {}", stderr(&output));
        assert!(stderr(&output).starts_with("new-service: NAME"), "{name:?}: {}", stderr(&output));
        assert!(!dest.exists(), "{name:?} created {}", dest.display());
    }

    let used = dir.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("keep.txt"), "mine").unwrap();
    let output = generate("acme-edge", &used);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("is not empty"), "{}", stderr(&output));
    let left: Vec<_> =
        std::fs::read_dir(&used).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(left, ["keep.txt"]);
}

#[test]
fn a_template_name_the_renames_miss_fails_the_generation_naming_where() {
    // A template whose files hold, and are named with, spellings no rename
    // covers: in text, in a binary file and in a path.
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template");
    std::fs::create_dir_all(template.join("scripts")).unwrap();
    let script = template.join("scripts/new-service.sh");
    std::fs::copy(self::template().join("scripts/new-service.sh"), &script).unwrap();
    std::fs::write(template.join("README.md"), "# ca-skeleton-rs\n\nRun Ca-Skeleton here.\n")
        .unwrap();
    std::fs::write(template.join("logo.bin"), b"\0\x01ca-skeleton\0").unwrap();
    std::fs::write(template.join("Ca-Skeleton.md"), "named for it\n").unwrap();
    git(&template, &["init", "-q"]);
    git(&template, &["add", "-A"]);

    let dest = dir.path().join("acme-edge");
    let output = generate_with(&script, "acme-edge", &dest);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let stderr = stderr(&output);
    assert!(stderr.contains("README.md:3:Run Ca-Skeleton here."), "{stderr}");
    assert!(stderr.contains("logo.bin: a binary file holding a template name"), "{stderr}");
    assert!(stderr.contains("Ca-Skeleton.md: a path holding a template name"), "{stderr}");
    assert!(stderr.contains("still holds names of the template"), "{stderr}");
}
