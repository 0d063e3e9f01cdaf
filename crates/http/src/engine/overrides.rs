//! Per-key overrides: one key of one policy decided under another quota (a customer given
//! more for an incident, an abuser given less), without a deploy.
//!
//! # How an override changes the quota of one key
//!
//! An override is a [`Policy`] of its own: the policy's name with the override's quota. A
//! request for the overridden key checks that policy instead of the configured one, in the same
//! all-or-nothing `check_all` as every other policy the request matches, so nothing about the
//! atomicity of a request changes. Stores apply the quota a check carries: the memory store's
//! tables and the Redis scripts' arguments come from the check's policy, so the override's quota
//! is the one the store applies, in memory and Redis alike.
//!
//! A policy's state is keyed by its [`fingerprint`](Policy::fingerprint), which covers the
//! quota, so an overridden key starts from fresh state under its new quota (state kept under
//! another quota would be read with the wrong meaning), and when the override ends (removed or
//! expired) the key is back on the state it had under the configured quota, of which whatever
//! has not expired still counts. The rate-limit headers carry the override's quota.
//!
//! # Cost
//!
//! A request pays one relaxed atomic load per matching policy while no override exists; when
//! some do, a lookup in a hash table read through [`ArcSwap`] (no lock, no shared write).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate::algorithm::FixedWindow;
use tollgate::{Calendar, CalendarUnit, Clock, MAX_PERIOD, Policy, Quota, Rate, Store, Timestamp};

use super::Engine;
use crate::headers::PolicyHeaders;

/// The quota fields an override sets; the fields it leaves out keep the policy's values.
///
/// The window algorithms take `limit` and `window`, the token bucket `capacity` and `refill`,
/// the leaky bucket `rate` and `queue`: the names of the configuration. A fixed window also
/// takes `calendar` (a period in the policy's time zone, UTC when it has none); a calendar
/// policy whose override sets only `limit` keeps its calendar, and one given `window` counts by
/// that window instead.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct QuotaFields {
    /// `limit` (fixed window, sliding window log and counter).
    pub limit: Option<u32>,
    /// `window` (fixed window, sliding window log and counter).
    pub window: Option<Duration>,
    /// `calendar` (fixed window): count per day, week, month or year.
    pub calendar: Option<CalendarUnit>,
    /// `capacity` (token bucket).
    pub capacity: Option<u32>,
    /// `refill` (token bucket).
    pub refill: Option<Rate>,
    /// `rate` (leaky bucket).
    pub rate: Option<Rate>,
    /// `queue` (leaky bucket).
    pub queue: Option<u32>,
}

/// Why an override cannot apply to a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OverrideError {
    /// The engine has no policy of that name.
    UnknownPolicy,
    /// A field does not fit the policy: its name and why.
    Field {
        /// The field, as the configuration and the admin API name it (`"limit"`, `"refill"`).
        field: &'static str,
        /// Why, and what to write instead.
        reason: String,
    },
}

impl fmt::Display for OverrideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OverrideError::UnknownPolicy => f.write_str("no policy of that name"),
            OverrideError::Field { field, reason } => write!(f, "{field}: {reason}"),
        }
    }
}

impl std::error::Error for OverrideError {}

fn field_error(field: &'static str, reason: impl Into<String>) -> OverrideError {
    OverrideError::Field {
        field,
        reason: reason.into(),
    }
}

