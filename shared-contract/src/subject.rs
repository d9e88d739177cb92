//! `SubjectDigest`: the only form in which a subject crosses the port.

use std::fmt;
use std::hash::{Hash, Hasher};

use crate::error::ContractError;

/// Fewest bytes of a digest's tag: 128 bits.
const MIN_TAG: usize = 16;
/// Most bytes of a digest's tag: 256 bits, HMAC-SHA-256's whole output. A
/// wider MAC is truncated to it, so a store's slot stays two cache lines.
const MAX_TAG: usize = 32;

/// An opaque pseudonym (key version and keyed hash): no raw identity crosses.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SubjectDigest {
    version: u32,
    len: u8,
    /// The tag, then zeros: equal digests are equal arrays.
    tag: [u8; MAX_TAG],
}

// Only the tag's own bytes: the zeros after it say nothing.
impl Hash for SubjectDigest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u32(self.version);
        self.tag().hash(state);
    }
}

impl SubjectDigest {
    /// Reads the printed form `v<version>:<hex>`: a decimal 32-bit version
    /// without leading zeros, and 16 to 32 bytes in lowercase hex.
    pub fn parse(digest: impl AsRef<str>) -> Result<Self, ContractError> {
        let digest = digest.as_ref();
        let invalid = |why: &str| Err(ContractError::InvalidSubjectDigest(why.to_owned()));
        let Some(rest) = digest.strip_prefix('v') else {
            return invalid("must start with 'v'");
        };
        let Some((version, hex)) = rest.split_once(':') else {
            return invalid("must be v<version>:<hex>");
        };
        // `u32::from_str` alone would take a sign and leading zeros, which
        // would print back as another text.
        let canonical = version.bytes().all(|b| b.is_ascii_digit())
            && (version == "0" || !version.starts_with('0'));
        let Some(version) = version.parse::<u32>().ok().filter(|_| canonical) else {
            return invalid("version must be a decimal 32-bit number without leading zeros");
        };
        if !(2 * MIN_TAG..=2 * MAX_TAG).contains(&hex.len()) || hex.len() % 2 != 0 {
            return invalid("digest must be an even count of 32 to 64 hex digits (16 to 32 bytes)");
        }
        // The `hex` crate reads either case; the printed form is lowercase.
        let mut tag = [0; MAX_TAG];
        if hex.bytes().any(|b| b.is_ascii_uppercase())
            || hex::decode_to_slice(hex, &mut tag[..hex.len() / 2]).is_err()
        {
            return invalid("digest must be lowercase hex");
        }
        Self::from_tag(version, &tag[..hex.len() / 2])
    }

    /// The digest of a keyed hash's output `tag` under the key of `version`.
    pub fn from_tag(version: u32, tag: &[u8]) -> Result<Self, ContractError> {
        if !(MIN_TAG..=MAX_TAG).contains(&tag.len()) {
            let why = "tag must be 16 to 32 bytes (128 to 256 bits)";
            return Err(ContractError::InvalidSubjectDigest(why.to_owned()));
        }
        let mut bytes = [0; MAX_TAG];
        bytes[..tag.len()].copy_from_slice(tag);
        // At most MAX_TAG (32): the length fits a byte.
        Ok(Self { version, len: tag.len() as u8, tag: bytes })
    }

    /// The version of the key that made the pseudonym.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The keyed hash's output, 16 to 32 bytes.
    pub fn tag(&self) -> &[u8] {
        &self.tag[..usize::from(self.len)]
    }
}

/// What turns a raw subject into its [`SubjectDigest`] for every front: a
/// keyed MAC over frames (the subject kind first), each a 4-byte big-endian
/// length and its bytes, so no two frame lists make one message.
pub trait SubjectPseudonymizer: Send + Sync + fmt::Debug {
    /// The pseudonym of the raw subject `frames`, never kept, logged or printed.
    fn pseudonymize_frames(&self, frames: &mut dyn Iterator<Item = &str>) -> SubjectDigest;
}

// The whole pseudonym: it is not secret, and keys and log lines carry it.
impl fmt::Debug for SubjectDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SubjectDigest({self})")
    }
}

