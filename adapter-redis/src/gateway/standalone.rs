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

    fn opened(&self, connection: &MultiplexedConnection, label: &Arc<str>, timeout: Duration) {
        crate::eviction::check(connection.clone(), Arc::clone(label), timeout);
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
            connection: LazyConnection::checking_each_connection(
                connector,
                connect_timeout,
                "standalone".into(),
            ),
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
        ping_until_answered(&gateway).await;
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

    /// `n` pings started together, each with `timeout`: how many were not
    /// sent.
    async fn burst(gateway: &Arc<StandaloneGateway>, n: usize, timeout: Duration) -> usize {
        let pings = super::super::tests::pings_at_once(gateway, n, timeout).await;
        pings.iter().filter(|&&ping| ping == Err(GatewayFailure::NotSent)).count()
    }

    /// `total_connections_received` of the server at `url`, over a
    /// connection of its own (which the count then includes).
    async fn connections_received(url: &str) -> u64 {
        let mut connection = Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("the server answers");
        let info: String =
            redis::cmd("INFO").arg("stats").query_async(&mut connection).await.unwrap();
        info.lines()
            .find_map(|line| line.trim().strip_prefix("total_connections_received:"))
            .and_then(|count| count.parse().ok())
            .expect("INFO stats counts the connections")
    }

    /// Pings until one is answered (the first ones may fall in the connect
    /// back-off), at most `RETRY_CONNECT_AFTER` apart a few times.
    async fn ping_until_answered(gateway: &StandaloneGateway) {
        use super::super::connection::RETRY_CONNECT_AFTER;
        for _ in 0..20 {
            match gateway.ping(Duration::from_secs(2)).await {
                Ok(()) => return,
                Err(failure) => assert_eq!(failure, GatewayFailure::NotSent),
            }
            tokio::time::sleep(RETRY_CONNECT_AFTER).await;
        }
        panic!("never answered again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frozen_server_costs_one_connect_attempt_for_a_burst_and_connects_once_back() {
        use super::super::connection::AMBIGUOUS_FAILURES_BEFORE_RECONNECT;

        let mut server = tokio::task::block_in_place(redis_fixture::RedisServer::start);
        // The connect timeout is long beside the time the burst takes to
        // start, so every caller of the burst finds the attempt pending.
        let gateway = Arc::new(
            StandaloneGateway::new(&server.url(), None, None, Duration::from_secs(1)).unwrap(),
        );
        let attempts = || gateway.connection.connect_attempts();
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        let received = connections_received(&server.url()).await;

        // SIGSTOP: the connection goes after the run of timeouts; a connect
        // then opens a socket (the kernel accepts it) that is never answered.
        server.pause();
        for _ in 0..AMBIGUOUS_FAILURES_BEFORE_RECONNECT {
            let ping = gateway.ping(Duration::from_millis(150)).await;
            assert_eq!(ping, Err(GatewayFailure::TimedOut));
        }
        assert_eq!(burst(&gateway, 32, Duration::from_secs(3)).await, 32);
        assert_eq!(attempts(), 2, "one connect for the whole burst, not one per caller");
        server.resume();
        ping_until_answered(&gateway).await;
        assert_eq!(attempts(), 3, "the first attempt after SIGCONT connects");
        // The server saw the same: the burst's socket and the reconnect,
        // besides `pause`'s `redis-cli` (it asks for the process id) and
        // this count's own connection.
        assert_eq!(connections_received(&server.url()).await, received + 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_killed_server_costs_one_connect_attempt_for_a_burst_and_connects_once_restarted() {
        let mut server = tokio::task::block_in_place(redis_fixture::RedisServer::start);
        let gateway = Arc::new(
            StandaloneGateway::new(&server.url(), None, None, Duration::from_secs(1)).unwrap(),
        );
        let attempts = || gateway.connection.connect_attempts();
        gateway.ping(Duration::from_secs(2)).await.unwrap();

        // SIGKILL: the port is closed, every connect is refused at once.
        tokio::task::block_in_place(|| server.crash());
        assert_eq!(gateway.ping(Duration::from_secs(2)).await, Err(GatewayFailure::ConnectionLost));
        assert_eq!(burst(&gateway, 32, Duration::from_secs(2)).await, 32);
        assert_eq!(attempts(), 2, "one refused connect for the whole burst, not one per caller");
        tokio::task::block_in_place(|| server.restart());
        ping_until_answered(&gateway).await;
        assert_eq!(attempts(), 3, "the first attempt after the restart connects");
        assert_eq!(gateway.connection.generation(), 2);
    }
}
