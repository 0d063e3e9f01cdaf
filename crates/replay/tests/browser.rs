//! The HTML report in a real browser: headless Chromium (Debian's `chromium`) opens
//! `report.html` over the DevTools protocol; the page must log no console error or warning,
//! throw nothing, fetch nothing, and show every plot (laid out at a real size, drawn, not
//! covered by anything).

mod common;

// The DevTools harness is the dashboard test's (one copy for both browser tests).
#[path = "../../server/tests/dashboard/devtools.rs"]
#[allow(dead_code)]
mod devtools;

use devtools::{Session, page_socket, start};
use serde_json::{Value, json};

/// For every plot: its id, rendered size, how many shapes it drew, and whether the element at
/// its centre (scrolled into view) belongs to it.
const CHECK_PLOTS: &str = r#"JSON.stringify([...document.querySelectorAll('figure.plot')].map(f => {
  const svg = f.querySelector('svg');
  if (!svg) return {id: f.id, svg: false};
  svg.scrollIntoView({block: 'center'});
  const r = svg.getBoundingClientRect();
  const style = getComputedStyle(svg);
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  return {id: f.id, svg: true, width: r.width, height: r.height,
          shapes: svg.querySelectorAll('rect,path,polyline,polygon,line,circle').length,
          texts: svg.querySelectorAll('text').length,
          shown: style.visibility !== 'hidden' && style.display !== 'none' && style.opacity !== '0',
          onTop: svg === hit || svg.contains(hit)};
}))"#;

#[test]
fn the_report_shows_every_plot_without_errors() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = common::write_log(dir.path(), "access.log", &common::twice_and_half());
    let mut text = common::policy("sliding_window_counter");
    text.push_str("\n[[policy]]\nname = \"all <&> \\\"sites\\\"\"\nalgorithm = \"token_bucket\"\ncapacity = 50\nrefill = \"1/s\"\nkey = [\"ip\"]\n");
    let mut options = tollgate_replay::Options::new(common::config(&text), vec![log]);
    options.sweep = Some(tollgate_replay::Sweep {
        policy: Some("api".into()),
        dimensions: vec![
            "limit=5,10,15,20"
                .parse()
                .unwrap_or_else(|e: String| panic!("{e}")),
        ],
    });
    let summary = common::replay_with(options);
    let out = dir.path().join("report");
    let written = tollgate_replay::report::write(&summary, &out).unwrap_or_else(|e| panic!("{e}"));
    let mut stems: Vec<String> = written
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    stems.sort();
    assert_eq!(stems.len(), 5, "{stems:?}"); // two per policy and the sweep

    let profile = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_browser, host) = start(profile.path());
    let mut s = Session::open(&page_socket(&host));
    for domain in ["Runtime", "Log", "Network", "Page"] {
        s.call(&format!("{domain}.enable"), json!({}));
    }
    let url = format!("file://{}", out.join("report.html").display());
    s.call("Page.navigate", json!({"url": url}));
    s.wait_for("Page.loadEventFired");
    let result = s.call(
        "Runtime.evaluate",
        json!({"expression": CHECK_PLOTS, "returnByValue": true}),
    );
    let plots: Value = serde_json::from_str(result["result"]["value"].as_str().unwrap_or("null"))
        .unwrap_or(Value::Null);
    // Whatever arrived while the page was checked counts too.
    s.call("Runtime.evaluate", json!({"expression": "1"}));

    let problems: Vec<&Value> = s
        .events
        .iter()
        .filter(|e| match e["method"].as_str().unwrap_or_default() {
            "Runtime.consoleAPICalled" => matches!(
                e["params"]["type"].as_str(),
                Some("error" | "warning" | "assert")
            ),
            "Runtime.exceptionThrown" => true,
            "Log.entryAdded" => matches!(
                e["params"]["entry"]["level"].as_str(),
                Some("error" | "warning")
            ),
            "Network.requestWillBeSent" => {
                let u = e["params"]["request"]["url"].as_str().unwrap_or_default();
                u != url && !u.starts_with("data:")
            }
            _ => false,
        })
        .collect();
    assert!(
        problems.is_empty(),
        "console errors, exceptions or fetches: {problems:#?}"
    );

    let plots = plots
        .as_array()
        .unwrap_or_else(|| panic!("no plot report: {result}"));
    let mut ids: Vec<String> = plots
        .iter()
        .map(|p| p["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    assert_eq!(ids, stems, "every plot file is on the page");
    for p in plots {
        assert_eq!(p["svg"], true, "{p}");
        assert!(
            p["width"].as_f64().unwrap_or(0.0) > 300.0
                && p["height"].as_f64().unwrap_or(0.0) > 120.0,
            "{p}"
        );
        assert!(
            p["shapes"].as_u64().unwrap_or(0) >= 5 && p["texts"].as_u64().unwrap_or(0) >= 5,
            "{p}"
        );
        assert_eq!(
            (p["shown"].as_bool(), p["onTop"].as_bool()),
            (Some(true), Some(true)),
            "{p}"
        );
    }
    let title = s.call(
        "Runtime.evaluate",
        json!({"expression": "document.title", "returnByValue": true}),
    );
    assert_eq!(title["result"]["value"], "Tollgate replay");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap_or_default();
    assert!(
        html.contains("all &lt;&amp;&gt; &quot;sites&quot;"),
        "names are escaped"
    );
    assert!(!html.contains("<script"), "the page has no script");
}
