//! `VersionedPseudonymizer`: turns a raw subject into the keyed pseudonym
//! that is the only form of it allowed to cross the port.

use std::collections::BTreeMap;
use std::fmt;

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;
use shared_contract::SubjectDigest;

use crate::error::WebError;
use crate::subject::SubjectKind;

/// Shortest key accepted: the HMAC-SHA-256 output size, so the key is never
/// the weak point of the pseudonym.
pub const MIN_KEY_BYTES: usize = 32;

/// HMAC-SHA-256 pseudonyms under several versioned keys, one of them active.
///
/// The message is three frames, kind, canonical identity and operation id,
/// each a 4-byte big-endian byte length followed by the UTF-8 bytes. The
/// length prefix makes the framing unambiguous: `("ab", "c")` and
/// `("a", "bc")` are different messages. The output is
/// `v<version>:<64 lowercase hex digits>` (the full 256-bit tag).
///
/// Rotation: configure the new key next to the old one and make it active;
/// [`Self::pseudonymize_with`] still derives pseudonyms under an older
/// version. A new active version means new buckets, so budgets restart
/// once at rotation.
pub struct VersionedPseudonymizer {
    keys: BTreeMap<u32, SecretSlice<u8>>,
    active_version: u32,
}

impl VersionedPseudonymizer {
    /// Keys by version; each must have at least [`MIN_KEY_BYTES`] bytes, no
    /// version may repeat, and `active_version` must be among them.
    pub fn new(
        keys: impl IntoIterator<Item = (u32, SecretSlice<u8>)>,
        active_version: u32,
    ) -> Result<Self, WebError> {
        let mut by_version = BTreeMap::new();
        for (version, key) in keys {
            let length = key.expose_secret().len();
            if length < MIN_KEY_BYTES {
                return Err(WebError::KeyTooShort { version, length, minimum: MIN_KEY_BYTES });
            }
            if by_version.insert(version, key).is_some() {
                return Err(WebError::DuplicateKeyVersion(version));
            }
        }
        if !by_version.contains_key(&active_version) {
            return Err(WebError::UnknownKeyVersion(active_version));
        }
        Ok(Self { keys: by_version, active_version })
    }

    /// The version new pseudonyms are made with.
    pub fn active_version(&self) -> u32 {
        self.active_version
    }

    /// The pseudonym under the active key.
    pub fn pseudonymize(
        &self,
        kind: SubjectKind,
        identity: &str,
        operation_id: &str,
    ) -> SubjectDigest {
        let key = &self.keys[&self.active_version];
        digest(self.active_version, key, kind, identity, operation_id)
    }

    /// The pseudonym under the key of `version`.
    pub fn pseudonymize_with(
        &self,
        version: u32,
        kind: SubjectKind,
        identity: &str,
        operation_id: &str,
    ) -> Result<SubjectDigest, WebError> {
        let key = self.keys.get(&version).ok_or(WebError::UnknownKeyVersion(version))?;
        Ok(digest(version, key, kind, identity, operation_id))
    }
}

fn digest(
    version: u32,
    key: &SecretSlice<u8>,
    kind: SubjectKind,
    identity: &str,
    operation_id: &str,
) -> SubjectDigest {
    // HMAC accepts keys of any length; construction validated ours anyway.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.expose_secret())
        .expect("HMAC-SHA-256 accepts a key of any length");
    for part in [kind.as_str(), identity, operation_id] {
        mac.update(&frame_length(part).to_be_bytes());
        mac.update(part.as_bytes());
    }
    let tag = mac.finalize().into_bytes();
    SubjectDigest::parse(format!("v{version}:{}", hex::encode(tag)))
        .expect("a decimal version and 64 lowercase hex digits form a valid digest")
}

// Parts longer than 4 GiB cannot arrive: HTTP header and route limits cut
// them off long before. Saturating keeps the framing total anyway.
fn frame_length(part: &str) -> u32 {
    u32::try_from(part.len()).unwrap_or(u32::MAX)
}

