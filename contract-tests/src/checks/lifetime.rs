//! How long a key's state and records live: long enough for everything that
//! still matters (with no grace at all), and hours later everything is gone.

use std::time::Duration;

use shared_contract::{EvaluationDedupPolicy, EvaluationId, RateLimitPolicyBuilder};

use crate::factory::ProviderFactory;
use crate::rig::{
    CheckPolicy, Rig, concurrency, fixed_window, gcra, sliding_counter, token_bucket,
};

/// Five hours of manual time (18_000_000 ms, a multiple of every window
/// here) after exhausting every algorithm, each gives a fresh budget and the
/// old evaluation ids charge again; thirty days on, the same.
pub async fn long_idle_state_acts_fresh(factory: &dyn ProviderFactory) {
    const FIVE_HOURS: u64 = 5 * 3_600_000;
    const THIRTY_DAYS: u64 = 30 * 24 * 3_600_000;
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5));
    let cc = CheckPolicy::new(concurrency("cc", 3, 30_000, 1000));
    let rig = Rig::start(factory, &[&fw, &sc, &tb, &g, &cc]).await;
    let (fw_id, sc_id, tb_id) =
        (EvaluationId::random(), EvaluationId::random(), EvaluationId::random());
    let (g_id, cc_id) = (EvaluationId::random(), EvaluationId::random());
    rig.at(0);
    rig.expect_id("cc first", &cc, "alice", 1, cc_id, cc.allowed(2, 0)).await;
    rig.drain(&cc, "alice", 2).await;
    rig.expect_id("fw first", &fw, "alice", 1, fw_id, fw.allowed(2, 1000)).await;
    rig.expect_id("sc first", &sc, "alice", 1, sc_id, sc.allowed(9, 1000)).await;
    rig.expect_id("tb first", &tb, "alice", 1, tb_id, tb.allowed(4, 100)).await;
    rig.expect_id("g first", &g, "alice", 1, g_id, g.allowed(4, 100)).await;
    rig.drain(&fw, "alice", 2).await;
    rig.drain(&sc, "alice", 9).await;
    rig.drain(&tb, "alice", 4).await;
    rig.drain(&g, "alice", 4).await;
    rig.at(FIVE_HOURS);
    // Records of T0 expired (T0 + 5 s <= t). fw: a new window; sc: the stored
    // window is thousands of windows old, p = n = 0; tb: k = 180_000 periods
    // refill to C, so the clock restarts: 4 tokens left, reset 100.
    rig.expect_id("fw hours later", &fw, "alice", 1, fw_id, fw.allowed(2, 1000)).await;
    rig.expect_id("sc hours later", &sc, "alice", 1, sc_id, sc.allowed(9, 1000)).await;
    rig.expect_id("tb hours later", &tb, "alice", 1, tb_id, tb.allowed(4, 100)).await;
    // g: tat is hours behind, d = 0: the whole burst.
    rig.expect_id("g hours later", &g, "alice", 1, g_id, g.allowed(4, 100)).await;
    // cc: every lease of T0 expired at T0 + 30 s; the old id takes a new one.
    rig.expect_id("cc hours later", &cc, "alice", 1, cc_id, cc.allowed(2, 0)).await;
    rig.at(THIRTY_DAYS);
    rig.expect_id("fw a month later", &fw, "alice", 1, fw_id, fw.allowed(2, 1000)).await;
    rig.expect_id("sc a month later", &sc, "alice", 1, sc_id, sc.allowed(9, 1000)).await;
    rig.expect_id("tb a month later", &tb, "alice", 1, tb_id, tb.allowed(4, 100)).await;
    rig.expect_id("g a month later", &g, "alice", 1, g_id, g.allowed(4, 100)).await;
    rig.expect_id("cc a month later", &cc, "alice", 1, cc_id, cc.allowed(2, 0)).await;
}

/// A key lives until both its state and its newest live record stop
/// mattering, plus `G = max(cleanup_grace, R)` (docs/algorithms.md, step 7).
/// With `G = 0`: a record outlives a fixed window's and a bucket's state
/// and still replays, and a sliding counter's state lives two windows.
pub async fn key_lifetime_covers_the_state_and_live_records(factory: &dyn ProviderFactory) {
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_secs(60),
        max_entries: 256,
        max_stored_bytes: 65_536,
    };
    let no_grace = |builder: RateLimitPolicyBuilder| {
        CheckPolicy::new(
            builder.cleanup_grace(Duration::ZERO).maximum_clock_regression(Duration::ZERO),
        )
    };
    let fw = no_grace(fixed_window("fw", 3, 1000).evaluation_dedup(dedup));
    let tb = no_grace(token_bucket("tb", 5, 1, 100).evaluation_dedup(dedup));
    let g = no_grace(gcra("g", 10, 1000, 5).evaluation_dedup(dedup));
    let sc = no_grace(
        sliding_counter("sc", 10, 10_000).evaluation_dedup(EvaluationDedupPolicy::Disabled),
    );
    // cc: the key lives as long as its latest lease, 20 s here.
    let cc = no_grace(concurrency("cc", 1, 20_000, 1000));
    let rig = Rig::start(factory, &[&fw, &tb, &sc, &g, &cc]).await;
    let (fw_id, tb_id, g_id) =
        (EvaluationId::random(), EvaluationId::random(), EvaluationId::random());
    rig.at(0);
    rig.expect("cc lease", &cc, "alice", 1, cc.allowed(0, 0)).await;
    // sc: ten charged in [T0, T0 + 10_000); state_end = T0 + 2 * 10_000.
    rig.drain(&sc, "alice", 10).await;
    // tb: state_end = T0 + reset 100; the record lives to T0 + 60_000.
    rig.expect_id("tb charge", &tb, "alice", 1, tb_id, tb.allowed(4, 100)).await;
    // g: tat = T0 + 100 ms, state_end T0 + 100; the record lives to T0 + 60_000.
    rig.expect_id("g charge", &g, "alice", 1, g_id, g.allowed(4, 100)).await;
    rig.at(900);
    // fw: state_end = T0 + 1000; the record lives to T0 + 900 + 60_000.
    rig.expect_id("fw charge", &fw, "alice", 1, fw_id, fw.allowed(2, 100)).await;
    rig.at(15_000);
    // sc: e = 5000, p = 10: est = floor(10 * 5000 / 10_000) = 5 -> 6, remaining 4,
    // reset 20_000 - 15_000 = 5000. A key gone at the window end would give 9.
    rig.expect("sc one and a half windows on", &sc, "alice", 1, sc.allowed(4, 5000)).await;
    // A key gone before its lease expired would admit this.
    rig.expect("cc lease still held", &cc, "alice", 1, cc.denied(0, 1000, 0)).await;
    rig.at(30_000);
    rig.expect_id("fw record after the state", &fw, "alice", 1, fw_id, fw.replayed(2, 100)).await;
    rig.expect_id("tb record after the state", &tb, "alice", 1, tb_id, tb.replayed(4, 100)).await;
    rig.expect_id("g record after the state", &g, "alice", 1, g_id, g.replayed(4, 100)).await;
    rig.expect("cc lease expired", &cc, "alice", 1, cc.allowed(0, 0)).await;
}
