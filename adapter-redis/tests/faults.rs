//! The Redis provider through a [`FaultProxy`] in front of a real
//! redis-server: slow replies, replies lost after the script ran, refused
//! connects, a silent peer, replies cut mid-frame and reset mid-reply. Each
//! fault must give a typed fail-closed outcome within the request's
//! deadline, never charge what it did not report (or could not know), never
//! hand one request another's decision, and heal without rebuilding the
//! adapter.
//!
//! Every random choice is seeded; the seed is printed, and
//! `FAULT_PROXY_SEED=<seed>` replays a failure.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adapter_redis::{RedisEdgeRateLimitAdapter, RedisSettings};
use redis_fixture::{FaultProxy, ProxyMode, RedisServer, ReplyFault, SeededRng};
use shared_contract::{
    Algorithm, Clock, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, ManualClock,
    OperationDigest, PolicyId, PolicySet, RateLimitDecision, RateLimitFailure, RateLimitOutcome,
    RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest, SubjectDigest, UnavailableCategory,
};
use support::{T0, inspector, subject};

/// How late past its deadline a call may come back.
const DEADLINE_SLACK: Duration = Duration::from_millis(50);
/// How soon after a fault heals the service must answer again.
const HEAL_BOUND: Duration = Duration::from_secs(2);

// These two helpers are the only places that build a request or read a
// decision: a set of one policy, under one operation.

fn request(
    policy: &str,
    subject: &SubjectDigest,
    evaluation_id: EvaluationId,
    deadline: Instant,
) -> RateLimitRequest<'static> {
    RateLimitRequest {
        policies: PolicySet::single(PolicyId::new(policy).unwrap()).into(),
        subject: *subject,
        operation: operation(),
        cost: 1,
        evaluation_id,
        deadline,
    }
}

/// The one operation every request here is for.
fn operation() -> OperationDigest {
    OperationDigest::from_u64(0x0000_0000_0000_00f1)
}

fn decision(outcome: &RateLimitOutcome) -> Option<RateLimitDecision> {
    match outcome {
        Ok(set) => set.decisions().first().copied(),
        Err(RateLimitFailure::Unavailable { .. })
        | Err(RateLimitFailure::Incompatible { .. })
        | Err(RateLimitFailure::Indeterminate { .. }) => None,
    }
}

fn fixed(id: &str, limit: u64, dedup: EvaluationDedupPolicy) -> RateLimitPolicy {
    // A window far longer than any test, so no count resets mid-test.
    RateLimitPolicy::builder(
        id,
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit,
            window: Duration::from_secs(3600),
        }),
    )
    .evaluation_dedup(dedup)
    .build()
    .unwrap()
}

struct Rig {
    server: RedisServer,
    proxy: FaultProxy,
    clock: ManualClock,
    adapter: RedisEdgeRateLimitAdapter,
    policies: Vec<RateLimitPolicy>,
    budget: Duration,
}

fn rig(policies: Vec<RateLimitPolicy>, command_timeout: Duration, budget: Duration) -> Rig {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], server.port())));
    let clock = ManualClock::new(T0);
    let settings = RedisSettings {
        urls: vec![proxy.url()],
        command_timeout,
        connect_timeout: command_timeout,
        ..RedisSettings::default()
    };
    let adapter =
        RedisEdgeRateLimitAdapter::new(settings, policies.clone(), Arc::new(clock.clone()))
            .unwrap();
    Rig { server, proxy, clock, adapter, policies, budget }
}

/// What one call gave and how long it took.
#[derive(Debug, Clone)]
struct Call {
    outcome: RateLimitOutcome,
    elapsed: Duration,
}

impl Rig {
    async fn call(&self, policy: &str, who: &SubjectDigest) -> Call {
        self.call_with(policy, who, EvaluationId::random()).await
    }

