//! [`ResponseFuture`]: what a [`RateLimitService`](super::RateLimitService) call returns. With a
//! store that answers at once (the memory store) the decision is made inside `call`, so the
//! future is the inner service's own, plus the headers to add or the ready 429: nothing boxed.
//! Only decisions that must wait for a remote store, and held (`delay`) requests, box a future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use super::BodyShape;
use crate::RateLimitHeaders;

type Decided<O, E> = Pin<Box<dyn Future<Output = Result<Response<O>, E>> + Send>>;

pin_project! {
    /// The response future of a [`RateLimitService`](super::RateLimitService): `F` is the
    /// inner service's future, whose body `B` becomes a response body the `K` way.
    pub struct ResponseFuture<F, K: BodyShape<B>, B, E> {
        #[pin]
        kind: Kind<F, K::Body, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, O, E> {
        // No policy matched: the inner future, untouched.
        Passthrough { #[pin] future: F },
        // Admitted at once: the inner future, then the headers.
        Admitted { #[pin] future: F, headers: Option<RateLimitHeaders> },
        // Answered by the engine (429, 401, 503).
        Answered { response: Option<Response<O>> },
        // Decided by a store that made us wait, or held.
        Decided { future: Decided<O, E> },
    }
}

impl<F, K: BodyShape<B>, B, E> ResponseFuture<F, K, B, E> {
    pub(crate) fn passthrough(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { future },
        }
    }

    pub(crate) fn admitted(future: F, headers: RateLimitHeaders) -> Self {
        ResponseFuture {
            kind: Kind::Admitted {
                future,
                headers: Some(headers),
            },
        }
    }

    pub(crate) fn answered(response: Response<K::Body>) -> Self {
        ResponseFuture {
            kind: Kind::Answered {
                response: Some(response),
            },
        }
    }

    pub(crate) fn boxed(future: Decided<K::Body, E>) -> Self {
        ResponseFuture {
            kind: Kind::Decided { future },
        }
    }
}

impl<F, K: BodyShape<B>, B, E> Future for ResponseFuture<F, K, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<K::Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough { future } => future
                .poll(cx)
                .map(|result| result.map(|response| response.map(K::inner))),
            KindProj::Admitted { future, headers } => {
                let mut response = match future.poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(response)) => response,
                };
                if let Some(headers) = headers.take() {
                    headers.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response.map(K::inner)))
            }
            KindProj::Answered { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after completing: a caller bug that a panic would turn into a
                // crash; it stays pending instead, as a fused future would.
                None => Poll::Pending,
            },
            KindProj::Decided { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, K: BodyShape<B>, B, E> fmt::Debug for ResponseFuture<F, K, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}
