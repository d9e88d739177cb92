//! The opt-in degraded mode (`[capabilities.rate-limit.degraded]`): a
//! decorator over the Redis port that answers, when Redis cannot decide,
//! from an in-process memory provider holding each policy at
//! `ceil(limit / instances)`, so the fleet together admits about the
//! configured limit while Redis is away instead of refusing everyone.
//!
//! It lives at the composition root because it combines two providers, and
//! adapters never import each other; it sees both only as
//! `Arc<dyn EdgeRateLimitPort>`, plus the memory store the local counts
//! live in.
//!
//! The local counts are never dropped when Redis answers again: they
//! expire with their own windows (the memory store's rule; the upkeep
//! purge frees them). A Redis that fails some calls and answers others
//! therefore cannot hand a subject a fresh share at every flip.
//!
//! Both ways, each side sees the other (the [`ledger`]): what the instance
//! admitted locally is written back to Redis, as ordinary charges on the
//! subject's key, before (or with) that subject's next Redis decision, so
//! the window Redis returns in counts it; and once a subject has been
//! decided locally in a window, Redis' later admissions of it are charged
//! to the local limiter too, so a Redis coming and going cannot add its
//! admissions to a whole local share. See [`DegradedPort::write_back`] for
//! what a write-back achieves per algorithm.

mod ledger;

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use adapter_memory::MemoryStore;
use async_trait::async_trait;
use shared_contract::{
    BudgetFailure, BudgetKey, BudgetState, Clock, ContractError, DecisionSource, EdgeRateLimitPort,
    Evaluation, EvaluationId, Lease, OperationDigest, PolicyId, PolicyScope, PolicySet,
    RateLimitFailure, RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest,
    ReleaseOutcome, Releasing, SetDecision, Settled, Settlement, Settling, SubjectDigest,
    UnavailableCategory,
};

pub use self::ledger::MAX_SUBJECTS;
use self::ledger::{Charge, Job, Ledger, Shape};

/// How long past the moment Redis gave up the local evaluation may still
/// start. The memory step takes microseconds; this only keeps a deadline
/// the Redis attempt used up (a timeout) from turning the local answer
/// into `AdmissionRejected`, a 503, which degraded mode exists to avoid.
pub const LOCAL_DEADLINE: Duration = Duration::from_millis(100);

/// How long Redis must answer with no failure before an instance leaves
/// degraded mode: a Redis failing some calls and answering others (a
/// paused or saturated server, a dead Cluster shard, a skewed clock for
/// one subject) is one outage, logged once entering and once leaving, not
/// a pair of lines per flip. Redis' own answers are used as soon as they
/// come, whether the instance is degraded or not.
pub const LEAVE_AFTER: Duration = Duration::from_secs(1);

/// How long after Redis' last failure this instance saw it still compares
/// Redis' count before deciding a subject it decided locally: a Redis that
/// restarts empty while the denial cache answers (at most its `max-age`, a
/// second by default) shows no failure to this instance, but one that
/// keeps coming and going shows one at least that often.
pub const COMPARE_AFTER: Duration = Duration::from_secs(10);

/// Whether this instance is degraded now, and the local counts it keeps.
/// One per process: every port a reload builds shares it, so entering and
/// leaving are logged once however often the table changes.
#[derive(Debug)]
pub struct DegradedMode {
    store: MemoryStore,
    instances: NonZeroU32,
    clock: Arc<dyn Clock>,
    /// `clock.monotonic()` when the mode was built: the origin of
    /// `last_failure`.
    origin: Instant,
    on: AtomicBool,
    /// Milliseconds from `origin` to the latest failure of Redis.
    last_failure: AtomicU64,
    /// How many times the instance entered degraded mode.
    entered: AtomicU64,
    /// What was admitted locally and is (or may be) missing from Redis.
    ledger: Ledger,
    /// Subjects of the ledger with a decision under way, and the signal
    /// that one ended: see [`DegradedMode::turn`].
    deciding: Mutex<HashSet<SubjectDigest>>,
    turn_ended: tokio::sync::Notify,
}

