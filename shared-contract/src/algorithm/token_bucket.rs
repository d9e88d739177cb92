//! Token bucket (docs/algorithms.md "Token bucket").

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Arguments, Charge, Checks, Lua, RateAlgorithm, Run, Step, ms};
use crate::bounds::{MAX_COUNT, MAX_PERIOD, millis};

/// `capacity` tokens refilled by `refill_tokens` every `refill_period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct TokenBucket {
    /// Tokens a full bucket holds.
    pub capacity: u64,
    /// Tokens added per whole period.
    pub refill_tokens: u64,
    /// Refill period, whole milliseconds.
    #[serde(with = "super::duration")]
    pub refill_period: Duration,
}

/// A token bucket's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Tokens in the bucket; below zero after a charge past it (a debt).
    pub tokens: i64,
    /// Start of the refill period not yet credited.
    pub updated_at: u64,
}

impl RateAlgorithm for TokenBucket {
    const NAME: &'static str = "token-bucket";
    const TAG: u8 = b'B';
    const KEYS: &'static [&'static str] = &["capacity", "refill-tokens", "refill-period"];
    const LUA: Lua = Lua {
        file: "token-bucket.lua",
        source: include_str!("token-bucket.lua"),
        function: "token_bucket",
        arity: 3,
        header: 25,
    };
    // No REFUSAL_STAYS: a refusal writes its refill and mark, and its wait grows with the cost.
    type State = TokenBucketState;

    fn limit(&self) -> u64 {
        self.capacity
    }

    /// The time an empty bucket takes to fill.
    fn quota_window(&self, _now: impl FnOnce() -> u64) -> Option<Duration> {
        let periods = self.capacity.div_ceil(self.refill_tokens.max(1));
        Some(self.refill_period.saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX)))
    }

    fn check(&self, checks: &mut Checks) -> bool {
        let limit_ok = checks.count("capacity", self.capacity, MAX_COUNT);
        let period_ok = checks.period("refill-period", self.refill_period, MAX_PERIOD);
        checks.count("refill-tokens", self.refill_tokens, MAX_COUNT);
        if limit_ok && period_ok {
            checks
                .exact_product(("capacity", self.capacity), ("refill-period", self.refill_period));
        }
        limit_ok
    }

    fn step(&self, state: Option<&TokenBucketState>, run: &Run<'_>) -> Step<TokenBucketState> {
        let (refill_tokens, period) = (self.refill_tokens.max(1), ms(self.refill_period));
        let (t, charge) = (run.t, run.charge);
        // Counts stay below 2^53 (`MAX_COUNT`), so they fit an i64 as they are.
        let signed = |count: u64| i64::try_from(count).unwrap_or(i64::MAX);
        let (capacity, cost) = (signed(self.capacity), signed(run.cost));
        let (tokens, updated_at) = state.map_or((capacity, t), |held| (held.tokens, held.updated_at));
        let periods = t.saturating_sub(updated_at) / period;
        let credit = signed(periods.saturating_mul(refill_tokens));
        let mut tokens = capacity.min(tokens.saturating_add(credit));
        // periods * period <= t - updated_at: the partial period is kept.
        let mut updated_at = updated_at + periods * period;
        if tokens == capacity {
            updated_at = t;
        }
        // Time from `t` until `needed` more tokens have been refilled.
        let wait_for = |needed: i64| {
            needed
                .unsigned_abs()
                .div_ceil(refill_tokens)
                .saturating_mul(period)
                .saturating_sub(t.saturating_sub(updated_at))
        };
        let allowed = match charge {
            Charge::Take | Charge::Spare => tokens >= cost,
            Charge::Force | Charge::Refund { .. } => true,
        };
        let retry_after = if allowed { 0 } else { wait_for(cost - tokens).max(1) };
        // A spared bucket writes the refill, as a denial does, and keeps its
        // tokens; a forced charge may leave it below zero (a debt).
        match charge {
            Charge::Take if allowed => tokens -= cost,
            Charge::Force => tokens = tokens.saturating_sub(cost),
            Charge::Refund { .. } => tokens = capacity.min(tokens.saturating_add(cost)),
            Charge::Take | Charge::Spare => {}
        }
        let reset_after = if tokens >= capacity { 0 } else { wait_for(capacity - tokens) };
        Step {
            allowed,
            remaining: tokens.max(0).unsigned_abs(),
            retry_after,
            reset_after,
            write: Some((TokenBucketState { tokens, updated_at }, t.saturating_add(reset_after))),
        }
    }

    /// The tokens below zero once the refill up to `t` is credited.
    fn debt(&self, state: &TokenBucketState, t: u64) -> u64 {
        let periods = t.saturating_sub(state.updated_at) / ms(self.refill_period);
        let credit = periods.saturating_mul(self.refill_tokens.max(1));
        let credit = i64::try_from(credit).unwrap_or(i64::MAX);
        state.tokens.saturating_add(credit).min(0).unsigned_abs()
    }

    fn scaled(&self, share: &dyn Fn(u64) -> u64) -> Self {
        Self { capacity: share(self.capacity), refill_tokens: share(self.refill_tokens), ..*self }
    }

    fn arguments(&self, _t: u64) -> Arguments {
        Arguments::of(&[self.capacity, self.refill_tokens, millis(self.refill_period)])
    }

    /// `tokens` as the two's complement bits of an i64 (a debt is negative).
    fn decode([tokens, updated_at, _]: [u64; 3]) -> Option<TokenBucketState> {
        let tokens = i64::from_ne_bytes(tokens.to_ne_bytes());
        Some(TokenBucketState { tokens, updated_at })
    }
}

#[cfg(test)]
mod tests {
    use super::super::AlgorithmState;
    use super::super::tests::{T0, apply, d};
    use super::*;

    #[test]
    fn token_bucket_worked_numbers() {
        let params = TokenBucket { capacity: 5, refill_tokens: 1, refill_period: d(100) };
        let mut state = None;
        for expected in [4, 3, 2, 1, 0] {
            let step = apply(params, &mut state, T0, 1);
            assert_eq!((step.allowed, step.remaining), (true, expected));
        }
        let denied = apply(params, &mut state, T0, 1);
        assert_eq!((denied.allowed, denied.remaining, denied.retry_after), (false, 0, 100));
        // A bucket denial still writes its state.
        assert!(denied.write.is_some());
        let step = apply(params, &mut state, T0 + 250, 1);
        assert_eq!((step.allowed, step.remaining, step.reset_after), (true, 1, 350));
        assert_eq!(
            state,
            Some(AlgorithmState::TokenBucket(TokenBucketState { tokens: 1, updated_at: T0 + 200 }))
        );
        assert_eq!(step.write.unwrap().1, T0 + 250 + 350);
    }

    #[test]
    fn a_full_bucket_restarts_its_refill_clock() {
        let params = TokenBucket { capacity: 2, refill_tokens: 1, refill_period: d(100) };
        let mut state = None;
        apply(params, &mut state, T0, 1);
        // 1 + 3 periods caps at 2: the clock restarts at T0 + 370.
        let step = apply(params, &mut state, T0 + 370, 1);
        assert_eq!((step.remaining, step.reset_after), (1, 100));
        assert_eq!(
            state,
            Some(AlgorithmState::TokenBucket(TokenBucketState { tokens: 1, updated_at: T0 + 370 }))
        );
    }
}
