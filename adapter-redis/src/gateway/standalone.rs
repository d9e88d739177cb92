//! `StandaloneGateway`: the gateway of one server, over one multiplexed
//! connection.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, RedisResult};

use super::connection::{Connect, LazyConnection};
use super::multiplexed::MultiplexedGateway;

/// The gateway of a standalone server: one multiplexed connection, opened
/// lazily and replaced by the rule of the `connection` module.
pub(crate) type StandaloneGateway = MultiplexedGateway<Standalone>;

/// Opens multiplexed connections to one server.
pub(crate) struct Standalone {
    client: Client,
    config: AsyncConnectionConfig,
}

impl Connect for Standalone {
    type Connection = MultiplexedConnection;

    fn connect(&self) -> impl Future<Output = RedisResult<MultiplexedConnection>> + Send {
        self.client.get_multiplexed_async_connection_with_config(&self.config)
    }
}

impl MultiplexedGateway<Standalone> {
    /// A gateway that connects on first use. Fails only on a bad URL.
    pub(crate) fn new(
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
        let connector = Arc::new(Standalone { client: Client::open(info)?, config });
        Ok(Self {
            connection: LazyConnection::new(connector, connect_timeout, "standalone"),
            waiting: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::{GatewayFailure, RedisGateway};

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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_server_costs_the_connection_after_the_ambiguous_failures_in_a_row() {
        use super::super::connection::AMBIGUOUS_FAILURES_BEFORE_RECONNECT;

        let mut server = tokio::task::block_in_place(redis_fixture::RedisServer::start);
        let gateway =
            StandaloneGateway::new(&server.url(), None, None, Duration::from_millis(300)).unwrap();
        let quick = Duration::from_millis(150);
        let generation = || gateway.connection.generation();
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        assert_eq!(generation(), 1);

        // One timeout short of the rule, then an answer: the run is over.
        server.pause();
        for _ in 1..AMBIGUOUS_FAILURES_BEFORE_RECONNECT {
            assert_eq!(gateway.ping(quick).await, Err(GatewayFailure::TimedOut));
        }
        server.resume();
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        assert_eq!(generation(), 1, "kept after fewer timeouts in a row than the rule");

        // The whole run: the connection is dropped, and a new one is tried
        // (which cannot finish against a frozen server: nothing was sent).
        server.pause();
        for _ in 0..AMBIGUOUS_FAILURES_BEFORE_RECONNECT {
            assert_eq!(gateway.ping(quick).await, Err(GatewayFailure::TimedOut));
        }
        assert_eq!(gateway.ping(quick).await, Err(GatewayFailure::NotSent));
        server.resume();
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        assert_eq!(generation(), 2, "replaced after the run");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_server_costs_the_connection_at_once() {
        let mut server = tokio::task::block_in_place(redis_fixture::RedisServer::start);
        let gateway =
            StandaloneGateway::new(&server.url(), None, None, Duration::from_millis(300)).unwrap();
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        tokio::task::block_in_place(|| server.restart());
        // The old socket is closed: the crate reports it dropped, so the
        // very next call opens a new connection.
        assert_eq!(gateway.ping(Duration::from_secs(2)).await, Err(GatewayFailure::ConnectionLost));
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        assert_eq!(gateway.connection.generation(), 2);
    }
}
