//! Headless Chromium (Debian's `chromium`) driven over the DevTools protocol with tungstenite,
//! as the replay report's browser test does: start it, find its page, send commands and keep
//! the events that arrive meanwhile.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

/// How long Chromium may take to start, and to answer one command.
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
pub(crate) struct Browser(Child);

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts Chromium with a fresh profile; its DevTools address.
pub(crate) fn start(profile: &Path) -> (Browser, String) {
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
            "--window-size=1280,1000",
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
pub(crate) fn page_socket(host: &str) -> String {
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
pub(crate) struct Session {
    socket: WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next: u64,
    pub(crate) events: Vec<Value>,
}

impl Session {
    pub(crate) fn open(url: &str) -> Session {
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

    pub(crate) fn call(&mut self, method: &str, params: Value) -> Value {
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

    pub(crate) fn wait_for(&mut self, event: &str) {
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

    /// The value of a JavaScript expression (awaited when it is a promise).
    pub(crate) fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {r}");
        r["result"]["value"].clone()
    }

    /// Evaluates `expression` until it is true, for at most `within`.
    pub(crate) fn eval_until(&mut self, expression: &str, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        while self.eval(expression) != Value::Bool(true) {
            assert!(
                std::time::Instant::now() < deadline,
                "never true: {expression}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