/// A subject's turn to decide (see [`DegradedMode::turn`]); the next one
/// starts when it drops.
struct Turn<'m> {
    mode: &'m DegradedMode,
    subject: SubjectDigest,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.mode.deciding.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.subject);
        self.mode.turn_ended.notify_waiters();
    }
}

impl DegradedMode {
    /// A mode counting in `store`, for a fleet of `instances`, timed by
    /// `clock` (the one the ports are built with).
    pub fn new(store: MemoryStore, instances: NonZeroU32, clock: Arc<dyn Clock>) -> Self {
        let origin = clock.monotonic();
        Self {
            store,
            instances,
            clock,
            origin,
            on: AtomicBool::new(false),
            last_failure: AtomicU64::new(0),
            entered: AtomicU64::new(0),
            ledger: Ledger::default(),
            deciding: Mutex::default(),
            turn_ended: tokio::sync::Notify::new(),
        }
    }

    /// Waits until no other decision of `subject` is under way, then holds
    /// its turn: a subject the ledger tracks is decided one request at a
    /// time, from its write-back to the record of Redis' answer. Otherwise
    /// a request arriving while another writes the subject's local
    /// admissions back would reach Redis before them, and a Redis that
    /// keeps restarting empty would admit that much again at every
    /// restart. `None` once `deadline` passes first.
    async fn turn(&self, subject: SubjectDigest, deadline: Instant) -> Option<Turn<'_>> {
        loop {
            let ended = self.turn_ended.notified();
            let mut ended = std::pin::pin!(ended);
            // Registered before the look, so an end between the two wakes it.
            ended.as_mut().enable();
            if self.deciding.lock().unwrap_or_else(PoisonError::into_inner).insert(subject) {
                return Some(Turn { mode: self, subject });
            }
            let left = deadline.saturating_duration_since(self.clock.monotonic());
            if left.is_zero() || tokio::time::timeout(left, ended).await.is_err() {
                return None;
            }
        }
    }

    /// The store the local limiter counts in.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    /// How many instances share the traffic while Redis is away.
    pub fn instances(&self) -> NonZeroU32 {
        self.instances
    }

    /// Whether the instance is degraded: from a failure of Redis until
    /// Redis has answered with no failure for [`LEAVE_AFTER`].
    pub fn is_degraded(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// How many times the instance entered degraded mode (and logged it).
    pub fn times_entered(&self) -> u64 {
        self.entered.load(Ordering::Relaxed)
    }

    /// How many subjects have local admissions Redis has not been given
    /// yet (written back at their next Redis decision).
    pub fn owing_subjects(&self) -> usize {
        self.ledger.owing()
    }

    /// Whether a decision must look at the ledger: while degraded, or while
    /// some subject is still tracked. Otherwise one atomic load each.
    fn tracking(&self) -> bool {
        self.is_degraded() || !self.ledger.is_empty()
    }

    /// Milliseconds since `origin` on the mode's clock.
    fn now_millis(&self) -> u64 {
        let elapsed = self.clock.monotonic().saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
    }

    /// Redis could not decide: noted, and the first time since the
    /// instance left (or started), one log line.
    fn enter(&self, outcome: &RateLimitOutcome) {
        // Loads first: the common case while degraded is a read, not a
        // write to a line every request shares (at most one a millisecond).
        let now = self.now_millis();
        if self.last_failure.load(Ordering::Relaxed) < now {
            self.last_failure.fetch_max(now, Ordering::AcqRel);
        }
        if !self.on.load(Ordering::Relaxed) && !self.on.swap(true, Ordering::AcqRel) {
            self.entered.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                outcome = outcome.category_name(),
                instances = self.instances.get(),
                "rate limit entering degraded mode: Redis cannot decide, so this instance \
                 limits locally at ceil(limit / instances) until Redis answers again"
            );
        }
    }

    /// Redis answered: once it has answered with no failure for
    /// [`LEAVE_AFTER`], one log line. The local counts stay until their
    /// windows end. A failure racing this answer may see the mode still on
    /// and not log; the next failure enters (and logs) again, and as the
    /// counts are kept no share is given twice.
    fn leave(&self) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        // The time since Redis' last failure (logged as `quiet_ms`), not
        // how long it has been answering: with few requests the first
        // answer past the hold time comes later.
        let quiet = self.now_millis().saturating_sub(self.last_failure.load(Ordering::Acquire));
        if Duration::from_millis(quiet) >= LEAVE_AFTER && self.on.swap(false, Ordering::AcqRel) {
            tracing::info!(
                quiet_ms = quiet,
                local_keys = self.store.live_entries(),
                owing_subjects = self.ledger.owing(),
                "rate limit leaving degraded mode: Redis has answered with no failure for \
                 the hold time; local counts kept until their windows end"
            );
        }
    }
}

