//! Where the live entries of allow and deny lists live and how every engine learns them, as
//! overrides do: in this process with the memory store (kept across reloads, since they live
//! beside the engine, not in it), in Redis with the Redis store (every instance polls the lists'
//! versions and reloads a list whose version moved).
//!
//! The entries are installed into each engine generation: on every change, and into a new
//! engine before a reload publishes it, under one lock, so no engine ever misses a change.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use tollgate::StoreError;
use tollgate_http::ListEntry;
use tollgate_redis::{ListChange, RedisStore};

use crate::generation::Generation;

/// The most live entries one list holds: each costs a node of the list's trie or a key in its
/// table, in every engine of every instance.
pub(crate) const MAX_LIVE_ENTRIES: usize = 100_000;

/// One live entry as it is stored (in memory, or as JSON in Redis) and listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Record {
    pub(crate) list: String,
    /// The entry, as [`ListEntry`] writes it (a network with its prefix length, or a key).
    pub(crate) entry: String,
    pub(crate) reason: String,
    /// Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires: Option<u64>,
    /// Unix seconds of the last change.
    pub(crate) updated: u64,
}

impl Record {
    pub(crate) fn expired(&self, unix_secs: u64) -> bool {
        self.expires.is_some_and(|end| end <= unix_secs)
    }
}

pub(crate) use crate::admin::overrides::registry::Backend;

type Id = (String, String);

#[derive(Debug, Default)]
struct State {
    records: BTreeMap<Id, Record>,
    /// The Redis version each list's records were read at.
    versions: HashMap<String, u64>,
}

/// Every live entry, and the lock under which engines learn them.
#[derive(Debug)]
pub(crate) struct Registry {
    backend: Backend,
    state: Mutex<State>,
}

