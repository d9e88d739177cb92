//! Calendar window (docs/algorithms.md "Calendar window"): a count per period.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use jiff::civil::{Date, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Arguments, Checks, Lua, RateAlgorithm, Run, Step};
use crate::bounds::MAX_COUNT;

/// At most `limit` units per calendar `period` of `time-zone`: "10,000
/// requests a month per API key, reset on the 1st at midnight in Berlin".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CalendarWindow {
    /// Units per period.
    pub limit: u64,
    /// The calendar period a count lives for.
    #[serde(deserialize_with = "by_name")]
    pub period: CalendarPeriod,
    /// The zone whose calendar the periods follow; UTC when left out.
    #[serde(default, deserialize_with = "by_name")]
    pub time_zone: CalendarZone,
}

/// A configured name read through its type's `FromStr`.
fn by_name<'de, D: Deserializer<'de>, T: FromStr<Err: fmt::Display>>(from: D) -> Result<T, D::Error> {
    String::deserialize(from)?.parse().map_err(serde::de::Error::custom)
}

crate::named_enum! {
    /// The calendar period a count lives for.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
    #[serde(rename_all = "lowercase")]
    pub enum CalendarPeriod {
        /// From local midnight to the next (23 or 25 hours across a DST change).
        Day = "day",
        /// An ISO week, from Monday 00:00 to the next Monday 00:00.
        Week = "week",
        /// From the 1st of a month, 00:00, to the 1st of the next.
        Month = "month",
        /// From January 1st, 00:00, to the next January 1st.
        Year = "year",
    }
}

/// A `time-zone` not in the time zone database, as written (cut at 64 chars).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown time zone {0:?}: expected an IANA time zone name such as \"Europe/Berlin\" or \"UTC\""
)]
pub struct UnknownTimeZone(String);

/// The time zone a calendar window's periods are counted in, UTC by default.
#[derive(Clone, PartialEq, Eq)]
pub struct CalendarZone(TimeZone);

impl CalendarZone {
    /// The zone's IANA name as the database spells it.
    pub fn name(&self) -> &str {
        self.0.iana_name().unwrap_or("UTC")
    }
}

impl Default for CalendarZone {
    fn default() -> Self {
        Self(TimeZone::UTC)
    }
}

impl FromStr for CalendarZone {
    type Err = UnknownTimeZone;

    /// Looks the name up case-insensitively; `Etc/Unknown` is refused, as it
    /// would count in UTC under another name.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match TimeZone::get(name) {
            Ok(zone) if !zone.is_unknown() => Ok(Self(zone)),
            _ => {
                let shown = match name.char_indices().nth(64) {
                    Some((at, _)) => format!("{}...", &name[..at]),
                    None => name.to_owned(),
                };
                Err(UnknownTimeZone(shown))
            }
        }
    }
}

impl Serialize for CalendarZone {
    fn serialize<S: Serializer>(&self, to: S) -> Result<S::Ok, S::Error> {
        to.serialize_str(self.name())
    }
}

impl fmt::Debug for CalendarZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CalendarZone").field(&self.name()).finish()
    }
}

/// The latest caller time placed in a calendar: 9998-12-30T00:00:00Z.
const LATEST_MS: u64 = 253_370_592_000_000;

/// The period holding `t` in `zone`: `start <= t < end`. Past 9998-12-30
/// the period holding that day runs on to a day after `t`, so a count
/// still holds under a clock that far ahead.
pub fn bounds(t: u64, period: CalendarPeriod, zone: &CalendarZone) -> (u64, u64) {
    const DAY: u64 = 86_400_000;
    let clamped = t.min(LATEST_MS);
    // Both conversions hold for every clamped time; the fallback (the UTC
    // day) only keeps this total.
    let (start, end) = local_bounds(clamped, period, &zone.0).unwrap_or_else(|| {
        let start = clamped - clamped % DAY;
        (start, start + DAY)
    });
    (start, if t < end { end } else { t.saturating_add(DAY) })
}

