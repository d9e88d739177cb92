//! Sliding-counter checks (docs/algorithms.md, "Sliding counter"):
//! `est = floor(p * (W - e) / W) + n`, deny without mutation when
//! `est + c > L`, `remaining = L - (est + c)` when allowed and
//! `max(0, L - est)` when denied, `reset_after = ws + W - t`, and the
//! retry-after formula with `A = L - c - n`.

use crate::factory::ProviderFactory;
use crate::rig::{CheckPolicy, Rig, sliding_counter};

/// With no previous window the counter admits exactly `L`; the denial waits
/// into the next window, where the estimate first drops below the limit.
pub async fn sliding_counter_allows_exactly_the_limit_in_one_window(factory: &dyn ProviderFactory) {
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let rig = Rig::start(factory, &[&sc]).await;
    rig.at(0);
    for n in 1..=10 {
        // p = 0, est = n - 1 before the charge: remaining = 10 - n.
        rig.expect("within the limit", &sc, "alice", 1, sc.allowed(10 - n, 1000)).await;
    }
    // est = 10; A = 10 - 1 - 10 < 0, so the next window: p' = 10, n' = 0,
    // x' = 1000 - floor((10 * 1000 - 1) / 10) = 1000 - 999 = 1,
    // retry = (T0 + 1000 - T0) + 1 = 1001.
    rig.expect("eleventh", &sc, "alice", 1, sc.denied(0, 1001, 1000)).await;
    rig.at(1000);
    // e = 0, p = 10: est = floor(10 * 1000 / 1000) = 10, denied;
    // A = 10 - 1 - 0 = 9, x = 1000 - floor(9999 / 10) = 1, retry = 1 - 0 = 1.
    rig.expect("start of the next window", &sc, "alice", 1, sc.denied(0, 1, 1000)).await;
    rig.at(1001);
    // est = floor(10 * 999 / 1000) = 9; 9 + 1 = 10 fits; remaining 0, reset 999.
    rig.expect("one ms later", &sc, "alice", 1, sc.allowed(0, 999)).await;
}

/// The worked numbers: 8 in `[T0, T0+1000)`, then at `T0 + 1250`
/// `est = 6`, four more pass and the fifth retries after 1 ms.
pub async fn sliding_counter_worked_example(factory: &dyn ProviderFactory) {
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let rig = Rig::start(factory, &[&sc]).await;
    rig.at(100);
    for n in 1..=8 {
        rig.expect("first window", &sc, "alice", 1, sc.allowed(10 - n, 900)).await;
    }
    rig.at(1250);
    // e = 250, p = 8: floor(8 * 750 / 1000) = 6; reset = 2000 - 1250 = 750.
    rig.expect("est 6 -> 7", &sc, "alice", 1, sc.allowed(3, 750)).await;
    rig.expect("est 7 -> 8", &sc, "alice", 1, sc.allowed(2, 750)).await;
    rig.expect("est 8 -> 9", &sc, "alice", 1, sc.allowed(1, 750)).await;
    rig.expect("est 9 -> 10", &sc, "alice", 1, sc.allowed(0, 750)).await;
    // A = 10 - 1 - 4 = 5, x = 1000 - floor(5999 / 8) = 251, retry = 251 - 250 = 1.
    rig.expect("fifth", &sc, "alice", 1, sc.denied(0, 1, 750)).await;
    rig.at(1251);
    // floor(8 * 749 / 1000) = floor(5.992) = 5; 5 + 4 + 1 = 10 fits.
    rig.expect("after the retry", &sc, "alice", 1, sc.allowed(0, 749)).await;
}

