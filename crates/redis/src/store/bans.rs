//! Lockout records in Redis, for operators: the check's script keeps each record beside its
//! key's state (`<prefix>:{<hmac>}:ban:<policy>`, a hash: streak start, denials, since, until,
//! and the key as the caller named it), so a ban is honoured by every instance from the check
//! that starts it. Listing them needs an index: a sorted set, `<prefix>:{bans}`, of the records'
//! keys scored by when their ban ends, to which the instance that saw a ban start adds it (one
//! more call, only then). In a Cluster the index lives in its own slot, which no check's script
//! may touch; a ban whose indexing failed is still enforced, only not listed.

use redis::{RedisError, Script, Value};
use tollgate::{BanRecord, Check, StoreError, Timestamp};

use super::connection::classify;
use super::{Prepared, RedisStore};
use crate::keys::{BAN_INFIX, ban_key};
use crate::script::clock_prelude;
use crate::verdict::Decided;
use crate::verdict::bans::BanMark;

/// Drops the index's ended bans and answers the script's clock and the rest, with scores.
const LIST: &str = "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
return {now, redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')}";

/// Deletes a record; answers the script's clock and when its ban ended (0: none).
const LIFT: &str = "local u = tonumber(redis.call('HGET', KEYS[1], 'u') or '0')
redis.call('DEL', KEYS[1])
return {now, u}";

/// The most bans listed at once.
const MAX_LISTED: usize = 10_000;

impl RedisStore {
    fn ban_index(&self) -> String {
        format!("{}:{{bans}}", self.inner.config.key_prefix)
    }

    fn clocked(&self, body: &str) -> Script {
        Script::new(&format!("{}{body}", clock_prelude(self.inner.config.clock)))
    }

    /// Adds the bans that the decisions `verdicts` of the checks `prepared` started to the
    /// index. Best effort: a failure is counted in [`RedisStoreStats::errors`](crate::RedisStoreStats), the ban stands.
    pub(super) async fn index_bans(&self, prepared: &[Prepared], verdicts: &[Decided]) {
        let started: Vec<(&str, u64)> = prepared
            .iter()
            .zip(verdicts)
            .filter_map(|(p, (_, mark))| match (mark, &p.ban_key) {
                (Some(BanMark::Started { until, .. }), Some(key)) => Some((key.as_str(), *until)),
                _ => None,
            })
            .collect();
        if started.is_empty() {
            return;
        }
        let index = self.ban_index();
        let result = self
            .bounded(async {
                let mut conn = self.inner.connection.get().await?;
                let mut cmd = redis::cmd("ZADD");
                cmd.arg(&index);
                for (key, until) in &started {
                    cmd.arg(*until).arg(*key);
                }
                let reply: Result<Value, RedisError> = conn.query(cmd).await;
                reply.map(|_| ()).map_err(classify)
            })
            .await;
        if result.is_err() {
            // Counted with the store's errors; the ban is enforced all the same.
            self.inner
                .stats
                .errors
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// How many bans are in force, by policy, from the index alone (one call): for metrics.
    pub async fn ban_counts(
        &self,
        now: Timestamp,
    ) -> Result<std::collections::HashMap<String, u64>, StoreError> {
        let (_, members) = self.indexed(now).await?;
        let mut counts = std::collections::HashMap::new();
        for pair in members.chunks_exact(2) {
            if let Some((_, policy)) = pair[0].split_once(BAN_INFIX) {
                *counts.entry(policy.to_owned()).or_insert(0) += 1;
            }
        }
        Ok(counts)
    }

    /// The index's bans that have not ended, as (record key, until) pairs, flat, with the
    /// script's clock.
    async fn indexed(&self, now: Timestamp) -> Result<(u64, Vec<String>), StoreError> {
        let index = self.ban_index();
        let reply = self
            .bounded(async {
                let mut conn = self.inner.connection.get().await?;
                let script = self.clocked(LIST);
                let mut call = script.key(&index);
                if self.inner.config.clock == crate::ClockSource::Local {
                    call.arg(now.as_micros());
                }
                let reply: Result<Value, RedisError> = call.invoke_async(&mut conn).await;
                reply.map_err(classify)
            })
            .await?;
        let unexpected = || crate::verdict::protocol("the ban index answered an unexpected shape");
        let Value::Array(parts) = reply else {
            return Err(unexpected());
        };
        let [clock, members] = <[Value; 2]>::try_from(parts).map_err(|_| unexpected())?;
        let clock: u64 = redis::from_redis_value(clock).map_err(|_| unexpected())?;
        let members: Vec<String> = redis::from_redis_value(members).map_err(|_| unexpected())?;
        Ok((clock, members))
    }

    /// The bans in force (see [`Store::bans`](tollgate::Store::bans)).
    pub(super) async fn bans_in_redis(&self, now: Timestamp) -> Result<Vec<BanRecord>, StoreError> {
        let (clock, members) = self.indexed(now).await?;
        let unexpected = || crate::verdict::protocol("a ban record has an unexpected shape");
        let mut out = Vec::new();
        for pair in members.chunks_exact(2).take(MAX_LISTED) {
            let name = &pair[0];
            let Some((_, policy)) = name.split_once(BAN_INFIX) else {
                continue;
            };
            let fields: Vec<Option<Vec<u8>>> = self
                .bounded(async {
                    let mut conn = self.inner.connection.get().await?;
                    let mut cmd = redis::cmd("HMGET");
                    cmd.arg(name).arg("b").arg("u").arg("d").arg("k");
                    let reply: Result<Value, RedisError> = conn.query(cmd).await;
                    let reply = reply.map_err(classify)?;
                    redis::from_redis_value(reply).map_err(|_| unexpected())
                })
                .await?;
            let number = |v: &Option<Vec<u8>>| -> u64 {
                v.as_deref()
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0)
            };
            let [since, until, denials, key] =
                <[Option<Vec<u8>>; 4]>::try_from(fields).map_err(|_| unexpected())?;
            let until = number(&until);
            // Lifted or ended since it was indexed (the index keeps it until its score).
            if until <= clock {
                continue;
            }
            out.push(BanRecord {
                policy: policy.to_owned(),
                key: key.unwrap_or_default(),
                since: Timestamp::from_micros(number(&since)),
                until: Timestamp::from_micros(until),
                denials: u32::try_from(number(&denials)).unwrap_or(u32::MAX),
            });
        }
        Ok(out)
    }

    /// Lifts a ban (see [`Store::lift_ban`](tollgate::Store::lift_ban)).
    pub(super) async fn lift_in_redis(
        &self,
        now: Timestamp,
        policy: &str,
        key: &[u8],
    ) -> Result<bool, StoreError> {
        let digest = self.inner.hasher.digest(key);
        let name = ban_key(&self.inner.config.key_prefix, &digest, policy);
        let index = self.ban_index();
        self.bounded(async {
            let mut conn = self.inner.connection.get().await?;
            let script = self.clocked(LIFT);
            let mut call = script.key(&name);
            if self.inner.config.clock == crate::ClockSource::Local {
                call.arg(now.as_micros());
            }
            let reply: Result<(u64, u64), RedisError> = call.invoke_async(&mut conn).await;
            let (clock, until) = reply.map_err(classify)?;
            let mut zrem = redis::cmd("ZREM");
            zrem.arg(&index).arg(&name);
            let removed: Result<Value, RedisError> = conn.query(zrem).await;
            removed.map_err(classify)?;
            Ok(clock < until)
        })
        .await
    }

    /// The lockout record's Redis key of `check` (for operators and tests).
    pub fn ban_key_of(&self, check: &Check<'_>) -> String {
        ban_key(
            &self.inner.config.key_prefix,
            &self.inner.hasher.digest(check.key),
            check.policy.name(),
        )
    }
}
