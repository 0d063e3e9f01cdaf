//! Tollgate for HTTP: rate limiting by route and key, with the response headers and 429s of
//! the Tollgate SPEC (§4, §5).
//!
//! - [`Engine`]: the policy engine, independent of tower. It matches a request against every
//!   [`HttpPolicy`] (routes: [`RouteMatch`]), selects each policy's key ([`KeyChain`] of
//!   [`KeySelector`]s: header, query, user, verified JWT claim, client IP behind
//!   [`TrustedProxies`]), decides all matching policies in one all-or-nothing store call and
//!   says what to do: pass, hold (leaky-bucket `delay`), or answer (429, 401, 503), with the
//!   `X-RateLimit-*`, `RateLimit-Policy`, `RateLimit` and `Retry-After` headers.
//! - [`RateLimitLayer`]: the tower layer over the engine, for axum, hyper and tonic.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Policy, Quota};
//! use tollgate_http::{Engine, HttpPolicy, KeyChain, RateLimitLayer, RouteMatch};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::builder()
//!     .policy(
//!         HttpPolicy::new(Policy::new("api", Quota::sliding_window_counter(100, Duration::from_secs(60))?)?)
//!             .keys(KeyChain::parse(["header:x-api-key", "ip"])?)
//!             .route(RouteMatch::any().path("/v1/**")?),
//!     )
//!     .build()?;
//! let layer = RateLimitLayer::new(engine);
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```

mod cidr;
mod client_ip;
mod engine;
mod error;
pub mod headers;
mod jwt;
mod key;
pub mod problem;
pub mod rate_limit;
mod request;
mod route;

pub use cidr::{Cidr, TrustedProxies};
pub use client_ip::ForwardedHeader;
pub use engine::{
    ANONYMOUS_KEY, Action, DEFAULT_MAX_DELAY, Engine, EngineBuilder, FailMode, Hold, HttpPolicy,
    Outcome, Prepared, RateLimitHeaders, Verdict,
};
pub use error::ConfigError;
pub use headers::{HeaderConfig, ResetFormat, RetryAfterFormat};
pub use jwt::{JwtVerifier, MAX_TOKEN_LEN};
pub use key::{KeyChain, KeySelector, MAX_RAW_KEY, UserId};
pub use rate_limit::{PeerAddr, RateLimitLayer, RateLimitService};
pub use request::RequestInfo;
pub use route::{HostPattern, NormalizedPath, PathPattern, RouteMatch, parse_method};
