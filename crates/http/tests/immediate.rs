//! The layer decides inside `call` when the store answers at once (the memory store), and in a
//! boxed future when it must wait (Redis). Both paths must answer exactly alike: the same
//! statuses, headers and bodies, request after request, for every action; and so must both
//! body shapes (the default wrapper and `inner_body`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use http_body_util::BodyExt;
use tollgate::{Check, Decision, Decisions, MemoryStore, Policy, Quota, Store, StoreError};
use tollgate::{ManualClock, Timestamp};
use tollgate_http::{Action, Engine, HttpPolicy, KeyChain};

/// The memory store behind a store that makes its caller wait once before every answer, as a
/// remote store does, and says it is not immediate.
#[derive(Clone, Default)]
struct Deferred(MemoryStore);

impl Store for Deferred {
    async fn apply(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        tokio::task::yield_now().await;
        self.0.apply(now, checks).await
    }

    async fn apply_one(&self, now: Timestamp, check: Check<'_>) -> Result<Decision, StoreError> {
        tokio::task::yield_now().await;
        self.0.apply_one(now, check).await
    }

    async fn charge(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        tokio::task::yield_now().await;
        self.0.charge(now, checks).await
    }

    async fn refund(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<(), StoreError> {
        tokio::task::yield_now().await;
        self.0.refund(now, checks).await
    }

    async fn release(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<u32, StoreError> {
        tokio::task::yield_now().await;
        self.0.release(now, checks).await
    }
}

/// A store that claims to be immediate but is not: the engine must not hang or panic, and
/// treats the broken promise as a store failure (the default fail mode lets requests through).
#[derive(Clone, Default)]
struct Liar(Deferred);

impl Store for Liar {
    async fn apply(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        self.0.apply(now, checks).await
    }

    async fn charge(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        self.0.charge(now, checks).await
    }

    async fn refund(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<(), StoreError> {
        self.0.refund(now, checks).await
    }

    async fn release(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<u32, StoreError> {
        self.0.release(now, checks).await
    }

    fn is_immediate(&self) -> bool {
        true
    }
}

fn policies() -> Vec<HttpPolicy> {
    let leaky = Policy::new(
        "hooks",
        Quota::leaky_bucket("1/s".parse().unwrap(), 10).unwrap(),
    )
    .unwrap();
    vec![
        policy(
            fixed("per-key", 3, 60),
            &["header:x-api-key", "ip"],
            Some("/api/**"),
        ),
        policy(swc("shadow", 2, 60), &["ip"], Some("/api/**")).action(Action::Shadow),
        HttpPolicy::new(leaky)
            .keys(KeyChain::parse(["header:x-api-key"]).unwrap())
            .route(tollgate_http::RouteMatch::any().path("/hooks/**").unwrap())
            .action(Action::Delay {
                max_delay: Duration::from_secs(2),
            }),
    ]
}

fn engine<S: Store>(store: S, clock: ManualClock) -> Engine<S, ManualClock> {
    Engine::builder()
        .store(store)
        .clock(clock)
        .policies(policies())
        .build()
        .unwrap()
}

/// Status, every header and the body of one response, comparable across apps.
async fn snapshot(app: &axum::Router, uri: &str, key: &str) -> (StatusCode, Vec<String>, String) {
    let response = send(app, get(uri, "192.0.2.7", &[("x-api-key", key)])).await;
    let status = response.status();
    let mut headers: Vec<String> = response
        .headers()
        .iter()
        .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
        .collect();
    headers.sort();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn immediate_and_deferred_stores_answer_alike() {
    let clock = manual_clock();
    let memory = app(engine(MemoryStore::new(), clock.clone()));
    let deferred = app(engine(Deferred::default(), clock.clone()));
    // The same again, with responses in axum's own body type.
    let memory_inner = app_inner_body(engine(MemoryStore::new(), clock.clone()));
    let deferred_inner = app_inner_body(engine(Deferred::default(), clock.clone()));
    let others = [&deferred, &memory_inner, &deferred_inner];
    assert!(MemoryStore::new().is_immediate() && !Deferred::default().is_immediate());
    let script = [
        // Admitted by both policies, then the shadow one would deny, then the enforced one does.
        ("/api/a", "k1"),
        ("/api/a", "k1"),
        ("/api/a", "k1"),
        ("/api/a", "k1"),
        ("/api/b", "k2"),
        // Not matched by any policy: passed untouched.
        ("/open", "k1"),
        // The delay policy: the first departs at once; the queue is tested in actions.rs.
        ("/hooks/x", "t1"),
    ];
    let mut statuses = Vec::new();
    for (uri, key) in script {
        let a = snapshot(&memory, uri, key).await;
        for other in others {
            let b = snapshot(other, uri, key).await;
            assert_eq!(a, b, "{uri} with key {key}");
        }
        statuses.push(a.0);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
        ]
    );
    // A held request goes through the boxed path on both, and passes once its slot comes.
    let held = |app: &axum::Router| {
        let app = app.clone();
        tokio::spawn(async move { snapshot(&app, "/hooks/x", "t1").await })
    };
    let a = held(&memory);
    let rest: Vec<_> = others.into_iter().map(held).collect();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(
        !a.is_finished() && rest.iter().all(|b| !b.is_finished()),
        "held for the next slot"
    );
    clock.advance(Duration::from_secs(1));
    let a = a.await.unwrap();
    assert_eq!(a.0, StatusCode::OK);
    for b in rest {
        assert_eq!(a, b.await.unwrap());
    }
}

/// `inner_body` with a service that is not axum's: responses stay `Full<Bytes>`, and the 429
/// is the engine's problem+json in that type.
#[tokio::test]
async fn inner_body_answers_in_the_inner_services_own_body_type() {
    use bytes::Bytes;
    use http::{Request, Response};
    use http_body_util::Full;
    use tower::{Layer, ServiceExt};

    let clock = manual_clock();
    let layer = tollgate_http::RateLimitLayer::new(engine(MemoryStore::new(), clock)).inner_body();
    let service = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"hi"))))
    }));
    let request = || {
        Request::builder()
            .uri("/api/x")
            .header("x-api-key", "k")
            .extension(peer("192.0.2.9"))
            .body(())
            .unwrap()
    };
    // The shadow policy (2 a minute) would be the most restrictive, but beside an enforcing
    // policy the headers report the enforcing one (3 a minute), which denies the fourth request.
    for remaining in ["2", "1", "0"] {
        let response: Response<Full<Bytes>> = service.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "x-ratelimit-remaining"), Some(remaining));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hi");
    }
    let denied = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&denied, "content-type"),
        Some("application/problem+json")
    );
    assert!(header(&denied, "retry-after").is_some());
    let body = denied.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 429);
}

#[tokio::test]
async fn a_store_that_breaks_the_immediate_promise_fails_like_a_down_store() {
    let engine = engine(Liar::default(), manual_clock());
    let request = get("/api/a", "192.0.2.7", &[]);
    let info =
        tollgate_http::RequestInfo::from_request(&request, Some("192.0.2.7".parse().unwrap()));
    let evaluation = engine
        .decide_now(engine.prepare(&info))
        .unwrap_or_else(|_| panic!("an immediate store is decided now"));
    assert!(evaluation.store_failed());
    assert!(evaluation.allowed(), "fail open by default");
    // Through the layer: let through without rate-limit headers, never a 500.
    let app = app(engine);
    let r = send(&app, get("/api/a", "192.0.2.7", &[])).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(header(&r, "ratelimit").is_none());
}
