//! What the layer hands its services and each request's future: the
//! bridge in force and the refusal shaper. Below `layer`, `service` and
//! `future`, which import in that direction only (tower-http's layout).

use std::sync::Arc;

use crate::bridge::TransportBridge;
use crate::refusal::RefusalShaper;
use crate::switch::BridgeSwitch;

/// What an enabled layer and its services share: the bridge in force and
/// the refusal shaper.
#[derive(Debug, Clone)]
pub(crate) struct LimiterSwitch {
    pub(crate) bridge: BridgeSwitch,
    pub(crate) shaper: Option<RefusalShaper>,
}

impl LimiterSwitch {
    /// What one request runs with, from its start to its response.
    pub(crate) fn current(&self) -> Limiter {
        Limiter { bridge: self.bridge.current(), shaper: self.shaper.clone() }
    }
}

/// What one request's future holds: the bridge it started with.
#[derive(Debug, Clone)]
pub(crate) struct Limiter {
    pub(crate) bridge: Arc<TransportBridge>,
    pub(crate) shaper: Option<RefusalShaper>,
}
