//! Fixed window (docs/algorithms.md "Fixed window"): a count per aligned
//! window; its state is the window's start and its count.

use super::{AlgorithmState, Charge, StateMismatch, Step};

/// One run at effective time `t` for `cost` units ([`super::run`]).
pub(super) fn step(
    limit: u64,
    window: u64,
    state: Option<&AlgorithmState>,
    t: u64,
    cost: u64,
    charge: Charge,
) -> Result<Step, StateMismatch> {
    let ws = t - t % window;
    let n = match state {
        Some(&AlgorithmState::FixedWindow { window_start, count }) if window_start == ws => count,
        None | Some(AlgorithmState::FixedWindow { .. }) => 0,
        Some(
            AlgorithmState::SlidingCounter { .. }
            | AlgorithmState::TokenBucket { .. }
            | AlgorithmState::Gcra { .. }
            | AlgorithmState::Concurrency,
        ) => {
            return Err(StateMismatch);
        }
    };
    let end = ws.saturating_add(window);
    let to_end = end.saturating_sub(t);
    if n.saturating_add(cost) > limit {
        return Ok(Step::denied(limit.saturating_sub(n), to_end.max(1), to_end));
    }
    if charge == Charge::Spare {
        return Ok(Step::spared(limit - n, to_end));
    }
    let n = n + cost;
    Ok(Step {
        allowed: true,
        remaining: limit - n,
        retry_after: 0,
        reset_after: to_end,
        write: Some((AlgorithmState::FixedWindow { window_start: ws, count: n }, end)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::Params;
    use super::super::tests::{T0, apply};
    use super::*;

    #[test]
    fn fixed_window_worked_numbers() {
        let params = Params::FixedWindow { limit: 3, window: 1000 };
        let mut state = None;
        for expected in [2, 1, 0] {
            let step = apply(&params, &mut state, T0 + 250, 1);
            assert!(step.allowed);
            assert_eq!((step.remaining, step.reset_after, step.retry_after), (expected, 750, 0));
            assert_eq!(step.write.unwrap().1, T0 + 1000);
        }
        let denied = apply(&params, &mut state, T0 + 250, 1);
        assert!(!denied.allowed);
        assert_eq!((denied.remaining, denied.retry_after, denied.reset_after), (0, 750, 750));
        assert_eq!(denied.write, None);
        // The next window starts from zero, with the same two fields.
        let next = apply(&params, &mut state, T0 + 1000, 1);
        assert_eq!((next.allowed, next.remaining), (true, 2));
        assert_eq!(state, Some(AlgorithmState::FixedWindow { window_start: T0 + 1000, count: 1 }));
    }
}
