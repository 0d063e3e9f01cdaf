//! Envoy's rate limit service in the server: on `[server] grpc_listen` answering from
//! `[envoy] config_dir`, and from a folder of envoyproxy/ratelimit YAML files alone
//! (`tollgate serve --envoy-config DIR`), over the server's store; files changed, added,
//! removed or in subfolders are picked up by the reload that watches the configuration.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use common::*;
use tollgate_envoy::RlsClient;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;

fn request(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
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

/// One `api_key` limit per hour. Envoy's windows are fixed and aligned to the clock: with a
/// minute's, a test that straddled a minute boundary saw its counters reset mid-test (a key
/// asserted over its limit after a reload was admitted again).
fn limit_yaml(domain: &str, per_hour: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: hour\n      requests_per_unit: {per_hour}\n"
    )
}

fn policy_header(r: &RateLimitResponse) -> String {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case("ratelimit-policy"))
        .map(|h| h.value.clone())
        .unwrap_or_default()
}

/// A fresh folder under the system's temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The requests-per-unit of the limit `domain` applies to a fresh `api_key`, if any (a fresh
/// key each time, so no count gets in the way).
async fn limit_of(client: &RlsClient, domain: &str) -> Option<u32> {
    static FRESH: AtomicU32 = AtomicU32::new(0);
    let fresh = FRESH.fetch_add(1, Ordering::Relaxed);
    let r = client
        .clone()
        .should_rate_limit(request(domain, "api_key", &format!("probe-{fresh}")))
        .await
        .unwrap();
    r.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

async fn reloads_failed(s: &Running) -> String {
    let m = get(&s.admin_url("/metrics"), &[]).await;
    String::from_utf8_lossy(&m.body)
        .lines()
        .find(|l| l.starts_with("tollgate_config_reloads_total{result=\"failed\"}"))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn grpc_listen_serves_envoy_rls_from_the_yaml_folder() {
    let dir = temp_dir("envoy-toml");
    std::fs::create_dir_all(dir.join("ratelimit")).unwrap();
    std::fs::write(dir.join("ratelimit/edge.yaml"), limit_yaml("edge", 2)).unwrap();
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
            .should_rate_limit(request("edge", "api_key", "k1"))
            .await
            .unwrap();
        codes.push(r.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER_LIMIT]);
    let r = client
        .should_rate_limit(request("edge", "api_key", "k2"))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert!(policy_header(&r).contains("q=2"), "{}", policy_header(&r));

    // A changed descriptor file is picked up without touching the TOML file.
    std::fs::write(dir.join("ratelimit/edge.yaml"), limit_yaml("edge", 5)).unwrap();
    wait_for(|| async { limit_of(&client, "edge").await == Some(5) }).await;

    // A bad descriptor file is rejected: the running descriptors stay.
    let before = reloads_failed(&s).await;
    std::fs::write(
        dir.join("ratelimit/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    )
    .unwrap();
    wait_for(|| async { reloads_failed(&s).await != before }).await;
    assert_eq!(limit_of(&client, "edge").await, Some(5));
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

/// `tollgate serve --envoy-config DIR`, every listener moved to port 0.
fn envoy_only(dir: &Path) -> tollgate_server::Config {
    let mut config = tollgate_server::Config::envoy_only(dir).unwrap();
    assert_eq!(
        config.grpc_listen,
        Some(tollgate_server::config::DEFAULT_GRPC_LISTEN)
    );
    assert!(config.policies.is_empty());
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    config.listen = any;
    config.admin_listen = any;
    config.grpc_listen = Some(any);
    config
}

#[tokio::test]
async fn envoy_config_dir_alone_runs_and_follows_files_added_removed_and_nested() {
    let dir = temp_dir("envoy-only");
    std::fs::write(dir.join("edge.yaml"), limit_yaml("edge", 2)).unwrap();
    // Hidden files (editor swap files, a ConfigMap's `..data`) and other extensions are not
    // configuration.
    std::fs::write(dir.join(".edge.yaml.swp"), "not yaml").unwrap();
    std::fs::create_dir_all(dir.join("..data")).unwrap();
    std::fs::write(dir.join("..data/edge.yaml"), limit_yaml("edge", 9)).unwrap();
    std::fs::write(dir.join("README.txt"), "notes").unwrap();
    let s = start(envoy_only(&dir)).await;
    let client = RlsClient::connect(format!("http://{}", s.grpc.unwrap()))
        .await
        .unwrap();
    let mut c = client.clone();
    let codes: Vec<i32> = futures_codes(&mut c, 3).await;
    assert_eq!(codes, [OK, OK, OVER_LIMIT]);
    // No HTTP policies: the decision API admits everything.
    let r = post_json(&s.url("/v1/check"), r#"{"path": "/x"}"#).await;
    assert_eq!(r.status, 200);

    // A file added in a subfolder brings its domain.
    assert_eq!(limit_of(&client, "tenants").await, None);
    std::fs::create_dir_all(dir.join("teams/a")).unwrap();
    std::fs::write(dir.join("teams/a/tenants.yml"), limit_yaml("tenants", 7)).unwrap();
    wait_for(|| async { limit_of(&client, "tenants").await == Some(7) }).await;
    // The edge counters were kept across the reload: k1 is still over.
    let r = c
        .should_rate_limit(request("edge", "api_key", "k1"))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OVER_LIMIT);

    // A file removed takes its domain away.
    std::fs::remove_file(dir.join("edge.yaml")).unwrap();
    wait_for(|| async { limit_of(&client, "edge").await.is_none() }).await;
    assert_eq!(limit_of(&client, "tenants").await, Some(7));

    // A bad file is refused with its name; the running configuration stays.
    let before = reloads_failed(&s).await;
    std::fs::write(
        dir.join("teams/bad.yaml"),
        "domain: bad\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: day}\n",
    )
    .unwrap();
    wait_for(|| async { reloads_failed(&s).await != before }).await;
    assert_eq!(limit_of(&client, "tenants").await, Some(7));
    s.stop().await;

    // Refused at start with the file and the descriptor named.
    let e = tollgate_server::Config::envoy_only(&dir)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.yaml") && e.contains("bad.k"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The overall codes of `n` calls for `api_key=k1` in domain `edge`.
async fn futures_codes(client: &mut RlsClient, n: usize) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..n {
        let r = client
            .should_rate_limit(request("edge", "api_key", "k1"))
            .await
            .unwrap();
        codes.push(r.overall_code);
    }
    codes
}
