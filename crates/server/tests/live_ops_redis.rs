//! Overrides over a real Redis: set on one instance, every instance applies them (the poll of
//! their version) by its next poll, within one second of tokio's paused clock, the override's
//! quota is the one the Redis scripts apply, shared by the instances, and an engine over Redis
//! decides an overridden key exactly as one over the memory store does. Needs `redis-server`
//! (`scripts/test.sh` installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use hyper::{HeaderMap, Method, StatusCode};
use redis_harness::RedisServer;
use serde_json::json;
use tollgate::testing::not_behind;
use tollgate::{Clock, ManualClock, MemoryStore, Timestamp};
use tollgate_http::{QuotaFields, RequestInfo};
use tollgate_redis::{ClockSource, OnError, RedisConfig, RedisStore};

#[tokio::test]
async fn overrides_set_on_one_instance_apply_on_every_instance() {
    let redis = RedisServer::start();
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"200ms\"\n\n[[policy]]\nname = \"api\"\nlimit = 10\nwindow = \"1m\"\nkey = [\"ip\"]\n",
        redis.port
    );
    let a = start_text(&text).await;
    let b = start_text(&text).await;
    let check = r#"{"path":"/v1/x","ip":"203.0.113.5"}"#;
    let started = Instant::now();
    let r = send(
        "PUT",
        &a.admin_url("/v1/overrides/api/ip:203.0.113.5"),
        &[("content-type", "application/json")],
        json!({"limit": 3, "reason": "shared test"}).to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    // Instance a applies its own change before it answers; b within its next poll.
    assert_eq!(
        post_json(&a.url("/v1/check"), check)
            .await
            .header("x-ratelimit-limit"),
        Some("3")
    );
    wait_for(|| async {
        post_json(
            &b.url("/v1/check"),
            r#"{"path":"/v1/x","ip":"198.51.100.1"}"#,
        )
        .await;
        get(&b.admin_url("/v1/overrides"), &[]).await.json()["overrides"]
            .as_array()
            .map(Vec::len)
            == Some(1)
    })
    .await;
    println!(
        "an override reached the other instance after {:?}",
        started.elapsed()
    );
    let listed = get(&b.admin_url("/v1/overrides"), &[]).await.json();
    assert!(listed["shared"].as_str().unwrap().starts_with("redis"));
    // One count in Redis under the override's quota: a spent 1, b and a spend the rest.
    let r = post_json(&b.url("/v1/check"), check).await;
    assert_eq!(
        (r.status, r.header("x-ratelimit-limit")),
        (StatusCode::OK, Some("3"))
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(
        post_json(&a.url("/v1/check"), check).await.status,
        StatusCode::OK
    );
    assert_eq!(
        post_json(&b.url("/v1/check"), check).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The top list says whose view it is.
    let top = get(&b.admin_url("/v1/top?policy=api"), &[]).await.json();
    assert!(
        top["scope"]
            .as_str()
            .unwrap()
            .contains("this instance only"),
        "{top}"
    );
    assert_eq!(top["denied"]["keys"][0]["key"], "ip:203.0.113.5");

    // Removed on b: a goes back to the configured quota.
    let r = send(
        "DELETE",
        &b.admin_url("/v1/overrides/api/ip:203.0.113.5?reason=over"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    wait_for(|| async {
        post_json(&a.url("/v1/check"), check)
            .await
            .header("x-ratelimit-limit")
            == Some("10")
    })
    .await;
    a.stop().await;
    b.stop().await;
}

/// Holds tokio's paused clock still until dropped. A paused current-thread runtime jumps its
/// clock to the next timer whenever it is idle, which with real sockets (Redis, HTTP) is most
/// of the time; while a blocking task is in flight it does not, so the clock then moves only
/// when the test advances it.
struct ClockHeld {
    _release: std::sync::mpsc::Sender<()>,
}

fn hold_the_clock() -> ClockHeld {
    let (release, held) = std::sync::mpsc::channel::<()>();
    tokio::task::spawn_blocking(move || {
        let _ = held.recv();
    });
    ClockHeld { _release: release }
}

/// Tries `cond` until it holds, within 10 s of real time, letting the runtime do the sockets'
/// work between tries (a blocking pause: the paused clock stays where it is).
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond().await {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        let _ = tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(5))).await;
    }
}

const CHECKED: &str = r#"{"path":"/v1/x","ip":"203.0.113.5"}"#;

/// The limit an instance decides the checked key under.
async fn limit_on(s: &Running) -> String {
    let r = post_json(&s.url("/v1/check"), CHECKED).await;
    r.header("x-ratelimit-limit").unwrap_or_default().to_owned()
}

/// The bound of "every instance applies a change within 1 second" as a structure, not a
/// stopwatch: on tokio's paused clock, which moves only when the test says, a change made on one
/// instance is not applied on the other while the clock stands still (only its poll applies
/// it), and is applied once the clock has moved one second, however slow the machine. Both
/// ways: set on a, removed on b.
#[tokio::test(start_paused = true)]
async fn a_change_is_applied_by_the_next_poll_within_one_second_of_the_clock() {
    let redis = RedisServer::start();
    let clock = hold_the_clock();
    // A sliding window log: its script reads no plain key, so the `GET`s Redis counts are the
    // instances' version polls and their reloads of the overrides. A timeout longer than any
    // step of the clock, so that no step times a Redis call out.
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1m\"\n\n[[policy]]\nname = \"api\"\nalgorithm = \"sliding_window_log\"\nlimit = 10\nwindow = \"1m\"\nkey = [\"ip\"]\n",
        redis.url()
    );
    let a = start_text(&text).await;
    let b = start_text(&text).await;
    let gets = || redis.command_calls("get");
    // Each polls once as it starts (the version is 0, as theirs: nothing to reload), then not
    // again until the clock moves.
    until("the first polls", || async { gets() >= 2 }).await;
    let over = "/v1/overrides/api/ip:203.0.113.5";
    let put = json!({"limit": 3, "reason": "paused clock"}).to_string();
    let r = send("PUT", &a.admin_url(over), &[], put).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(limit_on(&a).await, "3");
    for _ in 0..5 {
        assert_eq!(
            limit_on(&b).await,
            "10",
            "applied with the clock standing still"
        );
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    until("b applies the override", || async {
        limit_on(&b).await == "3"
    })
    .await;
    // That second's polls are done: the 2 first polls, a's reload after its change, then one
    // poll each and b's reload.
    until("the polls of that second", || async { gets() >= 6 }).await;

    let r = send(
        "DELETE",
        &b.admin_url(&format!("{over}?reason=over")),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(limit_on(&b).await, "10");
    for _ in 0..5 {
        assert_eq!(
            limit_on(&a).await,
            "3",
            "removed with the clock standing still"
        );
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    until("a applies the removal", || async {
        limit_on(&a).await == "10"
    })
    .await;
    drop(clock);
    a.stop().await;
    b.stop().await;
}

fn limit_header<S: tollgate::Store, C: tollgate::Clock>(
    o: &tollgate_http::Evaluation<S, C>,
) -> Option<hyper::header::HeaderValue> {
    o.headers()
        .find(|(h, _)| h == "x-ratelimit-limit")
        .map(|(_, v)| v)
}

/// The five algorithms, each with an override of its own fields.
fn cases() -> Vec<(&'static str, QuotaFields)> {
    let rate = |s: &str| Some(s.parse().unwrap());
    vec![
        (
            "algorithm = \"fixed_window\"\nlimit = 4\nwindow = \"10s\"",
            QuotaFields {
                limit: Some(2),
                ..Default::default()
            },
        ),
        (
            "algorithm = \"sliding_window_log\"\nlimit = 4\nwindow = \"10s\"",
            QuotaFields {
                limit: Some(6),
                window: Some(Duration::from_secs(5)),
                ..Default::default()
            },
        ),
        (
            "algorithm = \"sliding_window_counter\"\nlimit = 4\nwindow = \"10s\"",
            QuotaFields {
                limit: Some(2),
                ..Default::default()
            },
        ),
        (
            "algorithm = \"token_bucket\"\ncapacity = 4\nrefill = \"1/s\"",
            QuotaFields {
                capacity: Some(2),
                refill: rate("1/2s"),
                ..Default::default()
            },
        ),
        (
            "algorithm = \"leaky_bucket\"\nrate = \"2/s\"\nqueue = 3",
            QuotaFields {
                rate: rate("1/s"),
                queue: Some(1),
                ..Default::default()
            },
        ),
    ]
}

#[tokio::test]
async fn an_overridden_key_is_decided_in_redis_as_in_memory() {
    let redis = RedisServer::start();
    for (n, (quota, fields)) in cases().into_iter().enumerate() {
        let text = with_ports(&format!(
            "[[policy]]\nname = \"p{n}\"\n{quota}\nkey = [\"ip\"]\n"
        ));
        let config = tollgate_server::Config::parse("t.toml", &text).unwrap();
        let start = Timestamp::from_secs(1_700_000_000);
        let clock = ManualClock::new(start);
        let started = Instant::now();
        let mut redis_config =
            RedisConfig::standalone(&format!("redis://127.0.0.1:{}", redis.port));
        redis_config.clock = ClockSource::Local;
        redis_config.on_error = OnError::Deny;
        redis_config.timeout = Duration::from_secs(2);
        let in_redis = RedisStore::new(redis_config).await.unwrap();
        let memory =
            tollgate_server::http_engine(&config, MemoryStore::new(), clock.clone()).unwrap();
        let shared = tollgate_server::http_engine(&config, in_redis, clock.clone()).unwrap();
        let name = format!("p{n}");
        let key = || Box::<[u8]>::from(&b"ip:192.0.2.1"[..]);
        memory.set_overrides([(
            key(),
            memory.compile_override(&name, &fields, None).unwrap(),
        )]);
        shared.set_overrides([(
            key(),
            shared.compile_override(&name, &fields, None).unwrap(),
        )]);
        let headers = HeaderMap::new();
        let mut seen = [0u32; 2];
        for step in 0..40u64 {
            // Mostly bursts, now and then a pause: denials, refills and window turns.
            clock.advance(Duration::from_millis(
                [0, 0, 0, 300, 1_100, 2_700][(step % 6) as usize],
            ));
            // Redis expires keys on its own clock, by TTLs from this one.
            clock.set(not_behind(clock.now(), start, started));
            for ip in ["192.0.2.1", "192.0.2.2"] {
                let info = RequestInfo::new(&Method::GET, "/x", &headers)
                    .with_peer(Some(ip.parse().unwrap()));
                let m = memory.evaluate(&info).await;
                let r = shared.evaluate(&info).await;
                let strip = |d: &tollgate::Decisions| -> Vec<(bool, u64, u64)> {
                    d.as_slice()
                        .iter()
                        .map(|d| (d.allowed, d.limit, d.remaining))
                        .collect()
                };
                assert!(!r.store_failed(), "{name} step {step}: Redis failed");
                if ip == "192.0.2.1" {
                    seen[usize::from(r.decisions().allowed())] += 1;
                }
                assert_eq!(
                    strip(m.decisions()),
                    strip(r.decisions()),
                    "{name} {ip} step {step} at {}",
                    clock.now()
                );
                assert_eq!(
                    limit_header(&m),
                    limit_header(&r),
                    "{name} {ip} step {step}"
                );
            }
        }
        assert!(
            seen[0] > 0 && seen[1] > 0,
            "{name}: denied and admitted {seen:?}"
        );
        // The overridden key's state in Redis is under a policy of its own quota.
        let over = shared.key_override(&name, b"ip:192.0.2.1").unwrap();
        assert_ne!(
            over.policy().fingerprint(),
            shared.policies().next().unwrap().policy.fingerprint()
        );
    }
}

/// What Redis runs, as `MONITOR` shows it: the commands clients send (not those scripts run).
struct Monitor {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    port: u16,
}

impl Monitor {
    fn start(port: u16) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "MONITOR"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-cli: {e}; install it with `apt-get install redis-tools` (scripts/test.sh does)"));
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let first = lines.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(first, "OK");
        Monitor { child, lines, port }
    }

    /// The commands clients sent since the start, as lines like
    /// `"EVALSHA" "abc..." "1" "tollgate:..."`, up to a marker this sends last.
    fn commands(mut self) -> Vec<String> {
        let marker = "end-of-the-measured-decisions";
        let echoed = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "ECHO", marker])
            .output()
            .unwrap();
        assert!(echoed.status.success());
        let mut sent = Vec::new();
        loop {
            let line = self.lines.recv_timeout(Duration::from_secs(10)).unwrap();
            if line.contains(marker) {
                break;
            }
            // `1700000000.123456 [0 127.0.0.1:53412] "GET" "..."`; scripts' own are `[0 lua]`.
            if let Some((_, command)) = line.split_once("] ")
                && !line.contains(" lua] ")
            {
                sent.push(command.to_owned());
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        sent
    }
}

#[tokio::test]
async fn overridden_keys_cost_no_extra_redis_round_trip() {
    let redis = RedisServer::start();
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"2s\"\n\n[[policy]]\nname = \"api\"\nlimit = 100000\nwindow = \"1m\"\nkey = [\"ip\"]\n",
        redis.port
    );
    let s = start_text(&text).await;
    let r = send(
        "PUT",
        &s.admin_url("/v1/overrides/api/ip:203.0.113.5"),
        &[],
        json!({"limit": 50000, "reason": "cost test"}).to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    const N: u64 = 200;
    // As many decisions for a key without an override as for one with: the clients send
    // Redis as many commands for both, and the overrides' version polls follow the clock
    // (one per 250 ms), not the decisions.
    let mut decisions_sent = Vec::new();
    for ip in ["198.51.100.1", "203.0.113.5"] {
        let check = format!(r#"{{"path":"/v1/x","ip":"{ip}"}}"#);
        post_json(&s.url("/v1/check"), &check).await;
        let monitor = Monitor::start(redis.port);
        let started = Instant::now();
        for _ in 0..N {
            let r = post_json(&s.url("/v1/check"), &check).await;
            assert_eq!(r.status, StatusCode::OK);
        }
        // Two polls every 250 ms: the overrides' version and the lists' versions.
        let polls_at_most = 2 * (started.elapsed().as_millis() as u64 / 250 + 2);
        let sent = monitor.commands();
        let (polls, others): (Vec<&String>, Vec<&String>) = sent.iter().partition(|c| {
            (c.starts_with("\"GET\"") && c.contains("{overrides}:version"))
                || (c.starts_with("\"HGETALL\"") && c.contains("{lists}:versions"))
        });
        assert!(
            polls.len() as u64 <= polls_at_most,
            "{} version polls for {N} decisions",
            polls.len()
        );
        assert!(
            others.len() as u64 <= N,
            "{} commands: {others:#?}",
            others.len()
        );
        println!(
            "{ip}: {} commands for {N} decisions, {} version polls",
            others.len(),
            polls.len()
        );
        decisions_sent.push(others.len());
        let limit = if ip == "203.0.113.5" {
            "50000"
        } else {
            "100000"
        };
        let r = post_json(&s.url("/v1/check"), &check).await;
        assert_eq!(r.header("x-ratelimit-limit"), Some(limit));
    }
    assert_eq!(
        decisions_sent[0], decisions_sent[1],
        "commands sent for {N} decisions: without an override, with one"
    );
    s.stop().await;
}
