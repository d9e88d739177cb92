//! Evaluation dedupe (docs/algorithms.md, steps 4 and 6): a charged
//! evaluation leaves a record `{id, remaining, reset_after, written_at}`; a
//! repeat of its id within `ttl` replays it and charges nothing; records
//! expire when `written_at + ttl <= t` (and are dropped at the next write),
//! and are evicted oldest first beyond `record_capacity()`.

use std::time::Duration;

use futures::future::join_all;
use shared_contract::{DEDUP_RECORD_BYTES, EvaluationDedupPolicy, EvaluationId};

use crate::factory::ProviderFactory;
use crate::rig::{CheckPolicy, Rig, fixed_window, gcra, sliding_counter, token_bucket};

/// A repeat replays the recorded answer (even once the budget is gone) and
/// consumes nothing.
pub async fn dedupe_replays_a_repeat_without_charging(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let rig = Rig::start(factory, &[&fw]).await;
    let x = EvaluationId::random();
    rig.at(250);
    rig.expect_id("first", &fw, "alice", 1, x, fw.allowed(2, 750)).await;
    rig.at(400);
    // The recorded remaining and reset-after, not values recomputed at 400.
    rig.expect_id("repeat", &fw, "alice", 1, x, fw.replayed(2, 750)).await;
    rig.expect("new id", &fw, "alice", 1, fw.allowed(1, 600)).await;
    rig.expect("new id", &fw, "alice", 1, fw.allowed(0, 600)).await;
    rig.at(500);
    rig.expect_id("repeat on an empty budget", &fw, "alice", 1, x, fw.replayed(2, 750)).await;
    rig.expect("new id on an empty budget", &fw, "alice", 1, fw.denied(0, 500, 500)).await;
}

/// Replay works the same for the sliding counter, the token bucket and GCRA.
pub async fn dedupe_replay_works_for_every_algorithm(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let g = CheckPolicy::new(gcra("g", 10, 1000, 5));
    let rig = Rig::start(factory, &[&fw, &sc, &tb, &g]).await;
    let (fw_id, sc_id, tb_id) =
        (EvaluationId::random(), EvaluationId::random(), EvaluationId::random());
    let g_id = EvaluationId::random();
    rig.at(100);
    rig.expect_id("fw", &fw, "alice", 1, fw_id, fw.allowed(2, 900)).await;
    rig.expect_id("sc", &sc, "alice", 1, sc_id, sc.allowed(9, 900)).await;
    rig.at(300);
    // A new bucket at T0 + 300: 4 tokens, reset 100.
    rig.expect_id("tb", &tb, "alice", 1, tb_id, tb.allowed(4, 100)).await;
    // g at T0 + 300: tat := T0 + 400, remaining 4, reset 100.
    rig.expect_id("g", &g, "alice", 1, g_id, g.allowed(4, 100)).await;
    rig.at(350);
    rig.expect_id("fw repeat", &fw, "alice", 1, fw_id, fw.replayed(2, 900)).await;
    rig.expect_id("sc repeat", &sc, "alice", 1, sc_id, sc.replayed(9, 900)).await;
    rig.expect_id("tb repeat", &tb, "alice", 1, tb_id, tb.replayed(4, 100)).await;
    rig.expect_id("g repeat", &g, "alice", 1, g_id, g.replayed(4, 100)).await;
    // Nothing was consumed: fw n 1 -> 2; sc est 1 -> 2, reset 650;
    // tb k = floor(50 / 100) = 0, tokens 4 -> 3, reset = T0 + 300 + 200 - (T0 + 350) = 150.
    rig.expect("fw new id", &fw, "alice", 1, fw.allowed(1, 650)).await;
    rig.expect("sc new id", &sc, "alice", 1, sc.allowed(8, 650)).await;
    rig.expect("tb new id", &tb, "alice", 1, tb.allowed(3, 150)).await;
    // g: d = 50 ms -> 150 ms: remaining 3, reset 150 - 100 = 50.
    rig.expect("g new id", &g, "alice", 1, g.allowed(3, 50)).await;
}