/// `policy` as the local limiter holds it for a fleet of `instances`: every
/// count (limit, capacity, refill tokens, burst, max-in-flight) at
/// `ceil(count / instances)`,
/// the maximum cost at most the new count, everything else as configured.
/// A count is at least 1, and so is its ceiling: a policy of limit 1 stays
/// 1 on every instance, so the fleet may admit `instances` such requests
/// per window (never 0, which would refuse everything).
///
/// # Errors
/// What the policy builder finds; a scaled-down valid policy has none.
pub fn scaled(
    policy: &RateLimitPolicy,
    instances: NonZeroU32,
) -> Result<RateLimitPolicy, ContractError> {
    let share = |count: u64| count.div_ceil(u64::from(instances.get()));
    let algorithm = policy.algorithm().scaled(&share);
    let maximum_cost = policy.maximum_cost().min(algorithm.limit());
    RateLimitPolicy::builder(policy.id().as_str(), algorithm)
        .revision(policy.revision())
        .maximum_cost(maximum_cost)
        .failure_policy(policy.failure_policy())
        .cleanup_grace(policy.cleanup_grace())
        .maximum_clock_regression(policy.maximum_clock_regression())
        .evaluation_dedup(policy.evaluation_dedup())
        .scope(policy.scope())
        .mode(policy.mode())
        .build()
}

/// The Redis port with the degraded mode in front of its failures. A
/// handle: its clones share the ports and the mode, so an answer that
/// waits owns one.
#[derive(Debug, Clone)]
pub struct DegradedPort {
    primary: Arc<dyn EdgeRateLimitPort>,
    local: Arc<dyn EdgeRateLimitPort>,
    mode: Arc<DegradedMode>,
}

/// The retry-after of a Redis failure met while comparing counts, which
/// stands only when the local limiter cannot decide either (a cost above
/// the share), and of a request whose deadline passed waiting for its
/// subject's turn.
const COMPARE_RETRY_AFTER: Duration = Duration::from_secs(1);

impl DegradedPort {
    /// `primary` (Redis) decides; when it answers `Unavailable` (any
    /// category, `ClockUnsafe` included) or `Indeterminate`, `local` (a
    /// memory provider over `mode`'s store with the [`scaled`] policies)
    /// does. `mode`'s clock is the one both were built with.
    pub fn new(
        primary: Arc<dyn EdgeRateLimitPort>,
        local: Arc<dyn EdgeRateLimitPort>,
        mode: Arc<DegradedMode>,
    ) -> Self {
        Self { primary, local, mode }
    }

    /// The local answer to a request Redis could not decide; `failed` is
    /// Redis' answer, which stands when the local limiter cannot decide
    /// either (a cost above a policy's scaled limit, or no room left in
    /// the ledger for one more subject), so that fails closed. What the
    /// local limiter admits is recorded as owed to Redis.
    fn degraded(&self, request: RateLimitRequest<'static>, failed: RateLimitOutcome) -> Evaluation {
        self.mode.enter(&failed);
        if !self.mode.ledger.has_room(&request.subject, self.mode.now_millis(), true) {
            return Evaluation::ready(failed);
        }
        let mut local = request.clone();
        let now = self.mode.clock.monotonic();
        local.deadline = local.deadline.max(now + LOCAL_DEADLINE);
        match self.local.evaluate(local).into_ready() {
            Ok(outcome) => Evaluation::ready(self.locally(&request, outcome, failed)),
            Err(waiting) => {
                let port = self.clone();
                Evaluation::pending(async move {
                    let outcome = waiting.await;
                    port.locally(&request, outcome, failed)
                })
            }
        }
    }

