//! `ClusterGateway`: the gateway of a Redis Cluster, over the `redis`
//! crate's async cluster client.
//!
//! The client's own retries are switched off (`retries(0)`): it would resend
//! a command after a connection dropped mid-flight, which may charge a
//! subject twice and hides that the first attempt may have run. This
//! gateway retries itself, and only after answers that prove the command did
//! not run (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, ..., no connection,
//! connection refused), so every failure it returns is classified exactly
//! like the standalone gateway's. The client still refreshes its slot map
//! after every `MOVED` and reconnects dropped nodes; the gateway also
//! replaces the whole client connection periodically, so the slot map is
//! refreshed even when no error says it changed.

use std::collections::HashMap;
use std::fmt::{self, Debug};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::time::Instant;

use super::{
    GatewayFailure, RedisGateway, TIMEOUTS_BEFORE_RECONNECT, classify, digest_of, evalsha_command,
};

/// How old a cluster connection (and its slot map) may get before the
/// gateway builds a new one in the background.
pub const SLOT_MAP_REFRESH: Duration = Duration::from_secs(30);

/// First and longest pause between two attempts that were refused unrun.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// The gateway of a Redis Cluster: one cluster connection (a multiplexed
/// connection per node), opened lazily, replaced after repeated timeouts and
/// every [`SLOT_MAP_REFRESH`].
pub struct ClusterGateway {
    shared: Arc<Shared>,
    /// The source behind each digest `script_load` returned, for `ASK`.
    sources: Mutex<HashMap<String, &'static str>>,
    connect_timeout: Duration,
    slot_map_refresh: Duration,
    // Serializes connection attempts so a burst makes one, not hundreds.
    connecting: tokio::sync::Mutex<()>,
    /// Timeouts and lost connections in a row (a success resets it).
    ambiguous_in_a_row: AtomicU32,
}

/// What the background refresh needs too.
struct Shared {
    client: ClusterClient,
    current: Mutex<Option<Current>>,
    generation: AtomicU64,
    refreshing: AtomicBool,
}

#[derive(Clone)]
struct Current {
    generation: u64,
    connection: ClusterConnection,
    opened: Instant,
}

