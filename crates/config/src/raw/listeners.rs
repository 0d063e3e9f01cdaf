//! `[server]` and `[admin]`: where Tollgate listens, over TLS or not, and the bounds every
//! listener keeps (`header_read_timeout`, `max_header_bytes`, `max_connections`,
//! `[proxy] idle_timeout`).

use std::net::SocketAddr;

use super::fields::{addr, duration};
use super::{Errors, RawAdmin, RawProxy, RawServer, S};
use crate::tls::RawTls;

/// The listeners of `[server]` and `[admin]`; each field `None` when its value was refused
/// (and reported).
pub(super) struct Listeners {
    pub(super) listen: Option<SocketAddr>,
    /// `Some(None)` when no `grpc_listen` is set.
    pub(super) grpc_listen: Option<Option<SocketAddr>>,
    /// `Some(None)` when no `resp_listen` is set.
    pub(super) resp_listen: Option<Option<SocketAddr>>,
    /// `resp_password_env`'s password (`None` as well when it was refused, with `ok` false).
    pub(super) resp_password: Option<crate::Secret>,
    pub(super) ipv6_prefix: Option<u8>,
    pub(super) limits: Option<crate::Limits>,
    pub(super) admin_listen: Option<SocketAddr>,
    pub(super) admin_token: Option<String>,
    /// `[server]`'s TLS (`Some(None)`: plaintext).
    pub(super) tls: Option<Option<crate::TlsConfig>>,
    /// `[admin]`'s TLS (`Some(None)`: plaintext).
    pub(super) admin_tls: Option<Option<crate::TlsConfig>>,
    /// False when a field was refused that has no `None` of its own (an empty admin token).
    pub(super) ok: bool,
}

pub(super) fn validate(
    server: &RawServer,
    proxy: Option<&RawProxy>,
    admin: RawAdmin,
    errs: &mut Errors<'_>,
) -> Listeners {
    let limits = validate_limits(server, proxy, errs);
    let ipv6_prefix = match &server.ipv6_prefix {
        Some(v) if (0..=128).contains(v.get_ref()) => u8::try_from(*v.get_ref()).ok(),
        Some(v) => {
            let shown = errs.shown(v.span().start, v.get_ref());
            errs.at(v.span().start, format!("[server] field \"ipv6_prefix\" must be 0 to 128, not {shown}; write e.g. ipv6_prefix = 64"));
            None
        }
        None => Some(64),
    };
    let listen = match &server.listen {
        Some(v) => addr(v, "[server]", "listen", errs),
        None => Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
    };
    let grpc_listen = match &server.grpc_listen {
        Some(v) => addr(v, "[server]", "grpc_listen", errs).map(Some),
        None => Some(None),
    };
    let resp_listen = match &server.resp_listen {
        Some(v) => addr(v, "[server]", "resp_listen", errs).map(Some),
        None => Some(None),
    };
    let admin_listen = match &admin.listen {
        Some(v) => addr(v, "[admin]", "listen", errs),
        None => Some(SocketAddr::from(([127, 0, 0, 1], 9090))),
    };
    let tls = crate::tls::validate(
        "[server]",
        RawTls {
            cert: server.tls_cert.as_ref(),
            key: server.tls_key.as_ref(),
            client_ca: server.client_ca.as_ref(),
        },
        errs,
    );
    let admin_tls = crate::tls::validate(
        "[admin]",
        RawTls {
            cert: admin.tls_cert.as_ref(),
            key: admin.tls_key.as_ref(),
            client_ca: admin.client_ca.as_ref(),
        },
        errs,
    );
    let mut ok = true;
    let resp_password = match &server.resp_password_env {
        Some(v) => {
            let password = resp_password(v, server.resp_listen.is_some(), errs);
            ok &= password.is_some();
            password
        }
        None => None,
    };
    let admin_token = match admin.token {
        Some(t) if t.get_ref().is_empty() => {
            errs.at(
                t.span().start,
                "[admin] field \"token\" is empty; remove it to disable the check, or write a secret".to_owned(),
            );
            ok = false;
            None
        }
        Some(t) => Some(t.into_inner()),
        None => None,
    };
    Listeners {
        listen,
        grpc_listen,
        resp_listen,
        resp_password,
        ipv6_prefix,
        limits,
        admin_listen,
        admin_token,
        tls,
        admin_tls,
        ok,
    }
}

/// `resp_password_env`: the environment variable holding the Redis-protocol door's password,
/// set and not empty, next to a `resp_listen`.
fn resp_password(v: &S<String>, door: bool, errs: &mut Errors<'_>) -> Option<crate::Secret> {
    let name = v.get_ref();
    if !door {
        errs.at(
            v.span().start,
            "[server] field \"resp_password_env\" is the Redis-protocol door's password, and there is no door: add resp_listen, e.g. resp_listen = \"127.0.0.1:6380\", or remove it".to_owned(),
        );
        return None;
    }
    match std::env::var(name) {
        Ok(password) if !password.is_empty() => Some(crate::Secret::new(password.into_bytes())),
        _ => {
            errs.at(
                v.span().start,
                format!(
                    "[server] field \"resp_password_env\": the environment variable {name:?} is not set (or empty); export it before starting tollgate, e.g. export {name}=$(openssl rand -hex 16)"
                ),
            );
            None
        }
    }
}