// Key bytes never print: only the versions and which one is active.
impl fmt::Debug for VersionedPseudonymizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VersionedPseudonymizer")
            .field("versions", &self.keys.keys().collect::<Vec<_>>())
            .field("active_version", &self.active_version)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> SecretSlice<u8> {
        SecretSlice::from(vec![byte; 32])
    }

    fn single(version: u32, byte: u8) -> VersionedPseudonymizer {
        VersionedPseudonymizer::new([(version, key(byte))], version).unwrap()
    }

    #[test]
    fn matches_vectors_computed_with_python_hmac() {
        // Computed independently of this code with Python 3's standard library:
        // python3 -c 'import hmac,hashlib,struct; f=lambda s: struct.pack(">I", len(s.encode())) + s.encode(); print(hmac.new(KEY, f(KIND) + f(IDENTITY) + f(OPERATION), hashlib.sha256).hexdigest())'
        // with KEY = bytes(range(32)) for version 1 and
        // KEY = b"rotation-key-version-two-32bytes!" (33 bytes) for version 2.
        let sequential: Vec<u8> = (0u8..32).collect();
        let rotation = b"rotation-key-version-two-32bytes!".to_vec();
        let pseudonymizer = VersionedPseudonymizer::new(
            [(1, SecretSlice::from(sequential)), (2, SecretSlice::from(rotation))],
            1,
        )
        .unwrap();
        let vectors = [
            (
                SubjectKind::ClientIp,
                "203.0.113.7",
                "GET /api/orders/{id}",
                "v1:57ed907c613884fce08cfabb3e835f98d4fa43ef8cc0480a2f6cefe06fa1fbcf",
            ),
            (
                SubjectKind::ApiKey,
                "k-123",
                "POST /api/orders",
                "v1:3353d76ab4bc01498f9593ef42258c66f08810602f12f12b0ea88d61e77d78e0",
            ),
            (
                SubjectKind::Principal,
                "ユーザー",
                "GET /api/orders/{id}",
                "v1:d76fc58f0f9671b1bd196712bb3ef1a9eaad9c6b0a3744ac7d3092bb0336b2d2",
            ),
        ];
        for (kind, identity, operation, expected) in vectors {
            assert_eq!(pseudonymizer.pseudonymize(kind, identity, operation).as_str(), expected);
        }
        let under_two = pseudonymizer
            .pseudonymize_with(2, SubjectKind::ClientIp, "203.0.113.7", "GET /api/orders/{id}")
            .unwrap();
        assert_eq!(
            under_two.as_str(),
            "v2:8ab764e89ee2d7553fb44029c48d3c9b48613c4331573ddea8af97c7cd1897f0"
        );
    }

    #[test]
    fn framing_keeps_part_boundaries_apart() {
        let pseudonymizer = single(1, 0x42);
        let left = pseudonymizer.pseudonymize(SubjectKind::ApiKey, "ab", "c");
        let right = pseudonymizer.pseudonymize(SubjectKind::ApiKey, "a", "bc");
        assert_ne!(left, right);
    }

    #[test]
    fn output_carries_the_version_and_256_bits() {
        let digest = single(7, 0x01).pseudonymize(SubjectKind::ClientIp, "192.0.2.1", "GET /");
        let hex = digest.as_str().strip_prefix("v7:").expect("version prefix");
        assert_eq!(hex.len(), 64);
    }

    #[test]
    fn rotation_uses_the_active_key_and_versions_differ() {
        let both = VersionedPseudonymizer::new([(1, key(0x11)), (2, key(0x22))], 2).unwrap();
        let old = both.pseudonymize_with(1, SubjectKind::Principal, "alice", "GET /").unwrap();
        let new = both.pseudonymize_with(2, SubjectKind::Principal, "alice", "GET /").unwrap();
        assert_ne!(old, new);
        assert_eq!(both.active_version(), 2);
        assert_eq!(both.pseudonymize(SubjectKind::Principal, "alice", "GET /"), new);
        assert!(old.as_str().starts_with("v1:") && new.as_str().starts_with("v2:"));
        // The same key under the same version gives the same pseudonym in
        // another instance: versions, not instances, define buckets.
        assert_eq!(single(1, 0x11).pseudonymize(SubjectKind::Principal, "alice", "GET /"), old);
    }

    #[test]
    fn construction_refuses_short_duplicate_and_missing_keys() {
        let short = VersionedPseudonymizer::new([(1, SecretSlice::from(vec![0u8; 31]))], 1);
        assert_eq!(
            short.unwrap_err(),
            WebError::KeyTooShort { version: 1, length: 31, minimum: 32 }
        );
        let twice = VersionedPseudonymizer::new([(1, key(1)), (1, key(2))], 1);
        assert_eq!(twice.unwrap_err(), WebError::DuplicateKeyVersion(1));
        let inactive = VersionedPseudonymizer::new([(1, key(1))], 2);
        assert_eq!(inactive.unwrap_err(), WebError::UnknownKeyVersion(2));
        assert_eq!(
            single(1, 1).pseudonymize_with(3, SubjectKind::ApiKey, "k", "GET /").unwrap_err(),
            WebError::UnknownKeyVersion(3)
        );
    }

    #[test]
    fn debug_output_shows_versions_but_no_key_bytes() {
        let secret = b"0123456789abcdefghijklmnopqrstuvwxyz".to_vec();
        let pseudonymizer =
            VersionedPseudonymizer::new([(3, SecretSlice::from(secret))], 3).unwrap();
        let debug = format!("{pseudonymizer:?}");
        assert_eq!(debug, "VersionedPseudonymizer { versions: [3], active_version: 3 }");
        assert!(!debug.contains("0123"));
    }
}
