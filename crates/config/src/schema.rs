//! The shape check that runs before serde: walks the spanned TOML tree and reports every unknown
//! field and every value of the wrong type at once (serde stops at the first).

use toml::Spanned;
use toml::de::{DeInteger, DeTable, DeValue};

use super::Errors;

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    /// An integer or a float.
    Num,
    StrArray,
    Table(&'static [(&'static str, Ty)]),
    TableArray(&'static [(&'static str, Ty)]),
}

const SERVER: &[(&str, Ty)] = &[
    ("listen", Ty::Str),
    ("grpc_listen", Ty::Str),
    ("resp_listen", Ty::Str),
    ("resp_password_env", Ty::Str),
    ("ipv6_prefix", Ty::Int),
    ("header_read_timeout", Ty::Str),
    ("max_header_bytes", Ty::Int),
    ("max_connections", Ty::Int),
    ("drain_timeout", Ty::Str),
    ("tls_cert", Ty::Str),
    ("tls_key", Ty::Str),
    ("client_ca", Ty::Str),
];
const ADMIN: &[(&str, Ty)] = &[
    ("listen", Ty::Str),
    ("token", Ty::Str),
    ("tls_cert", Ty::Str),
    ("tls_key", Ty::Str),
    ("client_ca", Ty::Str),
];
const STORE: &[(&str, Ty)] = &[
    ("kind", Ty::Str),
    ("url", Ty::Str),
    ("cluster", Ty::Bool),
    ("nodes", Ty::StrArray),
    ("timeout", Ty::Str),
    ("on_error", Ty::Str),
    ("clock", Ty::Str),
    ("max_keys", Ty::Int),
    ("key_secret_env", Ty::Str),
    ("path", Ty::Str),
    ("snapshot_every", Ty::Str),
    ("tls_ca", Ty::Str),
];
const PROXY: &[(&str, Ty)] = &[
    ("listen", Ty::Str),
    ("upstream", Ty::Str),
    ("trusted_proxies", Ty::StrArray),
    ("forwarded_header", Ty::Str),
    ("timeout", Ty::Str),
    ("idle_timeout", Ty::Str),
    ("tls_cert", Ty::Str),
    ("tls_key", Ty::Str),
    ("client_ca", Ty::Str),
];
const HEADERS: &[(&str, Ty)] = &[
    ("legacy", Ty::Bool),
    ("reset_format", Ty::Str),
    ("ietf", Ty::Bool),
];
const MATCH: &[(&str, Ty)] = &[
    ("path", Ty::Str),
    ("methods", Ty::StrArray),
    ("host", Ty::Str),
];
const POLICY: &[(&str, Ty)] = &[
    ("name", Ty::Str),
    ("algorithm", Ty::Str),
    ("limit", Ty::Int),
    ("window", Ty::Str),
    ("calendar", Ty::Str),
    ("timezone", Ty::Str),
    ("capacity", Ty::Int),
    ("refill", Ty::Str),
    ("rate", Ty::Str),
    ("queue", Ty::Int),
    ("cost", Ty::Int),
    ("key", Ty::StrArray),
    ("match", Ty::Table(MATCH)),
    ("action", Ty::Str),
    ("max_delay", Ty::Str),
    ("require_key", Ty::Bool),
    ("queue_max_body", Ty::Int),
    ("queue_max_depth", Ty::Int),
    ("queue_attempts", Ty::Int),
    ("queue_backoff", Ty::Str),
    ("queue_claim_after", Ty::Str),
    ("queue_concurrency", Ty::Int),
    ("lease", Ty::Int),
    ("lease_ttl", Ty::Str),
    ("charge", Ty::Str),
    ("cost_from", Ty::Str),
    ("count_status", Ty::StrArray),
    ("ban", Ty::Table(BAN)),
];
const BAN: &[(&str, Ty)] = &[("after", Ty::Int), ("within", Ty::Str), ("for", Ty::Str)];
const LIST: &[(&str, Ty)] = &[
    ("name", Ty::Str),
    ("action", Ty::Str),
    ("ips", Ty::StrArray),
    ("keys", Ty::StrArray),
];
const JWT: &[(&str, Ty)] = &[
    ("hs256_secret_env", Ty::Str),
    ("rs256_public_key_file", Ty::Str),
    ("es256_public_key_file", Ty::Str),
];
const ENVOY: &[(&str, Ty)] = &[("config_dir", Ty::Str), ("failure_mode", Ty::Str)];
const FORWARD_AUTH: &[(&str, Ty)] = &[("trusted_proxies", Ty::StrArray)];
const TELEMETRY: &[(&str, Ty)] = &[
    ("otlp_endpoint", Ty::Str),
    ("sample_ratio", Ty::Num),
    ("service_name", Ty::Str),
];
const LOG: &[(&str, Ty)] = &[("format", Ty::Str), ("level", Ty::Str)];
const ROOT: &[(&str, Ty)] = &[
    ("server", Ty::Table(SERVER)),
    ("admin", Ty::Table(ADMIN)),
    ("store", Ty::Table(STORE)),
    ("proxy", Ty::Table(PROXY)),
    ("headers", Ty::Table(HEADERS)),
    ("policy", Ty::TableArray(POLICY)),
    ("list", Ty::TableArray(LIST)),
    ("jwt", Ty::Table(JWT)),
    ("envoy", Ty::Table(ENVOY)),
    ("forward_auth", Ty::Table(FORWARD_AUTH)),
    ("log", Ty::Table(LOG)),
    ("telemetry", Ty::Table(TELEMETRY)),
];

