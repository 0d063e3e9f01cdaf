#![allow(clippy::unwrap_used, clippy::expect_used)]

use jiff::ToSpan;
use jiff::civil::Date;
use proptest::prelude::*;

use super::*;

const HOUR: u64 = 3_600_000_000;

/// µs since the epoch of a UTC date and time.
fn utc(y: i16, mo: i8, d: i8, h: i8, mi: i8) -> u64 {
    let ts = jiff::civil::date(y, mo, d)
        .at(h, mi, 0, 0)
        .to_zoned_datetime(TimeZone::UTC)
        .unwrap()
        .timestamp();
    u64::try_from(ts.as_microsecond()).unwrap()
}

fn cal(unit: CalendarUnit, zone: &str) -> Calendar {
    Calendar::new(unit, zone).unwrap()
}

#[test]
fn lisbon_days_across_daylight_saving_are_23_and_25_hours() {
    let day = cal(CalendarUnit::Day, "Europe/Lisbon");
    // 2027-03-28: clocks go from 01:00 WET to 02:00 WEST.
    let p = day.period(utc(2027, 3, 28, 12, 0));
    assert_eq!(p.start, utc(2027, 3, 28, 0, 0));
    assert_eq!(p.end, utc(2027, 3, 28, 23, 0));
    assert_eq!(p.end - p.start, 23 * HOUR);
    // 2027-10-31: clocks go from 02:00 WEST back to 01:00 WET.
    let p = day.period(utc(2027, 10, 31, 12, 0));
    assert_eq!(p.start, utc(2027, 10, 30, 23, 0));
    assert_eq!(p.end, utc(2027, 11, 1, 0, 0));
    assert_eq!(p.end - p.start, 25 * HOUR);
    // The last microsecond of a day belongs to it, the next to the next day.
    let end = p.end;
    assert_eq!(day.period(end - 1).end, end);
    assert_eq!(day.period(end).start, end);
}

#[test]
fn months_and_leap_years() {
    let month = cal(CalendarUnit::Month, "Europe/Lisbon");
    let p = month.period(utc(2027, 2, 14, 9, 30));
    assert_eq!(p.start, utc(2027, 2, 1, 0, 0));
    assert_eq!(p.end, utc(2027, 3, 1, 0, 0));
    assert_eq!(p.end - p.start, 28 * 24 * HOUR);
    let p = month.period(utc(2028, 2, 29, 23, 59));
    assert_eq!(p.end - p.start, 29 * 24 * HOUR);
    // January 2027 in Lisbon (UTC+0 in winter) ends at 2027-02-01T00:00Z.
    let p = month.period(utc(2027, 1, 31, 23, 59));
    assert_eq!(p.end, utc(2027, 2, 1, 0, 0));
    // A month that spans a change: March 2027 is 31 days less an hour.
    let p = month.period(utc(2027, 3, 5, 0, 0));
    assert_eq!(p.end - p.start, 31 * 24 * HOUR - HOUR);

    let year = cal(CalendarUnit::Year, "UTC");
    let p = year.period(utc(2028, 6, 1, 0, 0));
    assert_eq!(
        (p.start, p.end),
        (utc(2028, 1, 1, 0, 0), utc(2029, 1, 1, 0, 0))
    );
    assert_eq!(p.end - p.start, 366 * 24 * HOUR);
    // New York's year starts at 05:00 UTC.
    let p = cal(CalendarUnit::Year, "America/New_York").period(utc(2027, 1, 1, 4, 0));
    assert_eq!(p.end, utc(2027, 1, 1, 5, 0));
}

#[test]
fn weeks_start_on_monday() {
    let week = cal(CalendarUnit::Week, "UTC");
    // 2027-02-01 is a Monday.
    let p = week.period(utc(2027, 2, 3, 10, 0));
    assert_eq!(
        (p.start, p.end),
        (utc(2027, 2, 1, 0, 0), utc(2027, 2, 8, 0, 0))
    );
    let p = week.period(utc(2027, 2, 7, 23, 59));
    assert_eq!(p.start, utc(2027, 2, 1, 0, 0));
    let p = week.period(utc(2027, 2, 8, 0, 0));
    assert_eq!(p.start, utc(2027, 2, 8, 0, 0));
    // A week across Lisbon's spring change is 167 hours.
    let p = cal(CalendarUnit::Week, "Europe/Lisbon").period(utc(2027, 3, 28, 12, 0));
    assert_eq!(p.end - p.start, 167 * HOUR);
}

#[test]
fn a_day_without_midnight_starts_when_the_clocks_jump() {
    // São Paulo 2018-11-04: clocks went from 00:00 to 01:00 (-03 to -02).
    let day = cal(CalendarUnit::Day, "America/Sao_Paulo");
    let p = day.period(utc(2018, 11, 4, 12, 0));
    assert_eq!(p.start, utc(2018, 11, 4, 3, 0));
    assert_eq!(p.end - p.start, 23 * HOUR);
    // The day before ended there too.
    assert_eq!(day.period(p.start - 1).end, p.start);
}

