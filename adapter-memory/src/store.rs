//! `MemoryStore`: the sharded in-process map of keys, with amortized
//! reclamation of expired keys and a hard bound on the keys it holds. A new
//! key in a full shard first makes it drop every key expired or whole again
//! (absence then means the same as the key's state), and is refused
//! ([`StoreFull`]) when that frees no slot: a key in use is never dropped, so
//! an exhausted subject keeps its refusal through any flood.

use std::collections::HashMap;
use std::fmt;
use std::iter::Sum;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use shared_contract::{
    DEDUP_RECORD_BYTES, EvaluationId, HELD_LEASE_BYTES, KeyRules, KeyState, MAX_POLICY_SET,
    PolicyId, SetMember, SubjectDigest,
};

use crate::entry::Entry;
pub(crate) use crate::map::KeySlot;
use crate::map::{Key, KeyHasher, KeyMap};

/// Most shards a store uses: the index comes from bits 32..48 of the subject's hash.
const MAX_SHARDS: usize = 1 << 16;
/// A shard sweeps at most once per this many operations (or a quarter of its
/// size after the last sweep), or on growing to twice that size: O(1) amortized.
const SWEEP_MIN_OPS: usize = 1024;
/// A swept map with over four times (and this many) more slots than keys shrinks.
const SHRINK_MIN_CAPACITY: usize = 64;
/// Keys a store holds unless told otherwise (`memory.max-keys`): a few
/// hundred MB at worst (docs/benchmarks.md).
pub const DEFAULT_MAX_KEYS: usize = 500_000;
/// A full shard reclaims at most once per this share of its keys in
/// operations, so a flood at the bound costs O(1) each.
const RECLAIM_SHARE: usize = 8;
const DEFAULT_MAX_KEYS_NONZERO: NonZeroUsize = NonZeroUsize::new(DEFAULT_MAX_KEYS).expect("not 0");

/// The memory provider's shared state: adapters built over one store (a
/// reload's) share its counters. The subject picks the shard, so every key of
/// one subject's policy set is under one lock.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    hasher: KeyHasher,
    namespaces: Mutex<Namespaces>,
    /// Keys one shard holds at most.
    shard_cap: usize,
    /// The largest slack of a namespace: no key is whole before its expiry less this.
    max_slack: AtomicU64,
}

/// The policy revisions the store has numbered.
#[derive(Default)]
struct Namespaces {
    numbers: HashMap<(PolicyId, u32), u32>,
    /// By namespace number: the policy's `ttl_slack_millis` (the smallest given).
    slack: Vec<u64>,
}

/// A request needed a new key and the store is full: nothing was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreFull;

/// Keeps each shard's lock on its own cache lines, so neighbouring shards do not contend.
#[repr(align(128))]
struct CachePadded<T>(T);

struct Shard {
    map: KeyMap,
    ops_since_sweep: usize,
    len_after_sweep: usize,
    /// A lower bound of every entry's expiry; no sweep before it.
    earliest_expiry: u64,
    /// Requests refused because their key would have been new here.
    refused: u64,
}

impl MemoryStore {
    /// A store with the default shard count holding at most [`DEFAULT_MAX_KEYS`] keys.
    pub fn new() -> Self {
        Self::with_max_keys(DEFAULT_MAX_KEYS_NONZERO)
    }

    /// A store with the default shard count (about four per core) holding at most `max_keys`.
    pub fn with_max_keys(max_keys: NonZeroUsize) -> Self {
        let cores = std::thread::available_parallelism().map_or(4, NonZeroUsize::get);
        Self::with_shards_and_max_keys(cores.saturating_mul(4).max(16), max_keys)
    }

    /// A store with `shards` shards holding at most [`DEFAULT_MAX_KEYS`].
    pub fn with_shards(shards: usize) -> Self {
        Self::with_shards_and_max_keys(shards, DEFAULT_MAX_KEYS_NONZERO)
    }

