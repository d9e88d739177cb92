//! Evaluation dedupe records of one key: a bounded queue, oldest first.

use std::collections::VecDeque;

/// What a charged evaluation left behind so a repeat of its id can replay
/// the answer instead of charging again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) evaluation_id: u128,
    pub(crate) remaining: u64,
    pub(crate) reset_after: u64,
    pub(crate) written_at: u64,
}

/// The records of one key. `written_at` never decreases from front to back
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
#[derive(Debug, Default)]
#[allow(
    clippy::box_collection,
    reason = "one pointer in every map slot instead of a 32-byte VecDeque header"
)]
pub(crate) struct Records(Option<Box<VecDeque<Record>>>);

impl Records {
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
    pub(crate) fn find(&self, evaluation_id: u128) -> Option<&Record> {
        self.0.as_ref()?.iter().rev().find(|r| r.evaluation_id == evaluation_id)
    }

    /// Appends `record`, then evicts the oldest beyond `capacity`.
    pub(crate) fn push(&mut self, record: Record, capacity: usize) {
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

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |queue| queue.len())
    }

    /// Records the buffer has room for, to show it stays bounded.
    #[cfg(test)]
    pub(crate) fn allocated(&self) -> usize {
        self.0.as_ref().map_or(0, |queue| queue.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u128, written_at: u64) -> Record {
        Record { evaluation_id: id, remaining: 0, reset_after: 0, written_at }
    }

    #[test]
    fn oldest_records_are_evicted_beyond_capacity() {
        let mut records = Records::default();
        for id in 0..10 {
            records.push(record(id, 100), 3);
        }
        assert_eq!(records.len(), 3);
        assert!(records.find(6).is_none());
        assert!(records.find(7).is_some() && records.find(9).is_some());
        assert!(records.allocated() <= 4);
    }

    #[test]
    fn expiry_is_written_at_plus_ttl_exclusive() {
        let mut records = Records::default();
        records.push(record(1, 100), 8);
        records.push(record(2, 200), 8);
        records.drop_expired(1099, 1000);
        assert_eq!(records.len(), 2);
        records.drop_expired(1100, 1000);
        assert!(records.find(1).is_none());
        assert_eq!(records.newest_written_at(), Some(200));
    }

    #[test]
    fn expiry_and_eviction_together_keep_exactly_the_live_newest() {
        let mut records = Records::default();
        for id in 0..200u128 {
            assert!(records.find(id).is_none());
            let t = u64::try_from(id).unwrap();
            records.push(record(id, t), 40);
            records.drop_expired(t, 50);
        }
        // At t = 199 the ttl keeps ids 150..200 and the capacity the last 40.
        for id in 0..200u128 {
            assert_eq!(records.find(id).is_some(), id >= 160, "id {id}");
        }
        records.clear();
        assert_eq!((records.len(), records.allocated()), (0, 0));
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let mut records = Records::default();
        records.push(record(1, 100), 0);
        assert_eq!(records.len(), 0);
        assert_eq!(records.newest_written_at(), None);
    }
}
