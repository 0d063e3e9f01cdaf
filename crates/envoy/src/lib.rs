//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`, gRPC) on
//! Tollgate's limiter: Envoy's `envoy.filters.http.ratelimit` filter (and the network and
//! Thrift ones) call [`serve`]'s `ShouldRateLimit` with a domain and descriptors; Tollgate
//! matches them against descriptor trees configured the way envoyproxy/ratelimit configures
//! them (its YAML files load unchanged with [`load_envoy_config_dir`]) and answers OK or
//! OVER_LIMIT, with the rate limit headers (`X-RateLimit-*`, IETF `RateLimit`) for Envoy to add to the response.
//!
//! ```no_run
//! use tollgate::Limiter;
//! use tollgate_envoy::{Config, Descriptor, Domain, RateLimit, RlsService, Unit, serve};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::new().domain(
//!     Domain::new("edge")
//!         .descriptor(Descriptor::new("remote_address").rate_limit(RateLimit::per(10, Unit::Second)))
//!         .descriptor(
//!             Descriptor::new("api_key")
//!                 .value("gold")
//!                 .rate_limit(RateLimit::per(1000, Unit::Minute)),
//!         ),
//! );
//! let service = RlsService::new(Limiter::builder().build()?, &config)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8081").await?;
//! serve(listener, service, std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Every envoyproxy/ratelimit configuration means here what it means there (wildcards,
//! `replaces`, `shadow_mode`, `quota_mode`, `share_threshold`, `unlimited`, blocklists with
//! `requests_per_unit: 0`), and a request descriptor's `limit` override applies as
//! envoyproxy/ratelimit applies it (see [`MAX_OVERRIDES`]); `docs/envoy.md` lists the
//! deliberate differences. Not supported: `quota` answers, `raw_body` and `dynamic_metadata`.
//!
//! `grpc.health.v1.Health` answers `Check` and streams `Watch` from the service's [`Health`].
//! [`serve_with_io`] runs each connection over a stream of the caller's making (TLS, say).

// The README's Rust examples compile as doc tests of this crate.
#[cfg(all(doctest, feature = "service"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(feature = "client")]
mod client;
mod config;
pub mod proto;
#[cfg(feature = "service")]
mod server;
#[cfg(feature = "service")]
mod service;
// Without the service, the trees are compiled only to validate a configuration.
#[cfg_attr(not(feature = "service"), allow(dead_code, unused_imports))]
mod tree;
mod yaml;

#[cfg(feature = "client")]
pub use client::RlsClient;
pub use config::{
    Config, ConfigError, Descriptor, Domain, OnError, RateLimit, ResetFormat, Unit,
    parse_failure_mode,
};
#[cfg(feature = "service")]
pub use server::{
    Health, MAX_REQUEST_BYTES, RLS_SERVICE_NAME, ServeOptions, serve, serve_with, serve_with_io,
};
#[cfg(feature = "service")]
pub use service::{CallSpan, CallTracer, MAX_DESCRIPTORS, MAX_OVERRIDES, Observer, RlsService};
pub use yaml::{envoy_config_files, load_envoy_config_dir, parse_envoy_config};
