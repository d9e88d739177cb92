//! The typed leaves of the configuration tree: strings, numbers,
//! durations, lists and secrets, each read with its problem
//! recorded under its key path; and unknown-key detection with a
//! "did you mean" hint.

use std::str::FromStr;
use std::time::Duration;

use figment::value::{Dict, Value};
use humantime_serde::re::humantime;
use shared_contract::UnknownName;

use super::Reader;
use crate::config::problems::KeyPath;
use crate::config::secret::{SecretSource, SecretValue};

impl Reader<'_> {
    pub(super) fn problem(&mut self, path: &KeyPath, message: impl Into<String>) {
        self.problems.push(path.clone(), message);
    }

    /// The table at `path` (absent is fine), to read with [`Self::field`]
    /// and hand to [`Self::close`].
    pub(super) fn table<'v>(&mut self, value: Option<&'v Value>, path: KeyPath) -> Table<'v> {
        let dict = match value {
            None | Some(Value::Empty(..)) => None,
            Some(Value::Dict(_, dict)) => Some(dict),
            Some(other) => {
                self.problem(&path, format!("expected a table, found {}", kind(other)));
                None
            }
        };
        Table { dict, path, known: Vec::new(), closed: false }
    }

    /// Ends reading `table`: every key no reader call asked for is a
    /// problem of its own, so a typo never passes silently.
    pub(super) fn close(&mut self, mut table: Table<'_>) {
        table.closed = true;
        if let Some(dict) = table.dict {
            self.unknown_keys(dict, &table.path, &table.known);
        }
    }

    pub(super) fn unknown_keys(&mut self, dict: &Dict, path: &KeyPath, known: &[&str]) {
        for key in dict.keys().filter(|key| !known.contains(&key.as_str())) {
            let hint = match closest(key, known) {
                Some(near) => format!("did you mean `{near}`? "),
                None => String::new(),
            };
            // Several algorithms share a key name (`limit`): list each once.
            let mut expected: Vec<&str> = Vec::with_capacity(known.len());
            for name in known {
                if !expected.contains(name) {
                    expected.push(name);
                }
            }
            let expected = expected.join(", ");
            self.problem(
                &path.child(key),
                format!("unknown key ({hint}expected one of: {expected})"),
            );
        }
    }

    /// Reads `key` of `table` with `parse`; `None` when absent or bad.
    pub(super) fn field<T>(
        &mut self,
        table: &mut Table<'_>,
        key: &'static str,
        parse: fn(&mut Self, &Value, &KeyPath) -> Option<T>,
    ) -> Option<T> {
        match table.get(key)? {
            Value::Empty(..) => None,
            value => parse(self, value, &table.path.child(key)),
        }
    }

    /// A name of a named enum (`T::from_str` with [`UnknownName`]).
    pub(super) fn name<T: FromStr<Err = UnknownName>>(
        &mut self,
        value: &Value,
        path: &KeyPath,
    ) -> Option<T> {
        let text = self.string(value, path)?;
        text.parse().map_err(|error: UnknownName| self.problem(path, error.to_string())).ok()
    }

    /// A policy set: one id as a string, several comma-separated in one
    /// string (as every list reads from an environment variable; an id
    /// never holds a comma), or an array of ids. Emptiness, length and
    /// repeats are validation's (every problem at once).
    pub(super) fn policy_list(&mut self, value: &Value, path: &KeyPath) -> Option<Vec<String>> {
        match value {
            Value::String(..) | Value::Char(..) => self.string_list(value, path),
            Value::Array(_, items) => {
                let mut ids = Vec::with_capacity(items.len());
                let mut all_read = true;
                for (index, item) in items.iter().enumerate() {
                    match self.string(item, &path.child(&index.to_string())) {
                        Some(id) => ids.push(id),
                        None => all_read = false,
                    }
                }
                all_read.then_some(ids)
            }
            other => {
                self.problem(
                    path,
                    format!("expected a policy id or a list of them, found {}", kind(other)),
                );
                None
            }
        }
    }

    pub(super) fn string(&mut self, value: &Value, path: &KeyPath) -> Option<String> {
        match value {
            Value::String(_, text) => Some(text.clone()),
            Value::Char(_, c) => Some(c.to_string()),
            other => {
                self.problem(path, format!("expected a string, found {}", kind(other)));
                None
            }
        }
    }

    pub(super) fn u64(&mut self, value: &Value, path: &KeyPath) -> Option<u64> {
        self.whole(value, path, || format!("must be a whole number from 0 to {}", u64::MAX))
    }

    /// A whole number that fits `T`; `out_of_range` is the problem of one
    /// that does not (a negative or fractional number, or too large).
    fn whole<T: TryFrom<u128>>(
        &mut self,
        value: &Value,
        path: &KeyPath,
        out_of_range: impl FnOnce() -> String,
    ) -> Option<T> {
        match value {
            Value::Num(_, number) => {
                let whole = number.to_u128_lossy().and_then(|n| T::try_from(n).ok());
                if whole.is_none() {
                    self.problem(path, out_of_range());
                }
                whole
            }
            other => {
                self.problem(path, format!("expected a whole number, found {}", kind(other)));
                None
            }
        }
    }

    pub(super) fn u32(&mut self, value: &Value, path: &KeyPath) -> Option<u32> {
        let number = self.u64(value, path)?;
        let narrowed = u32::try_from(number).ok();
        if narrowed.is_none() {
            self.problem(path, format!("must be at most {}, got {number}", u32::MAX));
        }
        narrowed
    }

    /// `degraded.instances`: read as a `u32`, but a number out of range
    /// names the range the key accepts, 1 to `u32::MAX` (0 reads, and
    /// validation says why it is no fleet when the mode is enabled).
    pub(super) fn instances(&mut self, value: &Value, path: &KeyPath) -> Option<u32> {
        self.whole(value, path, || format!("must be a whole number from 1 to {}", u32::MAX))
    }

    pub(super) fn bool(&mut self, value: &Value, path: &KeyPath) -> Option<bool> {
        match value {
            Value::Bool(_, flag) => Some(*flag),
            other => {
                self.problem(path, format!("expected true or false, found {}", kind(other)));
                None
            }
        }
    }

    pub(super) fn duration(&mut self, value: &Value, path: &KeyPath) -> Option<Duration> {
        match value {
            Value::String(_, text) => match humantime::parse_duration(text.trim()) {
                Ok(duration) => Some(duration),
                Err(error) => {
                    self.problem(
                        path,
                        format!(
                            "{text:?} is not a duration ({error}); write a number with a unit, like \"750ms\" or \"60s\""
                        ),
                    );
                    None
                }
            },
            Value::Num(..) => {
                self.problem(
                    path,
                    "a bare number has no unit; write a duration string like \"750ms\" or \"60s\"",
                );
                None
            }
            other => {
                self.problem(
                    path,
                    format!("expected a duration string like \"60s\", found {}", kind(other)),
                );
                None
            }
        }
    }

    /// A list given as an array of strings or as one comma-separated string
    /// (the form an environment variable can carry).
    pub(super) fn string_list(&mut self, value: &Value, path: &KeyPath) -> Option<Vec<String>> {
        match value {
            Value::Array(_, items) => {
                let mut strings = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    strings.push(self.string(item, &path.child(&index.to_string()))?);
                }
                Some(strings)
            }
            Value::String(_, text) => Some(
                text.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            ),
            other => {
                self.problem(path, format!("expected an array of strings, found {}", kind(other)));
                None
            }
        }
    }

    /// `"..."` or `{ env = "VAR" }`. The value is never echoed in a problem.
    pub(super) fn secret(&mut self, value: &Value, path: &KeyPath) -> Option<SecretValue> {
        match value {
            Value::String(_, text) => {
                Some(SecretValue::new(SecretSource::Inline, text.clone().into()))
            }
            Value::Dict(..) => {
                let mut table = self.table(Some(value), path.clone());
                let name = self.field(&mut table, "env", Self::string);
                let has_env = table.has("env");
                self.close(table);
                let Some(name) = name else {
                    if !has_env {
                        self.problem(
                            &path.child("env"),
                            "missing: name the variable that holds the secret",
                        );
                    }
                    return None;
                };
                match std::env::var(&name) {
                    Ok(secret) => Some(SecretValue::new(SecretSource::Env(name), secret.into())),
                    Err(std::env::VarError::NotPresent) => {
                        self.problem(
                            &path.child("env"),
                            format!("environment variable {name} is not set"),
                        );
                        None
                    }
                    Err(std::env::VarError::NotUnicode(_)) => {
                        self.problem(
                            &path.child("env"),
                            format!("environment variable {name} is not UTF-8"),
                        );
                        None
                    }
                }
            }
            Value::Num(..) => {
                self.problem(
                    path,
                    "expected a string; a secret made only of digits reads as a number, so quote it (in an environment variable: '\"...\"')",
                );
                None
            }
            other => {
                self.problem(
                    path,
                    format!("expected a string or {{ env = \"VAR\" }}, found {}", kind(other)),
                );
                None
            }
        }
    }
}

