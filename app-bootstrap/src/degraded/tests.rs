//! The decorator over a scripted primary port and a real memory provider.

use std::sync::Mutex;

use adapter_memory::MemoryEdgeRateLimitAdapter;
use shared_contract::{
    EvaluationId, IncompatibleCategory, Lease, ManualClock, OperationDigest, PolicySet,
    RateLimitDecision, RateLimitOutcomeExt, ReleaseOutcome, SetDecision, SubjectDigest,
};

use super::*;

const T0: u64 = 1_700_000_040_000;

/// Answers every request with the outcome it is told to, and holds the
/// fleet's policies.
#[derive(Debug)]
struct ScriptedPort {
    policies: Vec<RateLimitPolicy>,
    outcome: Mutex<RateLimitOutcome>,
    /// The ids of the leases released through it, and what it answers.
    released: Mutex<Vec<EvaluationId>>,
    release: ReleaseOutcome,
    /// The cost of every evaluation it admitted: its count.
    charged: Mutex<u64>,
}

impl ScriptedPort {
    fn new(policies: Vec<RateLimitPolicy>, release: ReleaseOutcome) -> Self {
        Self {
            policies,
            outcome: Mutex::new(unavailable()),
            released: Mutex::default(),
            release,
            charged: Mutex::default(),
        }
    }
}

#[async_trait]
impl EdgeRateLimitPort for ScriptedPort {
    fn evaluate(&self, request: RateLimitRequest) -> Evaluation {
        let outcome = self.outcome.lock().unwrap().clone();
        if outcome.is_allowed() {
            *self.charged.lock().unwrap() += request.cost;
        }
        Evaluation::ready(outcome)
    }

    fn policy(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.policies.iter().find(|policy| policy.id() == id)
    }

    async fn is_ready(&self) -> bool {
        false
    }

    /// Answers while its evaluations do, with its count.
    async fn inspect(&self, _: &BudgetKey) -> Result<BudgetState, BudgetFailure> {
        match &*self.outcome.lock().unwrap() {
            Ok(set) => {
                let decision = set.decisions()[0];
                let policy = &self.policies[0];
                let charged = *self.charged.lock().unwrap();
                Ok(BudgetState {
                    limit: policy.limit(),
                    remaining: policy.limit().saturating_sub(charged),
                    reset_after: Duration::from_millis(decision.reset_after_ms),
                    retry_after: Duration::from_millis(decision.retry_after_ms),
                    mark: Some(T0),
                    certainty: policy.algorithm().certainty(),
                    debt: 0,
                })
            }
            Err(_) => Err(BudgetFailure::Unavailable),
        }
    }

    async fn reset(&self, _: &BudgetKey) -> Result<(), BudgetFailure> {
        Err(BudgetFailure::Unavailable)
    }

    fn release(&self, lease: &Lease) -> Releasing {
        self.released.lock().unwrap().push(lease.id);
        Releasing::ready(self.release)
    }
}

fn fixed_window(limit: u64, maximum_cost: u64) -> RateLimitPolicy {
    let algorithm = shared_contract::Algorithm::FixedWindow(shared_contract::FixedWindow {
        limit,
        window: Duration::from_secs(60),
    });
    RateLimitPolicy::builder("api", algorithm).maximum_cost(maximum_cost).build().unwrap()
}

fn four() -> NonZeroU32 {
    NonZeroU32::new(4).unwrap()
}

struct Fixture {
    primary: Arc<ScriptedPort>,
    mode: Arc<DegradedMode>,
    clock: ManualClock,
    port: DegradedPort,
}

/// The fleet's policy `api` (10 per minute, maximum cost 10) over four
/// instances: 3 per minute here while Redis is away.
fn fixture() -> Fixture {
    fixture_over(fixed_window(10, 10), ReleaseOutcome::NotHeld)
}

