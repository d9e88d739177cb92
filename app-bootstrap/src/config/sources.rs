//! Where configuration comes from: the TOML file, then the environment,
//! layered with figment. Built-in defaults fill whatever neither sets; they
//! are applied while reading (see `read`), not as a figment layer, because
//! figment merges tables key by key and would keep the demo policy next to
//! a user's own policies.

use std::path::{Path, PathBuf};

use figment::Figment;
use figment::Source;
use figment::providers::{Env, Format, Toml};
use figment::value::{Dict, Value};

use super::{ConfigProblems, KeyPath};
use crate::error::BootstrapError;

/// Prefix of every configuration variable.
pub const ENV_PREFIX: &str = "CA_SKELETON_";
/// The variable that names the configuration file (`--config` wins). It is
/// not a configuration key, so the environment layer skips it.
pub const CONFIG_FILE_ENV: &str = "CA_SKELETON_CONFIG";

/// The sources to layer: an optional TOML file, then `CA_SKELETON_*`
/// variables.
#[derive(Debug, Clone)]
pub struct ConfigSources {
    file: Option<PathBuf>,
    /// Whether `CA_SKELETON_*` variables are layered over the file.
    environment: bool,
}

impl Default for ConfigSources {
    /// No file, the environment layered: as [`Self::new`]`(None)`.
    fn default() -> Self {
        Self::new(None)
    }
}

impl ConfigSources {
    /// Defaults, then `file` (if any), then the environment.
    pub fn new(file: Option<PathBuf>) -> Self {
        Self { file, environment: true }
    }

    /// Defaults, then `file`, and no environment layer: what the file says
    /// alone, whatever variables the process has. For tests, which could
    /// otherwise only shut the machine's variables out by clearing the
    /// process environment, and that is global: it hid `PATH` from tests
    /// running at the same time.
    pub fn file_only(file: PathBuf) -> Self {
        Self { file: Some(file), environment: false }
    }

    /// The configuration file, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The layered figment: file, then environment (later wins).
    pub fn figment(&self) -> Figment {
        let mut figment = Figment::new();
        if let Some(file) = &self.file {
            figment = figment.merge(Toml::file_exact(file));
        }
        if self.environment { figment.merge(environment()) } else { figment }
    }

    /// Names the source of each problem.
    pub(crate) fn locate(figment: &Figment, tree: &Dict, problems: &mut ConfigProblems) {
        problems.locate(|path| Self::source_of(figment, tree, path));
    }

    /// Where the value at `path` came from (or, for a key left out, its
    /// table): `in FILE, line N`, or `from VARIABLE`.
    fn source_of(figment: &Figment, tree: &Dict, path: &KeyPath) -> Option<String> {
        let mut value: Option<&Value> = None;
        let mut found = 0;
        for (depth, key) in path.segments().iter().enumerate() {
            let next = match value {
                None => tree.get(key),
                Some(Value::Dict(_, dict)) => dict.get(key),
                Some(Value::Array(_, items)) => key.parse().ok().and_then(|i: usize| items.get(i)),
                Some(_) => None,
            };
            let Some(next) = next else { break };
            (value, found) = (Some(next), depth + 1);
        }
        let value = value?;
        let keys = &path.segments()[..found];
        match &figment.get_metadata(value.tag())?.source {
            Some(Source::File(file)) => {
                let text = std::fs::read_to_string(file).ok();
                Some(match text.and_then(|text| line_of(&text, keys)) {
                    Some(line) => format!("in {}, line {line}", file.display()),
                    None => format!("in {}", file.display()),
                })
            }
            _ if !matches!(value, Value::Dict(..)) => {
                let name = keys.join("__").to_ascii_uppercase().replace('-', "_");
                Some(format!("from {ENV_PREFIX}{name}"))
            }
            _ => Some("from the environment".to_owned()),
        }
    }

