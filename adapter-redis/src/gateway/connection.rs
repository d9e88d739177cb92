//! `LazyConnection`: the one connection mechanism of both gateways.
//!
//! A connection is opened on first use, with one attempt in flight however
//! many callers wait (single flight), and cached with a generation number so
//! a failure on an old connection never throws away its replacement.
//!
//! # When the connection is replaced
//!
//! - At once, when the `redis` crate reports the connection dropped
//!   ([`RedisError::is_connection_dropped`]: broken pipe, reset, EOF, ...).
//!   A standalone multiplexed connection never recovers from that, so every
//!   later call on it would fail the same way.
//! - After [`AMBIGUOUS_FAILURES_BEFORE_RECONNECT`] ambiguous failures in a
//!   row (timeouts, or lost connections the crate does not call dropped).
//!   A blackholed server never closes the socket, so only a run of silence
//!   says the connection is dead; one slow reply does not. The cluster
//!   client also repairs a node's connection by itself, so a single
//!   ambiguous failure is no reason to rebuild it (and re-read the slot map).
//!
//! - At once, when the server answers `READONLY`: it was demoted to a
//!   replica (a Sentinel failover reconfigured it). The connection works but
//!   reaches the wrong node; a new one asks the sentinels (or resolves the
//!   stable address) again.
//! - On the next call after the connector's [`Connect::mark`] moved on: the
//!   connector learnt that its connections reach the wrong node (the
//!   sentinels name another master). One atomic read per call.
//!
//! Any other reply from the server, even an error reply, proves the
//! connection works and ends the run.
//!
//! # While Redis cannot be reached
//!
//! At most one connect attempt is in flight per connection: callers that
//! find one pending wait for it (within their deadline) and share its
//! connection, or fail with it as not sent; they never start one each. The
//! attempt is a task of its own, bounded by the connect timeout alone: a
//! caller with little time left neither cuts it short for the others nor
//! keeps its connection from the next callers.
//! For [`RETRY_CONNECT_AFTER`] after a failed attempt, callers fail at once
//! as not sent (nothing reached Redis, so never an ambiguous failure); the
//! first caller after that starts the next attempt, so the first call after
//! Redis is back connects at most that long later. The back-off ends early
//! when the connector's mark moves (the sentinels name another master).
//! The failing-fast path spends the task's cooperative budget: a caller
//! looping on it still lets the runtime drive the pending connect and the
//! timers (without, such a loop held a worker and hung the runtime).
//! `WARN redis connect failed` / `redis connect timed out` go out at most
//! once per [`CONNECT_WARN_EVERY`] per connection, with `suppressed`, the
//! failed attempts of this outage not logged since the line before;
//! `INFO redis connected again`, with `failed_attempts`, ends an outage.

use std::fmt::{self, Debug};
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};
use shared_contract::LogThrottle;
use tokio::time::Instant;

use super::GatewayFailure;

/// Ambiguous failures in a row (timeouts or lost connections, the ones after
/// which a command may have run) that make the gateway replace its
/// connection.
pub(crate) const AMBIGUOUS_FAILURES_BEFORE_RECONNECT: u32 = 3;

/// How long after a failed connect attempt calls fail at once as not sent
/// rather than start another: short, so the first call after Redis is back
/// still connects promptly, long enough that a down Redis costs a handful
/// of sockets a second, not one per request.
pub(crate) const RETRY_CONNECT_AFTER: Duration = Duration::from_millis(100);

/// The most often one connection logs a failed connect attempt.
pub(crate) const CONNECT_WARN_EVERY: Duration = Duration::from_secs(1);

/// What one connection knows of its failed connect attempts.
#[derive(Debug, Default)]
struct Outage {
    /// Failed attempts ever: a caller that waited for an attempt tells by
    /// it whether that attempt failed.
    failures: u64,
    /// When the latest attempt failed and the connector's mark it was made
    /// under; `None` once an attempt connected.
    latest: Option<(Instant, u64)>,
    /// Failed attempts since the last one that connected.
    in_a_row: u64,
    /// Before when no failure is logged.
    quiet_until: Option<Instant>,
    /// Failures not logged since the last line.
    suppressed: u64,
}

