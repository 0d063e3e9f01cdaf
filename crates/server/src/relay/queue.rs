//! The proxy's side of the `queue` action: a request only `queue` policies denied is read whole,
//! stored as the relay would send it upstream, and answered `202 Accepted` with its status URL
//! (`413` when its body is too large, `429` with `Retry-After` when the queue is full); and
//! `GET /v1/queue/{id}` answers a stored request's status.

use std::time::Duration;

use bytes::Buf;
use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::Quota;
use tollgate_http::{Answer, QueueTicket};
use tollgate_redis::stream_queue::{NewMessage, Pushed};

use super::body::{BodyCopy, Encoding, Framing, Trailers};
use super::client::Client;
use super::conn::{Conn, Plan, READ_CHUNK};
use super::deadline;
use super::head::{self, MALFORMED, MALFORMED_BODY, Refusal, Version};
use super::response::{write_answer, write_answer_as};
use crate::config::PolicyConfig;
use crate::generation::Generation;
use crate::queue;

/// The content types of the answers here.
const PROBLEM_JSON: &[u8] = b"application/problem+json";
const JSON: &[u8] = b"application/json";

/// The path prefix of a stored request's status.
const STATUS_PATH: &str = "/v1/queue/";

/// Why a queued request's body could not be read.
enum BodyProblem {
    TooLarge,
    Malformed,
    ClientGone,
}

impl Conn {
    /// Queues a request its `answer` says only `queue` policies denied, and answers it. `Ok`:
    /// whether the connection goes on. `Err`: no queue of this instance takes it; the caller
    /// answers the 429.
    pub(super) async fn enqueue(
        &mut self,
        client: &mut Client,
        engine: &Generation,
        answer: Box<Answer>,
        plan: Plan,
        timeout: Duration,
        stopping: bool,
    ) -> Result<bool, Box<Answer>> {
        let Some(ticket) = answer.queue_ticket() else {
            return Err(answer);
        };
        let policy = engine.policy(ticket.policy());
        let (Some(queue), Some(settings)) = (
            self.shared.queues.get(ticket.policy()),
            policy.and_then(|p| p.queue),
        ) else {
            return Err(answer);
        };
        let close = plan.close || stopping;
        let body = match self
            .queued_body(client, plan, settings.max_body, timeout)
            .await
        {
            Ok(body) => body,
            Err(problem) => {
                self.refuse_body(client, problem, &queue, plan.version)
                    .await;
                return Ok(false);
            }
        };
        let headers = match engine.http().admit_queued(ticket).await {
            Ok(headers) => headers,
            // Another policy denies it now: answered as any denial.
            Err(other) => {
                let written = self
                    .answer(client, &other, plan.version, close, timeout)
                    .await;
                return Ok(written && !close);
            }
        };
        let id = queue::new_id();
        let message = NewMessage {
            id: &id,
            key: ticket.key(),
            payload: &queue::encode(&self.uphead, &body),
            enqueued_ms: queue::now_ms(),
        };
        let reply = store(engine, &queue, ticket, policy, message, settings.max_depth).await;
        write_answer_as(
            &mut self.out,
            reply.status,
            reply.content_type,
            |out| {
                headers.write(out);
                out.extend_from_slice(reply.header.0.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(reply.header.1.as_bytes());
                out.extend_from_slice(b"\r\n");
            },
            reply.body.as_bytes(),
            plan.version,
            close,
        );
        let written = deadline::within(&mut self.timer, timeout, client.write_all(&self.out))
            .await
            .is_some_and(|r| r.is_ok());
        Ok(written && !close)
    }

    /// Answers a request whose body the queue cannot take (413, or 400 for broken chunking);
    /// the connection then ends: the rest of the body is unread.
    async fn refuse_body(
        &mut self,
        client: &mut Client,
        problem: BodyProblem,
        queue: &queue::Queue,
        version: Version,
    ) {
        let refusal = match problem {
            BodyProblem::ClientGone => return,
            BodyProblem::Malformed => MALFORMED_BODY,
            BodyProblem::TooLarge => {
                queue.counters.too_large();
                Refusal::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Content too large",
                    "the request body is larger than this queue stores (queue_max_body)",
                )
            }
        };
        self.refuse(client, refusal, version).await;
    }

