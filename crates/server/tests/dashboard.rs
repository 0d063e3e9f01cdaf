//! The dashboard in a real browser: headless Chromium opens `/` on the admin listener of a
//! server under load. The chart moves, the shadow policy's chart shows its shadow decisions,
//! the limited key appears in the top list, an override added, edited and removed through the
//! form changes the next decision each time, the page fetches nothing from anywhere else, logs
//! no console error or warning, and fits a phone's screen.
//!
//! `TOLLGATE_DASHBOARD_SCREENSHOT=docs/dashboard.png` also saves a screenshot there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "dashboard/devtools.rs"]
mod devtools;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine as _;
use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};

const POLICIES: &str = "[[policy]]\nname = \"api\"\nlimit = 30\nwindow = \"1m\"\nkey = [\"header:x-api-key\", \"ip\"]\n\n[[policy]]\nname = \"trial\"\naction = \"shadow\"\nlimit = 10\nwindow = \"1m\"\nkey = [\"ip\"]\n";

/// The client that never stops: one request in three.
const LOUD: &str = "203.0.113.66";

fn check(ip: &str, api_key: Option<&str>) -> String {
    let mut v = json!({"method": "GET", "path": "/v1/items", "ip": ip});
    if let Some(k) = api_key {
        v["headers"] = json!({"x-api-key": k});
    }
    v.to_string()
}

/// Decisions until `stop`: the loud client, many quiet ones, some with an API key.
async fn load(url: String, stop: Arc<AtomicBool>) {
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let body = match n % 3 {
            0 => check(LOUD, None),
            1 => check(&format!("198.51.100.{}", n % 200), None),
            _ => check(
                &format!("192.0.2.{}", n % 50),
                Some(&format!("key-{}", n % 7)),
            ),
        };
        post_json(&url, &body).await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
}

/// Whether a DevTools event is a console error or warning, an exception, or a request that
/// leaves the admin listener.
fn problem(event: &Value, origin: &str) -> bool {
    match event["method"].as_str().unwrap_or_default() {
        "Runtime.consoleAPICalled" => {
            matches!(
                event["params"]["type"].as_str(),
                Some("error" | "warning" | "assert")
            )
        }
        "Runtime.exceptionThrown" => true,
        "Log.entryAdded" => matches!(
            event["params"]["entry"]["level"].as_str(),
            Some("error" | "warning")
        ),
        "Network.requestWillBeSent" => {
            let url = event["params"]["request"]["url"]
                .as_str()
                .unwrap_or_default();
            !url.starts_with(origin) && !url.starts_with("data:")
        }
        _ => false,
    }
}

const CARD: &str = "document.querySelector('.card[data-policy=\"api\"] canvas')";

/// How long the page may take to show something.
const PATIENCE: Duration = Duration::from_secs(30);

/// Pixels of the shadow line's colour (#bf8700) that `policy`'s chart draws clearly above its
/// baseline, where a line at 0 lies.
fn shadow_pixels(page: &mut devtools::Session, policy: &str) -> u64 {
    let count = format!(
        "(() => {{
           const c = document.querySelector('.card[data-policy=\"{policy}\"] canvas');
           const ratio = window.devicePixelRatio || 1;
           const above = Math.floor(((c.clientHeight || 140) - 16 - 3) * ratio);
           const d = c.getContext('2d').getImageData(0, 0, c.width, above).data;
           let n = 0;
           for (let i = 0; i < d.length; i += 4) {{
             if (Math.abs(d[i] - 191) < 24 && Math.abs(d[i + 1] - 135) < 24 && d[i + 2] < 48
                 && d[i + 3] > 200) n++;
           }}
           return n;
         }})()"
    );
    page.eval(&count).as_u64().unwrap()
}

