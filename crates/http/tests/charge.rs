//! Charging by the response through the tower layer: an axum handler answers what a request
//! used (a JSON body, an event stream, a header), the layer passes the body on untouched and
//! charges the key exactly that; `count_status` counts only the statuses it lists. With
//! `inner_body()` the body cannot be read on its way: a header cost still is, a body cost falls
//! back to the policy's cost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::*;
use http_body_util::BodyExt;
use tollgate::{Clock, ManualClock};
use tollgate_http::{Charge, CostFrom, Engine, RateLimitLayer, StatusSet};
use tower::ServiceExt;

/// The handler: `x-tokens` asks for the usage to report, `x-as` for how (`json`, `sse`,
/// `header`), `x-status` for the status.
async fn handler(req: axum::http::Request<Body>) -> Response {
    let h = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let tokens = h("x-tokens").unwrap_or_default();
    let status = h("x-status")
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    match h("x-as").as_deref() {
        Some("sse") => {
            let body = format!(
                "data: {{\"choices\":[{{\"delta\":{{}}}}]}}\n\ndata: {{\"usage\":{{\"total_tokens\":{tokens}}}}}\n\ndata: [DONE]\n\n"
            );
            (status, [(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
        }
        Some("header") => (status, [("x-usage-tokens", tokens)], "done").into_response(),
        _ => {
            let body = format!(r#"{{"choices":[],"usage":{{"total_tokens":{tokens}}}}}"#);
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
    }
}

fn engine(clock: ManualClock, from: &str) -> Engine<tollgate::MemoryStore, ManualClock> {
    builder(clock)
        .policy(
            policy(
                fixed("tokens", 1000, 3600),
                &["header:x-api-key"],
                Some("/v1/**"),
            )
            .charge(Charge::Response(from.parse::<CostFrom>().unwrap())),
        )
        .policy(
            policy(
                fixed("errors", 3, 3600),
                &["header:x-api-key"],
                Some("/login"),
            )
            .count_status(StatusSet::parse(["401", "5xx"]).unwrap()),
        )
        .build()
        .unwrap()
}

fn call(path: &str, key: &str, headers: &[(&str, &str)]) -> axum::http::Request<Body> {
    let mut b = axum::http::Request::builder()
        .method("POST")
        .uri(path)
        .header("x-api-key", key)
        .extension(peer("203.0.113.5"));
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(Body::empty()).unwrap()
}

/// Sends a request and reads its body to the end (the charge lands as the body ends).
async fn exchange(app: &Router, request: axum::http::Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// What `key` has left under `policy` (a peek).
fn left(engine: &Engine<tollgate::MemoryStore, ManualClock>, policy: &str, key: &str) -> u64 {
    let prepared = engine.prepare(&tollgate_http::RequestInfo::new(
        &axum::http::Method::POST,
        if policy == "tokens" {
            "/v1/x"
        } else {
            "/login"
        },
        &{
            let mut h = axum::http::HeaderMap::new();
            h.insert("x-api-key", key.parse().unwrap());
            h
        },
    ));
    let (_, stored) = prepared.keys().next().unwrap();
    let p = engine
        .policies()
        .find(|p| p.policy.name() == policy)
        .unwrap()
        .policy
        .clone();
    let now = engine.limiter().clock().now();
    engine
        .limiter()
        .store()
        .apply_now(now, &[tollgate::Check::new(&p, stored, 0)])
        .into_first()
        .unwrap()
        .remaining
}

#[tokio::test]
async fn the_layer_charges_what_the_response_reports() {
    let clock = manual_clock();
    let engine = engine(clock.clone(), "json:usage.total_tokens");
    let app = Router::new()
        .route("/{*rest}", post(handler))
        .layer(RateLimitLayer::new(engine.clone()));
    let (status, body) = exchange(&app, call("/v1/a", "k1", &[("x-tokens", "120")])).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("\"total_tokens\":120"),
        "the body passes untouched: {body}"
    );
    assert_eq!(left(&engine, "tokens", "k1"), 880);
    let (_, body) = exchange(
        &app,
        call("/v1/a", "k1", &[("x-tokens", "300"), ("x-as", "sse")]),
    )
    .await;
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert_eq!(left(&engine, "tokens", "k1"), 580);
    // Past the budget, charged all the same; the next request is refused.
    exchange(&app, call("/v1/a", "k1", &[("x-tokens", "2000")])).await;
    assert_eq!(left(&engine, "tokens", "k1"), 0);
    let (status, _) = exchange(&app, call("/v1/a", "k1", &[("x-tokens", "1")])).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // Statuses: two 401s and a 503 count, successes do not; the fourth error is refused.
    for (s, _) in [("200", 0), ("401", 1), ("200", 1), ("401", 2), ("503", 3)] {
        let (status, _) = exchange(&app, call("/login", "k2", &[("x-status", s)])).await;
        assert_eq!(status.as_str(), s);
    }
    assert_eq!(left(&engine, "errors", "k2"), 0);
    let (status, _) = exchange(&app, call("/login", "k2", &[])).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn inner_body_reads_header_costs_and_falls_back_for_body_costs() {
    let clock = manual_clock();
    let by_header = engine(clock.clone(), "header:x-usage-tokens");
    let app = Router::new()
        .route("/{*rest}", post(handler))
        .layer(RateLimitLayer::new(by_header.clone()).inner_body());
    exchange(
        &app,
        call("/v1/a", "k1", &[("x-tokens", "40"), ("x-as", "header")]),
    )
    .await;
    assert_eq!(left(&by_header, "tokens", "k1"), 960);
    let by_body = engine(clock, "json:usage.total_tokens");
    let app = Router::new()
        .route("/{*rest}", post(handler))
        .layer(RateLimitLayer::new(by_body.clone()).inner_body());
    exchange(&app, call("/v1/a", "k1", &[("x-tokens", "40")])).await;
    // The body keeps its own type, so it is not read: admission's cost (1) stands, counted as
    // a fallback.
    assert_eq!(left(&by_body, "tokens", "k1"), 999);
    let fallbacks: Vec<(&str, u64)> = by_body.usage_fallbacks().collect();
    assert_eq!(fallbacks, [("tokens", 1)]);
}

/// `count_status` lists final statuses: codes from 200 to 599 and classes `2xx` to `5xx`. A
/// 1xx is refused with why (an interim response never ends a request, so it would count
/// nothing), and so is anything else that is not a status.
#[test]
fn count_status_takes_final_statuses_only() {
    let set = StatusSet::parse(["401", "5xx", " 2XX "]).unwrap_or_else(|e| panic!("{e}"));
    for (status, counts) in [
        (401, true),
        (403, false),
        (503, true),
        (204, true),
        (101, false),
    ] {
        assert_eq!(set.contains(status), counts, "{status}");
    }
    for interim in ["100", "101", "103", "1xx"] {
        let e = StatusSet::parse([interim]).err().map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.contains("interim")),
            "{interim}: {e:?}"
        );
    }
    for bad in ["099", "600", "6xx", "4x1", "40", "4000", "", "abc"] {
        assert!(StatusSet::parse([bad]).is_err(), "{bad}");
    }
    assert!(StatusSet::parse(Vec::<&str>::new()).is_err());
}
