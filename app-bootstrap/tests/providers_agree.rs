//! Differential property test: the memory and Redis providers answer every
//! request with the same `RateLimitOutcome`, bit for bit, for random policies
//! and random request sequences ("all providers return the
//! same tuple for the same inputs"). The contract suite pins fixed scenarios;
//! this explores random ones, clock regressions, dedupe replays, lease
//! releases and settles of usage included.
//!
//! Both providers live here because app-bootstrap is the one crate allowed to
//! know both. Redis is a private `redis-server` on a free loopback port
//! (never 6379), started once for this test binary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, Clock, DEDUP_RECORD_BYTES, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId,
    IncompatibleCategory, Lease, ManualClock, OperationDigest, PolicyMode, PolicyScope, PolicySet,
    RateLimitDecision, RateLimitFailure, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    ReleaseOutcome, SetDecision, SettleOutcome, Settled, Settlement, SubjectDigest,
    UnavailableCategory,
};
use uuid::Uuid;

/// Start of every case's caller clock (epoch ms), as the brief fixes it.
const T0: u64 = 1_800_000_000_000;
/// Subjects a case spreads its requests over.
const SUBJECTS: usize = 3;
/// How far back a repeated evaluation id may reach among the ids issued.
const RECENT_IDS: usize = 4;
/// The same for the long runs with many records: far enough back to reach
/// records a sweep or an eviction decides about.
const RECENT_IDS_MANY: usize = 10;
/// Cases per algorithm: enough to find a disagreement, few enough for a
/// debug build to stay quick.
const CASES: u32 = 64;
/// Far enough that no request ever meets its deadline.
const DEADLINE: Duration = Duration::from_secs(10);
/// Key lifetimes carry this grace, far beyond a case's real duration, so
/// Redis's real-time expiry never removes a key the memory provider keeps.
const CLEANUP_GRACE: Duration = Duration::from_secs(600);

/// Counts every case so each one gets its own Redis key prefix.
static CASE_COUNTER: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone, Copy)]
enum Shape {
    FixedWindow,
    SlidingCounter,
    TokenBucket,
    Gcra,
    Concurrency,
    CalendarWindow,
}

/// One random case: a policy set (one policy for the per-algorithm cases)
/// and the requests made under it.
#[derive(Debug, Clone)]
struct Scenario {
    policies: Vec<RateLimitPolicy>,
    steps: Vec<Step>,
}

impl Scenario {
    /// The policies, then one line per step: readable where `{:#?}` is not.
    fn describe(&self) -> String {
        let mut text = String::new();
        for policy in &self.policies {
            text.push_str(&format!("policy: {policy:?}\n"));
        }
        for (index, step) in self.steps.iter().enumerate() {
            text.push_str(&format!("  step {index}: {step:?}\n"));
        }
        text
    }
}

/// One request, preceded by a move of both caller clocks.
#[derive(Debug, Clone, Copy)]
struct Step {
    clock: ClockMove,
    subject: usize,
    /// Which of [`OPERATIONS`] the request is for.
    operation: usize,
    cost: u64,
    id: IdChoice,
    /// Instead of a request, the release of the lease of the k-th most
    /// recent id (0 = the last) for this subject and operation, whether or
    /// not that id took one.
    release: Option<usize>,
    /// Before the request (or release), at its time, a settle of usage
    /// for this subject and operation (docs/algorithms.md "Settling usage").
    settle: Option<SettleChoice>,
}

/// Which reservation a settle names, and the units it used.
#[derive(Debug, Clone, Copy)]
enum SettleChoice {
    /// The k-th most recent id (0 = the last) with the cost it was first
    /// asked with, whether or not it was admitted (and so settled before,
    /// or refused): settled again, it repeats.
    Reservation { back: usize, used: u64 },
    /// An id no request used, reserving `reserved` (0: an after-the-fact
    /// charge of `used`).
    Unknown { reserved: u64, used: u64 },
    /// The case's last settle sent again, as a retry after a lost reply.
    Again,
}

/// Two operations, so subject-scoped keys are shared and operation-scoped
/// ones are not.
const OPERATIONS: [u64; 2] = [0xa1, 0xb2];

#[derive(Debug, Clone, Copy)]
enum ClockMove {
    /// Both readings forward by this many ms.
    Forward(u64),
    /// The wall clock back by this many ms, as an NTP step would.
    Back(u64),
}

#[derive(Debug, Clone, Copy)]
enum IdChoice {
    /// A new evaluation id.
    Fresh,
    /// The k-th most recent fresh id (0 = the last), to provoke replays.
    Repeat(usize),
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Windows and periods: mostly short, so cases cross many of them, and
/// sometimes a few hundred ms, so requests pile up inside one.
fn period_ms() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 1..=50_u64, 1 => 100..=400_u64]
}