/// The longest `[server] drain_timeout`: a shutdown that waits longer is a stuck one.
const MAX_DRAIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// The listener bounds: `[server] header_read_timeout`, `max_header_bytes`, `max_connections`,
/// `drain_timeout` (zero: stop without waiting), and `[proxy] idle_timeout`; each unset one
/// keeps its default.
fn validate_limits(
    server: &RawServer,
    proxy: Option<&RawProxy>,
    errs: &mut Errors<'_>,
) -> Option<crate::Limits> {
    let mut out = crate::Limits::default();
    let mut ok = true;
    let mut positive = |v: &S<String>, ctx: &str, field: &str, example: &str| match duration(
        v, field, ctx, errs,
    ) {
        Some(d) if d.is_zero() => {
            errs.at(
                v.span().start,
                format!(
                    "{ctx}field \"{field}\" must be positive; write e.g. {field} = \"{example}\""
                ),
            );
            None
        }
        d => d,
    };
    if let Some(v) = &server.header_read_timeout {
        match positive(v, "[server] ", "header_read_timeout", "10s") {
            Some(d) => out.header_read_timeout = d,
            None => ok = false,
        }
    }
    if let Some(v) = proxy.and_then(|p| p.idle_timeout.as_ref()) {
        match positive(v, "[proxy] ", "idle_timeout", "75s") {
            Some(d) => out.idle_timeout = d,
            None => ok = false,
        }
    }
    if let Some(v) = &server.drain_timeout {
        match duration(v, "drain_timeout", "[server] ", errs) {
            Some(d) if d <= MAX_DRAIN => out.drain = d,
            Some(_) => {
                errs.at(
                    v.span().start,
                    "[server] field \"drain_timeout\" must be at most 1h; write e.g. \
                     drain_timeout = \"30s\""
                        .to_owned(),
                );
                ok = false;
            }
            None => ok = false,
        }
    }
    let mut bounded = |v: &S<i64>, field: &str, min: i64, max: i64, example: &str| {
        let n = *v.get_ref();
        if (min..=max).contains(&n) {
            usize::try_from(n).ok()
        } else {
            let shown = errs.shown(v.span().start, n);
            errs.at(
                v.span().start,
                format!("[server] field \"{field}\" must be {min} to {max}, not {shown}; write e.g. {field} = {example}"),
            );
            None
        }
    };
    if let Some(v) = &server.max_header_bytes {
        match bounded(v, "max_header_bytes", 1024, 1 << 20, "65536") {
            Some(n) => out.max_header_bytes = n,
            None => ok = false,
        }
    }
    if let Some(v) = &server.max_connections {
        match bounded(v, "max_connections", 1, 1_000_000, "10000") {
            Some(n) => out.max_connections = n,
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// One listener for [`distinct`]: its name as the file writes it, where its address is written
/// (`None`: the default), and the address.
pub(super) struct Bound {
    pub(super) name: &'static str,
    pub(super) at: Option<usize>,
    pub(super) addr: SocketAddr,
}

/// Refuses two listeners on one port (the same address, or one of them on every address of its
/// family): the second could not bind, and `serve` would stop at start with only the system's
/// "address in use". Port 0 asks the system for a free port, which never clashes.
pub(super) fn distinct(bound: &[Bound], errs: &mut Errors<'_>) -> bool {
    let mut ok = true;
    for (i, later) in bound.iter().enumerate() {
        for earlier in &bound[..i] {
            if !clash(earlier.addr, later.addr) {
                continue;
            }
            // Reported where an address was written: the later one's, or else the earlier.
            let (here, other) = if later.at.is_some() {
                (later, earlier)
            } else {
                (earlier, later)
            };
            let default = if other.at.is_none() {
                ", its default"
            } else {
                ""
            };
            errs.at(
                here.at.unwrap_or(0),
                format!(
                    "{} = \"{}\" takes the port of {} ({}{default}): two listeners cannot share a port; give each its own",
                    here.name, here.addr, other.name, other.addr
                ),
            );
            ok = false;
        }
    }
    ok
}

fn clash(a: SocketAddr, b: SocketAddr) -> bool {
    let (x, y) = (a.ip(), b.ip());
    a.port() == b.port()
        && a.port() != 0
        && (x == y
            || (x.is_ipv4() == y.is_ipv4() && (x.is_unspecified() || y.is_unspecified()))
            // `[::]` takes the IPv4 addresses too where the system maps them (Linux's default).
            || (x.is_ipv6() && x.is_unspecified())
            || (y.is_ipv6() && y.is_unspecified()))
}
