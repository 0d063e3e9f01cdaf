//! `[[list]]`: allow and deny lists of client addresses (`ips`, CIDR) and keys (`keys`, as
//! `/v1/top` shows them), applied before any policy at every door. Every refused value is
//! reported at its position: a bad network, an unknown action, a name used twice.
//!
//! ```toml
//! [[list]]
//! name = "partners"
//! action = "allow"
//! ips = ["203.0.113.0/24", "2001:db8::/32"]
//! keys = ["header:x-api-key:0123456789abcdef0123456789abcdef"]
//! ```

use serde::Deserialize;
use tollgate_http::{ListAction, ListEntry, ListSpec};
use toml::Spanned;

use crate::Errors;

type S<T> = Spanned<T>;

/// The most entries a configured list may have (each live list takes as many again).
pub const MAX_CONFIGURED_ENTRIES: usize = 1_000_000;

/// The longest list name.
const MAX_NAME: usize = 128;

/// One `[[list]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawList {
    name: Option<S<String>>,
    action: Option<S<String>>,
    ips: Option<Vec<S<String>>>,
    keys: Option<Vec<S<String>>>,
}

/// Whether `name` can name a list: 1 to 128 bytes of letters, digits, `-`, `_` and `.`, which a
/// URL path segment carries as it is.
pub fn valid_list_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Every `[[list]]`, in file order; `None` when any was refused (each problem reported).
/// `ipv6_prefix` is the length IPv6 clients are keyed by (`ip:` key entries must have it).
pub(crate) fn validate(
    raw: Vec<S<RawList>>,
    ipv6_prefix: Option<u8>,
    errs: &mut Errors<'_>,
) -> Option<Vec<ListSpec>> {
    let mut ok = true;
    let mut lists: Vec<ListSpec> = Vec::with_capacity(raw.len());
    let mut names: Vec<String> = Vec::with_capacity(raw.len());
    for item in raw {
        let at = item.span().start;
        let item = item.into_inner();
        if let Some(name) = &item.name {
            if names.contains(name.get_ref()) {
                errs.at(
                    name.span().start,
                    format!(
                        "list \"{}\" is defined twice; give each [[list]] its own name",
                        name.get_ref()
                    ),
                );
                ok = false;
            }
            names.push(name.get_ref().clone());
        }
        match one(at, item, ipv6_prefix, errs) {
            Some(spec) => lists.push(spec),
            None => ok = false,
        }
    }
    ok.then_some(lists)
}

fn one(
    at: usize,
    raw: RawList,
    ipv6_prefix: Option<u8>,
    errs: &mut Errors<'_>,
) -> Option<ListSpec> {
    let Some(name) = raw.name else {
        errs.at(
            at,
            "[[list]]: field \"name\" is required; write e.g. name = \"partners\"".to_owned(),
        );
        return None;
    };
    let name_at = name.span().start;
    let name = name.into_inner();
    let mut ok = true;
    if !valid_list_name(&name) {
        errs.at(
            name_at,
            format!(
                "[[list]]: field \"name\": {name:?} must be 1 to 128 letters, digits, '-', '_' or '.'"
            ),
        );
        ok = false;
    }
    let prefix = format!("list \"{name}\": ");
    let action = match &raw.action {
        Some(v) => match v.get_ref().parse::<ListAction>() {
            Ok(a) => Some(a),
            Err(_) => {
                errs.at(
                    v.span().start,
                    format!(
                        "{prefix}field \"action\": {:?} is not one of \"allow\", \"deny\"; write e.g. action = \"deny\"",
                        v.get_ref()
                    ),
                );
                None
            }
        },
        None => {
            errs.at(
                at,
                format!("{prefix}field \"action\" is required; write action = \"allow\" (never limited) or action = \"deny\" (refused before any policy)"),
            );
            None
        }
    };
    let mut entries = Vec::new();
    for ip in raw.ips.iter().flatten() {
        match ip.get_ref().parse::<tollgate_http::Cidr>() {
            Ok(cidr) => entries.push(ListEntry::Ip(cidr)),
            Err(e) => {
                errs.at(
                    ip.span().start,
                    format!(
                        "{prefix}field \"ips\": {:?}: {}; write e.g. \"203.0.113.0/24\", \"198.51.100.7\" or \"2001:db8::/32\"",
                        e.input(),
                        e.reason()
                    ),
                );
                ok = false;
            }
        }
    }
    for key in raw.keys.iter().flatten() {
        let entry = ListEntry::key(key.get_ref()).map_err(|e| e.reason().to_owned());
        let entry = entry.and_then(|entry| {
            // Unknown when [server] ipv6_prefix was refused: that error is reported already.
            ipv6_prefix.map_or(Ok(()), |bits| entry.fits_ipv6_prefix(bits))?;
            Ok(entry)
        });
        match entry {
            Ok(entry) => entries.push(entry),
            Err(e) => {
                errs.at(
                    key.span().start,
                    format!("{prefix}field \"keys\": {:?}: {e}", key.get_ref()),
                );
                ok = false;
            }
        }
    }
    if entries.len() > MAX_CONFIGURED_ENTRIES {
        errs.at(
            at,
            format!(
                "{prefix}{} entries; a list holds at most {MAX_CONFIGURED_ENTRIES}",
                entries.len()
            ),
        );
        ok = false;
    }
    let action = action?;
    ok.then_some(ListSpec {
        name,
        action,
        entries,
    })
}

#[cfg(test)]
#[path = "lists_tests.rs"]
mod tests;