fn algorithm(shape: Shape) -> BoxedStrategy<Algorithm> {
    match shape {
        Shape::FixedWindow => (1..=8_u64, period_ms())
            .prop_map(|(limit, window)| {
                Algorithm::FixedWindow(shared_contract::FixedWindow {
                    limit,
                    window: millis(window),
                })
            })
            .boxed(),
        Shape::SlidingCounter => (1..=8_u64, period_ms())
            .prop_map(|(limit, window)| {
                Algorithm::SlidingCounter(shared_contract::SlidingCounter {
                    limit,
                    window: millis(window),
                })
            })
            .boxed(),
        Shape::TokenBucket => (1..=8_u64, 1..=3_u64, period_ms())
            .prop_map(|(capacity, refill_tokens, period)| {
                Algorithm::TokenBucket(shared_contract::TokenBucket {
                    capacity,
                    refill_tokens,
                    refill_period: millis(period),
                })
            })
            .boxed(),
        // Limits that rarely divide the period: T is rounded up to whole
        // microseconds on both sides (by under 1 %: 8 per 1 ms is 125 us).
        // The burst covers at least 1 ms of cells, `ceil(1000 / T)`, the
        // builder's rule (docs/algorithms.md#gcra).
        Shape::Gcra => (1..=8_u64, period_ms())
            .prop_flat_map(|(limit, period)| {
                let least = 1000_u64.div_ceil((period * 1000).div_ceil(limit));
                (Just(limit), Just(period), least..=least.max(8))
            })
            .prop_map(|(limit, period, burst)| {
                Algorithm::Gcra(shared_contract::Gcra { limit, period: millis(period), burst })
            })
            .boxed(),
        // Few slots, so requests are refused; leases that expire within a
        // case, so a lease is reclaimed as well as released.
        Shape::Concurrency => (1..=4_u64, period_ms(), 1..=100_u64)
            .prop_map(|(max_in_flight, lease_ttl, retry_after)| {
                Algorithm::Concurrency(shared_contract::Concurrency {
                    max_in_flight,
                    lease_ttl: millis(lease_ttl),
                    retry_after: millis(retry_after),
                })
            })
            .boxed(),
        // T0 is local midnight in Los Angeles (2027-01-15 00:00 -08), so
        // the clock's steps back cross a day there: a caller in one day
        // meets a key marked in the next, beside zones where every case
        // stays in one period.
        Shape::CalendarWindow => {
            let periods = [
                shared_contract::CalendarPeriod::Day,
                shared_contract::CalendarPeriod::Week,
                shared_contract::CalendarPeriod::Month,
                shared_contract::CalendarPeriod::Year,
            ];
            let zones = ["America/Los_Angeles", "UTC", "Europe/Berlin"];
            (
                1..=8_u64,
                proptest::sample::select(periods.to_vec()),
                proptest::sample::select(zones.to_vec()),
            )
                .prop_map(|(limit, period, zone)| {
                    Algorithm::CalendarWindow(shared_contract::CalendarWindow {
                        limit,
                        period,
                        time_zone: zone.parse().expect("a zone of the bundled database"),
                    })
                })
                .boxed()
        }
    }
}

/// Dedupe off, or on with a small ttl and a capacity of 1 to 12 records set
/// by either bound (entries, or stored bytes that are not a whole number of
/// records), so eviction and expiry both happen within a case.
fn dedup() -> impl Strategy<Value = EvaluationDedupPolicy> {
    // Beyond 8 records the Redis sweep of expired records (at most 8 per
    // write) leaves some for later writes, beside the eviction at the cap.
    let enabled = (1..=100_u64, 1..=12_u32, 1..=13_u32, 0..DEDUP_RECORD_BYTES).prop_map(
        |(ttl, max_entries, records, spare_bytes)| EvaluationDedupPolicy::Enabled {
            ttl: millis(ttl),
            max_entries,
            max_stored_bytes: records * DEDUP_RECORD_BYTES + spare_bytes,
        },
    );
    prop_oneof![1 => Just(EvaluationDedupPolicy::Disabled), 3 => enabled]
}

fn policy(shape: Shape) -> impl Strategy<Value = RateLimitPolicy> {
    policy_as(
        "diff.random",
        algorithm(shape),
        Just(PolicyScope::Operation),
        Just(PolicyMode::Enforce),
    )
}

fn policy_as(
    id: &'static str,
    algorithm: impl Strategy<Value = Algorithm>,
    scope: impl Strategy<Value = PolicyScope> + Clone + 'static,
    mode: impl Strategy<Value = PolicyMode> + Clone + 'static,
) -> impl Strategy<Value = RateLimitPolicy> {
    algorithm
        .prop_flat_map(move |algorithm| {
            let limit = algorithm.limit();
            (Just(algorithm), 1..=limit, 0..=30_u64, dedup(), scope.clone(), mode.clone())
        })
        .prop_map(move |(algorithm, maximum_cost, regression, dedup, scope, mode)| {
            let holds_leases = algorithm.holds_leases();
            let builder = RateLimitPolicy::builder(id, algorithm)
                .maximum_clock_regression(millis(regression))
                .cleanup_grace(CLEANUP_GRACE)
                .scope(scope)
                .mode(mode);
            // A concurrency policy takes neither: a lease is one slot
            // whatever the cost, and its id is its dedupe.
            let builder = if holds_leases {
                builder
            } else {
                builder.maximum_cost(maximum_cost).evaluation_dedup(dedup)
            };
            builder.build().expect("the strategy only builds valid policies")
        })
}

/// Any algorithm, for the mixed sets.
fn any_algorithm() -> BoxedStrategy<Algorithm> {
    prop_oneof![
        algorithm(Shape::FixedWindow),
        algorithm(Shape::SlidingCounter),
        algorithm(Shape::TokenBucket),
        algorithm(Shape::Gcra),
        algorithm(Shape::Concurrency),
        algorithm(Shape::CalendarWindow),
    ]
    .boxed()
}

/// A set of one to three policies of any algorithm, scope and mode (shadow
/// one time in four), with distinct ids.
fn policy_set() -> impl Strategy<Value = Vec<RateLimitPolicy>> {
    const IDS: [&str; 3] = ["diff.a", "diff.b", "diff.c"];
    let scope = prop_oneof![Just(PolicyScope::Operation), Just(PolicyScope::Subject)];
    let mode = prop_oneof![3 => Just(PolicyMode::Enforce), 1 => Just(PolicyMode::Shadow)];
    (1..=IDS.len()).prop_flat_map(move |len| {
        IDS[..len]
            .iter()
            .map(|id| policy_as(id, any_algorithm(), scope.clone(), mode.clone()).boxed())
            .collect::<Vec<_>>()
    })
}

