//! `rediss://` end to end (feature `tls`): a TLS-only redis-server with a certificate from a CA
//! made for the test, trusted through `tls_root_cert_pem`.

#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::RedisServer;
use tollgate::testing::{T0, unique};
use tollgate::{Check, Policy, Quota, Store};
use tollgate_redis::{ClockSource, RedisConfig, RedisStore};

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "openssl {args:?} failed (is openssl installed?)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca() {
    let dir = std::env::temp_dir().join(unique("tollgate-redis-tls"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    let subj_ca = "/CN=tollgate-test-ca";
    openssl(
        &dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", subj_ca,
        ],
    );
    openssl(
        &dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
    let server = RedisServer::start_tls(
        &dir.join("ca.crt"),
        &dir.join("server.crt"),
        &dir.join("server.key"),
    );
    let url = format!("rediss://127.0.0.1:{}", server.port);

    let mut config = RedisConfig::standalone(&url);
    config.clock = ClockSource::Local;
    config.timeout = Duration::from_secs(2);
    config.tls_root_cert_pem = Some(std::fs::read(dir.join("ca.crt")).unwrap());
    let store = RedisStore::new(config).await.unwrap();
    assert!(store.is_ready(), "TLS handshake with the private CA");
    let policy = Policy::new(
        &unique("tls"),
        Quota::fixed_window(2, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let check = [Check::new(&policy, b"k", 1)];
    assert!(store.apply(T0, &check).await.unwrap().allowed());
    assert!(store.apply(T0, &check).await.unwrap().allowed());
    assert!(!store.apply(T0, &check).await.unwrap().allowed());

    // Without the CA the server's certificate is not trusted: not ready, and it says so.
    let mut untrusted = RedisConfig::standalone(&url);
    untrusted.timeout = Duration::from_millis(500);
    let store = RedisStore::new(untrusted).await.unwrap();
    assert!(!store.is_ready());
    assert!(store.ping().await.is_err());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
