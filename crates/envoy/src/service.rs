//! [`RlsService`]: answers `ShouldRateLimit` from the compiled configuration and a Tollgate
//! [`Limiter`].

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use smallvec::SmallVec;
use tollgate::headers;
use tollgate::{Check, Clock, Decision, Limiter, Store};
use tonic::Status;

use crate::config::{
    Compiled, Config, ConfigError, FailureMode, Leaf, RateLimit, ResetFormat, Unit, compile_leaf,
};
use crate::proto::envoy::common_ratelimit_v3::RateLimitDescriptor;
use crate::proto::envoy::config_core_v3::HeaderValue;
use crate::proto::envoy::service_ratelimit_v3::rate_limit_response::{Code, DescriptorStatus};
use crate::proto::envoy::service_ratelimit_v3::{RateLimitRequest, RateLimitResponse};

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 10_000;

/// Store keys longer than this are replaced by a hash (SPEC §4).
const MAX_KEY: usize = 256;

/// The most distinct per-request limit overrides (descriptor key path, requests per unit, unit)
/// one service keeps; past it, overrides of new shapes are ignored and the configured limit
/// applies. Each is a policy whose name lives for the whole process.
pub const MAX_OVERRIDES: usize = 1024;

type Overrides = HashMap<(String, u32, Unit, bool), Arc<Leaf>>;

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

#[derive(Debug)]
struct Inner<S: Store, C: Clock> {
    limiter: Limiter<S, C>,
    /// The configuration, swapped whole on reload: every call reads it with one atomic load
    /// and no lock, so calls never wait on each other or on a reload.
    config: ArcSwap<Compiled>,
    overrides: Mutex<Overrides>,
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

/// The decisions of one request, inline for up to four descriptors.
type DecisionList = SmallVec<[Decision; 4]>;

/// A store key, inline up to 64 bytes: typical descriptors (`api_key` and a key, an address)
/// fit, so building one allocates nothing.
type Key = SmallVec<[u8; 64]>;

/// One matched, counted descriptor of a request.
struct Entry<'a> {
    index: usize,
    leaf: LeafRef<'a>,
    key: Key,
    cost: u32,
    /// The cost exceeds what the quota can ever admit.
    too_big: bool,
}

impl<S: Store, C: Clock> RlsService<S, C> {
    /// A service answering from `config` with `limiter` (its registered policies are not used:
    /// the configuration carries its own). Errors name the domain and descriptor at fault.
    pub fn new(limiter: Limiter<S, C>, config: &Config) -> Result<Self, ConfigError> {
        Ok(RlsService {
            inner: Arc::new(Inner {
                limiter,
                config: ArcSwap::from_pointee(config.compile()?),
                overrides: Mutex::default(),
            }),
        })
    }

