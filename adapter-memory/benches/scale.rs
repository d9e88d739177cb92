//! How the memory provider's cost grows with the subjects it holds, beside
//! `governor`'s keyed limiter. Two parts, one line of
//! output per figure, each line a space-separated record that
//! `scripts/bench.sh` reads:
//!
//! - `decisions <contender> <subjects> <per_sec> <p50_ns> <p99_ns> <allowed_pct> <per_cpu_sec>`:
//!   one thread deciding over 1,000 / 100,000 / 1,000,000 subjects in a
//!   fixed pseudo-random order, after a warm-up that decides once for every
//!   subject (so the store already holds them all). Decisions/s is the count
//!   over the wall time; per CPU second is the count over the thread's time
//!   on a CPU (`/proc/thread-self/schedstat`), which other processes'
//!   load does not move. The latency is sampled: each batch of 64 decisions
//!   is timed with `Instant` and its mean recorded, so p50/p99 are
//!   percentiles of 64-decision means (one clock read per 64 decisions keeps
//!   the timer out of the figure; a lone slow decision shows diluted 64x).
//! - `rss <contender> <subjects> <bytes_per_subject>`: one child process per
//!   contender (this binary again, so no contender's freed memory is
//!   another's), resident set size (`/proc/self/statm`) before and after one
//!   decision for each of 1,000,000 subjects, the growth divided by the
//!   subjects. The subjects and the limiter are built before the first
//!   reading: the figure is what the limiter keeps per subject.
//!
//! Ours goes through the public port as `benches/decisions.rs` does:
//! pseudonyms shaped like the edge's (`v1:` and 64 hex digits), 100 units
//! per subject per second; governor has the same quota (a burst of 100)
//! keyed by the pseudonym's `String`. Our windows are a day (8,640,000
//! units in a fixed window, GCRA's 100/s with a burst of 100, leases
//! living a day; fixed windows end at multiples of their length since the
//! epoch, so a shorter one could end mid-run): governor never forgets a
//! key, and with a 1 s window the store
//! would sweep subjects not seen for a second, so at 1,000,000 subjects it
//! would hold a fraction of them (a first RSS run showed 46 bytes per
//! subject from exactly that). GCRA's state lives only until its
//! theoretical arrival time, a moment after a decision at 100/s, so the
//! RSS child measures GCRA at one unit per day with a burst of 100: the
//! same state, held for the whole run.
//!
//! `cargo bench -p adapter-memory --bench scale`; env: `SCALE_SECS` (seconds
//! per case, 3), `SCALE_SUBJECTS` (comma-separated counts,
//! `1000,100000,1000000`), `SCALE_RSS_SUBJECTS` (1000000), `SCALE_PART`
//! (`decisions`, `rss` or both when unset).

use std::hint::black_box;
use std::num::{NonZeroU32, NonZeroUsize};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adapter_memory::{MemoryEdgeRateLimitAdapter, MemoryStore};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, Lease, OperationDigest,
    PolicyId, PolicySet, PortAnswer, RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest,
    ReleaseOutcome, SubjectDigest, SystemClock,
};
use uuid::Uuid;

/// Units per subject per second in every policy, ours and governor's.
const PER_SECOND: u64 = 100;
const BATCH: u32 = 64;
/// The child process's variable: the contender whose RSS it measures.
const RSS_CHILD: &str = "SCALE_RSS_CHILD";

const CONTENDERS: [&str; 5] =
    ["governor-keyed", "fixed-window", "fixed-window+dedupe", "gcra", "concurrency+release"];

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn count(text: &str) -> usize {
    text.trim().parse().unwrap_or_else(|_| panic!("not a count: {text:?}"))
}

/// Text shaped like the edge's pseudonyms: `v1:` and 64 hex digits.
fn pseudonym(n: usize) -> String {
    let n = n as u64;
    let mixed = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("v1:{mixed:032x}{n:032x}")
}

