//! Fixed window (docs/algorithms.md "Fixed window"): a count per window.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Arguments, Checks, Lua, RateAlgorithm, Run, Step, ms};
use crate::bounds::{MAX_COUNT, MAX_PERIOD, millis};

/// At most `limit` units per aligned window of length `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FixedWindow {
    /// Units per window.
    pub limit: u64,
    /// Window length, whole milliseconds.
    #[serde(with = "super::duration")]
    pub window: Duration,
}

/// A fixed window's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Start of the window the count belongs to.
    pub window_start: u64,
    /// Units charged in that window.
    pub count: u64,
}

impl RateAlgorithm for FixedWindow {
    const NAME: &'static str = "fixed-window";
    const TAG: u8 = b'F';
    const KEYS: &'static [&'static str] = &["limit", "window"];
    const LUA: Lua = Lua {
        file: "fixed-window.lua",
        source: include_str!("fixed-window.lua"),
        function: "fixed_window",
        arity: 2,
        header: 25,
    };
    const WINDOWED: bool = true;
    // A refusal writes nothing, and the count it saw holds until the
    // window ends, whatever the cost.
    const REFUSAL_STAYS: bool = true;
    type State = FixedWindowState;

    fn limit(&self) -> u64 {
        self.limit
    }

    fn quota_window(&self, _now: impl FnOnce() -> u64) -> Option<Duration> {
        Some(self.window)
    }

    fn check(&self, checks: &mut Checks) -> bool {
        let limit_ok = checks.count("limit", self.limit, MAX_COUNT);
        checks.period("window", self.window, MAX_PERIOD);
        limit_ok
    }

    fn step(&self, state: Option<&FixedWindowState>, run: &Run<'_>) -> Step<FixedWindowState> {
        let window = ms(self.window);
        let ws = run.t - run.t % window;
        let n = match state {
            Some(&FixedWindowState { window_start, count }) if window_start == ws => count,
            _ => 0,
        };
        let end = ws.saturating_add(window);
        Step::count(self.limit, n, (ws, end), run, |count| FixedWindowState {
            window_start: ws,
            count,
        })
    }

    fn debt(&self, state: &FixedWindowState, t: u64) -> u64 {
        let current = state.window_start == t - t % ms(self.window);
        if current { state.count.saturating_sub(self.limit) } else { 0 }
    }

    fn scaled(&self, share: &dyn Fn(u64) -> u64) -> Self {
        Self { limit: share(self.limit), ..*self }
    }

    fn arguments(&self, _t: u64) -> Arguments {
        Arguments::of(&[self.limit, millis(self.window)])
    }

    fn decode([window_start, count, _]: [u64; 3]) -> Option<FixedWindowState> {
        Some(FixedWindowState { window_start, count })
    }
}

#[cfg(test)]
mod tests {
    use super::super::AlgorithmState;
    use super::super::tests::{T0, apply, d};
    use super::*;

    #[test]
    fn fixed_window_worked_numbers() {
        let params = FixedWindow { limit: 3, window: d(1000) };
        let mut state = None;
        for expected in [2, 1, 0] {
            let step = apply(params, &mut state, T0 + 250, 1);
            assert!(step.allowed);
            assert_eq!((step.remaining, step.reset_after, step.retry_after), (expected, 750, 0));
            assert_eq!(step.write.unwrap().1, T0 + 1000);
        }
        let denied = apply(params, &mut state, T0 + 250, 1);
        assert!(!denied.allowed);
        assert_eq!((denied.remaining, denied.retry_after, denied.reset_after), (0, 750, 750));
        assert_eq!(denied.write, None);
        // The next window starts from zero, with the same two fields.
        let next = apply(params, &mut state, T0 + 1000, 1);
        assert_eq!((next.allowed, next.remaining), (true, 2));
        assert_eq!(
            state,
            Some(AlgorithmState::FixedWindow(FixedWindowState {
                window_start: T0 + 1000,
                count: 1
            }))
        );
    }
}
