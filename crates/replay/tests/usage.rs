//! Costs known after the response, replayed from the log: `charge = "response"` takes each
//! request's logged cost, and `count_status` gives back what a request with another status
//! was charged, as the server's true-up after the response does.

mod common;

use common::{START, config, line, replay_with, write_log};
use tollgate_replay::{Format, JsonFields, Options};

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
}

/// A replay of `log`, JSON lines timed by their `ts` field, through the configuration `text`.
fn json_lines(text: &str, log: std::path::PathBuf) -> Options {
    let mut options = Options::new(config(text), vec![log]);
    options.format = Format::Auto;
    options.fields = JsonFields {
        time: "ts".into(),
        ..JsonFields::default()
    };
    options
}

/// A budget of 1,000 tokens a minute: a key's requests are admitted while anything is left and
/// each is charged what its line says it used, so the request after the budget runs out is
/// refused, however cheap it was announced to be.
#[test]
fn each_request_is_charged_the_cost_its_line_reports() {
    let dir = tempdir();
    // Key a: 400 + 400 + 400 spent (the third admitted with 200 left), the fourth refused.
    // Key b: 5 requests of 100 (500) all admitted. A line with no cost charges the policy's
    // cost (1), as a response that reports nothing does.
    let mut lines = Vec::new();
    for i in 0..4 {
        lines.push(format!(
            r#"{{"ts":{},"method":"POST","path":"/v1/chat","ip":"192.0.2.1","api_key":"a","status":200,"cost":400}}"#,
            (START + i) * 1000
        ));
    }
    for i in 0..5 {
        lines.push(format!(
            r#"{{"ts":{},"method":"POST","path":"/v1/chat","ip":"192.0.2.2","api_key":"b","status":200,"cost":100}}"#,
            (START + 10 + i) * 1000
        ));
    }
    lines.push(format!(
        r#"{{"ts":{},"method":"POST","path":"/v1/chat","ip":"192.0.2.2","api_key":"b","status":200}}"#,
        (START + 20) * 1000
    ));
    let log = write_log(dir.path(), "usage.jsonl", &lines);
    let text = "[[policy]]\nname = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nwindow = \"1m\"\n\
                charge = \"response\"\ncost_from = \"json:usage.total_tokens\"\n\
                key = [\"header:x-api-key\"]\nmatch = { path = \"/v1/**\" }\n";
    let s = replay_with(json_lines(text, log));
    assert_eq!(s.bad_lines.count, 0, "{:?}", s.bad_lines.first);
    let r = &s.result;
    assert_eq!((r.requests, r.denied), (10, 1));
    let p = &r.policies[0];
    assert_eq!((p.requests, p.denied, p.keys), (10, 1, 2));
}

/// A logged cost is held to the bound the server holds a read one to (2^53): above it, the
/// request is charged the policy's cost, as a server answered such a response; and a policy
/// that counts by status alone charges its own cost whatever the line's cost says.
#[test]
fn a_logged_cost_is_read_as_the_server_reads_one() {
    let dir = tempdir();
    let line = |i: i64, path: &str, status: u16, cost: &str| {
        format!(
            r#"{{"ts":{},"method":"POST","path":"{path}","ip":"192.0.2.9","api_key":"c","status":{status},"cost":{cost}}}"#,
            (START + i) * 1000
        )
    };
    let lines = vec![
        // tokens (100 a minute, fallback 10): 2^60 is charged 10, so 90 more are admitted
        // and the next request is refused.
        line(0, "/v1/chat", 200, "1152921504606846976"),
        line(1, "/v1/chat", 200, "90"),
        line(2, "/v1/chat", 200, "1"),
        // failed logins (3 a minute): each 401 costs 1, not the 500 its line says.
        line(3, "/login", 401, "500"),
        line(4, "/login", 401, "500"),
        line(5, "/login", 401, "500"),
        line(6, "/login", 401, "500"),
    ];
    let log = write_log(dir.path(), "usage.jsonl", &lines);
    let text = "[[policy]]\nname = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\n\
                charge = \"response\"\ncost_from = \"json:usage.total_tokens\"\ncost = 10\n\
                key = [\"header:x-api-key\"]\nmatch = { path = \"/v1/**\" }\n\n\
                [[policy]]\nname = \"failed\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1m\"\n\
                count_status = [\"401\"]\nkey = [\"header:x-api-key\"]\nmatch = { path = \"/login\" }\n";
    let s = replay_with(json_lines(text, log));
    assert_eq!(s.bad_lines.count, 0, "{:?}", s.bad_lines.first);
    let policy = |name: &str| {
        let p = s.result.policies.iter().find(|p| p.name == name);
        p.map(|p| (p.requests, p.denied))
    };
    assert_eq!(policy("tokens"), Some((3, 1)));
    assert_eq!(policy("failed"), Some((4, 1)));
}

/// Failed logins: only 401s count against 3 a minute, so a user who types the password right
/// is never locked out, and a guesser is refused after the third failure.
#[test]
fn only_the_statuses_named_count() {
    let dir = tempdir();
    let mut lines = Vec::new();
    // 198.51.100.7 guesses: six 401s in a row, one every 2 s.
    for i in 0..6 {
        lines.push(line("198.51.100.7", i * 2, "POST", "/login").replace("\" 200 ", "\" 401 "));
    }
    // 198.51.100.8 logs in ten times in a minute, every time right.
    for i in 0..10 {
        lines.push(line("198.51.100.8", i * 2 + 1, "POST", "/login"));
    }
    lines.sort_by_key(|l| l.split('[').nth(1).map(str::to_owned));
    let log = write_log(dir.path(), "access.log", &lines);
    let text = "[[policy]]\nname = \"logins\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1m\"\n\
                count_status = [\"401\"]\nkey = [\"ip\"]\nmatch = { path = \"/login\", methods = [\"POST\"] }\n";
    let s = replay_with(Options::new(config(text), vec![log]));
    assert_eq!(s.bad_lines.count, 0, "{:?}", s.bad_lines.first);
    let p = &s.result.policies[0];
    assert_eq!((p.requests, p.denied), (16, 3));
    let denied: Vec<(&str, u64)> = p
        .top_keys
        .iter()
        .map(|k| (k.key.as_str(), k.denied))
        .filter(|(_, d)| *d > 0)
        .collect();
    assert_eq!(denied, [("ip:198.51.100.7", 3)]);
}
