//! `EvaluationId`: what a provider's records and leases know one evaluation by.

use std::fmt;

use uuid::Uuid;

/// A server-generated id for one evaluation. A provider with dedupe enabled
/// answers a repeat of the same id from its record instead of charging again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EvaluationId {
    uuid: Uuid,
    // An id its minter never asks with again needs no record: only a
    // provider's own retry can repeat it, and one that never retries (the
    // in-process step) then keeps none.
    repeats: bool,
}

impl EvaluationId {
    /// A fresh random id (UUID v4) the caller may ask with again (a retried
    /// job). Never derive one from client input.
    pub fn random() -> Self {
        Self::from_uuid(Uuid::new_v4())
    }

    /// A fresh random id its caller never asks with again: each front's
    /// per-request id. A provider that retries itself still dedupes its own
    /// repeat; the in-process step keeps no record of it.
    pub fn once() -> Self {
        Self { uuid: Uuid::new_v4(), repeats: false }
    }

    /// Wraps an existing UUID (tests, replays), one that may repeat.
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self { uuid, repeats: true }
    }

    /// The same id, never asked with again.
    #[must_use]
    pub const fn minted_once(self) -> Self {
        Self { repeats: false, ..self }
    }

    /// Whether a caller may ask with this id again ([`Self::once`]: no).
    pub const fn may_repeat(&self) -> bool {
        self.repeats
    }

    /// The UUID.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.uuid
    }

    /// The 16 bytes of the UUID, the form a provider stores.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        self.uuid.as_bytes()
    }
}

impl fmt::Display for EvaluationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.uuid.fmt(f)
    }
}
