//! `EdgeRateLimitPort`: the one trait every provider implements.

use std::fmt::{self, Debug};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_trait::async_trait;

use crate::budget::{BudgetFailure, BudgetKey, BudgetState};
use crate::lease::{Lease, ReleaseOutcome};
use crate::outcome::RateLimitOutcome;
use crate::policy::{PolicyId, RateLimitPolicy};
use crate::request::RateLimitRequest;
use crate::settle::{SettleOutcome, Settled, Settlement};

/// A provider's answer: there at once ([`Self::into_ready`]), or a boxed future.
#[must_use = "a port answer does nothing unless taken or awaited"]
pub struct PortAnswer<T>(Answer<T>);

enum Answer<T> {
    /// `None` once taken by a poll.
    Ready(Option<T>),
    Waiting(Pin<Box<dyn Future<Output = T> + Send>>),
}

/// What [`EdgeRateLimitPort::evaluate`] answers.
pub type Evaluation = PortAnswer<RateLimitOutcome>;

/// What [`EdgeRateLimitPort::release`] answers.
pub type Releasing = PortAnswer<ReleaseOutcome>;

/// What [`EdgeRateLimitPort::settle`] answers.
pub type Settling = PortAnswer<SettleOutcome>;

impl<T> PortAnswer<T> {
    /// An answer there at once.
    pub const fn ready(answer: T) -> Self {
        Self(Answer::Ready(Some(answer)))
    }

    /// An answer `future` waits for (boxed here).
    pub fn pending(future: impl Future<Output = T> + Send + 'static) -> Self {
        Self(Answer::Waiting(Box::pin(future)))
    }

    /// The answer when it is there at once, without polling.
    ///
    /// # Errors
    /// The waiting answer itself, when there is none yet.
    pub fn into_ready(self) -> Result<T, Self> {
        match self.0 {
            Answer::Ready(Some(answer)) => Ok(answer),
            waiting @ (Answer::Ready(None) | Answer::Waiting(_)) => Err(Self(waiting)),
        }
    }
}

impl<T: Unpin> Future for PortAnswer<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match &mut self.get_mut().0 {
            Answer::Ready(answer) => {
                Poll::Ready(answer.take().expect("a port answer polled after it completed"))
            }
            Answer::Waiting(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T> fmt::Debug for PortAnswer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.0 {
            Answer::Ready(Some(_)) => "ready",
            Answer::Ready(None) => "taken",
            Answer::Waiting(_) => "waiting",
        };
        f.debug_tuple("PortAnswer").field(&state).finish()
    }
}

/// A rate-limit provider, used as `Arc<dyn EdgeRateLimitPort>`. The
/// contract every implementation keeps (the `contract-tests` crate checks it):
/// - `evaluate` MUST NOT panic; every failure is a typed
///   [`crate::RateLimitFailure`]. An answer there without waiting is
///   [`PortAnswer::ready`]; a [`PortAnswer::pending`] one does nothing until
///   first polled.
/// - It MUST answer `Incompatible(UnknownPolicy)` for a policy it does not
///   hold, `Incompatible(CostExceedsMaximum)` for a cost outside 1 ..= the
///   maximum, and `Unavailable(AdmissionRejected)` once the deadline has
///   passed, all without touching state.
/// - It MUST apply the algorithms, the clock-regression bound and dedupe
///   exactly as `docs/algorithms.md` defines them, so every provider gives
///   the same answer for the same inputs, and answer `Indeterminate` rather
///   than a guess when a charge may or may not have happened.
/// - An admitted request whose set holds a concurrency policy holds a lease
///   under each such key until [`Self::release`] or its `lease-ttl`; a
///   refused one holds none.
#[async_trait]
pub trait EdgeRateLimitPort: Send + Sync + Debug {
    /// Evaluates one request.
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation;

    /// The policy held under `id`, so the edge can describe it in headers.
    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy>;

    /// Whether the backing store responds; it MUST NOT consume budget.
    async fn is_ready(&self) -> bool;

    /// The budget `key` names now, for an operator. It MUST NOT charge,
    /// write or extend anything: the state comes from the same step
    /// `evaluate` runs (`shared_contract::inspect_key`). An absent budget is
    /// a fresh one (`mark` is `None`).
    ///
    /// # Errors
    /// `UnknownPolicy`, or `OperationRequired` / `OperationNotApplicable`
    /// ([`BudgetKey::operation_for`]), before any state is read;
    /// `StateIncompatible` for state it cannot read as the policy's;
    /// `Unavailable` / `Indeterminate` when the store does not answer.
    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure>;

    /// Deletes the budget `key` names, state and dedupe records, so the next
    /// request starts fresh. Idempotent; it MUST touch no other key.
    ///
    /// # Errors
    /// As [`Self::inspect`]; after `Indeterminate` asking again is safe.
    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure>;

    /// Gives back the lease an admitted request took, so another request can
    /// take its slot. It MUST remove only the lease `lease.id`, only under
    /// the keys of its subject and operation for the concurrency policies of
    /// `lease.policies` held now, moving no mark or lifetime. It MUST be
    /// idempotent ([`ReleaseOutcome::NotHeld`] for a lease not held) and MUST
    /// NOT panic: a store that does not answer is
    /// [`ReleaseOutcome::Unavailable`] when provably nothing ran, else
    /// [`ReleaseOutcome::Indeterminate`]; either way the lease expires at its
    /// `lease-ttl`.
    fn release(&self, lease: &Lease) -> Releasing;

    /// Settles what a request used against what it reserved
    /// (docs/algorithms.md "Settling usage"), as `evaluate` charges: the
    /// same keys, the clock bound, `shared_contract::settle_set`'s rules. It
    /// MUST answer `Incompatible(UnknownPolicy)` for a policy it does not
    /// hold and the failures of [`Settlement::check`] without touching
    /// state; a settle sent again MUST have one effect
    /// ([`Settled::Repeated`]), and one whose reservation left no live
    /// record MUST change nothing ([`Settled::UnknownReservation`]).
    /// Concurrency policies take no settle. The default answers
    /// [`Settled::Unsupported`]: the reservation stands as charged.
    fn settle(&self, settlement: Settlement<'_>) -> Settling {
        let _ = settlement;
        Settling::ready(Ok(Settled::Unsupported))
    }
}
