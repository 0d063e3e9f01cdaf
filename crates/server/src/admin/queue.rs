//! The admin endpoints of the `queue` action:
//!
//! - `GET /v1/queues`: every queue, with its depth, oldest message and dead letters;
//! - `GET /v1/queues/{policy}/dead?count=N&after=ENTRY`: its dead letters, oldest first, a page
//!   at a time (`next` is the `after` of the next page);
//! - `POST /v1/queues/{policy}/dead/{id}/redrive`: one dead letter back in the queue, with a
//!   fresh count of attempts and the same id (so the same `Idempotency-Key`);
//! - `POST /v1/queues/{policy}/redrive`: every dead letter back in the queue (as many as it
//!   has room for: re-driving respects `queue_max_depth`, and answers 409 when it is full);
//! - `DELETE /v1/queues/{policy}/dead/{id}`: a dead letter dropped for good.

use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use tollgate_redis::stream_queue::Redriven;

use crate::Shared;
use crate::queue::{self, Queue};
use crate::response::{Body, json_response, problem};

/// The most dead letters one page lists.
const MAX_PAGE: usize = 1_000;

/// Answers a request under `/v1/queues`.
pub(crate) async fn handle(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Response<Body> {
    let rest = path.strip_prefix("/v1/queues").unwrap_or_default();
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    if segments.is_empty() {
        return if method == Method::GET {
            list(shared).await
        } else {
            not_allowed()
        };
    }
    let Some(name) = percent_decode(segments[0]) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            Some("the policy name is not valid percent-encoded UTF-8"),
        );
    };
    let Some(queue) = shared.queues.get(&name) else {
        return problem(
            StatusCode::NOT_FOUND,
            "Not Found",
            Some("no queue of this name: GET /v1/queues lists them"),
        );
    };
    // Re-driving respects the queue's bound, as the running configuration sets it.
    let max_depth = shared
        .engine()
        .policy(&name)
        .and_then(|p| p.queue)
        .unwrap_or_default()
        .max_depth;
    match (method, &segments[1..]) {
        (&Method::GET, ["dead"]) => dead_letters(&queue, query).await,
        (&Method::POST, ["redrive"]) => redrive_all(&queue, max_depth).await,
        (&Method::POST, ["dead", id, "redrive"]) => redrive(&queue, id, max_depth).await,
        (&Method::DELETE, ["dead", id]) => discard(&queue, id).await,
        (_, ["dead"] | ["redrive"] | ["dead", _, "redrive"] | ["dead", _]) => not_allowed(),
        _ => problem(
            StatusCode::NOT_FOUND,
            "Not Found",
            Some("see docs/queue.md for the queue's admin endpoints"),
        ),
    }
}

fn not_allowed() -> Response<Body> {
    problem(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed", None)
}

fn unavailable(e: &tollgate::StoreError) -> Response<Body> {
    tracing::warn!(error = %e, "admin: the queue's store failed");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "Queue unavailable",
        Some("the queue's store did not answer; try again later"),
    )
}

async fn list(shared: &Shared) -> Response<Body> {
    let mut queues = Vec::new();
    for q in shared.queues.all() {
        let (delivered, refused, retries, dead_total) = q.counters.deliveries();
        let mut entry = json!({
            "policy": q.name,
            "durable": q.backend.durable(),
            "delivered": delivered,
            "refused": refused,
            "retries": retries,
            "dead_total": dead_total,
        });
        let stats = match q.backend.stats().await {
            Ok(s) => json!({
                "depth": s.depth,
                "dead_letters": s.dead,
                "oldest_age_seconds": s.oldest_ms.map(|at| queue::seconds(queue::now_ms().saturating_sub(at))),
            }),
            Err(e) => json!({ "error": e.to_string() }),
        };
        if let (Some(o), Value::Object(s)) = (entry.as_object_mut(), stats) {
            o.extend(s);
        }
        queues.push(entry);
    }
    json_response(StatusCode::OK, &json!({ "queues": queues }))
}

