//! What an instance admitted for each budget (subject, policy, operation)
//! while Redis could not decide, and how much of it Redis is known to
//! count: the difference is written back to Redis before (or with) that
//! subject's next Redis decision, so the window Redis returns in counts
//! what the instance admitted locally.
//!
//! One map, keyed by the subject's pseudonym, looked up (never scanned) by
//! a decision while degraded mode is on or something is still owed; when
//! neither holds the decision path reads one atomic and nothing else.
//! Expired budgets are purged at most once a second; the map holds at most
//! [`MAX_SUBJECTS`] subjects, and a subject it has no room for is not
//! admitted locally (Redis' failure stands: fail closed, never untracked).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use shared_contract::{EvaluationId, OperationDigest, PolicyId, SubjectDigest};

/// Most subjects the ledger tracks at once (a few hundred bytes each).
/// A flood of distinct subjects during an outage finds it full: once the
/// expired budgets are purged, a new subject is refused locally.
pub const MAX_SUBJECTS: usize = 100_000;

/// How often (at most) the decision path purges expired budgets.
const PURGE_EVERY_MILLIS: u64 = 1_000;

/// One budget's account. Amounts are in cost units of the fleet's policy.
#[derive(Debug, Clone)]
struct Account {
    policy: PolicyId,
    /// The operation requests of this budget named (the key's part for an
    /// operation-scoped policy; any of them for a subject-scoped one).
    operation: OperationDigest,
    /// Whether the key holds the operation (operation-scoped policy).
    scoped: bool,
    /// Whether the policy counts per window (fixed window, sliding
    /// counter), so Redis' count can be compared with what it was given.
    windowed: bool,
    /// Milliseconds (the mode's clock) when the admissions counted here no
    /// longer weigh in any state (the local state is whole again): writing
    /// them back later would only over-count, so the account ends.
    until: u64,
    /// What this instance admitted for the budget in its current window:
    /// locally, and (once the account exists) by Redis.
    admitted: u64,
    /// How much of `admitted` Redis is known to count.
    acked: u64,
    /// The id of the next write-back piece; kept across an answer that may
    /// or may not have charged, so the retry replays (with dedupe on)
    /// instead of charging twice.
    piece: EvaluationId,
    /// A write-back of this account is under way (one at a time).
    busy: bool,
}

impl Account {
    fn owes(&self) -> bool {
        self.admitted > self.acked
    }

    /// Whether Redis' count must be compared with `acked` before Redis
    /// decides for this budget again: for a windowed budget Redis holds
    /// something of, always, while the account lasts (its window). A Redis
    /// that restarted empty loses what it was given, and this instance
    /// need not have seen it fail: its denial cache may have answered
    /// every request of the subject while Redis was away.
    fn compares(&self) -> bool {
        self.windowed && self.acked > 0
    }

    fn matches(&self, policy: &PolicyId, operation: &OperationDigest) -> bool {
        self.policy == *policy && (!self.scoped || self.operation == *operation)
    }
}

/// The work a write-back takes out of the ledger for one account, and
/// gives back with what Redis answered.
#[derive(Debug, Clone)]
pub(super) struct Job {
    /// The fleet's policy.
    pub(super) policy: PolicyId,
    /// The operation to name in the write-back requests.
    pub(super) operation: OperationDigest,
    /// Whether the key holds the operation.
    pub(super) scoped: bool,
    /// Compare Redis' count with `acked` first (a restart may have lost it).
    pub(super) verify: bool,
    /// `admitted` when taken: what to bring `acked` up to.
    pub(super) admitted: u64,
    /// `acked` when taken; the job moves it.
    pub(super) acked: u64,
    acked_at_take: u64,
    /// The id of the next piece.
    pub(super) piece: EvaluationId,
    /// Whether the account's budget is gone (policy removed, or the key no
    /// longer fits it): the account is dropped.
    pub(super) drop: bool,
}

