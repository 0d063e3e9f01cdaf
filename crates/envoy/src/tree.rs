//! The compiled configuration: each domain's descriptor tree, checked the way envoyproxy/ratelimit
//! checks its files and compiled into maps the service walks per request without allocating.

mod leaf;
mod wildcard;

use std::collections::{HashMap, HashSet};

use crate::config::{Config, ConfigError, Descriptor, OnError, ResetFormat};

pub(crate) use leaf::{Leaf, LeafLimit, LeafOptions, until_window_end};
use wildcard::Wildcard;

/// The compiled configuration.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) domains: HashMap<String, Tree>,
    pub(crate) failure_mode: OnError,
    pub(crate) x_ratelimit_headers: bool,
    pub(crate) ietf_headers: bool,
    pub(crate) reset_format: ResetFormat,
    /// Whether any limit `replaces` another: only then does a request pay for the check.
    pub(crate) has_replaces: bool,
}

/// The children of a node, by key.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    by_key: HashMap<String, KeyNodes>,
}

/// The nodes of one key at one level, in envoyproxy/ratelimit's order of precedence.
#[derive(Debug, Default)]
struct KeyNodes {
    exact: HashMap<String, Node>,
    /// In configuration order: the first that matches wins.
    wildcard: Vec<(Wildcard, Node)>,
    any: Option<Box<Node>>,
}

#[derive(Debug)]
struct Node {
    leaf: Option<Leaf>,
    children: Tree,
}

impl Compiled {
    /// Checks `config` and builds the matching trees. Errors name the file (when the domain
    /// came from one), the domain and the descriptor path.
    pub(crate) fn new(config: &Config) -> Result<Compiled, ConfigError> {
        let mut domains = HashMap::with_capacity(config.domains.len());
        let mut names = HashSet::new();
        let mut has_replaces = false;
        for domain in &config.domains {
            let location = match &domain.source {
                Some(src) => format!("{src}: domain {:?}", domain.name),
                None => format!("domain {:?}", domain.name),
            };
            if domain.name.is_empty() {
                return Err(ConfigError::new(location, "the domain must not be empty"));
            }
            if domains.contains_key(domain.name.as_str()) {
                return Err(ConfigError::new(location, "the domain is defined twice"));
            }
            let mut walk = Walk {
                location: &location,
                path: domain.name.clone(),
                shared: Vec::new(),
                names: &mut names,
                has_replaces: false,
            };
            let tree = walk.tree(&domain.descriptors)?;
            has_replaces |= walk.has_replaces;
            domains.insert(domain.name.clone(), tree);
        }
        Ok(Compiled {
            domains,
            failure_mode: config.failure_mode,
            x_ratelimit_headers: config.x_ratelimit_headers,
            ietf_headers: config.ietf_headers,
            reset_format: config.reset_format,
            has_replaces,
        })
    }
}

impl Config {
    /// Checks the configuration without serving it: every error envoyproxy/ratelimit would
    /// refuse the files with, and Tollgate's own (such as a Tollgate quota it cannot build).
    pub fn validate(&self) -> Result<(), ConfigError> {
        Compiled::new(self).map(drop)
    }
}

impl Tree {
    /// The leaf for a request descriptor's entries, walked the way envoyproxy/ratelimit walks
    /// them: entry by entry down the tree, an exact key+value node before a wildcard node (the
    /// first in configuration order that matches) before a key-only node; the limit applies
    /// only if the descriptor's last entry stops at a node that has one.
    pub(crate) fn find<'a, 'e>(
        &'a self,
        entries: impl ExactSizeIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&'a Leaf> {
        let last = entries.len().checked_sub(1)?;
        let mut tree = self;
        for (i, (key, value)) in entries.enumerate() {
            let nodes = tree.by_key.get(key)?;
            let node = nodes
                .exact
                .get(value)
                .or_else(|| {
                    nodes
                        .wildcard
                        .iter()
                        .find(|(w, _)| w.matches(value))
                        .map(|(_, n)| n)
                })
                .or(nodes.any.as_deref())?;
            if i == last {
                return node.leaf.as_ref();
            }
            tree = &node.children;
        }
        None
    }
}

/// The state of compiling one domain.
struct Walk<'a> {
    location: &'a str,
    /// `domain.key_value.key`: where the walk is, for policy names and errors.
    path: String,
    /// Per level above: the wildcard pattern whose matches share one counter, if any.
    shared: Vec<Option<Box<str>>>,
    names: &'a mut HashSet<String>,
    has_replaces: bool,
}

