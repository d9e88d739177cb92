//! One keyed decision per iteration over 10,000 subjects, for each algorithm
//! of the memory provider and for `governor`'s keyed limiter (the in-process
//! anchor), on one thread and on two.
//!
//! Ours goes through the public port (`EdgeRateLimitPort::evaluate`), so a
//! decision includes what a caller pays: building the request (the subject
//! digest copied inline, two shared handles cloned) and one clock read
//! (`Clock::read_both`). The provider answers at once, so the answer is
//! taken as the fronts take it (`PortAnswer::into_ready`), with no runtime.
//! Policies allow 100 units per subject per second (limits, not latency, set
//! the allowed fraction); the run prints the fraction it saw.
//!
//! `port-floor` asks for a policy the adapter does not hold: the cost of the
//! request and the policy lookup without the store.
//! `concurrency+release` takes an in-flight lease and gives it back
//! (`EdgeRateLimitPort::release`) in each iteration: what a request under a
//! concurrency policy costs the provider, both calls.
//!
//! Two threads: `iter_custom` splits the iterations over two std threads and
//! reports the wall time, so the figure is nanoseconds per decision of the
//! pair (the inverse of aggregate throughput).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adapter_memory::MemoryEdgeRateLimitAdapter;
use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, Lease, OperationDigest,
    PolicyId, PolicySet, PortAnswer, RateLimitOutcome, RateLimitOutcomeExt, RateLimitPolicy,
    RateLimitRequest, ReleaseOutcome, SubjectDigest, SystemClock,
};
use uuid::Uuid;

const SUBJECTS: usize = 10_000;
/// Units per subject per second in every policy, ours and governor's.
const PER_SECOND: u64 = 100;
const WINDOW: Duration = Duration::from_secs(1);

/// Allowed and total decisions seen by one benchmark, for the printed mix.
#[derive(Default)]
struct Mix {
    allowed: AtomicU64,
    total: AtomicU64,
}

impl Mix {
    fn add(&self, allowed: u64, total: u64) {
        self.allowed.fetch_add(allowed, Ordering::Relaxed);
        self.total.fetch_add(total, Ordering::Relaxed);
    }

    fn report(&self, name: &str) {
        let (allowed, total) =
            (self.allowed.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed));
        if total == 0 {
            return; // filtered out of this run
        }
        let percent = 100.0 * allowed as f64 / total as f64;
        eprintln!("mix {name}: {percent:.1}% allowed of {total} decisions");
    }
}

/// xorshift64: a cheap, fixed pseudo-random subject order, the same for
/// every contender.
fn next_index(state: &mut u64) -> usize {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state % SUBJECTS as u64) as usize
}

/// Digests shaped like the edge's pseudonyms: `v1:` and 64 hex digits.
fn subjects() -> Vec<SubjectDigest> {
    (0..SUBJECTS as u64)
        .map(|n| {
            let mixed = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            SubjectDigest::parse(format!("v1:{mixed:032x}{n:032x}"))
        })
        .collect::<Result<_, _>>()
        .expect("valid digests")
}

fn policy(algorithm: Algorithm, dedup: EvaluationDedupPolicy) -> RateLimitPolicy {
    RateLimitPolicy::builder("bench", algorithm)
        .evaluation_dedup(dedup)
        .build()
        .expect("valid policy")
}

/// The provider never waits: its answer is there at once.
fn now<T>(answer: PortAnswer<T>) -> T {
    answer.into_ready().unwrap_or_else(|_| panic!("the memory provider never waits"))
}

fn evaluate_now(
    adapter: &MemoryEdgeRateLimitAdapter,
    request: RateLimitRequest,
) -> RateLimitOutcome {
    now(adapter.evaluate(request))
}

/// One contender: decides for subject `index` and says whether it allowed.
trait Contender: Sync {
    fn decide(&self, index: usize, evaluation: u128) -> bool;
}

struct Ours {
    adapter: MemoryEdgeRateLimitAdapter,
    policy: PolicySet,
    operation: OperationDigest,
    subjects: Vec<SubjectDigest>,
    /// Only the first `hot` subjects are asked about (all of them but in
    /// the `hot-*` cases).
    hot: usize,
    deadline: Instant,
}

