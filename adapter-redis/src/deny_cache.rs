//! `DenyCache`: the local denial cache in front of the scripts
//! (docs/operations.md#the-local-denial-cache; the argument that it never denies what Redis would admit is in
//! docs/algorithms.md, "Local denial cache").
//!
//! After Redis refuses a set of fixed windows, the same subject's same set
//! (policy ids and revisions, and the operation when a policy of the set is
//! operation-scoped) at the same or a higher cost is refused here, without a
//! Redis call, until the soonest moment Redis could answer otherwise or the
//! refusal is `max_age` old, whichever comes first: an admin reset through
//! another instance never reaches this cache, so no refusal is trusted
//! longer than that, whatever its window. The answer is the stored one with
//! `retry_after` and `reset_after` shrunk by the time passed on the same
//! clock the decision used.
//!
//! Bounded: at most `max_entries` denials over a few shards, each a
//! mutex-guarded map keyed by a SipHash of the request's key parts; a lookup
//! hashes borrowed parts and compares them with the stored ones, so it never
//! allocates. A full shard first drops what has run out, then the entry
//! that runs out soonest.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use foldhash::fast::RandomState;
use shared_contract::{
    Certainty, EvaluationId, MAX_POLICY_SET, OperationDigest, PolicyMode, PolicyScope, PolicySet,
    RateLimitDecision, RateLimitOutcome, RateLimitPolicy, RateLimitRequest, SetDecision,
    SubjectDigest, millis,
};

/// Shards of the denial map: enough that concurrent lookups rarely meet on
/// one lock, few enough that a small `max_entries` still spreads.
const SHARDS: usize = 16;

/// The cache. `None` of it exists when `redis.deny-cache.enabled` is false.
pub(crate) struct DenyCache {
    /// As configured (`redis.deny-cache.max-entries`).
    max_entries: usize,
    /// As configured (`redis.deny-cache.max-age`), in ms: the longest a
    /// refusal is served after Redis gave it.
    max_age: u64,
    shards: Box<[Mutex<Shard>]>,
    /// Entries per shard; `max_entries` split evenly, at least 1.
    per_shard: usize,
    /// Seeded per process, so clients cannot aim subjects at one bucket
    /// (the pseudonyms are keyed HMACs as well). foldhash, not SipHash:
    /// every Redis decision fingerprints its request here, and SipHash was
    /// 7 % of the bench's instructions (callgrind, docs/benchmarks.md).
    hasher: RandomState,
    /// Evaluation ids this adapter saw admitted for a set with dedupe on,
    /// direct-mapped (a newer id overwrites an older one in its slot): a
    /// repeat of one of them must reach Redis, which replays it.
    admitted: Box<[Mutex<Option<EvaluationId>>]>,
    /// Per subject (direct-mapped by its hash: subjects sharing a slot only
    /// send each other's requests to Redis), how many admissions this
    /// adapter has seen. A refusal holds the count it was stored at and
    /// answers only while it stands: an admission of the subject in any
    /// other set (a subject-scoped policy shared with another operation, a
    /// policy in another set) may have charged a key whose `remaining` the
    /// refusal reports.
    subject_admissions: Box<[AtomicU64]>,
    /// The latest caller time this cache has seen. A refusal decided
    /// behind it is not stored: a key this instance wrote since may hold a
    /// mark ahead of that caller time, and Redis then counted the refusal's
    /// waits from the mark, not from the caller time the cache would shrink
    /// them from.
    latest: AtomicU64,
}

impl fmt::Debug for DenyCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCache")
            .field("max_entries", &(self.per_shard * self.shards.len()))
            .finish_non_exhaustive()
    }
}

/// The map key is already a SipHash; it is used as is.
type Shard = HashMap<u64, Denial, BuildHasherDefault<PassThrough>>;

