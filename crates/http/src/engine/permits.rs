//! Concurrency limits at the engine: the permit each request takes, the slot given back when
//! its exchange ends, and the wait of a `delay` policy for a slot, first come first served per
//! key.
//!
//! A permit is named by an id unique to its request (the store keeps the ids a key holds), so
//! a release gives back exactly that request's slot and nobody else's ([`tollgate::next_permit`]:
//! distinct within a process, and colliding across the instances sharing a Redis with odds of
//! one in 2^64 per pair).
//!
//! Waiting for a slot: a request that only `delay` concurrency policies denied joins its key's
//! line (per policy and key, in this process). Only the request at the head asks the store
//! again: when a slot of that key is given back here (woken at once), or after the denial's
//! `retry_after` (a slot given back by another instance, or taken back by its TTL), at most
//! [`REMOTE_POLL`] on a shared store. A new request joins the back of the line rather than
//! trying first, so requests are admitted in order of arrival. One key's line never holds up
//! another key's.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tollgate::{Clock, Decisions, Store};

use super::{Action, Engine, Entry};
use crate::key::KeyBuf;

/// The longest a waiting request at the head of its line goes without asking a shared store
/// again: slots given back by other instances are noticed within this.
pub const REMOTE_POLL: Duration = Duration::from_millis(50);

/// Per-policy counts of this instance's slots, for metrics.
#[derive(Debug, Default)]
pub(super) struct SlotCounts {
    /// Requests holding a slot through this instance now (exchanges in progress).
    pub(super) in_flight: AtomicU64,
    /// Slots given back after the store had already taken them back at `lease_ttl`.
    pub(super) expired: AtomicU64,
}

/// The lines of requests waiting for a slot, by policy and key.
#[derive(Debug, Default)]
pub(super) struct Lines {
    /// How many requests wait in all: releases skip the lock when none does.
    waiting: AtomicUsize,
    lines: Mutex<HashMap<(usize, KeyBuf), Line>>,
}

#[derive(Debug)]
struct Line {
    /// The tickets in line, the head first.
    tickets: VecDeque<u64>,
    next: u64,
    notify: Arc<Notify>,
}

/// A place in a key's line; leaving (admitted, timed out, or the client gone) lets the next
/// one move up.
struct Ticket<'l> {
    lines: &'l Lines,
    slot: (usize, KeyBuf),
    number: u64,
    notify: Arc<Notify>,
}

impl Lines {
    fn join(&self, index: usize, key: &[u8]) -> Ticket<'_> {
        let slot = (index, KeyBuf::from(key));
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let line = lines.entry(slot.clone()).or_insert_with(|| Line {
            tickets: VecDeque::new(),
            next: 0,
            notify: Arc::new(Notify::new()),
        });
        let number = line.next;
        line.next += 1;
        line.tickets.push_back(number);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Ticket {
            lines: self,
            slot,
            number,
            notify: Arc::clone(&line.notify),
        }
    }

    /// Whether anyone waits for a slot of `key` under the policy at `index`.
    fn occupied(&self, index: usize, key: &[u8]) -> bool {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines
            .get(&(index, KeyBuf::from(key)))
            .is_some_and(|l| !l.tickets.is_empty())
    }

    /// A slot of `key` under the policy at `index` was given back here: the head of its line
    /// asks again.
    pub(super) fn wake(&self, index: usize, key: &[u8]) {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(line) = lines.get(&(index, KeyBuf::from(key))) {
            line.notify.notify_waiters();
        }
    }
}

