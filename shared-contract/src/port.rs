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

/// A provider's answer to one call: there at once (no allocation, no poll:
/// [`Self::into_ready`]), or a boxed `'static` future that waits for it.
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

impl<T> PortAnswer<T> {
    /// An answer there at once.
    pub const fn ready(answer: T) -> Self {
        Self(Answer::Ready(Some(answer)))
    }

    /// An answer `future` waits for (boxed here).
    pub fn pending(future: impl Future<Output = T> + Send + 'static) -> Self {
        Self(Answer::Waiting(Box::pin(future)))
    }

    /// The answer when it is there at once, without polling; else the
    /// waiting answer, to await.
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

/// A rate-limit provider, used as `Arc<dyn EdgeRateLimitPort>`.
///
/// The contract every implementation keeps (the `contract-tests` crate
/// checks it):
/// - `evaluate` MUST NOT panic; every failure is a typed
///   [`crate::RateLimitFailure`]. An answer it has without waiting it
///   gives as [`PortAnswer::ready`]; a [`PortAnswer::pending`] one does
///   nothing until first polled.
/// - It MUST answer `Incompatible(UnknownPolicy)` for a policy it does not
///   hold and `Incompatible(CostExceedsMaximum)` for cost 0 or above the
///   policy's maximum, without reading or touching any state.
/// - It MUST answer `Unavailable(AdmissionRejected)` without touching state
///   when the deadline has already passed.
/// - It MUST apply the algorithms, the clock-regression bound and evaluation
///   dedupe exactly as `docs/algorithms.md` defines
///   them, so every provider gives the same answer for the same inputs.
/// - It MUST answer `Indeterminate` rather than a guess when a charge may or
///   may not have happened.
/// - An admitted request whose set holds a concurrency policy holds a lease
///   under each such policy's key until [`Self::release`] or its
///   `lease-ttl`; a refused one holds none.
#[async_trait]
pub trait EdgeRateLimitPort: Send + Sync + Debug {
    /// Evaluates one request.
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation;

    /// The policy this provider holds under `id`, so the edge can describe
    /// it in response headers.
    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy>;

    /// Whether the provider can answer now (its backing store responds).
    /// Used by readiness probes; it MUST NOT consume budget.
    async fn is_ready(&self) -> bool;

    /// The budget `key` names as the provider holds it now, for an
    /// operator. It MUST NOT charge, write or extend anything: the state
    /// is computed from what is stored by the same step `evaluate` runs
    /// (`shared_contract::inspect_key`), so a following `evaluate` answers
    /// as if `inspect` had never been called. An absent budget is a fresh
    /// one (`mark` is `None`).
    ///
    /// # Errors
    /// `UnknownPolicy` for a policy it does not hold;
    /// `OperationRequired` / `OperationNotApplicable` when the key's
    /// operation does not fit the policy's scope
    /// ([`BudgetKey::operation_for`]), both before any state is read;
    /// `StateIncompatible` for state it cannot read as the policy's;
    /// `Unavailable` / `Indeterminate` when the store does not answer.
    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure>;

    /// Resets the budget `key` names: its state and its evaluation-dedupe
    /// records are deleted, so the next request starts fresh and an
    /// evaluation id seen before charges again. Idempotent: resetting an
    /// absent budget is `Ok`. It MUST touch no other key (another subject,
    /// policy, revision or operation).
    ///
    /// # Errors
    /// As [`Self::inspect`]; `Indeterminate` means the reset may or may not
    /// have happened, and asking again is safe.
    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure>;

    /// Gives back the in-flight lease an admitted request took
    /// (docs/algorithms.md "Concurrency (in-flight leases)"), so another
    /// request can take its slot. The contract every implementation keeps:
    /// - It MUST remove only the lease of id `lease.id`, and only under the
    ///   keys of `lease`'s subject and operation for the concurrency
    ///   policies of `lease.policies` it holds now (at their current
    ///   revision); rate policies, other subjects, operations, revisions
    ///   and other leases are untouched, and no key's mark or lifetime
    ///   moves.
    /// - It MUST be idempotent: releasing a lease that is not held (released
    ///   before, expired, never taken, or its policy removed or
    ///   re-revisioned by a reload) answers [`ReleaseOutcome::NotHeld`] and
    ///   changes nothing; `Released` means a slot was freed now.
    /// - It MUST NOT panic and has no error type, and answers at once
    ///   ([`PortAnswer::ready`]) when it need not wait: a store that does not
    ///   answer is [`ReleaseOutcome::Unavailable`] when provably nothing
    ///   ran and [`ReleaseOutcome::Indeterminate`] when the removal may or
    ///   may not have happened (releasing again is safe). A lease whose
    ///   release failed expires at its `lease-ttl`.
    fn release(&self, lease: &Lease) -> Releasing;
}
