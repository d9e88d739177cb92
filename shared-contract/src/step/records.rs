//! Evaluation dedupe records of one key, indexed by id.

use std::collections::{VecDeque, vec_deque};
use std::fmt;
use std::hash::BuildHasher;
use std::sync::OnceLock;

use foldhash::fast::RandomState;

use crate::evaluation::EvaluationId;

/// What a charged evaluation left for a repeat of its id to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupRecord {
    /// The evaluation that charged.
    pub evaluation_id: EvaluationId,
    /// Its `remaining`, replayed as is.
    pub remaining: u64,
    /// Its `reset_after` in milliseconds, replayed as is.
    pub reset_after: u64,
    /// The key's effective time (epoch ms) when it was written.
    pub written_at: u64,
}

/// The records of one key, oldest first (`written_at` never decreases, so
/// expiry and eviction pop from the front); from [`INDEX_FROM`] records on an
/// [`Index`] finds one in a fixed number of cache lines. Boxed on the first
/// record, so a key without records is one pointer.
#[derive(Clone, Default)]
pub struct DedupRecords(Option<Box<Held>>);

/// Records held from here on are indexed; fewer are scanned.
const INDEX_FROM: usize = 8;

#[derive(Clone, Default)]
struct Held {
    queue: VecDeque<DedupRecord>,
    /// The sequence number of the front record (wrapping).
    front_seq: u32,
    /// Empty below [`INDEX_FROM`] records.
    index: Index,
}

/// A keyed hash of the id: the port lets a caller choose ids, so a random
/// seed per process keeps probe chains short whatever ids arrive.
fn hash_of(id: EvaluationId) -> u64 {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE.get_or_init(RandomState::default).hash_one(id.as_uuid().as_u128())
}

/// The records' index: linear probing over words of the id hash's high half
/// over a sequence number (0: empty), at most half full, with no tombstones.
#[derive(Clone, Default)]
struct Index {
    slots: Box<[u64]>,
}

/// Marks a slot as held, whatever its fingerprint.
const HELD: u64 = 1 << 63;

impl Index {
    /// Room for `records` at most half full; at least 16 slots.
    fn with_room(records: usize) -> Self {
        let size = records.saturating_mul(2).max(16).next_power_of_two();
        Self { slots: vec![0; size].into_boxed_slice() }
    }

    fn is_built(&self) -> bool {
        !self.slots.is_empty()
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The word of `hash`: its high half (the held bit set) over `seq`.
    fn word(hash: u64, seq: u32) -> u64 {
        (hash & !u64::from(u32::MAX)) | HELD | u64::from(seq)
    }

    /// Where a word's probe starts: its fingerprint's low bits.
    fn home(&self, word: u64) -> usize {
        (word >> 32) as usize & self.mask()
    }

    /// The sequence numbers filed under `hash`, in probe order.
    fn candidates(&self, hash: u64) -> impl Iterator<Item = (usize, u32)> + '_ {
        let fingerprint = Self::word(hash, 0) >> 32;
        let mask = self.mask();
        let start = self.home(Self::word(hash, 0));
        (0..self.slots.len())
            .map(move |step| (start + step) & mask)
            .map_while(|slot| {
                let word = self.slots[slot];
                (word != 0).then_some((slot, word))
            })
            .filter(move |&(_, word)| word >> 32 == fingerprint)
            // The low half of a word is its sequence number.
            .map(|(slot, word)| (slot, word as u32))
    }

    fn insert(&mut self, hash: u64, seq: u32) {
        let word = Self::word(hash, seq);
        let mask = self.mask();
        let mut slot = self.home(word);
        while self.slots[slot] != 0 {
            slot = (slot + 1) & mask;
        }
        self.slots[slot] = word;
    }

    /// Removes the slot of `seq`; later words of its run move back.
    fn remove(&mut self, hash: u64, seq: u32) {
        let Some((mut hole, _)) = self.candidates(hash).find(|&(_, held)| held == seq) else {
            return;
        };
        let mask = self.mask();
        let mut next = hole;
        loop {
            next = (next + 1) & mask;
            let word = self.slots[next];
            if word == 0 {
                break;
            }
            // It moves to the hole when the hole lies between its home and
            // its slot (cyclically): its probe still passes the hole.
            let home = self.home(word);
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.slots[hole] = word;
                hole = next;
            }
        }
        self.slots[hole] = 0;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.iter().filter(|&&word| word != 0).count()
    }
}

