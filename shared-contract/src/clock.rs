//! `Clock`: where providers and the edge read time, so tests can drive it.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Two readings of time: wall-clock epoch milliseconds, which the
/// algorithms count in, and a monotonic instant, which deadlines use.
pub trait Clock: Send + Sync + Debug {
    /// Milliseconds since the Unix epoch. May run backwards (NTP steps);
    /// the clock-regression bound is there for that.
    fn epoch_millis(&self) -> u64;
    /// A monotonic instant for deadlines.
    fn monotonic(&self) -> Instant;
}

/// The operating system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn epoch_millis(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, crate::policy::millis)
    }

    fn monotonic(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told; clones share one time. `advance`
/// moves both readings; `set_epoch_millis` moves only the wall clock, as an
/// NTP step would.
#[derive(Debug, Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug)]
struct ManualInner {
    epoch_millis: AtomicU64,
    origin: Instant,
    monotonic_offset_millis: AtomicU64,
}

impl ManualClock {
    /// A clock reading `epoch_millis`.
    pub fn new(epoch_millis: u64) -> Self {
        Self {
            inner: Arc::new(ManualInner {
                epoch_millis: AtomicU64::new(epoch_millis),
                origin: Instant::now(),
                monotonic_offset_millis: AtomicU64::new(0),
            }),
        }
    }

    /// Moves both readings forward by `by` (whole milliseconds count).
    pub fn advance(&self, by: Duration) {
        let millis = crate::policy::millis(by);
        self.inner.epoch_millis.fetch_add(millis, Ordering::SeqCst);
        self.inner.monotonic_offset_millis.fetch_add(millis, Ordering::SeqCst);
    }

    /// Sets the wall clock only, forwards or backwards.
    pub fn set_epoch_millis(&self, epoch_millis: u64) {
        self.inner.epoch_millis.store(epoch_millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn epoch_millis(&self) -> u64 {
        self.inner.epoch_millis.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Instant {
        let offset = self.inner.monotonic_offset_millis.load(Ordering::SeqCst);
        self.inner.origin + Duration::from_millis(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_time() {
        let clock = ManualClock::new(1_000);
        let shared = clock.clone();
        let start = clock.monotonic();
        assert_eq!(clock.epoch_millis(), 1_000);
        shared.advance(Duration::from_millis(250));
        assert_eq!(clock.epoch_millis(), 1_250);
        assert_eq!(clock.monotonic() - start, Duration::from_millis(250));
        clock.set_epoch_millis(900);
        assert_eq!(shared.epoch_millis(), 900);
        assert_eq!(clock.monotonic() - start, Duration::from_millis(250));
    }

    #[test]
    fn system_clock_reads_a_plausible_epoch() {
        // 2020-01-01 in epoch milliseconds: any real clock is past it.
        assert!(SystemClock.epoch_millis() > 1_577_836_800_000);
    }
}