/// A change that could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError {
    #[error("list \"{0}\" holds {MAX_LIVE_ENTRIES} live entries already; remove some first")]
    Full(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Registry {
    pub(crate) fn new(backend: Backend) -> Self {
        Registry {
            backend,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether they are shared through Redis.
    pub(crate) fn shared(&self) -> bool {
        matches!(self.backend, Backend::Redis(_))
    }

    /// Installs the records into `engine`, then runs `publish` (which makes `engine` the one
    /// requests use) before any change can slip in between.
    pub(crate) fn install_then(&self, engine: &Generation, publish: impl FnOnce()) {
        let state = self.lock();
        install(&state, engine);
        publish();
    }

    /// The records that have not expired.
    pub(crate) fn list(&self, unix_secs: u64) -> Vec<Record> {
        self.lock()
            .records
            .values()
            .filter(|r| !r.expired(unix_secs))
            .cloned()
            .collect()
    }

    /// Puts `records` from the state file back (in memory only: Redis keeps its own) and
    /// installs them into `engine`.
    pub(crate) fn restore(&self, records: Vec<Record>, engine: &Generation) {
        if self.shared() {
            return;
        }
        let mut state = self.lock();
        for record in records {
            let id = (record.list.clone(), record.entry.clone());
            state.records.insert(id, record);
        }
        install(&state, engine);
    }

    /// Sets `record` (replacing the same entry of its list) and installs it into `current`;
    /// whether the entry was there already.
    pub(crate) async fn put(
        &self,
        record: Record,
        current: impl Fn() -> Arc<Generation>,
    ) -> Result<bool, ChangeError> {
        let id = (record.list.clone(), record.entry.clone());
        let existed = {
            let state = self.lock();
            let live = state
                .records
                .values()
                .filter(|r| r.list == record.list && !r.expired(record.updated))
                .count();
            let existed = state.records.contains_key(&id);
            if live >= MAX_LIVE_ENTRIES && !existed {
                return Err(ChangeError::Full(record.list));
            }
            existed
        };
        match &self.backend {
            Backend::Memory => {
                let mut state = self.lock();
                state.records.insert(id, record);
                install(&state, &current());
            }
            Backend::Redis(store) => {
                let text = serde_json::to_string(&record).unwrap_or_default();
                let change = store
                    .put_list_entry(&record.list, &record.entry, &text, MAX_LIVE_ENTRIES)
                    .await?;
                let ListChange::Done(version) = change else {
                    return Err(ChangeError::Full(record.list));
                };
                self.applied(
                    store,
                    &record.list,
                    version,
                    Some((id, record.clone())),
                    &current,
                )
                .await?;
            }
        }
        Ok(existed)
    }

    /// Removes `entry` of `list`; whether it was there.
    pub(crate) async fn delete(
        &self,
        list: &str,
        entry: &str,
        current: impl Fn() -> Arc<Generation>,
    ) -> Result<bool, ChangeError> {
        let id = (list.to_owned(), entry.to_owned());
        match &self.backend {
            Backend::Memory => {
                let mut state = self.lock();
                let existed = state.records.remove(&id).is_some();
                install(&state, &current());
                Ok(existed)
            }
            Backend::Redis(store) => match store.delete_list_entry(list, entry, None).await? {
                ListChange::Done(version) => {
                    self.applied_removal(store, list, version, id, &current)
                        .await?;
                    Ok(true)
                }
                ListChange::Refused => Ok(false),
            },
        }
    }

    /// After this instance changed `list` in Redis to `version`: when nobody else changed it
    /// since this instance last read it, the change is applied here without reading the list
    /// again; otherwise the list is read again.
    async fn applied(
        &self,
        store: &RedisStore,
        list: &str,
        version: u64,
        set: Option<(Id, Record)>,
        current: &impl Fn() -> Arc<Generation>,
    ) -> Result<(), StoreError> {
        {
            let mut state = self.lock();
            let known = state.versions.get(list).copied().unwrap_or(0);
            if version == known + 1 {
                state.versions.insert(list.to_owned(), version);
                if let Some((id, record)) = set {
                    state.records.insert(id, record);
                }
                install(&state, &current());
                return Ok(());
            }
        }
        self.refresh(store, list, current).await
    }

    async fn applied_removal(
        &self,
        store: &RedisStore,
        list: &str,
        version: u64,
        id: Id,
        current: &impl Fn() -> Arc<Generation>,
    ) -> Result<(), StoreError> {
        {
            let mut state = self.lock();
            let known = state.versions.get(list).copied().unwrap_or(0);
            if version == known + 1 {
                state.versions.insert(list.to_owned(), version);
                state.records.remove(&id);
                install(&state, &current());
                return Ok(());
            }
        }
        self.refresh(store, list, current).await
    }

    /// Housekeeping, every poll: with Redis, reloads the lists whose version moved and removes
    /// expired entries; in memory, drops expired ones. Either way an entry stops applying within
    /// one poll of its expiry.
    pub(crate) async fn poll(
        &self,
        unix_secs: u64,
        current: impl Fn() -> Arc<Generation>,
    ) -> Result<(), StoreError> {
        let expired = {
            let state = self.lock();
            state.records.values().any(|r| r.expired(unix_secs))
        };
        match &self.backend {
            Backend::Memory => {
                if expired {
                    let mut state = self.lock();
                    state.records.retain(|_, r| !r.expired(unix_secs));
                    install(&state, &current());
                }
                Ok(())
            }
            Backend::Redis(store) => {
                let versions = store.list_versions().await?;
                let moved: Vec<String> = {
                    let state = self.lock();
                    let mut moved: Vec<String> = versions
                        .iter()
                        .filter(|(list, v)| state.versions.get(*list) != Some(v))
                        .map(|(list, _)| list.clone())
                        .collect();
                    // A list Redis no longer knows (its data was flushed) is read again: empty.
                    moved.extend(
                        state
                            .versions
                            .keys()
                            .filter(|l| !versions.contains_key(*l))
                            .cloned(),
                    );
                    moved
                };
                for list in moved {
                    self.refresh(store, &list, &current).await?;
                }
                if expired {
                    self.drop_expired(store, unix_secs, &current).await?;
                }
                Ok(())
            }
        }
    }

    /// Reads list `list` from Redis and installs it.
    async fn refresh(
        &self,
        store: &RedisStore,
        list: &str,
        current: &impl Fn() -> Arc<Generation>,
    ) -> Result<(), StoreError> {
        let (version, pairs) = store.load_list(list).await?;
        let mut records = Vec::with_capacity(pairs.len());
        for (field, text) in pairs {
            match serde_json::from_str::<Record>(&text) {
                Ok(r) if r.list == list && r.entry == field => records.push(r),
                _ => tracing::warn!(
                    list = %list.escape_debug(),
                    entry = %field.escape_debug(),
                    "a list entry in Redis could not be read; it is ignored"
                ),
            }
        }
        let mut state = self.lock();
        // An older read finishing after a newer one changes nothing (a flushed Redis, whose
        // version is 0 again, is read as it is).
        if version > 0 && state.versions.get(list).is_some_and(|&v| version < v) {
            return Ok(());
        }
        if version == 0 {
            state.versions.remove(list);
        } else {
            state.versions.insert(list.to_owned(), version);
        }
        state.records.retain(|(l, _), _| l != list);
        for r in records {
            state.records.insert((r.list.clone(), r.entry.clone()), r);
        }
        install(&state, &current());
        Ok(())
    }

    /// Removes expired entries from Redis, each only if it is still the expired one (another
    /// instance may have just set it again); installs what is left here at once.
    async fn drop_expired(
        &self,
        store: &RedisStore,
        unix_secs: u64,
        current: &impl Fn() -> Arc<Generation>,
    ) -> Result<(), StoreError> {
        let expired: Vec<Record> = {
            let mut state = self.lock();
            let expired = state
                .records
                .values()
                .filter(|r| r.expired(unix_secs))
                .cloned()
                .collect();
            state.records.retain(|_, r| !r.expired(unix_secs));
            install(&state, &current());
            expired
        };
        for r in expired {
            let text = serde_json::to_string(&r).unwrap_or_default();
            store
                .delete_list_entry(&r.list, &r.entry, Some(&text))
                .await?;
        }
        Ok(())
    }
}

/// Installs every record that has not expired into `engine` (records of a list it does not
/// have, or that no longer parse, are left out).
fn install(state: &State, engine: &Generation) {
    let now = crate::admin::top::unix_secs();
    let entries = state
        .records
        .values()
        .filter(|r| !r.expired(now))
        .filter_map(|r| Some((r.list.clone(), ListEntry::parse(&r.entry).ok()?)))
        .collect();
    engine.http().set_live_list_entries(entries);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(list: &str, n: usize) -> Record {
        Record {
            list: list.to_owned(),
            entry: format!("10.{}.{}.{}/32", n >> 16, (n >> 8) & 255, n & 255),
            reason: "test".to_owned(),
            expires: None,
            updated: 1,
        }
    }

    #[tokio::test]
    async fn a_full_list_refuses_a_new_entry_and_expired_ones_do_not_count() {
        let registry = Registry::new(Backend::Memory);
        {
            let mut state = registry.lock();
            for n in 0..MAX_LIVE_ENTRIES {
                let r = record("blocked", n);
                state.records.insert((r.list.clone(), r.entry.clone()), r);
            }
        }
        // Refused before any engine is asked for: no generation is needed to say so.
        let full = registry
            .put(record("blocked", MAX_LIVE_ENTRIES), || {
                panic!("a refused change installs nothing")
            })
            .await;
        match full {
            Err(ChangeError::Full(list)) => assert_eq!(list, "blocked"),
            other => panic!("{other:?}"),
        }
        let message = ChangeError::Full("blocked".into()).to_string();
        assert!(message.contains("100000"), "{message}");
        // Expired entries do not count.
        registry
            .lock()
            .records
            .values_mut()
            .take(1)
            .for_each(|r| r.expires = Some(1));
        assert_eq!(registry.list(2).len(), MAX_LIVE_ENTRIES - 1);
    }
}
