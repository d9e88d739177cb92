//! The settle of a request's usage on Redis (docs/algorithms.md "Settling
//! usage"): `lua/settle.lua`, one `EVALSHA` over the keys the reservation's
//! evaluation sent (one hash tag, so a Cluster routes it like the
//! evaluation), with that evaluation's ARGV blocks. It takes a permit of
//! the script lane and `WAIT`s like an evaluation.

use std::sync::Arc;
use std::time::Duration;

use shared_contract::{
    IncompatibleCategory, RateLimitFailure, SettleOutcome, Settled, Settlement, UnavailableCategory,
};
use tokio::sync::TryAcquireError;
use tokio::time::Instant;
use tracing::Instrument;

use super::{ARGUMENTS, RedisEdgeRateLimitAdapter, Resolved, micros, number, script_span};
use crate::reply::{SettleReply, decode_settle};
use crate::scripts::{ScriptKind, Sent};

/// ARGV before the first policy block: caller time, reserved cost, the
/// settle's id, the reservation's id, units used.
const SETTLE_ARGS: usize = 5;

impl RedisEdgeRateLimitAdapter {
    /// The answer needing no round trip, if there is one: usage beyond a
    /// counter's range, a policy this provider does not hold, a deadline
    /// already passed (the memory provider's order).
    pub(super) fn settle_at_once(&self, settlement: &Settlement<'_>) -> Option<SettleOutcome> {
        if let Err(refused) = settlement.check() {
            return Some(Err(refused));
        }
        if let Err(refused) = settlement.request.known(|id| self.policies.get(id)) {
            return Some(Err(refused));
        }
        (settlement.request.deadline <= self.clock.monotonic()).then(|| {
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::AdmissionRejected,
                retry_after: self.failure_retry_after,
            })
        })
    }

    /// The settle by a script, once [`Self::settle_at_once`] found no answer.
    pub(super) async fn settle_in_redis(&self, settlement: Settlement<'static>) -> SettleOutcome {
        let request = &settlement.request;
        let set = request.known(|id| self.policies.get(id))?;
        let left = request.deadline.saturating_duration_since(self.clock.monotonic());
        let rejected = RateLimitFailure::Unavailable {
            category: UnavailableCategory::AdmissionRejected,
            retry_after: self.failure_retry_after,
        };
        if left.is_zero() {
            return Err(rejected);
        }
        let deadline = Instant::now() + left;
        let _permit = match self.lane.try_acquire() {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                let Ok(Ok(permit)) = tokio::time::timeout_at(deadline, self.lane.acquire()).await
                else {
                    return Err(rejected);
                };
                permit
            }
        };
        let keys: Vec<String> = set
            .iter()
            .map(|entry| self.keys.counter_key(&entry.policy, &request.subject, &request.operation))
            .collect();
        let now_millis = self.clock.epoch_millis();
        let reservation: Arc<[u8]> = if request.evaluation_id.may_repeat() {
            Arc::from(&request.evaluation_id.as_bytes()[..])
        } else {
            // An id minted once keeps no record to settle against, nor the
            // settle's (the in-process step's rule).
            Arc::from(&[][..])
        };
        let mut args = Vec::with_capacity(
            SETTLE_ARGS + set.iter().map(|entry| entry.block.len() + ARGUMENTS).sum::<usize>(),
        );
        args.extend([
            number(now_millis),
            number(request.cost),
            Arc::from(&settlement.settle_id().as_bytes()[..]),
            reservation,
            number(settlement.used),
        ]);
        for entry in set.iter() {
            args.extend(entry.block.iter().cloned());
            entry.push_arguments(now_millis, &mut args);
        }
        // A settle that may have run is safe to send again when it wrote
        // the settle's record wherever it wrote, or when it writes nothing
        // (a reservation to settle, with no record: `unknown`); only an
        // after-the-fact charge on keys without dedupe could charge twice.
        let replays = request.cost > 0
            || (request.evaluation_id.may_repeat()
                && set.iter().any(|entry| entry.dedup_enabled && !entry.holds_leases));
        if let Some(cache) = &self.deny_cache {
            cache.settling(now_millis);
        }
        let span = script_span(ScriptKind::Settle, keys.len());
        let started = span.as_ref().map(|_| std::time::Instant::now());
        let script = async {
            let outcome = self.run_settle(&set, &keys, &args, deadline).await;
            match outcome {
                Err(RateLimitFailure::Indeterminate { .. })
                    if replays && self.wait.is_none() && Instant::now() < deadline =>
                {
                    match self.run_settle(&set, &keys, &args, deadline).await {
                        settled @ Ok(_) => (settled, 2),
                        Err(_) => (outcome, 2),
                    }
                }
                Ok(_) | Err(_) => (outcome, 1_i64),
            }
        };
        let (outcome, attempts) = match &span {
            Some(span) => script.instrument(span.clone()).await,
            None => script.await,
        };
        if let Some((span, started)) = span.zip(started) {
            span.record("redis.attempts", attempts);
            span.record("redis.duration_us", micros(started.elapsed()));
        }
        if let Some(cache) = &self.deny_cache {
            cache.settled(&request.subject);
        }
        outcome
    }

    async fn run_settle(
        &self,
        set: &Resolved<'_>,
        keys: &[String],
        args: &[Arc<[u8]>],
        deadline: Instant,
    ) -> SettleOutcome {
        let result = self
            .scripts
            .evaluate_then_wait(
                &*self.gateway,
                ScriptKind::Settle,
                keys,
                args,
                self.wait,
                self.command_timeout,
                deadline,
            )
            .await;
        let indeterminate =
            RateLimitFailure::Indeterminate { retry_after: self.failure_retry_after };
        let first = set.iter().next().map(|entry| entry.policy.id());
        let sent = match result {
            Ok(sent) => sent,
            Err(failure) => {
                tracing::debug!(policy = ?first, ?failure, "settle script failed");
                return Err(self.failure_of(failure));
            }
        };
        let Some(reply) = decode_settle(&sent.reply, keys.len()) else {
            tracing::warn!(policy = ?first, "undecodable settle reply");
            return Err(indeterminate);
        };
        if !acknowledged(reply, &sent, self.wait.map_or(0, |wait| wait.replicas)) {
            tracing::warn!(policy = ?first, ?reply, "settle not acknowledged by replicas");
            return Err(indeterminate);
        }
        match reply {
            SettleReply::Applied { .. } => Ok(Settled::Applied),
            SettleReply::Repeated => Ok(Settled::Repeated),
            SettleReply::Unknown => Ok(Settled::UnknownReservation),
            SettleReply::ClockUnsafe { retry_after_ms } => Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::ClockUnsafe,
                retry_after: Duration::from_millis(retry_after_ms.max(1)),
            }),
            SettleReply::Corrupt => Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::StateIncompatible,
            }),
        }
    }
}

