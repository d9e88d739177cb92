//! One key's entry as the store holds it: the decision step's state and
//! the absolute expiry the store sweeps by.

use shared_contract::{KeyState, KeyWrite};

/// Everything the store holds for one key: constant size but for the dedupe
/// records and leases, each bounded by its policy.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Absolute expiry (epoch ms): from then on the key counts as absent.
    pub(crate) expires_at: u64,
    /// `None` for an entry not written yet, and while a step holds it.
    state: Option<KeyState>,
}

impl Entry {
    /// An entry holding what a step left, expiring as it wrote (at once
    /// when it wrote nothing).
    pub(crate) fn new(state: Option<KeyState>, write: Option<KeyWrite>) -> Self {
        Self { expires_at: write.map_or(0, |write| write.expires_at), state }
    }

    /// Whether an evaluation has written state into this entry.
    #[cfg(test)]
    pub(crate) fn is_written(&self) -> bool {
        self.state.is_some()
    }

    /// Moves the state out for a step at `now` (an expired key reads as
    /// absent), copying nothing.
    pub(crate) fn take(&mut self, now: u64) -> Option<KeyState> {
        if self.expires_at <= now {
            self.state = None;
        }
        self.state.take()
    }

    /// Moves the step's state back in, with its new expiry when it wrote
    /// one; the expiry.
    pub(crate) fn put(&mut self, state: Option<KeyState>, write: Option<KeyWrite>) -> u64 {
        self.state = state;
        if let Some(write) = write {
            self.expires_at = write.expires_at;
        }
        self.expires_at
    }

    /// The live state at `now`, to change in place (a release).
    pub(crate) fn live_state(&mut self, now: u64) -> Option<&mut KeyState> {
        if self.expires_at <= now {
            return None;
        }
        self.state.as_mut()
    }

    /// The state held, without moving it (an operator's inspect).
    pub(crate) fn state(&self) -> Option<&KeyState> {
        self.state.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::{
        Algorithm, EvaluationDedupPolicy, EvaluationId, KeyRules, RateLimitOutcome,
        RateLimitOutcomeExt, RateLimitPolicy, SetMember, evaluate_set,
    };

    use super::*;

    use crate::T0;

    #[test]
    fn an_entry_is_small_and_fixed_size() {
        // Expiry, mark, the largest state (three counts and a tag), one
        // pointer to the records and one to a concurrency key's leases: a
        // map slot stays small whatever a subject's history, so more keys
        // fit in cache.
        assert!(std::mem::size_of::<Entry>() <= 64, "{}", std::mem::size_of::<Entry>());
    }

    #[test]
    fn a_write_moves_the_expiry_and_a_denial_keeps_it() {
        // Fixed window 1 per second, grace and regression 1 s, no dedupe: a
        // write at T0 + 250 expires at T0 + 1000 + 1000.
        let policy = RateLimitPolicy::builder(
            "p",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 1,
                window: Duration::from_millis(1000),
            }),
        )
        .evaluation_dedup(EvaluationDedupPolicy::Disabled)
        .build()
        .unwrap();
        let rules = KeyRules::of(&policy);
        let id = EvaluationId::random();
        let mut entry = Entry::new(None, None);
        let evaluate = |entry: &mut Entry, now| {
            let mut members = [SetMember::new(&rules, entry.take(now))];
            let verdict = evaluate_set(&mut members, now, 1, id);
            let [member] = members;
            entry.put(member.state, member.write);
            RateLimitOutcome::from(verdict)
        };
        assert!(evaluate(&mut entry, T0 + 250).is_allowed());
        assert_eq!(entry.expires_at, T0 + 2000);
        let written = entry.state().cloned();
        assert!(!evaluate(&mut entry, T0 + 600).is_allowed());
        assert_eq!((entry.expires_at, entry.state().cloned()), (T0 + 2000, written));
        // Past its expiry the entry reads as absent.
        assert_eq!(entry.take(T0 + 2000), None);
        assert!(!entry.is_written());
    }
}
