//! An operator's inspect and reset of one budget on Redis: two small
//! scripts, `lua/inspect.lua` (the key's type, then one read of the state,
//! or of a lease set's members) and `lua/reset.lua` (one `UNLINK` of the
//! counter key, records or leases and all), run with `EVALSHA` like the
//! rate-limit scripts, so a Cluster routes both by the subject's hash tag
//! and the least-privilege user needs only `TYPE` and `ZRANGE` beyond what
//! the rate-limit scripts call. The algorithm itself runs here, in
//! `shared_contract::inspect_key`, over the decoded state.

use redis::Value;
use shared_contract::{
    AlgorithmState, BudgetFailure, BudgetKey, BudgetState, DedupRecords, EvaluationId, HeldLease,
    KeyRules, KeyState, Leases, inspect_key,
};

use super::{PolicyEntry, RedisEdgeRateLimitAdapter};
use crate::gateway::{GatewayFailure, LoadedScript};

const RESET: &str = include_str!("../../lua/reset.lua");

/// What `lua/inspect.lua` found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stored {
    Absent,
    State {
        mark: u64,
        algorithm: AlgorithmState,
    },
    /// A lease set (the lease algorithm's Lua file): its mark and every lease it
    /// holds, expired ones included (the step counts the live ones).
    Leases {
        mark: u64,
        leases: Leases,
    },
}

impl RedisEdgeRateLimitAdapter {
    /// The policy and counter key of a budget: the key `evaluate` charges.
    fn budget_entry(&self, key: &BudgetKey) -> Result<(&PolicyEntry, String), BudgetFailure> {
        let entry = self.policies.get(&key.policy).ok_or(BudgetFailure::UnknownPolicy)?;
        let operation = key.operation_for(&entry.policy)?;
        Ok((entry, self.keys.budget_key(&entry.policy, &key.subject, operation)))
    }

    pub(super) async fn inspect_budget(
        &self,
        key: &BudgetKey,
    ) -> Result<BudgetState, BudgetFailure> {
        let (entry, counter) = self.budget_entry(key)?;
        let reply = self
            .run_admin(crate::scripts::inspect_source(), &[counter])
            .await
            .map_err(failure_of)?;
        let now = self.clock.epoch_millis();
        let rules = KeyRules::of(&entry.policy);
        match decode_inspect(&reply) {
            Some(Stored::Absent) => inspect_key(&rules, None, now),
            Some(Stored::State { mark, algorithm }) => {
                // Records play no part in a budget's numbers.
                let state = KeyState {
                    mark,
                    algorithm,
                    records: DedupRecords::default(),
                    leases: Leases::default(),
                };
                inspect_key(&rules, Some(&state), now)
            }
            Some(Stored::Leases { mark, leases }) => {
                let Some(algorithm) = AlgorithmState::of_lease_set() else {
                    return Err(BudgetFailure::StateIncompatible);
                };
                let state = KeyState { mark, algorithm, records: DedupRecords::default(), leases };
                inspect_key(&rules, Some(&state), now)
            }
            None => {
                tracing::warn!(policy = %key.policy, "unreadable inspect reply");
                Err(BudgetFailure::StateIncompatible)
            }
        }
    }

    pub(super) async fn reset_budget(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        let (_, counter) = self.budget_entry(key)?;
        match self.run_admin(RESET, &[counter]).await.map_err(failure_of)? {
            Value::Int(0..=1) => Ok(()),
            // UNLINK answers a count; anything else means we cannot tell.
            _ => Err(BudgetFailure::Indeterminate),
        }
    }

    /// `SCRIPT LOAD` then `EVALSHA` of an operator's script, each within
    /// the command timeout. An operator's call is rare, so it loads every
    /// time instead of keeping a digest cache (the load is idempotent and
    /// reaches the node of the key's slot); one more try on `NOSCRIPT`
    /// (the cache was flushed in between: nothing ran).
    async fn run_admin(
        &self,
        source: &'static str,
        keys: &[String],
    ) -> Result<Value, GatewayFailure> {
        let slot = keys.first().map_or("", String::as_str);
        let mut tries = 2;
        loop {
            tries -= 1;
            let digest = match self.gateway.script_load(source, slot, self.command_timeout).await {
                Ok(digest) => digest,
                // SCRIPT LOAD changes no key, however it failed.
                Err(failure) => {
                    tracing::debug!(?failure, "operator script load failed");
                    return Err(GatewayFailure::NotSent);
                }
            };
            let script = LoadedScript { digest: digest.into(), source };
            match self.gateway.evalsha(&script, keys, &[], self.command_timeout).await {
                Err(GatewayFailure::NoScript) if tries > 0 => {}
                other => return other,
            }
        }
    }
}

/// A gateway failure as an operator's call reports it.
fn failure_of(failure: GatewayFailure) -> BudgetFailure {
    match failure {
        GatewayFailure::NotSent | GatewayFailure::Refused | GatewayFailure::NoScript => {
            BudgetFailure::Unavailable
        }
        GatewayFailure::WrongType | GatewayFailure::ScriptError => BudgetFailure::StateIncompatible,
        GatewayFailure::TimedOut
        | GatewayFailure::ConnectionLost
        | GatewayFailure::UnexpectedReply => BudgetFailure::Indeterminate,
    }
}