impl Debug for ClusterGateway {
    // The client holds the password: print none of it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterGateway")
            .field("connect_timeout", &self.connect_timeout)
            .field("generation", &self.shared.generation.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What one attempt's error means for the next step.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    /// Final: the failure, classified as on a standalone server.
    Stop(GatewayFailure),
    /// The command did not run; try again (after `ASKING` on `ask`'s node
    /// for an `ASK` redirect) while time is left.
    Retry { failure: GatewayFailure, ask: Option<(String, u16)> },
}

impl ClusterGateway {
    /// A gateway over the seed nodes `urls` that connects on first use.
    /// Every client timeout is set explicitly: connect, per-node response
    /// and overall response (the cluster client has none by default). Fails
    /// only on bad URLs.
    pub fn new(
        urls: &[String],
        username: Option<&str>,
        password: Option<&str>,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str))
            .connection_timeout(connect_timeout)
            .response_timeout(command_timeout)
            .overall_response_timeout(Some(command_timeout))
            .retries(0);
        if let Some(username) = username {
            builder = builder.username(username);
        }
        if let Some(password) = password {
            builder = builder.password(password);
        }
        Ok(Self {
            shared: Arc::new(Shared {
                client: builder.build()?,
                current: Mutex::new(None),
                generation: AtomicU64::new(0),
                refreshing: AtomicBool::new(false),
            }),
            sources: Mutex::new(HashMap::new()),
            connect_timeout,
            slot_map_refresh: SLOT_MAP_REFRESH,
            connecting: tokio::sync::Mutex::new(()),
            ambiguous_in_a_row: AtomicU32::new(0),
        })
    }

    /// Replaces the default [`SLOT_MAP_REFRESH`] interval (30 s) after which
    /// a new cluster connection, with a freshly read slot map, is built in
    /// the background.
    pub fn with_slot_map_refresh(mut self, every: Duration) -> Self {
        self.slot_map_refresh = every;
        self
    }

    async fn connection(&self, until: Instant) -> Result<Current, GatewayFailure> {
        if let Some(current) = self.shared.cached() {
            if current.opened.elapsed() >= self.slot_map_refresh {
                self.shared.refresh_in_background(self.connect_timeout);
            }
            return Ok(current);
        }
        let Ok(_turn) = tokio::time::timeout_at(until, self.connecting.lock()).await else {
            return Err(GatewayFailure::NotSent);
        };
        // Someone else may have connected while this task waited its turn.
        if let Some(current) = self.shared.cached() {
            return Ok(current);
        }
        let until = until.min(Instant::now() + self.connect_timeout);
        match tokio::time::timeout_at(until, self.shared.client.get_async_connection()).await {
            Ok(Ok(connection)) => {
                self.ambiguous_in_a_row.store(0, Ordering::Relaxed);
                Ok(self.shared.install(connection))
            }
            Ok(Err(error)) => {
                tracing::warn!(kind = error.category(), "redis cluster connect failed");
                Err(GatewayFailure::NotSent)
            }
            Err(_) => {
                tracing::warn!("redis cluster connect timed out");
                Err(GatewayFailure::NotSent)
            }
        }
    }

    /// Sends `cmd` along `routing` (the master of a key's slot), following
    /// `MOVED`/`ASK` and waiting out unrun refusals until `timeout` is spent.
    /// `script` is the source behind an `EVALSHA`: an `ASK` target (a node
    /// importing the slot) may never have seen it, so it is loaded there in
    /// the same pipeline.
    async fn query(
        &self,
        cmd: &redis::Cmd,
        routing: RoutingInfo,
        script: Option<&'static str>,
        timeout: Duration,
    ) -> Result<Value, GatewayFailure> {
        let until = Instant::now() + timeout;
        let mut ask: Option<(String, u16)> = None;
        let mut pause = FIRST_PAUSE;
        let mut last = GatewayFailure::NotSent;
        loop {
            if Instant::now() >= until {
                // Every attempt so far was refused unrun (or never sent).
                return Err(last);
            }
            let current = self.connection(until).await?;
            let mut connection = current.connection.clone();
            let attempt = async {
                match ask.take() {
                    None => connection.route_command(cmd.clone(), routing.clone()).await,
                    Some((host, port)) => {
                        // ASKING holds for the next command on the same
                        // connection only, so both go as one pipeline.
                        let mut pipeline = redis::pipe();
                        if let Some(source) = script {
                            pipeline.cmd("SCRIPT").arg("LOAD").arg(source);
                        }
                        pipeline.add_command(redis::cmd("ASKING")).add_command(cmd.clone());
                        let skip = pipeline.len() - 1;
                        let route = SingleNodeRoutingInfo::ByAddress { host, port };
                        let mut replies =
                            connection.route_pipeline(pipeline, skip, 1, route).await?;
                        Ok(replies.pop().unwrap_or(Value::Nil))
                    }
                }
            };
            let result = match tokio::time::timeout_at(until, attempt).await {
                Ok(result) => result.and_then(server_error_as_err),
                Err(_) => return Err(self.timed_out(current.generation)),
            };
            let error = match result {
                Ok(value) => {
                    self.ambiguous_in_a_row.store(0, Ordering::Relaxed);
                    return Ok(value);
                }
                Err(error) => error,
            };
            match next_step(&error) {
                Next::Stop(GatewayFailure::TimedOut) => {
                    return Err(self.timed_out(current.generation));
                }
                Next::Stop(GatewayFailure::ConnectionLost) => {
                    tracing::warn!(kind = error.category(), "redis cluster connection lost");
                    return Err(self.connection_lost(current.generation));
                }
                Next::Stop(failure) => {
                    if failure != GatewayFailure::NoScript {
                        tracing::warn!(
                            kind = error.category(),
                            code = error.code(),
                            ?failure,
                            "redis cluster error"
                        );
                    }
                    return Err(failure);
                }
                Next::Retry { failure, ask: redirect } => {
                    tracing::debug!(
                        kind = error.category(),
                        "redis cluster: retrying an unrun command"
                    );
                    last = failure;
                    ask = redirect;
                    let wake = (Instant::now() + pause).min(until);
                    tokio::time::sleep_until(wake).await;
                    pause = (pause * 2).min(LONGEST_PAUSE);
                }
            }
        }
    }

    fn timed_out(&self, generation: u64) -> GatewayFailure {
        self.count_ambiguous_failure(generation);
        GatewayFailure::TimedOut
    }

    fn connection_lost(&self, generation: u64) -> GatewayFailure {
        self.count_ambiguous_failure(generation);
        GatewayFailure::ConnectionLost
    }

    /// The client repairs a dropped node connection by itself, so one lost
    /// connection keeps the cluster connection; but a run of timeouts (a
    /// blackholed node) or of lost connections (say, the client's driver
    /// task is gone) replaces it.
    fn count_ambiguous_failure(&self, generation: u64) {
        let failures = self.ambiguous_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= TIMEOUTS_BEFORE_RECONNECT {
            tracing::warn!(failures, "redis cluster keeps failing; replacing the connection");
            self.ambiguous_in_a_row.store(0, Ordering::Relaxed);
            self.shared.discard(generation);
        }
    }
}

