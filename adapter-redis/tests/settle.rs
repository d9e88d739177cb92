//! Settling usage on a real redis-server (docs/algorithms.md "Settling
//! usage"): the worked numbers of every algorithm, a repeated settle, a
//! settle of an unknown reservation, a refund after its window ended, a
//! debt that refuses the next request and shows in the admin inspect, a
//! key of another algorithm, and what a settle refuses before it reaches
//! Redis. Expected values are the docs'.

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use redis_fixture::RedisServer;
use shared_contract::{
    Algorithm, BudgetKey, CalendarPeriod, CalendarWindow, Clock, Concurrency, EdgeRateLimitPort,
    EvaluationDedupPolicy, EvaluationId, FixedWindow, Gcra, IncompatibleCategory, ManualClock,
    PolicyId, PolicySet, RateLimitFailure, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    SettleOutcome, Settled, Settlement, SlidingCounter, TokenBucket,
};
use support::{T0, operation, subject};

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A policy of `algorithm` that reserves up to its limit, dedupe on with
/// records that outlive every test (the longest TTL a policy takes).
fn policy(id: &str, algorithm: Algorithm) -> RateLimitPolicy {
    let most = algorithm.limit();
    RateLimitPolicy::builder(id, algorithm)
        .maximum_cost(most)
        .evaluation_dedup(EvaluationDedupPolicy::Enabled {
            ttl: Duration::from_secs(3600),
            max_entries: 64,
            max_stored_bytes: 65_536,
        })
        .build()
        .unwrap()
}

/// One adapter over `policies` under a prefix of its own, and its clock.
struct Rig {
    clock: ManualClock,
    adapter: adapter_redis::RedisEdgeRateLimitAdapter,
    set: PolicySet,
}

impl Rig {
    fn new(scope: &str, at: u64, policies: Vec<RateLimitPolicy>) -> Self {
        let clock = ManualClock::new(at);
        let ids = policies.iter().map(|policy| policy.id().clone());
        let set = PolicySet::new(ids).unwrap();
        let prefix = support::scope_prefix(&format!("settle-{scope}"));
        let adapter = support::adapter(server(), &clock, policies, |settings| {
            settings.key_prefix = prefix;
        });
        Self { clock, adapter, set }
    }

    fn request(&self, cost: u64, id: EvaluationId) -> RateLimitRequest<'static> {
        RateLimitRequest {
            policies: self.set.clone().into(),
            subject: subject(1),
            operation: operation(),
            cost,
            evaluation_id: id,
            deadline: self.clock.monotonic() + Duration::from_secs(5),
        }
    }

    async fn take(&self, cost: u64, id: EvaluationId) -> RateLimitOutcome {
        self.adapter.evaluate(self.request(cost, id)).await
    }

    /// A request of `cost` under a fresh id: (allowed, remaining,
    /// retry_after ms, reset_after ms) of its one policy.
    async fn ask(&self, cost: u64) -> (bool, u64, u64, u64) {
        let outcome = self.take(cost, EvaluationId::random()).await;
        let set = outcome.unwrap_or_else(|failure| panic!("a decision, got {failure:?}"));
        let decision = set.decisions()[0];
        (set.allowed(), decision.remaining, decision.retry_after_ms, decision.reset_after_ms)
    }

    /// A reservation of `cost`, its id and its remaining.
    async fn reserve(&self, cost: u64) -> (EvaluationId, u64) {
        let id = EvaluationId::random();
        let set = self.take(cost, id).await.unwrap();
        assert!(set.allowed(), "the reservation of {cost} is admitted");
        (id, set.decisions()[0].remaining)
    }

    async fn settle(&self, reserved: u64, id: EvaluationId, used: u64) -> SettleOutcome {
        self.adapter.settle(Settlement { request: self.request(reserved, id), used }).await
    }

    fn at(&self, t: u64) {
        self.clock.set_epoch_millis(t);
    }
}

