//! The memory store kept on disk (`[store] path`), through real `tollgate serve` processes:
//! counts survive a clean stop (SIGTERM) whole and a crash (SIGKILL) up to the last snapshot;
//! overrides, lockouts, live list entries and queued requests come back; a damaged, cut or future state file is set aside
//! with a warning and the server starts empty.

mod serve_support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use serve_support::{Server, dir, http};

fn config(state: &Path, every: &str, extra: &str) -> String {
    format!(
        "[store]\nkind = \"memory\"\npath = \"{}\"\nsnapshot_every = \"{every}\"\n\n\
         [[policy]]\nname = \"hourly\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1h\"\n\n\
         [[policy]]\nname = \"log\"\nalgorithm = \"sliding_window_log\"\nlimit = 10\nwindow = \"1h\"\n\n\
         [[policy]]\nname = \"bucket\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrefill = \"1/1h\"\n\n\
         [[policy]]\nname = \"monthly\"\nalgorithm = \"fixed_window\"\nlimit = 10\ncalendar = \"month\"\ntimezone = \"Europe/Lisbon\"\n{extra}",
        state.display()
    )
}

const POLICIES: [&str; 4] = ["hourly", "log", "bucket", "monthly"];

fn spend(server: &Server, key: &str, n: u32) {
    for policy in POLICIES {
        for _ in 0..n {
            let a = server.check(policy, key, 1);
            assert_eq!(a.status, 200, "{policy}: {a:?}");
        }
    }
}

