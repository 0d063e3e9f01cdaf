//! Actions (reject, delay, shadow), several policies all-or-nothing, per-route cost, and what
//! a failing store does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use tollgate::OnError;
use tollgate::{Check, Decisions, Policy, Quota, StoreError, Timestamp};
use tollgate_http::{Action, Engine, HttpPolicy, KeyChain, RouteMatch};

fn leaky(rate: &str, queue: u32) -> Policy {
    Policy::new(
        "hooks",
        Quota::leaky_bucket(rate.parse().unwrap(), queue).unwrap(),
    )
    .unwrap()
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn delay_holds_for_the_slot_then_passes_and_refuses_beyond_the_bound() {
    let clock = manual_clock();
    let engine = builder(clock.clone())
        .policy(
            HttpPolicy::new(leaky("1/s", 10))
                .keys(KeyChain::parse(["header:x-tenant"]).unwrap())
                .action(Action::Delay {
                    max_delay: Duration::from_secs(2),
                }),
        )
        .build()
        .unwrap();
    let app = app(engine);
    let tenant = [("x-tenant", "t1")];
    let spawn = |app: &axum::Router| {
        let app = app.clone();
        tokio::spawn(async move { send(&app, get("/hooks/x", "1.1.1.1", &tenant)).await })
    };
    // The first departs at once.
    assert_eq!(
        status(&app, get("/hooks/x", "1.1.1.1", &tenant)).await,
        StatusCode::OK
    );
    let second = spawn(&app);
    let third = spawn(&app);
    settle().await;
    assert!(!second.is_finished() && !third.is_finished());
    // The fourth would wait 3 s > max_delay: refused at once, with a Retry-After.
    let r = send(&app, get("/hooks/x", "1.1.1.1", &tenant)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header_u64(&r, "retry-after") >= 1);
    clock.advance(Duration::from_secs(1));
    let r = second.await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(header(&r, "ratelimit").is_some());
    settle().await;
    assert!(!third.is_finished());
    clock.advance(Duration::from_secs(1));
    assert_eq!(third.await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn a_client_that_goes_away_while_held_frees_its_place() {
    let clock = manual_clock();
    let engine = builder(clock.clone())
        .policy(
            HttpPolicy::new(leaky("1/s", 10))
                .keys(KeyChain::parse(["header:x-tenant"]).unwrap())
                .action(Action::Delay {
                    max_delay: Duration::from_secs(2),
                }),
        )
        .build()
        .unwrap();
    let app = app(engine);
    let tenant = [("x-tenant", "t1")];
    assert_eq!(
        status(&app, get("/", "1.1.1.1", &tenant)).await,
        StatusCode::OK
    );
    let held = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, get("/", "1.1.1.1", &tenant)).await })
    };
    let last = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, get("/", "1.1.1.1", &tenant)).await })
    };
    settle().await;
    // Both slots (1 s and 2 s away) are taken: a fourth is refused.
    assert_eq!(
        status(&app, get("/", "1.1.1.1", &tenant)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The last client disconnects: its future is dropped and its slot given back.
    last.abort();
    assert!(last.await.unwrap_err().is_cancelled());
    settle().await;
    let again = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, get("/", "1.1.1.1", &tenant)).await })
    };
    settle().await;
    assert!(
        !again.is_finished(),
        "admitted into the freed slot, and held"
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(held.await.unwrap().status(), StatusCode::OK);
    assert_eq!(again.await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn delay_with_tokio_paused_time() {
    tokio::time::pause();
    let engine = Engine::builder()
        .clock(tollgate::TokioClock::new())
        .policy(
            HttpPolicy::new(leaky("10/s", 5))
                .keys(KeyChain::parse(["ip"]).unwrap())
                .action(Action::Delay {
                    max_delay: Duration::from_secs(1),
                }),
        )
        .build()
        .unwrap();
    let app = app(engine);
    let start = tokio::time::Instant::now();
    let mut handles = Vec::new();
    for _ in 0..4 {
        let app = app.clone();
        handles.push(tokio::spawn(async move {
            send(&app, get("/", "1.1.1.1", &[])).await.status()
        }));
    }
    for h in handles {
        assert_eq!(h.await.unwrap(), StatusCode::OK);
    }
    // Four departures at 10/s: the last left 300 ms after the first.
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(400),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn delay_needs_a_leaky_bucket() {
    let err = builder(manual_clock())
        .policy(HttpPolicy::new(fixed("p", 1, 1)).action(Action::Delay {
            max_delay: Duration::from_secs(1),
        }))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("leaky_bucket"), "{err}");
}

/// A shadow policy beside an enforcing one never blocks, and never changes the enforcing
/// answer: the numbers are the enforcing policy's (a client pacing itself by them is not
/// slowed by a trial), and a 429's `Retry-After` is the enforcing denial's, not the trial's
/// longer wait. `RateLimit-Policy` still lists both.
#[tokio::test]
async fn shadow_never_blocks_but_reports_and_enforced_policies_still_count() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("enforced", 3, 60), &["ip"], None))
        .policy(policy(fixed("trial", 1, 3600), &["ip"], None).action(Action::Shadow))
        .build()
        .unwrap();
    let app = app(engine);
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    assert_eq!(r.status(), StatusCode::OK);
    // The trial policy would deny from now on; the request passes with the enforcing numbers.
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    assert_eq!(r.status(), StatusCode::OK);
    let now = sf_items(header(&r, "ratelimit").unwrap());
    assert_eq!((now[0].name.as_str(), now[0].param("r")), ("enforced", 1));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("1"));
    let listed = sf_items(header(&r, "ratelimit-policy").unwrap());
    let names: Vec<&str> = listed.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["enforced", "trial"]);
    assert!(header(&r, "retry-after").is_none());
    assert_eq!(status(&app, get("/", "1.1.1.1", &[])).await, StatusCode::OK);
    // The enforced policy counted all three, and its window, not the trial's hour, is the wait.
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let body = body_json(r).await;
    assert_eq!(body["violated-policies"], serde_json::json!(["enforced"]));
}