/// A settle, one step in four: of a recent reservation mostly, used from
/// nothing to twice the maximum cost and a bit, so both refunds and
/// charges past the limit come up, and often the last one again.
fn settle(maximum_cost: u64) -> impl Strategy<Value = Option<SettleChoice>> {
    let used = 0..=2 * maximum_cost + 2;
    let choice = prop_oneof![
        3 => (0..RECENT_IDS, used.clone())
            .prop_map(|(back, used)| SettleChoice::Reservation { back, used }),
        1 => (prop_oneof![Just(0), 1..=maximum_cost], used)
            .prop_map(|(reserved, used)| SettleChoice::Unknown { reserved, used }),
        2 => Just(SettleChoice::Again),
    ];
    prop_oneof![3 => Just(None), 1 => choice.prop_map(Some)]
}

/// A step; costs run from 0 to one above the maximum so both ends of
/// `CostExceedsMaximum` come up. With `releases`, one step in four
/// releases a recent id's lease instead; one in four settles first.
fn step(maximum_cost: u64, releases: bool) -> impl Strategy<Value = Step> {
    let clock = prop_oneof![
        5 => (0..=40_u64).prop_map(ClockMove::Forward),
        1 => (0..=50_u64).prop_map(ClockMove::Back),
    ];
    let id =
        prop_oneof![3 => Just(IdChoice::Fresh), 1 => (0..RECENT_IDS).prop_map(IdChoice::Repeat)];
    let release = if releases {
        prop_oneof![3 => Just(None), 1 => (0..RECENT_IDS).prop_map(Some)].boxed()
    } else {
        Just(None).boxed()
    };
    let step = (clock, 0..SUBJECTS, 0..OPERATIONS.len(), 0..=maximum_cost + 1, id, release);
    (step, settle(maximum_cost)).prop_map(
        |((clock, subject, operation, cost, id, release), settle)| Step {
            clock,
            subject,
            operation,
            cost,
            id,
            release,
            settle,
        },
    )
}

/// The most a request of `policies` may cost: the smallest maximum of its
/// rate policies; `None` for a set of concurrency policies alone, which
/// take any cost from 1 (a lease is one slot).
fn cost_bound(policies: &[RateLimitPolicy]) -> Option<u64> {
    policies
        .iter()
        .filter(|policy| !policy.algorithm().holds_leases())
        .map(RateLimitPolicy::maximum_cost)
        .min()
}

fn scenario(shape: Shape) -> impl Strategy<Value = Scenario> {
    policy(shape).prop_map(|policy| vec![policy]).prop_flat_map(steps_for)
}

fn set_scenario() -> impl Strategy<Value = Scenario> {
    policy_set().prop_flat_map(steps_for)
}

/// Steps whose costs reach one above the smallest maximum of the set (2
/// for concurrency policies alone), with releases when the set holds a
/// concurrency policy.
fn steps_for(policies: Vec<RateLimitPolicy>) -> impl Strategy<Value = Scenario> {
    let maximum = cost_bound(&policies).unwrap_or(2);
    let releases = policies.iter().any(|policy| policy.algorithm().holds_leases());
    let steps = vec(step(maximum, releases), 1..=60);
    (Just(policies), steps).prop_map(|(policies, steps)| Scenario { policies, steps })
}

fn redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("build the tokio runtime")
    })
}

fn subject(index: usize) -> SubjectDigest {
    SubjectDigest::parse(format!("v1:{:032x}", index + 1)).expect("a valid digest")
}

/// What the random cases reached, so a strategy that stops exercising a
/// branch (say, replays) fails loudly instead of passing vacuously.
#[derive(Debug, Default)]
struct Tally {
    allowed: AtomicU64,
    denied: AtomicU64,
    replayed: AtomicU64,
    clock_unsafe: AtomicU64,
    cost_rejected: AtomicU64,
    /// Refused sets in which some policy allowed (and was spared).
    spared: AtomicU64,
    /// Admitted sets in which some (shadow) policy denied.
    shadow_denied: AtomicU64,
    /// Releases that freed a slot, and those that found no live lease.
    released: AtomicU64,
    not_held: AtomicU64,
    /// Settles applied, repeated, and of no live reservation.
    settled: AtomicU64,
    settle_repeated: AtomicU64,
    settle_unknown: AtomicU64,
}

