//! [`RateLimitLayer`]: applies the engine to a service.

use tollgate::{Clock, MemoryStore, Store, SystemClock};
use tower_layer::Layer;

use super::{PeerFn, RateLimitService, default_peer};
use crate::Engine;

/// Wraps services in a [`RateLimitService`] sharing one [`Engine`].
#[derive(Debug)]
pub struct RateLimitLayer<S = MemoryStore, C = SystemClock> {
    engine: Engine<S, C>,
    peer: PeerFn,
}

impl<S, C> Clone for RateLimitLayer<S, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            engine: self.engine.clone(),
            peer: self.peer,
        }
    }
}

impl<S: Store, C: Clock> RateLimitLayer<S, C> {
    /// The layer for `engine`.
    pub fn new(engine: Engine<S, C>) -> Self {
        RateLimitLayer {
            engine,
            peer: default_peer,
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

impl<T, S: Store, C: Clock> Layer<T> for RateLimitLayer<S, C> {
    type Service = RateLimitService<T, S, C>;

    fn layer(&self, inner: T) -> Self::Service {
        RateLimitService::new(inner, self.engine.clone(), self.peer)
    }
}