    /// Writes `answer` (a 429 or 503 of the engine); whether it was written.
    async fn answer(
        &mut self,
        client: &mut Client,
        answer: &Answer,
        version: Version,
        close: bool,
        timeout: Duration,
    ) -> bool {
        write_answer(
            &mut self.out,
            answer.status(),
            |out| answer.write_headers(out),
            answer.body(),
            version,
            close,
        );
        deadline::within(&mut self.timer, timeout, client.write_all(&self.out))
            .await
            .is_some_and(|r| r.is_ok())
    }

    /// Reads a queued request's body whole (chunked bodies decoded), at most `max` bytes.
    async fn queued_body(
        &mut self,
        client: &mut Client,
        plan: Plan,
        max: usize,
        timeout: Duration,
    ) -> Result<Vec<u8>, BodyProblem> {
        match plan.framing {
            Framing::None | Framing::Length(0) => return Ok(Vec::new()),
            Framing::Length(n) if n > u64::try_from(max).unwrap_or(u64::MAX) => {
                return Err(BodyProblem::TooLarge);
            }
            Framing::Close => return Err(BodyProblem::Malformed),
            Framing::Length(_) | Framing::Chunked => {}
        }
        if plan.expect_continue && plan.version == Version::Http11 {
            let sent = deadline::within(
                &mut self.timer,
                timeout,
                client.write_all(b"HTTP/1.1 100 Continue\r\n\r\n"),
            )
            .await;
            if sent.is_none_or(|r| r.is_err()) {
                return Err(BodyProblem::ClientGone);
            }
        }
        let mut copy = BodyCopy::new(plan.framing, Encoding::Identity, Trailers::Drop);
        let mut body = Vec::new();
        loop {
            let take = copy
                .copy(&self.inbuf, &mut body)
                .map_err(|_| BodyProblem::Malformed)?;
            self.inbuf.advance(take);
            if body.len() > max {
                return Err(BodyProblem::TooLarge);
            }
            if copy.done() {
                return Ok(body);
            }
            self.inbuf.reserve(READ_CHUNK);
            match deadline::within(&mut self.timer, timeout, client.read_buf(&mut self.inbuf)).await
            {
                Some(Ok(n)) if n > 0 => {}
                _ => return Err(BodyProblem::ClientGone),
            }
        }
    }

    /// Answers `GET /v1/queue/{id}`: the stored request's state, attempts and the upstream's
    /// last status, or 404. The request is Tollgate's own: no policy counts it.
    pub(super) async fn queue_status(
        &mut self,
        client: &mut Client,
        head_len: usize,
        timeout: Duration,
        stopping: bool,
    ) -> bool {
        let parsed = status_target(&self.inbuf[..head_len]);
        self.inbuf.advance(head_len);
        let (id, version, close) = match parsed {
            Ok(p) => p,
            Err((refusal, version)) => {
                self.refuse(client, refusal, version).await;
                return false;
            }
        };
        let close = close || stopping;
        let (status, content_type, text) = match self.shared.queues.find(&id).await {
            Ok(Some((queue, s))) => (
                StatusCode::OK,
                JSON,
                queue::status_json(&id, &queue.name, &s).to_string(),
            ),
            Ok(None) => (
                StatusCode::NOT_FOUND,
                PROBLEM_JSON,
                crate::response::problem_body(
                    StatusCode::NOT_FOUND,
                    "Not Found",
                    Some("no queued request has this id (or its status has expired)"),
                ),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "queue: cannot read a status");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    PROBLEM_JSON,
                    crate::response::problem_body(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Queue unavailable",
                        Some("the queue's store did not answer; try again later"),
                    ),
                )
            }
        };
        write_answer_as(
            &mut self.out,
            status,
            content_type,
            |out| out.extend_from_slice(b"cache-control: no-store\r\n"),
            text.as_bytes(),
            version,
            close,
        );
        let written = deadline::within(&mut self.timer, timeout, client.write_all(&self.out))
            .await
            .is_some_and(|r| r.is_ok());
        written && !close
    }
}