/// `policy` over four instances, Redis answering each release `release`.
fn fixture_over(policy: RateLimitPolicy, release: ReleaseOutcome) -> Fixture {
    let clock = ManualClock::new(T0);
    let primary = Arc::new(ScriptedPort::new(vec![policy.clone()], release));
    let mode = Arc::new(DegradedMode::new(MemoryStore::new(), four(), Arc::new(clock.clone())));
    let local = MemoryEdgeRateLimitAdapter::with_store(
        mode.store().clone(),
        [scaled(&policy, four()).unwrap()],
        Arc::new(clock.clone()),
    )
    .unwrap();
    let port = DegradedPort::new(Arc::clone(&primary) as _, Arc::new(local), Arc::clone(&mode));
    Fixture { primary, mode, clock, port }
}

fn unavailable() -> RateLimitOutcome {
    Err(RateLimitFailure::Unavailable {
        category: UnavailableCategory::UnavailableBeforeSend,
        retry_after: Duration::from_secs(1),
    })
}

fn redis_allows() -> RateLimitOutcome {
    let decision = RateLimitDecision {
        allowed: true,
        remaining: 9,
        retry_after_ms: 0,
        reset_after_ms: 60_000,
        replayed: false,
    };
    Ok(SetDecision::single(decision))
}

impl Fixture {
    fn primary_answers(&self, outcome: RateLimitOutcome) {
        *self.primary.outcome.lock().unwrap() = outcome;
    }

    fn request(&self, cost: u64) -> RateLimitRequest<'static> {
        RateLimitRequest {
            policies: PolicySet::single(PolicyId::new("api").unwrap()).into(),
            subject: SubjectDigest::parse(format!("v1:{}", "ab".repeat(16))).unwrap(),
            operation: OperationDigest::from_u64(0x0000_0000_0000_00c1),
            cost,
            evaluation_id: EvaluationId::random(),
            deadline: self.clock.monotonic() + Duration::from_millis(750),
        }
    }

    async fn ask(&self) -> RateLimitOutcome {
        self.port.evaluate(self.request(1)).await
    }
}

fn degraded_set(outcome: RateLimitOutcome) -> SetDecision {
    match outcome {
        Ok(set) => {
            assert_eq!(set.source(), DecisionSource::Degraded, "{set:?}");
            set
        }
        other @ (Err(RateLimitFailure::Unavailable { .. })
        | Err(RateLimitFailure::Incompatible { .. })
        | Err(RateLimitFailure::Indeterminate { .. })) => {
            panic!("expected a degraded decision, got {other:?}")
        }
    }
}

#[test]
fn every_count_is_scaled_to_its_ceiling_share_and_never_to_zero() {
    let window = Duration::from_secs(60);
    let cases = [(10, 4, 3), (12, 4, 3), (13, 4, 4), (1, 4, 1), (3, 1000, 1), (7, 1, 7)];
    for (limit, instances, share) in cases {
        let instances = NonZeroU32::new(instances).unwrap();
        let policy = scaled(&fixed_window(limit, 1), instances).unwrap();
        assert_eq!(
            *policy.algorithm(),
            shared_contract::Algorithm::FixedWindow(shared_contract::FixedWindow {
                limit: share,
                window
            })
        );
    }
    let sliding = RateLimitPolicy::builder(
        "s",
        shared_contract::Algorithm::SlidingCounter(shared_contract::SlidingCounter {
            limit: 9,
            window,
        }),
    )
    .build()
    .unwrap();
    assert_eq!(
        *scaled(&sliding, four()).unwrap().algorithm(),
        shared_contract::Algorithm::SlidingCounter(shared_contract::SlidingCounter {
            limit: 3,
            window
        })
    );
    let bucket = shared_contract::Algorithm::TokenBucket(shared_contract::TokenBucket {
        capacity: 10,
        refill_tokens: 5,
        refill_period: Duration::from_secs(1),
    });
    let bucket = RateLimitPolicy::builder("b", bucket)
        .revision(7)
        .maximum_cost(2)
        .scope(shared_contract::PolicyScope::Subject)
        .mode(shared_contract::PolicyMode::Shadow)
        .build()
        .unwrap();
    let local = scaled(&bucket, four()).unwrap();
    assert_eq!(
        *local.algorithm(),
        shared_contract::Algorithm::TokenBucket(shared_contract::TokenBucket {
            capacity: 3,
            refill_tokens: 2,
            refill_period: Duration::from_secs(1)
        })
    );
    // Everything but the counts is the fleet policy's.
    assert_eq!(
        (local.id(), local.revision(), local.maximum_cost(), local.scope(), local.mode()),
        (bucket.id(), 7, 2, bucket.scope(), bucket.mode())
    );
    // A maximum cost above the share is cut to it.
    assert_eq!(scaled(&fixed_window(10, 10), four()).unwrap().maximum_cost(), 3);
}

