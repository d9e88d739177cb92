//! One key's entry and the per-key steps of an evaluation (steps 3 to 7 of
//! docs/algorithms.md): clock-regression check, dedupe replay, the
//! algorithm, the dedupe record and the key's new expiry.

use std::time::Duration;

use shared_contract::{
    Certainty, IncompatibleCategory, RateLimitDecision, RateLimitOutcome, RateLimitPolicy,
    UnavailableCategory,
};

use crate::algorithm::{self, AlgorithmState, Params};
use crate::records::{Record, Records};

/// Everything the store holds for one key. Its size is constant except for
/// the dedupe records, which are bounded by the policy's record capacity.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Absolute expiry (epoch ms): from then on the key counts as absent.
    pub(crate) expires_at: u64,
    /// The highest effective time at which the state was written.
    mark: u64,
    /// `None` only for a fresh entry that has not been written yet.
    state: Option<AlgorithmState>,
    records: Records,
}

/// A policy compiled to milliseconds for the hot path.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    params: Params,
    certainty: Certainty,
    /// `maximum_clock_regression`, the `R` of the spec.
    regression: u64,
    /// `max(cleanup_grace, maximum_clock_regression)`, the `G` of the spec.
    slack: u64,
    /// Dedupe record lifetime; meaningful only when `record_capacity > 0`.
    dedup_ttl: u64,
    /// 0 when dedupe is disabled.
    record_capacity: usize,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Rules {
    pub(crate) fn of(policy: &RateLimitPolicy) -> Self {
        let params = Params::of(policy.algorithm());
        let certainty = match params {
            Params::SlidingCounter { .. } => Certainty::ApproximateAlgorithm,
            Params::FixedWindow { .. } | Params::TokenBucket { .. } => Certainty::Certain,
        };
        let dedup = policy.evaluation_dedup();
        Self {
            params,
            certainty,
            regression: millis(policy.maximum_clock_regression()),
            slack: policy.ttl_slack_millis(),
            dedup_ttl: dedup.ttl_millis(),
            record_capacity: usize::try_from(dedup.record_capacity()).unwrap_or(usize::MAX),
        }
    }

    fn decision(
        &self,
        allowed: bool,
        remaining: u64,
        retry_after: u64,
        reset_after: u64,
        replayed: bool,
    ) -> RateLimitOutcome {
        RateLimitOutcome::Evaluated(RateLimitDecision {
            allowed,
            limit: self.params.limit(),
            remaining,
            retry_after: Duration::from_millis(retry_after),
            reset_after: Duration::from_millis(reset_after),
            certainty: self.certainty,
            replayed,
        })
    }
}

impl Entry {
    /// An entry that holds nothing yet: the same as an absent key.
    pub(crate) fn blank() -> Self {
        Self { expires_at: 0, mark: 0, state: None, records: Records::default() }
    }

    /// Forgets an expired entry in place, keeping its key.
    pub(crate) fn reset(&mut self) {
        self.mark = 0;
        self.state = None;
        self.records.clear();
    }

    /// Whether an evaluation has written state into this entry.
    pub(crate) fn is_written(&self) -> bool {
        self.state.is_some()
    }

    /// Evaluates one request against this key at caller time `now`. The
    /// caller has already checked the policy, the cost and the deadline, and
    /// has reset the entry if it was past its expiry.
    pub(crate) fn evaluate(
        &mut self,
        rules: &Rules,
        now: u64,
        cost: u64,
        evaluation_id: u128,
    ) -> RateLimitOutcome {
        let mut t = now;
        if self.state.is_some() {
            let lag = self.mark.saturating_sub(t);
            if lag > rules.regression {
                return RateLimitOutcome::Unavailable {
                    category: UnavailableCategory::ClockUnsafe,
                    retry_after: Duration::from_millis(lag - rules.regression),
                };
            }
            t = t.max(self.mark);
        }

        if rules.record_capacity > 0 {
            // Expired records are only ignored here: a replay or a denial
            // writes nothing, so a clock that steps back inside the bound
            // must still find a record that is live at its time.
            let live = |record: &&Record| record.written_at.saturating_add(rules.dedup_ttl) > t;
            if let Some(record) = self.records.find(evaluation_id).filter(live) {
                return rules.decision(true, record.remaining, 0, record.reset_after, true);
            }
        }

        let step = match algorithm::run(&rules.params, self.state.as_ref(), t, cost) {
            Ok(step) => step,
            Err(algorithm::StateMismatch) => {
                return RateLimitOutcome::Incompatible {
                    category: IncompatibleCategory::StateIncompatible,
                };
            }
        };

        if let Some((state, state_end)) = step.write {
            self.state = Some(state);
            self.mark = t;
            let mut end = state_end;
            if rules.record_capacity > 0 {
                self.records.drop_expired(t, rules.dedup_ttl);
                if step.allowed {
                    let record = Record {
                        evaluation_id,
                        remaining: step.remaining,
                        reset_after: step.reset_after,
                        written_at: t,
                    };
                    self.records.push(record, rules.record_capacity);
                }
                if let Some(newest) = self.records.newest_written_at() {
                    end = end.max(newest.saturating_add(rules.dedup_ttl));
                }
            } else {
                // Dedupe switched off under the same revision: old records
                // must neither replay nor keep the key alive.
                self.records.clear();
            }
            self.expires_at = end.saturating_add(rules.slack);
        }
        rules.decision(step.allowed, step.remaining, step.retry_after, step.reset_after, false)
    }

    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> (Option<AlgorithmState>, u64, usize, usize) {
        (self.state, self.mark, self.records.len(), self.records.allocated())
    }
}

