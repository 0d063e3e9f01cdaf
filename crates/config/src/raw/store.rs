//! `[store]`: which store keeps the counters (memory or Redis), how it is reached, and what a
//! decision does when it fails.

use std::time::Duration;

use super::fields::{count, duration, one_of};
use super::{Errors, RawStore, S};
use crate::{OnError, Secret, StoreClock, StoreConfig, StoreKind};

/// The store with no `[store]` table: in memory, failing open.
pub(crate) fn default_store() -> StoreConfig {
    StoreConfig {
        kind: StoreKind::Memory,
        url: None,
        cluster: false,
        nodes: Vec::new(),
        timeout: Duration::from_millis(50),
        on_error: OnError::Allow,
        clock: StoreClock::Redis,
        max_keys: None,
        key_secret: None,
        path: None,
        snapshot_every: super::state::DEFAULT_SNAPSHOT_EVERY,
        tls_ca: None,
    }
}

/// `[store]`: the default store with each given field applied.
pub(super) fn validate(raw: Option<RawStore>, errs: &mut Errors<'_>) -> Option<StoreConfig> {
    let mut out = default_store();
    let Some(s) = raw else {
        return Some(out);
    };
    let ctx = "[store] ";
    let mut ok = true;
    if let Some(v) = &s.kind {
        match one_of(v, "kind", ctx, &[("memory", true), ("redis", false)], errs) {
            Some(true) => out.kind = StoreKind::Memory,
            Some(false) => out.kind = StoreKind::Redis,
            None => ok = false,
        }
    }
    ok &= redis_urls(&s, &mut out, errs);
    out.cluster = s.cluster.as_ref().is_some_and(|c| *c.get_ref());
    if let Some(v) = &s.timeout {
        match duration(v, "timeout", ctx, errs) {
            Some(d) if d.is_zero() => {
                errs.at(
                    v.span().start,
                    "[store] field \"timeout\" must be positive; write e.g. timeout = \"50ms\""
                        .to_owned(),
                );
                ok = false;
            }
            Some(d) => out.timeout = d,
            None => ok = false,
        }
    }
    if let Some(v) = &s.on_error {
        match one_of(
            v,
            "on_error",
            ctx,
            &[
                ("allow", OnError::Allow),
                ("deny", OnError::Deny),
                ("local", OnError::Local),
            ],
            errs,
        ) {
            Some(OnError::Local) if out.kind == StoreKind::Memory => {
                errs.at(
                    v.span().start,
                    "[store] field \"on_error\" = \"local\" falls back to a memory store when Redis fails, and this store is memory, which never fails: remove it, or set kind = \"redis\"".to_owned(),
                );
                ok = false;
            }
            Some(o) => out.on_error = o,
            None => ok = false,
        }
    }
    if let Some(v) = &s.clock {
        match one_of(
            v,
            "clock",
            ctx,
            &[("redis", StoreClock::Redis), ("local", StoreClock::Local)],
            errs,
        ) {
            Some(c) => out.clock = c,
            None => ok = false,
        }
    }
    if let Some(v) = &s.max_keys {
        match count(v, "max_keys", ctx, 1, errs) {
            Some(n) => out.max_keys = usize::try_from(n).ok(),
            None => ok = false,
        }
    }
    if let Some(v) = &s.key_secret_env {
        match key_secret(v, errs) {
            Some(secret) => out.key_secret = Some(secret),
            None => ok = false,
        }
    }
    ok &= super::state::validate(&s, &mut out, errs);
    ok &= tls_ca(&s, &mut out, errs);
    ok &= redis_server(&s, &out, ok, errs);
    ok.then_some(out)
}

/// `url` and `nodes`: Redis URLs (`redis://` or `rediss://`); false when one is not.
fn redis_urls(s: &RawStore, out: &mut StoreConfig, errs: &mut Errors<'_>) -> bool {
    let mut ok = true;
    if let Some(v) = &s.url {
        let u = v.get_ref();
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            errs.at(
                v.span().start,
                format!("[store] field \"url\": {u:?} is not a Redis URL; write e.g. url = \"redis://127.0.0.1:6379\" (rediss:// for TLS)"),
            );
            ok = false;
        }
        out.url = Some(u.clone());
    }
    for n in s.nodes.iter().flatten() {
        let u = n.get_ref();
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            errs.at(
                n.span().start,
                format!("[store] field \"nodes\": {u:?} is not a Redis URL; write e.g. nodes = [\"redis://10.0.0.1:7000\"]"),
            );
            ok = false;
        }
        out.nodes.push(u.clone());
    }
    ok
}