/// A table being read. The keys asked of it are the keys it knows: what
/// [`Reader::close`] reports as unknown is whatever no reader call asked
/// for, so each key is named once, at the call that reads it.
#[must_use = "close the table so its unknown keys are reported"]
pub(super) struct Table<'v> {
    dict: Option<&'v Dict>,
    path: KeyPath,
    known: Vec<&'static str>,
    closed: bool,
}

impl<'v> Table<'v> {
    /// The value of `key`, which becomes a known key of this table.
    pub(super) fn get(&mut self, key: &'static str) -> Option<&'v Value> {
        self.known.push(key);
        self.dict?.get(key)
    }

    /// Whether the table holds `key` (known or not).
    pub(super) fn has(&self, key: &str) -> bool {
        self.dict.is_some_and(|dict| dict.contains_key(key))
    }

    /// The table's keys and values, if it is there.
    pub(super) fn dict(&self) -> Option<&'v Dict> {
        self.dict
    }

    /// Ends reading a table whose other keys a reader of its own checks
    /// (see `owned`), so none is reported unknown here.
    pub(super) fn close_read(mut self) {
        self.closed = true;
    }

    /// Whether the table is there at all.
    pub(super) fn is_present(&self) -> bool {
        self.dict.is_some()
    }

    /// The table's key path.
    pub(super) fn path(&self) -> &KeyPath {
        &self.path
    }
}