fn local_bounds(t: u64, period: CalendarPeriod, tz: &TimeZone) -> Option<(u64, u64)> {
    let now = Timestamp::from_millisecond(i64::try_from(t).ok()?).ok()?;
    let today = tz.to_datetime(now).date();
    let (first, next) = match period {
        CalendarPeriod::Day => (today, today.tomorrow().ok()?),
        CalendarPeriod::Week => {
            let monday = today
                .checked_sub(jiff::Span::new().days(today.weekday().to_monday_zero_offset()))
                .ok()?;
            (monday, monday.checked_add(jiff::Span::new().weeks(1)).ok()?)
        }
        CalendarPeriod::Month => (today.first_of_month(), today.last_of_month().tomorrow().ok()?),
        CalendarPeriod::Year => (today.first_of_year(), today.last_of_year().tomorrow().ok()?),
    };
    let epoch_ms = |date| u64::try_from(first_instant(date, tz)?.as_millisecond().max(0)).ok();
    Some((epoch_ms(first)?, epoch_ms(next)?))
}

/// The first instant of `date` in `tz` (or of a later date, if it is skipped).
fn first_instant(date: Date, tz: &TimeZone) -> Option<Timestamp> {
    let midnight = date.to_datetime(Time::midnight());
    match tz.to_ambiguous_timestamp(midnight).offset() {
        AmbiguousOffset::Unambiguous { offset } | AmbiguousOffset::Fold { before: offset, .. } => {
            offset.to_timestamp(midnight).ok()
        }
        AmbiguousOffset::Gap { after, .. } => {
            // Midnight read with the later offset is an instant before the
            // jump, less than the jump's length before it.
            let before_jump = after.to_timestamp(midnight).ok()?;
            tz.following(before_jump).next().map(|transition| transition.timestamp())
        }
    }
}

/// A calendar window key's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalendarWindowState {
    /// Start of the period the count belongs to, epoch ms.
    pub period_start: u64,
    /// Units charged in that period.
    pub count: u64,
}

impl RateAlgorithm for CalendarWindow {
    const NAME: &'static str = "calendar-window";
    const TAG: u8 = b'P';
    const KEYS: &'static [&'static str] = &["limit", "period", "time-zone"];
    const DEFAULTED: &'static [&'static str] = &["time-zone"];
    const WINDOW_MOVES: bool = true;
    const LUA: Lua = Lua {
        file: "calendar-window.lua",
        source: include_str!("calendar-window.lua"),
        function: "calendar_window",
        arity: 4,
        header: 25,
    };
    const WINDOWED: bool = true;
    // A refusal writes nothing, and the count it saw holds until the
    // period ends, whatever the cost.
    const REFUSAL_STAYS: bool = true;
    type State = CalendarWindowState;

    fn limit(&self) -> u64 {
        self.limit
    }

    /// The length of the period holding the caller's time.
    fn quota_window(&self, now: impl FnOnce() -> u64) -> Option<Duration> {
        let (start, end) = bounds(now(), self.period, &self.time_zone);
        Some(Duration::from_millis(end - start))
    }

    fn check(&self, checks: &mut Checks) -> bool {
        checks.count("limit", self.limit, MAX_COUNT)
    }

    /// Counts as the fixed window does, in the period holding `run.t`.
    fn step(&self, state: Option<&CalendarWindowState>, run: &Run<'_>) -> Step<CalendarWindowState> {
        let (start, end) = bounds(run.t, self.period, &self.time_zone);
        let n = match state {
            Some(&CalendarWindowState { period_start, count }) if period_start == start => count,
            _ => 0,
        };
        Step::count(self.limit, n, (start, end), run, |count| CalendarWindowState {
            period_start: start,
            count,
        })
    }

    fn debt(&self, state: &CalendarWindowState, t: u64) -> u64 {
        let current = state.period_start == bounds(t, self.period, &self.time_zone).0;
        if current { state.count.saturating_sub(self.limit) } else { 0 }
    }

    fn scaled(&self, share: &dyn Fn(u64) -> u64) -> Self {
        Self { limit: share(self.limit), ..self.clone() }
    }

    /// The limit, the period holding `t` and the next period's end, where the
    /// script's effective time may lie (docs/algorithms.md "Calendar window").
    fn arguments(&self, t: u64) -> Arguments {
        let (start, end) = bounds(t, self.period, &self.time_zone);
        let (_, next_end) = bounds(end, self.period, &self.time_zone);
        Arguments::of(&[self.limit, start, end, next_end])
    }

    fn decode([period_start, count, _]: [u64; 3]) -> Option<CalendarWindowState> {
        Some(CalendarWindowState { period_start, count })
    }
}

