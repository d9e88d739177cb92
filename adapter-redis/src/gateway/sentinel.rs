//! `SentinelGateway`: the gateway of a master watched by Redis Sentinel,
//! over one multiplexed connection to whichever node the sentinels name.
//!
//! Discovery is the `redis` crate's own (`redis::sentinel::SentinelClient`,
//! feature `sentinel`): it asks the sentinels in the configured order
//! (`SENTINEL MASTERS`, up to three at once, the first in order that names
//! a master wins), skips a master a sentinel holds down (`s_down`/`o_down`),
//! and checks with `ROLE` that the node it names is a master, so a demoted
//! node is refused. It runs on every new connection, and the connection is
//! replaced by the rule of the `connection` module (dropped, a run of
//! ambiguous failures, or `READONLY` from a demoted node): after a
//! failover the next connection goes to the promoted replica. While no
//! sentinel names a usable master, connects fail and calls are
//! [`GatewayFailure::NotSent`].

use std::fmt::{self, Debug};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisError, RedisResult, Value};

use super::connection::{Connect, LazyConnection};
use super::{
    Acknowledged, GatewayFailure, LoadedScript, RedisGateway, WaitFor, digest_of, evalsha_command,
    pong,
};
use crate::settings::sentinel_address;

/// The gateway of a Sentinel-managed master.
pub(crate) struct SentinelGateway {
    connection: LazyConnection<Discovered>,
}

/// Asks the sentinels for the master, then connects to it. The crate's
/// client wants `&mut` (it caches its sentinel connections); the single
/// flight of `LazyConnection` means the lock is never contended for long.
struct Discovered {
    client: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
}

impl Connect for Discovered {
    type Connection = MultiplexedConnection;

    async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        self.client.lock().await.get_async_connection_with_config(&self.config).await
    }
}

impl Debug for SentinelGateway {
    // The client holds both passwords: print none of it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelGateway")
            .field("connect_timeout", &self.connection.connect_timeout())
            .field("generation", &self.connection.generation())
            .finish_non_exhaustive()
    }
}

/// Who the gateway logs in as, on the master and on the sentinels.
#[derive(Clone, Copy, Default)]
pub(crate) struct Logins<'a> {
    pub(crate) username: Option<&'a str>,
    pub(crate) password: Option<&'a str>,
    pub(crate) sentinel_username: Option<&'a str>,
    pub(crate) sentinel_password: Option<&'a str>,
}

impl SentinelGateway {
    /// A gateway that asks `sentinels` (`host:port`, in order) for
    /// `master_name` on first use. Fails only on a bad address or name.
    pub(crate) fn new(
        sentinels: &[String],
        master_name: &str,
        logins: Logins<'_>,
        connect_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let mut addresses = Vec::with_capacity(sentinels.len());
        for address in sentinels {
            let Some((host, port)) = sentinel_address(address) else {
                return Err(RedisError::from((ErrorKind::InvalidClientConfig, "not host:port")));
            };
            addresses.push(ConnectionAddr::Tcp(host, port));
        }
        let mut builder =
            SentinelClientBuilder::new(addresses, master_name, SentinelServerType::Master)?;
        if let Some(username) = logins.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = logins.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(username) = logins.sentinel_username {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = logins.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Each call carries its own timeout (capped by the request deadline).
            .set_response_timeout(None);
        let connector = Discovered { client: tokio::sync::Mutex::new(builder.build()?), config };
        Ok(Self { connection: LazyConnection::new(connector, connect_timeout, "sentinel") })
    }

    /// How many master connections were opened so far.
    #[cfg(test)]
    pub(crate) fn generation(&self) -> u64 {
        self.connection.generation()
    }
}

#[async_trait]
impl RedisGateway for SentinelGateway {
    async fn script_load(
        &self,
        source: &'static str,
        _key: &str,
        timeout: Duration,
    ) -> Result<String, GatewayFailure> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(source);
        digest_of(self.connection.query(&cmd, timeout).await?)
    }

    async fn evalsha(
        &self,
        script: &LoadedScript,
        keys: &[String],
        args: &[Arc<[u8]>],
        timeout: Duration,
    ) -> Result<Value, GatewayFailure> {
        self.connection.query(&evalsha_command(&script.digest, keys, args), timeout).await
    }

    async fn evalsha_then_wait(
        &self,
        script: &LoadedScript,
        keys: &[String],
        args: &[Arc<[u8]>],
        wait: WaitFor,
        timeout: Duration,
    ) -> Result<Acknowledged, GatewayFailure> {
        let cmd = evalsha_command(&script.digest, keys, args);
        self.connection.query_then_wait(&cmd, wait, timeout).await
    }

    async fn ping(&self, timeout: Duration) -> Result<(), GatewayFailure> {
        pong(&self.connection.query(&redis::cmd("PING"), timeout).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_answering_sentinel_is_not_sent_within_the_timeout() {
        // Ports 1 and 2 on loopback: nothing listens, every connect is refused.
        let sentinels = ["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let gateway = SentinelGateway::new(
            &sentinels,
            "mymaster",
            Logins::default(),
            Duration::from_millis(200),
        )
        .unwrap();
        let started = std::time::Instant::now();
        assert_eq!(gateway.ping(Duration::from_millis(300)).await, Err(GatewayFailure::NotSent));
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(gateway.generation(), 0);
    }
}
