//! The queue of a `queue` policy with the memory store: bounded, in this process, and gone when
//! it stops unless `[store] path` keeps the state on disk (then a restart finds its requests
//! again; see `persist`); the Redis store keeps them for every instance. It keeps
//! the Redis queue's semantics where they apply: depth counts waiting and taken messages, a
//! message taken by the drainer stays taken until it is finished or buried, dead letters are
//! kept for re-driving, statuses of finished messages for a while.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tollgate_redis::stream_queue::{
    DeadLetter, MessageState, MessageStatus, NewMessage, Pushed, QueueStats, QueuedMessage,
    Redriven,
};

/// Statuses of finished messages kept at most, the oldest dropped first.
const MAX_FINISHED: usize = 100_000;

/// One policy's queue, in memory.
#[derive(Debug, Default)]
pub(crate) struct MemoryQueue {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_entry: u64,
    ready: VecDeque<QueuedMessage>,
    /// Taken by the drainer, by entry.
    taken: HashMap<String, QueuedMessage>,
    dead: VecDeque<DeadLetter>,
    statuses: HashMap<String, MessageStatus>,
    /// Finished messages' ids with when their status may go, oldest first.
    finished: VecDeque<(u64, String)>,
}

impl State {
    fn entry(&mut self) -> String {
        self.next_entry += 1;
        format!("{}-0", self.next_entry)
    }

    /// Drops statuses kept past their time, or past [`MAX_FINISHED`].
    fn expire(&mut self, now_ms: u64) {
        while let Some((until, _)) = self.finished.front() {
            if *until > now_ms && self.finished.len() <= MAX_FINISHED {
                break;
            }
            if let Some((_, id)) = self.finished.pop_front()
                && self
                    .statuses
                    .get(&id)
                    .is_some_and(|s| s.state == MessageState::Delivered)
            {
                self.statuses.remove(&id);
            }
        }
    }
}

impl MemoryQueue {
    fn state(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub(crate) fn push(&self, m: NewMessage<'_>, max_depth: u64) -> Pushed {
        let mut s = self.state();
        let depth = s.ready.len() + s.taken.len();
        if u64::try_from(depth).unwrap_or(u64::MAX) >= max_depth {
            return Pushed::Full;
        }
        let entry = s.entry();
        s.ready.push_back(QueuedMessage {
            entry: entry.clone(),
            id: m.id.to_owned(),
            key: m.key.to_vec(),
            payload: m.payload.to_vec(),
            enqueued_ms: m.enqueued_ms,
        });
        s.statuses.insert(
            m.id.to_owned(),
            MessageStatus {
                state: MessageState::Queued,
                attempts: 0,
                status: None,
                error: None,
                enqueued_ms: m.enqueued_ms,
                updated_ms: m.enqueued_ms,
            },
        );
        Pushed::Queued(entry)
    }

    pub(crate) fn read(&self, count: usize) -> Vec<QueuedMessage> {
        let mut s = self.state();
        let n = count.min(s.ready.len());
        let out: Vec<QueuedMessage> = s.ready.drain(..n).collect();
        for m in &out {
            s.taken.insert(m.entry.clone(), m.clone());
        }
        out
    }

    /// The entries of `entries` no longer taken (a re-drive of another message cannot take
    /// them; only a finish can): none, in practice.
    pub(crate) fn keep(&self, entries: &[&str]) -> Vec<String> {
        let s = self.state();
        entries
            .iter()
            .filter(|e| !s.taken.contains_key(**e))
            .map(|e| (*e).to_owned())
            .collect()
    }

    pub(crate) fn attempt(&self, id: &str, now_ms: u64) -> u32 {
        let mut s = self.state();
        let status = s.statuses.entry(id.to_owned()).or_insert(MessageStatus {
            state: MessageState::Delivering,
            attempts: 0,
            status: None,
            error: None,
            enqueued_ms: now_ms,
            updated_ms: now_ms,
        });
        status.state = MessageState::Delivering;
        status.attempts += 1;
        status.updated_ms = now_ms;
        status.attempts
    }

    pub(crate) fn note(&self, id: &str, status: Option<u16>, error: &str, now_ms: u64) {
        if let Some(s) = self.state().statuses.get_mut(id) {
            s.status = status;
            s.error = (!error.is_empty()).then(|| error.to_owned());
            s.updated_ms = now_ms;
        }
    }

    pub(crate) fn complete(&self, m: &QueuedMessage, status: u16, now_ms: u64, keep: Duration) {
        let mut s = self.state();
        s.taken.remove(&m.entry);
        if let Some(st) = s.statuses.get_mut(&m.id) {
            st.state = MessageState::Delivered;
            st.status = Some(status);
            st.error = None;
            st.updated_ms = now_ms;
        }
        let until = now_ms.saturating_add(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX));
        s.finished.push_back((until, m.id.clone()));
        s.expire(now_ms);
    }

