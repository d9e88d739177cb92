//! The clock-regression bound `R` (docs/algorithms.md, step 3): a key keeps
//! the highest time `M` it was written at; `M - t > R` is
//! `Unavailable(ClockUnsafe, retry_after = M - t - R)` with nothing changed,
//! otherwise the evaluation runs at `t := max(t, M)`.

use std::time::Duration;

use shared_contract::{EvaluationId, RateLimitFailure, RateLimitOutcome, UnavailableCategory};

use crate::factory::ProviderFactory;
use crate::rig::{
    CheckPolicy, Rig, concurrency, fixed_window, gcra, ms, sliding_counter, token_bucket,
};

const BOUND: Duration = Duration::from_millis(500);

fn clock_unsafe(retry_ms: u64) -> RateLimitOutcome {
    Err(RateLimitFailure::Unavailable {
        category: UnavailableCategory::ClockUnsafe,
        retry_after: ms(retry_ms),
    })
}

/// A wall clock that steps back within the bound is treated as the key's
/// mark: the charge lands in the window of the mark, not of the lagging
/// clock.
pub async fn clock_regression_within_the_bound_uses_the_mark(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000).maximum_clock_regression(BOUND));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(1100);
    // ws = T0 + 1000, reset = 2000 - 1100 = 900. Mark M = T0 + 1100.
    rig.expect("charge at 1100", &fw, "alice", 1, fw.allowed(2, 900)).await;
    rig.at(900);
    // M - t = 200 <= 500: t := T0 + 1100, the same window, reset 900 (at
    // face value it would be window T0 with n = 0 and reset 100).
    rig.expect("clock 200 ms behind", &fw, "alice", 1, fw.allowed(1, 900)).await;
    rig.at(600);
    // M - t = 500 is not > 500: still inside the bound.
    rig.expect("clock exactly at the bound", &fw, "alice", 1, fw.allowed(0, 900)).await;
    rig.expect("denied at the mark", &fw, "alice", 1, fw.denied(0, 900, 900)).await;
    rig.at(1999);
    rig.expect("forward again", &fw, "alice", 1, fw.denied(0, 1, 1)).await;
    rig.at(2000);
    rig.expect("next window", &fw, "alice", 1, fw.allowed(2, 1000)).await;
}

/// The mark applies to the sliding counter, the token bucket and GCRA too.
pub async fn clock_regression_within_the_bound_applies_to_every_algorithm(
    factory: &dyn ProviderFactory,
) {
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000).maximum_clock_regression(BOUND));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100).maximum_clock_regression(BOUND));
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5).maximum_clock_regression(BOUND));
    let cc = CheckPolicy::new(concurrency("cc", 3, 1000, 400).maximum_clock_regression(BOUND));
    let rig = Rig::start(factory, &[&sc, &tb, &g, &cc]).await;
    rig.at(1100);
    // cc: a lease until T0 + 1100 + 1000 + 500 (lease-ttl + R) = T0 + 2600.
    rig.expect("cc at 1100", &cc, "alice", 1, cc.allowed(2, 0)).await;
    // g: T = 100 ms; tat := T0 + 1200: remaining 4, reset 100.
    rig.expect("g at 1100", &g, "alice", 1, g.allowed(4, 100)).await;
    // sc: p = 0, est 0 -> 1: remaining 9, reset 2000 - 1100 = 900.
    rig.expect("sc at 1100", &sc, "alice", 1, sc.allowed(9, 900)).await;
    // tb: a new bucket with updated_at = T0 + 1100: remaining 4, reset 100.
    rig.expect("tb at 1100", &tb, "alice", 1, tb.allowed(4, 100)).await;
    rig.at(900);
    // t := T0 + 1100. sc: same window, est 1 -> 2: remaining 8, reset 900.
    rig.expect("sc 200 ms behind", &sc, "alice", 1, sc.allowed(8, 900)).await;
    // tb: k = 0, tokens 4 -> 3: reset = T0 + 1100 + 2 * 100 - (T0 + 1100) = 200.
    rig.expect("tb 200 ms behind", &tb, "alice", 1, tb.allowed(3, 200)).await;
    // g: t := T0 + 1100, d = 100000 -> 200000: remaining 3, reset 100.
    rig.expect("g 200 ms behind", &g, "alice", 1, g.allowed(3, 100)).await;
    // cc: t := T0 + 1100, so this lease too lasts until T0 + 2600, not 2400.
    rig.expect("cc 200 ms behind", &cc, "alice", 1, cc.allowed(1, 0)).await;
    rig.at(1150);
    // sc: est = 0 + 2 -> 3: remaining 7, reset 850.
    rig.expect("sc ahead again", &sc, "alice", 1, sc.allowed(7, 850)).await;
    // tb: k = floor(50 / 100) = 0, tokens 3 -> 2: reset = T0 + 1100 + 300 - (T0 + 1150) = 250.
    rig.expect("tb ahead again", &tb, "alice", 1, tb.allowed(2, 250)).await;
    // g: d = 1300 - 1150 = 150 ms -> 250 ms: remaining 2, reset 250 - 200 = 50.
    rig.expect("g ahead again", &g, "alice", 1, g.allowed(2, 50)).await;
    // cc: a third lease until T0 + 2650.
    rig.expect("cc ahead again", &cc, "alice", 1, cc.allowed(0, 0)).await;
    rig.at(2599);
    rig.expect("cc: every lease still held", &cc, "alice", 1, cc.denied(0, 400, 0)).await;
    rig.at(2600);
    // The two leases of t = T0 + 1100 are gone; the one of T0 + 1150 is not.
    rig.expect("cc: two expired", &cc, "alice", 1, cc.allowed(1, 0)).await;
}

