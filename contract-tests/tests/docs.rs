//! The docs name what exists. Every backticked span of `README.md`,
//! `docs/*.md` and a crate's `README.md` that looks like code names identifiers found in the
//! workspace's sources, and every ```` ```rust <file> ```` block is a
//! verbatim excerpt of that file: a rename or an edit to the example breaks
//! this test instead of the reader.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Names of other systems the docs mention, which no source of ours spells.
const NOT_OURS: &[(&str, &str)] = &[
    ("TransactWriteItems", "DynamoDB's conditional batch write, named in the provider guide"),
    ("master_repl_offset", "a field of Redis's INFO replication, read by operators"),
];

/// The first words of a span that is a command line, not code.
const COMMANDS: &[&str] =
    &["cargo", "bash", "curl", "git", "redis-cli", "redis-server", "ca-skeleton", "kill", "ulimit"];

/// The provider guide, whose code is the example provider's.
const GUIDE: &str = "adding-a-provider.md";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md, docs/*.md and each crate folder's README.md, sorted.
fn doc_files() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    let mut crates: Vec<PathBuf> = fs::read_dir(root())
        .unwrap()
        .map(|entry| entry.unwrap().path().join("README.md"))
        .filter(|readme| readme.is_file())
        .collect();
    docs.sort();
    crates.sort();
    docs.insert(0, root().join("README.md"));
    docs.extend(crates);
    docs
}

/// Every identifier spelled in a source file (*.rs, *.lua, *.toml, *.sh and
/// the scripts under .ci/), and every *.rs file's stem: a module and an
/// integration-test binary are named by their file. This file is left out:
/// its allowlist and examples must not vouch for the docs.
fn source_words() -> HashSet<String> {
    let mut words = HashSet::new();
    let mut dirs = vec![root()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "target" && name != ".git" {
                    dirs.push(path);
                }
                continue;
            }
            let ext = path.extension().map(|ext| ext.to_string_lossy().into_owned());
            let in_ci = dir.file_name().is_some_and(|dir| dir == ".ci");
            if !in_ci && !matches!(ext.as_deref(), Some("rs" | "lua" | "toml" | "sh")) {
                continue;
            }
            if path.ends_with(file!()) {
                continue;
            }
            if ext.as_deref() == Some("rs") {
                words.insert(name.trim_end_matches(".rs").to_owned());
            }
            let Ok(text) = fs::read_to_string(&path) else { continue };
            words.extend(identifiers(&text).map(str::to_owned));
        }
    }
    words
}

fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
}

/// The inline code spans of a Markdown text outside fenced blocks, as
/// (line number, span).
fn spans(text: &str) -> Vec<(usize, &str)> {
    let mut spans = Vec::new();
    let mut fenced = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(open) = rest.find('`') {
            let ticks = rest[open..].len() - rest[open..].trim_start_matches('`').len();
            let after = &rest[open + ticks..];
            let fence = &rest[open..open + ticks];
            let Some(close) = after.find(fence) else { break };
            spans.push((index + 1, after[..close].trim()));
            rest = &after[close + ticks..];
        }
    }
    spans
}

/// `snake_case` with an inner underscore, or `CamelCase` with two humps.
fn looks_like_code(word: &str) -> bool {
    let snake = word.trim_matches('_').contains('_');
    let mut chars = word.chars();
    let camel = chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && word.chars().any(|c| c.is_ascii_lowercase())
        && chars.any(|c| c.is_ascii_uppercase());
    snake || camel
}

/// `t0`, `t_k`, `M_k`, `t_k0`: a formula's variable (one letter and an
/// index), not code.
fn is_math(word: &str) -> bool {
    let mut chars = word.chars();
    let letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest = chars.as_str();
    let (index, subscript) = rest.strip_prefix('_').map_or((rest, false), |index| (index, true));
    letter
        && (1..=2).contains(&index.len())
        && index.chars().all(|c| c.is_ascii_digit() || (subscript && c.is_ascii_alphanumeric()))
}

/// The identifiers a span names if it looks like code, else none: a path
/// (`a::b`, every segment) or a call (`f(..)`) names each identifier in it;
/// a bare word only if it looks like code. Commands, file paths, config
/// keys (kebab-case, dotted) and headers are not Rust and are left out.
fn code_names(span: &str) -> Vec<&str> {
    let first = span.split_whitespace().next().unwrap_or("");
    let path_or_call = span.contains("::") || span.contains('(');
    let command = COMMANDS.contains(&first) || first.starts_with("./") || span.contains(" --");
    let file = [".rs", ".md", ".toml", ".lua", ".sh", ".json", ".yml"]
        .iter()
        .any(|ext| span.contains(ext))
        || (span.contains('/') && !span.contains("::"));
    let prose = span.contains(char::is_whitespace) && !path_or_call && !span.contains('{');
    let key = !path_or_call && span.contains(['-', '.', '=']);
    if command || file || prose || key {
        return Vec::new();
    }
    identifiers(span)
        .filter(|word| !is_math(word))
        .filter(|word| path_or_call || looks_like_code(word))
        .collect()
}

#[test]
fn every_code_name_in_the_docs_exists_in_the_sources() {
    let words = source_words();
    let allowed: HashSet<&str> = NOT_OURS.iter().map(|(word, _)| *word).collect();
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        let text = fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        for (line, span) in spans(&text) {
            for word in code_names(span) {
                checked += 1;
                if !words.contains(word) && !allowed.contains(word) {
                    missing.push(format!("{name}:{line}: `{span}` names `{word}`"));
                }
            }
        }
    }
    // The docs name hundreds of items; a parser that finds none is broken.
    assert!(checked > 300, "only {checked} names checked");
    assert!(missing.is_empty(), "names in the docs that no source spells:\n{}", missing.join("\n"));
}

#[test]
fn every_allowed_name_is_still_in_the_docs_and_not_ours() {
    let words = source_words();
    let docs: String = doc_files().iter().map(|file| fs::read_to_string(file).unwrap()).collect();
    for (word, why) in NOT_OURS {
        assert!(docs.contains(&format!("`{word}`")), "{word} ({why}) is no longer in the docs");
        assert!(!words.contains(*word), "{word} is in the sources now: drop it from NOT_OURS");
    }
}

/// Each ```` ```rust <file> ```` block of the docs, as (`doc:line`, file,
/// block). In the provider guide, whose code is the example's, a
/// ```` ```rust ```` block without a file is an error, so none escapes the
/// excerpt check; elsewhere it is a sketch and is left out.
fn rust_blocks() -> Vec<(String, String, String)> {
    let mut blocks = Vec::new();
    for doc in doc_files() {
        let text = fs::read_to_string(&doc).unwrap();
        let name = doc.file_name().unwrap().to_string_lossy().into_owned();
        let mut open: Option<(usize, String, String)> = None;
        for (index, line) in text.lines().enumerate() {
            let fence = line.trim();
            match &mut open {
                None => {
                    if let Some(info) = fence.strip_prefix("```rust") {
                        let at = format!("{name}:{}", index + 1);
                        let quoted = !info.trim().is_empty();
                        assert!(quoted || name != GUIDE, "{at}: a ```rust block names its file");
                        open = Some((index + 1, info.trim().to_owned(), String::new()));
                    }
                }
                Some(_) if fence == "```" => {
                    let (start, source, block) = open.take().unwrap();
                    if !source.is_empty() {
                        blocks.push((format!("{name}:{start}"), source, block));
                    }
                }
                Some((_, _, block)) => {
                    block.push_str(line);
                    block.push('\n');
                }
            }
        }
    }
    blocks
}

#[test]
fn every_quoted_rust_block_is_a_verbatim_excerpt_of_its_file() {
    let blocks = rust_blocks();
    let guide = blocks.iter().filter(|(at, _, _)| at.starts_with(GUIDE)).count();
    assert!(guide >= 8, "the provider guide quotes its example ({guide} blocks)");
    for (at, source, block) in &blocks {
        let text = fs::read_to_string(root().join(source))
            .unwrap_or_else(|error| panic!("{at}: {source}: {error}"));
        assert!(
            text.lines()
                .collect::<Vec<_>>()
                .windows(block.lines().count())
                .any(|window| window.iter().copied().eq(block.lines())),
            "{at}: this block is not a verbatim run of lines of {source}:\n{block}"
        );
    }
}

#[test]
fn the_span_rules_keep_code_and_leave_out_what_is_not() {
    assert_eq!(code_names("evaluate_set"), ["evaluate_set"]);
    assert_eq!(code_names("SetVerdict"), ["SetVerdict"]);
    assert_eq!(code_names("shared_contract::KeyWrite"), ["shared_contract", "KeyWrite"]);
    assert_eq!(code_names("inspect_key(&rules, now)"), ["inspect_key", "rules", "now"]);
    assert_eq!(code_names("t_k = max(t0, M_k)"), ["max"]);
    for not_code in [
        "cargo test -p contract-tests --test docs",
        "capabilities.rate-limit.provider",
        "redis.enabled = true",
        "docs/algorithms.md",
        "RateLimit-Policy",
        "Mutex",
        "a few words",
    ] {
        assert_eq!(code_names(not_code), Vec::<&str>::new(), "{not_code}");
    }
}
