//! Sliding counter (docs/algorithms.md "Sliding counter").

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Arguments, Charge, Checks, Lua, RateAlgorithm, Run, Step, ms};
use crate::outcome::Certainty;
use crate::bounds::{MAX_COUNT, MAX_PERIOD, millis};

/// At most `limit` units per sliding `window`, estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SlidingCounter {
    /// Units per window.
    pub limit: u64,
    /// Window length, whole milliseconds.
    #[serde(with = "super::duration")]
    pub window: Duration,
}

/// A sliding counter's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingCounterState {
    /// Start of the window `current` belongs to.
    pub window_start: u64,
    /// Units charged in that window.
    pub current: u64,
    /// Units charged in the window before it.
    pub previous: u64,
}

impl RateAlgorithm for SlidingCounter {
    const NAME: &'static str = "sliding-counter";
    const TAG: u8 = b'S';
    const KEYS: &'static [&'static str] = &["limit", "window"];
    const LUA: Lua = Lua {
        file: "sliding-counter.lua",
        source: include_str!("sliding-counter.lua"),
        function: "sliding_counter",
        arity: 2,
        header: 33,
    };
    const WINDOWED: bool = true;
    // No REFUSAL_STAYS: the estimate decays every millisecond.
    type State = SlidingCounterState;

    fn limit(&self) -> u64 {
        self.limit
    }

    /// Only the weighted window is an estimate (docs/algorithms.md#sliding-counter).
    fn certainty(&self) -> Certainty {
        Certainty::ApproximateAlgorithm
    }

    fn quota_window(&self, _now: impl FnOnce() -> u64) -> Option<Duration> {
        Some(self.window)
    }

    fn check(&self, checks: &mut Checks) -> bool {
        let limit_ok = checks.count("limit", self.limit, MAX_COUNT);
        if checks.period("window", self.window, MAX_PERIOD) && limit_ok {
            checks.exact_product(("limit", self.limit), ("window", self.window));
        }
        limit_ok
    }

    fn step(
        &self,
        state: Option<&SlidingCounterState>,
        run: &Run<'_>,
    ) -> Step<SlidingCounterState> {
        let (limit, window, t, cost, charge) =
            (self.limit, ms(self.window), run.t, run.cost, run.charge);
        let Counts { ws, elapsed, n, p, weighted } = self.counts(state, t);
        let estimate = weighted.saturating_add(n);
        let to_end = window - elapsed;
        let current = match charge {
            Charge::Force => n.saturating_add(cost),
            // Only a reservation of this window is in `n`; one of the
            // previous window stays charged there.
            Charge::Refund { reserved_at } if reserved_at >= ws => n.saturating_sub(cost),
            Charge::Refund { .. } => n,
            Charge::Take | Charge::Spare if estimate.saturating_add(cost) > limit => {
                let retry_after = sliding_retry_after(limit, window, cost, n, p, elapsed);
                return Step::denied(limit.saturating_sub(estimate), retry_after, to_end);
            }
            Charge::Spare => return Step::spared(limit - estimate, to_end),
            Charge::Take => n + cost,
        };
        let state = SlidingCounterState { window_start: ws, current, previous: p };
        let end = ws.saturating_add(window.saturating_mul(2));
        Step::charged(limit.saturating_sub(weighted.saturating_add(current)), to_end, state, end)
    }

    /// The estimate past the limit at `t`.
    fn debt(&self, state: &SlidingCounterState, t: u64) -> u64 {
        let Counts { n, weighted, .. } = self.counts(Some(state), t);
        weighted.saturating_add(n).saturating_sub(self.limit)
    }

    fn scaled(&self, share: &dyn Fn(u64) -> u64) -> Self {
        Self { limit: share(self.limit), ..*self }
    }

    fn arguments(&self, _t: u64) -> Arguments {
        Arguments::of(&[self.limit, millis(self.window)])
    }

    fn decode([window_start, current, previous]: [u64; 3]) -> Option<SlidingCounterState> {
        Some(SlidingCounterState { window_start, current, previous })
    }
}

