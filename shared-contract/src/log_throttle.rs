//! A repeated log line held to one per interval, so an outage does not flood the log.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the fronts log a repeated failure at most.
pub const LOG_LINE_EVERY: Duration = Duration::from_secs(1);

/// One repeated log line's throttle, shared by the callers that log it.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    state: Mutex<ThrottleState>,
}

#[derive(Debug, Default)]
struct ThrottleState {
    /// Before when no line goes out; `None` before the first.
    quiet_until: Option<Instant>,
    /// Lines held back since the last one that went out.
    suppressed: u64,
}

impl LogThrottle {
    /// A throttle letting one line out per `every`.
    pub const fn new(every: Duration) -> Self {
        Self { every, state: Mutex::new(ThrottleState { quiet_until: None, suppressed: 0 }) }
    }

    /// `Some(lines held back since)` when the line due at `now` goes out.
    pub fn admit(&self, now: Instant) -> Option<u64> {
        // A panic while the lock was held left counters good enough for a log.
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.quiet_until.is_some_and(|until| now < until) {
            state.suppressed += 1;
            return None;
        }
        state.quiet_until = Some(now + self.every);
        Some(std::mem::take(&mut state.suppressed))
    }
}

impl Default for LogThrottle {
    fn default() -> Self {
        Self::new(LOG_LINE_EVERY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_goes_out_then_one_per_interval_with_the_held_back_count() {
        let throttle = LogThrottle::new(Duration::from_secs(1));
        let start = Instant::now();
        assert_eq!(throttle.admit(start), Some(0));
        assert_eq!(throttle.admit(start), None);
        assert_eq!(throttle.admit(start + Duration::from_millis(999)), None);
        assert_eq!(throttle.admit(start + Duration::from_secs(1)), Some(2));
        assert_eq!(throttle.admit(start + Duration::from_millis(1500)), None);
        assert_eq!(throttle.admit(start + Duration::from_secs(5)), Some(1));
        assert_eq!(throttle.admit(start + Duration::from_secs(6)), Some(0));
    }
}
