//! Token bucket (docs/algorithms.md "Token bucket"): tokens refilled by
//! whole periods up to the capacity; its state is the tokens left and the
//! start of the period not yet credited.

use super::{AlgorithmState, Charge, StateMismatch, Step};

/// One run at effective time `t` for `cost` units ([`super::run`]).
pub(super) fn step(
    capacity: u64,
    refill_tokens: u64,
    period: u64,
    state: Option<&AlgorithmState>,
    t: u64,
    cost: u64,
    charge: Charge,
) -> Result<Step, StateMismatch> {
    let (tokens, updated_at) = match state {
        None => (capacity, t),
        Some(&AlgorithmState::TokenBucket { tokens, updated_at }) => (tokens, updated_at),
        Some(
            AlgorithmState::FixedWindow { .. }
            | AlgorithmState::SlidingCounter { .. }
            | AlgorithmState::Gcra { .. }
            | AlgorithmState::Concurrency,
        ) => {
            return Err(StateMismatch);
        }
    };
    let periods = t.saturating_sub(updated_at) / period;
    let mut tokens = capacity.min(tokens.saturating_add(periods.saturating_mul(refill_tokens)));
    // periods * period <= t - updated_at: the partial period is kept.
    let mut updated_at = updated_at + periods * period;
    if tokens == capacity {
        updated_at = t;
    }
    // Time from `t` until `needed` more tokens have been refilled.
    let wait_for = |needed: u64| {
        needed
            .div_ceil(refill_tokens)
            .saturating_mul(period)
            .saturating_sub(t.saturating_sub(updated_at))
    };
    let allowed = tokens >= cost;
    let retry_after = if allowed { 0 } else { wait_for(cost - tokens).max(1) };
    // A spared bucket writes the refill, as a denial does, and keeps its tokens.
    if allowed && charge == Charge::Take {
        tokens -= cost;
    }
    let reset_after = if tokens >= capacity { 0 } else { wait_for(capacity - tokens) };
    Ok(Step {
        allowed,
        remaining: tokens,
        retry_after,
        reset_after,
        write: Some((
            AlgorithmState::TokenBucket { tokens, updated_at },
            t.saturating_add(reset_after),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::super::Params;
    use super::super::tests::{T0, apply};
    use super::*;

    #[test]
    fn token_bucket_worked_numbers() {
        let params = Params::TokenBucket { capacity: 5, refill_tokens: 1, period: 100 };
        let mut state = None;
        for expected in [4, 3, 2, 1, 0] {
            let step = apply(&params, &mut state, T0, 1);
            assert_eq!((step.allowed, step.remaining), (true, expected));
        }
        let denied = apply(&params, &mut state, T0, 1);
        assert_eq!((denied.allowed, denied.remaining, denied.retry_after), (false, 0, 100));
        // A bucket denial still writes its state.
        assert!(denied.write.is_some());
        let step = apply(&params, &mut state, T0 + 250, 1);
        assert_eq!((step.allowed, step.remaining, step.reset_after), (true, 1, 350));
        assert_eq!(state, Some(AlgorithmState::TokenBucket { tokens: 1, updated_at: T0 + 200 }));
        assert_eq!(step.write.unwrap().1, T0 + 250 + 350);
    }

    #[test]
    fn a_full_bucket_restarts_its_refill_clock() {
        let params = Params::TokenBucket { capacity: 2, refill_tokens: 1, period: 100 };
        let mut state = None;
        apply(&params, &mut state, T0, 1);
        // 1 + 3 periods caps at 2: the clock restarts at T0 + 370.
        let step = apply(&params, &mut state, T0 + 370, 1);
        assert_eq!((step.remaining, step.reset_after), (1, 100));
        assert_eq!(state, Some(AlgorithmState::TokenBucket { tokens: 1, updated_at: T0 + 370 }));
    }
}
