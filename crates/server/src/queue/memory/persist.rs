//! A memory queue's requests for the state file (`[store] path`): what waits (taken ones
//! included: a delivery cut off by a stop is tried again, with the same `Idempotency-Key`) and
//! the dead letters, with their statuses.

use tollgate_redis::stream_queue::{DeadLetter, MessageState, MessageStatus, QueuedMessage};

use super::MemoryQueue;

/// A queue's requests, as kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Kept {
    /// Waiting for delivery, oldest first, with their statuses.
    pub(crate) waiting: Vec<(QueuedMessage, MessageStatus)>,
    /// Out of attempts.
    pub(crate) dead: Vec<DeadLetter>,
}

impl MemoryQueue {
    /// A copy of the queue's requests.
    pub(crate) fn export(&self) -> Kept {
        let s = self.state();
        let status = |m: &QueuedMessage| {
            s.statuses.get(&m.id).cloned().unwrap_or(MessageStatus {
                state: MessageState::Queued,
                attempts: 0,
                status: None,
                error: None,
                enqueued_ms: m.enqueued_ms,
                updated_ms: m.enqueued_ms,
            })
        };
        // Taken ones first: they were read before those still waiting.
        let mut taken: Vec<&QueuedMessage> = s.taken.values().collect();
        taken.sort_by_key(|m| entry_seq(&m.entry));
        let waiting = taken
            .into_iter()
            .chain(s.ready.iter())
            .map(|m| (m.clone(), status(m)))
            .collect();
        Kept {
            waiting,
            dead: s.dead.iter().cloned().collect(),
        }
    }

    /// Adds `kept` after what the queue holds: the waiting requests to be delivered (their
    /// attempts so far counted), the dead letters to be re-driven or discarded.
    pub(crate) fn import(&self, kept: Kept) {
        let mut s = self.state();
        for (mut m, mut status) in kept.waiting {
            m.entry = s.entry();
            status.state = MessageState::Queued;
            s.statuses.insert(m.id.clone(), status);
            s.ready.push_back(m);
        }
        for mut d in kept.dead {
            d.message.entry = s.entry();
            s.statuses.insert(
                d.message.id.clone(),
                MessageStatus {
                    state: MessageState::Dead,
                    attempts: d.attempts,
                    status: d.status,
                    error: d.error.clone(),
                    enqueued_ms: d.message.enqueued_ms,
                    updated_ms: d.died_ms,
                },
            );
            s.dead.push_back(d);
        }
    }
}

fn entry_seq(entry: &str) -> u64 {
    entry
        .split('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

impl crate::queue::Queues {
    /// Every memory queue's requests, by policy name, for the state file.
    pub(crate) fn export_memory(&self) -> Vec<(String, Kept)> {
        self.all()
            .iter()
            .filter_map(|q| match &q.backend {
                crate::queue::Backend::Memory(m) => Some((q.name.clone(), m.export())),
                _ => None,
            })
            .collect()
    }

    /// Puts requests kept in the state file back into the memory queue of policy `name`;
    /// false when this instance has no such queue open (the policy is gone or no longer
    /// queues).
    pub(crate) fn import_memory(&self, name: &str, kept: Kept) -> bool {
        match self.get(name).as_deref().map(|q| &q.backend) {
            Some(crate::queue::Backend::Memory(m)) => {
                m.import(kept);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_redis::stream_queue::{NewMessage, Pushed};

    use super::*;

    #[test]
    fn a_queue_comes_back_with_taken_requests_waiting_again() {
        let q = MemoryQueue::default();
        for i in 0..4u8 {
            let id = format!("m{i}");
            let pushed = q.push(
                NewMessage {
                    id: &id,
                    key: b"k",
                    payload: &[i],
                    enqueued_ms: 1_000 + u64::from(i),
                },
                100,
            );
            assert!(matches!(pushed, Pushed::Queued(_)));
        }
        let taken = q.read(2);
        assert_eq!(q.attempt("m0", 2_000), 1);
        q.bury(
            DeadLetter {
                message: taken[1].clone(),
                attempts: 3,
                status: Some(503),
                error: None,
                died_ms: 3_000,
            },
            10,
        );
        let kept = q.export();
        assert_eq!(kept.waiting.len(), 3);
        assert_eq!(kept.dead.len(), 1);
        let back = MemoryQueue::default();
        back.import(kept);
        assert_eq!(back.stats().depth, 3);
        assert_eq!(back.stats().dead, 1);
        let m0 = back.status("m0").unwrap_or_else(|| panic!("m0"));
        assert_eq!((m0.state, m0.attempts), (MessageState::Queued, 1));
        let order: Vec<String> = back.read(3).into_iter().map(|m| m.id).collect();
        assert_eq!(order, ["m0", "m2", "m3"]);
        assert_eq!(back.status("m1").map(|s| s.state), Some(MessageState::Dead));
    }
}
