//! Allow and deny lists: clients by address (CIDR) or by key, decided before any policy, at
//! every door, since every door prepares its requests here.
//!
//! - A request whose client address or one of whose keys is on a *deny* list is refused with a
//!   403 that names the list (never the entry) before any policy counts it.
//! - One on an *allow* list passes: no policy counts it (it is still counted in metrics, as
//!   allowed by its list).
//! - Deny wins: a request matched by both is refused.
//!
//! Addresses are looked up in a prefix trie per address family (`prefix-trie`), longest prefix
//! first, so a lookup costs what a prefix match costs whatever the list's size; an IPv4-mapped
//! IPv6 address is looked up as its IPv4 address. Keys are matched exactly as `/v1/top` shows
//! them (`header:x-api-key:<hash>`, `ip:203.0.113.7`), by computing the request's key for each
//! selector some entry names: only those selectors are read, only while there are key entries.
//!
//! The lists are the configured ones plus the entries added at run time (the server's admin
//! API); both are compiled into one table, swapped whole when either changes, read without a
//! lock. While no list has an entry a request pays one relaxed atomic load.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use http::{HeaderName, StatusCode};
use prefix_trie::PrefixMap;
use tollgate::{Clock, Store};

use super::{Engine, Prepared};

mod entry;

use crate::key::{CredentialHasher, KeyBuf, KeyContext};
use crate::{ConfigError, KeySelector, Refusal};
pub use entry::{ListAction, ListEntry};

/// A configured list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListSpec {
    /// Its name, unique among lists.
    pub name: String,
    /// What it does.
    pub action: ListAction,
    /// Its entries.
    pub entries: Vec<ListEntry>,
}

/// A request a list matched: which list, and what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListHit {
    /// The list's name.
    pub list: &'static str,
    /// What it did.
    pub action: ListAction,
}

/// The compiled lists: a trie per address family and action, a key table per action.
#[derive(Debug, Default)]
struct Table {
    names: Vec<ListHit>,
    v4: [PrefixMap<(u32, u8), u32>; 2],
    v6: [PrefixMap<(u128, u8), u32>; 2],
    keys: [HashMap<Box<[u8]>, u32, foldhash::fast::RandomState>; 2],
    /// The selectors key entries name, each read once per request.
    selectors: Vec<KeySelector>,
    ips: bool,
}

impl Table {
    fn build(config: &[ListSpec], live: &[(String, ListEntry)]) -> Table {
        let mut table = Table::default();
        for spec in config {
            table.names.push(ListHit {
                list: tollgate::intern(&spec.name),
                action: spec.action,
            });
        }
        let entries = config
            .iter()
            .enumerate()
            .flat_map(|(i, spec)| spec.entries.iter().map(move |e| (i, e)))
            .chain(live.iter().filter_map(|(name, e)| {
                let i = config.iter().position(|s| s.name == *name)?;
                Some((i, e))
            }));
        for (i, entry) in entries {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let side = usize::from(config[i].action == ListAction::Allow);
            match entry {
                ListEntry::Ip(cidr) => {
                    table.ips = true;
                    match (cidr.addr(), cidr.prefix()) {
                        (IpAddr::V4(a), p) => {
                            table.v4[side].insert((u32::from(a), p), index);
                        }
                        (IpAddr::V6(a), p) => match a.to_ipv4_mapped() {
                            Some(v4) if p >= 96 => {
                                table.v4[side].insert((u32::from(v4), p - 96), index);
                            }
                            _ => {
                                table.v6[side].insert((u128::from(a), p), index);
                            }
                        },
                    }
                }
                ListEntry::Key { key, selector } => {
                    table.keys[side].insert(key.as_bytes().into(), index);
                    if !table.selectors.contains(selector) {
                        table.selectors.push(selector.clone());
                    }
                }
            }
        }
        table
    }

    fn is_empty(&self) -> bool {
        !self.ips && self.selectors.is_empty()
    }

