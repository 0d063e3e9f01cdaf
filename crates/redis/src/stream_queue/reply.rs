//! What the queue's scripts and commands answer, read into plain types. Redis is trusted to
//! answer what the scripts return, but a reply of another shape is an error, never a panic.

use redis::Value;
use tollgate::StoreError;

/// A message as the queue holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedMessage {
    /// Its stream entry (changes when a dead letter is re-driven).
    pub entry: String,
    /// Its id (never changes).
    pub id: String,
    /// The rate-limit key its deliveries are counted under.
    pub key: Vec<u8>,
    /// What to deliver.
    pub payload: Vec<u8>,
    /// When it was first queued, in milliseconds since the Unix epoch.
    pub enqueued_ms: u64,
}

/// A message that ran out of attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The message.
    pub message: QueuedMessage,
    /// Attempts made.
    pub attempts: u32,
    /// The upstream's last status, when it answered.
    pub status: Option<u16>,
    /// The last error, when it did not answer (refused, timed out, broke off).
    pub error: Option<String>,
    /// When it died, in milliseconds since the Unix epoch.
    pub died_ms: u64,
}

/// Where a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageState {
    /// Waiting for its slot.
    Queued,
    /// Taken by an instance: being delivered, or waiting to be tried again.
    Delivering,
    /// The upstream answered it (see [`MessageStatus::status`]: a 4xx is final too).
    Delivered,
    /// Out of attempts: a dead letter.
    Dead,
}

impl MessageState {
    /// `"queued"`, `"delivering"`, `"delivered"` or `"dead"`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Queued => "queued",
            MessageState::Delivering => "delivering",
            MessageState::Delivered => "delivered",
            MessageState::Dead => "dead",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "queued" => MessageState::Queued,
            "delivering" => MessageState::Delivering,
            "delivered" => MessageState::Delivered,
            "dead" => MessageState::Dead,
            _ => return None,
        })
    }
}

/// A message's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageStatus {
    /// Where it is.
    pub state: MessageState,
    /// Delivery attempts so far.
    pub attempts: u32,
    /// The upstream's status for the last attempt it answered.
    pub status: Option<u16>,
    /// The last attempt's error, when the upstream did not answer it.
    pub error: Option<String>,
    /// When it was queued, in milliseconds since the Unix epoch.
    pub enqueued_ms: u64,
    /// When its status last changed, in milliseconds since the Unix epoch.
    pub updated_ms: u64,
}

/// A queue's size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages waiting or being delivered.
    pub depth: u64,
    /// Dead letters.
    pub dead: u64,
    /// When the oldest message still in the queue was queued (ms since the Unix epoch).
    pub oldest_ms: Option<u64>,
}

pub(super) fn unexpected(what: &str, reply: &Value) -> StoreError {
    StoreError::Protocol {
        reason: format!("unexpected reply to the queue's {what}: {reply:?}"),
    }
}

/// A bulk or simple string as text; `None` for anything else (nil, false).
pub(super) fn text(v: &Value) -> Option<String> {
    bytes(v).map(|b| String::from_utf8_lossy(b).into_owned())
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(super) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text(other).and_then(|t| t.parse().ok()),
    }
}

/// An array of strings (other elements skipped).
pub(super) fn texts(v: &Value) -> Vec<String> {
    match v {
        Value::Array(items) => items.iter().filter_map(text).collect(),
        _ => Vec::new(),
    }
}

/// Stream entries, `{{entry id, {field, value, ...}}, ...}`, as messages.
pub(super) fn entries(reply: Value) -> Result<Vec<QueuedMessage>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(unexpected("read", &reply));
    };
    items
        .iter()
        .map(|item| entry(item).map(|(m, _)| m))
        .collect()
}

/// Dead-letter entries.
pub(super) fn dead_letters(reply: Value) -> Result<Vec<DeadLetter>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(unexpected("dead letters", &reply));
    };
    items
        .iter()
        .map(|item| {
            let (message, fields) = entry(item)?;
            let field = |name: &str| fields.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
            let number = |name: &str| {
                field(name)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Ok(DeadLetter {
                attempts: number("attempts")
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                status: number("status").and_then(|n| u16::try_from(n).ok()),
                error: field("error")
                    .filter(|e| !e.is_empty())
                    .map(|e| String::from_utf8_lossy(e).into_owned()),
                died_ms: number("died").unwrap_or(0),
                message,
            })
        })
        .collect()
}

/// A stream entry's fields, by name.
type Fields<'a> = Vec<(&'a str, &'a [u8])>;