impl Outage {
    /// Whether a call at `now`, under `mark`, fails at once: within
    /// [`RETRY_CONNECT_AFTER`] of a failed attempt under the same mark.
    fn backing_off(&self, now: Instant, mark: u64) -> bool {
        self.latest
            .is_some_and(|(failed, under)| under == mark && now < failed + RETRY_CONNECT_AFTER)
    }

    /// Records an attempt under `mark` that failed at `now`. `Some(failures
    /// held back since the last line)` when this one is to be logged.
    fn failed(&mut self, now: Instant, mark: u64) -> Option<u64> {
        self.failures += 1;
        self.in_a_row += 1;
        self.latest = Some((now, mark));
        if self.quiet_until.is_some_and(|until| now < until) {
            self.suppressed += 1;
            return None;
        }
        self.quiet_until = Some(now + CONNECT_WARN_EVERY);
        Some(std::mem::take(&mut self.suppressed))
    }

    /// Records an attempt that connected: `Some(failed attempts before it)`
    /// when it ends an outage. The attempts held back since the last line
    /// are among those, so the next outage's first line starts from none.
    fn connected(&mut self) -> Option<u64> {
        self.latest = None;
        self.suppressed = 0;
        Some(std::mem::take(&mut self.in_a_row)).filter(|&failed| failed > 0)
    }
}

/// How a gateway opens its kind of connection.
pub(crate) trait Connect: Send + Sync + 'static {
    /// A cheaply cloned handle to one open connection.
    type Connection: Clone + Send + Sync + 'static;

    /// Opens a new connection; the caller bounds the wait.
    fn connect(&self) -> impl Future<Output = RedisResult<Self::Connection>> + Send;

    /// Which lot of connections is current: a connection opened under an
    /// older mark is replaced on its next use. Read on every call, so a
    /// relaxed atomic load at most; constant for most connectors.
    fn mark(&self) -> u64 {
        0
    }

    /// Called once per call that takes a connection, before it does.
    fn used(&self) {}

    /// Called with each connection a gateway's main connection opens
    /// (start-up and every reconnect; not `WAIT` ones, which reach the same
    /// server), to check the server on a task of its own within `timeout`.
    fn opened(&self, _connection: &Self::Connection, _label: &Arc<str>, _timeout: Duration) {}
}

/// One open connection as handed out: clone it, send on it, and report how
/// the command went with its `generation`.
#[derive(Clone)]
pub(crate) struct Opened<T> {
    /// Which connection this is: 1 for the first opened, then counting up.
    pub(crate) generation: u64,
    pub(crate) connection: T,
    pub(crate) opened_at: Instant,
    /// The connector's [`Connect::mark`] before it opened this one.
    mark: u64,
}

/// A connect attempt as its callers share it: the connection it opened, or
/// `None` when it failed.
type Attempt<T> = Shared<BoxFuture<'static, Option<Opened<T>>>>;

/// A lazily opened, cached connection of kind `C`, replaced by the rule in
/// the module documentation.
pub(crate) struct LazyConnection<C: Connect> {
    /// Shared by every connection of one gateway (a pool's too).
    connector: Arc<C>,
    /// Names the topology (and a `WAIT` connection's number) in log lines.
    label: Arc<str>,
    /// Holds `redis keeps timing out or losing the connection` to one a
    /// second: the calls in flight on a failing connection all see the run
    /// of failures and would each log it.
    replacing_logged: LogThrottle,
    connect_timeout: Duration,
    /// Shared with the connect attempt in flight, which outlives the
    /// callers that gave up on it.
    state: Arc<State<C::Connection>>,
}

/// What a connection and its connect attempt in flight share.
struct State<T> {
    current: Mutex<Option<Opened<T>>>,
    /// The connect attempt in flight: a burst makes one, not hundreds.
    pending: Mutex<Option<Attempt<T>>>,
    generation: AtomicU64,
    ambiguous_in_a_row: AtomicU32,
    /// Connect attempts started, ever (tests count them).
    attempts: AtomicU64,
    outage: Mutex<Outage>,
    /// `Some(timeout)` when each new connection is handed to
    /// [`Connect::opened`] (see [`LazyConnection::checking_each_connection`]).
    check: Option<Duration>,
}

