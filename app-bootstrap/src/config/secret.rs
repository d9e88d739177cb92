//! Secret configuration values: given inline or read from a named variable,
//! and never printed.

use std::fmt;

use secrecy::{ExposeSecret, SecretSlice, SecretString};

/// Where a secret came from. The variable name is not secret and is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// Written in the file (or a `CA_SKELETON_...` variable) directly.
    Inline,
    /// `{ env = "VAR" }`: read from that environment variable at load time.
    Env(String),
    /// Made up at start because none was configured (memory provider only).
    Generated,
}

/// A secret and its source. `Debug` and the `check-config` rendering show
/// the source, never the value.
#[derive(Clone)]
pub struct SecretValue {
    source: SecretSource,
    value: SecretString,
}

impl SecretValue {
    /// Wraps a secret.
    pub fn new(source: SecretSource, value: SecretString) -> Self {
        Self { source, value }
    }

    /// Where it came from.
    pub fn source(&self) -> &SecretSource {
        &self.source
    }

    /// The secret itself; only the code that uses it calls this.
    pub fn expose(&self) -> &str {
        self.value.expose_secret()
    }

    /// The secret's bytes as key material.
    pub fn to_key_bytes(&self) -> SecretSlice<u8> {
        SecretSlice::from(self.expose().as_bytes().to_vec())
    }

    /// Length in bytes, safe to report.
    pub fn len(&self) -> usize {
        self.expose().len()
    }

    /// True for an empty secret.
    pub fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretValue")
            .field("source", &self.source)
            .field("value", &"[REDACTED]")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_the_source_but_never_the_value() {
        let secret = SecretValue::new(
            SecretSource::Env("PSEUDO_KEY".into()),
            SecretString::from("hunter2-hunter2"),
        );
        let debug = format!("{secret:?}");
        assert!(debug.contains("PSEUDO_KEY"), "{debug}");
        assert!(debug.contains("[REDACTED]"), "{debug}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert_eq!(secret.expose(), "hunter2-hunter2");
        assert_eq!(secret.len(), 15);
    }
}
