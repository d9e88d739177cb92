//! The three counting algorithms as pure functions over one key's state,
//! exactly as `docs/algorithms.md` defines them.
//!
//! All arithmetic saturates or widens: caller times come from an injected
//! clock and may be anything, and a provider's `evaluate` must never panic.

use crate::policy::{Algorithm, millis};

/// The stored counting state of one key: a constant number of fields
/// whatever the number of windows or refills a subject has lived through.
/// Times are epoch milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgorithmState {
    /// The current window's start and its count.
    FixedWindow {
        /// Start of the window the count belongs to.
        window_start: u64,
        /// Units charged in that window.
        count: u64,
    },
    /// The current window's start, its count and the previous window's count.
    SlidingCounter {
        /// Start of the window `current` belongs to.
        window_start: u64,
        /// Units charged in that window.
        current: u64,
        /// Units charged in the window before it.
        previous: u64,
    },
    /// Tokens left and the start of the current refill period.
    TokenBucket {
        /// Tokens in the bucket.
        tokens: u64,
        /// Start of the refill period not yet credited.
        updated_at: u64,
    },
}

/// A policy's algorithm with every duration in whole milliseconds, so the
/// hot path never converts a `Duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Params {
    FixedWindow { limit: u64, window: u64 },
    SlidingCounter { limit: u64, window: u64 },
    TokenBucket { capacity: u64, refill_tokens: u64, period: u64 },
}

impl Params {
    /// Converts a validated policy algorithm (windows and periods >= 1 ms).
    pub(crate) fn of(algorithm: &Algorithm) -> Self {
        // Validation keeps periods between 1 ms and ten years; max(1) only
        // guards the division should that ever change.
        let ms = |d| millis(d).max(1);
        match *algorithm {
            Algorithm::FixedWindow { limit, window } => {
                Self::FixedWindow { limit, window: ms(window) }
            }
            Algorithm::SlidingCounter { limit, window } => {
                Self::SlidingCounter { limit, window: ms(window) }
            }
            Algorithm::TokenBucket { capacity, refill_tokens, refill_period } => {
                Self::TokenBucket {
                    capacity,
                    refill_tokens: refill_tokens.max(1),
                    period: ms(refill_period),
                }
            }
        }
    }

    /// The limit or capacity reported in every decision.
    pub(crate) fn limit(&self) -> u64 {
        match *self {
            Self::FixedWindow { limit, .. } | Self::SlidingCounter { limit, .. } => limit,
            Self::TokenBucket { capacity, .. } => capacity,
        }
    }
}

/// What one run of an algorithm decided, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) retry_after: u64,
    pub(crate) reset_after: u64,
    /// The state to store and `state_end` (the time from which absence
    /// means the same as this state), or `None` when nothing is written.
    pub(crate) write: Option<(AlgorithmState, u64)>,
}

/// The stored state belongs to another algorithm (same policy id and
/// revision, changed algorithm): `Incompatible(StateIncompatible)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StateMismatch;

/// Whether an allowing run charges its cost. A set that another policy
/// denies charges nothing: each of its policies then runs `Spare`, which
/// answers as the algorithm would but writes what a denial writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charge {
    /// Charge `cost` when the algorithm allows.
    Take,
    /// Charge nothing; report the budget as it stands.
    Spare,
}

/// Runs the policy's algorithm at effective time `t` for `cost` units.
pub(crate) fn run(
    params: &Params,
    state: Option<&AlgorithmState>,
    t: u64,
    cost: u64,
    charge: Charge,
) -> Result<Step, StateMismatch> {
    match *params {
        Params::FixedWindow { limit, window } => {
            fixed_window(limit, window, state, t, cost, charge)
        }
        Params::SlidingCounter { limit, window } => {
            sliding_counter(limit, window, state, t, cost, charge)
        }
        Params::TokenBucket { capacity, refill_tokens, period } => {
            token_bucket(capacity, refill_tokens, period, state, t, cost, charge)
        }
    }
}