    /// The local limiter's `outcome` for `request`, recorded in the ledger
    /// when it admitted; Redis' `failed` when it could not decide.
    fn locally(
        &self,
        request: &RateLimitRequest,
        outcome: RateLimitOutcome,
        failed: RateLimitOutcome,
    ) -> RateLimitOutcome {
        match outcome {
            Ok(set) => {
                // A replay charged nothing.
                if set.allowed() && !set.replayed() {
                    let RateLimitRequest { subject, operation, policies, cost, .. } = request;
                    self.record(subject, operation, policies, *cost, &set, false);
                }
                Ok(set.from_degraded())
            }
            Err(_) => failed,
        }
    }

    /// The answer to `kept` once Redis answered `outcome`, `tracking` as
    /// read when the request came in.
    fn answered(
        &self,
        kept: RateLimitRequest<'static>,
        outcome: RateLimitOutcome,
        tracking: bool,
    ) -> Evaluation {
        let set = match &outcome {
            Ok(set) => set,
            Err(
                RateLimitFailure::Unavailable {
                    category:
                        UnavailableCategory::AdmissionRejected
                        | UnavailableCategory::UnavailableBeforeSend
                        | UnavailableCategory::ClockUnsafe,
                    ..
                }
                | RateLimitFailure::Indeterminate { .. },
            ) => return self.degraded(kept, outcome),
            // The request does not fit the policies (unknown policy, cost
            // above the maximum) or the stored state: no outage to cover.
            Err(RateLimitFailure::Incompatible { .. }) => return Evaluation::ready(outcome),
        };
        let mut mirror = None;
        match set.source() {
            // Redis itself answered: its answer stands, and degraded mode
            // ends once Redis has stopped failing for the hold time. An
            // admission of a subject this instance decided locally in the
            // window is charged to the local limiter too (what fits the
            // share), so a Redis coming and going cannot add its
            // admissions to a whole local share.
            DecisionSource::Store => {
                self.mode.leave();
                if tracking
                    && set.allowed()
                    && !set.replayed()
                    && !self.holds_leases(&kept.policies)
                    && self.record(
                        &kept.subject,
                        &kept.operation,
                        &kept.policies,
                        kept.cost,
                        set,
                        true,
                    )
                {
                    let mut request = kept;
                    let now = self.mode.clock.monotonic();
                    request.deadline = request.deadline.max(now + LOCAL_DEADLINE);
                    mirror = Some(self.local.evaluate(request));
                }
            }
            // The denial cache answers without Redis, and a nested
            // degraded answer is not Redis' either.
            DecisionSource::LocalCache | DecisionSource::Degraded => {}
        }
        // The mirror's answer is not the request's: Redis' stands.
        match mirror.map(Evaluation::into_ready) {
            None | Some(Ok(_)) => Evaluation::ready(outcome),
            Some(Err(waiting)) => Evaluation::pending(async move {
                let _ = waiting.await;
                outcome
            }),
        }
    }

    /// The evaluation while something is owed to Redis or followed:
    /// settling it first waits for Redis.
    async fn settled(&self, request: RateLimitRequest<'static>) -> RateLimitOutcome {
        let _turn = if self.mode.ledger.tracks(&request.subject) {
            let Some(turn) = self.mode.turn(request.subject, request.deadline).await else {
                return Err(RateLimitFailure::Unavailable {
                    category: UnavailableCategory::AdmissionRejected,
                    retry_after: COMPARE_RETRY_AFTER,
                });
            };
            Some(turn)
        } else {
            None
        };
        // Kept for the local limiter: the pseudonym is the one copy made
        // (the policy set is a shared pointer).
        let kept = request.clone();
        if let Some(failed) = self.settle(&request).await {
            return self.degraded(kept, failed).await;
        }
        let outcome = self.primary.evaluate(request).await;
        self.answered(kept, outcome, true).await
    }

