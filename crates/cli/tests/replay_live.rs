//! A replay decides as the live server does: the same requests, sent to a running
//! `tollgate_server` (`POST /v1/check` by attributes) and written to a log, get the same status
//! and, per policy, the same allowed and remaining from both.
//!
//! The server runs on the system clock and the replay on the log's; every window is a day long
//! so the few milliseconds between them never matter, and a run that crosses midnight UTC (a
//! window boundary) is retried.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_replay::{Format, Options};
use tollgate_server::{Config, Listeners};

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
[admin]
listen = "127.0.0.1:0"

[[policy]]
name = "api"
algorithm = "sliding_window_counter"
limit = 6
window = "1d"
key = ["header:x-api-key", "ip"]
match = { path = "/v1/**" }

[[policy]]
name = "export"
algorithm = "token_bucket"
capacity = 10
refill = "10/1d"
cost = 5
key = ["header:x-api-key", "ip"]
match = { path = "/v1/export/*", methods = ["POST"] }

[[policy]]
name = "login"
algorithm = "fixed_window"
limit = 3
window = "1d"
key = ["ip"]
match = { path = "/login", methods = ["POST"] }

[[policy]]
name = "audit"
algorithm = "sliding_window_log"
limit = 4
window = "1d"
action = "shadow"
key = ["ip"]
match = { path = "/v1/**" }

[[policy]]
name = "partner"
algorithm = "fixed_window"
limit = 2
window = "1d"
key = ["header:x-api-key"]
require_key = true
match = { path = "/partner/**" }
"#;

/// One request of the mix: method, path, API key, client IP.
type Request = (
    &'static str,
    &'static str,
    Option<&'static str>,
    &'static str,
);

/// A repeatable mix over the policies, keys and IPs, with unmatched paths among them.
fn requests(round: usize) -> Vec<Request> {
    const PATHS: [(&str, &str); 6] = [
        ("GET", "/v1/items"),
        ("POST", "/v1/export/7"),
        ("POST", "/login"),
        ("GET", "/partner/report"),
        ("GET", "/elsewhere"),
        ("GET", "/v1/items?page=2"),
    ];
    const KEYS: [Option<&str>; 4] = [Some("k-alpha"), Some("k-beta"), None, Some("k-gamma")];
    const IPS: [&str; 3] = ["198.51.100.1", "198.51.100.2", "2001:db8::7"];
    let mut state = 0x2545_f491_u64 + round as u64;
    (0..150)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = (state >> 33) as usize;
            let (method, path) = PATHS[r % PATHS.len()];
            (
                method,
                path,
                KEYS[r / 7 % KEYS.len()],
                IPS[r / 31 % IPS.len()],
            )
        })
        .collect()
}

/// `POST /v1/check` by attributes; the status and the JSON body.
async fn check(api: SocketAddr, r: &Request, ip: &str, key_suffix: &str) -> (u16, Value) {
    let (method, path, key, _) = *r;
    let mut body = json!({"method": method, "path": path, "ip": ip});
    if let Some(k) = key {
        body["headers"] = json!({"x-api-key": format!("{k}{key_suffix}")});
    }
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(api)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    stream
        .write_all(body.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&response);
    let status: u16 = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// A status and, sorted, each policy's (name, allowed, remaining).
type Answer = (u16, Vec<(String, bool, u64)>);

/// What `--decisions` wrote, one answer per request.
fn replayed_answers(path: &std::path::Path) -> Vec<Answer> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{e}"));
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or(Value::Null);
            let status = u16::try_from(v["status"].as_u64().unwrap_or(0)).unwrap_or(0);
            (status, decisions_of(&v["decisions"]))
        })
        .collect()
}

/// (policy, allowed, remaining) of a list of decisions, sorted.
fn decisions_of(list: &Value) -> Vec<(String, bool, u64)> {
    let mut out: Vec<(String, bool, u64)> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            (
                d["policy"].as_str().unwrap_or_default().to_owned(),
                d["allowed"].as_bool().unwrap_or_default(),
                d["remaining"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    out.sort();
    out
}

/// The live decisions per policy: (policy, allowed, remaining), enforced and shadow.
fn live_decisions(body: &Value) -> Vec<(String, bool, u64)> {
    let mut out = decisions_of(&body["decisions"]);
    out.extend(decisions_of(&body["shadow"]));
    out.sort();
    out
}

fn utc_day() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_decides_as_the_live_server_did() {
    let config = Config::parse("live.toml", CONFIG).unwrap_or_else(|e| panic!("{e}"));
    let listeners = Listeners::bind(&config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let api = listeners
        .local_addrs()
        .api
        .unwrap_or_else(|| panic!("no api listener"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(tollgate_server::run(config.clone(), listeners, async {
        let _ = stopped.await;
    }));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut compared = false;
    for round in 0..2 {
        let day = utc_day();
        // Fresh keys each round: the server's counters from a previous round do not carry over.
        let suffix = format!("-{round}");
        let mut lines = Vec::new();
        let mut live = Vec::new();
        for r in requests(round) {
            let millis = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            // Fresh addresses each round too.
            let ip = if round == 0 {
                r.3.to_owned()
            } else {
                r.3.replace("198.51.100.", "203.0.113.")
                    .replace("db8::", "db8:1::")
            };
            let (status, body) = check(api, &r, &ip, &suffix).await;
            let (method, path, key, _) = r;
            let mut line = json!({"time": millis, "method": method, "path": path, "ip": ip});
            if let Some(k) = key {
                line["api_key"] = json!(format!("{k}{suffix}"));
            }
            lines.push(line.to_string());
            live.push((status, live_decisions(&body)));
        }
        if utc_day() != day {
            continue; // crossed midnight UTC, where every day-long window turns over: again
        }
        let log = write_log(dir.path(), &format!("live-{round}.jsonl"), &lines);
        let decisions = dir.path().join(format!("decisions-{round}.jsonl"));
        let mut options = Options::new(config.clone(), vec![log]);
        options.format = Format::Json;
        options.decisions = Some(decisions.clone());
        let summary = replay_with(options);
        let replayed = replayed_answers(&decisions);
        assert_eq!(replayed.len(), live.len());
        for (i, (l, r)) in live.iter().zip(&replayed).enumerate() {
            assert_eq!(
                l,
                r,
                "request {i} {:?}: live {l:?}, replayed {r:?}",
                requests(round)[i]
            );
        }
        // The mix exercised every kind of answer.
        let statuses: Vec<u16> = live.iter().map(|(s, _)| *s).collect();
        for want in [200, 429, 401] {
            assert!(statuses.contains(&want), "no {want} in {statuses:?}");
        }
        assert!(
            live.iter()
                .any(|(s, d)| *s == 200 && d.iter().any(|(p, a, _)| p == "audit" && !a)),
            "no shadow denial"
        );
        let denied_live = statuses.iter().filter(|s| **s == 429).count() as u64;
        assert_eq!(summary.result.denied, denied_live);
        compared = true;
        break;
    }
    assert!(compared, "both rounds crossed midnight UTC");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
}

/// Writes `lines` to `dir/name`.
fn write_log(dir: &std::path::Path, name: &str, lines: &[String]) -> std::path::PathBuf {
    let path = dir.join(name);
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// Replays with `options`.
fn replay_with(options: Options) -> tollgate_replay::Summary {
    tollgate_replay::replay(&options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
}
