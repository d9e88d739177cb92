//! Token-bucket checks (docs/algorithms.md, "Token bucket"): a missing state
//! is a full bucket at `t`; `k = floor((t - updated_at) / P)` whole periods
//! refill `k * r` tokens and move `updated_at` by `k * P`; a full bucket
//! restarts its clock at `t`; `retry_after = updated_at + ceil((c - tokens) / r) * P - t`;
//! `reset_after = updated_at + ceil((C - tokens) / r) * P - t`, 0 when full.

use std::time::Duration;

use shared_contract::{RateLimitFailure, UnavailableCategory};

use crate::factory::ProviderFactory;
use crate::rig::{CheckPolicy, Rig, token_bucket};

/// A new bucket admits its capacity at once, then one token per period.
pub async fn token_bucket_allows_capacity_then_denies(factory: &dyn ProviderFactory) {
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let rig = Rig::start(factory, &[&tb]).await;
    rig.at(0);
    // updated_at = T0; tokens 4..0, reset = ceil((5 - tokens) / 1) * 100.
    rig.expect("first", &tb, "alice", 1, tb.allowed(4, 100)).await;
    rig.expect("second", &tb, "alice", 1, tb.allowed(3, 200)).await;
    rig.expect("third", &tb, "alice", 1, tb.allowed(2, 300)).await;
    rig.expect("fourth", &tb, "alice", 1, tb.allowed(1, 400)).await;
    rig.expect("fifth", &tb, "alice", 1, tb.allowed(0, 500)).await;
    // tokens 0 < 1: retry = T0 + 1 * 100 - T0 = 100.
    rig.expect("sixth", &tb, "alice", 1, tb.denied(0, 100, 500)).await;
    rig.expect("seventh", &tb, "alice", 1, tb.denied(0, 100, 500)).await;
    rig.at(99);
    // k = 0: retry = T0 + 100 - (T0 + 99) = 1, reset = T0 + 500 - (T0 + 99) = 401.
    rig.expect("one ms short of a token", &tb, "alice", 1, tb.denied(0, 1, 401)).await;
    rig.at(100);
    // k = 1: tokens 1, updated_at = T0 + 100; after the charge reset = 5 * 100.
    rig.expect("a token refilled", &tb, "alice", 1, tb.allowed(0, 500)).await;
}

/// The worked numbers: the partial period after a refill is kept, so the
/// next token arrives on the original period grid.
pub async fn token_bucket_refill_keeps_partial_periods(factory: &dyn ProviderFactory) {
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let rig = Rig::start(factory, &[&tb]).await;
    rig.at(0);
    rig.drain(&tb, "alice", 5).await;
    rig.at(250);
    // k = floor(250 / 100) = 2: tokens 2, updated_at = T0 + 200; after the
    // charge 1 token, reset = T0 + 200 + 4 * 100 - (T0 + 250) = 350.
    rig.expect("two refilled", &tb, "alice", 1, tb.allowed(1, 350)).await;
    rig.at(299);
    // k = floor(99 / 100) = 0; reset = T0 + 200 + 500 - (T0 + 299) = 401.
    rig.expect("last token", &tb, "alice", 1, tb.allowed(0, 401)).await;
    // retry = T0 + 200 + 100 - (T0 + 299) = 1.
    rig.expect("empty", &tb, "alice", 1, tb.denied(0, 1, 401)).await;
    rig.at(300);
    // k = 1 because updated_at stayed T0 + 200; had the partial 50 ms been
    // lost at T0 + 250, no token would be here yet.
    rig.expect("token on the grid", &tb, "alice", 1, tb.allowed(0, 500)).await;
    rig.expect("empty again", &tb, "alice", 1, tb.denied(0, 100, 500)).await;
}

