//! The tower middleware over the [`Engine`](crate::Engine): [`RateLimitLayer`] wraps a
//! service in a [`RateLimitService`], whose calls are checked before they reach it.
//!
//! Like axum middleware that rejects, and unlike tower's own rate limit, it never applies
//! backpressure: `poll_ready` is the inner service's, and a denied request is answered from
//! `call` with a complete 429 (or 401, or 503 when the store fails and the engine fails
//! closed). Admitted requests reach the inner service and their responses get the rate-limit
//! headers; requests no policy matches pass untouched, without even an allocation.

mod body;
mod future;
mod layer;
mod service;

use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http::Extensions;

pub use body::{BodySettle, ResponseBody};
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use service::RateLimitService;

/// How a [`RateLimitService`] makes its response bodies from the inner service's body `B` and
/// from the engine's own answers (a 429's problem+json). Two shapes: [`WrapBody`], the default,
/// for any inner body, and [`InnerBody`], for inner bodies made from `Bytes` (axum's).
pub trait BodyShape<B> {
    /// The response body.
    type Body;

    /// The inner service's body, as a response body.
    fn inner(body: B) -> Self::Body;

    /// The engine's answer, as a response body.
    fn answer(body: Bytes) -> Self::Body;

    /// The inner service's body, fed to `settle` as it streams (a policy that charges what
    /// the response says it cost). A shape that cannot wrap the body settles at once, with
    /// what the response's head says.
    fn metered(body: B, settle: Box<dyn BodySettle>) -> Self::Body;
}

/// The default [`BodyShape`]: [`ResponseBody<B>`], either the inner service's body or the
/// answer's. Works with any inner body.
#[derive(Clone, Copy, Debug, Default)]
pub struct WrapBody;

impl<B> BodyShape<B> for WrapBody {
    type Body = ResponseBody<B>;

    #[inline]
    fn inner(body: B) -> Self::Body {
        ResponseBody::inner(body)
    }

    fn answer(body: Bytes) -> Self::Body {
        ResponseBody::answer(body)
    }

    fn metered(body: B, settle: Box<dyn BodySettle>) -> Self::Body {
        ResponseBody::metered(body, settle)
    }
}

/// The [`BodyShape`] that keeps the inner service's own body type, for bodies that can be made
/// from `Bytes` (axum's `Body`, `Full<Bytes>`): admitted responses pass through unchanged.
/// With axum, whose routes box every response body that is not its own `Body`, this saves an
/// allocation and a layer of indirection on each response. See
/// [`RateLimitLayer::inner_body`].
#[derive(Clone, Copy, Debug, Default)]
pub struct InnerBody;

impl<B: From<Bytes>> BodyShape<B> for InnerBody {
    type Body = B;

    #[inline]
    fn inner(body: B) -> B {
        body
    }

    fn answer(body: Bytes) -> B {
        B::from(body)
    }

    /// The body keeps its own type, so it cannot be read on its way: the cost is what the head
    /// says (a `header:` source, `count_status`); a `json:` source is charged the policy's
    /// cost, and a warning says so once. Use the default shape to read costs from bodies.
    fn metered(body: B, settle: Box<dyn BodySettle>) -> B {
        settle.finish();
        body
    }
}

/// The peer's socket address, for servers to put in request extensions (hyper does not). axum's
/// `ConnectInfo` is read through [`RateLimitLayer::peer_addr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// Finds the peer address in request extensions.
pub type PeerFn = fn(&Extensions) -> Option<IpAddr>;

/// The default [`PeerFn`]: a [`PeerAddr`], a `SocketAddr` or an `IpAddr` in the extensions.
pub fn default_peer(extensions: &Extensions) -> Option<IpAddr> {
    extensions
        .get::<PeerAddr>()
        .map(|p| p.0.ip())
        .or_else(|| extensions.get::<SocketAddr>().map(SocketAddr::ip))
        .or_else(|| extensions.get::<IpAddr>().copied())
}
