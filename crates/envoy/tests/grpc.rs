//! `ShouldRateLimit` over real gRPC on 127.0.0.1 with tonic's client: descriptor matching,
//! hits_addend, shadow mode, unlimited, unknown domains, headers, all-or-nothing, other
//! algorithms, reload and limit overrides. The YAML files are in `yaml_files.rs`, the edges
//! (bad input, malformed bodies, store failures) in `wire.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{START, edge, header, request, sf_items, start};
use tollgate_envoy::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PUnit;
use tollgate_envoy::{Config, Descriptor, Domain, RateLimit, ResetFormat, Unit};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn exact_value_wins_over_key_only_and_values_count_apart() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    for i in 0..3 {
        let r = c
            .should_rate_limit(request("edge", &[&[("api_key", "gold")]]))
            .await
            .unwrap();
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(limit.requests_per_unit, 2);
        assert_eq!(limit.unit, PUnit::Minute as i32);
        // Unnamed in the configuration: no name, as envoyproxy/ratelimit answers.
        assert_eq!(limit.name, "");
        let expect = if i < 2 { OK } else { OVER };
        assert_eq!((r.overall_code, s.code), (expect, expect), "call {i}");
    }
    // Key-only: 5 per minute for each distinct value.
    for i in 0..6 {
        let r = c
            .should_rate_limit(request("edge", &[&[("api_key", "silver")]]))
            .await
            .unwrap();
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            5
        );
        assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "");
        assert_eq!(r.overall_code, if i < 5 { OK } else { OVER }, "call {i}");
        assert_eq!(r.statuses[0].limit_remaining, 4u32.saturating_sub(i));
    }
    let r = c
        .should_rate_limit(request("edge", &[&[("api_key", "bronze")]]))
        .await
        .unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 4));
    // A minute later, the windows have passed.
    server.clock.advance(Duration::from_secs(61));
    let r = c
        .should_rate_limit(request("edge", &[&[("api_key", "gold")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn nested_descriptors_apply_only_at_the_last_entry() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    // The parent alone has no limit.
    let r = c
        .should_rate_limit(request("edge", &[&[("generic_key", "foo")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    assert!(r.response_headers_to_add.is_empty());
    let nested: &[(&str, &str)] = &[("generic_key", "foo"), ("remote_address", "1.2.3.4")];
    let r = c
        .should_rate_limit(request("edge", &[nested]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    let policy = sf_items(header(&r, "RateLimit-Policy").unwrap());
    assert_eq!(policy[0].name, "edge.generic_key_foo.remote_address");
    let r = c
        .should_rate_limit(request("edge", &[nested]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OVER);
    // Another address has its own count; a value that matches no node has no limit.
    let other: &[(&str, &str)] = &[("generic_key", "foo"), ("remote_address", "5.6.7.8")];
    let r = c
        .should_rate_limit(request("edge", &[other]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    let unmatched: &[(&str, &str)] = &[("generic_key", "bar"), ("remote_address", "1.2.3.4")];
    let r = c
        .should_rate_limit(request("edge", &[unmatched]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    // Deeper than the tree: no limit.
    let deeper: &[(&str, &str)] = &[
        ("generic_key", "foo"),
        ("remote_address", "1.2.3.4"),
        ("x", "y"),
    ];
    let r = c
        .should_rate_limit(request("edge", &[deeper]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    // One second later the nested limit admits again.
    server.clock.advance(Duration::from_secs(1));
    let r = c
        .should_rate_limit(request("edge", &[nested]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn hits_addend_counts_that_many_and_zero_means_one() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    let mut req = request("edge", &[&[("path", "/a")]]);
    req.hits_addend = 4;
    let r = c.should_rate_limit(req.clone()).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 6));
    let r = c.should_rate_limit(req.clone()).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));
    // Past what is left: over the limit, and counted all the same, as the peer counts it.
    let r = c.should_rate_limit(req.clone()).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 0));
    req.hits_addend = 0;
    let mut fresh = req.clone();
    fresh.descriptors[0].entries[0].value = "/a2".to_owned();
    let r = c.should_rate_limit(fresh).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 9));
    // A per-descriptor hits_addend overrides the request's.
    let mut per = request("edge", &[&[("path", "/b")]]);
    per.hits_addend = 1;
    per.descriptors[0].hits_addend = Some(9);
    let r = c.should_rate_limit(per).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 1));
    // More than the limit can ever admit: over limit, and counted.
    let mut huge = request("edge", &[&[("path", "/c")]]);
    huge.hits_addend = u32::MAX;
    let r = c.should_rate_limit(huge).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 0));
    assert!(header(&r, "Retry-After").is_some());
}

#[tokio::test]
async fn shadow_mode_counts_but_answers_ok() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    let both: &[&[(&str, &str)]] = &[&[("client", "beta")], &[("path", "/s")]];
    for i in 0..3 {
        let r = c.should_rate_limit(request("edge", both)).await.unwrap();
        assert_eq!(r.overall_code, OK, "call {i}");
        assert_eq!(r.statuses[0].code, OK);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        // The enforced descriptor is counted even while the shadow one would deny.
        assert_eq!(r.statuses[1].limit_remaining, 9 - i);
        // Headers report the enforced descriptor only.
        assert_eq!(header(&r, "X-RateLimit-Limit"), Some("10"));
    }
}

#[tokio::test]
async fn unlimited_and_unknown_answer_ok() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    for _ in 0..5 {
        let r = c
            .should_rate_limit(request("edge", &[&[("remote_address", "10.0.0.1")]]))
            .await
            .unwrap();
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert!(r.statuses[0].current_limit.is_none());
    }
    // Unknown domain: OK, one OK status per descriptor, no headers.
    let r = c
        .should_rate_limit(request("nope", &[&[("api_key", "gold")], &[("a", "b")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 2);
    assert!(
        r.statuses
            .iter()
            .all(|s| s.code == OK && s.current_limit.is_none())
    );
    assert!(r.response_headers_to_add.is_empty());
    // Unknown keys in a known domain.
    let r = c
        .should_rate_limit(request("edge", &[&[("unknown", "x")], &[]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 2);
}

#[tokio::test]
async fn headers_follow_spec_section_5() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    let both: &[&[(&str, &str)]] = &[&[("api_key", "gold")], &[("path", "/h")]];
    let r = c.should_rate_limit(request("edge", both)).await.unwrap();
    assert_eq!(r.overall_code, OK);
    // Most restrictive: api_key_gold (remaining 1 of 2, versus 9 of 10).
    assert_eq!(header(&r, "X-RateLimit-Limit"), Some("2"));
    assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("1"));
    let reset: u64 = header(&r, "X-RateLimit-Reset").unwrap().parse().unwrap();
    assert!((START + 1..=START + 60).contains(&reset), "{reset}");
    let policies = sf_items(header(&r, "RateLimit-Policy").unwrap());
    assert_eq!(policies.len(), 2);
    assert_eq!(policies[0].name, "edge.api_key_gold");
    assert_eq!((policies[0].param("q"), policies[0].param("w")), (2, 60));
    assert_eq!(policies[1].name, "edge.path");
    assert_eq!((policies[1].param("q"), policies[1].param("w")), (10, 3600));
    let now = sf_items(header(&r, "RateLimit").unwrap());
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].name, "edge.api_key_gold");
    assert_eq!(now[0].param("r"), 1);
    assert!((1..=60).contains(&now[0].param("t")));
    assert!(header(&r, "Retry-After").is_none());
    // The duration until reset is reported per descriptor.
    let d = r.statuses[0].duration_until_reset.unwrap();
    assert!(d.seconds > 0 && d.seconds <= 60, "{d:?}");

    c.should_rate_limit(request("edge", both)).await.unwrap();
    let r = c.should_rate_limit(request("edge", both)).await.unwrap();
    assert_eq!(r.overall_code, OVER);
    assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("0"));
    let retry: i64 = header(&r, "Retry-After").unwrap().parse().unwrap();
    let t = sf_items(header(&r, "RateLimit").unwrap())[0].param("t");
    assert!(retry >= 1 && retry >= t, "Retry-After {retry} t {t}");

    // Switches: delta reset, no IETF fields.
    let server = start(edge().reset_format(ResetFormat::Delta).ietf_headers(false)).await;
    let mut c = server.client().await;
    let r = c
        .should_rate_limit(request("edge", &[&[("api_key", "gold")]]))
        .await
        .unwrap();
    let reset: u64 = header(&r, "X-RateLimit-Reset").unwrap().parse().unwrap();
    assert!((1..=60).contains(&reset));
    assert!(header(&r, "RateLimit").is_none());
    assert!(header(&r, "RateLimit-Policy").is_none());
    let server = start(edge().x_ratelimit_headers(false)).await;
    let mut c = server.client().await;
    let r = c
        .should_rate_limit(request("edge", &[&[("api_key", "gold")]]))
        .await
        .unwrap();
    assert!(header(&r, "X-RateLimit-Limit").is_none());
    assert!(header(&r, "RateLimit").is_some());
}

#[tokio::test]
async fn a_request_over_the_limit_is_counted_by_every_descriptor_as_the_peer_counts_it() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    let nested: &[(&str, &str)] = &[("generic_key", "foo"), ("remote_address", "9.9.9.9")];
    let both: &[&[(&str, &str)]] = &[nested, &[("path", "/x")]];
    let r = c.should_rate_limit(request("edge", both)).await.unwrap();
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[1].limit_remaining, 9);
    // The nested limit (1/s) denies; every descriptor still counts the hit, as
    // envoyproxy/ratelimit counts it (a usage report sent after the stream is never lost).
    for i in 0..3 {
        let r = c.should_rate_limit(request("edge", both)).await.unwrap();
        assert_eq!(r.overall_code, OVER);
        assert_eq!((r.statuses[0].code, r.statuses[1].code), (OVER, OK));
        assert_eq!(r.statuses[1].limit_remaining, 8 - i);
    }
    let r = c
        .should_rate_limit(request("edge", &[&[("path", "/x")]]))
        .await
        .unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 5);
}

/// `apply_on_stream_done`: Envoy reports a finished stream's usage as a request's
/// `hits_addend`. Past what is left it is still counted, so the next request is over the limit,
/// as with envoyproxy/ratelimit.
#[tokio::test]
async fn a_usage_report_past_the_limit_is_counted() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    let mut report = request("edge", &[&[("path", "/usage")]]);
    report.hits_addend = 25;
    let r = c.should_rate_limit(report).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 0));
    let r = c
        .should_rate_limit(request("edge", &[&[("path", "/usage")]]))
        .await
        .unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 0));
}