    /// A store with `shards` shards (a power of two, at most `max_keys /`
    /// [`MAX_POLICY_SET`]), each holding `max_keys / shards`: the seeded
    /// hash fills them evenly.
    pub fn with_shards_and_max_keys(shards: usize, max_keys: NonZeroUsize) -> Self {
        let count = shards.max(1).checked_next_power_of_two().unwrap_or(MAX_SHARDS).min(MAX_SHARDS);
        // Room in a shard for a whole set of one subject (its keys share the
        // subject's shard), or a small bound would refuse a set of several
        // policies on an empty store, and only on a host with more cores.
        let room = (max_keys.get() / MAX_POLICY_SET).max(1);
        let count = count.min(1 << room.ilog2());
        let hasher = KeyHasher::new();
        let shards =
            (0..count).map(|_| CachePadded(Mutex::new(Shard::new(hasher.clone())))).collect();
        Self {
            inner: Arc::new(StoreInner {
                shards,
                hasher,
                namespaces: Mutex::new(Namespaces::default()),
                shard_cap: max_keys.get() / count,
                max_slack: AtomicU64::new(0),
            }),
        }
    }

    /// The most keys the store holds: the bound rounded down to a multiple of the shards.
    pub fn max_keys(&self) -> usize {
        self.inner.shard_cap * self.inner.shards.len()
    }

    /// Requests refused because their key would have been new in a full store.
    pub fn refused_keys(&self) -> u64 {
        self.sum_shards(|shard| shard.refused)
    }

    /// Keys currently held, including expired ones not swept yet.
    pub fn live_entries(&self) -> usize {
        self.sum_shards(|shard| shard.map.len())
    }

    /// Dedupe record and lease bytes the keys hold, counted as `max-stored-bytes`
    /// and Redis count them: with [`Self::live_entries`], how a soak tells a leak
    /// from an allocator keeping freed pages.
    pub fn stored_bytes(&self) -> u64 {
        let (per_record, per_lease) = (u64::from(DEDUP_RECORD_BYTES), u64::from(HELD_LEASE_BYTES));
        self.sum_shards(|shard| {
            let held = shard.map.entries().filter_map(Entry::state);
            held.map(|s| s.records.len() as u64 * per_record + s.leases.len() as u64 * per_lease)
                .sum()
        })
    }

    /// Removes every key expired at `now_epoch_millis` (in a full shard, each
    /// key whole again too) and shrinks emptied maps; the number removed.
    pub fn purge_expired(&self, now_epoch_millis: u64) -> usize {
        self.sum_shards(|shard| {
            if shard.map.len() >= self.inner.shard_cap {
                self.reclaim(shard, now_epoch_millis)
            } else if now_epoch_millis < shard.earliest_expiry {
                // Nothing expires yet: a periodic purge costs one lock per shard.
                0
            } else {
                shard.sweep(now_epoch_millis, None)
            }
        })
    }

    fn sum_shards<T: Sum>(&self, of: impl Fn(&mut Shard) -> T) -> T {
        self.inner.shards.iter().map(|shard| of(&mut shard.0.lock())).sum()
    }

    /// The namespace number of a policy revision, the same for the same (id,
    /// revision); `slack` is the policy's `ttl_slack_millis`.
    pub(crate) fn namespace(&self, id: &PolicyId, revision: u32, slack: u64) -> u32 {
        let mut names = self.inner.namespaces.lock();
        let next = u32::try_from(names.numbers.len()).unwrap_or(u32::MAX);
        let number = *names.numbers.entry((id.clone(), revision)).or_insert(next);
        let at = usize::try_from(number).unwrap_or(usize::MAX);
        if let Some(known) = names.slack.get_mut(at) {
            *known = (*known).min(slack);
        } else if at == names.slack.len() {
            names.slack.push(slack);
        }
        self.inner.max_slack.fetch_max(slack, Ordering::Relaxed);
        number
    }

    /// Drops every key of a full `shard` expired or whole again at `now`,
    /// unless none can be yet (the earliest expiry less the largest slack);
    /// the number dropped.
    fn reclaim(&self, shard: &mut Shard, now: u64) -> usize {
        let max_slack = self.inner.max_slack.load(Ordering::Relaxed);
        if now.saturating_add(max_slack) < shard.earliest_expiry {
            return 0;
        }
        // Copied out, so no other lock is held over the scan.
        let slack = self.inner.namespaces.lock().slack.clone();
        shard.sweep(now, Some(&slack))
    }