impl Walk<'_> {
    fn tree(&mut self, descriptors: &[Descriptor]) -> Result<Tree, ConfigError> {
        let mut tree = Tree::default();
        for d in descriptors {
            let segment = match &d.value {
                Some(v) => format!("{}_{}", d.key, v),
                None => d.key.clone(),
            };
            let here = format!("{}, descriptor {}.{segment}", self.location, self.path);
            let fail = |reason: &str| ConfigError::new(here.clone(), reason);
            if d.key.is_empty() {
                return Err(fail("the descriptor has an empty key"));
            }
            let wildcard = d.value.as_deref().and_then(Wildcard::new);
            if d.share_threshold && wildcard.is_none() {
                return Err(fail(
                    "share_threshold needs a wildcard value (with a `*`): every value it \
                     matches then shares one counter",
                ));
            }
            let saved = self.path.len();
            self.path.push('.');
            self.path.push_str(&segment);
            let share = wildcard
                .as_ref()
                .filter(|_| d.share_threshold)
                .map(|w| Box::from(w.pattern()));
            self.shared.push(share);
            let node = self.node(d, &here);
            self.shared.pop();
            self.path.truncate(saved);
            let node = node?;
            let nodes = tree.by_key.entry(d.key.clone()).or_default();
            let duplicate = match (&d.value, wildcard) {
                (None, _) => nodes.any.replace(Box::new(node)).is_some(),
                (Some(_), Some(w)) => {
                    let dup = nodes
                        .wildcard
                        .iter()
                        .any(|(p, _)| p.pattern() == w.pattern());
                    nodes.wildcard.push((w, node));
                    dup
                }
                (Some(v), None) => nodes.exact.insert(v.clone(), node).is_some(),
            };
            if duplicate {
                return Err(fail(
                    "the same key and value appear twice at this level (an empty value is no \
                     value)",
                ));
            }
        }
        Ok(tree)
    }

    /// The node of `d`, the walk standing on it.
    fn node(&mut self, d: &Descriptor, here: &str) -> Result<Node, ConfigError> {
        let leaf = match &d.rate_limit {
            None => None,
            Some(limit) => {
                let name = limit.name.as_deref().unwrap_or("");
                for replaced in &limit.replaces {
                    if replaced.is_empty() {
                        return Err(ConfigError::new(
                            here,
                            "a replaces entry must name the limit it replaces",
                        ));
                    }
                    if replaced == name {
                        return Err(ConfigError::new(
                            here,
                            format!("the limit replaces itself ({name:?})"),
                        ));
                    }
                }
                self.has_replaces |= !limit.replaces.is_empty();
                let options = LeafOptions {
                    shadow: d.shadow_mode,
                    quota_mode: d.quota_mode,
                    shared: self.shared.clone().into_boxed_slice(),
                };
                Some(Leaf::compile(limit, options, &self.path, self.names, here)?)
            }
        };
        let children = self.tree(&d.descriptors)?;
        Ok(Node { leaf, children })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::config::{Domain, RateLimit, Unit};

    fn tree() -> Compiled {
        let config = Config::new().domain(
            Domain::new("d")
                .descriptor(Descriptor::new("k").rate_limit(RateLimit::per(5, Unit::Second)))
                .descriptor(
                    Descriptor::new("k")
                        .value("v")
                        .rate_limit(RateLimit::per(1, Unit::Minute)),
                )
                .descriptor(
                    Descriptor::new("a")
                        .descriptor(Descriptor::new("b").rate_limit(RateLimit::per(3, Unit::Hour)))
                        .descriptor(
                            Descriptor::new("p")
                                .value("pre*")
                                .rate_limit(RateLimit::per(9, Unit::Day)),
                        ),
                ),
        );
        Compiled::new(&config).unwrap()
    }

    fn name(c: &Compiled, entries: &[(&str, &str)]) -> Option<&'static str> {
        c.domains["d"]
            .find(entries.iter().copied())
            .and_then(|l| match &l.limit {
                LeafLimit::Policy(p) => Some(p.name()),
                _ => None,
            })
    }

    #[test]
    fn matching_follows_envoy_ratelimit() {
        let c = tree();
        assert_eq!(name(&c, &[("k", "v")]), Some("d.k_v"));
        assert_eq!(name(&c, &[("k", "other")]), Some("d.k"));
        assert_eq!(name(&c, &[("a", "x")]), None);
        assert_eq!(name(&c, &[("a", "x"), ("b", "y")]), Some("d.a.b"));
        assert_eq!(name(&c, &[("a", "x"), ("p", "prefix")]), Some("d.a.p_pre*"));
        assert_eq!(name(&c, &[("a", "x"), ("p", "nope")]), None);
        assert_eq!(name(&c, &[("a", "x"), ("b", "y"), ("c", "z")]), None);
        assert_eq!(name(&c, &[("zz", "x")]), None);
        assert_eq!(name(&c, &[]), None);
    }

    #[test]
    fn duplicate_domains_are_refused() {
        let dup = Config::new()
            .domain(Domain::new("d"))
            .domain(Domain::new("d"));
        assert!(Compiled::new(&dup).unwrap_err().reason().contains("twice"));
    }
}
