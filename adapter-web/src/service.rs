//! `RateLimitService`: the tower service the layer wraps around a handler.

use std::task::{Context, Poll};

use axum::BoxError;
use axum::body::{Body, Bytes, HttpBody};
use http::{Request, Response};
use tower::Service;

use crate::future::ResponseFuture;
use crate::limiter::LimiterSwitch;

/// Asks the bridge before every request; runs `inner` only when allowed.
/// Built by [`crate::RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimitService<S> {
    inner: S,
    limiter: Option<LimiterSwitch>,
}

impl<S> RateLimitService<S> {
    pub(crate) fn new(inner: S, limiter: Option<LimiterSwitch>) -> Self {
        Self { inner, limiter }
    }
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
        let Some(limiter) = &self.limiter else {
            return ResponseFuture::pass_through(self.inner.call(request));
        };
        ResponseFuture::evaluating(limiter.current(), &mut self.inner, request)
    }
}