#[tokio::test]
async fn a_fixed_window_settles_as_the_docs_say() {
    let fixed = Algorithm::FixedWindow(FixedWindow { limit: 10, window: ms(1000) });
    let rig = Rig::new("fixed", T0 + 100, vec![policy("p", fixed)]);
    // A reservation of 5 leaves 5; settled with u = 2 the count is 2.
    let (id, remaining) = rig.reserve(5).await;
    assert_eq!(remaining, 5);
    assert_eq!(rig.settle(5, id, 2).await, Ok(Settled::Applied));
    assert_eq!(rig.ask(1).await, (true, 7, 0, 900));
    // The same settle again (a retry after a lost reply) changes nothing.
    assert_eq!(rig.settle(5, id, 2).await, Ok(Settled::Repeated));
    assert_eq!(rig.ask(1).await, (true, 6, 0, 900));
    // A reservation of 5 (count 9) settled with u = 12: count 16, a debt.
    let (id, _) = rig.reserve(5).await;
    assert_eq!(rig.settle(5, id, 12).await, Ok(Settled::Applied));
    assert_eq!(rig.ask(1).await, (false, 0, 900, 900));
    // The next window admits it.
    rig.at(T0 + 1000);
    assert_eq!(rig.ask(1).await, (true, 9, 0, 1000));
    // A reservation of the window at T0 + 1000 settled in the next one
    // gives nothing back.
    rig.at(T0 + 1100);
    let (id, _) = rig.reserve(5).await;
    rig.at(T0 + 2000);
    assert_eq!(rig.settle(5, id, 0).await, Ok(Settled::Applied));
    assert_eq!(rig.ask(1).await, (true, 9, 0, 1000));
}

#[tokio::test]
async fn a_sliding_counter_settles_as_the_docs_say() {
    let sliding = Algorithm::SlidingCounter(SlidingCounter { limit: 10, window: ms(1000) });
    let rig = Rig::new("sliding", T0, vec![policy("p", sliding)]);
    let (id, _) = rig.reserve(4).await;
    assert_eq!(rig.settle(4, id, 10).await, Ok(Settled::Applied));
    assert!(!rig.ask(1).await.0, "n = 10 refuses");
    // At T0 + 1500: p = 10, e = 500, est = 5.
    rig.at(T0 + 1500);
    let (allowed, remaining, _, _) = rig.ask(1).await;
    assert_eq!((allowed, remaining), (true, 4));
}

#[tokio::test]
async fn a_token_bucket_in_debt_refuses_and_its_inspect_shows_it() {
    let bucket = |scope| {
        let algorithm = Algorithm::TokenBucket(TokenBucket {
            capacity: 10,
            refill_tokens: 1,
            refill_period: ms(100),
        });
        Rig::new(scope, T0, vec![policy("p", algorithm)])
    };
    let rig = bucket("bucket-debt");
    let (id, _) = rig.reserve(5).await;
    assert_eq!(rig.settle(5, id, 12).await, Ok(Settled::Applied));
    // Tokens -2: the budget says 0 left, 2 owed, 1200 ms to full.
    let key = BudgetKey::new(subject(1), PolicyId::new("p").unwrap(), Some(operation()));
    let budget = rig.adapter.inspect(&key).await.unwrap();
    assert_eq!((budget.remaining, budget.debt, budget.reset_after), (0, 2, ms(1200)));
    assert_eq!(rig.ask(1).await, (false, 0, 300, 1200));
    // At T0 + 300: k = 3, tokens 1.
    rig.at(T0 + 300);
    let (allowed, remaining, _, _) = rig.ask(1).await;
    assert_eq!((allowed, remaining), (true, 0));

    let rig = bucket("bucket-refund");
    let (id, _) = rig.reserve(4).await;
    assert_eq!(rig.settle(4, id, 1).await, Ok(Settled::Applied));
    let (allowed, remaining, _, _) = rig.ask(1).await;
    assert_eq!((allowed, remaining), (true, 8));
}

