//! `Clock`: where providers and the edge read time, so tests can drive it.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock epoch milliseconds to count in, and a monotonic instant for deadlines.
pub trait Clock: Send + Sync + Debug {
    /// Milliseconds since the Unix epoch; may run backwards (NTP steps).
    fn epoch_millis(&self) -> u64;
    /// A monotonic instant for deadlines.
    fn monotonic(&self) -> Instant;

    /// Both readings, `(monotonic, epoch_millis)`, in one read where it can.
    fn read_both(&self) -> (Instant, u64) {
        (self.monotonic(), self.epoch_millis())
    }
}

/// The operating system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn epoch_millis(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, crate::bounds::millis)
    }

    fn monotonic(&self) -> Instant {
        Instant::now()
    }

    /// One read of the monotonic clock, the wall clock derived from it by an
    /// offset re-read at most [`ANCHOR_REFRESH_MICROS`] apart: a decision pays
    /// one clock read, and an NTP step shows within a millisecond.
    fn read_both(&self) -> (Instant, u64) {
        let anchor = ANCHOR.get_or_init(Anchor::new);
        let monotonic = Instant::now();
        let micros = anchor.micros_at(monotonic);
        let refreshed = anchor.refreshed_at.load(Ordering::Relaxed);
        // Racing refreshes each store a valid offset. A reading the thread was
        // preempted in is not stored (it would put derived time ahead by the
        // preemption); the next call tries again.
        if micros.saturating_sub(refreshed) >= ANCHOR_REFRESH_MICROS {
            if let Some(offset) = anchor.measure_offset() {
                anchor.offset.store(offset, Ordering::Relaxed);
                anchor.refreshed_at.store(micros, Ordering::Relaxed);
            }
        }
        (monotonic, micros.wrapping_add(anchor.offset.load(Ordering::Relaxed)) / 1_000)
    }
}

/// Widest monotonic bracket around a wall-clock reading that gives its offset.
const ANCHOR_MAX_BRACKET_MICROS: u64 = 50;

/// Longest [`SystemClock::read_both`] goes without re-reading the wall clock.
const ANCHOR_REFRESH_MICROS: u64 = 1_000;

/// The wall clock as epoch µs = monotonic µs since `origin` + `offset`.
#[derive(Debug)]
struct Anchor {
    origin: Instant,
    offset: AtomicU64,
    /// Monotonic µs since `origin` when `offset` was last read.
    refreshed_at: AtomicU64,
}

static ANCHOR: OnceLock<Anchor> = OnceLock::new();

impl Anchor {
    fn new() -> Self {
        let mut anchor = Self {
            origin: Instant::now(),
            offset: AtomicU64::new(epoch_micros()),
            refreshed_at: AtomicU64::new(0),
        };
        // A few tries for a reading not preempted; the plain one otherwise.
        if let Some(offset) = (0..8).find_map(|_| anchor.measure_offset()) {
            *anchor.offset.get_mut() = offset;
        }
        anchor
    }

    /// The offset from a wall-clock reading between two monotonic ones.
    fn measure_offset(&self) -> Option<u64> {
        let before = self.micros_at(Instant::now());
        let epoch = epoch_micros();
        let after = self.micros_at(Instant::now());
        offset_between(before, epoch, after)
    }

    fn micros_at(&self, instant: Instant) -> u64 {
        let since = instant.saturating_duration_since(self.origin);
        since.as_secs().saturating_mul(1_000_000).saturating_add(u64::from(since.subsec_micros()))
    }
}

/// The offset of a wall-clock reading from the midpoint of its bracket.
fn offset_between(before: u64, epoch: u64, after: u64) -> Option<u64> {
    let bracket = after.saturating_sub(before);
    (bracket <= ANCHOR_MAX_BRACKET_MICROS).then(|| epoch.wrapping_sub(before + bracket / 2))
}

fn epoch_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
}

/// A clock that moves only when told; clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    epoch_millis: Arc<AtomicU64>,
    origin: Instant,
    monotonic_offset_millis: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `epoch_millis`.
    pub fn new(epoch_millis: u64) -> Self {
        Self {
            epoch_millis: Arc::new(AtomicU64::new(epoch_millis)),
            origin: Instant::now(),
            monotonic_offset_millis: Arc::default(),
        }
    }

    /// Moves both readings forward by `by` (whole milliseconds count).
    pub fn advance(&self, by: Duration) {
        let millis = crate::bounds::millis(by);
        self.epoch_millis.fetch_add(millis, Ordering::SeqCst);
        self.monotonic_offset_millis.fetch_add(millis, Ordering::SeqCst);
    }

    /// Sets the wall clock only, forwards or backwards.
    pub fn set_epoch_millis(&self, epoch_millis: u64) {
        self.epoch_millis.store(epoch_millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn epoch_millis(&self) -> u64 {
        self.epoch_millis.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Instant {
        self.origin + Duration::from_millis(self.monotonic_offset_millis.load(Ordering::SeqCst))
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

    #[test]
    fn an_offset_comes_from_a_tight_bracket_only() {
        // Read at 1,000 and 1,040 µs: the wall clock's 5,000,020 belongs to
        // their midpoint, 1,020.
        assert_eq!(offset_between(1_000, 5_000_020, 1_040), Some(4_999_000));
        assert_eq!(offset_between(1_000, 5_000_020, 1_000 + ANCHOR_MAX_BRACKET_MICROS + 1), None);
    }

    #[test]
    fn both_readings_at_once_agree_with_each_alone() {
        for _ in 0..3 {
            let before = (Instant::now(), SystemClock.epoch_millis());
            let (monotonic, epoch) = SystemClock.read_both();
            let after = (Instant::now(), SystemClock.epoch_millis());
            assert!(before.0 <= monotonic && monotonic <= after.0);
            // Derived from an offset at most a millisecond old: within a
            // few milliseconds of the wall clock read around it.
            assert!(before.1 <= epoch + 2 && epoch <= after.1 + 2, "{before:?} {epoch} {after:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
        let manual = ManualClock::new(5_000);
        assert_eq!(manual.read_both(), (manual.monotonic(), 5_000));
    }
}
