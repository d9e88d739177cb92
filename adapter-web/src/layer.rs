//! `RateLimitLayer`: the tower layer that puts the limiter in front of a
//! service (an axum `Router` via `Router::layer`, or any tower stack).

use std::sync::Arc;

use tower::Layer;

use crate::bridge::TransportBridge;
use crate::service::RateLimitService;

/// Rate-limits every request through a [`TransportBridge`], or passes
/// everything through when built with [`RateLimitLayer::disabled`].
///
/// On an axum `Router`, add it with `Router::layer` (not as an outer
/// service around the router): route layers run after routing, so axum's
/// `MatchedPath` is there and the operation is the route template.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bridge: Option<Arc<TransportBridge>>,
}

impl RateLimitLayer {
    /// A layer that evaluates every request through `bridge`.
    pub fn new(bridge: Arc<TransportBridge>) -> Self {
        Self { bridge: Some(bridge) }
    }

    /// A layer that passes every request straight through: the
    /// `disabled` provider switch.
    pub fn disabled() -> Self {
        Self { bridge: None }
    }

    /// Whether this layer limits at all.
    pub fn is_enabled(&self) -> bool {
        self.bridge.is_some()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService::new(inner, self.bridge.clone())
    }
}
