//! A limiter's policies by name: what `check("api", ..)` looks up on every call.

use std::collections::HashMap;

use crate::{Policy, Quota};

/// Policies by name. Most limiters have a handful, and comparing a few short names is several
/// times cheaper than hashing one, so small sets are scanned; large ones use a map.
///
/// The lookup a check makes ([`checkable`](Self::checkable)) leaves concurrency limits out:
/// they are held with slots, not checked, and a check that names one is told so on its
/// error path, so telling them apart costs a check nothing.
#[derive(Debug)]
pub(super) struct Policies {
    list: Vec<Policy>,
    lookup: Lookup,
}

/// How [`Policies`] finds a name.
#[derive(Debug)]
enum Lookup {
    /// One policy, the common case: its probe, compared in place (no slice to load and bound).
    One(NameProbe),
    /// The names of `list` as the scan compares them, side by side in one allocation.
    Scan(Vec<NameProbe>),
    Map(HashMap<&'static str, usize>),
}

impl Policies {
    const SCAN_UP_TO: usize = 8;

    pub(super) fn new(list: Vec<Policy>) -> Self {
        let probe = |p: &Policy| match p.quota() {
            Quota::Concurrency(_) => NameProbe::NONE,
            _ => NameProbe::of(p.name()),
        };
        let lookup = match &list[..] {
            [only] => Lookup::One(probe(only)),
            _ if list.len() > Self::SCAN_UP_TO => Lookup::Map(
                list.iter()
                    .enumerate()
                    .filter(|(_, p)| !matches!(p.quota(), Quota::Concurrency(_)))
                    .map(|(i, p)| (p.name(), i))
                    .collect(),
            ),
            _ => Lookup::Scan(list.iter().map(probe).collect()),
        };
        Policies { list, lookup }
    }

    /// The policy named `name`, whatever it is.
    pub(super) fn get(&self, name: &str) -> Option<&Policy> {
        self.checkable(name)
            .or_else(|| self.list.iter().find(|p| p.name() == name))
    }

    /// Every policy, in the order given.
    pub(super) fn list(&self) -> &[Policy] {
        &self.list
    }

    /// The policy named `name` if a check can ask it: any but a concurrency limit.
    #[inline(always)]
    pub(super) fn checkable(&self, name: &str) -> Option<&Policy> {
        let policy = match &self.lookup {
            Lookup::One(only) => {
                if *only != NameProbe::of(name) {
                    return None;
                }
                self.list.first()?
            }
            Lookup::Scan(probes) => {
                let probe = NameProbe::of(name);
                &self.list[probes.iter().position(|p| *p == probe)?]
            }
            Lookup::Map(index) => return index.get(name).map(|&i| &self.list[i]),
        };
        // A probe covers names of up to 16 bytes; longer ones compare their middles too.
        (name.len() <= NameProbe::EXACT_UP_TO || middles_equal(policy.name(), name))
            .then_some(policy)
    }
}

/// A name's length and its first and last eight bytes (overlapping for names of 8 to 16 bytes,
/// the first and last four, two or one for shorter ones): equal probes mean equal names of up
/// to 16 bytes, and no `memcmp` call per policy scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NameProbe {
    len: usize,
    head: u64,
    tail: u64,
}

impl NameProbe {
    const EXACT_UP_TO: usize = 16;

    /// A probe no name has (names are at most 128 bytes): a policy left out of the lookup.
    const NONE: NameProbe = NameProbe {
        len: usize::MAX,
        head: 0,
        tail: 0,
    };

    #[inline]
    fn of(name: &str) -> Self {
        let b = name.as_bytes();
        let n = b.len();
        let (head, tail) = if n >= 8 {
            (word::<8>(b, 0), word::<8>(b, n - 8))
        } else if n >= 4 {
            (word::<4>(b, 0), word::<4>(b, n - 4))
        } else if n >= 2 {
            (word::<2>(b, 0), word::<2>(b, n - 2))
        } else {
            (b.first().map_or(0, |&x| u64::from(x)), 0)
        };
        NameProbe { len: n, head, tail }
    }
}

/// Whether two names of the same length over 16 bytes, whose probes are equal (so their first
/// and last eight bytes are), agree in between: a word at a time, inline, where a `memcmp` call
/// cost a fifth of a check (callgrind, a 22-byte name).
#[inline]
fn middles_equal(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let end = a.len().saturating_sub(8);
    let mut at = 8;
    while at < end {
        if word::<8>(a, at) != word::<8>(b, at) {
            return false;
        }
        at += 8;
    }
    true
}

/// The `N` bytes of `b` at `at` as a little-endian number (`N` ≤ 8, `at + N` ≤ `b.len()`).
#[inline]
fn word<const N: usize>(b: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w[..N].copy_from_slice(&b[at..at + N]);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The scan (probes, then middles for long names) against comparing whole names, over names
    /// of every length up to the 128-byte limit that differ in one byte anywhere, with one policy
    /// (its own path) and with the most the scan takes.
    #[test]
    fn name_lookup_agrees_with_comparing_names() -> Result<(), crate::QuotaError> {
        let quota = Quota::fixed_window(1, Duration::from_secs(1))?;
        for (count, len) in [1, Policies::SCAN_UP_TO]
            .into_iter()
            .flat_map(|count| (1..=128).map(move |len| (count, len)))
        {
            let base: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            let mut names = vec![base.clone()];
            for at in 0..len {
                let mut other = base.clone().into_bytes();
                other[at] = b'Z';
                names.push(String::from_utf8(other).unwrap_or_default());
            }
            let registered: Vec<Policy> = names
                .iter()
                .take(count)
                .map(|n| Policy::new(n, quota.clone()))
                .collect::<Result<_, _>>()?;
            let policies = Policies::new(registered.clone());
            for name in &names {
                let expected = registered
                    .iter()
                    .find(|p| p.name() == name)
                    .map(Policy::name);
                assert_eq!(policies.get(name).map(Policy::name), expected, "{name}");
            }
            // Shorter and longer names never match.
            assert!(policies.get(&base[..len - 1]).is_none() || len == 1);
            assert!(policies.get(&format!("{base}a")).is_none());
        }
        Ok(())
    }
}