impl Job {
    /// What is still owed.
    pub(super) fn owed(&self) -> u64 {
        self.admitted.saturating_sub(self.acked)
    }
}

/// What one policy of an admitted set charged, for [`Ledger::record`].
#[derive(Debug, Clone)]
pub(super) struct Charge {
    /// The fleet's policy.
    pub(super) policy: PolicyId,
    /// Its key's shape, or `None` for a policy that holds leases (given
    /// back, not written back) or that Redis no longer holds.
    pub(super) shape: Option<Shape>,
    /// Milliseconds (the mode's clock) until the state this charge wrote
    /// is whole again.
    pub(super) until: u64,
    /// Whether Redis counted it (a mirror of Redis' admission) or only the
    /// local limiter did (owed to Redis).
    pub(super) on_redis: bool,
}

/// What an account needs to know of its policy.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    /// The key holds the operation (an operation-scoped policy).
    pub(super) scoped: bool,
    /// The policy counts per window (`Algorithm::windowed`).
    pub(super) windowed: bool,
}

/// The ledger of one process (shared by every port a reload builds).
#[derive(Debug, Default)]
pub(super) struct Ledger {
    subjects: Mutex<HashMap<SubjectDigest, Vec<Account>>>,
    /// How many subjects the map holds: 0 lets the decision path skip it.
    len: AtomicUsize,
    /// Milliseconds when the next purge may run.
    next_purge: AtomicU64,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, HashMap<SubjectDigest, Vec<Account>>> {
        self.subjects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, map: &HashMap<SubjectDigest, Vec<Account>>) {
        self.len.store(map.len(), Ordering::Release);
    }