#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else so it stays defined.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// One cached refusal and everything that names what it answers.
struct Denial {
    subject: SubjectDigest,
    policies: PolicySet,
    revisions: [u32; MAX_POLICY_SET],
    /// `Some` when a policy of the set is operation-scoped.
    operation: Option<OperationDigest>,
    cost: u64,
    /// The caller time (epoch ms) the refusal was decided at.
    decided_at: u64,
    /// The first caller time at which Redis is asked again: when it might
    /// answer otherwise, or at the max age, whichever is sooner.
    until: u64,
    decision: SetDecision,
    /// Whether any policy of the set keeps dedupe records.
    dedupe: bool,
    /// The subject's admission count when stored.
    admissions: u64,
}

/// The parts of a request the cache keys on, borrowed.
struct Parts<'r> {
    subject: &'r SubjectDigest,
    policies: &'r PolicySet,
    revisions: [u32; MAX_POLICY_SET],
    operation: Option<&'r OperationDigest>,
}

impl<'r> Parts<'r> {
    fn of<'p>(
        request: &'r RateLimitRequest,
        set: impl Iterator<Item = &'p RateLimitPolicy>,
    ) -> Self {
        let mut revisions = [0; MAX_POLICY_SET];
        let mut scoped = false;
        for (slot, policy) in revisions.iter_mut().zip(set) {
            *slot = policy.revision();
            scoped |= match policy.scope() {
                PolicyScope::Operation => true,
                PolicyScope::Subject => false,
            };
        }
        Self {
            subject: &request.subject,
            policies: &request.policies,
            revisions,
            operation: scoped.then_some(&request.operation),
        }
    }

    fn matches(&self, denial: &Denial) -> bool {
        denial.subject == *self.subject
            && denial.policies == *self.policies
            && denial.revisions == self.revisions
            && denial.operation.as_ref() == self.operation
    }
}

impl DenyCache {
    /// A cache of at most `max_entries` denials (at least one per shard),
    /// each served at most `max_age` after Redis gave it.
    pub(crate) fn new(max_entries: usize, max_age: Duration) -> Self {
        let shards = SHARDS.min(max_entries.max(1));
        Self {
            max_entries,
            max_age: millis(max_age).max(1),
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: max_entries.div_ceil(shards).max(1),
            hasher: RandomState::default(),
            admitted: (0..max_entries.max(1)).map(|_| Mutex::new(None)).collect(),
            subject_admissions: (0..max_entries.max(1)).map(|_| AtomicU64::new(0)).collect(),
            latest: AtomicU64::new(0),
        }
    }

    /// Moves the latest caller time seen up to `now`, and says whether
    /// `now` is behind it. The line is only written when time moves on, so
    /// concurrent lookups mostly read it.
    fn behind(&self, now: u64) -> bool {
        let latest = self.latest.load(Ordering::Relaxed);
        if now > latest {
            self.latest.fetch_max(now, Ordering::Relaxed) > now
        } else {
            now < latest
        }
    }

    fn fingerprint(&self, parts: &Parts<'_>) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        parts.subject.hash(&mut hasher);
        for id in parts.policies.ids() {
            id.as_str().hash(&mut hasher);
        }
        parts.revisions.hash(&mut hasher);
        parts.operation.hash(&mut hasher);
        hasher.finish()
    }

    fn shard(&self, fingerprint: u64) -> MutexGuard<'_, Shard> {
        // The high bits pick the shard; the map uses the whole hash.
        let index = usize::try_from(fingerprint >> 48).unwrap_or(0) % self.shards.len();
        self.shards[index].lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn admissions_of(&self, subject: &SubjectDigest) -> &AtomicU64 {
        let slots = self.subject_admissions.len() as u64;
        &self.subject_admissions
            [usize::try_from(self.hasher.hash_one(subject) % slots).unwrap_or(0)]
    }