#[cfg(test)]
mod tests {
    use super::super::AlgorithmState;
    use super::*;

    /// Runs a calendar window of `limit` per `period` in `zone` at `t`,
    /// charging, storing what it writes (the memory provider's way: the
    /// bounds at the key's effective time).
    fn apply(
        limit: u64,
        period: CalendarPeriod,
        zone: &CalendarZone,
        state: &mut Option<AlgorithmState>,
        t: u64,
        cost: u64,
    ) -> Step<AlgorithmState> {
        let calendar = CalendarWindow { limit, period, time_zone: zone.clone() };
        let step = super::super::tests::apply(calendar, state, t, cost);
        if let Some((_, state_end)) = step.write {
            assert_eq!(state_end, bounds(t, period, zone).1);
        }
        step
    }

    fn stored(period_start: u64, count: u64) -> Option<AlgorithmState> {
        Some(AlgorithmState::CalendarWindow(CalendarWindowState { period_start, count }))
    }

    fn zone(name: &str) -> CalendarZone {
        name.parse().unwrap()
    }

    const DAY: u64 = 86_400_000;

    // docs/algorithms.md, "Calendar window", worked numbers (a): a DST day
    // in Europe/Berlin, a request at 12:00 local.
    const SPRING_NOON: u64 = 1_806_228_000_000;
    const SPRING_DAY: (u64, u64) = (1_806_188_400_000, 1_806_271_200_000);
    const AUTUMN_NOON: u64 = 1_824_980_400_000;
    const AUTUMN_SECOND_0230: u64 = 1_824_946_200_000;
    const AUTUMN_DAY: (u64, u64) = (1_824_933_600_000, 1_825_023_600_000);

    #[test]
    fn a_dst_day_lasts_23_or_25_hours() {
        let berlin = zone("Europe/Berlin");
        assert_eq!(bounds(SPRING_NOON, CalendarPeriod::Day, &berlin), SPRING_DAY);
        assert_eq!(SPRING_DAY.1 - SPRING_DAY.0, 82_800_000);
        assert_eq!(SPRING_DAY.1 - SPRING_NOON, 43_200_000);
        assert_eq!(bounds(AUTUMN_NOON, CalendarPeriod::Day, &berlin), AUTUMN_DAY);
        assert_eq!(AUTUMN_DAY.1 - AUTUMN_DAY.0, 90_000_000);
        assert_eq!(AUTUMN_DAY.1 - AUTUMN_NOON, 43_200_000);
        // The second 02:30 of the day (after the clock went back) is the
        // same day.
        assert_eq!(bounds(AUTUMN_SECOND_0230, CalendarPeriod::Day, &berlin), AUTUMN_DAY);
        assert_eq!(AUTUMN_DAY.1 - AUTUMN_SECOND_0230, 77_400_000);
        // The bounds themselves: a period holds its start, not its end.
        assert_eq!(bounds(SPRING_DAY.0, CalendarPeriod::Day, &berlin), SPRING_DAY);
        assert_eq!(bounds(SPRING_DAY.1 - 1, CalendarPeriod::Day, &berlin), SPRING_DAY);
        assert_eq!(bounds(SPRING_DAY.1, CalendarPeriod::Day, &berlin).0, SPRING_DAY.1);
    }