impl Held {
    fn find(&self, evaluation_id: EvaluationId) -> Option<&DedupRecord> {
        let Self { queue, front_seq, index } = self;
        if !index.is_built() {
            // Retries follow their original closely: newest first.
            return queue.iter().rev().find(|r| r.evaluation_id == evaluation_id);
        }
        index
            .candidates(hash_of(evaluation_id))
            .filter_map(|(_, seq)| queue.get(seq.wrapping_sub(*front_seq) as usize))
            .find(|record| record.evaluation_id == evaluation_id)
    }

    /// Rebuilds the index with room for twice the records held.
    fn reindex(&mut self) {
        self.index = Index::with_room(self.queue.len().max(INDEX_FROM).saturating_mul(2));
        for position in 0..self.queue.len() {
            let hash = hash_of(self.queue[position].evaluation_id);
            self.index.insert(hash, self.front_seq.wrapping_add(position as u32));
        }
    }

    fn pop_front(&mut self) {
        let Some(record) = self.queue.pop_front() else { return };
        if self.index.is_built() {
            self.index.remove(hash_of(record.evaluation_id), self.front_seq);
        }
        self.front_seq = self.front_seq.wrapping_add(1);
    }

    fn push_back(&mut self, record: DedupRecord) {
        let seq = self.front_seq.wrapping_add(self.queue.len() as u32);
        self.queue.push_back(record);
        // Filed in place while the index stays at most half full, else rebuilt.
        if self.index.is_built() && self.queue.len().saturating_mul(2) <= self.index.slots.len() {
            self.index.insert(hash_of(record.evaluation_id), seq);
        } else if self.queue.len() >= INDEX_FROM {
            self.reindex();
        }
    }
}

impl DedupRecords {
    /// The records, oldest first.
    pub fn iter(&self) -> vec_deque::Iter<'_, DedupRecord> {
        static NONE: VecDeque<DedupRecord> = VecDeque::new();
        self.0.as_deref().map_or(&NONE, |held| &held.queue).iter()
    }

    /// How many records the key holds.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |held| held.queue.len())
    }

    /// Whether the key holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records the buffer has room for, for a store's memory account.
    pub fn allocated(&self) -> usize {
        self.0.as_ref().map_or(0, |held| held.queue.capacity())
    }

    /// Records the index holds (0 below [`INDEX_FROM`] records).
    #[cfg(test)]
    fn indexed(&self) -> usize {
        self.0.as_ref().map_or(0, |held| held.index.len())
    }

    /// Drops records with `written_at + ttl <= t`.
    pub(crate) fn drop_expired(&mut self, t: u64, ttl: u64) {
        if let Some(held) = &mut self.0 {
            while held.queue.front().is_some_and(|r| r.written_at.saturating_add(ttl) <= t) {
                held.pop_front();
            }
        }
    }

    /// The record of `evaluation_id`, if the key holds one.
    pub(crate) fn find(&self, evaluation_id: EvaluationId) -> Option<&DedupRecord> {
        self.0.as_ref()?.find(evaluation_id)
    }

    /// Appends `record`, then evicts the oldest beyond `capacity`.
    pub(crate) fn push(&mut self, record: DedupRecord, capacity: usize) {
        if capacity == 0 {
            self.clear();
            return;
        }
        // Most keys are one-shot: room for one record, not the default four.
        let held = self.0.get_or_insert_with(|| {
            Box::new(Held { queue: VecDeque::with_capacity(1), ..Held::default() })
        });
        // Evict first, so the index never holds more than `capacity`.
        while held.queue.len() >= capacity {
            held.pop_front();
        }
        held.push_back(record);
    }

    /// When the newest record was written.
    pub(crate) fn newest_written_at(&self) -> Option<u64> {
        self.0.as_ref()?.queue.back().map(|r| r.written_at)
    }

    /// Forgets every record and frees their memory.
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }
}