    fn admitted_slot(&self, id: EvaluationId) -> MutexGuard<'_, Option<EvaluationId>> {
        let index =
            usize::try_from(self.hasher.hash_one(id) % self.admitted.len() as u64).unwrap_or(0);
        self.admitted[index].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached refusal of `request` at caller time `now` (epoch ms, the
    /// adapter's clock), or `None` when Redis must answer: `now` is behind
    /// a caller time this cache has already seen, no entry, a lower cost
    /// than the one refused, the refusal has run out, the clock is behind
    /// the time it was decided at (the entry is dropped: a clock stepping
    /// back must not stretch it), or the request repeats an evaluation id
    /// this adapter saw admitted (Redis replays it).
    pub(crate) fn lookup<'p>(
        &self,
        request: &RateLimitRequest,
        set: impl Iterator<Item = &'p RateLimitPolicy> + Clone,
        now: u64,
    ) -> Option<SetDecision> {
        let behind = self.behind(now);
        let parts = Parts::of(request, set.clone());
        let fingerprint = self.fingerprint(&parts);
        let mut shard = self.shard(fingerprint);
        let denial = shard.get(&fingerprint).filter(|denial| parts.matches(denial))?;
        let admissions = self.admissions_of(&request.subject).load(Ordering::Acquire);
        if now < denial.decided_at || now >= denial.until || admissions != denial.admissions {
            shard.remove(&fingerprint);
            return None;
        }
        // Behind the latest time seen, a key may hold a mark ahead of `now`
        // (written by this instance, or where Redis's refusal of a token
        // bucket would have put it): Redis evaluates at the mark.
        if behind || request.cost < denial.cost {
            return None;
        }
        let mut answer = shrunk(&denial.decision, now - denial.decided_at);
        if request.cost > denial.cost {
            answer = costing(&answer, set, request.cost);
        }
        let dedupe = denial.dedupe;
        drop(shard);
        if dedupe && *self.admitted_slot(request.evaluation_id) == Some(request.evaluation_id) {
            return None;
        }
        Some(answer)
    }

    /// Learns from what Redis answered `request` at caller time `now`: a
    /// certain refusal is stored (replacing an older one of the same key);
    /// an admission drops the key's refusal, so this instance's own
    /// admissions (at a lower cost) never leave a stale answer, and
    /// remembers the id when the set dedupes. Failures teach nothing.
    pub(crate) fn learn<'p>(
        &self,
        request: &RateLimitRequest,
        set: impl Iterator<Item = &'p RateLimitPolicy> + Clone,
        now: u64,
        outcome: &RateLimitOutcome,
    ) {
        let Ok(decision) = outcome else { return };
        let dedupe = set.clone().any(|policy| policy.evaluation_dedup().record_capacity() > 0);
        let parts = Parts::of(request, set.clone());
        let fingerprint = self.fingerprint(&parts);
        if decision.allowed() {
            self.admissions_of(&request.subject).fetch_add(1, Ordering::AcqRel);
            self.shard(fingerprint).remove(&fingerprint);
            if dedupe {
                *self.admitted_slot(request.evaluation_id) = Some(request.evaluation_id);
            }
            return;
        }
        if self.behind(now) {
            return;
        }
        let Some(lasts) = stays_refused_for(set, decision) else { return };
        let denial = Denial {
            subject: request.subject,
            policies: (*request.policies).clone(),
            revisions: parts.revisions,
            operation: parts.operation.cloned(),
            cost: request.cost,
            decided_at: now,
            until: now.saturating_add(lasts.min(self.max_age)),
            decision: decision.clone(),
            dedupe,
            admissions: self.admissions_of(&request.subject).load(Ordering::Acquire),
        };
        let mut shard = self.shard(fingerprint);
        if shard.len() >= self.per_shard && !shard.contains_key(&fingerprint) {
            shard.retain(|_, held| held.decided_at <= now && now < held.until);
            if shard.len() >= self.per_shard {
                let soonest = shard.iter().min_by_key(|(_, held)| held.until).map(|(key, _)| *key);
                if let Some(key) = soonest {
                    shard.remove(&key);
                }
            }
        }
        shard.insert(fingerprint, denial);
    }

    /// An empty cache of the same size and max age.
    pub(crate) fn emptied(&self) -> Self {
        Self::new(self.max_entries, Duration::from_millis(self.max_age))
    }

    /// A settle at caller time `now` is about to be sent: it may move a
    /// key's mark to `now`, so a refusal decided behind it is not stored.
    pub(crate) fn settling(&self, now: u64) {
        self.behind(now);
    }

    /// A settle of `subject`'s usage was sent, whatever came back: it may
    /// have given units back to any key of the subject, so no refusal of
    /// it stored so far answers again (as after an admission).
    pub(crate) fn settled(&self, subject: &SubjectDigest) {
        self.admissions_of(subject).fetch_add(1, Ordering::AcqRel);
    }

    /// Forgets every cached refusal of `subject` (after an admin reset of
    /// its budget on this instance). Returns how many were dropped.
    pub(crate) fn forget(&self, subject: &SubjectDigest) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
                let before = shard.len();
                shard.retain(|_, held| held.subject != *subject);
                before - shard.len()
            })
            .sum()
    }

    /// Refusals held, expired ones included until they are next met.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

