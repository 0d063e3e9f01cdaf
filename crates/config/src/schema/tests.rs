//! The schema check against the serde structs it mirrors, and its messages.

use serde::de::{self, Deserialize, Visitor};

use super::super::{forward_auth::RawForwardAuth, log::RawLog, raw};
use super::*;

/// A deserializer that only records the field names a derived `Deserialize` struct asks
/// for (what serde passes to `deserialize_struct`), then stops.
struct FieldNames<'a>(&'a mut Vec<&'static str>);

impl<'de> de::Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only structs are inspected"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.extend_from_slice(fields);
        Err(de::Error::custom("fields recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

fn serde_fields<T: for<'de> Deserialize<'de>>() -> Vec<&'static str> {
    let mut names = Vec::new();
    let _ = T::deserialize(FieldNames(&mut names));
    names.sort_unstable();
    names
}

fn schema_fields(list: &[(&'static str, Ty)]) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = list.iter().map(|(name, _)| *name).collect();
    names.sort_unstable();
    names
}

#[test]
fn every_raw_struct_has_exactly_the_schema_fields() {
    let pairs = [
        (
            "top level",
            schema_fields(ROOT),
            serde_fields::<raw::RawConfig>(),
        ),
        (
            "[server]",
            schema_fields(SERVER),
            serde_fields::<raw::RawServer>(),
        ),
        (
            "[admin]",
            schema_fields(ADMIN),
            serde_fields::<raw::RawAdmin>(),
        ),
        (
            "[store]",
            schema_fields(STORE),
            serde_fields::<raw::RawStore>(),
        ),
        (
            "[proxy]",
            schema_fields(PROXY),
            serde_fields::<raw::RawProxy>(),
        ),
        (
            "[headers]",
            schema_fields(HEADERS),
            serde_fields::<raw::RawHeaders>(),
        ),
        (
            "[[policy]]",
            schema_fields(POLICY),
            serde_fields::<raw::RawPolicy>(),
        ),
        (
            "[policy.match]",
            schema_fields(MATCH),
            serde_fields::<raw::RawMatch>(),
        ),
        ("[jwt]", schema_fields(JWT), serde_fields::<raw::RawJwt>()),
        (
            "[envoy]",
            schema_fields(ENVOY),
            serde_fields::<raw::RawEnvoy>(),
        ),
        (
            "[forward_auth]",
            schema_fields(FORWARD_AUTH),
            serde_fields::<RawForwardAuth>(),
        ),
        ("[log]", schema_fields(LOG), serde_fields::<RawLog>()),
        (
            "[telemetry]",
            schema_fields(TELEMETRY),
            serde_fields::<super::super::telemetry::RawTelemetry>(),
        ),
    ];
    for (section, schema, serde) in pairs {
        assert!(!serde.is_empty(), "{section}: no fields recorded");
        assert_eq!(
            schema, serde,
            "{section}: schema.rs and the raw struct disagree"
        );
    }
}