impl<C: Connect> Debug for LazyConnection<C> {
    // The connector may hold a password: print none of it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyConnection")
            .field("label", &&*self.label)
            .field("connect_timeout", &self.connect_timeout)
            .field("generation", &self.generation())
            .field("connect_attempts", &self.connect_attempts())
            .finish_non_exhaustive()
    }
}

/// `mutex`'s guard; a panic elsewhere while it was held left nothing
/// half-written here.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<C: Connect> LazyConnection<C> {
    /// Nothing is opened until the first [`Self::get`].
    pub(crate) fn new(connector: Arc<C>, connect_timeout: Duration, label: Arc<str>) -> Self {
        Self {
            connector,
            label,
            replacing_logged: LogThrottle::new(CONNECT_WARN_EVERY),
            connect_timeout,
            state: Arc::new(State {
                current: Mutex::new(None),
                pending: Mutex::new(None),
                generation: AtomicU64::new(0),
                ambiguous_in_a_row: AtomicU32::new(0),
                attempts: AtomicU64::new(0),
                outage: Mutex::new(Outage::default()),
                check: None,
            }),
        }
    }

    /// Like [`Self::new`], handing each connection it opens to
    /// [`Connect::opened`] (within the connect timeout): for a gateway's
    /// main connection only.
    pub(crate) fn checking_each_connection(
        connector: Arc<C>,
        connect_timeout: Duration,
        label: Arc<str>,
    ) -> Self {
        let mut connection = Self::new(connector, connect_timeout, label);
        if let Some(state) = Arc::get_mut(&mut connection.state) {
            state.check = Some(connect_timeout);
        }
        connection
    }

    /// How many connect attempts were started so far.
    pub(crate) fn connect_attempts(&self) -> u64 {
        self.state.attempts.load(Ordering::Relaxed)
    }

    /// How many connections were opened so far.
    pub(crate) fn generation(&self) -> u64 {
        self.state.generation.load(Ordering::Relaxed)
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The topology it connects to, as log lines name it.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The connector every connection of this one is opened by.
    pub(crate) fn connector(&self) -> &Arc<C> {
        &self.connector
    }

    /// The cached connection, unless the connector's mark moved on since it
    /// was opened (then it is dropped here).
    fn cached(&self) -> Option<Opened<C::Connection>> {
        let mark = self.connector.mark();
        let mut current = lock(&self.state.current);
        match &*current {
            Some(held) if held.mark != mark => {
                tracing::warn!(label = &*self.label, "redis connection superseded; replacing it");
                *current = None;
                None
            }
            held => held.clone(),
        }
    }

    /// The cached connection, or the one the connect attempt in flight
    /// opens before `until` (starting that attempt when none is in flight
    /// and no failure is fresh), by the rule of "While Redis cannot be
    /// reached" in the module documentation. Nothing was sent when this
    /// fails.
    pub(crate) async fn get(
        &self,
        until: Instant,
    ) -> Result<Opened<C::Connection>, GatewayFailure> {
        self.connector.used();
        if let Some(cached) = self.cached() {
            return Ok(cached);
        }
        let attempt = {
            let mut pending = lock(&self.state.pending);
            match &*pending {
                Some(attempt) => Some(attempt.clone()),
                None if lock(&self.state.outage)
                    .backing_off(Instant::now(), self.connector.mark()) =>
                {
                    None
                }
                None => {
                    // An attempt may have installed its connection and
                    // ended since the look above.
                    if let Some(cached) = self.cached() {
                        return Ok(cached);
                    }
                    let attempt = self.start();
                    *pending = Some(attempt.clone());
                    Some(attempt)
                }
            }
        };
        let Some(attempt) = attempt else {
            // Nothing else here awaits: without this, a caller looping on
            // the answer never yields (see the module documentation).
            tokio::task::coop::consume_budget().await;
            return Err(GatewayFailure::NotSent);
        };
        match tokio::time::timeout_at(until, attempt).await {
            Ok(Some(opened)) => Ok(opened),
            // The attempt failed (its callers fail with it), or this
            // caller's time ran out first (the attempt goes on for the next).
            Ok(None) | Err(_) => Err(GatewayFailure::NotSent),
        }
    }

    /// Starts the connect attempt every caller shares: a task of its own,
    /// bounded by the connect timeout only, so a caller with little time
    /// left neither cuts it short for the others nor loses its connection
    /// for the next ones. It leaves the pending slot when it ends.
    fn start(&self) -> Attempt<C::Connection> {
        /// Empties the pending slot when the attempt ends, even cancelled
        /// (its runtime shutting down), so the next call can start another.
        struct Ended<T>(Arc<State<T>>);
        impl<T> Drop for Ended<T> {
            fn drop(&mut self) {
                *lock(&self.0.pending) = None;
            }
        }
        let connector = Arc::clone(&self.connector);
        let ended = Ended(Arc::clone(&self.state));
        let label = Arc::clone(&self.label);
        let until = Instant::now() + self.connect_timeout;
        let task = tokio::spawn(async move {
            let opened = ended.0.attempt(&*connector, &label, until).await.ok();
            drop(ended);
            opened
        });
        task.map(|joined| joined.ok().flatten()).boxed().shared()
    }

    /// Opens a new connection before `until` and caches it in place of the
    /// current one, which stays usable for whoever holds it. Outside the
    /// single flight of [`Self::get`]: for a deliberate replacement only.
    pub(crate) async fn open(
        &self,
        until: Instant,
    ) -> Result<Opened<C::Connection>, GatewayFailure> {
        self.state.attempt(&*self.connector, &self.label, until).await
    }
}