    // Worked numbers (b): a month end, limit 3, Europe/Berlin.
    const JANUARY_LAST_HALF_SECOND: u64 = 1_801_436_399_500;
    const JANUARY: (u64, u64) = (1_798_758_000_000, 1_801_436_400_000);
    const FEBRUARY_FIRST: u64 = 1_801_436_400_000;
    const FEBRUARY_2027: (u64, u64) = (1_801_436_400_000, 1_803_855_600_000);

    #[test]
    fn a_month_end_restarts_the_count() {
        let berlin = zone("Europe/Berlin");
        let month = CalendarPeriod::Month;
        assert_eq!(bounds(JANUARY_LAST_HALF_SECOND, month, &berlin), JANUARY);
        let mut state = None;
        for expected in [2, 1, 0] {
            let step = apply(3, month, &berlin, &mut state, JANUARY_LAST_HALF_SECOND, 1);
            assert!(step.allowed);
            assert_eq!((step.remaining, step.reset_after, step.retry_after), (expected, 500, 0));
        }
        let denied = apply(3, month, &berlin, &mut state, JANUARY_LAST_HALF_SECOND, 1);
        assert!(!denied.allowed);
        assert_eq!((denied.remaining, denied.retry_after, denied.reset_after), (0, 500, 500));
        assert_eq!(state, stored(JANUARY.0, 3));

        assert_eq!(bounds(FEBRUARY_FIRST, month, &berlin), FEBRUARY_2027);
        assert_eq!(FEBRUARY_2027.1 - FEBRUARY_2027.0, 2_419_200_000);
        let next = apply(3, month, &berlin, &mut state, FEBRUARY_FIRST, 1);
        assert!(next.allowed);
        assert_eq!((next.remaining, next.reset_after), (2, 2_419_200_000));
        assert_eq!(state, stored(FEBRUARY_2027.0, 1));
    }

    // Worked numbers (c): a leap year, Europe/Berlin, 2028-02-29 12:00.
    const LEAP_DAY_NOON: u64 = 1_835_434_800_000;
    const FEBRUARY_2028: (u64, u64) = (1_832_972_400_000, 1_835_478_000_000);
    const YEAR_2028: (u64, u64) = (1_830_294_000_000, 1_861_916_400_000);
    const YEAR_2027: (u64, u64) = (1_798_758_000_000, 1_830_294_000_000);

    #[test]
    fn a_leap_year_has_a_29_day_february_and_366_days() {
        let berlin = zone("Europe/Berlin");
        assert_eq!(bounds(LEAP_DAY_NOON, CalendarPeriod::Month, &berlin), FEBRUARY_2028);
        assert_eq!((FEBRUARY_2028.1 - FEBRUARY_2028.0) / 1000, 2_505_600);
        assert_eq!(FEBRUARY_2028.1 - LEAP_DAY_NOON, 43_200_000);
        assert_eq!(bounds(LEAP_DAY_NOON, CalendarPeriod::Year, &berlin), YEAR_2028);
        assert_eq!((YEAR_2028.1 - YEAR_2028.0) / 1000, 31_622_400);
        assert_eq!(YEAR_2028.1 - LEAP_DAY_NOON, 26_481_600_000);
        assert_eq!(bounds(YEAR_2027.0, CalendarPeriod::Year, &berlin), YEAR_2027);
        assert_eq!((YEAR_2027.1 - YEAR_2027.0) / 1000, 31_536_000);
    }

    // Worked numbers (d): ISO weeks, Europe/Berlin.
    const SPRING_WEEK: (u64, u64) = (1_805_670_000_000, 1_806_271_200_000);
    const NEW_YEAR_MORNING: u64 = 1_798_794_000_000;
    const NEW_YEAR_WEEK: (u64, u64) = (1_798_412_400_000, 1_799_017_200_000);

