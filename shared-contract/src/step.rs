//! The pure decision step of one key (steps 3 to 7 of docs/algorithms.md):
//! clock-regression check, dedupe replay, the algorithm, the dedupe record
//! and the key's new lifetime. No I/O and no clock: the caller loads the
//! state, passes its caller time and stores what comes back.
//!
//! It lives in the contract, not in a provider, so every provider over a
//! compare-and-set store gets the same numbers by calling it: load the key,
//! call [`evaluate_key`], compare-and-set the [`Transition::Write`] (if any),
//! and on a conflict start again from the load.

mod algorithm;
mod records;

use std::time::Duration;

pub use algorithm::AlgorithmState;
pub use records::{DedupRecord, DedupRecords};

use crate::outcome::{
    Certainty, IncompatibleCategory, RateLimitDecision, RateLimitOutcome, UnavailableCategory,
};
use crate::policy::{RateLimitPolicy, millis};
use crate::request::EvaluationId;
use algorithm::{Params, StateMismatch};

/// Everything a provider stores for one key. Absent keys are `None`, never a
/// zeroed value. Plain data: a provider may serialize it field by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// The highest effective time (epoch ms) at which the state was written.
    pub mark: u64,
    /// The algorithm's counters.
    pub algorithm: AlgorithmState,
    /// Dedupe records, oldest first; empty when dedupe is off.
    pub records: DedupRecords,
}

/// A policy compiled to milliseconds for the step, built once per policy so
/// a decision never converts a `Duration`.
#[derive(Debug, Clone)]
pub struct KeyRules {
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

impl KeyRules {
    /// Compiles a validated policy.
    pub fn of(policy: &RateLimitPolicy) -> Self {
        let dedup = policy.evaluation_dedup();
        Self {
            params: Params::of(policy.algorithm()),
            certainty: policy.algorithm().certainty(),
            regression: millis(policy.maximum_clock_regression()),
            slack: policy.ttl_slack_millis(),
            dedup_ttl: dedup.ttl_millis(),
            record_capacity: usize::try_from(dedup.record_capacity()).unwrap_or(usize::MAX),
        }
    }