impl Shared {
    fn cached(&self) -> Option<Current> {
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn install(&self, connection: ClusterConnection) -> Current {
        let current = Current {
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
            connection,
            opened: Instant::now(),
        };
        *self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some(current.clone());
        current
    }

    /// Drops the connection of `generation` (not a newer one) so the next
    /// call reconnects.
    fn discard(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.as_ref().is_some_and(|held| held.generation == generation) {
            *current = None;
        }
    }

    /// Builds a new cluster connection (a fresh slot map) in a background
    /// task and swaps it in; the old one serves until then. One at a time.
    fn refresh_in_background(self: &Arc<Self>, connect_timeout: Duration) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let connect = shared.client.get_async_connection();
            match tokio::time::timeout(connect_timeout, connect).await {
                Ok(Ok(connection)) => {
                    shared.install(connection);
                }
                // Keep the old connection; the next call past the interval tries again.
                Ok(Err(error)) => {
                    tracing::warn!(
                        kind = error.category(),
                        "redis cluster slot-map refresh failed"
                    );
                }
                Err(_) => tracing::warn!("redis cluster slot-map refresh timed out"),
            }
            shared.refreshing.store(false, Ordering::Release);
        });
    }
}

/// The master of the slot that `key` hashes to (its `{...}` hash tag).
fn route_of(key: &str) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        key.as_bytes(),
        SlotAddr::Master,
    )))
}

/// A server error inside a reply becomes an `Err`, as `query_async` does.
fn server_error_as_err(value: Value) -> Result<Value, RedisError> {
    match value {
        Value::ServerError(_) => value.extract_error(),
        other => Ok(other),
    }
}

/// What an attempt's error proves, and whether to try again.
fn next_step(error: &RedisError) -> Next {
    let retry = |failure| Next::Retry { failure, ask: None };
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::Ask) => Next::Retry {
            failure: GatewayFailure::Refused,
            ask: error.redirect_node().and_then(|(address, _slot)| {
                let (host, port) = address.rsplit_once(':')?;
                Some((host.to_owned(), port.parse().ok()?))
            }),
        },
        // A redirect or a cluster in transition: the command did not run,
        // and the client refreshes its slot map after MOVED and READONLY.
        ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly,
        ) => retry(GatewayFailure::Refused),
        // No connection to any node that could take it: nothing was sent.
        ErrorKind::ClusterConnectionNotFound => retry(GatewayFailure::NotSent),
        // A connect to the slot's node (or a MOVED target) was refused.
        ErrorKind::Io if error.is_connection_refusal() => retry(GatewayFailure::NotSent),
        _ => Next::Stop(classify(error)),
    }
}