impl QuotaFields {
    /// The fields that are set, by name.
    fn given(&self) -> impl Iterator<Item = &'static str> {
        [
            ("limit", self.limit.is_some()),
            ("window", self.window.is_some()),
            ("calendar", self.calendar.is_some()),
            ("capacity", self.capacity.is_some()),
            ("refill", self.refill.is_some()),
            ("rate", self.rate.is_some()),
            ("queue", self.queue.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
    }

    /// The quota `base` becomes with these fields (same algorithm; a leaky bucket keeps its
    /// `max_delay`), or the first field that does not fit and why.
    pub fn apply(&self, base: &Quota) -> Result<Quota, OverrideError> {
        let own: &[&'static str] = match base {
            Quota::FixedWindow(_) => &["limit", "window", "calendar"],
            Quota::SlidingWindowLog(_) | Quota::SlidingWindowCounter(_) => &["limit", "window"],
            Quota::TokenBucket(_) => &["capacity", "refill"],
            Quota::LeakyBucket(_) => &["rate", "queue"],
            // A permit's TTL is the policy's: how long a lost request may hold a slot is not a
            // per-key matter.
            Quota::Concurrency(_) => &["limit"],
        };
        let algorithm = base.kind().as_str();
        if let Some(other) = self.given().find(|f| !own.contains(f)) {
            let fields = match own {
                [one] => format!("whose quota field is {one}"),
                _ => format!("whose quota fields are {}", own.join(" and ")),
            };
            return Err(field_error(
                other,
                format!("the policy is a {algorithm}, {fields}"),
            ));
        }
        if self.given().next().is_none() {
            let give = match own {
                [one] => format!("give {one}"),
                [a, b] => format!("give {a} or {b} (or both)"),
                _ => format!("give one or more of {}", own.join(", ")),
            };
            return Err(field_error(own[0], give));
        }
        if let Quota::FixedWindow(fixed) = base
            && let Some(made) = self.calendar_quota(fixed)?
        {
            return Ok(made);
        }
        let quota = match base {
            Quota::FixedWindow(_) | Quota::SlidingWindowLog(_) | Quota::SlidingWindowCounter(_) => {
                let limit = self.limit.unwrap_or(base.limit());
                let window = self.window.unwrap_or(base.window());
                if limit == 0 {
                    return Err(field_error("limit", "must be at least 1"));
                }
                if window.is_zero() || window > MAX_PERIOD {
                    return Err(field_error(
                        "window",
                        "must be above zero and at most 400 days, like \"1m\" or \"1h\"",
                    ));
                }
                let made = match base {
                    Quota::FixedWindow(_) => Quota::fixed_window(limit, window),
                    Quota::SlidingWindowLog(_) => Quota::sliding_window_log(limit, window),
                    _ => Quota::sliding_window_counter(limit, window),
                };
                made.map_err(|e| field_error(self.first_of(own), e.reason()))?
            }
            Quota::TokenBucket(bucket) => {
                let capacity = self.capacity.unwrap_or(bucket.capacity());
                if capacity == 0 {
                    return Err(field_error("capacity", "must be at least 1"));
                }
                Quota::token_bucket(capacity, self.refill.unwrap_or(bucket.refill()))
                    .map_err(|e| field_error(self.first_of(own), e.reason()))?
            }
            Quota::LeakyBucket(bucket) => {
                let made = Quota::leaky_bucket(
                    self.rate.unwrap_or(bucket.rate()),
                    self.queue.unwrap_or(bucket.queue()),
                )
                .map_err(|e| field_error(self.first_of(own), e.reason()))?;
                match (made, bucket.max_delay()) {
                    (Quota::LeakyBucket(b), Some(max_delay)) => {
                        Quota::LeakyBucket(b.with_max_delay(max_delay))
                    }
                    (made, _) => made,
                }
            }
            Quota::Concurrency(c) => {
                let limit = self.limit.unwrap_or(c.limit());
                if limit == 0 {
                    return Err(field_error("limit", "must be at least 1"));
                }
                Quota::concurrency(limit, c.lease_ttl())
                    .map_err(|e| field_error("limit", e.reason()))?
            }
        };
        Ok(quota)
    }

    /// A fixed window's quota by the calendar: when the override names `calendar`, or the
    /// policy counts by one and the override does not name `window`. `None` otherwise.
    fn calendar_quota(&self, base: &FixedWindow) -> Result<Option<Quota>, OverrideError> {
        if self.window.is_some() {
            if self.calendar.is_some() {
                return Err(field_error(
                    "calendar",
                    "give calendar or window, not both: a calendar period is the window",
                ));
            }
            return Ok(None);
        }
        let calendar = match (self.calendar, base.calendar()) {
            (None, None) => return Ok(None),
            (None, Some(c)) => c.clone(),
            (Some(unit), Some(c)) => Calendar::new(unit, c.zone_name())
                .map_err(|e| field_error("calendar", e.reason()))?,
            (Some(unit), None) => Calendar::utc(unit),
        };
        let limit = self.limit.unwrap_or(base.limit());
        Quota::fixed_calendar(limit, calendar)
            .map(Some)
            .map_err(|e| field_error("limit", e.reason()))
    }

    /// The first of `own` that is set (both are not set only when the other is).
    fn first_of(&self, own: &[&'static str]) -> &'static str {
        self.given()
            .find(|f| own.contains(f))
            .or(own.first().copied())
            .unwrap_or("limit")
    }
}

/// An override ready to decide with: the policy with the override's quota, its header text,
/// and when it ends.
#[derive(Debug)]
pub struct KeyOverride {
    pub(crate) index: usize,
    pub(crate) policy: Policy,
    pub(crate) text: Arc<PolicyHeaders>,
    pub(crate) expires: Option<Timestamp>,
}

impl KeyOverride {
    /// The policy the key is decided under: the configured policy's name, the override's quota.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// When the override stops applying, if ever.
    pub fn expires(&self) -> Option<Timestamp> {
        self.expires
    }

    /// Whether it still applies at `now`.
    pub fn applies_at(&self, now: Timestamp) -> bool {
        self.expires.is_none_or(|end| now < end)
    }
}

/// Every override of one engine's policies, by policy and key.
#[derive(Debug, Default)]
struct Table {
    /// Indexed like the engine's policies; policies without overrides hold an empty map, which
    /// allocates nothing. Hashed with foldhash (seeded per process): every request with a key
    /// looks it up once overrides exist, and SipHash cost ~300 instructions a lookup, while the
    /// keys stored are the operators' (a client cannot grow the table to flood it).
    by_policy: Vec<HashMap<Box<[u8]>, Arc<KeyOverride>, foldhash::fast::RandomState>>,
}

/// The engine's overrides: swapped whole when they change, read without a lock.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    /// Whether any override exists: while none does (the usual case), a request pays this one
    /// relaxed load per matching policy and nothing else.
    any: AtomicBool,
    table: ArcSwap<Table>,
}

impl Overrides {
    /// The override of `key` under the policy at `index`, expired ones included (the caller
    /// checks [`KeyOverride::applies_at`], reading the clock only for keys that have one).
    #[inline]
    pub(crate) fn get(&self, index: usize, key: &[u8]) -> Option<Arc<KeyOverride>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.table
            .load()
            .by_policy
            .get(index)
            .and_then(|keys| keys.get(key))
            .cloned()
    }

    /// Replaces every override with `list` (`policies` is how many the engine has); a later
    /// entry for the same policy and key wins.
    pub(crate) fn replace(
        &self,
        policies: usize,
        list: impl IntoIterator<Item = (Box<[u8]>, KeyOverride)>,
    ) {
        let mut table = Table {
            by_policy: (0..policies).map(|_| HashMap::default()).collect(),
        };
        let mut any = false;
        for (key, over) in list {
            if let Some(keys) = table.by_policy.get_mut(over.index) {
                keys.insert(key, Arc::new(over));
                any = true;
            }
        }
        self.table.store(Arc::new(table));
        // After the table: a request that sees `any` finds the new table.
        self.any.store(any, Ordering::Release);
    }

    /// How many overrides there are.
    pub(crate) fn len(&self) -> usize {
        self.table.load().by_policy.iter().map(HashMap::len).sum()
    }
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// Checks an override of policy `name` with `fields`, ending at `expires`, and makes it
    /// ready for [`set_overrides`](Self::set_overrides). Refused: an unknown policy, a field of
    /// another algorithm, a quota that cannot be, or one below the policy's per-request cost.
    pub fn compile_override(
        &self,
        name: &str,
        fields: &QuotaFields,
        expires: Option<Timestamp>,
    ) -> Result<KeyOverride, OverrideError> {
        let index = self
            .inner
            .policies
            .iter()
            .position(|p| p.http.policy.name() == name)
            .ok_or(OverrideError::UnknownPolicy)?;
        let http = &self.inner.policies[index].http;
        // From the compiled policy: a `delay` policy's bucket already carries its bound.
        let quota = fields.apply(http.policy.quota())?;
        if quota.max_cost() < http.cost {
            let field = fields.given().next().unwrap_or("limit");
            return Err(field_error(
                field,
                format!(
                    "a request of this policy costs {}; an override admitting at most {} at once \
                     would refuse every one",
                    http.cost,
                    quota.max_cost()
                ),
            ));
        }
        let plain = Policy::new(name, quota).map_err(|e| field_error("limit", e.reason()))?;
        // The key's ban rule stays the policy's: its record is kept by the policy's name.
        let plain = match http.policy.ban() {
            Some(ban) => plain
                .with_ban(*ban)
                .map_err(|e| field_error("limit", e.reason()))?,
            None => plain,
        };
        // A lease that is unsound for the new quota is dropped: the key then goes to the store
        // on every request, which is always correct.
        let policy = match http.policy.lease() {
            Some(lease) => plain.clone().with_lease(*lease).unwrap_or(plain),
            None => plain,
        };
        let text = PolicyHeaders::shared(&policy).map_err(|e| field_error("limit", e.reason()))?;
        Ok(KeyOverride {
            index,
            policy,
            text,
            expires,
        })
    }

    /// Replaces every override with `list`: each key (as the store sees it, the form
    /// [`Prepared::keys`](super::Prepared::keys) gives) with its compiled override. Requests
    /// prepared from now on use them.
    pub fn set_overrides(&self, list: impl IntoIterator<Item = (Box<[u8]>, KeyOverride)>) {
        self.inner
            .overrides
            .replace(self.inner.policies.len(), list);
    }

    /// The override that applies now to `key` under policy `name`, for a decision made by
    /// policy name outside a request (the server's `/v1/check`): check
    /// [`KeyOverride::policy`] in place of the configured one, then render the headers with
    /// [`headers_for_overridden`](Self::headers_for_overridden).
    pub fn key_override(&self, name: &str, key: &[u8]) -> Option<Arc<KeyOverride>> {
        let index = self
            .inner
            .policies
            .iter()
            .position(|p| p.http.policy.name() == name)?;
        self.live_override(index, key)
    }

    /// How many overrides are set (expired ones included until the next
    /// [`set_overrides`](Self::set_overrides)).
    pub fn override_count(&self) -> usize {
        self.inner.overrides.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(limit: u32, secs: u64) -> Quota {
        Quota::sliding_window_counter(limit, Duration::from_secs(secs))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn fields_left_out_keep_the_policys_values() {
        let base = window(100, 60);
        let limit_only = QuotaFields {
            limit: Some(1000),
            ..QuotaFields::default()
        };
        assert_eq!(limit_only.apply(&base), Ok(window(1000, 60)));
        let window_only = QuotaFields {
            window: Some(Duration::from_secs(3600)),
            ..QuotaFields::default()
        };
        assert_eq!(window_only.apply(&base), Ok(window(100, 3600)));
    }

    #[test]
    fn fields_of_another_algorithm_are_named() {
        let base = window(100, 60);
        let wrong = QuotaFields {
            capacity: Some(5),
            ..QuotaFields::default()
        };
        match wrong.apply(&base) {
            Err(OverrideError::Field { field, reason }) => {
                assert_eq!(field, "capacity");
                assert!(reason.contains("limit and window"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let none = QuotaFields::default();
        assert!(matches!(
            none.apply(&base),
            Err(OverrideError::Field { field: "limit", .. })
        ));
        let zero = QuotaFields {
            limit: Some(0),
            ..QuotaFields::default()
        };
        assert!(matches!(
            zero.apply(&base),
            Err(OverrideError::Field { field: "limit", .. })
        ));
    }

    #[test]
    fn buckets_take_their_own_fields_and_keep_max_delay() -> Result<(), Box<dyn std::error::Error>>
    {
        let tb = Quota::token_bucket(20, "1/s".parse()?)?;
        let more = QuotaFields {
            refill: Some("5/s".parse()?),
            ..QuotaFields::default()
        };
        assert_eq!(
            more.apply(&tb),
            Ok(Quota::token_bucket(20, "5/s".parse()?)?)
        );
        let Quota::LeakyBucket(lb) = Quota::leaky_bucket("5/s".parse()?, 10)? else {
            panic!("not a leaky bucket");
        };
        let lb = Quota::LeakyBucket(lb.with_max_delay(Duration::from_secs(2)));
        let deeper = QuotaFields {
            queue: Some(50),
            ..QuotaFields::default()
        };
        match deeper.apply(&lb) {
            Ok(Quota::LeakyBucket(b)) => {
                assert_eq!(b.queue(), 50);
                assert_eq!(b.max_delay(), Some(Duration::from_secs(2)));
            }
            other => panic!("{other:?}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod calendar_tests;