/// With dedupe disabled a repeat is a new charge.
pub async fn dedupe_disabled_charges_every_repeat(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(
        fixed_window("fw", 3, 1000).evaluation_dedup(EvaluationDedupPolicy::Disabled),
    );
    let tb = CheckPolicy::new(
        token_bucket("tb", 5, 1, 100).evaluation_dedup(EvaluationDedupPolicy::Disabled),
    );
    let rig = Rig::start(factory, &[&fw, &tb]).await;
    let x = EvaluationId::random();
    rig.at(0);
    rig.expect_id("first", &fw, "alice", 1, x, fw.allowed(2, 1000)).await;
    rig.expect_id("repeat", &fw, "alice", 1, x, fw.allowed(1, 1000)).await;
    rig.expect_id("repeat", &fw, "alice", 1, x, fw.allowed(0, 1000)).await;
    rig.expect_id("repeat", &fw, "alice", 1, x, fw.denied(0, 1000, 1000)).await;
    rig.expect_id("first", &tb, "alice", 1, x, tb.allowed(4, 100)).await;
    rig.expect_id("repeat", &tb, "alice", 1, x, tb.allowed(3, 200)).await;
}

/// A record answers for `ttl` and not a millisecond longer; the repeat after
/// it charges again and leaves a new record.
pub async fn dedupe_record_expires_after_its_ttl(factory: &dyn ProviderFactory) {
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_millis(1000),
        max_entries: 256,
        max_stored_bytes: 65_536,
    };
    let fw = CheckPolicy::new(fixed_window("fw", 5, 10_000).evaluation_dedup(dedup));
    let rig = Rig::start(factory, &[&fw]).await;
    let x = EvaluationId::random();
    rig.at(0);
    rig.expect_id("first", &fw, "alice", 1, x, fw.allowed(4, 10_000)).await;
    rig.at(999);
    // T0 + 0 + 1000 > T0 + 999: alive.
    rig.expect_id("last ms of the ttl", &fw, "alice", 1, x, fw.replayed(4, 10_000)).await;
    rig.at(1000);
    // written_at + ttl = T0 + 1000 <= t: dropped, so the repeat charges.
    rig.expect_id("ttl over", &fw, "alice", 1, x, fw.allowed(3, 9000)).await;
    rig.at(1999);
    rig.expect_id("the new record", &fw, "alice", 1, x, fw.replayed(3, 9000)).await;
    rig.at(2000);
    rig.expect_id("its ttl over too", &fw, "alice", 1, x, fw.allowed(2, 8000)).await;
}

/// Beyond `max_entries` the oldest record goes first: with room for two,
/// after `a, b, c` a repeat of `a` charges but `c` replays.
pub async fn dedupe_evicts_the_oldest_beyond_max_entries(factory: &dyn ProviderFactory) {
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_secs(5),
        max_entries: 2,
        max_stored_bytes: 65_536,
    };
    eviction_pattern(factory, dedup).await;
}

/// The byte bound evicts the same way: `2 * 40 + 39` bytes hold two records.
pub async fn dedupe_evicts_the_oldest_beyond_max_stored_bytes(factory: &dyn ProviderFactory) {
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_secs(5),
        max_entries: 256,
        // floor(119 / 40) = 2 records.
        max_stored_bytes: 2 * DEDUP_RECORD_BYTES + DEDUP_RECORD_BYTES - 1,
    };
    eviction_pattern(factory, dedup).await;
}

async fn eviction_pattern(factory: &dyn ProviderFactory, dedup: EvaluationDedupPolicy) {
    assert_eq!(dedup.record_capacity(), 2, "the pattern below assumes room for two records");
    let fw = CheckPolicy::new(fixed_window("fw", 10, 10_000).evaluation_dedup(dedup));
    let rig = Rig::start(factory, &[&fw]).await;
    let (a, b, c) = (EvaluationId::random(), EvaluationId::random(), EvaluationId::random());
    // W = 10_000, so reset = 10_000 - offset throughout.
    rig.at(100);
    rig.expect_id("a", &fw, "alice", 1, a, fw.allowed(9, 9900)).await;
    rig.at(200);
    rig.expect_id("b", &fw, "alice", 1, b, fw.allowed(8, 9800)).await;
    rig.at(300);
    // Records [a, b] + c: a, the oldest, is evicted -> [b, c].
    rig.expect_id("c", &fw, "alice", 1, c, fw.allowed(7, 9700)).await;
    rig.at(400);
    // a is gone: charged again; [b, c] + a evicts b -> [c, a].
    rig.expect_id("a again", &fw, "alice", 1, a, fw.allowed(6, 9600)).await;
    rig.at(500);
    rig.expect_id("c replays", &fw, "alice", 1, c, fw.replayed(7, 9700)).await;
    rig.at(600);
    // b is gone: charged; [c, a] + b evicts c -> [a, b].
    rig.expect_id("b again", &fw, "alice", 1, b, fw.allowed(5, 9400)).await;
    rig.at(700);
    rig.expect_id("a replays its second record", &fw, "alice", 1, a, fw.replayed(6, 9600)).await;
    rig.at(800);
    rig.expect_id("c is gone now", &fw, "alice", 1, c, fw.allowed(4, 9200)).await;
}