impl Tally {
    fn count(&self, outcome: &RateLimitOutcome) {
        if let Ok(set) = outcome {
            let some_allowed = set.decisions().iter().any(|decision| decision.allowed);
            let some_denied = set.decisions().iter().any(|decision| !decision.allowed);
            if !set.allowed() && some_allowed {
                self.spared.fetch_add(1, Ordering::Relaxed);
            }
            if set.allowed() && some_denied && !set.replayed() {
                self.shadow_denied.fetch_add(1, Ordering::Relaxed);
            }
        }
        let counter = match outcome {
            Ok(set) if set.replayed() => &self.replayed,
            Ok(set) if set.allowed() => &self.allowed,
            Ok(_) => &self.denied,
            Err(RateLimitFailure::Unavailable { .. }) => &self.clock_unsafe,
            Err(RateLimitFailure::Incompatible { .. }) => &self.cost_rejected,
            // `expected_kind` rejects it before it is counted.
            Err(RateLimitFailure::Indeterminate { .. }) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn count_release(&self, outcome: ReleaseOutcome) {
        let counter = match outcome {
            ReleaseOutcome::Released => &self.released,
            ReleaseOutcome::NotHeld => &self.not_held,
            // `run_case` rejects them before they are counted.
            ReleaseOutcome::Unavailable { .. } | ReleaseOutcome::Indeterminate => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn count_settle(&self, outcome: &SettleOutcome) {
        let counter = match outcome {
            Ok(Settled::Applied) => &self.settled,
            Ok(Settled::Repeated) => &self.settle_repeated,
            Ok(Settled::UnknownReservation) => &self.settle_unknown,
            // `run_case` rejects them before they are counted; a clock
            // refusal is counted with the decisions'.
            Ok(Settled::Unsupported) | Err(_) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn assert_covered(&self, what: &str, coverage: Coverage) {
        let Coverage { sets, leases, settles } = coverage;
        let mut reached = vec![
            ("allowed", &self.allowed),
            ("denied", &self.denied),
            ("replayed", &self.replayed),
            ("clock-unsafe", &self.clock_unsafe),
            ("cost-exceeds-maximum", &self.cost_rejected),
        ];
        if sets {
            reached.push(("refused set with a spared policy", &self.spared));
            reached.push(("admitted set with a denying shadow", &self.shadow_denied));
        }
        if leases {
            reached.push(("release of a held lease", &self.released));
            reached.push(("release of a lease not held", &self.not_held));
        }
        if settles {
            reached.push(("settle applied", &self.settled));
            reached.push(("settle repeated", &self.settle_repeated));
            reached.push(("settle of no live reservation", &self.settle_unknown));
        }
        for (name, counter) in reached {
            assert!(
                counter.load(Ordering::Relaxed) > 0,
                "{what}: no random case produced a {name} outcome; the strategy lost coverage \
                 ({self:?})"
            );
        }
    }
}

/// The only outcomes a healthy provider gives these requests: a decision,
/// a clock regression beyond the bound, or a cost outside 1..=maximum.
fn expected_kind(outcome: &RateLimitOutcome) -> bool {
    match outcome {
        Ok(_) => true,
        Err(RateLimitFailure::Unavailable { category, .. }) => match category {
            UnavailableCategory::ClockUnsafe => true,
            UnavailableCategory::AdmissionRejected | UnavailableCategory::UnavailableBeforeSend => {
                false
            }
        },
        Err(RateLimitFailure::Incompatible { category }) => match category {
            IncompatibleCategory::CostExceedsMaximum => true,
            IncompatibleCategory::UnknownPolicy | IncompatibleCategory::StateIncompatible => false,
        },
        Err(RateLimitFailure::Indeterminate { .. }) => false,
    }
}

/// Both providers under one policy, each with its own manual clock, the
/// two clocks always moved alike.
#[derive(Debug)]
struct Pair {
    policies: PolicySet,
    memory: MemoryEdgeRateLimitAdapter,
    memory_clock: ManualClock,
    redis: RedisEdgeRateLimitAdapter,
    redis_clock: ManualClock,
}

impl Pair {
    fn new(policies: &[RateLimitPolicy]) -> Self {
        let case = CASE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let memory_clock = ManualClock::new(T0);
        let redis_clock = ManualClock::new(T0);
        let memory =
            MemoryEdgeRateLimitAdapter::new(policies.to_vec(), Arc::new(memory_clock.clone()))
                .expect("a valid memory adapter");
        let settings = RedisSettings {
            urls: vec![redis().url()],
            // A fresh prefix per case: no case ever reads another's keys.
            key_prefix: format!("ca:rl:pa{case}:"),
            // Generous, so a loaded machine never turns a reply into a timeout.
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(5),
            ..RedisSettings::default()
        };
        let redis = RedisEdgeRateLimitAdapter::new(
            settings,
            policies.to_vec(),
            Arc::new(redis_clock.clone()),
        )
        .expect("a valid redis adapter");
        let ids = policies.iter().map(|policy| policy.id().clone());
        let policies = PolicySet::new(ids).expect("distinct ids");
        Self { policies, memory, memory_clock, redis, redis_clock }
    }

    fn move_clocks(&self, step: ClockMove) {
        for clock in [&self.memory_clock, &self.redis_clock] {
            match step {
                ClockMove::Forward(ms) => clock.advance(millis(ms)),
                ClockMove::Back(ms) => clock.set_epoch_millis(clock.epoch_millis() - ms),
            }
        }
    }

    /// Milliseconds since `T0` on both clocks (negative after a step back).
    fn elapsed(&self) -> i128 {
        i128::from(self.memory_clock.epoch_millis()) - i128::from(T0)
    }

    /// The same release to both providers: (memory, redis).
    async fn release(
        &self,
        subject: &SubjectDigest,
        operation: usize,
        id: EvaluationId,
    ) -> (ReleaseOutcome, ReleaseOutcome) {
        let lease = Lease {
            policies: self.policies.clone(),
            subject: *subject,
            operation: OperationDigest::from_u64(OPERATIONS[operation]),
            id,
        };
        (self.memory.release(&lease).await, self.redis.release(&lease).await)
    }

    /// The same settle to both providers: (memory, redis).
    async fn settle(
        &self,
        subject: &SubjectDigest,
        operation: usize,
        reserved: u64,
        evaluation_id: EvaluationId,
        used: u64,
    ) -> (SettleOutcome, SettleOutcome) {
        let operation = OperationDigest::from_u64(OPERATIONS[operation]);
        let settlement = |clock: &ManualClock| Settlement {
            request: RateLimitRequest {
                policies: self.policies.clone().into(),
                subject: *subject,
                operation,
                cost: reserved,
                evaluation_id,
                deadline: clock.monotonic() + DEADLINE,
            },
            used,
        };
        let from_memory = self.memory.settle(settlement(&self.memory_clock)).await;
        let from_redis = self.redis.settle(settlement(&self.redis_clock)).await;
        (from_memory, from_redis)
    }

    /// The same request to both providers: (memory, redis).
    async fn evaluate(
        &self,
        subject: &SubjectDigest,
        operation: usize,
        cost: u64,
        evaluation_id: EvaluationId,
    ) -> (RateLimitOutcome, RateLimitOutcome) {
        let operation = OperationDigest::from_u64(OPERATIONS[operation]);
        let request = |clock: &ManualClock| RateLimitRequest {
            policies: self.policies.clone().into(),
            subject: *subject,
            operation,
            cost,
            evaluation_id,
            deadline: clock.monotonic() + DEADLINE,
        };
        let from_memory = self.memory.evaluate(request(&self.memory_clock)).await;
        let from_redis = self.redis.evaluate(request(&self.redis_clock)).await;
        (from_memory, from_redis)
    }
}

/// Ids numbered within a case, so a shrunk case replays the same way.
fn numbered_id(number: usize) -> EvaluationId {
    EvaluationId::from_uuid(Uuid::from_u128(number as u128))
}

/// Fails the case unless both providers answered step `index` alike.
fn agree<T: PartialEq + std::fmt::Debug>(
    from_memory: &T,
    from_redis: &T,
    index: usize,
    step: &Step,
    pair: &Pair,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        from_memory,
        from_redis,
        "step {} ({:?}) at t = T0 + {} ms: memory (left) and redis (right) disagree",
        index,
        step,
        pair.elapsed()
    );
    Ok(())
}

async fn run_case(scenario: &Scenario, tally: &Tally) -> Result<(), TestCaseError> {
    let pair = Pair::new(&scenario.policies);
    let maximum_cost = cost_bound(&scenario.policies);
    let subjects: Vec<SubjectDigest> = (0..SUBJECTS).map(subject).collect();
    let mut issued: Vec<EvaluationId> = Vec::new();
    // The cost each issued id was first asked with, in `issued`'s order.
    let mut costs: Vec<u64> = Vec::new();
    // Ids no request uses, for settles of unknown reservations.
    let mut strangers = 0_u128;
    // The last settle: subject, operation, id, reserved, used.
    let mut last_settle = None;
    for (index, step) in scenario.steps.iter().enumerate() {
        pair.move_clocks(step.clock);
        let (subject, operation) = (step.subject, step.operation);
        let settle = match step.settle {
            None => None,
            Some(SettleChoice::Reservation { back, used }) => issued
                .len()
                .checked_sub(back + 1)
                .map(|at| (subject, operation, issued[at], costs[at], used)),
            Some(SettleChoice::Unknown { reserved, used }) => {
                strangers += 1;
                let id = EvaluationId::from_uuid(Uuid::from_u128(u128::MAX - strangers));
                Some((subject, operation, id, reserved, used))
            }
            Some(SettleChoice::Again) => last_settle,
        };
        // Before the step's request, at its time: the requests stay what
        // they were without settles.
        if let Some(settle) = settle {
            last_settle = Some(settle);
            let (subject, operation, id, reserved, used) = settle;
            let (from_memory, from_redis) =
                pair.settle(&subjects[subject], operation, reserved, id, used).await;
            agree(&from_memory, &from_redis, index, step, &pair)?;
            prop_assert!(
                matches!(
                    from_memory,
                    Ok(Settled::Applied | Settled::Repeated | Settled::UnknownReservation)
                        | Err(RateLimitFailure::Unavailable {
                            category: UnavailableCategory::ClockUnsafe,
                            ..
                        })
                ),
                "step {index}: unexpected {from_memory:?}"
            );
            tally.count_settle(&from_memory);
        }
        if let Some(back) = step.release {
            let Some(&id) = issued.iter().rev().nth(back) else { continue };
            let (from_memory, from_redis) =
                pair.release(&subjects[step.subject], step.operation, id).await;
            agree(&from_memory, &from_redis, index, step, &pair)?;
            prop_assert!(!from_memory.failed(), "step {index}: unexpected {from_memory:?}");
            tally.count_release(from_memory);
            continue;
        }
        let repeated = match step.id {
            IdChoice::Fresh => None,
            IdChoice::Repeat(back) => issued.iter().rev().nth(back).copied(),
        };
        let evaluation_id = repeated.unwrap_or_else(|| {
            let fresh = numbered_id(issued.len() + 1);
            issued.push(fresh);
            costs.push(step.cost);
            fresh
        });
        let (from_memory, from_redis) =
            pair.evaluate(&subjects[step.subject], step.operation, step.cost, evaluation_id).await;
        agree(&from_memory, &from_redis, index, step, &pair)?;
        prop_assert!(expected_kind(&from_memory), "step {index}: unexpected {from_memory:?}");
        let cost_out_of_range =
            step.cost == 0 || maximum_cost.is_some_and(|maximum| step.cost > maximum);
        prop_assert_eq!(
            matches!(
                from_memory,
                Err(RateLimitFailure::Incompatible {
                    category: IncompatibleCategory::CostExceedsMaximum
                })
            ),
            cost_out_of_range,
            "step {}: cost {} against maximum {:?} gave {:?}",
            index,
            step.cost,
            maximum_cost,
            from_memory
        );
        tally.count(&from_memory);
    }
    Ok(())
}

/// Runs `CASES` random scenarios of one algorithm; on a disagreement,
/// proptest shrinks it and the panic shows the minimal scenario.
fn providers_agree(shape: Shape) {
    let leases = matches!(shape, Shape::Concurrency);
    // Concurrency keys take no settle: a set of them alone never settles
    // a reservation.
    let coverage = Coverage { sets: false, leases, settles: !leases };
    agree_on(&format!("{shape:?}"), scenario(shape), coverage, CASES);
}

/// What a run's random cases must reach beside every outcome kind: the set
/// answers ([`Tally::assert_covered`]), lease releases of both kinds and
/// settles of every answer.
#[derive(Debug, Clone, Copy)]
struct Coverage {
    sets: bool,
    leases: bool,
    settles: bool,
}

/// The long runs of one policy, which make no settles.
const ONE_POLICY: Coverage = Coverage { sets: false, leases: false, settles: false };

fn agree_on(
    what: &str,
    scenarios: impl Strategy<Value = Scenario>,
    coverage: Coverage,
    cases: u32,
) {
    let tally = Tally::default();
    // No persistence: a failing seed must not land in the repository unasked.
    // A generous shrink budget: a case runs in milliseconds, and only a
    // failing run spends it.
    let config =
        Config { cases, max_shrink_iters: 8192, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&scenarios, |scenario| runtime().block_on(run_case(&scenario, &tally)));
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, minimal)) => {
            panic!("{what}: {reason}\nminimal scenario:\n{}", minimal.describe())
        }
        Err(TestError::Abort(reason)) => panic!("{what}: proptest aborted: {reason}"),
    }
    tally.assert_covered(what, coverage);
}

#[test]
fn fixed_window_providers_agree_on_random_sequences() {
    providers_agree(Shape::FixedWindow);
}

#[test]
fn sliding_counter_providers_agree_on_random_sequences() {
    providers_agree(Shape::SlidingCounter);
}

#[test]
fn token_bucket_providers_agree_on_random_sequences() {
    providers_agree(Shape::TokenBucket);
}

#[test]
fn gcra_providers_agree_on_random_sequences() {
    providers_agree(Shape::Gcra);
}

#[test]
fn calendar_window_providers_agree_on_random_sequences() {
    providers_agree(Shape::CalendarWindow);
}

/// Leases taken, replayed, refused, released, released twice, released
/// after they expired, and reclaimed at their TTL, with clock steps back:
/// both providers give the same answers and the same release outcomes.
#[test]
fn concurrency_providers_agree_on_random_sequences() {
    providers_agree(Shape::Concurrency);
}

/// Fixed windows with room for many records, small clock steps and long
/// runs, so the Redis records reach their cap and its sweep of expired
/// records (at most 8 per write) runs often: both providers still give the
/// same answers, replays included.
#[test]
fn many_dedupe_records_providers_agree() {
    // More cases than the others: a bug here shows only once a record a
    // sweep or an eviction decides about is asked for again.
    agree_on("many records", many_records_scenario(), ONE_POLICY, 4 * CASES);
}

fn many_records_scenario() -> impl Strategy<Value = Scenario> {
    let policy = (20..=100_u64, 6..=16_u32, 0..=30_u64, 10..=30_u64).prop_map(
        |(ttl, max_entries, regression, limit)| {
            let dedup = EvaluationDedupPolicy::Enabled {
                ttl: millis(ttl),
                max_entries,
                max_stored_bytes: 65_536,
            };
            RateLimitPolicy::builder(
                "diff.records",
                Algorithm::FixedWindow(shared_contract::FixedWindow {
                    limit,
                    window: millis(1_000),
                }),
            )
            .maximum_clock_regression(millis(regression))
            .cleanup_grace(CLEANUP_GRACE)
            .evaluation_dedup(dedup)
            .build()
            .expect("the strategy only builds valid policies")
        },
    );
    let clock = prop_oneof![
        10 => (0..=8_u64).prop_map(ClockMove::Forward),
        1 => (0..=50_u64).prop_map(ClockMove::Back),
    ];
    long_run_of_one(policy, clock)
}

/// Token buckets that drain within a few requests and then refill only
/// every second or more, with dedupe on: a key is refused for long
/// stretches, each refusal writing its refill, so Redis sweeps expired
/// records on writes that charge nothing (at most 8 per write, where the
/// memory provider drops them all); then a refill admits again and old ids
/// come back. Both providers give the same answers throughout.
#[test]
fn a_token_bucket_refused_for_a_while_providers_agree() {
    agree_on("refused token bucket", refused_bucket_scenario(), ONE_POLICY, 2 * CASES);
}

fn refused_bucket_scenario() -> impl Strategy<Value = Scenario> {
    let policy = (8..=30_u64, 1..=3_u64, 1_000..=3_000_u64, 20..=100_u64, 6..=40_u32, 0..=30_u64)
        .prop_map(|(capacity, refill_tokens, period, ttl, max_entries, regression)| {
            let dedup = EvaluationDedupPolicy::Enabled {
                ttl: millis(ttl),
                max_entries,
                max_stored_bytes: 65_536,
            };
            let bucket = Algorithm::TokenBucket(shared_contract::TokenBucket {
                capacity,
                refill_tokens,
                refill_period: millis(period),
            });
            RateLimitPolicy::builder("diff.refused", bucket)
                .maximum_clock_regression(millis(regression))
                .cleanup_grace(CLEANUP_GRACE)
                .evaluation_dedup(dedup)
                .build()
                .expect("the strategy only builds valid policies")
        });
    let clock = prop_oneof![
        12 => (0..=15_u64).prop_map(ClockMove::Forward),
        1 => (0..=50_u64).prop_map(ClockMove::Back),
        1 => (1_000..=3_000_u64).prop_map(ClockMove::Forward),
    ];
    long_run_of_one(policy, clock)
}

/// Random sets of one to three policies of mixed algorithms, scopes and
/// modes, over two operations: both providers give the same set answer.
#[test]
fn policy_sets_providers_agree_on_random_sequences() {
    // Not every run draws a concurrency policy into a set, so releases are
    // not required here; the concurrency run above requires them.
    let coverage = Coverage { sets: true, leases: false, settles: true };
    agree_on("policy sets", set_scenario(), coverage, CASES);
}

fn fixed_decision(
    allowed: bool,
    remaining: u64,
    retry: u64,
    reset: u64,
    replayed: bool,
) -> RateLimitOutcome {
    Ok(SetDecision::single(RateLimitDecision {
        allowed,
        remaining,
        retry_after_ms: retry,
        reset_after_ms: reset,
        replayed,
    }))
}

/// Fixed window of 2 per 1000 ms (T0 is a multiple of it), dedupe records
/// live 50 ms, clock may lag 10 ms.
fn pinned_policy() -> RateLimitPolicy {
    RateLimitPolicy::builder(
        "diff.pinned",
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit: 2, window: millis(1000) }),
    )
    .maximum_cost(2)
    .maximum_clock_regression(millis(10))
    .cleanup_grace(CLEANUP_GRACE)
    .evaluation_dedup(EvaluationDedupPolicy::Enabled {
        ttl: millis(50),
        max_entries: 4,
        max_stored_bytes: 4 * DEDUP_RECORD_BYTES,
    })
    .build()
    .expect("a valid policy")
}

