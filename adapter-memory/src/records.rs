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
#[derive(Debug, Default)]
pub(crate) struct Records(VecDeque<Record>);

impl Records {
    /// Drops records with `written_at + ttl <= t`.
    pub(crate) fn drop_expired(&mut self, t: u64, ttl: u64) {
        while self.0.front().is_some_and(|r| r.written_at.saturating_add(ttl) <= t) {
            self.0.pop_front();
        }
    }

    /// The record of `evaluation_id`, searching the newest first because
    /// retries follow their original closely.
    pub(crate) fn find(&self, evaluation_id: u128) -> Option<&Record> {
        self.0.iter().rev().find(|r| r.evaluation_id == evaluation_id)
    }

    /// Appends `record`, then evicts the oldest beyond `capacity`.
    pub(crate) fn push(&mut self, record: Record, capacity: usize) {
        if capacity == 0 {
            self.0.clear();
            return;
        }
        if self.0.capacity() == 0 {
            // Most keys are one-shot: one record, not the default four.
            self.0.reserve_exact(1);
        }
        self.0.push_back(record);
        while self.0.len() > capacity {
            self.0.pop_front();
        }
    }

    /// When the newest record was written.
    pub(crate) fn newest_written_at(&self) -> Option<u64> {
        self.0.back().map(|r| r.written_at)
    }

    /// Forgets every record (the key expired or dedupe is off).
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Records the buffer has room for, to show it stays bounded.
    #[cfg(test)]
    pub(crate) fn allocated(&self) -> usize {
        self.0.capacity()
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
    fn capacity_zero_keeps_nothing() {
        let mut records = Records::default();
        records.push(record(1, 100), 0);
        assert_eq!(records.len(), 0);
        assert_eq!(records.newest_written_at(), None);
    }
}