/// A denial charges nothing and leaves no record: its retry in a later
/// window is charged (once), for the fixed window and for the token bucket,
/// which writes state even when it denies.
pub async fn dedupe_does_not_record_a_denial(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 1, 1000));
    let tb = CheckPolicy::new(token_bucket("tb", 1, 1, 100));
    let rig = Rig::start(factory, &[&fw, &tb]).await;
    let (x, y) = (EvaluationId::random(), EvaluationId::random());
    rig.at(100);
    rig.expect("fw first", &fw, "alice", 1, fw.allowed(0, 900)).await;
    rig.at(200);
    rig.expect_id("fw denied", &fw, "alice", 1, x, fw.denied(0, 800, 800)).await;
    rig.at(1000);
    rig.expect_id("fw retry in the next window", &fw, "alice", 1, x, fw.allowed(0, 1000)).await;
    rig.at(1100);
    rig.expect_id("fw retry repeated", &fw, "alice", 1, x, fw.replayed(0, 1000)).await;
    rig.expect("fw new id", &fw, "alice", 1, fw.denied(0, 900, 900)).await;
    // A new bucket at T0 + 1100: its one token taken, reset 100.
    rig.expect("tb takes the token", &tb, "alice", 1, tb.allowed(0, 100)).await;
    rig.expect_id("tb denied", &tb, "alice", 1, y, tb.denied(0, 100, 100)).await;
    rig.at(1200);
    // k = 1: a token again; the retry of y is charged, not replayed.
    rig.expect_id("tb retry", &tb, "alice", 1, y, tb.allowed(0, 100)).await;
    rig.at(1250);
    rig.expect_id("tb retry repeated", &tb, "alice", 1, y, tb.replayed(0, 100)).await;
}

/// Records belong to their key: the same id under another subject or
/// another policy is a different evaluation.
pub async fn dedupe_records_are_per_subject_and_policy(factory: &dyn ProviderFactory) {
    let first = CheckPolicy::new(fixed_window("fw-a", 3, 1000));
    let second = CheckPolicy::new(fixed_window("fw-b", 3, 1000));
    let rig = Rig::start(factory, &[&first, &second]).await;
    let x = EvaluationId::random();
    rig.at(0);
    rig.expect_id("alice", &first, "alice", 1, x, first.allowed(2, 1000)).await;
    rig.expect_id("bob, same id", &first, "bob", 1, x, first.allowed(2, 1000)).await;
    rig.expect_id("alice, other policy", &second, "alice", 1, x, second.allowed(2, 1000)).await;
    rig.at(10);
    rig.expect_id("alice repeat", &first, "alice", 1, x, first.replayed(2, 1000)).await;
    rig.expect_id("bob repeat", &first, "bob", 1, x, first.replayed(2, 1000)).await;
    rig.expect_id("other policy repeat", &second, "alice", 1, x, second.replayed(2, 1000)).await;
    rig.expect("alice new id", &first, "alice", 1, first.allowed(1, 990)).await;
}

/// A replay writes nothing: not the state, not the key's mark. After a
/// replay late in the record's life, a clock back near the original charge
/// is still within the bound.
pub async fn dedupe_replay_writes_nothing(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(
        fixed_window("fw", 3, 10_000).maximum_clock_regression(Duration::from_millis(500)),
    );
    let rig = Rig::start(factory, &[&fw]).await;
    let x = EvaluationId::random();
    rig.at(100);
    // Mark T0 + 100; reset = 10_000 - 100 = 9900.
    rig.expect_id("charge", &fw, "alice", 1, x, fw.allowed(2, 9900)).await;
    rig.at(1000);
    // T0 + 100 + 5000 > T0 + 1000: the record is alive.
    rig.expect_id("replay 900 ms later", &fw, "alice", 1, x, fw.replayed(2, 9900)).await;
    rig.at(400);
    // The mark is still T0 + 100, so t = T0 + 400 stands: n 1 -> 2, reset
    // 9600. (Had the replay moved the mark to T0 + 1000, this would be
    // ClockUnsafe: 600 > 500.)
    rig.expect("back near the charge", &fw, "alice", 1, fw.allowed(1, 9600)).await;
}

