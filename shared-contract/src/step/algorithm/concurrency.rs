//! Concurrency (docs/algorithms.md "Concurrency (in-flight leases)"): at
//! most `max_in_flight` live leases per key. The state is only its tag;
//! the leases are the key's [`Leases`], which the set step adds to when
//! the request is admitted and a release removes from.

use super::{AlgorithmState, Charge, Leases, StateMismatch, Step};

/// A concurrency policy's parameters in milliseconds. `lease_life` is the
/// lease TTL plus the maximum clock regression `R`: another instance's
/// clock may run up to `R` ahead of the taker's, and must not see a lease
/// expire that its taker still holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) max_in_flight: u64,
    pub(super) lease_life: u64,
    pub(super) retry_after: u64,
}

/// One run at effective time `t` ([`super::run`]): allowed iff the live
/// leases leave a slot. An allowing `Take` writes the tag and the key's end
/// (the latest live lease's expiry, the new one included); the set step
/// adds the lease itself. No window: `reset_after` is 0, and a denial
/// tells the configured `retry_after`.
pub(super) fn step(
    limits: Limits,
    state: Option<&AlgorithmState>,
    leases: &Leases,
    t: u64,
    charge: Charge,
) -> Result<Step, StateMismatch> {
    match state {
        None | Some(AlgorithmState::Concurrency) => {}
        Some(
            AlgorithmState::FixedWindow { .. }
            | AlgorithmState::SlidingCounter { .. }
            | AlgorithmState::TokenBucket { .. }
            | AlgorithmState::Gcra { .. },
        ) => return Err(StateMismatch),
    }
    let Limits { max_in_flight, lease_life, retry_after } = limits;
    let held = leases.live(t);
    if held >= max_in_flight {
        // A reload may have lowered the limit below what is held.
        return Ok(Step::denied(0, retry_after.max(1), 0));
    }
    let free = max_in_flight - held;
    if charge == Charge::Spare {
        return Ok(Step::spared(free, 0));
    }
    let expires_at = t.saturating_add(lease_life);
    let end = leases.latest_live_expiry(t).map_or(expires_at, |latest| latest.max(expires_at));
    Ok(Step {
        allowed: true,
        remaining: free - 1,
        retry_after: 0,
        reset_after: 0,
        write: Some((AlgorithmState::Concurrency, end)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::T0;
    use super::*;
    use crate::request::EvaluationId;
    use crate::step::HeldLease;

    const LIMITS: Limits = Limits { max_in_flight: 2, lease_life: 30_000, retry_after: 1000 };

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
        assert_eq!(first.write, Some((AlgorithmState::Concurrency, T0 + 30_000)));
        let one: Leases = [lease(1, T0 + 30_000)].into_iter().collect();
        let second =
            step(LIMITS, Some(&AlgorithmState::Concurrency), &one, T0 + 10, Charge::Take).unwrap();
        assert_eq!((second.allowed, second.remaining), (true, 0));
        assert_eq!(second.write, Some((AlgorithmState::Concurrency, T0 + 30_010)));
        let two: Leases = [lease(1, T0 + 30_000), lease(2, T0 + 30_010)].into_iter().collect();
        let third =
            step(LIMITS, Some(&AlgorithmState::Concurrency), &two, T0 + 20, Charge::Take).unwrap();
        assert_eq!(
            (third.allowed, third.remaining, third.retry_after, third.reset_after, third.write),
            (false, 0, 1000, 0, None)
        );
    }

    #[test]
    fn a_lease_is_gone_at_its_expiry_and_a_spared_run_writes_nothing() {
        let two: Leases = [lease(1, T0 + 30_000), lease(2, T0 + 30_010)].into_iter().collect();
        let held = Some(&AlgorithmState::Concurrency);
        // At T0 + 30 000 the first lease has expired (expires_at <= t).
        let spared = step(LIMITS, held, &two, T0 + 30_000, Charge::Spare).unwrap();
        assert_eq!((spared.allowed, spared.remaining, spared.write), (true, 1, None));
        let taken = step(LIMITS, held, &two, T0 + 30_000, Charge::Take).unwrap();
        assert_eq!((taken.allowed, taken.remaining), (true, 0));
        assert_eq!(taken.write, Some((AlgorithmState::Concurrency, T0 + 60_000)));
        // A limit lowered by a reload below what is held: refused, 0 left.
        let one = Limits { max_in_flight: 1, ..LIMITS };
        let over = step(one, held, &two, T0, Charge::Spare).unwrap();
        assert_eq!((over.allowed, over.remaining, over.retry_after), (false, 0, 1000));
    }

    #[test]
    fn the_key_lives_until_its_latest_lease_expires() {
        // A longer TTL of an earlier revision-less reload keeps the key alive.
        let long: Leases = [lease(1, T0 + 90_000)].into_iter().collect();
        let taken =
            step(LIMITS, Some(&AlgorithmState::Concurrency), &long, T0, Charge::Take).unwrap();
        assert_eq!(taken.write, Some((AlgorithmState::Concurrency, T0 + 90_000)));
    }
}
