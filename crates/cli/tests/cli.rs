//! End-to-end runs of the real `tollgate` binary: validate, serve with reload on SIGHUP and exit
//! on SIGTERM, and a Python urllib3 client that honours Retry-After.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

mod closed_stdout_support;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/examples/tollgate.toml")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn validate_prints_the_effective_policies() {
    let out = Command::new(BIN)
        .args(["validate"])
        .arg(example())
        .env("TOLLGATE_JWT_SECRET", "test-secret")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "api: sliding_window_counter limit=100 window=1m key=[header:x-api-key, jwt:sub, ip] match=/v1/** cost=1 action=reject",
            "export: token_bucket capacity=20 refill=1/1s key=[header:x-api-key, ip] match=POST /v1/export/* cost=5 action=reject",
            "webhooks-out: leaky_bucket rate=5/1s queue=50 max_delay=10s key=[header:x-tenant] match=/hooks/** cost=1 action=delay",
            "reports-in-flight: concurrency limit=4 lease_ttl=5m key=[header:x-api-key, ip] match=/v1/reports/** cost=1 action=delay max_delay=30s",
            "login: fixed_window limit=10 window=1m key=[ip] match=POST /login cost=1 action=reject ban for 1h after 5 denials within 10m",
            "list \"partners\": allow, 2 entries",
            "list \"blocked\": deny, 1 entry",
            &format!(
                "envoy domain \"edge\" from {}",
                example().parent().unwrap().join("ratelimit").display()
            ),
        ]
    );
}