    /// Whether no subject is tracked (the decision path's one read).
    pub(super) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// How many subjects are tracked.
    pub(super) fn subjects(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Whether `subject` has an account.
    pub(super) fn tracks(&self, subject: &SubjectDigest) -> bool {
        !self.is_empty() && self.lock().contains_key(subject)
    }

    /// How many subjects still owe Redis something.
    pub(super) fn owing(&self) -> usize {
        self.lock().values().filter(|accounts| accounts.iter().any(Account::owes)).count()
    }

    /// Whether `subject` has an account (or, if not, room for one), purging
    /// first when the map is full and a purge is due.
    pub(super) fn has_room(&self, subject: &SubjectDigest, now: u64, on: bool) -> bool {
        if self.subjects() < MAX_SUBJECTS {
            return true;
        }
        self.purge(now, on, on);
        let map = self.lock();
        map.contains_key(subject) || map.len() < MAX_SUBJECTS
    }

    /// Drops what no longer matters, at most once every
    /// [`PURGE_EVERY_MILLIS`]: accounts past their `until`; and once the
    /// mode is off, accounts that owe nothing and, unless `comparing`
    /// (Redis failed recently), those that only compare (they are only
    /// needed to follow a subject while Redis comes and goes). Every
    /// decision looks the ledger up while it holds anything, so it must
    /// empty soon after an outage, not at the end of a day's window.
    pub(super) fn purge(&self, now: u64, on: bool, comparing: bool) {
        let due = self.next_purge.load(Ordering::Relaxed);
        if now < due
            || self
                .next_purge
                .compare_exchange(
                    due,
                    now + PURGE_EVERY_MILLIS,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let mut map = self.lock();
        map.retain(|_, accounts| {
            accounts.retain(|account| {
                account.busy
                    || (account.until > now
                        && (on || account.owes() || (comparing && account.compares())))
            });
            !accounts.is_empty()
        });
        self.publish(&map);
    }

    /// Records what an admitted set charged for `subject`, one charge per
    /// policy. A local admission opens the
    /// account; Redis' admission is counted only in an account already
    /// open (a subject decided locally in the window), as admitted and
    /// acknowledged at once. Returns whether any account was touched.
    pub(super) fn record(
        &self,
        subject: &SubjectDigest,
        operation: &OperationDigest,
        cost: u64,
        now: u64,
        charges: &[Charge],
    ) -> bool {
        let mut map = self.lock();
        let on_redis = charges.iter().all(|charge| charge.on_redis);
        if on_redis && !map.contains_key(subject) {
            return false;
        }
        let accounts = map.entry(*subject).or_default();
        let mut touched = false;
        for charge in charges {
            let (policy, Some(shape)) = (&charge.policy, charge.shape) else { continue };
            let index = accounts.iter().position(|account| account.matches(policy, operation));
            let account = match index {
                Some(index) => &mut accounts[index],
                None if charge.on_redis => continue,
                None => {
                    accounts.push(Account {
                        policy: policy.clone(),
                        operation: *operation,
                        scoped: shape.scoped,
                        windowed: shape.windowed,
                        until: 0,
                        admitted: 0,
                        acked: 0,
                        piece: EvaluationId::random(),
                        busy: false,
                    });
                    accounts.last_mut().expect("just pushed")
                }
            };
            // A window (or refill) that ended took its admissions with it.
            if account.until <= now && !account.busy {
                account.admitted = 0;
                account.acked = 0;
            }
            account.until = account.until.max(charge.until);
            account.admitted = account.admitted.saturating_add(cost);
            if charge.on_redis {
                account.acked = account.acked.saturating_add(cost);
            }
            touched = true;
        }
        if accounts.is_empty() {
            map.remove(subject);
        }
        self.publish(&map);
        touched
    }

    /// Takes the write-backs `subject` needs now: accounts that owe Redis
    /// something, or whose Redis count must be checked after a failure,
    /// and that no other request is writing back. Marks them busy.
    pub(super) fn take(&self, subject: &SubjectDigest, now: u64) -> Vec<Job> {
        let mut map = self.lock();
        let Some(accounts) = map.get_mut(subject) else { return Vec::new() };
        let mut jobs = Vec::new();
        for account in accounts.iter_mut() {
            if account.busy || account.until <= now {
                continue;
            }
            let verify = account.compares();
            if !account.owes() && !verify {
                continue;
            }
            account.busy = true;
            jobs.push(Job {
                policy: account.policy.clone(),
                operation: account.operation,
                scoped: account.scoped,
                verify,
                admitted: account.admitted,
                acked: account.acked,
                acked_at_take: account.acked,
                piece: account.piece,
                drop: false,
            });
        }
        jobs
    }

    /// Gives a job back with what it achieved: `acked` moves by what the
    /// job moved it (others may have added admissions meanwhile), the
    /// piece id is kept for a retry, and the account is freed.
    pub(super) fn finish(&self, subject: &SubjectDigest, job: &Job) {
        let mut map = self.lock();
        let Some(accounts) = map.get_mut(subject) else { return };
        let Some(index) = accounts
            .iter()
            .position(|account| account.busy && account.matches(&job.policy, &job.operation))
        else {
            return;
        };
        if job.drop {
            accounts.swap_remove(index);
        } else {
            let account = &mut accounts[index];
            account.busy = false;
            account.piece = job.piece;
            let acked = if job.acked >= job.acked_at_take {
                account.acked.saturating_add(job.acked - job.acked_at_take)
            } else {
                account.acked.saturating_sub(job.acked_at_take - job.acked)
            };
            account.acked = acked.min(account.admitted);
        }
        if accounts.is_empty() {
            map.remove(subject);
        }
        self.publish(&map);
    }

    /// Forgets every account of `subject` under `policy` (an operator reset
    /// Redis' budget: writing the old admissions back would undo it).
    pub(super) fn forget(&self, subject: &SubjectDigest, policy: &PolicyId) {
        let mut map = self.lock();
        if let Some(accounts) = map.get_mut(subject) {
            accounts.retain(|account| account.busy || account.policy != *policy);
            if accounts.is_empty() {
                map.remove(subject);
            }
        }
        self.publish(&map);
    }
}
