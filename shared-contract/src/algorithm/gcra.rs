//! GCRA (docs/algorithms.md "GCRA") by virtual scheduling, in microseconds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Arguments, Charge, Checks, Lua, RateAlgorithm, Run, Step};
use crate::bounds::{MAX_COUNT, MAX_EXACT_PRODUCT, MAX_PERIOD, millis};

/// GCRA: `limit` per `period` at the steady rate, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", from = "Configured")]
pub struct Gcra {
    /// Requests per period at the steady rate.
    pub limit: u64,
    /// The period, whole milliseconds.
    #[serde(with = "super::duration")]
    pub period: Duration,
    /// How many may arrive at once (the configuration's default: `limit`).
    pub burst: u64,
}

/// GCRA's keys as configured: `burst` defaults to `limit`.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct Configured {
    limit: u64,
    #[serde(with = "super::duration")]
    period: Duration,
    burst: Option<u64>,
}

impl From<Configured> for Gcra {
    fn from(Configured { limit, period, burst }: Configured) -> Self {
        Self { limit, period, burst: burst.unwrap_or(limit) }
    }
}

/// A GCRA key's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraState {
    /// When the key's backlog of cells is spent, epoch **microseconds**.
    pub tat: u64,
}

impl Gcra {
    /// The emission interval `T = ceil(1000 x period / limit)` µs.
    pub(crate) fn emission_interval_micros(&self) -> u64 {
        millis(self.period).saturating_mul(1000).div_ceil(self.limit.max(1)).max(1)
    }
}

impl RateAlgorithm for Gcra {
    const NAME: &'static str = "gcra";
    const TAG: u8 = b'G';
    const KEYS: &'static [&'static str] = &["limit", "period", "burst"];
    /// A burst left out is the limit.
    const DEFAULTED: &'static [&'static str] = &["burst"];
    const LUA: Lua = Lua {
        file: "gcra.lua",
        source: include_str!("gcra.lua"),
        function: "gcra",
        arity: 2,
        header: 17,
    };
    // No REFUSAL_STAYS: a refusal's wait grows with the cost.
    type State = GcraState;

    /// The burst: the most spent at once.
    #[allow(clippy::misnamed_getters, reason = "a GCRA's limit in this sense is its burst")]
    fn limit(&self) -> u64 {
        self.burst
    }

    /// `burst x T`: the time an empty key takes to grant its burst again.
    fn quota_window(&self, _now: impl FnOnce() -> u64) -> Option<Duration> {
        Some(Duration::from_micros(self.burst.saturating_mul(self.emission_interval_micros())))
    }

    fn check(&self, checks: &mut Checks) -> bool {
        let rate_ok = checks.count("limit", self.limit, MAX_COUNT);
        let limit_ok = checks.count("burst", self.burst, MAX_COUNT);
        let period_ok = checks.period("period", self.period, MAX_PERIOD);
        let interval = self.emission_interval_micros();
        if rate_ok && period_ok {
            // T may round up by less than 1 µs per cell: refused when that
            // slows the steady rate by more than 1 %, `T x L > 1.01 x 1000 P`.
            let (limit, granted) = (self.limit, u128::from(interval) * u128::from(self.limit));
            let asked = u128::from(millis(self.period)) * 1000;
            if granted * 100 > asked * 101 {
                checks.reject(
                    "limit",
                    format!(
                        "period / limit rounds up to T = {interval} us, so {limit} cells take \
                         {granted} us instead of {asked} us (more than 1 % slower); choose a \
                         limit that divides 1000 x period in ms, or at most 10 per ms of period"
                    ),
                );
            }
            // The caller clock counts whole milliseconds: a `burst x T` under
            // 1 ms would admit at most `burst` a millisecond, below the rate.
            let (burst, least) = (self.burst, 1000_u64.div_ceil(interval.max(1)));
            if limit_ok && burst < least {
                checks.reject(
                    "burst",
                    format!(
                        "must cover at least 1 ms of cells, as the clock counts whole \
                         milliseconds: burst >= ceil(1000 us / T) = {least} with T = {interval} \
                         us, got {burst}"
                    ),
                );
            }
        }
        if limit_ok && period_ok {
            // GCRA counts in microseconds: u + b x T must stay below 2^53
            // (docs/algorithms.md#gcra), so b x T below 2^52.
            let tolerance = u128::from(self.burst) * u128::from(interval);
            if tolerance >= u128::from(MAX_EXACT_PRODUCT / 2) {
                let why = "must stay below 2^52 microseconds for exact arithmetic";
                checks.reject("burst", format!("burst x (period / limit) {why}, got {tolerance}"));
            }
        }
        limit_ok
    }

    /// `burst` cells at once, one more every emission interval.
    fn step(&self, state: Option<&GcraState>, run: &Run<'_>) -> Step<GcraState> {
        let (burst, interval, t, cost, charge) =
            (self.burst, self.emission_interval_micros(), run.t, run.cost, run.charge);
        let u = t.saturating_mul(1000);
        let tat = state.map_or(u, |state| state.tat);
        let a = tat.max(u);
        let backlog = a - u;
        // b x T: every conforming backlog stays within it (d + c T <= b T).
        let whole = burst.saturating_mul(interval);
        let cells = cost.saturating_mul(interval);
        let needed = backlog.saturating_add(cells);
        let backlog = match charge {
            Charge::Force => needed,
            // What the schedule has not yet paid of the reservation comes off.
            Charge::Refund { .. } => backlog.saturating_sub(cells),
            Charge::Take | Charge::Spare if needed > whole => {
                let (remaining, reset_after) = budget(burst, interval, whole, backlog);
                return Step::denied(remaining, micros_to_millis(needed - whole).max(1), reset_after);
            }
            Charge::Spare => {
                let (remaining, reset_after) = budget(burst, interval, whole, backlog);
                return Step::spared(remaining, reset_after);
            }
            Charge::Take => needed,
        };
        let tat = u.saturating_add(backlog);
        let (remaining, reset_after) = budget(burst, interval, whole, backlog);
        Step::charged(remaining, reset_after, GcraState { tat }, micros_to_millis(tat))
    }

    /// The cells of backlog beyond the burst at `t`, rounded up.
    fn debt(&self, state: &GcraState, t: u64) -> u64 {
        let interval = self.emission_interval_micros().max(1);
        let backlog = state.tat.saturating_sub(t.saturating_mul(1000));
        backlog.saturating_sub(self.burst.saturating_mul(interval)).div_ceil(interval)
    }

    /// The rate and the burst both shared.
    fn scaled(&self, share: &dyn Fn(u64) -> u64) -> Self {
        Self { limit: share(self.limit), burst: share(self.burst), ..*self }
    }

    fn arguments(&self, _t: u64) -> Arguments {
        Arguments::of(&[self.burst, self.emission_interval_micros()])
    }

    fn decode([tat, _, _]: [u64; 3]) -> Option<GcraState> {
        Some(GcraState { tat })
    }
}