/// How long a refused set is sure to stay refused with every decision as
/// stored, or `None` when it must not be cached: the soonest retry-after of
/// its denying enforced policies (one of them denying keeps the set refused;
/// the soonest keeps every reported denial true), cut at each fixed
/// window's end (where its reported budget renews).
///
/// Only sets whose every algorithm says a refusal stays one until its
/// `reset_after` with no other traffic, whatever the cost
/// ([`shared_contract::RateAlgorithm::refusal_stays`]: of the registered
/// ones, the fixed window) are cached; each algorithm's module says why
/// its refusals do or do not.
fn stays_refused_for<'p>(
    set: impl Iterator<Item = &'p RateLimitPolicy>,
    decision: &SetDecision,
) -> Option<u64> {
    let mut lasts: Option<u64> = None;
    let mut cut = |by: u64| lasts = Some(lasts.map_or(by, |held| held.min(by)));
    for (policy, decided) in set.zip(decision.decisions()) {
        match policy.algorithm().certainty() {
            Certainty::Certain => {}
            Certainty::ApproximateAlgorithm => return None,
        }
        if decided.replayed {
            return None;
        }
        if !policy.algorithm().refusal_stays() {
            return None;
        }
        cut(decided.reset_after_ms);
        match policy.mode() {
            PolicyMode::Enforce if !decided.allowed => cut(decided.retry_after_ms),
            PolicyMode::Enforce | PolicyMode::Shadow => {}
        }
    }
    // Nothing is refused for less than a millisecond.
    lasts.filter(|&lasts| lasts > 0)
}

/// A cached refusal asked again at a higher `cost`: a member that allowed
/// with fewer units left than that refuses it as its window's step would,
/// until the window ends (every cached algorithm is a window counter).
fn costing<'p>(
    decision: &SetDecision,
    set: impl Iterator<Item = &'p RateLimitPolicy>,
    cost: u64,
) -> SetDecision {
    let members = set.zip(decision.decisions()).map(|(policy, &decided)| {
        let refuses = decided.allowed && decided.remaining < cost;
        let retry_after_ms =
            if refuses { decided.reset_after_ms.max(1) } else { decided.retry_after_ms };
        (
            policy.mode(),
            RateLimitDecision { allowed: decided.allowed && !refuses, retry_after_ms, ..decided },
        )
    });
    SetDecision::of_members(members).from_cache()
}

/// `decision` as it reads `elapsed` ms after it was made: every wait
/// shorter by that much (a denial's at least 1 ms), marked as cached.
fn shrunk(decision: &SetDecision, elapsed: u64) -> SetDecision {
    decision.aged(elapsed).from_cache()
}

#[cfg(test)]
mod tests;