impl Ours {
    fn request(&self, index: usize, evaluation: u128) -> RateLimitRequest<'_> {
        RateLimitRequest {
            policies: (&self.policy).into(),
            subject: self.subjects[index % self.hot],
            operation: self.operation,
            cost: 1,
            evaluation_id: EvaluationId::from_uuid(Uuid::from_u128(evaluation)),
            deadline: self.deadline,
        }
    }
}

impl Contender for Ours {
    fn decide(&self, index: usize, evaluation: u128) -> bool {
        evaluate_now(&self.adapter, self.request(index, evaluation)).is_allowed()
    }
}

/// A concurrency policy: each decision takes a lease and releases it.
struct Leasing(Ours);

impl Contender for Leasing {
    fn decide(&self, index: usize, evaluation: u128) -> bool {
        let request = self.0.request(index, evaluation);
        let lease = Lease::of(&request);
        let allowed = evaluate_now(&self.0.adapter, request).is_allowed();
        let released = now(self.0.adapter.release(&lease));
        assert_eq!(released == ReleaseOutcome::Released, allowed, "an admitted lease is released");
        allowed
    }
}

struct Governor {
    limiter: DefaultKeyedRateLimiter<String>,
    keys: Vec<String>,
}

impl Contender for Governor {
    fn decide(&self, index: usize, _evaluation: u128) -> bool {
        self.limiter.check_key(&self.keys[index]).is_ok()
    }
}

fn ours(algorithm: Algorithm, dedup: EvaluationDedupPolicy) -> Ours {
    let adapter =
        MemoryEdgeRateLimitAdapter::new([policy(algorithm, dedup)], Arc::new(SystemClock))
            .expect("adapter builds");
    Ours {
        adapter,
        policy: PolicySet::single(PolicyId::new("bench").expect("valid id")),
        operation: OperationDigest::from_u64(0x0000_0000_0000_00aa),
        subjects: subjects(),
        hot: SUBJECTS,
        deadline: Instant::now() + Duration::from_secs(24 * 3600),
    }
}

/// 64 subjects under a limit never reached, so every decision charges:
/// with dedupe on each key sits at its record cap (256) after the warm-up,
/// and every decision looks its id up, appends a record and evicts the
/// oldest. The records (64 x 256 x 40 bytes) fit in cache, so this shows
/// what the records themselves cost, apart from the memory misses of the
/// 10,000-subject case.
fn hot(dedup: EvaluationDedupPolicy) -> Ours {
    let mut hot = ours(
        Algorithm::FixedWindow(shared_contract::FixedWindow {
            limit: 1_000_000_000,
            window: WINDOW,
        }),
        dedup,
    );
    hot.hot = HOT_SUBJECTS;
    hot
}

const HOT_SUBJECTS: usize = 64;

/// Requests for a policy the adapter does not hold: what a decision costs
/// before the store (request, boxed future, policy lookup), all denied.
fn port_floor() -> Ours {
    let mut floor = ours(
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit: PER_SECOND, window: WINDOW }),
        EvaluationDedupPolicy::Disabled,
    );
    floor.policy = PolicySet::single(PolicyId::new("not-held").expect("valid id"));
    floor
}

fn governor() -> Governor {
    let burst = NonZeroU32::new(u32::try_from(PER_SECOND).expect("fits")).expect("non-zero");
    governor_with(Quota::per_second(burst))
}

fn governor_with(quota: Quota) -> Governor {
    Governor {
        limiter: RateLimiter::keyed(quota),
        keys: subjects().iter().map(ToString::to_string).collect(),
    }
}

/// The equal mixes: every decision allowed (a limit no run reaches), or
/// every decision after each subject's first denied (one a day), for ours
/// and governor alike, so neither contender's cheaper path weighs more.
fn fixed_window_every(allowed: bool) -> Ours {
    let (limit, window) =
        if allowed { (1_000_000_000, WINDOW) } else { (1, Duration::from_secs(24 * 3600)) };
    ours(
        Algorithm::FixedWindow(shared_contract::FixedWindow { limit, window }),
        EvaluationDedupPolicy::Disabled,
    )
}

