//! Calendar-window checks (docs/algorithms.md, "Calendar window"): the
//! period holding `t` in the policy's zone, counted as the fixed window
//! counts; `reset_after = e - t`, a denial's `retry_after = max(e - t, 1)`.
//! Times are the worked numbers' epoch milliseconds.

use shared_contract::CalendarPeriod;

use crate::factory::ProviderFactory;
use crate::rig::{CheckPolicy, Rig, T0, calendar_window};

fn calendar(id: &str, limit: u64, period: CalendarPeriod) -> CheckPolicy {
    CheckPolicy::new(calendar_window(id, limit, period))
}

/// Worked numbers (b): limit 3 a month in Berlin. At 2027-01-31T23:59:59.5
/// three pass with remaining 2, 1, 0 and 500 ms to the month's end; the
/// fourth is refused for those 500 ms. February 1st, 00:00 restarts the
/// count, with February's 28 days to its end.
pub async fn calendar_window_restarts_on_the_first_of_the_month(factory: &dyn ProviderFactory) {
    let month = calendar("monthly", 3, CalendarPeriod::Month);
    let rig = Rig::start(factory, &[&month]).await;
    rig.at(1_801_436_399_500 - T0);
    rig.expect("first", &month, "alice", 1, month.allowed(2, 500)).await;
    rig.expect("second", &month, "alice", 1, month.allowed(1, 500)).await;
    rig.expect("third", &month, "alice", 1, month.allowed(0, 500)).await;
    rig.expect("fourth is over the limit", &month, "alice", 1, month.denied(0, 500, 500)).await;
    rig.at(1_801_436_400_000 - T0);
    rig.expect("February 1st", &month, "alice", 1, month.allowed(2, 2_419_200_000)).await;
}

/// Worked numbers (a): a day in Berlin lasts 23 hours on 2027-03-28 and
/// 25 on 2027-10-31; at noon both have 12 hours left, and on 2027-10-31 the
/// second 02:30 (after the clock went back) 21.5 hours.
pub async fn calendar_window_days_follow_the_zones_clock_changes(factory: &dyn ProviderFactory) {
    let day = calendar("daily", 1, CalendarPeriod::Day);
    let rig = Rig::start(factory, &[&day]).await;
    rig.at(1_806_228_000_000 - T0);
    rig.expect("spring noon", &day, "alice", 1, day.allowed(0, 43_200_000)).await;
    rig.expect("refused to midnight", &day, "alice", 1, day.denied(0, 43_200_000, 43_200_000))
        .await;
    rig.at(1_824_946_200_000 - T0);
    rig.expect("the second 02:30", &day, "bob", 1, day.allowed(0, 77_400_000)).await;
    rig.at(1_824_980_400_000 - T0);
    rig.expect("autumn noon, same day", &day, "bob", 1, day.denied(0, 43_200_000, 43_200_000))
        .await;
}

/// Worked numbers (d) and (c): an ISO week runs from Monday, so Sunday
/// 2027-03-28 at noon is 12 hours before its end; 2028 is a leap year (its
/// February ends 12 hours after noon on the 29th, the year 26,481,600 s
/// after it).
pub async fn calendar_window_months_years_and_weeks_end_where_the_calendar_says(
    factory: &dyn ProviderFactory,
) {
    let week = calendar("weekly", 2, CalendarPeriod::Week);
    let month = calendar("monthly", 2, CalendarPeriod::Month);
    let year = calendar("yearly", 2, CalendarPeriod::Year);
    let rig = Rig::start(factory, &[&week, &month, &year]).await;
    rig.at(1_806_228_000_000 - T0);
    rig.expect("Sunday noon", &week, "alice", 1, week.allowed(1, 43_200_000)).await;
    rig.at(1_835_434_800_000 - T0);
    rig.expect("leap day, month", &month, "alice", 1, month.allowed(1, 43_200_000)).await;
    rig.expect("leap day, year", &year, "alice", 1, year.allowed(1, 26_481_600_000)).await;
    rig.expect("and again", &year, "alice", 1, year.allowed(0, 26_481_600_000)).await;
    rig.expect(
        "the year is spent",
        &year,
        "alice",
        1,
        year.denied(0, 26_481_600_000, 26_481_600_000),
    )
    .await;
}
