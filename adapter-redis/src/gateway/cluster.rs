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
//! after every `MOVED` and reconnects dropped nodes. Because nothing tells
//! it that slots moved when no command hits a `MOVED`, the gateway also
//! builds a new cluster connection (and so reads the slot map afresh) in
//! the background on the first call after the current one has been open
//! [`SLOT_MAP_REFRESH`]; an idle gateway refreshes nothing.
//!
//! In `WAIT` mode the charges go on their own `wait-connections` cluster
//! connections, one call per master at a time on each (`pool` says why):
//! the gateway reads which master serves each slot (`CLUSTER SLOTS`, in the
//! background, again once that is [`SLOT_MAP_REFRESH`] old) and keeps one
//! set of turns per master, so a master whose replica is gone holds its own
//! connections only. Until the first read, and for slots no master serves,
//! one shared set of turns stands in; a stale read only misplaces turns,
//! never a command (commands are routed by slot as always).

use std::collections::HashMap;
use std::fmt::{self, Debug};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};
use tokio::time::Instant;

use super::connection::{Connect, LazyConnection, Opened};
use super::pool::{Turns, WaitPool, patience};
use super::{
    Acknowledged, GatewayFailure, LoadedScript, RedisGateway, WaitFor, acknowledged_of, classify,
    digest_of, evalsha_command, log_error_reply, pong, script_load_command, wait_command,
};

/// How long a cluster connection (and its slot map) may serve before the
/// first call after that builds a new one in the background.
pub(crate) const SLOT_MAP_REFRESH: Duration = Duration::from_secs(30);

/// First and longest pause between two attempts that were refused unrun.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// The gateway of a Redis Cluster: one cluster connection (a multiplexed
/// connection per node), opened lazily, replaced by the rule of the
/// `connection` module and, in the background, on the first call after it
/// is [`SLOT_MAP_REFRESH`] old.
pub(crate) struct ClusterGateway {
    shared: Arc<Shared>,
    slot_map_refresh: Duration,
}

/// What the background refresh needs too.
struct Shared {
    connection: LazyConnection<Cluster>,
    /// One background refresh at a time.
    refreshing: AtomicBool,
    /// `WAIT` mode's connections and turns, when `wait-replicas` > 0.
    waiting: Option<Waiting>,
}

/// `WAIT` mode's cluster connections, with one set of turns per master.
struct Waiting {
    pool: WaitPool<Cluster>,
    masters: RwLock<Arc<Masters>>,
    /// One background read of the masters at a time.
    reading: AtomicBool,
    /// When the next read is due: [`SLOT_MAP_REFRESH`] after one that
    /// worked, [`REREAD_AFTER_FAILURE`] after one that did not.
    next_read: Mutex<Option<Instant>>,
}

/// How soon a failed read of the masters is tried again.
const REREAD_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Which master serves each slot, as `CLUSTER SLOTS` said, and the turns on
/// the pool's connections per master.
struct Masters {
    /// Per slot, an index into `turns`.
    owner: Box<[u16]>,
    /// One per master, then the shared one for slots none serves.
    turns: Box<[Turns]>,
}

/// Slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// Opens cluster connections from the seed nodes.
struct Cluster(ClusterClient);

impl Connect for Cluster {
    type Connection = ClusterConnection;

    fn connect(&self) -> impl Future<Output = RedisResult<ClusterConnection>> + Send {
        self.0.get_async_connection()
    }

    /// `INFO` goes to every master: each one's policy is read.
    fn opened(&self, connection: &ClusterConnection, label: &Arc<str>, timeout: Duration) {
        crate::eviction::check(connection.clone(), Arc::clone(label), timeout);
    }
}