#[tokio::test]
async fn other_algorithms_and_quotas() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    for i in 0..4 {
        let r = c
            .should_rate_limit(request("edge", &[&[("tb", "k")]]))
            .await
            .unwrap();
        assert_eq!(r.overall_code, if i < 3 { OK } else { OVER }, "call {i}");
        assert_eq!(
            r.statuses[0].current_limit.as_ref().unwrap().unit,
            PUnit::Second as i32
        );
    }
    let r = c
        .should_rate_limit(request("edge", &[&[("custom", "k")]]))
        .await
        .unwrap();
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    // 7 per 90 s is no unit: reported per second, rounded down.
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (0, PUnit::Second as i32)
    );
    assert_eq!(r.statuses[0].limit_remaining, 6);
    let policy = sf_items(header(&r, "RateLimit-Policy").unwrap());
    assert_eq!((policy[0].param("q"), policy[0].param("w")), (7, 90));
}

#[tokio::test]
async fn reload_swaps_the_config_and_keeps_unchanged_counters() {
    let limiter = tollgate::Limiter::builder().build().unwrap();
    let service = tollgate_envoy::RlsService::new(limiter, &edge()).unwrap();
    let gold = request("edge", &[&[("api_key", "gold")]]);
    let path = request("edge", &[&[("path", "/r")]]);
    service.should_rate_limit(&gold).await.unwrap();
    service.should_rate_limit(&path).await.unwrap();
    // api_key=gold goes from 2/min to 3/min; path is unchanged; a new domain appears.
    let next = Config::new().domain(
        Domain::new("edge")
            .descriptor(
                Descriptor::new("api_key")
                    .value("gold")
                    .rate_limit(RateLimit::per(3, Unit::Minute)),
            )
            .descriptor(Descriptor::new("path").rate_limit(RateLimit::per(10, Unit::Hour))),
    );
    let next = next.domain(
        Domain::new("new")
            .descriptor(Descriptor::new("k").rate_limit(RateLimit::per(1, Unit::Day))),
    );
    let clone = service.clone();
    clone.reload(&next).unwrap();
    let r = service.should_rate_limit(&gold).await.unwrap();
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "a changed limit starts afresh"
    );
    let r = service.should_rate_limit(&path).await.unwrap();
    assert_eq!(
        r.statuses[0].limit_remaining, 8,
        "an unchanged limit keeps its count"
    );
    let r = service
        .should_rate_limit(&request("new", &[&[("k", "v")]]))
        .await
        .unwrap();
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    // A bad config is refused and the old one stays.
    let bad = Config::new()
        .domain(Domain::new("edge"))
        .domain(Domain::new("edge"));
    assert!(service.reload(&bad).is_err());
    let r = service
        .should_rate_limit(&request("new", &[&[("k", "v")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OVER);
}

#[tokio::test]
async fn limit_overrides_apply_as_envoy_ratelimit_applies_them() {
    use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let server = start(edge()).await;
    let mut c = server.client().await;
    let with_override = |domain: &str, entries: &[(&str, &str)], rpu: u32, unit: i32| {
        let mut r = request(domain, &[entries]);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: rpu,
            unit,
        });
        r
    };
    // Unmatched in the tree: the override applies, per value.
    for i in 0..3 {
        let r = c
            .should_rate_limit(with_override("edge", &[("user", "u1")], 2, 2))
            .await
            .unwrap();
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (2, PUnit::Minute as i32)
        );
        assert_eq!(r.overall_code, if i < 2 { OK } else { OVER }, "call {i}");
    }
    let r = c
        .should_rate_limit(with_override("edge", &[("user", "u2")], 2, 2))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    // Matched: the override wins over the configured 2/min of api_key=gold.
    for _ in 0..3 {
        let r = c
            .should_rate_limit(with_override("edge", &[("api_key", "gold")], 5, 3))
            .await
            .unwrap();
        assert_eq!(r.overall_code, OK);
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            5
        );
    }
    // Unknown domain, unknown unit: no override.
    let r = c
        .should_rate_limit(with_override("nope", &[("user", "u1")], 1, 1))
        .await
        .unwrap();
    assert!(r.statuses[0].current_limit.is_none());
    // Zero requests: every request over the limit, as the peer reads it.
    let r = c
        .should_rate_limit(with_override("edge", &[("api_key", "gold")], 0, 1))
        .await
        .unwrap();
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, r.overall_code), (0, OVER));
    let r = c
        .should_rate_limit(with_override("edge", &[("user", "u9")], 1, 99))
        .await
        .unwrap();
    assert!(r.statuses[0].current_limit.is_none());
    // WEEK is 7 in envoy.type.v3.RateLimitUnit and in the answer's unit enum.
    let r = c
        .should_rate_limit(with_override("edge", &[("user", "w1")], 3, 7))
        .await
        .unwrap();
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit, PUnit::Week as i32),
        (3, 7, 7)
    );
    let reset = r.statuses[0].duration_until_reset.unwrap();
    assert!(
        reset.seconds > 0 && reset.seconds <= 7 * 86_400,
        "{reset:?}"
    );
}

