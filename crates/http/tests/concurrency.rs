//! Concurrency limits through the tower layer: a request's slot is held until its response
//! body has been sent (or dropped, when the client goes away), not just until the handler
//! answers; with `delay`, a request waits for a slot rather than being refused. With
//! `inner_body()` the layer cannot see the body end, and the slot is given back at the head.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::routing::get as route_get;
use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tollgate::{Policy, Quota};
use tollgate_http::{Action, Engine, RateLimitLayer};
use tower::ServiceExt;

type Chunks = mpsc::Sender<Bytes>;

/// A body that streams what arrives on a channel and ends when its sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// An app whose `/export` answers at once with a body that streams what the test sends down
/// the channel handed over on `senders`, ending when the test drops it.
fn streaming_app<C: tollgate::Clock>(
    engine: Engine<tollgate::MemoryStore, C>,
    inner_body: bool,
) -> (Router, mpsc::UnboundedReceiver<Chunks>) {
    let (tx, rx) = mpsc::unbounded_channel::<Chunks>();
    let handler = move || {
        let tx = tx.clone();
        async move {
            let (chunks, body) = mpsc::channel(4);
            let _ = tx.send(chunks);
            Body::new(ChannelBody(body))
        }
    };
    let layer = RateLimitLayer::new(engine);
    let router = Router::new().route("/export", route_get(handler));
    let router = if inner_body {
        router.layer(layer.inner_body())
    } else {
        router.layer(layer)
    };
    (router, rx)
}

fn engine(limit: u32, action: Action) -> Engine {
    Engine::builder()
        .policy(exports(limit, action))
        .build()
        .unwrap()
}

fn exports(limit: u32, action: Action) -> tollgate_http::HttpPolicy {
    let quota = Quota::concurrency(limit, Duration::from_secs(3600)).unwrap();
    policy(
        Policy::new("exports", quota).unwrap(),
        &["header:x-api-key"],
        None,
    )
    .action(action)
}

fn export() -> axum::http::Request<Body> {
    get("/export", "203.0.113.9", &[("x-api-key", "k")])
}

#[tokio::test]
async fn the_slot_is_held_until_the_body_ends() {
    let (app, mut bodies) = streaming_app(engine(1, Action::Reject), false);
    let first = app.clone().oneshot(export()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "ratelimit-policy"), Some("\"exports\";q=1"));
    let chunks = bodies.recv().await.unwrap();
    // The head is out, the body is not: still in flight.
    let second = app.clone().oneshot(export()).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&second, "retry-after"), Some("1"));
    chunks.send(Bytes::from_static(b"rows")).await.unwrap();
    drop(chunks);
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"rows");
    let third = app.clone().oneshot(export()).await.unwrap();
    assert_eq!(third.status(), StatusCode::OK, "the slot came back");
}

#[tokio::test]
async fn a_body_dropped_unfinished_gives_the_slot_back() {
    let (app, mut bodies) = streaming_app(engine(1, Action::Reject), false);
    let first = app.clone().oneshot(export()).await.unwrap();
    let _chunks = bodies.recv().await.unwrap();
    assert_eq!(status(&app, export()).await, StatusCode::TOO_MANY_REQUESTS);
    // The client went away mid-body.
    drop(first);
    assert_eq!(status(&app, export()).await, StatusCode::OK);
}

#[tokio::test]
async fn with_delay_a_request_waits_for_the_slot() {
    let action = Action::Delay {
        max_delay: Duration::from_secs(30),
    };
    let (app, mut bodies) = streaming_app(engine(1, action), false);
    let first = app.clone().oneshot(export()).await.unwrap();
    let chunks = bodies.recv().await.unwrap();
    let waiting = tokio::spawn(app.clone().oneshot(export()));
    // It waits while the first body streams...
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    // ...and is admitted once it ends.
    drop(chunks);
    first.into_body().collect().await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    assert_eq!(second.status(), StatusCode::OK);
}

#[tokio::test]
async fn with_delay_a_request_is_refused_after_max_delay() {
    let action = Action::Delay {
        max_delay: Duration::from_millis(300),
    };
    let (app, mut bodies) = streaming_app(engine(1, action), false);
    let _first = app.clone().oneshot(export()).await.unwrap();
    let _chunks = bodies.recv().await.unwrap();
    let second = app.clone().oneshot(export()).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&second, "retry-after").is_some());
}

/// Every request in a line waits at most `max_delay` from its arrival, not only the head: one
/// that lined up behind others (without asking first) used to wait its `max_delay` in line,
/// then as long again as if it had just been denied. On tokio's paused clock, so the times are
/// exact.
#[tokio::test(start_paused = true)]
async fn with_delay_every_request_in_line_is_refused_at_its_max_delay() {
    let max_delay = Duration::from_millis(1000);
    let engine = Engine::builder()
        .clock(tollgate::TokioClock::new())
        .policy(exports(1, Action::Delay { max_delay }))
        .build()
        .unwrap();
    let (app, mut bodies) = streaming_app(engine, false);
    let _first = app.clone().oneshot(export()).await.unwrap();
    let _chunks = bodies.recv().await.unwrap();
    let mut line = Vec::new();
    for _ in 0..4 {
        let app = app.clone();
        line.push(tokio::spawn(async move {
            let arrived = tokio::time::Instant::now();
            let answer = app.oneshot(export()).await.unwrap();
            (answer.status(), arrived.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for waiter in line {
        let (status, waited) = waiter.await.unwrap();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(waited >= max_delay, "{waited:?}");
        assert!(
            waited < max_delay + Duration::from_millis(100),
            "{waited:?}"
        );
    }
}

/// `inner_body()` keeps the inner service's body type, which the layer cannot wrap: the slot
/// is given back when the head passes.
#[tokio::test]
async fn inner_body_gives_the_slot_back_at_the_head() {
    let (app, mut bodies) = streaming_app(engine(1, Action::Reject), true);
    let _first = app.clone().oneshot(export()).await.unwrap();
    let _chunks = bodies.recv().await.unwrap();
    assert_eq!(status(&app, export()).await, StatusCode::OK);
}