impl Debug for ClusterGateway {
    // The client holds the password: print none of it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterGateway")
            .field("connect_timeout", &self.shared.connection.connect_timeout())
            .field("generation", &self.shared.connection.generation())
            .field("slot_map_refresh", &self.slot_map_refresh)
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
    pub(crate) fn new(
        urls: &[String],
        username: Option<&str>,
        password: Option<&str>,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Result<Self, RedisError> {
        // What the client does per node once built is its own: with a
        // shard's master dead, each request to its slots refreshes the slot
        // map and reconnects to the dead node, logging at WARN under the
        // target `redis::cluster_handling`. Nothing here bounds that:
        // `retries(0)` already, and `max_connection_attempts` bounds only
        // the client's background reconnect loop (docs/operations.md says
        // how to quiet the lines).
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
        let connection = LazyConnection::checking_each_connection(
            Arc::new(Cluster(builder.build()?)),
            connect_timeout,
            "cluster".into(),
        );
        Ok(Self {
            shared: Arc::new(Shared {
                connection,
                refreshing: AtomicBool::new(false),
                waiting: None,
            }),
            slot_map_refresh: SLOT_MAP_REFRESH,
        })
    }

    /// Sends [`RedisGateway::evalsha_then_wait`] on `size` cluster
    /// connections of their own, one call per master at a time on each.
    pub(crate) fn with_wait_connections(mut self, size: usize) -> Self {
        let connection = &self.shared.connection;
        let pool =
            WaitPool::new(connection.connector(), size, connection.connect_timeout(), "cluster");
        let masters = RwLock::new(Arc::new(Masters::unknown(pool.size())));
        let waiting =
            Waiting { pool, masters, reading: AtomicBool::new(false), next_read: Mutex::new(None) };
        // Only just built: nothing else holds the shared part yet.
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.waiting = Some(waiting);
        }
        self
    }

    /// Replaces the default [`SLOT_MAP_REFRESH`] age (30 s) after which the
    /// next call starts building a new cluster connection, with a freshly
    /// read slot map, in the background.
    #[cfg(test)]
    fn with_slot_map_refresh(mut self, every: Duration) -> Self {
        self.slot_map_refresh = every;
        self
    }

    async fn connection(
        &self,
        until: Instant,
    ) -> Result<Opened<ClusterConnection>, GatewayFailure> {
        let opened = self.shared.connection.get(until).await?;
        if opened.opened_at.elapsed() >= self.slot_map_refresh {
            self.shared.refresh_in_background();
        }
        Ok(opened)
    }

    /// Sends `cmd` along `routing` (the master of a key's slot), following
    /// `MOVED`/`ASK` and waiting out unrun refusals until `timeout` is spent.
    /// `script` is the source behind an `EVALSHA`: an `ASK` target (a node
    /// importing the slot) may never have seen it, so it is loaded there in
    /// the same pipeline. With `wait`, `WAIT` follows `cmd` in one pipeline
    /// to the same node, and the reply is the array of both replies.
    async fn query(
        &self,
        cmd: &redis::Cmd,
        routing: RoutingInfo,
        script: Option<&'static str>,
        wait: Option<WaitFor>,
        timeout: Duration,
    ) -> Result<Value, GatewayFailure> {
        self.query_on(None, cmd, routing, script, wait, timeout).await
    }

