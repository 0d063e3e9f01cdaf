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
    // The cost above the bound is the one fallback, and the line is no bad cost: it is whole.
    let tokens = s.result.policies.iter().find(|p| p.name == "tokens");
    assert_eq!(tokens.map(|p| p.usage_fallbacks), Some(1));
    assert_eq!(s.bad_costs.count, 0);
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

/// The audit's configuration: a budget of 100 tokens an hour charged by the response (10 up
/// front, and as the fallback), beside one request an hour per address.
const TOKENS_AND_PER_IP: &str = "[[policy]]\nname = \"tokens\"\nalgorithm = \"fixed_window\"\n\
    limit = 100\nwindow = \"1h\"\nkey = [\"header:x-api-key\"]\nmatch = { path = \"/v1/chat\" }\n\
    charge = \"response\"\ncost_from = \"json:usage.total_tokens\"\ncost = 10\n\n\
    [[policy]]\nname = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\n\
    key = [\"ip\"]\n";

/// Asserts what a replay of [`bad_costs`] through [`TOKENS_AND_PER_IP`] decided: every line
/// counted by both policies, the bad costs charged `cost`, none of them a bad line.
fn assert_bad_costs_charged_the_fallback(s: &tollgate_replay::Summary) {
    assert_eq!(s.bad_lines.count, 0, "{:?}", s.bad_lines.first);
    let policy = |name: &str| {
        let p = s.result.policies.iter().find(|p| p.name == name);
        p.map(|p| (p.requests, p.denied))
    };
    // per-ip: 9.9.9.9's second request is refused, its first (cost 12.5) having counted.
    assert_eq!(policy("per-ip"), Some((13, 1)));
    // tokens: key k2's bad costs are charged 10 each, so its eleventh is refused.
    assert_eq!(policy("tokens"), Some((13, 1)));
    assert_eq!((s.result.requests, s.result.denied), (13, 2));
    // Each admitted one is a fallback, as the server counts it; the lines are counted apart.
    let fallbacks = |name: &str| {
        let p = s.result.policies.iter().find(|p| p.name == name);
        p.map(|p| p.usage_fallbacks)
    };
    assert_eq!(
        (fallbacks("tokens"), fallbacks("per-ip")),
        (Some(11), Some(0))
    );
    assert_eq!(s.bad_costs.count, 12);
    let listed: Vec<u64> = s.bad_costs.first.iter().map(|l| l.line).collect();
    assert_eq!(listed, [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
    let table = tollgate_replay::table::render(s);
    assert!(table.contains("; 0 bad, 0 out of order\n"), "{table}");
    assert!(
        table.contains("\n  12 lines whose cost is not a whole number (first: "),
        "{table}"
    );
    let json = serde_json::to_value(s).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(json["bad_costs"]["count"], 12);
    assert_eq!(json["result"]["policies"][0]["usage_fallbacks"], 11);
}

/// The costs of [`assert_bad_costs_charged_the_fallback`]: 9.9.9.9 sends 12.5 then 3 with key
/// k1 (the audit's two lines), then key k2 sends eleven bad costs from eleven addresses.
fn bad_costs(json: bool) -> Vec<(String, &'static str, String)> {
    let mut lines = vec![
        ("9.9.9.9".to_owned(), "k1", "12.5".to_owned()),
        ("9.9.9.9".to_owned(), "k1", "3".to_owned()),
    ];
    let bad: &[&str] = if json {
        &[
            "12.5",
            "-3",
            "\"abc\"",
            "1e3",
            "true",
            "\"12.5\"",
            "\"+5\"",
            "\"\\u0031 2\"",
        ]
    } else {
        &["12.5", "-3", "abc", "1e3", "+5", "0x10", "1,000", "½"]
    };
    for i in 0..11 {
        lines.push((format!("10.0.0.{i}"), "k2", bad[i % bad.len()].to_owned()));
    }
    lines
}

/// A JSON line whose cost is not a whole number is still a request: every policy counts it,
/// and a policy charged by the response charges it its `cost`, as the server charges a
/// response whose cost is bad.
#[test]
fn a_json_cost_that_is_not_a_whole_number_is_charged_the_policy_cost() {
    let dir = tempdir();
    let lines: Vec<String> = bad_costs(true)
        .into_iter()
        .enumerate()
        .map(|(i, (ip, key, cost))| {
            format!(
                r#"{{"ts":{},"method":"POST","path":"/v1/chat","ip":"{ip}","api_key":"{key}","status":200,"cost":{cost}}}"#,
                (START + i as i64) * 1000
            )
        })
        .collect();
    let log = write_log(dir.path(), "bad.jsonl", &lines);
    let decisions = dir.path().join("decisions.jsonl");
    let mut options = json_lines(TOKENS_AND_PER_IP, log);
    options.decisions = Some(decisions.clone());
    let s = replay_with(options);
    assert_bad_costs_charged_the_fallback(&s);
    // The audit's second line: refused by per-ip, its first line (cost 12.5) having counted.
    let traced = std::fs::read_to_string(&decisions).unwrap_or_else(|e| panic!("{e}"));
    let second: serde_json::Value = traced
        .lines()
        .nth(1)
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    assert_eq!(
        (&second["line"], &second["status"]),
        (&2.into(), &429.into()),
        "{traced}"
    );
    let per_ip = second["decisions"].as_array().into_iter().flatten();
    let per_ip: Vec<_> = per_ip.filter(|d| d["policy"] == "per-ip").collect();
    assert_eq!(per_ip.len(), 1, "{traced}");
    assert_eq!(per_ip[0]["allowed"], false, "{traced}");
}

/// The same in the combined format, whose cost follows `$msec` and `$request_time`.
#[test]
fn a_combined_cost_that_is_not_a_whole_number_is_charged_the_policy_cost() {
    let dir = tempdir();
    let lines: Vec<String> = bad_costs(false)
        .into_iter()
        .enumerate()
        .map(|(i, (ip, key, cost))| {
            let secs = i as i64;
            let head = line(&ip, secs, "POST", "/v1/chat");
            format!("{head} \"{key}\" {}.000 0.000 {cost}", START + secs)
        })
        .collect();
    let log = write_log(dir.path(), "access.log", &lines);
    let s = replay_with(Options::new(config(TOKENS_AND_PER_IP), vec![log]));
    assert_bad_costs_charged_the_fallback(&s);
}

/// A line that does not say how the request ended (no status, `null`, `-`, `"abc"`, or a
/// number that is no status code, such as nginx's `000`) is replayed as a request the server
/// never answered: admission's charge stands, so a `count_status` policy counts it.
#[test]
fn a_line_without_a_status_keeps_its_charge() {
    let dir = tempdir();
    // Numbers that are no status first: were they read as a 200, each would be given back and
    // the requests after them admitted.
    let statuses = [
        r#","status":0"#,
        r#","status":"000""#,
        r#","status":1000"#,
        r#","status":99"#,
        "",
        r#","status":null"#,
        r#","status":"-""#,
        r#","status":"abc""#,
    ];
    let lines: Vec<String> = statuses
        .iter()
        .enumerate()
        .map(|(i, status)| {
            format!(
                r#"{{"ts":{},"method":"POST","path":"/login","ip":"192.0.2.{i}","api_key":"a"{status}}}"#,
                (START + i as i64) * 1000
            )
        })
        .collect();
    let log = write_log(dir.path(), "statuses.jsonl", &lines);
    let text = "[[policy]]\nname = \"failed\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1m\"\n\
                count_status = [\"401\"]\nkey = [\"header:x-api-key\"]\nmatch = { path = \"/login\" }\n";
    let s = replay_with(json_lines(text, log));
    assert_eq!(s.bad_lines.count, 0, "{:?}", s.bad_lines.first);
    let p = &s.result.policies[0];
    // Three count, the other five are refused: none was given back.
    assert_eq!((p.requests, p.denied), (8, 5));

    // Combined: `-` (Apache) and `000` (nginx, no response sent) alike.
    let lines: Vec<String> = ["-", "000", "-", "000"]
        .iter()
        .enumerate()
        .map(|(i, status)| {
            let head = line(&format!("192.0.2.{i}"), i as i64, "POST", "/login");
            format!(
                "{} \"a\"",
                head.replacen("\" 200 ", &format!("\" {status} "), 1)
            )
        })
        .collect();
    let log = write_log(dir.path(), "statuses.log", &lines);
    let s = replay_with(Options::new(config(text), vec![log]));
    assert_eq!(s.bad_lines.count, 0, "{:?}", s.bad_lines.first);
    let p = &s.result.policies[0];
    assert_eq!((p.requests, p.denied), (4, 1));
}
