//! The container image, built by `scripts/image.sh` (FROM scratch, nothing pulled) and run under
//! podman as a user runs it: read-only root filesystem, ports published on free loopback ports.
//! It is at most 30 MB; it runs as its non-root user, the binary as PID 1; it serves its own
//! default configuration (listening on 0.0.0.0, so reachable through the published ports);
//! it reloads a mounted configuration when the file changes; it serves Envoy's rate limit
//! service from the Kubernetes Envoy example's ConfigMaps; two containers on the Redis example's
//! configuration share one count; and `podman stop` drains it and it exits 0.
//!
//! The image holds the release build: it is the image users get, and only it fits the size
//! bound with room to spare (measured: 20.0 MB; the dev build makes a 42 MB image, and still
//! 29.9 MB with its symbols stripped too). `scripts/test.sh` builds it before the tests (about
//! 4 minutes on CI's 2 cores, while nothing else runs); run alone, the first test builds it
//! (`cargo build --release`, a no-op when it is up to date).
//!
//! Needs podman (`scripts/test.sh` installs it and configures it for this machine), the
//! `kubernetes-validate` venv (for PyYAML) and `redis-server`. Every container and image is
//! removed when its test ends, failed or not.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(target_os = "linux")]

mod deploy_support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use deploy_support::*;
use tollgate_envoy::RlsClient;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_testkit::redis::RedisProcess;

/// The size bound of the image, in bytes (uncompressed, as `podman image inspect` counts it).
const MAX_IMAGE_BYTES: u64 = 30_000_000;
/// The user the image runs as (Containerfile: `USER 10001:10001`).
const IMAGE_USER: &str = "10001";
/// How long `podman stop` waits before it kills: the server drains for up to 30 s, so this
/// is the recommended `--stop-timeout` (docs/deploy.md). An exit code of 0 means it left by
/// itself, drained, before that.
const STOP_SECONDS: u64 = 40;
/// Generous bound for a container to start serving on a loaded machine.
const START: Duration = Duration::from_secs(60);

/// `RateLimitResponse.Code`.
const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;

fn podman_output(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run podman ({e}): scripts/test.sh installs it"))
}

