//! The GCRA of this workspace against `governor`'s (docs/algorithms.md,
//! "GCRA"): on any arrival times and costs, the memory provider and
//! `governor`'s direct limiter on a fake clock, with
//! `Quota::with_period(T).allow_burst(b)` and `check_n(c)`, admit the same
//! requests; each admission reports the same remaining burst capacity, and
//! each denial waits `governor`'s wait rounded up to whole milliseconds.
//! `T` is whole microseconds, so neither side rounds it: either `limit =
//! 1000` per `period = T ms`, or any limit and period with `governor`
//! given the rule's `T = ceil(1000 x period / limit)`.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use governor::middleware::StateInformationMiddleware;
use governor::{Quota, RateLimiter};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shared_contract::{Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, RateLimitPolicy};
use support::{T0, adapter, decision, id, request, subject};

/// One case: the policy's limit and period (ms), its burst, and the
/// requests as (gap before it in ms, cost).
#[derive(Debug, Clone)]
struct Case {
    limit: u64,
    period_ms: u64,
    burst: u64,
    requests: Vec<(u64, u64)>,
}

impl Case {
    /// The rule's emission interval, whole microseconds.
    fn interval_micros(&self) -> u64 {
        (self.period_ms * 1000).div_ceil(self.limit)
    }
}

fn case() -> impl Strategy<Value = Case> {
    // Any whole-microsecond T (limit 1000 per T ms), or a limit that rarely
    // divides its period.
    // The builder's GCRA rules (docs/algorithms.md#gcra): T rounded up by
    // at most 1 % of the period, and a burst covering at least 1 ms of
    // cells, so `b` runs from `ceil(1000 / T)` to 7 above it.
    let rate = prop_oneof![(1..=200_000_u64).prop_map(|t| (1000, t)), (1..=50_u64, 1..=2_000_u64),]
        .prop_filter("T rounds up by at most 1 %", |&(limit, period_ms)| {
            (period_ms * 1000).div_ceil(limit) * limit * 100 <= period_ms * 1000 * 101
        });
    (rate, 0..=7_u64).prop_flat_map(|((limit, period_ms), extra)| {
        let interval = (period_ms * 1000).div_ceil(limit);
        let burst = 1000_u64.div_ceil(interval) + extra;
        let interval_ms = interval.div_ceil(1000);
        // Gaps from none to a few intervals, mostly short: bursts, denials
        // and recoveries all come up.
        let gap = prop_oneof![2 => Just(0_u64), 3 => 0..=interval_ms * 3 + 2];
        let requests = proptest::collection::vec((gap, 1..=burst), 1..=60);
        requests.prop_map(move |requests| Case { limit, period_ms, burst, requests })
    })
}

fn agree(case: &Case, runtime: &tokio::runtime::Runtime) -> Result<(), TestCaseError> {
    let interval = case.interval_micros();
    let policy = RateLimitPolicy::builder(
        "g",
        Algorithm::Gcra(shared_contract::Gcra {
            limit: case.limit,
            period: Duration::from_millis(case.period_ms),
            burst: case.burst,
        }),
    )
    .maximum_cost(case.burst)
    .evaluation_dedup(EvaluationDedupPolicy::Disabled)
    .build()
    .expect("the strategy builds valid policies");
    let (ours, clock) = adapter(vec![policy]);
    let quota = Quota::with_period(Duration::from_micros(interval))
        .expect("T >= 1 us")
        .allow_burst(NonZeroU32::new(u32::try_from(case.burst).unwrap()).unwrap());
    let fake = FakeRelativeClock::default();
    let theirs = RateLimiter::direct_with_clock(quota, fake.clone())
        .with_middleware::<StateInformationMiddleware>();
    let mut at = T0;
    for (n, &(gap, cost)) in case.requests.iter().enumerate() {
        at += gap;
        clock.set_epoch_millis(at);
        fake.advance(Duration::from_millis(gap));
        let mut asked = request(&clock, &id("g"), subject(1), n as u128);
        asked.cost = cost;
        let mine = decision(runtime.block_on(ours.evaluate(asked)));
        let theirs = theirs
            .check_n(NonZeroU32::new(u32::try_from(cost).unwrap()).unwrap())
            .expect("cost <= burst fits governor's capacity");
        let at_step = format!("step {n} at T0 + {} ms, cost {cost}", at - T0);
        match theirs {
            Ok(snapshot) => {
                prop_assert!(mine.allowed, "{at_step}: governor admits, ours {mine:?}");
                prop_assert_eq!(
                    mine.remaining,
                    u64::from(snapshot.remaining_burst_capacity()),
                    "{}",
                    at_step
                );
            }
            Err(not_until) => {
                prop_assert!(!mine.allowed, "{at_step}: governor denies, ours {mine:?}");
                let wait = not_until.wait_time_from(governor::clock::Clock::now(&fake));
                let wait_ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap();
                prop_assert_eq!(mine.retry_after_ms, wait_ms.max(1), "{}", at_step);
            }
        }
    }
    Ok(())
}

#[test]
fn gcra_decides_as_governor_does_for_any_arrivals_and_costs() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let config = Config { cases: 512, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&case(), |case| agree(&case, &runtime));
    if let Err(error) = result {
        panic!("{error}");
    }
}

/// A cost above the burst never conforms: governor's `check_n` answers
/// `InsufficientCapacity`, and the policy's `maximum_cost` (at most the
/// burst) refuses it as `CostExceedsMaximum` before any state is read.
#[test]
fn a_cost_above_the_burst_is_refused_by_both() {
    let quota = Quota::with_period(Duration::from_millis(100))
        .unwrap()
        .allow_burst(NonZeroU32::new(5).unwrap());
    let theirs = RateLimiter::direct_with_clock(quota, FakeRelativeClock::default());
    assert_eq!(theirs.check_n(NonZeroU32::new(6).unwrap()), Err(governor::InsufficientCapacity(5)));
    let over = RateLimitPolicy::builder(
        "g",
        Algorithm::Gcra(shared_contract::Gcra {
            limit: 10,
            period: Duration::from_secs(1),
            burst: 5,
        }),
    )
    .maximum_cost(6)
    .build();
    assert!(over.is_err(), "maximum-cost above the burst: {over:?}");
    let policy = RateLimitPolicy::builder(
        "g",
        Algorithm::Gcra(shared_contract::Gcra {
            limit: 10,
            period: Duration::from_secs(1),
            burst: 5,
        }),
    )
    .maximum_cost(5)
    .build()
    .unwrap();
    let (ours, clock) = adapter(vec![policy]);
    let mut asked = request(&clock, &id("g"), subject(1), 1);
    asked.cost = 6;
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    assert_eq!(
        runtime.block_on(ours.evaluate(asked)),
        Err(shared_contract::RateLimitFailure::Incompatible {
            category: shared_contract::IncompatibleCategory::CostExceedsMaximum
        })
    );
}
