//! What an evaluation gives back: the prepared request, the disposition (pass, hold, answer),
//! the answer a caller writes, the rate-limit headers, a held request and the refund that
//! gives a held or queued request's quota back when it is dropped.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use smallvec::SmallVec;
use tollgate::{Check, Clock, Decisions, Store};

use crate::headers::{HeaderList, write_lines};
use crate::key::KeyBuf;
use crate::{Refusal, problem};

use super::{Engine, KeyOverride, QueueTicket, Settle};

/// One matching policy and the key the request is counted under.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub(super) index: usize,
    pub(super) key: KeyBuf,
    /// What the request costs under this policy: the policy's cost, or a caller's own (a
    /// check by policy name).
    pub(super) cost: u32,
    /// The key's override of the policy's quota, when it has one.
    pub(super) over: Option<Arc<KeyOverride>>,
    /// The permit a concurrency limit's check takes (0 for the other algorithms).
    pub(super) permit: u64,
}

/// The synchronous half of an evaluation: which policies match and the keys. Owns its data, so
/// it can cross an `await` without borrowing the request.
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    // Inline room for the usual one or two matching policies; the future that carries this
    // across the store call is moved around whole.
    pub(super) entries: SmallVec<[Entry; 2]>,
    pub(super) refusal: Option<Box<Refusal>>,
    /// The allow or deny list that decided the request, if one did (`lists.rs`).
    pub(super) listed: Option<super::ListHit>,
}

impl Prepared {
    /// Whether no policy applies (the request passes untouched, without headers).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.refusal.is_none()
    }

    /// Each matching policy (its index among the engine's policies, in order) with the key the
    /// request is counted under, as the store sees it: credentials appear as their keyed hash.
    /// In the order of the evaluation's decisions.
    pub fn keys(&self) -> impl Iterator<Item = (usize, &[u8])> {
        self.entries.iter().map(|e| (e.index, &e.key[..]))
    }
}

/// What to do with a request.
#[derive(Debug)]
pub enum Disposition<S: Store, C: Clock> {
    /// Pass it on now, adding the evaluation's headers to the response.
    Pass,
    /// Hold it for [`Hold::delay`], then pass it on. Dropping the hold before it completes
    /// gives the request's quota back.
    Hold(Hold<S, C>),
    /// Answer with this response (429, 401, 400, 414 or 503) instead of passing it on. It already carries
    /// the evaluation's headers. Boxed: the admitted requests, which are most, then move a small
    /// disposition around, and a refusal allocates once.
    Respond(Box<Answer>),
}

/// A response the engine gives instead of passing the request on: a 429, a 401 (no key for a
/// policy that requires one), a 400 (a field a key is read from sent twice), a 414 (a path too
/// deep to normalise) or a 503 (the store failed and the engine fails closed), always an RFC
/// 9457 `application/problem+json` body.
///
/// Kept as its parts rather than an `http::Response`: a server that writes HTTP/1.1 itself
/// copies them out directly, where a `HeaderMap` would be built, hashed and dropped for every
/// refusal, which is most of what a refusal costs. [`Answer::into_response`] builds the
/// response for everyone else.
#[derive(Clone, Debug)]
pub struct Answer {
    pub(super) status: StatusCode,
    /// After `Content-Type`: the rate-limit headers and `Retry-After`, when there are any.
    pub(super) headers: HeaderList,
    pub(super) body: Bytes,
    /// Set on a 429 that only `queue` policies gave: what a caller needs to queue the request.
    pub(super) queue: Option<Box<QueueTicket>>,
}

impl Answer {
    pub(super) fn new(status: StatusCode, headers: HeaderList, body: Bytes) -> Box<Self> {
        Box::new(Answer {
            status,
            headers,
            body,
            queue: None,
        })
    }

    /// On a 429 that only [`Action::Queue`](crate::Action::Queue) policies gave (every other
    /// policy admits the request): the queue the request may join instead, and what joining it
    /// charges. See [`Engine::admit_queued`].
    pub fn queue_ticket(&self) -> Option<&QueueTicket> {
        self.queue.as_deref()
    }

    /// 429, 401, 400 (a key field sent twice), 414 (a path too deep to normalise) or 503.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers besides `Content-Type` ([`problem::PROBLEM_JSON`]), in order: the rate-limit
    /// headers, then `Retry-After`. Each value is made as it is asked for;
    /// [`Answer::write_headers`] writes them without making any.
    pub fn headers(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        self.headers
            .fields()
            .map(|f| (f.which.name(), f.header_value()))
    }

    /// Appends [`Answer::headers`] to `out` as HTTP/1.1 header lines (`name: value` and CRLF
    /// each, names in lower case), for a server that writes its responses itself: numbers are
    /// formatted straight into `out`, with no allocation.
    pub fn write_headers(&self, out: &mut Vec<u8>) {
        write_lines(&self.headers, out);
    }

    /// The problem+json body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The answer as a response: `Content-Type` first, then [`Answer::headers`].
    pub fn into_response(self) -> Response<Bytes> {
        let mut response = Response::new(self.body);
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        // Sized once: growing the map midway would rehash it.
        let fields = self.headers.fields();
        headers.reserve(fields.len() + 1);
        headers.insert(http::header::CONTENT_TYPE, problem::PROBLEM_JSON);
        for f in fields {
            headers.insert(f.which.name(), f.header_value());
        }
        response
    }
}

