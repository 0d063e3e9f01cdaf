//! Tollgate's core: *has this key made too many requests in the current window?*
//!
//! - Six algorithms as pure state machines ([`algorithm`]): fixed window, sliding window log,
//!   sliding window counter (the recommended default), token bucket and leaky bucket limit
//!   requests per time; concurrency limits requests in flight (permits taken on admission and
//!   given back by [`Store::release`]).
//! - [`Quota`], [`Rate`] and [`parse_duration`]: the configuration notation (`"100/1m"`,
//!   `"10/s"`, `"250ms"`) parsed into values that cannot be invalid.
//! - [`Decision`]: allowed, limit, remaining, reset, retry_after, delay, policy.
//! - [`Clock`]: injected time, with [`SystemClock`], [`TokioClock`] and [`ManualClock`].
//! - [`Store`]: applies algorithm steps atomically and all-or-nothing; [`MemoryStore`] is the
//!   embedded default, `tollgate-redis` shares state between instances.
//! - [`Limiter`]: named policies over a store: `check`, `check_all`, `acquire`.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Limiter, Policy, Quota};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("api", Quota::sliding_window_counter(100, Duration::from_secs(60))?)?)
//!     .policy(Policy::new("export", Quota::token_bucket(20, "1/s".parse()?)?)?)
//!     .build()?;
//!
//! let decision = limiter.check("api", "customer-42", 1).await?;
//! assert!(decision.allowed);
//! assert_eq!(decision.remaining, 99);
//! # Ok(())
//! # }
//! ```

// The README's and the library guide's Rust examples compile and run as doc tests of this crate.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct LibraryGuideDoctests;

pub mod algorithm;
mod ban;
pub mod calendar;
mod clock;
mod decision;
mod error;
pub mod headers;
pub mod key_digest;
mod lease;
mod limiter;
mod on_error;
mod policy;
mod quota;
pub mod store;
#[cfg(test)]
mod test_rng;
#[cfg(feature = "test-util")]
pub mod testing;

pub use ban::{Ban, BanRecord, BanState, BanStatus};
pub use calendar::{Calendar, CalendarUnit, Period};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp, TokioClock};
pub use decision::{Decision, Decisions, Outcome, Verdict};
pub use error::{Error, ErrorKind, QuotaError, StoreError};
pub use lease::{DEFAULT_LEASE_TTL, Lease};
pub use limiter::{Limiter, LimiterBuilder, Slot, next_permit};
pub use on_error::{OnError, UNAVAILABLE_RETRY};
pub use policy::{MAX_POLICY_NAME, Policy, intern};
pub use quota::{AlgorithmKind, MAX_PERIOD, Quota, Rate, format_duration, parse_duration};
pub use store::{Check, MemoryStore, Store};
