//! JSON bodies whose objects name each member once.
//!
//! `serde_json` keeps the last of a repeated member, and another reader of the same body (a
//! gateway that validated it first, a log pipeline) may keep the first: a body such as
//! `{"policy": "strict", "policy": "lenient"}` would then be decided under one policy and
//! audited under the other. The server refuses repeated header fields for the same reason.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Why `body` is not a JSON text whose objects (at any depth) name each member once: the first
/// repeated member. `None` for a body that is not JSON at all: its parse says why.
pub(crate) fn repeated_member(body: &[u8]) -> Option<String> {
    match serde_json::from_slice::<Unique>(body) {
        Err(e) if e.is_data() => Some(e.to_string()),
        _ => None,
    }
}

/// Any JSON value, read only to find a repeated member.
struct Unique;

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        while seq.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut seen = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            map.next_value::<Unique>()?;
            if let Some(name) = seen.replace(name) {
                return Err(de::Error::custom(format!(
                    "the member {name:?} is given twice; give each member once"
                )));
            }
        }
        Ok(Unique)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_given_twice_at_any_depth_is_found() {
        for body in [
            r#"{"policy":"a","policy":"b","key":"k"}"#,
            r#"{"method":"GET","headers":{"x-api-key":"a","x-api-key":"b"}}"#,
            r#"[{"a":1},{"b":2,"b":3}]"#,
        ] {
            let found = repeated_member(body.as_bytes());
            assert!(found.is_some_and(|e| e.contains("given twice")), "{body}");
        }
        for body in [
            r#"{"policy":"a","key":"k","cost":2}"#,
            r#"{"a":{"x":1},"b":{"x":1}}"#,
            "not json",
            "",
        ] {
            assert_eq!(repeated_member(body.as_bytes()), None, "{body}");
        }
    }
}