    /// [`Self::query`] on `pooled` (a `WAIT` connection), or on the
    /// gateway's own connection when `None`.
    async fn query_on(
        &self,
        pooled: Option<&LazyConnection<Cluster>>,
        cmd: &redis::Cmd,
        routing: RoutingInfo,
        script: Option<&'static str>,
        wait: Option<WaitFor>,
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
            let opened = match pooled {
                Some(lazy) => lazy.get(until).await?,
                None => self.connection(until).await?,
            };
            let mut connection = opened.connection.clone();
            let attempt = async {
                let ask = ask.take();
                let route = match (&ask, &routing) {
                    (None, _) if wait.is_none() => {
                        return connection.route_command(cmd.clone(), routing.clone()).await;
                    }
                    (Some((host, port)), _) => {
                        SingleNodeRoutingInfo::ByAddress { host: host.clone(), port: *port }
                    }
                    (None, RoutingInfo::SingleNode(node)) => node.clone(),
                    // A foreign enum that may grow: only a single node is ours.
                    (None, _) => {
                        return Err(RedisError::from((
                            ErrorKind::InvalidClientConfig,
                            "WAIT follows a command to one node only",
                        )));
                    }
                };
                let mut pipeline = redis::pipe();
                if ask.is_some() {
                    // ASKING holds for the next command on the same
                    // connection only, so both go as one pipeline.
                    if let Some(source) = script {
                        pipeline.add_command(script_load_command(source));
                    }
                    pipeline.add_command(redis::cmd("ASKING"));
                }
                pipeline.add_command(cmd.clone());
                if let Some(wait) = wait {
                    pipeline.add_command(wait_command(wait));
                }
                let count = if wait.is_some() { 2 } else { 1 };
                let skip = pipeline.len() - count;
                let mut replies = connection.route_pipeline(pipeline, skip, count, route).await?;
                match wait {
                    None => Ok(replies.pop().unwrap_or(Value::Nil)),
                    // The script's error stays first, where the caller looks.
                    Some(_) => match replies.first() {
                        Some(Value::ServerError(_)) => Ok(replies.swap_remove(0)),
                        _ => Ok(Value::Array(replies)),
                    },
                }
            };
            let lazy = pooled.unwrap_or(&self.shared.connection);
            let result = match tokio::time::timeout_at(until, attempt).await {
                Ok(result) => result.and_then(server_error_as_err),
                Err(_) => {
                    return Err(lazy.failed(opened.generation, GatewayFailure::TimedOut, None));
                }
            };
            let error = match result {
                Ok(value) => {
                    lazy.answered();
                    return Ok(value);
                }
                Err(error) => error,
            };
            match next_step(&error) {
                Next::Stop(failure) => {
                    if failure != GatewayFailure::NoScript {
                        log_error_reply(&error, "redis cluster error");
                    }
                    return Err(lazy.failed(opened.generation, failure, Some(&error)));
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
}

impl Shared {
    /// Builds a new cluster connection (a fresh slot map) in a background
    /// task and swaps it in; the old one serves until then. One at a time.
    fn refresh_in_background(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let until = Instant::now() + shared.connection.connect_timeout();
            // On failure the old connection stays (the failure is logged);
            // the next call past the age tries again.
            let _kept_old = shared.connection.open(until).await;
            shared.refreshing.store(false, Ordering::Release);
        });
    }
}

impl Waiting {
    /// The masters as last read; starts a background read when one is due
    /// (on first use, then [`SLOT_MAP_REFRESH`] after the last that worked).
    fn masters(&self, shared: &Arc<Shared>) -> Arc<Masters> {
        let masters =
            Arc::clone(&self.masters.read().unwrap_or_else(|poisoned| poisoned.into_inner()));
        let due = self
            .next_read
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_none_or(|at| Instant::now() >= at);
        if due && !self.reading.swap(true, Ordering::AcqRel) {
            let shared = Arc::clone(shared);
            tokio::spawn(async move {
                let Some(waiting) = &shared.waiting else { return };
                let until = Instant::now() + shared.connection.connect_timeout();
                let size = waiting.pool.size();
                let read = read_masters(&shared.connection, size, until).await;
                // On failure the old read (or the shared turns) stays.
                let pause = if read.is_some() { SLOT_MAP_REFRESH } else { REREAD_AFTER_FAILURE };
                if let Some(read) = read {
                    *waiting.masters.write().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                        Arc::new(read);
                }
                *waiting.next_read.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some(Instant::now() + pause);
                waiting.reading.store(false, Ordering::Release);
            });
        }
        masters
    }
}

/// `CLUSTER SLOTS` from any node, as [`Masters`] with `size` turns each.
async fn read_masters(
    connection: &LazyConnection<Cluster>,
    size: usize,
    until: Instant,
) -> Option<Masters> {
    let opened = connection.get(until).await.ok()?;
    let mut cluster = opened.connection.clone();
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
    match tokio::time::timeout_at(until, cluster.route_command(cmd, routing)).await.ok()? {
        Ok(reply) => Masters::of_slots(&reply, size),
        Err(error) => {
            tracing::warn!(
                kind = error.category(),
                code = error.code(),
                "redis CLUSTER SLOTS failed"
            );
            None
        }
    }
}

impl Masters {
    /// Before any read: one shared set of turns for every slot.
    fn unknown(size: usize) -> Self {
        Self { owner: vec![0; SLOTS].into(), turns: Box::new([Turns::new(size)]) }
    }

    /// A `CLUSTER SLOTS` reply: `[start, end, [host, port, ...], replicas...]`
    /// per range; the first node of a range is its master.
    fn of_slots(reply: &Value, size: usize) -> Option<Self> {
        let Value::Array(ranges) = reply else { return None };
        let mut masters: HashMap<(Vec<u8>, i64), u16> = HashMap::new();
        let mut owner = vec![u16::MAX; SLOTS];
        for range in ranges {
            let Value::Array(fields) = range else { return None };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(node))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let host = match node.first() {
                Some(Value::BulkString(host)) => host.clone(),
                Some(Value::SimpleString(host)) => host.clone().into_bytes(),
                _ => return None,
            };
            let Some(Value::Int(port)) = node.get(1) else { return None };
            let next = u16::try_from(masters.len()).ok()?;
            let index = *masters.entry((host, *port)).or_insert(next);
            let start = usize::try_from(*start).ok()?;
            let end = usize::try_from(*end).ok()?.min(SLOTS - 1);
            for slot in owner.get_mut(start..=end)? {
                *slot = index;
            }
        }
        // Slots no master serves share the last set of turns.
        let unserved = u16::try_from(masters.len()).ok()?;
        for slot in &mut owner {
            if *slot == u16::MAX {
                *slot = unserved;
            }
        }
        let turns = (0..=masters.len()).map(|_| Turns::new(size)).collect();
        Some(Self { owner: owner.into(), turns })
    }

