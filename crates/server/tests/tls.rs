//! TLS on every listener a client connects to: the decision API, the admin listener, the
//! proxy, Envoy's gRPC rate limit service and the Redis-protocol door, over real sockets with
//! certificates made here (the proxy's bodies and slots over TLS: `tls_proxy.rs`; the Redis
//! door's real clients and batches over TLS: `tls_resp.rs`).
//! Each answers over TLS and refuses plaintext (and a client that never says a word); with
//! `client_ca`, only certificates of that CA get in. Certificates and the client CA are
//! rotated by replacing the files, without a restart; a bad new set is refused and the
//! running one kept.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod tls_common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use common::log::with_log;
use common::{Running, start, wait_for};
use tls_common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitRequest;

const HTTP1: &[&[u8]] = &[b"http/1.1"];
const H2: &[&[u8]] = &[b"h2"];
const BOTH: &[&[u8]] = &[b"h2", b"http/1.1"];

/// The listeners a client connects to.
#[derive(Clone, Copy, Debug)]
enum Door {
    Api,
    Admin,
    Proxy,
    Grpc,
    Resp,
}

const DOORS: [Door; 5] = [Door::Api, Door::Admin, Door::Proxy, Door::Grpc, Door::Resp];

impl Door {
    fn addr(self, s: &Running) -> SocketAddr {
        match self {
            Door::Api => s.api,
            Door::Admin => s.admin,
            Door::Proxy => s.proxy.unwrap(),
            Door::Grpc => s.grpc.unwrap(),
            Door::Resp => s.resp.unwrap(),
        }
    }

    fn alpn(self) -> &'static [&'static [u8]] {
        match self {
            Door::Grpc => H2,
            Door::Resp => NO_ALPN,
            _ => HTTP1,
        }
    }

    /// One real call through the door on a new connection: a decision, a health check, a
    /// proxied request, a `ShouldRateLimit`. `Err` says why it failed.
    async fn call(self, s: &Running, config: Arc<rustls::ClientConfig>) -> Result<(), String> {
        let addr = self.addr(s);
        let (status, body) = match self {
            Door::Api => {
                https(
                    addr,
                    config,
                    "POST",
                    "/v1/check",
                    r#"{"policy":"api","key":"k"}"#,
                )
                .await?
            }
            Door::Admin => https(addr, config, "GET", "/healthz", "").await?,
            Door::Proxy => https(addr, config, "GET", "/through", "").await?,
            Door::Grpc => {
                let mut client = grpc_client(addr, config).await?;
                let call = client.should_rate_limit(rls_request());
                let r = tokio::time::timeout(NO_HANG, call)
                    .await
                    .expect("an answer or an error, not a hang")
                    .map_err(|e| format!("call: {e}"))?;
                assert_eq!(r.overall_code, 1, "{r:?}");
                return Ok(());
            }
            Door::Resp => {
                let reply = resp_command(addr, config, &["TOLLGATE.CHECK", "api", "k"]).await?;
                assert!(reply.starts_with("*5\r\n:1\r\n:1000\r\n"), "{reply:?}");
                return Ok(());
            }
        };
        assert_eq!(status, 200, "{self:?}: {body}");
        if let Door::Api = self {
            assert!(body.contains("\"allowed\":true"), "{body}");
        }
        Ok(())
    }
}

fn rls_request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".to_owned(),
                value: "k".to_owned(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
}

/// Every listener over TLS with `dir/server.pem` and `dir/server.key`, and `dir/ca.pem` as the
/// client CA when `mtls`; a one-second header read timeout.
async fn config_text(dir: &Path, mtls: bool) -> String {
    let upstream = common::upstream().await;
    std::fs::create_dir_all(dir.join("ratelimit")).unwrap();
    std::fs::write(
        dir.join("ratelimit/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000\n",
    )
    .unwrap();
    let tls = tls_fields(dir, mtls);
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n\
         header_read_timeout = \"1s\"\n{tls}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n{tls}\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\n{tls}\n\
         [envoy]\nconfig_dir = {:?}\n\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nwindow = \"1h\"\nkey = [\"ip\"]\n",
        dir.join("ratelimit")
    )
}

async fn start_tls(dir: &Path, mtls: bool) -> Running {
    let text = config_text(dir, mtls).await;
    start(tollgate_server::Config::parse("tls.toml", &text).unwrap()).await
}

