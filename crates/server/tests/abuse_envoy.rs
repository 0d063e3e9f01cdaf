//! Allow and deny lists at Envoy's door: a request whose descriptors carry `remote_address`
//! is judged by the server's lists before any descriptor, live entries included; one without
//! it is decided as usual.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::json;
use tollgate_envoy::RlsClient;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitRequest;

const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;

fn from(address: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".to_owned(),
                value: address.to_owned(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
}

#[tokio::test]
async fn remote_address_is_judged_by_the_lists_first() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ratelimit")).unwrap();
    std::fs::write(
        dir.path().join("ratelimit/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n",
    )
    .unwrap();
    let path = dir.path().join("tollgate.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n[envoy]\nconfig_dir = \"ratelimit\"\n\n\
         [[list]]\nname = \"partners\"\naction = \"allow\"\nips = [\"203.0.113.0/24\"]\n\n\
         [[list]]\nname = \"blocked\"\naction = \"deny\"\nips = [\"198.51.100.0/24\"]\n",
    )
    .unwrap();
    let s = start(tollgate_server::Config::load(&path).unwrap()).await;
    let mut client = RlsClient::connect(format!("http://{}", s.grpc.unwrap()))
        .await
        .unwrap();
    let denied = client
        .should_rate_limit(from("198.51.100.7"))
        .await
        .unwrap();
    assert_eq!(denied.overall_code, OVER_LIMIT);
    let list = denied
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "x-tollgate-list")
        .map(|h| h.value.clone());
    assert_eq!(list.as_deref(), Some("blocked"));
    for _ in 0..3 {
        let r = client.should_rate_limit(from("203.0.113.7")).await.unwrap();
        assert_eq!(r.overall_code, OK, "partners are never limited");
    }
    // Anyone else: the descriptor's one request an hour.
    let mut codes = Vec::new();
    for _ in 0..2 {
        codes.push(
            client
                .should_rate_limit(from("192.0.2.7"))
                .await
                .unwrap()
                .overall_code,
        );
    }
    assert_eq!(codes, [OK, OVER_LIMIT]);
    // A live entry applies to Envoy's door too.
    let put = send(
        "PUT",
        &s.admin_url("/v1/lists/partners/entries/192.0.2.7"),
        &[("content-type", "application/json")],
        json!({"reason": "new partner"}).to_string(),
    )
    .await;
    assert_eq!(put.status, hyper::StatusCode::CREATED);
    let r = client.should_rate_limit(from("192.0.2.7")).await.unwrap();
    assert_eq!(r.overall_code, OK);
    let metrics =
        String::from_utf8(get(&s.admin_url("/metrics"), &[]).await.body.to_vec()).unwrap();
    assert!(
        metrics.contains("tollgate_list_matches_total{list=\"partners\",action=\"allow\"} 4"),
        "{metrics}"
    );
    s.stop().await;
}
