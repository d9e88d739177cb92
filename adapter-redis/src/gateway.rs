//! `RedisGateway`: the seam between the adapter and the `redis` crate. The
//! real gateways (standalone here, Cluster in `cluster`) classify every
//! `redis` error by whether the command may have run, so the adapter's
//! failure mapping can be tested with a mock.

mod cluster;

pub use cluster::{ClusterGateway, SLOT_MAP_REFRESH};

use std::fmt::{self, Debug};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::time::Instant;

/// What went wrong talking to Redis, classified by what it proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayFailure {
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
    /// Sent, but no reply came before the timeout: it may have run.
    TimedOut,
    /// The connection broke after the command was handed to it: it may
    /// have run.
    ConnectionLost,
}

/// The Redis commands the adapter needs. Each call gets its own timeout and
/// MUST return within it.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait RedisGateway: Send + Sync + Debug {
    /// `SCRIPT LOAD source` on the server that runs `key`'s scripts (in a
    /// cluster, the master of the key's slot), returning the digest.
    async fn script_load(
        &self,
        source: &'static str,
        key: &str,
        timeout: Duration,
    ) -> Result<String, GatewayFailure>;

    /// `EVALSHA digest 1 key args...`, returning the raw reply.
    async fn evalsha(
        &self,
        digest: &str,
        key: &str,
        args: &[Vec<u8>],
        timeout: Duration,
    ) -> Result<Value, GatewayFailure>;

    /// `PING`.
    async fn ping(&self, timeout: Duration) -> Result<(), GatewayFailure>;
}

/// Consecutive timeouts after which the gateway drops its connection: a
/// blackholed server never closes the socket, so nothing else would.
pub(crate) const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;

/// The gateway of a standalone server: one multiplexed connection, opened
/// lazily, replaced when it breaks or keeps timing out.
pub struct StandaloneGateway {
    client: Client,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    // Serializes connection attempts so a burst makes one, not hundreds.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    consecutive_timeouts: AtomicU32,
}

