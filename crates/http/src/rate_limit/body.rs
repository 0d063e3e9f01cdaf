//! [`ResponseBody`]: the body of a [`RateLimitService`](super::RateLimitService)'s responses in
//! the default shape: the inner service's, the engine's own answer, or the inner service's
//! passed through a [`Settle`](crate::Settle) that reads the response's cost as it streams
//! (`charge = "response"`), never holding a byte back.

use std::error::Error;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;
use tollgate::{Clock, Store};

use crate::Settle;

/// A true-up fed the body of the response it settles, whatever the engine's store and clock.
pub trait BodySettle: Send + 'static {
    /// The next chunk of the body.
    fn feed(&mut self, chunk: &[u8]);
    /// The body has ended: settle now.
    fn finish(self: Box<Self>);
}

impl<S: Store, C: Clock> BodySettle for Settle<S, C> {
    fn feed(&mut self, chunk: &[u8]) {
        Settle::feed(self, chunk);
    }

    fn finish(self: Box<Self>) {
        Settle::finish(*self);
    }
}

pin_project! {
    /// The response body of a [`RateLimitService`](super::RateLimitService) in the default
    /// [`WrapBody`](super::WrapBody) shape: the inner service's, the engine's own answer (a
    /// 429's problem+json), or the inner service's read on its way by what settles its cost.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = Proj]
    enum Kind<B> {
        // The inner service's body, as it is.
        Inner { #[pin] body: B },
        // The inner service's body, each chunk also fed to the settle that reads its cost;
        // settled at its end (or, dropped early, with what was seen).
        Metered { #[pin] body: B, settle: Option<Box<dyn BodySettle>> },
        // The engine's own answer.
        Answer { #[pin] body: Full<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    /// An answer of the engine's.
    pub fn answer(body: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Answer {
                body: Full::new(body),
            },
        }
    }

    /// The inner service's body, fed to `settle` as it streams.
    pub fn metered(body: B, settle: Box<dyn BodySettle>) -> Self {
        ResponseBody {
            kind: Kind::Metered {
                body,
                settle: Some(settle),
            },
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.kind {
            Kind::Inner { .. } => "ResponseBody::Inner",
            Kind::Metered { .. } => "ResponseBody::Metered",
            Kind::Answer { .. } => "ResponseBody::Answer",
        })
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            Proj::Inner { body } => body
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            Proj::Answer { body } => body
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|e| match e {}))),
            Proj::Metered { body, settle } => {
                let polled = body.poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let (Some(data), Some(s)) = (frame.data_ref(), settle.as_mut()) {
                            s.feed(data);
                        }
                    }
                    Poll::Ready(None) => {
                        if let Some(s) = settle.take() {
                            s.finish();
                        }
                    }
                    // An error ends the body: the settle, dropped with it, settles with what it
                    // saw (the policy's cost for a cost it never read).
                    Poll::Ready(Some(Err(_))) => drop(settle.take()),
                    Poll::Pending => {}
                }
                polled.map(|f| f.map(|r| r.map_err(Into::into)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } | Kind::Metered { body, .. } => body.is_end_stream(),
            Kind::Answer { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Metered { body, .. } => body.size_hint(),
            Kind::Answer { body } => body.size_hint(),
        }
    }
}
