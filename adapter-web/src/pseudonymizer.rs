//! `VersionedPseudonymizer`: turns a raw subject into the keyed pseudonym
//! that is the only form of it allowed to cross the port.

use std::collections::BTreeMap;
use std::fmt;

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;
use shared_contract::{SubjectDigest, SubjectPseudonymizer};

use crate::error::WebError;
use crate::subject::SubjectKind;

/// Shortest key accepted: the HMAC-SHA-256 output size, so the key is never
/// the weak point of the pseudonym.
pub const MIN_KEY_BYTES: usize = 32;

/// HMAC-SHA-256 pseudonyms under several versioned keys, one of them active.
///
/// The message is two frames, kind and canonical identity, each a 4-byte
/// big-endian byte length followed by the UTF-8 bytes. The length prefix
/// makes the framing unambiguous: `("ab", "c")` and `("a", "bc")` are
/// different messages. The output is the version and the full 256-bit tag,
/// printed `v<version>:<64 lowercase hex digits>`.
///
/// The pseudonym depends on the subject alone, not the operation: it is
/// the Redis Cluster hash tag every key of the subject shares, so one
/// policy set (whose keys may span operations) is one script on one slot.
/// Operations enter keys separately, as an [`shared_contract::OperationDigest`].
///
/// Rotation: configure the new key next to the old one and make it active;
/// [`Self::pseudonymize_with`] still derives pseudonyms under an older
/// version. A new active version means new buckets, so budgets restart
/// once at rotation.
pub struct VersionedPseudonymizer {
    keys: BTreeMap<u32, KeyedMac>,
    active_version: u32,
}

/// HMAC-SHA-256 already keyed with one version's key: a pseudonym clones
/// it instead of hashing the padded key again (two SHA-256 blocks saved per
/// request). It is as secret as the key, so it never prints.
#[derive(Clone)]
struct KeyedMac(Hmac<Sha256>);

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
            // HMAC accepts keys of any length; ours were checked above.
            let mac = <Hmac<Sha256> as Mac>::new_from_slice(key.expose_secret())
                .expect("HMAC-SHA-256 accepts a key of any length");
            if by_version.insert(version, KeyedMac(mac)).is_some() {
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
    pub fn pseudonymize(&self, kind: SubjectKind, identity: &str) -> SubjectDigest {
        let key = &self.keys[&self.active_version];
        digest(self.active_version, key, kind, identity)
    }

    /// The pseudonym under the key of `version`.
    pub fn pseudonymize_with(
        &self,
        version: u32,
        kind: SubjectKind,
        identity: &str,
    ) -> Result<SubjectDigest, WebError> {
        let key = self.keys.get(&version).ok_or(WebError::UnknownKeyVersion(version))?;
        Ok(digest(version, key, kind, identity))
    }
}

fn digest(version: u32, key: &KeyedMac, kind: SubjectKind, identity: &str) -> SubjectDigest {
    SubjectDigest::from_tag(version, &tag(key, [kind.as_str(), identity]))
        .expect("a 32-byte tag makes a valid digest")
}

/// HMAC-SHA-256 over the framed parts.
fn tag<'a>(key: &KeyedMac, parts: impl IntoIterator<Item = &'a str>) -> [u8; 32] {
    let mut mac = key.0.clone();
    for part in parts {
        mac.update(&frame_length(part).to_be_bytes());
        mac.update(part.as_bytes());
    }
    mac.finalize().into_bytes().into()
}

