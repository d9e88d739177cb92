//! The pure decision step of a policy set (steps 3 to 8 of
//! docs/algorithms.md): a provider loads every key of the set, calls
//! [`evaluate_set`], and stores every member that has a [`KeyWrite`] at once.

mod records;
mod settle;

use std::time::Duration;

pub use records::{DedupRecord, DedupRecords};
pub use settle::{SettleVerdict, settle_set};

use crate::algorithm::{Algorithm, AlgorithmState, Charge, Run, StateMismatch, Step};
use crate::bounds::{MAX_POLICY_SET, millis};
use crate::budget::{BudgetFailure, BudgetState};
use crate::evaluation::EvaluationId;
use crate::leases::{HeldLease, Leases};
use crate::outcome::PolicyMode;
use crate::outcome::{
    IncompatibleCategory, RateLimitDecision, RateLimitFailure, RateLimitOutcome, SetDecision,
    UnavailableCategory,
};
use crate::policy::RateLimitPolicy;
#[cfg(doc)]
use crate::request::RateLimitRequest;

/// Everything a provider stores for one key, plain data to serialize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// The highest effective time (epoch ms) at which the state was written.
    pub mark: u64,
    /// The algorithm's counters.
    pub algorithm: AlgorithmState,
    /// Dedupe records, oldest first; empty when dedupe is off.
    pub records: DedupRecords,
    /// The in-flight leases of a concurrency key; empty for any other.
    pub leases: Leases,
}

/// A policy compiled to milliseconds once, so a decision converts nothing.
#[derive(Debug, Clone)]
pub struct KeyRules {
    algorithm: Algorithm,
    mode: PolicyMode,
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
            algorithm: policy.algorithm().clone(),
            mode: policy.mode(),
            regression: millis(policy.maximum_clock_regression()),
            slack: policy.ttl_slack_millis(),
            dedup_ttl: dedup.ttl_millis(),
            record_capacity: usize::try_from(dedup.record_capacity()).unwrap_or(usize::MAX),
        }
    }

    /// Whether the policy's admitted requests hold a lease in its key.
    pub fn holds_leases(&self) -> bool {
        self.algorithm.holds_leases()
    }

    /// Whether the policy can refuse (not a shadow one).
    pub fn enforced(&self) -> bool {
        self.mode == PolicyMode::Enforce
    }

    /// Its algorithm over a loaded key at effective time `t`.
    fn run(
        &self,
        state: Option<&KeyState>,
        t: u64,
        cost: u64,
        charge: Charge,
    ) -> Result<Step<AlgorithmState>, StateMismatch> {
        let counters = state.map(|held| &held.algorithm);
        let leases = state.map_or(&Leases::NONE, |held| &held.leases);
        self.algorithm.run(counters, &Run { t, cost, charge, leases, regression: self.regression })
    }

    /// The live dedupe record of `evaluation_id` at `t`, if any.
    fn live_record<'s>(
        &self,
        state: Option<&'s KeyState>,
        evaluation_id: EvaluationId,
        t: u64,
    ) -> Option<&'s DedupRecord> {
        // Expired records are only ignored here: a replay or a denial
        // writes nothing, so a clock that steps back inside the bound must
        // still find a record that is live at its time.
        (self.record_capacity > 0 && evaluation_id.may_repeat())
            .then(|| state?.records.find(evaluation_id))
            .flatten()
            .filter(|record| record.written_at.saturating_add(self.dedup_ttl) > t)
    }

    /// This evaluation's replay from a live dedupe record or lease at `t`.
    fn replay(
        &self,
        state: Option<&KeyState>,
        evaluation_id: EvaluationId,
        t: u64,
    ) -> Option<RateLimitDecision> {
        let state = state?;
        let (remaining, reset_after_ms) = match self.live_record(Some(state), evaluation_id, t) {
            Some(record) => (record.remaining, record.reset_after),
            None if self.holds_leases() => {
                state.leases.find_live(evaluation_id, t)?;
                (self.algorithm.limit().saturating_sub(state.leases.live(t)), 0)
            }
            None => return None,
        };
        Some(RateLimitDecision {
            allowed: true,
            remaining,
            retry_after_ms: 0,
            reset_after_ms,
            replayed: true,
        })
    }
}

/// One policy of a set: its rules and its key's state, as loaded and as written.
#[derive(Debug)]
pub struct SetMember<'r> {
    /// The policy's rules.
    pub rules: &'r KeyRules,
    /// The key's state: moved in before the step, the new state after.
    pub state: Option<KeyState>,
    /// After the step: `Some` when `state` must be written.
    pub write: Option<KeyWrite>,
}

impl<'r> SetMember<'r> {
    /// A member with its loaded state.
    pub fn new(rules: &'r KeyRules, state: Option<KeyState>) -> Self {
        Self { rules, state, write: None }
    }
}

/// How long a written key lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyWrite {
    /// Absolute expiry, epoch ms.
    pub expires_at: u64,
    /// `expires_at` minus the caller's own time (not the key's mark): the TTL
    /// for a store that takes a relative one. A store shared by writers with
    /// different clocks must never shorten an expiry already in place with it.
    pub lifetime: u64,
}

