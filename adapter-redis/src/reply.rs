//! The script replies: a flat array led by the set's status, decoded
//! strictly for the number of keys the call sent (layout at the top of
//! `lua/policy-set.lua`), and the settle's (`lua/settle.lua`).

use redis::Value;
use shared_contract::MAX_POLICY_SET;

/// The status a script puts first in its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyStatus {
    /// Admitted: every enforced policy allowed (or the set replayed).
    Allowed,
    /// Refused by an enforced policy; nothing charged anywhere.
    Denied,
    /// The caller clock lags a key's mark beyond its bound; nothing written.
    ClockUnsafe,
    /// A key holds a value this script does not know; nothing written.
    Corrupt,
}

impl ReplyStatus {
    /// Every status, in declaration order.
    pub(crate) const ALL: [Self; 4] =
        [Self::Allowed, Self::Denied, Self::ClockUnsafe, Self::Corrupt];

    /// The string a script sends for this status.
    pub(crate) const fn wire_name(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::ClockUnsafe => "clock_unsafe",
            Self::Corrupt => "corrupt",
        }
    }

    /// The status a script's status string names.
    pub(crate) fn from_wire(name: &[u8]) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.wire_name().as_bytes() == name)
    }
}

/// What one key of the set answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct KeyAnswer {
    /// The policy's own answer (under a refused set, uncharged).
    pub(crate) allowed: bool,
    /// Answered from this key's dedupe record.
    pub(crate) replayed: bool,
    /// Units left.
    pub(crate) remaining: u64,
    /// Milliseconds until the budget is whole again.
    pub(crate) reset_after_ms: u64,
    /// Milliseconds to wait when denied; 0 otherwise.
    pub(crate) retry_after_ms: u64,
}

/// A decoded script reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "decoded on the stack once per call; boxing the answers would allocate per call"
)]
pub(crate) enum SetReply {
    /// `allowed` or `denied`, with one answer per key in the set's order.
    Decided {
        /// Whether the set admitted the request.
        admitted: bool,
        /// The answers; only the first `len` are used.
        answers: [KeyAnswer; MAX_POLICY_SET],
        /// How many keys the call sent.
        len: usize,
    },
    /// The largest lag beyond a key's bound, in milliseconds.
    ClockUnsafe {
        /// Milliseconds.
        retry_after_ms: u64,
    },
    /// A key of the set holds another algorithm's state or a value of an
    /// unknown shape.
    Corrupt,
}

/// Why a reply could not be decoded. The script may have run, so the
/// adapter treats every one of these as `Indeterminate`.
#[derive(Debug, Clone, PartialEq, Eq, Copy)]
pub(crate) enum ReplyError {
    /// Not an array of exactly the status's length for this many keys.
    WrongShape,
    /// The first element is not a known status string.
    UnknownStatus,
    /// A number is missing, negative or not an integer, an answer flag is
    /// not 0, 1 or 2, or a corrupt key's index is not one of the set's.
    BadNumber,
}

/// Numbers each key adds to a decided reply.
pub(crate) const PER_KEY: usize = 4;
/// Elements of a `clock_unsafe` or `corrupt` reply: status and one number.
pub(crate) const FAILURE_LEN: usize = 2;

/// The answer flag of a key: denied, allowed, replayed.
const DENIED: u64 = 0;
const ALLOWED: u64 = 1;
const REPLAYED: u64 = 2;

impl SetReply {
    /// Elements of a decided reply for `keys` keys.
    pub(crate) const fn decided_len(keys: usize) -> usize {
        1 + PER_KEY * keys
    }

