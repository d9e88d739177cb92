//! Store keys: a policy namespace, an operation (0 for a subject-scoped
//! policy) and a subject digest.
//!
//! The subject is hashed once per decision with the store's random-seeded
//! [`SubjectHasher`]; that hash picks the shard, so every key of one subject (every
//! policy of a set) lives under one lock, and each key's map hash is mixed
//! from it cheaply and reused as-is by the shard's map (a pass-through
//! hasher), so a decision hashes the subject only once. A
//! lookup borrows the caller's bytes through [`KeyView`]. Digests of the
//! usual length (`v<version>:` plus 64 hex digits) are stored inline in the
//! map slot: no allocation per key, and no second cache miss to compare it.

use std::borrow::Borrow;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};

/// The parts of a key, owned or borrowed.
pub(crate) trait KeyView {
    fn prehash(&self) -> u64;
    fn namespace(&self) -> u32;
    fn operation(&self) -> u64;
    fn subject(&self) -> &[u8];
}

/// Longest subject stored inline: `v` + 4 version digits + `:` + 64 hex.
const INLINE: usize = 70;

/// A subject's bytes, inline when short enough.
#[derive(Debug)]
enum Subject {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Subject {
    fn new(source: &[u8]) -> Self {
        match u8::try_from(source.len()) {
            Ok(len) if source.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..source.len()].copy_from_slice(source);
                Self::Inline { len, bytes }
            }
            Ok(_) | Err(_) => Self::Heap(source.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(bytes) => bytes,
        }
    }
}

/// A key as the map owns it, built when its entry is inserted.
#[derive(Debug)]
pub(crate) struct StoredKey {
    hash: u64,
    namespace: u32,
    operation: u64,
    subject: Subject,
}

/// A key borrowed from a request, for lookups.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LookupKey<'a> {
    pub(crate) hash: u64,
    pub(crate) namespace: u32,
    pub(crate) operation: u64,
    pub(crate) subject: &'a [u8],
}

impl<'a> LookupKey<'a> {
    /// The key of (namespace, operation) for a subject whose store hash is
    /// `subject_hash`. The mix is a bijection of the subject hash for fixed
    /// namespace and operation, so distinct subjects keep distinct hashes.
    pub(crate) fn new(
        subject_hash: u64,
        namespace: u32,
        operation: u64,
        subject: &'a [u8],
    ) -> Self {
        let salt = u64::from(namespace).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ operation.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        let mixed = (subject_hash ^ salt).wrapping_mul(0xff51_afd7_ed55_8ccd);
        Self { hash: mixed ^ (mixed >> 33), namespace, operation, subject }
    }

    pub(crate) fn to_stored(self) -> StoredKey {
        StoredKey {
            hash: self.hash,
            namespace: self.namespace,
            operation: self.operation,
            subject: Subject::new(self.subject),
        }
    }
}

impl KeyView for StoredKey {
    fn prehash(&self) -> u64 {
        self.hash
    }
    fn namespace(&self) -> u32 {
        self.namespace
    }
    fn operation(&self) -> u64 {
        self.operation
    }
    fn subject(&self) -> &[u8] {
        self.subject.as_bytes()
    }
}

impl KeyView for LookupKey<'_> {
    fn prehash(&self) -> u64 {
        self.hash
    }
    fn namespace(&self) -> u32 {
        self.namespace
    }
    fn operation(&self) -> u64 {
        self.operation
    }
    fn subject(&self) -> &[u8] {
        self.subject
    }
}

// `HashMap<StoredKey, _>` looks up by `&dyn KeyView`: Hash and Eq below agree
// with StoredKey's own, as `Borrow` requires.
impl<'a> Borrow<dyn KeyView + 'a> for StoredKey {
    fn borrow(&self) -> &(dyn KeyView + 'a) {
        self
    }
}

impl Hash for dyn KeyView + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.prehash());
    }
}

impl PartialEq for dyn KeyView + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.prehash() == other.prehash()
            && self.namespace() == other.namespace()
            && self.operation() == other.operation()
            && self.subject() == other.subject()
    }
}

impl Eq for dyn KeyView + '_ {}

impl Hash for StoredKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for StoredKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && self.namespace == other.namespace
            && self.operation == other.operation
            && self.subject.as_bytes() == other.subject.as_bytes()
    }
}

impl Eq for StoredKey {}

