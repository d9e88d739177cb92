//! One key's entry as the store holds it: the shared decision step's state
//! plus the absolute expiry the store sweeps by.

use shared_contract::{
    EvaluationId, KeyRules, KeyState, RateLimitOutcome, Transition, evaluate_key,
};

/// Everything the store holds for one key. Its size is constant except for
/// the dedupe records, which are bounded by the policy's record capacity.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Absolute expiry (epoch ms): from then on the key counts as absent.
    pub(crate) expires_at: u64,
    /// `None` only for a fresh entry that has not been written yet.
    state: Option<KeyState>,
}

impl Entry {
    /// An entry that holds nothing yet: the same as an absent key.
    pub(crate) fn blank() -> Self {
        Self { expires_at: 0, state: None }
    }

    /// Forgets an expired entry in place, keeping its key.
    pub(crate) fn reset(&mut self) {
        self.state = None;
    }

    /// Whether an evaluation has written state into this entry.
    pub(crate) fn is_written(&self) -> bool {
        self.state.is_some()
    }

    /// Evaluates one request against this key at caller time `now`. The
    /// caller has already checked the policy, the cost and the deadline, and
    /// has reset the entry if it was past its expiry. The state moves
    /// through the step and back, so nothing is copied or allocated here.
    pub(crate) fn evaluate(
        &mut self,
        rules: &KeyRules,
        now: u64,
        cost: u64,
        evaluation_id: EvaluationId,
    ) -> RateLimitOutcome {
        let step = evaluate_key(rules, self.state.take(), now, cost, evaluation_id);
        match step.transition {
            Transition::Keep(state) => self.state = state,
            Transition::Write { state, expires_at, .. } => {
                self.state = Some(state);
                self.expires_at = expires_at;
            }
        }
        step.verdict.into()
    }

    #[cfg(test)]
    pub(crate) fn state(&self) -> Option<&KeyState> {
        self.state.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::{Algorithm, EvaluationDedupPolicy, RateLimitPolicy};

    use super::*;

    const T0: u64 = 1_800_000_000_000;

    #[test]
    fn an_entry_is_small_and_fixed_size() {
        // Expiry, mark, the largest state (three counts and a tag) and one
        // pointer to the records: a map slot stays small whatever a
        // subject's history, so more keys fit in cache.
        assert!(std::mem::size_of::<Entry>() <= 56, "{}", std::mem::size_of::<Entry>());
    }

    #[test]
    fn a_write_moves_the_expiry_and_a_denial_keeps_it() {
        // Fixed window 1 per second, grace and regression 1 s, no dedupe: a
        // write at T0 + 250 expires at T0 + 1000 + 1000.
        let policy = RateLimitPolicy::builder(
            "p",
            Algorithm::FixedWindow { limit: 1, window: Duration::from_millis(1000) },
        )
        .evaluation_dedup(EvaluationDedupPolicy::Disabled)
        .build()
        .unwrap();
        let rules = KeyRules::of(&policy);
        let id = EvaluationId::random();
        let mut entry = Entry::blank();
        assert!(entry.evaluate(&rules, T0 + 250, 1, id).is_allowed());
        assert_eq!(entry.expires_at, T0 + 2000);
        let written = entry.state().cloned();
        assert!(!entry.evaluate(&rules, T0 + 600, 1, id).is_allowed());
        assert_eq!((entry.expires_at, entry.state().cloned()), (T0 + 2000, written));
        entry.reset();
        assert!(!entry.is_written());
    }
}
