//! The counting algorithms as pure functions over one key's state, exactly
//! as `docs/algorithms.md` defines them: one module each, and here what
//! they share, the state a key holds and the dispatch by policy.
//!
//! All arithmetic saturates or widens: caller times come from an injected
//! clock and may be anything, and a provider's `evaluate` must never panic.

use super::leases::Leases;
use crate::policy::{Algorithm, millis};

// Not yet registered: the algorithm registry will name it.
#[allow(dead_code)]
mod calendar_window;
mod concurrency;
mod fixed_window;
mod gcra;
mod sliding_counter;
mod token_bucket;

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
    /// GCRA's theoretical arrival time.
    Gcra {
        /// When the key's backlog of cells is spent, epoch **microseconds**.
        tat: u64,
    },
    /// A concurrency key: its leases are heap data, held beside the state
    /// in [`super::KeyState::leases`]; this says whose they are.
    Concurrency,
}

/// A policy's algorithm with every duration in whole milliseconds, so the
/// hot path never converts a `Duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Params {
    FixedWindow {
        limit: u64,
        window: u64,
    },
    SlidingCounter {
        limit: u64,
        window: u64,
    },
    TokenBucket {
        capacity: u64,
        refill_tokens: u64,
        period: u64,
    },
    /// `interval` is the emission interval in whole microseconds.
    Gcra {
        burst: u64,
        interval: u64,
    },
    /// `lease_life` is the lease TTL plus the maximum clock regression:
    /// how long a lease counts from its taking, so a clock ahead of the
    /// taker's by up to the bound never drops a lease it still holds.
    Concurrency {
        max_in_flight: u64,
        lease_life: u64,
        retry_after: u64,
    },
}

