//! `BridgeSwitch`: the bridge requests are evaluated through now, replaced
//! whole when the policies are reloaded.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::bridge::TransportBridge;

/// The bridge in force. A reload builds a whole new [`TransportBridge`]
/// (its port holds the new policy table, its prepared sets the new header
/// descriptions) and [`replace`](Self::replace)s it here; a request takes
/// the bridge once when it starts and keeps it to its response, so it
/// never sees half of one table and half of the other.
///
/// Taking the bridge is lock-free: every request pays for it.
#[derive(Clone)]
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

impl fmt::Debug for BridgeSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BridgeSwitch").field("current", &self.current.load()).finish()
    }
}