/// Whether a reply may stand under `WAIT` (acknowledge.rs says why): a
/// settle that wrote needs `wanted` replicas; a repeat wrote nothing this
/// `WAIT` could count, so it cannot be proven.
fn acknowledged(reply: SettleReply, sent: &Sent, wanted: u32) -> bool {
    let Some(replicas) = &sent.replicas else { return true };
    match reply {
        SettleReply::Applied { wrote: true } => {
            matches!(replicas, Ok(acknowledged) if *acknowledged >= u64::from(wanted))
        }
        SettleReply::Repeated => false,
        SettleReply::Applied { wrote: false }
        | SettleReply::Unknown
        | SettleReply::ClockUnsafe { .. }
        | SettleReply::Corrupt => true,
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;
    use crate::gateway::GatewayFailure;

    #[test]
    fn under_wait_only_a_settle_that_wrote_and_was_acknowledged_stands() {
        let sent = |replicas| Sent { reply: Value::Nil, replicas };
        let wrote = SettleReply::Applied { wrote: true };
        assert!(acknowledged(wrote, &sent(None), 1));
        assert!(acknowledged(wrote, &sent(Some(Ok(2))), 2));
        assert!(!acknowledged(wrote, &sent(Some(Ok(1))), 2));
        assert!(!acknowledged(wrote, &sent(Some(Err(GatewayFailure::Refused))), 1));
        assert!(!acknowledged(SettleReply::Repeated, &sent(Some(Ok(5))), 1));
        for nothing_written in [
            SettleReply::Applied { wrote: false },
            SettleReply::Unknown,
            SettleReply::ClockUnsafe { retry_after_ms: 3 },
            SettleReply::Corrupt,
        ] {
            assert!(acknowledged(nothing_written, &sent(Some(Ok(0))), 1), "{nothing_written:?}");
        }
    }
}