#[test]
fn a_concurrency_policy_holds_its_share_of_the_slots() {
    let exports = |max_in_flight| {
        shared_contract::Algorithm::Concurrency(shared_contract::Concurrency {
            max_in_flight,
            lease_ttl: Duration::from_secs(30),
            retry_after: Duration::from_secs(2),
        })
    };
    for (max_in_flight, share) in [(10, 3), (4, 1), (1, 1), (13, 4)] {
        let policy = RateLimitPolicy::builder("exports", exports(max_in_flight)).build().unwrap();
        let local = scaled(&policy, four()).unwrap();
        assert_eq!(*local.algorithm(), exports(share), "{max_in_flight}");
    }
}

#[tokio::test]
async fn a_lease_is_released_where_it_was_taken_local_first_then_redis() {
    let exports = shared_contract::Algorithm::Concurrency(shared_contract::Concurrency {
        max_in_flight: 4,
        lease_ttl: Duration::from_secs(30),
        retry_after: Duration::from_secs(2),
    });
    let policy = RateLimitPolicy::builder("api", exports).build().unwrap();
    let fixture = fixture_over(policy, ReleaseOutcome::Released);

    // Redis away: ceil(4 / 4) = 1 slot here, taken, so the next is refused.
    let taken = fixture.request(1);
    assert!(degraded_set(fixture.port.evaluate(taken.clone()).await).allowed());
    assert!(!degraded_set(fixture.ask().await).allowed(), "the local slot is taken");
    // Given back locally, without asking Redis (which may still be away).
    assert_eq!(fixture.port.release(&Lease::of(&taken)).await, ReleaseOutcome::Released);
    assert!(fixture.primary.released.lock().unwrap().is_empty());
    assert!(degraded_set(fixture.ask().await).allowed(), "the slot is free again");

    // A lease Redis admitted is not held locally: Redis releases it.
    fixture.primary_answers(redis_allows());
    let on_redis = fixture.request(1);
    assert_eq!(fixture.port.evaluate(on_redis.clone()).await, redis_allows());
    assert_eq!(fixture.port.release(&Lease::of(&on_redis)).await, ReleaseOutcome::Released);
    assert_eq!(*fixture.primary.released.lock().unwrap(), [on_redis.evaluation_id]);
}

#[tokio::test]
async fn while_redis_cannot_decide_the_share_is_admitted_then_refused_with_decisions() {
    let fixture = fixture();
    let failures = [
        unavailable(),
        Err(RateLimitFailure::Indeterminate { retry_after: Duration::from_secs(1) }),
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::ClockUnsafe,
            retry_after: Duration::from_secs(1),
        }),
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::AdmissionRejected,
            retry_after: Duration::from_secs(1),
        }),
    ];
    let mut answers = Vec::new();
    for failure in failures {
        fixture.primary_answers(failure);
        answers.push(degraded_set(fixture.ask().await));
    }
    assert!(fixture.mode.is_degraded());
    // ceil(10 / 4) = 3: three admitted, then refused, with the local
    // limit's numbers for the headers.
    let allowed: Vec<_> = answers.iter().map(SetDecision::allowed).collect();
    assert_eq!(allowed, [true, true, true, false]);
    let remaining: Vec<_> = answers.iter().map(|set| set.decisions()[0].remaining).collect();
    assert_eq!(remaining, [2, 1, 0, 0]);
    let refused = answers[3].decisions()[0];
    assert!(refused.retry_after_ms > 0 && refused.retry_after_ms <= 60_000);
}

