//! [`HeaderList`]: the rate-limit headers of one response, as the numbers and interned text
//! they are written from.

use std::time::Duration;

use tollgate::headers as fields;
use tollgate::{Decision, Timestamp};

use super::field::{Field, Value, Which};
use super::{HeaderConfig, PolicyText, RetryAfterFormat};

/// `Retry-After`, when a response carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Retry {
    #[default]
    None,
    /// Whole seconds.
    Seconds(u64),
    /// An HTTP date, this many seconds after the epoch.
    Date(u64),
}

/// The form of a [`HeaderList`]'s `Retry-After`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum RetryKind {
    #[default]
    None,
    Seconds,
    Date,
}

/// The rate-limit headers of one response, kept as what they are written from: the numbers of
/// the most restrictive decision and references to the policies' interned text. The fields
/// themselves ([`HeaderList::fields`]) are made as they are written.
///
/// Small on purpose (80 bytes, no allocation for one or two policies): a tower response future
/// carries it while the inner service runs, and every byte of it is moved with the future.
#[derive(Clone, Debug, Default)]
pub(crate) struct HeaderList {
    /// The policies `RateLimit-Policy` lists, in order; empty when no decision is reported.
    policies: smallvec::SmallVec<[PolicyText; 2]>,
    /// Which of them made the most restrictive decision (its quoted name for `RateLimit`).
    worst: Option<u8>,
    /// Its limit, remaining count, `X-RateLimit-Reset` and `RateLimit`'s `t`.
    limit: u64,
    remaining: u64,
    reset: u64,
    t: u64,
    /// `Retry-After`: which form, and its seconds or date. Kept apart rather than as a
    /// [`Retry`], whose tag would take a word of its own.
    retry_kind: RetryKind,
    retry: u64,
    /// Which families to write (the `[headers]` config), and whether `reset` is written.
    legacy: bool,
    ietf: bool,
    has_reset: bool,
}

impl HeaderList {
    /// No headers.
    pub(crate) fn new() -> Self {
        HeaderList::default()
    }

    /// Only `Retry-After: 1`, for an answer that asks for a retry soon without a decision
    /// behind it.
    pub(crate) fn retry_soon() -> Self {
        let mut list = HeaderList::default();
        list.set_retry(Retry::Seconds(1));
        list
    }

    /// Adds `Retry-After`, after the other fields.
    pub(crate) fn set_retry(&mut self, retry: Retry) {
        (self.retry_kind, self.retry) = match retry {
            Retry::None => (RetryKind::None, 0),
            Retry::Seconds(secs) => (RetryKind::Seconds, secs),
            Retry::Date(at) => (RetryKind::Date, at),
        };
    }

    /// `Retry-After`, if the list has it.
    pub(crate) fn retry(&self) -> Retry {
        match self.retry_kind {
            RetryKind::None => Retry::None,
            RetryKind::Seconds => Retry::Seconds(self.retry),
            RetryKind::Date => Retry::Date(self.retry),
        }
    }

    /// The `t` the `RateLimit` field reports, if the list has that field.
    /// The most restrictive decision's policy text.
    fn worst(&self) -> Option<&PolicyText> {
        self.policies.get(usize::from(self.worst?))
    }

    pub(crate) fn t(&self) -> Option<u64> {
        (self.ietf && self.worst.is_some()).then_some(self.t)
    }

    /// The fields, in order: `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `RateLimit-Policy`,
    /// `RateLimit`, `Retry-After`, each when configured and known. Made one at a time, as they
    /// are written: nothing is collected.
    pub(crate) fn fields(&self) -> Fields<'_> {
        Fields {
            list: self,
            next: 0,
        }
    }

    /// The `which` field, if the list has it.
    fn field(&self, which: Which) -> Option<Field<'_>> {
        let value = match which {
            Which::RetryAfter => match self.retry() {
                Retry::None => return None,
                Retry::Seconds(secs) => Value::Number(secs),
                Retry::Date(at) => Value::Date(at),
            },
            Which::Limit | Which::Remaining | Which::Reset if !self.legacy => return None,
            Which::Policy | Which::RateLimit if !self.ietf => return None,
            Which::Limit => {
                let worst = self.worst()?;
                if self.limit == worst.headers().limit {
                    Value::Text(worst.text(|h| &h.limit_text))
                } else {
                    Value::Number(self.limit)
                }
            }
            Which::Remaining => {
                self.worst?;
                Value::Number(self.remaining)
            }
            Which::Reset => {
                self.worst?;
                if !self.has_reset {
                    return None;
                }
                Value::Number(self.reset)
            }
            Which::Policy => {
                self.worst?;
                match self.policies.as_slice() {
                    [only] => Value::Text(only.text(|h| &h.policy_item)),
                    many => Value::Items(many),
                }
            }
            Which::RateLimit => Value::Item {
                quoted: &self.worst()?.headers().quoted_name,
                r: self.remaining,
                t: self.t,
            },
        };
        Some(Field { which, value })
    }

    /// Whether there are none.
    pub(crate) fn is_empty(&self) -> bool {
        self.retry_kind == RetryKind::None && (self.worst.is_none() || !(self.legacy || self.ietf))
    }
}

