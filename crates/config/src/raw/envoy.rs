//! `[envoy]`: the folder of envoyproxy/ratelimit YAML files Envoy's rate limit service answers
//! from, and what it answers when the store fails.

use super::{Errors, RawEnvoy, S};
use crate::{Envoy, OnError, StoreConfig};

/// `[envoy]` (`Some(None)` when absent, `None` when refused), and whether it agrees with
/// `[server] grpc_listen`: each needs the other, unless `--envoy-config` supplies the
/// descriptors (`envoy_dir_given`).
pub(super) fn validate_section(
    raw: Option<S<RawEnvoy>>,
    grpc_listen: Option<&S<String>>,
    envoy_dir_given: bool,
    store: Option<&StoreConfig>,
    errs: &mut Errors<'_>,
) -> (Option<Option<Envoy>>, bool) {
    let Some(e) = raw else {
        if let Some(g) = grpc_listen.filter(|_| !envoy_dir_given) {
            errs.at(g.span().start, "[server] grpc_listen serves Envoy's rate limit service, which needs its descriptors: add [envoy] config_dir = \"ratelimit\" (a folder of envoyproxy/ratelimit YAML files)".to_owned());
            return (Some(None), false);
        }
        return (Some(None), true);
    };
    let at = e.span().start;
    let mut ok = true;
    if grpc_listen.is_none() {
        errs.at(
            at,
            "[envoy] needs [server] grpc_listen, e.g. grpc_listen = \"127.0.0.1:8081\"".to_owned(),
        );
        ok = false;
    }
    (validate(at, e.into_inner(), store, errs).map(Some), ok)
}

/// `config_dir` loaded and compiled once, so a descriptor error surfaces with the file.
fn validate(
    at: usize,
    e: RawEnvoy,
    store: Option<&StoreConfig>,
    errs: &mut Errors<'_>,
) -> Option<Envoy> {
    let Some(dir) = e.config_dir else {
        errs.at(at, "[envoy] field \"config_dir\" is required; write e.g. config_dir = \"ratelimit\" (a folder of envoyproxy/ratelimit YAML files, relative to this file)".to_owned());
        return None;
    };
    let path = errs.relative(dir.get_ref());
    let read_from = crate::WatchedFiles::envoy_folder(&path);
    let domains = match tollgate_envoy::load_envoy_config_dir(&path) {
        Ok(d) => d,
        Err(err) => {
            errs.at(
                dir.span().start,
                format!("[envoy] field \"config_dir\": {err}"),
            );
            return None;
        }
    };
    let failure_mode = match &e.failure_mode {
        Some(v) => match tollgate_envoy::parse_failure_mode(v.get_ref()) {
            Ok(m) => m,
            Err(reason) => {
                errs.at(
                    v.span().start,
                    format!("[envoy] field \"failure_mode\": {reason}"),
                );
                return None;
            }
        },
        // The one failure rule of every door, unless Envoy's own setting says otherwise.
        None => store.map_or(OnError::Allow, |s| s.on_error),
    };
    // Compile once now, so descriptor errors surface in `validate`.
    if let Err(err) = tollgate_envoy::Config::new()
        .domains(domains.clone())
        .validate()
    {
        errs.at(
            dir.span().start,
            format!("[envoy] field \"config_dir\": {err}"),
        );
        return None;
    }
    Some(Envoy {
        config_dir: path,
        domains,
        failure_mode,
        read_from,
    })
}
