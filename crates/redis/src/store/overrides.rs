//! Per-key overrides kept in Redis for every instance: one hash, `<prefix>:{overrides}` (a
//! field per override, its text as the caller writes it), and a version,
//! `<prefix>:{overrides}:version`, that every change moves on in the same script. Both share
//! the hash tag, so in a Cluster they live in one slot and each script is atomic.
//!
//! Instances poll the version (one `GET`, a few times a second) and reload the hash when it
//! moved: a change reaches every instance within one poll, and decisions never wait for Redis
//! to learn about overrides. The quota an override sets is carried by the checks themselves
//! (an override is a policy of its own), so the decision scripts need nothing new.

use redis::{RedisError, Script, Value};
use tollgate::StoreError;

use super::RedisStore;
use super::connection::classify;

/// Sets one field and moves the version on (`next_version!`); answers the new version.
const PUT: &str = concat!(
    "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])\n",
    "local last = tonumber(redis.call('GET', KEYS[2]) or '0')\n",
    next_version!(),
    "redis.call('SET', KEYS[2], string.format('%d', v))
return v"
);

/// Removes one field (when `ARGV[2]` is given, only while it still holds that value); moves
/// the version on as [`PUT`] does and answers it when a field was removed, else 0.
const DELETE: &str = concat!(
    "local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current or (ARGV[2] and current ~= ARGV[2]) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')\n",
    next_version!(),
    "redis.call('SET', KEYS[2], string.format('%d', v))
return v"
);

/// The version and every field, read together.
const LOAD: &str = "return {redis.call('GET', KEYS[2]) or '0', redis.call('HGETALL', KEYS[1])}";

impl RedisStore {
    fn override_keys(&self) -> [String; 2] {
        let prefix = &self.inner.config.key_prefix;
        [
            format!("{prefix}:{{overrides}}"),
            format!("{prefix}:{{overrides}}:version"),
        ]
    }

    /// Sets override `field` to `value` for every instance; the new version.
    pub async fn put_override(&self, field: &str, value: &str) -> Result<u64, StoreError> {
        let [hash, version] = self.override_keys();
        self.bounded(async {
            let mut conn = self.inner.connection.get().await?;
            let reply: Result<u64, RedisError> = Script::new(PUT)
                .key(hash)
                .key(version)
                .arg(field)
                .arg(value)
                .invoke_async(&mut conn)
                .await;
            reply.map_err(classify)
        })
        .await
    }

    /// Removes override `field` for every instance (with `only_if`, only while its value is
    /// still that: an expired override is not removed after someone set it again): the new
    /// version, or `None` when nothing was removed.
    pub async fn delete_override(
        &self,
        field: &str,
        only_if: Option<&str>,
    ) -> Result<Option<u64>, StoreError> {
        let [hash, version] = self.override_keys();
        self.bounded(async {
            let mut conn = self.inner.connection.get().await?;
            let script = Script::new(DELETE);
            let mut call = script.key(hash);
            call.key(version).arg(field);
            if let Some(value) = only_if {
                call.arg(value);
            }
            let reply: Result<u64, RedisError> = call.invoke_async(&mut conn).await;
            reply.map(|v| (v > 0).then_some(v)).map_err(classify)
        })
        .await
    }

    /// The overrides' version: it changes with every change (0 before the first).
    pub async fn overrides_version(&self) -> Result<u64, StoreError> {
        let [_, version] = self.override_keys();
        self.bounded(async {
            let mut conn = self.inner.connection.get().await?;
            let reply: Result<Option<u64>, RedisError> =
                redis::cmd("GET").arg(version).query_async(&mut conn).await;
            reply.map(Option::unwrap_or_default).map_err(classify)
        })
        .await
    }

    /// Every override (field, value) with the version they are at, read atomically.
    pub async fn load_overrides(&self) -> Result<(u64, Vec<(String, String)>), StoreError> {
        let [hash, version] = self.override_keys();
        let reply = self
            .bounded(async {
                let mut conn = self.inner.connection.get().await?;
                let reply: Result<Value, RedisError> = Script::new(LOAD)
                    .key(hash)
                    .key(version)
                    .invoke_async(&mut conn)
                    .await;
                reply.map_err(classify)
            })
            .await?;
        versioned_pairs(reply, "overrides")
    }
}

/// A load script's reply, `[version, [field, value, ...]]`, as the version and the pairs;
/// `what` names the script in the error for any other shape.
pub(super) fn versioned_pairs(
    reply: Value,
    what: &str,
) -> Result<(u64, Vec<(String, String)>), StoreError> {
    let unexpected = || StoreError::Protocol {
        reason: format!("the {what} script answered an unexpected shape"),
    };
    let Value::Array(parts) = reply else {
        return Err(unexpected());
    };
    let [version, fields] = <[Value; 2]>::try_from(parts).map_err(|_| unexpected())?;
    let version: u64 = redis::from_redis_value::<String>(version)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(unexpected)?;
    let fields: Vec<String> = redis::from_redis_value(fields).map_err(|_| unexpected())?;
    let mut pairs = Vec::with_capacity(fields.len() / 2);
    let mut items = fields.into_iter();
    while let (Some(field), Some(value)) = (items.next(), items.next()) {
        pairs.push((field, value));
    }
    Ok((version, pairs))
}