    /// Moves a taken message to the dead letters. Dead letters past `max_dead` push the
    /// oldest out (logged): memory stays bounded.
    pub(crate) fn bury(&self, d: DeadLetter, max_dead: u64) {
        let mut s = self.state();
        s.taken.remove(&d.message.entry);
        if let Some(st) = s.statuses.get_mut(&d.message.id) {
            st.state = MessageState::Dead;
            st.attempts = d.attempts;
            st.status = d.status;
            st.error = d.error.clone();
            st.updated_ms = d.died_ms;
        }
        let mut dead = d;
        dead.message.entry = s.entry();
        s.dead.push_back(dead);
        while u64::try_from(s.dead.len()).unwrap_or(u64::MAX) > max_dead {
            if let Some(old) = s.dead.pop_front() {
                tracing::warn!(id = %old.message.id, "memory queue: dead letters full; the oldest is dropped");
                s.statuses.remove(&old.message.id);
            }
        }
    }

    pub(crate) fn status(&self, id: &str) -> Option<MessageStatus> {
        self.state().statuses.get(id).cloned()
    }

    pub(crate) fn dead_letters(&self, after: Option<&str>, count: usize) -> Vec<DeadLetter> {
        let s = self.state();
        let seq = |entry: &str| entry.split('-').next().and_then(|n| n.parse::<u64>().ok());
        let after = after.and_then(seq).unwrap_or(0);
        s.dead
            .iter()
            .filter(|d| seq(&d.message.entry).is_some_and(|n| n > after))
            .take(count)
            .cloned()
            .collect()
    }

    pub(crate) fn redrive(&self, id: &str, now_ms: u64, max_depth: u64) -> Redriven {
        let mut s = self.state();
        let Some(at) = s.dead.iter().position(|d| d.message.id == id) else {
            return Redriven::NotDead;
        };
        if u64::try_from(s.ready.len() + s.taken.len()).unwrap_or(u64::MAX) >= max_depth {
            return Redriven::Full;
        }
        let Some(dead) = s.dead.remove(at) else {
            return Redriven::NotDead;
        };
        let mut message = dead.message;
        message.entry = s.entry();
        if let Some(st) = s.statuses.get_mut(id) {
            st.state = MessageState::Queued;
            st.attempts = 0;
            st.status = None;
            st.error = None;
            st.updated_ms = now_ms;
        }
        s.ready.push_back(message);
        Redriven::Queued
    }

    pub(crate) fn discard(&self, id: &str) -> bool {
        let mut s = self.state();
        let Some(at) = s.dead.iter().position(|d| d.message.id == id) else {
            return false;
        };
        s.dead.remove(at);
        s.statuses.remove(id);
        true
    }

    pub(crate) fn stats(&self) -> QueueStats {
        let s = self.state();
        QueueStats {
            depth: u64::try_from(s.ready.len() + s.taken.len()).unwrap_or(u64::MAX),
            dead: u64::try_from(s.dead.len()).unwrap_or(u64::MAX),
            oldest_ms: s
                .ready
                .iter()
                .chain(s.taken.values())
                .map(|m| m.enqueued_ms)
                .min(),
        }
    }
}

mod persist;

