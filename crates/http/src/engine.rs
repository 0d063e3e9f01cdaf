//! The policy engine: which policies a request falls under, whose key it is counted against,
//! what the limiter decides, and what to answer. Independent of tower, so the server's proxy,
//! check API and forward-auth endpoint use it exactly as the layer does.
//!
//! One request is two steps: [`Engine::prepare`] (synchronous: route matching, key selection,
//! JWT verification) and [`Engine::decide`] (one `check_all` against the store, all-or-nothing
//! across every matching policy). [`Engine::evaluate`] does both.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{HeaderName, StatusCode};
use smallvec::SmallVec;
use tollgate::{
    Check, Clock, Decision, Decisions, Error, Limiter, MemoryStore, OnError, Store, SystemClock,
};

use crate::headers::{HeaderList, PolicyHeaders, PolicyText, render};
use crate::key::{CredentialHasher, KeyBuf, KeyContext};
use crate::route::{NormalizedPath, PathTooDeep};
use crate::{HeaderConfig, JwtVerifier, Refusal, RequestInfo, normalize};

mod bans;
mod builder;
mod evaluation;
mod lists;
mod outage;
pub(crate) mod overrides;
mod permits;
mod policy;
mod queue;
mod respond;
mod settle;
mod slot_lease;

pub use bans::BANNED_TITLE;
pub use builder::EngineBuilder;
pub use evaluation::{Answer, Disposition, Evaluation, Hold, Prepared, RateLimitHeaders};
use evaluation::{Entry, RefundGuard};
pub use lists::{ListAction, ListEntry, ListHit, ListSpec};
pub use permits::REMOTE_POLL;
pub use policy::{Action, HttpPolicy};
pub use queue::QueueTicket;
pub use settle::{Charge, Settle, StatusSet, UsageCounters};
pub use slot_lease::LeaseError;

use overrides::{KeyOverride, Overrides};

/// The key a request without one is counted under (per policy), unless the policy requires a
/// key. Selector keys always contain a `:`, so no request can claim this one.
pub const ANONYMOUS_KEY: &[u8] = b"anonymous";

/// The default bound on a held request's wait with the `delay` action.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(10);

/// A policy with everything a request needs precomputed.
#[derive(Debug)]
struct Compiled {
    http: HttpPolicy,
    text: &'static PolicyHeaders,
    /// Whether an admitted request has something to do when its exchange ends: a true-up
    /// once its response is known (`charge = "response"` or `count_status`), or a slot to
    /// give back (a concurrency limit).
    settles: bool,
    /// A concurrency limit: each request takes a permit.
    concurrent: bool,
    /// A concurrency limit with `delay`: a request denied a slot waits in line for one.
    waits: bool,
    /// This instance's slots of a concurrency limit, for metrics.
    slots: permits::SlotCounts,
    /// Responses charged the fallback because their cost was missing or bad.
    usage: Arc<settle::UsageCount>,
}

/// What the tower layer takes of a decision made at once: the headers, what to do, and the
/// true-up to hand the response to.
pub(crate) type Now<S, C> = (
    RateLimitHeaders,
    Disposition<S, C>,
    Option<Box<Settle<S, C>>>,
);

