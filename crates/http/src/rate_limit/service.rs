//! [`RateLimitService`]: checks each request with the engine before the inner service sees it.

use std::marker::PhantomData;
use std::task::{Context, Poll};

use http::{Request, Response};
use tollgate::{Clock, MemoryStore, Store, SystemClock};
use tower_service::Service;

use super::future::ResponseFuture;
use super::{BodyShape, PeerFn, WrapBody};
use crate::{Answer, Disposition, Engine, Hold, Prepared, RateLimitHeaders, RequestInfo};

/// The rate-limited service. Clones share the engine (and so the counters). `K` is how
/// response bodies are made ([`BodyShape`]).
#[derive(Debug)]
pub struct RateLimitService<T, S = MemoryStore, C = SystemClock, K = WrapBody> {
    inner: T,
    engine: Engine<S, C>,
    peer: PeerFn,
    shape: PhantomData<fn() -> K>,
}

impl<T: Clone, S, C, K> Clone for RateLimitService<T, S, C, K> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            engine: self.engine.clone(),
            peer: self.peer,
            shape: PhantomData,
        }
    }
}

impl<T, S: Store, C: Clock> RateLimitService<T, S, C> {
    /// `inner`, checked by `engine`, finding the peer address with `peer`.
    pub fn new(inner: T, engine: Engine<S, C>, peer: PeerFn) -> Self {
        Self::with_shape(inner, engine, peer)
    }
}

impl<T, S: Store, C: Clock, K> RateLimitService<T, S, C, K> {
    /// [`new`](RateLimitService::new), making response bodies the `K` way.
    pub fn with_shape(inner: T, engine: Engine<S, C>, peer: PeerFn) -> Self {
        RateLimitService {
            inner,
            engine,
            peer,
            shape: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<S, C> {
        &self.engine
    }
}

impl<T, S, C, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<T, S, C, K>
where
    T: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
    S: Store,
    C: Clock,
    K: BodyShape<ResBody>,
    K::Body: Send + 'static,
{
    type Response = Response<K::Body>;
    type Error = T::Error;
    type Future = ResponseFuture<T::Future, K, ResBody, T::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // No backpressure of our own: denials are answered, not waited for.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The peer is looked up only if a key needs the client's address, the host only if a
        // route matches on it.
        let info = RequestInfo::for_layer(&request, self.peer, self.engine.reads_host());
        let prepared = self.engine.prepare(&info);
        if prepared.is_empty() {
            return ResponseFuture::passthrough(self.inner.call(request));
        }
        // The memory store decides here and now: the inner service, which was polled ready,
        // takes the request directly and nothing is boxed.
        let (later, settle) = match self.engine.disposition_now(&prepared) {
            Some((headers, disposition, settle)) => match disposition {
                Disposition::Pass if settle.is_none() => {
                    return ResponseFuture::admitted(self.inner.call(request), headers);
                }
                Disposition::Pass => (Later::Pass(headers), settle),
                Disposition::Respond(response) => {
                    return ResponseFuture::answered(answer::<K, ResBody>(*response));
                }
                Disposition::Hold(hold) => (Later::Hold(hold, headers), settle),
            },
            None => (Later::Decide(prepared), None),
        };
        // A remote store to wait for, or a hold: the inner service that was polled ready goes
        // with the request into a boxed future; this one keeps a fresh clone for the next call
        // (the usual tower idiom for async middleware).
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let engine = self.engine.clone();
        ResponseFuture::boxed(Box::pin(async move {
            let (headers, settle) = match later {
                Later::Pass(headers) => (headers, settle),
                Later::Hold(hold, headers) => {
                    hold.wait().await;
                    (headers, settle)
                }
                Later::Decide(prepared) => {
                    let mut evaluation = engine.decide(prepared).await;
                    let settle = evaluation.take_settle();
                    let (_, headers, disposition) = evaluation.into_parts();
                    match disposition {
                        Disposition::Respond(response) => {
                            return Ok(answer::<K, ResBody>(*response));
                        }
                        Disposition::Hold(hold) => hold.wait().await,
                        Disposition::Pass => {}
                    }
                    (headers, settle)
                }
            };
            let mut response = inner.call(request).await?;
            headers.apply(response.headers_mut());
            let Some(mut settle) = settle else {
                return Ok(response.map(K::inner));
            };
            // What the response says it cost: its status and headers now, its body as it
            // streams to the client (never held back). A concurrency slot is given back when
            // the body ends (or is dropped), not at the head.
            settle.response(response.status(), response.headers());
            if !settle.reads_body() && !settle.holds_slots() {
                settle.finish();
                return Ok(response.map(K::inner));
            }
            Ok(response.map(|body| K::metered(body, settle)))
        }))
    }
}

/// The engine's own answer (429, 401, 503) as this service's response.
fn answer<K: BodyShape<B>, B>(answer: Answer) -> Response<K::Body> {
    answer.into_response().map(K::answer)
}

/// What is left to do for a request `call` could not finish synchronously. Moved once, into
/// the future that is boxed anyway; boxing a variant would only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Later<S: Store, C: Clock> {
    /// Pass the request on with these headers (it has a true-up to hand its response to).
    Pass(RateLimitHeaders),
    /// Wait out the hold, then pass the request on with these headers.
    Hold(Hold<S, C>, RateLimitHeaders),
    /// Ask the store (which answers asynchronously), then act on its disposition.
    Decide(Prepared),
}
