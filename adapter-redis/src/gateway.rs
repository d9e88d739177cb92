//! `RedisGateway`: the seam between the adapter and the `redis` crate. The
//! real gateways ([`StandaloneGateway`], [`ClusterGateway`]) share one
//! connection mechanism (`connection`) and classify every `redis` error by
//! whether the command may have run ([`classify`]), so the adapter's
//! failure mapping can be tested with a mock.

mod cluster;
mod connection;
mod standalone;

pub(crate) use cluster::ClusterGateway;
pub(crate) use standalone::StandaloneGateway;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

/// What went wrong talking to Redis, classified by what it proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GatewayFailure {
    /// Nothing reached the server: no connection, connect refused or timed
    /// out, authentication failed, or no time was left to send.
    NotSent,
    /// The server refused the command without running it (`NOPERM`,
    /// `LOADING`, `BUSY`, `OOM`, `READONLY`, `MASTERDOWN`, ...).
    Refused,
    /// `NOSCRIPT`: the digest is unknown to the server; nothing ran.
    NoScript,
    /// `WRONGTYPE`: the key holds a value of another Redis type.
    WrongType,
    /// The script ran and raised another error before its only write.
    ScriptError,
    /// The command ran and the server answered, but not with the reply
    /// that command gives (`PING` without `PONG`, `SCRIPT LOAD` without a
    /// digest). Only commands that charge nothing report it; an
    /// undecodable script reply is the adapter's to judge.
    UnexpectedReply,
    /// Sent, but no reply came before the timeout: it may have run.
    TimedOut,
    /// The connection broke after the command was handed to it: it may
    /// have run.
    ConnectionLost,
}

/// A script as the gateway sends it: the digest `SCRIPT LOAD` returned and
/// the source behind it, so a gateway that must load it again elsewhere (a
/// cluster node importing the key's slot) needs no map of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoadedScript {
    /// The SHA-1 digest `EVALSHA` names.
    pub(crate) digest: Arc<str>,
    /// The source that digest is of.
    pub(crate) source: &'static str,
}

/// The Redis commands the adapter needs. Each call gets its own timeout and
/// MUST return within it.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub(crate) trait RedisGateway: Send + Sync + Debug {
    /// `SCRIPT LOAD source` on the server that runs `key`'s scripts (in a
    /// cluster, the master of the key's slot), returning the digest.
    async fn script_load(
        &self,
        source: &'static str,
        key: &str,
        timeout: Duration,
    ) -> Result<String, GatewayFailure>;

    /// `EVALSHA digest <keys.len()> keys... args...` of `script`, returning
    /// the raw reply. Every key of one call shares one hash tag (one
    /// subject), so in a cluster the first key names the slot. Arguments
    /// are shared buffers: a policy's fixed ones are built once and only
    /// their reference counts move per call.
    async fn evalsha(
        &self,
        script: &LoadedScript,
        keys: &[String],
        args: &[Arc<[u8]>],
        timeout: Duration,
    ) -> Result<Value, GatewayFailure>;

    /// `PING`: `Ok` only for `PONG`, [`GatewayFailure::UnexpectedReply`]
    /// for any other answer.
    async fn ping(&self, timeout: Duration) -> Result<(), GatewayFailure>;
}

/// `EVALSHA <digest> <numkeys> <keys...> <args...>`, the one script
/// command either topology sends.
pub(crate) fn evalsha_command(digest: &str, keys: &[String], args: &[Arc<[u8]>]) -> redis::Cmd {
    // Sized once: grown one argument at a time, the buffers were
    // reallocated about ten times per call (callgrind, docs/benchmarks.md).
    let data = b"EVALSHA".len()
        + digest.len()
        + 3
        + keys.iter().map(String::len).sum::<usize>()
        + args.iter().map(|arg| arg.len()).sum::<usize>();
    let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + args.len(), data);
    cmd.arg("EVALSHA").arg(digest).arg(keys.len());
    for key in keys {
        cmd.arg(key.as_str());
    }
    for arg in args {
        cmd.arg(&**arg);
    }
    cmd
}

