//! After the response: what an admitted request really cost. A policy with
//! `charge = "response"` charges what the response says it used (the tokens an AI API answered
//! with, read by [`UsageMeter`] from a header or the JSON body as it passes) less what
//! admission already charged; a policy with `count_status` counts only responses whose status
//! it lists, and gives the rest back. The door hands the response to a [`Settle`] and finishes
//! it when the exchange ends; the true-up is a charge or a refund, never refused.

mod status_set;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Waker};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use smallvec::SmallVec;
use tollgate::{Check, Clock, Store};

use super::permits::SmallEntries;
use super::{Engine, Entry};
use crate::CostFrom;
use crate::usage::{Usage, UsageMeter};

pub use status_set::StatusSet;

/// When a policy charges a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Charge {
    /// Up front: the policy's `cost`, at admission.
    #[default]
    Request,
    /// Once the response says what it cost (`cost_from`): admission charges the policy's
    /// `cost` (what a request needs left to be admitted), the response's cost trues it up.
    Response(CostFrom),
}

/// One policy's part of a true-up.
#[derive(Debug)]
struct Due {
    entry: Entry,
    meter: Option<UsageMeter>,
    /// The cost as the door learned it otherwise (a log line's field), which a meter would
    /// otherwise read.
    reported: Option<u64>,
}

/// The true-up of an admitted request, once its response is known: hand it the response
/// ([`response`](Settle::response) or [`response_from`](Settle::response_from)), feed it the
/// body while [`reads_body`](Settle::reads_body), and [`finish`](Settle::finish) it when the
/// exchange ends. Dropped unfinished (the client went away, the upstream failed mid-body), it
/// settles with what it knows: a cost it never saw is charged the fallback (the policy's
/// `cost`), so the request is never charged less than admission said.
pub struct Settle<S: Store, C: Clock> {
    engine: Engine<S, C>,
    dues: SmallVec<[Due; 1]>,
    /// The concurrency slots the request holds, given back when the exchange ends.
    slots: SmallEntries,
    status: Option<u16>,
    /// The response was the door's own (the upstream failed: 502, 504), so there is no cost in
    /// it to read: admission's charge stands, and no fallback is counted.
    answered_here: bool,
    done: bool,
}