/// What the step answers: the part of a [`RateLimitOutcome`] keys decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetVerdict {
    /// The set's decisions, admitted or refused (possibly replayed).
    Decided(SetDecision),
    /// The caller's time lags a key's mark beyond its bound; nothing changes.
    ClockUnsafe {
        /// How far beyond the bound the caller's time lags (at most).
        retry_after: Duration,
    },
    /// A key holds another algorithm's state; nothing changes.
    StateMismatch,
}

impl From<SetVerdict> for RateLimitOutcome {
    fn from(verdict: SetVerdict) -> Self {
        match verdict {
            SetVerdict::Decided(decision) => Ok(decision),
            SetVerdict::ClockUnsafe { retry_after } => Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after,
            }),
            SetVerdict::StateMismatch => Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::StateIncompatible,
            }),
        }
    }
}

/// Evaluates one request against the loaded keys of its set, in order, at
/// caller time `now` for a `cost` [`RateLimitRequest::resolve`] admitted.
/// Admitted iff every enforced member allows; then every allowing member is
/// charged, else none. States move in and out, never copied; at most
/// [`MAX_POLICY_SET`] members are evaluated.
pub fn evaluate_set(
    members: &mut [SetMember<'_>],
    now: u64,
    cost: u64,
    evaluation_id: EvaluationId,
) -> SetVerdict {
    // Most sets hold one policy: its working arrays then hold one entry,
    // not eight to fill and carry.
    if members.len() == 1 {
        evaluate_members::<1>(members, now, cost, evaluation_id)
    } else {
        evaluate_members::<MAX_POLICY_SET>(members, now, cost, evaluation_id)
    }
}

/// [`evaluate_set`] with working arrays of `N`: at most `N` members.
fn evaluate_members<const N: usize>(
    members: &mut [SetMember<'_>],
    now: u64,
    cost: u64,
    evaluation_id: EvaluationId,
) -> SetVerdict {
    let len = members.len().min(N);
    let members = &mut members[..len];
    let times = match effective_times::<N>(members, now) {
        Ok(times) => times,
        Err(retry_after) => return SetVerdict::ClockUnsafe { retry_after },
    };

    // Step 4: a live record (or lease) of this evaluation in any key
    // replays the whole set, and nothing is written anywhere.
    let mut decisions = [None; N];
    for ((member, &t), decision) in members.iter().zip(&times).zip(&mut decisions) {
        *decision = member.rules.replay(member.state.as_ref(), evaluation_id, t);
    }
    if decisions.iter().any(Option::is_some) {
        for ((member, &t), decision) in members.iter().zip(&times).zip(&mut decisions) {
            if decision.is_none() {
                let Ok(step) = member.rules.run(member.state.as_ref(), t, cost, Charge::Spare)
                else {
                    return SetVerdict::StateMismatch;
                };
                *decision = Some(decision_of(&step));
            }
        }
        return SetVerdict::Decided(decided(members, &decisions));
    }

    // Step 5: every algorithm, charging; step 6: the set's verdict.
    let mut steps = [None; N];
    for ((member, &t), step) in members.iter().zip(&times).zip(&mut steps) {
        let Ok(run) = member.rules.run(member.state.as_ref(), t, cost, Charge::Take) else {
            return SetVerdict::StateMismatch;
        };
        *step = Some(run);
    }
    let admitted = members.iter().zip(&steps).all(|(member, step)| {
        member.rules.mode == PolicyMode::Shadow || step.is_some_and(|s| s.allowed)
    });
    if !admitted {
        // Nothing is charged anywhere: an allowing member runs spared.
        for ((member, &t), step) in members.iter().zip(&times).zip(&mut steps) {
            if step.is_some_and(|s| s.allowed) {
                *step = member.rules.run(member.state.as_ref(), t, cost, Charge::Spare).ok();
            }
        }
    }

    // Steps 7 and 8: records and lifetimes of the keys that are written.
    for (((member, &t), step), decision) in
        members.iter_mut().zip(&times).zip(&steps).zip(&mut decisions)
    {
        let Some(step) = step else { continue };
        *decision = Some(decision_of(step));
        let charged = admitted && step.allowed;
        commit(member, now, t, step, charged, evaluation_id);
    }
    SetVerdict::Decided(decided(members, &decisions))
}

/// Step 3: the bound on every key, and each key's effective time (inside
/// the bound a key's time never runs backwards); the largest lag beyond a
/// bound when one is broken.
fn effective_times<const N: usize>(
    members: &mut [SetMember<'_>],
    now: u64,
) -> Result<[u64; N], Duration> {
    let mut times = [now; N];
    let mut unsafe_by = None;
    for (member, t) in members.iter_mut().zip(&mut times) {
        member.write = None;
        if let Some(held) = &member.state {
            let lag = held.mark.saturating_sub(now);
            if lag > member.rules.regression {
                unsafe_by = unsafe_by.max(Some(lag - member.rules.regression));
            }
            *t = now.max(held.mark);
        }
    }
    unsafe_by.map_or(Ok(times), |by| Err(Duration::from_millis(by)))
}

/// A member's decision from its step, not replayed.
fn decision_of(step: &Step<AlgorithmState>) -> RateLimitDecision {
    RateLimitDecision {
        allowed: step.allowed,
        remaining: step.remaining,
        retry_after_ms: step.retry_after,
        reset_after_ms: step.reset_after,
        replayed: false,
    }
}

/// The set's answer from each member's decision; an undecided member denies.
fn decided(members: &[SetMember<'_>], decisions: &[Option<RateLimitDecision>]) -> SetDecision {
    let undecided = decision_of(&Step::denied(0, 1, 0));
    let of = |member: &SetMember<'_>, decision: &Option<RateLimitDecision>| {
        (member.rules.mode, decision.unwrap_or(undecided))
    };
    // A set of one, the usual case, passes one item, not a zip to walk.
    if let ([member], [decision]) = (members, decisions) {
        return SetDecision::of_members(std::iter::once(of(member, decision)));
    }
    SetDecision::of_members(members.iter().zip(decisions).map(|(m, d)| of(m, d)))
}

/// A key's budget now, for an operator: its algorithm run spared at `now`
/// (or the key's mark when `now` lags it), writing nothing.
///
/// # Errors
/// [`BudgetFailure::StateIncompatible`] for another algorithm's state.
pub fn inspect_key(
    rules: &KeyRules,
    state: Option<&KeyState>,
    now: u64,
) -> Result<BudgetState, BudgetFailure> {
    let mark = state.map(|held| held.mark);
    let t = mark.map_or(now, |mark| now.max(mark));
    // Cost 1: the smallest request, so `retry_after` says when anything passes.
    let step = rules
        .run(state, t, 1, Charge::Spare)
        .map_err(|StateMismatch| BudgetFailure::StateIncompatible)?;
    let retry_after = if step.allowed { 0 } else { step.retry_after.max(1) };
    Ok(BudgetState {
        limit: rules.algorithm.limit(),
        remaining: step.remaining,
        reset_after: Duration::from_millis(step.reset_after),
        retry_after: Duration::from_millis(retry_after),
        mark,
        certainty: rules.algorithm.certainty(),
        debt: state.map_or(0, |held| rules.algorithm.debt(&held.algorithm, t)),
    })
}

/// Writes one member's new state, dedupe record and lifetime (steps 7 and 8).
fn commit(
    member: &mut SetMember<'_>,
    now: u64,
    t: u64,
    step: &Step<AlgorithmState>,
    charged: bool,
    evaluation_id: EvaluationId,
) {
    let Some((counters, state_end)) = step.write else { return };
    let rules = member.rules;
    let (mut records, mut leases) =
        member.state.take().map(|held| (held.records, held.leases)).unwrap_or_default();
    if let (Some(lease_life), true) = (rules.algorithm.lease_life(rules.regression), charged) {
        // The lease this admitted request holds until it is released; the
        // step counted a free slot among the live ones. It counts for
        // lease-ttl + R, so no clock ahead by up to R drops it early.
        leases.drop_expired(t);
        leases.push(HeldLease { id: evaluation_id, expires_at: t.saturating_add(lease_life) });
    }
    let mut end = state_end;
    if rules.record_capacity > 0 {
        records.drop_expired(t, rules.dedup_ttl);
        if charged && evaluation_id.may_repeat() {
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
    member.state = Some(KeyState { mark: t, algorithm: counters, records, leases });
    member.write = Some(KeyWrite { expires_at, lifetime: expires_at.saturating_sub(now) });
}

#[cfg(test)]
mod tests {
    use crate::{Algorithm, Certainty, EvaluationDedupPolicy};

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
            let mut members = [SetMember::new(rules, self.state.take())];
            let verdict = evaluate_set(&mut members, now, cost, id);
            let [member] = members;
            if let Some(write) = member.write {
                assert_eq!(write.expires_at - write.lifetime, now, "lifetime counts from now");
                self.expires_at = write.expires_at;
            }
            self.state = member.state;
            verdict.into()
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
        Algorithm::FixedWindow(crate::FixedWindow { limit, window: Duration::from_millis(1000) })
    }

    fn decision(outcome: RateLimitOutcome) -> RateLimitDecision {
        match outcome {
            Ok(set) => {
                assert_eq!(set.decisions().len(), 1, "one policy, one decision");
                assert_eq!(
                    set.allowed(),
                    set.decisions()[0].allowed,
                    "one enforced policy decides"
                );
                set.decisions()[0]
            }
            Err(other) => panic!("expected a decision, got {other:?}"),
        }
    }

    #[test]
    fn expiry_is_state_end_or_newest_record_plus_the_larger_slack() {
        // Fixed window ends at T0 + 1000; a record written at T0 + 250 with
        // a 5 s ttl lives to T0 + 5250; slack G = max(300, 500) = 500.
        let with_dedup = rules(fixed(3), EvaluationDedupPolicy::enabled_defaults());
        let mut key = Key::default();
        let _ = key.evaluate(&with_dedup, T0 + 250, 1, 1);
        assert_eq!(key.expires_at, T0 + 5250 + 500);

        let without = rules(fixed(3), EvaluationDedupPolicy::Disabled);
        let mut key = Key::default();
        let _ = key.evaluate(&without, T0 + 250, 1, 1);
        assert_eq!(key.expires_at, T0 + 1000 + 500);
    }

    #[test]
    fn a_lagging_clock_inside_the_bound_uses_the_mark_and_beyond_it_is_clock_unsafe() {
        let rules = rules(fixed(5), EvaluationDedupPolicy::Disabled);
        let mut key = Key::default();
        let _ = key.evaluate(&rules, T0 + 1200, 1, 1);
        // 400 ms behind (bound 500): evaluated at the mark, in window T0 + 1000.
        let inside = decision(key.evaluate(&rules, T0 + 800, 1, 2));
        assert_eq!((inside.remaining, inside.reset_after_ms), (3, 800));
        assert_eq!(key.state.as_ref().map(|state| state.mark), Some(T0 + 1200));
        // 700 ms behind: 200 ms beyond the bound; nothing changes.
        let before = key.state.clone();
        let outcome = key.evaluate(&rules, T0 + 500, 1, 3);
        assert_eq!(
            outcome,
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: Duration::from_millis(200),
            })
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
        assert_eq!(
            (again.remaining, again.reset_after_ms),
            (first.remaining, first.reset_after_ms)
        );
        assert_eq!(key.state, before);
        assert_eq!(key.expires_at, expires_at);
    }

    #[test]
    fn an_id_minted_once_leaves_no_record_and_the_key_lives_to_its_state_end() {
        // As the record-less key of the expiry test: T0 + 1000 + G 500.
        let rules = rules(fixed(3), EvaluationDedupPolicy::enabled_defaults());
        let mut key = Key::default();
        let mut members = [SetMember::new(&rules, None)];
        let verdict = evaluate_set(&mut members, T0 + 250, 1, EvaluationId::once());
        assert_eq!(decision(verdict.into()).remaining, 2);
        let [member] = members;
        key.state = member.state;
        assert_eq!(key.records(), 0);
        assert_eq!(member.write.map(|write| write.expires_at), Some(T0 + 1000 + 500));
    }

    #[test]
    fn a_denial_that_charges_nothing_writes_nothing() {
        let rules = rules(fixed(1), EvaluationDedupPolicy::enabled_defaults());
        let mut key = Key::default();
        let _ = key.evaluate(&rules, T0 + 250, 1, 1);
        let id = EvaluationId::from_uuid(uuid::Uuid::from_u128(2));
        let mut members = [SetMember::new(&rules, key.state.clone())];
        let verdict = evaluate_set(&mut members, T0 + 600, 1, id);
        assert!(!decision(verdict.into()).allowed);
        assert_eq!(members[0].write, None);
        assert_eq!(members[0].state, key.state);
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
        let _ = key.evaluate(&rules(fixed(3), EvaluationDedupPolicy::enabled_defaults()), T0, 1, 1);
        assert_eq!(key.records(), 1);
        let off = rules(fixed(3), EvaluationDedupPolicy::Disabled);
        // The same id charges again, and the record no longer keeps the key alive.
        assert_eq!(decision(key.evaluate(&off, T0, 1, 1)).remaining, 1);
        assert_eq!((key.records(), key.expires_at), (0, T0 + 1000 + 500));
    }

    #[test]
    fn state_of_another_algorithm_is_incompatible_and_untouched() {
        let bucket = rules(
            Algorithm::TokenBucket(crate::TokenBucket {
                capacity: 3,
                refill_tokens: 1,
                refill_period: Duration::from_millis(100),
            }),
            EvaluationDedupPolicy::Disabled,
        );
        let mut key = Key::default();
        let _ = key.evaluate(&bucket, T0, 1, 1);
        let before = key.state.clone();
        let window = rules(fixed(3), EvaluationDedupPolicy::Disabled);
        assert_eq!(
            key.evaluate(&window, T0, 1, 2),
            Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::StateIncompatible
            })
        );
        assert_eq!(key.state, before);
    }

    #[test]
    fn only_the_sliding_counter_is_approximate() {
        let window = Duration::from_millis(1000);
        let period = Duration::from_millis(100);
        let cases = [
            (Algorithm::FixedWindow(crate::FixedWindow { limit: 3, window }), Certainty::Certain),
            (
                Algorithm::SlidingCounter(crate::SlidingCounter { limit: 3, window }),
                Certainty::ApproximateAlgorithm,
            ),
            (
                Algorithm::TokenBucket(crate::TokenBucket {
                    capacity: 3,
                    refill_tokens: 1,
                    refill_period: period,
                }),
                Certainty::Certain,
            ),
        ];
        for (algorithm, certainty) in cases {
            assert_eq!(algorithm.certainty(), certainty, "{}", algorithm.name());
            let rules = rules(algorithm.clone(), EvaluationDedupPolicy::Disabled);
            let inspected = inspect_key(&rules, None, T0).unwrap().certainty;
            assert_eq!(inspected, certainty, "{}", algorithm.name());
        }
    }

    #[test]
    fn inspect_runs_the_step_spared_at_the_later_of_now_and_the_mark() {
        let rules = rules(fixed(3), EvaluationDedupPolicy::enabled_defaults());
        let fresh = inspect_key(&rules, None, T0 + 250).unwrap();
        assert_eq!((fresh.remaining, fresh.mark), (3, None));
        let mut key = Key::default();
        let _ = key.evaluate(&rules, T0 + 600, 1, 1);
        let before = key.state.clone();
        // 400 ms behind the mark: seen from the mark, as evaluate would.
        let seen = inspect_key(&rules, key.state.as_ref(), T0 + 200).unwrap();
        assert_eq!((seen.remaining, seen.reset_after), (2, Duration::from_millis(400)));
        assert_eq!((seen.retry_after, seen.mark), (Duration::ZERO, Some(T0 + 600)));
        assert_eq!(key.state, before, "inspect takes the state by reference");
        let _ = key.evaluate(&rules, T0 + 600, 2, 2);
        let empty = inspect_key(&rules, key.state.as_ref(), T0 + 700).unwrap();
        assert_eq!((empty.remaining, empty.retry_after), (0, Duration::from_millis(300)));
        let bucket = rules_of_bucket();
        assert_eq!(
            inspect_key(&bucket, key.state.as_ref(), T0 + 700),
            Err(BudgetFailure::StateIncompatible)
        );
    }

    fn rules_of_bucket() -> KeyRules {
        let algorithm = Algorithm::TokenBucket(crate::TokenBucket {
            capacity: 3,
            refill_tokens: 1,
            refill_period: Duration::from_millis(100),
        });
        rules(algorithm, EvaluationDedupPolicy::Disabled)
    }

    #[test]
    fn millis_is_whole_and_saturating() {
        assert_eq!(millis(Duration::from_micros(1999)), 1);
        assert_eq!(millis(Duration::from_secs(3)), 3000);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }

    /// The keys of one subject's policy set, as a store would hold them.
    struct Set {
        rules: Vec<KeyRules>,
        keys: Vec<Key>,
    }

    impl Set {
        fn of(rules: Vec<KeyRules>) -> Self {
            let keys = rules.iter().map(|_| Key::default()).collect();
            Self { rules, keys }
        }

        fn evaluate(&mut self, now: u64, cost: u64, id: u128) -> (SetVerdict, Vec<bool>) {
            let id = EvaluationId::from_uuid(uuid::Uuid::from_u128(id));
            let mut members: Vec<_> = self
                .rules
                .iter()
                .zip(&mut self.keys)
                .map(|(rules, key)| SetMember::new(rules, key.state.take()))
                .collect();
            let verdict = evaluate_set(&mut members, now, cost, id);
            let written = members.iter().map(|member| member.write.is_some()).collect();
            for (member, key) in members.into_iter().zip(&mut self.keys) {
                if let Some(write) = member.write {
                    key.expires_at = write.expires_at;
                }
                key.state = member.state;
            }
            (verdict, written)
        }
    }

    fn set_decision(verdict: SetVerdict) -> SetDecision {
        match verdict {
            SetVerdict::Decided(set) => set,
            other @ (SetVerdict::ClockUnsafe { .. } | SetVerdict::StateMismatch) => {
                panic!("expected decisions, got {other:?}")
            }
        }
    }

    fn with_mode(algorithm: Algorithm, mode: PolicyMode) -> KeyRules {
        let policy = RateLimitPolicy::builder("p", algorithm)
            .maximum_clock_regression(Duration::from_millis(500))
            .mode(mode)
            .build()
            .unwrap();
        KeyRules::of(&policy)
    }

    #[test]
    fn a_denial_by_one_policy_charges_no_other() {
        // Burst 2 per second beside 10 per second.
        let mut set = Set::of(vec![
            with_mode(fixed(2), PolicyMode::Enforce),
            with_mode(fixed(10), PolicyMode::Enforce),
        ]);
        for id in 1..=2 {
            assert!(set_decision(set.evaluate(T0, 1, id).0).allowed());
        }
        let (verdict, written) = set.evaluate(T0 + 100, 1, 3);
        let denied = set_decision(verdict);
        assert!(!denied.allowed());
        let [burst, sustained] = denied.decisions() else { panic!("two decisions") };
        assert!(!burst.allowed && sustained.allowed);
        // The sustained budget stands at 8, uncharged, and nothing was written.
        assert_eq!((burst.remaining, sustained.remaining), (0, 8));
        assert_eq!(sustained.retry_after_ms, 0);
        assert_eq!(written, [false, false]);
        // The next window of the burst policy admits again, charging both.
        let next = set_decision(set.evaluate(T0 + 1000, 1, 4).0);
        let remaining: Vec<_> = next.decisions().iter().map(|d| d.remaining).collect();
        assert!(next.allowed());
        assert_eq!(remaining, [1, 9]);
    }

    #[test]
    fn a_shadow_policy_never_blocks_and_is_charged_only_on_its_own_allow() {
        let mut set = Set::of(vec![
            with_mode(fixed(10), PolicyMode::Enforce),
            with_mode(fixed(1), PolicyMode::Shadow),
        ]);
        let first = set_decision(set.evaluate(T0, 1, 1).0);
        assert!(first.allowed());
        assert_eq!(first.decisions()[1].remaining, 0);
        let (verdict, written) = set.evaluate(T0, 1, 2);
        let second = set_decision(verdict);
        assert!(second.allowed(), "shadow never blocks");
        let [enforced, shadow] = second.decisions() else { panic!("two decisions") };
        assert_eq!((enforced.allowed, enforced.remaining), (true, 8));
        assert_eq!((shadow.allowed, shadow.remaining), (false, 0));
        assert_eq!(written, [true, false], "the denying shadow writes nothing");
    }

    #[test]
    fn a_set_of_shadow_policies_alone_is_always_admitted() {
        let mut set = Set::of(vec![with_mode(fixed(1), PolicyMode::Shadow)]);
        assert!(set_decision(set.evaluate(T0, 1, 1).0).allowed());
        let second = set_decision(set.evaluate(T0, 1, 2).0);
        assert!(second.allowed() && !second.decisions()[0].allowed);
    }

    #[test]
    fn a_repeat_replays_the_whole_set_and_writes_nothing() {
        let mut set = Set::of(vec![
            with_mode(fixed(5), PolicyMode::Enforce),
            with_mode(fixed(1), PolicyMode::Shadow),
        ]);
        set.evaluate(T0, 1, 1);
        // Another evaluation drains the shadow policy: it has no record of 2.
        let second = set_decision(set.evaluate(T0, 1, 2).0);
        assert!(!second.decisions()[1].allowed);
        let (verdict, written) = set.evaluate(T0 + 300, 1, 2);
        let again = set_decision(verdict);
        assert!(again.allowed() && again.replayed());
        let [enforced, shadow] = again.decisions() else { panic!("two decisions") };
        assert_eq!((enforced.replayed, enforced.remaining), (true, 3));
        assert_eq!((shadow.replayed, shadow.allowed), (false, false));
        assert_eq!(written, [false, false]);
        // Still 3 left: the replay charged nothing.
        let third = set_decision(set.evaluate(T0 + 300, 1, 3).0);
        assert_eq!(third.decisions()[0].remaining, 2);
    }

    #[test]
    fn clock_unsafe_on_one_key_changes_no_key() {
        let mut set = Set::of(vec![
            with_mode(fixed(5), PolicyMode::Enforce),
            with_mode(fixed(5), PolicyMode::Enforce),
        ]);
        set.evaluate(T0 + 900, 1, 1);
        // Only the first key moves ahead (a set of it alone, as another
        // operation listing the same subject-scoped policy would).
        let mut first =
            Set { rules: vec![set.rules[0].clone()], keys: vec![std::mem::take(&mut set.keys[0])] };
        first.evaluate(T0 + 1_800, 1, 2);
        set.keys[0] = std::mem::take(&mut first.keys[0]);
        let before: Vec<_> = set.keys.iter().map(|key| key.state.clone()).collect();
        // 1 s behind the first key (bound 500 ms), 100 ms behind the second.
        let (verdict, written) = set.evaluate(T0 + 800, 1, 3);
        assert_eq!(verdict, SetVerdict::ClockUnsafe { retry_after: Duration::from_millis(500) });
        assert_eq!(written, [false, false]);
        let after: Vec<_> = set.keys.iter().map(|key| key.state.clone()).collect();
        assert_eq!(after, before);
    }

    #[test]
    fn a_spared_token_bucket_writes_its_refill_but_keeps_its_tokens() {
        let bucket = Algorithm::TokenBucket(crate::TokenBucket {
            capacity: 4,
            refill_tokens: 1,
            refill_period: Duration::from_millis(100),
        });
        let mut set = Set::of(vec![
            with_mode(fixed(1), PolicyMode::Enforce),
            with_mode(bucket, PolicyMode::Enforce),
        ]);
        set.evaluate(T0, 1, 1);
        let (verdict, written) = set.evaluate(T0 + 250, 1, 2);
        let denied = set_decision(verdict);
        assert!(!denied.allowed());
        // 3 tokens at T0, +2 refilled by T0 + 250 (capped at 4): 4, uncharged.
        assert_eq!(denied.decisions()[1].remaining, 4);
        assert_eq!(written, [false, true], "the bucket writes its refill as a denial does");
        assert_eq!(
            set.keys[1].state.as_ref().map(|state| state.algorithm),
            Some(AlgorithmState::TokenBucket(crate::TokenBucketState {
                tokens: 4,
                updated_at: T0 + 250
            }))
        );
    }

    // ---- Concurrency (docs/algorithms.md "Concurrency (in-flight leases)") ----

    /// `max_in_flight` leases of 30 s, a refusal telling `retry_ms`.
    fn in_flight(max_in_flight: u64, retry_ms: u64) -> Algorithm {
        Algorithm::Concurrency(crate::Concurrency {
            max_in_flight,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_millis(retry_ms),
        })
    }

    /// max-in-flight 2, lease-ttl 30 s, retry-after 1 s: the design's example.
    fn two_in_flight() -> Algorithm {
        in_flight(2, 1000)
    }

    fn lease_id(n: u128) -> EvaluationId {
        EvaluationId::from_uuid(uuid::Uuid::from_u128(n))
    }

    /// The ids of the leases a key holds, in the order taken.
    fn lease_ids(key: &Key) -> Vec<EvaluationId> {
        key.state.iter().flat_map(|state| state.leases.iter().map(|lease| lease.id)).collect()
    }

    fn only(set: SetDecision) -> (bool, u64, u64, u64, bool) {
        let d = set.decisions()[0];
        (d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms, d.replayed)
    }

    #[test]
    fn two_in_flight_hold_two_leases_refuse_the_third_and_replay_the_first() {
        let mut set = Set::of(vec![with_mode(two_in_flight(), PolicyMode::Enforce)]);
        let (first, written) = set.evaluate(T0, 1, 1);
        assert_eq!(only(set_decision(first)), (true, 1, 0, 0, false));
        assert_eq!(written, [true]);
        // The lease counts for lease-ttl + R (30 s + 500 ms); the key lives
        // until it expires, plus the slack (grace 1 s).
        assert_eq!(set.keys[0].expires_at, T0 + 30_500 + 1000);
        // Cost is not a lease count: cost 5 takes one slot.
        assert_eq!(only(set_decision(set.evaluate(T0 + 10, 5, 2).0)), (true, 0, 0, 0, false));
        assert_eq!(set.keys[0].expires_at, T0 + 30_510 + 1000);
        let (third, written) = set.evaluate(T0 + 20, 1, 3);
        assert_eq!(only(set_decision(third)), (false, 0, 1000, 0, false));
        assert_eq!(written, [false], "a refusal writes nothing");
        // The same evaluation id again: the same lease, no second slot.
        let (replay, written) = set.evaluate(T0 + 30, 1, 1);
        assert_eq!(only(set_decision(replay)), (true, 0, 0, 0, true));
        assert_eq!(written, [false]);
        assert_eq!(lease_ids(&set.keys[0]), [lease_id(1), lease_id(2)]);
    }

    #[test]
    fn a_lease_is_gone_at_its_expiry_and_a_released_one_frees_its_slot() {
        let mut set = Set::of(vec![with_mode(two_in_flight(), PolicyMode::Enforce)]);
        set.evaluate(T0, 1, 1);
        set.evaluate(T0 + 10, 1, 2);
        // At T0 + 30 500 (lease-ttl + R) lease 1 has expired (expires_at <= t):
        // a slot is free, and the admitted request drops the expired lease as
        // it adds its own.
        assert!(!only(set_decision(set.evaluate(T0 + 30_499, 1, 3).0)).0);
        assert_eq!(only(set_decision(set.evaluate(T0 + 30_500, 1, 4).0)), (true, 0, 0, 0, false));
        assert_eq!(lease_ids(&set.keys[0]), [lease_id(2), lease_id(4)]);
        // An expired lease's id is no replay: it asks for a slot again.
        assert!(!only(set_decision(set.evaluate(T0 + 30_501, 1, 1).0)).0);
        // A release frees a slot at once; a second release finds nothing.
        let state = set.keys[0].state.as_mut().unwrap();
        assert!(state.leases.release(lease_id(2), T0 + 30_502));
        assert!(!state.leases.release(lease_id(2), T0 + 30_502));
        assert_eq!(only(set_decision(set.evaluate(T0 + 30_503, 1, 5).0)), (true, 0, 0, 0, false));
        assert_eq!(lease_ids(&set.keys[0]), [lease_id(4), lease_id(5)]);
    }

    #[test]
    fn a_request_refused_by_a_rate_policy_holds_no_lease() {
        let mut set = Set::of(vec![
            with_mode(fixed(1), PolicyMode::Enforce),
            with_mode(two_in_flight(), PolicyMode::Enforce),
        ]);
        assert!(set_decision(set.evaluate(T0, 1, 1).0).allowed());
        let (verdict, written) = set.evaluate(T0 + 100, 1, 2);
        let refused = set_decision(verdict);
        assert!(!refused.allowed());
        assert_eq!(written, [false, false]);
        // The concurrency member allows, spared: one slot of two still free.
        let lease = refused.decisions()[1];
        assert_eq!((lease.allowed, lease.remaining), (true, 1));
        assert_eq!(lease_ids(&set.keys[1]), [lease_id(1)]);
    }

    #[test]
    fn a_request_refused_for_lack_of_a_lease_charges_no_rate_policy() {
        let one_in_flight = in_flight(1, 250);
        let mut set = Set::of(vec![
            with_mode(fixed(10), PolicyMode::Enforce),
            with_mode(one_in_flight, PolicyMode::Enforce),
        ]);
        assert!(set_decision(set.evaluate(T0, 1, 1).0).allowed());
        let (verdict, written) = set.evaluate(T0 + 100, 1, 2);
        let refused = set_decision(verdict);
        assert!(!refused.allowed());
        assert_eq!(written, [false, false], "no charge, no lease");
        let [rate, lease] = [refused.decisions()[0], refused.decisions()[1]];
        assert_eq!((rate.allowed, rate.remaining), (true, 9));
        assert_eq!((lease.allowed, lease.remaining, lease.retry_after_ms), (false, 0, 250));
        // Released, the next request takes the slot and the rate's 2nd unit.
        set.keys[1].state.as_mut().unwrap().leases.release(lease_id(1), T0 + 200);
        let admitted = set_decision(set.evaluate(T0 + 300, 1, 3).0);
        assert!(admitted.allowed());
        assert_eq!(admitted.decisions()[0].remaining, 8);
    }

    #[test]
    fn a_dedupe_replay_returns_the_same_lease_and_a_lease_replays_the_whole_set() {
        for dedup in [EvaluationDedupPolicy::enabled_defaults(), EvaluationDedupPolicy::Disabled] {
            let rate = RateLimitPolicy::builder("r", fixed(10))
                .maximum_clock_regression(Duration::from_millis(500))
                .evaluation_dedup(dedup)
                .build()
                .unwrap();
            let mut set =
                Set::of(vec![KeyRules::of(&rate), with_mode(two_in_flight(), PolicyMode::Enforce)]);
            assert!(set_decision(set.evaluate(T0, 1, 1).0).allowed());
            let (verdict, written) = set.evaluate(T0 + 50, 1, 1);
            let replay = set_decision(verdict);
            assert!(replay.allowed() && replay.replayed(), "{dedup:?}");
            assert_eq!(written, [false, false], "{dedup:?}");
            // Whether the rate's record or the lease replayed the set, the
            // rate was charged once and one slot is taken.
            assert_eq!(replay.decisions()[0].remaining, 9, "{dedup:?}");
            let lease = replay.decisions()[1];
            assert_eq!((lease.allowed, lease.remaining, lease.replayed), (true, 1, true));
            assert_eq!(lease_ids(&set.keys[1]), [lease_id(1)], "{dedup:?}");
            let next = set_decision(set.evaluate(T0 + 60, 1, 2).0);
            assert_eq!(
                (next.decisions()[0].remaining, next.decisions()[1].remaining),
                (8, 0),
                "{dedup:?}"
            );
        }
    }

    #[test]
    fn a_shadow_concurrency_policy_takes_real_leases_but_never_denies() {
        let one_in_flight = in_flight(1, 1000);
        let mut set = Set::of(vec![
            with_mode(fixed(10), PolicyMode::Enforce),
            with_mode(one_in_flight, PolicyMode::Shadow),
        ]);
        let first = set_decision(set.evaluate(T0, 1, 1).0);
        assert!(first.allowed());
        assert_eq!(lease_ids(&set.keys[1]), [lease_id(1)], "a real lease");
        let (verdict, written) = set.evaluate(T0 + 10, 1, 2);
        let second = set_decision(verdict);
        assert!(second.allowed(), "a shadow policy never denies");
        assert_eq!((second.decisions()[1].allowed, second.decisions()[0].remaining), (false, 8));
        // Its would-be denial takes no lease: it never holds more than its limit.
        assert_eq!(written, [true, false]);
        assert_eq!(lease_ids(&set.keys[1]), [lease_id(1)]);
    }

    #[test]
    fn leases_keep_the_clock_bound_and_expire_at_the_effective_time() {
        let mut set = Set::of(vec![with_mode(two_in_flight(), PolicyMode::Enforce)]);
        set.evaluate(T0 + 1000, 1, 1);
        // 1000 ms behind the mark, bound 500 ms: refused, nothing changes.
        let before = set.keys[0].state.clone();
        let (verdict, written) = set.evaluate(T0, 1, 2);
        assert_eq!(verdict, SetVerdict::ClockUnsafe { retry_after: Duration::from_millis(500) });
        assert_eq!((written, set.keys[0].state.clone()), (vec![false], before));
        // 400 ms behind: evaluated at the mark, so the lease runs from T0 + 1000
        // for lease-ttl + R (30 s + 500 ms).
        assert!(set_decision(set.evaluate(T0 + 600, 1, 3).0).allowed());
        let expiries: Vec<u64> =
            set.keys[0].state.iter().flat_map(|s| s.leases.iter().map(|l| l.expires_at)).collect();
        assert_eq!(expiries, [T0 + 31_500, T0 + 31_500]);
    }

    #[test]
    fn inspecting_a_concurrency_budget_counts_its_live_leases() {
        let rules = with_mode(two_in_flight(), PolicyMode::Enforce);
        let fresh = inspect_key(&rules, None, T0).unwrap();
        assert_eq!((fresh.limit, fresh.remaining, fresh.retry_after), (2, 2, Duration::ZERO));
        let mut set = Set::of(vec![rules.clone()]);
        set.evaluate(T0, 1, 1);
        set.evaluate(T0 + 10, 1, 2);
        let state = set.keys[0].state.as_ref();
        let full = inspect_key(&rules, state, T0 + 20).unwrap();
        assert_eq!(
            (full.remaining, full.retry_after, full.reset_after, full.mark),
            (0, Duration::from_secs(1), Duration::ZERO, Some(T0 + 10))
        );
        // Lease 1 expired at T0 + 30 500 (lease-ttl + R): one slot free,
        // nothing written.
        let later = inspect_key(&rules, state, T0 + 30_500).unwrap();
        assert_eq!((later.remaining, later.retry_after), (1, Duration::ZERO));
        // A concurrency key read as a rate policy's is another algorithm's state.
        assert_eq!(
            inspect_key(&with_mode(fixed(3), PolicyMode::Enforce), state, T0),
            Err(BudgetFailure::StateIncompatible)
        );
    }
}
