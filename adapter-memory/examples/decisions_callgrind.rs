//! Instructions per memory decision, for `valgrind --tool=callgrind`: the
//! keys of 10,000 subjects are stored first, then `N` fixed-window
//! decisions run over them through the port, each answer taken at once as
//! the fronts take it. Run it at two `N` and divide the difference of the
//! totals by the difference of the `N`s: the set-up cancels out.
//!
//! ```text
//! cargo build --release -p adapter-memory --example decisions_callgrind
//! valgrind --tool=callgrind target/release/examples/decisions_callgrind 10000 [dedupe|floor]
//! valgrind --tool=callgrind target/release/examples/decisions_callgrind 60000 [dedupe|floor]
//! ```
//!
//! `dedupe` turns evaluation dedupe on (its defaults); `floor` asks for a
//! policy the provider does not hold (the port floor: no store).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adapter_memory::MemoryEdgeRateLimitAdapter;
use shared_contract::{
    Algorithm, EdgeRateLimitPort, EvaluationDedupPolicy, EvaluationId, FixedWindow,
    OperationDigest, PolicyId, PolicySet, RateLimitOutcomeExt, RateLimitPolicy, RateLimitRequest,
    SubjectDigest, SystemClock,
};
use uuid::Uuid;

const SUBJECTS: usize = 10_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let decisions: usize = args.next().and_then(|n| n.parse().ok()).expect("N, the decisions");
    let mode = args.next().unwrap_or_default();
    let dedup = match mode.as_str() {
        "dedupe" => EvaluationDedupPolicy::enabled_defaults(),
        _ => EvaluationDedupPolicy::Disabled,
    };
    let window = Algorithm::FixedWindow(FixedWindow { limit: 100, window: Duration::from_secs(1) });
    let policy = RateLimitPolicy::builder("bench", window).evaluation_dedup(dedup).build();
    let adapter = MemoryEdgeRateLimitAdapter::new([policy.expect("valid")], Arc::new(SystemClock))
        .expect("one policy");
    let asked = if mode == "floor" { "other" } else { "bench" };
    let policies = PolicySet::single(PolicyId::new(asked).expect("valid id"));
    let operation = OperationDigest::from_u64(0xaa);
    let subjects: Vec<SubjectDigest> = (0..SUBJECTS)
        .map(|n| SubjectDigest::parse(format!("v1:{n:032x}")).expect("valid digest"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut allowed = 0_u64;
    for (n, index) in (0..SUBJECTS).chain(0..decisions).enumerate() {
        let request = RateLimitRequest {
            policies: (&policies).into(),
            subject: subjects[index % SUBJECTS],
            operation,
            cost: 1,
            evaluation_id: EvaluationId::from_uuid(Uuid::from_u128(n as u128)),
            deadline,
        };
        let answer = adapter.evaluate(request).into_ready();
        allowed += u64::from(answer.expect("the memory provider never waits").is_allowed());
    }
    println!("{allowed} of {} allowed", SUBJECTS + decisions);
    black_box(allowed);
}