impl<S: Store, C: Clock> fmt::Debug for Settle<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settle")
            .field("dues", &self.dues)
            .field("slots", &self.slots.len())
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl<S: Store, C: Clock> Settle<S, C> {
    /// The true-up of `dues` (policies that charge by the response) and the release of
    /// `slots` (concurrency permits taken).
    pub(super) fn new(
        engine: Engine<S, C>,
        dues: impl IntoIterator<Item = Entry>,
        slots: SmallEntries,
    ) -> Self {
        engine.hold_slots(&slots);
        Settle {
            engine,
            dues: dues
                .into_iter()
                .map(|entry| Due {
                    entry,
                    meter: None,
                    reported: None,
                })
                .collect(),
            slots,
            status: None,
            answered_here: false,
            done: false,
        }
    }

    /// Whether the response's status and headers matter (a policy trues up by them); a settle
    /// that only gives slots back needs nothing of the response.
    pub fn reads_response(&self) -> bool {
        !self.dues.is_empty()
    }

    /// Whether some policy reads the request's cost from the response body (`cost_from =
    /// "json:..."`), known before the response: the door must ask the upstream for an
    /// uncompressed body, or a client that accepts gzip would hide its usage.
    pub fn reads_cost_from_body(&self) -> bool {
        self.dues.iter().any(
            |d| match &self.engine.inner.policies[d.entry.index].http.charge {
                Charge::Response(from) => from.header().is_none(),
                Charge::Request => false,
            },
        )
    }

    /// Whether the request holds concurrency slots, given back when this settles.
    pub fn holds_slots(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Leaves the request's concurrency slots to their `lease_ttl`: for a door that never
    /// learns when the request ends (forward-auth).
    pub fn keep_slots(&mut self) {
        let kept = std::mem::take(&mut self.slots);
        self.engine.hand_off(&kept);
    }

    /// Hands the request's concurrency slots to the caller as a lease token, which
    /// [`Engine::release_lease`] takes back (`/v1/check` in `"mode": "acquire"`); `None` when
    /// it holds none. Unreleased, the slots return at their `lease_ttl`.
    pub fn lease(&mut self) -> Option<String> {
        if self.slots.is_empty() {
            return None;
        }
        let slots = std::mem::take(&mut self.slots);
        self.engine.hand_off(&slots);
        Some(self.engine.lease_token(&slots))
    }

    /// The response's status and headers (a `header:` cost is read here).
    pub fn response(&mut self, status: StatusCode, headers: &HeaderMap) {
        self.status = Some(status.as_u16());
        for due in &mut self.dues {
            let policy = &self.engine.inner.policies[due.entry.index].http;
            if let Charge::Response(cost_from) = &policy.charge {
                due.meter = Some(UsageMeter::new(cost_from, headers));
            }
        }
    }

    /// [`response`](Settle::response) from a response head read as raw header lines (a server
    /// that parses HTTP/1.1 itself): only the headers a cost is read from are copied.
    pub fn response_from<'h>(
        &mut self,
        status: u16,
        headers: impl IntoIterator<Item = (&'h str, &'h [u8])>,
    ) {
        let mut wanted = HeaderMap::new();
        if self.meters() {
            for (name, value) in headers {
                if self.reads_header(name)
                    && let (Ok(n), Ok(v)) = (
                        HeaderName::from_bytes(name.as_bytes()),
                        HeaderValue::from_bytes(value),
                    )
                {
                    wanted.append(n, v);
                }
            }
        }
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        self.response(status, &wanted);
    }

    /// The client got the door's own answer instead of the upstream's (the upstream failed:
    /// 502, 504): its status counts for `count_status` (a 5xx error budget counts upstream
    /// failures), and a policy charged by the response keeps admission's charge, as a request
    /// that got no response does, without counting a fallback: there was no response to read.
    pub fn answered_here(&mut self, status: u16) {
        self.answered_here = true;
        self.response_from(status, std::iter::empty());
    }

    /// The response's cost as the door knows it without reading the response (`tollgate
    /// replay`: the log line's cost field), for every policy that charges by the response.
    pub fn reported(&mut self, cost: u64) {
        for due in &mut self.dues {
            due.reported = Some(cost);
        }
    }

    /// Whether some policy reads its cost from the response.
    fn meters(&self) -> bool {
        self.dues.iter().any(|d| {
            matches!(
                self.engine.inner.policies[d.entry.index].http.charge,
                Charge::Response(_)
            )
        })
    }

    /// Whether a response header named `name` says something a cost is read from.
    fn reads_header(&self, name: &str) -> bool {
        name.eq_ignore_ascii_case("content-type")
            || name.eq_ignore_ascii_case("content-encoding")
            || self.dues.iter().any(|d| {
                match &self.engine.inner.policies[d.entry.index].http.charge {
                    Charge::Response(c) => c
                        .header()
                        .is_some_and(|h| h.as_str().eq_ignore_ascii_case(name)),
                    Charge::Request => false,
                }
            })
    }

    /// Whether the body must be fed (some policy reads its cost from it).
    pub fn reads_body(&self) -> bool {
        self.dues
            .iter()
            .any(|d| d.meter.as_ref().is_some_and(UsageMeter::reads_body))
    }

    /// The next chunk of the response body, as it passes to the client.
    #[inline]
    pub fn feed(&mut self, chunk: &[u8]) {
        for due in &mut self.dues {
            if let Some(meter) = &mut due.meter {
                meter.feed(chunk);
            }
        }
    }

    /// The exchange is over (the body has all been fed): trues up every policy. Never waits:
    /// on a store that answers at once it is done here, otherwise in a task of its own.
    pub fn finish(mut self) {
        self.settle();
    }

    /// [`finish`](Self::finish), returning once the store has the true-up: a door that reads
    /// the next request on the same connection awaits it first, so that request is decided on
    /// the trued-up count (on a shared store, a spawned true-up could land after it). On a
    /// store that answers at once it is `finish`.
    pub async fn finish_in_order(mut self) {
        if let Some(work) = self.true_up() {
            work.await;
        }
    }

    fn settle(&mut self) {
        if let Some(work) = self.true_up() {
            self.engine.run_now_or_spawn(work, "a response's true-up");
        }
    }

    /// Gives the slots back and works out every policy's true-up: the store calls to make,
    /// if any. Done once.
    fn true_up(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        if self.done {
            return None;
        }
        self.done = true;
        self.engine.release(std::mem::take(&mut self.slots));
        // No response at all (the request never left, or the upstream never answered a
        // head): admission's charge stands as it is (a held request's refund, if any, is its
        // hold's to give).
        self.status?;
        let mut charges: SmallVec<[(usize, u32); 2]> = SmallVec::new();
        let mut refunds: SmallVec<[(usize, u32); 2]> = SmallVec::new();
        for (i, due) in self.dues.iter_mut().enumerate() {
            let compiled = &self.engine.inner.policies[due.entry.index];
            let admitted = due.entry.cost;
            let counts = match (&compiled.http.count_status, self.status) {
                (Some(set), Some(status)) => set.contains(status),
                _ => true,
            };
            let actual = if !counts {
                0
            } else if self.answered_here {
                admitted
            } else {
                let usage = match (&compiled.http.charge, due.reported, due.meter.take()) {
                    // A cost the door knew without reading the response (replay's log line)
                    // is held to the bound a read one is held to; a policy that counts by
                    // status alone keeps its own cost.
                    (Charge::Response(from), Some(cost), _) if cost > from.max() => {
                        Some(Usage::Bad(crate::usage::BadReason::TooLarge))
                    }
                    (Charge::Response(_), Some(cost), _) => Some(Usage::Found(cost)),
                    (_, _, meter) => meter.map(UsageMeter::finish),
                };
                match usage {
                    Some(Usage::Found(cost)) => u32::try_from(cost).unwrap_or(u32::MAX),
                    Some(usage) => {
                        compiled.usage_fallback(&usage);
                        admitted
                    }
                    None if matches!(compiled.http.charge, Charge::Response(_)) => {
                        compiled.usage_fallback(&Usage::Missing(
                            crate::usage::MissingReason::NotInBody,
                        ));
                        admitted
                    }
                    None => admitted,
                }
            };
            if actual > admitted {
                charges.push((i, actual - admitted));
            } else if actual < admitted {
                refunds.push((i, admitted - actual));
            }
        }
        if charges.is_empty() && refunds.is_empty() {
            return None;
        }
        let engine = self.engine.clone();
        let dues: SmallVec<[Entry; 2]> = self.dues.drain(..).map(|d| d.entry).collect();
        Some(async move {
            let checks = |list: &[(usize, u32)]| -> SmallVec<[Check<'_>; 2]> {
                list.iter()
                    .map(|&(i, cost)| Check {
                        cost,
                        ..engine.check(&dues[i])
                    })
                    .collect()
            };
            let now = engine.inner.limiter.clock().now();
            let store = engine.inner.limiter.store();
            if !charges.is_empty()
                && let Err(error) = store.charge(now, &checks(&charges)).await
            {
                tracing::warn!(%error, "could not charge a response's cost; it is lost");
            }
            if !refunds.is_empty()
                && let Err(error) = store.refund(now, &checks(&refunds)).await
            {
                tracing::debug!(%error, "could not give back what a response did not cost");
            }
        })
    }
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// Runs `work` (a store call and what follows it) without making the caller wait: polled
    /// once here on a store that answers at once, else spawned on the runtime. `what` names it
    /// in the log if it cannot run.
    pub(super) fn run_now_or_spawn(
        &self,
        work: impl Future<Output = ()> + Send + 'static,
        what: &'static str,
    ) {
        if self.inner.limiter.store().is_immediate() {
            // The memory store answers on the first poll: done here, with no task.
            let future = std::pin::pin!(work);
            if future
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending()
            {
                tracing::warn!(what, "an immediate store left a call pending; it is lost");
            }
        } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(work);
        } else {
            tracing::warn!(what, "no runtime to call the store on; the call is lost");
        }
    }
}