    #[test]
    fn an_iso_week_starts_on_monday() {
        let berlin = zone("Europe/Berlin");
        assert_eq!(bounds(SPRING_NOON, CalendarPeriod::Week, &berlin), SPRING_WEEK);
        assert_eq!((SPRING_WEEK.1 - SPRING_WEEK.0) / 1000, 601_200);
        assert_eq!(bounds(NEW_YEAR_MORNING, CalendarPeriod::Week, &berlin), NEW_YEAR_WEEK);
        assert_eq!((NEW_YEAR_WEEK.1 - NEW_YEAR_WEEK.0) / 1000, 604_800);
        assert_eq!(NEW_YEAR_WEEK.1 - NEW_YEAR_MORNING, 223_200_000);
        // Sunday's last millisecond is still the week; Monday 00:00 is the next.
        assert_eq!(bounds(SPRING_WEEK.1 - 1, CalendarPeriod::Week, &berlin), SPRING_WEEK);
        assert_eq!(bounds(SPRING_WEEK.1, CalendarPeriod::Week, &berlin).0, SPRING_WEEK.1);
    }

    // Worked numbers (e): a midnight that does not exist, and a day that
    // does not exist.
    const SANTIAGO_NOON: u64 = 1_662_908_400_000;
    const SANTIAGO_DAY: (u64, u64) = (1_662_868_800_000, 1_662_951_600_000);
    const SANTIAGO_DAY_BEFORE_NOON: u64 = 1_662_825_600_000;
    const SANTIAGO_DAY_BEFORE: (u64, u64) = (1_662_782_400_000, 1_662_868_800_000);
    const APIA_29TH_NOON: u64 = 1_325_196_000_000;
    const APIA_29TH: (u64, u64) = (1_325_152_800_000, 1_325_239_200_000);
    const APIA_31ST_NOON: u64 = 1_325_282_400_000;
    const APIA_31ST: (u64, u64) = (1_325_239_200_000, 1_325_325_600_000);

    #[test]
    fn a_skipped_midnight_starts_the_day_at_the_transition() {
        let santiago = zone("America/Santiago");
        assert_eq!(bounds(SANTIAGO_NOON, CalendarPeriod::Day, &santiago), SANTIAGO_DAY);
        assert_eq!(SANTIAGO_DAY.1 - SANTIAGO_DAY.0, 82_800_000);
        assert_eq!(
            bounds(SANTIAGO_DAY_BEFORE_NOON, CalendarPeriod::Day, &santiago),
            SANTIAGO_DAY_BEFORE
        );
        // jiff's own start of day gives the same instant for this gap.
        let noon = Timestamp::from_millisecond(SANTIAGO_NOON as i64).unwrap();
        let start_of_day = noon.to_zoned_datetime(santiago.0.clone()).start_of_day().unwrap();
        assert_eq!(start_of_day.timestamp().as_millisecond() as u64, SANTIAGO_DAY.0);

        let apia = zone("Pacific/Apia");
        assert_eq!(bounds(APIA_29TH_NOON, CalendarPeriod::Day, &apia), APIA_29TH);
        assert_eq!(bounds(APIA_31ST_NOON, CalendarPeriod::Day, &apia), APIA_31ST);
    }

