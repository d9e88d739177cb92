//! Secret configuration values: given inline or read from a named variable,
//! and never printed.

use std::cell::Cell;
use std::fmt;

use secrecy::{ExposeSecret, SecretSlice, SecretString};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};
use sha2::{Digest, Sha256};

/// What a redacted secret reads as.
pub(crate) const REDACTED: &str = "[REDACTED]";

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

/// A secret and its source. `Debug` and `Serialize` (what `check-config`
/// prints) show the source, never the value: `[REDACTED]`, or the same
/// `{ env = "VAR" }` the file holds.
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

impl Serialize for SecretValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if FINGERPRINTING.get() {
            return serializer.serialize_str(&fingerprint(self.expose()));
        }
        match &self.source {
            SecretSource::Inline | SecretSource::Generated => serializer.serialize_str(REDACTED),
            SecretSource::Env(name) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("env", name)?;
                map.end()
            }
        }
    }
}

/// `"..."` (inline) or `{ env = "VAR" }`, read from the variable now. The
/// value is never echoed in a problem.
impl<'de> Deserialize<'de> for SecretValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Secret)
    }
}

struct Secret;

impl<'de> Visitor<'de> for Secret {
    type Value = SecretValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string or { env = \"VAR\" }")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<SecretValue, E> {
        Ok(SecretValue::new(SecretSource::Inline, text.into()))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<SecretValue, E> {
        Err(E::custom(DIGITS))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<SecretValue, E> {
        Err(E::custom(DIGITS))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<SecretValue, E> {
        Err(E::custom(DIGITS))
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<SecretValue, M::Error> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct FromEnv {
            env: EnvVar,
        }
        let FromEnv { env } = FromEnv::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(env.0)
    }
}

const DIGITS: &str = "expected a string; a secret written as a bare number (digits, or a \
                      decimal) reads as a number, so quote it (in an environment variable: \
                      '\"...\"')";

/// The secret in the named variable.
struct EnvVar(SecretValue);

impl<'de> Deserialize<'de> for EnvVar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        match std::env::var(&name) {
            Ok(secret) => Ok(Self(SecretValue::new(SecretSource::Env(name), secret.into()))),
            Err(std::env::VarError::NotPresent) => {
                Err(de::Error::custom(format!("environment variable {name} is not set")))
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(de::Error::custom(format!("environment variable {name} is not UTF-8")))
            }
        }
    }
}

thread_local! {
    /// Set while [`fingerprinted`] runs on this thread.
    static FINGERPRINTING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `render` with every [`SecretValue`] serialized as the SHA-256
/// fingerprint of its value instead of redacted, so two configurations can
/// be compared (a reload tells a changed password from an unchanged one)
/// without either holding the secret. Never printed.
pub(crate) fn fingerprinted<T>(render: impl FnOnce() -> T) -> T {
    /// Restores the mode even if `render` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            FINGERPRINTING.set(self.0);
        }
    }
    let _restore = Restore(FINGERPRINTING.replace(true));
    render()
}

/// `sha256:<hex>` of `secret`.
pub(crate) fn fingerprint(secret: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(secret)))
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

    #[test]
    fn serialize_shows_the_source_and_a_fingerprint_only_when_asked() {
        let inline = SecretValue::new(SecretSource::Inline, SecretString::from("hunter2"));
        let env = SecretValue::new(SecretSource::Env("ADMIN_TOKEN".into()), "hunter2".into());
        let render = |secret: &SecretValue| serde_json::to_string(secret).unwrap();
        assert_eq!(render(&inline), r#""[REDACTED]""#);
        assert_eq!(render(&env), r#"{"env":"ADMIN_TOKEN"}"#);
        let fingerprint = fingerprinted(|| render(&inline));
        assert!(fingerprint.starts_with(r#""sha256:"#), "{fingerprint}");
        assert!(!fingerprint.contains("hunter2"), "{fingerprint}");
        assert_eq!(fingerprinted(|| render(&env)), fingerprint, "the value, not the source");
        // The mode ends with the call.
        assert_eq!(render(&inline), r#""[REDACTED]""#);
    }
}
