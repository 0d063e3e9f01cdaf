//! The rate-limit headers and bodies, parsed with a structured-field parser and cross-checked against
//! the decisions the engine reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use http::{Method, StatusCode};
use tollgate::{Policy, Quota};
use tollgate_http::{
    HeaderConfig, HttpPolicy, KeyChain, RequestInfo, ResetFormat, RetryAfterFormat,
};

#[tokio::test]
async fn every_response_through_a_policy_carries_the_headers() {
    let clock = manual_clock();
    let engine = builder(clock.clone())
        .policy(policy(
            fixed("per-key", 3, 60),
            &["header:x-api-key"],
            Some("/v1/**"),
        ))
        .build()
        .unwrap();
    let app = app(engine);
    clock.advance(Duration::from_secs(20)); // 20 s into a 60 s window
    let key = [("x-api-key", "k")];
    for expected_remaining in [2, 1, 0] {
        let r = send(&app, get("/v1/items", "1.1.1.1", &key)).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header_u64(&r, "x-ratelimit-limit"), 3);
        assert_eq!(header_u64(&r, "x-ratelimit-remaining"), expected_remaining);
        assert_eq!(header_u64(&r, "x-ratelimit-reset"), START + 60);
        let policy = sf_items(header(&r, "ratelimit-policy").unwrap());
        assert_eq!(policy.len(), 1);
        assert_eq!(policy[0].name, "per-key");
        assert_eq!((policy[0].param("q"), policy[0].param("w")), (3, 60));
        let now = sf_items(header(&r, "ratelimit").unwrap());
        assert_eq!(now[0].name, "per-key");
        assert_eq!(now[0].param("r"), expected_remaining as i64);
        assert_eq!(now[0].param("t"), 40);
        assert!(header(&r, "retry-after").is_none());
    }
    let r = send(&app, get("/v1/items", "1.1.1.1", &key)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    let retry = header_u64(&r, "retry-after");
    let now = sf_items(header(&r, "ratelimit").unwrap());
    assert_eq!(now[0].param("r"), 0);
    let t = u64::try_from(now[0].param("t")).unwrap();
    assert_eq!(retry, 40);
    assert!(retry >= t && retry >= 1);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining"), 0);
    let body = body_json(r).await;
    assert_eq!(
        body,
        serde_json::json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Request cannot be satisfied as assigned quota has been exceeded",
            "status": 429,
            "violated-policies": ["per-key"],
            "retry_after": 40
        })
    );
    // Outside every policy: no headers at all.
    let r = send(&app, get("/other", "1.1.1.1", &key)).await;
    assert!(header(&r, "x-ratelimit-limit").is_none());
    assert!(header(&r, "ratelimit-policy").is_none());
}