fn governor_every(allowed: bool) -> Governor {
    let quota =
        if allowed { Quota::per_second(NonZeroU32::MAX) } else { Quota::per_hour(NonZeroU32::MIN) };
    governor_with(quota)
}

/// Runs `iters` decisions on `threads` threads and returns the wall time.
fn run(contender: &dyn Contender, mix: &Mix, iters: u64, threads: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let share = iters / threads + u64::from(thread < iters % threads);
            scope.spawn(move || {
                let mut state = 0x2545_f491_4f6c_dd1d ^ (thread + 1);
                let mut allowed = 0;
                for n in 0..share {
                    let index = next_index(&mut state);
                    let evaluation = (u128::from(thread) << 64) | u128::from(n);
                    allowed += u64::from(black_box(contender.decide(index, evaluation)));
                }
                mix.add(allowed, share);
            });
        }
    });
    start.elapsed()
}

/// Builds one contender; each is built just before its benchmarks and
/// dropped after them, so one contender's memory (the dedupe records above
/// all) never weighs on another's figures.
type Build = fn() -> Box<dyn Contender>;

fn decisions(c: &mut Criterion) {
    let contenders: [(&str, Build); 14] = [
        ("governor-keyed", || Box::new(governor())),
        ("governor-all-allowed", || Box::new(governor_every(true))),
        ("fixed-window-all-allowed", || Box::new(fixed_window_every(true))),
        ("governor-all-denied", || Box::new(governor_every(false))),
        ("fixed-window-all-denied", || Box::new(fixed_window_every(false))),
        ("port-floor", || Box::new(port_floor())),
        ("fixed-window", || {
            Box::new(ours(
                Algorithm::FixedWindow(shared_contract::FixedWindow {
                    limit: PER_SECOND,
                    window: WINDOW,
                }),
                EvaluationDedupPolicy::Disabled,
            ))
        }),
        ("sliding-counter", || {
            Box::new(ours(
                Algorithm::SlidingCounter(shared_contract::SlidingCounter {
                    limit: PER_SECOND,
                    window: WINDOW,
                }),
                EvaluationDedupPolicy::Disabled,
            ))
        }),
        ("token-bucket", || {
            Box::new(ours(
                Algorithm::TokenBucket(shared_contract::TokenBucket {
                    capacity: PER_SECOND,
                    refill_tokens: 1,
                    refill_period: WINDOW / u32::try_from(PER_SECOND).expect("fits"),
                }),
                EvaluationDedupPolicy::Disabled,
            ))
        }),
        // The same quota as governor's: 100 per second, a burst of 100.
        ("gcra", || {
            Box::new(ours(
                Algorithm::Gcra(shared_contract::Gcra {
                    limit: PER_SECOND,
                    period: WINDOW,
                    burst: PER_SECOND,
                }),
                EvaluationDedupPolicy::Disabled,
            ))
        }),
        ("fixed-window+dedupe", || {
            Box::new(ours(
                Algorithm::FixedWindow(shared_contract::FixedWindow {
                    limit: PER_SECOND,
                    window: WINDOW,
                }),
                EvaluationDedupPolicy::enabled_defaults(),
            ))
        }),
        // 100 in flight per subject, each released at once: never refused.
        ("concurrency+release", || {
            Box::new(Leasing(ours(
                Algorithm::Concurrency(shared_contract::Concurrency {
                    max_in_flight: PER_SECOND,
                    lease_ttl: Duration::from_secs(30),
                    retry_after: WINDOW,
                }),
                EvaluationDedupPolicy::Disabled,
            )))
        }),
        ("hot-at-cap", || Box::new(hot(EvaluationDedupPolicy::Disabled))),
        ("hot-at-cap+dedupe", || Box::new(hot(EvaluationDedupPolicy::enabled_defaults()))),
    ];
    for (name, build) in contenders {
        let contender = build();
        let mut group = c.benchmark_group(name);
        for threads in [1, 2] {
            let mix = Mix::default();
            group.bench_function(format!("{threads}-thread"), |b| {
                b.iter_custom(|iters| run(contender.as_ref(), &mix, iters, threads));
            });
            mix.report(&format!("{name} {threads}-thread"));
        }
        group.finish();
    }
}

criterion_group!(benches, decisions);
criterion_main!(benches);