/// `podman ARGS`, which must succeed; its standard output.
fn podman(args: &[&str]) -> String {
    let out = podman_output(args);
    assert!(
        out.status.success(),
        "podman {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A name of this test process's own, for containers and images.
fn unique(what: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "tollgate-test-{}-{what}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// An image built by scripts/image.sh, removed when dropped.
struct Image {
    tag: String,
}

impl Image {
    fn build(what: &str) -> Image {
        let tag = format!("localhost/{}:test", unique(what));
        let image = Image { tag };
        let out = Command::new(repo_root().join("scripts/image.sh"))
            .args(["--tag", &image.tag])
            .env("CARGO_TARGET_DIR", target_dir())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/image.sh failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        image
    }

    fn inspect(&self, format: &str) -> String {
        podman(&["image", "inspect", "--format", format, &self.tag])
            .trim()
            .to_owned()
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        quietly(&["rmi", "--force", &self.tag]);
    }
}

/// `podman ARGS` for cleaning up: never panics (a drop may run while a test panics).
fn quietly(args: &[&str]) {
    let _ = Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A container, force-removed when dropped.
struct Container {
    name: String,
}

impl Container {
    /// `podman run --detach --read-only` with `options`, the image, then `args`. `ports` are
    /// the container ports to publish on free loopback ports; returns them with their
    /// addresses, in order. A port taken between choosing and binding it is chosen again.
    fn run(
        image: &Image,
        options: &[String],
        ports: &[u16],
        args: &[&str],
    ) -> (Container, Vec<SocketAddr>) {
        for _attempt in 0..5 {
            let name = unique("run");
            let addrs: Vec<SocketAddr> = ports
                .iter()
                .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
                .collect();
            let mut cmd: Vec<String> = [
                "run",
                "--detach",
                "--read-only",
                "--name",
                &name,
                "--stop-timeout",
                &STOP_SECONDS.to_string(),
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
            for (addr, port) in addrs.iter().zip(ports) {
                cmd.push("--publish".to_owned());
                cmd.push(format!("{addr}:{port}"));
            }
            cmd.extend(options.iter().cloned());
            cmd.push(image.tag.clone());
            cmd.extend(args.iter().map(|s| (*s).to_owned()));
            let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let out = podman_output(&refs);
            let container = Container { name };
            if out.status.success() {
                return (container, addrs);
            }
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("address already in use"),
                "podman {cmd:?}: {err}"
            );
        }
        panic!("no free ports after 5 attempts");
    }

    fn inspect(&self, format: &str) -> String {
        podman(&["inspect", "--format", format, &self.name])
            .trim()
            .to_owned()
    }

    fn logs(&self) -> String {
        let out = podman_output(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Polls `GET path` on `addr` until it answers 200, failing early if the container ends.
    fn wait_for(&self, addr: SocketAddr, path: &str) {
        let deadline = Instant::now() + START;
        loop {
            if let Ok(reply) = try_http(addr, "GET", path, "")
                && reply.status == 200
            {
                return;
            }
            if self.inspect("{{.State.Running}}") != "true" {
                panic!("the container stopped:\n{}", self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "{path} on {addr} never answered 200:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `podman stop` (SIGTERM, then SIGKILL after STOP_SECONDS); the exit code.
    fn stop(&self) -> i64 {
        stop(&self.name)
    }
}

/// `podman stop` of a container by name; its exit code.
fn stop(name: &str) -> i64 {
    podman(&["stop", "--time", &STOP_SECONDS.to_string(), name]);
    podman(&["inspect", "--format", "{{.State.ExitCode}}", name])
        .trim()
        .parse()
        .unwrap()
}

impl Drop for Container {
    fn drop(&mut self) {
        quietly(&["rm", "--force", "--time", "0", &self.name]);
    }
}

struct Reply {
    status: u16,
    /// The head, lowercased.
    head: String,
    body: String,
}

fn try_http(addr: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP answer: {text:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status: {head:?}")))?;
    Ok(Reply {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    })
}

fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Reply {
    try_http(addr, method, path, body).unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"))
}

fn check(addr: SocketAddr, policy: &str, key: &str) -> Reply {
    http(
        addr,
        "POST",
        "/v1/check",
        &format!(r#"{{"policy":"{policy}","key":"{key}","cost":1}}"#),
    )
}

/// A JSON number field of an answer body.
fn field(reply: &Reply, name: &str) -> i64 {
    let v: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    v[name]
        .as_i64()
        .unwrap_or_else(|| panic!("no {name} in {}", reply.body))
}

#[test]
fn the_image_is_small_runs_as_non_root_serves_its_default_and_stops_cleanly() {
    let image = Image::build("default");
    let size: u64 = image.inspect("{{.Size}}").parse().unwrap();
    assert!(
        size <= MAX_IMAGE_BYTES,
        "the image is {size} bytes, over {MAX_IMAGE_BYTES}"
    );
    assert_eq!(
        image.inspect("{{.Config.User}}"),
        format!("{IMAGE_USER}:{IMAGE_USER}")
    );
    assert_eq!(
        image.inspect("{{.Config.Entrypoint}}"),
        "[/usr/bin/tollgate]"
    );
    // One layer: the files of scripts/image.sh, nothing from a base image.
    assert_eq!(image.inspect("{{len .RootFS.Layers}}"), "1");

    // Its own configuration checks out, run by the entrypoint.
    let validate = podman(&[
        "run",
        "--rm",
        "--read-only",
        &image.tag,
        "validate",
        "/etc/tollgate/tollgate.toml",
    ]);
    assert!(
        validate.starts_with("default: sliding_window_counter limit=100"),
        "{validate}"
    );

    // With no arguments: `serve --config /etc/tollgate/tollgate.toml`, on 0.0.0.0.
    let (container, addrs) = Container::run(&image, &[], &[8080, 9090], &[]);
    let (api, admin) = (addrs[0], addrs[1]);
    container.wait_for(admin, "/healthz");
    let reply = check(api, "default", "customer-42");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        reply.head.contains("x-ratelimit-limit: 100"),
        "{}",
        reply.head
    );
    assert_eq!(field(&reply, "remaining"), 99);

    // Not root, and the binary is PID 1 (no init: it handles SIGTERM itself).
    let top = podman(&["top", &container.name, "pid", "user", "huser", "args"]);
    let row = top
        .lines()
        .find(|l| l.contains("/usr/bin/tollgate"))
        .unwrap_or_else(|| panic!("podman top:\n{top}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    // `user` is the name in the image's /etc/passwd, `huser` the uid on the host.
    assert_eq!(
        &cols[..3],
        ["1", "tollgate", IMAGE_USER],
        "podman top:\n{top}"
    );
    assert_eq!(container.inspect("{{.HostConfig.ReadonlyRootfs}}"), "true");

    // An idle keep-alive client does not hold the drain up.
    let mut idle = TcpStream::connect(api).unwrap();
    write!(idle, "GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 404");

    let code = container.stop();
    let logs = container.logs();
    assert_eq!(code, 0, "podman stop: exit code {code}\n{logs}");
    assert!(logs.contains("draining"), "{logs}");
}

#[test]
fn the_image_reloads_a_mounted_configuration_file() {
    let image = Image::build("reload");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let original =
        std::fs::read_to_string(repo_root().join("deploy/container/tollgate.toml")).unwrap();
    std::fs::write(&file, &original).unwrap();
    set_mode(&file, 0o644);
    let mount = format!("{}:/etc/tollgate/tollgate.toml:ro", file.display());
    let (container, addrs) = Container::run(
        &image,
        &["--volume".to_owned(), mount],
        &[8080, 9090],
        &["serve", "--config", "/etc/tollgate/tollgate.toml"],
    );
    let (api, admin) = (addrs[0], addrs[1]);
    container.wait_for(admin, "/healthz");
    assert_eq!(check(api, "partner", "p1").status, 404);

    // Written in place (same inode), as a file bind mount needs: a new policy.
    let edited = format!(
        "{original}\n[[policy]]\nname = \"partner\"\nlimit = 7\nwindow = \"1m\"\nkey = [\"header:x-api-key\"]\n"
    );
    std::fs::write(&file, edited).unwrap();
    let deadline = Instant::now() + START;
    let reply = loop {
        let reply = check(api, "partner", "p1");
        if reply.status == 200 {
            break reply;
        }
        assert_eq!(reply.status, 404, "{}", reply.body);
        assert!(
            Instant::now() < deadline,
            "the edit was not picked up:\n{}",
            container.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        reply.head.contains("x-ratelimit-limit: 7"),
        "{}",
        reply.head
    );
    assert!(container.logs().contains("configuration reloaded"));
    assert_eq!(container.stop(), 0, "{}", container.logs());
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `--volume` options that mount the example's ConfigMaps where its Deployment does.
fn volumes(ex: &Example) -> Vec<String> {
    ex.mounts
        .iter()
        .flat_map(|(dir, at)| ["--volume".to_owned(), format!("{}:{at}:ro", dir.display())])
        .collect()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
    }
}

fn rls_request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

#[test]
fn the_image_serves_envoy_from_the_kubernetes_example() {
    let image = Image::build("envoy");
    let ex = Example::load("envoy");
    let args: Vec<&str> = ex.args.iter().map(String::as_str).collect();
    let (container, addrs) = Container::run(
        &image,
        &volumes(&ex),
        &[ex.port("grpc"), ex.port("admin")],
        &args,
    );
    let (grpc, admin) = (addrs[0], addrs[1]);
    container.wait_for(admin, "/readyz");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = RlsClient::connect(format!("http://{grpc}")).await.unwrap();
        let call = |request: RateLimitRequest| {
            let mut client = client.clone();
            async move { client.should_rate_limit(request).await.unwrap() }
        };
        // What envoy.yaml's rate_limits send for a request with an API key.
        let r = call(rls_request(vec![
            descriptor(&[("remote_address", "203.0.113.9")]),
            descriptor(&[("api_key", "k1")]),
            descriptor(&[("generic_key", "api"), ("api_key", "k1")]),
        ]))
        .await;
        assert_eq!(r.overall_code, OK);
        let limits: Vec<u32> = r
            .statuses
            .iter()
            .map(|s| s.current_limit.as_ref().unwrap().requests_per_unit)
            .collect();
        assert_eq!(limits, [20, 100, 10_000]);
        // The smoke-test key is never limited.
        let r = call(rls_request(vec![descriptor(&[(
            "api_key",
            "ci-smoke-test",
        )])]))
        .await;
        assert_eq!(r.overall_code, OK);
        assert!(r.statuses[0].current_limit.is_none());
        // 100 a minute for one key: 99 more pass, then it is over the limit.
        for n in 2..=100 {
            let r = call(rls_request(vec![descriptor(&[("api_key", "k1")])])).await;
            assert_eq!(r.overall_code, OK, "call {n}");
        }
        let r = call(rls_request(vec![descriptor(&[("api_key", "k1")])])).await;
        assert_eq!(r.overall_code, OVER_LIMIT);

        // Stopped while the client still holds its HTTP/2 connection, as Envoy does: the
        // server sends GOAWAY, the client (driven by this runtime meanwhile) closes, and the
        // server exits 0.
        let name = container.name.clone();
        let code = tokio::task::spawn_blocking(move || stop(&name))
            .await
            .unwrap();
        assert_eq!(code, 0, "{}", container.logs());
        drop(client);
    });
}

/// Two containers on the Redis example's configuration: the host's network (the test's own
/// redis-server on loopback, reached under the example's host name through /etc/hosts), each
/// container's listeners moved to free loopback ports.
#[test]
fn two_containers_on_the_redis_example_share_one_count() {
    let image = Image::build("redis");
    let redis = RedisProcess::start(&[]);
    let ex = Example::load("redis");
    let text = std::fs::read_to_string(ex.config()).unwrap();
    for needle in [
        "0.0.0.0:8080",
        "0.0.0.0:9090",
        "redis://tollgate-redis:6379",
    ] {
        assert!(text.contains(needle), "the example no longer has {needle}");
    }
    let env: Vec<String> = ex
        .env
        .iter()
        .flat_map(|(k, v)| ["--env".to_owned(), format!("{k}={v}")])
        .collect();
    let args: Vec<&str> = ex.args.iter().map(String::as_str).collect();
    let mut containers = Vec::new();
    for _ in 0..2 {
        let (api, admin) = (free_port(), free_port());
        let config = text
            .replace("0.0.0.0:8080", &format!("127.0.0.1:{api}"))
            .replace("0.0.0.0:9090", &format!("127.0.0.1:{admin}"))
            .replace(":6379", &format!(":{}", redis.port()));
        let dir = tempfile::tempdir().unwrap();
        set_mode(dir.path(), 0o755);
        let file = dir.path().join("tollgate.toml");
        std::fs::write(&file, config).unwrap();
        set_mode(&file, 0o644);
        let mut options = vec![
            "--network=host".to_owned(),
            "--add-host=tollgate-redis:127.0.0.1".to_owned(),
            "--volume".to_owned(),
            format!("{}:/etc/tollgate:ro", dir.path().display()),
        ];
        options.extend(env.iter().cloned());
        let (container, _) = Container::run(&image, &options, &[], &args);
        let admin = SocketAddr::from(([127, 0, 0, 1], admin));
        // Ready: Redis answers.
        container.wait_for(admin, "/readyz");
        containers.push((container, SocketAddr::from(([127, 0, 0, 1], api)), dir));
    }
    let (a, b) = (containers[0].1, containers[1].1);
    for expected in [99, 98, 97] {
        assert_eq!(field(&check(a, "default", "shared"), "remaining"), expected);
    }
    assert_eq!(field(&check(b, "default", "shared"), "remaining"), 96);
    for (container, _, _) in &containers {
        assert_eq!(container.stop(), 0, "{}", container.logs());
    }
}