impl<S: Store, C: Clock> Drop for Settle<S, C> {
    fn drop(&mut self) {
        self.settle();
    }
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// Each policy's count of responses charged the fallback because their cost was missing or
    /// bad (`charge = "response"`), for metrics: (policy name, count).
    pub fn usage_fallbacks(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.inner
            .policies
            .iter()
            .filter(|p| matches!(p.http.charge, Charge::Response(_)))
            .map(|p| {
                (
                    p.http.policy.name(),
                    p.usage.fallbacks.load(Ordering::Relaxed),
                )
            })
    }
}

/// The responses whose cost could not be read, by policy name, for engines built one after
/// another (a server's reloads, [`EngineBuilder::usage_counters`]): the count and its one log
/// line outlive each engine. A clone is a handle to the same counters.
///
/// [`EngineBuilder::usage_counters`]: super::EngineBuilder::usage_counters
#[derive(Clone, Debug, Default)]
pub struct UsageCounters(Arc<Mutex<HashMap<String, Arc<UsageCount>>>>);

impl UsageCounters {
    /// The counter of `policy`, made on first use.
    pub(super) fn of(&self, policy: &str) -> Arc<UsageCount> {
        let mut counters = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(counters.entry(policy.to_owned()).or_default())
    }
}

/// One policy's responses charged the fallback, and whether that was logged yet.
#[derive(Debug, Default)]
pub(super) struct UsageCount {
    fallbacks: AtomicU64,
    warned: AtomicBool,
}

impl super::Compiled {
    /// Counts a response charged the fallback, and says so in the log once per policy.
    fn usage_fallback(&self, usage: &Usage) {
        self.usage.fallbacks.fetch_add(1, Ordering::Relaxed);
        if !self.usage.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                policy = self.http.policy.name(),
                %usage,
                "a response's cost could not be read; it was charged the policy's cost (logged \
                 once per policy; tollgate_usage_fallbacks_total counts them all)"
            );
        }
    }
}