    async fn call_with(&self, policy: &str, who: &SubjectDigest, id: EvaluationId) -> Call {
        let started = Instant::now();
        let deadline = self.clock.monotonic() + self.budget;
        let outcome = self.adapter.evaluate(request(policy, who, id, deadline)).await;
        let call = Call { outcome, elapsed: started.elapsed() };
        assert!(
            call.elapsed <= self.budget + DEADLINE_SLACK,
            "seed {}: a call took {:?}, beyond its budget {:?} + {DEADLINE_SLACK:?}: {call:?}",
            self.proxy.seed(),
            call.elapsed,
            self.budget
        );
        call
    }

    /// Calls until one is allowed, at most [`HEAL_BOUND`] after `healed`;
    /// returns how long after `healed` the service answered.
    async fn recovers(&self, policy: &str, who: &SubjectDigest, healed: Instant) -> Duration {
        loop {
            let call = self.call(policy, who).await;
            if decision(&call.outcome).is_some_and(|decision| decision.allowed) {
                return healed.elapsed();
            }
            assert!(
                healed.elapsed() < HEAL_BOUND,
                "seed {}: no decision {HEAL_BOUND:?} after the heal; last {call:?}",
                self.proxy.seed()
            );
        }
    }

    /// The charges the key of (`policy`, `who`) holds, read on the real
    /// server behind the proxy: the fixed-window count `n`, the third double
    /// after the tag byte (docs/algorithms.md, "Stored state on Redis").
    async fn charges(&self, policy: &str, who: &SubjectDigest) -> u64 {
        let policy = self.policies.iter().find(|p| p.id().as_str() == policy).unwrap();
        let key = self.adapter.keys().counter_key(policy, who, &operation());
        let mut redis = inspector(&self.server).await;
        // With dedupe on the key is a hash whose field `s` is the state.
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut redis).await.unwrap();
        let read = if kind == "hash" {
            redis::cmd("HGET").arg(&key).arg("s").clone()
        } else {
            redis::cmd("GET").arg(&key).clone()
        };
        let raw: Option<Vec<u8>> = read.query_async(&mut redis).await.unwrap();
        let Some(raw) = raw else { return 0 };
        assert_eq!(raw.first(), Some(&b'F'), "a fixed-window key starts with its tag");
        let n = f64::from_le_bytes(raw[17..25].try_into().unwrap());
        assert!(n >= 0.0 && n.fract() == 0.0, "a count is a whole number: {n}");
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked just above
        let n = n as u64;
        n
    }
}

/// Tallies of outcomes, for the charge bound: every allowed decision was
/// charged, and nothing was charged but those and the indeterminate ones.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    allowed: u64,
    denied: u64,
    indeterminate: u64,
    before_send: u64,
    admission_rejected: u64,
    worst: Duration,
}

impl Tally {
    fn add(&mut self, call: &Call) {
        self.worst = self.worst.max(call.elapsed);
        match &call.outcome {
            Ok(set) if set.allowed() => self.allowed += 1,
            Ok(_) => self.denied += 1,
            Err(RateLimitFailure::Indeterminate { .. }) => self.indeterminate += 1,
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::UnavailableBeforeSend,
                ..
            }) => self.before_send += 1,
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::AdmissionRejected,
                ..
            }) => self.admission_rejected += 1,
            other => panic!("an outcome no network fault explains: {other:?}"),
        }
    }

    fn assert_charges(&self, charges: u64, seed: u64) {
        assert!(
            self.allowed <= charges && charges <= self.allowed + self.indeterminate,
            "seed {seed}: {charges} charges for {self:?}"
        );
    }
}