/// The previous window's weight at elapsed 0, 250, 500, 750 and 999 ms of a
/// 1000 ms window, floored.
pub async fn sliding_counter_estimate_floors_at_elapsed_fractions(factory: &dyn ProviderFactory) {
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let rig = Rig::start(factory, &[&sc]).await;
    // p = 7 for each subject; one request of cost 1 at e leaves
    // remaining = 10 - (floor(7 * (1000 - e) / 1000) + 1), reset = 1000 - e.
    let points = [
        ("e0", 0, 2),     // floor(7000 / 1000) = 7
        ("e250", 250, 4), // floor(5250 / 1000) = 5
        ("e500", 500, 6), // floor(3500 / 1000) = 3
        ("e750", 750, 8), // floor(1750 / 1000) = 1
        ("e999", 999, 9), // floor(7 / 1000) = 0
    ];
    rig.at(500);
    for (who, _, _) in points {
        rig.drain(&sc, who, 7).await;
    }
    for (who, elapsed, remaining) in points {
        rig.at(1000 + elapsed);
        rig.expect("weighted estimate", &sc, who, 1, sc.allowed(remaining, 1000 - elapsed)).await;
    }
}

/// Cost above one: the denial's wait lies inside the current window.
pub async fn sliding_counter_cost_above_one_retries_inside_the_window(
    factory: &dyn ProviderFactory,
) {
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000).maximum_cost(3));
    let rig = Rig::start(factory, &[&sc]).await;
    rig.at(0);
    rig.expect("cost 3", &sc, "alice", 3, sc.allowed(7, 1000)).await;
    rig.expect("cost 3", &sc, "alice", 3, sc.allowed(4, 1000)).await;
    rig.expect("cost 3", &sc, "alice", 3, sc.allowed(1, 1000)).await;
    rig.expect("cost 1", &sc, "alice", 1, sc.allowed(0, 1000)).await;
    rig.at(1500);
    // e = 500, p = 10, n = 0: est = floor(10 * 500 / 1000) = 5.
    rig.expect("est 5 + 3", &sc, "alice", 3, sc.allowed(2, 500)).await;
    rig.expect("est 8 + 2", &sc, "alice", 2, sc.allowed(0, 500)).await;
    // n = 5, est = 10, cost 3 denied: A = 10 - 3 - 5 = 2,
    // x = 1000 - floor((3 * 1000 - 1) / 10) = 1000 - 299 = 701, retry = 701 - 500 = 201.
    rig.expect("cost 3 over", &sc, "alice", 3, sc.denied(0, 201, 500)).await;
    rig.at(1700);
    // est = floor(10 * 300 / 1000) + 5 = 8; 8 + 3 > 10; remaining 10 - 8 = 2; retry 701 - 700 = 1.
    rig.expect("one ms short", &sc, "alice", 3, sc.denied(2, 1, 300)).await;
    rig.at(1701);
    // est = floor(10 * 299 / 1000) + 5 = 2 + 5 = 7; 7 + 3 = 10 fits.
    rig.expect("at the retry", &sc, "alice", 3, sc.allowed(0, 299)).await;
}

