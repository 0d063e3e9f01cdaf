//! `CL.THROTTLE key max_burst count_per_period period [quantity]`, redis-cell's command, on
//! Tollgate's core: a token bucket of `max_burst + 1` refilled one unit per emission interval,
//! decided by a [`Limiter`] over any [`Store`] (so instances sharing a Redis store share these
//! counts too), answered with redis-cell's five integers ([`crate::cell`]).
//!
//! Every distinct `(max_burst, count, period)` is one [`Policy`], all under the one name
//! [`POLICY_NAME`]: a policy's name is interned for the life of the process, so names must not
//! follow client input, and its fingerprint covers the quota, so distinct quotas keep distinct
//! states. Unlike redis-cell, which keeps one state per key whatever the arguments, a key
//! throttled under new numbers starts afresh, as Tollgate's reloads do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tollgate::{Clock, Limiter, MAX_PERIOD, MemoryStore, Policy, Quota, Rate, Store, SystemClock};

use crate::cell::{self, CellReply};

/// The name of every policy `CL.THROTTLE` creates. A configured policy of this name and the
/// very same token bucket would share its counts.
pub const POLICY_NAME: &str = "cl.throttle";

/// The default bound on distinct `(max_burst, count, period)` sets kept built.
pub const DEFAULT_MAX_QUOTAS: usize = 10_000;

/// How many quotas each connection keeps at hand, so that its checks take no shared lock.
const CONNECTION_SLOTS: usize = 4;

/// An error of `CL.THROTTLE`, as its reply carries it after the `-`: redis-cell's own text for
/// what redis-cell refuses (`Cell error: Store error: ...`), `ERR ...` for what only Tollgate
/// refuses (negative numbers, quotas beyond its range, a failing store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThrottleError(String);

impl ThrottleError {
    /// The error line, without the leading `-`.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ThrottleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ThrottleError {}

/// A quota of `CL.THROTTLE`, built once per distinct argument set.
#[derive(Debug)]
pub(crate) struct CellQuota {
    policy: Policy,
    limit: i64,
    /// The bucket's interval: redis-cell's, rounded up to a whole microsecond.
    interval_ns: i64,
}

type QuotaKey = (i64, i64, i64);

/// The quotas one connection used last, checked before the shared cache.
#[derive(Debug, Default)]
pub(crate) struct QuotaSlots {
    slots: [Option<(QuotaKey, Arc<CellQuota>)>; CONNECTION_SLOTS],
    next: usize,
}

impl QuotaSlots {
    #[inline]
    fn get(&self, key: QuotaKey) -> Option<&Arc<CellQuota>> {
        self.slots
            .iter()
            .flatten()
            .find(|(k, _)| *k == key)
            .map(|(_, q)| q)
    }

    fn put(&mut self, key: QuotaKey, quota: Arc<CellQuota>) {
        self.slots[self.next] = Some((key, quota));
        self.next = (self.next + 1) % CONNECTION_SLOTS;
    }
}

/// `CL.THROTTLE` over a limiter's store and clock.
#[derive(Debug)]
pub struct Throttle<S = MemoryStore, C = SystemClock> {
    limiter: Limiter<S, C>,
    max_quotas: usize,
    quotas: Mutex<HashMap<QuotaKey, Arc<CellQuota>>>,
}

impl<S: Store, C: Clock> Throttle<S, C> {
    /// `CL.THROTTLE` deciding through `limiter` (its store and clock; its own policies play no
    /// part), keeping up to [`DEFAULT_MAX_QUOTAS`] distinct quotas built.
    pub fn new(limiter: Limiter<S, C>) -> Self {
        Throttle {
            limiter,
            max_quotas: DEFAULT_MAX_QUOTAS,
            quotas: Mutex::default(),
        }
    }

    /// Keeps up to `max` distinct `(max_burst, count, period)` quotas built. Past it the cache
    /// starts over: that only costs rebuilding them, since their counts live in the store.
    pub fn with_max_quotas(mut self, max: usize) -> Self {
        self.max_quotas = max.max(1);
        self
    }

    /// The limiter deciding.
    pub fn limiter(&self) -> &Limiter<S, C> {
        &self.limiter
    }