impl Params {
    /// Converts a validated policy algorithm (windows and periods >= 1 ms);
    /// `regression` is the policy's maximum clock regression in ms.
    pub(crate) fn of(algorithm: &Algorithm, regression: u64) -> Self {
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
            Algorithm::Gcra { burst, .. } => {
                Self::Gcra { burst, interval: algorithm.emission_interval_micros().unwrap_or(1) }
            }
            Algorithm::Concurrency { max_in_flight, lease_ttl, retry_after } => Self::Concurrency {
                max_in_flight,
                lease_life: ms(lease_ttl).saturating_add(regression),
                retry_after: ms(retry_after),
            },
        }
    }

    /// The limit or capacity reported in every decision.
    pub(crate) fn limit(&self) -> u64 {
        match *self {
            Self::FixedWindow { limit, .. } | Self::SlidingCounter { limit, .. } => limit,
            Self::TokenBucket { capacity, .. } => capacity,
            Self::Gcra { burst, .. } => burst,
            Self::Concurrency { max_in_flight, .. } => max_in_flight,
        }
    }

    /// How long a concurrency policy's lease counts from its taking, in ms
    /// (lease TTL + maximum clock regression); `None` for a rate policy.
    pub(crate) fn lease_life(&self) -> Option<u64> {
        match *self {
            Self::Concurrency { lease_life, .. } => Some(lease_life),
            Self::FixedWindow { .. }
            | Self::SlidingCounter { .. }
            | Self::TokenBucket { .. }
            | Self::Gcra { .. } => None,
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

impl Step {
    /// A denial that writes nothing (the window algorithms' deny path).
    pub(crate) fn denied(remaining: u64, retry_after: u64, reset_after: u64) -> Self {
        Self { allowed: false, remaining, retry_after, reset_after, write: None }
    }

    /// An allowance that charges nothing (a set member spared because
    /// another member denied).
    pub(crate) fn spared(remaining: u64, reset_after: u64) -> Self {
        Self { allowed: true, remaining, retry_after: 0, reset_after, write: None }
    }
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

/// Runs the policy's algorithm at effective time `t` for `cost` units over
/// the key's state and, for a concurrency key, its leases (a lease is one
/// slot whatever the cost).
pub(crate) fn run(
    params: &Params,
    state: Option<&AlgorithmState>,
    leases: &Leases,
    t: u64,
    cost: u64,
    charge: Charge,
) -> Result<Step, StateMismatch> {
    match *params {
        Params::FixedWindow { limit, window } => {
            fixed_window::step(limit, window, state, t, cost, charge)
        }
        Params::SlidingCounter { limit, window } => {
            sliding_counter::step(limit, window, state, t, cost, charge)
        }
        Params::TokenBucket { capacity, refill_tokens, period } => {
            token_bucket::step(capacity, refill_tokens, period, state, t, cost, charge)
        }
        Params::Gcra { burst, interval } => gcra::step(burst, interval, state, t, cost, charge),
        Params::Concurrency { max_in_flight, lease_life, retry_after } => {
            let limits = concurrency::Limits { max_in_flight, lease_life, retry_after };
            concurrency::step(limits, state, leases, t, charge)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A multiple of every window below, as the worked numbers assume.
    pub(super) const T0: u64 = 1_800_000_000_000;

    pub(super) fn apply(
        params: &Params,
        state: &mut Option<AlgorithmState>,
        t: u64,
        cost: u64,
    ) -> Step {
        let step = run(params, state.as_ref(), &Leases::NONE, t, cost, Charge::Take).unwrap();
        if let Some((written, _)) = step.write {
            *state = Some(written);
        }
        step
    }

    #[test]
    fn state_of_another_algorithm_is_a_mismatch() {
        let bucket = AlgorithmState::TokenBucket { tokens: 1, updated_at: T0 };
        let fixed = Params::FixedWindow { limit: 3, window: 1000 };
        assert_eq!(
            run(&fixed, Some(&bucket), &Leases::NONE, T0, 1, Charge::Take),
            Err(StateMismatch)
        );
        let sliding = Params::SlidingCounter { limit: 3, window: 1000 };
        assert_eq!(
            run(&sliding, Some(&bucket), &Leases::NONE, T0, 1, Charge::Take),
            Err(StateMismatch)
        );
        let window = AlgorithmState::FixedWindow { window_start: T0, count: 1 };
        let tb = Params::TokenBucket { capacity: 1, refill_tokens: 1, period: 1 };
        assert_eq!(run(&tb, Some(&window), &Leases::NONE, T0, 1, Charge::Take), Err(StateMismatch));
        let gcra = Params::Gcra { burst: 1, interval: 1000 };
        assert_eq!(
            run(&gcra, Some(&bucket), &Leases::NONE, T0, 1, Charge::Take),
            Err(StateMismatch)
        );
        let cells = AlgorithmState::Gcra { tat: T0 * 1000 };
        for other in [fixed, sliding, tb] {
            assert_eq!(
                run(&other, Some(&cells), &Leases::NONE, T0, 1, Charge::Take),
                Err(StateMismatch)
            );
        }
        let leases = Params::Concurrency { max_in_flight: 2, lease_life: 1000, retry_after: 100 };
        for other in [bucket, window, cells] {
            assert_eq!(
                run(&leases, Some(&other), &Leases::NONE, T0, 1, Charge::Take),
                Err(StateMismatch)
            );
        }
        for other in [fixed, sliding, tb, gcra] {
            let held = AlgorithmState::Concurrency;
            assert_eq!(
                run(&other, Some(&held), &Leases::NONE, T0, 1, Charge::Take),
                Err(StateMismatch)
            );
        }
    }

    #[test]
    fn extreme_clock_values_do_not_panic() {
        let all = [
            Params::FixedWindow { limit: 1, window: 7 },
            Params::SlidingCounter { limit: 1, window: 7 },
            Params::TokenBucket { capacity: 1, refill_tokens: 1, period: 7 },
            Params::Gcra { burst: 1, interval: 7 },
            Params::Gcra { burst: 3, interval: u64::MAX / 2 },
            Params::Concurrency { max_in_flight: 1, lease_life: 7, retry_after: 1 },
            Params::Concurrency { max_in_flight: 3, lease_life: u64::MAX, retry_after: 1 },
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
        let spared =
            run(&fixed, state.as_ref(), &Leases::NONE, T0 + 300, 1, Charge::Spare).unwrap();
        assert!(spared.allowed);
        assert_eq!((spared.remaining, spared.reset_after, spared.write), (2, 700, None));

        let sliding = Params::SlidingCounter { limit: 10, window: 1000 };
        let mut state = None;
        apply(&sliding, &mut state, T0, 4);
        let spared =
            run(&sliding, state.as_ref(), &Leases::NONE, T0 + 500, 1, Charge::Spare).unwrap();
        assert_eq!((spared.allowed, spared.remaining, spared.write), (true, 6, None));

        // Capacity 5, 1 token per 100 ms: 2 left at T0, 3 at T0 + 100 (refilled).
        let bucket = Params::TokenBucket { capacity: 5, refill_tokens: 1, period: 100 };
        let mut state = None;
        apply(&bucket, &mut state, T0, 3);
        let spared =
            run(&bucket, state.as_ref(), &Leases::NONE, T0 + 100, 1, Charge::Spare).unwrap();
        assert_eq!((spared.allowed, spared.remaining), (true, 3));
        let written = AlgorithmState::TokenBucket { tokens: 3, updated_at: T0 + 100 };
        assert_eq!(spared.write, Some((written, T0 + 100 + 200)));

        // GCRA b = 5, T = 100 ms: 3 cells at T0 leave 2, spared at T0 + 100 3.
        let gcra = Params::Gcra { burst: 5, interval: 100_000 };
        let mut state = None;
        apply(&gcra, &mut state, T0, 3);
        let spared = run(&gcra, state.as_ref(), &Leases::NONE, T0 + 100, 1, Charge::Spare).unwrap();
        assert_eq!((spared.allowed, spared.remaining, spared.write), (true, 3, None));
    }
}
