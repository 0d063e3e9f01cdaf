//! Tollgate's Redis-protocol door: any Redis client, pipelining or not, in RESP2 or RESP3,
//! asks for decisions.
//!
//! - `CL.THROTTLE key max_burst count_per_period period [quantity]`, answered exactly as the
//!   redis-cell module answers it (five integers; its errors too), on Tollgate's token bucket
//!   and store: [`Throttle`], [`cell`].
//! - `TOLLGATE.CHECK policy key [cost]`: a decision under configured policies, through a
//!   [`Decide`] the server implements ([`LimiterDecide`] over a plain [`tollgate::Limiter`]).
//! - `PING`, `ECHO`, `HELLO` (2 or 3), `QUIT`, `AUTH`, `SELECT 0`, `CLIENT`, `COMMAND`,
//!   `CONFIG GET`, `INFO`: what clients send on connect, answered as Redis answers them.
//! - `MULTI`, `EXEC`, `DISCARD` (and `UNWATCH`): Redis's transactions, each queued command
//!   run in order at `EXEC`; `WATCH` is refused.
//! - An optional password, as Redis's `requirepass` ([`Handler::with_password`]).
//! - [`serve`]: the listener, bounded by [`Limits`] (connections, request size, pipelining
//!   depth, idle and write timeouts), with a graceful drain; [`serve_over`] the same through a
//!   [`Transport`] such as TLS.
//! - [`codec`]: the RESP request parser and reply writer.
//!
//! ```no_run
//! use tollgate::{Limiter, Policy, Quota};
//! use tollgate_resp::{Handler, Limits, serve};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("api", Quota::token_bucket(100, "10/s".parse()?)?)?)
//!     .build()?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:6380").await?;
//! serve(listener, Handler::for_limiter(limiter), Limits::default(), async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```

pub mod cell;
pub mod codec;
mod decide;
mod handler;
mod server;
mod throttle;

pub use codec::Protocol;
pub use decide::{CheckError, CheckReply, Decide, LimiterDecide};
pub use handler::{CHECK_FIELDS, Handler};
pub use server::{Limits, Plain, Transport, serve, serve_over};
pub use throttle::{DEFAULT_MAX_QUOTAS, POLICY_NAME, Throttle, ThrottleError};
