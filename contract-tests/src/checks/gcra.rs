//! GCRA checks (docs/algorithms.md, "GCRA"): in whole microseconds,
//! `T = ceil(1000 P / L)`, `d = max(tat, u) - u`; a cost `c` conforms iff
//! `d + c T <= b T`, then `tat := max(tat, u) + c T`; `remaining =
//! floor((b T - d') / T)`, `reset_after` when the next cell beyond them
//! conforms, `retry_after = ceil((d + c T - b T) / 1000)` ms; a denial or
//! a spared run writes nothing.

use std::time::Duration;

use shared_contract::{EvaluationId, RateLimitFailure, UnavailableCategory};

use crate::factory::ProviderFactory;
use crate::rig::{CheckPolicy, Rig, fixed_window, gcra, set_outcome};

/// `L = 10` per second, `b = 5`: five at once, then one per `T = 100 ms`.
pub async fn gcra_allows_the_burst_then_one_cell_per_interval(factory: &dyn ProviderFactory) {
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5));
    let rig = Rig::start(factory, &[&g]).await;
    rig.at(0);
    // d' = 100000 k: remaining 5 - k; the next cell conforms 100 ms on.
    for remaining in [4, 3, 2, 1, 0] {
        rig.expect("burst", &g, "alice", 1, g.allowed(remaining, 100)).await;
    }
    // d = 500000: 600000 > 500000, retry = reset = 100.
    rig.expect("sixth", &g, "alice", 1, g.denied(0, 100, 100)).await;
    rig.at(99);
    // d = 401000: retry = ceil(1000 / 1000) = 1, reset 1.
    rig.expect("one ms short", &g, "alice", 1, g.denied(0, 1, 1)).await;
    rig.at(100);
    // d = 400000 conforms exactly; d' = 500000: remaining 0, reset 100.
    rig.expect("one cell later", &g, "alice", 1, g.allowed(0, 100)).await;
    rig.at(10_000);
    // Long idle: tat far behind, the whole burst again.
    rig.expect("idle", &g, "alice", 1, g.allowed(4, 100)).await;
}

/// The worked numbers, cost 2 included.
pub async fn gcra_worked_numbers(factory: &dyn ProviderFactory) {
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5).maximum_cost(2));
    let rig = Rig::start(factory, &[&g]).await;
    rig.at(0);
    rig.drain(&g, "alice", 5).await;
    rig.at(250);
    // d = 250000 -> 350000: remaining 1, reset ceil(50000 / 1000) = 50.
    rig.expect("at 250", &g, "alice", 1, g.allowed(1, 50)).await;
    // Cost 2: 550000 > 500000: retry 50; remaining 1, reset 50.
    rig.expect("cost 2 denied", &g, "alice", 2, g.denied(1, 50, 50)).await;
    rig.at(300);
    // d = 300000 + 200000 = 500000 conforms: remaining 0, reset 100.
    rig.expect("cost 2 at its retry", &g, "alice", 2, g.allowed(0, 100)).await;
    rig.at(350);
    // d = 450000: cost 1 needs 550000, retry 50, reset 50; cost 2 retry 150.
    rig.expect("cost 1 denied", &g, "alice", 1, g.denied(0, 50, 50)).await;
    rig.expect("cost 2 denied", &g, "alice", 2, g.denied(0, 150, 50)).await;
}

/// `L = 3` per second, `b = 1`: `T = 333334 us`; a wait of 334 us is 1 ms,
/// and a key idle past its tat restarts from the caller's time.
pub async fn gcra_rounds_its_interval_and_every_wait_up(factory: &dyn ProviderFactory) {
    let g = CheckPolicy::new(gcra("g", 3, 1000, 1));
    let rig = Rig::start(factory, &[&g]).await;
    rig.at(0);
    // d' = 333334: remaining 0, reset ceil(333334 / 1000) = 334.
    rig.expect("first", &g, "alice", 1, g.allowed(0, 334)).await;
    rig.at(333);
    // d = 334 us: retry = reset = 1 ms.
    rig.expect("334 us short", &g, "alice", 1, g.denied(0, 1, 1)).await;
    rig.at(334);
    // tat = 333334 us < 334000: d = 0; tat := 334000 + 333334.
    rig.expect("second", &g, "alice", 1, g.allowed(0, 334)).await;
    rig.at(667);
    rig.expect("334 us short again", &g, "alice", 1, g.denied(0, 1, 1)).await;
    rig.at(668);
    rig.expect("third", &g, "alice", 1, g.allowed(0, 334)).await;
}

/// A GCRA denial writes nothing, the mark included: a clock that steps
/// back after it is measured against the last charge (unlike a token
/// bucket, whose denial writes its refill).
pub async fn gcra_denial_leaves_the_mark_where_it_was(factory: &dyn ProviderFactory) {
    let g = CheckPolicy::new(
        gcra("g", 1, 10_000, 1).maximum_clock_regression(Duration::from_millis(500)),
    );
    let rig = Rig::start(factory, &[&g]).await;
    rig.at(2000);
    // T = 10 s: tat = T0 + 12 s, mark T0 + 2000.
    rig.expect("take the cell", &g, "alice", 1, g.allowed(0, 10_000)).await;
    rig.at(5000);
    rig.expect("denied at 5000", &g, "alice", 1, g.denied(0, 7000, 7000)).await;
    rig.at(1600);
    // The mark stayed at T0 + 2000: 400 ms behind is within the bound, so
    // t := T0 + 2000: retry = reset = 10_000.
    rig.expect("400 ms behind the charge", &g, "alice", 1, g.denied(0, 10_000, 10_000)).await;
    rig.at(1400);
    // 600 ms behind the charge: retry = 600 - 500 = 100.
    rig.expect(
        "600 ms behind the charge",
        &g,
        "alice",
        1,
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::ClockUnsafe,
            retry_after: Duration::from_millis(100),
        }),
    )
    .await;
}

/// Beside a fixed window that refuses, a GCRA that allows is spared: its
/// cell is not taken, and the next admitted set takes it.
pub async fn gcra_in_a_refused_set_is_charged_nothing(factory: &dyn ProviderFactory) {
    let gate = CheckPolicy::new(fixed_window("gate", 1, 1000));
    let g = CheckPolicy::new(gcra("g", 10, 1000, 3));
    let rig = Rig::start(factory, &[&gate, &g]).await;
    let set = [&gate, &g];
    let ask = || rig.set_request(&set, "GET /search", "alice", 1, EvaluationId::random());
    rig.at(0);
    let first = set_outcome(true, &[gate.allows(0, 1000), g.allows(2, 100)]);
    rig.expect_set("first", ask(), first).await;
    rig.at(50);
    // d = 50000: spared, remaining floor(250000 / 100000) = 2, the next
    // cell beyond them at ceil((50000 - 0) / 1000) = 50.
    let refused = set_outcome(false, &[gate.denies(0, 950, 950), g.allows(2, 50)]);
    rig.expect_set("the gate denies", ask(), refused).await;
    rig.at(1000);
    // d = 0: the whole burst, as if the refused set had never come.
    let again = set_outcome(true, &[gate.allows(0, 1000), g.allows(2, 100)]);
    rig.expect_set("next window", ask(), again).await;
}
