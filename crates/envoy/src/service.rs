//! [`RlsService`]: answers `ShouldRateLimit` from the compiled configuration and a Tollgate
//! [`Limiter`]: matches each descriptor (or takes its limit override), drops replaced limits,
//! decides them all in one all-or-nothing store call ([`decide`]) and writes the answer
//! ([`answer`]).

mod answer;
mod decide;

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use arc_swap::ArcSwap;
use smallvec::SmallVec;
use tollgate::key_digest::{KeyDigest, MAX_RAW_KEY};
use tollgate::{Clock, Limiter, Outcome, Store};
use tonic::Status;

use crate::config::{Config, ConfigError, RateLimit, Unit};
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::tree::{Compiled, Leaf, LeafLimit, LeafOptions};

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 10_000;

/// The most distinct per-request limit overrides (descriptor key path, requests per unit, unit)
/// one service keeps; past it, overrides of new shapes are ignored and the configured limit
/// applies. Each is a policy whose name lives for the whole process.
pub const MAX_OVERRIDES: usize = 1024;

type Overrides = HashMap<(String, u32, Unit), Arc<Leaf>>;

/// Where the service's decisions are counted: called once per counted descriptor of a request
/// with the limit's policy name, the store key and what became of it (the server counts them
/// in the same metrics as its other doors).
pub type Observer = Arc<dyn Fn(&str, &[u8], Outcome) + Send + Sync>;

/// Begins a call's span (for traces): given the call's request headers (a `traceparent` among
/// them), it answers what the call's decisions are told, or `None` when the call is not traced.
pub type CallTracer =
    Arc<dyn Fn(&tonic::codegen::http::HeaderMap) -> Option<Box<dyn CallSpan>> + Send + Sync>;

/// One traced call: told each counted descriptor's policy, store key and outcome, and ended
/// when dropped.
pub trait CallSpan: Send {
    /// A descriptor's decision.
    fn record(&mut self, policy: &str, key: &[u8], outcome: Outcome);
}

/// Envoy's rate limit service over a Tollgate [`Limiter`]: cheap to clone (one reference
/// count); clones share the limiter and the configuration.
///
/// Each matched descriptor becomes a check of its descriptor node's policy (named after the
/// domain and the descriptor path, e.g. `edge.remote_address` or `edge.api_key_gold`) for a key
/// made of the descriptor's entries, so each distinct value of a key-only node counts on its
/// own. All descriptors of one request are decided in one all-or-nothing
/// [`Limiter::check_all`].
#[derive(Debug)]
pub struct RlsService<S: Store, C: Clock> {
    inner: Arc<Inner<S, C>>,
}

struct Inner<S: Store, C: Clock> {
    limiter: Limiter<S, C>,
    /// The configuration, swapped whole on reload: every call reads it with one atomic load
    /// and no lock, so calls never wait on each other or on a reload.
    config: ArcSwap<Compiled>,
    overrides: Mutex<Overrides>,
    observer: Option<Observer>,
    /// What `grpc.health.v1.Health` reports.
    health: crate::Health,
    tracer: Option<CallTracer>,
}

