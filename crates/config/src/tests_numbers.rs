//! Integers past the 64 bits TOML holds (`limit = 99999999999999999999`): each reported at its
//! field with the field's range and the number as written, all at once, never in serde's words
//! ("invalid type: integer `99999999999999999999` as i128, expected i64").

use super::*;

fn errors(text: &str) -> Vec<String> {
    match Config::parse("t.toml", text) {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(d)) => d.0.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
    }
}

fn assert_no_serde_words(errors: &[String]) {
    for e in errors {
        assert!(
            !e.contains("invalid type") && !e.contains("i128") && !e.contains("expected i64"),
            "{e}"
        );
    }
}

#[test]
fn a_policy_limit_past_64_bits_names_the_field_and_its_range() {
    let e = errors(
        "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\n\
         limit = 99999999999999999999\nwindow = \"1m\"\nkey = [\"ip\"]\n",
    );
    assert_eq!(
        e,
        [
            "t.toml:4:9: policy \"api\": field \"limit\" must be between 1 and 4294967295, \
             not 99999999999999999999"
        ]
    );
}

/// Serde stopped at the first; the shape check finds them all, too large or too small, in
/// decimal or hex, and each field's own check gives its range.
#[test]
fn every_integer_field_past_64_bits_is_reported_with_its_range() {
    let e = errors(
        "[server]\n\
         max_connections = -99999999999999999999\n\
         ipv6_prefix = 0xFFFFFFFFFFFFFFFFFF\n\
         max_header_bytes = 99999999999999999999\n\
         [store]\n\
         max_keys = 99999999999999999999\n\
         [telemetry]\n\
         sample_ratio = 99999999999999999999\n\
         [proxy]\n\
         listen = \"127.0.0.1:0\"\n\
         upstream = \"http://127.0.0.1:3000\"\n\
         [[policy]]\n\
         name = \"q\"\n\
         algorithm = \"leaky_bucket\"\n\
         rate = \"5/s\"\n\
         queue = -99999999999999999999\n\
         action = \"queue\"\n\
         cost = 99999999999999999999\n\
         queue_max_depth = 99_999_999_999_999_999_999\n\
         ban = { after = 99999999999999999999, within = \"1m\", for = \"1m\" }\n",
    );
    assert_no_serde_words(&e);
    let expected = [
        "t.toml:2:19: [server] field \"max_connections\" must be 1 to 1000000, not -99999999999999999999",
        "t.toml:3:15: [server] field \"ipv6_prefix\" must be 0 to 128, not 0xFFFFFFFFFFFFFFFFFF",
        "t.toml:4:20: [server] field \"max_header_bytes\" must be 1024 to 1048576, not 99999999999999999999",
        "t.toml:6:12: [store] field \"max_keys\" must be between 1 and 4294967295, not 99999999999999999999",
        "t.toml:8:16: [telemetry] field \"sample_ratio\" = 99999999999999999999 must be from 0 to 1",
        "t.toml:16:9: policy \"q\": field \"queue\" must be between 0 and 4294967295, not -99999999999999999999",
        "t.toml:18:8: policy \"q\": field \"cost\" must be between 1 and 4294967295, not 99999999999999999999",
        "t.toml:19:19: policy \"q\": field \"queue_max_depth\" must be from 1 to 100000000, not 99999999999999999999",
        "t.toml:20:17: policy \"q\": field \"ban.after\" must be between 1 and 4294967295, not 99999999999999999999",
    ];
    assert_eq!(e.len(), expected.len(), "{e:#?}");
    for (got, want) in e.iter().zip(expected) {
        assert!(got.starts_with(want), "{got}\nwant: {want}");
    }
}

/// A field no check reaches (its policy is refused before it) is still refused, by name.
#[test]
fn a_number_past_64_bits_no_check_reaches_is_still_refused_by_name() {
    let e = errors("[[policy]]\nlimit = 99999999999999999999\n");
    assert_no_serde_words(&e);
    assert!(
        e.contains(
            &"t.toml:2:9: field \"limit\" in [[policy]] #1 is 99999999999999999999, a number \
              too large for it (past 64 bits); write e.g. limit = 100"
                .to_owned()
        ),
        "{e:#?}"
    );
    let e = errors("[telemetry]\nsample_ratio = -99999999999999999999\n");
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(e[0].starts_with("t.toml:2:16: [telemetry] field \"sample_ratio\" = -99999999999999999999 must be from 0 to 1"), "{e:#?}");
}

/// The number as written appears only for a number past 64 bits: others keep their value.
#[test]
fn numbers_within_64_bits_are_shown_as_their_value() {
    let e = errors(
        "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\n\
         limit = 9_223_372_036_854_775_807\nwindow = \"1m\"\nkey = [\"ip\"]\n",
    );
    assert_eq!(
        e,
        [
            "t.toml:4:9: policy \"api\": field \"limit\" must be between 1 and 4294967295, \
          not 9223372036854775807"
        ]
    );
}
