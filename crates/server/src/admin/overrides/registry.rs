//! Where overrides live and how every engine learns them: in this process with the memory
//! store (kept across reloads, since they live beside the engine, not in it), in Redis with the
//! Redis store (every instance polls a version and reloads them when it moves).
//!
//! The records are installed into each engine generation: on every change, and into a new
//! engine before a reload publishes it, under one lock, so no engine ever misses a change.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate::{CalendarUnit, Rate, StoreError, Timestamp, parse_duration};
use tollgate_http::{OverrideError, QuotaFields};
use tollgate_redis::RedisStore;

use crate::generation::Generation;
use crate::store::AnyStore;

/// The most overrides at once, over every policy: each costs a policy of its own in every
/// engine, and interned header text for each distinct quota.
pub(crate) const MAX_OVERRIDES: usize = 10_000;

/// How often an instance asks Redis whether the overrides changed.
pub(crate) const POLL: Duration = Duration::from_millis(250);

/// One override as it is stored (in memory, or as JSON in Redis) and listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Record {
    pub(crate) policy: String,
    pub(crate) key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) window: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) calendar: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) capacity: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) refill: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) queue: Option<u32>,
    /// Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires: Option<u64>,
    pub(crate) reason: String,
    /// Unix seconds of the last change.
    pub(crate) updated: u64,
}

impl Record {
    /// The quota fields, parsed (they were checked when written; a record written by another
    /// version may still fail here, and is then listed as inactive).
    pub(crate) fn fields(&self) -> Result<QuotaFields, OverrideError> {
        let bad = |field: &'static str, reason: String| OverrideError::Field { field, reason };
        let rate = |field: &'static str, text: &Option<String>| -> Result<Option<Rate>, _> {
            text.as_deref()
                .map(|t| {
                    t.parse::<Rate>()
                        .map_err(|e| bad(field, e.reason().to_owned()))
                })
                .transpose()
        };
        Ok(QuotaFields {
            limit: self.limit,
            window: self
                .window
                .as_deref()
                .map(|t| parse_duration(t).map_err(|e| bad("window", e.reason().to_owned())))
                .transpose()?,
            calendar: self
                .calendar
                .as_deref()
                .map(|t| {
                    t.parse::<CalendarUnit>()
                        .map_err(|e| bad("calendar", e.reason().to_owned()))
                })
                .transpose()?,
            capacity: self.capacity,
            refill: rate("refill", &self.refill)?,
            rate: rate("rate", &self.rate)?,
            queue: self.queue,
        })
    }

    /// When it ends, as the engine's clock counts.
    pub(crate) fn expires_at(&self) -> Option<Timestamp> {
        self.expires.map(Timestamp::from_secs)
    }

    pub(crate) fn expired(&self, unix_secs: u64) -> bool {
        self.expires.is_some_and(|end| end <= unix_secs)
    }

    /// The Redis hash field: policy names hold no control character, so the first newline
    /// ends the name.
    fn field(&self) -> String {
        field(&self.policy, &self.key)
    }
}

fn field(policy: &str, key: &str) -> String {
    format!("{policy}\n{key}")
}

/// Where the records are kept (overrides, and the lists' live entries alike).
#[derive(Debug)]
pub(crate) enum Backend {
    /// In this process.
    Memory,
    /// In Redis, for every instance.
    Redis(RedisStore),
}

impl Backend {
    /// Beside the counts: in this process with the memory store, in Redis with Redis.
    pub(crate) fn of(store: &AnyStore) -> Self {
        match store {
            AnyStore::Memory(_) => Backend::Memory,
            AnyStore::Redis(r) => Backend::Redis(r.clone()),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    records: BTreeMap<(String, String), Record>,
    /// Why a record does not apply to the running configuration (its policy is gone, or no
    /// longer fits its fields), by (policy, key).
    inactive: HashMap<(String, String), String>,
    /// The Redis version the records were read at.
    version: u64,
}

/// Every override, and the lock under which engines learn them.
#[derive(Debug)]
pub(crate) struct Registry {
    backend: Backend,
    state: Mutex<State>,
}

/// A change that could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError {
    #[error("there are {MAX_OVERRIDES} overrides already; remove some first")]
    Full,
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
        let mut state = self.lock();
        install(&mut state, engine);
        publish();
    }

    /// The records that have not expired, each with why it does not apply, if it does not.
    pub(crate) fn list(&self, unix_secs: u64) -> Vec<(Record, Option<String>)> {
        let state = self.lock();
        state
            .records
            .iter()
            .filter(|(_, r)| !r.expired(unix_secs))
            .map(|(id, r)| (r.clone(), state.inactive.get(id).cloned()))
            .collect()
    }

    /// Every record not expired at `unix_secs`, for the state file (`[store] path`).
    pub(crate) fn records(&self, unix_secs: u64) -> Vec<Record> {
        let state = self.lock();
        state
            .records
            .values()
            .filter(|r| !r.expired(unix_secs))
            .cloned()
            .collect()
    }

    /// Puts `records` from the state file back (in memory only: Redis keeps its own) and
    /// installs them into `engine`; how many.
    pub(crate) fn restore(&self, records: Vec<Record>, engine: &Generation) -> usize {
        if self.shared() {
            return 0;
        }
        let mut state = self.lock();
        let n = records.len();
        for record in records {
            state
                .records
                .insert((record.policy.clone(), record.key.clone()), record);
        }
        install(&mut state, engine);
        n
    }