/// Runs `steps` (clock move, cost, evaluation id number, expected outcome)
/// for one subject on both providers; each must give what the spec says.
fn check_pinned(steps: &[(ClockMove, u64, usize, RateLimitOutcome)]) {
    let subject = subject(0);
    runtime().block_on(async {
        let pair = Pair::new(&[pinned_policy()]);
        for (index, (clock, cost, id, want)) in steps.iter().enumerate() {
            pair.move_clocks(*clock);
            let (from_memory, from_redis) =
                pair.evaluate(&subject, 0, *cost, numbered_id(*id)).await;
            assert!(
                from_memory == *want && from_redis == *want,
                "step {index}: docs/algorithms.md wants {want:?}\n  memory gave {from_memory:?}\n  \
                 redis gave {from_redis:?}"
            );
        }
    });
}

/// The smallest disagreement the random cases found, pinned with the
/// numbers of docs/algorithms.md. A denial writes nothing, so the record it
/// saw expire is still stored; after a clock step back inside the bound the
/// record is live again (`written_at + ttl > t`) and its id must replay,
/// not charge a second time.
#[test]
fn a_denial_leaves_an_expired_record_for_a_lagging_clock_to_replay() {
    check_pinned(&[
        // t = T0: n = 1, remaining 1, reset 1000; record {1, written_at T0}.
        (ClockMove::Forward(0), 1, 1, fixed_decision(true, 1, 0, 1000, false)),
        // t = T0 + 50: record 1 is expired for this evaluation
        // (T0 + 50 <= t); 1 + 2 > 2 is denied and nothing is written.
        (ClockMove::Forward(50), 2, 2, fixed_decision(false, 1, 950, 950, false)),
        // t = T0 + 49, 1 ms behind but the mark is still T0: record 1 is
        // live (T0 + 50 > t) and replays as recorded.
        (ClockMove::Back(1), 1, 1, fixed_decision(true, 1, 0, 1000, true)),
    ]);
}