#[tokio::test]
async fn redis_answers_stand_at_once_and_leaving_waits_for_the_hold_and_keeps_the_counts() {
    let fixture = fixture();
    for _ in 0..3 {
        assert!(degraded_set(fixture.ask().await).allowed());
    }
    assert!(!degraded_set(fixture.ask().await).allowed(), "the share is spent");
    // Redis answers: its answer is used at once, but one answer is no
    // end of the outage.
    fixture.primary_answers(redis_allows());
    assert_eq!(fixture.ask().await, redis_allows());
    assert!(fixture.mode.is_degraded(), "Redis answered for less than {LEAVE_AFTER:?}");
    fixture.clock.advance(LEAVE_AFTER - Duration::from_millis(1));
    assert_eq!(fixture.ask().await, redis_allows());
    assert!(fixture.mode.is_degraded(), "still within the hold");
    fixture.clock.advance(Duration::from_millis(1));
    assert_eq!(fixture.ask().await, redis_allows());
    assert!(!fixture.mode.is_degraded(), "{LEAVE_AFTER:?} of answers and no failure");
    assert_eq!(fixture.mode.times_entered(), 1);
    assert_eq!(fixture.mode.store().live_entries(), 1, "the local count is kept");
    // Redis away again in the same window: the spent share stays spent.
    fixture.primary_answers(unavailable());
    let again = degraded_set(fixture.ask().await);
    assert!(!again.allowed(), "no fresh share in the same window: {again:?}");
    assert_eq!(fixture.mode.times_entered(), 2);
    // The next window (60 s, following the clock) has a whole share.
    fixture.clock.advance(Duration::from_secs(60));
    let next = degraded_set(fixture.ask().await);
    assert!(next.allowed());
    assert_eq!(next.decisions()[0].remaining, 2);
}

#[tokio::test]
async fn a_flapping_redis_gives_one_share_per_window_and_one_entering() {
    let fixture = fixture();
    // The outside pass's sequence: the subject's own calls fail (a skewed
    // clock, a dead shard, a paused server) while Redis answers calls in
    // between, a few milliseconds apart.
    let mut admitted = 0;
    for _ in 0..12 {
        fixture.primary_answers(Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::ClockUnsafe,
            retry_after: Duration::from_secs(1),
        }));
        admitted += u32::from(degraded_set(fixture.ask().await).allowed());
        fixture.clock.advance(Duration::from_millis(5));
        fixture.primary_answers(redis_allows());
        assert_eq!(fixture.ask().await, redis_allows(), "Redis' answer stands while degraded");
        fixture.clock.advance(Duration::from_millis(5));
    }
    // ceil(10 / 4) = 3 for the window, however often Redis answers: once
    // the subject is decided locally, Redis' admissions of it count there
    // too (the first flip's), so two local admissions spend the share.
    assert_eq!(admitted, 2, "the share, counting Redis' admission in between");
    assert_eq!(fixture.mode.times_entered(), 1, "one outage, one entering line");
    assert!(fixture.mode.is_degraded());
    // Flips a hold time apart are separate outages, and still one share.
    for _ in 0..3 {
        fixture.clock.advance(LEAVE_AFTER);
        assert_eq!(fixture.ask().await, redis_allows());
        assert!(!fixture.mode.is_degraded());
        fixture.primary_answers(unavailable());
        assert!(!degraded_set(fixture.ask().await).allowed(), "the window's share is spent");
        fixture.primary_answers(redis_allows());
    }
    assert_eq!(fixture.mode.times_entered(), 4);
}

