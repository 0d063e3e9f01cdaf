//! Settling a finished delivery: done (recorded), tried again after the policy's backoff, or
//! buried in the dead letters after its last attempt. Apart from the drain loop, which only
//! hands each finished task here.

use tokio::task::Id;
use tokio::time::Instant;

use super::super::backend::Burial;
use super::super::{STATUS_KEPT, now_ms};
use super::{Attempt, Delivered, Drainer, Held, STORE_PAUSE};

impl Drainer {
    /// Settles a finished delivery task.
    pub(super) async fn settle(
        &mut self,
        done: Result<(Id, (Held, Attempt)), tokio::task::JoinError>,
    ) {
        let (held, outcome) = match done {
            Ok((id, result)) => {
                self.in_flight_entries.remove(&id);
                result
            }
            Err(e) => {
                // The message stays pending; with Redis another instance (or this one, past the
                // claim timeout) takes it over.
                let entry = self.in_flight_entries.remove(&e.id());
                tracing::error!(policy = %self.queue.name, ?entry, error = %e, "queue: a delivery task failed");
                return;
            }
        };
        let lost = self.lost.remove(&held.message.entry);
        let q = &self.queue;
        let now = now_ms();
        // The attempt number, the upstream's status or the error, and whether retrying is
        // pointless whatever the attempts left.
        let (attempts, status, error, hopeless) = match outcome {
            Attempt::NotTried => {
                if !lost {
                    self.paused_until = Instant::now() + STORE_PAUSE;
                    self.waiting.push_front(held);
                }
                return;
            }
            Attempt::Unreadable { attempts } => {
                (attempts, None, "the stored request cannot be read", true)
            }
            Attempt::Tried {
                attempts,
                delivered,
            } => match delivered {
                Delivered::Answered(status) if settled(status) => {
                    q.counters.delivered(status >= 400);
                    if let Err(e) = q
                        .backend
                        .complete(&held.message, status, now, STATUS_KEPT)
                        .await
                    {
                        tracing::warn!(policy = %q.name, id = %held.message.id, error = %e, "queue: delivered, but cannot record it (it may be delivered again)");
                    }
                    return;
                }
                Delivered::Answered(status) => (attempts, Some(status), "", false),
                Delivered::Failed(reason) => (attempts, None, reason, false),
            },
        };
        if lost {
            return;
        }
        if attempts >= self.settings.attempts || hopeless {
            q.counters.dead();
            tracing::warn!(policy = %q.name, id = %held.message.id, attempts, ?status, error, "queue: out of attempts; moved to the dead letters");
            let burial = Burial {
                message: &held.message,
                attempts,
                status,
                error,
                max_dead: self.settings.max_depth,
            };
            if let Err(e) = q.backend.bury(burial, now).await {
                tracing::warn!(policy = %q.name, id = %held.message.id, error = %e, "queue: cannot bury a message (it will be tried again)");
            }
            return;
        }
        q.counters.retry();
        let _ = q.backend.note(&held.message.id, status, error, now).await;
        let wait = self.settings.backoff_for(attempts);
        tracing::debug!(policy = %q.name, id = %held.message.id, attempts, ?status, error, ?wait, "queue: delivery failed; tried again later");
        self.waiting.push_back(Held {
            not_before: Instant::now() + wait,
            ..held
        });
    }
}

/// Whether an answer settles a delivery: 1xx–3xx, and any 4xx but 408 and 429 (the upstream
/// refused this request for good). 5xx, 408 and 429 are tried again.
fn settled(status: u16) -> bool {
    status < 500 && status != 408 && status != 429
}

#[cfg(test)]
mod tests {
    use super::settled;

    #[test]
    fn only_5xx_408_and_429_are_tried_again() {
        for s in [200, 201, 204, 301, 304, 400, 401, 404, 409, 410, 422] {
            assert!(settled(s), "{s}");
        }
        for s in [408, 429, 500, 502, 503, 504, 599] {
            assert!(!settled(s), "{s}");
        }
    }
}