/// The framing of [`VersionedPseudonymizer::pseudonymize`] over any list
/// of frames, for a front end whose subjects are not HTTP's (Envoy's
/// descriptors): `pseudonymize(kind, identity)` is the frames
/// `[kind.as_str(), identity]`.
impl SubjectPseudonymizer for VersionedPseudonymizer {
    fn pseudonymize_frames(&self, frames: &mut dyn Iterator<Item = &str>) -> SubjectDigest {
        let key = &self.keys[&self.active_version];
        SubjectDigest::from_tag(self.active_version, &tag(key, frames))
            .expect("a 32-byte tag makes a valid digest")
    }
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
        // python3 -c 'import hmac,hashlib,struct; f=lambda s: struct.pack(">I", len(s.encode())) + s.encode(); print(hmac.new(KEY, f(KIND) + f(IDENTITY), hashlib.sha256).hexdigest())'
        // with KEY = bytes(range(32)) for version 1 and
        // KEY = b"rotation-key-version-two-32bytes!" (33 bytes) for version 2.
        // The first is the worked example of docs/ARCHITECTURE.md.
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
                "203.0.113.7/32",
                "v1:ebb86875561615151dcde4e2faca5ef791264ae17d27b582a93d102bc7cfba67",
            ),
            (
                SubjectKind::ClientIp,
                "2001:db8:1:2::/64",
                "v1:5ec82f5aded88df814168f90c5cfdfcbe780119a3c8126359e4edcdc106186b9",
            ),
            (
                SubjectKind::ApiKey,
                "k-123",
                "v1:d246ab7168f827743842f0d5e4031fbdc3ce365388a502b9943bdfadfcf5bd1a",
            ),
            (
                SubjectKind::Principal,
                "ユーザー",
                "v1:a561057b43584b70d5e456ba60e4e2f45bf50fc36186359a7d40636f1ab95f7b",
            ),
        ];
        for (kind, identity, expected) in vectors {
            assert_eq!(pseudonymizer.pseudonymize(kind, identity).to_string(), expected);
        }
        let under_two =
            pseudonymizer.pseudonymize_with(2, SubjectKind::ClientIp, "203.0.113.7/32").unwrap();
        assert_eq!(
            under_two.to_string(),
            "v2:76ce83273386b8b902fa0475cae0af0f91840fcbcfc63c5b9ecfeb563b380555"
        );
    }

    #[test]
    fn framing_keeps_part_boundaries_apart() {
        let keyed =
            || KeyedMac(<Hmac<Sha256> as Mac>::new_from_slice(key(0x42).expose_secret()).unwrap());
        assert_ne!(tag(&keyed(), ["ab", "c"]), tag(&keyed(), ["a", "bc"]));
        let pseudonymizer = single(1, 0x42);
        // The kind is framed too: one string as principal and as API key
        // are two subjects.
        assert_ne!(
            pseudonymizer.pseudonymize(SubjectKind::Principal, "alice"),
            pseudonymizer.pseudonymize(SubjectKind::ApiKey, "alice")
        );
    }

    /// See [`any_frames_take_the_same_framing_as_a_kind_and_identity`].
    const PYTHON_DESCRIPTOR_VECTOR: &str =
        "v1:d07cbfe158235f4a8bb581cbb118a7f4fefac1a2d29492ff2bdcf039747eb653";

    #[test]
    fn any_frames_take_the_same_framing_as_a_kind_and_identity() {
        let pseudonymizer = single(1, 0x42);
        let framed = pseudonymizer.pseudonymize_frames(&mut ["ip", "203.0.113.7/32"].into_iter());
        assert_eq!(framed, pseudonymizer.pseudonymize(SubjectKind::ClientIp, "203.0.113.7/32"));
        // Computed with Python 3's standard library as above, KEY = bytes(range(32)):
        // hmac.new(KEY, f("descriptor") + f("edge") + f("remote_address") + f("10.0.0.1"), hashlib.sha256)
        let sequential =
            VersionedPseudonymizer::new([(1, SecretSlice::from((0u8..32).collect::<Vec<_>>()))], 1)
                .unwrap();
        let descriptor = sequential.pseudonymize_frames(
            &mut ["descriptor", "edge", "remote_address", "10.0.0.1"].into_iter(),
        );
        assert_eq!(descriptor.to_string(), PYTHON_DESCRIPTOR_VECTOR);
        assert_ne!(
            descriptor,
            sequential.pseudonymize_frames(
                &mut ["descriptor", "edge", "remote_address10.0.0.1"].into_iter()
            )
        );
    }

    #[test]
    fn output_carries_the_version_and_256_bits() {
        let digest = single(7, 0x01).pseudonymize(SubjectKind::ClientIp, "192.0.2.1/32");
        let text = digest.to_string();
        let hex = text.strip_prefix("v7:").expect("version prefix");
        assert_eq!(hex.len(), 64);
        assert_eq!((digest.version(), digest.tag().len()), (7, 32));
    }

    #[test]
    fn rotation_uses_the_active_key_and_versions_differ() {
        let both = VersionedPseudonymizer::new([(1, key(0x11)), (2, key(0x22))], 2).unwrap();
        let old = both.pseudonymize_with(1, SubjectKind::Principal, "alice").unwrap();
        let new = both.pseudonymize_with(2, SubjectKind::Principal, "alice").unwrap();
        assert_ne!(old, new);
        assert_eq!(both.active_version(), 2);
        assert_eq!(both.pseudonymize(SubjectKind::Principal, "alice"), new);
        assert!(old.to_string().starts_with("v1:") && new.to_string().starts_with("v2:"));
        // The same key under the same version gives the same pseudonym in
        // another instance: versions, not instances, define buckets.
        assert_eq!(single(1, 0x11).pseudonymize(SubjectKind::Principal, "alice"), old);
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
            single(1, 1).pseudonymize_with(3, SubjectKind::ApiKey, "k").unwrap_err(),
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