    /// `CL.THROTTLE` with its arguments as they come off the wire, the command name left out:
    /// `key max_burst count_per_period period [quantity]`.
    ///
    /// A store that cannot decide is answered `-ERR` and its error; the door's [`Handler`]
    /// answers it by its decider's failure rule instead
    /// ([`Decide::store_failed`](crate::Decide::store_failed)).
    ///
    /// [`Handler`]: crate::Handler
    pub async fn throttle(&self, args: &[&[u8]]) -> Result<CellReply, ThrottleError> {
        self.throttle_with(&mut QuotaSlots::default(), args, |e| {
            Err(format!("ERR {e}"))
        })
        .await
    }

    /// [`throttle`](Self::throttle), looking quotas up in a connection's slots first, and
    /// answering a store that cannot decide by `on_store_error`: `Ok(())` admits the request
    /// uncounted, an error line refuses it.
    pub(crate) async fn throttle_with(
        &self,
        slots: &mut QuotaSlots,
        args: &[&[u8]],
        on_store_error: impl FnOnce(tollgate::Error) -> Result<(), String>,
    ) -> Result<CellReply, ThrottleError> {
        let [key, max_burst, count, period, rest @ ..] = args else {
            return Err(ThrottleError(cell::USAGE.to_owned()));
        };
        if rest.len() > 1 {
            return Err(ThrottleError(cell::USAGE.to_owned()));
        }
        let number = |arg: &[u8]| {
            cell::parse_i64(arg).ok_or_else(|| ThrottleError(cell::not_an_integer(arg)))
        };
        let quota_key = (number(max_burst)?, number(count)?, number(period)?);
        let quantity = match rest.first() {
            Some(arg) => number(arg)?,
            None => 1,
        };
        let quota = match slots.get(quota_key) {
            Some(quota) => Arc::clone(quota),
            None => {
                let quota = self.quota(quota_key)?;
                slots.put(quota_key, Arc::clone(&quota));
                quota
            }
        };
        if quantity < 0 {
            return Err(ThrottleError(
                "ERR CL.THROTTLE: a negative quantity is not supported".to_owned(),
            ));
        }
        self.decide(&quota, key, quantity, on_store_error).await
    }

    /// The quota for `(max_burst, count, period)`, from the shared cache or built.
    fn quota(&self, key: QuotaKey) -> Result<Arc<CellQuota>, ThrottleError> {
        let mut quotas = self.quotas.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(quota) = quotas.get(&key) {
            return Ok(Arc::clone(quota));
        }
        let quota = Arc::new(build(key)?);
        if quotas.len() >= self.max_quotas {
            quotas.clear();
        }
        quotas.insert(key, Arc::clone(&quota));
        Ok(quota)
    }