/// The smallest wait after which a denied request passes with no other traffic.
/// A key's counts at `t`: its window start and elapsed time, the current
/// and previous counts, and the previous one weighted.
struct Counts {
    ws: u64,
    elapsed: u64,
    n: u64,
    p: u64,
    weighted: u64,
}

impl SlidingCounter {
    fn counts(&self, state: Option<&SlidingCounterState>, t: u64) -> Counts {
        let window = ms(self.window);
        let ws = t - t % window;
        let elapsed = t - ws;
        let (n, p) = match state {
            Some(held) if held.window_start == ws => (held.current, held.previous),
            Some(held) if ws.checked_sub(window) == Some(held.window_start) => (0, held.current),
            _ => (0, 0),
        };
        // p <= limit and limit * window < 2^53, so u64 suffices; a count above
        // the limit (a lowered limit, a settle's debt) could overflow, and
        // only then takes u128.
        let weighted = match p.checked_mul(window - elapsed) {
            Some(product) => product / window,
            None => {
                let wide = u128::from(p) * u128::from(window - elapsed) / u128::from(window);
                u64::try_from(wide).unwrap_or(u64::MAX)
            }
        };
        Counts { ws, elapsed, n, p, weighted }
    }
}

fn sliding_retry_after(limit: u64, window: u64, cost: u64, n: u64, p: u64, elapsed: u64) -> u64 {
    let [l, w, c, n, p, e] = [limit, window, cost, n, p, elapsed].map(i128::from);
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

#[cfg(test)]
mod tests {
    use super::super::AlgorithmState;
    use super::super::tests::{T0, apply, d};
    use super::*;

    #[test]
    fn sliding_counter_worked_numbers() {
        let params = SlidingCounter { limit: 10, window: d(1000) };
        let mut state = None;
        for _ in 0..8 {
            assert!(apply(params, &mut state, T0 + 100, 1).allowed);
        }
        for expected in [3, 2, 1, 0] {
            let step = apply(params, &mut state, T0 + 1250, 1);
            assert!(step.allowed);
            assert_eq!((step.remaining, step.reset_after), (expected, 750));
            assert_eq!(step.write.unwrap().1, T0 + 3000);
        }
        let denied = apply(params, &mut state, T0 + 1250, 1);
        assert!(!denied.allowed);
        assert_eq!((denied.remaining, denied.retry_after, denied.reset_after), (0, 1, 750));
        assert_eq!(denied.write, None);
        // The retry-after is exact: one millisecond later the same request passes.
        assert!(apply(params, &mut state, T0 + 1251, 1).allowed);
    }

    #[test]
    fn sliding_counter_denial_waits_into_the_next_window_when_the_current_count_blocks() {
        // L = 4, W = 1000: 4 charged at T0 + 500 (p = 0, n = 4). A = 4 - 1 - 4 < 0,
        // so the wait reaches into the next window: p' = 4, n' = 0,
        // x' = max(0, 1000 - floor((4 * 1000 - 1) / 4)) = 1000 - 999 = 1,
        // retry_after = (T0 + 1000 - (T0 + 500)) + 1 = 501.
        let params = SlidingCounter { limit: 4, window: d(1000) };
        let mut state = None;
        for _ in 0..4 {
            assert!(apply(params, &mut state, T0 + 500, 1).allowed);
        }
        let denied = apply(params, &mut state, T0 + 500, 1);
        assert_eq!((denied.allowed, denied.retry_after), (false, 501));
        assert!(!apply(params, &mut state, T0 + 1000, 1).allowed);
        assert!(apply(params, &mut state, T0 + 1001, 1).allowed);
    }

    #[test]
    fn sliding_counter_forgets_everything_two_windows_on() {
        let params = SlidingCounter { limit: 2, window: d(1000) };
        let mut state = None;
        apply(params, &mut state, T0, 1);
        apply(params, &mut state, T0, 1);
        let later = apply(params, &mut state, T0 + 2000, 2);
        assert_eq!((later.allowed, later.remaining), (true, 0));
        assert_eq!(
            state,
            Some(AlgorithmState::SlidingCounter(SlidingCounterState {
                window_start: T0 + 2000,
                current: 2,
                previous: 0
            }))
        );
    }
}