impl Debug for StandaloneGateway {
    // The client's connection info may hold a password: print none of it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandaloneGateway")
            .field("connect_timeout", &self.connect_timeout)
            .field("generation", &self.generation.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl StandaloneGateway {
    /// A gateway that connects on first use. Fails only on a bad URL.
    pub fn new(
        url: &str,
        username: Option<&str>,
        password: Option<&str>,
        connect_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let mut info = redis::IntoConnectionInfo::into_connection_info(url)?;
        let mut redis_settings = info.redis_settings().clone();
        if let Some(username) = username {
            redis_settings = redis_settings.set_username(username);
        }
        if let Some(password) = password {
            redis_settings = redis_settings.set_password(password);
        }
        info = info.set_redis_settings(redis_settings);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Each call carries its own timeout (capped by the request deadline).
            .set_response_timeout(None);
        Ok(Self {
            client: Client::open(info)?,
            config,
            connect_timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            consecutive_timeouts: AtomicU32::new(0),
        })
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    async fn connection(
        &self,
        until: Instant,
    ) -> Result<(u64, MultiplexedConnection), GatewayFailure> {
        if let Some(cached) = self.cached() {
            return Ok(cached);
        }
        let Ok(_turn) = tokio::time::timeout_at(until, self.connecting.lock()).await else {
            return Err(GatewayFailure::NotSent);
        };
        // Someone else may have connected while this task waited its turn.
        if let Some(cached) = self.cached() {
            return Ok(cached);
        }
        let until = until.min(Instant::now() + self.connect_timeout);
        let connect = self.client.get_multiplexed_async_connection_with_config(&self.config);
        match tokio::time::timeout_at(until, connect).await {
            Ok(Ok(connection)) => {
                let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                *self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some((generation, connection.clone()));
                self.consecutive_timeouts.store(0, Ordering::Relaxed);
                Ok((generation, connection))
            }
            Ok(Err(error)) => {
                tracing::warn!(kind = error.category(), "redis connect failed");
                Err(GatewayFailure::NotSent)
            }
            Err(_) => {
                tracing::warn!("redis connect timed out");
                Err(GatewayFailure::NotSent)
            }
        }
    }

    /// Drops the connection of `generation` (not a newer one) so the next
    /// call reconnects.
    fn discard(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.as_ref().is_some_and(|(held, _)| *held == generation) {
            *current = None;
        }
    }

    async fn query(&self, cmd: &redis::Cmd, timeout: Duration) -> Result<Value, GatewayFailure> {
        let until = Instant::now() + timeout;
        let (generation, mut connection) = self.connection(until).await?;
        if Instant::now() >= until {
            return Err(GatewayFailure::NotSent);
        }
        match tokio::time::timeout_at(until, cmd.query_async::<Value>(&mut connection)).await {
            Ok(Ok(value)) => {
                self.consecutive_timeouts.store(0, Ordering::Relaxed);
                Ok(value)
            }
            Ok(Err(error)) => Err(self.classify(&error, generation)),
            Err(_) => {
                let timeouts = self.consecutive_timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                if timeouts >= TIMEOUTS_BEFORE_RECONNECT {
                    tracing::warn!(timeouts, "redis keeps timing out; replacing the connection");
                    self.consecutive_timeouts.store(0, Ordering::Relaxed);
                    self.discard(generation);
                }
                Err(GatewayFailure::TimedOut)
            }
        }
    }

    fn classify(&self, error: &RedisError, generation: u64) -> GatewayFailure {
        let failure = classify(error);
        match failure {
            GatewayFailure::TimedOut | GatewayFailure::ConnectionLost => self.discard(generation),
            GatewayFailure::NotSent
            | GatewayFailure::Refused
            | GatewayFailure::NoScript
            | GatewayFailure::WrongType
            | GatewayFailure::ScriptError => {}
        }
        if failure != GatewayFailure::NoScript {
            tracing::warn!(kind = error.category(), code = error.code(), ?failure, "redis error");
        }
        failure
    }
}

/// Classifies a `redis` error returned after the command was handed to the
/// connection.
/// `EVALSHA <digest> 1 <key> <args...>`, the one script command either
/// topology sends.
pub(crate) fn evalsha_command(digest: &str, key: &str, args: &[Vec<u8>]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(digest).arg(1).arg(key);
    for arg in args {
        cmd.arg(arg.as_slice());
    }
    cmd
}

/// The digest in a `SCRIPT LOAD` reply; any other reply means the script
/// is not registered, so nothing was run.
pub(crate) fn digest_of(reply: Value) -> Result<String, GatewayFailure> {
    match reply {
        Value::BulkString(bytes) => String::from_utf8(bytes).map_err(|_| GatewayFailure::NotSent),
        Value::SimpleString(text) => Ok(text),
        _ => Err(GatewayFailure::NotSent),
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

#[async_trait]
impl RedisGateway for StandaloneGateway {
    async fn script_load(
        &self,
        source: &'static str,
        _key: &str,
        timeout: Duration,
    ) -> Result<String, GatewayFailure> {
        digest_of(self.query(redis::cmd("SCRIPT").arg("LOAD").arg(source), timeout).await?)
    }

    async fn evalsha(
        &self,
        digest: &str,
        key: &str,
        args: &[Vec<u8>],
        timeout: Duration,
    ) -> Result<Value, GatewayFailure> {
        self.query(&evalsha_command(digest, key, args), timeout).await
    }

    async fn ping(&self, timeout: Duration) -> Result<(), GatewayFailure> {
        match self.query(&redis::cmd("PING"), timeout).await? {
            Value::SimpleString(text) if text == "PONG" => Ok(()),
            _ => Err(GatewayFailure::ScriptError),
        }
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

    #[tokio::test]
    async fn an_unreachable_server_is_not_sent_within_the_timeout() {
        // Port 1 on loopback: nothing listens there, so the connect is refused.
        let gateway =
            StandaloneGateway::new("redis://127.0.0.1:1", None, None, Duration::from_millis(200))
                .unwrap();
        let started = std::time::Instant::now();
        assert_eq!(gateway.ping(Duration::from_millis(300)).await, Err(GatewayFailure::NotSent));
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
