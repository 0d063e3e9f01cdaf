//! Live entries of allow and deny lists kept in Redis for every instance, as overrides are: one
//! hash per list, `<prefix>:{lists}:<name>` (a field per entry, its record as the caller writes
//! it), and one hash of versions, `<prefix>:{lists}:versions` (a field per list, moved on by
//! every change in the same script). All share the hash tag, so in a Cluster they live in one
//! slot and each script is atomic.
//!
//! Instances poll the versions (one `HGETALL` of a few fields, a few times a second) and reload
//! only the lists whose version moved: a change reaches every instance within one poll, and
//! decisions never wait for Redis to learn about lists.

use std::collections::HashMap;

use redis::{RedisError, Script, Value};
use tollgate::StoreError;

use super::RedisStore;
use super::connection::classify;

/// Sets one entry unless the list holds `ARGV[4]` entries already; moves the list's version
/// on (`next_version!`). Answers the new version, or -1 when the list is full.
const PUT: &str = concat!(
    "if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0
  and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then return -1 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')\n",
    next_version!(),
    "redis.call('HSET', KEYS[2], ARGV[1], string.format('%d', v))
return v"
);

/// Removes one entry (when `ARGV[3]` is given, only while it still holds that value); moves
/// the list's version on as [`PUT`] does and answers it when an entry was removed, else 0.
const DELETE: &str = concat!(
    "local current = redis.call('HGET', KEYS[1], ARGV[2])
if not current or (ARGV[3] and current ~= ARGV[3]) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')\n",
    next_version!(),
    "redis.call('HSET', KEYS[2], ARGV[1], string.format('%d', v))
return v"
);

/// One list's version and entries, read together.
const LOAD: &str =
    "return {redis.call('HGET', KEYS[2], ARGV[1]) or '0', redis.call('HGETALL', KEYS[1])}";

/// What a list change came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListChange {
    /// Done: the list's new version.
    Done(u64),
    /// Nothing to do: the entry was not there (a delete), or the list is full (a put).
    Refused,
}

impl RedisStore {
    fn list_keys(&self, list: &str) -> [String; 2] {
        let prefix = &self.inner.config.key_prefix;
        [
            format!("{prefix}:{{lists}}:{list}"),
            format!("{prefix}:{{lists}}:versions"),
        ]
    }

    /// Sets `entry` of list `list` to `value` for every instance, unless the list holds `max`
    /// entries already and this is not one of them.
    pub async fn put_list_entry(
        &self,
        list: &str,
        entry: &str,
        value: &str,
        max: usize,
    ) -> Result<ListChange, StoreError> {
        let [hash, versions] = self.list_keys(list);
        self.bounded(async {
            let mut conn = self.inner.connection.get().await?;
            let reply: Result<i64, RedisError> = Script::new(PUT)
                .key(hash)
                .key(versions)
                .arg(list)
                .arg(entry)
                .arg(value)
                .arg(max)
                .invoke_async(&mut conn)
                .await;
            reply
                .map(|v| u64::try_from(v).map_or(ListChange::Refused, ListChange::Done))
                .map_err(classify)
        })
        .await
    }

    /// Removes `entry` of list `list` for every instance (with `only_if`, only while its value
    /// is still that: an expired entry is not removed after someone set it again).
    pub async fn delete_list_entry(
        &self,
        list: &str,
        entry: &str,
        only_if: Option<&str>,
    ) -> Result<ListChange, StoreError> {
        let [hash, versions] = self.list_keys(list);
        self.bounded(async {
            let mut conn = self.inner.connection.get().await?;
            let script = Script::new(DELETE);
            let mut call = script.key(hash);
            call.key(versions).arg(list).arg(entry);
            if let Some(value) = only_if {
                call.arg(value);
            }
            let reply: Result<u64, RedisError> = call.invoke_async(&mut conn).await;
            reply
                .map(|v| {
                    if v > 0 {
                        ListChange::Done(v)
                    } else {
                        ListChange::Refused
                    }
                })
                .map_err(classify)
        })
        .await
    }

    /// Every list's version (a list never changed has none).
    pub async fn list_versions(&self) -> Result<HashMap<String, u64>, StoreError> {
        let [_, versions] = self.list_keys("");
        self.bounded(async {
            let mut conn = self.inner.connection.get().await?;
            let mut cmd = redis::cmd("HGETALL");
            cmd.arg(versions);
            let reply = conn.query(cmd).await.map_err(classify)?;
            let pairs: HashMap<String, u64> =
                redis::from_redis_value(reply).map_err(|_| StoreError::Protocol {
                    reason: "the list versions are not numbers".to_owned(),
                })?;
            Ok(pairs)
        })
        .await
    }

    /// List `list`'s entries (entry, value) with the version they are at, read atomically.
    pub async fn load_list(&self, list: &str) -> Result<(u64, Vec<(String, String)>), StoreError> {
        let [hash, versions] = self.list_keys(list);
        let reply = self
            .bounded(async {
                let mut conn = self.inner.connection.get().await?;
                let reply: Result<Value, RedisError> = Script::new(LOAD)
                    .key(hash)
                    .key(versions)
                    .arg(list)
                    .invoke_async(&mut conn)
                    .await;
                reply.map_err(classify)
            })
            .await?;
        super::overrides::versioned_pairs(reply, "list")
    }
}