/// Decodes `lua/inspect.lua`'s reply; `None` for a corrupt value or a reply
/// of another shape.
fn decode_inspect(reply: &Value) -> Option<Stored> {
    let Value::Array(items) = reply else { return None };
    let number = |at: usize| match items.get(at) {
        Some(&Value::Int(n)) => u64::try_from(n).ok(),
        _ => None,
    };
    // A state's numbers as the bits `AlgorithmState::decode` reads: a
    // token bucket's debt (negative tokens) as two's complement.
    let bits = |at: usize| match items.get(at) {
        Some(&Value::Int(n)) => Some(u64::from_ne_bytes(n.to_ne_bytes())),
        _ => None,
    };
    match items.first() {
        Some(Value::BulkString(status)) if status == b"absent" && items.len() == 1 => {
            Some(Stored::Absent)
        }
        Some(Value::BulkString(status)) if status == b"state" && items.len() == 6 => {
            let (mark, a, b, c) = (number(2)?, bits(3)?, bits(4)?, bits(5)?);
            let algorithm = AlgorithmState::decode(u8::try_from(number(1)?).ok()?, [a, b, c])?;
            Some(Stored::State { mark, algorithm })
        }
        // The mark, then (lease id, expires_at) pairs.
        Some(Value::BulkString(status)) if status == b"leases" && items.len() % 2 == 0 => {
            let mark = number(1)?;
            let leases = items[2..]
                .chunks_exact(2)
                .map(|pair| match pair {
                    [Value::BulkString(id), Value::Int(expires_at)] => Some(HeldLease {
                        id: EvaluationId::from_uuid(uuid::Uuid::from_bytes(
                            id.as_slice().try_into().ok()?,
                        )),
                        expires_at: u64::try_from(*expires_at).ok()?,
                    }),
                    _ => None,
                })
                .collect::<Option<Leases>>()?;
            Some(Stored::Leases { mark, leases })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn the_inspect_reply_decodes_each_algorithm_and_refuses_anything_else() {
        assert_eq!(decode_inspect(&Value::Array(vec![bulk("absent")])), Some(Stored::Absent));
        let state = |tag: u8| {
            Value::Array(vec![
                bulk("state"),
                Value::Int(i64::from(tag)),
                Value::Int(10),
                Value::Int(1),
                Value::Int(2),
                Value::Int(3),
            ])
        };
        let decoded = |tag| match decode_inspect(&state(tag)) {
            Some(Stored::State { mark: 10, algorithm }) => Some(algorithm),
            _ => None,
        };
        assert_eq!(
            decoded(b'F'),
            Some(AlgorithmState::FixedWindow(shared_contract::FixedWindowState {
                window_start: 1,
                count: 2
            }))
        );
        assert_eq!(
            decoded(b'S'),
            Some(AlgorithmState::SlidingCounter(shared_contract::SlidingCounterState {
                window_start: 1,
                current: 2,
                previous: 3
            }))
        );
        assert_eq!(
            decoded(b'B'),
            Some(AlgorithmState::TokenBucket(shared_contract::TokenBucketState {
                tokens: 1,
                updated_at: 2
            }))
        );
        assert_eq!(
            decoded(b'G'),
            Some(AlgorithmState::Gcra(shared_contract::GcraState { tat: 1 }))
        );
        // A bucket in debt after a settle's charge past it.
        let debt = Value::Array(vec![
            bulk("state"),
            Value::Int(i64::from(b'B')),
            Value::Int(10),
            Value::Int(-2),
            Value::Int(2),
            Value::Int(0),
        ]);
        assert_eq!(
            decode_inspect(&debt),
            Some(Stored::State {
                mark: 10,
                algorithm: AlgorithmState::TokenBucket(shared_contract::TokenBucketState {
                    tokens: -2,
                    updated_at: 2
                })
            })
        );
        let id = |n: u8| Value::BulkString(vec![n; 16]);
        let lease = |n: u8, expires_at| HeldLease {
            id: EvaluationId::from_uuid(uuid::Uuid::from_bytes([n; 16])),
            expires_at,
        };
        let leases = |items: Vec<Value>| {
            decode_inspect(&Value::Array([vec![bulk("leases"), Value::Int(10)], items].concat()))
        };
        assert_eq!(
            leases(vec![id(1), Value::Int(40), id(2), Value::Int(50)]),
            Some(Stored::Leases {
                mark: 10,
                leases: [lease(1, 40), lease(2, 50)].into_iter().collect()
            })
        );
        assert_eq!(leases(vec![]), Some(Stored::Leases { mark: 10, leases: Leases::default() }));
        for bad in [
            vec![id(1)],
            vec![id(1), Value::Int(-1)],
            vec![Value::BulkString(vec![1; 15]), Value::Int(40)],
            vec![Value::Int(40), id(1)],
        ] {
            assert_eq!(leases(bad.clone()), None, "{bad:?}");
        }
        for bad in [
            state(b'C'),
            state(b'X'),
            Value::Array(vec![bulk("corrupt")]),
            Value::Array(vec![bulk("state"), Value::Int(70)]),
            Value::Array(vec![bulk("absent"), Value::Int(1)]),
            Value::Nil,
        ] {
            assert_eq!(decode_inspect(&bad), None, "{bad:?}");
        }
    }
}
