//! `Refusal`: the hook that lets a service reshape the edge's refusals
//! (the move `tower_governor` users know as `error_handler`).

use std::fmt;
use std::sync::Arc;

use axum::body::Body;
use http::Response;

use crate::bridge::BridgeEvaluation;
use crate::rejection::EdgeRejection;

/// Why the edge answered instead of the handler.
#[derive(Debug, Clone, Copy)]
pub enum Refusal<'a> {
    /// The port's answer was not an allowed decision (`429` or `503`).
    Outcome(&'a BridgeEvaluation),
    /// The request was refused before evaluation (`400` or `500`).
    Rejected(&'a EdgeRejection),
}

/// The shaper's signature: the reason and the default response in, the
/// response to send out.
type ShapeFn = dyn Fn(Refusal<'_>, Response<Body>) -> Response<Body> + Send + Sync;

/// Rewrites the default problem+json refusal. The handler has not run and
/// will not run whatever the shaper returns: it shapes the answer, it
/// cannot admit the request.
#[derive(Clone)]
pub(crate) struct RefusalShaper(pub(crate) Arc<ShapeFn>);

impl RefusalShaper {
    pub(crate) fn shape(&self, refusal: Refusal<'_>, response: Response<Body>) -> Response<Body> {
        (self.0)(refusal, response)
    }
}

impl fmt::Debug for RefusalShaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RefusalShaper(..)")
    }
}