#[tokio::test]
async fn latency_beyond_the_command_timeout_fails_closed_within_the_deadline() {
    let budget = Duration::from_millis(400);
    let policies = vec![
        fixed("plain", 100, EvaluationDedupPolicy::Disabled),
        fixed("deduped", 100, EvaluationDedupPolicy::enabled_defaults()),
    ];
    let rig = rig(policies, Duration::from_millis(100), budget);
    let who = subject(1);
    for policy in ["plain", "deduped"] {
        let mut tally = Tally::default();
        tally.add(&rig.call(policy, &who).await);
        assert_eq!(tally.allowed, 1, "pass-through answers");
        rig.proxy.set_mode(ProxyMode::Latency {
            base: Duration::from_millis(300),
            jitter: Duration::from_millis(100),
        });
        for _ in 0..6 {
            let call = rig.call(policy, &who).await;
            // A reply 300 ms late never beats a 100 ms command timeout: no
            // decision, only the fail-closed outcomes a slow server explains
            // (before-send when a replaced connection cannot finish its
            // handshake in time).
            assert!(decision(&call.outcome).is_none(), "{call:?}");
            tally.add(&call);
        }
        assert!(tally.indeterminate >= 1, "{tally:?}");
        rig.proxy.set_mode(ProxyMode::PassThrough);
        let healed = Instant::now();
        let recovery = rig.recovers(policy, &who, healed).await;
        tally.allowed += 1;
        // Late replies of timed-out scripts may still be on their way.
        tally.assert_charges(rig.charges(policy, &who).await, rig.proxy.seed());
        eprintln!(
            "latency {policy}: worst call {:?} (budget {budget:?}), recovery {recovery:?}, {tally:?}",
            tally.worst
        );
    }
}

#[tokio::test]
async fn a_reply_lost_after_the_script_ran_replays_the_single_charge_with_dedupe() {
    let rig = rig(
        vec![fixed("deduped", 10, EvaluationDedupPolicy::enabled_defaults())],
        Duration::from_millis(250),
        Duration::from_millis(750),
    );
    let who = subject(2);
    // A warm-up first, so the connection is open and the script loaded and
    // the next reply is the script's own.
    let warm = rig.call("deduped", &who).await;
    assert!(decision(&warm.outcome).is_some_and(|d| d.allowed), "{warm:?}");
    rig.proxy.arm(ReplyFault::DropAndClose);
    let call = rig.call("deduped", &who).await;
    assert_eq!(rig.proxy.applied(), 1);
    let replayed = decision(&call.outcome).expect("the retry settles it");
    assert!(replayed.allowed && replayed.replayed, "{call:?}");
    assert_eq!(replayed.remaining, 8, "the lost reply's own charge, not a second");
    assert_eq!(rig.charges("deduped", &who).await, 2, "one charge per evaluation");
    let next = decision(&rig.call("deduped", &who).await.outcome).unwrap();
    assert!(next.allowed && !next.replayed);
    assert_eq!(next.remaining, 7);
    assert_eq!(rig.charges("deduped", &who).await, 3);
    eprintln!("reply lost, dedupe on: replayed in {:?}", call.elapsed);
}

#[tokio::test]
async fn a_reply_lost_after_the_script_ran_is_indeterminate_and_charged_once_without_dedupe() {
    let rig = rig(
        vec![fixed("plain", 10, EvaluationDedupPolicy::Disabled)],
        Duration::from_millis(250),
        Duration::from_millis(750),
    );
    let who = subject(3);
    assert!(rig.call("plain", &who).await.outcome.is_allowed());
    rig.proxy.arm(ReplyFault::DropAndClose);
    let call = rig.call("plain", &who).await;
    assert!(matches!(call.outcome, Err(RateLimitFailure::Indeterminate { .. })), "{call:?}");
    assert_eq!(rig.proxy.applied(), 1);
    assert_eq!(rig.charges("plain", &who).await, 2, "the lost evaluation charged once");
    // The dropped connection is replaced at once: the next call decides.
    let next = decision(&rig.call("plain", &who).await.outcome).unwrap();
    assert!(next.allowed);
    assert_eq!(next.remaining, 7);
    assert_eq!(rig.charges("plain", &who).await, 3);
}