/// Bytes written in plaintext, and everything the server answers before it closes.
async fn plaintext(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(NO_HANG, tcp.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the connection is closed, not left hanging");
    answer
}

#[tokio::test]
async fn every_listener_serves_tls_and_refuses_plaintext() {
    let dir = temp_dir("serve");
    let ca = Ca::new("server CA");
    install(&dir, &ca.server("tollgate"));
    let s = start_tls(&dir, false).await;
    for door in DOORS {
        door.call(&s, client_config(&ca, None, door.alpn()))
            .await
            .unwrap_or_else(|e| panic!("{door:?}: {e}"));
        // A client that connects and never starts a handshake is cut off by the header read
        // timeout.
        assert!(plaintext(door.addr(&s), b"").await.is_empty(), "{door:?}");
    }
    // Plaintext HTTP is told to use HTTPS, then closed.
    for door in [Door::Api, Door::Admin, Door::Proxy] {
        let answer = plaintext(
            door.addr(&s),
            b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n",
        )
        .await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{door:?}: {answer}"
        );
        assert!(answer.contains("speaks HTTPS"), "{answer}");
    }
    // A plaintext Redis client is told to use TLS, in a reply it shows, then closed.
    for command in [&b"PING\r\n"[..], b"*1\r\n$4\r\nPING\r\n"] {
        let answer = plaintext(s.resp.unwrap(), command).await;
        assert_eq!(
            String::from_utf8_lossy(&answer),
            "-ERR this port speaks TLS: connect with TLS (redis-cli --tls)\r\n"
        );
    }
    // Plaintext gRPC (HTTP/2 without TLS) is refused.
    let plain = tollgate_envoy::RlsClient::connect(format!("http://{}", s.grpc.unwrap())).await;
    if let Ok(mut client) = plain {
        let call = tokio::time::timeout(NO_HANG, client.should_rate_limit(rls_request()));
        assert!(call.await.expect("no hang").is_err());
    }
    // The decision API and the admin listener speak HTTP/2 too, chosen by ALPN: what a client
    // offering both gets, and the only choice of one offering just h2.
    for alpn in [BOTH, H2] {
        let (chosen, status, body) = https2(
            s.api,
            client_config(&ca, None, alpn),
            "POST",
            "/v1/check",
            r#"{"policy":"api","key":"k2"}"#,
        )
        .await
        .unwrap_or_else(|e| panic!("h2 check: {e}"));
        assert_eq!(chosen.as_deref(), Some(&b"h2"[..]));
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"allowed\":true"), "{body}");
        let (chosen, status, _) = https2(
            s.admin,
            client_config(&ca, None, alpn),
            "GET",
            "/healthz",
            "",
        )
        .await
        .unwrap_or_else(|e| panic!("h2 health: {e}"));
        assert_eq!((chosen.as_deref(), status), (Some(&b"h2"[..]), 200));
    }
    // The proxy speaks HTTP/1.1 to clients: one offering both gets it, one offering only h2 is
    // refused, as is one offering only a protocol no listener speaks.
    let (status, _) = https(
        s.proxy.unwrap(),
        client_config(&ca, None, BOTH),
        "GET",
        "/through",
        "",
    )
    .await
    .unwrap_or_else(|e| panic!("proxy: {e}"));
    assert_eq!(status, 200);
    let h2_only = client_config(&ca, None, H2);
    assert!(
        https(s.proxy.unwrap(), h2_only, "GET", "/through", "")
            .await
            .is_err()
    );
    let spdy = client_config(&ca, None, &[b"spdy/3.1"]);
    assert!(https(s.api, spdy, "GET", "/healthz", "").await.is_err());
    // A client that does not trust the server's CA refuses it.
    let stranger = client_config(&Ca::new("another CA"), None, HTTP1);
    assert!(https(s.api, stranger, "GET", "/healthz", "").await.is_err());
    // After all that, the listeners still serve.
    for door in DOORS {
        door.call(&s, client_config(&ca, None, door.alpn()))
            .await
            .unwrap();
    }
    s.stop().await;
}

#[tokio::test]
async fn mutual_tls_takes_only_certificates_of_the_client_ca() {
    let dir = temp_dir("mtls");
    let ca = Ca::new("server CA");
    install(&dir, &ca.server("tollgate"));
    let clients = Ca::new("client CA");
    std::fs::write(dir.join("ca.pem"), clients.pem()).unwrap();
    let s = start_tls(&dir, true).await;
    let good = clients.client("good client");
    let foreign = Ca::new("foreign CA").client("foreign client");
    // A certificate the server's own CA signed is no client certificate either.
    let wrong_ca = ca.client("server CA's client");
    for door in DOORS {
        door.call(&s, client_config(&ca, Some(&good), door.alpn()))
            .await
            .unwrap_or_else(|e| panic!("{door:?} with a good certificate: {e}"));
        for (what, cert) in [
            ("another CA's", Some(&foreign)),
            ("the server CA's", Some(&wrong_ca)),
            ("no", None),
        ] {
            let refused = door.call(&s, client_config(&ca, cert, door.alpn())).await;
            assert!(refused.is_err(), "{door:?} took {what} certificate");
        }
    }
    s.stop().await;
}