pub(crate) use persist::Kept;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Push,
        Read(usize),
        Complete(usize),
        Bury(usize),
        Redrive(usize),
        Discard(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Push),
            2 => (0usize..4).prop_map(Op::Read),
            2 => (0usize..8).prop_map(Op::Complete),
            1 => (0usize..8).prop_map(Op::Bury),
            1 => (0usize..8).prop_map(Op::Redrive),
            1 => (0usize..8).prop_map(Op::Discard),
        ]
    }

    proptest! {
        /// Against a model of plain lists: the depth bound holds (waiting and taken count), reads
        /// come in queue order, every message is in exactly one place, and its status says
        /// which.
        #[test]
        fn the_memory_queue_follows_its_model(ops in proptest::collection::vec(op(), 1..80)) {
            const DEPTH: u64 = 5;
            let q = MemoryQueue::default();
            let (mut ready, mut taken, mut dead, mut done) =
                (VecDeque::new(), Vec::<QueuedMessage>::new(), Vec::<String>::new(), Vec::new());
            let mut next = 0;
            for op in ops {
                match op {
                    Op::Push => {
                        let id = format!("m{next}");
                        next += 1;
                        let full = (ready.len() + taken.len()) as u64 >= DEPTH;
                        let pushed = q.push(NewMessage { id: &id, key: b"k", payload: b"p", enqueued_ms: next }, DEPTH);
                        prop_assert_eq!(pushed == Pushed::Full, full);
                        if !full {
                            ready.push_back(id);
                        }
                    }
                    Op::Read(n) => {
                        let got = q.read(n);
                        let want: Vec<String> = ready.drain(..n.min(ready.len())).collect();
                        prop_assert_eq!(got.iter().map(|m| m.id.clone()).collect::<Vec<_>>(), want);
                        taken.extend(got);
                    }
                    Op::Complete(i) if i < taken.len() => {
                        let m = taken.remove(i);
                        q.complete(&m, 200, 1, Duration::from_secs(60));
                        done.push(m.id);
                    }
                    Op::Bury(i) if i < taken.len() => {
                        let m = taken.remove(i);
                        dead.push(m.id.clone());
                        q.bury(DeadLetter { message: m, attempts: 1, status: Some(500), error: None, died_ms: 1 }, 100);
                    }
                    Op::Redrive(i) if i < dead.len() => {
                        let full = (ready.len() + taken.len()) as u64 >= DEPTH;
                        let redriven = q.redrive(&dead[i], 2, DEPTH);
                        if full {
                            prop_assert_eq!(redriven, Redriven::Full);
                        } else {
                            prop_assert_eq!(redriven, Redriven::Queued);
                            ready.push_back(dead.remove(i));
                        }
                    }
                    Op::Discard(i) if i < dead.len() => {
                        let id = dead.remove(i);
                        prop_assert!(q.discard(&id));
                        prop_assert!(q.status(&id).is_none());
                    }
                    _ => {}
                }
                let stats = q.stats();
                prop_assert_eq!(stats.depth, (ready.len() + taken.len()) as u64);
                prop_assert!(stats.depth <= DEPTH);
                prop_assert_eq!(stats.dead, dead.len() as u64);
                let state = |id: &String| q.status(id).map(|s| s.state);
                for id in &ready {
                    prop_assert_eq!(state(id), Some(MessageState::Queued));
                }
                for id in &dead {
                    prop_assert_eq!(state(id), Some(MessageState::Dead));
                }
                for id in &done {
                    prop_assert_eq!(state(id), Some(MessageState::Delivered));
                }
            }
        }
    }

    fn new(id: &str) -> NewMessage<'_> {
        NewMessage {
            id,
            key: b"k",
            payload: b"p",
            enqueued_ms: 5,
        }
    }

    #[test]
    fn depth_counts_taken_messages_until_they_finish() {
        let q = MemoryQueue::default();
        assert!(matches!(q.push(new("a"), 2), Pushed::Queued(_)));
        assert!(matches!(q.push(new("b"), 2), Pushed::Queued(_)));
        assert_eq!(q.push(new("c"), 2), Pushed::Full);
        let taken = q.read(10);
        assert_eq!(taken.len(), 2);
        // Taken is still in the queue: no room yet.
        assert_eq!(q.push(new("c"), 2), Pushed::Full);
        assert_eq!(q.attempt("a", 6), 1);
        q.complete(&taken[0], 204, 7, Duration::from_secs(60));
        assert!(matches!(q.push(new("c"), 2), Pushed::Queued(_)));
        let a = q.status("a");
        assert_eq!(a.as_ref().map(|s| s.state), Some(MessageState::Delivered));
        assert_eq!(a.and_then(|s| s.status), Some(204));
        assert_eq!(
            q.keep(&[&taken[0].entry, &taken[1].entry]),
            [taken[0].entry.clone()]
        );
    }

    #[test]
    fn dead_letters_are_listed_redriven_with_fresh_attempts_and_discarded() {
        let q = MemoryQueue::default();
        for id in ["a", "b"] {
            let _ = q.push(new(id), 10);
        }
        for m in q.read(2) {
            assert_eq!(q.attempt(&m.id, 6), 1);
            q.bury(
                DeadLetter {
                    message: m,
                    attempts: 1,
                    status: Some(500),
                    error: None,
                    died_ms: 8,
                },
                10,
            );
        }
        assert_eq!(q.stats().depth, 0);
        assert_eq!(q.stats().dead, 2);
        let page = q.dead_letters(None, 1);
        assert_eq!(page.len(), 1);
        let rest = q.dead_letters(Some(&page[0].message.entry), 10);
        assert_eq!(
            rest.iter()
                .map(|d| d.message.id.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
        assert_eq!(q.redrive("a", 9, 1), Redriven::Queued);
        assert_eq!(q.redrive("a", 9, 10), Redriven::NotDead);
        // The queue holds its most: a re-drive waits for room.
        assert_eq!(q.redrive("b", 9, 1), Redriven::Full);
        let a = q.status("a");
        assert_eq!(
            a.as_ref().map(|s| (s.state, s.attempts)),
            Some((MessageState::Queued, 0))
        );
        assert_eq!(
            q.read(5).iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        assert!(q.discard("b"));
        assert!(q.status("b").is_none());
        assert_eq!(q.stats().dead, 0);
    }

    #[test]
    fn dead_letters_past_their_bound_push_the_oldest_out() {
        let q = MemoryQueue::default();
        for id in ["a", "b", "c"] {
            let _ = q.push(new(id), 10);
        }
        for m in q.read(3) {
            q.bury(
                DeadLetter {
                    message: m,
                    attempts: 1,
                    status: None,
                    error: Some("refused".into()),
                    died_ms: 8,
                },
                2,
            );
        }
        let ids: Vec<String> = q
            .dead_letters(None, 10)
            .into_iter()
            .map(|d| d.message.id)
            .collect();
        assert_eq!(ids, ["b", "c"]);
        assert!(q.status("a").is_none());
    }
}