/// The digest in a `SCRIPT LOAD` reply; any other reply means the script
/// is not registered (and `SCRIPT LOAD` charges nothing).
pub(crate) fn digest_of(reply: Value) -> Result<String, GatewayFailure> {
    match reply {
        Value::BulkString(bytes) => {
            String::from_utf8(bytes).map_err(|_| GatewayFailure::UnexpectedReply)
        }
        Value::SimpleString(text) => Ok(text),
        _ => Err(GatewayFailure::UnexpectedReply),
    }
}

/// Whether a `PING` reply is the one `PING` gives.
pub(crate) fn pong(reply: &Value) -> Result<(), GatewayFailure> {
    match reply {
        Value::SimpleString(text) if text == "PONG" => Ok(()),
        _ => Err(GatewayFailure::UnexpectedReply),
    }
}

/// Classifies a `redis` error returned after the command was handed to the
/// connection.
pub(crate) fn classify(error: &RedisError) -> GatewayFailure {
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::NoScript) => GatewayFailure::NoScript,
        // Redis 7 checks the commands a script calls against the caller's
        // ACL and answers a plain ERR; the script stopped before its write.
        ErrorKind::Server(ServerErrorKind::ResponseError)
            if error.detail().is_some_and(|detail| {
                detail.starts_with("The user executing the script can't")
            }) =>
        {
            GatewayFailure::Refused
        }
        ErrorKind::Server(ServerErrorKind::ResponseError) => GatewayFailure::ScriptError,
        ErrorKind::Server(_) => GatewayFailure::Refused,
        ErrorKind::Extension => match error.code() {
            Some("WRONGTYPE") => GatewayFailure::WrongType,
            Some("BUSY" | "OOM" | "NOAUTH" | "WRONGPASS" | "NOREPLICAS" | "MISCONF" | "NOPERM") => {
                GatewayFailure::Refused
            }
            _ => GatewayFailure::ScriptError,
        },
        ErrorKind::Io if error.is_timeout() => GatewayFailure::TimedOut,
        // Anything else on the client side: the bytes may have left.
        _ => GatewayFailure::ConnectionLost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str) -> RedisError {
        redis::make_extension_error(code.to_owned(), Some("detail".to_owned()))
    }

    #[test]
    fn extension_codes_are_classified_by_what_they_prove() {
        assert_eq!(classify(&server_error("WRONGTYPE")), GatewayFailure::WrongType);
        assert_eq!(classify(&server_error("BUSY")), GatewayFailure::Refused);
        assert_eq!(classify(&server_error("OOM")), GatewayFailure::Refused);
        assert_eq!(classify(&server_error("SOMETHINGNEW")), GatewayFailure::ScriptError);
    }

    #[test]
    fn io_errors_mean_it_may_have_run() {
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(classify(&reset), GatewayFailure::ConnectionLost);
        let timed_out = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(classify(&timed_out), GatewayFailure::TimedOut);
    }

    #[test]
    fn an_evalsha_command_is_the_digest_the_key_count_the_keys_and_the_args_in_order() {
        let keys = ["ca:rl:{v1:00}:a:1".to_owned(), "ca:rl:{v1:00}:a:1:dedupe".to_owned()];
        let args: [Arc<[u8]>; 2] = [Arc::from(&b"1800000000250"[..]), Arc::from(&b"F"[..])];
        let packed = evalsha_command("0123abcd", &keys, &args).get_packed_command();
        let expected = "*7\r\n$7\r\nEVALSHA\r\n$8\r\n0123abcd\r\n$1\r\n2\r\n\
            $17\r\nca:rl:{v1:00}:a:1\r\n$24\r\nca:rl:{v1:00}:a:1:dedupe\r\n\
            $13\r\n1800000000250\r\n$1\r\nF\r\n";
        assert_eq!(String::from_utf8(packed).unwrap(), expected);
    }

    #[test]
    fn only_pong_answers_a_ping_and_only_a_digest_a_script_load() {
        assert_eq!(pong(&Value::SimpleString("PONG".to_owned())), Ok(()));
        for other in
            [Value::SimpleString("PANG".to_owned()), Value::Okay, Value::Nil, Value::Int(1)]
        {
            assert_eq!(pong(&other), Err(GatewayFailure::UnexpectedReply), "{other:?}");
        }
        assert_eq!(digest_of(Value::BulkString(b"abc".to_vec())), Ok("abc".to_owned()));
        assert_eq!(digest_of(Value::Int(1)), Err(GatewayFailure::UnexpectedReply));
    }
}