    /// Decodes the raw reply of a call over `keys` keys (1 ..=
    /// [`MAX_POLICY_SET`]), rejecting anything short, long or mistyped.
    pub(crate) fn decode(value: &Value, keys: usize) -> Result<Self, ReplyError> {
        let Value::Array(items) = value else {
            return Err(ReplyError::WrongShape);
        };
        let Some((status, numbers)) = items.split_first() else {
            return Err(ReplyError::WrongShape);
        };
        let status = match status {
            Value::BulkString(bytes) => bytes.as_slice(),
            Value::SimpleString(text) => text.as_bytes(),
            _ => return Err(ReplyError::UnknownStatus),
        };
        let status = ReplyStatus::from_wire(status).ok_or(ReplyError::UnknownStatus)?;
        match status {
            ReplyStatus::Allowed | ReplyStatus::Denied => {
                if keys == 0 || keys > MAX_POLICY_SET || items.len() != Self::decided_len(keys) {
                    return Err(ReplyError::WrongShape);
                }
                let mut answers = [KeyAnswer::default(); MAX_POLICY_SET];
                for (answer, fields) in answers.iter_mut().zip(numbers.chunks_exact(PER_KEY)) {
                    let (allowed, replayed) = match number(&fields[0])? {
                        DENIED => (false, false),
                        ALLOWED => (true, false),
                        REPLAYED => (true, true),
                        _ => return Err(ReplyError::BadNumber),
                    };
                    *answer = KeyAnswer {
                        allowed,
                        replayed,
                        remaining: number(&fields[1])?,
                        reset_after_ms: number(&fields[2])?,
                        retry_after_ms: number(&fields[3])?,
                    };
                }
                Ok(Self::Decided { admitted: status == ReplyStatus::Allowed, answers, len: keys })
            }
            ReplyStatus::ClockUnsafe | ReplyStatus::Corrupt => {
                let [wait]: &[Value; FAILURE_LEN - 1] =
                    numbers.try_into().map_err(|_| ReplyError::WrongShape)?;
                let wait = number(wait)?;
                if status == ReplyStatus::ClockUnsafe {
                    return Ok(Self::ClockUnsafe { retry_after_ms: wait });
                }
                // The index names the key; it must be one the call sent.
                match usize::try_from(wait) {
                    Ok(index) if (1..=keys).contains(&index) => Ok(Self::Corrupt),
                    Ok(_) | Err(_) => Err(ReplyError::BadNumber),
                }
            }
        }
    }
}

fn number(value: &Value) -> Result<u64, ReplyError> {
    match value {
        Value::Int(n) => u64::try_from(*n).map_err(|_| ReplyError::BadNumber),
        _ => Err(ReplyError::BadNumber),
    }
}

/// What `lua/settle.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SettleReply {
    /// Settled now; `wrote` says whether any key was written.
    Applied {
        wrote: bool,
    },
    Repeated,
    Unknown,
    ClockUnsafe {
        retry_after_ms: u64,
    },
    Corrupt,
}

