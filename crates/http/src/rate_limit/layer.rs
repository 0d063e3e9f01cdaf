//! [`RateLimitLayer`]: applies the engine to a service.

use std::marker::PhantomData;

use tollgate::{Clock, MemoryStore, Store, SystemClock};
use tower_layer::Layer;

use super::{InnerBody, PeerFn, RateLimitService, WrapBody, default_peer};
use crate::Engine;

/// Wraps services in a [`RateLimitService`] sharing one [`Engine`]. `K` is how response bodies
/// are made ([`BodyShape`](super::BodyShape)): [`WrapBody`] unless
/// [`inner_body`](Self::inner_body) is called.
#[derive(Debug)]
pub struct RateLimitLayer<S = MemoryStore, C = SystemClock, K = WrapBody> {
    engine: Engine<S, C>,
    peer: PeerFn,
    shape: PhantomData<fn() -> K>,
}

impl<S, C, K> Clone for RateLimitLayer<S, C, K> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            engine: self.engine.clone(),
            peer: self.peer,
            shape: PhantomData,
        }
    }
}

impl<S: Store, C: Clock> RateLimitLayer<S, C> {
    /// The layer for `engine`.
    pub fn new(engine: Engine<S, C>) -> Self {
        RateLimitLayer {
            engine,
            peer: default_peer,
            shape: PhantomData,
        }
    }
}

impl<S: Store, C: Clock, K> RateLimitLayer<S, C, K> {
    /// Responses keep the inner service's body type, which must be constructible from `Bytes`
    /// (the engine's own answers are made that way): axum's `Body`, `Full<Bytes>`. The
    /// default wraps it in [`ResponseBody`](super::ResponseBody), which any body fits but which
    /// axum then boxes on every response. For axum apps:
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use axum::Router;
    /// use axum::routing::get;
    /// use tollgate_http::{Engine, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(Engine::builder().build()?).inner_body();
    /// let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(layer);
    /// # let _ = app;
    /// # Ok(())
    /// # }
    /// ```
    pub fn inner_body(self) -> RateLimitLayer<S, C, InnerBody> {
        RateLimitLayer {
            engine: self.engine,
            peer: self.peer,
            shape: PhantomData,
        }
    }

    /// How to find the peer address in a request's extensions (default: [`default_peer`]). With
    /// axum's `into_make_service_with_connect_info::<SocketAddr>()`:
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::net::SocketAddr;
    /// use axum::extract::ConnectInfo;
    /// use tollgate_http::{Engine, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(Engine::builder().build()?)
    ///     .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`default_peer`]: super::default_peer
    pub fn peer_addr(mut self, peer: PeerFn) -> Self {
        self.peer = peer;
        self
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<S, C> {
        &self.engine
    }
}

impl<T, S: Store, C: Clock, K> Layer<T> for RateLimitLayer<S, C, K> {
    type Service = RateLimitService<T, S, C, K>;

    fn layer(&self, inner: T) -> Self::Service {
        RateLimitService::with_shape(inner, self.engine.clone(), self.peer)
    }
}