/// Beyond the bound every algorithm answers `ClockUnsafe` with the wait
/// until the clock is back within it, and changes nothing: back at the
/// right time the counts are as before, and the evaluation id is unused.
pub async fn clock_regression_beyond_the_bound_is_clock_unsafe_and_mutates_nothing(
    factory: &dyn ProviderFactory,
) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000).maximum_clock_regression(BOUND));
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000).maximum_clock_regression(BOUND));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100).maximum_clock_regression(BOUND));
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5).maximum_clock_regression(BOUND));
    let cc = CheckPolicy::new(concurrency("cc", 3, 30_000, 1000).maximum_clock_regression(BOUND));
    let policies = [&fw, &sc, &tb, &g, &cc];
    let rig = Rig::start(factory, &policies).await;
    rig.at(1100);
    rig.expect("cc at 1100", &cc, "alice", 1, cc.allowed(2, 0)).await;
    rig.expect("fw at 1100", &fw, "alice", 1, fw.allowed(2, 900)).await;
    rig.expect("sc at 1100", &sc, "alice", 1, sc.allowed(9, 900)).await;
    rig.expect("tb at 1100", &tb, "alice", 1, tb.allowed(4, 100)).await;
    rig.expect("g at 1100", &g, "alice", 1, g.allowed(4, 100)).await;
    let ids = [
        EvaluationId::random(),
        EvaluationId::random(),
        EvaluationId::random(),
        EvaluationId::random(),
        EvaluationId::random(),
    ];
    rig.at(599);
    // M - t = 1100 - 599 = 501 > 500: retry = 501 - 500 = 1.
    for (policy, id) in policies.iter().zip(ids) {
        rig.expect_id("1 ms beyond the bound", policy, "alice", 1, id, clock_unsafe(1)).await;
    }
    rig.at(100);
    // M - t = 1000: retry = 1000 - 500 = 500.
    for (policy, id) in policies.iter().zip(ids) {
        rig.expect_id("far behind", policy, "alice", 1, id, clock_unsafe(500)).await;
    }
    rig.at(1100);
    // Unchanged state, and the ids were never recorded, so they charge:
    // fw n = 2; sc est 1 -> 2; tb k = 0, tokens 4 -> 3, reset 200; g d =
    // 100 ms -> 200 ms, remaining 3, reset 100.
    let [fw_id, sc_id, tb_id, g_id, cc_id] = ids;
    rig.expect_id("fw back", &fw, "alice", 1, fw_id, fw.allowed(1, 900)).await;
    rig.expect_id("sc back", &sc, "alice", 1, sc_id, sc.allowed(8, 900)).await;
    rig.expect_id("tb back", &tb, "alice", 1, tb_id, tb.allowed(3, 200)).await;
    rig.expect_id("g back", &g, "alice", 1, g_id, g.allowed(3, 100)).await;
    // cc: still one lease held, and the id took none: a second one now.
    rig.expect_id("cc back", &cc, "alice", 1, cc_id, cc.allowed(1, 0)).await;
}

/// The clock bound is checked before the dedupe records are read: a repeat
/// from a clock beyond the bound is `ClockUnsafe`, not a replay.
pub async fn clock_regression_is_checked_before_replay(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000).maximum_clock_regression(BOUND));
    let rig = Rig::start(factory, &[&fw]).await;
    let x = EvaluationId::random();
    rig.at(1100);
    rig.expect_id("charge", &fw, "alice", 1, x, fw.allowed(2, 900)).await;
    rig.at(100);
    // M - t = 1000 > 500: retry = 500.
    rig.expect_id("repeat from far behind", &fw, "alice", 1, x, clock_unsafe(500)).await;
    rig.at(600);
    // M - t = 500: within the bound, t := T0 + 1100, and the record replays.
    rig.expect_id("repeat within the bound", &fw, "alice", 1, x, fw.replayed(2, 900)).await;
}
