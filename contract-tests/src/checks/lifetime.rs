//! State after long idleness: hours later every key answers as if new, and
//! old dedupe records are gone.

use shared_contract::EvaluationId;

use crate::factory::ProviderFactory;
use crate::rig::{CheckPolicy, Rig, fixed_window, sliding_counter, token_bucket};

/// Five hours of manual time (18_000_000 ms, a multiple of every window
/// here) after exhausting every algorithm, each gives a fresh budget and the
/// old evaluation ids charge again; thirty days on, the same.
pub async fn long_idle_state_acts_fresh(factory: &dyn ProviderFactory) {
    const FIVE_HOURS: u64 = 5 * 3_600_000;
    const THIRTY_DAYS: u64 = 30 * 24 * 3_600_000;
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let rig = Rig::start(factory, &[&fw, &sc, &tb]).await;
    let (fw_id, sc_id, tb_id) =
        (EvaluationId::random(), EvaluationId::random(), EvaluationId::random());
    rig.at(0);
    rig.expect_id("fw first", &fw, "alice", 1, fw_id, fw.allowed(2, 1000)).await;
    rig.expect_id("sc first", &sc, "alice", 1, sc_id, sc.allowed(9, 1000)).await;
    rig.expect_id("tb first", &tb, "alice", 1, tb_id, tb.allowed(4, 100)).await;
    rig.drain(&fw, "alice", 2).await;
    rig.drain(&sc, "alice", 9).await;
    rig.drain(&tb, "alice", 4).await;
    rig.at(FIVE_HOURS);
    // Records of T0 expired (T0 + 5 s <= t). fw: a new window; sc: the stored
    // window is thousands of windows old, p = n = 0; tb: k = 180_000 periods
    // refill to C, so the clock restarts: 4 tokens left, reset 100.
    rig.expect_id("fw hours later", &fw, "alice", 1, fw_id, fw.allowed(2, 1000)).await;
    rig.expect_id("sc hours later", &sc, "alice", 1, sc_id, sc.allowed(9, 1000)).await;
    rig.expect_id("tb hours later", &tb, "alice", 1, tb_id, tb.allowed(4, 100)).await;
    rig.at(THIRTY_DAYS);
    rig.expect_id("fw a month later", &fw, "alice", 1, fw_id, fw.allowed(2, 1000)).await;
    rig.expect_id("sc a month later", &sc, "alice", 1, sc_id, sc.allowed(9, 1000)).await;
    rig.expect_id("tb a month later", &tb, "alice", 1, tb_id, tb.allowed(4, 100)).await;
}