/// Decodes `lua/settle.lua`'s reply over `keys` keys; `None` for anything
/// of another shape.
pub(crate) fn decode_settle(reply: &Value, keys: usize) -> Option<SettleReply> {
    let Value::Array(items) = reply else { return None };
    let (status, numbers) = items.split_first()?;
    let status = match status {
        Value::BulkString(bytes) => bytes.as_slice(),
        Value::SimpleString(text) => text.as_bytes(),
        _ => return None,
    };
    let number = match numbers {
        [] => None,
        [Value::Int(n)] => Some(u64::try_from(*n).ok()?),
        _ => return None,
    };
    match (status, number) {
        (b"applied", Some(0)) => Some(SettleReply::Applied { wrote: false }),
        (b"applied", Some(1)) => Some(SettleReply::Applied { wrote: true }),
        (b"repeated", None) => Some(SettleReply::Repeated),
        (b"unknown", None) => Some(SettleReply::Unknown),
        (b"clock_unsafe", Some(retry_after_ms)) => {
            Some(SettleReply::ClockUnsafe { retry_after_ms })
        }
        // The index names the key; it must be one the call sent.
        (b"corrupt", Some(index)) if (1..=keys).contains(&usize::try_from(index).ok()?) => {
            Some(SettleReply::Corrupt)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: &str, numbers: &[i64]) -> Value {
        let mut items = vec![Value::BulkString(status.as_bytes().to_vec())];
        items.extend(numbers.iter().copied().map(Value::Int));
        Value::Array(items)
    }

    fn answers(reply: SetReply) -> (bool, Vec<KeyAnswer>) {
        match reply {
            SetReply::Decided { admitted, answers, len } => (admitted, answers[..len].to_vec()),
            other @ (SetReply::ClockUnsafe { .. } | SetReply::Corrupt) => {
                panic!("expected answers, got {other:?}")
            }
        }
    }

    #[test]
    fn decodes_every_status_for_its_number_of_keys() {
        let one = SetReply::decode(&reply("allowed", &[2, 2, 750, 0]), 1).unwrap();
        let expected = KeyAnswer {
            allowed: true,
            replayed: true,
            remaining: 2,
            reset_after_ms: 750,
            retry_after_ms: 0,
        };
        assert_eq!(answers(one), (true, vec![expected]));
        let two = SetReply::decode(&reply("denied", &[0, 0, 750, 750, 1, 8, 750, 0]), 2).unwrap();
        let (admitted, two) = answers(two);
        assert!(!admitted);
        assert_eq!((two[0].allowed, two[0].retry_after_ms), (false, 750));
        assert_eq!((two[1].allowed, two[1].replayed, two[1].remaining), (true, false, 8));
        assert_eq!(
            SetReply::decode(&reply("clock_unsafe", &[40]), 3),
            Ok(SetReply::ClockUnsafe { retry_after_ms: 40 })
        );
        assert_eq!(SetReply::decode(&reply("corrupt", &[3]), 3), Ok(SetReply::Corrupt));
    }

    #[test]
    fn rejects_a_shape_of_another_key_count_and_mistyped_replies() {
        let two_keys = reply("allowed", &[1, 1, 1, 0, 1, 1, 1, 0]);
        assert_eq!(SetReply::decode(&two_keys, 1), Err(ReplyError::WrongShape));
        assert_eq!(SetReply::decode(&two_keys, 3), Err(ReplyError::WrongShape));
        assert!(SetReply::decode(&two_keys, 2).is_ok());
        let short = Value::Array(vec![Value::BulkString(b"allowed".to_vec()), Value::Int(1)]);
        assert_eq!(SetReply::decode(&short, 1), Err(ReplyError::WrongShape));
        assert_eq!(SetReply::decode(&Value::Array(vec![]), 1), Err(ReplyError::WrongShape));
        assert_eq!(SetReply::decode(&Value::Int(1), 1), Err(ReplyError::WrongShape));
        assert_eq!(SetReply::decode(&Value::Nil, 1), Err(ReplyError::WrongShape));
        assert_eq!(
            SetReply::decode(&reply("clock_unsafe", &[1, 2]), 1),
            Err(ReplyError::WrongShape)
        );
        assert_eq!(
            SetReply::decode(&reply("maybe", &[0, 0, 0, 0]), 1),
            Err(ReplyError::UnknownStatus)
        );
        assert_eq!(
            SetReply::decode(&reply("denied", &[0, -1, 0, 0]), 1),
            Err(ReplyError::BadNumber)
        );
        assert_eq!(
            SetReply::decode(&reply("allowed", &[3, 0, 0, 0]), 1),
            Err(ReplyError::BadNumber)
        );
        assert_eq!(SetReply::decode(&reply("corrupt", &[2]), 1), Err(ReplyError::BadNumber));
        assert_eq!(SetReply::decode(&reply("corrupt", &[0]), 1), Err(ReplyError::BadNumber));
        let text_number = Value::Array(vec![
            Value::BulkString(b"allowed".to_vec()),
            Value::Int(1),
            Value::BulkString(b"1".to_vec()),
            Value::Int(0),
            Value::Int(0),
        ]);
        assert_eq!(SetReply::decode(&text_number, 1), Err(ReplyError::BadNumber));
    }

    #[test]
    fn the_settle_reply_decodes_each_status_and_refuses_anything_else() {
        let decoded = |status, numbers: &[i64]| decode_settle(&reply(status, numbers), 2);
        assert_eq!(decoded("applied", &[1]), Some(SettleReply::Applied { wrote: true }));
        assert_eq!(decoded("applied", &[0]), Some(SettleReply::Applied { wrote: false }));
        assert_eq!(decoded("repeated", &[]), Some(SettleReply::Repeated));
        assert_eq!(decoded("unknown", &[]), Some(SettleReply::Unknown));
        assert_eq!(
            decoded("clock_unsafe", &[40]),
            Some(SettleReply::ClockUnsafe { retry_after_ms: 40 })
        );
        assert_eq!(decoded("corrupt", &[2]), Some(SettleReply::Corrupt));
        for (status, numbers) in [
            ("applied", &[][..]),
            ("applied", &[2]),
            ("repeated", &[1]),
            ("unknown", &[0]),
            ("clock_unsafe", &[-1]),
            ("corrupt", &[0]),
            ("corrupt", &[3]),
            ("allowed", &[1]),
        ] {
            assert_eq!(decoded(status, numbers), None, "{status} {numbers:?}");
        }
        assert_eq!(decode_settle(&Value::Nil, 1), None);
        assert_eq!(decode_settle(&Value::Array(vec![]), 1), None);
    }
}