    fn ip(&self, side: usize, ip: IpAddr) -> Option<u32> {
        match ip.to_canonical() {
            IpAddr::V4(a) => self.v4[side].get_lpm(&(u32::from(a), 32)).map(|(_, i)| *i),
            IpAddr::V6(a) => self.v6[side]
                .get_lpm(&(u128::from(a), 128))
                .map(|(_, i)| *i),
        }
    }

    fn hit(&self, index: u32) -> Option<ListHit> {
        self.names.get(usize::try_from(index).ok()?).copied()
    }
}

/// The engine's lists: the configured ones, the live entries, and the table built from both.
#[derive(Debug, Default)]
pub(crate) struct Lists {
    any: AtomicBool,
    table: ArcSwap<Table>,
    sources: Mutex<Sources>,
}

/// What the table is built from: the configured lists, and the live entries by list name.
type Sources = (Vec<ListSpec>, Vec<(String, ListEntry)>);

impl Lists {
    /// The lists `config` describes, with no live entries; refused: two lists of one name, and
    /// a `jwt:` key entry when the engine verifies no JWT (`has_jwt` false), which no request
    /// could match.
    pub(crate) fn new(config: Vec<ListSpec>, has_jwt: bool) -> Result<Lists, ConfigError> {
        for (i, spec) in config.iter().enumerate() {
            if config[..i].iter().any(|s| s.name == spec.name) {
                return Err(ConfigError::new(&spec.name, "two lists have this name"));
            }
            let jwt = spec.entries.iter().find(|e| {
                matches!(
                    e,
                    ListEntry::Key {
                        selector: KeySelector::Jwt(_),
                        ..
                    }
                )
            });
            if let Some(entry) = jwt
                && !has_jwt
            {
                return Err(ConfigError::new(
                    &entry.to_string(),
                    format!(
                        "list \"{}\": a jwt: key needs a verification key to ever match; add \
                         [jwt] with hs256_secret_env, rs256_public_key_file or \
                         es256_public_key_file",
                        spec.name
                    ),
                ));
            }
        }
        let lists = Lists::default();
        lists.install(config, Vec::new());
        Ok(lists)
    }

    fn install(&self, config: Vec<ListSpec>, live: Vec<(String, ListEntry)>) {
        let table = Table::build(&config, &live);
        let any = !table.is_empty();
        self.table.store(Arc::new(table));
        self.any.store(any, Ordering::Release);
        *self.sources.lock().unwrap_or_else(PoisonError::into_inner) = (config, live);
    }

    /// The headers key entries read (for the engine's [`Engine::headers_read`]).
    pub(crate) fn headers(config: &[ListSpec]) -> impl Iterator<Item = HeaderName> + '_ {
        config
            .iter()
            .flat_map(|s| &s.entries)
            .filter_map(|e| match e {
                ListEntry::Key {
                    selector: KeySelector::Header(name),
                    ..
                } => Some(name.clone()),
                ListEntry::Key {
                    selector: KeySelector::Jwt(_),
                    ..
                } => Some(http::header::AUTHORIZATION),
                _ => None,
            })
    }

    /// The list that matches the request, if any: deny lists first.
    #[inline]
    fn check(
        &self,
        cx: &KeyContext<'_>,
        hasher: &CredentialHasher,
    ) -> Result<Option<ListHit>, Refusal> {
        if !self.any.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let table = self.table.load();
        let ip = if table.ips {
            cx.client_ip
                .get_or_init(|| (cx.resolve_ip)(cx.info).map_err(Box::new))
                .clone()
                .map_err(|r| *r)?
        } else {
            None
        };
        let mut keys: smallvec::SmallVec<[KeyBuf; 2]> = smallvec::SmallVec::new();
        for selector in &table.selectors {
            let mut key = KeyBuf::new();
            if cx.select(selector, hasher, &mut key)? {
                keys.push(key);
            }
        }
        for side in [0, 1] {
            let by_ip = ip.and_then(|ip| table.ip(side, ip));
            let by_key = || {
                keys.iter()
                    .find_map(|k| table.keys[side].get(&k[..]).copied())
            };
            if let Some(index) = by_ip.or_else(by_key) {
                return Ok(table.hit(index));
            }
        }
        Ok(None)
    }

    /// The list that matches a client address alone, if any: deny lists first.
    fn check_address(&self, ip: IpAddr) -> Option<ListHit> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let table = self.table.load();
        [0, 1]
            .into_iter()
            .find_map(|side| table.ip(side, ip))
            .and_then(|index| table.hit(index))
    }

    /// The list that matches a key given by name (as the store counts it), if any.
    fn check_key(&self, key: &[u8]) -> Option<ListHit> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let table = self.table.load();
        [0, 1]
            .into_iter()
            .find_map(|side| table.keys[side].get(key).copied())
            .and_then(|index| table.hit(index))
    }
}