/// The fields of a [`HeaderList`], made as they are asked for.
#[derive(Clone, Debug)]
pub(crate) struct Fields<'a> {
    list: &'a HeaderList,
    /// The position in [`Which::ORDER`] to look at next.
    next: usize,
}

impl<'a> Iterator for Fields<'a> {
    type Item = Field<'a>;

    fn next(&mut self) -> Option<Field<'a>> {
        while let Some(&which) = Which::ORDER.get(self.next) {
            self.next += 1;
            if let Some(field) = self.list.field(which) {
                return Some(field);
            }
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = Which::ORDER
            .get(self.next..)
            .unwrap_or_default()
            .iter()
            .filter(|&&which| self.list.field(which).is_some())
            .count();
        (left, Some(left))
    }
}

impl ExactSizeIterator for Fields<'_> {}

/// Appends `list`'s fields to `out` as HTTP/1.1 header lines (`name: value` and CRLF each).
pub(crate) fn write_lines(list: &HeaderList, out: &mut Vec<u8>) {
    for f in list.fields() {
        out.extend_from_slice(f.which.line_start());
        f.write_value(out);
        out.extend_from_slice(b"\r\n");
    }
}

/// The headers for `decisions` (with their policies' text).
pub(crate) fn render(
    config: &HeaderConfig,
    now: Timestamp,
    items: &[(&Decision, PolicyText)],
) -> HeaderList {
    render_reporting(config, now, items, &[])
}

/// [`render`], where `shadow[i]` says the i-th decision is a shadow policy's (missing: not).
/// `RateLimit-Policy` lists every policy, but the numbers (`X-RateLimit-*`, `RateLimit`, and
/// the `t` that `Retry-After` is never below) are the most restrictive enforcing decision's:
/// a policy on trial must not change the answer the enforcing ones give, or tell a client that
/// paces itself by them to slow down. With only shadow policies, theirs are reported: what
/// would have happened.
pub(crate) fn render_reporting(
    config: &HeaderConfig,
    now: Timestamp,
    items: &[(&Decision, PolicyText)],
    shadow: &[bool],
) -> HeaderList {
    let is_shadow = |i: usize| shadow.get(i).copied().unwrap_or(false);
    let enforcing = (0..items.len()).any(|i| !is_shadow(i));
    let Some((at, &(worst, _))) = items
        .iter()
        .enumerate()
        .filter(|(i, _)| !enforcing || !is_shadow(*i))
        .min_by(|(_, (a, _)), (_, (b, _))| fields::cmp_restrictive(a, b))
    else {
        return HeaderList::new();
    };
    let reset = if config.legacy {
        config.reset_format.reset_secs(now, worst)
    } else {
        None
    };
    HeaderList {
        policies: items.iter().map(|(_, text)| text.clone()).collect(),
        worst: u8::try_from(at).ok(),
        limit: worst.limit,
        remaining: worst.remaining,
        reset: reset.unwrap_or(0),
        t: fields::t_secs(worst),
        retry_kind: RetryKind::None,
        retry: 0,
        legacy: config.legacy,
        ietf: config.ietf,
        has_reset: reset.is_some(),
    }
}

/// `Retry-After` for a wait of `wait`, and its whole seconds: rounded up, at least 1, and not
/// earlier than `floor_secs` (the `t` the `RateLimit` field reports).
pub(crate) fn retry_after(
    format: RetryAfterFormat,
    now: Timestamp,
    wait: Duration,
    floor_secs: u64,
) -> (u64, Retry) {
    let secs = fields::retry_after_secs(wait, floor_secs);
    let retry = match format {
        RetryAfterFormat::Seconds => Retry::Seconds(secs),
        // Whole seconds after now, rounded up, so the date is never earlier than the wait.
        RetryAfterFormat::HttpDate => Retry::Date(
            fields::ceil_secs(Duration::from_micros(now.as_micros())).saturating_add(secs),
        ),
    };
    (secs, retry)
}
