//! `[proxy]`: the reverse proxy's listener (over TLS or not), its upstream, whose forwarding
//! headers are believed, and how long an exchange may take.

use std::time::Duration;

use tollgate_http::{Cidr, ForwardedHeader};

use super::fields::{addr, duration, one_of};
use super::{Errors, RawProxy, S};
use crate::ProxyConfig;

/// `[proxy]`; `listen` and `upstream` are required.
pub(super) fn validate(p: S<RawProxy>, errs: &mut Errors<'_>) -> Option<ProxyConfig> {
    let at = p.span().start;
    let p = p.into_inner();
    let mut ok = true;
    let listen = match &p.listen {
        Some(v) => addr(v, "[proxy]", "listen", errs),
        None => {
            errs.at(
                at,
                "[proxy] field \"listen\" is required; write e.g. listen = \"127.0.0.1:8000\""
                    .to_owned(),
            );
            None
        }
    };
    let upstream = match &p.upstream {
        Some(v) => upstream(v, errs),
        None => {
            errs.at(at, "[proxy] field \"upstream\" is required; write e.g. upstream = \"http://127.0.0.1:3000\"".to_owned());
            None
        }
    };
    let mut trusted = Vec::new();
    for t in p.trusted_proxies.unwrap_or_default() {
        match t.get_ref().parse::<Cidr>() {
            Ok(c) => trusted.push(c),
            Err(e) => {
                errs.at(
                    t.span().start,
                    format!("[proxy] field \"trusted_proxies\": {:?}: {}; write e.g. trusted_proxies = [\"10.0.0.0/8\"]", e.input(), e.reason()),
                );
                ok = false;
            }
        }
    }
    let timeout = match &p.timeout {
        Some(v) => match duration(v, "timeout", "[proxy] ", errs) {
            // Zero would answer 504 to every request the upstream does not answer at once.
            Some(d) if d.is_zero() => {
                errs.at(
                    v.span().start,
                    "[proxy] field \"timeout\" must be positive; write e.g. timeout = \"30s\""
                        .to_owned(),
                );
                None
            }
            d => d,
        },
        None => Some(Duration::from_secs(30)),
    };
    let forwarded_header = match &p.forwarded_header {
        Some(v) => one_of(
            v,
            "forwarded_header",
            "[proxy] ",
            &[
                ("x-forwarded-for", ForwardedHeader::XForwardedFor),
                ("forwarded", ForwardedHeader::Forwarded),
            ],
            errs,
        ),
        None => Some(ForwardedHeader::XForwardedFor),
    };
    let tls = crate::tls::validate(
        "[proxy]",
        crate::tls::RawTls {
            cert: p.tls_cert.as_ref(),
            key: p.tls_key.as_ref(),
            client_ca: p.client_ca.as_ref(),
        },
        errs,
    );
    if !ok {
        return None;
    }
    Some(ProxyConfig {
        listen: listen?,
        upstream: upstream?,
        trusted_proxies: tollgate_http::TrustedProxies::new(trusted),
        forwarded_header: forwarded_header?,
        timeout: timeout?,
        tls: tls?,
    })
}

/// `upstream`: an `http://HOST:PORT` base, with no path.
fn upstream(v: &S<String>, errs: &mut Errors<'_>) -> Option<http::Uri> {
    match v.get_ref().parse::<http::Uri>() {
        Ok(u)
            if u.scheme_str() == Some("http")
                && u.authority().is_some()
                && u.path_and_query().is_none_or(|pq| pq.as_str() == "/") =>
        {
            Some(u)
        }
        _ => {
            errs.at(
                v.span().start,
                format!(
                    "[proxy] field \"upstream\": {:?} is not an http://HOST:PORT base (no path; https upstreams are not supported); write e.g. upstream = \"http://127.0.0.1:3000\"",
                    v.get_ref()
                ),
            );
            None
        }
    }
}
