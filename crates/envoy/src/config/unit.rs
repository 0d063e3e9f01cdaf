//! [`Unit`]: the time unit of an envoyproxy/ratelimit limit, its length, and its numbers in the
//! two protobuf enums that carry it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
#[cfg(feature = "service")]
use crate::proto::envoy::r#type::v3::RateLimitUnit;

/// The time unit of an envoyproxy/ratelimit limit (`unit:` in its YAML).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day (86,400 s).
    Day,
    /// One week (7 days).
    Week,
    /// One month, counted as 30 days.
    Month,
    /// One year, counted as 365 days.
    Year,
}

impl Unit {
    /// The unit's length.
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// The unit in `RateLimitResponse.RateLimit.Unit` (`WEEK` is 7, after `YEAR`).
    pub(crate) fn proto(self) -> ProtoUnit {
        match self {
            Unit::Second => ProtoUnit::Second,
            Unit::Minute => ProtoUnit::Minute,
            Unit::Hour => ProtoUnit::Hour,
            Unit::Day => ProtoUnit::Day,
            Unit::Week => ProtoUnit::Week,
            Unit::Month => ProtoUnit::Month,
            Unit::Year => ProtoUnit::Year,
        }
    }

    /// The unit numbered `n` in `envoy.type.v3.RateLimitUnit` (a descriptor's `limit`
    /// override); `None` for `UNKNOWN` and numbers a newer Envoy may add.
    #[cfg(feature = "service")]
    pub(crate) fn from_rate_limit_unit(n: i32) -> Option<Unit> {
        Some(match RateLimitUnit::try_from(n).ok()? {
            RateLimitUnit::Unknown => return None,
            RateLimitUnit::Second => Unit::Second,
            RateLimitUnit::Minute => Unit::Minute,
            RateLimitUnit::Hour => Unit::Hour,
            RateLimitUnit::Day => Unit::Day,
            RateLimitUnit::Week => Unit::Week,
            RateLimitUnit::Month => Unit::Month,
            RateLimitUnit::Year => Unit::Year,
        })
    }

    /// The unit whose length is `d` exactly, if any.
    pub(crate) fn of_duration(d: Duration) -> Option<Unit> {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ]
        .into_iter()
        .find(|u| u.duration() == d)
    }
}

impl FromStr for Unit {
    type Err = String;

    /// `second`, `minute`, `hour`, `day`, `week`, `month`, `year`, any case (as
    /// envoyproxy/ratelimit reads them).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "second" => Ok(Unit::Second),
            "minute" => Ok(Unit::Minute),
            "hour" => Ok(Unit::Hour),
            "day" => Ok(Unit::Day),
            "week" => Ok(Unit::Week),
            "month" => Ok(Unit::Month),
            "year" => Ok(Unit::Year),
            _ => Err(format!(
                "invalid rate limit unit {:?}: use second, minute, hour, day, week, month or year",
                s.chars().take(40).collect::<String>()
            )),
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        })
    }
}
