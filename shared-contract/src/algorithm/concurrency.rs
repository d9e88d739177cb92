//! Concurrency (docs/algorithms.md "Concurrency (in-flight leases)").

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Arguments, Charge, Checks, Lua, RateAlgorithm, Run, Step, ms};
use crate::error::PolicyField;
use crate::bounds::{MAX_GRACE, MAX_IN_FLIGHT, MAX_LEASE_TTL};

/// In-flight leases: at most `max_in_flight` requests of a key hold a lease
/// at once, each released when its response is done or expired `lease_ttl`
/// after it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Concurrency {
    /// Leases a key may hold at once.
    pub max_in_flight: u64,
    /// The longest a lease is held if never released, whole milliseconds.
    #[serde(with = "super::duration")]
    pub lease_ttl: Duration,
    /// What a refusal tells clients to wait, whole milliseconds.
    #[serde(with = "super::duration")]
    pub retry_after: Duration,
}

/// A concurrency key's state: its tag alone (see [`crate::KeyState::leases`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased;

impl RateAlgorithm for Concurrency {
    const NAME: &'static str = "concurrency";
    const TAG: u8 = b'C';
    const KEYS: &'static [&'static str] = &["max-in-flight", "lease-ttl", "retry-after"];
    const LUA: Lua = Lua {
        file: "concurrency.lua",
        source: include_str!("concurrency.lua"),
        function: "concurrency",
        arity: 3,
        header: 0,
    };
    const HOLDS_LEASES: bool = true;
    /// A lease is one slot whatever the cost, and the lease id is its dedupe.
    const REFUSED_COMMON_KEYS: &'static [PolicyField] =
        &[PolicyField::MaximumCost, PolicyField::EvaluationDedup];
    // No REFUSAL_STAYS: a release may free a slot at any moment, on any instance.
    type State = Leased;

    fn limit(&self) -> u64 {
        self.max_in_flight
    }

    /// None: its limit holds at every instant, over no window.
    fn quota_window(&self, _now: impl FnOnce() -> u64) -> Option<Duration> {
        None
    }

    fn check(&self, checks: &mut Checks) -> bool {
        let limit_ok = checks.count("max-in-flight", self.max_in_flight, MAX_IN_FLIGHT);
        checks.period("lease-ttl", self.lease_ttl, MAX_LEASE_TTL);
        checks.period("retry-after", self.retry_after, MAX_GRACE);
        limit_ok
    }

    /// Allowed iff the live leases leave a slot.
    fn step(&self, _state: Option<&Leased>, run: &Run<'_>) -> Step<Leased> {
        let held = run.leases.live(run.t);
        if held >= self.max_in_flight {
            // A reload may have lowered the limit below what is held.
            return Step::denied(0, ms(self.retry_after), 0);
        }
        let free = self.max_in_flight - held;
        if run.charge == Charge::Spare {
            return Step::spared(free, 0);
        }
        let expires_at = run.t.saturating_add(self.lease_life(run.regression).unwrap_or(0));
        let latest = run.leases.latest_live_expiry(run.t);
        Step::charged(free - 1, 0, Leased, latest.map_or(expires_at, |at| at.max(expires_at)))
    }

    /// Each instance holds its share of the slots; the times stay.
    fn scaled(&self, share: &dyn Fn(u64) -> u64) -> Self {
        Self { max_in_flight: share(self.max_in_flight), ..*self }
    }

    /// The lease TTL plus the maximum clock regression: another instance's
    /// clock may run that far ahead of the taker's, and must not see a lease
    /// expire that its taker still holds.
    fn lease_life(&self, regression: u64) -> Option<u64> {
        Some(ms(self.lease_ttl).saturating_add(regression))
    }

    fn arguments(&self, _t: u64) -> Arguments {
        Arguments::of(&[self.max_in_flight, ms(self.lease_ttl), ms(self.retry_after)])
    }

    /// A lease key is a sorted set, never a state header.
    fn decode(_: [u64; 3]) -> Option<Leased> {
        Some(Leased)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{T0, d};
    use super::super::{Algorithm, AlgorithmState, StateMismatch};
    use super::*;
    use crate::evaluation::EvaluationId;
    use crate::leases::HeldLease;
    use crate::leases::Leases;

    const LIMITS: Concurrency =
        Concurrency { max_in_flight: 2, lease_ttl: d(30_000), retry_after: d(1000) };

    fn step(
        limits: Concurrency,
        state: Option<&AlgorithmState>,
        leases: &Leases,
        t: u64,
        charge: Charge,
    ) -> Result<Step<AlgorithmState>, StateMismatch> {
        Algorithm::from(limits).run(state, &Run { t, cost: 1, charge, leases, regression: 0 })
    }

    fn lease(n: u128, expires_at: u64) -> HeldLease {
        HeldLease { id: EvaluationId::from_uuid(uuid::Uuid::from_u128(n)), expires_at }
    }

    #[test]
    fn two_in_flight_admit_two_and_refuse_the_third_with_retry_after() {
        // max-in-flight 2, lease-ttl 30 s, retry-after 1 s (the design's example).
        let first = step(LIMITS, None, &Leases::NONE, T0, Charge::Take).unwrap();
        assert_eq!(
            (first.allowed, first.remaining, first.retry_after, first.reset_after),
            (true, 1, 0, 0)
        );
        assert_eq!(first.write, Some((AlgorithmState::Concurrency(Leased), T0 + 30_000)));
        let one: Leases = [lease(1, T0 + 30_000)].into_iter().collect();
        let second =
            step(LIMITS, Some(&AlgorithmState::Concurrency(Leased)), &one, T0 + 10, Charge::Take)
                .unwrap();
        assert_eq!((second.allowed, second.remaining), (true, 0));
        assert_eq!(second.write, Some((AlgorithmState::Concurrency(Leased), T0 + 30_010)));
        let two: Leases = [lease(1, T0 + 30_000), lease(2, T0 + 30_010)].into_iter().collect();
        let third =
            step(LIMITS, Some(&AlgorithmState::Concurrency(Leased)), &two, T0 + 20, Charge::Take)
                .unwrap();
        assert_eq!(
            (third.allowed, third.remaining, third.retry_after, third.reset_after, third.write),
            (false, 0, 1000, 0, None)
        );
    }

    #[test]
    fn a_lease_is_gone_at_its_expiry_and_a_spared_run_writes_nothing() {
        let two: Leases = [lease(1, T0 + 30_000), lease(2, T0 + 30_010)].into_iter().collect();
        let held = Some(&AlgorithmState::Concurrency(Leased));
        // At T0 + 30 000 the first lease has expired (expires_at <= t).
        let spared = step(LIMITS, held, &two, T0 + 30_000, Charge::Spare).unwrap();
        assert_eq!((spared.allowed, spared.remaining, spared.write), (true, 1, None));
        let taken = step(LIMITS, held, &two, T0 + 30_000, Charge::Take).unwrap();
        assert_eq!((taken.allowed, taken.remaining), (true, 0));
        assert_eq!(taken.write, Some((AlgorithmState::Concurrency(Leased), T0 + 60_000)));
        // A limit lowered by a reload below what is held: refused, 0 left.
        let one = Concurrency { max_in_flight: 1, ..LIMITS };
        let over = step(one, held, &two, T0, Charge::Spare).unwrap();
        assert_eq!((over.allowed, over.remaining, over.retry_after), (false, 0, 1000));
    }

    #[test]
    fn the_key_lives_until_its_latest_lease_expires() {
        // A longer TTL of an earlier revision-less reload keeps the key alive.
        let long: Leases = [lease(1, T0 + 90_000)].into_iter().collect();
        let taken =
            step(LIMITS, Some(&AlgorithmState::Concurrency(Leased)), &long, T0, Charge::Take)
                .unwrap();
        assert_eq!(taken.write, Some((AlgorithmState::Concurrency(Leased), T0 + 90_000)));
    }
}