/// The 403 of a request on deny list `list`.
fn forbidden(list: &str) -> Refusal {
    let mut detail = String::from("This client is on the deny list ");
    detail.push_str(&serde_json::Value::from(list).to_string());
    detail.push('.');
    Refusal::new(StatusCode::FORBIDDEN, "Forbidden", "").with_detail(detail)
}

impl Prepared {
    /// The list that decided the request, when one did: refused by a deny list (the 403 is the
    /// prepared refusal), or let through by an allow list (no policy counts it).
    pub fn listed(&self) -> Option<ListHit> {
        self.listed
    }

    fn set_listed(&mut self, hit: ListHit) {
        self.listed = Some(hit);
        self.entries.clear();
        if hit.action == ListAction::Deny {
            self.refusal = Some(Box::new(forbidden(hit.list)));
        }
    }
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// Applies the lists to a request being prepared: `true` when one decided it.
    #[inline]
    pub(super) fn apply_lists(&self, cx: &KeyContext<'_>, prepared: &mut Prepared) -> bool {
        match self.inner.lists.check(cx, &self.inner.hasher) {
            Ok(None) => false,
            Ok(Some(hit)) => {
                prepared.set_listed(hit);
                true
            }
            Err(refusal) => {
                prepared.refusal = Some(Box::new(refusal));
                true
            }
        }
    }

    /// Applies the key lists to a check by policy name: `true` when one decided it.
    pub(super) fn apply_key_lists(&self, key: &[u8], prepared: &mut Prepared) -> bool {
        match self.inner.lists.check_key(key) {
            Some(hit) => {
                prepared.set_listed(hit);
                true
            }
            None => false,
        }
    }

    /// The list (by address only) that decides a request from `ip`, for a door that knows
    /// nothing of the request but its client's address (Envoy's, from `remote_address`).
    pub fn list_for_address(&self, ip: IpAddr) -> Option<ListHit> {
        self.inner.lists.check_address(ip)
    }

    /// The configured lists, in order.
    pub fn lists(&self) -> Vec<ListSpec> {
        let sources = self
            .inner
            .lists
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sources.0.clone()
    }

    /// Replaces the entries added at run time with `entries` (list name, entry); entries of a
    /// list the engine does not have are kept aside and ignored. Requests prepared from now on
    /// see them.
    pub fn set_live_list_entries(&self, entries: Vec<(String, ListEntry)>) {
        let config = self.lists();
        self.inner.lists.install(config, entries);
    }

    /// Whether `entry` can be matched by this engine: a key entry reading a header the engine
    /// does not read (no policy's key and no configured list's names it) would never match
    /// behind the proxy, which copies only those headers; `Err` says why.
    pub fn list_entry_readable(&self, entry: &ListEntry) -> Result<(), String> {
        let name = match entry {
            ListEntry::Key {
                selector: KeySelector::Header(name),
                ..
            } => name.clone(),
            ListEntry::Key {
                selector: KeySelector::Jwt(_),
                ..
            } if self.inner.jwt.is_none() => {
                return Err(
                    "no JWT key is configured ([jwt]): a jwt: key can never match".to_owned(),
                );
            }
            ListEntry::Key {
                selector: KeySelector::Ip,
                ..
            } => return entry.fits_ipv6_prefix(self.inner.ipv6_prefix),
            _ => return Ok(()),
        };
        if self.inner.headers_read.contains(&name) {
            Ok(())
        } else {
            Err(format!(
                "header {name} is read by no policy's key and no configured list; a live entry \
                 can only name a header the configuration reads"
            ))
        }
    }
}
