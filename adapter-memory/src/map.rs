//! A shard's keys: a `hashbrown::HashTable` of entries by a hash the store
//! computes once per decision, so no subject or key is hashed twice. A held
//! key is 128 bytes on a 64-byte boundary: a look-up reads two cache lines.

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use shared_contract::{KeyState, KeyWrite, OperationDigest, SubjectDigest};
use std::hash::BuildHasher;

use crate::entry::Entry;

/// What a policy adds to its keys: its revision's namespace number, and
/// the operation of an operation-scoped policy, packed in 24 bytes (an
/// option of the digest's enum beside the namespace takes 32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeySlot {
    operation: [u64; 2],
    pub(crate) namespace: u32,
    /// 0 without an operation, 1 for a 64-bit digest, 2 for a 128-bit one.
    form: u8,
}

impl KeySlot {
    pub(crate) const fn new(namespace: u32, operation: Option<OperationDigest>) -> Self {
        let (bits, form) = match operation {
            None => (0, 0),
            Some(operation) => {
                let (bits, wide) = operation.bits();
                (bits, 1 + wide as u8)
            }
        };
        // The halves of a u128: the casts keep exactly 64 bits each.
        Self { operation: [(bits >> 64) as u64, bits as u64], namespace, form }
    }
}

/// One key as a look-up asks for it, with its hash ([`KeyHasher::key`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Key<'s> {
    pub(crate) slot: KeySlot,
    pub(crate) subject: &'s SubjectDigest,
    pub(crate) hash: u64,
}

/// A key held whole in its slot, no allocation per key. Its hash is not
/// kept: the table's control byte rejects most other keys, and growth,
/// which is rare, hashes the held key again.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Held {
    pub(crate) slot: KeySlot,
    subject: SubjectDigest,
    pub(crate) entry: Entry,
}

impl Held {
    fn is(&self, key: &Key<'_>) -> bool {
        self.slot == key.slot && same_subject(&self.subject, key.subject)
    }
}

/// Digest equality: the key version, then the tag's own bytes (not the
/// array's zeros after them).
fn same_subject(a: &SubjectDigest, b: &SubjectDigest) -> bool {
    a.version() == b.version() && same_bytes(a.tag(), b.tag())
}

/// Byte equality without a call out to `memcmp` for an id or a tag: up to 16
/// bytes as two overlapping words of 4 or 8 bytes, longer ones sixteen at a
/// time (the last compare may overlap).
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    fn at<const W: usize>(bytes: &[u8], at: usize) -> Option<[u8; W]> {
        bytes.get(at..at + W)?.try_into().ok()
    }
    let n = a.len();
    match n {
        _ if n != b.len() => false,
        4..8 => at::<4>(a, 0) == at::<4>(b, 0) && at::<4>(a, n - 4) == at::<4>(b, n - 4),
        8..=16 => at::<8>(a, 0) == at::<8>(b, 0) && at::<8>(a, n - 8) == at::<8>(b, n - 8),
        17.. => {
            let wide = |i| at::<16>(a, i) == at::<16>(b, i);
            (0..n - 16).step_by(16).all(wide) && wide(n - 16)
        }
        _ => a == b,
    }
}

/// Eight bytes of a tag as one number (the chunk is exactly eight).
fn word(bytes: &[u8]) -> u64 {
    bytes.try_into().map_or(0, u64::from_le_bytes)
}

/// The product of `a` and `b` folded to 64 bits: foldhash's mixing step.
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    // The halves of the product: the casts keep exactly 64 bits each.
    (product as u64) ^ ((product >> 64) as u64)
}

/// The store's hashes, seeded per store: subjects are keyed HMAC pseudonyms
/// no client chooses, and the seeds keep shard and bucket placement
/// unpredictable all the same.
#[derive(Clone)]
pub(crate) struct KeyHasher {
    seeds: [u64; 4],
    /// Operation digests, whose bits are theirs to hash.
    operations: RandomState,
}

impl KeyHasher {
    pub(crate) fn new() -> Self {
        let operations = RandomState::default();
        let seeds = [1u64, 2, 3, 4].map(|n| operations.hash_one(n) | 1);
        Self { seeds, operations }
    }