#[tokio::test]
async fn a_gcra_key_settles_as_the_docs_say() {
    let gcra = || Algorithm::Gcra(Gcra { limit: 10, period: ms(1000), burst: 5 });
    let rig = Rig::new("gcra-refund", T0, vec![policy("p", gcra())]);
    let (id, remaining) = rig.reserve(3).await;
    assert_eq!(remaining, 2);
    assert_eq!(rig.settle(3, id, 1).await, Ok(Settled::Applied));
    let (allowed, remaining, _, _) = rig.ask(1).await;
    assert_eq!((allowed, remaining), (true, 3));

    let rig = Rig::new("gcra-debt", T0, vec![policy("p", gcra())]);
    let (id, _) = rig.reserve(5).await;
    assert_eq!(rig.settle(5, id, 8).await, Ok(Settled::Applied));
    let (allowed, _, retry_after, _) = rig.ask(1).await;
    assert_eq!((allowed, retry_after), (false, 400));
    rig.at(T0 + 400);
    let (allowed, remaining, _, _) = rig.ask(1).await;
    assert_eq!((allowed, remaining), (true, 0));
}

/// 31 January 2027, 23:30 in Europe/Berlin (22:30 UTC), and the instants
/// after it the docs' example and a refund across midnight use.
const JANUARY_2330: u64 = 1_801_434_600_000;
const FEBRUARY_0030: u64 = JANUARY_2330 + 3_600_000;

#[tokio::test]
async fn a_calendar_month_keeps_a_reservation_of_the_month_before() {
    let month = || {
        Algorithm::CalendarWindow(CalendarWindow {
            limit: 10,
            period: CalendarPeriod::Month,
            time_zone: "Europe/Berlin".parse().unwrap(),
        })
    };
    let rig = Rig::new("calendar", JANUARY_2330, vec![policy("p", month())]);
    let (id, _) = rig.reserve(5).await;
    rig.at(FEBRUARY_0030);
    // The record lived its hour (the longest TTL) by then: nothing to settle.
    let settled = rig.settle(5, id, 0).await;
    assert!(matches!(settled, Ok(Settled::Applied | Settled::UnknownReservation)), "{settled:?}");
    assert_eq!(rig.ask(1).await.1, 9);

    // Half a minute either side of midnight, the record is live: the
    // settle applies and still gives January's units back to no one.
    let before = JANUARY_2330 + 1_770_000; // 23:59:30
    let rig = Rig::new("calendar-live", before, vec![policy("p", month())]);
    let (id, _) = rig.reserve(5).await;
    rig.at(before + 60_000); // 00:00:30
    assert_eq!(rig.settle(5, id, 0).await, Ok(Settled::Applied));
    assert_eq!(rig.ask(1).await.1, 9);
}

#[tokio::test]
async fn a_settle_without_a_live_reservation_changes_nothing() {
    let fixed = || Algorithm::FixedWindow(FixedWindow { limit: 10, window: ms(1000) });
    let rig = Rig::new("unknown", T0, vec![policy("p", fixed())]);
    rig.reserve(5).await;
    // An id no evaluation used.
    assert_eq!(rig.settle(5, EvaluationId::random(), 0).await, Ok(Settled::UnknownReservation));
    assert_eq!(rig.ask(1).await.1, 4);
    // An id minted once keeps no record to settle against.
    let once = EvaluationId::once();
    assert!(rig.take(2, once).await.unwrap().allowed());
    assert_eq!(rig.settle(2, once, 0).await, Ok(Settled::UnknownReservation));
    assert_eq!(rig.ask(1).await.1, 1);

    // Dedupe off: no record, so no reservation to find.
    let off = RateLimitPolicy::builder("p", fixed())
        .maximum_cost(10)
        .evaluation_dedup(EvaluationDedupPolicy::Disabled)
        .build()
        .unwrap();
    let rig = Rig::new("unknown-off", T0, vec![off]);
    let (id, _) = rig.reserve(5).await;
    assert_eq!(rig.settle(5, id, 0).await, Ok(Settled::UnknownReservation));
    assert_eq!(rig.ask(1).await.1, 4);
    // A reservation of 0 charges what was used, with or without records.
    let id = EvaluationId::random();
    assert_eq!(rig.settle(0, id, 3).await, Ok(Settled::Applied));
    assert_eq!(rig.ask(1).await.1, 0);
}