    #[test]
    fn periods_tile_the_time_line_across_every_change() {
        // Zones with midnight gaps, a skipped date, half-hour DST and none.
        let zones = [
            "Europe/Berlin",
            "America/Santiago",
            "Asia/Beirut",
            "America/Sao_Paulo",
            "Pacific/Apia",
            "Australia/Lord_Howe",
            "Asia/Kolkata",
        ];
        let hour = 3_600_000;
        for name in zones {
            let zone = zone(name);
            for period in [CalendarPeriod::Day, CalendarPeriod::Week, CalendarPeriod::Month] {
                // From 2000 to 2040, each period starts where the last ended
                // and holds every time inside it.
                let (mut start, mut end) = bounds(946_684_800_000, period, &zone);
                while start < 2_208_988_800_000 {
                    assert!(end - start >= 22 * hour, "{name} {period:?} {start}..{end}");
                    assert_eq!(bounds(start + (end - start) / 2, period, &zone), (start, end));
                    assert_eq!(bounds(end - 1, period, &zone), (start, end));
                    let next = bounds(end, period, &zone);
                    assert_eq!(next.0, end, "{name} {period:?}");
                    (start, end) = next;
                }
            }
        }
    }

    #[test]
    fn utc_is_the_default_and_names_are_checked() {
        assert_eq!(CalendarZone::default().name(), "UTC");
        assert_eq!(bounds(0, CalendarPeriod::Year, &CalendarZone::default()), (0, 31_536_000_000));
        assert_eq!(zone("europe/berlin").name(), "Europe/Berlin");
        let bad = "Europe/Berlim".parse::<CalendarZone>().unwrap_err();
        assert_eq!(bad, UnknownTimeZone("Europe/Berlim".to_owned()));
        assert!(bad.to_string().contains("\"Europe/Berlim\""), "{bad}");
        assert!("Etc/Unknown".parse::<CalendarZone>().is_err());
        assert!("".parse::<CalendarZone>().is_err());
        // A long value is cut in the message, not echoed whole.
        let long = "x".repeat(10_000).parse::<CalendarZone>().unwrap_err().to_string();
        assert!(long.len() < 200 && long.contains(&format!("\"{}...\"", "x".repeat(64))), "{long}");
        for period in
            [CalendarPeriod::Day, CalendarPeriod::Week, CalendarPeriod::Month, CalendarPeriod::Year]
        {
            assert_eq!(period.name().parse::<CalendarPeriod>(), Ok(period));
        }
        let bad = "fortnight".parse::<CalendarPeriod>().unwrap_err();
        assert!(bad.to_string().contains("\"fortnight\""), "{bad}");
    }

    #[test]
    fn any_time_has_bounds_and_never_panics() {
        let zones =
            ["UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago", "America/Santiago"].map(zone);
        let periods = [
            CalendarPeriod::Day,
            CalendarPeriod::Week,
            CalendarPeriod::Month,
            CalendarPeriod::Year,
        ];
        for zone in &zones {
            for period in periods {
                for t in [0, 1, 86_399_999, LATEST_MS - 1, LATEST_MS] {
                    let (start, end) = bounds(t, period, zone);
                    assert!(start <= t && t < end, "{t} {period:?} {zone:?}: {start}..{end}");
                }
                // Later times count in the period holding 9998-12-30, run
                // on to a day after them: a count holds, the limit too.
                let (latest_start, latest_end) = bounds(LATEST_MS, period, zone);
                for t in [latest_end, latest_end + 1, i64::MAX as u64, u64::MAX - 1] {
                    assert_eq!(bounds(t, period, zone), (latest_start, t.saturating_add(DAY)));
                    let mut state = None;
                    for (remaining, later) in [(2, 0), (1, DAY / 2), (0, DAY - 1)] {
                        let at = t.saturating_add(later);
                        let step = apply(3, period, zone, &mut state, at, 1);
                        assert!(step.allowed && step.remaining == remaining, "{t} +{later}");
                    }
                    let refused = apply(3, period, zone, &mut state, t.saturating_add(DAY), 1);
                    assert!(!refused.allowed, "{t} {period:?} {zone:?}: a fourth in one period");
                }
            }
        }
        // A zone west of Greenwich at 0: its day began before 1970.
        assert_eq!(bounds(0, CalendarPeriod::Day, &zones[2]), (0, 39_600_000));
    }
}
