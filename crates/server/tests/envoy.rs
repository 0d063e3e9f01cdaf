//! Envoy's rate limit service on `[server] grpc_listen`, answering from `[envoy] config_dir`
//! over the server's store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tollgate_envoy::RlsClient;
use tollgate_envoy::proto::envoy::common_ratelimit_v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::common_ratelimit_v3::rate_limit_descriptor::Entry;
use tollgate_envoy::proto::envoy::service_ratelimit_v3::RateLimitRequest;

const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;

fn request(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
}

#[tokio::test]
async fn grpc_listen_serves_envoy_rls_from_the_yaml_folder() {
    let dir = std::env::temp_dir().join(format!("tollgate-envoy-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("ratelimit")).unwrap();
    std::fs::write(
        dir.join("ratelimit/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n",
    )
    .unwrap();
    let path = dir.join("tollgate.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[envoy]\nconfig_dir = \"ratelimit\"\n",
    )
    .unwrap();
    let s = start(tollgate_server::Config::load(&path).unwrap()).await;
    let mut client = RlsClient::connect(format!("http://{}", s.grpc.unwrap()))
        .await
        .unwrap();
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request("api_key", "k1"))
            .await
            .unwrap();
        codes.push(r.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER_LIMIT]);
    let r = client
        .should_rate_limit(request("api_key", "k2"))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert!(
        r.response_headers_to_add
            .iter()
            .any(|h| h.key.eq_ignore_ascii_case("ratelimit-policy"))
    );

    // A reload picks up changed descriptors without a restart (the file watch compares the
    // main config file, so touch it too).
    let policy_header =
        |r: &tollgate_envoy::proto::envoy::service_ratelimit_v3::RateLimitResponse| {
            r.response_headers_to_add
                .iter()
                .find(|h| h.key.eq_ignore_ascii_case("ratelimit-policy"))
                .map(|h| h.value.clone())
                .unwrap_or_default()
        };
    std::fs::write(
        dir.join("ratelimit/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n",
    )
    .unwrap();
    let toml = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{toml}# descriptors changed\n")).unwrap();
    let mut fresh = 0;
    wait_for(|| {
        fresh += 1;
        let key = format!("reload-{fresh}");
        let mut client = client.clone();
        async move {
            let r = client
                .should_rate_limit(request("api_key", &key))
                .await
                .unwrap();
            policy_header(&r).contains("q=5")
        }
    })
    .await;

    // A bad descriptor file is rejected: the running descriptors stay.
    std::fs::write(
        dir.join("ratelimit/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    )
    .unwrap();
    std::fs::write(&path, format!("{toml}# a bad descriptor\n")).unwrap();
    wait_for(|| async {
        let m = get(&s.admin_url("/metrics"), &[]).await;
        String::from_utf8_lossy(&m.body)
            .contains("tollgate_config_reloads_total{result=\"failed\"} 1")
    })
    .await;
    let r = client
        .should_rate_limit(request("api_key", "after-bad"))
        .await
        .unwrap();
    assert!(policy_header(&r).contains("q=5"), "{}", policy_header(&r));
    s.stop().await;

    // A grpc_listen without descriptors is refused with its position.
    let e =
        tollgate_server::Config::parse("t.toml", "[server]\ngrpc_listen = \"127.0.0.1:8081\"\n")
            .unwrap_err()
            .to_string();
    assert!(
        e.starts_with("t.toml:2:15: [server] grpc_listen serves Envoy"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
