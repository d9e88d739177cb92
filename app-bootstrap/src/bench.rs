//! `ca-skeleton bench`: drives the configured provider through the port
//! with N concurrent callers over M subjects for a while, and reports one
//! JSON line (docs/benchmarks.md). It measures the provider, not HTTP.
//! Under a concurrency policy each admitted decision's lease is released
//! before the caller's next decision, as a request of no duration would
//! (the release is not in the latency).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngCore;
use serde::Serialize;
use shared_contract::{
    Clock, EdgeRateLimitPort, EvaluationId, Lease, OperationDigest, PolicyId, PolicySet,
    RateLimitOutcome, RateLimitOutcomeExt, RateLimitRequest, SubjectDigest, SystemClock,
};

use crate::capability::RateLimitCapability;
use crate::config::AppConfig;
use crate::error::BootstrapError;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Concurrent callers.
    pub concurrency: usize,
    /// Distinct subjects the callers spread over.
    pub subjects: usize,
    /// How long to run.
    pub duration: Duration,
    /// The policy to evaluate; `None` means the default policy set.
    pub policy: Option<String>,
    /// The runtime flavor it runs on (reported as given).
    pub runtime: &'static str,
}

/// The one JSON line `bench` prints.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// `memory` or `redis`.
    pub provider: String,
    /// The tokio runtime flavor: `multi-thread` or `current-thread`.
    pub runtime: &'static str,
    /// The algorithms of the policies evaluated, joined by `+`.
    pub algorithm: String,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Distinct subjects.
    pub subjects: usize,
    /// Evaluations completed.
    pub decisions: u64,
    /// Evaluations per second of wall time.
    pub decisions_per_sec: f64,
    /// Median evaluation latency in microseconds.
    pub p50_us: f64,
    /// 99th percentile evaluation latency in microseconds.
    pub p99_us: f64,
    /// Allowed decisions.
    pub allowed: u64,
    /// Denied decisions.
    pub denied: u64,
    /// Count by outcome category (`allowed`, `denied`, failure categories).
    pub outcomes: BTreeMap<&'static str, u64>,
}

/// Runs the load generator against the configured provider.
pub async fn run(
    config: &AppConfig,
    options: &BenchOptions,
) -> Result<BenchReport, BootstrapError> {
    if options.concurrency == 0 || options.subjects == 0 {
        return Err(BootstrapError::Usage(
            "--concurrency and --subjects must be at least 1".into(),
        ));
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (provider, port) = match RateLimitCapability::build(config, Arc::clone(&clock))? {
        RateLimitCapability::Enabled { provider, port, .. } => (provider, port),
        RateLimitCapability::Disabled => {
            return Err(BootstrapError::Usage(
                "bench needs a provider, but capabilities.rate-limit.provider is \"disabled\""
                    .into(),
            ));
        }
    };
    let rate_limit = &config.capabilities.rate_limit;
    // One named policy, or the default policy set as configured.
    let names = match &options.policy {
        Some(name) => vec![name.clone()],
        None => rate_limit.default_policy.clone(),
    };
    let mut ids = Vec::with_capacity(names.len());
    let mut algorithms = Vec::with_capacity(names.len());
    let mut holds_leases = false;
    for name in &names {
        let id = PolicyId::new(name.as_str())
            .map_err(|error| BootstrapError::Usage(format!("--policy {name:?}: {error}")))?;
        let Some(policy) = port.policy(&id) else {
            let defined = rate_limit.policies.keys().cloned().collect::<Vec<_>>().join(", ");
            return Err(BootstrapError::Usage(format!(
                "--policy {name:?} is not configured (defined: {defined})"
            )));
        };
        algorithms.push(policy.algorithm().name());
        holds_leases |= policy.algorithm().holds_leases();
        ids.push(id);
    }
    let policies = PolicySet::new(ids)
        .map_err(|error| BootstrapError::Usage(format!("the policy set: {error}")))?;
    let algorithm = algorithms.join("+");
    // Every decision names one operation, as one route's traffic would.
    let operation = OperationDigest::from_u64(BENCH_OPERATION);
    let subjects = Arc::new(subjects(options.subjects));

    let started = Instant::now();
    let end = started + options.duration;
    let mut callers = Vec::with_capacity(options.concurrency);
    for caller in 0..options.concurrency {
        let job = Caller {
            port: Arc::clone(&port),
            clock: Arc::clone(&clock),
            policies: policies.clone(),
            operation,
            subjects: Arc::clone(&subjects),
            first_subject: caller,
            stride: options.concurrency,
            budget: rate_limit.edge.evaluation_budget,
            end,
            holds_leases,
        };
        callers.push(tokio::spawn(job.run()));
    }
    let mut total = Tally::default();
    for caller in callers {
        let tally = caller
            .await
            .map_err(|error| BootstrapError::Usage(format!("a bench caller failed: {error}")))?;
        total.merge(&tally);
    }
    let elapsed = started.elapsed().as_secs_f64();

    let decisions = total.latency.count();
    Ok(BenchReport {
        provider: provider.name(),
        runtime: options.runtime,
        algorithm,
        concurrency: options.concurrency,
        subjects: options.subjects,
        decisions,
        decisions_per_sec: round(decisions as f64 / elapsed.max(f64::EPSILON), 1),
        p50_us: round(total.latency.quantile(0.50) as f64 / 1_000.0, 3),
        p99_us: round(total.latency.quantile(0.99) as f64 / 1_000.0, 3),
        allowed: total.outcomes.get("allowed").copied().unwrap_or(0),
        denied: total.outcomes.get("denied").copied().unwrap_or(0),
        outcomes: total.outcomes,
    })
}

/// The operation digest every bench decision carries.
const BENCH_OPERATION: u64 = 0xbec;

/// Synthetic pseudonyms with a per-run salt, so a second run against the
/// same Redis starts from fresh counters.
fn subjects(count: usize) -> Vec<SubjectDigest> {
    let salt = rand::rng().next_u64();
    (0..count as u64)
        .map(|index| {
            SubjectDigest::parse(format!("v1:{salt:016x}{index:016x}"))
                .expect("32 lowercase hex digits form a valid digest")
        })
        .collect()
}

fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10_f64.powi(decimals);
    (value * scale).round() / scale
}

