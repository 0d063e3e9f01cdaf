//! The Redis-protocol door of a running server: `TOLLGATE.CHECK` decides under the configured
//! policies with the same key, quota and failure rule as `/v1/check` by policy (the two share
//! a key's count), and `CL.THROTTLE` answers as redis-cell does, over the server's store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_testkit::redis::RedisProcess;

const POLICY: &str = "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1h\"\nkey = [\"ip\"]\n";

/// One command as a RESP array of bulk strings.
fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Sends `commands` pipelined in one write and reads until `replies` replies (lines starting
/// a reply) have come.
async fn pipeline(addr: std::net::SocketAddr, commands: &[Vec<u8>], expect: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(&commands.concat()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).ends_with(expect) {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("a reply within 10 s")
            .unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn tollgate_check_shares_the_policy_and_key_with_the_decision_api() {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{POLICY}"
    );
    let s = start(tollgate_server::Config::parse("t.toml", &text).unwrap()).await;
    let resp = s.resp.expect("the door is listening");
    // One check through the decision API, two through the door: the third leaves none.
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"policy":"api","key":"ip:203.0.113.9"}"#,
    )
    .await;
    assert_eq!(r.json()["remaining"], 2);
    let reply = pipeline(
        resp,
        &[
            command(&["TOLLGATE.CHECK", "api", "ip:203.0.113.9"]),
            command(&["TOLLGATE.CHECK", "api", "ip:203.0.113.9", "1"]),
            command(&["TOLLGATE.CHECK", "api", "ip:203.0.113.9"]),
            command(&["TOLLGATE.CHECK", "nope", "k"]),
            command(&["PING"]),
        ],
        "+PONG\r\n",
    )
    .await;
    let lines: Vec<&str> = reply.split("\r\n").collect();
    // [allowed, limit, remaining, reset, retry_after] three times.
    assert_eq!(&lines[..4], ["*5", ":1", ":3", ":1"], "{reply}");
    assert_eq!(&lines[6..10], ["*5", ":1", ":3", ":0"], "{reply}");
    assert_eq!(&lines[12..16], ["*5", ":0", ":3", ":0"], "{reply}");
    let retry: i64 = lines[17].trim_start_matches(':').parse().unwrap();
    assert!(retry >= 1, "{reply}");
    assert!(
        lines[18].starts_with("-ERR unknown policy 'nope'"),
        "{reply}"
    );
    // The decision API sees the door's counts: the key is spent.
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"policy":"api","key":"ip:203.0.113.9"}"#,
    )
    .await;
    assert_eq!(r.status, hyper::StatusCode::TOO_MANY_REQUESTS);
    // CL.THROTTLE: redis-cell's five integers (limited, limit, remaining, retry, reset).
    let reply = pipeline(
        resp,
        &[command(&["CL.THROTTLE", "user123", "15", "30", "60", "1"])],
        "\r\n",
    )
    .await;
    assert!(
        reply.starts_with("*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n"),
        "{reply}"
    );
    s.stop().await;
}

#[tokio::test]
async fn lists_decide_before_the_policy_at_this_door_too() {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{POLICY}\n\
         [[list]]\nname = \"partners\"\naction = \"allow\"\nkeys = [\"user:alice\"]\n\n\
         [[list]]\nname = \"blocked\"\naction = \"deny\"\nkeys = [\"user:bob\"]\n"
    );
    let s = start(tollgate_server::Config::parse("t.toml", &text).unwrap()).await;
    let resp = s.resp.expect("the door is listening");
    let mut commands = Vec::new();
    for _ in 0..4 {
        commands.push(command(&["TOLLGATE.CHECK", "api", "user:alice"]));
    }
    commands.push(command(&["TOLLGATE.CHECK", "api", "user:bob"]));
    commands.push(command(&["PING"]));
    let reply = pipeline(resp, &commands, "+PONG\r\n").await;
    let lines: Vec<&str> = reply.split("\r\n").collect();
    // The partner: admitted four times over a limit of 3, uncounted (no quota to report).
    for i in 0..4 {
        assert_eq!(
            &lines[i * 6..i * 6 + 6],
            ["*5", ":1", ":0", ":0", ":0", ":-1"],
            "{reply}"
        );
    }
    // The blocked key: refused, and no wait would help (retry_after -1), as the HTTP doors'
    // 403 says; not an unknown policy.
    assert_eq!(
        &lines[24..30],
        ["*5", ":0", ":0", ":0", ":0", ":-1"],
        "{reply}"
    );
    // And /v1/check agrees: 403 for the blocked key.
    let r = post_json(&s.url("/v1/check"), r#"{"policy":"api","key":"user:bob"}"#).await;
    assert_eq!(r.status, hyper::StatusCode::FORBIDDEN);
    s.stop().await;
}

