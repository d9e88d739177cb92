//! The tower middleware, and the `BridgeSwitch` holding the bridge in force.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use arc_swap::ArcSwap;
use axum::BoxError;
use axum::body::{Body, Bytes, HttpBody};
use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::answer::{DecisionHeaders, Refusal, RefusalShaper, decision_headers};
use crate::bridge::{Answer, Asked, Held, TransportBridge};
use crate::lease::ReleasingBody;
use crate::usage::RateLimitUsage;

/// Rate-limits every request through a [`TransportBridge`], or passes
/// everything through when built with [`RateLimitLayer::disabled`].
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    switch: Option<BridgeSwitch>,
    shaper: Option<RefusalShaper>,
}

impl RateLimitLayer {
    /// A layer that evaluates every request through `bridge`.
    pub fn new(bridge: Arc<TransportBridge>) -> Self {
        Self::switched(BridgeSwitch::new(bridge))
    }

    /// A layer that evaluates each request through the bridge `switch` holds
    /// when it starts: replace it there to reload.
    pub fn switched(switch: BridgeSwitch) -> Self {
        Self { switch: Some(switch), shaper: None }
    }

    /// The switch of an enabled layer; `None` when it limits nothing.
    pub fn switch(&self) -> Option<&BridgeSwitch> {
        self.switch.as_ref()
    }

    /// A layer that passes every request straight through (provider `disabled`).
    pub fn disabled() -> Self {
        Self { switch: None, shaper: None }
    }

    /// Replaces each default problem+json refusal with what `shaper` makes of it.
    pub fn with_refusal_shaper(
        mut self,
        shaper: impl Fn(Refusal<'_>, Response<Body>) -> Response<Body> + Send + Sync + 'static,
    ) -> Self {
        self.shaper = Some(RefusalShaper(Arc::new(shaper)));
        self
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService { inner, layer: self.clone() }
    }
}

/// Asks the bridge before every request; runs `inner` only when allowed.
#[derive(Debug, Clone)]
pub struct RateLimitService<S> {
    inner: S,
    layer: RateLimitLayer,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    ReqBody: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let RateLimitLayer { switch: Some(switch), shaper } = &self.layer else {
            let future = self.inner.call(request);
            let headers = DecisionHeaders::default();
            let held = Held::default();
            return ResponseFuture { state: State::Running { future, headers, held } };
        };
        ResponseFuture::evaluating(switch.current(), shaper.clone(), &mut self.inner, request)
    }
}

/// A port answer still to come, handing back the request parts and the bridge.
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
        // response gets these headers.
        Running {
            #[pin]
            future: S::Future,
            headers: DecisionHeaders,
            held: Held,
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
    /// Asks the bridge at once: an answer without waiting is used here,
    /// nothing boxed; only a provider that waits leaves it to the future.
    fn evaluating(
        bridge: Arc<TransportBridge>,
        shaper: Option<RefusalShaper>,
        ready: &mut S,
        request: Request<ReqBody>,
    ) -> Self {
        let (parts, body) = request.into_parts();
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

/// The state the bridge's answer leads to: `call` running, or the refusal.
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
    let reason = match &mut result {
        Err(refusal) => *refusal,
        Ok((evaluation, held)) if !evaluation.admits() => {
            drop(std::mem::take(held));
            Refusal::Outcome(evaluation)
        }
        Ok((evaluation, held)) => {
            let future = call(parts);
            let headers = decision_headers(evaluation);
            return State::Running { future, headers, held: std::mem::take(held) };
        }
    };
    let settings = bridge.settings();
    let response = reason.response(&settings.problem_type_base, settings.failure_retry_after);
    let response = match shaper {
        Some(RefusalShaper(shape)) => shape(reason, response),
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
                StateProj::Running { future, headers, held } => {
                    let response = ready!(future.poll(cx))?;
                    let Held { lease, reservation } = std::mem::take(held);
                    // Settled with what the handler reported, once the body ends.
                    let usage = response.extensions().get::<RateLimitUsage>().cloned();
                    let settle = reservation.zip(usage).map(|(held, usage)| held.settled_by(usage));
                    let mut response = match (lease, settle) {
                        (None, None) => response.map(Body::new),
                        guard => response
                            .map(|inner| Body::new(ReleasingBody { inner, guard: Some(guard) })),
                    };
                    // Ours replace any the handler set.
                    std::mem::take(headers).apply(response.headers_mut());
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
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// The bridge in force.
#[derive(Debug, Clone)]
pub struct BridgeSwitch {
    current: Arc<ArcSwap<TransportBridge>>,
}

impl BridgeSwitch {
    /// A switch holding `bridge`.
    pub fn new(bridge: Arc<TransportBridge>) -> Self {
        Self { current: Arc::new(ArcSwap::new(bridge)) }
    }

    /// The bridge in force now.
    pub fn current(&self) -> Arc<TransportBridge> {
        self.current.load_full()
    }

    /// Puts `bridge` in force for every request that starts from now on;
    /// returns the one it replaces (requests already running keep it).
    pub fn replace(&self, bridge: Arc<TransportBridge>) -> Arc<TransportBridge> {
        self.current.swap(bridge)
    }
}