    /// Whether `shard` has a slot for each of `missing` new keys, after a
    /// reclaim if one is due (once per `len / RECLAIM_SHARE` operations);
    /// counts a refusal when it has not.
    fn has_room(&self, shard: &mut Shard, now: u64, missing: impl Fn(&Shard) -> usize) -> bool {
        let cap = self.inner.shard_cap;
        if shard.map.len() + missing(shard) <= cap {
            return true;
        }
        if shard.ops_since_sweep >= shard.map.len() / RECLAIM_SHARE {
            self.reclaim(shard, now);
            if shard.map.len() + missing(shard) <= cap {
                return true;
            }
        }
        shard.refused += 1;
        shard.after_op(now, u64::MAX);
        false
    }

    /// [`Self::with_set`] for a set of one, the usual case: one member, and
    /// one map lookup whose entry is held across the step.
    pub(crate) fn with_one<R>(
        &self,
        subject: &SubjectDigest,
        (slot, rules): (KeySlot, &KeyRules),
        now: u64,
        step: impl FnOnce(&mut [SetMember<'_>]) -> R,
    ) -> Result<R, StoreFull> {
        let (shard, hash) = self.shard(subject);
        let key = self.inner.hasher.key(slot, subject, hash);
        let mut members = [SetMember::new(rules, None)];
        let mut guard = shard.lock();
        let shard = &mut *guard;
        let (result, expiry) = if let Some(entry) = shard.map.get_mut(&key) {
            members[0].state = entry.take(now);
            let result = step(&mut members);
            let [member] = members;
            (result, entry.put(member.state, member.write))
        } else {
            // A full shard is the only cost on this path: one compare.
            if shard.map.len() >= self.inner.shard_cap && !self.has_room(shard, now, |_| 1) {
                return Err(StoreFull);
            }
            let result = step(&mut members);
            let [member] = members;
            (result, shard.map.insert_written(&key, member.state, member.write))
        };
        shard.after_op(now, expiry);
        Ok(result)
    }

    /// Runs `step` over the keys of one subject's policy set (1 to
    /// [`MAX_POLICY_SET`]) under its shard lock, in fixed arrays: each key's
    /// state moves into its member (an expired key reads as absent) and back
    /// with its new expiry; a new key is inserted only if the step wrote it.
    /// [`StoreFull`], and `step` does not run, when a new key of an enforced
    /// policy finds no slot; a shadow policy's is then decided unstored.
    pub(crate) fn with_set<R>(
        &self,
        subject: &SubjectDigest,
        keys: &[(KeySlot, &KeyRules)],
        now: u64,
        step: impl FnOnce(&mut [SetMember<'_>]) -> R,
    ) -> Result<R, StoreFull> {
        const N: usize = MAX_POLICY_SET;
        let n = keys.len().min(N);
        let last = n.saturating_sub(1);
        let (shard, hash) = self.shard(subject);
        let lookups: [Key<'_>; N] =
            std::array::from_fn(|i| self.inner.hasher.key(keys[i.min(last)].0, subject, hash));
        let mut members: [SetMember<'_>; N] =
            std::array::from_fn(|i| SetMember::new(keys[i.min(last)].1, None));
        let mut guard = shard.lock();
        let shard = &mut *guard;
        // New keys left out for want of room: shadow policies' only.
        let mut unstored = [false; N];
        // Counted only when the shard is nearly full, before any state moves out.
        if shard.map.len() + n > self.inner.shard_cap {
            let missing = |shard: &Shard, shadow: bool| {
                let new = lookups[..n].iter().zip(keys).filter(|(key, (_, rules))| {
                    (shadow || rules.enforced()) && shard.map.get(key).is_none()
                });
                new.count()
            };
            if !self.has_room(shard, now, |shard| missing(shard, false)) {
                return Err(StoreFull);
            }
            // A shadow policy never refuses a set: with no slot for its new
            // key it is decided on a fresh budget and not stored.
            if shard.map.len() + missing(shard, true) > self.inner.shard_cap {
                for ((unstored, key), (_, rules)) in unstored.iter_mut().zip(&lookups).zip(keys) {
                    *unstored = !rules.enforced() && shard.map.get(key).is_none();
                }
            }
        }
        for (member, key) in members[..n].iter_mut().zip(&lookups) {
            member.state = shard.map.get_mut(key).and_then(|entry| entry.take(now));
        }
        let result = step(&mut members[..n]);
        let mut earliest = u64::MAX;
        for ((member, key), unstored) in members[..n].iter_mut().zip(&lookups).zip(unstored) {
            let (state, write) = (member.state.take(), member.write);
            if unstored {
                continue;
            }
            let expiry = match shard.map.get_mut(key) {
                Some(entry) => entry.put(state, write),
                None => shard.map.insert_written(key, state, write),
            };
            earliest = earliest.min(expiry);
        }
        shard.after_op(now, earliest);
        Ok(result)
    }

    /// A copy of one key's state at `now` (`None` when absent or expired), for
    /// an operator's inspect: nothing moves or counts as an operation.
    pub(crate) fn peek(
        &self,
        slot: KeySlot,
        subject: &SubjectDigest,
        now: u64,
    ) -> Option<KeyState> {
        let (shard, hash) = self.shard(subject);
        let shard = shard.lock();
        let entry = shard.map.get(&self.inner.hasher.key(slot, subject, hash))?;
        (entry.expires_at > now).then(|| entry.state().cloned()).flatten()
    }

    /// Removes the live lease `id` from the keys `slots` of `subject` under its
    /// shard lock, moving nothing else: true when one was removed.
    pub(crate) fn release(
        &self,
        subject: &SubjectDigest,
        slots: impl IntoIterator<Item = KeySlot>,
        id: EvaluationId,
        now: u64,
    ) -> bool {
        let (shard, hash) = self.shard(subject);
        let mut shard = shard.lock();
        let mut released = false;
        for slot in slots {
            let key = self.inner.hasher.key(slot, subject, hash);
            if let Some(state) = shard.map.get_mut(&key).and_then(|entry| entry.live_state(now)) {
                released |= state.leases.release(id, now);
            }
        }
        released
    }

    /// Removes one key with its dedupe records (an operator's reset).
    pub(crate) fn remove(&self, slot: KeySlot, subject: &SubjectDigest) {
        let (shard, hash) = self.shard(subject);
        shard.lock().map.remove(&self.inner.hasher.key(slot, subject, hash));
    }

    /// The shard of every key of `subject`, and the subject's hash, from
    /// which its keys' hashes derive: the digest is hashed once per decision.
    fn shard(&self, subject: &SubjectDigest) -> (&Mutex<Shard>, u64) {
        let hash = self.inner.hasher.subject(subject);
        // The mask keeps the index below the (power of two) shard count.
        let index = usize::try_from(hash >> 32).unwrap_or(0) & (self.inner.shards.len() - 1);
        (&self.inner.shards[index].0, hash)
    }

    #[cfg(test)]
    pub(crate) fn shard_count(&self) -> usize {
        self.inner.shards.len()
    }

    /// Slots allocated over all shards, to show that memory falls.
    #[cfg(test)]
    pub(crate) fn allocated_slots(&self) -> usize {
        self.sum_shards(|shard| shard.map.capacity())
    }

    #[cfg(test)]
    pub(crate) fn inspect<R>(
        &self,
        slot: KeySlot,
        subject: &SubjectDigest,
        look: impl FnOnce(Option<&Entry>) -> R,
    ) -> R {
        let (shard, hash) = self.shard(subject);
        look(shard.lock().map.get(&self.inner.hasher.key(slot, subject, hash)))
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .finish_non_exhaustive()
    }
}

impl Shard {
    fn new(hasher: KeyHasher) -> Self {
        Self {
            map: KeyMap::new(hasher),
            ops_since_sweep: 0,
            len_after_sweep: 0,
            earliest_expiry: u64::MAX,
            refused: 0,
        }
    }

    /// Counts an operation (whose writes expire from `expiry` on; `u64::MAX`
    /// for none) and sweeps when one is due and something can have expired.
    fn after_op(&mut self, now: u64, expiry: u64) {
        self.earliest_expiry = self.earliest_expiry.min(expiry);
        self.ops_since_sweep += 1;
        let due = self.ops_since_sweep >= SWEEP_MIN_OPS.max(self.len_after_sweep / 4)
            || self.map.len() >= SWEEP_MIN_OPS.max(self.len_after_sweep.saturating_mul(2));
        if due && now >= self.earliest_expiry {
            self.sweep(now, None);
        }
    }

    /// Removes entries expired at `now` (with `slack` by namespace, also those
    /// whole again), recomputes the earliest expiry and shrinks a map left far
    /// below its capacity; the removed count.
    fn sweep(&mut self, now: u64, slack: Option<&[u64]>) -> usize {
        let before = self.map.len();
        let mut earliest = u64::MAX;
        self.map.retain(|held| {
            // A namespace never numbered has no slack to subtract.
            let at = usize::try_from(held.slot.namespace).unwrap_or(usize::MAX);
            let slack = slack.and_then(|slack| slack.get(at)).copied().unwrap_or(0);
            let keep = held.entry.expires_at.saturating_sub(slack) > now;
            if keep {
                earliest = earliest.min(held.entry.expires_at);
            }
            keep
        });
        let len = self.map.len();
        self.earliest_expiry = earliest;
        self.ops_since_sweep = 0;
        self.len_after_sweep = len;
        if self.map.capacity() > SHRINK_MIN_CAPACITY.max(len.saturating_mul(4)) {
            self.map.shrink_to(len.saturating_mul(2));
        }
        before - len
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::{
        Algorithm, AlgorithmState, EvaluationDedupPolicy, EvaluationId, KeyRules, OperationDigest,
        RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy, evaluate_set,
    };

    use super::*;

    /// A shard holds a whole set of one subject, however many cores ask
    /// for shards (found from outside: 32 keys in 16 shards of 2 refused a
    /// set of four policies on an empty store).
    #[test]
    fn a_shard_holds_a_whole_policy_set() {
        for max_keys in [8, 32, 100, 500_000] {
            let store =
                MemoryStore::with_shards_and_max_keys(64, NonZeroUsize::new(max_keys).unwrap());
            assert!(store.inner.shard_cap >= MAX_POLICY_SET, "{max_keys}");
        }
        let small = MemoryStore::with_shards_and_max_keys(64, NonZeroUsize::new(3).unwrap());
        assert_eq!((small.inner.shards.len(), small.max_keys()), (1, 3));
    }

    use crate::T0;

    /// Fixed window 10 per second, grace and regression 1 s, no dedupe: a
    /// key written at `t` expires at `ws + 1000 + 1000`.
    fn rules() -> KeyRules {
        let policy = RateLimitPolicy::builder(
            "p",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 10,
                window: Duration::from_millis(1000),
            }),
        )
        .evaluation_dedup(EvaluationDedupPolicy::Disabled)
        .build()
        .unwrap();
        KeyRules::of(&policy)
    }

    fn id(n: u128) -> EvaluationId {
        EvaluationId::from_uuid(uuid::Uuid::from_u128(n))
    }

    fn subject(n: u64) -> SubjectDigest {
        SubjectDigest::parse(format!("v1:{n:032x}")).unwrap()
    }

    const SLOT: KeySlot = KeySlot::new(0, None);

    /// One evaluation of one key, as the adapter makes it for a set of one.
    fn evaluate(
        store: &MemoryStore,
        rules: &KeyRules,
        n: u64,
        now: u64,
        id: EvaluationId,
    ) -> RateLimitOutcome {
        store
            .with_one(&subject(n), (SLOT, rules), now, |members| evaluate_set(members, now, 1, id))
            .expect("the store has room")
            .into()
    }

    fn touch(store: &MemoryStore, rules: &KeyRules, n: u64, now: u64) {
        let outcome = evaluate(store, rules, n, now, id(0));
        assert!(outcome.is_allowed(), "{outcome:?}");
    }

    /// Two leases at once, each held 30 s; grace and regression 1 s: a lease
    /// taken at `t` counts until `t + 30_000 + 1000` (lease-ttl + regression)
    /// and a key whose latest lease it is expires 1000 (the grace) later.
    fn two_in_flight() -> KeyRules {
        let algorithm = Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 2,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
        });
        KeyRules::of(&RateLimitPolicy::builder("c", algorithm).build().unwrap())
    }

    fn leases_of(store: &MemoryStore, n: u64) -> (Option<u64>, Vec<EvaluationId>, u64) {
        store.inspect(SLOT, &subject(n), |entry| {
            let entry = entry.expect("the key exists");
            let state = entry.state().expect("the key holds state");
            (
                Some(state.mark),
                state.leases.iter().map(|lease| lease.id).collect(),
                entry.expires_at,
            )
        })
    }

    #[test]
    fn a_release_removes_only_its_lease_and_moves_no_mark_or_expiry() {
        let store = MemoryStore::with_shards(2);
        let rules = two_in_flight();
        assert!(evaluate(&store, &rules, 7, T0, id(1)).is_allowed());
        assert!(evaluate(&store, &rules, 7, T0 + 10, id(2)).is_allowed());
        assert!(evaluate(&store, &rules, 8, T0 + 10, id(1)).is_allowed());
        assert_eq!(leases_of(&store, 7), (Some(T0 + 10), vec![id(1), id(2)], T0 + 32_010));
        assert_eq!(store.stored_bytes(), 3 * u64::from(HELD_LEASE_BYTES));
        assert!(store.release(&subject(7), [SLOT], id(1), T0 + 20));
        assert!(!store.release(&subject(7), [SLOT], id(1), T0 + 20), "released once");
        assert!(!store.release(&subject(7), [SLOT], id(3), T0 + 20), "never held");
        // Subject 8's lease of the same id, and subject 7's other lease, stay.
        assert_eq!(leases_of(&store, 7), (Some(T0 + 10), vec![id(2)], T0 + 32_010));
        assert_eq!(leases_of(&store, 8), (Some(T0 + 10), vec![id(1)], T0 + 32_010));
        assert_eq!(store.stored_bytes(), 2 * u64::from(HELD_LEASE_BYTES));
        // An absent key holds nothing to release.
        assert!(!store.release(&subject(9), [SLOT], id(1), T0 + 20));
        assert_eq!(store.live_entries(), 2);
    }

    #[test]
    fn an_expired_lease_frees_nothing_and_its_key_is_swept_after_the_latest_lease() {
        let store = MemoryStore::with_shards(1);
        let rules = two_in_flight();
        assert!(evaluate(&store, &rules, 7, T0, id(1)).is_allowed());
        assert!(evaluate(&store, &rules, 7, T0 + 1_000, id(2)).is_allowed());
        // Lease 1 is gone at T0 + 31 000: releasing it then frees nothing
        // (and removes its id).
        assert!(!store.release(&subject(7), [SLOT], id(1), T0 + 31_000));
        assert_eq!(leases_of(&store, 7).1, [id(2)]);
        assert_eq!(store.stored_bytes(), u64::from(HELD_LEASE_BYTES));
        // The key lives to lease 2's expiry plus the grace: T0 + 33 000.
        assert_eq!(store.purge_expired(T0 + 32_999), 0);
        assert_eq!(store.purge_expired(T0 + 33_000), 1);
        assert_eq!((store.live_entries(), store.stored_bytes()), (0, 0));
        assert!(!store.release(&subject(7), [SLOT], id(2), T0 + 33_000));
    }

    #[test]
    fn shard_counts_round_up_to_a_power_of_two_within_bounds() {
        // At the default bound a shard holds a set of 8: 500,000 / 8 keys
        // allow 32,768 shards at most.
        let most = 32_768;
        for (asked, got) in [(0, 1), (1, 1), (3, 4), (16, 16), (17, 32), (usize::MAX, most)] {
            assert_eq!(MemoryStore::with_shards(asked).shard_count(), got, "asked {asked}");
        }
        let default = MemoryStore::new().shard_count();
        assert!(default.is_power_of_two() && default >= 16, "{default}");
    }

    #[test]
    fn namespaces_are_per_policy_revision_and_stable() {
        let store = MemoryStore::with_shards(1);
        let a = PolicyId::new("a").unwrap();
        let b = PolicyId::new("b").unwrap();
        let a1 = store.namespace(&a, 1, 0);
        assert_eq!(store.clone().namespace(&a, 1, 0), a1);
        assert_ne!(store.namespace(&a, 2, 0), a1);
        assert_ne!(store.namespace(&b, 1, 0), a1);
    }

    #[test]
    fn purge_removes_exactly_the_expired_keys_and_shrinks() {
        let store = MemoryStore::with_shards(4);
        let rules = rules();
        for n in 0..5_000 {
            touch(&store, &rules, n, T0);
        }
        for n in 5_000..5_010 {
            touch(&store, &rules, n, T0 + 1_000);
        }
        let slots_full = store.allocated_slots();
        assert_eq!(store.live_entries(), 5_010);
        // Keys of window T0 expire at T0 + 2000, those of T0 + 1000 at T0 + 3000.
        assert_eq!(store.purge_expired(T0 + 1_999), 0);
        assert_eq!(store.purge_expired(T0 + 2_000), 5_000);
        assert_eq!(store.live_entries(), 10);
        assert!(
            store.allocated_slots() * 20 < slots_full,
            "{} of {slots_full}",
            store.allocated_slots()
        );
        assert_eq!(store.purge_expired(T0 + 3_000), 10);
        assert_eq!(store.live_entries(), 0);
    }

    #[test]
    fn a_purge_drops_keys_whole_again_only_from_a_full_shard() {
        // Slack 1 s: keys charged at T0 are whole at T0 + 1000 (window
        // end) and expire at T0 + 2000.
        let rules = rules();
        let ns = |store: &MemoryStore| store.namespace(&PolicyId::new("p").unwrap(), 1, 1_000);
        let full = MemoryStore::with_shards_and_max_keys(1, NonZeroUsize::new(2).unwrap());
        let roomy = MemoryStore::with_shards_and_max_keys(1, NonZeroUsize::new(3).unwrap());
        for store in [&full, &roomy] {
            assert_eq!(ns(store), SLOT.namespace);
            touch(store, &rules, 1, T0);
            touch(store, &rules, 2, T0);
        }
        assert_eq!((full.purge_expired(T0 + 999), roomy.purge_expired(T0 + 999)), (0, 0));
        // Whole, not expired: only the full store lets them go.
        assert_eq!((full.purge_expired(T0 + 1_000), roomy.purge_expired(T0 + 1_000)), (2, 0));
        assert_eq!(roomy.purge_expired(T0 + 2_000), 2);
    }

    #[test]
    fn the_bound_is_a_multiple_of_the_shards_each_with_room_for_a_set() {
        let bounded = |shards, keys| {
            let store =
                MemoryStore::with_shards_and_max_keys(shards, NonZeroUsize::new(keys).unwrap());
            (store.shard_count(), store.max_keys())
        };
        assert_eq!(bounded(16, 20_000), (16, 20_000));
        assert_eq!(bounded(16, 1_001), (16, 992));
        assert_eq!(bounded(64, 10), (1, 10));
        assert_eq!(bounded(64, 64), (8, 64));
        assert_eq!(bounded(4, 1), (1, 1));
        assert!(MemoryStore::new().max_keys() <= DEFAULT_MAX_KEYS);
    }

    #[test]
    fn ordinary_operations_sweep_a_shard_once_its_keys_expired() {
        let store = MemoryStore::with_shards(1);
        let rules = rules();
        for n in 0..3 * SWEEP_MIN_OPS as u64 {
            touch(&store, &rules, n, T0);
        }
        assert_eq!(store.live_entries(), 3 * SWEEP_MIN_OPS);
        // The shard grew past its sweep threshold while nothing could expire;
        // the first operation after the expiry sweeps it.
        touch(&store, &rules, u64::MAX, T0 + 2_000);
        assert_eq!(store.live_entries(), 1);
    }

    #[test]
    fn a_sweep_is_amortized_over_operations_of_a_stable_shard() {
        let store = MemoryStore::with_shards(1);
        let rules = rules();
        // Sweeps happen at len >= 1024 (nothing expired yet): none removed.
        for n in 0..100 {
            touch(&store, &rules, n, T0);
        }
        // Past their expiry, one hot key keeps the shard busy: the expired
        // 100 go within SWEEP_MIN_OPS operations, not on every one.
        touch(&store, &rules, 1_000_000, T0 + 2_000);
        assert_eq!(store.live_entries(), 101);
        for _ in 0..SWEEP_MIN_OPS {
            let now = T0 + 2_000;
            let _ = evaluate(&store, &rules, 1_000_000, now, id(0));
        }
        assert_eq!(store.live_entries(), 1);
    }

    #[test]
    fn an_expired_key_reads_as_absent_and_reuses_its_slot() {
        let store = MemoryStore::with_shards(1);
        let rules = rules();
        touch(&store, &rules, 1, T0);
        // Still held at T0 + 2500 (no sweep yet), but expired: it starts afresh.
        let now = T0 + 2_500;
        let outcome = evaluate(&store, &rules, 1, now, id(0));
        let Ok(set) = outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!(set.decisions()[0].remaining, 9);
        assert_eq!(store.live_entries(), 1);
    }

    #[test]
    fn state_stays_constant_size_over_many_windows() {
        let store = MemoryStore::with_shards(1);
        let policy = RateLimitPolicy::builder(
            "p",
            Algorithm::SlidingCounter(shared_contract::SlidingCounter {
                limit: 1_000,
                window: Duration::from_millis(10),
            }),
        )
        .evaluation_dedup(EvaluationDedupPolicy::Enabled {
            ttl: Duration::from_millis(100),
            max_entries: 8,
            max_stored_bytes: 65_536,
        })
        .build()
        .unwrap();
        let rules = KeyRules::of(&policy);
        let mut max_allocated = 0;
        for step in 0..20_000u64 {
            let now = T0 + step;
            let id = id(u128::from(step));
            let _ = evaluate(&store, &rules, 7, now, id);
            let (algorithm, records, allocated) = store.inspect(SLOT, &subject(7), |entry| {
                let state = entry.and_then(Entry::state).expect("written");
                (state.algorithm, state.records.len(), state.records.allocated())
            });
            assert!(matches!(
                algorithm,
                AlgorithmState::SlidingCounter(shared_contract::SlidingCounterState { .. })
            ));
            assert!(records <= 8, "{records} records");
            max_allocated = max_allocated.max(allocated);
        }
        assert!(max_allocated <= 16, "record buffer grew to {max_allocated}");
        assert_eq!(store.live_entries(), 1);
    }

    #[test]
    fn every_key_of_a_subject_is_in_one_shard_and_a_set_writes_only_what_it_decided() {
        let store = MemoryStore::with_shards(64);
        let rules = rules();
        let slots = [
            (KeySlot::new(0, None), &rules),
            (KeySlot::new(1, None), &rules),
            (KeySlot::new(1, Some(OperationDigest::from_u64(42))), &rules),
        ];
        let now = T0;
        let verdict = store
            .with_set(&subject(3), &slots, now, |members| evaluate_set(members, now, 1, id(1)))
            .expect("the store has room");
        assert!(RateLimitOutcome::from(verdict).is_allowed());
        // Three keys, all in the subject's shard.
        let shard_of = |store: &MemoryStore| {
            store.inner.shards.iter().position(|shard| !shard.0.lock().map.is_empty())
        };
        assert_eq!(store.live_entries(), 3);
        let busy = store.inner.shards.iter().filter(|shard| !shard.0.lock().map.is_empty()).count();
        assert_eq!((busy, shard_of(&store).is_some()), (1, true));
        for (slot, _) in slots {
            let remaining = store.inspect(slot, &subject(3), |entry| {
                match entry.and_then(Entry::state).map(|state| state.algorithm) {
                    Some(AlgorithmState::FixedWindow(shared_contract::FixedWindowState {
                        count,
                        ..
                    })) => count,
                    other => panic!("{other:?}"),
                }
            });
            assert_eq!(remaining, 1);
        }
    }

    #[test]
    fn a_key_is_its_namespace_operation_and_subject_whole() {
        let store = MemoryStore::with_shards(4);
        let rules = rules();
        let narrow = Some(OperationDigest::from_u64(0xaa));
        let wide = Some(OperationDigest::from_u128(0xaa));
        let keys = [
            (KeySlot::new(0, None), subject(1)),
            (KeySlot::new(1, None), subject(1)),
            (KeySlot::new(1, narrow), subject(1)),
            (KeySlot::new(1, wide), subject(1)),
            (KeySlot::new(1, narrow), subject(2)),
            // The same tag under another key version, or one byte longer.
            (SLOT, SubjectDigest::from_tag(2, &[0; 16]).unwrap()),
            (SLOT, SubjectDigest::from_tag(1, &[0; 16]).unwrap()),
            (SLOT, SubjectDigest::from_tag(1, &[0; 17]).unwrap()),
        ];
        for (count, (slot, subject)) in keys.iter().enumerate() {
            let now = T0;
            store
                .with_set(subject, &[(*slot, &rules)], now, |members| {
                    evaluate_set(members, now, u64::try_from(count + 1).unwrap(), id(0))
                })
                .expect("the store has room");
        }
        assert_eq!(store.live_entries(), keys.len());
        for (count, (slot, subject)) in keys.iter().enumerate() {
            let charged = store.inspect(*slot, subject, |entry| {
                match entry.and_then(Entry::state).map(|state| state.algorithm) {
                    Some(AlgorithmState::FixedWindow(shared_contract::FixedWindowState {
                        count,
                        ..
                    })) => count,
                    other => panic!("{other:?}"),
                }
            });
            assert_eq!(charged, u64::try_from(count + 1).unwrap(), "{slot:?} {subject}");
        }
    }
}