/// The same through a replay, which writes nothing either (step 4 of
/// docs/algorithms.md: "records stay as they were").
#[test]
fn a_replay_leaves_an_expired_record_for_a_lagging_clock_to_replay() {
    check_pinned(&[
        // t = T0: n = 1; record {1, written_at T0}.
        (ClockMove::Forward(0), 1, 1, fixed_decision(true, 1, 0, 1000, false)),
        // t = T0 + 30: n = 2; record {2, written_at T0 + 30}; mark T0 + 30.
        (ClockMove::Forward(30), 1, 2, fixed_decision(true, 0, 0, 970, false)),
        // t = T0 + 50: record 1 is expired for this evaluation; record 2
        // replays and nothing is written.
        (ClockMove::Forward(20), 1, 2, fixed_decision(true, 0, 0, 970, true)),
        // t = T0 + 49, behind T0 + 50 but not behind the mark: record 1 is
        // live again and replays.
        (ClockMove::Back(1), 1, 1, fixed_decision(true, 1, 0, 1000, true)),
    ]);
}

/// The smallest disagreement the concurrency cases found, pinned with the
/// numbers of docs/algorithms.md: a release removes its own lease only. A
/// lease expired at the release's time but live at a lagging clock's
/// (inside the bound: the release moved no mark) still counts.
#[test]
fn a_release_leaves_expired_leases_for_a_lagging_clock() {
    // At most 1 in flight, leases live 50 ms, a refusal says 30 ms, the
    // clock may lag 20 ms.
    let policy = RateLimitPolicy::builder(
        "diff.leases",
        Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight: 1,
            lease_ttl: millis(50),
            retry_after: millis(30),
        }),
    )
    .maximum_clock_regression(millis(20))
    .cleanup_grace(CLEANUP_GRACE)
    .build()
    .expect("a valid policy");
    let decided = |allowed: bool, retry: u64| {
        Ok(SetDecision::single(RateLimitDecision {
            allowed,
            remaining: 0,
            retry_after_ms: retry,
            reset_after_ms: 0,
            replayed: false,
        }))
    };
    let subject = subject(0);
    runtime().block_on(async {
        let pair = Pair::new(&[policy]);
        let both = |outcome: (RateLimitOutcome, RateLimitOutcome), want: RateLimitOutcome| {
            assert!(
                outcome.0 == want && outcome.1 == want,
                "docs/algorithms.md wants {want:?}\n  memory gave {:?}\n  redis gave {:?}",
                outcome.0,
                outcome.1
            );
        };
        // t = T0: lease 1 taken, expires at T0 + 50; mark T0.
        both(pair.evaluate(&subject, 0, 1, numbered_id(1)).await, decided(true, 0));
        // t = T0 + 60: a release of an id never taken frees nothing.
        pair.move_clocks(ClockMove::Forward(60));
        let released = pair.release(&subject, 0, numbered_id(9)).await;
        assert_eq!(released, (ReleaseOutcome::NotHeld, ReleaseOutcome::NotHeld));
        // t = T0 + 45 (behind the release, not behind the mark): lease 1 is
        // live (T0 + 50 > t), so the one slot is taken.
        pair.move_clocks(ClockMove::Back(15));
        both(pair.evaluate(&subject, 0, 1, numbered_id(2)).await, decided(false, 30));
    });
}

