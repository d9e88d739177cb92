//! `SubjectDigest`: the only form in which a subject crosses the port.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::error::ContractError;

/// An opaque pseudonym `v<version>:<hex>` of at least 128 bits. The raw
/// identity (IP, API key, principal) never enters this crate's types, so it
/// cannot reach a provider, a key or a log line through the port.
///
/// Every request carries one, so the usual digests (`v` + up to 4 version
/// digits + `:` + 64 hex) are held inline: making or cloning one allocates
/// nothing. Longer ones are shared on the heap.
#[derive(Clone)]
pub struct SubjectDigest(Text);

/// Longest digest held inline: `v` + 4 version digits + `:` + 64 hex.
const INLINE: usize = 70;

#[derive(Clone)]
enum Text {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Arc<str>),
}

impl Text {
    fn new(text: &str) -> Self {
        match u8::try_from(text.len()) {
            Ok(len) if text.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                Self::Inline { len, bytes }
            }
            Ok(_) | Err(_) => Self::Shared(text.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Shared(text) => text.as_bytes(),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Only ASCII is ever written inline (`SubjectDigest::parse` and
            // `from_tag` check or make it), so this never fails.
            Self::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Self::Shared(text) => text,
        }
    }
}

impl PartialEq for SubjectDigest {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for SubjectDigest {}

// As a `String` of the same text hashes, so maps keyed by it are unchanged.
impl Hash for SubjectDigest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl SubjectDigest {
    /// Validates the `v<version>:<hex>` form: a decimal version of 1 to 10
    /// digits and 32 to 128 lowercase hex digits.
    pub fn parse(digest: impl Into<String>) -> Result<Self, ContractError> {
        let digest: String = digest.into();
        let invalid = |why: &str| Err(ContractError::InvalidSubjectDigest(why.to_owned()));
        let Some(rest) = digest.strip_prefix('v') else {
            return invalid("must start with 'v'");
        };
        let Some((version, hex)) = rest.split_once(':') else {
            return invalid("must be v<version>:<hex>");
        };
        if version.is_empty() || version.len() > 10 || !version.bytes().all(|b| b.is_ascii_digit())
        {
            return invalid("version must be 1 to 10 decimal digits");
        }
        if !(32..=128).contains(&hex.len()) {
            return invalid("digest must be 32 to 128 hex digits (128 to 512 bits)");
        }
        if !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return invalid("digest must be lowercase hex");
        }
        Ok(Self(Text::new(&digest)))
    }

    /// The digest `v<version>:<tag in lowercase hex>` of a keyed hash's
    /// output (16 to 64 bytes). Valid by construction, so unlike
    /// [`Self::parse`] nothing is checked character by character: the edge
    /// makes one per request.
    pub fn from_tag(version: u32, tag: &[u8]) -> Result<Self, ContractError> {
        if !(16..=64).contains(&tag.len()) {
            return Err(ContractError::InvalidSubjectDigest(
                "tag must be 16 to 64 bytes (128 to 512 bits)".to_owned(),
            ));
        }
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut digits = itoa::Buffer::new();
        let version = digits.format(version);
        // The longest text: 'v', 10 version digits, ':', 128 hex digits.
        let mut text = [0; 1 + 10 + 1 + 128];
        text[0] = b'v';
        let mut len = 1 + version.len();
        text[1..len].copy_from_slice(version.as_bytes());
        text[len] = b':';
        len += 1;
        for (pair, byte) in text[len..].chunks_exact_mut(2).zip(tag) {
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 0x0f)];
        }
        len += 2 * tag.len();
        let text = std::str::from_utf8(&text[..len])
            .map_err(|_| ContractError::InvalidSubjectDigest("not ASCII".to_owned()))?;
        Ok(Self(Text::new(text)))
    }

    /// The pseudonym as text, as it may appear in a storage key.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The pseudonym's bytes (its ASCII text), for a store that hashes and
    /// compares them without reading them as text.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// What turns a raw subject into its [`SubjectDigest`], given to every
/// inbound adapter so each front end names subjects with one key and one
/// framing: a keyed MAC over the frames in order (the subject kind first,
/// then the parts of its identity), each frame a 4-byte big-endian byte
/// length followed by its bytes, so no two frame lists make one message.
pub trait SubjectPseudonymizer: Send + Sync + fmt::Debug {
    /// The pseudonym of the subject `frames` names, under the active key.
    /// The frames are raw subject data: an implementation never keeps,
    /// logs or prints them.
    fn pseudonymize_frames(&self, frames: &mut dyn Iterator<Item = &str>) -> SubjectDigest;
}

// Debug and Display both print the whole pseudonym: it is not secret, and an
// operator matches it against keys and log lines, which carry it whole.
impl fmt::Debug for SubjectDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SubjectDigest({})", self.as_str())
    }
}

impl fmt::Display for SubjectDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_versioned_hex_of_at_least_128_bits() {
        let digest = SubjectDigest::parse(format!("v1:{}", "ab".repeat(16))).unwrap();
        assert_eq!(digest.as_str(), format!("v1:{}", "ab".repeat(16)));
        assert!(SubjectDigest::parse(format!("v42:{}", "0".repeat(64))).is_ok());
    }

    #[test]
    fn a_tag_becomes_the_digest_parse_accepts() {
        let tag: Vec<u8> = (0..32).map(|n| n * 8 + 1).collect();
        let made = SubjectDigest::from_tag(4_294_967_295, &tag).unwrap();
        let hex: String = tag.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(made.as_str(), format!("v4294967295:{hex}"));
        assert_eq!(SubjectDigest::parse(made.as_str()).unwrap(), made);
        assert_eq!(
            SubjectDigest::from_tag(0, &[0xab; 16]).unwrap().as_str(),
            format!("v0:{}", "ab".repeat(16))
        );
        for length in [0, 15, 65] {
            assert!(SubjectDigest::from_tag(1, &vec![0; length]).is_err(), "{length} bytes");
        }
    }

    #[test]
    fn short_and_long_digests_read_back_and_compare_alike() {
        let usual = format!("v1:{}", "ab".repeat(32));
        let long = format!("v1234567890:{}", "cd".repeat(64));
        for text in [&usual, &long] {
            let digest = SubjectDigest::parse(text.as_str()).unwrap();
            assert_eq!((digest.as_str(), digest.as_bytes()), (text.as_str(), text.as_bytes()));
            assert_eq!(digest.clone(), digest);
            assert_eq!(digest.to_string(), *text);
        }
        assert!(matches!(SubjectDigest::parse(usual.as_str()).unwrap().0, Text::Inline { .. }));
        assert!(matches!(SubjectDigest::parse(long.as_str()).unwrap().0, Text::Shared(_)));
        let hash = |digest: &SubjectDigest| {
            let mut hasher = std::hash::DefaultHasher::new();
            digest.hash(&mut hasher);
            hasher.finish()
        };
        let mut text_hasher = std::hash::DefaultHasher::new();
        usual.hash(&mut text_hasher);
        assert_eq!(hash(&SubjectDigest::parse(usual.as_str()).unwrap()), text_hasher.finish());
        assert_ne!(
            SubjectDigest::parse(usual.as_str()).unwrap(),
            SubjectDigest::parse(long).unwrap()
        );
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
            &format!("v1:{}", "a".repeat(129)),
            &format!("v1:{}}}", "a".repeat(32)),
        ] {
            assert!(SubjectDigest::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