#[tokio::test]
async fn the_body_lists_fields_in_spec_order() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("per-key", 1, 60), &["ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    send(&app, get("/", "1.1.1.1", &[])).await;
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    use http_body_util::BodyExt;
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(text.starts_with(
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"#
    ));
    assert!(
        text.ends_with(r#""status":429,"violated-policies":["per-key"],"retry_after":60}"#),
        "{text}"
    );
}

#[tokio::test]
async fn token_bucket_window_is_the_time_to_refill_and_t_rounds_up() {
    let clock = manual_clock();
    let bucket = Policy::new(
        "burst",
        Quota::token_bucket(20, "1/s".parse().unwrap()).unwrap(),
    )
    .unwrap();
    let engine = builder(clock.clone())
        .policy(
            HttpPolicy::new(bucket)
                .keys(KeyChain::parse(["ip"]).unwrap())
                .cost(5),
        )
        .build()
        .unwrap();
    let app = app(engine);
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    let policy = sf_items(header(&r, "ratelimit-policy").unwrap());
    assert_eq!((policy[0].param("q"), policy[0].param("w")), (20, 20));
    let now = sf_items(header(&r, "ratelimit").unwrap());
    assert_eq!((now[0].param("r"), now[0].param("t")), (15, 5));
    clock.advance(Duration::from_millis(300));
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    let now = sf_items(header(&r, "ratelimit").unwrap());
    // 10 tokens used, 0.3 s of refill: 9.7 s until full, rounded up.
    assert_eq!((now[0].param("r"), now[0].param("t")), (10, 10));
}

#[tokio::test]
async fn several_policies_are_all_listed_and_the_most_restrictive_reported() {
    let clock = manual_clock();
    let engine = builder(clock.clone())
        .policy(policy(fixed("burst", 100, 60), &["ip"], None))
        .policy(policy(fixed("daily", 5, 86_400), &["ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    let policy = sf_items(header(&r, "ratelimit-policy").unwrap());
    let names: Vec<_> = policy.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["burst", "daily"]);
    assert_eq!((policy[1].param("q"), policy[1].param("w")), (5, 86_400));
    let now = sf_items(header(&r, "ratelimit").unwrap());
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].name, "daily");
    assert_eq!(now[0].param("r"), 4);
    assert_eq!(header_u64(&r, "x-ratelimit-limit"), 5);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining"), 4);
    // The wire format: `;` without spaces, items joined by ", ".
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some(r#""burst";q=100;w=60, "daily";q=5;w=86400"#)
    );
}

#[tokio::test]
async fn reset_delta_legacy_off_ietf_off_and_http_date() {
    let clock = manual_clock();
    let engine = builder(clock.clone())
        .policy(policy(fixed("p", 1, 60), &["ip"], None))
        .headers(HeaderConfig {
            reset_format: ResetFormat::Delta,
            ietf: false,
            retry_after_format: RetryAfterFormat::HttpDate,
            ..HeaderConfig::default()
        })
        .build()
        .unwrap();
    let app = app(engine);
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    assert_eq!(header_u64(&r, "x-ratelimit-reset"), 60);
    assert!(header(&r, "ratelimit").is_none() && header(&r, "ratelimit-policy").is_none());
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let date = httpdate::parse_http_date(header(&r, "retry-after").unwrap()).unwrap();
    let at = date
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(at, START + 60);

    let engine = builder(clock.clone())
        .policy(policy(fixed("p", 1, 60), &["ip"], None))
        .headers(HeaderConfig {
            legacy: false,
            ..HeaderConfig::default()
        })
        .build()
        .unwrap();
    let app2 = common::app(engine);
    let r = send(&app2, get("/", "1.1.1.1", &[])).await;
    assert!(header(&r, "x-ratelimit-limit").is_none());
    assert!(header(&r, "ratelimit").is_some());
}

/// `reset_format = "none"` with the IETF fields off: the two lines tower_governor sends, and
/// a 429 still carries its Retry-After.
#[tokio::test]
async fn limit_and_remaining_only() {
    let clock = manual_clock();
    let engine = builder(clock.clone())
        .policy(policy(fixed("p", 2, 60), &["ip"], None))
        .headers(HeaderConfig {
            reset_format: "none".parse().unwrap(),
            ietf: false,
            ..HeaderConfig::default()
        })
        .build()
        .unwrap();
    let app = app(engine);
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    let mut names: Vec<&str> = r.headers().keys().map(|n| n.as_str()).collect();
    names.retain(|n| n.contains("ratelimit"));
    names.sort_unstable();
    assert_eq!(names, ["x-ratelimit-limit", "x-ratelimit-remaining"]);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining"), 1);
    send(&app, get("/", "1.1.1.1", &[])).await;
    let r = send(&app, get("/", "1.1.1.1", &[])).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header_u64(&r, "retry-after"), 60);
    assert!(header(&r, "x-ratelimit-reset").is_none());
}

#[tokio::test]
async fn retry_after_is_never_zero_and_never_before_t() {
    let clock = manual_clock();
    let engine = builder(clock.clone())
        .policy(policy(swc("swc", 10, 10), &["ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    let mut denials = 0;
    // Walk through time in uneven steps: every 429 must satisfy the header contract's inequalities (t <= Retry-After, both at least 1).
    for step in 0..400u64 {
        clock.advance(Duration::from_millis(37 + (step * 13) % 101));
        let r = send(&app, get("/", "1.1.1.1", &[])).await;
        let now = sf_items(header(&r, "ratelimit").unwrap());
        let t = u64::try_from(now[0].param("t")).unwrap();
        assert!(now[0].param("r") >= 0);
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            denials += 1;
            let retry = header_u64(&r, "retry-after");
            assert!(retry >= 1 && retry >= t, "retry {retry} t {t}");
            let body = body_json(r).await;
            assert_eq!(body["retry_after"].as_u64(), Some(retry));
        }
    }
    assert!(denials > 0);
}

#[tokio::test]
async fn engine_outcome_matches_the_headers() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("a", 10, 60), &["ip"], Some("/v1/**")))
        .policy(policy(
            fixed("b", 3, 10),
            &["header:x-api-key", "ip"],
            Some("/v1/export/*"),
        ))
        .build()
        .unwrap();
    let headers = http::HeaderMap::new();
    let method = Method::POST;
    let info = RequestInfo::new(&method, "/v1/export/7?x=1", &headers)
        .with_client_ip(Some("203.0.113.9".parse().unwrap()));
    let evaluation = engine.evaluate(&info).await;
    assert!(evaluation.allowed());
    let ds = evaluation.decisions();
    assert_eq!(ds.len(), 2);
    let worst = ds.most_restrictive().unwrap();
    assert_eq!(worst.policy, "b");
    let mut map = http::HeaderMap::new();
    evaluation.apply_headers(&mut map);
    assert_eq!(
        map["x-ratelimit-remaining"],
        worst.remaining.to_string().as_str()
    );
    let now = sf_items(map["ratelimit"].to_str().unwrap());
    assert_eq!(now[0].param("r") as u64, worst.remaining);
    assert_eq!(
        now[0].param("t") as u64,
        worst.reset.as_secs() + u64::from(worst.reset.subsec_nanos() > 0)
    );
}
