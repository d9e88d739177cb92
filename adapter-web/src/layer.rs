//! `RateLimitLayer`: the tower layer that puts the limiter in front of a
//! service (an axum `Router` via `Router::layer`, or any tower stack).

use std::sync::Arc;

use axum::body::Body;
use http::Response;
use tower::Layer;

use crate::bridge::TransportBridge;
use crate::limiter::LimiterSwitch;
use crate::refusal::{Refusal, RefusalShaper};
use crate::service::RateLimitService;
use crate::switch::BridgeSwitch;

/// Rate-limits every request through a [`TransportBridge`], or passes
/// everything through when built with [`RateLimitLayer::disabled`].
///
/// On an axum `Router`, add it with `Router::layer` (not as an outer
/// service around the router): route layers run after routing, so axum's
/// `MatchedPath` is there and the operation is the route template. To
/// count requests by something else (a tenant, an account), insert an
/// [`crate::AuthenticatedPrincipal`] in a layer that runs before this one;
/// to charge a request more than 1, insert a [`crate::RateLimitCost`] the
/// same way.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Option<LimiterSwitch>,
}

impl RateLimitLayer {
    /// A layer that evaluates every request through `bridge`.
    pub fn new(bridge: Arc<TransportBridge>) -> Self {
        Self::switched(BridgeSwitch::new(bridge))
    }

    /// A layer that evaluates every request through the bridge `switch`
    /// holds when the request starts: replace it there to reload.
    pub fn switched(switch: BridgeSwitch) -> Self {
        Self { limiter: Some(LimiterSwitch { bridge: switch, shaper: None }) }
    }

    /// The switch of an enabled layer.
    pub fn switch(&self) -> Option<&BridgeSwitch> {
        self.limiter.as_ref().map(|limiter| &limiter.bridge)
    }

    /// A layer that passes every request straight through: the
    /// `disabled` provider switch.
    pub fn disabled() -> Self {
        Self { limiter: None }
    }

    /// Replaces the default problem+json refusals (`429`, `503`, `400`,
    /// `500`) with what `shaper` makes of them; it receives the reason and
    /// the default response, headers included. The handler never runs for
    /// a refused request, whatever the shaper returns. No effect on a
    /// disabled layer.
    pub fn with_refusal_shaper(
        mut self,
        shaper: impl Fn(Refusal<'_>, Response<Body>) -> Response<Body> + Send + Sync + 'static,
    ) -> Self {
        if let Some(limiter) = &mut self.limiter {
            limiter.shaper = Some(RefusalShaper(Arc::new(shaper)));
        }
        self
    }

    /// Whether this layer limits at all.
    pub fn is_enabled(&self) -> bool {
        self.limiter.is_some()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService::new(inner, self.limiter.clone())
    }
}
