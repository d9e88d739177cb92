//! Evaluation dedupe records of one key: a bounded queue, oldest first,
//! with an id index once the queue is long enough that scanning it on every
//! decision would cost more than the index.

use std::collections::{HashMap, VecDeque};

use crate::key::BuildPrehashed;

/// Below this many records a lookup scans the queue; from here on an index
/// of ids answers the common case (no such id) without a scan.
const INDEX_FROM: usize = 16;

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
/// Boxed and allocated on the first record, so a key without records (dedupe
/// off, or only denials) carries one pointer: a small map slot keeps more
/// keys in cache.
#[derive(Debug, Default)]
pub(crate) struct Records(Option<Box<Queue>>);

#[derive(Debug, Default)]
struct Queue {
    queue: VecDeque<Record>,
    /// Folded id -> how many queued records fold to it, kept while the
    /// queue is long. Counting keeps two ids that fold alike both findable.
    index: Option<HashMap<u64, u32, BuildPrehashed>>,
}

/// Folds an id to 64 well-mixed bits for the index (ids are server-made
/// UUIDs, not attacker-chosen; a collision only costs a scan).
fn fold(evaluation_id: u128) -> u64 {
    let folded = (evaluation_id as u64) ^ ((evaluation_id >> 64) as u64);
    folded.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn count_in(index: &mut HashMap<u64, u32, BuildPrehashed>, evaluation_id: u128) {
    *index.entry(fold(evaluation_id)).or_insert(0) += 1;
}

impl Records {
    /// Drops records with `written_at + ttl <= t`.
    pub(crate) fn drop_expired(&mut self, t: u64, ttl: u64) {
        if let Some(queue) = &mut self.0 {
            queue.drop_expired(t, ttl);
        }
    }

    /// The record of `evaluation_id`, if held.
    pub(crate) fn find(&self, evaluation_id: u128) -> Option<&Record> {
        self.0.as_ref().and_then(|queue| queue.find(evaluation_id))
    }

    /// Appends `record` (whose id [`Records::find`] did not find), then
    /// evicts the oldest beyond `capacity`.
    pub(crate) fn push(&mut self, record: Record, capacity: usize) {
        if capacity == 0 {
            self.clear();
            return;
        }
        self.0.get_or_insert_with(Box::default).push(record, capacity);
    }

    /// When the newest record was written.
    pub(crate) fn newest_written_at(&self) -> Option<u64> {
        self.0.as_ref().and_then(|queue| queue.newest_written_at())
    }

    /// Forgets every record (the key expired or dedupe is off) and frees
    /// their memory.
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |queue| queue.queue.len())
    }

    /// Records the buffer has room for, to show it stays bounded.
    #[cfg(test)]
    pub(crate) fn allocated(&self) -> usize {
        self.0.as_ref().map_or(0, |queue| queue.queue.capacity())
    }

    #[cfg(test)]
    fn indexed(&self) -> bool {
        self.0.as_ref().is_some_and(|queue| queue.index.is_some())
    }
}

impl Queue {
    /// Drops records with `written_at + ttl <= t`.
    fn drop_expired(&mut self, t: u64, ttl: u64) {
        while self.queue.front().is_some_and(|r| r.written_at.saturating_add(ttl) <= t) {
            self.pop_oldest();
        }
    }

    /// The record of `evaluation_id`, searching the newest first because
    /// retries follow their original closely.
    fn find(&self, evaluation_id: u128) -> Option<&Record> {
        if let Some(index) = &self.index {
            if !index.contains_key(&fold(evaluation_id)) {
                return None;
            }
        }
        self.queue.iter().rev().find(|r| r.evaluation_id == evaluation_id)
    }

    /// Appends `record`, then evicts the oldest beyond `capacity`.
    fn push(&mut self, record: Record, capacity: usize) {
        if self.queue.capacity() == 0 {
            // Most keys are one-shot: one record, not the default four.
            self.queue.reserve_exact(1);
        }
        self.queue.push_back(record);
        match &mut self.index {
            Some(index) => count_in(index, record.evaluation_id),
            None if self.queue.len() >= INDEX_FROM => {
                let mut index =
                    HashMap::with_capacity_and_hasher(capacity, BuildPrehashed::default());
                for queued in &self.queue {
                    count_in(&mut index, queued.evaluation_id);
                }
                self.index = Some(index);
            }
            None => {}
        }
        while self.queue.len() > capacity {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some(oldest) = self.queue.pop_front() {
            if let Some(index) = &mut self.index {
                let folded = fold(oldest.evaluation_id);
                if let Some(count) = index.get_mut(&folded) {
                    *count -= 1;
                    if *count == 0 {
                        index.remove(&folded);
                    }
                }
            }
        }
    }

    /// When the newest record was written.
    fn newest_written_at(&self) -> Option<u64> {
        self.queue.back().map(|r| r.written_at)
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
    fn the_index_agrees_with_a_scan_through_growth_expiry_and_eviction() {
        let mut records = Records::default();
        for id in 0..200u128 {
            assert!(records.find(id).is_none());
            records.push(record(id, u64::try_from(id).unwrap()), 40);
            records.drop_expired(u64::try_from(id).unwrap(), 50);
        }
        assert!(records.indexed());
        // At t = 199 the ttl keeps ids 150..200 and the capacity the last 40.
        for id in 0..200u128 {
            assert_eq!(records.find(id).is_some(), id >= 160, "id {id}");
        }
        records.clear();
        assert!(!records.indexed() && records.find(199).is_none());
    }

    #[test]
    fn ids_that_fold_alike_stay_findable_until_each_leaves() {
        // fold(a) == fold(b): the two halves are swapped.
        let (a, b) = ((1u128 << 64) | 2, (2u128 << 64) | 1);
        assert_eq!(fold(a), fold(b));
        let mut records = Records::default();
        records.push(record(a, 0), 64);
        records.push(record(b, 0), 64);
        for id in 100..120 {
            records.push(record(id, 1), 64);
        }
        assert!(records.indexed());
        records.0.as_mut().unwrap().pop_oldest();
        assert!(records.find(a).is_none());
        assert!(records.find(b).is_some());
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let mut records = Records::default();
        records.push(record(1, 100), 0);
        assert_eq!(records.len(), 0);
        assert_eq!(records.newest_written_at(), None);
    }
}