#[test]
fn rotated_certificates_reach_new_connections_and_bad_ones_are_refused() {
    with_log(|log| async move {
        let dir = temp_dir("rotate");
        let ca = Ca::new("server CA");
        let first = ca.server("first");
        install(&dir, &first);
        let s = start_tls(&dir, false).await;
        let http = client_config(&ca, None, HTTP1);
        let h2 = client_config(&ca, None, H2);
        for door in DOORS {
            assert_eq!(
                served_cert(door.addr(&s), client_config(&ca, None, door.alpn())).await,
                first.der
            );
        }
        // A connection made before the rotation carries on (on the proxy, whose connections
        // may idle for longer than the rotation takes).
        let mut before = Https::open(s.proxy.unwrap(), Arc::clone(&http))
            .await
            .unwrap();
        assert_eq!(before.request("GET", "/through", "").await.unwrap().0, 200);

        // A new pair in place of the old: new connections get it, on every listener.
        let second = ca.server("second");
        install(&dir, &second);
        for door in DOORS {
            let config = client_config(&ca, None, door.alpn());
            let addr = door.addr(&s);
            wait_for(|| {
                let config = Arc::clone(&config);
                let want = second.der.clone();
                async move { served_cert(addr, config).await == want }
            })
            .await;
        }
        assert_eq!(before.request("GET", "/through", "").await.unwrap().0, 200);
        for door in DOORS {
            door.call(&s, client_config(&ca, None, door.alpn()))
                .await
                .unwrap();
        }

        // Garbage in place of the certificate: refused, logged, and the running one stays.
        let refused = log.count("TLS files refused");
        std::fs::write(
            dir.join("server.pem"),
            "-----BEGIN CERTIFICATE-----\ngarbage\n",
        )
        .unwrap();
        wait_for(|| async { log.count("TLS files refused") > refused }).await;
        assert_eq!(served_cert(s.api, Arc::clone(&http)).await, second.der);
        assert_eq!(
            served_cert(s.grpc.unwrap(), Arc::clone(&h2)).await,
            second.der
        );

        // A certificate whose key is not the one beside it: refused too.
        let mismatched = log.count("does not match");
        let third = ca.server("third");
        std::fs::write(dir.join("server.pem"), &third.cert).unwrap();
        wait_for(|| async { log.count("does not match") > mismatched }).await;
        assert_eq!(served_cert(s.api, Arc::clone(&http)).await, second.der);

        // Its key arrives: the pair is whole, and served.
        std::fs::write(dir.join("server.key"), &third.key).unwrap();
        let api = s.api;
        wait_for(|| {
            let http = Arc::clone(&http);
            let want = third.der.clone();
            async move { served_cert(api, http).await == want }
        })
        .await;
        assert!(
            log.count("TLS certificate reloaded") >= 4,
            "one per listener at least"
        );
        s.stop().await;
    });
}

