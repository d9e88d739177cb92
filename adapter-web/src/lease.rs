//! In-flight leases at the edge: a request admitted under a concurrency
//! policy holds a [`LeaseGuard`], which gives the lease back to the port when
//! it drops, with the response body ([`ReleasingBody`]) or the request's future.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::{Bytes, HttpBody};
use http_body::{Frame, SizeHint};
use metrics::Counter;
use pin_project_lite::pin_project;
use shared_contract::{
    EdgeRateLimitPort, Lease, RateLimitFailure, RateLimitOutcome, ReleaseOutcome,
};
use tokio_util::task::TaskTracker;

use crate::telemetry::{LEASE_RELEASE_FAILURES_TOTAL, PolicyIds};

/// The edge's releases still running, which a shutdown waits for (else the
/// runtime ends before they run).
#[derive(Debug, Clone)]
pub struct LeaseReleases {
    pub(crate) running: TaskTracker,
    failures: Counter,
}

impl Default for LeaseReleases {
    fn default() -> Self {
        Self {
            running: TaskTracker::new(),
            failures: metrics::counter!(LEASE_RELEASE_FAILURES_TOTAL),
        }
    }
}

impl LeaseReleases {
    /// Waits at most `bound` for the releases still running, once the
    /// connections are closed; counts and logs those left as failures.
    pub async fn finish_within(&self, bound: Duration) -> usize {
        self.running.close();
        if tokio::time::timeout(bound, self.running.wait()).await.is_ok() {
            return 0;
        }
        let unfinished = self.running.len();
        if unfinished > 0 {
            self.failures.increment(unfinished as u64);
            tracing::warn!(
                unfinished,
                ?bound,
                "in-flight lease releases still running at shutdown; their slots may stay taken until their leases expire"
            );
        }
        unfinished
    }
}

/// Holds an admitted request's lease; dropping it gives the lease back
/// (`None` once the lease is known not to be held).
#[derive(Debug)]
pub(crate) struct LeaseGuard(Option<Release>);

#[derive(Debug)]
struct Release {
    port: Arc<dyn EdgeRateLimitPort>,
    lease: Lease,
    releases: LeaseReleases,
}

impl LeaseGuard {
    /// A guard for `lease`, maybe taken through `port`, released tracked by `releases`.
    pub(crate) fn new(
        port: Arc<dyn EdgeRateLimitPort>,
        lease: Lease,
        releases: LeaseReleases,
    ) -> Self {
        Self(Some(Release { port, lease, releases }))
    }

    /// The guard while the answer may leave the lease held: an admitted set's or
    /// an `Indeterminate` one's (a refused set writes nothing, so none is given back).
    pub(crate) fn if_held(mut self, outcome: &RateLimitOutcome) -> Option<Self> {
        let held = match outcome {
            Ok(set) => set.allowed(),
            Err(RateLimitFailure::Indeterminate { .. }) => true,
            Err(RateLimitFailure::Unavailable { .. } | RateLimitFailure::Incompatible { .. }) => {
                false
            }
        };
        if !held {
            self.0 = None;
        }
        held.then_some(self)
    }
}

impl Drop for LeaseGuard {
    /// Gives the lease back on the runtime the request ran on.
    fn drop(&mut self) {
        let Some(Release { port, lease, releases }) = self.0.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(
                policies = %PolicyIds(lease.policies.ids()),
                "no runtime left to release an in-flight lease; it expires on its own"
            );
            return;
        };
        let failures = releases.failures.clone();
        // Not inline while unwinding: a panic in the provider there would abort.
        let waiting = match (!std::thread::panicking()).then(|| port.release(&lease).into_ready()) {
            Some(Ok(outcome)) => return record(outcome, &lease, &failures),
            Some(Err(waiting)) => Some(waiting),
            None => None,
        };
        // Tracked until it ends, so a shutdown can wait for it.
        let release = releases.running.track_future(async move {
            let outcome = match waiting {
                Some(waiting) => waiting.await,
                None => port.release(&lease).await,
            };
            record(outcome, &lease, &failures);
        });
        drop(runtime.spawn(release));
    }
}

/// Counts and logs a failed release (by the subject's pseudonym).
fn record(outcome: ReleaseOutcome, lease: &Lease, failures: &Counter) {
    match outcome {
        ReleaseOutcome::Released | ReleaseOutcome::NotHeld => {}
        ReleaseOutcome::Unavailable { .. } | ReleaseOutcome::Indeterminate => {
            failures.increment(1);
            let subject = lease.subject.to_string();
            tracing::warn!(
                policies = %PolicyIds(lease.policies.ids()),
                subject = subject.as_str(),
                outcome = outcome.name(),
                "in-flight lease release failed; the slot may stay taken until the lease expires"
            );
        }
    }
}

pin_project! {
    /// A response body that drops its request's guards once sent or
    /// dropped: the lease goes back, the usage report is settled.
    pub(crate) struct ReleasingBody<B, G> {
        #[pin]
        pub(crate) inner: B,
        pub(crate) guard: Option<G>,
    }
}

impl<B, G> HttpBody for ReleasingBody<B, G>
where
    B: HttpBody<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        // Sent, or failed: dropping the guards ends what they hold.
        if !matches!(frame, Some(Ok(_))) || this.inner.is_end_stream() {
            this.guard.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