/// Neither a denial nor a replay removes a record that expired at its time:
/// when the clock then steps back inside the bound, the record is live again
/// and replays (step 4: expired records are ignored, and dropped only when
/// the key is written). Found by the memory-vs-Redis property test.
pub async fn dedupe_record_survives_a_denial_and_a_step_back(factory: &dyn ProviderFactory) {
    let dedup = EvaluationDedupPolicy::Enabled {
        ttl: Duration::from_millis(50),
        max_entries: 4,
        max_stored_bytes: 65_536,
    };
    let fw = CheckPolicy::new(
        fixed_window("fw", 2, 1000)
            .maximum_cost(2)
            .maximum_clock_regression(Duration::from_millis(10))
            .evaluation_dedup(dedup),
    );
    let rig = Rig::start(factory, &[&fw]).await;
    let (x, y, z) = (EvaluationId::random(), EvaluationId::random(), EvaluationId::random());
    rig.at(0);
    // n = 1, remaining 1, reset 1000; record x written at T0, live until T0 + 50.
    rig.expect_id("charge x", &fw, "alice", 1, x, fw.allowed(1, 1000)).await;
    rig.at(50);
    // n + c = 1 + 2 > 2: denied, nothing written; x has expired at T0 + 50.
    rig.expect_id("denied y", &fw, "alice", 2, y, fw.denied(1, 950, 950)).await;
    rig.at(49);
    // Mark T0, lag none: t = T0 + 49 < T0 + 50, so x is live and replays.
    rig.expect_id("x after the denial", &fw, "alice", 1, x, fw.replayed(1, 1000)).await;
    rig.at(50);
    // A write at T0 + 50 moves the mark, after which a step back no longer
    // revives x.
    rig.expect_id("charge z", &fw, "alice", 1, z, fw.allowed(0, 950)).await;
    rig.at(49);
    // Mark T0 + 50, t = T0 + 49 within the bound -> t = T0 + 50: x expired and
    // the budget is spent, so the repeat is evaluated afresh and denied.
    rig.expect_id("x after a write", &fw, "alice", 1, x, fw.denied(0, 950, 950)).await;
}

/// Repeats of one evaluation that arrive together charge it exactly once:
/// one answer is the charge, the rest replay it.
pub async fn dedupe_concurrent_repeats_charge_once(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 5, 1000));
    let rig = Rig::start(factory, &[&fw]).await;
    let x = EvaluationId::random();
    rig.at(0);
    let outcomes = join_all((0..8).map(|_| rig.ask(rig.request(fw.id(), "alice", 1, x)))).await;
    let charged = outcomes.iter().filter(|outcome| **outcome == fw.allowed(4, 1000)).count();
    let replayed = outcomes.iter().filter(|outcome| **outcome == fw.replayed(4, 1000)).count();
    assert_eq!((charged, replayed), (1, 7), "eight concurrent repeats: {outcomes:?}");
    rig.expect("new id", &fw, "alice", 1, fw.allowed(3, 1000)).await;
}

#[cfg(test)]
mod tests {
    use shared_contract::RateLimitDecision;

    use super::*;
    use crate::rig::one_decision;

    #[test]
    fn the_byte_bound_of_the_eviction_check_holds_two_records() {
        let dedup = EvaluationDedupPolicy::Enabled {
            ttl: Duration::from_secs(5),
            max_entries: 256,
            max_stored_bytes: 2 * DEDUP_RECORD_BYTES + DEDUP_RECORD_BYTES - 1,
        };
        assert_eq!(dedup.record_capacity(), 2);
    }

    #[test]
    fn a_replay_differs_from_a_charge_only_in_the_flag() {
        let fw = CheckPolicy::new(fixed_window("fw", 5, 1000));
        let (Ok(charge), Ok(replay)) = (fw.allowed(4, 1000), fw.replayed(4, 1000)) else {
            panic!("both are decisions");
        };
        let (charge, replay) = (one_decision(&charge), one_decision(&replay));
        assert_eq!(charge, RateLimitDecision { replayed: false, ..replay });
        assert!(replay.replayed);
    }
}
