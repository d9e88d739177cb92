//! Evaluation dedupe records of one key: a bounded queue, oldest first.

use std::collections::{VecDeque, vec_deque};

use crate::request::EvaluationId;

/// What a charged evaluation left behind so a repeat of its id can replay
/// the answer instead of charging again. Counts [`crate::DEDUP_RECORD_BYTES`]
/// against the byte bound.
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

/// The records of one key, oldest first. `written_at` never decreases from front to back
/// (records are appended at the key's effective time, which never runs
/// backwards), so expiry and eviction both pop from the front.
///
/// A lookup scans the queue. An id index (a hash set beside the queue) was
/// measured slower at the default 256 records: the scan reads contiguous
/// memory the prefetcher streams, the index adds random misses
/// (docs/benchmarks.md).
///
/// Boxed and allocated on the first record, so a key without records (dedupe
/// off, or only denials) carries one pointer: a small map slot keeps more
/// keys in cache.
///
/// A provider that serializes a key reads the records with
/// [`DedupRecords::iter`] and rebuilds them, in the same order, with
/// `collect()`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(
    clippy::box_collection,
    reason = "one pointer in every map slot instead of a 32-byte VecDeque header"
)]
pub struct DedupRecords(Option<Box<VecDeque<DedupRecord>>>);

impl DedupRecords {
    /// The records, oldest first.
    pub fn iter(&self) -> vec_deque::Iter<'_, DedupRecord> {
        static NONE: VecDeque<DedupRecord> = VecDeque::new();
        self.0.as_deref().unwrap_or(&NONE).iter()
    }

    /// How many records the key holds.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |queue| queue.len())
    }

    /// Whether the key holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records the buffer has room for without growing, so a store can show
    /// that its memory stays bounded.
    pub fn allocated(&self) -> usize {
        self.0.as_ref().map_or(0, |queue| queue.capacity())
    }

    /// Drops records with `written_at + ttl <= t`.
    pub(crate) fn drop_expired(&mut self, t: u64, ttl: u64) {
        if let Some(queue) = &mut self.0 {
            while queue.front().is_some_and(|r| r.written_at.saturating_add(ttl) <= t) {
                queue.pop_front();
            }
        }
    }

    /// The record of `evaluation_id`, searching the newest first because
    /// retries follow their original closely.
    pub(crate) fn find(&self, evaluation_id: EvaluationId) -> Option<&DedupRecord> {
        self.0.as_ref()?.iter().rev().find(|r| r.evaluation_id == evaluation_id)
    }

    /// Appends `record`, then evicts the oldest beyond `capacity`.
    pub(crate) fn push(&mut self, record: DedupRecord, capacity: usize) {
        if capacity == 0 {
            self.clear();
            return;
        }
        // Most keys are one-shot: room for one record, not the default four.
        let queue = self.0.get_or_insert_with(|| Box::new(VecDeque::with_capacity(1)));
        queue.push_back(record);
        while queue.len() > capacity {
            queue.pop_front();
        }
    }

    /// When the newest record was written.
    pub(crate) fn newest_written_at(&self) -> Option<u64> {
        self.0.as_ref()?.back().map(|r| r.written_at)
    }

    /// Forgets every record (the key expired or dedupe is off) and frees
    /// their memory.
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }
}

impl FromIterator<DedupRecord> for DedupRecords {
    /// Rebuilds stored records, given oldest first.
    fn from_iter<I: IntoIterator<Item = DedupRecord>>(records: I) -> Self {
        let queue: VecDeque<DedupRecord> = records.into_iter().collect();
        Self((!queue.is_empty()).then(|| Box::new(queue)))
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
}