    /// Decides `quantity` for `key`. A quantity over the limit is refused with no retry time,
    /// as redis-cell refuses it, reporting the key's state as it stands (a peek).
    ///
    /// When the store cannot decide, `on_store_error` does: admitted, the answer is
    /// `[0, limit, 0, -1, 0]` (the limit is the caller's own number; the key's state is
    /// unknown, so nothing remains and nothing resets, as `TOLLGATE.CHECK` answers zeros). A
    /// quantity over the limit needs no store to be refused: `[1, limit, 0, -1, 0]`.
    async fn decide(
        &self,
        quota: &CellQuota,
        key: &[u8],
        quantity: i64,
        on_store_error: impl FnOnce(tollgate::Error) -> Result<(), String>,
    ) -> Result<CellReply, ThrottleError> {
        let over = quantity > quota.limit;
        // Not over the limit, so at most `u32::MAX` (the limit is a bucket's capacity).
        let cost = if over { 0 } else { quantity as u32 };
        let decision = match self.limiter.check_policy(&quota.policy, key, cost).await {
            Ok(decision) => decision,
            Err(e) if matches!(e.kind(), tollgate::ErrorKind::Store(_)) => {
                let unknown = |limited| CellReply {
                    limited,
                    limit: quota.limit,
                    remaining: 0,
                    retry_after: -1,
                    reset_after: 0,
                };
                if over {
                    return Ok(unknown(true));
                }
                return on_store_error(e)
                    .map(|()| unknown(false))
                    .map_err(ThrottleError);
            }
            Err(e) => return Err(ThrottleError(format!("ERR {e}"))),
        };
        let ttl = nanos(decision.reset);
        Ok(if over {
            cell::reply(quota.limit, quota.interval_ns, true, ttl, None)
        } else {
            cell::reply(
                quota.limit,
                quota.interval_ns,
                !decision.allowed,
                ttl,
                decision.retry_after.map(nanos),
            )
        })
    }
}

/// A duration of a decision (at most a bucket's span, a hundred years) in nanoseconds.
fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// The token bucket redis-cell's arguments describe, or the error redis-cell (or, beyond
/// redis-cell's sense, Tollgate) gives for them.
fn build((max_burst, count, period): QuotaKey) -> Result<CellQuota, ThrottleError> {
    let interval_ns = cell::emission_interval_ns(count, period);
    if interval_ns == 0 {
        return Err(ThrottleError(cell::ZERO_RATE.to_owned()));
    }
    // redis-cell computes on with these, into negative limits and intervals; its answers then
    // mean nothing, so Tollgate refuses them.
    if interval_ns < 0 {
        return Err(ThrottleError(
            "ERR CL.THROTTLE: a negative rate is not supported (count per period and period \
             must be positive)"
                .to_owned(),
        ));
    }
    let Some(capacity) = max_burst
        .checked_add(1)
        .and_then(|limit| u32::try_from(limit).ok())
        .filter(|&c| c > 0)
    else {
        return Err(ThrottleError(
            "ERR CL.THROTTLE: max_burst must be 0 to 4294967294".to_owned(),
        ));
    };
    let interval_us = (interval_ns as u64).div_ceil(1_000);
    // The bucket refills one token each interval, and a refill period is at most MAX_PERIOD;
    // the period redis-cell is given may be longer when its count is larger.
    if Duration::from_micros(interval_us) > MAX_PERIOD {
        return Err(ThrottleError(format!(
            "ERR CL.THROTTLE: the interval between two tokens (period / count) must be at \
             most 400 days (max_burst {max_burst}, count_per_period {count}, period {period})"
        )));
    }
    let quota = Rate::new(1, Duration::from_micros(interval_us))
        .and_then(|rate| Quota::token_bucket(capacity, rate))
        .and_then(|quota| Policy::new(POLICY_NAME, quota))
        .map_err(|e| {
            ThrottleError(format!(
                "ERR CL.THROTTLE: {} (max_burst {max_burst}, count_per_period {count}, period \
                 {period})",
                e.reason()
            ))
        })?;
    Ok(CellQuota {
        policy: quota,
        limit: i64::from(capacity),
        interval_ns: (interval_us * 1_000) as i64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};
    use tollgate::{ManualClock, Timestamp};

    /// The memory store decides on the first poll.
    fn now<F: Future>(f: F) -> F::Output {
        match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("the memory store waited"),
        }
    }

    fn throttle() -> (Throttle<MemoryStore, ManualClock>, ManualClock) {
        let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
        let limiter = Limiter::builder()
            .clock(clock.clone())
            .build()
            .expect("no policies");
        (Throttle::new(limiter), clock)
    }

    fn call(t: &Throttle<MemoryStore, ManualClock>, line: &str) -> Result<[i64; 5], String> {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        now(t.throttle(&args))
            .map(CellReply::to_array)
            .map_err(|e| e.message().to_owned())
    }

    /// redis-cell's README example and its arithmetic for a limit of 5 at 1 per second.
    #[test]
    fn answers_as_redis_cell() {
        let (t, clock) = throttle();
        assert_eq!(call(&t, "user123 15 30 60"), Ok([0, 16, 15, -1, 2]));
        assert_eq!(call(&t, "k 4 1 1 6"), Ok([1, 5, 5, -1, 0]));
        for remaining in (0..5).rev() {
            assert_eq!(
                call(&t, "k 4 1 1"),
                Ok([0, 5, remaining, -1, 5 - remaining])
            );
        }
        assert_eq!(call(&t, "k 4 1 1"), Ok([1, 5, 0, 1, 5]));
        clock.advance(Duration::from_millis(3_000));
        assert_eq!(call(&t, "k 4 1 1"), Ok([0, 5, 2, -1, 3]));
        clock.advance(Duration::from_millis(100));
        assert_eq!(call(&t, "k 4 1 1"), Ok([0, 5, 1, -1, 4]));
        clock.advance(Duration::from_millis(900));
        assert_eq!(call(&t, "k 4 1 1"), Ok([0, 5, 1, -1, 4]));
        clock.advance(Duration::from_millis(4_000));
        assert_eq!(call(&t, "k 4 1 1"), Ok([0, 5, 4, -1, 1]));
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(call(&t, "k 4 1 1"), Ok([0, 5, 4, -1, 1]));
        assert_eq!(call(&t, "k 4 1 1 0"), Ok([0, 5, 4, -1, 1]));
        assert_eq!(call(&t, "k 4 1 1 2"), Ok([0, 5, 2, -1, 3]));
        assert_eq!(call(&t, "k 4 1 1 5"), Ok([1, 5, 2, 3, 3]));
    }

    #[test]
    fn errors_read_as_redis_cell_and_tollgate() {
        let (t, _) = throttle();
        let usage = Err(cell::USAGE.to_owned());
        assert_eq!(call(&t, "k 1 1"), usage);
        assert_eq!(call(&t, "k 1 1 1 1 1"), usage);
        assert_eq!(
            call(&t, "k x 1 1"),
            Err("Cell error: Store error: Couldn't parse as integer: x".to_owned())
        );
        assert_eq!(
            call(&t, "k 1 1 1 1.5"),
            Err("Cell error: Store error: Couldn't parse as integer: 1.5".to_owned())
        );
        assert_eq!(call(&t, "k 1 0 1"), Err(cell::ZERO_RATE.to_owned()));
        assert_eq!(call(&t, "k 1 1 0"), Err(cell::ZERO_RATE.to_owned()));
        assert!(call(&t, "k -1 1 1").is_err_and(|e| e.starts_with("ERR CL.THROTTLE: max_burst")));
        assert!(call(&t, "k 1 -1 1").is_err_and(|e| e.contains("negative rate")));
        assert!(call(&t, "k 1 1 1 -1").is_err_and(|e| e.contains("negative quantity")));
        assert!(call(&t, "k 4294967295 1 1").is_err());
        assert!(call(&t, "k 4294967294 1000000 1").is_ok());
        assert!(call(&t, "k 1000 1 10000000").is_err_and(|e| e.contains("100 years")));
        // The bound is on the interval between two tokens, not on the period: 800 days for
        // two tokens is 400 days each, and a day more is refused, saying so.
        assert!(call(&t, "k 0 2 69120000").is_ok());
        assert!(
            call(&t, "k 0 2 69120002").is_err_and(|e| e.contains("interval between two tokens"))
        );
        // Every refusal of Tollgate's own reads `ERR CL.THROTTLE: ...`, the arguments after
        // the colon where they help.
        for line in [
            "k -1 1 1",
            "k 1 -1 1",
            "k 1 1 1 -1",
            "k 4294967295 1 1",
            "k 1000 1 10000000",
            "k 5 1 34560001",
        ] {
            let e = call(&t, line).unwrap_err();
            assert!(e.starts_with("ERR CL.THROTTLE: "), "{line}: {e}");
        }
        assert_eq!(
            call(&t, "k 5 1 34560001"),
            Err(
                "ERR CL.THROTTLE: the interval between two tokens (period / count) must be at \
                 most 400 days (max_burst 5, count_per_period 1, period 34560001)"
                    .to_owned()
            )
        );
        // Both signs negative make a positive rate, as in redis-cell.
        assert_eq!(call(&t, "n 0 -1 -60"), Ok([0, 1, 0, -1, 60]));
    }

    #[test]
    fn the_quota_cache_is_bounded_and_starts_over() {
        let (t, _) = throttle();
        let t = t.with_max_quotas(3);
        for burst in 0..10 {
            assert!(call(&t, &format!("k {burst} 1 1")).is_ok());
            let len = t.quotas.lock().map(|q| q.len()).unwrap_or(0);
            assert!(len <= 3, "{len}");
        }
    }
}