    /// After the local limiter's `local` answer to a release: Redis', when
    /// the lease was not held locally.
    fn released_locally(&self, lease: &Lease, local: ReleaseOutcome) -> Releasing {
        // Held nowhere: a local failure (the memory provider has none)
        // would still be the one to report.
        let pick = move |redis| match redis {
            ReleaseOutcome::NotHeld => local,
            ReleaseOutcome::Released
            | ReleaseOutcome::Unavailable { .. }
            | ReleaseOutcome::Indeterminate => redis,
        };
        match local {
            ReleaseOutcome::Released => Releasing::ready(local),
            ReleaseOutcome::NotHeld
            | ReleaseOutcome::Unavailable { .. }
            | ReleaseOutcome::Indeterminate => match self.primary.release(lease).into_ready() {
                Ok(redis) => Releasing::ready(pick(redis)),
                Err(waiting) => Releasing::pending(async move { pick(waiting.await) }),
            },
        }
    }

    /// Records in the ledger what the admitted `set` charged: owed to
    /// Redis when the local limiter decided, acknowledged at once when
    /// Redis did (counted only for a subject already decided locally in
    /// the window). Whether any account was touched.
    fn record(
        &self,
        subject: &SubjectDigest,
        operation: &OperationDigest,
        policies: &PolicySet,
        cost: u64,
        set: &SetDecision,
        on_redis: bool,
    ) -> bool {
        let now = self.mode.now_millis();
        let charges: Vec<_> = policies
            .ids()
            .iter()
            .zip(set.decisions())
            .map(|(id, decision)| {
                let shape = self.primary.policy(id).filter(|p| !p.algorithm().holds_leases()).map(
                    |policy| Shape {
                        scoped: policy.scope() == PolicyScope::Operation,
                        windowed: policy.algorithm().windowed(),
                    },
                );
                let until = now.saturating_add(decision.reset_after_ms);
                Charge { policy: id.clone(), shape, until, on_redis }
            })
            .collect();
        self.mode.ledger.record(subject, operation, cost, now, &charges)
    }

    /// Whether a policy of `policies` holds leases (or is unknown here).
    fn holds_leases(&self, policies: &PolicySet) -> bool {
        policies.ids().iter().any(|id| {
            self.primary.policy(id).is_none_or(|policy| policy.algorithm().holds_leases())
        })
    }

    /// Settles what `request`'s subject owes Redis before Redis decides the
    /// request (see [`Self::write_back`]). `Some` is Redis' failure when
    /// it did not answer: what is owed stays owed, for the next decision,
    /// and the request is decided locally without asking Redis again.
    async fn settle(&self, request: &RateLimitRequest<'_>) -> Option<RateLimitOutcome> {
        let now = self.mode.now_millis();
        let quiet = now.saturating_sub(self.mode.last_failure.load(Ordering::Acquire));
        let comparing = Duration::from_millis(quiet) < COMPARE_AFTER;
        self.mode.ledger.purge(now, self.mode.is_degraded(), comparing);
        let jobs = self.mode.ledger.take(&request.subject, now);
        let mut failed = None;
        for mut job in jobs {
            if failed.is_none() {
                failed = self.write_back(request, &mut job).await;
            }
            self.mode.ledger.finish(&request.subject, &job);
        }
        failed
    }