/// `v<version>:<tag in lowercase hex>`, as keys and log lines carry it.
impl fmt::Display for SubjectDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0; 2 * MAX_TAG];
        let text = &mut text[..2 * self.tag().len()];
        // Neither fails: the buffer is twice the tag, and hex is ASCII.
        hex::encode_to_slice(self.tag(), text).map_err(|_| fmt::Error)?;
        let hex = std::str::from_utf8(text).map_err(|_| fmt::Error)?;
        write!(f, "v{}:{hex}", self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_versioned_hex_of_at_least_128_bits() {
        let digest = SubjectDigest::parse(format!("v1:{}", "ab".repeat(16))).unwrap();
        assert_eq!(digest.to_string(), format!("v1:{}", "ab".repeat(16)));
        assert_eq!((digest.version(), digest.tag()), (1, &[0xab; 16][..]));
        assert!(SubjectDigest::parse(format!("v42:{}", "0".repeat(64))).is_ok());
    }

    #[test]
    fn a_tag_becomes_the_digest_parse_accepts() {
        let tag: Vec<u8> = (0..32).map(|n| n * 8 + 1).collect();
        let made = SubjectDigest::from_tag(4_294_967_295, &tag).unwrap();
        let hex: String = tag.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(made.to_string(), format!("v4294967295:{hex}"));
        assert_eq!(SubjectDigest::parse(made.to_string()).unwrap(), made);
        assert_eq!(
            SubjectDigest::from_tag(0, &[0xab; 16]).unwrap().to_string(),
            format!("v0:{}", "ab".repeat(16))
        );
        for length in [0, 15, 33] {
            assert!(SubjectDigest::from_tag(1, &vec![0; length]).is_err(), "{length} bytes");
        }
    }

    #[test]
    fn short_and_long_digests_read_back_and_compare_alike() {
        let usual = format!("v1:{}", "ab".repeat(32));
        let long = format!("v4294967295:{}", "cd".repeat(24));
        let shortest = format!("v0:{}", "0f".repeat(16));
        for text in [&usual, &long, &shortest] {
            let digest = SubjectDigest::parse(text.as_str()).unwrap();
            assert_eq!(digest.to_string(), *text);
            assert_eq!(format!("{digest:?}"), format!("SubjectDigest({text})"));
            let copy = digest;
            assert_eq!(copy, digest);
        }
        let hash = |digest: &SubjectDigest| {
            let mut hasher = std::hash::DefaultHasher::new();
            digest.hash(&mut hasher);
            hasher.finish()
        };
        let parsed = SubjectDigest::parse(usual.as_str()).unwrap();
        let made = SubjectDigest::from_tag(1, &[0xab; 32]).unwrap();
        assert_eq!((parsed, hash(&parsed)), (made, hash(&made)));
        // Another version, another length, a prefix: other digests.
        for other in [
            SubjectDigest::from_tag(2, &[0xab; 32]).unwrap(),
            SubjectDigest::from_tag(1, &[0xab; 31]).unwrap(),
            SubjectDigest::from_tag(1, &[0xab; 30]).unwrap(),
            SubjectDigest::parse(long.as_str()).unwrap(),
        ] {
            assert_ne!(other, parsed);
            assert_ne!(hash(&other), hash(&parsed));
        }
    }

    #[test]
    fn rejects_anything_that_could_be_a_raw_identity() {
        for bad in [
            "203.0.113.7",
            "v1:short",
            &format!("1:{}", "a".repeat(32)),
            &format!("v:{}", "a".repeat(32)),
            &format!("v1:{}", "A".repeat(32)),
            &format!("v1:{}", "g".repeat(32)),
            &format!("v1:{}", "a".repeat(65)),
            &format!("v1:{}", "a".repeat(66)),
            &format!("v1:{}}}", "a".repeat(32)),
        ] {
            assert!(SubjectDigest::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn rejects_texts_that_would_print_back_otherwise() {
        for bad in [
            format!("v1:{}", "a".repeat(33)),
            format!("v01:{}", "a".repeat(32)),
            format!("v+1:{}", "a".repeat(32)),
            format!("v4294967296:{}", "a".repeat(32)),
        ] {
            assert!(SubjectDigest::parse(bad.as_str()).is_err(), "{bad} accepted");
        }
    }
}