fn fixed_window(
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
        Some(AlgorithmState::SlidingCounter { .. } | AlgorithmState::TokenBucket { .. }) => {
            return Err(StateMismatch);
        }
    };
    let end = ws.saturating_add(window);
    let to_end = end.saturating_sub(t);
    if n.saturating_add(cost) > limit {
        return Ok(Step {
            allowed: false,
            remaining: limit.saturating_sub(n),
            retry_after: to_end.max(1),
            reset_after: to_end,
            write: None,
        });
    }
    if charge == Charge::Spare {
        return Ok(Step {
            allowed: true,
            remaining: limit - n,
            retry_after: 0,
            reset_after: to_end,
            write: None,
        });
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

fn sliding_counter(
    limit: u64,
    window: u64,
    state: Option<&AlgorithmState>,
    t: u64,
    cost: u64,
    charge: Charge,
) -> Result<Step, StateMismatch> {
    let ws = t - t % window;
    let elapsed = t - ws;
    let (n, p) = match state {
        None => (0, 0),
        Some(&AlgorithmState::SlidingCounter { window_start, current, previous }) => {
            if window_start == ws {
                (current, previous)
            } else if ws.checked_sub(window) == Some(window_start) {
                (0, current)
            } else {
                (0, 0)
            }
        }
        Some(AlgorithmState::FixedWindow { .. } | AlgorithmState::TokenBucket { .. }) => {
            return Err(StateMismatch);
        }
    };
    // p <= limit and limit * window < 2^53, so u64 suffices; a stored count
    // above a lowered limit could overflow, and only then takes u128.
    let weighted = match p.checked_mul(window - elapsed) {
        Some(product) => product / window,
        None => {
            let wide = u128::from(p) * u128::from(window - elapsed) / u128::from(window);
            u64::try_from(wide).unwrap_or(u64::MAX)
        }
    };
    let estimate = weighted.saturating_add(n);
    let to_end = window - elapsed;
    if estimate.saturating_add(cost) > limit {
        return Ok(Step {
            allowed: false,
            remaining: limit.saturating_sub(estimate),
            retry_after: sliding_retry_after(limit, window, cost, n, p, elapsed),
            reset_after: to_end,
            write: None,
        });
    }
    if charge == Charge::Spare {
        return Ok(Step {
            allowed: true,
            remaining: limit - estimate,
            retry_after: 0,
            reset_after: to_end,
            write: None,
        });
    }
    let state = AlgorithmState::SlidingCounter { window_start: ws, current: n + cost, previous: p };
    Ok(Step {
        allowed: true,
        remaining: limit - (estimate + cost),
        retry_after: 0,
        reset_after: to_end,
        write: Some((state, ws.saturating_add(window.saturating_mul(2)))),
    })
}

/// The smallest wait after which a denied sliding-counter request passes
/// with no other traffic (docs/algorithms.md, "Sliding counter").
fn sliding_retry_after(limit: u64, window: u64, cost: u64, n: u64, p: u64, elapsed: u64) -> u64 {
    let (l, w, c, n, p, e) = (
        i128::from(limit),
        i128::from(window),
        i128::from(cost),
        i128::from(n),
        i128::from(p),
        i128::from(elapsed),
    );
    let a = l - c - n;
    if a >= 0 && p > 0 {
        let x = w - ((a + 1) * w - 1) / p;
        if x < w {
            return to_millis(x - e);
        }
    }
    let to_end = w - e;
    let next = if n == 0 { 0 } else { (w - ((l - c + 1) * w - 1) / n).max(0) };
    if next < w { to_millis(to_end + next) } else { to_millis(to_end + w) }
}

/// A denial's wait is at least 1 ms; the formulas guarantee it, this keeps
/// the port's promise even for state written under other parameters.
fn to_millis(value: i128) -> u64 {
    u64::try_from(value).unwrap_or(if value < 0 { 0 } else { u64::MAX }).max(1)
}

fn token_bucket(
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
        Some(AlgorithmState::FixedWindow { .. } | AlgorithmState::SlidingCounter { .. }) => {
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
    use super::*;

    // A multiple of every window below, as the worked numbers assume.
    const T0: u64 = 1_800_000_000_000;

    fn apply(params: &Params, state: &mut Option<AlgorithmState>, t: u64, cost: u64) -> Step {
        let step = run(params, state.as_ref(), t, cost, Charge::Take).unwrap();
        if let Some((written, _)) = step.write {
            *state = Some(written);
        }
        step
    }

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

    #[test]
    fn sliding_counter_worked_numbers() {
        let params = Params::SlidingCounter { limit: 10, window: 1000 };
        let mut state = None;
        for _ in 0..8 {
            assert!(apply(&params, &mut state, T0 + 100, 1).allowed);
        }
        for expected in [3, 2, 1, 0] {
            let step = apply(&params, &mut state, T0 + 1250, 1);
            assert!(step.allowed);
            assert_eq!((step.remaining, step.reset_after), (expected, 750));
            assert_eq!(step.write.unwrap().1, T0 + 3000);
        }
        let denied = apply(&params, &mut state, T0 + 1250, 1);
        assert!(!denied.allowed);
        assert_eq!((denied.remaining, denied.retry_after, denied.reset_after), (0, 1, 750));
        assert_eq!(denied.write, None);
        // The retry-after is exact: one millisecond later the same request passes.
        assert!(apply(&params, &mut state, T0 + 1251, 1).allowed);
    }

    #[test]
    fn sliding_counter_denial_waits_into_the_next_window_when_the_current_count_blocks() {
        // L = 4, W = 1000: 4 charged at T0 + 500 (p = 0, n = 4). A = 4 - 1 - 4 < 0,
        // so the wait reaches into the next window: p' = 4, n' = 0,
        // x' = max(0, 1000 - floor((4 * 1000 - 1) / 4)) = 1000 - 999 = 1,
        // retry_after = (T0 + 1000 - (T0 + 500)) + 1 = 501.
        let params = Params::SlidingCounter { limit: 4, window: 1000 };
        let mut state = None;
        for _ in 0..4 {
            assert!(apply(&params, &mut state, T0 + 500, 1).allowed);
        }
        let denied = apply(&params, &mut state, T0 + 500, 1);
        assert_eq!((denied.allowed, denied.retry_after), (false, 501));
        assert!(!apply(&params, &mut state, T0 + 1000, 1).allowed);
        assert!(apply(&params, &mut state, T0 + 1001, 1).allowed);
    }

    #[test]
    fn sliding_counter_forgets_everything_two_windows_on() {
        let params = Params::SlidingCounter { limit: 2, window: 1000 };
        let mut state = None;
        apply(&params, &mut state, T0, 1);
        apply(&params, &mut state, T0, 1);
        let later = apply(&params, &mut state, T0 + 2000, 2);
        assert_eq!((later.allowed, later.remaining), (true, 0));
        assert_eq!(
            state,
            Some(AlgorithmState::SlidingCounter {
                window_start: T0 + 2000,
                current: 2,
                previous: 0
            })
        );
    }

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

    #[test]
    fn state_of_another_algorithm_is_a_mismatch() {
        let bucket = AlgorithmState::TokenBucket { tokens: 1, updated_at: T0 };
        let fixed = Params::FixedWindow { limit: 3, window: 1000 };
        assert_eq!(run(&fixed, Some(&bucket), T0, 1, Charge::Take), Err(StateMismatch));
        let sliding = Params::SlidingCounter { limit: 3, window: 1000 };
        assert_eq!(run(&sliding, Some(&bucket), T0, 1, Charge::Take), Err(StateMismatch));
        let window = AlgorithmState::FixedWindow { window_start: T0, count: 1 };
        let tb = Params::TokenBucket { capacity: 1, refill_tokens: 1, period: 1 };
        assert_eq!(run(&tb, Some(&window), T0, 1, Charge::Take), Err(StateMismatch));
    }

    #[test]
    fn extreme_clock_values_do_not_panic() {
        let all = [
            Params::FixedWindow { limit: 1, window: 7 },
            Params::SlidingCounter { limit: 1, window: 7 },
            Params::TokenBucket { capacity: 1, refill_tokens: 1, period: 7 },
        ];
        for params in all {
            let mut state = None;
            for t in [0, u64::MAX, 0, u64::MAX - 1] {
                let step = apply(&params, &mut state, t, 1);
                assert!(step.allowed || step.retry_after >= 1);
            }
        }
    }

    #[test]
    fn a_spared_run_reports_the_budget_as_it_stands_and_writes_what_a_denial_writes() {
        let fixed = Params::FixedWindow { limit: 3, window: 1000 };
        let mut state = None;
        apply(&fixed, &mut state, T0 + 250, 1);
        let spared = run(&fixed, state.as_ref(), T0 + 300, 1, Charge::Spare).unwrap();
        assert!(spared.allowed);
        assert_eq!((spared.remaining, spared.reset_after, spared.write), (2, 700, None));

        let sliding = Params::SlidingCounter { limit: 10, window: 1000 };
        let mut state = None;
        apply(&sliding, &mut state, T0, 4);
        let spared = run(&sliding, state.as_ref(), T0 + 500, 1, Charge::Spare).unwrap();
        assert_eq!((spared.allowed, spared.remaining, spared.write), (true, 6, None));

        // Capacity 5, 1 token per 100 ms: 2 left at T0, 3 at T0 + 100 (refilled).
        let bucket = Params::TokenBucket { capacity: 5, refill_tokens: 1, period: 100 };
        let mut state = None;
        apply(&bucket, &mut state, T0, 3);
        let spared = run(&bucket, state.as_ref(), T0 + 100, 1, Charge::Spare).unwrap();
        assert_eq!((spared.allowed, spared.remaining), (true, 3));
        let written = AlgorithmState::TokenBucket { tokens: 3, updated_at: T0 + 100 };
        assert_eq!(spared.write, Some((written, T0 + 100 + 200)));
    }
}