    /// Writes one account back to Redis through the port, as ordinary
    /// charges on the subject's key: pieces of at most the policy's
    /// `maximum-cost`, each with its own evaluation id, kept across a
    /// failure so a retry after an `Indeterminate` answer replays (with
    /// dedupe on) rather than charging twice. Each piece Redis takes is
    /// acknowledged at once, so an instance whose Redis flips up and down
    /// writes each local admission back once; a piece Redis does not
    /// answer stays owed (retried at the subject's next decision). A piece
    /// Redis refuses because it does not fit is followed by one of the
    /// size Redis says still fits (its `remaining`), until nothing does:
    /// the budget is then full in Redis, which refuses what follows.
    ///
    /// Per algorithm, what this achieves:
    /// - fixed window: Redis' count in the window is what it would have
    ///   been had Redis decided the local admissions (capped at the
    ///   limit), so the window Redis returns in stays at the limit;
    /// - sliding counter: the same for the current window; admissions of
    ///   the previous window are not written back (the account ends with
    ///   its window), so the weighted estimate lacks their share;
    /// - token bucket and GCRA: the tokens (cells) are taken at the time of
    ///   the write-back with no refill credit for the time since, which
    ///   errs towards refusing; an account ends once the local state has
    ///   refilled (its `reset_after`), after which nothing would remain;
    /// - concurrency: nothing is written back: a lease goes back where it
    ///   was taken (locally) and ends at its `lease-ttl`.
    ///
    /// A Redis that restarted empty (or lost keys) in between lost what it
    /// was given: for a windowed policy, after any failure of Redis since
    /// its count was last compared, the account compares first
    /// (`inspect`, which charges nothing) and writes back again what is
    /// missing of its own acknowledged admissions. Redis' count also holds
    /// other instances' admissions, so the comparison never writes twice
    /// what a Redis that kept its data holds.
    async fn write_back(
        &self,
        request: &RateLimitRequest<'_>,
        job: &mut Job,
    ) -> Option<RateLimitOutcome> {
        let Some(policy) = self.primary.policy(&job.policy) else {
            job.drop = true;
            return None;
        };
        if job.verify {
            let operation = job.scoped.then_some(job.operation);
            let key = BudgetKey::new(request.subject, job.policy.clone(), operation);
            match self.primary.inspect(&key).await {
                Ok(state) => {
                    job.acked = job.acked.min(state.limit.saturating_sub(state.remaining));
                }
                Err(BudgetFailure::Unavailable) => {
                    return Some(Err(RateLimitFailure::Unavailable {
                        category: UnavailableCategory::UnavailableBeforeSend,
                        retry_after: COMPARE_RETRY_AFTER,
                    }));
                }
                Err(BudgetFailure::Indeterminate) => {
                    return Some(Err(RateLimitFailure::Indeterminate {
                        retry_after: COMPARE_RETRY_AFTER,
                    }));
                }
                Err(
                    BudgetFailure::UnknownPolicy
                    | BudgetFailure::OperationRequired
                    | BudgetFailure::OperationNotApplicable
                    | BudgetFailure::StateIncompatible,
                ) => {
                    job.drop = true;
                    return None;
                }
            }
        }
        let mut most = policy.maximum_cost();
        while job.owed() > 0 {
            let cost = job.owed().min(most);
            let piece = RateLimitRequest {
                policies: PolicySet::single(job.policy.clone()).into(),
                subject: request.subject,
                operation: job.operation,
                cost,
                evaluation_id: job.piece,
                deadline: request.deadline,
            };
            match self.primary.evaluate(piece).await {
                Ok(set) if !set.allowed() && set.source() == DecisionSource::Store => {
                    job.piece = EvaluationId::random();
                    let room = set.decisions().first().map_or(0, |decision| decision.remaining);
                    if room > 0 && room < cost {
                        most = room;
                    } else {
                        // Full in Redis: it refuses the rest of the window.
                        job.acked = job.admitted;
                    }
                }
                Ok(set) if set.source() == DecisionSource::Store => {
                    job.piece = EvaluationId::random();
                    job.acked += cost;
                    most = policy.maximum_cost();
                }
                // An answer Redis' store did not make is no charge there,
                // and a cached refusal says nothing of a Redis that has
                // restarted empty since: the rest stays owed, for a later
                // decision.
                Ok(_) => return None,
                failed @ (Err(RateLimitFailure::Unavailable { .. })
                | Err(RateLimitFailure::Indeterminate { .. })) => return Some(failed),
                Err(RateLimitFailure::Incompatible { .. }) => {
                    job.drop = true;
                    return None;
                }
            }
        }
        None
    }
}