#[tokio::test]
async fn refused_connects_are_unavailable_before_send_and_heal_without_rebuilding() {
    let rig = rig(
        vec![fixed("plain", 100, EvaluationDedupPolicy::Disabled)],
        Duration::from_millis(200),
        Duration::from_millis(500),
    );
    let who = subject(4);
    let mut tally = Tally::default();
    tally.add(&rig.call("plain", &who).await);
    assert_eq!(tally.allowed, 1);
    rig.proxy.set_mode(ProxyMode::Refuse);
    // The first call may still find the closed connection (it may have sent
    // on it before learning it is gone); from then on nothing connects.
    let first = rig.call("plain", &who).await;
    assert!(decision(&first.outcome).is_none(), "{first:?}");
    tally.add(&first);
    for _ in 0..5 {
        let call = rig.call("plain", &who).await;
        assert_eq!(
            call.outcome,
            Err(RateLimitFailure::Unavailable {
                category: UnavailableCategory::UnavailableBeforeSend,
                retry_after: RedisSettings::default().failure_retry_after,
            })
        );
        tally.add(&call);
    }
    let accepted = rig.proxy.accepted();
    rig.proxy.set_mode(ProxyMode::PassThrough);
    let recovery = rig.recovers("plain", &who, Instant::now()).await;
    tally.allowed += 1;
    assert!(rig.proxy.accepted() > accepted, "a new connection after the heal");
    tally.assert_charges(rig.charges("plain", &who).await, rig.proxy.seed());
    eprintln!("refused: first call {first:?}, recovery {recovery:?}, {tally:?}");
}

