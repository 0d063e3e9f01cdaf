//! TLS on the listeners (`tls_cert`, `tls_key`, `client_ca` of `[server]`, `[admin]`,
//! `[proxy]`; `[server]`'s also on its gRPC and Redis-protocol doors): the handshake of each
//! accepted connection, in its own task and within the header read timeout, and the files read
//! again whenever they change, without a restart.
//!
//! Each TLS listener holds its current rustls configuration behind an atomic pointer; every
//! accepted connection takes the one current then. A rotation (new certificate and key, or a
//! new CA bundle) builds a whole new configuration and swaps it in: connections already open
//! keep the certificate they were made with, new ones get the new one. A new set of files that
//! does not load (unparseable, a key that does not match its certificate) is refused with an
//! error in the log, and the running one stays.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::server::TlsStream;

use crate::config::{Config, TlsConfig, TlsError};

/// How often the certificate files are looked at.
const POLL: Duration = Duration::from_secs(1);

/// How long before its certificate expires a listener starts warning, at each load.
const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// A certificate's end that could not be read.
const UNKNOWN: i64 = i64::MIN;

/// The first byte of a TLS connection: a handshake record.
const HANDSHAKE: u8 = 0x16;

/// What a plaintext HTTP request on an HTTPS listener is answered, rather than a connection
/// closed without a word.
const PLAIN_HTTP: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n\
    content-length: 57\r\nconnection: close\r\n\r\n\
    This listener speaks HTTPS: connect with https:// (TLS).\n";

/// What a plaintext Redis client on the TLS Redis-protocol door is answered: an error reply it
/// shows (`redis-cli` prints it), rather than a connection closed without a word.
const PLAIN_RESP: &[u8] = b"-ERR this port speaks TLS: connect with TLS (redis-cli --tls)\r\n";

/// What a listener's clients speak, for a readable refusal of one that skips TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plaintext {
    /// HTTP/1.1: a plaintext request is answered 400, saying to use https.
    Http,
    /// The Redis protocol: a plaintext command is answered with an error reply saying so.
    Resp,
    /// Anything else (gRPC): the connection is closed.
    Close,
}

impl Plaintext {
    /// The answer to a plaintext client whose first byte is `first`, if it is one this
    /// protocol's clients send first (an HTTP method's capital; a RESP array, or an inline
    /// command's letter).
    fn refusal(self, first: u8) -> Option<&'static [u8]> {
        match self {
            Plaintext::Http if first.is_ascii_uppercase() => Some(PLAIN_HTTP),
            Plaintext::Resp if first == b'*' || first.is_ascii_alphabetic() => Some(PLAIN_RESP),
            _ => None,
        }
    }
}

