//! Sections whose owner derives `Deserialize`: the owner's serde names are
//! the keys and its `Default` the defaults, so no key is written here.
//!
//! A derived `Deserialize` stops at the first error. To report every
//! problem at once, each leaf the file (or the environment) sets is tried
//! on its own over the defaults: one that does not read is recorded under
//! its full key path, with the owner's message, and left at its default.

use figment::value::{Dict, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Reader;
use super::values::kind;
use crate::config::problems::KeyPath;

/// One value the configuration sets, by its keys below the section.
type Leaf = (Vec<String>, Value);

impl Reader<'_> {
    /// Reads the section `dict` at `path` as `T`. Keys in `own` belong to
    /// the caller (read by it, not by `T`) and are neither read nor unknown.
    pub(super) fn owned<T>(&mut self, dict: Option<&Dict>, path: &KeyPath, own: &[&str]) -> T
    where
        T: Serialize + DeserializeOwned + Default,
    {
        let Some(dict) = dict else { return T::default() };
        let Ok(Value::Dict(_, defaults)) = Value::serialize(T::default()) else {
            self.problem(path, "cannot be read (its owner is not a table)");
            return T::default();
        };
        let mut leaves = Vec::new();
        self.leaves(dict, &defaults, path, own, &mut Vec::new(), &mut leaves);
        let mut read = defaults;
        for (keys, value) in leaves {
            let items = match &value {
                Value::Array(tag, items) => Some((*tag, items.clone())),
                _ => None,
            };
            let before = replace(&mut read, &keys, value);
            if let Err(error) = Value::from(read.clone()).deserialize::<T>() {
                let at = keys.iter().fold(path.clone(), |at, key| at.child(key));
                // A bad item of a list is named by its index: each item is
                // tried alone. A rule of the whole list names the list.
                let alone: Vec<Value> = match (&before, items) {
                    (Some(Value::Array(..)), Some((tag, items))) => {
                        items.into_iter().map(|item| Value::Array(tag, vec![item])).collect()
                    }
                    _ => Vec::new(),
                };
                let mut named = false;
                for (index, item) in alone.into_iter().enumerate() {
                    let mut alone = read.clone();
                    replace(&mut alone, &keys, item);
                    if let Err(error) = Value::from(alone).deserialize::<T>() {
                        self.problem(&at.child(&index.to_string()), error.kind.to_string());
                        named = true;
                    }
                }
                if !named {
                    self.problem(&at, error.kind.to_string());
                }
                if let Some(before) = before {
                    replace(&mut read, &keys, before);
                }
            }
        }
        Value::from(read).deserialize().unwrap_or_default()
    }

    /// The leaves of `dict` that `defaults` knows, in key order; every
    /// other key is reported unknown. A list may be given as one
    /// comma-separated string, the form an environment variable carries.
    fn leaves(
        &mut self,
        dict: &Dict,
        defaults: &Dict,
        path: &KeyPath,
        own: &[&str],
        keys: &mut Vec<String>,
        out: &mut Vec<Leaf>,
    ) {
        let at = keys.iter().fold(path.clone(), |at, key| at.child(key));
        let known: Vec<&str> =
            own.iter().copied().chain(defaults.keys().map(String::as_str)).collect();
        self.unknown_keys(dict, &at, &known);
        for (key, value) in dict.iter().filter(|(key, _)| !own.contains(&key.as_str())) {
            let Some(default) = defaults.get(key) else { continue };
            keys.push(key.clone());
            match (default, value) {
                (_, Value::Empty(..)) => {}
                (Value::Dict(_, defaults), Value::Dict(_, dict)) => {
                    self.leaves(dict, defaults, path, &[], keys, out);
                }
                (Value::Dict(..), other) => {
                    let at = keys.iter().fold(path.clone(), |at, key| at.child(key));
                    self.problem(&at, format!("expected a table, found {}", kind(other)));
                }
                (Value::Array(..), Value::String(tag, text)) => {
                    let items = text
                        .split(',')
                        .map(str::trim)
                        .filter(|item| !item.is_empty())
                        .map(|item| Value::String(*tag, item.to_owned()))
                        .collect();
                    out.push((keys.clone(), Value::Array(*tag, items)));
                }
                (_, value) => out.push((keys.clone(), value.clone())),
            }
            keys.pop();
        }
    }
}

/// Puts `value` at `keys` in `root` and gives back what was there. The
/// keys follow the defaults' tables, so every table on the way exists.
fn replace(root: &mut Dict, keys: &[String], value: Value) -> Option<Value> {
    let (last, tables) = keys.split_last()?;
    let mut dict = root;
    for key in tables {
        let Some(Value::Dict(_, inner)) = dict.get_mut(key) else { return None };
        dict = inner;
    }
    dict.insert(last.clone(), value)
}