    /// The turns of the master that serves `key`'s slot.
    fn turns_of(&self, key: &str) -> &Turns {
        let owner = self.owner.get(usize::from(key_slot(key.as_bytes()))).copied().unwrap_or(0);
        self.turns.get(usize::from(owner)).unwrap_or(&self.turns[0])
    }
}

/// The slot of `key`: CRC16 (XMODEM) of its `{...}` hash tag, or of the
/// whole key when it has none, modulo 16,384 (the client's own rule; its
/// slot type does not give the number out).
fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&byte| byte == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter().position(|&byte| byte == b'}').map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    // 16,384 is a power of two.
    crc & 0x3fff
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
        digest_of(
            self.query(&script_load_command(source), route_of(key), None, None, timeout).await?,
        )
    }

    async fn evalsha(
        &self,
        script: &LoadedScript,
        keys: &[String],
        args: &[Arc<[u8]>],
        timeout: Duration,
    ) -> Result<Value, GatewayFailure> {
        let cmd = evalsha_command(&script.digest, keys, args);
        // One hash tag for every key of the call: the first names the slot.
        let key = keys.first().map_or("", String::as_str);
        self.query(&cmd, route_of(key), Some(script.source), None, timeout).await
    }

    /// `EVALSHA` and `WAIT` as one pipeline to the master of the key's
    /// slot (so `WAIT` runs on the connection that ran the script), with the
    /// same redirects and retries as [`Self::evalsha`].
    async fn evalsha_then_wait(
        &self,
        script: &LoadedScript,
        keys: &[String],
        args: &[Arc<[u8]>],
        wait: WaitFor,
        timeout: Duration,
    ) -> Result<Acknowledged, GatewayFailure> {
        let cmd = evalsha_command(&script.digest, keys, args);
        let key = keys.first().map_or("", String::as_str);
        let (route, source) = (route_of(key), Some(script.source));
        let reply = match &self.shared.waiting {
            None => self.query(&cmd, route, source, Some(wait), timeout).await?,
            Some(waiting) => {
                // As on one server (`pool`): a turn within the wait's own
                // timeout, which the time taken to get it comes off.
                let started = Instant::now();
                let patient = started + Duration::from_millis(wait.timeout_ms);
                let masters = waiting.masters(&self.shared);
                let Some(turn) = masters.turns_of(key).take(patient.min(started + timeout)).await
                else {
                    tracing::debug!("no WAIT connection came free within wait-timeout");
                    return Err(GatewayFailure::NotSent);
                };
                let now = Instant::now();
                let Some(wait) = patience(wait, started, now) else {
                    return Err(GatewayFailure::NotSent);
                };
                let pooled = waiting.pool.connection(turn.index);
                let left = timeout.saturating_sub(now - started);
                self.query_on(Some(pooled), &cmd, route, source, Some(wait), left).await?
            }
        };
        match reply {
            Value::Array(mut replies) if replies.len() == 2 => {
                let wait = replies.pop().unwrap_or(Value::Nil);
                let evalsha = replies.pop().unwrap_or(Value::Nil);
                // A script error was already taken out by `query`.
                acknowledged_of(evalsha, wait).map_err(|error| classify(&error))
            }
            // Two replies were asked for; anything else is unreadable, and
            // the script may have run.
            _ => Err(GatewayFailure::UnexpectedReply),
        }
    }

    /// Ready when at least one master answers `PING`: with
    /// `cluster-require-full-coverage no` one shard's failover must not take
    /// every instance out of rotation.
    async fn ping(&self, timeout: Duration) -> Result<(), GatewayFailure> {
        let until = Instant::now() + timeout;
        let opened = self.connection(until).await?;
        let mut connection = opened.connection.clone();
        let routing = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::OneSucceeded),
        ));
        let lazy = &self.shared.connection;
        let failure = match tokio::time::timeout_at(
            until,
            connection.route_command(redis::cmd("PING"), routing),
        )
        .await
        {
            // The aggregated answer of several masters may come back as OK.
            Ok(Ok(Value::Okay)) => Ok(()),
            Ok(Ok(reply)) => pong(&reply).map_err(|failure| (failure, None)),
            Ok(Err(error)) => Err((classify(&error), Some(error))),
            Err(_) => Err((GatewayFailure::TimedOut, None)),
        };
        match failure {
            Ok(()) => {
                lazy.answered();
                Ok(())
            }
            Err((failure, error)) => Err(lazy.failed(opened.generation, failure, error.as_ref())),
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
    fn a_key_s_slot_is_the_one_the_client_routes_it_to() {
        use redis::cluster_routing::Slot;
        for key in ["ca:rl:{v1:00}:p:1", "foo", "{}x", "a{b}c{d}", "{user1000}.following", ""] {
            assert_eq!(Slot::new(key_slot(key.as_bytes())), Some(Slot::for_key(key)), "{key}");
        }
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"{user1000}.followers"));
    }

    #[test]
    fn each_master_has_its_own_turns_and_unserved_slots_share_one() {
        let node =
            |port| Value::Array(vec![Value::BulkString(b"127.0.0.1".to_vec()), Value::Int(port)]);
        let range = |start, end, port| {
            Value::Array(vec![Value::Int(start), Value::Int(end), node(port), node(port + 3)])
        };
        let reply = Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
            range(10923, 16000, 7002),
            range(16001, 16100, 7000),
        ]);
        let masters = Masters::of_slots(&reply, 8).unwrap();
        assert_eq!(masters.turns.len(), 4);
        assert_eq!(masters.owner[0], 0);
        assert_eq!(masters.owner[5461], 1);
        assert_eq!(masters.owner[16000], 2);
        assert_eq!(masters.owner[16050], 0);
        assert_eq!(masters.owner[16383], 3, "served by none");
        assert!(Masters::of_slots(&Value::Int(1), 8).is_none());
        let key = "ca:rl:{v1:00}:p:1";
        let owner = masters.owner[usize::from(key_slot(key.as_bytes()))];
        assert!(std::ptr::eq(masters.turns_of(key), &masters.turns[usize::from(owner)]));
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_first_call_past_the_age_refreshes_the_slot_map_in_the_background() {
        let cluster = tokio::task::block_in_place(redis_fixture::RedisCluster::start);
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
        let opened = || gateway.shared.connection.generation();
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        assert_eq!(opened(), 1);
        tokio::time::sleep(every + Duration::from_millis(50)).await;
        assert_eq!(opened(), 1, "an idle gateway refreshes nothing");
        // Served by the old connection, which starts the refresh.
        gateway.ping(Duration::from_secs(2)).await.unwrap();
        let waited = std::time::Instant::now();
        while opened() < 2 {
            assert!(waited.elapsed() < Duration::from_secs(5), "no refresh happened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let key = "ca:rl:{refresh}:p:1";
        let source = "return 7";
        let digest = gateway.script_load(source, key, Duration::from_secs(2)).await.unwrap();
        let script = LoadedScript { digest: digest.into(), source };
        assert_eq!(
            gateway.evalsha(&script, &[key.to_owned()], &[], Duration::from_secs(2)).await,
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
        let key = "ca:rl:{v1:00}:p:1";
        let script = LoadedScript { digest: "digest".into(), source: "return 1" };
        assert_eq!(
            gateway.evalsha(&script, &[key.to_owned()], &[], Duration::from_millis(300)).await,
            Err(GatewayFailure::NotSent)
        );
        assert_eq!(
            gateway.script_load("return 1", key, Duration::from_millis(300)).await,
            Err(GatewayFailure::NotSent)
        );
        assert_eq!(gateway.ping(Duration::from_millis(300)).await, Err(GatewayFailure::NotSent));
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_no_node_reachable_a_burst_of_calls_makes_one_connect_attempt() {
        let urls = ["redis://127.0.0.1:1".to_owned(), "redis://127.0.0.1:2".to_owned()];
        let gateway = Arc::new(
            ClusterGateway::new(
                &urls,
                None,
                None,
                Duration::from_secs(1),
                Duration::from_millis(200),
            )
            .unwrap(),
        );
        let pings = super::super::tests::pings_at_once(&gateway, 16, Duration::from_secs(2)).await;
        assert_eq!(pings, [Err(GatewayFailure::NotSent); 16]);
        assert_eq!(gateway.shared.connection.connect_attempts(), 1, "not one per caller");
    }
}