#[tokio::test]
async fn an_after_the_fact_charge_is_kept_once_and_used_equal_to_reserved_changes_nothing() {
    let fixed = Algorithm::FixedWindow(FixedWindow { limit: 10, window: ms(1000) });
    let rig = Rig::new("after", T0, vec![policy("p", fixed)]);
    let id = EvaluationId::random();
    assert_eq!(rig.settle(0, id, 4).await, Ok(Settled::Applied));
    assert_eq!(rig.settle(0, id, 4).await, Ok(Settled::Repeated));
    assert_eq!(rig.ask(1).await.1, 5);
    let (id, _) = rig.reserve(2).await;
    assert_eq!(rig.settle(2, id, 2).await, Ok(Settled::Applied));
    assert_eq!(rig.ask(1).await.1, 2);
}

#[tokio::test]
async fn a_set_settles_its_rate_keys_and_leaves_its_leases() {
    let fixed = Algorithm::FixedWindow(FixedWindow { limit: 10, window: ms(1000) });
    let leases = Algorithm::Concurrency(Concurrency {
        max_in_flight: 2,
        lease_ttl: Duration::from_secs(10),
        retry_after: ms(100),
    });
    let slots = RateLimitPolicy::builder("q", leases).build().unwrap();
    let rig = Rig::new("set", T0, vec![policy("p", fixed), slots]);
    let (id, _) = rig.reserve(6).await;
    assert_eq!(rig.settle(6, id, 1).await, Ok(Settled::Applied));
    // The window holds 1 again; the lease of the reservation still holds
    // one of the two slots.
    let set = rig.take(1, EvaluationId::random()).await.unwrap();
    let remaining: Vec<u64> = set.decisions().iter().map(|decision| decision.remaining).collect();
    assert_eq!(remaining, [8, 0]);
}

#[tokio::test]
async fn what_a_settle_refuses_it_refuses_before_redis() {
    let fixed = Algorithm::FixedWindow(FixedWindow { limit: 10, window: ms(1000) });
    let rig = Rig::new("refused", T0, vec![policy("p", fixed)]);
    let id = EvaluationId::random();
    let beyond = (1 << 53) + 1;
    let too_much =
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::CostExceedsMaximum });
    let answer = rig.adapter.settle(Settlement { request: rig.request(1, id), used: beyond });
    assert_eq!(answer.into_ready().unwrap(), too_much);
    // Beyond maximum-cost but within a counter's range: settled.
    assert_eq!(rig.settle(0, id, 17).await, Ok(Settled::Applied));
    let unknown = Settlement {
        request: RateLimitRequest {
            policies: PolicySet::single(PolicyId::new("nope").unwrap()).into(),
            ..rig.request(1, id)
        },
        used: 0,
    };
    assert_eq!(
        rig.adapter.settle(unknown).into_ready().unwrap(),
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::UnknownPolicy })
    );
}

/// A key to settle that holds another algorithm's state fails the settle,
/// which writes nothing; one the settle does not touch fails nothing.
#[tokio::test]
async fn a_key_of_another_algorithm_fails_the_settle_and_nothing_is_written() {
    use redis::AsyncCommands;
    let fixed = Algorithm::FixedWindow(FixedWindow { limit: 10, window: ms(1000) });
    let rig = Rig::new("corrupt", T0, vec![policy("p", fixed)]);
    let (id, _) = rig.reserve(5).await;
    let policy = rig.adapter.policy(&PolicyId::new("p").unwrap()).unwrap();
    let key = rig.adapter.keys().counter_key(policy, &subject(1), &operation());
    let mut redis = support::inspector(server()).await;
    let state: Vec<u8> = redis.hget(&key, "s").await.unwrap();
    // The same doubles and records trailer under a token bucket's tag (its
    // header is as long as the fixed window's).
    let mut bucket = state.clone();
    bucket[0] = b'B';
    let _: () = redis.hset(&key, "s", &bucket).await.unwrap();
    assert_eq!(
        rig.settle(5, id, 1).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible })
    );
    let after: Vec<u8> = redis.hget(&key, "s").await.unwrap();
    assert_eq!(after, bucket, "nothing written");
    // The reservation of another id does not run it; a settle of u = c does
    // (it is recorded).
    assert_eq!(rig.settle(5, EvaluationId::random(), 1).await, Ok(Settled::UnknownReservation));
    assert_eq!(
        rig.settle(5, id, 5).await,
        Err(RateLimitFailure::Incompatible { category: IncompatibleCategory::StateIncompatible })
    );
}