/// Reports TOML syntax errors, unknown fields and mistyped values; returns the document with
/// those fields removed, so the rest can still be validated (all errors at once), or `None`
/// when the syntax is broken.
pub(super) fn check<'i>(text: &'i str, errs: &mut Errors<'_>) -> Option<Spanned<DeTable<'i>>> {
    let (mut root, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        for e in syntax {
            errs.at(
                e.span().map_or(0, |s| s.start),
                format!("TOML syntax: {}", e.message().trim()),
            );
        }
        return None;
    }
    table(root.get_mut(), ROOT, "the top level", errs);
    Some(root)
}

fn table(t: &mut DeTable<'_>, fields: &[(&str, Ty)], ctx: &str, errs: &mut Errors<'_>) {
    let mut bad: Vec<String> = Vec::new();
    for (key, value) in t.iter_mut() {
        let name: &str = key.get_ref();
        match fields.iter().find(|(f, _)| *f == name) {
            Some((_, ty)) => {
                if !check_value(name, value, *ty, ctx, errs) {
                    // Dropped for its type: do not also report it as missing.
                    errs.suppress(format!("{ctx}: field \"{name}\" is required"));
                    errs.suppress(format!("{ctx} field \"{name}\" is required"));
                    bad.push(name.to_owned());
                }
            }
            None => {
                bad.push(name.to_owned());
                let known: Vec<&str> = fields.iter().map(|(f, _)| *f).collect();
                let hint = match closest(name, &known) {
                    Some(c) => format!("did you mean \"{c}\"? "),
                    None => String::new(),
                };
                errs.at(
                    key.span().start,
                    format!(
                        "unknown field \"{name}\" in {ctx}; {hint}known fields: {}",
                        known.join(", ")
                    ),
                );
            }
        }
    }
    if !bad.is_empty() {
        let old = std::mem::replace(t, DeTable::new());
        for (k, v) in old {
            if !bad.iter().any(|b| b.as_str() == k.get_ref().as_ref()) {
                t.insert(k, v);
            }
        }
    }
}

