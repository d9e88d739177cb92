//! `WaitPool`: the connections `WAIT` mode sends charges on, one call at a
//! time each (`redis.wait-connections` of them per master).
//!
//! `WAIT` blocks the client it runs on until the replicas acknowledge or its
//! timeout passes, and Redis serves one client's commands in order: on one
//! shared connection every charge waits behind each blocked `WAIT` before
//! it (with a replica gone, each for the full `wait-timeout`, so the later
//! ones run into `command-timeout`). Lent out one call at a time, a
//! connection carries at most one `WAIT`, so a blocked `WAIT` holds that
//! connection only. A call waits for a free connection within its
//! `wait-timeout` only, and the wait comes off the `WAIT`'s own timeout
//! ([`patience`]), so every charge is answered within about `wait-timeout`:
//! acknowledged, `Indeterminate`, or refused unsent when no connection came
//! free in time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::WaitFor;
use super::connection::{Connect, LazyConnection};

/// Connections of one connector, lent out one call at a time.
pub(crate) struct WaitPool<C: Connect> {
    connections: Box<[LazyConnection<C>]>,
    turns: Turns,
}

/// One connection of a [`WaitPool`], back in the pool when dropped.
pub(crate) struct Lent<'a, C: Connect> {
    pool: &'a WaitPool<C>,
    turn: Turn<'a>,
}

impl<C: Connect> WaitPool<C> {
    /// `size` connections (at least one), each opened lazily by `connector`
    /// and named `<label>-wait-<n>` (from 1) in log lines: each logs its
    /// own connect failures, and they must not read as one connection's.
    pub(crate) fn new(
        connector: &Arc<C>,
        size: usize,
        connect_timeout: Duration,
        label: &str,
    ) -> Self {
        let size = size.max(1);
        Self {
            connections: (1..=size)
                .map(|number| {
                    let label = format!("{label}-wait-{number}").into();
                    LazyConnection::new(Arc::clone(connector), connect_timeout, label)
                })
                .collect(),
            turns: Turns::new(size),
        }
    }

    /// How many connections the pool holds.
    pub(crate) fn size(&self) -> usize {
        self.connections.len()
    }

    /// Connection `index` (below [`Self::size`]), whoever holds its turn.
    pub(crate) fn connection(&self, index: usize) -> &LazyConnection<C> {
        &self.connections[index]
    }

    /// A connection no other call holds, waiting until `until` at most.
    pub(crate) async fn lend(&self, until: Instant) -> Option<Lent<'_, C>> {
        Some(Lent { pool: self, turn: self.turns.take(until).await? })
    }
}

impl<C: Connect> std::ops::Deref for Lent<'_, C> {
    type Target = LazyConnection<C>;

    fn deref(&self) -> &LazyConnection<C> {
        self.pool.connection(self.turn.index)
    }
}

/// Turns on `size` connections, one call per connection at a time: the
/// indices not taken, and one permit per free index.
pub(crate) struct Turns {
    idle: Mutex<Vec<usize>>,
    permits: Semaphore,
}

/// A taken turn on connection [`Self::index`], given back when dropped.
pub(crate) struct Turn<'a> {
    turns: &'a Turns,
    pub(crate) index: usize,
    // Released after the index is back (fields drop after `drop` ran).
    _permit: SemaphorePermit<'a>,
}

impl Turns {
    pub(crate) fn new(size: usize) -> Self {
        Self { idle: Mutex::new((0..size).rev().collect()), permits: Semaphore::new(size) }
    }

    /// A turn no other call holds, waiting until `until` at most.
    pub(crate) async fn take(&self, until: Instant) -> Option<Turn<'_>> {
        let permit = match self.permits.try_acquire() {
            Ok(permit) => permit,
            Err(_) => tokio::time::timeout_at(until, self.permits.acquire()).await.ok()?.ok()?,
        };
        // A permit means a free index: each is pushed back before its
        // permit is released.
        let index = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop()?;
        Some(Turn { turns: self, index, _permit: permit })
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turns.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(self.index);
    }
}

/// `wait` with what is left of its timeout at `now`, counted from
/// `started`: the time a call waited for a connection comes off the
/// server's wait. `None` once nothing is left (`WAIT` counts whole
/// milliseconds, and 0 would block forever).
pub(crate) fn patience(wait: WaitFor, started: Instant, now: Instant) -> Option<WaitFor> {
    let waited = u64::try_from(now.saturating_duration_since(started).as_millis()).ok()?;
    let timeout_ms = wait.timeout_ms.checked_sub(waited).filter(|&left| left > 0)?;
    Some(WaitFor { timeout_ms, ..wait })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    impl Connect for Nothing {
        type Connection = ();

        async fn connect(&self) -> redis::RedisResult<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_connection_is_lent_to_one_call_at_a_time() {
        let pool = WaitPool::new(&Arc::new(Nothing), 2, Duration::from_secs(1), "test");
        let soon = || Instant::now() + Duration::from_millis(20);
        let first = pool.lend(soon()).await.unwrap();
        let second = pool.lend(soon()).await.unwrap();
        assert_ne!(first.turn.index, second.turn.index);
        // Both are out: the third call waits until its bound, for nothing.
        assert!(pool.lend(soon()).await.is_none());
        let index = first.turn.index;
        drop(first);
        assert_eq!(pool.lend(soon()).await.unwrap().turn.index, index);
        assert_eq!(pool.size(), 2);
    }

    #[test]
    fn each_wait_connection_has_its_own_label() {
        let pool = WaitPool::new(&Arc::new(Nothing), 3, Duration::from_secs(1), "standalone");
        let labels: Vec<_> = (0..pool.size()).map(|index| pool.connection(index).label()).collect();
        assert_eq!(labels, ["standalone-wait-1", "standalone-wait-2", "standalone-wait-3"]);
    }

    #[test]
    fn the_wait_for_a_connection_comes_off_the_wait_timeout() {
        let wait = WaitFor { replicas: 1, timeout_ms: 100 };
        let started = Instant::now();
        let at = |ms| started + Duration::from_millis(ms);
        assert_eq!(patience(wait, started, started), Some(wait));
        assert_eq!(patience(wait, started, at(30)), Some(WaitFor { replicas: 1, timeout_ms: 70 }));
        assert_eq!(patience(wait, started, at(99)), Some(WaitFor { replicas: 1, timeout_ms: 1 }));
        assert_eq!(patience(wait, started, at(100)), None);
        assert_eq!(patience(wait, started, at(250)), None);
    }
}
