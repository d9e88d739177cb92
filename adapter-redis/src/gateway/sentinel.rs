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

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisError, RedisResult};

use super::connection::{Connect, LazyConnection};
use super::multiplexed::MultiplexedGateway;
use crate::settings::sentinel_address;

/// The gateway of a Sentinel-managed master.
pub(crate) type SentinelGateway = MultiplexedGateway<Discovered>;

/// Asks the sentinels for the master, then connects to it. The crate's
/// client wants `&mut` (it caches its sentinel connections); the single
/// flight of `LazyConnection` means the lock is never contended for long.
pub(crate) struct Discovered {
    client: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
}

impl Connect for Discovered {
    type Connection = MultiplexedConnection;

    async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        self.client.lock().await.get_async_connection_with_config(&self.config).await
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

impl MultiplexedGateway<Discovered> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::{GatewayFailure, RedisGateway};

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
