//! Replica-acknowledged charges (`redis.wait-replicas`): whether a script's
//! answer may stand, given what the `WAIT` after it counted.
//!
//! Replication is asynchronous: a master that dies before its replicas
//! copied a charge loses it, and the promoted replica admits that many
//! extra requests. With `wait-replicas = N` every script is followed, in
//! the same round trip, by `WAIT N <wait-timeout>`; an admission that
//! charged stands only when at least N replicas acknowledged. Fewer means
//! the charge may be lost on failover, so the answer is `Indeterminate`,
//! never a silent allow. A denial charges nothing, so its `WAIT` count is
//! ignored. A replayed charge (the dedupe record of an earlier attempt)
//! cannot be proven either: `WAIT` counts what this connection wrote, and
//! the replay wrote nothing, so it too is `Indeterminate`.

use crate::gateway::GatewayFailure;
use crate::reply::SetReply;

/// Why an admission cannot stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shortfall {
    /// `WAIT` answered fewer than the replicas asked for.
    Fewer {
        /// Replicas that acknowledged.
        acknowledged: u64,
        /// Replicas asked for.
        wanted: u32,
    },
    /// `WAIT` itself failed (refused, odd reply) after the script ran.
    NoCount(GatewayFailure),
    /// The admission replays an earlier charge, which `WAIT` cannot cover.
    Replayed,
}

/// `Some` when `reply` charged (or replayed a charge) and `replicas` (the
/// `WAIT` count, `None` when no `WAIT` was sent) does not prove `wanted`
/// replicas have it.
pub(crate) fn shortfall(
    reply: &SetReply,
    replicas: Option<Result<u64, GatewayFailure>>,
    wanted: u32,
) -> Option<Shortfall> {
    let replicas = replicas?;
    let SetReply::Decided { admitted: true, answers, len } = reply else {
        // A denial, a clock refusal or a corrupt key wrote no charge.
        return None;
    };
    let answers = &answers[..*len];
    if answers.iter().any(|answer| answer.replayed) {
        return Some(Shortfall::Replayed);
    }
    // Shadow policies that deny are not charged; a set of them alone
    // may charge nothing at all.
    if !answers.iter().any(|answer| answer.allowed) {
        return None;
    }
    match replicas {
        Ok(acknowledged) if acknowledged >= u64::from(wanted) => None,
        Ok(acknowledged) => Some(Shortfall::Fewer { acknowledged, wanted }),
        Err(failure) => Some(Shortfall::NoCount(failure)),
    }
}

#[cfg(test)]
mod tests {
    use shared_contract::MAX_POLICY_SET;

    use super::*;
    use crate::reply::KeyAnswer;

    fn decided(admitted: bool, keys: &[(bool, bool)]) -> SetReply {
        let mut answers = [KeyAnswer::default(); MAX_POLICY_SET];
        for (answer, &(allowed, replayed)) in answers.iter_mut().zip(keys) {
            *answer = KeyAnswer { allowed, replayed, ..KeyAnswer::default() };
        }
        SetReply::Decided { admitted, answers, len: keys.len() }
    }

    #[test]
    fn a_charge_stands_only_with_enough_acknowledgements() {
        let charged = decided(true, &[(true, false), (true, false)]);
        assert_eq!(shortfall(&charged, Some(Ok(2)), 2), None);
        assert_eq!(shortfall(&charged, Some(Ok(3)), 2), None);
        assert_eq!(
            shortfall(&charged, Some(Ok(1)), 2),
            Some(Shortfall::Fewer { acknowledged: 1, wanted: 2 })
        );
        assert_eq!(
            shortfall(&charged, Some(Err(GatewayFailure::Refused)), 1),
            Some(Shortfall::NoCount(GatewayFailure::Refused))
        );
        // No WAIT was sent: nothing to judge.
        assert_eq!(shortfall(&charged, None, 1), None);
    }

    #[test]
    fn what_charged_nothing_needs_no_acknowledgement_and_a_replay_cannot_get_one() {
        let zero = Some(Ok(0));
        assert_eq!(shortfall(&decided(false, &[(false, false), (true, false)]), zero, 1), None);
        assert_eq!(shortfall(&SetReply::ClockUnsafe { retry_after_ms: 5 }, zero, 1), None);
        assert_eq!(shortfall(&SetReply::Corrupt, zero, 1), None);
        // A set of shadow policies that all denied: admitted, nothing charged.
        assert_eq!(shortfall(&decided(true, &[(false, false)]), zero, 1), None);
        assert_eq!(
            shortfall(&decided(true, &[(true, true)]), Some(Ok(5)), 1),
            Some(Shortfall::Replayed)
        );
    }
}
