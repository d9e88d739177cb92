//! The script reply: a fixed array led by a status string, decoded strictly.

use redis::Value;

/// The status a script puts first in its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyStatus {
    /// Charged (or replayed from a dedupe record).
    Allowed,
    /// Not admitted; nothing charged.
    Denied,
    /// The caller clock lags the key's mark beyond the bound; nothing written.
    ClockUnsafe,
    /// The stored value has a shape this script does not know; nothing written.
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

/// A decoded script reply:
/// `{status, remaining, reset_after_ms, retry_after_ms, replayed}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScriptReply {
    /// What the script decided.
    pub(crate) status: ReplyStatus,
    /// Units left.
    pub(crate) remaining: u64,
    /// Milliseconds until the budget is whole again.
    pub(crate) reset_after_ms: u64,
    /// Milliseconds to wait (denial) or the clock lag beyond the bound
    /// (`clock_unsafe`); 0 otherwise.
    pub(crate) retry_after_ms: u64,
    /// True when answered from a dedupe record.
    pub(crate) replayed: bool,
}

/// Why a reply could not be decoded. The script may have run, so the
/// adapter treats every one of these as `Indeterminate`.
#[derive(Debug, Clone, PartialEq, Eq, Copy)]
pub(crate) enum ReplyError {
    /// Not an array of exactly [`ScriptReply::LEN`] elements.
    WrongShape,
    /// The first element is not a known status string.
    UnknownStatus,
    /// A number is missing, negative or not an integer, or the replay flag
    /// is not 0 or 1.
    BadNumber,
}

impl ScriptReply {
    /// Elements in every reply.
    pub(crate) const LEN: usize = 5;

    /// Decodes a raw reply, rejecting anything short or mistyped.
    pub(crate) fn decode(value: &Value) -> Result<Self, ReplyError> {
        let Value::Array(items) = value else {
            return Err(ReplyError::WrongShape);
        };
        let [status, remaining, reset_after, retry_after, replayed]: &[Value; Self::LEN] =
            items.as_slice().try_into().map_err(|_| ReplyError::WrongShape)?;
        let status = match status {
            Value::BulkString(bytes) => bytes.as_slice(),
            Value::SimpleString(text) => text.as_bytes(),
            _ => return Err(ReplyError::UnknownStatus),
        };
        let status = ReplyStatus::from_wire(status).ok_or(ReplyError::UnknownStatus)?;
        let replayed = match number(replayed)? {
            0 => false,
            1 => true,
            _ => return Err(ReplyError::BadNumber),
        };
        Ok(Self {
            status,
            remaining: number(remaining)?,
            reset_after_ms: number(reset_after)?,
            retry_after_ms: number(retry_after)?,
            replayed,
        })
    }
}

fn number(value: &Value) -> Result<u64, ReplyError> {
    match value {
        Value::Int(n) => u64::try_from(*n).map_err(|_| ReplyError::BadNumber),
        _ => Err(ReplyError::BadNumber),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: &str, numbers: [i64; 4]) -> Value {
        let mut items = vec![Value::BulkString(status.as_bytes().to_vec())];
        items.extend(numbers.map(Value::Int));
        Value::Array(items)
    }

    #[test]
    fn decodes_every_status() {
        let allowed = ScriptReply::decode(&reply("allowed", [2, 750, 0, 1])).unwrap();
        assert_eq!(
            allowed,
            ScriptReply {
                status: ReplyStatus::Allowed,
                remaining: 2,
                reset_after_ms: 750,
                retry_after_ms: 0,
                replayed: true
            }
        );
        for (text, status) in [
            ("denied", ReplyStatus::Denied),
            ("clock_unsafe", ReplyStatus::ClockUnsafe),
            ("corrupt", ReplyStatus::Corrupt),
        ] {
            assert_eq!(ScriptReply::decode(&reply(text, [0, 0, 5, 0])).unwrap().status, status);
        }
    }

    #[test]
    fn rejects_short_long_and_mistyped_replies() {
        let short = Value::Array(vec![Value::BulkString(b"allowed".to_vec()), Value::Int(1)]);
        assert_eq!(ScriptReply::decode(&short), Err(ReplyError::WrongShape));
        let Value::Array(mut long) = reply("allowed", [1, 1, 0, 0]) else { unreachable!() };
        long.push(Value::Int(0));
        assert_eq!(ScriptReply::decode(&Value::Array(long)), Err(ReplyError::WrongShape));
        assert_eq!(ScriptReply::decode(&Value::Int(1)), Err(ReplyError::WrongShape));
        assert_eq!(ScriptReply::decode(&Value::Nil), Err(ReplyError::WrongShape));
        assert_eq!(
            ScriptReply::decode(&reply("maybe", [0, 0, 0, 0])),
            Err(ReplyError::UnknownStatus)
        );
        assert_eq!(
            ScriptReply::decode(&reply("denied", [-1, 0, 0, 0])),
            Err(ReplyError::BadNumber)
        );
        assert_eq!(
            ScriptReply::decode(&reply("allowed", [0, 0, 0, 2])),
            Err(ReplyError::BadNumber)
        );
        let text_number = Value::Array(vec![
            Value::BulkString(b"allowed".to_vec()),
            Value::BulkString(b"1".to_vec()),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
        ]);
        assert_eq!(ScriptReply::decode(&text_number), Err(ReplyError::BadNumber));
    }
}
