//! The field readers every table shares: an address, a duration, one of a fixed set of words,
//! a bounded count. Each reports a refused value at its position, with what to write instead.

use std::net::SocketAddr;
use std::time::Duration;

use tollgate::parse_duration;

use super::{Errors, S};

/// `IP:PORT`.
pub(super) fn addr(
    v: &S<String>,
    ctx: &str,
    field: &str,
    errs: &mut Errors<'_>,
) -> Option<SocketAddr> {
    match v.get_ref().parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.at(
                v.span().start,
                format!(
                    "{ctx} field \"{field}\": {:?} is not an address; write IP:PORT, e.g. {field} = \"127.0.0.1:8080\" (or \"[::1]:8080\")",
                    v.get_ref()
                ),
            );
            None
        }
    }
}

/// A duration such as `"50ms"` or `"1m"`.
pub(super) fn duration(
    v: &S<String>,
    field: &str,
    ctx: &str,
    errs: &mut Errors<'_>,
) -> Option<Duration> {
    match parse_duration(v.get_ref()) {
        Ok(d) => Some(d),
        Err(e) => {
            // An example the field itself accepts.
            let example = match field {
                "window" => "1m",
                "lease_ttl" => "5m",
                "timeout" if ctx.starts_with("[store]") => "50ms",
                "timeout" => "30s",
                f if f.starts_with("ban.") => "15m",
                _ => "10s",
            };
            errs.at(
                v.span().start,
                format!(
                    "{ctx}field \"{field}\": {}; write e.g. {field} = \"{example}\"",
                    e.reason()
                ),
            );
            None
        }
    }
}

/// One of `choices`, by name.
pub(super) fn one_of<T: Copy>(
    v: &S<String>,
    field: &str,
    ctx: &str,
    choices: &[(&str, T)],
    errs: &mut Errors<'_>,
) -> Option<T> {
    match choices.iter().find(|(n, _)| *n == v.get_ref()) {
        Some((_, t)) => Some(*t),
        None => {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
            errs.at(
                v.span().start,
                format!(
                    "{ctx}field \"{field}\": {:?} is not one of {}; write e.g. {field} = {}",
                    v.get_ref(),
                    names.join(", "),
                    names.first().map_or("", String::as_str)
                ),
            );
            None
        }
    }
}

/// A positive integer that fits `u32`.
pub(super) fn count(
    v: &S<i64>,
    field: &str,
    ctx: &str,
    min: i64,
    errs: &mut Errors<'_>,
) -> Option<u32> {
    let n = *v.get_ref();
    if n < min || n > i64::from(u32::MAX) {
        let shown = errs.shown(v.span().start, n);
        errs.at(
            v.span().start,
            format!(
                "{ctx}field \"{field}\" must be between {min} and {}, not {shown}",
                u32::MAX
            ),
        );
        return None;
    }
    u32::try_from(n).ok()
}