#[tokio::test]
async fn a_rotated_client_ca_changes_which_clients_get_in() {
    let dir = temp_dir("rotate-ca");
    let ca = Ca::new("server CA");
    install(&dir, &ca.server("tollgate"));
    let old_ca = Ca::new("old client CA");
    let new_ca = Ca::new("new client CA");
    std::fs::write(dir.join("ca.pem"), old_ca.pem()).unwrap();
    let s = start_tls(&dir, true).await;
    let old_client = old_ca.client("old");
    let new_client = new_ca.client("new");
    for door in DOORS {
        door.call(&s, client_config(&ca, Some(&old_client), door.alpn()))
            .await
            .unwrap();
        assert!(
            door.call(&s, client_config(&ca, Some(&new_client), door.alpn()))
                .await
                .is_err()
        );
    }
    std::fs::write(dir.join("ca.pem"), new_ca.pem()).unwrap();
    let running = &s;
    for door in DOORS {
        let config = client_config(&ca, Some(&new_client), door.alpn());
        wait_for(|| {
            let config = Arc::clone(&config);
            async move { door.call(running, config).await.is_ok() }
        })
        .await;
        assert!(
            door.call(&s, client_config(&ca, Some(&old_client), door.alpn()))
                .await
                .is_err()
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn bad_certificates_fail_the_start_and_a_reload_keeps_the_running_configuration() {
    let dir = temp_dir("reload");
    let ca = Ca::new("server CA");
    install(&dir, &ca.server("tollgate"));
    std::fs::write(dir.join("junk.pem"), "not a certificate\n").unwrap();
    // Valid when read, spoiled before the start: the start fails naming listener and file.
    let text = config_text(&dir, false).await;
    let config = tollgate_server::Config::parse("tls.toml", &text).unwrap();
    std::fs::write(dir.join("server.pem"), "not a certificate\n").unwrap();
    let listeners = tollgate_server::Listeners::bind(&config).await.unwrap();
    let e = tollgate_server::run(config, listeners, async {})
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cannot serve the api listener over TLS: tls_cert: "),
        "{e}"
    );
    assert!(e.contains("server.pem: no certificate in it"), "{e}");

    install(&dir, &ca.server("tollgate"));
    let file = dir.join("tollgate.toml");
    std::fs::write(&file, &text).unwrap();
    let s = start(tollgate_server::Config::load(&file).unwrap()).await;
    let http = client_config(&ca, None, HTTP1);
    let metrics = || async {
        let (_, body) = https(s.admin, Arc::clone(&http), "GET", "/metrics", "")
            .await
            .unwrap();
        body.lines()
            .find(|l| l.starts_with("tollgate_config_reloads_total{result=\"failed\"}"))
            .unwrap_or_default()
            .to_owned()
    };
    let failed = metrics().await;
    // A new limit, and a certificate file that is not one: the whole reload is refused.
    let spoiled = text.replace("limit = 1000\n", "limit = 1\n").replacen(
        &format!("{:?}", dir.join("server.pem")),
        &format!("{:?}", dir.join("junk.pem")),
        1,
    );
    std::fs::write(&file, spoiled).unwrap();
    wait_for(|| async { metrics().await != failed }).await;
    for _ in 0..3 {
        Door::Api.call(&s, Arc::clone(&http)).await.unwrap();
    }
    s.stop().await;
}

/// Every TLS listener exports when its certificate expires, a rotation moves it, and one near
/// its end (or past it) is warned about when loaded: a server never checks its own
/// certificate's dates, and its clients would just fail their handshakes.
#[test]
fn certificate_expiry_is_exported_and_warned_about() {
    with_log(|log| async move {
        let dir = temp_dir("expiry");
        let ca = Ca::new("server CA");
        let soon = time::OffsetDateTime::now_utc() + time::Duration::hours(3 * 24 + 12);
        let soon = soon.replace_nanosecond(0).unwrap();
        install(&dir, &ca.server_until("soon", soon));
        let s = start_tls(&dir, false).await;
        wait_for(|| async { log.count("TLS certificate expires in 3 days") >= 5 }).await;
        let http = client_config(&ca, None, HTTP1);
        let admin = s.admin;
        let metrics = || {
            let http = Arc::clone(&http);
            // Empty while the admin listener serves a certificate the client refuses.
            async move {
                https(admin, http, "GET", "/metrics", "")
                    .await
                    .map_or_else(|_| String::new(), |(_, body)| body)
            }
        };
        let text = metrics().await;
        for listener in ["api", "admin", "proxy", "grpc", "resp"] {
            let line = format!(
                "tollgate_tls_certificate_expiry_timestamp_seconds{{listener=\"{listener}\"}} {}\n",
                soon.unix_timestamp()
            );
            assert!(text.contains(&line), "{line}in\n{text}");
        }
        // Rotated to one that has already expired: warned at load, and an error once the
        // watcher sees it has passed, once per listener.
        let past = time::OffsetDateTime::now_utc() - time::Duration::days(1);
        install(&dir, &ca.server_until("past", past));
        wait_for(|| async { log.count("TLS certificate has expired") >= 5 }).await;
        wait_for(|| async { log.count("TLS certificate expired: clients refuse it") >= 5 }).await;
        // And to a fresh one: the metric follows.
        let later = (time::OffsetDateTime::now_utc() + time::Duration::days(90))
            .replace_nanosecond(0)
            .unwrap();
        install(&dir, &ca.server_until("later", later));
        let want = format!(
            "tollgate_tls_certificate_expiry_timestamp_seconds{{listener=\"api\"}} {}\n",
            later.unix_timestamp()
        );
        wait_for(|| {
            let (metrics, want) = (metrics, want.clone());
            async move { metrics().await.contains(&want) }
        })
        .await;
        assert_eq!(log.count("TLS certificate expired: clients refuse it"), 5);
        s.stop().await;
    });
}
