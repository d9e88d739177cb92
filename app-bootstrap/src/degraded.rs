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
//! therefore cannot hand a subject a fresh share at every flip: per window
//! and per instance, the local limiter admits at most the share.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adapter_memory::MemoryStore;
use async_trait::async_trait;
use shared_contract::{
    Algorithm, BudgetFailure, BudgetKey, BudgetState, Clock, ContractError, DecisionSource,
    EdgeRateLimitPort, Lease, PolicyId, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    ReleaseOutcome, UnavailableCategory,
};

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
    let algorithm = match *policy.algorithm() {
        Algorithm::FixedWindow { limit, window } => {
            Algorithm::FixedWindow { limit: share(limit), window }
        }
        Algorithm::SlidingCounter { limit, window } => {
            Algorithm::SlidingCounter { limit: share(limit), window }
        }
        Algorithm::TokenBucket { capacity, refill_tokens, refill_period } => {
            Algorithm::TokenBucket {
                capacity: share(capacity),
                refill_tokens: share(refill_tokens),
                refill_period,
            }
        }
        // The rate and the burst both shared: each instance spaces its
        // cells `instances` times further apart.
        Algorithm::Gcra { limit, period, burst } => {
            Algorithm::Gcra { limit: share(limit), period, burst: share(burst) }
        }
        // Each instance holds its share of the slots; the TTL and what a
        // refusal tells clients stay.
        Algorithm::Concurrency { max_in_flight, lease_ttl, retry_after } => {
            Algorithm::Concurrency { max_in_flight: share(max_in_flight), lease_ttl, retry_after }
        }
    };
    let maximum_cost = policy.maximum_cost().min(algorithm.limit());
    RateLimitPolicy::builder(policy.id().as_str(), algorithm)
        .revision(policy.revision())
        .maximum_cost(maximum_cost)
        .failure_policy(policy.failure_policy())
        .cleanup_grace(policy.cleanup_grace())
        .maximum_clock_regression(policy.maximum_clock_regression())
        .evaluation_dedup(*policy.evaluation_dedup())
        .scope(policy.scope())
        .mode(policy.mode())
        .build()
}

/// The Redis port with the degraded mode in front of its failures.
#[derive(Debug)]
pub struct DegradedPort {
    primary: Arc<dyn EdgeRateLimitPort>,
    local: Arc<dyn EdgeRateLimitPort>,
    mode: Arc<DegradedMode>,
}

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
    /// either (a cost above a policy's scaled limit), so that fails closed.
    async fn degraded(
        &self,
        mut request: RateLimitRequest,
        failed: RateLimitOutcome,
    ) -> RateLimitOutcome {
        self.mode.enter(&failed);
        let now = self.mode.clock.monotonic();
        request.deadline = request.deadline.max(now + LOCAL_DEADLINE);
        match self.local.evaluate(request).await {
            RateLimitOutcome::Evaluated(set) => RateLimitOutcome::Evaluated(set.from_degraded()),
            RateLimitOutcome::Unavailable { .. }
            | RateLimitOutcome::Incompatible { .. }
            | RateLimitOutcome::Indeterminate { .. } => failed,
        }
    }
}

#[async_trait]
impl EdgeRateLimitPort for DegradedPort {
    async fn evaluate(&self, request: RateLimitRequest) -> RateLimitOutcome {
        // Kept for the local limiter: the pseudonym is the one copy made
        // (the policy set and the operation are shared pointers).
        let kept = request.clone();
        let outcome = self.primary.evaluate(request).await;
        match outcome {
            RateLimitOutcome::Evaluated(set) => {
                match set.source() {
                    // Redis itself answered: its answer stands, and
                    // degraded mode ends once Redis has stopped failing
                    // for the hold time.
                    DecisionSource::Store => self.mode.leave(),
                    // The denial cache answers without Redis, and a nested
                    // degraded answer is not Redis' either.
                    DecisionSource::LocalCache | DecisionSource::Degraded => {}
                }
                outcome
            }
            RateLimitOutcome::Unavailable {
                category:
                    UnavailableCategory::AdmissionRejected
                    | UnavailableCategory::UnavailableBeforeSend
                    | UnavailableCategory::ClockUnsafe,
                ..
            }
            | RateLimitOutcome::Indeterminate { .. } => self.degraded(kept, outcome).await,
            // The request does not fit the policies (unknown policy, cost
            // above the maximum) or the stored state: no outage to cover.
            RateLimitOutcome::Incompatible { .. } => outcome,
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

    /// Redis' budget; the local counts expire with their windows.
    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        self.primary.reset(key).await
    }

    /// The local limiter first: a lease taken there (while Redis could not
    /// decide) is held only there, and giving it back asks nothing of a
    /// Redis that may still be away. A lease it does not hold was taken
    /// on Redis.
    async fn release(&self, lease: &Lease) -> ReleaseOutcome {
        let local = self.local.release(lease).await;
        match local {
            ReleaseOutcome::Released => local,
            ReleaseOutcome::NotHeld
            | ReleaseOutcome::Unavailable { .. }
            | ReleaseOutcome::Indeterminate => match self.primary.release(lease).await {
                // Held nowhere: a local failure (the memory provider has
                // none) would still be the one to report.
                ReleaseOutcome::NotHeld => local,
                redis @ (ReleaseOutcome::Released
                | ReleaseOutcome::Unavailable { .. }
                | ReleaseOutcome::Indeterminate) => redis,
            },
        }
    }
}

#[cfg(test)]
mod tests;
