//! The HTML report in a real browser: headless Chromium (Debian's `chromium`) opens
//! `report.html` over the DevTools protocol; the page must log no console error or warning,
//! throw nothing, fetch nothing, and show every plot (laid out at a real size, drawn, not
//! covered by anything).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

/// How long Chromium may take to start, and to answer one DevTools command.
const PATIENCE: Duration = Duration::from_secs(60);

fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "headless Chromium is missing: run `apt-get install chromium` (scripts/test.sh does)"
        )
    })
}

/// Chromium, killed when dropped.
struct Browser(Child);

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts Chromium with a fresh profile; its DevTools address.
fn start(profile: &Path) -> (Browser, String) {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--remote-debugging-port=0",
            "--window-size=1200,900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start chromium: {e}"));
    let stderr = child.stderr.take().unwrap_or_else(|| panic!("no stderr"));
    let browser = Browser(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.split("DevTools listening on ").nth(1) {
                let _ = tx.send(url.trim().to_owned());
            }
        }
    });
    let url = rx
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("chromium did not start its DevTools listener"));
    let host = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    (browser, host)
}

/// The DevTools websocket of the browser's page.
fn page_socket(host: &str) -> String {
    let mut stream = TcpStream::connect(host).unwrap_or_else(|e| panic!("{e}"));
    stream
        .set_read_timeout(Some(PATIENCE))
        .unwrap_or_else(|e| panic!("{e}"));
    write!(stream, "GET /json/list HTTP/1.1\r\nHost: {host}\r\n\r\n")
        .unwrap_or_else(|e| panic!("{e}"));
    // Chromium keeps the connection open: read the head, then exactly Content-Length bytes.
    let mut reader = BufReader::new(stream);
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{e}"));
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader
        .read_exact(&mut body)
        .unwrap_or_else(|e| panic!("{e}"));
    let body = String::from_utf8_lossy(&body);
    let targets: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    targets
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["type"] == "page")
        .and_then(|t| t["webSocketDebuggerUrl"].as_str())
        .unwrap_or_else(|| panic!("no page target in {body}"))
        .to_owned()
}

/// A DevTools session: commands and the events that arrive meanwhile.
struct Session {
    socket: WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next: u64,
    events: Vec<Value>,
}

impl Session {
    fn open(url: &str) -> Session {
        let (socket, _) = tungstenite::connect(url).unwrap_or_else(|e| panic!("{e}"));
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = socket.get_ref() {
            s.set_read_timeout(Some(PATIENCE))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        Session {
            socket,
            next: 1,
            events: Vec::new(),
        }
    }

    fn receive(&mut self) -> Value {
        loop {
            match self
                .socket
                .read()
                .unwrap_or_else(|e| panic!("DevTools: {e}"))
            {
                Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap_or(Value::Null),
                Message::Close(_) => panic!("DevTools closed the connection"),
                _ => {}
            }
        }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let command = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket
            .send(Message::text(command))
            .unwrap_or_else(|e| panic!("{e}"));
        loop {
            let m = self.receive();
            if m["id"] == id {
                assert!(m.get("error").is_none(), "{method}: {m}");
                return m["result"].clone();
            }
            self.events.push(m);
        }
    }

    fn wait_for(&mut self, event: &str) {
        if self.events.iter().any(|e| e["method"] == event) {
            return;
        }
        loop {
            let m = self.receive();
            let done = m["method"] == event;
            self.events.push(m);
            if done {
                return;
            }
        }
    }
}

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
