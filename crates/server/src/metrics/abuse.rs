//! Lockouts' and lists' metrics: bans started by each policy (counted where the decision was
//! made, once, for every door), bans in force by policy (read from the store at each scrape:
//! with Redis, the whole deployment's), and requests each allow or deny list decided.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::{Sharded, escape_label};

/// The counters of lockouts and lists.
#[derive(Debug, Default)]
pub(crate) struct AbuseCounters {
    /// Bans started, by policy: rare, so a lock is fine.
    bans_started: Mutex<BTreeMap<String, u64>>,
    /// Requests decided by each list, by name, with its action: resolved once per engine.
    lists: RwLock<HashMap<String, (&'static str, Arc<Sharded<1>>)>>,
}

impl AbuseCounters {
    /// Counts a ban that `policy` started.
    pub(crate) fn ban_started(&self, policy: &str) {
        let mut map = self
            .bans_started
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *map.entry(policy.to_owned()).or_insert(0) += 1;
    }

    /// The counter of list `name` (action `action`), created on first use.
    pub(crate) fn list_counter(&self, name: &str, action: &'static str) -> Arc<Sharded<1>> {
        match self.lists.write() {
            Ok(mut map) => {
                let entry = map
                    .entry(name.to_owned())
                    .or_insert_with(|| (action, Arc::default()));
                entry.0 = action;
                Arc::clone(&entry.1)
            }
            Err(_) => Arc::default(),
        }
    }

    pub(super) fn render(&self, out: &mut String) {
        out.push_str(
            "# HELP tollgate_bans_started_total Bans started, by policy.\n\
             # TYPE tollgate_bans_started_total counter\n",
        );
        let started = self
            .bans_started
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (policy, n) in started.iter() {
            let _ = writeln!(
                out,
                "tollgate_bans_started_total{{policy=\"{}\"}} {n}",
                escape_label(policy)
            );
        }
        drop(started);
        out.push_str(
            "# HELP tollgate_list_matches_total Requests an allow list let through uncounted or a \
             deny list refused, by list.\n# TYPE tollgate_list_matches_total counter\n",
        );
        if let Ok(map) = self.lists.read() {
            let mut names: Vec<&String> = map.keys().collect();
            names.sort();
            for name in names {
                if let Some((action, c)) = map.get(name) {
                    let _ = writeln!(
                        out,
                        "tollgate_list_matches_total{{list=\"{}\",action=\"{action}\"}} {}",
                        escape_label(name),
                        c.get(0)
                    );
                }
            }
        }
    }
}

/// `tollgate_bans_active`, by policy, as the store counts them now (nothing when it could not).
pub(crate) fn render_bans_active(out: &mut String, counts: &Option<Vec<(String, u64)>>) {
    let Some(counts) = counts else {
        return;
    };
    out.push_str(
        "# HELP tollgate_bans_active Bans in force, by policy (with Redis, every instance's).\n\
         # TYPE tollgate_bans_active gauge\n",
    );
    for (policy, n) in counts {
        let _ = writeln!(
            out,
            "tollgate_bans_active{{policy=\"{}\"}} {n}",
            escape_label(policy)
        );
    }
}