async fn dead_letters(queue: &Queue, query: Option<&str>) -> Response<Body> {
    let param = |name: &str| {
        query?
            .split('&')
            .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
    };
    let count = param("count")
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, MAX_PAGE);
    let after = param("after").and_then(percent_decode);
    // An entry is `<number>-<number>` (a Redis stream id; the memory queue writes the same):
    // anything else is the caller's mistake, not a store that failed.
    if let Some(a) = after.as_deref()
        && !is_entry(a)
    {
        return crate::admin::fields::bad_field(
            "after",
            "must be an entry as the previous page's `next` gave it (digits, '-', digits)",
        );
    }
    let page = match queue.backend.dead_letters(after.as_deref(), count).await {
        Ok(page) => page,
        Err(e) => return unavailable(&e),
    };
    let next = (page.len() == count)
        .then(|| page.last().map(|d| d.message.entry.clone()))
        .flatten();
    let list: Vec<Value> = page
        .iter()
        .map(|d| {
            let (method, target) = queue::request_line(&d.message.payload).unwrap_or_default();
            json!({
                "id": d.message.id,
                "entry": d.message.entry,
                "method": method,
                "target": target,
                "attempts": d.attempts,
                "status": d.status,
                "error": d.error,
                "enqueued_at": queue::seconds(d.message.enqueued_ms),
                "died_at": queue::seconds(d.died_ms),
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({ "policy": queue.name, "dead_letters": list, "next": next }),
    )
}

fn full() -> Response<Body> {
    problem(
        StatusCode::CONFLICT,
        "Queue full",
        Some("the queue holds queue_max_depth messages: re-drive once it has room"),
    )
}

async fn redrive(queue: &Queue, id: &str, max_depth: u64) -> Response<Body> {
    match queue.backend.redrive(id, queue::now_ms(), max_depth).await {
        Ok(Redriven::Queued) => {
            queue.wake.notify_one();
            json_response(StatusCode::OK, &json!({ "id": id, "state": "queued" }))
        }
        Ok(Redriven::Full) => full(),
        Ok(Redriven::NotDead) => problem(
            StatusCode::NOT_FOUND,
            "Not Found",
            Some("no dead letter of this queue has this id"),
        ),
        Err(e) => unavailable(&e),
    }
}

/// Re-drives dead letters oldest first until none is left or the queue is full; answers how
/// many went back and whether the queue filled up (then some remain).
async fn redrive_all(queue: &Queue, max_depth: u64) -> Response<Body> {
    let mut redriven = 0u64;
    let mut after: Option<String> = None;
    let mut filled = false;
    'pages: loop {
        let page = match queue.backend.dead_letters(after.as_deref(), MAX_PAGE).await {
            Ok(page) => page,
            Err(e) => return unavailable(&e),
        };
        for d in &page {
            match queue
                .backend
                .redrive(&d.message.id, queue::now_ms(), max_depth)
                .await
            {
                Ok(Redriven::Queued) => redriven += 1,
                Ok(Redriven::NotDead) => {}
                Ok(Redriven::Full) => {
                    filled = true;
                    break 'pages;
                }
                Err(e) => return unavailable(&e),
            }
        }
        match page.last() {
            Some(last) if page.len() == MAX_PAGE => after = Some(last.message.entry.clone()),
            _ => break,
        }
    }
    if redriven > 0 {
        queue.wake.notify_one();
    }
    json_response(
        StatusCode::OK,
        &json!({ "redriven": redriven, "queue_full": filled }),
    )
}

async fn discard(queue: &Queue, id: &str) -> Response<Body> {
    match queue.backend.discard(id).await {
        Ok(true) => json_response(StatusCode::OK, &json!({ "id": id, "state": "discarded" })),
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            "Not Found",
            Some("no dead letter of this queue has this id"),
        ),
        Err(e) => unavailable(&e),
    }
}

/// `%XX` escapes of a path segment or query value decoded; `None` when they do not make
/// UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Whether `text` has the form of a queue entry: digits, `-`, digits.
fn is_entry(text: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    text.split_once('-')
        .is_some_and(|(ms, seq)| digits(ms) && digits(seq))
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn percent_escapes_are_decoded_and_broken_ones_refused() {
        assert_eq!(
            percent_decode("webhooks-out").as_deref(),
            Some("webhooks-out")
        );
        assert_eq!(percent_decode("a%20b%2Fc").as_deref(), Some("a b/c"));
        assert_eq!(percent_decode("%e2%82%ac").as_deref(), Some("€"));
        assert_eq!(percent_decode("%"), None);
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%ff"), None);
    }
}
