//! Operating the server on Redis: `rediss://` to a TLS-only `redis-server` whose certificate a
//! private CA signed, trusted through `[store] tls_ca`, or through `SSL_CERT_FILE` (the Redis
//! client reads the system's trust store, which that variable replaces). Needs `redis-server` built with TLS (Debian's
//! is).
//!
//! The variable is read from the process's environment, which a test must not change under
//! other threads: the test runs the server in a child process of this test binary (the ignored
//! test `rediss_child`), with the environment it needs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod tls_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use hyper::StatusCode;
use tollgate_testkit::redis::{RedisProcess, plain_args};

/// The child's `rediss://` URL; set only for the child.
const CHILD_URL: &str = "TOLLGATE_TEST_REDISS_URL";
/// Whether the child expects Redis trusted ("1") or not ("0").
const CHILD_TRUSTED: &str = "TOLLGATE_TEST_REDISS_TRUSTED";

/// A TLS-only `redis-server` on a free loopback port, killed when dropped.
struct TlsRedis {
    redis: RedisProcess,
    dir: PathBuf,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        self.redis.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TlsRedis {
    /// Starts one with a certificate for 127.0.0.1 signed by a fresh CA, written as
    /// `dir/ca.pem`.
    fn start(dir: &Path) -> TlsRedis {
        let ca = tls_common::Ca::new("tollgate-redis-test-ca");
        let leaf = ca.server("redis");
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.join("redis.pem"), &leaf.cert).unwrap();
        std::fs::write(dir.join("redis.key"), &leaf.key).unwrap();
        let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
        let redis = RedisProcess::start_with(|port| {
            let mut args = plain_args(0);
            args.extend(
                [
                    "--tls-port",
                    &port.to_string(),
                    "--tls-cert-file",
                    &path("redis.pem"),
                    "--tls-key-file",
                    &path("redis.key"),
                    "--tls-ca-cert-file",
                    &path("ca.pem"),
                    "--tls-auth-clients",
                    "no",
                    "--dir",
                    &path(""),
                ]
                .map(str::to_owned),
            );
            args
        })
        .unwrap_or_else(|why| {
            panic!("the TLS redis-server did not start (it must be built with TLS, as Debian's is): {why}")
        });
        TlsRedis {
            redis,
            dir: dir.to_owned(),
        }
    }

    fn port(&self) -> u16 {
        self.redis.port()
    }
}

/// Runs `rediss_child` in a child process with `env`; its output, and whether it passed.
fn run_child(url: &str, ca: Option<&Path>) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["rediss_child", "--exact", "--ignored", "--nocapture"])
        .env(CHILD_URL, url)
        .env(CHILD_TRUSTED, if ca.is_some() { "1" } else { "0" })
        .env_remove("SSL_CERT_DIR");
    match ca {
        Some(ca) => cmd.env("SSL_CERT_FILE", ca),
        None => cmd.env_remove("SSL_CERT_FILE"),
    };
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The child must have run the test, not filtered it out.
    let ran = text.contains("running 1 test");
    assert!(ran, "the child did not run rediss_child:\n{text}");
    (out.status.success(), text)
}

/// The server decides through `rediss://`: with the CA in `SSL_CERT_FILE` it is ready and its
/// decisions come from Redis (counted there); without it, the certificate is not trusted and
/// `/readyz` says the store is unreachable.
#[test]
fn rediss_through_the_server() {
    let dir = tls_common::temp_dir("redis-ops");
    let redis = TlsRedis::start(&dir);
    let url = format!("rediss://127.0.0.1:{}", redis.port());
    let (ok, text) = run_child(&url, Some(&dir.join("ca.pem")));
    assert!(ok, "rediss:// with the CA trusted:\n{text}");
    // The decisions were counted in that Redis, over TLS.
    let ca = dir.join("ca.pem");
    let keys = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &redis.port().to_string()])
        .args(["--tls", "--cacert", ca.to_str().unwrap(), "DBSIZE"])
        .output()
        .unwrap();
    let keys = String::from_utf8_lossy(&keys.stdout).trim().to_owned();
    assert_eq!(keys, "1", "the policy's one key in Redis");
    let (ok, text) = run_child(&url, None);
    assert!(ok, "rediss:// with the CA not trusted:\n{text}");
    drop(redis);
}

