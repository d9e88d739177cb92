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
//! At most one connect attempt is in flight. Callers that arrive while it
//! is pending wait for it only while Redis has not failed a connect since
//! it last connected (a first connect, a replacement): they share its
//! connection. Once a connect has failed, a caller finding an attempt
//! pending fails at once as not sent, and a caller whose awaited attempt
//! failed does not start another: a down or frozen Redis costs one socket
//! at a time, not one per request. Nothing waits between attempts, so the
//! first call after Redis is back connects. The connect-failure `WARN`
//! lines are at most one per [`CONNECT_WARN_EVERY`], each with how many
//! were `suppressed` since the one before.

use std::fmt::{self, Debug};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};
use tokio::time::Instant;

use super::GatewayFailure;

/// Ambiguous failures in a row (timeouts or lost connections, the ones after
/// which a command may have run) that make the gateway replace its
/// connection.
pub(crate) const AMBIGUOUS_FAILURES_BEFORE_RECONNECT: u32 = 3;

/// The most often a connection logs a failed connect attempt.
pub(crate) const CONNECT_WARN_EVERY: Duration = Duration::from_secs(1);

/// Lets one log line through per [`CONNECT_WARN_EVERY`] and counts the
/// ones it holds back.
struct Throttle {
    origin: Instant,
    /// Milliseconds from `origin` before which no line goes out.
    next: AtomicU64,
    suppressed: AtomicU64,
}