/// `remaining` and `reset_after` (ms) at backlog `d`.
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
    use super::super::AlgorithmState;
    use super::super::tests::{T0, apply, d, take};
    use super::*;

    // L = 10, P = 1000 ms, b = 5: T = 100000 us.
    const PARAMS: Gcra = Gcra { limit: 10, period: d(1000), burst: 5 };

    #[test]
    fn gcra_worked_numbers() {
        let mut state = None;
        for expected in [4, 3, 2, 1, 0] {
            let step = apply(PARAMS, &mut state, T0, 1);
            assert_eq!((step.allowed, step.remaining, step.reset_after), (true, expected, 100));
        }
        assert_eq!(state, Some(AlgorithmState::Gcra(GcraState { tat: (T0 + 500) * 1000 })));
        let denied = run(&PARAMS, state.as_ref(), T0, 1);
        assert_eq!(
            (denied.allowed, denied.remaining, denied.retry_after, denied.reset_after),
            (false, 0, 100, 100)
        );
        assert_eq!(denied.write, None, "a denial writes nothing");

        let step = apply(PARAMS, &mut state, T0 + 250, 1);
        assert_eq!((step.allowed, step.remaining, step.reset_after), (true, 1, 50));
        let denied = run(&PARAMS, state.as_ref(), T0 + 250, 2);
        assert_eq!((denied.allowed, denied.remaining, denied.retry_after), (false, 1, 50));
    }

    #[test]
    fn gcra_state_ends_when_its_arrival_time_is_reached() {
        let mut state = None;
        let mut last = None;
        for _ in 0..5 {
            last = apply(PARAMS, &mut state, T0, 1).write;
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
        let params = Gcra { limit: 3, period: d(1000), burst: 1 };
        let mut state = None;
        assert!(apply(params, &mut state, T0, 1).allowed);
        let denied = run(&params, state.as_ref(), T0 + 333, 1);
        // 333.334 ms after T0 the cell conforms: 334 us left, 1 ms on the wire.
        assert_eq!((denied.allowed, denied.retry_after), (false, 1));
        assert!(run(&params, state.as_ref(), T0 + 334, 1).allowed);
    }

    fn run(
        params: &Gcra,
        state: Option<&AlgorithmState>,
        t: u64,
        cost: u64,
    ) -> Step<AlgorithmState> {
        super::super::Algorithm::from(*params).run(state, &take(t, cost)).unwrap()
    }
}
