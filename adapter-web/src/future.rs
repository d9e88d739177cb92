//! `ResponseFuture`: evaluate first, then run the inner service or answer
//! in its place.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::BoxError;
use axum::body::{Body, Bytes, HttpBody};
use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use crate::bridge::{Answer, Asked, TransportBridge};
use crate::lease::{LeaseGuard, ReleasingBody};
use crate::limiter::Limiter;
use crate::mapping::{DecisionHeaders, decision_headers, refusal, rejection_response};
use crate::refusal::{Refusal, RefusalShaper};

/// A port answer still to come, with the request parts and the bridge
/// handed back: the future owns the one reference the request takes, so
/// no second count is bumped on the bridge every request shares.
type Evaluation = Pin<Box<dyn Future<Output = (Parts, Arc<TransportBridge>, Answer)> + Send>>;

pin_project! {
    /// The response future of [`crate::RateLimitService`].
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // The bridge is asking the port; the inner service waits, unused.
        Evaluating {
            evaluation: Evaluation,
            shaper: Option<RefusalShaper>,
            inner: Option<S>,
            body: Option<ReqBody>,
        },
        // Allowed (or limiting disabled): the inner service runs, and its
        // response gets these headers. The lease, if the request holds
        // one, goes to the response body; dropped here with the future
        // (no response yet: client gone, handler cancelled or panicked, an
        // error), it is given back.
        Running {
            #[pin]
            future: S::Future,
            headers: Option<DecisionHeaders>,
            lease: Option<LeaseGuard>,
        },
        // Refused: this response replaces the inner service's.
        Refused {
            response: Option<Response<Body>>,
        },
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>> + Clone,
{
    /// Asks the bridge at once: a provider that answers without waiting
    /// (the memory provider) is done here, with nothing boxed or polled,
    /// and an admitted request goes straight to `ready`, the instance
    /// `poll_ready` readied, with no clone of it. Only a provider that
    /// waits leaves the evaluation to the future, with a clone of `ready`
    /// left behind.
    pub(crate) fn evaluating(limiter: Limiter, ready: &mut S, request: Request<ReqBody>) -> Self {
        let (parts, body) = request.into_parts();
        let Limiter { bridge, shaper } = limiter;
        let state = match bridge.ask(&parts) {
            Asked::Answered(result) => answered(parts, &bridge, result, shaper.as_ref(), |parts| {
                ready.call(Request::from_parts(parts, body))
            }),
            Asked::Waiting(waiting) => {
                let evaluation: Evaluation = Box::pin(async move {
                    let result = waiting.answer(&bridge).await;
                    (parts, bridge, result)
                });
                // The readied instance must be the one called, later, once
                // the evaluation allows it; a clone stays behind.
                let clone = ready.clone();
                let inner = Some(std::mem::replace(ready, clone));
                State::Evaluating { evaluation, shaper, inner, body: Some(body) }
            }
        };
        Self { state }
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn pass_through(future: S::Future) -> Self {
        Self { state: State::Running { future, headers: None, lease: None } }
    }
}

/// The state the bridge's answer leads to: the inner service running
/// (`call` makes its future from the request parts) with the decision
/// headers and the lease to give back after the response, or the refusal
/// that replaces its response.
fn answered<S, ReqBody>(
    parts: Parts,
    bridge: &TransportBridge,
    mut result: Answer,
    shaper: Option<&RefusalShaper>,
    call: impl FnOnce(Parts) -> S::Future,
) -> State<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    let settings = bridge.settings();
    let (reason, response) = match &mut result {
        Err(rejection) => (Refusal::Rejected(rejection), rejection_response(rejection, settings)),
        Ok((evaluation, lease)) => match refusal(evaluation, settings) {
            Some(response) => {
                // Refused, yet maybe holding a lease (an `Indeterminate`
                // answer): given back now.
                drop(lease.take());
                (Refusal::Outcome(evaluation), response)
            }
            None => {
                let future = call(parts);
                let headers = Some(decision_headers(evaluation));
                return State::Running { future, headers, lease: lease.take() };
            }
        },
    };
    let response = match shaper {
        Some(shaper) => shaper.shape(reason, response),
        None => response,
    };
    State::Refused { response: Some(response) }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<Response<Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Evaluating { evaluation, shaper, inner, body } => {
                    let (parts, bridge, result) = ready!(evaluation.as_mut().poll(cx));
                    answered(parts, &bridge, result, shaper.as_ref(), |parts| {
                        let (mut inner, body) = inner.take().zip(body.take()).expect(
                            "the inner service and body are taken only when leaving this state",
                        );
                        inner.call(Request::from_parts(parts, body))
                    })
                }
                StateProj::Running { future, headers, lease } => {
                    let response = ready!(future.poll(cx))?;
                    let mut response = match lease.take() {
                        Some(lease) => {
                            response.map(|body| Body::new(ReleasingBody::new(body, lease)))
                        }
                        None => response.map(Body::new),
                    };
                    // Ours replace any the handler set.
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Refused { response } => {
                    let response = response.take().expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(response));
                }
            };
            this.state.set(next);
        }
    }
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Evaluating { .. } => "evaluating",
            State::Running { .. } => "running",
            State::Refused { .. } => "refused",
        };
        f.debug_struct("ResponseFuture").field("state", &state).finish()
    }
}
