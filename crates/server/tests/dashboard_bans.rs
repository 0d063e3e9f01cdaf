//! The dashboard's bans in a real browser: headless Chromium opens `/` on the admin listener,
//! the banned key appears in the bans table with its policy and denials, and its `lift` button
//! (with the reason typed beside it) lets the client in again at once; the page logs no console
//! error or warning.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "dashboard/devtools.rs"]
mod devtools;

use std::time::Duration;

use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};

const LOGIN: &str = "[[policy]]\nname = \"login\"\nalgorithm = \"fixed_window\"\nlimit = 2\n\
window = \"1s\"\nkey = [\"ip\"]\nban = { after = 3, within = \"1m\", for = \"10m\" }\n";

const BANNED: &str = "192.0.2.99";

const PATIENCE: Duration = Duration::from_secs(30);

fn login() -> String {
    json!({"method": "POST", "path": "/login", "ip": BANNED}).to_string()
}

/// A console error or warning, or an exception.
fn problem(event: &Value) -> bool {
    match event["method"].as_str().unwrap_or_default() {
        "Runtime.consoleAPICalled" => matches!(
            event["params"]["type"].as_str(),
            Some("error" | "warning" | "assert")
        ),
        "Runtime.exceptionThrown" => true,
        "Log.entryAdded" => matches!(
            event["params"]["entry"]["level"].as_str(),
            Some("error" | "warning")
        ),
        _ => false,
    }
}

#[test]
fn a_ban_is_shown_and_lifted_from_the_dashboard() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(start_text(LOGIN));
    rt.block_on(async {
        let deadline = std::time::Instant::now() + PATIENCE;
        while post_json(&server.url("/v1/check"), &login()).await.json()["banned"] != true {
            assert!(std::time::Instant::now() < deadline, "never banned");
        }
    });
    let profile = tempfile::tempdir().unwrap();
    let (_browser, host) = devtools::start(profile.path());
    let mut page = devtools::Session::open(&devtools::page_socket(&host));
    for domain in ["Runtime", "Log", "Page"] {
        page.call(&format!("{domain}.enable"), json!({}));
    }
    page.call("Page.navigate", json!({"url": server.admin_url("/")}));
    page.wait_for("Page.loadEventFired");
    let row = format!(
        "[...document.querySelectorAll('#bans tbody tr')].find(r => r.cells[1] && r.cells[1].textContent === 'ip:{BANNED}')"
    );
    page.eval_until(&format!("Boolean({row})"), PATIENCE);
    assert_eq!(
        page.eval(&format!("{row}.cells[0].textContent")),
        json!("login")
    );
    let denials = page.eval(&format!("Number({row}.cells[4].textContent)"));
    assert!(denials.as_u64().unwrap() >= 3, "{denials}");
    // Banned past its window (1 s): the page took longer than that to show it.
    let still = rt.block_on(post_json(&server.url("/v1/check"), &login()));
    assert_eq!(still.status, StatusCode::TOO_MANY_REQUESTS);
    page.eval(&format!(
        "document.getElementById('b-reason').value = 'browser test: a false alarm';
         {row}.querySelector('button').click(); true"
    ));
    page.eval_until(
        &format!(
            "document.getElementById('b-result').textContent === 'lifted the ban of ip:{BANNED} under login'"
        ),
        PATIENCE,
    );
    let next = rt.block_on(post_json(&server.url("/v1/check"), &login()));
    assert_eq!(next.status, StatusCode::OK, "let in at once");
    page.eval_until(&format!("!{row}"), PATIENCE);
    page.eval("1");
    let problems: Vec<&Value> = page.events.iter().filter(|e| problem(e)).collect();
    assert!(
        problems.is_empty(),
        "console errors or exceptions: {problems:#?}"
    );
    rt.block_on(server.stop());
}
