//! GCRA (docs/algorithms.md "GCRA"): the generic cell rate algorithm by
//! virtual scheduling, in whole microseconds; its state is one theoretical
//! arrival time.

use super::{AlgorithmState, Charge, StateMismatch, Step};

/// One run at effective time `t` (ms) for `cost` cells ([`super::run`]):
/// `burst` cells at once, one more every `interval` microseconds.
pub(super) fn step(
    burst: u64,
    interval: u64,
    state: Option<&AlgorithmState>,
    t: u64,
    cost: u64,
    charge: Charge,
) -> Result<Step, StateMismatch> {
    let u = t.saturating_mul(1000);
    let tat = match state {
        None => u,
        Some(&AlgorithmState::Gcra { tat }) => tat,
        Some(
            AlgorithmState::FixedWindow { .. }
            | AlgorithmState::SlidingCounter { .. }
            | AlgorithmState::TokenBucket { .. }
            | AlgorithmState::Concurrency,
        ) => return Err(StateMismatch),
    };
    let a = tat.max(u);
    let backlog = a - u;
    // b x T: every conforming backlog stays within it (d + c T <= b T).
    let whole = burst.saturating_mul(interval);
    let needed = backlog.saturating_add(cost.saturating_mul(interval));
    if needed > whole {
        let (remaining, reset_after) = budget(burst, interval, whole, backlog);
        return Ok(Step::denied(remaining, micros_to_millis(needed - whole).max(1), reset_after));
    }
    if charge == Charge::Spare {
        let (remaining, reset_after) = budget(burst, interval, whole, backlog);
        return Ok(Step::spared(remaining, reset_after));
    }
    let tat = a.saturating_add(needed - backlog);
    let (remaining, reset_after) = budget(burst, interval, whole, needed);
    Ok(Step {
        allowed: true,
        remaining,
        retry_after: 0,
        reset_after,
        write: Some((AlgorithmState::Gcra { tat }, micros_to_millis(tat))),
    })
}

/// `remaining` and `reset_after` (ms) at backlog `d`: the cells that
/// conform now, and when the next one beyond them does (0 when all do).
fn budget(burst: u64, interval: u64, whole: u64, d: u64) -> (u64, u64) {
    let remaining = whole.saturating_sub(d) / interval;
    if remaining >= burst {
        return (burst, 0);
    }
    let next = d.saturating_sub((burst - remaining - 1).saturating_mul(interval));
    (remaining, micros_to_millis(next))
}

/// Microseconds to milliseconds, rounded up: a wait never understated.
fn micros_to_millis(micros: u64) -> u64 {
    micros.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::super::Params;
    use super::super::tests::{T0, apply};
    use super::*;

    // L = 10, P = 1000 ms, b = 5: T = 100000 us.
    const PARAMS: Params = Params::Gcra { burst: 5, interval: 100_000 };

    #[test]
    fn gcra_worked_numbers() {
        let mut state = None;
        for expected in [4, 3, 2, 1, 0] {
            let step = apply(&PARAMS, &mut state, T0, 1);
            assert_eq!((step.allowed, step.remaining, step.reset_after), (true, expected, 100));
        }
        assert_eq!(state, Some(AlgorithmState::Gcra { tat: (T0 + 500) * 1000 }));
        let denied = run(&PARAMS, state.as_ref(), T0, 1);
        assert_eq!(
            (denied.allowed, denied.remaining, denied.retry_after, denied.reset_after),
            (false, 0, 100, 100)
        );
        assert_eq!(denied.write, None, "a denial writes nothing");

        let step = apply(&PARAMS, &mut state, T0 + 250, 1);
        assert_eq!((step.allowed, step.remaining, step.reset_after), (true, 1, 50));
        let denied = run(&PARAMS, state.as_ref(), T0 + 250, 2);
        assert_eq!((denied.allowed, denied.remaining, denied.retry_after), (false, 1, 50));
    }

    #[test]
    fn gcra_state_ends_when_its_arrival_time_is_reached() {
        let mut state = None;
        let mut last = None;
        for _ in 0..5 {
            last = apply(&PARAMS, &mut state, T0, 1).write;
        }
        assert_eq!(last.map(|(_, end)| end), Some(T0 + 500));
        // At state_end the key answers as an absent one: the whole burst.
        let fresh = run(&PARAMS, None, T0 + 500, 1);
        let aged = run(&PARAMS, state.as_ref(), T0 + 500, 1);
        assert_eq!(aged, fresh);
        assert_eq!(aged.remaining, 4);
    }

    #[test]
    fn a_rounded_interval_rounds_every_wait_up() {
        // L = 3 per second: T = 333334 us; one cell after a full burst of 1.
        let params = Params::Gcra { burst: 1, interval: 333_334 };
        let mut state = None;
        assert!(apply(&params, &mut state, T0, 1).allowed);
        let denied = run(&params, state.as_ref(), T0 + 333, 1);
        // 333.334 ms after T0 the cell conforms: 334 us left, 1 ms on the wire.
        assert_eq!((denied.allowed, denied.retry_after), (false, 1));
        assert!(run(&params, state.as_ref(), T0 + 334, 1).allowed);
    }

    fn run(params: &Params, state: Option<&AlgorithmState>, t: u64, cost: u64) -> Step {
        super::super::run(params, state, &super::super::Leases::NONE, t, cost, Charge::Take)
            .unwrap()
    }
}