/// Built without an intermediate collection: memory freed before the RSS
/// reading would be reused by the fill and hide part of its growth.
fn subjects(count: usize) -> Vec<SubjectDigest> {
    (0..count).map(|n| SubjectDigest::parse(pseudonym(n)).expect("valid digest")).collect()
}

/// The provider never waits: its answer is there at once.
fn now<T>(answer: PortAnswer<T>) -> T {
    answer.into_ready().unwrap_or_else(|_| panic!("the memory provider never waits"))
}

/// One contender: decides for subject `index` and says whether it allowed.
trait Contender {
    fn decide(&self, index: usize, evaluation: u128) -> bool;
}

struct Ours {
    adapter: MemoryEdgeRateLimitAdapter,
    policy: PolicySet,
    operation: OperationDigest,
    subjects: Vec<SubjectDigest>,
    deadline: Instant,
    /// A concurrency policy: each decision takes a lease and gives it back.
    leasing: bool,
}

impl Contender for Ours {
    fn decide(&self, index: usize, evaluation: u128) -> bool {
        let request = RateLimitRequest {
            policies: self.policy.clone().into(),
            subject: self.subjects[index],
            operation: self.operation,
            cost: 1,
            evaluation_id: EvaluationId::from_uuid(Uuid::from_u128(evaluation)),
            deadline: self.deadline,
        };
        if !self.leasing {
            return now(self.adapter.evaluate(request)).is_allowed();
        }
        let lease = Lease::of(&request);
        let allowed = now(self.adapter.evaluate(request)).is_allowed();
        let released = now(self.adapter.release(&lease));
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

/// `held`: GCRA at one unit per window, so its state outlives the fill.
fn build(name: &str, count: usize, held: bool) -> Box<dyn Contender> {
    let window = Duration::from_secs(24 * 3600);
    let limit = PER_SECOND * window.as_secs();
    let (algorithm, dedup) = match name {
        "governor-keyed" => {
            let burst = NonZeroU32::new(u32::try_from(PER_SECOND).expect("fits")).expect("> 0");
            let keys = (0..count).map(pseudonym).collect();
            return Box::new(Governor {
                limiter: RateLimiter::keyed(Quota::per_second(burst)),
                keys,
            });
        }
        "fixed-window" => (
            Algorithm::FixedWindow(shared_contract::FixedWindow { limit, window }),
            EvaluationDedupPolicy::Disabled,
        ),
        "fixed-window+dedupe" => (
            Algorithm::FixedWindow(shared_contract::FixedWindow { limit, window }),
            EvaluationDedupPolicy::enabled_defaults(),
        ),
        // The same quota as governor's: 100 per second, a burst of 100.
        "gcra" => (
            Algorithm::Gcra(shared_contract::Gcra {
                limit: if held { 1 } else { limit },
                period: window,
                burst: PER_SECOND,
            }),
            EvaluationDedupPolicy::Disabled,
        ),
        // 100 in flight per subject, each released at once: never refused.
        "concurrency+release" => (
            Algorithm::Concurrency(shared_contract::Concurrency {
                max_in_flight: PER_SECOND,
                lease_ttl: window,
                retry_after: Duration::from_secs(1),
            }),
            EvaluationDedupPolicy::Disabled,
        ),
        other => panic!("no contender {other:?}"),
    };
    let policy = RateLimitPolicy::builder("bench", algorithm)
        .evaluation_dedup(dedup)
        .build()
        .expect("valid policy");
    // A bound that holds every subject: this measures decisions, not
    // refusals of a full store.
    let store = MemoryStore::with_max_keys(NonZeroUsize::new(count.max(1)).expect("at least 1"));
    let adapter = MemoryEdgeRateLimitAdapter::with_store(store, [policy], Arc::new(SystemClock))
        .expect("adapter builds");
    Box::new(Ours {
        adapter,
        policy: PolicySet::single(PolicyId::new("bench").expect("valid id")),
        operation: OperationDigest::from_u64(0x0000_0000_0000_00aa),
        subjects: subjects(count),
        deadline: Instant::now() + Duration::from_secs(24 * 3600),
        leasing: name == "concurrency+release",
    })
}

/// xorshift64: a cheap, fixed pseudo-random subject order, the same for
/// every contender.
fn next_index(state: &mut u64, count: usize) -> usize {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state % count as u64) as usize
}

/// Evaluation ids never repeat within a process, so dedupe always charges.
struct Ids(u128);

impl Ids {
    fn next(&mut self) -> u128 {
        self.0 += 1;
        self.0
    }
}

fn warm(contender: &dyn Contender, count: usize, ids: &mut Ids) {
    for index in 0..count {
        black_box(contender.decide(index, ids.next()));
    }
}

/// Nanoseconds this thread has run on a CPU (schedstat's first field).
fn thread_cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat (Linux)");
    stat.split_whitespace().next().and_then(|v| v.parse().ok()).expect("schedstat's run time")
}