#[tokio::test]
async fn weekly_limits_report_the_week_unit() {
    let config = Config::new().domain(
        Domain::new("w").descriptor(Descriptor::new("k").rate_limit(RateLimit::per(4, Unit::Week))),
    );
    let server = start(config).await;
    let mut c = server.client().await;
    let r = c
        .should_rate_limit(request("w", &[&[("k", "v")]]))
        .await
        .unwrap();
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (4, PUnit::Week as i32)
    );
    let policy = sf_items(header(&r, "RateLimit-Policy").unwrap());
    assert_eq!(policy[0].name, "w.k");
    assert_eq!(
        policy[0].params,
        vec![("q".to_owned(), 4), ("w".to_owned(), 604_800)]
    );
}

#[tokio::test]
async fn a_descriptor_hits_addend_overrides_the_request_one_zero_included() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    // Two descriptors, request addend 3: the first counts 3, the second its own 2.
    let mut req = request("edge", &[&[("path", "/x")], &[("api_key", "k-x")]]);
    req.hits_addend = 3;
    req.descriptors[1].hits_addend = Some(2);
    let r = c.should_rate_limit(req).await.unwrap();
    assert_eq!(r.overall_code, OK);
    let remaining: Vec<u32> = r.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(remaining, vec![7, 3]);
    // A descriptor addend of 0 checks without counting (as envoyproxy/ratelimit reads it),
    // where a request addend of 0 means 1.
    let mut peek = request("edge", &[&[("path", "/x")]]);
    peek.descriptors[0].hits_addend = Some(0);
    let r = c.should_rate_limit(peek).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 7));
    // More than u32 can hold: the limit can never admit it, and (as the peer does) it is
    // counted all the same.
    let mut huge = request("edge", &[&[("path", "/y")]]);
    huge.descriptors[0].hits_addend = Some(u64::MAX);
    let r = c.should_rate_limit(huge).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 0));
}