/// Finds a client address from the request; the engine's default reads the peer and, from
/// trusted proxies, the forwarding header.
type ResolveIp = dyn Fn(&RequestInfo<'_>) -> Result<Option<IpAddr>, Refusal> + Send + Sync;

struct Inner<S, C> {
    limiter: Limiter<S, C>,
    policies: Vec<Compiled>,
    headers: HeaderConfig,
    jwt: Option<JwtVerifier>,
    hasher: CredentialHasher,
    ipv6_prefix: u8,
    on_error: OnError,
    resolve_ip: Box<ResolveIp>,
    /// Whether some route matches on the path; if none does, requests skip normalising it.
    reads_path: bool,
    /// Whether some route matches on the host; if none does, the layer does not look it up.
    reads_host: bool,
    /// The request headers a decision can read (see [`Engine::headers_read`]).
    headers_read: Vec<HeaderName>,
    /// Per-key quotas in place of the policies' own.
    overrides: Overrides,
    /// Requests waiting for a concurrency slot, by policy and key.
    lines: permits::Lines,
    /// The key lease tokens are signed under.
    lease_tag: tollgate::key_digest::KeyDigest,
    /// Allow and deny lists, applied before any policy.
    lists: lists::Lists,
    /// The log of store failures: rate-limited, and told when they end.
    outage: outage::Outage,
}

impl<S, C> fmt::Debug for Inner<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("policies", &self.policies)
            .field("headers", &self.headers)
            .field("jwt", &self.jwt)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .field("on_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

/// The policy engine. Cheap to clone; clones share the limiter, the store and the policies.
#[derive(Debug)]
pub struct Engine<S = MemoryStore, C = SystemClock> {
    // One shared allocation, the limiter inside: a clone per request (as tower services make)
    // is one reference-count update, which matters when cores contend for it.
    inner: Arc<Inner<S, C>>,
}

impl<S, C> Clone for Engine<S, C> {
    fn clone(&self) -> Self {
        Engine {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// The rate-limit headers for decisions of this engine's policies made outside a request, by a
    /// decision API that checks a policy by name (the server's `/v1/check`): the same headers a
    /// request through the layer gets, `Retry-After` included when denied. Empty when a decision
    /// comes from a policy this engine does not have.
    pub fn headers_for(&self, decisions: &Decisions) -> RateLimitHeaders {
        self.headers_for_overridden(decisions, &[])
    }

    /// [`headers_for`](Self::headers_for) decisions of which the i-th was made under the
    /// override `overrides[i]` when there is one (see [`Engine::key_override`]).
    pub fn headers_for_overridden(
        &self,
        decisions: &Decisions,
        overrides: &[Option<Arc<KeyOverride>>],
    ) -> RateLimitHeaders {
        let indexes: SmallVec<[usize; 4]> = decisions
            .as_slice()
            .iter()
            .filter_map(|d| {
                self.inner
                    .policies
                    .iter()
                    .position(|p| p.http.policy.name() == d.policy)
            })
            .collect();
        if indexes.len() != decisions.len() {
            return RateLimitHeaders::default();
        }
        let mut headers = self.render_at(decisions, &indexes, overrides);
        if !decisions.allowed()
            && let Some((_, field)) = self.retry_after_at(decisions, &headers, &indexes)
        {
            headers.set_retry(field);
        }
        RateLimitHeaders(headers)
    }

    /// The limiter (for checks by policy name, such as the server's `/v1/check`).
    pub fn limiter(&self) -> &Limiter<S, C> {
        &self.inner.limiter
    }

    /// The policies, in order.
    pub fn policies(&self) -> impl Iterator<Item = &HttpPolicy> {
        self.inner.policies.iter().map(|c| &c.http)
    }

    /// The request headers a decision can read: each `header:` key selector's, `Authorization`
    /// when some key is a `jwt:` claim, and the forwarding header read from trusted proxies.
    /// (`Host` is [`RequestInfo::host`].) A caller that hands the engine a reduced header map,
    /// as the server's relay does, copies these and needs nothing else.
    pub fn headers_read(&self) -> &[HeaderName] {
        &self.inner.headers_read
    }

    /// Whether some policy's route matches on the host.
    pub(crate) fn reads_host(&self) -> bool {
        self.inner.reads_host
    }

    /// The header settings.
    pub fn header_config(&self) -> &HeaderConfig {
        &self.inner.headers
    }

    /// Matches the request against the policies and selects its keys.
    pub fn prepare(&self, info: &RequestInfo<'_>) -> Prepared {
        let mut prepared = Prepared::default();
        let path = if self.inner.reads_path {
            match NormalizedPath::new(info.path) {
                Ok(path) => path,
                Err(PathTooDeep) => {
                    let refusal = Refusal::new(StatusCode::URI_TOO_LONG, "URI Too Long", "")
                        .with_detail(format!("The request {PathTooDeep}."));
                    prepared.refusal = Some(Box::new(refusal));
                    return prepared;
                }
            }
        } else {
            NormalizedPath::default()
        };
        let cx = KeyContext {
            info,
            jwt: self.inner.jwt.as_ref(),
            claims: Default::default(),
            client_ip: Default::default(),
            resolve_ip: &*self.inner.resolve_ip,
            ipv6_prefix: self.inner.ipv6_prefix,
        };
        if self.apply_lists(&cx, &mut prepared) {
            return prepared;
        }
        for (index, policy) in self.inner.policies.iter().enumerate() {
            let http = &policy.http;
            if !http.route.matches(info.method, &path, info.host) {
                continue;
            }
            let mut key = KeyBuf::new();
            let found = match cx.key(&http.keys, &self.inner.hasher, &mut key) {
                Ok(found) => found,
                Err(refusal) => {
                    prepared.refusal = Some(Box::new(refusal));
                    prepared.entries.clear();
                    return prepared;
                }
            };
            if !found {
                if http.require_key {
                    prepared.refusal = Some(Box::new(key_required(http.policy.name())));
                    prepared.entries.clear();
                    return prepared;
                }
                key.clear();
                key.extend_from_slice(ANONYMOUS_KEY);
            }
            let over = self.live_override(index, &key);
            let cost = http.cost;
            prepared.entries.push(Entry {
                index,
                key,
                cost,
                over,
                permit: self.permit_for(index),
            });
        }
        if !prepared.entries.is_empty()
            && let Err(refusal) = readable(info)
        {
            prepared.refusal = Some(Box::new(refusal));
            prepared.entries.clear();
        }
        prepared
    }

    /// Prepares a check of `key` under the policy named `policy` for `cost`, as the doors that
    /// name a policy do (`/v1/check` by policy, the Redis-protocol door): the key is counted as
    /// [`store_key`](Self::store_key) writes it, under its override when it has one, and
    /// decided like any request (the same failure rule, headers and 429). `None` for a policy
    /// this engine does not have.
    pub fn prepare_key(&self, policy: &str, key: &[u8], cost: u32) -> Option<Prepared> {
        let index = self
            .inner
            .policies
            .iter()
            .position(|p| p.http.policy.name() == policy)?;
        let mut stored = KeyBuf::new();
        self.store_key(key, &mut stored);
        let mut prepared = Prepared::default();
        if self.apply_key_lists(&stored, &mut prepared) {
            return Some(prepared);
        }
        let over = self.live_override(index, &stored);
        prepared.entries.push(Entry {
            index,
            key: stored,
            cost,
            over,
            permit: self.permit_for(index),
        });
        Some(prepared)
    }

    /// Appends the key a store counts a caller's `key` under (a key given by name rather than
    /// selected from a request): the core's long-key rule
    /// ([`KeyDigest::write_key`](tollgate::key_digest::KeyDigest::write_key)) under the
    /// engine's key secret. This is the form `/v1/top` shows and overrides and lists take.
    pub fn store_key(&self, key: &[u8], out: &mut impl Extend<u8>) {
        self.inner.hasher.write_key(key, out);
    }

    /// A fresh permit for a request under the policy at `index` when it is a concurrency
    /// limit; 0 (none) otherwise.
    #[inline]
    fn permit_for(&self, index: usize) -> u64 {
        if self.inner.policies[index].concurrent {
            tollgate::next_permit()
        } else {
            0
        }
    }

    /// Whether deciding `prepared` may wait for a concurrency slot, which only the general,
    /// awaited path does.
    fn may_wait(&self, prepared: &Prepared) -> bool {
        prepared.entries.iter().any(|e| self.waits(e.index))
    }

    /// The override of `key` under the policy at `index`, if one applies now. The clock is
    /// read only for a key that has one.
    #[inline]
    fn live_override(&self, index: usize, key: &[u8]) -> Option<Arc<KeyOverride>> {
        let over = self.inner.overrides.get(index, key)?;
        over.applies_at(self.inner.limiter.clock().now())
            .then_some(over)
    }

    /// Matches, selects keys and decides.
    pub async fn evaluate(&self, info: &RequestInfo<'_>) -> Evaluation<S, C> {
        let prepared = self.prepare(info);
        self.decide(prepared).await
    }

    /// Decides a prepared request: one all-or-nothing `check_all` over every matching policy.
    pub async fn decide(&self, prepared: Prepared) -> Evaluation<S, C> {
        self.decide_ref(&prepared).await
    }

    /// [`decide`](Self::decide), leaving the prepared request with the caller, who can read its
    /// [`keys`](Prepared::keys) next to the decisions (the server's top-keys sketches do).
    pub async fn decide_prepared(&self, prepared: &Prepared) -> Evaluation<S, C> {
        self.decide_ref(prepared).await
    }

    /// Charges a prepared request's costs whatever the quotas say, never refusing: a usage
    /// report (`/v1/check` with `"mode": "report"`, a cost known only once the work was done).
    /// The decisions are admitted and say what each key has left; a failed store is answered
    /// by the one failure rule, as any request.
    pub async fn report_prepared(&self, prepared: &Prepared) -> Evaluation<S, C> {
        if let Some(refusal) = &prepared.refusal {
            return self.refused(refusal);
        }
        let entries = &prepared.entries;
        if entries.is_empty() {
            return self.evaluation(Decisions::new(), HeaderList::new(), Disposition::Pass);
        }
        let checks: SmallVec<[Check<'_>; 4]> = entries.iter().map(|e| self.check(e)).collect();
        let now = self.inner.limiter.clock().now();
        match self.inner.limiter.store().charge(now, &checks).await {
            Ok(decisions) if decisions.len() == entries.len() => {
                let decisions = decisions.at(now);
                let headers = self.render(&decisions, entries);
                self.evaluation(decisions, headers, Disposition::Pass)
            }
            Ok(_) => self.failed(miscounted(), entries),
            Err(e) => self.failed(e.into(), entries),
        }
    }

    /// Decides a prepared request without awaiting, when the store answers at once (the memory
    /// store, see [`Store::is_immediate`]); hands the request back for [`decide`](Self::decide)
    /// otherwise. The evaluation is the one `decide` would give. A caller on a hot path saves the
    /// future it would otherwise have to keep (and usually box) across the store call.
    // Both sides are moved once, on the stack; boxing either would add the allocation per
    // request this function exists to avoid.
    #[allow(clippy::result_large_err)]
    pub fn decide_now(&self, prepared: Prepared) -> Result<Evaluation<S, C>, Prepared> {
        match self.decide_now_ref(&prepared) {
            Some(evaluation) => Ok(evaluation),
            None => Err(prepared),
        }
    }

    /// [`decide_now`](Self::decide_now) without taking the request: `None` when the store
    /// does not answer at once (then [`decide_prepared`](Self::decide_prepared)). The caller
    /// keeps the request, to read its [`keys`](Prepared::keys) next to the decisions.
    pub fn decide_now_ref(&self, prepared: &Prepared) -> Option<Evaluation<S, C>> {
        if !self.inner.limiter.store().is_immediate() || self.may_wait(prepared) {
            return None;
        }
        Some(match self.decide_one_now(prepared) {
            Some(Ok((decision, headers))) => self.evaluation(
                std::iter::once(decision).collect(),
                headers,
                Disposition::Pass,
            ),
            Some(Err(evaluation)) => evaluation,
            None => self.decide_polled(prepared),
        })
    }

    /// What the tower layer needs of [`decide_now`](Self::decide_now): the headers and the
    /// disposition, without the decisions. The request stays with the caller, and an admitted
    /// request (most) returns 136 bytes where an evaluation is 328: both are moves the layer
    /// pays on every request.
    pub(crate) fn disposition_now(&self, prepared: &Prepared) -> Option<Now<S, C>> {
        if !self.inner.limiter.store().is_immediate() || self.may_wait(prepared) {
            return None;
        }
        let mut evaluation = match self.decide_one_now(prepared) {
            Some(Ok((_, headers))) => {
                return Some((RateLimitHeaders(headers), Disposition::Pass, None));
            }
            Some(Err(evaluation)) => evaluation,
            None => self.decide_polled(prepared),
        };
        let settle = evaluation.take_settle();
        let (_, headers, disposition) = evaluation.into_parts();
        Some((headers, disposition, settle))
    }

    /// The general path, polled once on an immediate store.
    fn decide_polled(&self, prepared: &Prepared) -> Evaluation<S, C> {
        let decided = {
            let future = std::pin::pin!(self.decide_ref(prepared));
            future.poll(&mut Context::from_waker(Waker::noop()))
        };
        match decided {
            Poll::Ready(evaluation) => evaluation,
            // The store broke its promise; what it was doing is dropped unfinished.
            Poll::Pending => self.failed(pending_immediate_store(), &prepared.entries),
        }
    }

    /// The common request, one rejecting policy, decided by an immediate store: one poll of the
    /// store's single-check future and the headers of one decision, without the general path's
    /// lists and state machine (a tenth of what the layer adds to a request). `Ok` with the
    /// decision and its headers when admitted, `Err` with the evaluation otherwise; `None` for any
    /// other request, before anything is decided.
    #[inline]
    #[allow(clippy::result_large_err)]
    fn decide_one_now(
        &self,
        prepared: &Prepared,
    ) -> Option<Result<(Decision, HeaderList), Evaluation<S, C>>> {
        let [entry] = prepared.entries.as_slice() else {
            return None;
        };
        let compiled = &self.inner.policies[entry.index];
        if prepared.refusal.is_some() || compiled.http.action != Action::Reject || compiled.settles
        {
            return None;
        }
        let now = self.inner.limiter.clock().now();
        let future = std::pin::pin!(self.inner.limiter.store().apply_one(now, self.check(entry)));
        let decision = match future.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(decision)) => decision,
            Poll::Ready(Err(error)) => {
                return Some(Err(self.failed(error.into(), &prepared.entries)));
            }
            Poll::Pending => {
                return Some(Err(
                    self.failed(pending_immediate_store(), &prepared.entries)
                ));
            }
        };
        if !decision.allowed {
            let decisions = Decisions::from_iter([decision]).at(now);
            let headers = self.render(&decisions, &prepared.entries);
            return Some(Err(self.deny(decisions, headers, &prepared.entries)));
        }
        let headers = render(&self.inner.headers, now, &[(&decision, self.text(entry))]);
        Some(Ok((decision, headers)))
    }

    async fn decide_ref(&self, prepared: &Prepared) -> Evaluation<S, C> {
        if let Some(refusal) = &prepared.refusal {
            return self.refused(refusal);
        }
        if prepared.entries.is_empty() {
            return self.evaluation(Decisions::new(), HeaderList::new(), Disposition::Pass);
        }
        let entries = &prepared.entries;
        let mut waited = false;
        let mut evaluation = self.decide_entries(entries, &mut waited).await;
        evaluation.waited_for_slot = waited;
        evaluation
    }

    /// [`decide_ref`](Self::decide_ref) for a request some policy counts; `waited` is set
    /// when it waited in a line for a concurrency slot.
    async fn decide_entries(&self, entries: &[Entry], waited: &mut bool) -> Evaluation<S, C> {
        // Others wait for this key's slots: behind them, without asking first. That wait is
        // the request's whole `max_delay`: it does not wait again once it is over.
        let lined_up = self.must_line_up(entries);
        *waited = lined_up;
        let decided = if lined_up {
            self.wait_for_slot(entries, None).await.map(|(d, _)| d)
        } else {
            self.check_all(&self.checks(entries)).await
        };
        let mut decisions = match decided {
            Ok(d) if d.len() == entries.len() => d,
            Ok(_) => return self.failed(miscounted(), entries),
            Err(e) => return self.failed(e, entries),
        };
        if !lined_up && !decisions.allowed() && self.only_slots_missing(&decisions, entries) {
            *waited = true;
            decisions = match self.wait_for_slot(entries, Some(decisions)).await {
                Ok((d, _)) if d.len() == entries.len() => d,
                Ok(_) => return self.failed(miscounted(), entries),
                Err(e) => return self.failed(e, entries),
            };
        }
        let mut consumed = decisions.allowed();
        if !consumed {
            let enforced_denial = decisions
                .as_slice()
                .iter()
                .zip(entries.iter())
                .any(|(d, e)| !d.allowed && !self.is_shadow(e));
            for (d, e) in decisions.as_slice().iter().zip(entries.iter()) {
                if !d.allowed && self.is_shadow(e) {
                    tracing::debug!(policy = d.policy, "shadow policy would deny this request");
                }
            }
            if !enforced_denial {
                // Only shadow policies deny: the request goes on, so the enforcing policies
                // must count it, in their own all-or-nothing call.
                match self.count_enforced(decisions, entries).await {
                    Ok((counted, admitted)) => (decisions, consumed) = (counted, admitted),
                    Err(evaluation) => return evaluation,
                }
            }
        }
        let headers = self.render(&decisions, entries);
        if !consumed {
            return self.deny(decisions, headers, entries);
        }
        self.admitted(decisions, headers, entries)
    }

    /// The answer to a request refused before any count: 401 without a required key, 400 for
    /// a field the request cannot be read by (a key field sent twice, a client address a trusted
    /// proxy reported unreadably), 414 for a path too deep to normalise.
    fn refused(&self, refusal: &Refusal) -> Evaluation<S, C> {
        tracing::debug!(%refusal, "request refused before any policy counted it");
        let answer = Answer::new(refusal.status(), HeaderList::new(), refusal.body());
        self.evaluation(
            Decisions::new(),
            HeaderList::new(),
            Disposition::Respond(answer),
        )
    }

    /// When only shadow policies denied: the enforcing policies count the request in their own
    /// all-or-nothing call. Their decisions replace the first ones (shadow ones stay), with
    /// whether they admitted; `Err` is the evaluation to answer at once.
    async fn count_enforced(
        &self,
        decisions: Decisions,
        entries: &[Entry],
    ) -> Result<(Decisions, bool), Evaluation<S, C>> {
        let enforced: SmallVec<[Check<'_>; 4]> = entries
            .iter()
            .filter(|e| !self.is_shadow(e))
            .map(|e| self.check(e))
            .collect();
        if enforced.is_empty() {
            let headers = self.render(&decisions, entries);
            return Err(self.evaluation(decisions, headers, Disposition::Pass));
        }
        let again = match self.check_all(&enforced).await {
            Ok(d) => d,
            Err(e) => return Err(self.failed(e, entries)),
        };
        let admitted = again.allowed();
        // The first decisions' instant, the earlier: the shadow policies' resets count from
        // it, and the enforcing policies', from a moment later, are then off by that moment
        // at most, never past a window's whole-second end.
        let at = decisions.decided_at();
        let mut again = again.into_iter();
        let decisions = decisions
            .into_iter()
            .zip(entries.iter())
            .map(|(d, e)| {
                if self.is_shadow(e) {
                    Some(d)
                } else {
                    again.next()
                }
            })
            .collect::<Option<Decisions>>()
            .unwrap_or_default();
        if decisions.len() != entries.len() {
            return Err(self.failed(miscounted(), entries));
        }
        let decisions = match at {
            Some(at) => decisions.at(at),
            None => decisions,
        };
        Ok((decisions, admitted))
    }

    /// An admitted request: held for the longest slot a `delay` policy asks for, or passed.
    fn admitted(
        &self,
        decisions: Decisions,
        headers: HeaderList,
        entries: &[Entry],
    ) -> Evaluation<S, C> {
        let delay = decisions
            .as_slice()
            .iter()
            .zip(entries.iter())
            .filter(|(_, e)| matches!(self.action(e), Action::Delay { .. }))
            .filter_map(|(d, _)| d.delay)
            .max();
        let settle = self.settle_for(&decisions, entries);
        let mut evaluation = match delay {
            Some(delay) if !delay.is_zero() => {
                let hold = Hold {
                    delay,
                    guard: Some(RefundGuard {
                        engine: self.clone(),
                        // A concurrency slot is given back by the request's settle, held
                        // or not: only the others' quota is refunded here.
                        entries: entries
                            .iter()
                            .filter(|e| {
                                !self.is_shadow(e) && !self.inner.policies[e.index].concurrent
                            })
                            .cloned()
                            .collect(),
                        armed: true,
                    }),
                };
                self.evaluation(decisions, headers, Disposition::Hold(hold))
            }
            _ => self.evaluation(decisions, headers, Disposition::Pass),
        };
        evaluation.settle = settle;
        evaluation
    }

    /// The true-up of an admitted request: the policies that counted it and charge by its
    /// response (`charge = "response"`, `count_status`); `None` when there are none.
    fn settle_for(&self, decisions: &Decisions, entries: &[Entry]) -> Option<Box<Settle<S, C>>> {
        let due = |(d, e): &(&tollgate::Decision, &Entry)| {
            d.allowed && self.inner.policies[e.index].settles
        };
        let pairs = || decisions.as_slice().iter().zip(entries.iter());
        if !pairs().any(|p| due(&p)) {
            return None;
        }
        let concurrent = |e: &Entry| self.inner.policies[e.index].concurrent;
        let dues = pairs()
            .filter(|p| due(p) && !concurrent(p.1))
            .map(|(_, e)| e.clone());
        let slots = pairs()
            .filter(|p| due(p) && concurrent(p.1))
            .map(|(_, e)| e.clone())
            .collect();
        Some(Box::new(Settle::new(self.clone(), dues, slots)))
    }

    fn evaluation(
        &self,
        decisions: Decisions,
        headers: HeaderList,
        disposition: Disposition<S, C>,
    ) -> Evaluation<S, C> {
        Evaluation {
            decisions,
            headers,
            disposition,
            store_failed: false,
            settle: None,
            waited_for_slot: false,
        }
    }

    /// The limiter's `check_all`, with the store's single-check path for the common request that
    /// one policy applies to, the decisions recorded with the time they were decided at (what
    /// the headers' absolute reset time counts from). Costs were checked against their quotas
    /// when the engine was built.
    async fn check_all(&self, checks: &[Check<'_>]) -> Result<Decisions, Error> {
        let now = self.inner.limiter.clock().now();
        if let [check] = checks {
            let decision = self.inner.limiter.store().apply_one(now, *check).await?;
            self.inner.outage.answered();
            return Ok(Decisions::from_iter([decision]).at(now));
        }
        let decisions = self.inner.limiter.check_all_at(now, checks).await?;
        self.inner.outage.answered();
        Ok(decisions.at(now))
    }

    fn check<'e>(&'e self, entry: &'e Entry) -> Check<'e> {
        let http = &self.inner.policies[entry.index].http;
        let policy = entry.over.as_ref().map_or(&http.policy, |o| &o.policy);
        Check::new(policy, &entry.key, entry.cost).with_permit(entry.permit)
    }

    /// The header text of the quota `entry` is decided under: its override's, or its policy's.
    fn text(&self, entry: &Entry) -> PolicyText {
        match &entry.over {
            Some(over) => PolicyText::Override(Arc::clone(&over.text)),
            None => PolicyText::Interned(self.inner.policies[entry.index].text),
        }
    }

    fn action(&self, entry: &Entry) -> Action {
        self.inner.policies[entry.index].http.action
    }

    fn is_shadow(&self, entry: &Entry) -> bool {
        self.action(entry) == Action::Shadow
    }
}

/// Whether the request's target and host read the same to the routes as to the upstream, by
/// the readings every door shares ([`normalize`]): a target with a fragment or a byte outside
/// visible ASCII, a host with an empty port, are refused as at every door. Checked only for a
/// request some policy counts; a door that read them already (the proxy, forward-auth,
/// `/v1/check`) has refused what would fail here.
fn readable(info: &RequestInfo<'_>) -> Result<(), Refusal> {
    const TARGET: &str = "the request target";
    let visible = |b: &u8| (0x21..=0x7e).contains(b) && *b != b'#';
    let path_ok = info.path.starts_with('/') && info.path.bytes().all(|b| visible(&b));
    let query_ok = info.query.is_none_or(|q| q.bytes().all(|b| visible(&b)));
    if !(path_ok && query_ok) {
        // The shared reading's own refusal, with its wording.
        normalize::target(b"", TARGET)?;
    }
    let host = info.host.map(str::as_bytes).or_else(|| {
        info.headers
            .get(http::header::HOST)
            .map(http::HeaderValue::as_bytes)
    });
    if let Some(host) = host {
        normalize::authority(host, "Host")?;
    }
    Ok(())
}

/// The 401 of a request without a key for `policy`, which requires one.
fn key_required(policy: &str) -> Refusal {
    let mut detail =
        String::from("This request needs a key (API key, token or identity) for policy ");
    // The name inside quotes, as JSON would escape it.
    detail.push_str(&serde_json::Value::from(policy).to_string());
    Refusal::new(StatusCode::UNAUTHORIZED, "Unauthorized", "").with_detail(detail)
}

/// A store that answered a different number of decisions than it was asked for is broken: its
/// answer is treated as a failure, not trusted.
fn miscounted() -> Error {
    Error::from(tollgate::StoreError::Protocol {
        reason: "the store answered a different number of decisions than checks".to_owned(),
    })
}

/// A store that said it answers immediately left a decision pending: treated as a failure, so
/// the configured fail mode decides.
fn pending_immediate_store() -> Error {
    Error::from(tollgate::StoreError::Protocol {
        reason: "an immediate store left a decision pending".to_owned(),
    })
}