/// The id a status request asks for, its version and whether its connection ends; or the
/// refusal of a head that is not a valid bodiless request.
fn status_target(bytes: &[u8]) -> Result<(String, Version, bool), (Refusal, Version)> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let version = match req.parse(bytes) {
        Ok(httparse::Status::Complete(_)) if req.version == Some(0) => Version::Http10,
        Ok(httparse::Status::Complete(_)) => Version::Http11,
        _ => return Err((MALFORMED, Version::Http11)),
    };
    let head = head::check(&req).map_err(|r| (r, version))?;
    if !matches!(head.framing, Framing::None | Framing::Length(0)) {
        let refusal = Refusal::new(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            "a status request has no body",
        );
        return Err((refusal, version));
    }
    let path = head.target.split('?').next().unwrap_or_default();
    let id = path
        .strip_prefix(STATUS_PATH)
        .unwrap_or_default()
        .to_owned();
    Ok((id, version, head.close))
}

/// What the proxy answers a request it tried to queue.
struct QueueReply {
    status: StatusCode,
    content_type: &'static [u8],
    /// `Location` of a 202, `Retry-After` of a refusal.
    header: (&'static str, String),
    body: String,
}

/// Stores a request the engine admitted to the queue: `202` with its status URL, or `429`
/// (the queue is full) or `503` (its store failed) with the policy's quota given back.
async fn store(
    engine: &Generation,
    queue: &queue::Queue,
    ticket: &QueueTicket,
    policy: Option<&PolicyConfig>,
    message: NewMessage<'_>,
    max_depth: u64,
) -> QueueReply {
    let id = message.id;
    match queue.backend.push(message, max_depth).await {
        Ok(Pushed::Queued(_)) => {
            queue.counters.enqueued();
            queue.wake.notify_one();
            accepted(id, ticket.policy())
        }
        Ok(Pushed::Full) => {
            engine.http().refund_queued(ticket);
            queue.counters.full();
            let retry = policy.map_or(1, |p| retry_secs(p.policy.quota()));
            refused(StatusCode::TOO_MANY_REQUESTS, "Queue full", retry)
        }
        Err(e) => {
            engine.http().refund_queued(ticket);
            tracing::warn!(policy = ticket.policy(), error = %e, "queue: cannot store a request");
            refused(StatusCode::SERVICE_UNAVAILABLE, "Queue unavailable", 1)
        }
    }
}

/// `202 Accepted`: where the stored request's status is.
fn accepted(id: &str, policy: &str) -> QueueReply {
    let location = format!("{STATUS_PATH}{id}");
    let body = serde_json::json!({
        "id": id, "policy": policy, "state": "queued", "location": location,
    })
    .to_string();
    QueueReply {
        status: StatusCode::ACCEPTED,
        content_type: JSON,
        header: ("location", location),
        body,
    }
}

/// A 429 (full) or 503 (the store failed), to try again after `retry` seconds.
fn refused(status: StatusCode, title: &str, retry: u64) -> QueueReply {
    let detail = if status == StatusCode::TOO_MANY_REQUESTS {
        "the queue holds its most requests (queue_max_depth); try again later"
    } else {
        "the queue's store did not answer; try again later"
    };
    QueueReply {
        status,
        content_type: PROBLEM_JSON,
        header: ("retry-after", retry.to_string()),
        body: crate::response::problem_body(status, title, Some(detail)),
    }
}

/// `Retry-After` for a full queue: a slot frees when the next delivery departs, one leaky-
/// bucket interval away (whole seconds, at least 1).
fn retry_secs(quota: &Quota) -> u64 {
    match quota {
        Quota::LeakyBucket(lb) => lb.interval_micros().div_ceil(1_000_000).max(1),
        _ => 1,
    }
}