    /// The subject's hash, which picks the shard and seeds its keys' hashes:
    /// the tag sixteen bytes at a time, folded into the running hash.
    pub(crate) fn subject(&self, subject: &SubjectDigest) -> u64 {
        let [s0, s1, s2, s3] = self.seeds;
        let tag = subject.tag();
        let length = u64::try_from(tag.len()).unwrap_or(u64::MAX);
        let mut hash = fold(u64::from(subject.version()) ^ s0, length ^ s1);
        let mut chunks = tag.chunks_exact(16);
        for chunk in &mut chunks {
            hash = fold(word(&chunk[..8]) ^ s2 ^ hash, word(&chunk[8..]) ^ s3);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut padded = [0; 16];
            padded[..rest.len()].copy_from_slice(rest);
            hash = fold(word(&padded[..8]) ^ s2 ^ hash, word(&padded[8..]) ^ s3);
        }
        hash
    }

    /// A key's hash: its subject's with the slot's mixed in, so one
    /// subject's keys spread over the table.
    pub(crate) fn key<'s>(
        &self,
        slot: KeySlot,
        subject: &'s SubjectDigest,
        subject_hash: u64,
    ) -> Key<'s> {
        Key { slot, subject, hash: subject_hash ^ self.slot(slot) }
    }

    fn slot(&self, slot: KeySlot) -> u64 {
        let [s0, s1, ..] = self.seeds;
        let operation =
            if slot.form == 0 { 0 } else { self.operations.hash_one((slot.operation, slot.form)) };
        fold(u64::from(slot.namespace) ^ s1, operation ^ s0)
    }

    /// A held key's hash, as [`Self::key`] made it.
    fn held(&self, held: &Held) -> u64 {
        self.subject(&held.subject) ^ self.slot(held.slot)
    }
}

/// A shard's keys and their entries.
pub(crate) struct KeyMap {
    table: HashTable<Held>,
    hasher: KeyHasher,
}

impl KeyMap {
    pub(crate) fn new(hasher: KeyHasher) -> Self {
        Self { table: HashTable::new(), hasher }
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub(crate) fn get(&self, key: &Key<'_>) -> Option<&Entry> {
        self.table.find(key.hash, |held| held.is(key)).map(|held| &held.entry)
    }

    pub(crate) fn get_mut(&mut self, key: &Key<'_>) -> Option<&mut Entry> {
        self.table.find_mut(key.hash, |held| held.is(key)).map(|held| &mut held.entry)
    }

    /// Inserts a key the map does not hold, if the step wrote its `state`;
    /// the entry's expiry, `u64::MAX` when nothing was inserted.
    pub(crate) fn insert_written(
        &mut self,
        key: &Key<'_>,
        state: Option<KeyState>,
        write: Option<KeyWrite>,
    ) -> u64 {
        if state.is_none() {
            return u64::MAX;
        }
        let entry = Entry::new(state, write);
        let expiry = entry.expires_at;
        let held = Held { slot: key.slot, subject: *key.subject, entry };
        let hasher = &self.hasher;
        self.table.insert_unique(key.hash, held, |held| hasher.held(held));
        expiry
    }

    pub(crate) fn remove(&mut self, key: &Key<'_>) {
        if let Ok(found) = self.table.find_entry(key.hash, |held| held.is(key)) {
            found.remove();
        }
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.table.iter().map(|held| &held.entry)
    }

    pub(crate) fn retain(&mut self, keep: impl FnMut(&mut Held) -> bool) {
        self.table.retain(keep);
    }

    pub(crate) fn shrink_to(&mut self, capacity: usize) {
        let hasher = &self.hasher;
        self.table.shrink_to(capacity, |held| hasher.held(held));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_key_is_two_cache_lines_on_their_boundary() {
        assert_eq!((size_of::<Held>(), align_of::<Held>()), (128, 64));
    }

    #[test]
    fn subjects_compare_as_equality_does_at_every_tag_length() {
        for n in 16..=32 {
            let tag: Vec<u8> = (0..n).map(|i| u8::try_from(i * 7 % 251).unwrap()).collect();
            let a = SubjectDigest::from_tag(1, &tag).unwrap();
            assert!(same_subject(&a, &SubjectDigest::from_tag(1, &tag).unwrap()), "{n}");
            assert!(!same_subject(&a, &SubjectDigest::from_tag(2, &tag).unwrap()), "{n}");
            for at in 0..n {
                let mut other = tag.clone();
                other[at] ^= 1;
                let b = SubjectDigest::from_tag(1, &other).unwrap();
                assert!(!same_subject(&a, &b), "{n} differing at {at}");
            }
        }
        // One zero byte longer is another subject.
        let short = SubjectDigest::from_tag(1, &[0; 16]).unwrap();
        assert!(!same_subject(&short, &SubjectDigest::from_tag(1, &[0; 17]).unwrap()));
    }
}
