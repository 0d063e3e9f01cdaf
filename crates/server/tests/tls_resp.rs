//! The Redis-protocol door over TLS with real clients and real loads: `redis-cli --tls` and
//! redis-py with a client certificate (and refused without one), a pipelined batch far larger
//! than the sockets hold, and a connection that went quiet and comes back. (The door's place
//! among every TLS listener, rotation and plaintext refusal: `tls.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod tls_common;

use std::path::Path;

use common::{Running, start};
use tls_common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The decision API and the Redis door over TLS with `dir/server.pem` and `dir/server.key`,
/// and `dir/ca.pem` as the client CA when `mtls`; the policy `api`, 1,000 an hour by address.
async fn start_tls(dir: &Path, mtls: bool) -> Running {
    let tls = tls_fields(dir, mtls);
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n\
         header_read_timeout = \"1s\"\n{tls}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nwindow = \"1h\"\nkey = [\"ip\"]\n"
    );
    start(tollgate_server::Config::parse("tls.toml", &text).unwrap()).await
}

/// A Python that imports `redis`: `$TOLLGATE_RESP_PYTHON` (set by `scripts/test.sh`), else the
/// venv that script makes.
fn redis_py() -> std::path::PathBuf {
    let made = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|t| t.join("resp-pyvenv/bin/python"));
    std::env::var_os("TOLLGATE_RESP_PYTHON")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain(made)
        .find(|p| {
            std::process::Command::new(p)
                .args(["-c", "import redis"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("a Python with the redis package: run scripts/test.sh, which installs it")
}

/// `command`'s output, run off the test's runtime, which serves the door meanwhile.
async fn run_blocking(mut command: std::process::Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e} (redis-cli: Debian's redis-tools)"))
}

/// What redis-cli prints for `args` sent to `port` over TLS with `tls_args`, and whether it
/// succeeded.
async fn redis_cli(port: u16, tls_args: &[String], args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new("redis-cli");
    command
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--tls"])
        .args(tls_args)
        .args(args);
    let out = run_blocking(command).await;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && !text.contains("rror"), text)
}

#[tokio::test]
async fn real_redis_clients_check_over_tls_with_a_client_certificate() {
    let dir = temp_dir("resp-clients");
    let ca = Ca::new("server CA");
    install(&dir, &ca.server("tollgate"));
    let clients = Ca::new("client CA");
    std::fs::write(dir.join("ca.pem"), clients.pem()).unwrap();
    std::fs::write(dir.join("server-ca.pem"), ca.pem()).unwrap();
    let good = clients.client("good client");
    std::fs::write(dir.join("client.pem"), &good.cert).unwrap();
    std::fs::write(dir.join("client.key"), &good.key).unwrap();
    let s = start_tls(&dir, true).await;
    let port = s.resp.unwrap().port();
    let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let trust = vec!["--cacert".to_owned(), path("server-ca.pem")];
    let with_cert = [
        trust.clone(),
        vec![
            "--cert".to_owned(),
            path("client.pem"),
            "--key".to_owned(),
            path("client.key"),
        ],
    ]
    .concat();

    // redis-cli, with the client certificate: a decision, then redis-cell's answer.
    let (ok, out) = redis_cli(port, &with_cert, &["TOLLGATE.CHECK", "api", "cli"]).await;
    assert!(ok, "{out}");
    assert_eq!(
        out.lines().take(3).collect::<Vec<_>>(),
        ["1", "1000", "999"]
    );
    let (ok, out) = redis_cli(port, &with_cert, &["CL.THROTTLE", "cell", "15", "30", "60"]).await;
    assert!(ok, "{out}");
    assert_eq!(out.lines().take(3).collect::<Vec<_>>(), ["0", "16", "15"]);
    // Without one, the handshake is refused and nothing is decided.
    let (ok, out) = redis_cli(port, &trust, &["TOLLGATE.CHECK", "api", "cli"]).await;
    assert!(!ok, "{out}");

    // redis-py over TLS, RESP2 and RESP3, with and without the client certificate.
    let script = r#"
import sys, redis
port, ca, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
for proto in (2, 3):
    r = redis.Redis(host="127.0.0.1", port=port, protocol=proto, ssl=True,
                    ssl_ca_certs=ca, ssl_certfile=cert, ssl_keyfile=key)
    assert r.ping() is True
    got = r.execute_command("TOLLGATE.CHECK", "api", "py")
    print(proto, got)
try:
    redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=ca).ping()
    print("no certificate: admitted")
except redis.exceptions.ConnectionError:
    print("no certificate: refused")
"#;
    let mut command = std::process::Command::new(redis_py());
    command.args(["-c", script, &port.to_string()]).args([
        path("server-ca.pem"),
        path("client.pem"),
        path("client.key"),
    ]);
    let out = run_blocking(command).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    // [allowed, limit, remaining, reset (the hour's window: any second), retry_after].
    assert!(
        lines[0].starts_with("2 [1, 1000, 999, ") && lines[0].ends_with(", -1]"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("3 {") && lines[1].contains("'remaining': 998"),
        "{text}"
    );
    assert_eq!(lines[2], "no certificate: refused", "{text}");
    s.stop().await;
}

/// A server with its decision API and Redis door over TLS (no client CA), its certificate
/// from the CA returned.
async fn serving(name: &str) -> (Running, Ca) {
    let dir = temp_dir(name);
    let ca = Ca::new("server CA");
    install(&dir, &ca.server("tollgate"));
    (start_tls(&dir, false).await, ca)
}

#[tokio::test]
async fn a_large_pipelined_batch_is_answered_whole_over_tls() {
    let (s, ca) = serving("resp-batch").await;
    // A small receive buffer (which also stops the kernel growing it), so the server's socket
    // fills up.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 * 1024).unwrap();
    let tcp = socket.connect(s.resp.unwrap()).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(client_config(&ca, None, NO_ALPN))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (mut read, mut write) = tokio::io::split(tls);
    // 400 replies of 32 KiB through a small receive buffer: the server's writes block and
    // resume many times over, and every reply arrives whole and in order.
    let payload = "x".repeat(32 * 1024);
    let command = format!("*2\r\n$4\r\nECHO\r\n${}\r\n{payload}\r\n", payload.len());
    let reply = format!("${}\r\n{payload}\r\n", payload.len());
    let count = 400;
    let writer = tokio::spawn(async move {
        for _ in 0..count {
            write.write_all(command.as_bytes()).await.unwrap();
        }
        // TLS may still hold the last records: without a flush they might never leave.
        write.flush().await.unwrap();
        write
    });
    let mut got = vec![0u8; reply.len() * count];
    tokio::time::timeout(NO_HANG, read.read_exact(&mut got))
        .await
        .expect("every reply, not a hang")
        .unwrap();
    assert!(got.chunks(reply.len()).all(|c| c == reply.as_bytes()));
    drop(writer.await.unwrap());
    s.stop().await;
}

#[tokio::test]
async fn a_quiet_tls_connection_gives_its_buffers_back_and_goes_on() {
    let (s, ca) = serving("resp-quiet").await;
    let mut tls = connect(s.resp.unwrap(), client_config(&ca, None, NO_ALPN))
        .await
        .unwrap();
    let mut pong = [0u8; 7];
    for round in 0..2 {
        tls.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
        tls.flush().await.unwrap();
        tokio::time::timeout(NO_HANG, tls.read_exact(&mut pong))
            .await
            .expect("a reply")
            .unwrap();
        assert_eq!(&pong, b"+PONG\r\n", "round {round}");
        // Past the second after which a quiet connection drops its buffers and waits with
        // none: its next command wakes it.
        tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    }
    s.stop().await;
}
