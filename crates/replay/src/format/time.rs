//! Timestamps as logs write them: `[10/Oct/2000:13:55:36 -0700]` (combined), RFC 3339
//! (`$time_iso8601`), and seconds since the epoch (`$msec`, `1700000000.123`).

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use tollgate::Timestamp;

use super::LineError;

/// Consecutive lines of a log mostly share their second: the last text and its value are kept,
/// so a timestamp is parsed once per second of log rather than once per line.
#[derive(Debug, Default)]
pub(crate) struct TimeCache {
    text: Vec<u8>,
    value: Timestamp,
}

impl TimeCache {
    /// `text` in the combined format's `$time_local` notation.
    pub(crate) fn local(&mut self, text: &[u8]) -> Result<Timestamp, LineError> {
        if !self.text.is_empty() && self.text == text {
            return Ok(self.value);
        }
        let value = std::str::from_utf8(text)
            .ok()
            .and_then(parse_local)
            .ok_or_else(|| LineError::new("the time is not like 10/Oct/2000:13:55:36 -0700"))?;
        self.text.clear();
        self.text.extend_from_slice(text);
        self.value = value;
        Ok(value)
    }
}

/// `10/Oct/2000:13:55:36 -0700`.
pub(crate) fn parse_local(text: &str) -> Option<Timestamp> {
    let format = format_description!(
        "[day]/[month repr:short]/[year]:[hour]:[minute]:[second] [offset_hour sign:mandatory][offset_minute]"
    );
    OffsetDateTime::parse(text, format)
        .ok()
        .and_then(from_datetime)
}

/// RFC 3339, `$time_local`, or seconds since the epoch written as text.
pub(crate) fn parse_text(text: &str) -> Option<Timestamp> {
    let text = text.trim();
    if let Ok(t) = OffsetDateTime::parse(text, &Rfc3339) {
        return from_datetime(t);
    }
    if let Some(t) = parse_local(text.trim_start_matches('[').trim_end_matches(']')) {
        return Some(t);
    }
    text.parse::<f64>().ok().and_then(from_epoch_number)
}

/// Seconds since the epoch (`$msec`: `1700000000.123`); numbers from 10^11 up are taken as
/// milliseconds (in seconds they would be past the year 5000), as many JSON loggers write them.
pub(crate) fn from_epoch_number(n: f64) -> Option<Timestamp> {
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    let seconds = if n >= 1e11 { n / 1_000.0 } else { n };
    let micros = (seconds * 1_000_000.0).round();
    // A float to integer cast saturates; anything this large is no log's time anyway.
    (micros < 1e18).then(|| Timestamp::from_micros(micros as u64))
}

fn from_datetime(t: OffsetDateTime) -> Option<Timestamp> {
    let nanos = t.unix_timestamp_nanos();
    u64::try_from(nanos / 1_000)
        .ok()
        .map(Timestamp::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_notation_gives_the_same_instant() {
        let want = Some(Timestamp::from_secs(971_211_336));
        assert_eq!(parse_local("10/Oct/2000:13:55:36 -0700"), want);
        assert_eq!(parse_text("2000-10-10T20:55:36+00:00"), want);
        assert_eq!(parse_text("2000-10-10T13:55:36-07:00"), want);
        assert_eq!(parse_text("[10/Oct/2000:13:55:36 -0700]"), want);
        assert_eq!(parse_text("971211336"), want);
        assert_eq!(from_epoch_number(971_211_336_000.0), want);
        assert_eq!(
            from_epoch_number(971_211_336.25),
            Some(Timestamp::from_micros(971_211_336_250_000))
        );
    }

    /// RFC 3339 §5.6 lets a space stand for the `T` (`date --rfc-3339=seconds` writes one);
    /// the offset is required either way, since a time without one names no instant.
    #[test]
    fn rfc3339_may_separate_date_and_time_with_a_space() {
        let want = Some(Timestamp::from_secs(971_211_336));
        assert_eq!(parse_text("2000-10-10 20:55:36Z"), want);
        assert_eq!(parse_text("2000-10-10 13:55:36-07:00"), want);
        assert_eq!(parse_text("2000-10-10 20:55:36.000+00:00"), want);
        assert_eq!(parse_text("2000-10-10T20:55:36"), None);
        assert_eq!(parse_text("2000-10-10 20:55:36"), None);
    }

    #[test]
    fn nonsense_is_refused() {
        assert_eq!(parse_local("10/Oct/2000:25:55:36 -0700"), None);
        assert_eq!(parse_text("yesterday"), None);
        assert_eq!(from_epoch_number(-1.0), None);
        assert_eq!(from_epoch_number(f64::NAN), None);
        let mut cache = TimeCache::default();
        assert!(cache.local(b"").is_err());
        assert!(cache.local(b"10/Oct/2000:13:55:36 -0700").is_ok());
        assert!(cache.local(b"10/Oct/2000:13:55:37").is_err());
    }
}