/// A long run of 100 to 200 requests against one policy, with clock moves
/// from `clock`, ids repeated up to `RECENT_IDS_MANY` back and mostly a
/// cost of 1 (the maximum), so most requests charge.
fn long_run_of_one(
    policy: impl Strategy<Value = RateLimitPolicy>,
    clock: impl Strategy<Value = ClockMove>,
) -> impl Strategy<Value = Scenario> {
    let id = prop_oneof![
        3 => Just(IdChoice::Fresh),
        1 => (0..RECENT_IDS_MANY).prop_map(IdChoice::Repeat)
    ];
    let cost = prop_oneof![8 => Just(1_u64), 1 => Just(0), 1 => Just(2)];
    let step = (clock, 0..SUBJECTS, 0..OPERATIONS.len(), cost, id).prop_map(
        |(clock, subject, operation, cost, id)| Step {
            clock,
            subject,
            operation,
            cost,
            id,
            release: None,
            settle: None,
        },
    );
    (policy, vec(step, 100..=200))
        .prop_map(|(policy, steps)| Scenario { policies: vec![policy], steps })
}

/// A settled sequence over a set of a fixed window and a token bucket
/// (docs/algorithms.md "Settling usage"), with a concurrency policy beside
/// them: refunds, a charge past the limit, a repeat, an unknown id and an
/// after-the-fact charge; both providers answer each step alike, and the
/// answers the docs give.
#[test]
fn a_settled_sequence_over_a_set_agrees() {
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_secs(60),
        max_entries: 16,
        max_stored_bytes: 16 * DEDUP_RECORD_BYTES,
    };
    let build = |id: &str, algorithm: Algorithm| {
        let builder = RateLimitPolicy::builder(id, algorithm).cleanup_grace(CLEANUP_GRACE);
        let builder = if id == "diff.slots" {
            builder
        } else {
            builder.maximum_cost(8).evaluation_dedup(dedup)
        };
        builder.build().expect("a valid policy")
    };
    let policies = [
        build(
            "diff.window",
            Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: 10,
                window: millis(1000),
            }),
        ),
        build(
            "diff.bucket",
            Algorithm::TokenBucket(shared_contract::TokenBucket {
                capacity: 10,
                refill_tokens: 1,
                refill_period: millis(100),
            }),
        ),
        build(
            "diff.slots",
            Algorithm::Concurrency(shared_contract::Concurrency {
                max_in_flight: 8,
                lease_ttl: millis(10_000),
                retry_after: millis(100),
            }),
        ),
    ];
    let subject = subject(0);
    runtime().block_on(async {
        let pair = Pair::new(&policies);
        let remaining = |outcome: RateLimitOutcome| {
            outcome.map(|set| {
                (set.allowed(), set.decisions().iter().map(|d| d.remaining).collect::<Vec<_>>())
            })
        };
        let take = async |cost, id| {
            let (memory, redis) = pair.evaluate(&subject, 0, cost, numbered_id(id)).await;
            assert_eq!(memory, redis, "request {id} of {cost}");
            remaining(memory)
        };
        let settle = async |reserved, id, used| {
            let (memory, redis) = pair.settle(&subject, 0, reserved, numbered_id(id), used).await;
            assert_eq!(memory, redis, "settle of {id} ({reserved} reserved, {used} used)");
            memory
        };
        // t = T0: a reservation of 5 leaves 5 in the window and the bucket.
        assert_eq!(take(5, 1).await, Ok((true, vec![5, 5, 7])));
        // Used 2: 3 back to both.
        assert_eq!(settle(5, 1, 2).await, Ok(Settled::Applied));
        assert_eq!(settle(5, 1, 2).await, Ok(Settled::Repeated));
        assert_eq!(take(1, 2).await, Ok((true, vec![7, 7, 6])));
        // Used 9 of 4: 5 past the reservation, so the window holds 12 of
        // 10 and the bucket -2 tokens; the next request is refused.
        assert_eq!(take(4, 3).await, Ok((true, vec![3, 3, 5])));
        assert_eq!(settle(4, 3, 9).await, Ok(Settled::Applied));
        assert_eq!(take(1, 4).await, Ok((false, vec![0, 0, 5])));
        // An id no request used: nothing changes.
        assert_eq!(settle(3, 99, 0).await, Ok(Settled::UnknownReservation));
        // At T0 + 1000: a new window; the bucket refilled 10 periods, to
        // 8. An after-the-fact charge of 2 takes both down by 2.
        pair.move_clocks(ClockMove::Forward(1000));
        assert_eq!(settle(0, 5, 2).await, Ok(Settled::Applied));
        assert_eq!(take(1, 6).await, Ok((true, vec![7, 5, 4])));
    });
}