    /// Replaces the configuration for every clone of this service; calls in flight finish with
    /// the old one. A limit whose name (domain and descriptor path) and quota are unchanged
    /// keeps its counters; a changed one starts afresh. On error the old configuration stays.
    pub fn reload(&self, config: &Config) -> Result<(), ConfigError> {
        let compiled = config.compile()?;
        self.inner.config.store(Arc::new(compiled));
        Ok(())
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
            return Ok(ok_response(statuses));
        };
        let hits = request.hits_addend.max(1);
        let mut entries: SmallVec<[Entry<'_>; 4]> = SmallVec::new();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let found = tree.find(
                descriptor
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str())),
            );
            let leaf = match self.override_leaf(&request.domain, descriptor, found) {
                Some(o) => LeafRef::Override(o),
                None => match found {
                    Some(l) => LeafRef::Config(l),
                    None => continue,
                },
            };
            let Some(policy) = &leaf.policy else {
                // Unlimited: OK, never counted, as envoyproxy/ratelimit answers.
                statuses[index].limit_remaining = u32::MAX;
                continue;
            };
            let cost = match descriptor.hits_addend {
                Some(h) => u32::try_from(h.value).unwrap_or(u32::MAX),
                None => hits,
            };
            let too_big = cost > policy.quota().max_cost();
            entries.push(Entry {
                index,
                leaf,
                key: store_key(descriptor.entries.iter().map(|e| (&e.key, &e.value))),
                cost,
                too_big,
            });
        }
        if entries.is_empty() {
            return Ok(ok_response(statuses));
        }
        let decisions = match self.decide(&entries).await {
            Ok(d) => d,
            Err(error) => {
                return match config.failure_mode {
                    FailureMode::Allow => Ok(ok_response(statuses)),
                    FailureMode::Unavailable => Err(Status::unavailable(format!(
                        "the rate limit store failed: {error}"
                    ))),
                };
            }
        };
        let mut over = false;
        for (entry, d) in entries.iter().zip(decisions.iter()) {
            let denied = !d.allowed && !entry.leaf.shadow;
            over |= denied;
            let status = &mut statuses[entry.index];
            status.code = if denied { Code::OverLimit } else { Code::Ok } as i32;
            status.current_limit.clone_from(&entry.leaf.current_limit);
            status.limit_remaining = u32::try_from(d.remaining).unwrap_or(u32::MAX);
            status.duration_until_reset = Some(d.reset.into());
        }
        let headers = self.headers(&config, &entries, &decisions, over);
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
            request_headers_to_add: Vec::new(),
        })
    }

    /// The limit a descriptor's `limit` override asks for, as envoyproxy/ratelimit applies it:
    /// in a known domain, whether or not the descriptor matched the tree, counted per
    /// descriptor key path and value. Shadow mode follows the matched node. `None` when there
    /// is no usable override (zero requests, a unit out of range) or [`MAX_OVERRIDES`] shapes
    /// are already in use.
    fn override_leaf(
        &self,
        domain: &str,
        descriptor: &RateLimitDescriptor,
        found: Option<&Leaf>,
    ) -> Option<Arc<Leaf>> {
        let o = descriptor.limit.as_ref()?;
        let unit = Unit::from_rate_limit_unit(o.unit)?;
        if o.requests_per_unit == 0 || descriptor.entries.is_empty() {
            return None;
        }
        let shadow = found.is_some_and(|l| l.shadow);
        let mut path = String::with_capacity(domain.len() + 32);
        path.push_str(domain);
        for e in &descriptor.entries {
            path.push('.');
            path.push_str(&e.key);
        }
        path.push_str("~override");
        let key = (path, o.requests_per_unit, unit, shadow);
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
        let leaf = Arc::new(
            compile_leaf(&limit, shadow, &key.0, &mut Default::default(), "override").ok()?,
        );
        cache.insert(key, Arc::clone(&leaf));
        Some(leaf)
    }

    /// Decides every entry in one all-or-nothing call. A cost no quota can admit denies its
    /// descriptor without counting; if only shadow descriptors deny, the enforced ones are
    /// counted in a second all-or-nothing call, since the request goes on.
    async fn decide(&self, entries: &[Entry<'_>]) -> Result<DecisionList, tollgate::Error> {
        let forced = entries.iter().any(|e| e.too_big && !e.leaf.shadow);
        let checks: SmallVec<[Check<'_>; 4]> = entries
            .iter()
            .filter_map(|e| {
                let policy = e.leaf.policy.as_ref()?;
                // Peek (cost 0) where nothing may be consumed.
                let cost = if forced || e.too_big { 0 } else { e.cost };
                Some(Check::new(policy, &e.key, cost))
            })
            .collect();
        let first = self.inner.limiter.check_all(&checks).await?;
        let mut decisions: DecisionList = first.into_iter().collect();
        for (e, d) in entries.iter().zip(decisions.iter_mut()) {
            if e.too_big {
                d.allowed = false;
                d.retry_after = None;
            }
        }
        if forced {
            return Ok(decisions);
        }
        let admitted = decisions.iter().all(|d| d.allowed);
        let enforced_denial = entries
            .iter()
            .zip(decisions.iter())
            .any(|(e, d)| !d.allowed && !e.leaf.shadow);
        if admitted || enforced_denial {
            return Ok(decisions);
        }
        // Only shadow descriptors deny: count the enforced ones.
        let enforced: SmallVec<[Check<'_>; 4]> = entries
            .iter()
            .filter(|e| !e.leaf.shadow)
            .filter_map(|e| Some(Check::new(e.leaf.policy.as_ref()?, &e.key, e.cost)))
            .collect();
        if enforced.is_empty() {
            return Ok(decisions);
        }
        let again = self.inner.limiter.check_all(&enforced).await?;
        let mut again = again.into_iter();
        for (e, d) in entries.iter().zip(decisions.iter_mut()) {
            if !e.leaf.shadow {
                if let Some(next) = again.next() {
                    *d = next;
                }
            }
        }
        Ok(decisions)
    }

    /// The SPEC §5 headers over the enforced (non-shadow) descriptors, written by
    /// [`tollgate::headers`] as the tower layer and the server write them.
    fn headers(
        &self,
        config: &Compiled,
        entries: &[Entry<'_>],
        decisions: &[Decision],
        over: bool,
    ) -> Vec<HeaderValue> {
        let items: SmallVec<[(&Entry<'_>, &Decision); 4]> = entries
            .iter()
            .zip(decisions)
            .filter(|(e, _)| !e.leaf.shadow)
            .collect();
        let Some(&(worst_entry, worst)) = items
            .iter()
            .min_by(|(_, a), (_, b)| headers::cmp_restrictive(a, b))
        else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(6);
        if config.x_ratelimit_headers {
            out.push(header("X-RateLimit-Limit", number(worst.limit)));
            out.push(header("X-RateLimit-Remaining", number(worst.remaining)));
            let reset = match config.reset_format {
                ResetFormat::Delta => headers::reset_delta_secs(worst),
                ResetFormat::Epoch => {
                    headers::reset_epoch_secs(self.inner.limiter.clock().now(), worst)
                }
            };
            out.push(header("X-RateLimit-Reset", number(reset)));
        }
        if config.ietf_headers {
            let policy = match items.as_slice() {
                [(only, _)] => only.leaf.policy_item.clone(),
                _ => {
                    // Each policy once, even when several descriptors matched it.
                    let mut listed: SmallVec<[&str; 4]> = SmallVec::new();
                    let mut policy = String::with_capacity(items.len() * 32);
                    for (e, _) in &items {
                        if listed.contains(&e.leaf.policy_item.as_str()) {
                            continue;
                        }
                        listed.push(&e.leaf.policy_item);
                        if !policy.is_empty() {
                            policy.push_str(headers::LIST_SEPARATOR);
                        }
                        policy.push_str(&e.leaf.policy_item);
                    }
                    policy
                }
            };
            out.push(header("RateLimit-Policy", policy));
            let mut field = String::with_capacity(worst_entry.leaf.quoted_name.len() + 24);
            headers::write_ratelimit_item(&mut field, &worst_entry.leaf.quoted_name, worst);
            out.push(header("RateLimit", field));
        }
        if over {
            let wait = retry_after(&items).unwrap_or(worst.reset);
            let secs = headers::retry_after_secs(wait, headers::t_secs(worst));
            out.push(header("Retry-After", number(secs)));
        }
        out
    }
}

/// The latest `retry_after` among the denying enforced decisions; `None` if any can never be
/// admitted or none says (then `Retry-After` falls back to the full reset: Envoy's filter
/// always gets a wait to pass on).
fn retry_after(items: &[(&Entry<'_>, &Decision)]) -> Option<Duration> {
    let mut latest: Option<Duration> = None;
    for (_, d) in items.iter().filter(|(_, d)| !d.allowed) {
        let r = d.retry_after?;
        latest = Some(latest.map_or(r, |l| l.max(r)));
    }
    latest
}

fn number(n: u64) -> String {
    let mut s = String::with_capacity(20);
    headers::write_u64(&mut s, n);
    s
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    }
}

fn ok_response(statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses,
        response_headers_to_add: Vec::new(),
        request_headers_to_add: Vec::new(),
    }
}

/// The store key of a descriptor: its entries, each key and value length-prefixed so that no
/// two descriptors share a key; longer than 256 bytes, a 128-bit SHA-256 prefix of it.
fn store_key<'a>(entries: impl Iterator<Item = (&'a String, &'a String)>) -> Key {
    let mut key = Key::new();
    for (k, v) in entries {
        for part in [k, v] {
            key.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_le_bytes());
            key.extend_from_slice(part.as_bytes());
        }
    }
    if key.len() <= MAX_KEY {
        return key;
    }
    // SHA-256 (cut to 128 bits): collision-resistant, so no one can craft a long value that
    // shares another's count.
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(&key);
    let mut hashed = Key::new();
    hashed.extend_from_slice(b"#h");
    hashed.extend_from_slice(&digest[..16]);
    hashed
}
