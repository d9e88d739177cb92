//! The settle step (docs/algorithms.md "Settling usage"): a provider loads
//! every key of the set, calls [`settle_set`], and stores every member
//! that has a [`KeyWrite`](super::KeyWrite) at once, as for a decision.

use std::time::Duration;

use super::{SetMember, commit, effective_times};
use crate::algorithm::{AlgorithmState, Charge, StateMismatch, Step};
use crate::bounds::MAX_POLICY_SET;
use crate::outcome::{IncompatibleCategory, RateLimitFailure, UnavailableCategory};
use crate::settle::{SettleOutcome, Settled, Settlement};

/// What the settle step answers: the part of a [`SettleOutcome`] keys decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleVerdict {
    /// Settled, repeated or not found.
    Settled(Settled),
    /// The caller's time lags a key's mark beyond its bound; nothing changes.
    ClockUnsafe {
        /// How far beyond the bound the caller's time lags (at most).
        retry_after: Duration,
    },
    /// A key holds another algorithm's state; nothing changes.
    StateMismatch,
}

impl From<SettleVerdict> for SettleOutcome {
    fn from(verdict: SettleVerdict) -> Self {
        match verdict {
            SettleVerdict::Settled(settled) => Ok(settled),
            SettleVerdict::ClockUnsafe { retry_after } => Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after,
            }),
            SettleVerdict::StateMismatch => Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::StateIncompatible,
            }),
        }
    }
}

/// Settles `settlement` over the loaded keys of its set at caller time
/// `now`. A live record of the settle's own id in any key repeats it
/// (nothing written). Otherwise each key holding a live record of the
/// reservation (every key for a reservation of 0) takes the difference:
/// the excess charged past the limit, or the rest given back to the budget
/// the reservation was charged in; each key written keeps the settle's
/// record. No key with the reservation's record: not found. Concurrency
/// keys take no settle.
pub fn settle_set(
    members: &mut [SetMember<'_>],
    now: u64,
    settlement: &Settlement<'_>,
) -> SettleVerdict {
    const N: usize = MAX_POLICY_SET;
    let len = members.len().min(N);
    let members = &mut members[..len];
    let times = match effective_times::<N>(members, now) {
        Ok(times) => times,
        Err(retry_after) => return SettleVerdict::ClockUnsafe { retry_after },
    };
    let (reservation, reserved, used) =
        (settlement.request.evaluation_id, settlement.request.cost, settlement.used);
    let settle_id = settlement.settle_id();
    let repeated = members.iter().zip(&times).any(|(member, &t)| {
        member.rules.live_record(member.state.as_ref(), settle_id, t).is_some()
    });
    if repeated {
        return SettleVerdict::Settled(Settled::Repeated);
    }

    // What each key takes: the charge and its units, or nothing.
    let mut charges = [None; N];
    for ((member, &t), charge) in members.iter().zip(&times).zip(&mut charges) {
        if member.rules.holds_leases() {
            continue;
        }
        let reserved_at = if reserved == 0 {
            t
        } else {
            match member.rules.live_record(member.state.as_ref(), reservation, t) {
                Some(record) => record.written_at,
                None => continue,
            }
        };
        *charge = Some(match used.checked_sub(reserved) {
            Some(excess) => (Charge::Force, excess),
            None => (Charge::Refund { reserved_at }, reserved - used),
        });
    }
    if charges.iter().all(Option::is_none) {
        let none = if reserved == 0 { Settled::Applied } else { Settled::UnknownReservation };
        return SettleVerdict::Settled(none);
    }

    // Every run first, so a mismatch anywhere writes nothing anywhere.
    let mut steps: [Option<Step<AlgorithmState>>; N] = [None; N];
    for (((member, &t), charge), step) in members.iter().zip(&times).zip(&charges).zip(&mut steps) {
        if let Some((charge, units)) = *charge {
            match member.rules.run(member.state.as_ref(), t, units, charge) {
                Ok(run) => *step = Some(run),
                Err(StateMismatch) => return SettleVerdict::StateMismatch,
            }
        }
    }
    for ((member, &t), step) in members.iter_mut().zip(&times).zip(&steps) {
        if let Some(step) = step {
            commit(member, now, t, step, true, settle_id);
        }
    }
    SettleVerdict::Settled(Settled::Applied)
}