#[async_trait]
impl RedisGateway for ClusterGateway {
    async fn script_load(
        &self,
        source: &'static str,
        key: &str,
        timeout: Duration,
    ) -> Result<String, GatewayFailure> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(source);
        let digest = digest_of(self.query(&cmd, route_of(key), None, timeout).await?)?;
        self.sources
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(digest.clone(), source);
        Ok(digest)
    }

    async fn evalsha(
        &self,
        digest: &str,
        key: &str,
        args: &[Vec<u8>],
        timeout: Duration,
    ) -> Result<Value, GatewayFailure> {
        let cmd = evalsha_command(digest, key, args);
        let script = self
            .sources
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(digest)
            .copied();
        self.query(&cmd, route_of(key), script, timeout).await
    }

    /// Ready when at least one master answers `PING`: with
    /// `cluster-require-full-coverage no` one shard's failover must not take
    /// every instance out of rotation.
    async fn ping(&self, timeout: Duration) -> Result<(), GatewayFailure> {
        let until = Instant::now() + timeout;
        let current = self.connection(until).await?;
        let mut connection = current.connection.clone();
        let routing = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::OneSucceeded),
        ));
        match tokio::time::timeout_at(until, connection.route_command(redis::cmd("PING"), routing))
            .await
        {
            Ok(Ok(Value::SimpleString(text))) if text == "PONG" => Ok(()),
            Ok(Ok(Value::Okay)) => Ok(()),
            Ok(Ok(_)) => Err(GatewayFailure::ScriptError),
            Ok(Err(error)) => Err(classify(&error)),
            Err(_) => Err(self.timed_out(current.generation)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_error(wire: &str) -> RedisError {
        let value = redis::parse_redis_value(wire.as_bytes()).expect("a RESP error");
        value.extract_error().expect_err("an error reply")
    }

    fn retried(failure: GatewayFailure) -> Next {
        Next::Retry { failure, ask: None }
    }

    #[test]
    fn redirects_and_cluster_transitions_are_retried_as_unrun() {
        for wire in [
            "-MOVED 3999 127.0.0.1:7002\r\n",
            "-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            "-CLUSTERDOWN Hash slot not served\r\n",
            "-MASTERDOWN Link with MASTER is down\r\n",
            "-LOADING Redis is loading the dataset in memory\r\n",
            "-READONLY You can't write against a read only replica.\r\n",
        ] {
            assert_eq!(next_step(&reply_error(wire)), retried(GatewayFailure::Refused), "{wire}");
        }
    }

    #[test]
    fn ask_is_retried_at_the_named_node() {
        assert_eq!(
            next_step(&reply_error("-ASK 3999 127.0.0.1:7002\r\n")),
            Next::Retry {
                failure: GatewayFailure::Refused,
                ask: Some(("127.0.0.1".to_owned(), 7002)),
            }
        );
    }

    #[test]
    fn no_connection_and_a_refused_connect_were_never_sent() {
        let missing = RedisError::from((ErrorKind::ClusterConnectionNotFound, "no connection"));
        assert_eq!(next_step(&missing), retried(GatewayFailure::NotSent));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(next_step(&refused), retried(GatewayFailure::NotSent));
    }

    #[test]
    fn everything_else_is_classified_as_on_a_standalone_server() {
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(next_step(&reset), Next::Stop(GatewayFailure::ConnectionLost));
        let timed_out = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(next_step(&timed_out), Next::Stop(GatewayFailure::TimedOut));
        assert_eq!(
            next_step(&reply_error("-NOSCRIPT No matching script.\r\n")),
            Next::Stop(GatewayFailure::NoScript)
        );
        assert_eq!(
            next_step(&reply_error("-NOPERM this user has no permissions\r\n")),
            Next::Stop(GatewayFailure::Refused)
        );
        assert_eq!(
            next_step(&reply_error("-WRONGTYPE Operation against a key\r\n")),
            Next::Stop(GatewayFailure::WrongType)
        );
        // A script never touches two slots; if it did, nothing ran.
        assert_eq!(
            next_step(&reply_error("-CROSSSLOT Keys in request don't hash to the same slot\r\n")),
            Next::Stop(GatewayFailure::Refused)
        );
    }

    #[cfg(feature = "test-fixture")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_slot_map_is_refreshed_periodically_in_the_background() {
        let cluster = tokio::task::block_in_place(crate::fixture::RedisCluster::start);
        let every = Duration::from_millis(200);
        let gateway = ClusterGateway::new(
            &cluster.urls(),
            None,
            None,
            Duration::from_secs(2),
            Duration::from_secs(2),
        )
        .unwrap()
        .with_slot_map_refresh(every);
        let opened = || gateway.shared.generation.load(Ordering::Relaxed);
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        assert_eq!(opened(), 1);
        tokio::time::sleep(every + Duration::from_millis(50)).await;
        // Served by the old connection, which starts the refresh.
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        let waited = std::time::Instant::now();
        while opened() < 2 {
            assert!(waited.elapsed() < Duration::from_secs(5), "no refresh happened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let key = "ca:rl:{refresh}";
        let digest = gateway.script_load("return 7", key, Duration::from_secs(2)).await.unwrap();
        assert_eq!(
            gateway.evalsha(&digest, key, &[], Duration::from_secs(2)).await,
            Ok(Value::Int(7))
        );
    }

    #[tokio::test]
    async fn an_unreachable_cluster_is_not_sent_within_the_timeout() {
        // Ports 1 and 2 on loopback: nothing listens, every connect is refused.
        let urls = ["redis://127.0.0.1:1".to_owned(), "redis://127.0.0.1:2".to_owned()];
        let gateway = ClusterGateway::new(
            &urls,
            None,
            None,
            Duration::from_millis(200),
            Duration::from_millis(200),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let key = "ca:rl:{p:1:v1:00}";
        assert_eq!(
            gateway.evalsha("digest", key, &[], Duration::from_millis(300)).await,
            Err(GatewayFailure::NotSent)
        );
        assert_eq!(
            gateway.script_load("return 1", key, Duration::from_millis(300)).await,
            Err(GatewayFailure::NotSent)
        );
        assert_eq!(gateway.ping(Duration::from_millis(300)).await, Err(GatewayFailure::NotSent));
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
