//! The opt-in degraded mode (`[capabilities.rate-limit.degraded]`): a
//! decorator over the Redis port that answers, when Redis cannot decide,
//! from an in-process memory provider holding each policy at
//! `ceil(limit / instances)`, so the fleet together admits about the
//! configured limit while Redis is away instead of refusing everyone.
//!
//! It lives at the composition root because it combines two providers, and
//! adapters never import each other; it sees both only as
//! `Arc<dyn EdgeRateLimitPort>`, plus the memory store it empties on
//! leaving.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use adapter_memory::MemoryStore;
use async_trait::async_trait;
use shared_contract::{
    Algorithm, BudgetFailure, BudgetKey, BudgetState, Clock, ContractError, DecisionSource,
    EdgeRateLimitPort, PolicyId, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    UnavailableCategory,
};

/// How long past the moment Redis gave up the local evaluation may still
/// start. The memory step takes microseconds; this only keeps a deadline
/// the Redis attempt used up (a timeout) from turning the local answer
/// into `AdmissionRejected`, a 503, which degraded mode exists to avoid.
pub const LOCAL_DEADLINE: Duration = Duration::from_millis(100);

/// Whether this instance is degraded now, and the local counts it keeps
/// while it is. One per process: every port a reload builds shares it, so
/// entering and leaving are logged once however often the table changes.
#[derive(Debug)]
pub struct DegradedMode {
    store: MemoryStore,
    instances: NonZeroU32,
    on: AtomicBool,
}

impl DegradedMode {
    /// A mode counting in `store`, for a fleet of `instances`.
    pub fn new(store: MemoryStore, instances: NonZeroU32) -> Self {
        Self { store, instances, on: AtomicBool::new(false) }
    }

    /// The store the local limiter counts in.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    /// How many instances share the traffic while Redis is away.
    pub fn instances(&self) -> NonZeroU32 {
        self.instances
    }

    /// Whether the last answer came from the local limiter (until Redis
    /// answers again).
    pub fn is_degraded(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Redis could not decide: the first time since it last answered, one
    /// log line.
    fn enter(&self, outcome: &RateLimitOutcome) {
        // A load first: the common case while degraded is a read, not a
        // write to a line every request shares.
        if !self.on.load(Ordering::Relaxed) && !self.on.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                outcome = outcome.category_name(),
                instances = self.instances.get(),
                "rate limit entering degraded mode: Redis cannot decide, so this instance \
                 limits locally at ceil(limit / instances) until Redis answers again"
            );
        }
    }

    /// Redis answered: the first time since it could not, one log line,
    /// and the local counts are dropped (the next time starts whole).
    fn leave(&self) {
        if self.on.load(Ordering::Relaxed) && self.on.swap(false, Ordering::AcqRel) {
            let dropped = self.store.clear();
            tracing::info!(
                dropped,
                "rate limit leaving degraded mode: Redis answers again; local counts dropped"
            );
        }
    }
}

/// `policy` as the local limiter holds it for a fleet of `instances`: every
/// count (limit, capacity, refill tokens, burst) at `ceil(count / instances)`,
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
    clock: Arc<dyn Clock>,
}

impl DegradedPort {
    /// `primary` (Redis) decides; when it answers `Unavailable` (any
    /// category, `ClockUnsafe` included) or `Indeterminate`, `local` (a
    /// memory provider over `mode`'s store with the [`scaled`] policies)
    /// does. `clock` is the one both were built with.
    pub fn new(
        primary: Arc<dyn EdgeRateLimitPort>,
        local: Arc<dyn EdgeRateLimitPort>,
        mode: Arc<DegradedMode>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self { primary, local, mode, clock }
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
        let now = self.clock.monotonic();
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
                    // Redis itself answered: degraded mode ends here.
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

    /// Redis' budget: the operator looks at the fleet's count.
    async fn inspect(&self, key: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        self.primary.inspect(key).await
    }

    /// Redis' budget; the local counts go at the end of degraded mode.
    async fn reset(&self, key: &BudgetKey) -> Result<(), BudgetFailure> {
        self.primary.reset(key).await
    }
}

#[cfg(test)]
mod tests;
