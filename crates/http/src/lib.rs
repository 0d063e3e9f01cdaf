//! Tollgate for HTTP: rate limiting by route and key, with the rate-limit response headers
//! (`X-RateLimit-*`, IETF `RateLimit` and `RateLimit-Policy`) and problem+json 429s.
//!
//! - [`Engine`]: the policy engine, independent of tower. It matches a request against every
//!   [`HttpPolicy`] (routes: [`RouteMatch`]), selects each policy's key ([`KeyChain`] of
//!   [`KeySelector`]s: header, query, user, verified JWT claim, client IP behind
//!   [`TrustedProxies`]), decides all matching policies in one all-or-nothing store call and
//!   says what to do: pass, hold (leaky-bucket `delay`), or answer (429, 401, 400, 414, 503), with the
//!   `X-RateLimit-*`, `RateLimit-Policy`, `RateLimit` and `Retry-After` headers.
//! - [`RateLimitLayer`]: the tower layer over the engine, for axum, hyper and tonic.
//!
//! # Behaviour
//!
//! - **All-or-nothing.** Every policy whose route matches is checked in one `check_all` call:
//!   a request denied by any enforcing policy consumes quota from none. Shadow policies are in
//!   that call too, so they count exactly as they would if enforced; only when nothing but
//!   shadow policies denies does a second call count the request against the enforcing ones
//!   (a shadow policy must never change what the others do).
//! - **Keys.** The first selector of a policy's chain that finds a value gives the key, stored
//!   as `header:<name>:<hash>`, `query:<name>:<hash>`, `jwt:<claim>:<hash>`, `user:<id>` (or
//!   `user:#<hash>` above 256 bytes) or `ip:<addr>` / `ip:<net>/<prefix>`. Credential hashes
//!   are 128-bit SipHash-2-4 under a key derived from [`EngineBuilder::key_hash_secret`]; a long
//!   `user` id follows the core's long-key rule ([`tollgate::key_digest`]) under the same
//!   secret. No key: the policy's [`ANONYMOUS_KEY`], or 401 with `require_key`.
//! - **Client IP.** The peer address, unless the peer is in `trusted_proxies`: then the one
//!   configured [`ForwardedHeader`] is walked right to left past trusted hops
//!   ([`client_address`], the walk every door shares); an unreadable hop further left stops at
//!   the last trusted hop, an unreadable right-most one is refused (400). IPv6 clients are
//!   grouped by `ipv6_prefix` (/64).
//! - **Requests that cannot be read** the way an upstream would read them (a host with an
//!   empty port, a target with a fragment, a key field sent twice) are refused with a
//!   [`Refusal`]: the same status and problem+json, naming the field, at every door
//!   ([`normalize`]).
//! - **Paths** are matched normalised (percent-decoding except `%2F`, no empty or `.`
//!   segments, `..` resolved), so `/v1/%2e%2e/admin` is `/admin`.
//! - **Headers**: `X-RateLimit-*` of the most restrictive decision (switchable,
//!   epoch or delta reset), `RateLimit-Policy` listing every matching policy and `RateLimit`
//!   for the most restrictive. On a 429, `t` and `Retry-After` both give the wait until the
//!   request could pass (whole seconds, rounded up, at least 1; `Retry-After` never below
//!   `t`), and the body is RFC 9457 problem+json. A request no policy matches gets none.
//! - **Actions.** `reject` answers 429. `delay` (leaky bucket only) holds the request for its
//!   slot on the limiter's clock, bounded by `max_delay` inside the algorithm, so a request
//!   that would wait longer is refused before it consumes anything; a held request whose
//!   client goes away gives its quota back. `shadow` never blocks, logs at debug level and
//!   adds the headers of what would have happened.
//! - **Store failure** follows [`OnError`](tollgate::OnError): `Allow` (default) passes the request without
//!   rate-limit headers and logs a warning; `Deny` answers 503 with a generic problem+json
//!   body and `Retry-After: 1`. Neither leaks the store's error.
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
pub mod normalize;
pub mod problem;
pub mod rate_limit;
mod refusal;
mod request;
mod route;
pub mod usage;

pub use cidr::{Cidr, TrustedProxies};
pub use client_ip::{ForwardedHeader, client_address};
pub use engine::overrides::{KeyOverride, OverrideError, QuotaFields};
pub use engine::{
    ANONYMOUS_KEY, Action, Answer, BANNED_TITLE, Charge, DEFAULT_MAX_DELAY, Disposition, Engine,
    EngineBuilder, Evaluation, Hold, HttpPolicy, LeaseError, ListAction, ListEntry, ListHit,
    ListSpec, Prepared, QueueTicket, REMOTE_POLL, RateLimitHeaders, Settle, StatusSet,
    UsageCounters,
};
pub use error::ConfigError;
pub use headers::{HeaderConfig, ResetFormat, RetryAfterFormat};
pub use jwt::{JwtVerifier, MAX_TOKEN_LEN};
pub use key::{KeyChain, KeySelector, MAX_RAW_KEY, UserId};
pub use rate_limit::{BodyShape, InnerBody, PeerAddr, RateLimitLayer, RateLimitService, WrapBody};
pub use refusal::Refusal;
pub use request::RequestInfo;
pub use route::{
    HostPattern, MAX_PATH_SEGMENTS, NormalizedPath, PathPattern, PathTooDeep, RouteMatch,
    parse_method,
};
pub use usage::CostFrom;