impl<T: Clone> State<T> {
    /// One connect attempt by `connector` before `until`: the connection,
    /// installed, or a failure recorded and logged by the rule.
    async fn attempt<C: Connect<Connection = T>>(
        &self,
        connector: &C,
        label: &str,
        until: Instant,
    ) -> Result<Opened<T>, GatewayFailure> {
        // Read before: a mark that moves while connecting may be about this
        // very node, so the new connection must not outlive it.
        let mark = connector.mark();
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let error = match tokio::time::timeout_at(until, connector.connect()).await {
            Ok(Ok(connection)) => {
                if let Some(failed_attempts) = lock(&self.outage).connected() {
                    tracing::info!(label, failed_attempts, "redis connected again");
                }
                if let Some(timeout) = self.check {
                    connector.opened(&connection, &Arc::from(label), timeout);
                }
                return Ok(self.install(connection, mark));
            }
            Ok(Err(error)) => Some(error),
            Err(_) => None,
        };
        let logged = lock(&self.outage).failed(Instant::now(), mark);
        match (logged, error) {
            (Some(suppressed), Some(error)) => {
                tracing::warn!(kind = error.category(), label, suppressed, "redis connect failed");
            }
            (Some(suppressed), None) => {
                tracing::warn!(label, suppressed, "redis connect timed out");
            }
            (None, _) => {}
        }
        Err(GatewayFailure::NotSent)
    }

    fn install(&self, connection: T, mark: u64) -> Opened<T> {
        let opened = Opened {
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
            connection,
            opened_at: Instant::now(),
            mark,
        };
        *lock(&self.current) = Some(opened.clone());
        self.ambiguous_in_a_row.store(0, Ordering::Relaxed);
        opened
    }
}

impl<C: Connect> LazyConnection<C> {
    /// Drops the connection of `generation` (not a newer one) so the next
    /// call reconnects.
    fn discard(&self, generation: u64) {
        let mut current = lock(&self.state.current);
        if current.as_ref().is_some_and(|held| held.generation == generation) {
            *current = None;
        }
    }

    /// The server answered (a reply, or an error reply): the run of
    /// ambiguous failures is over.
    pub(crate) fn answered(&self) {
        self.state.ambiguous_in_a_row.store(0, Ordering::Relaxed);
    }