struct Caller {
    port: Arc<dyn EdgeRateLimitPort>,
    clock: Arc<dyn Clock>,
    policies: PolicySet,
    operation: OperationDigest,
    subjects: Arc<Vec<SubjectDigest>>,
    first_subject: usize,
    stride: usize,
    budget: Duration,
    end: Instant,
    /// A policy of the set is a concurrency policy: admitted decisions
    /// hold a lease to give back.
    holds_leases: bool,
}

impl Caller {
    /// Evaluates until `end`, walking the subjects with a stride so the
    /// callers together cover them evenly.
    async fn run(self) -> Tally {
        let mut tally = Tally::default();
        let mut next = self.first_subject % self.subjects.len();
        let mut calls: u64 = 0;
        while Instant::now() < self.end {
            let request = RateLimitRequest {
                policies: self.policies.clone().into(),
                subject: self.subjects[next],
                operation: self.operation,
                cost: 1,
                evaluation_id: EvaluationId::random(),
                deadline: self.clock.monotonic() + self.budget,
            };
            let lease = self.holds_leases.then(|| Lease::of(&request));
            let asked = Instant::now();
            let outcome = self.port.evaluate(request).await;
            tally.latency.record(u64::try_from(asked.elapsed().as_nanos()).unwrap_or(u64::MAX));
            tally.count(&outcome);
            if let Some(lease) = lease.filter(|_| outcome.is_allowed()) {
                self.port.release(&lease).await;
            }
            next = (next + self.stride) % self.subjects.len();
            // A provider that answers without waiting (memory) never makes
            // this task yield: without a turn given back now and then, the
            // first callers would hold every worker to the end and the
            // others (and their subjects) would never run.
            calls += 1;
            if calls % YIELD_EVERY == 0 {
                tokio::task::yield_now().await;
            }
        }
        tally
    }
}

/// Decisions a caller makes between two turns it gives back to the runtime.
const YIELD_EVERY: u64 = 64;

#[derive(Debug, Default)]
struct Tally {
    latency: LatencyHistogram,
    outcomes: BTreeMap<&'static str, u64>,
}

impl Tally {
    fn count(&mut self, outcome: &RateLimitOutcome) {
        *self.outcomes.entry(outcome.category_name()).or_default() += 1;
    }