#[tokio::test]
async fn the_door_asks_for_the_password_of_the_running_configuration() {
    // PATH is always set: its value is the password.
    let password = std::env::var("PATH").unwrap();
    let dir = std::env::temp_dir().join(format!("tollgate-resp-password-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tollgate.toml");
    let with = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\nresp_password_env = \"PATH\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{POLICY}"
    );
    std::fs::write(&file, &with).unwrap();
    let s = start(tollgate_server::Config::load(&file).unwrap()).await;
    let resp = s.resp.unwrap();
    let noauth = "-NOAUTH Authentication required.\r\n";
    assert_eq!(
        pipeline(resp, &[command(&["TOLLGATE.CHECK", "api", "k"])], "\r\n").await,
        noauth
    );
    let reply = pipeline(
        resp,
        &[
            command(&["AUTH", &password]),
            command(&["TOLLGATE.CHECK", "api", "k"]),
        ],
        "\r\n:-1\r\n",
    )
    .await;
    assert!(
        reply.starts_with("+OK\r\n*5\r\n:1\r\n:3\r\n:2\r\n"),
        "{reply}"
    );
    let reply = pipeline(resp, &[command(&["AUTH", "wrong"])], "\r\n").await;
    assert_eq!(
        reply,
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );

    // The password taken out of the configuration: new connections need none.
    std::fs::write(&file, with.replace("resp_password_env = \"PATH\"\n", "")).unwrap();
    wait_for(|| async { pipeline(resp, &[command(&["PING"])], "\r\n").await == "+PONG\r\n" }).await;
    s.stop().await;
}

/// `CL.THROTTLE` follows `[store] on_error` as `TOLLGATE.CHECK` does once Redis is gone:
/// `allow` admits uncounted (`[0, limit, 0, -1, 0]`; `TOLLGATE.CHECK`'s `1 0 0 0 -1`), `deny`
/// refuses with the same error at both, `local` decides from this instance's memory.
#[tokio::test]
async fn cl_throttle_follows_on_error_when_the_store_fails() {
    let throttle = |key: &str| command(&["CL.THROTTLE", key, "2", "1", "60"]);
    let check = command(&["TOLLGATE.CHECK", "api", "k"]);
    let refused = "-ERR store unavailable: the store could not decide; retry shortly\r\n";
    for mode in ["allow", "deny", "local"] {
        let mut redis = RedisProcess::start(&[]);
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"100ms\"\non_error = \"{mode}\"\n{POLICY}",
            redis.url()
        );
        let s = start(tollgate_server::Config::parse("t.toml", &text).unwrap()).await;
        let resp = s.resp.expect("the door is listening");
        // With Redis: counted there.
        let reply = pipeline(resp, &[throttle("before"), throttle("before")], ":120\r\n").await;
        assert_eq!(
            reply, "*5\r\n:0\r\n:3\r\n:2\r\n:-1\r\n:60\r\n*5\r\n:0\r\n:3\r\n:1\r\n:-1\r\n:120\r\n",
            "{mode}"
        );
        redis.kill();
        let mut commands = vec![throttle("after"); 4];
        commands.push(command(&["CL.THROTTLE", "after", "2", "1", "60", "5"]));
        commands.push(check.clone());
        commands.push(command(&["PING"]));
        let reply = pipeline(resp, &commands, "+PONG\r\n").await;
        let want = match mode {
            "allow" => format!(
                "{}*5\r\n:1\r\n:3\r\n:0\r\n:-1\r\n:0\r\n*5\r\n:1\r\n:0\r\n:0\r\n:0\r\n:-1\r\n+PONG\r\n",
                "*5\r\n:0\r\n:3\r\n:0\r\n:-1\r\n:0\r\n".repeat(4)
            ),
            "deny" => format!(
                "{}*5\r\n:1\r\n:3\r\n:0\r\n:-1\r\n:0\r\n{refused}+PONG\r\n",
                refused.repeat(4)
            ),
            // This instance's own count, from scratch: three admitted, the fourth refused;
            // a quantity over the limit peeks at it.
            _ => "*5\r\n:0\r\n:3\r\n:2\r\n:-1\r\n:60\r\n*5\r\n:0\r\n:3\r\n:1\r\n:-1\r\n:120\r\n\
                  *5\r\n:0\r\n:3\r\n:0\r\n:-1\r\n:180\r\n*5\r\n:1\r\n:3\r\n:0\r\n:60\r\n:180\r\n\
                  *5\r\n:1\r\n:3\r\n:0\r\n:-1\r\n:180\r\n"
                .to_owned(),
        };
        if mode == "local" {
            assert!(reply.starts_with(&want), "{mode}: {reply}");
            assert!(reply.ends_with("\r\n+PONG\r\n"), "{mode}: {reply}");
        } else {
            assert_eq!(reply, want, "{mode}");
        }
        s.stop().await;
    }
}

/// Under a policy whose action is `delay`, the door's answer has no field to say how long to
/// wait, so it answers when the request's slot comes, as forward-auth's 200 does: a client
/// acting on the answer at once still goes no faster than the policy's rate.
#[tokio::test]
async fn a_delayed_check_is_answered_when_its_slot_comes() {
    let text = "[server]\nlisten = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[policy]]\nname = \"smooth\"\nalgorithm = \"leaky_bucket\"\nrate = \"2/s\"\nqueue = 1\nkey = [\"ip\"]\naction = \"delay\"\nmax_delay = \"5s\"\n";
    let s = start(tollgate_server::Config::parse("t.toml", text).unwrap()).await;
    let resp = s.resp.expect("the door is listening");
    let check = [command(&["TOLLGATE.CHECK", "smooth", "k"])];
    // The first passes at once; the second's slot is half a second later.
    let first = pipeline(resp, &check, ":-1\r\n").await;
    let started = std::time::Instant::now();
    let second = pipeline(resp, &check, ":-1\r\n").await;
    let held = started.elapsed();
    assert!(first.starts_with("*5\r\n:1\r\n:2\r\n:1\r\n"), "{first}");
    assert!(second.starts_with("*5\r\n:1\r\n:2\r\n:0\r\n"), "{second}");
    assert!(
        held >= std::time::Duration::from_millis(400),
        "the delayed check was answered after {held:?}: {second}"
    );
    s.stop().await;
}
