//! Fixed-window checks (docs/algorithms.md, "Fixed window"): `ws = t - t mod W`,
//! deny without mutation when `n + c > L`, `remaining = L - n`,
//! `reset_after = ws + W - t`, a denial's `retry_after = reset_after`.

use crate::factory::ProviderFactory;
use crate::rig::{CheckPolicy, Rig, fixed_window};

/// The worked numbers: `L = 3`, `W = 1000` at `T0 + 250` admits three with
/// remaining 2, 1, 0 and denies the fourth with retry-after 750 ms.
pub async fn fixed_window_allows_exactly_the_limit(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(250);
    // ws = T0; reset = T0 + 1000 - (T0 + 250) = 750.
    rig.expect("first", &fw, "alice", 1, fw.allowed(2, 750)).await;
    rig.expect("second", &fw, "alice", 1, fw.allowed(1, 750)).await;
    rig.expect("third", &fw, "alice", 1, fw.allowed(0, 750)).await;
    rig.expect("fourth is over the limit", &fw, "alice", 1, fw.denied(0, 750, 750)).await;
    // A denial writes nothing, so the next one is denied the same way.
    rig.expect("fifth", &fw, "alice", 1, fw.denied(0, 750, 750)).await;
}

/// The budget comes back whole when the next window starts, and not a
/// millisecond before.
pub async fn fixed_window_new_window_restores_the_budget(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 3, 1000));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(250);
    rig.drain(&fw, "alice", 3).await;
    rig.at(999);
    // Last millisecond of [T0, T0+1000): reset = 1000 - 999 = 1.
    rig.expect("last ms of the window", &fw, "alice", 1, fw.denied(0, 1, 1)).await;
    rig.at(1000);
    // ws = T0 + 1000 differs from the stored window start: n = 0.
    rig.expect("first of the new window", &fw, "alice", 1, fw.allowed(2, 1000)).await;
    rig.expect("second", &fw, "alice", 1, fw.allowed(1, 1000)).await;
    rig.expect("third", &fw, "alice", 1, fw.allowed(0, 1000)).await;
    rig.expect("fourth", &fw, "alice", 1, fw.denied(0, 1000, 1000)).await;
    rig.at(2500);
    // ws = T0 + 2000; reset = 3000 - 2500 = 500.
    rig.expect("a later window", &fw, "alice", 1, fw.allowed(2, 500)).await;
}

/// A denial's retry-after is the time to the window end, at any point in it.
pub async fn fixed_window_retry_after_counts_down_to_the_window_end(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 1, 1000));
    let minute = CheckPolicy::new(fixed_window("fw-minute", 1, 60_000));
    let rig = Rig::start(factory, &[&fw, &minute]).await;
    rig.at(0);
    rig.expect("window start", &fw, "alice", 1, fw.allowed(0, 1000)).await;
    rig.expect("denied at the start", &fw, "alice", 1, fw.denied(0, 1000, 1000)).await;
    rig.at(400);
    // 1000 - 400 = 600.
    rig.expect("denied at 400", &fw, "alice", 1, fw.denied(0, 600, 600)).await;
    rig.at(999);
    rig.expect("denied at 999", &fw, "alice", 1, fw.denied(0, 1, 1)).await;
    rig.at(1000);
    rig.expect("next window", &fw, "alice", 1, fw.allowed(0, 1000)).await;
    rig.at(12_345);
    // T0 is a multiple of 60_000, so ws = T0 and reset = 60_000 - 12_345 = 47_655.
    rig.expect("minute window", &minute, "alice", 1, minute.allowed(0, 47_655)).await;
    rig.expect("minute denied", &minute, "alice", 1, minute.denied(0, 47_655, 47_655)).await;
}

/// A cost above one charges that many units, and a cost that does not fit
/// is denied while a smaller one still fits.
pub async fn fixed_window_cost_above_one_charges_its_cost(factory: &dyn ProviderFactory) {
    let fw = CheckPolicy::new(fixed_window("fw", 10, 1000).maximum_cost(4));
    let rig = Rig::start(factory, &[&fw]).await;
    rig.at(100);
    // reset = 1000 - 100 = 900 throughout.
    rig.expect("cost 4: n = 4", &fw, "alice", 4, fw.allowed(6, 900)).await;
    rig.expect("cost 4: n = 8", &fw, "alice", 4, fw.allowed(2, 900)).await;
    // 8 + 3 = 11 > 10: denied, n stays 8.
    rig.expect("cost 3 does not fit", &fw, "alice", 3, fw.denied(2, 900, 900)).await;
    // 8 + 2 = 10 <= 10.
    rig.expect("cost 2 fits exactly", &fw, "alice", 2, fw.allowed(0, 900)).await;
    rig.expect("cost 1 over", &fw, "alice", 1, fw.denied(0, 900, 900)).await;
    rig.at(1000);
    rig.expect("new window", &fw, "alice", 4, fw.allowed(6, 1000)).await;
}