#[test]
fn validate_reports_every_error_with_file_line_column() {
    let dir = temp_dir("bad");
    let file = dir.join("tollgate.toml");
    std::fs::write(
        &file,
        concat!(
            "[server]\n",
            "listen = \"localhost\"\n",
            "\n",
            "[[policy]]\n",
            "name = \"api\"\n",
            "algorithm = \"sliding_window_counter\"\n",
            "window = \"1m\"\n",
            "key = [\"header:x-api-key\", \"cookie:session\"]\n",
            "burst = 3\n",
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let f = file.display().to_string();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 5, "{stderr}");
    assert!(
        lines[0].starts_with(&format!("{f}:2:10: [server] field \"listen\"")),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with(&format!(
            "{f}:4:1: policy \"api\": field \"limit\" is required for algorithm \"sliding_window_counter\"; write e.g. limit = 100"
        )),
        "{stderr}"
    );
    assert!(
        lines[2].starts_with(&format!("{f}:8:28: policy \"api\": field \"key\"")),
        "{stderr}"
    );
    assert!(
        lines[3].starts_with(&format!("{f}:9:1: unknown field \"burst\"")),
        "{stderr}"
    );
    assert!(lines[4].ends_with("4 errors"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A running `tollgate serve`, killed if the test fails.
struct Server {
    child: Child,
    api: SocketAddr,
    admin: SocketAddr,
    /// What the server wrote to stderr so far (also passed on to the test's stderr).
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(config: &Path) -> Server {
    serve_env(config, &[])
}

fn serve_env(config: &Path, env: &[(&str, &str)]) -> Server {
    let mut cmd = Command::new(BIN);
    cmd.envs(env.iter().copied());
    serve_command(cmd, config)
}

/// Starts `cmd` (the binary, or a wrapper that runs it) with `serve --config <config>` appended.
fn serve_command(mut cmd: Command, config: &Path) -> Server {
    let mut child = cmd
        .args(["serve", "--config"])
        .arg(config)
        .env("TOLLGATE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn({
        let log = std::sync::Arc::clone(&log);
        move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("{line}");
                log.lock().unwrap().push(line);
            }
        }
    });
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let (mut api, mut admin) = (None, None);
    while api.is_none() || admin.is_none() {
        let line = lines.next().expect("server output").unwrap();
        let addr = |l: &str| -> SocketAddr {
            let url = l
                .split_whitespace()
                .find(|w| w.starts_with("http://"))
                .unwrap();
            url.trim_start_matches("http://").parse().unwrap()
        };
        if line.trim_start().starts_with("decision API") {
            api = Some(addr(&line));
        } else if line.trim_start().starts_with("admin") {
            admin = Some(addr(&line));
        }
    }
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server {
        child,
        api: api.unwrap(),
        admin: admin.unwrap(),
        log,
    }
}

/// Sends SIGTERM and checks that the server drains and exits with success.
fn terminate(server: &mut Server) {
    sigterm(server);
    let status = exit_within(server, Duration::from_secs(20), "SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// Sends the server `SIGTERM`.
fn sigterm(server: &Server) {
    let pid = server.child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(sent.unwrap().success());
}

/// The server's exit status, once it exits within `limit` of `after` (what was done to it).
fn exit_within(server: &mut Server, limit: Duration, after: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "no exit after {after}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP/1.1 request over a fresh connection: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

fn config_text(limit: u32) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\n"
    )
}

#[cfg(unix)]
#[test]
fn serve_reloads_on_sighup_and_exits_on_sigterm() {
    let dir = temp_dir("serve");
    let file = dir.join("tollgate.toml");
    std::fs::write(&file, config_text(5)).unwrap();
    let mut server = serve(&file);
    let check = r#"{"policy":"api","key":"k"}"#;
    let (status, body) = http(server.api, "POST", "/v1/check", check);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"remaining\":4"), "{body}");

    // Add a policy, signal, and see it served; api keeps its count.
    std::fs::write(
        &file,
        config_text(5) + "\n[[policy]]\nname = \"more\"\nlimit = 1\nwindow = \"1m\"\n",
    )
    .unwrap();
    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = http(server.admin, "GET", "/v1/policies", "");
        if body.contains("\"more\"") {
            break;
        }
        assert!(Instant::now() < deadline, "reload not seen: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, body) = http(server.api, "POST", "/v1/check", check);
    assert!(body.contains("\"remaining\":3"), "{body}");

    terminate(&mut server);
    let _ = std::fs::remove_dir_all(&dir);
}

const PYTHON_CLIENT: &str = r#"
import json, sys, time
import urllib3
from urllib3.util.retry import Retry

url = sys.argv[1]
body = json.dumps({"policy": "api", "key": "py"}).encode()
headers = {"content-type": "application/json"}
http = urllib3.PoolManager()
first = http.request("POST", url, body=body, headers=headers, retries=False)
assert first.status == 200, first.status
denied = http.request("POST", url, body=body, headers=headers, retries=False)
assert denied.status == 429, denied.status
wait = int(denied.headers["Retry-After"])
assert wait >= 1, wait
retry = Retry(total=5, status_forcelist=[429], allowed_methods=frozenset({"POST"}),
              respect_retry_after_header=True, backoff_factor=0, raise_on_status=True)
started = time.monotonic()
ok = http.request("POST", url, body=body, headers=headers, retries=retry)
elapsed = time.monotonic() - started
assert ok.status == 200, ok.status
assert elapsed >= 0.9, elapsed
print(f"ok after {elapsed:.2f}s (told to wait {wait}s)")
"#;

#[test]
fn python_urllib3_retry_honours_retry_after() {
    let python = Command::new("python3")
        .args(["-c", "import urllib3"])
        .output();
    match python {
        Err(_) => panic!("python3 is not installed (scripts/test.sh installs it)"),
        Ok(out) if !out.status.success() => {
            panic!("python3 has no urllib3: apt-get install python3-urllib3 (scripts/test.sh does)")
        }
        Ok(_) => {}
    }
    let dir = temp_dir("python");
    let file = dir.join("tollgate.toml");
    std::fs::write(
        &file,
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"2s\"\n",
    )
    .unwrap();
    let server = serve(&file);
    let out = Command::new("python3")
        .args(["-c", PYTHON_CLIENT])
        .arg(format!("http://{}/v1/check", server.api))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, metrics) = http(server.admin, "GET", "/metrics", "");
    assert!(
        metrics.contains("tollgate_decisions_total{policy=\"api\",outcome=\"denied\"}"),
        "{metrics}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// HS256, secret "test-secret", {"sub": "alice", "exp": 4102444800}.
const ALICE: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZSIsImV4cCI6NDEwMjQ0NDgwMH0.93jbePocwURshwfZuCpoUe2xfj8CW6Qapmb6YNjUYwI";

#[test]
fn jwt_claims_key_requests_and_forged_tokens_are_ignored() {
    let dir = temp_dir("jwt");
    let file = dir.join("tollgate.toml");
    std::fs::write(
        &file,
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nkey = [\"jwt:sub\", \"ip\"]\n\n[jwt]\nhs256_secret_env = \"TG_TEST_JWT\"\n",
    )
    .unwrap();
    // Without the secret in the environment, the file is refused with the variable named.
    let out = Command::new(BIN)
        .arg("validate")
        .arg(&file)
        .env_remove("TG_TEST_JWT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(":14:20: [jwt] field \"hs256_secret_env\": the environment variable \"TG_TEST_JWT\" is not set"), "{stderr}");

    let server = serve_env(&file, &[("TG_TEST_JWT", "test-secret")]);
    let req = |token: &str, ip: &str| {
        format!(r#"{{"path":"/x","headers":{{"authorization":"Bearer {token}"}},"ip":"{ip}"}}"#)
    };
    let (status, body) = http(server.api, "POST", "/v1/check", &req(ALICE, "192.0.2.1"));
    assert_eq!(status, 200, "{body}");
    // Same subject from another address: the same key, now over its limit.
    let (status, _) = http(server.api, "POST", "/v1/check", &req(ALICE, "192.0.2.2"));
    assert_eq!(status, 429);
    // A forged token is treated as absent: the request falls back to its IP.
    let forged = format!("{}x", &ALICE[..ALICE.len() - 1]);
    let (status, _) = http(server.api, "POST", "/v1/check", &req(&forged, "192.0.2.3"));
    assert_eq!(status, 200);
    let (status, _) = http(server.api, "POST", "/v1/check", &req(&forged, "192.0.2.3"));
    assert_eq!(status, 429);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The issue's "10,000 idle connections do not take the server down": the server is started
/// with the soft open-file limit at 1,024, as many systems start processes, and must raise it
/// itself; 10,000 connections then sit idle on the decision API (its `max_connections`, so one
/// more waits in the backlog). The admin listener keeps answering; the header read timeout cuts
/// the idle connections; the waiting client is served; the server exits cleanly.
#[cfg(target_os = "linux")]
#[test]
fn ten_thousand_idle_connections_do_not_take_the_server_down() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    const IDLE: u64 = 10_000;
    // This process holds the client ends: it needs the descriptors too.
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(1 << 20).min(1 << 20);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: limit.maximum,
        },
    );
    if hard < IDLE + 512 {
        eprintln!("skipped: the hard open-file limit ({hard}) is below what the test needs");
        return;
    }
    let dir = temp_dir("idle");
    let file = dir.join("tollgate.toml");
    std::fs::write(
        &file,
        config_text(1_000_000).replace(
            "[server]\n",
            "[server]\nheader_read_timeout = \"2s\"\nmax_connections = 10000\n",
        ),
    )
    .unwrap();
    // Started at a soft limit of 1,024 (prlimit, from util-linux) when it is there.
    let cmd = if Command::new("prlimit").arg("--version").output().is_ok() {
        let mut c = Command::new("prlimit");
        c.arg("--nofile=1024:").arg(BIN);
        c
    } else {
        Command::new(BIN)
    };
    let mut server = serve_command(cmd, &file);

    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|i| {
            TcpStream::connect(server.api).unwrap_or_else(|e| panic!("idle connection {i}: {e}"))
        })
        .collect();
    // One more than the listener serves at once: it waits until idle ones are cut.
    let waiting = std::thread::spawn({
        let api = server.api;
        move || http(api, "POST", "/v1/check", r#"{"policy":"api","key":"k"}"#)
    });
    // Meanwhile the admin listener, with its own limit, answers.
    let (status, body) = http(server.admin, "GET", "/healthz", "");
    assert_eq!(status, 200, "{body}");

    let (status, body) = waiting.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"allowed\":true"), "{body}");
    // Every idle connection was closed by the server (end of stream, or a reset).
    for (i, mut c) in idle.into_iter().enumerate() {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 64];
        match c.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("idle connection {i} was not closed: {other:?}"),
        }
    }
    // Still serving, and it exits cleanly on SIGTERM.
    let (status, _) = http(
        server.api,
        "POST",
        "/v1/check",
        r#"{"policy":"api","key":"k"}"#,
    );
    assert_eq!(status, 200);
    terminate(&mut server);
    // Every connection was accepted as it came: none ran out of descriptors.
    let log = server.log.lock().unwrap();
    assert!(
        !log.iter()
            .any(|l| l.contains("accept failed") || l.contains("open file limit")),
        "{log:#?}"
    );
    drop(log);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve` refuses to start, with one clear line, when it could never run as configured: no
/// configuration file (its system error said once), or a state file whose folder nothing can be
/// written to (it used to start and lose the state at every restart).
#[test]
fn serve_refuses_to_start_when_it_cannot_run_as_configured() {
    // `serve --config <config>`, which must fail at start: what it said.
    let refused = |config: &Path| -> String {
        let out = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{text}");
        text
    };
    let dir = temp_dir("refuse");
    let text = refused(&dir.join("missing.toml"));
    assert_eq!(text.matches("(os error 2)").count(), 1, "{text}");

    let file = dir.join("unwritable.toml");
    std::fs::write(
        &file,
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [store]\npath = \"/proc/tollgate-state\"\n",
    )
    .unwrap();
    let text = refused(&file);
    assert!(
        text.contains("[store] path: cannot write the state file's folder /proc"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `tollgate validate FILE | head -1`, `tollgate man | head`, `tollgate completions bash |
