//! Giving permits back: [`Store::release`](tollgate::Store::release) for the Redis store.

use std::sync::atomic::Ordering;

use redis::Value;
use tollgate::{Check, OnError, Quota, StoreError, Timestamp};

use super::{Prepared, RedisStore, failure};
use crate::script::{self, ScriptKind};
use crate::verdict::protocol;

impl RedisStore {
    /// [`Store::release`](tollgate::Store::release): the concurrency checks' permits given
    /// back in Redis, and in the fallback store under `on_error = "local"`.
    pub(super) async fn release_permits(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<u32, StoreError> {
        let held: Vec<Check<'_>> = checks
            .iter()
            .filter(|c| matches!(c.policy.quota(), Quota::Concurrency(_)))
            .copied()
            .collect();
        if held.is_empty() {
            return Ok(0);
        }
        let local = self.inner.config.on_error == OnError::Local;
        // A permit the fallback store gave out while Redis was away is given back there.
        let in_memory = if local {
            self.inner.memory.release_now(now, &held)
        } else {
            0
        };
        let prepared = self.prepare(&held)?;
        let result = if self.may_call_redis() {
            self.within_timeout(self.release_in_redis(now, &held, &prepared))
                .await
        } else {
            Err(failure::circuit_open())
        };
        match result {
            Ok(in_redis) => {
                self.inner.probe_at.store(0, Ordering::Relaxed);
                Ok(in_redis + in_memory)
            }
            Err(e) => {
                self.failed(&e);
                if local { Ok(in_memory) } else { Err(e) }
            }
        }
    }

    /// Gives permits back in Redis, one `release.lua` call per slot (one on a standalone
    /// Redis); how many were still held.
    pub(super) async fn release_in_redis(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
        prepared: &[Prepared],
    ) -> Result<u32, StoreError> {
        let mut conn = self.inner.connection.get().await?;
        let mut held = 0;
        for members in self.slot_groups(prepared) {
            let keys: Vec<&str> = members.iter().map(|&i| prepared[i].key.as_str()).collect();
            let reply = self
                .eval(&mut conn, ScriptKind::Release, &keys, now, |cmd| {
                    for &i in &members {
                        cmd.arg(script::permit_id(checks[i].permit));
                    }
                    Ok(())
                })
                .await?;
            let Value::Int(n) = reply else {
                return Err(protocol(&format!("release.lua replied {reply:?}")));
            };
            held += u32::try_from(n).map_err(|_| protocol("release.lua replied a bad count"))?;
        }
        Ok(held)
    }
}
