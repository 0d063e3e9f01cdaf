//! `tollgate serve --envoy-config DIR` as a user runs it: the real binary answers Envoy's rate
//! limit calls (gRPC, the envoy crate's `RlsClient`) from a folder of envoyproxy/ratelimit YAML
//! files, OK then OVER_LIMIT as the YAML says, and a file added to the folder while it runs
//! (in a subfolder, as the peer reads them) brings its domain without a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_envoy::RlsClient;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// `RateLimitResponse.Code`.
const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A domain whose every `api_key` value may make `per_hour` calls an hour. Hours, not minutes:
/// Envoy windows are fixed and aligned to the clock, and a test that straddled a minute boundary
/// would see its counters reset midway.
fn limit_yaml(domain: &str, per_hour: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: hour\n      requests_per_unit: {per_hour}\n"
    )
}

/// A running `tollgate serve`, killed when dropped.
struct Server {
    child: Child,
    grpc: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tollgate serve ARGS` and reads the gRPC address from its banner.
fn serve(dir: &Path, args: &[&str]) -> Server {
    let mut child = Command::new(BIN)
        .current_dir(dir)
        .arg("serve")
        .args(args)
        .env("TOLLGATE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let grpc = loop {
        let Some(line) = lines.next() else {
            let status = child.wait().unwrap();
            panic!("tollgate serve {args:?} ended ({status}) before serving Envoy");
        };
        let line = line.unwrap();
        if let Some(url) = line.split_whitespace().find(|w| w.starts_with("grpc://")) {
            break url.trim_start_matches("grpc://").parse().unwrap();
        }
    };
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server { child, grpc }
}

fn request(domain: &str, api_key: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".to_owned(),
                value: api_key.to_owned(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
}

/// One `ShouldRateLimit` call.
async fn call(client: &RlsClient, domain: &str, api_key: &str) -> RateLimitResponse {
    client
        .clone()
        .should_rate_limit(request(domain, api_key))
        .await
        .unwrap()
}

/// The overall codes of `n` calls for one key.
async fn codes(client: &RlsClient, domain: &str, api_key: &str, n: usize) -> Vec<i32> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(call(client, domain, api_key).await.overall_code);
    }
    out
}

/// The requests-per-unit `domain` applies to a fresh key, if the server knows the domain.
async fn limit_of(client: &RlsClient, domain: &str, probe: &mut u32) -> Option<u32> {
    *probe += 1;
    let r = call(client, domain, &format!("probe-{probe}")).await;
    r.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

/// The folder's first limits, then a file added in a subfolder while the server runs.
async fn answers_and_follows_the_folder(server: &Server, folder: &Path) {
    let client = RlsClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    // edge.yaml: 2 an hour per api_key.
    assert_eq!(codes(&client, "edge", "k1", 3).await, [OK, OK, OVER_LIMIT]);
    let r = call(&client, "edge", "k1").await;
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (2, 3)); // 3 = HOUR
    // Each api_key value is counted apart.
    assert_eq!(codes(&client, "edge", "k2", 1).await, [OK]);

    let mut probe = 0;
    assert_eq!(limit_of(&client, "tenants", &mut probe).await, None);
    std::fs::create_dir_all(folder.join("teams/a")).unwrap();
    std::fs::write(folder.join("teams/a/tenants.yml"), limit_yaml("tenants", 1)).unwrap();
    // The reload watch picks it up (within a second, as the docs say; the bound is generous
    // for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(30);
    while limit_of(&client, "tenants", &mut probe).await != Some(1) {
        assert!(Instant::now() < deadline, "the new file was not picked up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(codes(&client, "tenants", "t1", 2).await, [OK, OVER_LIMIT]);
    // The reload kept edge's counters: k1 is still over its limit.
    assert_eq!(codes(&client, "edge", "k1", 1).await, [OVER_LIMIT]);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Next to a TOML file that moves every listener, Envoy's among them, to a free port.
#[test]
fn serve_envoy_config_answers_from_the_folder_and_picks_up_a_new_file() {
    let dir = temp_dir("envoy-config");
    let folder = dir.join("ratelimit");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("edge.yaml"), limit_yaml("edge", 2)).unwrap();
    std::fs::write(
        dir.join("tollgate.toml"),
        "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let server = serve(
        &dir,
        &[
            "--config",
            "tollgate.toml",
            "--envoy-config",
            folder.to_str().unwrap(),
        ],
    );
    runtime().block_on(answers_and_follows_the_folder(&server, &folder));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Set in the copy of this test binary that runs inside its own network namespace.
const IN_NAMESPACE: &str = "TOLLGATE_TEST_IN_NETNS";

/// The folder alone, no TOML, the way envoyproxy/ratelimit runs: every listener on its fixed
/// default port (Envoy's on 127.0.0.1:8081). Those ports may be taken on a shared machine, so
/// the test runs again inside a network namespace of its own (`unshare`, util-linux), where
/// loopback is private to it and the server it starts.
#[cfg(target_os = "linux")]
#[test]
fn serve_envoy_config_alone_serves_on_the_default_port() {
    if std::env::var_os(IN_NAMESPACE).is_some() {
        return alone_in_this_namespace();
    }
    let this = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--"])
        .arg(this)
        .args([
            "--exact",
            "serve_envoy_config_alone_serves_on_the_default_port",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IN_NAMESPACE, "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run unshare (util-linux): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the test in its own network namespace failed (unshare needs unprivileged user \
         namespaces: sysctl kernel.unprivileged_userns_clone=1):\n{stdout}\n{stderr}"
    );
    // The copy ran the test, not nothing.
    assert!(stdout.contains("1 passed"), "{stdout}\n{stderr}");
}

/// Inside the namespace: loopback up, then `tollgate serve --envoy-config DIR` and nothing else.
#[cfg(target_os = "linux")]
fn alone_in_this_namespace() {
    let up = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run ip: {e} (apt-get install iproute2)"));
    assert!(up.success(), "ip link set lo up: {up}");
    let dir = temp_dir("envoy-alone");
    std::fs::write(dir.join("edge.yaml"), limit_yaml("edge", 2)).unwrap();
    let server = serve(&dir, &["--envoy-config", "."]);
    assert_eq!(server.grpc, "127.0.0.1:8081".parse().unwrap());
    runtime().block_on(answers_and_follows_the_folder(&server, &dir));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