    fn merge(&mut self, other: &Self) {
        self.latency.merge(&other.latency);
        for (category, count) in &other.outcomes {
            *self.outcomes.entry(category).or_default() += count;
        }
    }
}

/// Values below 2^SUB_BITS (64 ns) are exact; above, each doubling splits
/// into HALF (32) buckets: about 3 % relative error, plenty for p50/p99,
/// in a fixed 15 KiB per caller.
const SUB_BITS: u32 = 6;
const HALF: u64 = 1 << (SUB_BITS - 1);
/// The largest shift is `63 - (SUB_BITS - 1)`; its top bucket is the last.
const BUCKETS: usize = (64 - SUB_BITS as usize + 2) * HALF as usize;

/// A log-linear histogram of nanoseconds: exact below 64 ns, then 32
/// buckets per doubling.
#[derive(Debug, Clone)]
pub(crate) struct LatencyHistogram {
    counts: Vec<u64>,
    total: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self { counts: vec![0; BUCKETS], total: 0 }
    }
}

impl LatencyHistogram {
    pub(crate) fn record(&mut self, nanos: u64) {
        self.counts[bucket_of(nanos)] += 1;
        self.total += 1;
    }

    pub(crate) fn count(&self) -> u64 {
        self.total
    }

    pub(crate) fn merge(&mut self, other: &Self) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
    }

    /// The value at quantile `q` (0..=1): the midpoint of the bucket that
    /// holds the sample of rank `ceil(q * total)`; 0 when empty.
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let (low, high) = bounds_of(bucket);
                return low + (high - low) / 2;
            }
        }
        unreachable!("the counts add up to the total")
    }
}

fn bucket_of(value: u64) -> usize {
    if value < (1 << SUB_BITS) {
        return value as usize;
    }
    let top_bit = 63 - value.leading_zeros();
    let shift = top_bit - (SUB_BITS - 1);
    // `value >> shift` keeps the top SUB_BITS bits: HALF ..< 2 * HALF.
    (u64::from(shift) * HALF + (value >> shift)) as usize
}

/// Smallest and largest value of a bucket.
fn bounds_of(bucket: usize) -> (u64, u64) {
    let bucket = bucket as u64;
    if bucket < (1 << SUB_BITS) {
        return (bucket, bucket);
    }
    let shift = bucket / HALF - 1;
    let top = bucket - shift * HALF;
    (top << shift, (top << shift) + ((1 << shift) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact_and_buckets_are_contiguous() {
        for value in 0..64 {
            assert_eq!(bounds_of(bucket_of(value)), (value, value));
        }
        // Every value lies inside its bucket's bounds and buckets never skip.
        let mut previous = bucket_of(63);
        for value in [64, 65, 127, 128, 129, 1_000, 65_535, 1 << 40, u64::MAX] {
            let bucket = bucket_of(value);
            let (low, high) = bounds_of(bucket);
            assert!(low <= value && value <= high, "{value} outside {low}..={high}");
            assert!(bucket >= previous);
            previous = bucket;
        }
        assert_eq!(bucket_of(64), 64);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn relative_error_stays_within_one_sub_bucket() {
        for value in [100_u64, 1_234, 98_765, 5_000_000, 123_456_789] {
            let (low, high) = bounds_of(bucket_of(value));
            assert!(
                (high - low) as f64 / low as f64 <= 1.0 / HALF as f64,
                "{value}: {low}..={high}"
            );
        }
    }

    #[test]
    fn quantiles_pick_the_bucket_of_the_ranked_sample() {
        let mut histogram = LatencyHistogram::default();
        for value in 1..=100 {
            histogram.record(value);
        }
        assert_eq!(histogram.count(), 100);
        // Rank 50 is the value 50, exact below 64.
        assert_eq!(histogram.quantile(0.50), 50);
        // Rank 99 is 99, in the bucket 98..=99 (shift 1).
        assert_eq!(bounds_of(bucket_of(99)), (98, 99));
        assert_eq!(histogram.quantile(0.99), 98);
        let mut other = LatencyHistogram::default();
        other.record(1);
        histogram.merge(&other);
        assert_eq!(histogram.count(), 101);
        assert_eq!(LatencyHistogram::default().quantile(0.5), 0);
    }
}