#[tokio::test]
async fn each_local_admission_is_written_back_once_however_often_redis_flips() {
    let fixture = fixture();
    for _ in 0..3 {
        assert!(degraded_set(fixture.ask().await).allowed());
    }
    for _ in 0..5 {
        fixture.primary_answers(redis_allows());
        assert_eq!(fixture.ask().await, redis_allows());
        fixture.primary_answers(unavailable());
        assert!(!degraded_set(fixture.ask().await).allowed(), "the share is spent");
    }
    // The three local admissions (one piece: the maximum cost is 10) and
    // the five requests Redis decided: nothing twice.
    assert_eq!(*fixture.primary.charged.lock().unwrap(), 3 + 5);
    assert_eq!(fixture.mode.owing_subjects(), 0);
}

#[tokio::test]
async fn a_write_back_redis_does_not_answer_stays_owed_for_the_next_decision() {
    let fixture = fixture();
    assert!(degraded_set(fixture.ask().await).allowed());
    // Redis answers nothing (the piece included): decided locally, owed.
    fixture.primary_answers(Err(RateLimitFailure::Indeterminate {
        retry_after: Duration::from_secs(1),
    }));
    assert!(degraded_set(fixture.ask().await).allowed());
    assert_eq!(fixture.mode.owing_subjects(), 1);
    assert_eq!(*fixture.primary.charged.lock().unwrap(), 0);
    fixture.primary_answers(redis_allows());
    assert_eq!(fixture.ask().await, redis_allows());
    assert_eq!(*fixture.primary.charged.lock().unwrap(), 2 + 1, "both written back, then one");
    assert_eq!(fixture.mode.owing_subjects(), 0);
}

#[tokio::test]
async fn a_denial_cache_answer_is_not_redis_and_keeps_degraded_mode() {
    let fixture = fixture();
    degraded_set(fixture.ask().await);
    let Ok(redis) = redis_allows() else { unreachable!() };
    let cached = Ok(redis.from_cache());
    fixture.primary_answers(cached.clone());
    assert_eq!(fixture.ask().await, cached);
    assert!(fixture.mode.is_degraded());
    assert_eq!(fixture.mode.store().live_entries(), 1, "the local count stays");
}

#[tokio::test]
async fn a_deadline_the_redis_attempt_used_up_still_gets_a_local_answer() {
    let fixture = fixture();
    let mut request = fixture.request(1);
    // Redis timed out at the deadline: it has passed when the local step runs.
    fixture.clock.advance(Duration::from_millis(750));
    request.deadline = fixture.clock.monotonic();
    assert!(degraded_set(fixture.port.evaluate(request).await).allowed());
}

#[tokio::test]
async fn what_the_local_limit_cannot_decide_fails_closed_with_redis_answer() {
    let fixture = fixture();
    // Cost 5 fits the fleet's maximum (10) but not the local share (3).
    assert_eq!(fixture.port.evaluate(fixture.request(5)).await, unavailable());
    // An incompatible request is no outage: passed through, not degraded.
    let unknown =
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::UnknownPolicy });
    let fixture = self::fixture();
    fixture.primary_answers(unknown.clone());
    assert_eq!(fixture.ask().await, unknown);
    assert!(!fixture.mode.is_degraded());
}

#[tokio::test]
async fn the_fleet_policy_describes_and_the_instance_stays_ready() {
    let fixture = fixture();
    let policy = fixture.port.policy(&PolicyId::new("api").unwrap()).unwrap();
    assert_eq!(policy.limit(), 10, "the headers' RateLimit-Policy names the configured quota");
    assert!(!fixture.primary.is_ready().await);
    assert!(fixture.port.is_ready().await, "the local limiter answers while Redis does not");
}
