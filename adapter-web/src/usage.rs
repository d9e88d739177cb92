//! Usage-based limits at the edge: a request that carries a
//! [`crate::RateLimitCost`] reserves it; a handler that reports what it used
//! with a [`RateLimitUsage`] response extension has it settled once the
//! response body ends (docs/algorithms.md "Settling usage").

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use shared_contract::{
    Clock, EdgeRateLimitPort, LOG_LINE_EVERY, LogThrottle, MAX_COUNT, PolicySet, RateLimitRequest,
    SettleOutcome, Settlement, settle_outcome_label,
};

use crate::lease::LeaseReleases;
use crate::telemetry::{FRONT_HTTP, PolicyIds, SETTLES_TOTAL};

/// What a request used, reported by its handler as a response extension.
/// The edge reads it when the response body ends, or is dropped: a
/// streaming handler keeps a clone and [`Self::add`]s as it goes. Never
/// reported, the reservation stands as charged.
#[derive(Debug, Clone, Default)]
pub struct RateLimitUsage(Arc<AtomicU64>);

/// Nothing reported yet.
const UNREPORTED: u64 = u64::MAX;

impl RateLimitUsage {
    /// A report of `used` units.
    pub fn new(used: u64) -> Self {
        let usage = Self::unreported();
        usage.set(used);
        usage
    }

    /// A handle nothing has been reported through yet.
    pub fn unreported() -> Self {
        Self(Arc::new(AtomicU64::new(UNREPORTED)))
    }

    /// Reports `used` units in all (at most `u64::MAX - 1`).
    pub fn set(&self, used: u64) {
        self.0.store(used.min(UNREPORTED - 1), Ordering::Relaxed);
    }

    /// Adds `units` to what was reported (none reported counts as 0).
    pub fn add(&self, units: u64) {
        let _ = self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            let held = if held == UNREPORTED { 0 } else { held };
            Some(held.saturating_add(units).min(UNREPORTED - 1))
        });
    }

    /// What was reported, if anything.
    pub fn reported(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|&used| used != UNREPORTED)
    }
}

/// An admitted request's reservation, kept until its response says what
/// it used.
#[derive(Debug)]
pub(crate) struct Reservation {
    pub(crate) port: Arc<dyn EdgeRateLimitPort>,
    pub(crate) request: RateLimitRequest<'static>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) budget: std::time::Duration,
    pub(crate) tasks: LeaseReleases,
}

/// Settles its reservation with what its usage handle holds when dropped:
/// with the response body, sent or not.
#[derive(Debug)]
pub(crate) struct SettleGuard {
    reservation: Option<Reservation>,
    usage: RateLimitUsage,
}

impl Reservation {
    /// The guard that settles it with `usage`.
    pub(crate) fn settled_by(self, usage: RateLimitUsage) -> SettleGuard {
        SettleGuard { reservation: Some(self), usage }
    }
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        let Some(Reservation { port, mut request, clock, budget, tasks }) = self.reservation.take()
        else {
            return;
        };
        // Beyond a counter's range, the most a settle charges: never less.
        let Some(used) = self.usage.reported().map(|used| used.min(MAX_COUNT)) else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("no runtime left to settle a request's usage; its reservation stands");
            return;
        };
        let now = clock.monotonic();
        request.deadline = now.checked_add(budget).unwrap_or(now);
        let policies = request.policies.clone().into_owned();
        let settlement = Settlement { request, used };
        // Not inline while unwinding: a panic in the provider there would abort.
        let waiting = match (!std::thread::panicking()).then(|| port.settle(settlement.clone())) {
            Some(settling) => match settling.into_ready() {
                Ok(outcome) => return record(&outcome, &policies),
                Err(waiting) => Some(waiting),
            },
            None => None,
        };
        // Tracked until it ends, so a shutdown can wait for it.
        let settle = tasks.running.track_future(async move {
            let outcome = match waiting {
                Some(waiting) => waiting.await,
                None => port.settle(settlement).await,
            };
            record(&outcome, &policies);
        });
        drop(runtime.spawn(settle));
    }
}

/// Counts a settle by its outcome; a failure is logged (by policy, never
/// the subject).
fn record(outcome: &SettleOutcome, policies: &PolicySet) {
    // One line a second: while the provider is down every settle fails alike.
    static FAILURES_LOGGED: LogThrottle = LogThrottle::new(LOG_LINE_EVERY);
    if let Err(failure) = outcome
        && let Some(suppressed) = FAILURES_LOGGED.admit(std::time::Instant::now())
    {
        tracing::warn!(
            policies = %PolicyIds(policies.ids()),
            outcome = failure.category_name(),
            suppressed,
            "a request's usage was not settled; its reservation stands as charged"
        );
    }
    let outcome = settle_outcome_label(outcome);
    metrics::counter!(SETTLES_TOTAL, "outcome" => outcome, "front" => FRONT_HTTP).increment(1);
}