#[tokio::test]
async fn shadow_alone_never_blocks() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("trial", 1, 60), &["ip"], None).action(Action::Shadow))
        .build()
        .unwrap();
    let app = app(engine);
    for _ in 0..5 {
        let r = send(&app, get("/", "1.1.1.1", &[])).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(header(&r, "x-ratelimit-remaining").is_some());
    }
}

#[tokio::test]
async fn a_denial_by_one_policy_consumes_from_none() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 2, 60), &["ip"], Some("/v1/**")))
        .policy(
            policy(fixed("export", 1, 60), &["ip"], Some("/v1/export/*")).route(
                RouteMatch::any()
                    .path("/v1/export/*")
                    .unwrap()
                    .methods(["POST"])
                    .unwrap(),
            ),
        )
        .build()
        .unwrap();
    let app = app(engine);
    let post = |path: &str| {
        let mut r = get(path, "1.1.1.1", &[]);
        *r.method_mut() = http::Method::POST;
        r
    };
    assert_eq!(status(&app, post("/v1/export/1")).await, StatusCode::OK); // api 1 left, export 0
    let r = send(&app, post("/v1/export/2")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let policies = sf_items(header(&r, "ratelimit-policy").unwrap());
    assert_eq!(policies.len(), 2);
    assert_eq!(
        body_json(r).await["violated-policies"],
        serde_json::json!(["export"])
    );
    // GET does not match the export policy, and `api` still has the unit the denial left it.
    let r = send(&app, get("/v1/export/3", "1.1.1.1", &[])).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining"), 0);
    assert_eq!(
        status(&app, get("/v1/items", "1.1.1.1", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn per_route_cost() {
    let bucket = Policy::new(
        "export",
        Quota::token_bucket(20, "1/m".parse().unwrap()).unwrap(),
    )
    .unwrap();
    let engine = builder(manual_clock())
        .policy(
            HttpPolicy::new(bucket)
                .cost(5)
                .route(RouteMatch::any().path("/v1/export/*").unwrap()),
        )
        .build()
        .unwrap();
    let app = app(engine);
    for remaining in [15, 10, 5, 0] {
        let r = send(&app, get("/v1/export/1", "1.1.1.1", &[])).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header_u64(&r, "x-ratelimit-remaining"), remaining);
    }
    assert_eq!(
        status(&app, get("/v1/export/1", "1.1.1.1", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A cost no request could ever pay is a configuration error, not a runtime 429.
    let err = builder(manual_clock())
        .policy(HttpPolicy::new(fixed("p", 3, 1)).cost(4))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("exceeds the quota"), "{err}");
}

/// A store that always fails, as an unreachable Redis would.
struct Down;

impl tollgate::Store for Down {
    async fn apply(&self, _now: Timestamp, _checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        Err(StoreError::Unavailable {
            reason: "connection refused to 10.1.2.3:6379 (secret detail)".into(),
        })
    }

    async fn charge(
        &self,
        _now: Timestamp,
        _checks: &[Check<'_>],
    ) -> Result<Decisions, StoreError> {
        Err(StoreError::Unavailable {
            reason: "connection refused".into(),
        })
    }

    async fn refund(&self, _now: Timestamp, _checks: &[Check<'_>]) -> Result<(), StoreError> {
        Ok(())
    }

    async fn release(&self, _now: Timestamp, _checks: &[Check<'_>]) -> Result<u32, StoreError> {
        Err(StoreError::Unavailable {
            reason: "connection refused to 10.1.2.3:6379 (secret detail)".into(),
        })
    }
}

#[tokio::test]
async fn store_failure_fails_open_by_default() {
    let engine = Engine::builder()
        .store(Down)
        .policy(policy(fixed("p", 1, 60), &["ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    let engine = Engine::builder()
        .store(Down)
        .policy(policy(fixed("p", 1, 60), &["ip"], None))
        .build()
        .unwrap();
    let headers = http::HeaderMap::new();
    let info = tollgate_http::RequestInfo::new(&http::Method::GET, "/", &headers);
    let evaluation = engine.evaluate(&info).await;
    assert!(evaluation.allowed() && evaluation.store_failed());
    for _ in 0..3 {
        let r = send(&app, get("/", "1.1.1.1", &[])).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(header(&r, "x-ratelimit-limit").is_none());
    }
}

#[tokio::test]
async fn store_failure_can_fail_closed_without_leaking_internals() {
    let engine = Engine::builder()
        .store(Down)
        .on_error(OnError::Deny)
        .policy(policy(fixed("p", 1, 60), &["ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    assert_eq!(header(&r, "retry-after"), Some("1"));
    let body = body_json(r).await.to_string();
    assert!(
        !body.contains("10.1.2.3") && !body.contains("secret") && !body.contains("refused"),
        "{body}"
    );
}
