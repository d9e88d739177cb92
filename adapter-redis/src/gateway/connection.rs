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

use std::fmt::{self, Debug};
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};
use tokio::time::Instant;

use super::GatewayFailure;

/// Ambiguous failures in a row (timeouts or lost connections, the ones after
/// which a command may have run) that make the gateway replace its
/// connection.
pub(crate) const AMBIGUOUS_FAILURES_BEFORE_RECONNECT: u32 = 3;

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
        }
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
        let Ok(_turn) = tokio::time::timeout_at(until, self.connecting.lock()).await else {
            return Err(GatewayFailure::NotSent);
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
        match tokio::time::timeout_at(until, self.connector.connect()).await {
            Ok(Ok(connection)) => Ok(self.install(connection, mark)),
            Ok(Err(error)) => {
                tracing::warn!(kind = error.category(), label = self.label, "redis connect failed");
                Err(GatewayFailure::NotSent)
            }
            Err(_) => {
                tracing::warn!(label = self.label, "redis connect timed out");
                Err(GatewayFailure::NotSent)
            }
        }
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
    }

    impl Connect for Arc<Counting> {
        type Connection = usize;

        fn connect(&self) -> impl Future<Output = RedisResult<usize>> + Send {
            let counting = Arc::clone(self);
            async move {
                tokio::time::sleep(counting.delay).await;
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
}
