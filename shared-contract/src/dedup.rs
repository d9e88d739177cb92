//! `EvaluationDedupPolicy`: so a retried evaluation replays instead of charging twice.

use std::time::Duration;

use crate::algorithm::Checks;
use crate::bounds::MAX_GRACE;
use crate::error::PolicyField;

/// Payload bytes one dedupe record counts against `max_stored_bytes` everywhere.
pub const DEDUP_RECORD_BYTES: u32 = 16 + 4 * 8 + 8 + (16 + 8);

/// Whether and how a key remembers the evaluations that charged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvaluationDedupPolicy {
    /// Every evaluation is counted, repeats included.
    Disabled,
    /// A repeat of a charged evaluation's id within `ttl` replays its result.
    Enabled {
        /// How long a record answers repeats.
        ttl: Duration,
        /// Records kept per key; the oldest go first.
        max_entries: u32,
        /// Record payload bytes kept per key (see [`DEDUP_RECORD_BYTES`]).
        max_stored_bytes: u32,
    },
}

impl EvaluationDedupPolicy {
    /// Dedupe on with 5 s, 256 entries and 65,536 bytes.
    pub const fn enabled_defaults() -> Self {
        Self::Enabled { ttl: Duration::from_secs(5), max_entries: 256, max_stored_bytes: 65_536 }
    }

    /// Records a key may hold under both bounds; 0 when disabled.
    pub const fn record_capacity(&self) -> u32 {
        match *self {
            Self::Disabled => 0,
            Self::Enabled { max_entries, max_stored_bytes, .. } => {
                let by_bytes = max_stored_bytes / DEDUP_RECORD_BYTES;
                if by_bytes < max_entries { by_bytes } else { max_entries }
            }
        }
    }

    /// The record lifetime in milliseconds; 0 when disabled.
    pub fn ttl_millis(&self) -> u64 {
        match *self {
            Self::Disabled => 0,
            Self::Enabled { ttl, .. } => crate::bounds::millis(ttl),
        }
    }

    pub(crate) fn check(&self, checks: &mut Checks) {
        let Self::Enabled { ttl, max_entries, max_stored_bytes } = *self else { return };
        checks.period(PolicyField::DedupTtl, ttl, MAX_GRACE);
        checks.count(PolicyField::DedupMaxEntries, max_entries.into(), 65_536);
        let (least, most) = (DEDUP_RECORD_BYTES, 16 << 20);
        if !(least..=most).contains(&max_stored_bytes) {
            let range = format!("{least}..={most} (one record is {least} bytes)");
            let problem = format!("must be in {range}, got {max_stored_bytes}");
            checks.reject(PolicyField::DedupMaxStoredBytes, problem);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PolicyViolation;

    impl EvaluationDedupPolicy {
        fn violations(&self) -> Vec<PolicyViolation> {
            let mut checks = Checks::default();
            self.check(&mut checks);
            checks.violations
        }
    }

    #[test]
    fn enabled_defaults_are_five_seconds_256_entries_64_kib() {
        let EvaluationDedupPolicy::Enabled { ttl, max_entries, max_stored_bytes } =
            EvaluationDedupPolicy::enabled_defaults()
        else {
            panic!("defaults must be enabled");
        };
        assert_eq!(ttl, Duration::from_secs(5));
        assert_eq!(max_entries, 256);
        assert_eq!(max_stored_bytes, 65_536);
    }

    #[test]
    fn capacity_is_the_tighter_of_both_bounds() {
        assert_eq!(EvaluationDedupPolicy::enabled_defaults().record_capacity(), 256);
        let by_bytes = EvaluationDedupPolicy::Enabled {
            ttl: Duration::from_secs(1),
            max_entries: 10,
            max_stored_bytes: 3 * DEDUP_RECORD_BYTES + 39,
        };
        assert_eq!(by_bytes.record_capacity(), 3);
        assert_eq!(EvaluationDedupPolicy::Disabled.record_capacity(), 0);
    }

    #[test]
    fn each_bound_names_its_field() {
        let bad = EvaluationDedupPolicy::Enabled {
            ttl: Duration::ZERO,
            max_entries: 0,
            max_stored_bytes: DEDUP_RECORD_BYTES - 1,
        };
        let fields: Vec<_> = bad.violations().iter().map(|v| v.field).collect();
        assert_eq!(
            fields,
            [PolicyField::DedupTtl, PolicyField::DedupMaxEntries, PolicyField::DedupMaxStoredBytes]
        );
        assert!(EvaluationDedupPolicy::Disabled.violations().is_empty());
    }
}
