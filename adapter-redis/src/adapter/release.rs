//! The release of an in-flight lease on Redis: `lua/release.lua`, one
//! `EVALSHA` over the lease's keys (the concurrency policies of its set
//! that this adapter holds now, at their current revision: the keys the
//! admitting evaluation wrote, under the subject's one hash tag). It takes
//! a permit of the script lane like an evaluation, and never `WAIT`s: a
//! release a failover loses only holds its slot until the lease's TTL, as
//! a failed release does.

use std::sync::Arc;

use redis::Value;
use shared_contract::{Lease, ReleaseOutcome, UnavailableCategory};
use tokio::sync::TryAcquireError;
use tokio::time::Instant;
use tracing::Instrument;

use super::{RedisEdgeRateLimitAdapter, number, script_span};
use crate::gateway::GatewayFailure;
use crate::scripts::ScriptKind;

impl RedisEdgeRateLimitAdapter {
    pub(super) async fn release_lease(&self, lease: &Lease) -> ReleaseOutcome {
        let keys: Vec<String> = lease
            .policies
            .ids()
            .iter()
            .filter_map(|id| self.policies.get(id))
            .filter(|entry| entry.holds_leases)
            .map(|entry| self.keys.counter_key(&entry.policy, &lease.subject, &lease.operation))
            .collect();
        // No concurrency policy of the set is held now (a set of rate
        // policies, or a reload removed them): nothing to ask Redis.
        if keys.is_empty() {
            return ReleaseOutcome::NotHeld;
        }
        // A release has no deadline of its own: one command's time.
        let deadline = Instant::now() + self.command_timeout;
        let _permit = match self.lane.try_acquire() {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                let Ok(Ok(permit)) = tokio::time::timeout_at(deadline, self.lane.acquire()).await
                else {
                    return ReleaseOutcome::Unavailable {
                        category: UnavailableCategory::AdmissionRejected,
                    };
                };
                permit
            }
        };
        let args: [Arc<[u8]>; 2] =
            [Arc::from(&lease.id.as_bytes()[..]), number(self.clock.epoch_millis())];
        let call = self.scripts.evaluate_then_wait(
            &*self.gateway,
            ScriptKind::Release,
            &keys,
            &args,
            None,
            self.command_timeout,
            deadline,
        );
        let result = match script_span(ScriptKind::Release, keys.len()) {
            Some(span) => call.instrument(span).await,
            None => call.await,
        };
        match result {
            Ok(sent) => released(&sent.reply, keys.len()).unwrap_or_else(|| {
                tracing::warn!("undecodable release reply");
                ReleaseOutcome::Indeterminate
            }),
            Err(GatewayFailure::NotSent | GatewayFailure::Refused | GatewayFailure::NoScript) => {
                ReleaseOutcome::Unavailable { category: UnavailableCategory::UnavailableBeforeSend }
            }
            // The script may have run (a release.lua error cannot come from
            // a key of another type, which it leaves alone).
            Err(
                GatewayFailure::TimedOut
                | GatewayFailure::ConnectionLost
                | GatewayFailure::UnexpectedReply
                | GatewayFailure::WrongType
                | GatewayFailure::ScriptError,
            ) => ReleaseOutcome::Indeterminate,
        }
    }
}

/// `lua/release.lua`'s reply over `keys` keys: how many held the lease
/// live; `None` for anything else.
fn released(reply: &Value, keys: usize) -> Option<ReleaseOutcome> {
    let Value::Int(count) = *reply else { return None };
    match usize::try_from(count).ok()? {
        0 => Some(ReleaseOutcome::NotHeld),
        held if held <= keys => Some(ReleaseOutcome::Released),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_reply_counts_the_keys_that_held_the_lease() {
        assert_eq!(released(&Value::Int(0), 2), Some(ReleaseOutcome::NotHeld));
        assert_eq!(released(&Value::Int(1), 2), Some(ReleaseOutcome::Released));
        assert_eq!(released(&Value::Int(2), 2), Some(ReleaseOutcome::Released));
        for bad in [Value::Int(3), Value::Int(-1), Value::Nil, Value::BulkString(b"1".to_vec())] {
            assert_eq!(released(&bad, 2), None, "{bad:?}");
        }
    }
}
