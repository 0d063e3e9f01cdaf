//! Calendar periods: a day, an ISO week (from Monday), a month or a year, in an IANA time zone.
//!
//! [`Calendar::period`] is a pure function from an instant to the period that contains it, as
//! two instants in microseconds since the Unix epoch: no I/O, no clock. The zone's rules are
//! read once, when the calendar is built, from the time zone database bundled into the binary
//! (so periods never depend on the host's `/usr/share/zoneinfo`).
//!
//! A period starts at the first instant whose local date is its first day, and ends where the
//! next one starts. A day is 23 or 25 hours long across a daylight-saving change; a month is 28
//! to 31 days; a year 365 or 366. When local midnight does not exist (a change at midnight skips
//! it), the day starts when the clocks jump; when it happens twice, at the first of the two.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::Arc;

use jiff::tz::{AmbiguousOffset, TimeZone};

use crate::QuotaError;

const DAY_SECS: i64 = 86_400;
const MICROS: i64 = 1_000_000;

/// The length of a calendar period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// `day`: from local midnight to the next.
    Day,
    /// `week`: an ISO week, from Monday's local midnight to the next Monday's.
    Week,
    /// `month`: from the first day of a month to the first of the next.
    Month,
    /// `year`: from January 1st to the next.
    Year,
}

impl CalendarUnit {
    /// Every unit.
    pub const ALL: [CalendarUnit; 4] = [
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
        CalendarUnit::Year,
    ];

    /// The configuration name (`"month"`).
    pub fn as_str(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }

    /// The nominal length in seconds: 86,400 for a day, 604,800 for a week, and the mean
    /// Gregorian month (2,629,746) and year (31,556,952). What headers advertise as `w`, since a
    /// period of the calendar has no one length.
    pub fn nominal_secs(self) -> u64 {
        match self {
            CalendarUnit::Day => 86_400,
            CalendarUnit::Week => 604_800,
            CalendarUnit::Month => 2_629_746,
            CalendarUnit::Year => 31_556_952,
        }
    }
}

impl fmt::Display for CalendarUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CalendarUnit {
    type Err = QuotaError;

    fn from_str(s: &str) -> Result<Self, QuotaError> {
        CalendarUnit::ALL
            .into_iter()
            .find(|u| u.as_str() == s)
            .ok_or_else(|| {
                QuotaError::new(
                    s,
                    "unknown calendar period; use \"day\", \"week\", \"month\" or \"year\"",
                )
            })
    }
}

/// One period: `[start, end)`, in microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Period {
    /// The period's first instant.
    pub start: u64,
    /// The next period's first instant.
    pub end: u64,
}

/// Periods of one unit in one time zone.
#[derive(Clone)]
pub struct Calendar {
    unit: CalendarUnit,
    zone: TimeZone,
    zone_name: Arc<str>,
}

impl Calendar {
    /// Periods of `unit` in the IANA zone `zone` (`"Europe/Lisbon"`, `"UTC"`); errors on a zone
    /// the bundled database does not know.
    pub fn new(unit: CalendarUnit, zone: &str) -> Result<Self, QuotaError> {
        let tz = TimeZone::get(zone).map_err(|_| {
            QuotaError::new(
                zone,
                "unknown time zone; use an IANA name such as \"UTC\", \"Europe/Lisbon\" or \
                 \"America/New_York\"",
            )
        })?;
        Ok(Calendar {
            unit,
            zone: tz,
            zone_name: Arc::from(zone),
        })
    }

    /// Periods of `unit` in UTC.
    pub fn utc(unit: CalendarUnit) -> Self {
        Calendar {
            unit,
            zone: TimeZone::UTC,
            zone_name: Arc::from("UTC"),
        }
    }

    /// The unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The zone's name, as given.
    pub fn zone_name(&self) -> &str {
        &self.zone_name
    }

    /// The zone's rules.
    pub fn zone(&self) -> &TimeZone {
        &self.zone
    }

    /// The period that contains `now` (µs since the epoch): `start <= now < end`. Instants past
    /// the year 9999 fall in one last period that never ends.
    pub fn period(&self, now: u64) -> Period {
        let forever = Period {
            start: now,
            end: crate::algorithm::MAX_TIME,
        };
        let Ok(micros) = i64::try_from(now) else {
            return forever;
        };
        let Ok(at) = jiff::Timestamp::from_microsecond(micros) else {
            return forever;
        };
        let offset = i64::from(self.zone.to_offset(at).seconds());
        let local_day = (micros.div_euclid(MICROS) + offset).div_euclid(DAY_SECS);
        let (first, next) = self.first_days(local_day);
        match (self.day_start(first), self.day_start(next)) {
            (Some(start), Some(end)) if start <= now && now < end => Period { start, end },
            (_, Some(end)) if now < end => Period { start: now, end },
            _ => forever,
        }
    }

    /// The first day (days since 1970-01-01) of the period that contains local day `day`, and
    /// of the next period.
    fn first_days(&self, day: i64) -> (i64, i64) {
        match self.unit {
            CalendarUnit::Day => (day, day + 1),
            CalendarUnit::Week => {
                // 1970-01-01 was a Thursday: Monday is 0.
                let first = day - (day + 3).rem_euclid(7);
                (first, first + 7)
            }
            CalendarUnit::Month => {
                let (y, m, _) = civil_from_days(day);
                let next = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (days_from_civil(y, m, 1), days_from_civil(next.0, next.1, 1))
            }
            CalendarUnit::Year => {
                let (y, _, _) = civil_from_days(day);
                (days_from_civil(y, 1, 1), days_from_civil(y + 1, 1, 1))
            }
        }
    }

    /// The first instant (µs) of local day `day`: its midnight, or where the clocks jump when a
    /// change skips midnight, or the first of two midnights. `None` outside jiff's range.
    fn day_start(&self, day: i64) -> Option<u64> {
        let (y, m, d) = civil_from_days(day);
        let date = jiff::civil::Date::new(i16::try_from(y).ok()?, m as i8, d as i8).ok()?;
        let midnight = day * DAY_SECS;
        let secs = match self
            .zone
            .to_ambiguous_timestamp(date.to_datetime(jiff::civil::Time::midnight()))
            .offset()
        {
            AmbiguousOffset::Unambiguous { offset } => midnight - i64::from(offset.seconds()),
            // Midnight twice: the first, under the offset before the change.
            AmbiguousOffset::Fold { before, .. } => midnight - i64::from(before.seconds()),
            // No midnight: the day starts at the jump, the first change after the instant that
            // midnight would be under the later offset (the earlier of the two readings).
            AmbiguousOffset::Gap { after, .. } => {
                let early = midnight - i64::from(after.seconds());
                let at = jiff::Timestamp::from_second(early).ok()?;
                let jump = self.zone.following(at).next()?;
                return u64::try_from(jump.timestamp().as_microsecond()).ok();
            }
        };
        u64::try_from(secs.checked_mul(MICROS)?).ok()
    }
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Calendar({} in {})", self.unit, self.zone_name)
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit && self.zone_name == other.zone_name
    }
}

impl Eq for Calendar {}

impl Hash for Calendar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.unit.hash(state);
        self.zone_name.hash(state);
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date of a day since 1970-01-01 (H. Hinnant's `civil_from_days`).
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