/// Passes a key's precomputed hash through. Keys write exactly one `u64`;
/// `write` folds bytes (FNV-1a) only so any other use stays well defined.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// The hasher builder of every shard's map.
pub(crate) type BuildPrehashed = BuildHasherDefault<Prehashed>;

/// The subject hash of one store: foldhash (hashbrown's default), seeded per
/// store. Subjects reach the store as keyed HMAC pseudonyms, which no client
/// can choose; the seed still keeps shard and bucket placement unpredictable
/// to a caller that could. It replaced SipHash-1-3, which cost a seventh of
/// a decision on a 67-byte digest (docs/benchmarks.md).
#[derive(Clone, Default)]
pub(crate) struct SubjectHasher(foldhash::fast::RandomState);

impl SubjectHasher {
    /// A hasher with a seed of its own.
    pub(crate) fn random() -> Self {
        Self::default()
    }

    pub(crate) fn hash(&self, subject: &[u8]) -> u64 {
        self.0.hash_one(subject)
    }
}

// Seeds are as secret as a SipHash key: they never print.
impl std::fmt::Debug for SubjectHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubjectHasher")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_borrowed_key_finds_the_stored_one() {
        let mut map: HashMap<StoredKey, u8, BuildPrehashed> = HashMap::default();
        let subject = String::from("v1:00112233445566778899aabbccddeeff");
        let lookup =
            LookupKey { hash: 42, namespace: 7, operation: 0, subject: subject.as_bytes() };
        map.insert(lookup.to_stored(), 1);
        assert_eq!(map.get(&lookup as &dyn KeyView), Some(&1));
        // Same hash, other namespace or subject: a different key.
        let other_ns = LookupKey { namespace: 8, ..lookup };
        assert_eq!(map.get(&other_ns as &dyn KeyView), None);
        let other_operation = LookupKey { operation: 1, ..lookup };
        assert_eq!(map.get(&other_operation as &dyn KeyView), None);
        let other_subject = LookupKey { subject: b"v1:ffffffffffffffffffffffffffffffff", ..lookup };
        assert_eq!(map.get(&other_subject as &dyn KeyView), None);
    }

    #[test]
    fn short_and_long_subjects_both_round_trip() {
        let mut map: HashMap<StoredKey, u8, BuildPrehashed> = HashMap::default();
        let usual = format!("v1:{}", "ab".repeat(32));
        let long = format!("v1234567890:{}", "cd".repeat(64));
        for (n, subject) in [usual.as_bytes(), long.as_bytes()].into_iter().enumerate() {
            let lookup = LookupKey { hash: 9, namespace: 0, operation: 0, subject };
            map.insert(lookup.to_stored(), u8::try_from(n).unwrap());
        }
        assert!(matches!(Subject::new(usual.as_bytes()), Subject::Inline { .. }));
        assert!(matches!(Subject::new(long.as_bytes()), Subject::Heap(_)));
        let find = |subject: &[u8]| {
            map.get(&LookupKey { hash: 9, namespace: 0, operation: 0, subject } as &dyn KeyView)
        };
        assert_eq!((find(usual.as_bytes()), find(long.as_bytes())), (Some(&0), Some(&1)));
        // A prefix of an inline subject is another key.
        assert_eq!(find(&usual.as_bytes()[..66]), None);
    }

    #[test]
    fn subject_hashes_differ_by_content_length_and_seed() {
        let hasher = SubjectHasher::random();
        let usual = format!("v1:{}", "ab".repeat(32));
        let subjects =
            ["", "a", "a\0", "ab", &usual, &usual[..66], "v1:0123456789abcdef0123456789abcdef"];
        let mut hashes: Vec<u64> = subjects.iter().map(|s| hasher.hash(s.as_bytes())).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), subjects.len());
        assert_eq!(
            hasher.hash(usual.as_bytes()),
            hasher.clone().hash(usual.as_bytes()),
            "deterministic"
        );
        let random = SubjectHasher::random();
        assert_ne!(hasher.hash(usual.as_bytes()), random.hash(usual.as_bytes()), "seeded");
    }

    #[test]
    fn keys_of_one_subject_get_distinct_hashes() {
        let subject_hash = 0x0123_4567_89ab_cdef;
        let hashes: Vec<u64> = [(0, 0), (1, 0), (0, 1), (1, 1)]
            .iter()
            .map(|&(namespace, operation)| {
                LookupKey::new(subject_hash, namespace, operation, b"s").hash
            })
            .collect();
        let mut distinct = hashes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), hashes.len(), "{hashes:x?}");
    }
}