#[async_trait]
impl EdgeRateLimitPort for DegradedPort {
    /// At once when Redis' answer is (the denial cache) and the local
    /// limiter's is (the memory provider), outside outages with nothing
    /// owed; else it waits, owning a handle of this port.
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation {
        // Outside outages, one atomic load: nothing is owed or followed.
        if self.mode.tracking() {
            let (port, request) = (self.clone(), request.into_owned());
            return Evaluation::pending(async move { port.settled(request).await });
        }
        // Kept for the local limiter, owning its set: the answer may wait.
        let kept = request.clone().into_owned();
        match self.primary.evaluate(request).into_ready() {
            Ok(outcome) => self.answered(kept, outcome, false),
            Err(waiting) => {
                let port = self.clone();
                Evaluation::pending(async move {
                    let outcome = waiting.await;
                    port.answered(kept, outcome, false).await
                })
            }
        }
    }

    /// The policies as configured (the fleet's), for the headers.
    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.primary.policy(id)
    }

    /// Ready when Redis is, and while it is not too: the instance still
    /// answers every request, locally. Taking every instance out of
    /// service while Redis is away would refuse everyone, which is what
    /// the mode was enabled to avoid.
    async fn is_ready(&self) -> bool {
        self.primary.is_ready().await || self.local.is_ready().await
    }

    /// Redis' budget, the fleet's count; when Redis cannot answer, the
    /// local limiter's (this instance's count at its share), as a request
    /// would be decided then: an Envoy look-only descriptor (`hits_addend`
    /// 0) is a look, and degraded mode answers it like a charge. A local
    /// failure (none for the memory provider) leaves Redis' standing.
    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        match self.primary.inspect(key).await {
            Err(failed @ (BudgetFailure::Unavailable | BudgetFailure::Indeterminate)) => {
                self.local.inspect(key).await.map_err(|_| failed)
            }
            answer @ (Ok(_)
            | Err(
                BudgetFailure::UnknownPolicy
                | BudgetFailure::OperationRequired
                | BudgetFailure::OperationNotApplicable
                | BudgetFailure::StateIncompatible,
            )) => answer,
        }
    }

    /// Redis' budget; the local counts expire with their windows. What
    /// the instance still owed Redis for it is forgotten: writing it back
    /// would undo the reset.
    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        let reset = self.primary.reset(key).await;
        if reset.is_ok() {
            self.mode.ledger.forget(&key.subject, &key.policy);
        }
        reset
    }

    /// On Redis first; where Redis did not apply it (away, or no record of
    /// the reservation, which the local limiter decided in an outage) the
    /// local limiter's answer when it applied it. An excess charged
    /// locally stays local: nothing owed to Redis is written for it.
    fn settle(&self, settlement: Settlement<'_>) -> Settling {
        let (port, settlement) = (self.clone(), settlement.into_owned());
        Settling::pending(async move {
            let remote = port.primary.settle(settlement.clone()).await;
            match remote {
                Ok(Settled::Applied | Settled::Repeated)
                | Err(RateLimitFailure::Incompatible { .. }) => remote,
                Ok(Settled::UnknownReservation | Settled::Unsupported)
                | Err(
                    RateLimitFailure::Unavailable { .. } | RateLimitFailure::Indeterminate { .. },
                ) => match port.local.settle(settlement).await {
                    local @ Ok(Settled::Applied | Settled::Repeated) => local,
                    _ => remote,
                },
            }
        })
    }

    /// The local limiter first: a lease taken there (while Redis could not
    /// decide) is held only there, and giving it back asks nothing of a
    /// Redis that may still be away. A lease it does not hold was taken
    /// on Redis.
    fn release(&self, lease: &Lease) -> Releasing {
        match self.local.release(lease).into_ready() {
            Ok(local) => self.released_locally(lease, local),
            Err(waiting) => {
                let (port, lease) = (self.clone(), lease.clone());
                Releasing::pending(async move {
                    let local = waiting.await;
                    port.released_locally(&lease, local).await
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
