//! envoyproxy/ratelimit's YAML files over real gRPC: the fixtures in its README's style load
//! unchanged and answer as the peer would; the example Envoy set-up answers what Envoy sends;
//! bad files are refused naming the file and the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{descriptor, header, request, start};
use tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PUnit;
use tollgate_envoy::{Config, load_envoy_config_dir};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

fn fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[tokio::test]
async fn envoy_ratelimit_yaml_configs_load_unchanged() {
    let domains = load_envoy_config_dir(fixtures().join("config")).unwrap();
    let names: Vec<&str> = domains.iter().map(|d| d.name()).collect();
    assert_eq!(names, ["mongo_cps", "rl"]);
    let server = start(Config::new().domains(domains)).await;
    let mut c = server.client().await;

    let r = c
        .should_rate_limit(request("mongo_cps", &[&[("database", "users")]]))
        .await
        .unwrap();
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (500, PUnit::Second as i32)
    );
    let r = c
        .should_rate_limit(request("mongo_cps", &[&[("database", "other")]]))
        .await
        .unwrap();
    assert!(r.statuses[0].current_limit.is_none());

    // Nested marketing limit (5/day) wins over the top-level to_number (100/day).
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061234567")];
    for i in 0..6 {
        let r = c
            .should_rate_limit(request("rl", &[marketing]))
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
        assert_eq!(r.overall_code, if i < 5 { OK } else { OVER });
    }
    let r = c
        .should_rate_limit(request("rl", &[&[("to_number", "2061234567")]]))
        .await
        .unwrap();
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        100
    );
    assert_eq!(r.statuses[0].limit_remaining, 99);

    // remote_address: 10/s, except the unlimited 50.0.0.5.
    for i in 0..11 {
        let r = c
            .should_rate_limit(request("rl", &[&[("remote_address", "1.1.1.1")]]))
            .await
            .unwrap();
        assert_eq!(r.overall_code, if i < 10 { OK } else { OVER });
        let r = c
            .should_rate_limit(request("rl", &[&[("remote_address", "50.0.0.5")]]))
            .await
            .unwrap();
        assert_eq!(
            (r.overall_code, r.statuses[0].limit_remaining),
            (OK, u32::MAX)
        );
    }

    let bad: &[(&str, &str)] = &[
        ("source_cluster", "proxy"),
        ("destination_cluster", "bad_service"),
    ];
    for i in 0..4 {
        let r = c.should_rate_limit(request("rl", &[bad])).await.unwrap();
        assert_eq!(r.overall_code, if i < 3 { OK } else { OVER });
    }
    for _ in 0..3 {
        let r = c
            .should_rate_limit(request("rl", &[&[("client_id", "beta")]]))
            .await
            .unwrap();
        assert_eq!(r.overall_code, OK);
    }
    let r = c
        .should_rate_limit(request("rl", &[&[("api_key", "k1")]]))
        .await
        .unwrap();
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit),
        ("per-api-key", 4)
    );
}

#[test]
fn yaml_errors_name_the_file_and_the_reason() {
    let err = load_envoy_config_dir(fixtures().join("bad")).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("broken.yaml"), "{text}");
    assert!(text.contains("fortnight"), "{text}");
    assert!(text.contains("remote_address"), "{text}");
    let err = tollgate_envoy::parse_envoy_config(
        "x.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    colour: red\n",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("x.yaml") && err.to_string().contains("colour"),
        "{err}"
    );
    let err = tollgate_envoy::parse_envoy_config("y.yaml", "descriptors: []\n").unwrap_err();
    assert!(err.to_string().contains("domain"), "{err}");
    let err = load_envoy_config_dir(fixtures().join("missing")).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    // Requests in flight cannot be limited over a protocol with no release.
    let err = tollgate_envoy::parse_envoy_config(
        "c.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 3\n      algorithm: concurrency\n",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("c.yaml")
            && err.to_string().contains("no message for a request's end"),
        "{err}"
    );
    // Two files with one domain.
    let a = tollgate_envoy::parse_envoy_config("a.yaml", "domain: d\n").unwrap();
    let b = tollgate_envoy::parse_envoy_config("b.yaml", "domain: d\n").unwrap();
    let limiter = tollgate::Limiter::builder().build().unwrap();
    let err =
        tollgate_envoy::RlsService::new(limiter, &Config::new().domain(a).domain(b)).unwrap_err();
    assert!(
        err.to_string().contains("b.yaml") && err.to_string().contains("twice"),
        "{err}"
    );
}

/// The descriptors `examples/envoy/envoy.yaml` makes Envoy send, against the example's
/// Tollgate config.
#[tokio::test]
async fn the_envoy_example_config_answers_what_envoy_sends() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/envoy/ratelimit");
    let server = start(Config::new().domains(load_envoy_config_dir(dir).unwrap())).await;
    let mut c = server.client().await;
    let envoy = |ip: &str, key: &str| {
        let descriptors: Vec<Vec<(String, String)>> = vec![
            vec![("remote_address".into(), ip.into())],
            vec![("api_key".into(), key.into())],
            vec![
                ("generic_key".into(), "api".into()),
                ("api_key".into(), key.into()),
            ],
        ];
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: descriptors
                .iter()
                .map(|d| {
                    let pairs: Vec<(&str, &str)> =
                        d.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    descriptor(&pairs)
                })
                .collect(),
            hits_addend: 0,
        }
    };
    let r = c.should_rate_limit(envoy("192.0.2.1", "k1")).await.unwrap();
    assert_eq!(r.overall_code, OK);
    let limits: Vec<u32> = r
        .statuses
        .iter()
        .map(|s| s.current_limit.as_ref().unwrap().requests_per_unit)
        .collect();
    assert_eq!(limits, [20, 100, 10_000]);
    // The per-address limit: 20 a second, then OVER_LIMIT with Retry-After.
    for _ in 1..20 {
        let r = c.should_rate_limit(envoy("192.0.2.1", "k1")).await.unwrap();
        assert_eq!(r.overall_code, OK);
    }
    let r = c.should_rate_limit(envoy("192.0.2.1", "k1")).await.unwrap();
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!(header(&r, "Retry-After"), Some("1"));
    // The denied request was counted by the API key too, as the peer counts every hit.
    let r = c.should_rate_limit(envoy("192.0.2.2", "k1")).await.unwrap();
    assert_eq!(r.statuses[1].limit_remaining, 78);
    // The CI key is unlimited; the partner key has its own limit.
    let r = c
        .should_rate_limit(envoy("192.0.2.3", "ci-smoke-test"))
        .await
        .unwrap();
    assert_eq!(r.statuses[1].limit_remaining, u32::MAX);
    let r = c
        .should_rate_limit(envoy("192.0.2.4", "partner-7f3a"))
        .await
        .unwrap();
    assert_eq!(
        r.statuses[1]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1000
    );
}
