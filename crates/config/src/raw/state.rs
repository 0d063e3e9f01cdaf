//! `[store] path` and `snapshot_every`: the memory store kept on disk across restarts. Only the
//! memory store has them (Redis keeps its own state).

use std::time::Duration;

use super::fields::duration;
use super::{Errors, RawStore};
use crate::{StoreConfig, StoreKind};

/// How often the state is written while running, by default.
pub(crate) const DEFAULT_SNAPSHOT_EVERY: Duration = Duration::from_secs(10);

/// The shortest `snapshot_every`: a snapshot of a million keys takes a good part of a second.
const MIN_SNAPSHOT_EVERY: Duration = Duration::from_secs(1);

/// Applies `path` and `snapshot_every` to `out`; false when one was refused.
pub(super) fn validate(s: &RawStore, out: &mut StoreConfig, errs: &mut Errors<'_>) -> bool {
    let ctx = "[store] ";
    let mut ok = true;
    if out.kind == StoreKind::Redis {
        for (field, v) in [("path", &s.path), ("snapshot_every", &s.snapshot_every)] {
            if let Some(v) = v {
                errs.at(
                    v.span().start,
                    format!(
                        "[store] field \"{field}\" applies only to kind = \"memory\": Redis keeps \
                         its own state; remove it"
                    ),
                );
                ok = false;
            }
        }
        return ok;
    }
    if let Some(v) = &s.path {
        let text = v.get_ref().trim();
        if text.is_empty() || text.ends_with('/') {
            errs.at(
                v.span().start,
                "[store] field \"path\" names the state file, not a folder; write e.g. path = \
                 \"/var/lib/tollgate/state\""
                    .to_owned(),
            );
            ok = false;
        } else {
            // Relative to the configuration's folder, as every path the file names: the working
            // directory of a service (`/` under systemd) is no place for state.
            let path = errs.relative(text);
            // A folder that exists already where the file should be: said here, with the line,
            // rather than when the server starts.
            if path.is_dir() {
                errs.at(
                    v.span().start,
                    format!(
                        "[store] field \"path\": {} is a folder; name the state file in it, e.g. \
                         path = \"{}\"",
                        path.display(),
                        std::path::Path::new(text).join("state").display()
                    ),
                );
                ok = false;
            } else {
                out.path = Some(path);
            }
        }
    }
    if let Some(v) = &s.snapshot_every {
        if s.path.is_none() {
            errs.at(
                v.span().start,
                "[store] field \"snapshot_every\" needs path, the file the state is written to; \
                 add e.g. path = \"/var/lib/tollgate/state\""
                    .to_owned(),
            );
            ok = false;
        }
        match duration(v, "snapshot_every", ctx, errs) {
            Some(d) if d < MIN_SNAPSHOT_EVERY => {
                errs.at(
                    v.span().start,
                    "[store] field \"snapshot_every\" must be at least 1s; write e.g. \
                     snapshot_every = \"10s\""
                        .to_owned(),
                );
                ok = false;
            }
            Some(d) => out.snapshot_every = d,
            None => ok = false,
        }
    }
    ok
}