/// The child's half of [`rediss_through_the_server`]: the server on `rediss://`.
#[tokio::test]
#[ignore = "run by rediss_through_the_server in a child process with SSL_CERT_FILE set"]
async fn rediss_child() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        eprintln!("nothing to do: rediss_through_the_server runs this with its environment");
        return;
    };
    let trusted = std::env::var(CHILD_TRUSTED).as_deref() == Ok("1");
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout = \"2s\"\non_error = \"deny\"\n\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1m\"\n\
         key = [\"header:x-api-key\"]\n"
    );
    let config = tollgate_server::Config::parse("test.toml", &with_ports(&text))
        .unwrap_or_else(|e| panic!("a rediss:// store is a valid configuration: {e}"));
    let server = start(config).await;
    let ready = get(&server.admin_url("/readyz"), &[]).await;
    let req = r#"{"policy":"api","key":"tls-key","cost":1}"#;
    if trusted {
        assert_eq!(
            ready.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&ready.body)
        );
        let mut seen = Vec::new();
        for _ in 0..3 {
            let r = post_json(&server.url("/v1/check"), req).await;
            seen.push((
                r.status,
                r.json()["remaining"].clone(),
                r.json()["fail_open"].clone(),
            ));
        }
        assert_eq!(
            seen,
            [
                (StatusCode::OK, 1.into(), false.into()),
                (StatusCode::OK, 0.into(), false.into()),
                (StatusCode::TOO_MANY_REQUESTS, 0.into(), false.into()),
            ]
        );
    } else {
        let body = String::from_utf8_lossy(&ready.body).into_owned();
        assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("store unreachable"), "{body}");
        // on_error = "deny": no decision without Redis.
        let r = post_json(&server.url("/v1/check"), req).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    server.stop().await;
}

/// The store's config text for `url`, with `tls_ca` when given.
fn store_config(url: &str, tls_ca: Option<&Path>) -> String {
    let ca = tls_ca.map_or(String::new(), |p| format!("tls_ca = {:?}\n", p));
    format!(
        "[store]\nkind = \"redis\"\nurl = \"{url}\"\n{ca}timeout = \"2s\"\non_error = \"deny\"\n\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1m\"\n\
         key = [\"header:x-api-key\"]\n"
    )
}

/// `[store] tls_ca` trusts a private CA for Redis alone, with no environment: the server is
/// ready and decides through Redis; with another CA there, Redis's certificate is refused.
#[tokio::test]
async fn rediss_with_tls_ca() {
    let dir = tls_common::temp_dir("redis-tls-ca");
    let redis = TlsRedis::start(&dir);
    let url = format!("rediss://127.0.0.1:{}", redis.port());
    let text = store_config(&url, Some(&dir.join("ca.pem")));
    let config = tollgate_server::Config::parse("test.toml", &with_ports(&text)).unwrap();
    let server = start(config).await;
    let ready = get(&server.admin_url("/readyz"), &[]).await;
    assert_eq!(ready.status, StatusCode::OK, "{ready:?}");
    let req = r#"{"policy":"api","key":"tls-ca-key"}"#;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(post_json(&server.url("/v1/check"), req).await.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    server.stop().await;
    // Another CA: the server's certificate is not trusted, whatever the system trusts.
    let other = tls_common::Ca::new("another CA");
    std::fs::write(dir.join("other.pem"), other.pem()).unwrap();
    let text = store_config(&url, Some(&dir.join("other.pem")));
    let config = tollgate_server::Config::parse("test.toml", &with_ports(&text)).unwrap();
    let server = start(config).await;
    let ready = get(&server.admin_url("/readyz"), &[]).await;
    let said = String::from_utf8_lossy(&ready.body).into_owned();
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "{said}");
    assert!(said.contains("store unreachable"), "{said}");
    server.stop().await;
    drop(redis);
}

/// `tls_ca` is refused where it means nothing, and a file that holds no certificate is named.
#[test]
fn tls_ca_is_checked_where_it_is_written() {
    let dir = tls_common::temp_dir("redis-tls-ca-bad");
    std::fs::write(dir.join("junk.pem"), "not a certificate\n").unwrap();
    let errors = |text: &str| match tollgate_server::Config::parse("t.toml", text) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    let plain = store_config("redis://127.0.0.1:6379", Some(&dir.join("junk.pem")));
    let e = errors(&plain);
    assert!(
        e.contains("t.toml:4:") && e.contains("needs kind = \"redis\" and rediss:// URLs"),
        "{e}"
    );
    let junk = store_config("rediss://127.0.0.1:6380", Some(&dir.join("junk.pem")));
    let e = errors(&junk);
    assert!(
        e.contains("t.toml:4:") && e.contains("no certificate in it"),
        "{e}"
    );
    let gone = store_config("rediss://127.0.0.1:6380", Some(&dir.join("gone.pem")));
    let e = errors(&gone);
    assert!(e.contains("tls_ca") && e.contains("cannot read"), "{e}");
}