    fn decided(
        &self,
        allowed: bool,
        remaining: u64,
        retry_after: u64,
        reset_after: u64,
        replayed: bool,
    ) -> StepVerdict {
        StepVerdict::Decided(RateLimitDecision {
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

/// What the step answers: the part of a [`RateLimitOutcome`] that depends on
/// the key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepVerdict {
    /// Allowed or denied (possibly replayed from a dedupe record).
    Decided(RateLimitDecision),
    /// The caller's time lags the key's mark by more than the bound;
    /// nothing changes.
    ClockUnsafe {
        /// How far beyond the bound the caller's time lags.
        retry_after: Duration,
    },
    /// The key holds another algorithm's state (the policy changed its
    /// algorithm without a new revision); nothing changes.
    StateMismatch,
}

impl From<StepVerdict> for RateLimitOutcome {
    fn from(verdict: StepVerdict) -> Self {
        match verdict {
            StepVerdict::Decided(decision) => Self::Evaluated(decision),
            StepVerdict::ClockUnsafe { retry_after } => {
                Self::Unavailable { category: UnavailableCategory::ClockUnsafe, retry_after }
            }
            StepVerdict::StateMismatch => {
                Self::Incompatible { category: IncompatibleCategory::StateIncompatible }
            }
        }
    }
}

/// What the provider must store after the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Nothing to write (a denial that charged nothing, a replay, a refusal):
    /// the state that came in, handed back unchanged.
    Keep(Option<KeyState>),
    /// Write `state` in place of what was loaded; the key lives until
    /// `expires_at`, after which its absence means the same as its state.
    Write {
        /// The new state, mark and records included.
        state: KeyState,
        /// Absolute expiry, epoch ms.
        expires_at: u64,
        /// `expires_at` minus the effective time: the TTL for a store that
        /// takes a relative one.
        lifetime: u64,
    },
}

/// One step's result: the answer and what to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyStep {
    /// The answer for the caller.
    pub verdict: StepVerdict,
    /// What to store; a compare-and-set provider writes only a `Write`.
    pub transition: Transition,
}

/// Evaluates one request against one key: `state` as loaded (`None` when
/// absent or past its expiry), caller time `now` (epoch ms), a `cost` the
/// caller has already checked against the policy (1 ..= maximum cost), and
/// the request's evaluation id. The caller has also handled unknown
/// policies and expired deadlines, which never read state.
///
/// The state moves in and out, so a store that keeps it in memory writes it
/// back without copying or allocating.
pub fn evaluate_key(
    rules: &KeyRules,
    state: Option<KeyState>,
    now: u64,
    cost: u64,
    evaluation_id: EvaluationId,
) -> KeyStep {
    let keep = |verdict, state| KeyStep { verdict, transition: Transition::Keep(state) };
    let mut t = now;
    if let Some(held) = &state {
        let lag = held.mark.saturating_sub(t);
        if lag > rules.regression {
            let retry_after = Duration::from_millis(lag - rules.regression);
            return keep(StepVerdict::ClockUnsafe { retry_after }, state);
        }
        t = t.max(held.mark);
    }

    if rules.record_capacity > 0 {
        // Expired records are only ignored here: a replay or a denial
        // writes nothing, so a clock that steps back inside the bound
        // must still find a record that is live at its time.
        let live = |record: &&DedupRecord| record.written_at.saturating_add(rules.dedup_ttl) > t;
        let replay = state.as_ref().and_then(|held| held.records.find(evaluation_id)).filter(live);
        if let Some(record) = replay {
            let verdict = rules.decided(true, record.remaining, 0, record.reset_after, true);
            return keep(verdict, state);
        }
    }

    let counters = state.as_ref().map(|held| &held.algorithm);
    let step = match algorithm::run(&rules.params, counters, t, cost) {
        Ok(step) => step,
        Err(StateMismatch) => return keep(StepVerdict::StateMismatch, state),
    };
    let verdict =
        rules.decided(step.allowed, step.remaining, step.retry_after, step.reset_after, false);
    let Some((counters, state_end)) = step.write else {
        return keep(verdict, state);
    };

    let mut records = state.map(|held| held.records).unwrap_or_default();
    let mut end = state_end;
    if rules.record_capacity > 0 {
        records.drop_expired(t, rules.dedup_ttl);
        if step.allowed {
            let record = DedupRecord {
                evaluation_id,
                remaining: step.remaining,
                reset_after: step.reset_after,
                written_at: t,
            };
            records.push(record, rules.record_capacity);
        }
        if let Some(newest) = records.newest_written_at() {
            end = end.max(newest.saturating_add(rules.dedup_ttl));
        }
    } else {
        // Dedupe switched off under the same revision: old records must
        // neither replay nor keep the key alive.
        records.clear();
    }
    let expires_at = end.saturating_add(rules.slack);
    KeyStep {
        verdict,
        transition: Transition::Write {
            state: KeyState { mark: t, algorithm: counters, records },
            expires_at,
            lifetime: expires_at.saturating_sub(t),
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::{Algorithm, EvaluationDedupPolicy};

    use super::*;

    const T0: u64 = 1_800_000_000_000;

    /// One key as a store would hold it: the state and its expiry.
    #[derive(Debug, Default)]
    struct Key {
        state: Option<KeyState>,
        expires_at: u64,
    }

    impl Key {
        fn evaluate(
            &mut self,
            rules: &KeyRules,
            now: u64,
            cost: u64,
            id: u128,
        ) -> RateLimitOutcome {
            let id = EvaluationId::from_uuid(uuid::Uuid::from_u128(id));
            let step = evaluate_key(rules, self.state.take(), now, cost, id);
            match step.transition {
                Transition::Keep(state) => self.state = state,
                Transition::Write { state, expires_at, lifetime } => {
                    assert_eq!(expires_at - lifetime, state.mark, "lifetime counts from the mark");
                    self.state = Some(state);
                    self.expires_at = expires_at;
                }
            }
            step.verdict.into()
        }

        fn records(&self) -> usize {
            self.state.as_ref().map_or(0, |state| state.records.len())
        }
    }

    fn rules(algorithm: Algorithm, dedup: EvaluationDedupPolicy) -> KeyRules {
        let policy = RateLimitPolicy::builder("p", algorithm)
            .cleanup_grace(Duration::from_millis(300))
            .maximum_clock_regression(Duration::from_millis(500))
            .evaluation_dedup(dedup)
            .build()
            .unwrap();
        KeyRules::of(&policy)
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
    fn expiry_is_state_end_or_newest_record_plus_the_larger_slack() {
        // Fixed window ends at T0 + 1000; a record written at T0 + 250 with
        // a 5 s ttl lives to T0 + 5250; slack G = max(300, 500) = 500.
        let with_dedup = rules(fixed(3), EvaluationDedupPolicy::enabled_defaults());
        let mut key = Key::default();
        key.evaluate(&with_dedup, T0 + 250, 1, 1);
        assert_eq!(key.expires_at, T0 + 5250 + 500);

        let without = rules(fixed(3), EvaluationDedupPolicy::Disabled);
        let mut key = Key::default();
        key.evaluate(&without, T0 + 250, 1, 1);
        assert_eq!(key.expires_at, T0 + 1000 + 500);
    }

    #[test]
    fn a_lagging_clock_inside_the_bound_uses_the_mark_and_beyond_it_is_clock_unsafe() {
        let rules = rules(fixed(5), EvaluationDedupPolicy::Disabled);
        let mut key = Key::default();
        key.evaluate(&rules, T0 + 1200, 1, 1);
        // 400 ms behind (bound 500): evaluated at the mark, in window T0 + 1000.
        let inside = decision(key.evaluate(&rules, T0 + 800, 1, 2));
        assert_eq!((inside.remaining, inside.reset_after), (3, Duration::from_millis(800)));
        assert_eq!(key.state.as_ref().map(|state| state.mark), Some(T0 + 1200));
        // 700 ms behind: 200 ms beyond the bound; nothing changes.
        let before = key.state.clone();
        let outcome = key.evaluate(&rules, T0 + 500, 1, 3);
        assert_eq!(
            outcome,
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: Duration::from_millis(200),
            }
        );
        assert_eq!(key.state, before);
    }

    #[test]
    fn a_repeat_replays_without_charging_and_writes_nothing() {
        let rules = rules(fixed(3), EvaluationDedupPolicy::enabled_defaults());
        let mut key = Key::default();
        let first = decision(key.evaluate(&rules, T0 + 250, 1, 77));
        let expires_at = key.expires_at;
        let before = key.state.clone();
        let again = decision(key.evaluate(&rules, T0 + 900, 1, 77));
        assert!(again.replayed && again.allowed);
        assert_eq!((again.remaining, again.reset_after), (first.remaining, first.reset_after));
        assert_eq!(key.state, before);
        assert_eq!(key.expires_at, expires_at);
    }

    #[test]
    fn a_denial_that_charges_nothing_writes_nothing() {
        let rules = rules(fixed(1), EvaluationDedupPolicy::enabled_defaults());
        let mut key = Key::default();
        key.evaluate(&rules, T0 + 250, 1, 1);
        let id = EvaluationId::from_uuid(uuid::Uuid::from_u128(2));
        let step = evaluate_key(&rules, key.state.clone(), T0 + 600, 1, id);
        assert!(!decision(step.verdict.into()).allowed);
        assert_eq!(step.transition, Transition::Keep(key.state));
    }

    #[test]
    fn records_stay_within_the_byte_bound() {
        let dedup = EvaluationDedupPolicy::Enabled {
            ttl: Duration::from_secs(60),
            max_entries: 100,
            max_stored_bytes: 3 * crate::DEDUP_RECORD_BYTES,
        };
        let rules = rules(fixed(1_000), dedup);
        let mut key = Key::default();
        for id in 0..50 {
            assert!(decision(key.evaluate(&rules, T0, 1, id)).allowed);
        }
        assert_eq!(key.records(), 3);
        // The oldest were evicted: id 0 charges again, id 49 replays.
        assert!(!decision(key.evaluate(&rules, T0, 1, 0)).replayed);
        assert!(decision(key.evaluate(&rules, T0, 1, 49)).replayed);
    }

    #[test]
    fn dedupe_switched_off_drops_the_records_at_the_next_write() {
        let mut key = Key::default();
        key.evaluate(&rules(fixed(3), EvaluationDedupPolicy::enabled_defaults()), T0, 1, 1);
        assert_eq!(key.records(), 1);
        let off = rules(fixed(3), EvaluationDedupPolicy::Disabled);
        // The same id charges again, and the record no longer keeps the key alive.
        assert_eq!(decision(key.evaluate(&off, T0, 1, 1)).remaining, 1);
        assert_eq!((key.records(), key.expires_at), (0, T0 + 1000 + 500));
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
        let mut key = Key::default();
        key.evaluate(&bucket, T0, 1, 1);
        let before = key.state.clone();
        let window = rules(fixed(3), EvaluationDedupPolicy::Disabled);
        assert_eq!(
            key.evaluate(&window, T0, 1, 2),
            RateLimitOutcome::Incompatible { category: IncompatibleCategory::StateIncompatible }
        );
        assert_eq!(key.state, before);
    }

    #[test]
    fn only_the_sliding_counter_is_approximate() {
        let window = Duration::from_millis(1000);
        let period = Duration::from_millis(100);
        let cases = [
            (Algorithm::FixedWindow { limit: 3, window }, Certainty::Certain),
            (Algorithm::SlidingCounter { limit: 3, window }, Certainty::ApproximateAlgorithm),
            (
                Algorithm::TokenBucket { capacity: 3, refill_tokens: 1, refill_period: period },
                Certainty::Certain,
            ),
        ];
        for (algorithm, certainty) in cases {
            assert_eq!(algorithm.certainty(), certainty, "{}", algorithm.name());
            let rules = rules(algorithm, EvaluationDedupPolicy::Disabled);
            let decided = decision(Key::default().evaluate(&rules, T0, 1, 1));
            assert_eq!(decided.certainty, certainty, "{}", algorithm.name());
        }
    }

    #[test]
    fn millis_is_whole_and_saturating() {
        assert_eq!(millis(Duration::from_micros(1999)), 1);
        assert_eq!(millis(Duration::from_secs(3)), 3000);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