/// `tls_ca`: a PEM file of CA certificates (relative to the configuration's folder) for a
/// Redis reached over TLS, every URL `rediss://`; false when refused.
fn tls_ca(s: &RawStore, out: &mut StoreConfig, errs: &mut Errors<'_>) -> bool {
    let Some(v) = &s.tls_ca else {
        return true;
    };
    let tls = out
        .url
        .iter()
        .chain(&out.nodes)
        .all(|u| u.starts_with("rediss://"));
    if out.kind != StoreKind::Redis || (out.url.is_none() && out.nodes.is_empty()) || !tls {
        errs.at(
            v.span().start,
            "[store] field \"tls_ca\" is the CA of a Redis reached over TLS: it needs kind = \
             \"redis\" and rediss:// URLs (url = \"rediss://redis.internal:6380\")"
                .to_owned(),
        );
        return false;
    }
    match crate::tls::ca_pem(&errs.relative(v.get_ref()), "tls_ca") {
        Ok(pem) => {
            out.tls_ca = Some(pem);
            true
        }
        Err(e) => {
            errs.at(v.span().start, format!("[store] {e}"));
            false
        }
    }
}

/// `key_secret_env`: the environment variable that holds the secret keying credential digests
/// in the store, at least [`Secret::MIN_LEN`] bytes.
fn key_secret(v: &S<String>, errs: &mut Errors<'_>) -> Option<Secret> {
    let name = v.get_ref();
    match std::env::var(name) {
        Ok(secret) if secret.len() >= Secret::MIN_LEN => Some(Secret::new(secret.into_bytes())),
        Ok(secret) if !secret.is_empty() => {
            errs.at(
                v.span().start,
                format!(
                    "[store] field \"key_secret_env\": the environment variable {name:?} holds {} bytes; use at least {}, e.g. export {name}=$(openssl rand -hex 32)",
                    secret.len(),
                    Secret::MIN_LEN
                ),
            );
            None
        }
        _ => {
            errs.at(
                v.span().start,
                format!(
                    "[store] field \"key_secret_env\": the environment variable {name:?} is not set (or empty); export it before starting tollgate, e.g. export {name}=$(openssl rand -hex 32)"
                ),
            );
            None
        }
    }
}

/// A Redis store names a server, and its settings make a valid Redis configuration (checked
/// only when the fields were valid on their own, `fields_ok`).
fn redis_server(s: &RawStore, out: &StoreConfig, fields_ok: bool, errs: &mut Errors<'_>) -> bool {
    let mut ok = true;
    if fields_ok
        && out.kind == StoreKind::Redis
        && (out.url.is_some() || !out.nodes.is_empty())
        && let Err(e) = out.redis_config().validate()
    {
        let at = s
            .url
            .as_ref()
            .map(|v| v.span().start)
            .or_else(|| s.kind.as_ref().map(|k| k.span().start))
            .unwrap_or(0);
        errs.at(
            at,
            format!("[store]: {e}; write e.g. url = \"redis://127.0.0.1:6379\""),
        );
        ok = false;
    }
    if out.kind == StoreKind::Memory {
        // A Redis server named for a memory store would be silently unused: every instance
        // would count alone while its operator believes the counts are shared.
        let named = s
            .url
            .as_ref()
            .map(|v| ("url", v.span().start))
            .or_else(|| {
                s.nodes
                    .iter()
                    .flatten()
                    .next()
                    .map(|n| ("nodes", n.span().start))
            })
            .or_else(|| {
                s.cluster
                    .as_ref()
                    .filter(|c| *c.get_ref())
                    .map(|c| ("cluster", c.span().start))
            });
        if let Some((field, at)) = named {
            let default = if s.kind.is_none() {
                " (the default)"
            } else {
                ""
            };
            errs.at(
                at,
                format!(
                    "[store] field \"{field}\" is for a Redis store, and this store is \"memory\"{default}, which would not use it: add kind = \"redis\" to share the counts through Redis, or remove {field}"
                ),
            );
            ok = false;
        }
    }
    if out.kind == StoreKind::Redis && out.url.is_none() && out.nodes.is_empty() {
        let at = s.kind.as_ref().map_or(0, |k| k.span().start);
        errs.at(at, "[store] kind = \"redis\" needs a server: write url = \"redis://127.0.0.1:6379\" (or nodes = [...] for a cluster)".to_owned());
        ok = false;
    }
    ok
}