/// A bucket that refills to capacity restarts its refill clock at `t`.
pub async fn token_bucket_full_bucket_restarts_its_refill_clock(factory: &dyn ProviderFactory) {
    let tb = CheckPolicy::new(token_bucket("tb", 5, 1, 100));
    let rig = Rig::start(factory, &[&tb]).await;
    rig.at(0);
    rig.expect("one taken", &tb, "alice", 1, tb.allowed(4, 100)).await;
    rig.at(150);
    // k = 1: tokens min(5, 4 + 1) = 5 = C, so updated_at = T0 + 150 (not
    // T0 + 100); after the charge reset = T0 + 150 + 100 - (T0 + 150) = 100.
    rig.expect("full again", &tb, "alice", 1, tb.allowed(4, 100)).await;
    rig.at(249);
    // k = floor(99 / 100) = 0: reset = T0 + 150 + 2 * 100 - (T0 + 249) = 101.
    rig.expect("no refill yet", &tb, "alice", 1, tb.allowed(3, 101)).await;
    rig.at(250);
    // k = 1: tokens 4, updated_at = T0 + 250: reset = 2 * 100 = 200.
    rig.expect("refill on the new grid", &tb, "alice", 1, tb.allowed(3, 200)).await;
    rig.at(10_000);
    // k = floor(9750 / 100) = 97: tokens min(5, 3 + 97) = 5, clock restarts.
    rig.expect("long after", &tb, "alice", 1, tb.allowed(4, 100)).await;
}

/// Cost above one and refill above one: ceilings in retry and reset.
pub async fn token_bucket_cost_above_one(factory: &dyn ProviderFactory) {
    let tb = CheckPolicy::new(token_bucket("tb", 10, 2, 100).maximum_cost(6));
    let rig = Rig::start(factory, &[&tb]).await;
    rig.at(0);
    // tokens 10 - 6 = 4; reset = ceil(6 / 2) * 100 = 300.
    rig.expect("cost 6", &tb, "alice", 6, tb.allowed(4, 300)).await;
    // 4 < 6: retry = ceil(2 / 2) * 100 = 100.
    rig.expect("cost 6 again", &tb, "alice", 6, tb.denied(4, 100, 300)).await;
    rig.at(150);
    // k = 1: tokens 6, updated_at = T0 + 100; after cost 6: 0 tokens,
    // reset = T0 + 100 + ceil(10 / 2) * 100 - (T0 + 150) = 450.
    rig.expect("cost 6 after a refill", &tb, "alice", 6, tb.allowed(0, 450)).await;
    // retry = T0 + 100 + ceil(5 / 2) * 100 - (T0 + 150) = 250.
    rig.expect("cost 5 on empty", &tb, "alice", 5, tb.denied(0, 250, 450)).await;
    rig.at(399);
    // k = floor(299 / 100) = 2: tokens 4, updated_at = T0 + 300;
    // retry = T0 + 300 + ceil(1 / 2) * 100 - (T0 + 399) = 1,
    // reset = T0 + 300 + ceil(6 / 2) * 100 - (T0 + 399) = 201.
    rig.expect("cost 5 one ms short", &tb, "alice", 5, tb.denied(4, 1, 201)).await;
    rig.at(400);
    // k = 1: tokens 6, updated_at = T0 + 400; after cost 5: 1 token,
    // reset = ceil(9 / 2) * 100 = 500.
    rig.expect("cost 5 at the retry", &tb, "alice", 5, tb.allowed(1, 500)).await;
}

/// A bucket denial still writes its state, so it moves the key's mark:
/// a clock that then steps back beyond the bound is `ClockUnsafe`.
pub async fn token_bucket_denial_still_moves_the_mark(factory: &dyn ProviderFactory) {
    let tb = CheckPolicy::new(
        token_bucket("tb", 1, 1, 10_000).maximum_clock_regression(Duration::from_millis(500)),
    );
    let rig = Rig::start(factory, &[&tb]).await;
    rig.at(0);
    // The one token taken; reset = ceil(1 / 1) * 10_000 = 10_000. Mark T0.
    rig.expect("take the token", &tb, "alice", 1, tb.allowed(0, 10_000)).await;
    rig.at(2000);
    // k = 0: retry = reset = T0 + 10_000 - (T0 + 2000) = 8000; the state is
    // written, so the mark becomes T0 + 2000.
    rig.expect("denied, state written", &tb, "alice", 1, tb.denied(0, 8000, 8000)).await;
    rig.at(1400);
    // M - t = 2000 - 1400 = 600 > 500: retry = 600 - 500 = 100. (Had the
    // denial left the mark at T0, this would be a denial with retry 8600.)
    rig.expect(
        "clock 600 ms behind the denial",
        &tb,
        "alice",
        1,
        Err(RateLimitFailure::Unavailable {
            category: UnavailableCategory::ClockUnsafe,
            retry_after: Duration::from_millis(100),
        }),
    )
    .await;
}