    /// The merged tree, before typing and validation, and the figment that
    /// knows where each value came from.
    pub(crate) fn merged_tree(&self) -> Result<(Figment, Dict), BootstrapError> {
        if let Some(file) = &self.file {
            if !file.is_file() {
                return Err(BootstrapError::ConfigSource(format!(
                    "configuration file {} does not exist or is not a file",
                    file.display()
                )));
            }
        }
        let figment = self.figment();
        let tree = figment.extract::<Dict>().map_err(|error| {
            // A file TOML cannot read (a syntax error, a number past 64 bits)
            // stops before any key is typed: say where, and name the key from
            // the line. Never the line itself: it may hold a key or token.
            let file = self.file.as_ref();
            let name = file.map(|file| file.display().to_string()).unwrap_or_default();
            let bytes = file.and_then(|file| std::fs::read(file).ok());
            let syntax = bytes.and_then(|bytes| {
                let text = match String::from_utf8(bytes) {
                    Ok(text) => text,
                    Err(error) => {
                        let at = error.utf8_error().valid_up_to();
                        let line = error.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
                        return Some(format!(
                            "{name}: line {}: not UTF-8, as TOML must be",
                            line + 1
                        ));
                    }
                };
                let error = toml::from_str::<toml::Table>(&text).err()?;
                let span = error.span()?;
                let line = text[..span.start].matches('\n').count() + 1;
                let column = text[..span.start].rsplit('\n').next().map_or(0, str::len) + 1;
                let key = key_path_at(&text, line);
                let key = key.map(|key| format!(" (key path {key})")).unwrap_or_default();
                let message = error.message().trim_end().replace('\n', "; ");
                let message = if message.is_empty() { "not valid TOML" } else { &message };
                Some(format!("{name}: TOML line {line}, column {column}: {message}{key}"))
            });
            BootstrapError::ConfigSource(syntax.unwrap_or_else(|| error.to_string()))
        })?;
        Ok((figment, tree))
    }
}

/// The line of a TOML text that sets `keys` (a table's header for a table).
fn line_of(text: &str, keys: &[String]) -> Option<usize> {
    let document = toml_edit::ImDocument::parse(text).ok()?;
    let mut table: &dyn toml_edit::TableLike = document.as_table();
    let mut span = None;
    let mut keys = keys.iter();
    while let Some(key) = keys.next() {
        let Some((key, item)) = table.get_key_value(key) else { break };
        span = key.span().or(span);
        table = match item {
            toml_edit::Item::ArrayOfTables(tables) => {
                let Some(table) = keys.next().and_then(|i| tables.get(i.parse().ok()?)) else {
                    break;
                };
                span = table.span().or(span);
                table
            }
            item => match item.as_table_like() {
                Some(table) => table,
                None => break,
            },
        };
    }
    span.map(|span| text[..span.start].matches('\n').count() + 1)
}

/// The dotted key path set on line `line` (1-based) of a TOML text: the
/// table its last header names (an array of tables with the index of the
/// entry), then the key before its `=`; a line inside a value that spans
/// several lines belongs to the key that opened it.
fn key_path_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    // An error at the very end (an array left open) is past the last line.
    let line = line.min(lines.len());
    let before = lines.get(..line.checked_sub(1)?)?;
    let is_header = |l: &str| l.trim_start().starts_with('[');
    let opened = lines.get(..line)?.iter().rev().take_while(|l| !is_header(l));
    // The nearest line at or above with a key: a continuation line has none.
    let assignment = opened.filter_map(|l| l.split_once('=')).find(|(key, _)| {
        let key = key.trim();
        let quoted = key.len() >= 2 && key.starts_with('"') && key.ends_with('"');
        quoted || (!key.is_empty() && !key.contains(['"', '[', ',', '#']))
    });
    let key = assignment?.0.trim();
    let Some(header) = before.iter().rev().find(|l| is_header(l)) else {
        return Some(key.to_owned());
    };
    // The header's name: between its brackets, before any comment after them.
    let name = |header: &str| {
        let name = header.trim_start().trim_start_matches('[');
        name.split_once(']').map_or(name, |(name, _)| name).trim().to_owned()
    };
    let table = name(header);
    let table = if header.trim_start().starts_with("[[") {
        let same = |l: &&&str| l.trim_start().starts_with("[[") && name(l) == table;
        format!("{table}.{}", before.iter().filter(same).count() - 1)
    } else {
        table
    };
    Some(format!("{table}.{key}"))
}

/// `CA_SKELETON_A__B_C=v` -> `a.b-c = v`: `__` separates levels and `_`
/// inside a level stands for `-`, because variable names cannot hold `-`.
fn environment() -> Env {
    Env::raw().filter_map(|name| configuration_key(name.as_str()).map(Into::into))
}