impl PartialEq for DedupRecords {
    /// The same records in the same order, however indexed.
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for DedupRecords {}

impl fmt::Debug for DedupRecords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl FromIterator<DedupRecord> for DedupRecords {
    /// Rebuilds stored records, given oldest first.
    fn from_iter<I: IntoIterator<Item = DedupRecord>>(records: I) -> Self {
        let queue: VecDeque<DedupRecord> = records.into_iter().collect();
        if queue.is_empty() {
            return Self(None);
        }
        let mut held = Held { queue, ..Held::default() };
        if held.queue.len() >= INDEX_FROM {
            held.reindex();
        }
        Self(Some(Box::new(held)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> EvaluationId {
        EvaluationId::from_uuid(uuid::Uuid::from_u128(n))
    }

    fn record(n: u128, written_at: u64) -> DedupRecord {
        DedupRecord { evaluation_id: id(n), remaining: 0, reset_after: 0, written_at }
    }

    #[test]
    fn oldest_records_are_evicted_beyond_capacity() {
        let mut records = DedupRecords::default();
        for n in 0..10 {
            records.push(record(n, 100), 3);
        }
        assert_eq!(records.len(), 3);
        assert!(records.find(id(6)).is_none());
        assert!(records.find(id(7)).is_some() && records.find(id(9)).is_some());
        assert!(records.allocated() <= 4);
    }

    #[test]
    fn expiry_is_written_at_plus_ttl_exclusive() {
        let mut records = DedupRecords::default();
        records.push(record(1, 100), 8);
        records.push(record(2, 200), 8);
        records.drop_expired(1099, 1000);
        assert_eq!(records.len(), 2);
        records.drop_expired(1100, 1000);
        assert!(records.find(id(1)).is_none());
        assert_eq!(records.newest_written_at(), Some(200));
    }

    #[test]
    fn expiry_and_eviction_together_keep_exactly_the_live_newest() {
        let mut records = DedupRecords::default();
        for n in 0..200u128 {
            assert!(records.find(id(n)).is_none());
            let t = u64::try_from(n).unwrap();
            records.push(record(n, t), 40);
            records.drop_expired(t, 50);
        }
        // At t = 199 the ttl keeps ids 150..200 and the capacity the last 40.
        for n in 0..200u128 {
            assert_eq!(records.find(id(n)).is_some(), n >= 160, "id {n}");
        }
        records.clear();
        assert_eq!((records.len(), records.allocated()), (0, 0));
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let mut records = DedupRecords::default();
        records.push(record(1, 100), 0);
        assert_eq!(records.len(), 0);
        assert_eq!(records.newest_written_at(), None);
    }

    #[test]
    fn stored_records_round_trip_oldest_first() {
        let mut records = DedupRecords::default();
        for n in 0..3 {
            records.push(record(n, 100 + u64::try_from(n).unwrap()), 8);
        }
        let rebuilt: DedupRecords = records.iter().copied().collect();
        assert_eq!(rebuilt, records);
        let written: Vec<u64> = rebuilt.iter().map(|r| r.written_at).collect();
        assert_eq!(written, [100, 101, 102]);
        // No records is no allocation, however it was built.
        let empty: DedupRecords = std::iter::empty().collect();
        assert_eq!((empty.is_empty(), empty.allocated()), (true, 0));
    }

    /// The plain queue the index must agree with: the same records found,
    /// the same order kept.
    fn agrees_with_a_scan(records: &DedupRecords, model: &VecDeque<DedupRecord>, ids: u128) {
        assert!(records.iter().eq(model.iter()), "order");
        for n in 0..ids {
            let scanned = model.iter().find(|r| r.evaluation_id == id(n));
            assert_eq!(records.find(id(n)), scanned, "id {n}");
        }
    }

    #[test]
    fn the_index_finds_exactly_what_a_scan_finds_at_the_cap() {
        // 256 records (the default cap), 2,000 appended: every lookup after
        // the index is built agrees with a scan of the same queue, through
        // many evictions and expiries.
        let mut records = DedupRecords::default();
        let mut model = VecDeque::new();
        for n in 0..2_000u128 {
            let t = u64::try_from(n).unwrap();
            let record = DedupRecord { remaining: t, ..record(n, t) };
            records.push(record, 256);
            model.push_back(record);
            while model.len() > 256 {
                model.pop_front();
            }
            // Every 300 appends a ttl of 200 drops a run from the front.
            if n % 300 == 299 {
                records.drop_expired(t, 200);
                model.retain(|r| r.written_at + 200 > t);
            }
            if n % 97 == 0 || n == 1_999 {
                agrees_with_a_scan(&records, &model, n + 2);
            }
        }
        assert_eq!(records.len(), 256);
        // Every record indexed, no evicted one left behind.
        assert_eq!(records.indexed(), 256);
    }

    #[test]
    fn a_small_key_scans_and_builds_its_index_at_the_threshold() {
        let mut records = DedupRecords::default();
        for n in 0..INDEX_FROM as u128 - 1 {
            records.push(record(n, 100), 256);
        }
        assert_eq!(records.indexed(), 0, "a few records are scanned");
        records.push(record(99, 100), 256);
        assert_eq!(records.indexed(), INDEX_FROM);
        assert!(records.find(id(0)).is_some() && records.find(id(99)).is_some());
        assert!(records.find(id(98)).is_none());
        // Rebuilt from storage, the index is there and finds the same.
        let rebuilt: DedupRecords = records.iter().copied().collect();
        assert_eq!(rebuilt.indexed(), INDEX_FROM);
        assert_eq!(rebuilt.find(id(3)), records.find(id(3)));
        assert_eq!(rebuilt, records);
    }

    #[test]
    fn sequence_numbers_wrap_without_losing_a_record() {
        let mut records = DedupRecords::default();
        for n in 0..20 {
            records.push(record(n, 100), 16);
        }
        // Move the numbering to just before the wrap and reindex there.
        if let Some(held) = &mut records.0 {
            held.front_seq = u32::MAX - 5;
            held.reindex();
        }
        let mut model: VecDeque<DedupRecord> = records.iter().copied().collect();
        for n in 20..60 {
            records.push(record(n, 100), 16);
            model.push_back(record(n, 100));
            model.pop_front();
            agrees_with_a_scan(&records, &model, 61);
        }
    }

    #[test]
    fn the_index_keeps_every_word_findable_through_removals_in_a_run_that_wraps() {
        // Sixteen slots; homes 14 and 15 (the high half picks the home), so
        // runs wrap past the end; removals in every order of a mixed run.
        let hash = |home: u64, n: u64| ((home | n << 8) << 32) | n;
        let words: Vec<(u64, u32)> =
            (0..7u32).map(|n| (hash(14 + u64::from(n % 2), 0), n)).collect();
        for first in 0..words.len() {
            for second in 0..words.len() {
                let mut index = Index::with_room(4);
                assert_eq!(index.slots.len(), 16);
                for &(hash, seq) in &words {
                    index.insert(hash, seq);
                }
                index.remove(words[first].0, words[first].1);
                index.remove(words[second].0, words[second].1);
                for (at, &(hash, seq)) in words.iter().enumerate() {
                    let found = index.candidates(hash).any(|(_, held)| held == seq);
                    assert_eq!(found, at != first && at != second, "{first} {second}: {seq}");
                }
                let left = words.len() - if first == second { 1 } else { 2 };
                assert_eq!(index.len(), left);
            }
        }
    }

    #[test]
    fn ids_alike_in_their_halves_stay_findable_through_evictions() {
        // Ids whose two 64-bit halves are equal (a weak mixer folds them to
        // one hash): evicting in order must leave every later one findable.
        let mut records = DedupRecords::default();
        let mut model = VecDeque::new();
        for n in 0..500u128 {
            let n = n.wrapping_mul(0x1_0000_0000_0000_0001);
            records.push(record(n, 1), 12);
            model.push_back(record(n, 1));
            while model.len() > 12 {
                model.pop_front();
            }
            assert!(records.iter().eq(model.iter()));
            for r in &model {
                assert_eq!(records.find(r.evaluation_id), Some(r));
            }
        }
    }
}