#[tokio::test]
async fn a_blackhole_is_bounded_by_the_deadline_and_the_connection_is_replaced_after_three() {
    let budget = Duration::from_millis(300);
    let rig = rig(
        vec![fixed("plain", 100, EvaluationDedupPolicy::Disabled)],
        Duration::from_millis(100),
        budget,
    );
    let who = subject(5);
    let mut tally = Tally::default();
    tally.add(&rig.call("plain", &who).await);
    assert_eq!((tally.allowed, rig.proxy.accepted()), (1, 1));
    rig.proxy.set_mode(ProxyMode::Blackhole);
    // AMBIGUOUS_FAILURES_BEFORE_RECONNECT (gateway/connection.rs) is 3: two
    // timeouts keep the connection, the third drops it.
    for timeouts in 1..=3 {
        let call = rig.call("plain", &who).await;
        assert!(matches!(call.outcome, Err(RateLimitFailure::Indeterminate { .. })), "{call:?}");
        assert_eq!(rig.proxy.accepted(), 1, "still the first connection after {timeouts}");
        tally.add(&call);
    }
    // The next call connects afresh; the silent proxy accepts the socket but
    // the handshake never completes, so nothing was sent.
    for _ in 0..3 {
        let call = rig.call("plain", &who).await;
        assert!(
            matches!(
                call.outcome,
                Err(RateLimitFailure::Unavailable {
                    category: UnavailableCategory::UnavailableBeforeSend,
                    ..
                })
            ),
            "{call:?}"
        );
        tally.add(&call);
    }
    assert!(rig.proxy.accepted() >= 2, "the connection was replaced");
    rig.proxy.set_mode(ProxyMode::PassThrough);
    let recovery = rig.recovers("plain", &who, Instant::now()).await;
    tally.allowed += 1;
    tally.assert_charges(rig.charges("plain", &who).await, rig.proxy.seed());
    eprintln!(
        "blackhole: worst call {:?} (budget {budget:?}), recovery {recovery:?}, {} connections, {tally:?}",
        tally.worst,
        rig.proxy.accepted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_cut_or_reset_mid_frame_never_carry_another_requests_decision() {
    const SUBJECTS: u8 = 6;
    const ROUNDS: u64 = 16;
    // Subject i evaluates its own policy of limit 1000 * (i + 1), so the
    // `remaining` of any decision names whose key it came from.
    let policies: Vec<RateLimitPolicy> = (0..SUBJECTS)
        .map(|i| {
            let dedup = if i % 2 == 0 {
                EvaluationDedupPolicy::enabled_defaults()
            } else {
                EvaluationDedupPolicy::Disabled
            };
            fixed(&format!("p{i}"), 1000 * (u64::from(i) + 1), dedup)
        })
        .collect();
    let rig = Arc::new(rig(policies, Duration::from_millis(250), Duration::from_millis(750)));
    let mut schedule = SeededRng::new(rig.proxy.seed());
    let mut tallies = vec![Tally::default(); usize::from(SUBJECTS)];
    let mut last_remaining: Vec<u64> = (0..SUBJECTS).map(|i| 1000 * (u64::from(i) + 1)).collect();
    for round in 1..=ROUNDS {
        let faults = [ReplyFault::CutMidFrame, ReplyFault::ResetMidReply];
        rig.proxy.arm(faults[usize::try_from(schedule.below(2)).unwrap()]);
        let armed = Instant::now();
        // A fault armed before a round is taken by a reply of that round.
        // The calls go again while it is not: right after a failed connect
        // (a cut handshake) they are refused unsent for the connect
        // back-off, and then no reply passes at all.
        loop {
            let calls: Vec<_> = (0..SUBJECTS)
                .map(|i| {
                    let rig = Arc::clone(&rig);
                    tokio::spawn(async move { rig.call(&format!("p{i}"), &subject(i)).await })
                })
                .collect();
            for (i, call) in calls.into_iter().enumerate() {
                let call = call.await.unwrap();
                tallies[i].add(&call);
                if let Some(decision) = decision(&call.outcome) {
                    let limit = 1000 * (i as u64 + 1);
                    assert!(
                        decision.allowed
                            && decision.remaining < last_remaining[i]
                            && decision.remaining > limit - 1000,
                        "seed {}: subject {i} (limit {limit}, last remaining {}) got {decision:?}",
                        rig.proxy.seed(),
                        last_remaining[i]
                    );
                    last_remaining[i] = decision.remaining;
                }
            }
            if rig.proxy.wait_applied(round, Duration::from_millis(200)).await {
                break;
            }
            assert!(armed.elapsed() < HEAL_BOUND, "round {round} fault unused");
        }
    }
    let healed = Instant::now();
    let mut recovery = Duration::ZERO;
    for i in 0..SUBJECTS {
        recovery = recovery.max(rig.recovers(&format!("p{i}"), &subject(i), healed).await);
        let tally = &mut tallies[usize::from(i)];
        tally.allowed += 1;
        let charges = rig.charges(&format!("p{i}"), &subject(i)).await;
        tally.assert_charges(charges, rig.proxy.seed());
    }
    let total = tallies.iter().fold(Tally::default(), |mut sum, t| {
        sum.allowed += t.allowed;
        sum.indeterminate += t.indeterminate;
        sum.before_send += t.before_send;
        sum.worst = sum.worst.max(t.worst);
        sum
    });
    assert!(total.indeterminate + total.before_send >= 1, "the faults hit calls: {total:?}");
    eprintln!("cut/reset: {} faults, recovery {recovery:?}, {total:?}", rig.proxy.applied());
}

#[tokio::test]
async fn a_seeded_schedule_of_every_fault_keeps_each_call_bounded_and_each_charge_reported() {
    let budget = Duration::from_millis(300);
    let rig = rig(
        vec![fixed("deduped", 10_000, EvaluationDedupPolicy::enabled_defaults())],
        Duration::from_millis(100),
        budget,
    );
    let who = subject(7);
    let mut schedule = SeededRng::new(rig.proxy.seed());
    let mut tally = Tally::default();
    tally.add(&rig.call("deduped", &who).await);
    for _ in 0..12 {
        match schedule.below(7) {
            0 => rig.proxy.set_mode(ProxyMode::PassThrough),
            1 => rig.proxy.set_mode(ProxyMode::Latency {
                base: Duration::from_millis(schedule.below(200)),
                jitter: Duration::from_millis(50),
            }),
            2 => rig.proxy.set_mode(ProxyMode::Blackhole),
            3 => rig.proxy.set_mode(ProxyMode::Refuse),
            pick => rig.proxy.arm(ReplyFault::ALL[usize::try_from(pick - 4).unwrap()]),
        }
        for _ in 0..3 {
            tally.add(&rig.call("deduped", &who).await);
        }
    }
    rig.proxy.set_mode(ProxyMode::PassThrough);
    let recovery = rig.recovers("deduped", &who, Instant::now()).await;
    tally.allowed += 1;
    tally.assert_charges(rig.charges("deduped", &who).await, rig.proxy.seed());
    eprintln!("schedule seed {}: recovery {recovery:?}, {tally:?}", rig.proxy.seed());
}