#[test]
fn far_instants_and_unknown_zones() {
    let day = Calendar::utc(CalendarUnit::Day);
    let p = day.period(u64::MAX);
    assert_eq!(p.end, crate::algorithm::MAX_TIME);
    assert_eq!(
        day.period(0),
        Period {
            start: 0,
            end: 86_400_000_000
        }
    );
    assert!(Calendar::new(CalendarUnit::Day, "Mars/Olympus_Mons").is_err());
    assert!("fortnight".parse::<CalendarUnit>().is_err());
    assert_eq!("week".parse::<CalendarUnit>(), Ok(CalendarUnit::Week));
}

/// Kwajalein crossed the date line in 1993 and never lived 21 August: the day of the 20th ends
/// at the start of the 22nd, and the day after is the 22nd, both 24 hours long.
#[test]
fn a_skipped_day_is_no_period() {
    let day = cal(CalendarUnit::Day, "Pacific/Kwajalein");
    let at = |s: &str| s.parse::<jiff::Timestamp>().unwrap().as_microsecond() as u64;
    let twentieth = day.period(at("1993-08-20T12:00:00Z"));
    assert_eq!(twentieth.start, at("1993-08-20T12:00:00Z"));
    assert_eq!(twentieth.end, at("1993-08-21T12:00:00Z"));
    let twenty_second = day.period(twentieth.end);
    assert_eq!(twenty_second.start, twentieth.end);
    assert_eq!(twenty_second.end, at("1993-08-22T12:00:00Z"));
}

#[test]
fn civil_arithmetic_matches_jiff() {
    for day in (-800_000..2_932_000).step_by(97) {
        let (y, m, d) = civil_from_days(day);
        let date = Date::new(y as i16, m as i8, d as i8).unwrap();
        let epoch = Date::new(1970, 1, 1).unwrap();
        let since = date.duration_since(epoch).as_secs() / 86_400;
        assert_eq!(since, day, "{date}");
        assert_eq!(days_from_civil(y, m, d), day);
    }
}

fn zones() -> Vec<String> {
    let mut names: Vec<String> = jiff::tz::db().available().map(|n| n.to_string()).collect();
    names.sort();
    names
}

/// The first days of the period that contains `date`, and of the next, by jiff's own date
/// arithmetic.
fn reference_days(unit: CalendarUnit, date: Date) -> (Date, Date) {
    match unit {
        CalendarUnit::Day => (date, date.tomorrow().unwrap()),
        CalendarUnit::Week => {
            let back = i64::from(date.weekday().to_monday_zero_offset());
            let first = date.checked_sub(back.days()).unwrap();
            (first, first.checked_add(7.days()).unwrap())
        }
        CalendarUnit::Month => {
            let first = date.first_of_month();
            (first, first.checked_add(1.month()).unwrap())
        }
        CalendarUnit::Year => {
            let first = date.first_of_year();
            (first, first.checked_add(1.year()).unwrap())
        }
    }
}

/// `day`, or the first later day that `zone` lives through: a zone may skip a whole day, as
/// Pacific/Kwajalein skipped 1993-08-21 when it crossed the date line.
fn lived_day(zone: &TimeZone, day: Date) -> Date {
    day.to_zoned_datetime(zone.clone()).unwrap().date()
}

fn local_date(zone: &TimeZone, micros: u64) -> Date {
    jiff::Timestamp::from_microsecond(micros as i64)
        .unwrap()
        .to_zoned_datetime(zone.clone())
        .date()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]

    /// Against jiff: the period contains `now`; its start is the first instant of the first day
    /// jiff's arithmetic names (the instant before is on an earlier date), its end the first
    /// instant of the next period's first day; where midnight exists once, both are the
    /// instants of jiff's own `start_of_day`.
    #[test]
    fn periods_match_jiff(
        now in 63_072_000_000_000u64..4_102_444_800_000_000,
        zone_index in any::<prop::sample::Index>(),
        unit_index in 0usize..4,
    ) {
        let names = zones();
        let name = &names[zone_index.index(names.len())];
        let unit = CalendarUnit::ALL[unit_index];
        let calendar = cal(unit, name);
        let zone = calendar.zone().clone();
        let p = calendar.period(now);
        prop_assert!(p.start <= now && now < p.end, "{name} {unit}: {p:?} {now}");
        let (first, next) = reference_days(unit, local_date(&zone, now));
        let (first, next) = (lived_day(&zone, first), lived_day(&zone, next));
        if p.start > 0 {
            prop_assert_eq!(local_date(&zone, p.start), first, "{} {}", name, unit);
            prop_assert!(local_date(&zone, p.start - 1) < first, "{} {}", name, unit);
        }
        prop_assert_eq!(local_date(&zone, p.end), next, "{} {}", name, unit);
        prop_assert!(local_date(&zone, p.end - 1) < next, "{} {}", name, unit);
        for (day, instant) in [(first, p.start), (next, p.end)] {
            let midnight = zone.to_ambiguous_timestamp(day.to_datetime(jiff::civil::Time::midnight()));
            if let AmbiguousOffset::Unambiguous { .. } = midnight.offset() {
                let jiff_start = day.to_zoned_datetime(zone.clone()).unwrap().start_of_day().unwrap();
                let jiff_micros = jiff_start.timestamp().as_microsecond();
                if jiff_micros >= 0 && (day != first || p.start > 0) {
                    prop_assert_eq!(instant as i64, jiff_micros, "{} {} {}", name, unit, day);
                }
            }
        }
    }
}