impl Ticket<'_> {
    fn at_head(&self) -> bool {
        let lines = self.lines.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines
            .get(&self.slot)
            .and_then(|l| l.tickets.front())
            .is_some_and(|&n| n == self.number)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut lines = self.lines.lines.lock().unwrap_or_else(|p| p.into_inner());
        let Some(line) = lines.get_mut(&self.slot) else {
            return;
        };
        let was_head = line.tickets.front() == Some(&self.number);
        line.tickets.retain(|&n| n != self.number);
        self.lines.waiting.fetch_sub(1, Ordering::Relaxed);
        if line.tickets.is_empty() {
            lines.remove(&self.slot);
        } else if was_head {
            // The next one may find a slot free already (several can be).
            line.notify.notify_waiters();
        }
    }
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// Whether the policy at `index` waits for a slot (a concurrency limit with `delay`).
    pub(super) fn waits(&self, index: usize) -> bool {
        self.inner.policies[index].waits
    }

    /// The line a request of `entries` would wait in: its first waiting policy's key, when
    /// some policy waits.
    fn line_of(&self, entries: &[Entry]) -> Option<(usize, Duration)> {
        let mut found: Option<(usize, Duration)> = None;
        for (i, e) in entries.iter().enumerate() {
            if let Action::Delay { max_delay } = self.action(e)
                && self.waits(e.index)
            {
                let bound = found.map_or(max_delay, |(_, d)| d.min(max_delay));
                found = Some((found.map_or(i, |(at, _)| at), bound));
            }
        }
        found
    }

    /// Whether a request of `entries` must line up before asking the store: someone already
    /// waits for its key.
    pub(super) fn must_line_up(&self, entries: &[Entry]) -> bool {
        self.line_of(entries)
            .is_some_and(|(i, _)| self.inner.lines.occupied(entries[i].index, &entries[i].key))
    }

    /// Whether `decisions` are denials a wait can turn into admission: every enforcing policy
    /// that denied is a concurrency limit with `delay`, and each can pass (a `retry_after`).
    pub(super) fn only_slots_missing(&self, decisions: &Decisions, entries: &[Entry]) -> bool {
        let mut any = false;
        for (d, e) in decisions.as_slice().iter().zip(entries.iter()) {
            if d.allowed || self.is_shadow(e) {
                continue;
            }
            if !self.waits(e.index)
                || !matches!(self.action(e), Action::Delay { .. })
                || d.retry_after.is_none()
            {
                return false;
            }
            any = true;
        }
        any
    }

    /// Waits in line for the slots `entries` need, asking the store again at the head, until
    /// admitted or the policies' `max_delay` has passed. Returns the last decisions and whether
    /// they admit; `Err` is a store failure. `first` is the denial that sent the request here,
    /// `None` when it lined up without asking.
    pub(super) async fn wait_for_slot(
        &self,
        entries: &[Entry],
        first: Option<Decisions>,
    ) -> Result<(Decisions, bool), tollgate::Error> {
        let Some((at, max_delay)) = self.line_of(entries) else {
            return Err(no_line());
        };
        let clock = self.inner.limiter.clock();
        let start = clock.now();
        let ticket = self.inner.lines.join(entries[at].index, &entries[at].key);
        // Just denied: the first ask waits for a wake or the retry time.
        let mut asked_now = first.is_some();
        let mut last = first;
        loop {
            let notified = ticket.notify.notified();
            tokio::pin!(notified);
            // Registered before looking, so a wake between the look and the wait is not lost.
            notified.as_mut().enable();
            if !asked_now && ticket.at_head() {
                let decisions = self.check_all(&self.checks(entries)).await?;
                if decisions.allowed() || !self.only_slots_missing(&decisions, entries) {
                    let admitted = decisions.allowed();
                    return Ok((decisions, admitted));
                }
                last = Some(decisions);
            }
            asked_now = false;
            let waited = clock.now().saturating_duration_since(start);
            let Some(left) = max_delay.checked_sub(waited).filter(|d| !d.is_zero()) else {
                break;
            };
            let retry = last
                .as_ref()
                .and_then(|d| d.as_slice().iter().filter_map(|d| d.retry_after).min())
                .unwrap_or(REMOTE_POLL);
            let poll = if self.inner.limiter.store().is_immediate() {
                retry
            } else {
                retry.min(REMOTE_POLL)
            };
            tokio::select! {
                () = &mut notified => {}
                () = clock.sleep(poll.min(left)) => {}
            }
        }
        drop(ticket);
        // Out of time. A request that never reached the head has no answer of its own: it
        // asks once (and, should a slot be free this instant, takes it).
        match last {
            Some(decisions) => Ok((decisions, false)),
            None => {
                let decisions = self.check_all(&self.checks(entries)).await?;
                let admitted = decisions.allowed();
                Ok((decisions, admitted))
            }
        }
    }

    pub(super) fn checks<'e>(
        &'e self,
        entries: &'e [Entry],
    ) -> smallvec::SmallVec<[tollgate::Check<'e>; 4]> {
        entries.iter().map(|e| self.check(e)).collect()
    }

    /// Gives back the slots of `entries` (their permits), then wakes the lines waiting for
    /// them. Never waits: on a store that answers at once it is done here, otherwise in a task
    /// of its own.
    pub(super) fn release(&self, entries: SmallEntries) {
        if entries.is_empty() {
            return;
        }
        for e in &entries {
            self.inner.policies[e.index]
                .slots
                .in_flight
                .fetch_sub(1, Ordering::Relaxed);
        }
        let engine = self.clone();
        let work = async move {
            let checks: smallvec::SmallVec<[tollgate::Check<'_>; 2]> =
                entries.iter().map(|e| engine.check(e)).collect();
            let now = engine.inner.limiter.clock().now();
            match engine.inner.limiter.store().release(now, &checks).await {
                Ok(held) => {
                    let gone = u32::try_from(entries.len()).unwrap_or(u32::MAX);
                    if held < gone {
                        // Which ones expired is not told; with one concurrency policy per
                        // request (the usual) it is that one.
                        for e in entries.iter().take((gone - held) as usize) {
                            engine.inner.policies[e.index]
                                .slots
                                .expired
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        tracing::debug!(
                            "a request ended after its slot's lease_ttl; the store had taken it back"
                        );
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "could not give a slot back; it returns at its lease_ttl");
                }
            }
            for e in &entries {
                engine.inner.lines.wake(e.index, &e.key);
            }
        };
        self.run_now_or_spawn(work, "a slot's release");
    }

    /// Counts slots taken by an admitted request that this instance will give back.
    pub(super) fn hold_slots(&self, entries: &[Entry]) {
        for e in entries {
            self.inner.policies[e.index]
                .slots
                .in_flight
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Each concurrency policy's slot counts, for metrics: (policy name, requests in flight
    /// through this instance, slots found taken back by their TTL when given back).
    pub fn slot_counts(&self) -> impl Iterator<Item = (&'static str, u64, u64)> + '_ {
        self.inner
            .policies
            .iter()
            .filter(|p| p.concurrent)
            .map(|p| {
                (
                    p.http.policy.name(),
                    p.slots.in_flight.load(Ordering::Relaxed),
                    p.slots.expired.load(Ordering::Relaxed),
                )
            })
    }
}

/// The entries a release gives back: usually one.
pub(super) type SmallEntries = smallvec::SmallVec<[Entry; 1]>;

fn no_line() -> tollgate::Error {
    tollgate::Error::from(tollgate::StoreError::Protocol {
        reason: "a request waited for a slot no policy waits for".to_owned(),
    })
}