/// The result of evaluating a request.
#[derive(Debug)]
pub struct Evaluation<S: Store, C: Clock> {
    pub(super) decisions: Decisions,
    pub(super) headers: HeaderList,
    pub(super) disposition: Disposition<S, C>,
    pub(super) store_failed: bool,
    /// The true-up of an admitted request whose policies charge by the response
    /// (`charge = "response"`, `count_status`).
    pub(super) settle: Option<Box<Settle<S, C>>>,
    /// The request waited in a line for a concurrency slot (`action = "delay"`).
    pub(super) waited_for_slot: bool,
}

impl<S: Store, C: Clock> Evaluation<S, C> {
    /// One decision per matching policy, in policy order; empty when none matched, the key was
    /// missing or the store failed.
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// Whether the store failed, so the request was let through
    /// ([`OnError::Allow`](tollgate::OnError::Allow)) or answered 503
    /// ([`OnError::Deny`](tollgate::OnError::Deny)) undecided.
    pub fn store_failed(&self) -> bool {
        self.store_failed
    }

    /// The true-up the door hands the response to, when a policy that admitted the request
    /// charges by its response (`charge = "response"` or `count_status`): taken once. A door
    /// that drops it unfed charges every such policy its `cost`, as admission did.
    pub fn take_settle(&mut self) -> Option<Box<Settle<S, C>>> {
        self.settle.take()
    }

    /// Whether the request waited in a line for a concurrency slot (`action = "delay"`)
    /// before this answer. Its client may have given up meanwhile: a door that can tell should
    /// make sure it is still there before passing the request on, and otherwise drop the
    /// evaluation, which gives the slot back.
    pub fn waited_for_slot(&self) -> bool {
        self.waited_for_slot
    }

    /// Whether the request goes on (now or after a hold).
    pub fn allowed(&self) -> bool {
        !matches!(self.disposition, Disposition::Respond(_))
    }

    /// The rate-limit headers for the response (each value made as it is asked for).
    pub fn headers(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        self.headers
            .fields()
            .map(|f| (f.which.name(), f.header_value()))
    }

    /// Adds the rate-limit headers to `headers`.
    pub fn apply_headers(&self, headers: &mut HeaderMap) {
        for f in self.headers.fields() {
            headers.insert(f.which.name(), f.header_value());
        }
    }

    /// What to do.
    pub fn disposition(&self) -> &Disposition<S, C> {
        &self.disposition
    }

    /// The decisions, the headers and what to do, by value.
    pub fn into_parts(self) -> (Decisions, RateLimitHeaders, Disposition<S, C>) {
        (
            self.decisions,
            RateLimitHeaders(self.headers),
            self.disposition,
        )
    }
}

/// The rate-limit headers of an evaluation, to add to the response once there is one.
#[derive(Clone, Debug, Default)]
pub struct RateLimitHeaders(pub(super) HeaderList);

impl RateLimitHeaders {
    /// Adds the headers to `headers`, replacing any of the same name.
    pub fn apply(self, headers: &mut HeaderMap) {
        // One growth of the map up front rather than a rehash midway.
        let fields = self.0.fields();
        headers.reserve(fields.len());
        for f in fields {
            headers.insert(f.which.name(), f.header_value());
        }
    }

    /// Whether there are none (no policy matched, or the store failed open).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The headers, each value made as it is asked for ([`RateLimitHeaders::write`] makes
    /// none).
    pub fn iter(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        self.0.fields().map(|f| (f.which.name(), f.header_value()))
    }

    /// The headers' names, in lower case.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.fields().map(|f| f.which.as_str())
    }

    /// Appends the headers to `out` as HTTP/1.1 header lines (`name: value` and CRLF each,
    /// names in lower case), for a server that writes its responses itself: the numbers are
    /// formatted straight into `out`, with no allocation.
    pub fn write(&self, out: &mut Vec<u8>) {
        write_lines(&self.0, out);
    }
}

/// A request held for its leaky-bucket slot.
#[derive(Debug)]
pub struct Hold<S: Store, C: Clock> {
    pub(super) delay: Duration,
    pub(super) guard: Option<RefundGuard<S, C>>,
}

impl<S: Store, C: Clock> Hold<S, C> {
    /// How long the request is held.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Waits out the hold on the limiter's clock. If this future is dropped first (the client
    /// went away), the request's quota is given back.
    pub async fn wait(mut self) {
        if let Some(guard) = &self.guard {
            guard.engine.inner.limiter.clock().sleep(self.delay).await;
        }
        // Served: nothing to give back.
        if let Some(guard) = &mut self.guard {
            guard.armed = false;
        }
    }
}

/// Gives the quota of an abandoned held request back to the store.
#[derive(Debug)]
pub(super) struct RefundGuard<S: Store, C: Clock> {
    pub(super) engine: Engine<S, C>,
    // Only held requests get here: a Vec keeps `Disposition` small for all the others.
    pub(super) entries: Vec<Entry>,
    pub(super) armed: bool,
}

impl<S: Store, C: Clock> Drop for RefundGuard<S, C> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The refund talks to the store, which may be remote: it runs as its own task. Outside
        // a runtime there is nothing to run it on, and the slot simply passes unused.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let engine = self.engine.clone();
        let entries = std::mem::take(&mut self.entries);
        runtime.spawn(async move {
            let checks: SmallVec<[Check<'_>; 4]> =
                entries.iter().map(|e| engine.check(e)).collect();
            let now = engine.inner.limiter.clock().now();
            if let Err(error) = engine.inner.limiter.store().refund(now, &checks).await {
                tracing::debug!(%error, "could not give back a held request's quota");
            }
        });
    }
}