/// The key path a variable sets, or `None` for one that sets none: another
/// prefix, [`CONFIG_FILE_ENV`], or a name with a lower-case letter. Only
/// upper case is read (figment would match any case), so
/// `ca_skeleton_redis__urls` set by a shell or a tool that lower-cases
/// names is never taken for configuration.
fn configuration_key(name: &str) -> Option<String> {
    let path = name.strip_prefix(ENV_PREFIX)?;
    if path.is_empty() || name == CONFIG_FILE_ENV || path.bytes().any(|b| b.is_ascii_lowercase()) {
        return None;
    }
    Some(path.to_ascii_lowercase().replace("__", ".").replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use figment::Jail;

    use super::*;

    #[test]
    fn a_value_toml_cannot_read_is_named_by_its_key_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("big.toml");
        let policy = "[capabilities.rate-limit.policies.cal]\nalgorithm = \"fixed-window\"\n";
        std::fs::write(&file, format!("{policy}limit = 18446744073709551616\n")).unwrap();
        let error =
            ConfigSources::file_only(file).merged_tree().map(|_| ()).unwrap_err().to_string();
        assert!(error.contains("line 3"), "{error}");
        assert!(
            error.ends_with("(key path capabilities.rate-limit.policies.cal.limit)"),
            "{error}"
        );
        assert_eq!(key_path_at("top = 1\n", 1).as_deref(), Some("top"));
        assert_eq!(key_path_at("[a]\n# note\n\n", 2), None);
        // A comment after a header, the second of an array of tables, a
        // value's continuation line (found from outside).
        let text = "[t.p] # quota\nlimit = 1\n[[r]]\nd = 1\n[[r]]\nd = 2\nl = [\n  1,\n]\n";
        assert_eq!(key_path_at(text, 2).as_deref(), Some("t.p.limit"));
        assert_eq!(key_path_at(text, 4).as_deref(), Some("r.0.d"));
        assert_eq!(key_path_at(text, 6).as_deref(), Some("r.1.d"));
        assert_eq!(key_path_at(text, 8).as_deref(), Some("r.1.l"));
        let quoted = "[ops]\n\"GET /x\" = [\n  \"a=b\",\n]\n";
        assert_eq!(key_path_at(quoted, 3).as_deref(), Some("ops.\"GET /x\""));
        // Past the last line (an array left open at the end), found from
        // outside: the last line's key, no panic.
        assert_eq!(key_path_at("[t]\nx = [\n", 3).as_deref(), Some("t.x"));
        assert_eq!(key_path_at("", 1), None);
    }

    /// A syntax error names file, line, column and key, and never echoes
    /// the line: it may hold a pseudonymizer key or an admin token (found
    /// from outside, in check-config and the reload log).
    #[test]
    fn a_syntax_error_never_echoes_the_line_that_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.toml");
        let secret = "815f94d0a1b2c3d4e5f60718293a4b5c6d7e8f90";
        for (text, line, key) in [
            (format!("[pseudonymizer.keys]\n1 = \"{secret}\" x\n"), 2, "pseudonymizer.keys.1"),
            (format!("[admin]\ntoken = {secret}\n"), 2, "admin.token"),
            ("[server]\nx = [\n".to_owned(), 3, "server.x"),
            ("[server]\nx =\n".to_owned(), 2, "server.x"),
        ] {
            std::fs::write(&file, &text).unwrap();
            let sources = ConfigSources::file_only(file.clone());
            let error = sources.merged_tree().map(|_| ()).unwrap_err().to_string();
            assert!(!error.contains(secret) && !error.contains(" x"), "{error}");
            assert!(error.contains(&format!("TOML line {line}, column ")), "{error}");
            assert!(error.ends_with(&format!("(key path {key})")), "{error}");
            assert!(error.contains("bad.toml"), "{error}");
            assert!(!error.contains(": (key path"), "a message before the key: {error}");
        }
        std::fs::write(&file, b"[server]\nx = \"\xff\"\n").unwrap();
        let sources = ConfigSources::file_only(file.clone());
        let error = sources.merged_tree().map(|_| ()).unwrap_err().to_string();
        assert!(error.ends_with("bad.toml: line 2: not UTF-8, as TOML must be"), "{error}");
    }

    #[test]
    #[allow(clippy::result_large_err, reason = "figment::Jail fixes the closure's error type")]
    fn only_upper_case_variables_are_configuration() {
        Jail::expect_with(|jail| {
            // Built from the prefix, so a service made from this template
            // tests its own.
            let lower = ENV_PREFIX.to_ascii_lowercase();
            let mixed = format!("{}{}", &lower[..1], &ENV_PREFIX[1..]);
            jail.set_env(format!("{lower}capabilities__rate_limit__provider"), "redis");
            jail.set_env(format!("{mixed}REDIS__ENABLED"), "true");
            jail.set_env(format!("{ENV_PREFIX}redis__topology"), "cluster");
            jail.set_env(format!("{ENV_PREFIX}SERVER__HEADER_READ_TIMEOUT"), "3s");
            jail.set_env(format!("{lower}config"), "ignored.toml");
            let (_, tree) = ConfigSources::new(None).merged_tree().expect("the environment reads");
            let json = serde_json::to_value(&tree).expect("a tree");
            assert_eq!(json, serde_json::json!({ "server": { "header-read-timeout": "3s" } }));
            Ok(())
        });
    }
}