/// One entry: the message, and every field by name.
fn entry(item: &Value) -> Result<(QueuedMessage, Fields<'_>), StoreError> {
    let bad = || unexpected("stream entry", item);
    let Value::Array(parts) = item else {
        return Err(bad());
    };
    let (Some(id), Some(Value::Array(flat))) = (parts.first().and_then(text), parts.get(1)) else {
        return Err(bad());
    };
    let mut fields = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks(2) {
        if let [name, value] = pair
            && let (Some(name), Some(value)) = (bytes(name), bytes(value))
        {
            fields.push((std::str::from_utf8(name).unwrap_or(""), value));
        }
    }
    let field = |name: &str| fields.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let message = QueuedMessage {
        id: field("id")
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .ok_or_else(bad)?,
        key: field("key").map(<[u8]>::to_vec).unwrap_or_default(),
        payload: field("p").map(<[u8]>::to_vec).ok_or_else(bad)?,
        enqueued_ms: field("at")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        entry: id,
    };
    Ok((message, fields))
}

/// A status hash (`HGETALL`: a flat list in RESP2, a map in RESP3); `None` when empty.
pub(super) fn status(reply: &Value) -> Option<MessageStatus> {
    let pairs: Vec<(&Value, &Value)> = match reply {
        Value::Array(flat) => flat
            .chunks(2)
            .filter_map(|p| match p {
                [k, v] => Some((k, v)),
                _ => None,
            })
            .collect(),
        Value::Map(map) => map.iter().map(|(k, v)| (k, v)).collect(),
        _ => return None,
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| bytes(k) == Some(name.as_bytes()))
            .and_then(|(_, v)| text(v))
    };
    let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
    Some(MessageStatus {
        state: MessageState::parse(&field("state")?)?,
        attempts: number("attempts")
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        status: number("status").and_then(|n| u16::try_from(n).ok()),
        error: field("error").filter(|e| !e.is_empty()),
        enqueued_ms: number("at").unwrap_or(0),
        updated_ms: number("updated").unwrap_or(0),
    })
}

/// `{depth, dead, oldest "at" or false}`.
pub(super) fn stats(reply: &Value) -> Result<QueueStats, StoreError> {
    let Value::Array(items) = reply else {
        return Err(unexpected("stats", reply));
    };
    match items.as_slice() {
        [depth, dead, oldest] => Ok(QueueStats {
            depth: int(depth).and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
            dead: int(dead).and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
            oldest_ms: int(oldest).and_then(|n| u64::try_from(n).ok()),
        }),
        _ => Err(unexpected("stats", reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn entries_are_read_by_field_name_and_bad_shapes_are_errors() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![
                bulk("at"),
                bulk("17"),
                bulk("id"),
                bulk("abc"),
                bulk("p"),
                bulk("payload"),
                bulk("key"),
                bulk("k"),
            ]),
        ])]);
        let got = entries(reply);
        assert_eq!(
            got.ok(),
            Some(vec![QueuedMessage {
                entry: "1-0".into(),
                id: "abc".into(),
                key: b"k".to_vec(),
                payload: b"payload".to_vec(),
                enqueued_ms: 17,
            }])
        );
        assert!(entries(Value::Int(3)).is_err());
        assert!(entries(Value::Array(vec![Value::Array(vec![bulk("1-0")])])).is_err());
        // No payload: not a message of this queue.
        let no_payload = Value::Array(vec![Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![bulk("id"), bulk("abc")]),
        ])]);
        assert!(entries(no_payload).is_err());
    }

    #[test]
    fn statuses_read_both_resp_versions_and_unknown_states_are_none() {
        let flat = Value::Array(vec![
            bulk("state"),
            bulk("delivered"),
            bulk("attempts"),
            bulk("2"),
            bulk("status"),
            bulk("204"),
            bulk("error"),
            bulk(""),
        ]);
        let s = status(&flat);
        assert_eq!(s.as_ref().map(|s| s.state), Some(MessageState::Delivered));
        assert_eq!(s.as_ref().and_then(|s| s.status), Some(204));
        assert_eq!(s.as_ref().map(|s| s.attempts), Some(2));
        assert_eq!(s.and_then(|s| s.error), None);
        let map = Value::Map(vec![(bulk("state"), bulk("dead"))]);
        assert_eq!(status(&map).map(|s| s.state), Some(MessageState::Dead));
        assert_eq!(status(&Value::Array(Vec::new())), None);
        assert_eq!(
            status(&Value::Array(vec![bulk("state"), bulk("odd")])),
            None
        );
    }
}
