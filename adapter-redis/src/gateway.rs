//! `RedisGateway`: the seam between the adapter and the `redis` crate. The
//! real gateways ([`StandaloneGateway`], [`ClusterGateway`],
//! [`SentinelGateway`]) share one connection mechanism (`connection`; the
//! two over one multiplexed connection also share `multiplexed`) and
//! classify every `redis` error by whether the command may have run
//! ([`classify`]), so the adapter's failure mapping can be tested with a
//! mock.

mod cluster;
mod connection;
mod multiplexed;
mod pool;
mod sentinel;
mod standalone;

pub(crate) use cluster::ClusterGateway;
pub(crate) use sentinel::{Logins, SentinelGateway};
pub(crate) use standalone::StandaloneGateway;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use shared_contract::{LOG_LINE_EVERY, LogThrottle};

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

/// `WAIT <replicas> <timeout_ms>` after a charging script: how many
/// replicas must acknowledge its write, and how long the server waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitFor {
    /// Replicas that must acknowledge (at least 1).
    pub(crate) replicas: u32,
    /// The server's wait, whole milliseconds (at least 1; 0 would block
    /// forever).
    pub(crate) timeout_ms: u64,
}

/// A script's reply and what the `WAIT` after it said.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Acknowledged {
    /// The script's raw reply, as [`RedisGateway::evalsha`] returns it.
    pub(crate) reply: Value,
    /// How many replicas acknowledged the connection's writes so far, or
    /// why `WAIT` gave no count (the script ran either way).
    pub(crate) replicas: Result<u64, GatewayFailure>,
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

    /// [`Self::evalsha`], then `WAIT` on the same connection to the same
    /// node, in one round trip. `WAIT` counts the replicas that have every
    /// write this connection made so far, so the script's write is among
    /// them. An error of the script is returned as `Err` (so `NOSCRIPT`
    /// is retried as for [`Self::evalsha`]); once the script answered, a
    /// failed `WAIT` is reported in [`Acknowledged::replicas`].
    async fn evalsha_then_wait(
        &self,
        script: &LoadedScript,
        keys: &[String],
        args: &[Arc<[u8]>],
        wait: WaitFor,
        timeout: Duration,
    ) -> Result<Acknowledged, GatewayFailure>;

    /// `PING`: `Ok` only for `PONG`, [`GatewayFailure::UnexpectedReply`]
    /// for any other answer.
    async fn ping(&self, timeout: Duration) -> Result<(), GatewayFailure>;
}

/// `WAIT <replicas> <timeout_ms>`.
pub(crate) fn wait_command(wait: WaitFor) -> redis::Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(wait.replicas).arg(wait.timeout_ms);
    cmd
}

/// The two replies of `EVALSHA` + `WAIT`: the script's error is the
/// call's; `WAIT`'s is only the acknowledgement's.
pub(crate) fn acknowledged_of(evalsha: Value, wait: Value) -> Result<Acknowledged, RedisError> {
    let reply = evalsha.extract_error()?;
    let replicas = match wait {
        Value::Int(count) => u64::try_from(count).map_err(|_| GatewayFailure::UnexpectedReply),
        Value::ServerError(_) => match wait.extract_error() {
            Err(error) => {
                log_error_reply(&error, "redis WAIT refused");
                Err(classify(&error))
            }
            Ok(_) => Err(GatewayFailure::UnexpectedReply),
        },
        _ => Err(GatewayFailure::UnexpectedReply),
    };
    Ok(Acknowledged { reply, replicas })
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

/// `SCRIPT LOAD` of a script's source.
pub(crate) fn script_load_command(source: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(source);
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
/// One line a second for Redis' error replies: while a server refuses
/// (OOM, BUSY, LOADING, READONLY, NOPERM) every request gets one, and a
/// client must not be able to make a log line per request.
static ERROR_REPLIES_LOGGED: LogThrottle = LogThrottle::new(LOG_LINE_EVERY);

/// Logs `error`, an error reply to a request's command, at most once a
/// second with the count of those not logged since.
pub(crate) fn log_error_reply(error: &RedisError, message: &'static str) {
    if let Some(suppressed) = ERROR_REPLIES_LOGGED.admit(std::time::Instant::now()) {
        tracing::warn!(kind = error.category(), code = error.code(), suppressed, "{message}");
    }
}

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

    /// `n` pings of `gateway` started together (a barrier), each with
    /// `timeout`: how each went.
    pub(super) async fn pings_at_once<G: RedisGateway + 'static>(
        gateway: &Arc<G>,
        n: usize,
        timeout: Duration,
    ) -> Vec<Result<(), GatewayFailure>> {
        let start = Arc::new(tokio::sync::Barrier::new(n));
        let pings: Vec<_> = (0..n)
            .map(|_| {
                let (gateway, start) = (Arc::clone(gateway), Arc::clone(&start));
                tokio::spawn(async move {
                    start.wait().await;
                    gateway.ping(timeout).await
                })
            })
            .collect();
        let mut results = Vec::with_capacity(n);
        for ping in pings {
            results.push(ping.await.expect("a ping panicked"));
        }
        results
    }

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
    fn a_script_error_fails_the_call_and_a_wait_error_only_the_acknowledgement() {
        let error = |wire: &str| redis::parse_redis_value(wire.as_bytes()).unwrap();
        let noscript = acknowledged_of(error("-NOSCRIPT No matching script.\r\n"), Value::Int(1));
        assert_eq!(noscript.map_err(|e| classify(&e)), Err(GatewayFailure::NoScript));
        assert_eq!(
            acknowledged_of(Value::Int(7), Value::Int(2)).unwrap(),
            Acknowledged { reply: Value::Int(7), replicas: Ok(2) }
        );
        let refused = acknowledged_of(Value::Int(7), error("-NOPERM no WAIT for you\r\n"));
        assert_eq!(refused.unwrap().replicas, Err(GatewayFailure::Refused));
        let odd = acknowledged_of(Value::Int(7), Value::Okay).unwrap();
        assert_eq!(odd.replicas, Err(GatewayFailure::UnexpectedReply));
        assert_eq!(
            acknowledged_of(Value::Int(7), Value::Int(-1)).unwrap().replicas,
            Err(GatewayFailure::UnexpectedReply)
        );
    }

    #[test]
    fn an_evalsha_command_is_the_digest_the_key_count_the_keys_and_the_args_in_order() {
        // Keys without the default prefix: a new service renames that, and
        // the lengths below would no longer match.
        let keys = ["k:{v1:00}:a:1".to_owned(), "k:{v1:00}:daily:1".to_owned()];
        let args: [Arc<[u8]>; 2] = [Arc::from(&b"1800000000250"[..]), Arc::from(&b"F"[..])];
        let packed = evalsha_command("0123abcd", &keys, &args).get_packed_command();
        let expected = "*7\r\n$7\r\nEVALSHA\r\n$8\r\n0123abcd\r\n$1\r\n2\r\n\
            $13\r\nk:{v1:00}:a:1\r\n$17\r\nk:{v1:00}:daily:1\r\n\
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