fn decisions(name: &str, count: usize, secs: u64) {
    let contender = build(name, count, false);
    let mut ids = Ids(0);
    warm(contender.as_ref(), count, &mut ids);
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut means = Vec::with_capacity(1 << 20);
    let (mut allowed, mut total) = (0_u64, 0_u64);
    let cpu_started = thread_cpu_ns();
    let started = Instant::now();
    let end = started + Duration::from_secs(secs);
    loop {
        let batch = Instant::now();
        if batch >= end {
            break;
        }
        for _ in 0..BATCH {
            let index = next_index(&mut state, count);
            allowed += u64::from(black_box(contender.decide(index, ids.next())));
        }
        means.push(batch.elapsed().as_nanos() / u128::from(BATCH));
        total += u64::from(BATCH);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let on_cpu = thread_cpu_ns().saturating_sub(cpu_started).max(1) as f64 / 1e9;
    means.sort_unstable();
    let at = |q: f64| means[((means.len() as f64 * q) as usize).min(means.len() - 1)];
    let percent = 100.0 * allowed as f64 / total as f64;
    println!(
        "decisions {name} {count} {:.0} {} {} {percent:.1} {:.0}",
        total as f64 / elapsed,
        at(0.50),
        at(0.99),
        total as f64 / on_cpu
    );
}

/// Resident set size in bytes: `/proc/self/statm`'s second field in pages
/// (4 KiB on every Linux this runs on; `getconf PAGESIZE` would need libc).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm (Linux)");
    let pages: u64 =
        statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("statm's resident");
    pages * 4096
}

fn rss_child(name: &str, count: usize) {
    let contender = build(name, count, true);
    let mut ids = Ids(0);
    let before = resident_bytes();
    warm(contender.as_ref(), count, &mut ids);
    let after = resident_bytes();
    black_box(&contender);
    let per_subject = after.saturating_sub(before) as f64 / count as f64;
    println!("rss {name} {count} {per_subject:.1}");
}

fn main() {
    let rss_subjects = count(&env_or("SCALE_RSS_SUBJECTS", "1000000"));
    if let Ok(name) = std::env::var(RSS_CHILD) {
        rss_child(&name, rss_subjects);
        return;
    }
    let part = std::env::var("SCALE_PART").ok();
    let secs = count(&env_or("SCALE_SECS", "3")) as u64;
    if part.as_deref() != Some("rss") {
        let counts = env_or("SCALE_SUBJECTS", "1000,100000,1000000");
        for subjects in counts.split(',').map(count) {
            for name in CONTENDERS {
                decisions(name, subjects, secs);
            }
        }
    }
    if part.as_deref() != Some("decisions") {
        let exe = std::env::current_exe().expect("this binary's path");
        for name in CONTENDERS {
            let status =
                Command::new(&exe).env(RSS_CHILD, name).status().expect("the RSS child starts");
            assert!(status.success(), "the RSS child for {name} failed: {status}");
        }
    }
}