/// The shadow series is the shadow policy's: `trial` (10 a minute per IP, `action = "shadow"`)
/// would deny the loud client, so its samples, its rates and its drawing show shadow decisions
/// and never a denial, while the rejecting policy's shadow stays at 0.
fn the_shadow_chart_shows_the_shadow_policy(page: &mut devtools::Session) {
    let series = |name: &str| format!("(window.tollgateDashboard.series.get('{name}') || [])");
    page.eval_until(
        &format!("{}.some(p => p.shadow > 0)", series("trial")),
        PATIENCE,
    );
    assert_eq!(
        page.eval(&format!("{}.every(p => p.denied === 0)", series("trial"))),
        json!(true)
    );
    assert_eq!(
        page.eval(&format!(
            "{0}.length > 0 && {0}.every(p => p.shadow === 0)",
            series("api")
        )),
        json!(true)
    );
    let trial = "document.querySelector('.card[data-policy=\"trial\"]')";
    assert!(
        page.eval(&format!("{trial}.querySelector('h3').textContent"))
            .as_str()
            .unwrap()
            .starts_with("trial (shadow"),
    );
    page.eval_until(
        &format!("!/ 0\\.0\\/s shadow$/.test({trial}.querySelector('.rates').textContent)"),
        PATIENCE,
    );
    let deadline = std::time::Instant::now() + PATIENCE;
    while shadow_pixels(page, "trial") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no shadow line above the baseline of trial's chart"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        shadow_pixels(page, "api"),
        0,
        "a shadow line on api's chart"
    );
}

/// The loud client's row in the overrides table (undefined when there is none).
fn override_row() -> String {
    format!(
        "[...document.querySelectorAll('#overrides tbody tr')].find(r => r.cells[1].textContent === 'ip:{LOUD}')"
    )
}

/// Clicks the button labelled `label` in the loud client's override row.
fn click_in_override_row(page: &mut devtools::Session, label: &str) {
    page.eval(&format!(
        "[...{}.querySelectorAll('button')].find(b => b.textContent === '{label}').click(), true",
        override_row()
    ));
}

/// The `RateLimit-Policy` of the loud client's next decision.
fn next_policy(rt: &tokio::runtime::Runtime, server: &Running) -> String {
    let next = rt.block_on(post_json(&server.url("/v1/check"), &check(LOUD, None)));
    next.header("ratelimit-policy")
        .unwrap_or_default()
        .to_owned()
}

