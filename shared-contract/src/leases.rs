//! The in-flight leases one concurrency key holds.

use std::fmt;
use std::slice;

use crate::evaluation::EvaluationId;

/// One lease a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLease {
    /// The lease id: the evaluation id of the request that took it.
    pub id: EvaluationId,
    /// Epoch ms; from then on the lease is gone (`expires_at <= t`).
    pub expires_at: u64,
}

/// The leases of one key, in the order they were taken.
#[derive(Clone, Default, PartialEq, Eq)]
#[allow(
    clippy::box_collection,
    reason = "one pointer in every key, not a Vec's three: only concurrency keys allocate"
)]
pub struct Leases(Option<Box<Vec<HeldLease>>>);

impl Leases {
    /// No lease, without allocating.
    pub(crate) const NONE: Self = Self(None);

    /// Every lease stored, expired ones included, oldest first.
    pub fn iter(&self) -> slice::Iter<'_, HeldLease> {
        self.0.as_deref().map_or(&[][..], Vec::as_slice).iter()
    }

    /// How many leases are stored, expired ones included.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |held| held.len())
    }

    /// Whether no lease is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Leases the buffer has room for.
    #[cfg(test)]
    fn allocated(&self) -> usize {
        self.0.as_ref().map_or(0, |held| held.capacity())
    }

    /// How many leases are live at `t` (`expires_at > t`).
    pub fn live(&self, t: u64) -> u64 {
        self.iter().filter(|lease| lease.expires_at > t).count() as u64
    }

    /// The lease of `id` if it is live at `t`.
    pub fn find_live(&self, id: EvaluationId, t: u64) -> Option<&HeldLease> {
        self.iter().find(|lease| lease.id == id && lease.expires_at > t)
    }

    /// The latest expiry of a lease live at `t`.
    pub fn latest_live_expiry(&self, t: u64) -> Option<u64> {
        self.iter().map(|lease| lease.expires_at).filter(|&at| at > t).max()
    }

    /// Removes the lease of `id`; true when it was live at `now` (a slot was
    /// freed). No other lease is touched: a release moves no mark.
    pub fn release(&mut self, id: EvaluationId, now: u64) -> bool {
        let Some(held) = &mut self.0 else { return false };
        let Some(at) = held.iter().position(|lease| lease.id == id) else { return false };
        let released = held.remove(at).expires_at > now;
        if held.is_empty() {
            self.0 = None;
        }
        released
    }

    /// Drops the leases expired at `t`.
    pub(crate) fn drop_expired(&mut self, t: u64) {
        if let Some(held) = &mut self.0 {
            held.retain(|lease| lease.expires_at > t);
            if held.is_empty() {
                self.0 = None;
            }
        }
    }

    /// Adds a lease (the caller checked the bound and that `id` holds none).
    pub(crate) fn push(&mut self, lease: HeldLease) {
        // Most keys hold one or two leases: room for one, not the default four.
        self.0.get_or_insert_with(|| Box::new(Vec::with_capacity(1))).push(lease);
    }
}

impl fmt::Debug for Leases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl FromIterator<HeldLease> for Leases {
    /// Rebuilds stored leases.
    fn from_iter<I: IntoIterator<Item = HeldLease>>(leases: I) -> Self {
        let held: Vec<HeldLease> = leases.into_iter().collect();
        if held.is_empty() { Self(None) } else { Self(Some(Box::new(held))) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> EvaluationId {
        EvaluationId::from_uuid(uuid::Uuid::from_u128(n))
    }

    fn lease(n: u128, expires_at: u64) -> HeldLease {
        HeldLease { id: id(n), expires_at }
    }

    #[test]
    fn a_lease_is_live_until_its_expiry_exclusive() {
        let leases: Leases = [lease(1, 100), lease(2, 200)].into_iter().collect();
        assert_eq!((leases.live(99), leases.live(100), leases.live(200)), (2, 1, 0));
        assert!(leases.find_live(id(1), 99).is_some());
        assert!(leases.find_live(id(1), 100).is_none());
        assert_eq!(leases.latest_live_expiry(150), Some(200));
        assert_eq!(leases.latest_live_expiry(200), None);
    }

    #[test]
    fn release_frees_a_live_lease_once_and_never_another() {
        let mut leases: Leases =
            [lease(1, 100), lease(2, 200), lease(3, 300)].into_iter().collect();
        assert!(leases.release(id(2), 50));
        assert!(!leases.release(id(2), 50), "a second release finds nothing");
        assert_eq!(leases.iter().map(|l| l.id).collect::<Vec<_>>(), [id(1), id(3)]);
        // Expired at 150, lease 1 stays for a lagging clock: a release of
        // another lease touches only its own.
        assert!(leases.release(id(3), 150));
        assert_eq!(leases.iter().copied().collect::<Vec<_>>(), [lease(1, 100)]);
        // An expired lease is not held: releasing it frees no slot, and
        // removes it.
        assert!(!leases.release(id(1), 100));
        assert_eq!((leases.len(), leases.allocated()), (0, 0));
        assert!(!Leases::default().release(id(9), 0));
    }

    #[test]
    fn expired_leases_are_dropped_and_stored_ones_round_trip() {
        let mut leases = Leases::default();
        leases.push(lease(1, 100));
        leases.push(lease(2, 200));
        let rebuilt: Leases = leases.iter().copied().collect();
        assert_eq!(rebuilt, leases);
        leases.drop_expired(100);
        assert_eq!(leases.iter().copied().collect::<Vec<_>>(), [lease(2, 200)]);
        leases.drop_expired(200);
        assert_eq!((leases.is_empty(), leases.allocated()), (true, 0));
        let empty: Leases = std::iter::empty().collect();
        assert_eq!(empty, Leases::NONE);
    }
}