#[cfg(test)]
mod tests {
    use shared_contract::{Algorithm, EvaluationDedupPolicy};

    use super::*;

    const T0: u64 = 1_800_000_000_000;

    fn rules(algorithm: Algorithm, dedup: EvaluationDedupPolicy) -> Rules {
        let policy = RateLimitPolicy::builder("p", algorithm)
            .cleanup_grace(Duration::from_millis(300))
            .maximum_clock_regression(Duration::from_millis(500))
            .evaluation_dedup(dedup)
            .build()
            .unwrap();
        Rules::of(&policy)
    }

    fn fixed(limit: u64) -> Algorithm {
        Algorithm::FixedWindow { limit, window: Duration::from_millis(1000) }
    }

    fn decision(outcome: RateLimitOutcome) -> RateLimitDecision {
        match outcome {
            RateLimitOutcome::Evaluated(decision) => decision,
            other @ (RateLimitOutcome::Unavailable { .. }
            | RateLimitOutcome::Incompatible { .. }
            | RateLimitOutcome::Indeterminate { .. }) => {
                panic!("expected a decision, got {other:?}")
            }
        }
    }

    #[test]
    fn an_entry_is_small_and_fixed_size() {
        // Expiry, mark, the largest state (three counts and a tag) and one
        // pointer to the records: a map slot stays small whatever a
        // subject's history, so more keys fit in cache.
        assert!(std::mem::size_of::<Entry>() <= 56, "{}", std::mem::size_of::<Entry>());
    }

    #[test]
    fn expiry_is_state_end_or_newest_record_plus_the_larger_slack() {
        // Fixed window ends at T0 + 1000; a record written at T0 + 250 with
        // a 5 s ttl lives to T0 + 5250; slack G = max(300, 500) = 500.
        let with_dedup = rules(fixed(3), EvaluationDedupPolicy::enabled_defaults());
        let mut entry = Entry::blank();
        entry.evaluate(&with_dedup, T0 + 250, 1, 1);
        assert_eq!(entry.expires_at, T0 + 5250 + 500);

        let without = rules(fixed(3), EvaluationDedupPolicy::Disabled);
        let mut entry = Entry::blank();
        entry.evaluate(&without, T0 + 250, 1, 1);
        assert_eq!(entry.expires_at, T0 + 1000 + 500);
    }

    #[test]
    fn a_lagging_clock_inside_the_bound_uses_the_mark_and_beyond_it_is_clock_unsafe() {
        let rules = rules(fixed(5), EvaluationDedupPolicy::Disabled);
        let mut entry = Entry::blank();
        entry.evaluate(&rules, T0 + 1200, 1, 1);
        // 400 ms behind (bound 500): evaluated at the mark, in window T0 + 1000.
        let inside = decision(entry.evaluate(&rules, T0 + 800, 1, 2));
        assert_eq!((inside.remaining, inside.reset_after), (3, Duration::from_millis(800)));
        assert_eq!(entry.snapshot().1, T0 + 1200);
        // 700 ms behind: 200 ms beyond the bound; nothing changes.
        let before = entry.snapshot();
        let outcome = entry.evaluate(&rules, T0 + 500, 1, 3);
        assert_eq!(
            outcome,
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: Duration::from_millis(200),
            }
        );
        assert_eq!(entry.snapshot(), before);
    }

    #[test]
    fn a_repeat_replays_without_charging_and_writes_nothing() {
        let rules = rules(fixed(3), EvaluationDedupPolicy::enabled_defaults());
        let mut entry = Entry::blank();
        let first = decision(entry.evaluate(&rules, T0 + 250, 1, 77));
        let expires_at = entry.expires_at;
        let before = entry.snapshot();
        let again = decision(entry.evaluate(&rules, T0 + 900, 1, 77));
        assert!(again.replayed && again.allowed);
        assert_eq!((again.remaining, again.reset_after), (first.remaining, first.reset_after));
        assert_eq!(entry.snapshot(), before);
        assert_eq!(entry.expires_at, expires_at);
    }

    #[test]
    fn records_stay_within_the_byte_bound() {
        let dedup = EvaluationDedupPolicy::Enabled {
            ttl: Duration::from_secs(60),
            max_entries: 100,
            max_stored_bytes: 3 * shared_contract::DEDUP_RECORD_BYTES,
        };
        let rules = rules(fixed(1_000), dedup);
        let mut entry = Entry::blank();
        for id in 0..50 {
            assert!(decision(entry.evaluate(&rules, T0, 1, id)).allowed);
        }
        assert_eq!(entry.snapshot().2, 3);
        // The oldest were evicted: id 0 charges again, id 49 replays.
        assert!(!decision(entry.evaluate(&rules, T0, 1, 0)).replayed);
        assert!(decision(entry.evaluate(&rules, T0, 1, 49)).replayed);
    }

    #[test]
    fn state_of_another_algorithm_is_incompatible_and_untouched() {
        let bucket = rules(
            Algorithm::TokenBucket {
                capacity: 3,
                refill_tokens: 1,
                refill_period: Duration::from_millis(100),
            },
            EvaluationDedupPolicy::Disabled,
        );
        let mut entry = Entry::blank();
        entry.evaluate(&bucket, T0, 1, 1);
        let before = entry.snapshot();
        let window = rules(fixed(3), EvaluationDedupPolicy::Disabled);
        assert_eq!(
            entry.evaluate(&window, T0, 1, 2),
            RateLimitOutcome::Incompatible { category: IncompatibleCategory::StateIncompatible }
        );
        assert_eq!(entry.snapshot(), before);
    }
}