/// head`: a reader that goes away ends the command quietly (status 0, nothing on stderr); it
/// was a panic ("failed printing to stdout: Broken pipe") for validate and an error (status 1)
/// for man and completions.
#[test]
fn a_closed_stdout_ends_the_printing_commands_quietly() {
    let dir = temp_dir("closed-stdout");
    let config = dir.join("t.toml");
    std::fs::write(&config, config_text(5)).unwrap();
    let config = config.to_str().unwrap();
    // Each command's problem, so that one failing does not hide another's.
    let problems: Vec<String> = [
        &["validate", config][..],
        &["man"],
        &["completions", "bash"],
        &["completions", "zsh"],
    ]
    .into_iter()
    .filter_map(|args| {
        let out = closed_stdout_support::run(BIN, &dir, args);
        closed_stdout_support::not_quiet(args, &out)
    })
    .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tollgate serve | head -1`: the banner's reader going away does not take the server down
/// (println! panicked there); it serves, and stops cleanly on SIGTERM.
#[cfg(unix)]
#[test]
fn serve_keeps_serving_when_its_stdout_is_closed() {
    let dir = temp_dir("serve-closed-stdout");
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let file = dir.join("tollgate.toml");
    std::fs::write(
        &file,
        config_text(5).replace(
            "[admin]\nlisten = \"127.0.0.1:0\"",
            &format!("[admin]\nlisten = \"{admin}\""),
        ),
    )
    .unwrap();
    let child =
        closed_stdout_support::spawn(BIN, &dir, &["serve", "--config", file.to_str().unwrap()]);
    let mut server = Server {
        child,
        api: admin,
        admin,
        log: std::sync::Arc::default(),
    };
    // The listener is bound before the banner is written, and served only after: an answer
    // to /healthz means the banner's write to the closed pipe is behind it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(admin).is_err() {
        if let Some(status) = server.child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut e) = server.child.stderr.take() {
                let _ = e.read_to_string(&mut stderr);
            }
            panic!("serve exited, {status:?}: {stderr}");
        }
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, _) = http(admin, "GET", "/healthz", "");
    assert_eq!(status, 200);
    assert!(server.child.try_wait().unwrap().is_none(), "serve exited");
    terminate(&mut server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tollgate man` names only pages `tollgate man --dir` writes (it named a tollgate-help(1)
/// that none was written for), prints the same tollgate.1 as the folder gets, and tells the
/// server's signals and the exit statuses as docs/server.md has them.
#[test]
fn the_man_pages_name_only_written_pages_and_tell_signals_and_exit_status() {
    let dir = temp_dir("man");
    let out = Command::new(BIN)
        .args(["man", "--dir"])
        .arg(dir.join("man"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: Vec<String> = std::fs::read_dir(dir.join("man"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(written.contains(&"tollgate.1".to_owned()), "{written:?}");
    let page = Command::new(BIN).arg("man").output().unwrap();
    assert!(page.status.success());
    let page = String::from_utf8(page.stdout).unwrap();
    assert_eq!(
        page,
        std::fs::read_to_string(dir.join("man/tollgate.1")).unwrap(),
        "tollgate man and tollgate man --dir disagree"
    );
    for name in &written {
        let text = std::fs::read_to_string(dir.join("man").join(name)).unwrap();
        // Every "tollgate\-NAME(1)" a page names (roff writes "-" as "\-").
        for (at, _) in text.match_indices("tollgate\\-") {
            let rest = &text[at + "tollgate\\-".len()..];
            let Some(end) = rest.find("(1)") else {
                continue;
            };
            let sub = &rest[..end];
            if sub.chars().all(|c| c.is_ascii_lowercase()) {
                let file = format!("tollgate-{sub}.1");
                assert!(
                    written.contains(&file),
                    "{name} names {file}, not written: {written:?}"
                );
            }
        }
    }
    assert!(!page.contains("tollgate\\-help(1)"), "{page}");
    for name in ["tollgate.1", "tollgate-serve.1"] {
        let text = std::fs::read_to_string(dir.join("man").join(name)).unwrap();
        for needle in [
            ".SH SIGNALS",
            "SIGHUP",
            "re\\-reads its \\-\\-config file",
            "SIGTERM, SIGINT",
            "drain_timeout (30 seconds by default)",
            ".SH \"EXIT STATUS\"",
            "bad configuration or could not start",
        ] {
            assert!(text.contains(needle), "{name} lacks {needle:?}:\n{text}");
        }
    }
    // `tollgate help` itself still works.
    let help = Command::new(BIN).args(["help", "serve"]).output().unwrap();
    assert!(help.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM drains; a second signal during the drain stops the server at once, with status 1.
#[cfg(unix)]
#[test]
fn a_second_signal_stops_the_drain() {
    let dir = temp_dir("second-signal");
    let config = dir.join("tollgate.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout = \"30s\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let mut server = serve(&config);
    // A request whose body never ends keeps the drain waiting (for header_read_timeout).
    let mut held = TcpStream::connect(server.api).unwrap();
    held.write_all(
        b"POST /v1/check HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    sigterm(&server);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "still draining after one signal"
    );
    sigterm(&server);
    let status = exit_within(&mut server, Duration::from_secs(10), "a second SIGTERM");
    assert_eq!(status.code(), Some(1), "{status:?}");
    let log = server.log.lock().unwrap().join("\n");
    assert!(log.contains("a second signal"), "{log}");
    drop(held);
    std::fs::remove_dir_all(&dir).ok();
}
