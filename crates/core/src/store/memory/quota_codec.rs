//! A quota as bytes, for the memory store's snapshot: each table of the store is kept with its
//! quota, so a snapshot restores whatever policies wrote it (configured ones, overrides, Envoy
//! descriptors) without asking the caller for them.

use std::time::Duration;

use crate::algorithm::LeakyBucket;
use crate::store::snapshot::{Cursor, Put, SnapshotError, corrupt};
use crate::{Calendar, CalendarUnit, Quota, Rate};

fn unit_code(unit: CalendarUnit) -> u8 {
    match unit {
        CalendarUnit::Day => 1,
        CalendarUnit::Week => 2,
        CalendarUnit::Month => 3,
        CalendarUnit::Year => 4,
    }
}

fn put_rate(out: &mut Vec<u8>, rate: Rate) {
    out.put_u32(rate.count());
    out.put_u64(rate.period_micros());
}

fn rate(c: &mut Cursor<'_>) -> Result<Rate, SnapshotError> {
    let count = c.u32()?;
    let period = c.u64()?;
    Rate::new(count, Duration::from_micros(period)).map_err(|e| corrupt(e.to_string()))
}

/// Appends `quota`.
pub(super) fn encode(quota: &Quota, out: &mut Vec<u8>) {
    match quota {
        Quota::FixedWindow(a) => match a.calendar() {
            Some(c) => {
                out.put_u8(7);
                out.put_u32(a.limit());
                out.put_u8(unit_code(c.unit()));
                out.put_bytes(c.zone_name().as_bytes());
            }
            None => {
                out.put_u8(1);
                out.put_u32(a.limit());
                out.put_u64(a.window_micros());
            }
        },
        Quota::SlidingWindowLog(a) => {
            out.put_u8(2);
            out.put_u32(a.limit());
            out.put_u64(a.window_micros());
        }
        Quota::SlidingWindowCounter(a) => {
            out.put_u8(3);
            out.put_u32(a.limit());
            out.put_u64(a.window_micros());
        }
        Quota::TokenBucket(a) => {
            out.put_u8(4);
            out.put_u32(a.capacity());
            put_rate(out, a.refill());
        }
        Quota::LeakyBucket(a) => {
            out.put_u8(5);
            put_rate(out, a.rate());
            out.put_u32(a.queue());
            let max_delay = a.max_delay().map_or(u64::MAX, |d| {
                u64::try_from(d.as_micros()).unwrap_or(u64::MAX - 1)
            });
            out.put_u64(max_delay);
        }
        Quota::Concurrency(a) => {
            out.put_u8(6);
            out.put_u32(a.limit());
            out.put_u64(a.lease_ttl_micros());
        }
    }
}

/// Reads a quota [`encode`] wrote; `Ok(None)` for one this build cannot make (a time zone it
/// does not know), an error for bytes no encoder wrote.
pub(super) fn decode(c: &mut Cursor<'_>) -> Result<Option<Quota>, SnapshotError> {
    let window = |c: &mut Cursor<'_>| -> Result<(u32, Duration), SnapshotError> {
        Ok((c.u32()?, Duration::from_micros(c.u64()?)))
    };
    let made = match c.u8()? {
        1 => window(c).map(|(l, w)| Quota::fixed_window(l, w))?,
        2 => window(c).map(|(l, w)| Quota::sliding_window_log(l, w))?,
        3 => window(c).map(|(l, w)| Quota::sliding_window_counter(l, w))?,
        4 => {
            let capacity = c.u32()?;
            Quota::token_bucket(capacity, rate(c)?)
        }
        5 => {
            let r = rate(c)?;
            let queue = c.u32()?;
            let max_delay = c.u64()?;
            LeakyBucket::new(r, queue).map(|b| {
                Quota::LeakyBucket(if max_delay == u64::MAX {
                    b
                } else {
                    b.with_max_delay(Duration::from_micros(max_delay))
                })
            })
        }
        6 => window(c).map(|(l, ttl)| Quota::concurrency(l, ttl))?,
        7 => {
            let limit = c.u32()?;
            let unit = match c.u8()? {
                1 => CalendarUnit::Day,
                2 => CalendarUnit::Week,
                3 => CalendarUnit::Month,
                4 => CalendarUnit::Year,
                other => return Err(corrupt(format!("calendar unit {other}"))),
            };
            let zone = std::str::from_utf8(c.bytes()?).map_err(|_| corrupt("a zone name"))?;
            match Calendar::new(unit, zone) {
                Ok(calendar) => Quota::fixed_calendar(limit, calendar),
                Err(_) => return Ok(None),
            }
        }
        other => return Err(corrupt(format!("algorithm code {other}"))),
    };
    made.map(Some).map_err(|e| corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_quota_round_trips() -> Result<(), Box<dyn std::error::Error>> {
        let second = Duration::from_secs(1);
        let quotas = [
            Quota::fixed_window(5, Duration::from_millis(1500))?,
            Quota::fixed_calendar(9, Calendar::new(CalendarUnit::Month, "Europe/Lisbon")?)?,
            Quota::sliding_window_log(7, second)?,
            Quota::sliding_window_counter(100, Duration::from_secs(60))?,
            Quota::token_bucket(20, "3/7s".parse()?)?,
            Quota::leaky_bucket("5/s".parse()?, 10)?,
            Quota::LeakyBucket(LeakyBucket::new("5/s".parse()?, 3)?.with_max_delay(second)),
            Quota::concurrency(4, Duration::from_secs(300))?,
        ];
        for quota in quotas {
            let mut bytes = Vec::new();
            encode(&quota, &mut bytes);
            let mut c = Cursor::new(&bytes);
            assert_eq!(decode(&mut c)?, Some(quota));
            assert!(c.is_empty());
        }
        Ok(())
    }
}