/// What `key` has left under `policy`, by a peek (cost 0).
fn left(server: &Server, policy: &str, key: &str) -> u64 {
    let a = server.check(policy, key, 0);
    assert_eq!(a.status, 200, "{a:?}");
    a.json()["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("{a:?}"))
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[test]
fn a_key_that_spent_7_of_10_has_3_after_a_clean_restart() {
    let d = dir();
    let state = d.path().join("state");
    let text = config(&state, "1h", "");
    let mut server = Server::start(d.path(), &text, None);
    // The snapshot series are there before the first snapshot (an hour away), at 0.
    let metrics = http(server.admin, "GET", "/metrics", "").body;
    assert!(
        metrics.contains("tollgate_state_snapshots_total{result=\"written\"} 0")
            && metrics.contains("tollgate_state_last_snapshot_timestamp_seconds 0"),
        "{metrics}"
    );
    spend(&server, "tenant-7", 7);
    spend(&server, "tenant-2", 2);
    let status = server.terminate();
    assert!(status.success(), "{status:?}\n{}", server.log());
    assert!(
        state.exists(),
        "no state file after SIGTERM:\n{}",
        server.log()
    );
    assert!(server.log().contains("state saved"), "{}", server.log());

    let server = Server::start(d.path(), &text, None);
    assert!(server.log().contains("state restored") || wait_log(&server, "state restored"));
    for policy in POLICIES {
        assert_eq!(left(&server, policy, "tenant-7"), 3, "{policy}");
        assert_eq!(left(&server, policy, "tenant-2"), 8, "{policy}");
        assert_eq!(left(&server, policy, "someone-else"), 10, "{policy}");
    }
    // And the three are really all that is left.
    for policy in POLICIES {
        for _ in 0..3 {
            assert_eq!(server.check(policy, "tenant-7", 1).status, 200, "{policy}");
        }
        assert_eq!(server.check(policy, "tenant-7", 1).status, 429, "{policy}");
    }
}

fn wait_log(server: &Server, text: &str) -> bool {
    for _ in 0..500 {
        if server.log().contains(text) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn after_a_crash_a_key_has_at_most_what_the_last_snapshot_held() {
    let d = dir();
    let state = d.path().join("state");
    let text = config(&state, "1s", "");
    let mut server = Server::start(d.path(), &text, None);
    spend(&server, "tenant", 4);
    // Two snapshots after the first four: the second began after they were spent.
    let mut seen = modified(&state);
    let mut snapshots = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while snapshots < 2 {
        assert!(
            Instant::now() < deadline,
            "no snapshot written:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
        let now = modified(&state);
        if now.is_some() && now != seen {
            snapshots += 1;
            seen = now;
        }
    }
    // The snapshots are counted, and the last one's time is told, for alerts.
    let metrics = serve_support::http(server.admin, "GET", "/metrics", "").body;
    let written = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_state_snapshots_total{result=\"written\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(written.is_some_and(|n| n >= 2), "{metrics}");
    assert!(metrics.contains("tollgate_state_snapshots_total{result=\"failed\"} 0"));
    let last = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_state_last_snapshot_timestamp_seconds "))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    assert!(
        now.abs_diff(last) < 60,
        "last snapshot at {last}, now {now}"
    );
    spend(&server, "tenant", 3);
    server.kill();

    let server = Server::start(d.path(), &text, None);
    for policy in POLICIES {
        let left = left(&server, policy, "tenant");
        // The four were snapshotted; the last three may or may not have been.
        assert!((3..=6).contains(&left), "{policy}: {left} left");
    }
}

/// An upstream that answers 200 to every request.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    port
}

#[test]
fn overrides_and_queued_requests_survive_a_restart() {
    let d = dir();
    let state = d.path().join("state");
    let port = upstream();
    let extra = format!(
        "\n[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:{port}\"\n\n\
         [[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"1/1h\"\nqueue = 0\n\
         action = \"queue\"\nkey = [\"header:x-sender\"]\nmatch = {{ path = \"/hooks/**\" }}\n\n\
         [[policy]]\nname = \"keyed\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1h\"\n\
         key = [\"header:x-api-key\"]\nmatch = {{ path = \"/api/**\" }}\n"
    );
    let text = config(&state, "1h", &extra);
    let mut server = Server::start(d.path(), &text, None);
    let put = http(
        server.admin,
        "PUT",
        "/v1/overrides/hourly/vip",
        r#"{"limit": 50, "reason": "kept across restarts"}"#,
    );
    assert!(put.status == 201 || put.status == 200, "{put:?}");
    let proxy = server.proxy.unwrap_or_else(|| panic!("no proxy"));
    // The first passes (a burst of one), the next two wait an hour each for their slot.
    let mut ids = Vec::new();
    for n in 0..3 {
        let a = http(proxy, "POST", &format!("/hooks/{n}"), "{}");
        if n == 0 {
            assert_eq!(a.status, 200, "{a:?}");
        } else {
            assert_eq!(a.status, 202, "{a:?}");
            let location = a.headers.get("location").cloned().unwrap_or_default();
            ids.push(location.trim_start_matches("/v1/queue/").to_owned());
        }
    }
    assert_eq!(left(&server, "hourly", "vip"), 50);
    // API keys are hashed under a secret drawn for the process (no key_secret_env): the state
    // file keeps it, or the keys would start afresh.
    for _ in 0..3 {
        assert_eq!(api_call(proxy).status, 200);
    }
    assert!(server.terminate().success());

    let server = Server::start(d.path(), &text, None);
    assert_eq!(left(&server, "hourly", "vip"), 50, "the override is back");
    let listed = http(server.admin, "GET", "/v1/overrides/hourly/vip", "");
    assert_eq!(listed.status, 200, "{listed:?}");
    let proxy = server.proxy.unwrap_or_else(|| panic!("no proxy"));
    for _ in 0..2 {
        assert_eq!(api_call(proxy).status, 200);
    }
    assert_eq!(api_call(proxy).status, 429, "3 + 2 of 5 spent");
    for id in &ids {
        assert!(!id.is_empty(), "{ids:?}");
        let a = http(proxy, "GET", &format!("/v1/queue/{id}"), "");
        assert_eq!(a.status, 200, "{id}: {a:?}\n{}", server.log());
        assert_eq!(a.json()["state"], "queued", "{a:?}");
    }
}

#[test]
fn lockouts_and_live_list_entries_survive_a_restart() {
    let d = dir();
    let state = d.path().join("state");
    // A bucket of one refilled each second, not a one-second fixed window: three requests in
    // a row are one admission and two denials wherever they fall (a window could turn between
    // them and admit the second).
    let extra = "\n[[policy]]\nname = \"login\"\nalgorithm = \"token_bucket\"\ncapacity = 1\n\
         refill = \"1/s\"\nkey = [\"ip\"]\nmatch = { path = \"/login\" }\n\
         ban = { after = 2, within = \"10m\", for = \"1h\" }\n\n\
         [[list]]\nname = \"blocked\"\naction = \"deny\"\nips = [\"198.51.100.0/24\"]\n";
    let text = config(&state, "1h", extra);
    let mut server = Server::start(d.path(), &text, None);
    let login = r#"{"path": "/login", "ip": "192.0.2.9"}"#;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(http(server.api, "POST", "/v1/check", login).status);
    }
    // Admitted, then two denials within the window: the second starts the ban.
    assert_eq!(statuses, [200, 429, 429], "{}", server.log());
    let put = http(
        server.admin,
        "PUT",
        "/v1/lists/blocked/entries/203.0.113.0%2F24",
        r#"{"reason": "credential stuffing"}"#,
    );
    assert_eq!(put.status, 201, "{put:?}");
    let stranger = r#"{"path": "/x", "ip": "203.0.113.5"}"#;
    assert_eq!(http(server.api, "POST", "/v1/check", stranger).status, 403);
    assert!(server.terminate().success());

    let server = Server::start(d.path(), &text, None);
    // Long after the bucket refilled (1 s), the ban (1 h) holds.
    std::thread::sleep(Duration::from_millis(1100));
    let banned = http(server.api, "POST", "/v1/check", login);
    assert_eq!(banned.status, 429, "{banned:?}\n{}", server.log());
    let retry: u64 = banned
        .headers
        .get("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(retry > 3000, "the ban's end, not the bucket's: {banned:?}");
    let bans = http(server.admin, "GET", "/v1/bans", "");
    assert_eq!(bans.status, 200, "{bans:?}");
    assert!(bans.body.contains("192.0.2.9"), "{bans:?}");
    // The live deny entry is back and applies.
    assert_eq!(http(server.api, "POST", "/v1/check", stranger).status, 403);
    let lists = http(server.admin, "GET", "/v1/lists", "");
    assert!(lists.body.contains("credential stuffing"), "{lists:?}");
    // And the API says where they are kept: not "lost on restart", as without a path.
    assert_eq!(
        lists.json()["shared"],
        "this process: kept across reloads, and across restarts in [store] path",
        "{lists:?}"
    );
}

/// `GET /api/items` with an API key, through the proxy.
fn api_call(proxy: std::net::SocketAddr) -> serve_support::Answer {
    let mut s = std::net::TcpStream::connect(proxy).unwrap_or_else(|e| panic!("{e}"));
    let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
    let head = format!(
        "GET /api/items HTTP/1.1\r\nHost: {proxy}\r\nX-Api-Key: secret-key-1\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    serve_support::Answer {
        status,
        headers: Default::default(),
        body: out,
    }
}

/// A valid state file from a run that spent 5 of `hourly` on `k`.
fn valid_state(d: &tempfile::TempDir, text: &str) -> Vec<u8> {
    let mut server = Server::start(d.path(), text, None);
    for _ in 0..5 {
        assert_eq!(server.check("hourly", "k", 1).status, 200);
    }
    assert!(server.terminate().success());
    std::fs::read(d.path().join("state")).unwrap_or_else(|e| panic!("{e}"))
}

fn future_version() -> Vec<u8> {
    let mut bytes = b"TOLLGATE STATE\n\0".to_vec();
    let mut header = 2u32.to_le_bytes().to_vec();
    header.extend_from_slice(&0u64.to_le_bytes());
    tollgate::store::snapshot::write_frame(&mut bytes, 10, &header)
        .unwrap_or_else(|e| panic!("{e}"));
    bytes.extend_from_slice(b"whatever version 2 holds");
    bytes
}

#[test]
fn a_damaged_cut_or_future_state_file_is_set_aside_and_the_server_starts_empty() {
    let d = dir();
    let state = d.path().join("state");
    let text = config(&state, "1h", "");
    let good = valid_state(&d, &text);
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    let cases = [
        ("damaged", flipped, "checksum"),
        (
            "cut",
            good[..good.len() * 2 / 3].to_vec(),
            "ends in the middle",
        ),
        ("future", future_version(), "format version 2"),
        (
            "not ours",
            b"{\"hello\": \"a JSON file, not ours\"}\n".to_vec(),
            "not a Tollgate state file",
        ),
    ];
    for (what, bytes, says) in cases {
        for entry in std::fs::read_dir(d.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .flatten()
        {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("state.corrupt-")
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        std::fs::write(&state, &bytes).unwrap_or_else(|e| panic!("{e}"));
        let mut server = Server::start(d.path(), &text, None);
        assert!(wait_log(&server, "moved aside"), "{what}: {}", server.log());
        let log = server.log();
        assert!(log.contains(says), "{what}: {log}");
        assert!(log.contains("starts with empty state"), "{what}: {log}");
        // Running, and empty.
        assert_eq!(left(&server, "hourly", "k"), 10, "{what}");
        assert!(server.running(), "{what}");
        // The file is kept, under a new name, as it was.
        let aside: Vec<_> = std::fs::read_dir(d.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("state.corrupt-")
            })
            .collect();
        assert_eq!(aside.len(), 1, "{what}");
        assert_eq!(std::fs::read(aside[0].path()).ok(), Some(bytes), "{what}");
        assert!(server.terminate().success(), "{what}");
    }
}

/// Two servers on one state file: the second waits for the first to let go of it (a rolling
/// restart: the old one drains and saves as the new one starts), then restores what the first
/// saved. Neither ever writes over the other's snapshot.
#[test]
fn a_second_server_on_the_same_state_file_waits_for_the_first_to_save() {
    let d = dir();
    let state = d.path().join("state");
    let text = config(&state, "1s", "");
    let mut first = Server::start(d.path(), &text, None);
    spend(&first, "tenant", 7);
    // The second binds its listeners and then waits for the state file, saying so, and tells
    // a service manager it is ready only once it has restored it and answers.
    let second_dir = dir();
    let socket = second_dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&socket).unwrap();
    let second = Server::start_with_env(
        second_dir.path(),
        &text,
        None,
        &[("NOTIFY_SOCKET", socket.as_path())],
    );
    assert!(
        wait_log(&second, "another process holds the state file"),
        "{}",
        second.log()
    );
    assert!(!second.log().contains("state restored"), "{}", second.log());
    notify.set_nonblocking(true).unwrap();
    let mut message = [0u8; 64];
    assert!(
        notify.recv(&mut message).is_err(),
        "READY=1 while waiting for the state file"
    );
    let status = first.terminate();
    assert!(status.success(), "{status:?}\n{}", first.log());
    assert!(wait_log(&second, "state restored"), "{}", second.log());
    notify.set_nonblocking(false).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let n = notify.recv(&mut message).expect("READY=1 once restored");
    assert_eq!(&message[..n], b"READY=1\n");
    for policy in POLICIES {
        assert_eq!(left(&second, policy, "tenant"), 3, "{policy}");
    }
}