impl<S: Store + std::fmt::Debug, C: Clock + std::fmt::Debug> std::fmt::Debug for Inner<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlsService")
            .field("limiter", &self.limiter)
            .field("observed", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Store, C: Clock> Clone for RlsService<S, C> {
    fn clone(&self) -> Self {
        RlsService {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// A matched limit: from the configuration, or a request's override.
enum LeafRef<'a> {
    Config(&'a Leaf),
    Override(Arc<Leaf>),
}

impl Deref for LeafRef<'_> {
    type Target = Leaf;

    fn deref(&self) -> &Leaf {
        match self {
            LeafRef::Config(l) => l,
            LeafRef::Override(l) => l,
        }
    }
}

/// A store key, inline up to 64 bytes: typical descriptors (`api_key` and a key, an address)
/// fit, so building one allocates nothing.
type Key = SmallVec<[u8; 64]>;

/// One matched, counted (or blocked) descriptor of a request.
struct Entry<'a> {
    index: usize,
    leaf: LeafRef<'a>,
    key: Key,
    cost: u32,
    /// Over the limit whatever the store says: a cost the quota can never admit, or hits
    /// against `requests_per_unit: 0`.
    denied_up_front: bool,
}

impl<S: Store, C: Clock> RlsService<S, C> {
    /// A service answering from `config` with `limiter` (its registered policies are not used:
    /// the configuration carries its own). Errors name the domain and descriptor at fault.
    pub fn new(limiter: Limiter<S, C>, config: &Config) -> Result<Self, ConfigError> {
        Ok(RlsService {
            inner: Arc::new(Inner {
                limiter,
                config: ArcSwap::from_pointee(Compiled::new(config)?),
                overrides: Mutex::default(),
                observer: None,
                health: crate::Health::default(),
                tracer: None,
            }),
        })
    }

    /// The same service, reporting every decision to `observer` (see [`Observer`]). Call it
    /// before cloning the service: clones made earlier do not report.
    pub fn with_observer(self, observer: Observer) -> Self {
        let inner = match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                inner.observer = Some(observer);
                inner
            }
            Err(shared) => Inner {
                limiter: shared.limiter.clone(),
                config: ArcSwap::new(shared.config.load_full()),
                overrides: Mutex::default(),
                observer: Some(observer),
                health: shared.health.clone(),
                tracer: shared.tracer.clone(),
            },
        };
        RlsService {
            inner: Arc::new(inner),
        }
    }

    /// The same service, tracing each call through `tracer` (see [`CallTracer`]). Call it
    /// before cloning the service: clones made earlier do not trace.
    pub fn with_tracer(self, tracer: CallTracer) -> Self {
        let inner = match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                inner.tracer = Some(tracer);
                inner
            }
            Err(shared) => Inner {
                limiter: shared.limiter.clone(),
                config: ArcSwap::new(shared.config.load_full()),
                overrides: Mutex::default(),
                observer: shared.observer.clone(),
                health: shared.health.clone(),
                tracer: Some(tracer),
            },
        };
        RlsService {
            inner: Arc::new(inner),
        }
    }

    /// A call's span, when the service traces and this call is sampled.
    pub(crate) fn begin_span(
        &self,
        headers: &tonic::codegen::http::HeaderMap,
    ) -> Option<Box<dyn CallSpan>> {
        self.inner.tracer.as_ref().and_then(|t| t(headers))
    }

    /// Replaces the configuration for every clone of this service; calls in flight finish with
    /// the old one. A limit whose name (domain and descriptor path) and quota are unchanged
    /// keeps its counters; a changed one starts afresh. On error the old configuration stays.
    pub fn reload(&self, config: &Config) -> Result<(), ConfigError> {
        let compiled = Compiled::new(config)?;
        self.inner.config.store(Arc::new(compiled));
        Ok(())
    }

    /// The status `grpc.health.v1.Health` reports for this service (shared by every clone):
    /// serving until set otherwise.
    pub fn health(&self) -> &crate::Health {
        &self.inner.health
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<S, C> {
        &self.inner.limiter
    }

    /// Answers one `ShouldRateLimit` call.
    ///
    /// Errors (as gRPC statuses): `INVALID_ARGUMENT` for an empty domain, no descriptors or
    /// more than [`MAX_DESCRIPTORS`]; `UNAVAILABLE` when the store fails and the failure mode
    /// says so.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        self.should_rate_limit_traced(request, None).await
    }

    /// [`should_rate_limit`](Self::should_rate_limit), telling `span` each decision.
    pub(crate) async fn should_rate_limit_traced(
        &self,
        request: &RateLimitRequest,
        mut span: Option<&mut (dyn CallSpan + 'static)>,
    ) -> Result<RateLimitResponse, Status> {
        check_request(request)?;
        let mut statuses: Vec<DescriptorStatus> = request
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            })
            .collect();
        // A full reference (not a guard): the entries borrow from it across the store call.
        let config = self.inner.config.load_full();
        let Some(tree) = config.domains.get(&request.domain) else {
            return Ok(answer::ok(statuses));
        };
        let mut matched: SmallVec<[(usize, LeafRef<'_>); 4]> = SmallVec::new();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            // As envoyproxy/ratelimit: an override applies instead of the tree.
            let leaf = match self.override_leaf(&request.domain, descriptor) {
                Some(o) => LeafRef::Override(o),
                None => match tree.find(entry_pairs(descriptor)) {
                    Some(l) => LeafRef::Config(l),
                    None => continue,
                },
            };
            matched.push((index, leaf));
        }
        if config.has_replaces {
            drop_replaced(&mut matched);
        }
        let hits = request.hits_addend.max(1);
        let mut entries: SmallVec<[Entry<'_>; 4]> = SmallVec::new();
        for (index, leaf) in matched {
            let descriptor = &request.descriptors[index];
            // A descriptor's own addend wins, 0 included (check without counting).
            let cost = descriptor
                .hits_addend
                .map_or(hits, |h| u32::try_from(h).unwrap_or(u32::MAX));
            let denied_up_front = match &leaf.limit {
                LeafLimit::Unlimited => {
                    // OK, never counted, as envoyproxy/ratelimit answers.
                    statuses[index].limit_remaining = u32::MAX;
                    continue;
                }
                LeafLimit::Blocked => cost > 0,
                LeafLimit::Policy(p) => cost > p.quota().max_cost(),
            };
            let key = store_key(descriptor, &leaf.options.shared);
            entries.push(Entry {
                index,
                leaf,
                key,
                cost,
                denied_up_front,
            });
        }
        if entries.is_empty() {
            return Ok(answer::ok(statuses));
        }
        let now = self.inner.limiter.clock().now();
        let decisions = match decide::decide(&self.inner.limiter, &entries, now).await {
            Ok(d) => d,
            Err(error) => {
                let outcome = if config.failure_mode.admits() {
                    Outcome::FailOpen
                } else {
                    Outcome::FailClosed
                };
                self.observe(&entries, &mut span, |_| outcome);
                // The core's one failure rule: fail open answers OK with no limits (none was
                // counted), fail closed says the service is unavailable.
                return if config.failure_mode.admits() {
                    Ok(answer::ok(statuses))
                } else {
                    Err(Status::unavailable(format!(
                        "the rate limit store failed: {error}"
                    )))
                };
            }
        };
        self.observe(&entries, &mut span, |i| {
            let shadow = entries[i].leaf.options.shadow;
            decisions
                .get(i)
                .map_or(Outcome::Allowed, |d| Outcome::of(d, shadow))
        });
        Ok(answer::answer(&config, statuses, &entries, &decisions, now))
    }

    /// Reports each entry's outcome to the observer, if there is one.
    fn observe(
        &self,
        entries: &[Entry<'_>],
        span: &mut Option<&mut (dyn CallSpan + 'static)>,
        outcome: impl Fn(usize) -> Outcome,
    ) {
        if let Some(observer) = &self.inner.observer {
            for (i, e) in entries.iter().enumerate() {
                observer(&e.leaf.policy_name, &e.key, outcome(i));
            }
        }
        if let Some(span) = span {
            for (i, e) in entries.iter().enumerate() {
                span.record(&e.leaf.policy_name, &e.key, outcome(i));
            }
        }
    }

    /// The limit a descriptor's `limit` override asks for, as envoyproxy/ratelimit applies it:
    /// in a known domain, whether or not the descriptor matches the tree, never in shadow or
    /// quota mode, counted per descriptor key path and value, `requests_per_unit: 0` denying
    /// all. `None` when there is no usable override (an unknown unit) or [`MAX_OVERRIDES`]
    /// shapes are already in use.
    fn override_leaf(&self, domain: &str, descriptor: &RateLimitDescriptor) -> Option<Arc<Leaf>> {
        let o = descriptor.limit.as_ref()?;
        let unit = Unit::from_rate_limit_unit(o.unit)?;
        if descriptor.entries.is_empty() {
            return None;
        }
        let mut path = String::with_capacity(domain.len() + 32);
        path.push_str(domain);
        for e in &descriptor.entries {
            path.push('.');
            path.push_str(&e.key);
        }
        path.push_str("~override");
        let key = (path, o.requests_per_unit, unit);
        let mut cache = self
            .inner
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(leaf) = cache.get(&key) {
            return Some(Arc::clone(leaf));
        }
        if cache.len() >= MAX_OVERRIDES {
            return None;
        }
        let limit = RateLimit::per(o.requests_per_unit, unit);
        let options = LeafOptions::default();
        let mut names = Default::default();
        let leaf = Arc::new(Leaf::compile(&limit, options, &key.0, &mut names, "override").ok()?);
        cache.insert(key, Arc::clone(&leaf));
        Some(leaf)
    }
}

fn check_request(request: &RateLimitRequest) -> Result<(), Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "too many rate limit descriptors: {} (at most {MAX_DESCRIPTORS})",
            request.descriptors.len()
        )));
    }
    Ok(())
}