    /// Records how a command sent on connection `generation` failed, and
    /// replaces the connection when the rule says so. `error` is the
    /// `redis` crate's error, when it gave one (a timeout of our own has
    /// none). Returns `failure`.
    pub(crate) fn failed(
        &self,
        generation: u64,
        failure: GatewayFailure,
        error: Option<&RedisError>,
    ) -> GatewayFailure {
        match failure {
            GatewayFailure::ConnectionLost
                if error.is_some_and(RedisError::is_connection_dropped) =>
            {
                tracing::warn!(label = &*self.label, "redis connection dropped; replacing it");
                self.state.ambiguous_in_a_row.store(0, Ordering::Relaxed);
                self.discard(generation);
            }
            GatewayFailure::Refused
                if error.is_some_and(|error| {
                    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
                }) =>
            {
                tracing::warn!(label = &*self.label, "redis node is a replica now; replacing it");
                self.state.ambiguous_in_a_row.store(0, Ordering::Relaxed);
                self.discard(generation);
            }
            GatewayFailure::TimedOut | GatewayFailure::ConnectionLost => {
                let failures = self.state.ambiguous_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
                if failures >= AMBIGUOUS_FAILURES_BEFORE_RECONNECT {
                    let now = Instant::now().into_std();
                    if let Some(suppressed) = self.replacing_logged.admit(now) {
                        tracing::warn!(
                            failures,
                            label = &*self.label,
                            suppressed,
                            "redis keeps timing out or losing the connection; replacing it"
                        );
                    }
                    self.state.ambiguous_in_a_row.store(0, Ordering::Relaxed);
                    self.discard(generation);
                }
            }
            // The server answered, so the connection works.
            GatewayFailure::Refused
            | GatewayFailure::NoScript
            | GatewayFailure::WrongType
            | GatewayFailure::ScriptError
            | GatewayFailure::UnexpectedReply => self.answered(),
            // Never reached the connection: says nothing about it.
            GatewayFailure::NotSent => {}
        }
        failure
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    use super::*;

    /// Hands out connection numbers after `delay`, counting its connects,
    /// under the mark the test sets.
    #[derive(Debug, Default)]
    struct Counting {
        connects: AtomicUsize,
        delay: Duration,
        mark: AtomicU64,
        /// Every connect is refused (after `delay`) while set.
        refuse: AtomicBool,
        /// A connect moves the mark on while set, as the Sentinel connector
        /// does when the node it reached is another master than before.
        moves_mark: AtomicBool,
    }

    impl Connect for Arc<Counting> {
        type Connection = usize;

        fn connect(&self) -> impl Future<Output = RedisResult<usize>> + Send {
            let counting = Arc::clone(self);
            async move {
                tokio::time::sleep(counting.delay).await;
                if counting.refuse.load(Ordering::Relaxed) {
                    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                    return Err(RedisError::from(refused));
                }
                if counting.moves_mark.swap(false, Ordering::Relaxed) {
                    counting.mark.fetch_add(1, Ordering::Relaxed);
                }
                Ok(counting.connects.fetch_add(1, Ordering::Relaxed) + 1)
            }
        }

        fn mark(&self) -> u64 {
            self.mark.load(Ordering::Relaxed)
        }
    }

    fn lazy(delay: Duration) -> (LazyConnection<Arc<Counting>>, Arc<Counting>) {
        let counting = Arc::new(Counting { delay, ..Counting::default() });
        let connector = Arc::new(Arc::clone(&counting));
        (LazyConnection::new(connector, Duration::from_secs(1), "test".into()), counting)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(1)
    }

    fn dropped() -> RedisError {
        RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_connect() {
        let (lazy, counting) = lazy(Duration::from_millis(50));
        let lazy = Arc::new(lazy);
        let callers: Vec<_> = (0..32)
            .map(|_| {
                let lazy = Arc::clone(&lazy);
                tokio::spawn(async move { lazy.get(soon()).await.map(|held| held.generation) })
            })
            .collect();
        for caller in callers {
            assert_eq!(caller.await.unwrap(), Ok(1));
        }
        assert_eq!(counting.connects.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn replaced_after_the_ambiguous_failures_in_a_row_and_not_before() {
        let (lazy, counting) = lazy(Duration::ZERO);
        let first = lazy.get(soon()).await.unwrap();
        for _ in 1..AMBIGUOUS_FAILURES_BEFORE_RECONNECT {
            lazy.failed(first.generation, GatewayFailure::TimedOut, None);
            assert_eq!(lazy.get(soon()).await.unwrap().generation, first.generation);
        }
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        lazy.failed(first.generation, GatewayFailure::ConnectionLost, Some(&reset));
        assert_eq!(lazy.get(soon()).await.unwrap().generation, first.generation + 1);
        assert_eq!(counting.connects.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn an_answer_ends_the_run() {
        let (lazy, _) = lazy(Duration::ZERO);
        let held = lazy.get(soon()).await.unwrap();
        for round in 0..3 {
            for _ in 1..AMBIGUOUS_FAILURES_BEFORE_RECONNECT {
                lazy.failed(held.generation, GatewayFailure::TimedOut, None);
            }
            match round {
                0 => lazy.answered(),
                1 => _ = lazy.failed(held.generation, GatewayFailure::Refused, None),
                _ => _ = lazy.failed(held.generation, GatewayFailure::UnexpectedReply, None),
            }
        }
        assert_eq!(lazy.get(soon()).await.unwrap().generation, held.generation);
    }

    #[tokio::test]
    async fn a_dropped_connection_is_replaced_at_once() {
        let (lazy, _) = lazy(Duration::ZERO);
        let held = lazy.get(soon()).await.unwrap();
        lazy.failed(held.generation, GatewayFailure::ConnectionLost, Some(&dropped()));
        assert_eq!(lazy.get(soon()).await.unwrap().generation, held.generation + 1);
    }

    #[tokio::test]
    async fn a_demoted_node_is_replaced_at_once_and_other_refusals_keep_it() {
        let (lazy, _) = lazy(Duration::ZERO);
        let held = lazy.get(soon()).await.unwrap();
        let wire = "-NOPERM this user has no permissions\r\n";
        let noperm =
            redis::parse_redis_value(wire.as_bytes()).unwrap().extract_error().unwrap_err();
        lazy.failed(held.generation, GatewayFailure::Refused, Some(&noperm));
        assert_eq!(lazy.get(soon()).await.unwrap().generation, held.generation);
        let wire = "-READONLY You can't write against a read only replica.\r\n";
        let readonly =
            redis::parse_redis_value(wire.as_bytes()).unwrap().extract_error().unwrap_err();
        lazy.failed(held.generation, GatewayFailure::Refused, Some(&readonly));
        assert_eq!(lazy.get(soon()).await.unwrap().generation, held.generation + 1);
    }

    #[tokio::test]
    async fn a_failure_on_an_old_connection_keeps_its_replacement() {
        let (lazy, _) = lazy(Duration::ZERO);
        let old = lazy.get(soon()).await.unwrap();
        lazy.failed(old.generation, GatewayFailure::ConnectionLost, Some(&dropped()));
        let new = lazy.get(soon()).await.unwrap();
        lazy.failed(old.generation, GatewayFailure::ConnectionLost, Some(&dropped()));
        assert_eq!(lazy.get(soon()).await.unwrap().generation, new.generation);
    }

    #[tokio::test]
    async fn a_connection_under_an_older_mark_is_replaced_on_its_next_use() {
        let (lazy, counting) = lazy(Duration::ZERO);
        let held = lazy.get(soon()).await.unwrap();
        assert_eq!(lazy.get(soon()).await.unwrap().generation, held.generation);
        counting.mark.store(1, Ordering::Relaxed);
        let replaced = lazy.get(soon()).await.unwrap();
        assert_eq!(replaced.generation, held.generation + 1);
        assert_eq!(lazy.get(soon()).await.unwrap().generation, replaced.generation);
    }

    #[tokio::test]
    async fn a_connect_past_the_deadline_was_never_sent() {
        let (lazy, _) = lazy(Duration::from_secs(5));
        let until = Instant::now() + Duration::from_millis(50);
        assert_eq!(lazy.get(until).await.map(|held| held.generation), Err(GatewayFailure::NotSent));
        assert_eq!(lazy.generation(), 0);
    }

    /// `n` callers of `get` at once, each with a second to spare: the
    /// generation each got, `None` for not sent.
    async fn burst(lazy: &Arc<LazyConnection<Arc<Counting>>>, n: usize) -> Vec<Option<u64>> {
        let callers: Vec<_> = (0..n)
            .map(|_| {
                let lazy = Arc::clone(lazy);
                tokio::spawn(async move { lazy.get(soon()).await.ok().map(|held| held.generation) })
            })
            .collect();
        let mut generations = Vec::new();
        for caller in callers {
            generations.push(caller.await.unwrap());
        }
        generations
    }

    #[tokio::test]
    async fn the_callers_waiting_for_a_failed_connect_fail_with_it() {
        let (lazy, counting) = lazy(Duration::from_millis(50));
        counting.refuse.store(true, Ordering::Relaxed);
        let lazy = Arc::new(lazy);
        assert_eq!(burst(&lazy, 16).await, [None; 16]);
        assert_eq!(lazy.connect_attempts(), 1, "one attempt for the burst, not one per caller");
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_failed_connect_calls_fail_at_once_until_the_back_off_ends() {
        let (lazy, counting) = lazy(Duration::ZERO);
        counting.refuse.store(true, Ordering::Relaxed);
        assert_eq!(
            lazy.get(soon()).await.map(|held| held.generation),
            Err(GatewayFailure::NotSent)
        );
        assert_eq!(lazy.connect_attempts(), 1);
        tokio::time::advance(RETRY_CONNECT_AFTER - Duration::from_millis(1)).await;
        for _ in 0..100 {
            assert_eq!(lazy.get(soon()).await.map(|_| ()), Err(GatewayFailure::NotSent));
        }
        assert_eq!(lazy.connect_attempts(), 1, "no attempt within the back-off");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(lazy.get(soon()).await.map(|_| ()), Err(GatewayFailure::NotSent));
        assert_eq!(lazy.connect_attempts(), 2, "the first call after it tries again");
        // Redis is back: the first call after the back-off connects.
        counting.refuse.store(false, Ordering::Relaxed);
        tokio::time::advance(RETRY_CONNECT_AFTER).await;
        assert_eq!(lazy.get(soon()).await.unwrap().generation, 1);
        assert_eq!(lazy.connect_attempts(), 3);
        // Connected: a dropped connection is replaced by the very next call.
        lazy.failed(1, GatewayFailure::ConnectionLost, Some(&dropped()));
        assert_eq!(lazy.get(soon()).await.unwrap().generation, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_moved_mark_ends_the_back_off() {
        let (lazy, counting) = lazy(Duration::ZERO);
        counting.refuse.store(true, Ordering::Relaxed);
        assert!(lazy.get(soon()).await.is_err());
        counting.refuse.store(false, Ordering::Relaxed);
        assert!(lazy.get(soon()).await.is_err(), "backing off");
        // The sentinels name another master: worth trying at once.
        counting.mark.fetch_add(1, Ordering::Relaxed);
        assert_eq!(lazy.get(soon()).await.unwrap().generation, 1);
        assert_eq!(lazy.connect_attempts(), 2);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_caller_looping_on_a_refused_call_lets_other_tasks_run() {
        let (lazy, counting) = lazy(Duration::ZERO);
        counting.refuse.store(true, Ordering::Relaxed);
        assert!(lazy.get(soon()).await.is_err());
        let ran = Arc::new(AtomicBool::new(false));
        let other = Arc::clone(&ran);
        let _other = tokio::spawn(async move { other.store(true, Ordering::Relaxed) });
        // Paused time stands still: every call is within the back-off and
        // fails at once. The other task only runs if this loop yields.
        for _ in 0..1_000 {
            assert!(lazy.get(soon()).await.is_err());
        }
        assert!(ran.load(Ordering::Relaxed), "the loop never let the runtime run another task");
        assert_eq!(lazy.connect_attempts(), 1);
    }

    #[tokio::test]
    async fn a_connect_that_moves_the_mark_serves_its_waiters_and_is_replaced_once() {
        // The Sentinel connector moves the mark when it reaches another
        // master than before: the connection it made reaches the right
        // node, so every caller that waited for it gets it, and the next
        // call (seeing it under an older mark) opens one more, once.
        let (lazy, counting) = lazy(Duration::from_millis(50));
        counting.moves_mark.store(true, Ordering::Relaxed);
        let lazy = Arc::new(lazy);
        assert_eq!(burst(&lazy, 8).await, [Some(1); 8]);
        assert_eq!(burst(&lazy, 8).await, [Some(2); 8]);
        assert_eq!(lazy.connect_attempts(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connect_outlives_a_caller_that_gives_up_and_serves_the_next() {
        let (lazy, counting) = lazy(Duration::from_millis(50));
        // This caller's time runs out first: not sent, but the attempt goes
        // on (bounded by the connect timeout only), not cut short for all.
        let hurried = Instant::now() + Duration::from_millis(10);
        assert_eq!(lazy.get(hurried).await.map(|_| ()), Err(GatewayFailure::NotSent));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(lazy.get(soon()).await.unwrap().generation, 1, "the attempt's connection");
        assert_eq!(lazy.connect_attempts(), 1);
        assert_eq!(counting.connects.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn failed_connects_are_logged_once_a_second_with_the_count_held_back() {
        let origin = Instant::now();
        let at = |millis| origin + Duration::from_millis(millis);
        let mut outage = Outage::default();
        assert_eq!(outage.failed(at(0), 0), Some(0));
        for millis in [1, 10, 500, 999] {
            assert_eq!(outage.failed(at(millis), 0), None);
        }
        assert_eq!(outage.failed(at(1_000), 0), Some(4));
        assert_eq!(outage.failed(at(1_500), 0), None);
        assert_eq!(outage.connected(), Some(7), "one line when connected again");
        assert_eq!(outage.connected(), None, "and only one");
        assert_eq!(outage.failed(at(60_000), 0), Some(0));
        assert_eq!(outage.failures, 8);
    }

    /// Counts the events whose message is `message`.
    struct LinesOf {
        message: &'static str,
        seen: Arc<AtomicUsize>,
    }

    struct MessageIs<'a>(&'static str, &'a mut bool);

    impl tracing::field::Visit for MessageIs<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn Debug) {
            if field.name() == "message" && format!("{value:?}") == self.0 {
                *self.1 = true;
            }
        }
    }

    impl tracing::Subscriber for LinesOf {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut matches = false;
            event.record(&mut MessageIs(self.message, &mut matches));
            if matches {
                self.seen.fetch_add(1, Ordering::Relaxed);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// The calls in flight on a failing connection all fail: the
    /// replacement is logged once a second, not once per run of
    /// [`AMBIGUOUS_FAILURES_BEFORE_RECONNECT`] failures.
    #[test]
    fn replacing_a_failing_connection_is_logged_once_a_second() {
        let seen = Arc::new(AtomicUsize::new(0));
        let message = "redis keeps timing out or losing the connection; replacing it";
        let subscriber = LinesOf { message, seen: Arc::clone(&seen) };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        tracing::subscriber::with_default(subscriber, || {
            runtime.block_on(async {
                let (lazy, _) = lazy(Duration::ZERO);
                let held = lazy.get(soon()).await.unwrap();
                for _ in 0..4 * AMBIGUOUS_FAILURES_BEFORE_RECONNECT {
                    lazy.failed(held.generation, GatewayFailure::TimedOut, None);
                }
            });
        });
        assert_eq!(seen.load(Ordering::Relaxed), 1);
    }

    /// The attempts held back at the end of one outage are counted in its
    /// `failed_attempts`; the next outage's first line starts from none.
    #[test]
    fn connecting_clears_the_count_held_back() {
        let origin = Instant::now();
        let at = |millis| origin + Duration::from_millis(millis);
        let mut outage = Outage::default();
        assert_eq!(outage.failed(at(0), 0), Some(0));
        assert_eq!(outage.failed(at(200), 0), None);
        assert_eq!(outage.failed(at(400), 0), None);
        assert_eq!(outage.connected(), Some(3));
        assert_eq!(outage.failed(at(5_000), 0), Some(0), "no tail of the outage before");
    }
}