/// Checks one value; `false` when it has the wrong type and must be dropped.
fn check_value(
    name: &str,
    v: &mut Spanned<DeValue<'_>>,
    ty: Ty,
    ctx: &str,
    errs: &mut Errors<'_>,
) -> bool {
    let at = v.span().start;
    let found = v.get_ref().type_str();
    let wrong = |errs: &mut Errors<'_>, want: &str, example: &str| {
        errs.at(
            at,
            format!("field \"{name}\" in {ctx} must be {want}, not {found}; write e.g. {example}"),
        );
    };
    match (ty, v.get_mut()) {
        (Ty::Int | Ty::Num, DeValue::Integer(i)) => {
            let example = if matches!(ty, Ty::Num) { "0.5" } else { "100" };
            return saturate(name, i, at, ctx, example, errs);
        }
        (Ty::Str, DeValue::String(_)) => {}
        (Ty::Bool, DeValue::Boolean(_)) => {}
        (Ty::Num, DeValue::Float(_)) => {}
        (Ty::Num, _) => {
            wrong(errs, "a number", &format!("{name} = 0.5"));
            return false;
        }
        (Ty::Str, _) => {
            wrong(errs, "a string", &format!("{name} = \"...\""));
            return false;
        }
        (Ty::Int, _) => {
            wrong(errs, "an integer", &format!("{name} = 100"));
            return false;
        }
        (Ty::Bool, _) => {
            wrong(errs, "true or false", &format!("{name} = true"));
            return false;
        }
        (Ty::StrArray, DeValue::Array(items)) => return string_items(name, items, ctx, errs),
        (Ty::StrArray, _) => {
            wrong(errs, "an array of strings", &format!("{name} = [\"...\"]"));
            return false;
        }
        (Ty::Table(fields), DeValue::Table(t)) => {
            let ctx = if ctx == "the top level" {
                format!("[{name}]")
            } else {
                format!("{name} of {ctx}")
            };
            table(t, fields, &ctx, errs);
        }
        (Ty::Table(_), _) => {
            wrong(errs, "a table", &format!("[{name}]"));
            return false;
        }
        (Ty::TableArray(fields), DeValue::Array(items)) => {
            return table_items(name, items, fields, errs);
        }
        (Ty::TableArray(_), _) => {
            wrong(errs, "an array of tables", &format!("[[{name}]]"));
            return false;
        }
    }
    true
}

/// An integer past the 64 bits TOML holds (serde would refuse it in its own words, "invalid
/// type: integer `99999999999999999999` as i128, expected i64", naming no field) becomes the
/// nearest one that fits, which every integer field's range refuses: its check then says the
/// field and the range, with the number as written ([`Errors::shown`]). `false` (drop the
/// field) should the stand-in not be made: the message naming the field is reported then.
fn saturate(
    name: &str,
    i: &mut DeInteger<'_>,
    at: usize,
    ctx: &str,
    example: &str,
    errs: &mut Errors<'_>,
) -> bool {
    if i64::from_str_radix(i.as_str(), i.radix()).is_ok() {
        return true;
    }
    // Text, so that the stand-in lives as long as the document (`i64::MIN` and `i64::MAX`).
    let (size, nearest) = if i.as_str().starts_with('-') {
        ("small", "-9223372036854775808")
    } else {
        ("large", "9223372036854775807")
    };
    errs.too_large(
        at,
        i.to_string(),
        format!(
            "field \"{name}\" in {ctx} is {i}, a number too {size} for it (past 64 bits); \
             write e.g. {name} = {example}"
        ),
    );
    match DeValue::parse(nearest).map(Spanned::into_inner) {
        Ok(DeValue::Integer(n)) => {
            *i = n;
            true
        }
        _ => false,
    }
}

/// Every item of a string array is a string; each one that is not is reported.
fn string_items(
    name: &str,
    items: &[Spanned<DeValue<'_>>],
    ctx: &str,
    errs: &mut Errors<'_>,
) -> bool {
    let mut ok = true;
    for item in items {
        if !item.get_ref().is_str() {
            errs.at(
                item.span().start,
                format!(
                    "field \"{name}\" in {ctx} must list strings, not {}; write e.g. {name} = [\"...\"]",
                    item.get_ref().type_str()
                ),
            );
            ok = false;
        }
    }
    ok
}

/// Every entry of an array of tables (`[[policy]]`) is a table whose fields are checked, each
/// named in messages by its `name` when it has one.
fn table_items(
    name: &str,
    items: &mut [Spanned<DeValue<'_>>],
    fields: &[(&'static str, Ty)],
    errs: &mut Errors<'_>,
) -> bool {
    let mut ok = true;
    for (i, item) in items.iter_mut().enumerate() {
        let at = item.span().start;
        match item.get_mut() {
            DeValue::Table(t) => {
                let label = t
                    .get("name")
                    .and_then(|n| n.get_ref().as_str().map(|s| format!("{name} \"{s}\"")))
                    .unwrap_or_else(|| format!("[[{name}]] #{}", i + 1));
                table(t, fields, &label, errs);
            }
            _ => {
                errs.at(
                    at,
                    format!("each entry of \"{name}\" must be a table; write [[{name}]]"),
                );
                ok = false;
            }
        }
    }
    ok
}

/// The known name nearest to `name`, if it is a plausible typo.
fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The field lists above are the ones the shape check enforces; serde reads the raw structs.
/// A field added to one and not the other would either be refused before serde sees it or
/// slip past the check's type test, so this test holds the two to the same names.
#[cfg(test)]
mod tests;