/// When the current window's own count blocks the request, the wait runs
/// into the next window, where that count becomes the weighted previous one.
pub async fn sliding_counter_retry_after_falls_in_the_next_window(factory: &dyn ProviderFactory) {
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000).maximum_cost(5));
    let rig = Rig::start(factory, &[&sc]).await;
    rig.at(300);
    rig.expect("bob cost 5", &sc, "bob", 5, sc.allowed(5, 700)).await;
    rig.expect("bob cost 3", &sc, "bob", 3, sc.allowed(2, 700)).await;
    // n = 8, est + 5 = 13 > 10; A = 10 - 5 - 8 < 0: next window with p' = 8,
    // x' = 1000 - floor((6 * 1000 - 1) / 8) = 1000 - 749 = 251,
    // retry = (1000 - 300) + 251 = 951.
    rig.expect("bob cost 5 over", &sc, "bob", 5, sc.denied(2, 951, 700)).await;
    rig.at(400);
    rig.expect("alice cost 5", &sc, "alice", 5, sc.allowed(5, 600)).await;
    rig.expect("alice cost 5", &sc, "alice", 5, sc.allowed(0, 600)).await;
    // n = 10, A < 0: x' = 1000 - floor(9999 / 10) = 1, retry = (1000 - 400) + 1 = 601.
    rig.expect("alice over", &sc, "alice", 1, sc.denied(0, 601, 600)).await;
    rig.at(1001);
    // At T0 + 400 + 601: est = floor(10 * 999 / 1000) = 9, fits.
    rig.expect("alice at her retry", &sc, "alice", 1, sc.allowed(0, 999)).await;
    rig.at(1250);
    // One ms before bob's retry: est = floor(8 * 750 / 1000) = 6, 6 + 5 > 10,
    // remaining 4; A = 10 - 5 - 0 = 5, x = 251, retry = 251 - 250 = 1.
    rig.expect("bob one ms short", &sc, "bob", 5, sc.denied(4, 1, 750)).await;
    rig.at(1251);
    // est = floor(8 * 749 / 1000) = 5; 5 + 5 = 10 fits.
    rig.expect("bob at his retry", &sc, "bob", 5, sc.allowed(0, 749)).await;
}

/// A count so large that even the next window's weight never lets the
/// request through: the wait is the rest of this window plus a whole one.
pub async fn sliding_counter_retry_after_two_windows_later(factory: &dyn ProviderFactory) {
    let sc = CheckPolicy::new(sliding_counter("sc", 20, 10).maximum_cost(20));
    let rig = Rig::start(factory, &[&sc]).await;
    rig.at(0);
    rig.expect("cost 10", &sc, "alice", 10, sc.allowed(10, 10)).await;
    // est = 10, 10 + 20 > 20; A = 20 - 20 - 10 < 0; next window p' = 10:
    // x' = 10 - floor((1 * 10 - 1) / 10) = 10 - 0 = 10 >= W, so
    // retry = (T0 + 10 - T0) + 10 = 20. remaining = 20 - 10.
    rig.expect("cost 20 over", &sc, "alice", 20, sc.denied(10, 20, 10)).await;
    rig.at(19);
    // ws = T0 + 10, e = 9, p = 10, n = 0: est = floor(10 * 1 / 10) = 1, denied,
    // remaining 19; A = 0, x = 10 - floor(9 / 10) = 10 >= W, so the next
    // window with n = 0: x' = 0, retry = (T0 + 20 - (T0 + 19)) + 0 = 1.
    rig.expect("last ms of the next window", &sc, "alice", 20, sc.denied(19, 1, 1)).await;
    rig.at(20);
    // Two windows after T0 both counts are zero.
    rig.expect("two windows on", &sc, "alice", 20, sc.allowed(0, 10)).await;
}

/// Two windows after the last charge the state acts as new: no previous
/// weight is carried over.
pub async fn sliding_counter_forgets_both_counts_two_windows_later(factory: &dyn ProviderFactory) {
    let sc = CheckPolicy::new(sliding_counter("sc", 10, 1000));
    let rig = Rig::start(factory, &[&sc]).await;
    rig.at(0);
    rig.drain(&sc, "alice", 10).await;
    rig.drain(&sc, "bob", 10).await;
    rig.at(2000);
    // Stored window T0 = ws - 2W: p = 0, n = 0.
    rig.expect("alice two windows on", &sc, "alice", 1, sc.allowed(9, 1000)).await;
    for remaining in (0..9).rev() {
        rig.expect("alice refills the window", &sc, "alice", 1, sc.allowed(remaining, 1000)).await;
    }
    // Same as a first window: x' = 1, retry = 1000 + 1.
    rig.expect("alice over", &sc, "alice", 1, sc.denied(0, 1001, 1000)).await;
    rig.at(3500);
    rig.expect("bob three and a half windows on", &sc, "bob", 1, sc.allowed(9, 500)).await;
}