/// Edits the loud client's override through its row's `edit` button and the form, then
/// removes it with its `remove` button: each time, the next decision for the key follows.
fn edit_then_remove_the_override(
    page: &mut devtools::Session,
    rt: &tokio::runtime::Runtime,
    server: &Running,
) {
    let row = override_row();
    let overrides = || {
        rt.block_on(get(&server.admin_url("/v1/overrides"), &[]))
            .json()
    };
    // The form takes the override's fields; a new limit, window and reason replace them.
    click_in_override_row(page, "edit");
    assert_eq!(
        page.eval("document.getElementById('o-limit').value"),
        json!("100000")
    );
    page.eval(
        "document.getElementById('o-result').textContent = '';
         document.getElementById('o-limit').value = '77777';
         document.getElementById('o-window').value = '2m';
         document.getElementById('o-reason').value = 'browser test: the migration slows down';
         document.getElementById('o-save').click(); true",
    );
    page.eval_until(
        "document.getElementById('o-result').textContent.startsWith('saved')",
        PATIENCE,
    );
    let policy = next_policy(rt, server);
    assert!(policy.contains("\"api\";q=77777;w=120"), "{policy}");
    // Replaced, not added.
    let listed = overrides();
    assert_eq!(
        listed["overrides"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    assert_eq!(
        listed["overrides"][0]["reason"],
        "browser test: the migration slows down"
    );
    page.eval_until(
        &format!("Boolean({row}) && {row}.cells[2].textContent.includes('limit=77777')"),
        PATIENCE,
    );

    // Removed, with the reason the form holds: the policy's own quota again.
    page.eval("document.getElementById('o-reason').value = 'browser test: migration done'; true");
    click_in_override_row(page, "remove");
    page.eval_until(
        &format!(
            "document.getElementById('o-result').textContent === 'removed the override of ip:{LOUD}'"
        ),
        PATIENCE,
    );
    let policy = next_policy(rt, server);
    assert!(policy.contains("\"api\";q=30;w=60"), "{policy}");
    let listed = overrides();
    assert_eq!(
        listed["overrides"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );
    page.eval_until(&format!("!{row}"), PATIENCE);
}

#[test]
fn the_dashboard_shows_live_decisions_and_changes_an_override_through_its_form() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(start_text(POLICIES));
    let stop = Arc::new(AtomicBool::new(false));
    rt.spawn(load(server.url("/v1/check"), Arc::clone(&stop)));

    let profile = tempfile::tempdir().unwrap();
    let (_browser, host) = devtools::start(profile.path());
    let mut page = devtools::Session::open(&devtools::page_socket(&host));
    for domain in ["Runtime", "Log", "Network", "Page"] {
        page.call(&format!("{domain}.enable"), json!({}));
    }
    let origin = server.admin_url("/");
    page.call("Page.navigate", json!({"url": origin}));
    page.wait_for("Page.loadEventFired");
    let patience = PATIENCE;

    // The chart moves: new samples arrive and the drawing changes with them.
    page.eval_until(&format!("Number({CARD}?.dataset.samples) >= 2"), patience);
    let before = page.eval(&format!("{CARD}.toDataURL()"));
    let samples = page
        .eval(&format!("Number({CARD}.dataset.samples)"))
        .as_u64()
        .unwrap();
    page.eval_until(
        &format!("Number({CARD}.dataset.samples) >= {}", samples + 2),
        patience,
    );
    assert_ne!(
        page.eval(&format!("{CARD}.toDataURL()")),
        before,
        "the chart did not change"
    );
    let rates =
        page.eval("document.querySelector('.card[data-policy=\"api\"] .rates').textContent");
    assert!(
        !rates.as_str().unwrap().starts_with("0.0/s admitted"),
        "{rates}"
    );
    the_shadow_chart_shows_the_shadow_policy(&mut page);

    // The loud client is in the top list; its row's button starts an override of it.
    let row = format!(
        "[...document.querySelectorAll('#top tbody tr')].find(r => r.cells[0].textContent === 'ip:{LOUD}')"
    );
    page.eval_until(&format!("Boolean({row})"), patience);
    let denied = rt.block_on(post_json(&server.url("/v1/check"), &check(LOUD, None)));
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    page.eval(&format!("{row}.querySelector('button').click(), true"));
    assert_eq!(
        page.eval("document.getElementById('o-key').value"),
        json!(format!("ip:{LOUD}"))
    );
    page.eval(
        "document.getElementById('o-limit').value = '100000';
         document.getElementById('o-reason').value = 'browser test: a partner migrates';
         document.getElementById('o-save').click(); true",
    );
    page.eval_until(
        "document.getElementById('o-result').textContent.startsWith('saved')",
        patience,
    );

    // The next decision for that key follows the override.
    let next = rt.block_on(post_json(&server.url("/v1/check"), &check(LOUD, None)));
    assert_eq!(next.status, StatusCode::OK);
    let policy = next.header("ratelimit-policy").unwrap_or_default();
    assert!(policy.contains("\"api\";q=100000;w=60"), "{policy}");
    page.eval_until(
        &format!("[...document.querySelectorAll('#overrides tbody tr')].some(r => r.cells[1].textContent === 'ip:{LOUD}')"),
        patience,
    );
    // The store's health is shown.
    page.eval_until(
        "document.getElementById('store').textContent.includes('memory · ready')",
        patience,
    );

    if let Some(path) = std::env::var_os("TOLLGATE_DASHBOARD_SCREENSHOT") {
        // Half a minute of history, for a chart worth showing.
        page.eval_until(
            &format!("Number({CARD}.dataset.samples) >= 30"),
            Duration::from_secs(90),
        );
        let metrics = page.call("Page.getLayoutMetrics", json!({}));
        let size = &metrics["cssContentSize"];
        let clip =
            json!({"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1});
        let shot = page.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true, "clip": clip}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap_or_default())
            .unwrap();
        std::fs::write(&path, png).unwrap();
    }

    edit_then_remove_the_override(&mut page, &rt, &server);

    // On a phone's screen: nothing wider than the screen, the charts included.
    page.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true}),
    );
    page.eval_until(
        &format!("{CARD}.getBoundingClientRect().width <= 390"),
        patience,
    );
    let widths = page.eval(
        "JSON.stringify({page: document.documentElement.scrollWidth, view: window.innerWidth,
           widest: Math.max(...[...document.querySelectorAll('main > section')].map(s => s.getBoundingClientRect().right))})",
    );
    let widths: Value = serde_json::from_str(widths.as_str().unwrap()).unwrap();
    assert!(
        widths["page"].as_f64() <= widths["view"].as_f64(),
        "{widths}"
    );
    assert!(
        widths["widest"].as_f64().unwrap() <= widths["view"].as_f64().unwrap() + 0.5,
        "{widths}"
    );

    // Whatever arrived meanwhile counts too.
    page.eval("1");
    let problems: Vec<&Value> = page.events.iter().filter(|e| problem(e, &origin)).collect();
    assert!(
        problems.is_empty(),
        "console errors, exceptions or foreign fetches: {problems:#?}"
    );
    stop.store(true, Ordering::Relaxed);
    rt.block_on(server.stop());
}