/// One listener's TLS.
pub(crate) struct Tls {
    /// The listener, for the logs.
    listener: &'static str,
    /// The application protocols offered in the handshake (ALPN), most preferred first.
    alpn: Vec<Vec<u8>>,
    /// How a plaintext client is refused.
    plaintext: Plaintext,
    current: ArcSwap<rustls::ServerConfig>,
    /// When the current certificate expires (Unix seconds; [`UNKNOWN`] if unreadable).
    not_after: AtomicI64,
    /// Whether the current certificate's passing its end has been logged.
    expiry_logged: AtomicBool,
    /// The files it was first loaded from, and what they held then: where [`watch_files`]
    /// starts, so that a certificate written while the server started is a change it takes in.
    first: (TlsConfig, Seen),
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// TLS for `listener` from `files`, offering `alpn` (e.g. `http/1.1`, or `h2` for gRPC;
    /// none for the Redis protocol); a plaintext client is refused as `plaintext` says.
    pub(crate) fn new(
        listener: &'static str,
        files: &TlsConfig,
        alpn: &[&[u8]],
        plaintext: Plaintext,
    ) -> Result<Arc<Tls>, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        // Read before they are loaded: a rotation racing the load shows as a change.
        let seen = contents(files);
        let config = build(files, &alpn)?;
        Ok(Arc::new(Tls {
            listener,
            alpn,
            plaintext,
            current: ArcSwap::from_pointee(config),
            not_after: AtomicI64::new(certificate_end(listener, files)),
            expiry_logged: AtomicBool::new(false),
            first: (files.clone(), seen),
        }))
    }

    /// The listener's name (`api`, `admin`, `proxy`, `grpc`, `resp`).
    pub(crate) fn listener(&self) -> &'static str {
        self.listener
    }

    /// When the listener's current certificate expires, in Unix seconds.
    pub(crate) fn not_after(&self) -> Option<i64> {
        Some(self.not_after.load(Ordering::Relaxed)).filter(|&t| t != UNKNOWN)
    }

    /// Logs, once per certificate, that the current one has expired: clients refuse it now.
    fn log_if_expired(&self, now: i64) {
        let Some(end) = self.not_after() else { return };
        if now >= end && !self.expiry_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(
                listener = self.listener,
                not_after = %rfc3339(end),
                "TLS certificate expired: clients refuse it until a new one is written"
            );
        }
    }

    /// The TLS side of `stream`, once its handshake completes within `limit`; `None` when it
    /// fails (a plaintext client, a client certificate refused or missing, no common protocol)
    /// or takes too long, and the connection is closed.
    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        limit: Duration,
    ) -> Option<TlsStream<TcpStream>> {
        let deadline = Instant::now() + limit;
        let mut first = [0u8; 1];
        match timeout_at(deadline, stream.peek(&mut first)).await {
            Ok(Ok(1)) => {}
            Ok(_) => return None,
            Err(_) => {
                tracing::debug!(listener = self.listener, %peer, "TLS: no handshake in time");
                return None;
            }
        }
        if first[0] != HANDSHAKE {
            tracing::debug!(listener = self.listener, %peer, "TLS: a plaintext client, refused");
            if let Some(answer) = self.plaintext.refusal(first[0]) {
                refuse_plaintext(stream, answer, deadline).await;
            }
            return None;
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(self.current.load_full());
        match timeout_at(deadline, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => Some(tls),
            Ok(Err(e)) => {
                tracing::debug!(listener = self.listener, %peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(listener = self.listener, %peer, "TLS: no handshake in time");
                None
            }
        }
    }

    /// Loads `files` again; swaps them in when they load, keeps the running ones otherwise.
    fn reload(&self, files: &TlsConfig) -> Result<(), TlsError> {
        let config = build(files, &self.alpn)?;
        self.current.store(Arc::new(config));
        self.not_after
            .store(certificate_end(self.listener, files), Ordering::Relaxed);
        self.expiry_logged.store(false, Ordering::Relaxed);
        Ok(())
    }
}

/// When the certificate of `files` expires ([`UNKNOWN`] if it cannot be read), with a warning
/// when that is past or less than [`EXPIRY_WARNING`] away: a server does not check its own
/// certificate's dates, and its clients would fail their handshakes without a word here.
fn certificate_end(listener: &'static str, files: &TlsConfig) -> i64 {
    let end = match files.not_after() {
        Ok(end) => end,
        Err(e) => {
            tracing::warn!(
                listener,
                "TLS: the certificate's expiry could not be read: {e}"
            );
            return UNKNOWN;
        }
    };
    let left = end.saturating_sub(unix_now());
    if left <= 0 {
        tracing::warn!(
            listener,
            cert = %files.cert.display(),
            not_after = %rfc3339(end),
            "TLS certificate has expired: clients will refuse it"
        );
    } else if left < EXPIRY_WARNING.as_secs() as i64 {
        tracing::warn!(
            listener,
            cert = %files.cert.display(),
            not_after = %rfc3339(end),
            "TLS certificate expires in {}",
            time_left(left)
        );
    }
    end
}

/// `secs` (above zero) as a warning says it: in days, or hours and minutes within the last day.
fn time_left(secs: i64) -> String {
    match secs {
        172_800.. => format!("{} days", secs / 86_400),
        86_400.. => "1 day".to_owned(),
        3_600.. => format!("{} h {} min", secs / 3_600, secs % 3_600 / 60),
        _ => format!("{} min", (secs + 59) / 60),
    }
}

fn unix_now() -> i64 {
    i64::try_from(crate::admin::top::unix_secs()).unwrap_or(i64::MAX)
}

/// Unix seconds as RFC 3339, for the logs (the number itself past the calendar's range).
fn rfc3339(t: i64) -> String {
    crate::admin::fields::rfc3339_text(t).unwrap_or_else(|| t.to_string())
}

/// The rustls configuration of `files` with `alpn`.
fn build(files: &TlsConfig, alpn: &[Vec<u8>]) -> Result<rustls::ServerConfig, TlsError> {
    let mut config = files.load()?;
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

/// Writes the plaintext refusal, then closes once the client has had a moment to read it
/// (closing with its request unread would reset the connection, and the answer with it).
async fn refuse_plaintext(mut stream: TcpStream, answer: &[u8], deadline: Instant) {
    if !matches!(
        timeout_at(deadline, stream.write_all(answer)).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let _ = timeout_at(deadline, stream.shutdown()).await;
    let mut sink = [0u8; 4096];
    let linger = deadline.min(Instant::now() + Duration::from_secs(1));
    for _ in 0..16 {
        match timeout_at(linger, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
    }
}

/// A TLS listener and where its files come from in a configuration (`[server]`, `[admin]`,
/// `[proxy]`), so that files renamed by a reload are followed too.
pub(crate) type Watched = (Arc<Tls>, fn(&Config) -> Option<TlsConfig>);

/// The files' contents as last seen (`None`: unreadable).
type Seen = Vec<Option<Vec<u8>>>;

fn contents(files: &TlsConfig) -> Seen {
    let paths: [Option<&PathBuf>; 3] = [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ];
    paths
        .into_iter()
        .flatten()
        .map(|p| std::fs::read(p).ok())
        .collect()
}

/// Reads the TLS files of `listeners` every second and reloads a listener's when they have
/// changed (contents compared, so a Kubernetes secret's symlink swap counts, and two writes
/// within a second are not missed). `config` gives the running configuration.
pub(crate) async fn watch_files<F>(
    listeners: Vec<Watched>,
    config: F,
    mut stop: watch::Receiver<bool>,
) where
    F: Fn() -> Arc<crate::generation::Generation>,
{
    if listeners.is_empty() {
        return;
    }
    let mut state: Vec<(TlsConfig, Seen)> =
        listeners.iter().map(|(tls, _)| tls.first.clone()).collect();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = crate::serve::stopped(&mut stop) => return,
        }
        let running = config();
        let now = unix_now();
        for ((tls, files_of), (files, seen)) in listeners.iter().zip(state.iter_mut()) {
            tls.log_if_expired(now);
            // A configuration without TLS here keeps the files this listener started with:
            // turning TLS off takes a restart.
            let wanted = files_of(running.config()).unwrap_or_else(|| files.clone());
            let now = contents(&wanted);
            if wanted == *files && now == *seen {
                continue;
            }
            *files = wanted;
            *seen = now;
            match tls.reload(files) {
                Ok(()) => tracing::info!(
                    listener = tls.listener,
                    cert = %files.cert.display(),
                    "TLS certificate reloaded"
                ),
                Err(e) => tracing::error!(
                    listener = tls.listener,
                    "TLS files refused; the running certificate stays: {e}"
                ),
            }
        }
    }
}

/// The TLS of each listener that has it, made at start from the configuration.
#[derive(Debug, Default)]
pub(crate) struct ListenerTls {
    pub(crate) api: Option<Arc<Tls>>,
    pub(crate) admin: Option<Arc<Tls>>,
    pub(crate) proxy: Option<Arc<Tls>>,
    /// Envoy's rate limit service: `[server]`'s files, offering HTTP/2 only.
    pub(crate) grpc: Option<Arc<Tls>>,
    /// The Redis-protocol door: `[server]`'s files, no ALPN (Redis clients offer none).
    pub(crate) resp: Option<Arc<Tls>>,
}

fn server_files(c: &Config) -> Option<TlsConfig> {
    c.tls.clone()
}

fn admin_files(c: &Config) -> Option<TlsConfig> {
    c.admin_tls.clone()
}

fn proxy_files(c: &Config) -> Option<TlsConfig> {
    c.proxy.as_ref().and_then(|p| p.tls.clone())
}

impl ListenerTls {
    /// Loads every listener's files; the first that fails names its listener.
    pub(crate) fn new(config: &Config) -> Result<ListenerTls, crate::ServerError> {
        const HTTP1: &[&[u8]] = &[b"http/1.1"];
        // The listeners that serve HTTP/2 as well offer it first: a client that offers both
        // (curl, Go, Java) multiplexes its checks over one connection.
        const HTTP2_AND_1: &[&[u8]] = &[b"h2", b"http/1.1"];
        let make = |listener: &'static str,
                    files: Option<TlsConfig>,
                    alpn: &[&[u8]],
                    plaintext: Plaintext|
         -> Result<Option<Arc<Tls>>, crate::ServerError> {
            files
                .map(|f| Tls::new(listener, &f, alpn, plaintext))
                .transpose()
                .map_err(|source| crate::ServerError::Tls { listener, source })
        };
        Ok(ListenerTls {
            api: make("api", server_files(config), HTTP2_AND_1, Plaintext::Http)?,
            admin: make("admin", admin_files(config), HTTP2_AND_1, Plaintext::Http)?,
            proxy: make("proxy", proxy_files(config), HTTP1, Plaintext::Http)?,
            grpc: match config.grpc_listen {
                Some(_) => make("grpc", server_files(config), &[b"h2"], Plaintext::Close)?,
                None => None,
            },
            resp: match config.resp_listen {
                Some(_) => make("resp", server_files(config), &[], Plaintext::Resp)?,
                None => None,
            },
        })
    }

    /// Each TLS listener.
    pub(crate) fn all(&self) -> Vec<Arc<Tls>> {
        self.watched().into_iter().map(|(tls, _)| tls).collect()
    }

    /// Each TLS listener with where its files come from, for [`watch_files`].
    pub(crate) fn watched(&self) -> Vec<Watched> {
        let with = |tls: &Option<Arc<Tls>>, files: fn(&Config) -> Option<TlsConfig>| {
            tls.as_ref().map(|t| (Arc::clone(t), files))
        };
        [
            with(&self.api, server_files),
            with(&self.admin, admin_files),
            with(&self.proxy, proxy_files),
            with(&self.grpc, server_files),
            with(&self.resp, server_files),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Whether `old` and `new` differ in which listeners have TLS: that takes a restart.
pub(crate) fn turned_on_or_off(old: &Config, new: &Config) -> bool {
    [server_files, admin_files, proxy_files]
        .iter()
        .any(|files| files(old).is_some() != files(new).is_some())
}

#[cfg(test)]
mod tests {
    use super::time_left;

    #[test]
    fn time_left_is_said_in_days_then_hours() {
        assert_eq!(time_left(13 * 86_400 + 5), "13 days");
        assert_eq!(time_left(86_400 + 3_600), "1 day");
        assert_eq!(time_left(5 * 3_600 + 61), "5 h 1 min");
        assert_eq!(time_left(59), "1 min");
    }
}
