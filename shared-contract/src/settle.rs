//! `Settlement`: what a request used once its work is done, given back or
//! charged past the limit against what it reserved (docs/algorithms.md
//! "Settling usage").

use crate::bounds::MAX_COUNT;
use crate::evaluation::EvaluationId;
use crate::outcome::{IncompatibleCategory, RateLimitFailure};
use crate::request::RateLimitRequest;

/// A request's usage, settled against its reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement<'a> {
    /// The reservation as it was evaluated: its set, subject, operation,
    /// evaluation id and `cost`, what it reserved. A `cost` of 0 settles no
    /// reservation: `used` is charged as it stands (an after-the-fact charge).
    pub request: RateLimitRequest<'a>,
    /// Units the request used, 0 ..= [`MAX_COUNT`].
    pub used: u64,
}

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Applied now: the difference given back, or the excess charged.
    Applied,
    /// Applied before (a repeat after a lost reply); nothing changed.
    Repeated,
    /// No live dedupe record of the reservation (dedupe off, its record
    /// expired or evicted, or the budget reset); nothing changed, the
    /// reservation stands as charged.
    UnknownReservation,
    /// The provider does not settle; the reservation stands as charged.
    Unsupported,
}

/// What [`crate::EdgeRateLimitPort::settle`] answers.
pub type SettleOutcome = Result<Settled, RateLimitFailure>;

impl Settlement<'_> {
    /// The same settlement owning its set, for a provider that waits.
    pub fn into_owned(self) -> Settlement<'static> {
        Settlement { request: self.request.into_owned(), used: self.used }
    }

    /// The id a settle is known by in dedupe records: the reservation's,
    /// its UUID version nibble flipped from 4 to F, so never a random id's.
    pub fn settle_id(&self) -> EvaluationId {
        let mut bytes = *self.request.evaluation_id.as_bytes();
        bytes[6] ^= 0xB0;
        let id = EvaluationId::from_uuid(uuid::Uuid::from_bytes(bytes));
        if self.request.evaluation_id.may_repeat() { id } else { id.minted_once() }
    }

    /// `CostExceedsMaximum` for a reservation or usage beyond a counter's
    /// range; `maximum-cost` bounds only what a request reserves.
    ///
    /// # Errors
    /// That failure, before any state is read.
    pub fn check(&self) -> Result<(), RateLimitFailure> {
        if self.request.cost > MAX_COUNT || self.used > MAX_COUNT {
            return Err(RateLimitFailure::Incompatible {
                category: IncompatibleCategory::CostExceedsMaximum,
            });
        }
        Ok(())
    }
}