impl Throttle {
    fn new(origin: Instant) -> Self {
        Self { origin, next: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(lines held back since the last one)` when a line may go out
    /// at `now`, else `None` (and the line is counted).
    fn admit(&self, now: Instant) -> Option<u64> {
        let at = u64::try_from(now.saturating_duration_since(self.origin).as_millis())
            .unwrap_or(u64::MAX);
        let next = self.next.load(Ordering::Acquire);
        let every = u64::try_from(CONNECT_WARN_EVERY.as_millis()).unwrap_or(u64::MAX);
        if at >= next
            && self
                .next
                .compare_exchange(
                    next,
                    at.saturating_add(every),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::AcqRel))
        } else {
            self.suppressed.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

/// How a gateway opens its kind of connection.
pub(crate) trait Connect: Send + Sync {
    /// A cheaply cloned handle to one open connection.
    type Connection: Clone + Send + Sync;

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

/// A lazily opened, cached connection of kind `C`, replaced by the rule in
/// the module documentation.
pub(crate) struct LazyConnection<C: Connect> {
    /// Shared by every connection of one gateway (a pool's too).
    connector: Arc<C>,
    /// Names the topology in log lines.
    label: &'static str,
    connect_timeout: Duration,
    current: Mutex<Option<Opened<C::Connection>>>,
    // Serializes connection attempts so a burst makes one, not hundreds.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    ambiguous_in_a_row: AtomicU32,
    /// Connect attempts started (for tests and the rule above).
    attempts: AtomicU64,
    /// Connect attempts failed, ever: a waiter tells by it that the
    /// attempt it waited for failed.
    connect_failures: AtomicU64,
    /// Whether the latest connect attempt failed.
    down: AtomicBool,
    warnings: Throttle,
}

impl<C: Connect> Debug for LazyConnection<C> {
    // The connector may hold a password: print none of it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyConnection")
            .field("label", &self.label)
            .field("connect_timeout", &self.connect_timeout)
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl<C: Connect> LazyConnection<C> {
    /// Nothing is opened until the first [`Self::get`].
    pub(crate) fn new(connector: Arc<C>, connect_timeout: Duration, label: &'static str) -> Self {
        Self {
            connector,
            label,
            connect_timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            ambiguous_in_a_row: AtomicU32::new(0),
            attempts: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            down: AtomicBool::new(false),
            warnings: Throttle::new(Instant::now()),
        }
    }

    /// How many connect attempts were started so far.
    #[cfg(test)]
    pub(crate) fn connect_attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// How many connections were opened so far.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The topology it connects to, as log lines name it.
    pub(crate) fn label(&self) -> &'static str {
        self.label
    }

    /// The connector every connection of this one is opened by.
    pub(crate) fn connector(&self) -> &Arc<C> {
        &self.connector
    }

    /// The cached connection, unless the connector's mark moved on since it
    /// was opened (then it is dropped here).
    fn cached(&self) -> Option<Opened<C::Connection>> {
        let mark = self.connector.mark();
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*current {
            Some(held) if held.mark != mark => {
                tracing::warn!(label = self.label, "redis connection superseded; replacing it");
                *current = None;
                None
            }
            held => held.clone(),
        }
    }

    /// The cached connection, or a new one opened before `until` (and
    /// within the connect timeout). Nothing was sent when this fails.
    pub(crate) async fn get(
        &self,
        until: Instant,
    ) -> Result<Opened<C::Connection>, GatewayFailure> {
        self.connector.used();
        if let Some(cached) = self.cached() {
            return Ok(cached);
        }
        let _turn = match self.connecting.try_lock() {
            Ok(turn) => turn,
            // Redis failed the last attempt: no queue behind this one.
            Err(_) if self.down.load(Ordering::Acquire) => return Err(GatewayFailure::NotSent),
            Err(_) => {
                let failures = self.connect_failures.load(Ordering::Acquire);
                let Ok(turn) = tokio::time::timeout_at(until, self.connecting.lock()).await else {
                    return Err(GatewayFailure::NotSent);
                };
                // The attempt waited for failed: not another one per waiter.
                if self.connect_failures.load(Ordering::Acquire) != failures
                    && self.cached().is_none()
                {
                    return Err(GatewayFailure::NotSent);
                }
                turn
            }
        };
        // Someone else may have connected while this task waited its turn.
        if let Some(cached) = self.cached() {
            return Ok(cached);
        }
        self.open(until.min(Instant::now() + self.connect_timeout)).await
    }

    /// Opens a new connection before `until` and caches it in place of the
    /// current one, which stays usable for whoever holds it. Outside the
    /// single flight of [`Self::get`]: for a deliberate replacement only.
    pub(crate) async fn open(
        &self,
        until: Instant,
    ) -> Result<Opened<C::Connection>, GatewayFailure> {
        // Read before: a mark that moves while connecting may be about this
        // very node, so the new connection must not outlive it.
        let mark = self.connector.mark();
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let failed = match tokio::time::timeout_at(until, self.connector.connect()).await {
            Ok(Ok(connection)) => {
                if self.down.swap(false, Ordering::AcqRel) {
                    tracing::info!(label = self.label, "redis connected again");
                }
                return Ok(self.install(connection, mark));
            }
            Ok(Err(error)) => Some(error),
            Err(_) => None,
        };
        self.down.store(true, Ordering::Release);
        self.connect_failures.fetch_add(1, Ordering::AcqRel);
        if let Some(suppressed) = self.warnings.admit(Instant::now()) {
            match failed {
                Some(error) => tracing::warn!(
                    kind = error.category(),
                    label = self.label,
                    suppressed,
                    "redis connect failed"
                ),
                None => tracing::warn!(label = self.label, suppressed, "redis connect timed out"),
            }
        }
        Err(GatewayFailure::NotSent)
    }

    fn install(&self, connection: C::Connection, mark: u64) -> Opened<C::Connection> {
        let opened = Opened {
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
            connection,
            opened_at: Instant::now(),
            mark,
        };
        *self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some(opened.clone());
        self.ambiguous_in_a_row.store(0, Ordering::Relaxed);
        opened
    }

    /// Drops the connection of `generation` (not a newer one) so the next
    /// call reconnects.
    fn discard(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.as_ref().is_some_and(|held| held.generation == generation) {
            *current = None;
        }
    }

    /// The server answered (a reply, or an error reply): the run of
    /// ambiguous failures is over.
    pub(crate) fn answered(&self) {
        self.ambiguous_in_a_row.store(0, Ordering::Relaxed);
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
                tracing::warn!(label = self.label, "redis connection dropped; replacing it");
                self.ambiguous_in_a_row.store(0, Ordering::Relaxed);
                self.discard(generation);
            }
            GatewayFailure::Refused
                if error.is_some_and(|error| {
                    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
                }) =>
            {
                tracing::warn!(label = self.label, "redis node is a replica now; replacing it");
                self.ambiguous_in_a_row.store(0, Ordering::Relaxed);
                self.discard(generation);
            }
            GatewayFailure::TimedOut | GatewayFailure::ConnectionLost => {
                let failures = self.ambiguous_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
                if failures >= AMBIGUOUS_FAILURES_BEFORE_RECONNECT {
                    tracing::warn!(
                        failures,
                        label = self.label,
                        "redis keeps timing out or losing the connection; replacing it"
                    );
                    self.ambiguous_in_a_row.store(0, Ordering::Relaxed);
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
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Hands out connection numbers after `delay`, counting its connects,
    /// under the mark the test sets.
    #[derive(Debug, Default)]
    struct Counting {
        connects: AtomicUsize,
        delay: Duration,
        mark: AtomicU64,
        /// Every connect is refused (after `delay`) while set.
        refuse: std::sync::atomic::AtomicBool,
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
        (LazyConnection::new(connector, Duration::from_secs(1), "test"), counting)
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

    /// `n` callers of `get` at once, each with a second to spare.
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
    async fn the_waiters_of_a_failed_connect_fail_without_one_attempt_each() {
        let (lazy, counting) = lazy(Duration::from_millis(50));
        counting.refuse.store(true, Ordering::Relaxed);
        let lazy = Arc::new(lazy);
        assert_eq!(burst(&lazy, 16).await, [None; 16]);
        assert_eq!(lazy.connect_attempts(), 1, "one attempt for the burst, not one per caller");
        // Down now: an attempt in flight turns the others away at once.
        assert_eq!(burst(&lazy, 16).await, [None; 16]);
        assert_eq!(lazy.connect_attempts(), 2);
    }

    #[tokio::test]
    async fn the_first_call_after_a_failed_connect_connects_again() {
        let (lazy, counting) = lazy(Duration::ZERO);
        counting.refuse.store(true, Ordering::Relaxed);
        for attempt in 1..=3 {
            assert_eq!(
                lazy.get(soon()).await.map(|held| held.generation),
                Err(GatewayFailure::NotSent)
            );
            assert_eq!(lazy.connect_attempts(), attempt, "no attempt skipped while down");
        }
        counting.refuse.store(false, Ordering::Relaxed);
        assert_eq!(lazy.get(soon()).await.unwrap().generation, 1, "back at the first call");
        // Up again: a burst shares one connect once more.
        let lazy = Arc::new(lazy);
        let held = lazy.get(soon()).await.unwrap();
        lazy.failed(held.generation, GatewayFailure::ConnectionLost, Some(&dropped()));
        assert_eq!(burst(&lazy, 8).await, [Some(2); 8]);
    }

    #[test]
    fn connect_warnings_are_one_a_second_with_the_count_held_back() {
        let origin = Instant::now();
        let throttle = Throttle::new(origin);
        let at = |millis| origin + Duration::from_millis(millis);
        assert_eq!(throttle.admit(at(0)), Some(0));
        for millis in [1, 10, 500, 999] {
            assert_eq!(throttle.admit(at(millis)), None);
        }
        assert_eq!(throttle.admit(at(1000)), Some(4));
        assert_eq!(throttle.admit(at(1500)), None);
        assert_eq!(throttle.admit(at(60_000)), Some(1));
    }
}