impl Drop for Table<'_> {
    fn drop(&mut self) {
        // A table dropped unclosed would let its typos pass unreported.
        debug_assert!(
            self.closed || std::thread::panicking(),
            "table {} was read but never closed",
            self.path
        );
    }
}

/// What kind of value this is, without its content (it may be a secret).
pub(super) fn kind(value: &Value) -> &'static str {
    match value {
        Value::String(..) | Value::Char(..) => "a string",
        Value::Bool(..) => "a boolean",
        Value::Num(..) => "a number",
        Value::Empty(..) => "an empty value",
        Value::Dict(..) => "a table",
        Value::Array(..) => "an array",
    }
}

pub(super) fn quoted(names: &[&str]) -> String {
    names.iter().map(|name| format!("{name:?}")).collect::<Vec<_>>().join(", ")
}

/// The known key within edit distance 2 of `key`, for "did you mean".
fn closest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|candidate| (edit_distance(key, candidate), *candidate))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY_KEYS: &[&str] = &["algorithm", "limit", "window", "capacity", "refill-period"];

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("window", "window"), 0);
        assert_eq!(edit_distance("windw", "window"), 1);
        assert_eq!(edit_distance("limt", "limit"), 1);
        assert_eq!(closest("windwo", POLICY_KEYS), Some("window"));
        assert_eq!(closest("zzzzzzzz", POLICY_KEYS), None);
    }
}
