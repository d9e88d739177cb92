//! Store keys: a policy namespace plus a subject digest, hashed once.
//!
//! The hash is computed once per decision with the store's random-keyed
//! SipHash; it picks the shard and is then reused as-is by the shard's map
//! (a pass-through hasher), so a decision hashes the subject only once. A
//! lookup borrows the caller's `&str` through [`KeyView`], so only inserting
//! a new key allocates.

use std::borrow::Borrow;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// The parts of a key, owned or borrowed.
pub(crate) trait KeyView {
    fn prehash(&self) -> u64;
    fn namespace(&self) -> u32;
    fn subject(&self) -> &str;
}

/// A key as the map owns it; allocated once, when its entry is inserted.
#[derive(Debug)]
pub(crate) struct StoredKey {
    hash: u64,
    namespace: u32,
    subject: Box<str>,
}

/// A key borrowed from a request, for lookups.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LookupKey<'a> {
    pub(crate) hash: u64,
    pub(crate) namespace: u32,
    pub(crate) subject: &'a str,
}

impl LookupKey<'_> {
    pub(crate) fn to_stored(self) -> StoredKey {
        StoredKey { hash: self.hash, namespace: self.namespace, subject: self.subject.into() }
    }
}

impl KeyView for StoredKey {
    fn prehash(&self) -> u64 {
        self.hash
    }
    fn namespace(&self) -> u32 {
        self.namespace
    }
    fn subject(&self) -> &str {
        &self.subject
    }
}

impl KeyView for LookupKey<'_> {
    fn prehash(&self) -> u64 {
        self.hash
    }
    fn namespace(&self) -> u32 {
        self.namespace
    }
    fn subject(&self) -> &str {
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
            && self.subject == other.subject
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_borrowed_key_finds_the_stored_one() {
        let mut map: HashMap<StoredKey, u8, BuildPrehashed> = HashMap::default();
        let subject = String::from("v1:00112233445566778899aabbccddeeff");
        let lookup = LookupKey { hash: 42, namespace: 7, subject: &subject };
        map.insert(lookup.to_stored(), 1);
        assert_eq!(map.get(&lookup as &dyn KeyView), Some(&1));
        // Same hash, other namespace or subject: a different key.
        let other_ns = LookupKey { namespace: 8, ..lookup };
        assert_eq!(map.get(&other_ns as &dyn KeyView), None);
        let other_subject = LookupKey { subject: "v1:ffffffffffffffffffffffffffffffff", ..lookup };
        assert_eq!(map.get(&other_subject as &dyn KeyView), None);
    }
}
