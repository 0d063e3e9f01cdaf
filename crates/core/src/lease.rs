//! Hot-key leases: a policy's opt-in for stores that several instances share. Instead of one
//! store call per request, an instance takes a batch of the key's quota in one call, spends it
//! locally and returns what it did not use. Stores that keep state in this process (the memory
//! store) have nothing to save and ignore it; `tollgate-redis` honours it (its `docs/redis.md`
//! states and proves how far the instances can over-admit together).

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::clock::duration_micros;
use crate::quota::format_duration;
use crate::{Quota, QuotaError};

/// The longest a lease lives when the policy does not say: one second, and at most a tenth
/// of a window (a sliding window log counts leased units for the window plus this long).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(1);

/// How much of a policy's quota one instance may take at once, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    size: NonZeroU32,
    ttl_micros: u64,
}

impl Lease {
    /// Leases of up to `size` units that an instance spends within `ttl` of taking them.
    pub fn new(size: u32, ttl: Duration) -> Result<Self, QuotaError> {
        let input = format!("lease {size} for {ttl:?}");
        let size = NonZeroU32::new(size)
            .ok_or_else(|| QuotaError::new(&input, "a lease must be at least 1 unit"))?;
        let ttl_micros = duration_micros(ttl);
        if ttl_micros == 0 || ttl > crate::MAX_PERIOD {
            return Err(QuotaError::new(
                &input,
                "a lease's ttl must be above zero and at most 400 days",
            ));
        }
        Ok(Lease { size, ttl_micros })
    }

    /// The ttl a lease of `quota` gets by default: [`DEFAULT_LEASE_TTL`], at most a tenth of
    /// the window of a window algorithm.
    pub fn default_ttl(quota: &Quota) -> Duration {
        let window = match quota {
            Quota::FixedWindow(a) => a.window_micros(),
            Quota::SlidingWindowLog(a) => a.window_micros(),
            Quota::SlidingWindowCounter(a) => a.window_micros(),
            Quota::TokenBucket(_) | Quota::LeakyBucket(_) | Quota::Concurrency(_) => u64::MAX,
        };
        DEFAULT_LEASE_TTL.min(Duration::from_micros((window / 10).max(1)))
    }

    /// The most units one lease takes.
    pub fn size(&self) -> u32 {
        self.size.get()
    }

    /// How long an instance may spend a lease after taking it.
    pub fn ttl(&self) -> Duration {
        Duration::from_micros(self.ttl_micros)
    }

    /// [`ttl`](Self::ttl) in microseconds.
    pub fn ttl_micros(&self) -> u64 {
        self.ttl_micros
    }

    /// Whether `quota` can be leased this way: refused for a leaky bucket (it paces requests
    /// one departure slot at a time; a batch of slots spent locally would break the pace), for
    /// concurrency (a permit is held by one request and given back by it, by id: there is no
    /// batch of them to spend locally), for a lease larger than the quota, and for a window
    /// algorithm whose window is shorter than the ttl.
    pub(crate) fn check(&self, quota: &Quota) -> Result<(), QuotaError> {
        let input = format!("lease {} for {:?} on {quota}", self.size, self.ttl());
        let window = match quota {
            Quota::LeakyBucket(_) => {
                return Err(QuotaError::new(
                    &input,
                    "a leaky bucket paces requests one slot at a time, which a lease spent \
                     locally would not; lease a token bucket (capacity = queue + 1) instead",
                ));
            }
            Quota::Concurrency(_) => {
                return Err(QuotaError::new(
                    &input,
                    "a concurrency limit's permits are held and given back one request at a \
                     time, by id; they cannot be leased",
                ));
            }
            Quota::FixedWindow(a) => Some(a.window_micros()),
            Quota::SlidingWindowLog(a) => Some(a.window_micros()),
            Quota::SlidingWindowCounter(a) => Some(a.window_micros()),
            Quota::TokenBucket(_) => None,
        };
        if self.size() > quota.limit() {
            return Err(QuotaError::new(
                &input,
                "a lease cannot be larger than the quota; lease a small share of it (a lease \
                 is what one instance can hold back from the others)",
            ));
        }
        if window.is_some_and(|w| self.ttl_micros > w) {
            return Err(QuotaError::new(
                &input,
                "a lease's ttl cannot be longer than the window",
            ));
        }
        Ok(())
    }
}

/// In the configuration's notation: `lease=100 lease_ttl=1s`.
impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease={} lease_ttl={}",
            self.size,
            format_duration(self.ttl())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;

    #[test]
    fn leases_are_refused_where_unsound() -> Result<(), QuotaError> {
        let second = Duration::from_secs(1);
        let lease = Lease::new(10, Duration::from_millis(100))?;
        for quota in [
            Quota::fixed_window(100, second)?,
            Quota::sliding_window_log(100, second)?,
            Quota::sliding_window_counter(100, second)?,
            Quota::token_bucket(100, "10/s".parse()?)?,
        ] {
            let p = Policy::new("leased", quota.clone())?.with_lease(lease)?;
            assert_eq!(p.lease(), Some(&lease));
            let plain = Policy::new("leased", quota)?;
            assert_eq!(p.fingerprint(), plain.fingerprint(), "same counters");
        }
        let leaky = Policy::new("pace", Quota::leaky_bucket("10/s".parse()?, 5)?)?;
        assert!(leaky.with_lease(lease).is_err());
        let inflight = Policy::new("inflight", Quota::concurrency(100, second)?)?;
        assert!(inflight.with_lease(lease).is_err());
        let small = Policy::new("small", Quota::fixed_window(5, second)?)?;
        assert!(small.with_lease(lease).is_err(), "larger than the quota");
        let short = Policy::new(
            "short",
            Quota::fixed_window(100, Duration::from_millis(50))?,
        )?;
        assert!(short.with_lease(lease).is_err(), "ttl past the window");
        assert!(Lease::new(0, second).is_err());
        assert!(Lease::new(1, Duration::ZERO).is_err());
        Ok(())
    }

    #[test]
    fn default_ttl_is_a_second_or_a_tenth_of_the_window() -> Result<(), QuotaError> {
        let q = Quota::fixed_window(100, Duration::from_secs(60))?;
        assert_eq!(Lease::default_ttl(&q), Duration::from_secs(1));
        let q = Quota::sliding_window_log(100, Duration::from_secs(2))?;
        assert_eq!(Lease::default_ttl(&q), Duration::from_millis(200));
        let q = Quota::token_bucket(100, "1/h".parse()?)?;
        assert_eq!(Lease::default_ttl(&q), Duration::from_secs(1));
        Ok(())
    }
}
