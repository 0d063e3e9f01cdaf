//! The script calls: one check, several checks all-or-nothing (one call, or one per slot with
//! refunds when a Cluster spreads them), and refunds. Releases are in `release.rs`.

use std::sync::atomic::Ordering;

use redis::{Cmd, RedisError, Value};
use tollgate::{Check, StoreError, Timestamp, Verdict};

use super::connection::{Conn, classify, is_noscript};
use super::{Prepared, RedisStore};
use crate::config::ClockSource;
use crate::script::{self, ScriptKind};
use crate::verdict::{self, Decided, Grant, protocol};

impl RedisStore {
    /// `fut`, script calls made through [`run`](Self::run) or
    /// [`refund_in_redis`](Self::refund_in_redis), within the configured timeout: a standalone
    /// store's calls carry their deadline to the coalescer, which keeps one timer per batch of
    /// calls (`store/coalesce.rs`); a Cluster's are bounded here, one timer per request.
    pub(super) async fn within_timeout<T>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if self.inner.config.cluster {
            self.bounded(fut).await
        } else {
            fut.await
        }
    }

    /// A failed call's error: a reply that did not come within the deadline is the store's
    /// timeout.
    fn call_error(&self, e: RedisError) -> StoreError {
        if e.is_timeout() {
            StoreError::Timeout {
                after: self.inner.config.timeout,
            }
        } else {
            classify(e)
        }
    }

    /// The command `name` (EVALSHA or EVAL) of script `kind` over `keys`, with `now` and the
    /// arguments `args` appends.
    pub(super) fn command(
        &self,
        name: &str,
        kind: ScriptKind,
        keys: &[&str],
        now: Timestamp,
        args: impl Fn(&mut Cmd) -> Result<(), StoreError>,
    ) -> Result<Cmd, StoreError> {
        let script = self.inner.scripts.get(kind);
        // Sized for the script's arguments (a handful per check, numbers of up to 20 digits)
        // and the keys, so building the call does not grow its buffers step by step.
        let key_bytes: usize = keys.iter().map(|k| k.len()).sum();
        let mut cmd = Cmd::with_capacity(keys.len() * 6 + 4, key_bytes + keys.len() * 100 + 64);
        cmd.arg(name)
            .arg(if name == "EVAL" {
                &script.source
            } else {
                &script.sha
            })
            .arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        if self.inner.config.clock == ClockSource::Local {
            cmd.arg(now.as_micros());
        }
        args(&mut cmd)?;
        Ok(cmd)
    }

    /// One script call: EVALSHA, and EVAL when the node does not know the script yet.
    pub(super) async fn eval(
        &self,
        conn: &mut Conn,
        kind: ScriptKind,
        keys: &[&str],
        now: Timestamp,
        args: impl Fn(&mut Cmd) -> Result<(), StoreError>,
    ) -> Result<Value, StoreError> {
        let calls = &self.inner.stats.script_calls;
        calls.fetch_add(1, Ordering::Relaxed);
        let cmd = self.command("EVALSHA", kind, keys, now, &args)?;
        let reply: Result<Value, RedisError> = conn.query(cmd).await;
        match reply {
            Err(e) if is_noscript(&e) => {
                // A restarted or new node has an empty script cache: EVAL loads it there.
                calls.fetch_add(1, Ordering::Relaxed);
                let cmd = self.command("EVAL", kind, keys, now, &args)?;
                let reply: Result<Value, RedisError> = conn.query(cmd).await;
                reply.map_err(|e| self.call_error(e))
            }
            other => other.map_err(|e| self.call_error(e)),
        }
    }

    /// One check through its algorithm's script: admit its cost, or take up to `want` units (a
    /// lease) logged `at` µs later.
    pub(super) async fn one(
        &self,
        conn: &mut Conn,
        now: Timestamp,
        check: &Check<'_>,
        key: &str,
        want: u32,
        at: u64,
    ) -> Result<Grant, StoreError> {
        let kind = ScriptKind::of(check.policy.quota());
        let reply = self
            .eval(conn, kind, &[key], now, |cmd| {
                script::one_check_args(cmd, now, check, want, at)
            })
            .await?;
        verdict::one_check(check, reply)
    }

    /// Several checks in one call of `multi.lua`, all-or-nothing (written only when `commit`
    /// and every check admits), with the lockout records `ban_keys` of the checks whose
    /// policy bans (in order).
    async fn multi(
        &self,
        conn: &mut Conn,
        now: Timestamp,
        checks: &[&Check<'_>],
        keys: &[&str],
        ban_keys: &[&str],
        commit: bool,
    ) -> Result<Vec<Decided>, StoreError> {
        let all_keys: Vec<&str> = keys.iter().chain(ban_keys).copied().collect();
        let reply = self
            .eval(conn, ScriptKind::Multi, &all_keys, now, |cmd| {
                cmd.arg(u8::from(commit)).arg(ban_keys.len());
                for (check, key) in checks.iter().zip(keys) {
                    // A log reports as many of its oldest units as this request's checks on
                    // it cost: no retry time of this request needs more.
                    let oldest: u64 = checks
                        .iter()
                        .zip(keys)
                        .filter(|(_, k)| *k == key)
                        .map(|(c, _)| u64::from(c.cost))
                        .sum();
                    script::multi_args(cmd, now, check, oldest)?;
                }
                script::ban_args(cmd, checks);
                Ok(())
            })
            .await?;
        verdict::multi(checks, keys, reply, commit)
    }

    /// Charges every check its cost whatever its quota says, in one call of `multi.lua` per
    /// slot (one call on a standalone Redis): each key's charge is atomic, and nothing is
    /// all-or-nothing about a charge, so a Cluster's slots need no refunds.
    pub(super) async fn charge_in_redis(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
        prepared: &[Prepared],
    ) -> Result<Vec<Verdict>, StoreError> {
        let mut conn = self.inner.connection.get().await?;
        let mut verdicts: Vec<Option<Verdict>> = vec![None; checks.len()];
        for members in self.slot_groups(prepared) {
            let group: Vec<&Check<'_>> = members.iter().map(|&i| &checks[i]).collect();
            let keys: Vec<&str> = members.iter().map(|&i| prepared[i].key.as_str()).collect();
            let reply = self
                .eval(&mut conn, ScriptKind::Multi, &keys, now, |cmd| {
                    // Charges ignore bans: no lockout records.
                    cmd.arg(2u8).arg(0u8);
                    for check in &group {
                        // What is left afterwards is a peek: no oldest units are needed.
                        script::multi_args(cmd, now, check, 0)?;
                    }
                    Ok(())
                })
                .await?;
            for (&i, v) in members.iter().zip(verdict::charged(&group, &keys, reply)?) {
                verdicts[i] = Some(v);
            }
        }
        verdicts
            .into_iter()
            .map(|v| v.ok_or_else(|| protocol("a charge without a verdict")))
            .collect()
    }

    /// Gives back `costs[i]` of `checks[i]` where `guards[i]` says (0: a plain refund).
    pub(super) async fn refund_call(
        &self,
        conn: &mut Conn,
        now: Timestamp,
        checks: &[&Check<'_>],
        keys: &[&str],
        costs_and_guards: &[(u32, u64)],
    ) -> Result<(), StoreError> {
        self.eval(conn, ScriptKind::Refund, keys, now, |cmd| {
            for (check, &(cost, guard)) in checks.iter().zip(costs_and_guards) {
                script::refund_args(cmd, now, check, cost, guard);
            }
            Ok(())
        })
        .await
        .map(|_| ())
    }

    /// Decides the checks in Redis: one call, or one per slot in a Cluster (see the type's
    /// docs).
    pub(super) async fn run(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
        prepared: &[Prepared],
    ) -> Result<Vec<Decided>, StoreError> {
        let mut conn = self.inner.connection.get().await?;
        if let ([check], [p]) = (checks, prepared)
            && p.ban_key.is_none()
        {
            let grant = self
                .one(&mut conn, now, check, &p.key, check.cost, 0)
                .await?;
            return Ok(vec![(grant.verdict, None)]);
        }
        let first = prepared.first().map(|p| p.slot);
        if !self.inner.config.cluster || prepared.iter().all(|p| Some(p.slot) == first) {
            let all: Vec<&Check<'_>> = checks.iter().collect();
            let keys: Vec<&str> = prepared.iter().map(|p| p.key.as_str()).collect();
            let bans: Vec<&str> = prepared
                .iter()
                .filter_map(|p| p.ban_key.as_deref())
                .collect();
            return self.multi(&mut conn, now, &all, &keys, &bans, true).await;
        }
        self.run_across_slots(&mut conn, now, checks, prepared)
            .await
    }

    /// Several slots: one call per slot in order; when a later slot denies, the earlier ones
    /// are refunded and every slot but the denying one reports its quota as it stands.
    async fn run_across_slots(
        &self,
        conn: &mut Conn,
        now: Timestamp,
        checks: &[Check<'_>],
        prepared: &[Prepared],
    ) -> Result<Vec<Decided>, StoreError> {
        // Group by slot, in order of first appearance.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, p) in prepared.iter().enumerate() {
            match groups.iter_mut().find(|(s, _)| *s == p.slot) {
                Some((_, members)) => members.push(i),
                None => groups.push((p.slot, vec![i])),
            }
        }
        let group = |members: &[usize]| -> (Vec<&Check<'_>>, Vec<&str>, Vec<&str>) {
            (
                members.iter().map(|&i| &checks[i]).collect(),
                members.iter().map(|&i| prepared[i].key.as_str()).collect(),
                members
                    .iter()
                    .filter_map(|&i| prepared[i].ban_key.as_deref())
                    .collect(),
            )
        };
        let mut verdicts: Vec<Option<Decided>> = vec![None; prepared.len()];
        let mut denied_at = None;
        for (g, (_, members)) in groups.iter().enumerate() {
            let (group_checks, keys, bans) = group(members);
            let got = self
                .multi(conn, now, &group_checks, &keys, &bans, true)
                .await?;
            let admitted = got.iter().all(|(v, _)| v.allowed);
            for (&i, v) in members.iter().zip(got) {
                verdicts[i] = Some(v);
            }
            if !admitted {
                denied_at = Some(g);
                break;
            }
        }
        if let Some(denied) = denied_at {
            for (g, (_, members)) in groups.iter().enumerate() {
                if g == denied {
                    continue;
                }
                let (group_checks, keys, bans) = group(members);
                if g < denied {
                    let costs: Vec<(u32, u64)> = group_checks.iter().map(|c| (c.cost, 0)).collect();
                    self.refund_call(conn, now, &group_checks, &keys, &costs)
                        .await?;
                }
                let got = self
                    .multi(conn, now, &group_checks, &keys, &bans, false)
                    .await?;
                for (&i, v) in members.iter().zip(got) {
                    verdicts[i] = Some(v);
                }
            }
        }
        verdicts
            .into_iter()
            .map(|v| v.ok_or_else(|| protocol("a check got no verdict")))
            .collect()
    }

    /// Refunds in Redis: per key and commutative across keys, so one call per slot.
    pub(super) async fn refund_in_redis(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
        prepared: &[Prepared],
    ) -> Result<(), StoreError> {
        let mut conn = self.inner.connection.get().await?;
        for members in self.slot_groups(prepared) {
            let group_checks: Vec<&Check<'_>> = members.iter().map(|&i| &checks[i]).collect();
            let keys: Vec<&str> = members.iter().map(|&i| prepared[i].key.as_str()).collect();
            let costs: Vec<(u32, u64)> = group_checks.iter().map(|c| (c.cost, 0)).collect();
            self.refund_call(&mut conn, now, &group_checks, &keys, &costs)
                .await?;
        }
        Ok(())
    }

    /// The checks of each slot the keys land in, by index: one group on a standalone Redis,
    /// one per slot in a Cluster (a script may touch one slot only). For calls that need no
    /// all-or-nothing across slots: refunds, charges and releases.
    pub(super) fn slot_groups(&self, prepared: &[Prepared]) -> Vec<Vec<usize>> {
        if !self.inner.config.cluster {
            return vec![(0..prepared.len()).collect()];
        }
        let mut slots: Vec<u16> = Vec::new();
        for p in prepared {
            if !slots.contains(&p.slot) {
                slots.push(p.slot);
            }
        }
        slots
            .into_iter()
            .map(|s| {
                (0..prepared.len())
                    .filter(|&i| prepared[i].slot == s)
                    .collect()
            })
            .collect()
    }
}
