//! Keeping a shard within its bounds: sweeps of the entries whose quota has reset, eviction of
//! those with the least at stake when the shard is full, and trimming the sliding logs back to
//! their byte budget. The deciding paths call in here before they add a key or grow a log.

use super::{Ghosts, Limits, MIN_SWEEP, PolicyTable, Shard};
use crate::{Quota, Timestamp};

impl Shard {
    /// Makes room for one more key: sweeps expired entries when the shard has doubled since the
    /// last sweep or is full, then evicts the entries with the least at stake if still full.
    /// When a quarter or more of the keys added since the last sweep are keys it dropped, the
    /// doubled shard keeps its expired entries instead (see `ghosts`); a full one never does.
    pub(super) fn make_room(&mut self, now: Timestamp, limits: Limits) {
        if !self.room_due(limits) {
            return;
        }
        let cap = limits.keys;
        let len = *self.len_mut();
        let returned = std::mem::take(self.returns.get_mut());
        let added = len.saturating_sub(self.swept_len);
        if len < cap && added > 0 && returned * 4 >= added {
            self.sweep_at = (len * 2).clamp(MIN_SWEEP.min(cap), cap);
            self.swept_len = len;
            return;
        }
        let mut ghosts = std::mem::take(&mut self.ghosts);
        ghosts.prepare(cap);
        self.sweep_recording(now.as_micros(), &mut ghosts);
        self.ghosts = ghosts;
        let len = *self.len_mut();
        if len >= cap {
            let count = cap.div_ceil(16).max(len + 1 - cap);
            self.evict(now, count, None);
        }
        self.swept_len = *self.len_mut();
        self.sweep_at = (self.swept_len * 2).clamp(MIN_SWEEP.min(cap), cap);
    }

    /// Whether [`make_room`](Self::make_room) has work before one more key: a sweep, and an
    /// eviction if the shard is full.
    pub(super) fn room_due(&self, limits: Limits) -> bool {
        let len = self.len();
        len >= self.sweep_at || len >= limits.keys
    }

    /// Drops entries whose quota has fully reset; returns how many.
    pub(in super::super) fn sweep(&mut self, now: u64) -> usize {
        self.sweep_recording(now, &mut Ghosts::default())
    }

    /// [`sweep`](Self::sweep), recording the keys dropped in `ghosts`.
    fn sweep_recording(&mut self, now: u64, ghosts: &mut Ghosts) -> usize {
        self.bans.sweep(now);
        let before = *self.len_mut();
        for table in &mut self.tables {
            table.sweep(now, ghosts);
        }
        self.tables.retain(|t| t.len() > 0);
        self.recount();
        before - *self.len_mut()
    }

    fn recount(&mut self) {
        *self.len.get_mut() = self.tables.iter().map(PolicyTable::len).sum();
        let bytes = self.tables.iter_mut().map(|t| t.logs.bytes()).sum();
        *self.log_bytes.get_mut() = bytes;
    }

    /// Drops `count` entries, the least at stake first, never `keep`.
    fn evict(&mut self, now: Timestamp, count: usize, keep: Option<u64>) {
        let mut ranked = Vec::with_capacity(*self.len_mut());
        for (index, table) in self.tables.iter_mut().enumerate() {
            table.ranked(now, index, &mut ranked);
        }
        ranked.retain(|c| Some(c.hash) != keep);
        let count = count.min(ranked.len());
        if count == 0 {
            return;
        }
        if count < ranked.len() {
            ranked.select_nth_unstable(count - 1);
        }
        for c in &ranked[..count] {
            self.tables[c.index].remove(c.hash);
        }
        self.recount();
    }

    /// Brings the logs back within their byte budget: drops those that have reset, then the
    /// least at stake, but never `keep` (the log that just grew), so a client being denied keeps
    /// its full log and a new log never evicts itself. It trims to fifteen sixteenths of the
    /// budget, so the next trim is many new logs away (one ranking per request would make a
    /// flood of new keys quadratic).
    pub(in super::super) fn trim_logs(&mut self, now: Timestamp, limits: Limits, keep: u64) {
        if self.log_bytes() <= limits.log_bytes {
            return;
        }
        let target = limits.log_bytes - limits.log_bytes / 16;
        let now_us = now.as_micros();
        for table in &mut self.tables {
            if let Quota::SlidingWindowLog(alg) = &table.quota {
                table
                    .logs
                    .retain(|log| alg.expires_at_log(log).as_micros() > now_us);
            }
        }
        self.recount();
        while self.log_bytes() > target {
            let mut ranked = Vec::new();
            for (index, table) in self.tables.iter_mut().enumerate() {
                if matches!(table.quota, Quota::SlidingWindowLog(_)) {
                    table.ranked(now, index, &mut ranked);
                }
            }
            ranked.retain(|c| c.hash != keep);
            // Evict in rounds of an eighth, so a trim does not rank the logs once per victim.
            let Some(count) = Some(ranked.len().div_ceil(8)).filter(|&n| n > 0) else {
                break;
            };
            ranked.sort_unstable();
            let mut excess = self.log_bytes() - target;
            for c in ranked.iter().take(count) {
                let table = &mut self.tables[c.index];
                if let Some(log) = table.logs.remove(c.hash) {
                    excess = excess.saturating_sub(log.bytes());
                }
                if excess == 0 {
                    break;
                }
            }
            self.recount();
        }
    }
}