    /// Sets `record` (replacing the one of its policy and key) and installs it into `current`.
    pub(crate) async fn put(
        &self,
        record: Record,
        current: impl Fn() -> std::sync::Arc<Generation>,
    ) -> Result<(), ChangeError> {
        let id = (record.policy.clone(), record.key.clone());
        {
            let state = self.lock();
            let live = state
                .records
                .values()
                .filter(|r| !r.expired(record.updated))
                .count();
            if live >= MAX_OVERRIDES && !state.records.contains_key(&id) {
                return Err(ChangeError::Full);
            }
        }
        match &self.backend {
            Backend::Memory => {
                let mut state = self.lock();
                state.records.insert(id, record);
                install(&mut state, &current());
            }
            Backend::Redis(store) => {
                let text = serde_json::to_string(&record).unwrap_or_default();
                store.put_override(&record.field(), &text).await?;
                self.refresh(store, &current).await?;
            }
        }
        Ok(())
    }

    /// Removes the override of `key` under `policy`; whether there was one.
    pub(crate) async fn delete(
        &self,
        policy: &str,
        key: &str,
        current: impl Fn() -> std::sync::Arc<Generation>,
    ) -> Result<bool, ChangeError> {
        match &self.backend {
            Backend::Memory => {
                let mut state = self.lock();
                let existed = state
                    .records
                    .remove(&(policy.to_owned(), key.to_owned()))
                    .is_some();
                install(&mut state, &current());
                Ok(existed)
            }
            Backend::Redis(store) => {
                let existed = store.delete_override(&field(policy, key), None).await?;
                self.refresh(store, &current).await?;
                Ok(existed.is_some())
            }
        }
    }

    /// Housekeeping, every [`POLL`]: with Redis, reloads the records when their version moved;
    /// in memory, drops expired ones.
    pub(crate) async fn poll(
        &self,
        unix_secs: u64,
        current: impl Fn() -> std::sync::Arc<Generation>,
    ) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Memory => {
                let mut state = self.lock();
                let before = state.records.len();
                state.records.retain(|_, r| !r.expired(unix_secs));
                if state.records.len() != before {
                    install(&mut state, &current());
                }
                Ok(())
            }
            Backend::Redis(store) => {
                let version = store.overrides_version().await?;
                if version != self.lock().version {
                    self.refresh(store, &current).await?;
                }
                // An override that expired since the last change is removed from Redis too,
                // not only no longer applied: nothing else would ever delete its field.
                let expired = self.lock().records.values().any(|r| r.expired(unix_secs));
                if expired {
                    self.drop_expired(store, unix_secs, &current).await?;
                }
                Ok(())
            }
        }
    }

    /// Reads every record from Redis and installs them.
    async fn refresh(
        &self,
        store: &RedisStore,
        current: &impl Fn() -> std::sync::Arc<Generation>,
    ) -> Result<(), StoreError> {
        let (version, pairs) = store.load_overrides().await?;
        let mut records = BTreeMap::new();
        for (field, text) in pairs {
            match serde_json::from_str::<Record>(&text) {
                Ok(r) => {
                    records.insert((r.policy.clone(), r.key.clone()), r);
                }
                Err(e) => tracing::warn!(
                    field = %field.escape_debug(),
                    error = %e,
                    "an override in Redis could not be read; it is ignored"
                ),
            }
        }
        let mut state = self.lock();
        // An older read finishing after a newer one changes nothing; a Redis without the
        // version (it lost its data: a restart without persistence, a flush) is read as it is.
        if version > 0 && version < state.version {
            return Ok(());
        }
        state.version = version;
        state.records = records;
        install(&mut state, &current());
        Ok(())
    }

    /// Removes expired records from Redis, each only if it is still the expired one (another
    /// instance may have just set it again), then from this instance (a removal that failed is
    /// tried again at the next poll).
    async fn drop_expired(
        &self,
        store: &RedisStore,
        unix_secs: u64,
        current: &impl Fn() -> std::sync::Arc<Generation>,
    ) -> Result<(), StoreError> {
        let expired: Vec<Record> = self
            .lock()
            .records
            .values()
            .filter(|r| r.expired(unix_secs))
            .cloned()
            .collect();
        for r in &expired {
            let text = serde_json::to_string(r).unwrap_or_default();
            store.delete_override(&r.field(), Some(&text)).await?;
        }
        let mut state = self.lock();
        for r in &expired {
            let id = (r.policy.clone(), r.key.clone());
            if state.records.get(&id) == Some(r) {
                state.records.remove(&id);
            }
        }
        install(&mut state, &current());
        Ok(())
    }
}

/// Compiles every record that has not expired against `engine` and installs them; the others
/// are noted as inactive, with why.
fn install(state: &mut State, engine: &Generation) {
    let now = crate::admin::top::unix_secs();
    let mut compiled = Vec::with_capacity(state.records.len());
    let mut inactive = HashMap::new();
    for (id, record) in &state.records {
        if record.expired(now) {
            continue;
        }
        let made = record.fields().and_then(|fields| {
            engine
                .http()
                .compile_override(&record.policy, &fields, record.expires_at())
        });
        match made {
            Ok(over) => compiled.push((Box::<[u8]>::from(record.key.as_bytes()), over)),
            Err(OverrideError::UnknownPolicy) => {
                inactive.insert(
                    id.clone(),
                    "the running configuration has no such policy".to_owned(),
                );
            }
            Err(e) => {
                inactive.insert(
                    id.clone(),
                    format!("does not fit the policy as configured now: {e}"),
                );
            }
        }
    }
    engine.http().set_overrides(compiled);
    state.inactive = inactive;
}
