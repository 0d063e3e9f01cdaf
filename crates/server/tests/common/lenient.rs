//! A recording upstream that reads HTTP/1.1 as leniently as a careless server would (bare LF
//! accepted, chunk-size lines read up to their first non-hex byte, the first `Content-Length`
//! believed, "chunked" anywhere in `Transfer-Encoding`): whatever a proxy lets through that such
//! a server could read as a second request, it records as one. Each request is answered with
//! its id (`x-req-id`, else the last path segment) in hex in `x-echo`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request as the recording upstream read it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub id: String,
    pub method: String,
    pub target: String,
    pub host: String,
    /// Every `X-Forwarded-For` line, joined with ", " in order: one list.
    pub forwarded_for: String,
    /// The values of its `x-api-key` lines that are not empty.
    pub api_keys: Vec<String>,
}

/// Starts the upstream; every request it reads is pushed to `seen`, in the order read.
pub async fn upstream(seen: Arc<Mutex<Vec<Seen>>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(serve(s, Arc::clone(&seen)));
        }
    });
    addr
}

async fn serve(mut s: TcpStream, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_until_blank(&mut s, &mut buf).await else {
            return;
        };
        let head: Vec<u8> = buf.drain(..end).collect();
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split('\n').map(|l| l.trim_end_matches('\r'));
        let line = lines.next().unwrap_or("");
        let mut parts = line.split(' ');
        let method = parts.next().unwrap_or("").to_owned();
        let target = parts.next().unwrap_or("").to_owned();
        let mut headers: Vec<(String, String)> = Vec::new();
        for l in lines {
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let id = get("x-req-id")
            .or_else(|| target.rsplit('/').next().map(str::to_owned))
            .unwrap_or_default();
        let forwarded_for = headers
            .iter()
            .filter(|(k, _)| k == "x-forwarded-for")
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let api_keys = headers
            .iter()
            .filter(|(k, v)| k == "x-api-key" && !v.is_empty())
            .map(|(_, v)| v.clone())
            .collect();
        seen.lock().unwrap().push(Seen {
            id: id.clone(),
            method: method.clone(),
            target: target.clone(),
            host: get("host").unwrap_or_default(),
            forwarded_for,
            api_keys,
        });
        let chunked =
            get("transfer-encoding").is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
        let ok = if chunked {
            read_chunked(&mut s, &mut buf).await
        } else {
            let n: usize = get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            read_n(&mut s, &mut buf, n).await
        };
        if !ok {
            return;
        }
        let body = if method == "HEAD" { "" } else { "ok" };
        let reply = format!(
            "HTTP/1.1 200 OK\r\nx-echo: {}\r\ncontent-length: 2\r\n\r\n{body}",
            hex(&id)
        );
        if s.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

pub fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut b = [0u8; 8192];
    match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
        Ok(Ok(n)) if n > 0 => {
            buf.extend_from_slice(&b[..n]);
            true
        }
        _ => false,
    }
}

/// Where the head ends: after an empty line, LF or CRLF.
async fn read_until_blank(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        for i in 0..buf.len() {
            if buf[i] == b'\n' {
                if buf.get(i + 1) == Some(&b'\n') {
                    return Some(i + 2);
                }
                if buf.get(i + 1..i + 3) == Some(b"\r\n") {
                    return Some(i + 3);
                }
            }
        }
        if !fill(s, buf).await {
            return None;
        }
    }
}

async fn read_n(s: &mut TcpStream, buf: &mut Vec<u8>, n: usize) -> bool {
    while buf.len() < n {
        if !fill(s, buf).await {
            return false;
        }
    }
    buf.drain(..n);
    true
}

async fn read_line(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            return Some(buf.drain(..=i).collect());
        }
        if !fill(s, buf).await {
            return None;
        }
    }
}

async fn read_chunked(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    loop {
        let Some(line) = read_line(s, buf).await else {
            return false;
        };
        let digits: String = line
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .map(|&b| b as char)
            .collect();
        let Ok(size) = usize::from_str_radix(&digits, 16) else {
            return false;
        };
        if size == 0 {
            // Trailers, up to an empty line.
            loop {
                let Some(l) = read_line(s, buf).await else {
                    return false;
                };
                if l == b"\n" || l == b"\r\n" {
                    return true;
                }
            }
        }
        if !read_n(s, buf, size).await {
            return false;
        }
        if read_line(s, buf).await.is_none() {
            return false;
        }
    }
}