fn entry_pairs(
    descriptor: &RateLimitDescriptor,
) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
    descriptor
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
}

/// envoyproxy/ratelimit's `replaces`: every matched limit (unlimited ones included) names the
/// limits it replaces; a matched limit with one of those names is dropped, neither checked nor
/// counted, and its descriptor is answered OK with no limit.
fn drop_replaced(matched: &mut SmallVec<[(usize, LeafRef<'_>); 4]>) {
    let replaced: SmallVec<[&str; 4]> = matched
        .iter()
        .flat_map(|(_, leaf)| leaf.replaces.iter().map(String::as_str))
        .collect();
    if replaced.is_empty() {
        return;
    }
    // Names borrowed from leaves that may be dropped: decide first, then drop.
    let keep: SmallVec<[bool; 4]> = matched
        .iter()
        .map(|(_, leaf)| leaf.name.is_empty() || !replaced.contains(&&*leaf.name))
        .collect();
    drop(replaced);
    let mut keep = keep.into_iter();
    matched.retain(|_| keep.next().unwrap_or(true));
}

/// The store key of a descriptor: its entries, each key and value length-prefixed so that no
/// two descriptors share a key, a `share_threshold` wildcard standing for the value it
/// matched; then the core's long-key rule ([`KeyDigest::write_key`]), so a descriptor longer
/// than [`MAX_RAW_KEY`] bytes is counted under its 128-bit digest.
fn store_key(descriptor: &RateLimitDescriptor, shared: &[Option<Box<str>>]) -> Key {
    let mut key = Key::new();
    for (i, e) in descriptor.entries.iter().enumerate() {
        let value = match shared.get(i) {
            Some(Some(pattern)) => &**pattern,
            _ => e.value.as_str(),
        };
        for part in [e.key.as_str(), value] {
            key.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_le_bytes());
            key.extend_from_slice(part.as_bytes());
        }
    }
    if key.len() <= MAX_RAW_KEY && key.first() != Some(&b'#') {
        return key;
    }
    // A public (empty) secret: every instance sharing a store counts a long descriptor under
    // the same name, and the digest is collision-resistant even so.
    static LONG_KEYS: LazyLock<KeyDigest> = LazyLock::new(|| KeyDigest::new(b""));
    let mut hashed = Key::new();
    LONG_KEYS.write_key(&key, &mut hashed);
    hashed
}
