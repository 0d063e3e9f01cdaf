//! Unit tests of the usage meter: every rule of `CostFrom`, `header:`, JSON bodies and event
//! streams, each body read whole, byte by byte, and split at every offset (and at every pair
//! of offsets when short), which must all answer the same.

use http::{HeaderMap, HeaderValue};

use super::*;

fn cost_from(text: &str) -> CostFrom {
    text.parse().unwrap()
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

fn json_headers() -> HeaderMap {
    headers(&[("content-type", "application/json")])
}

fn sse_headers() -> HeaderMap {
    headers(&[("content-type", "text/event-stream")])
}

/// The answer for `body` fed whole, which must be the answer for every other chunking.
fn read_every_way(cost_from: &CostFrom, headers: &HeaderMap, body: &[u8]) -> Usage {
    let whole = read_usage(cost_from, headers, body);
    let feed = |pieces: &[&[u8]]| {
        let mut meter = UsageMeter::new(cost_from, headers);
        for piece in pieces {
            meter.feed(piece);
        }
        meter.finish()
    };
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(feed(&bytes), whole, "byte by byte: {:?}", show(body));
    for at in 0..=body.len() {
        let (a, b) = body.split_at(at);
        assert_eq!(feed(&[a, b"", b]), whole, "split at {at}: {:?}", show(body));
    }
    if body.len() <= 96 {
        for i in 0..=body.len() {
            for j in i..=body.len() {
                let pieces = [&body[..i], &body[i..j], &body[j..]];
                assert_eq!(
                    feed(&pieces),
                    whole,
                    "split at {i} and {j}: {:?}",
                    show(body)
                );
            }
        }
    }
    whole
}

fn show(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

fn json(path: &str, body: &str) -> Usage {
    json_bytes(path, body.as_bytes())
}

fn json_bytes(path: &str, body: &[u8]) -> Usage {
    read_every_way(&cost_from(path), &json_headers(), body)
}

fn sse(path: &str, body: &str) -> Usage {
    read_every_way(&cost_from(path), &sse_headers(), body.as_bytes())
}

const TOTAL: &str = "json:usage.total_tokens";

fn bad(reason: BadReason) -> Usage {
    Usage::Bad(reason)
}

fn malformed(offset: u64) -> Usage {
    Usage::Bad(BadReason::Malformed { offset })
}

fn is_malformed(usage: Usage) -> bool {
    matches!(usage, Usage::Bad(BadReason::Malformed { .. }))
}

// ---- CostFrom ----

#[test]
fn cost_from_parses_headers_and_paths() {
    let header = cost_from(" header: X-Usage-Tokens ");
    assert_eq!(header.header().map(|h| h.as_str()), Some("x-usage-tokens"));
    assert!(header.json_keys().is_none());
    assert_eq!(header.to_string(), "header:x-usage-tokens");

    let path = cost_from("json:usage.total_tokens");
    assert!(path.header().is_none());
    assert_eq!(
        path.json_keys().unwrap().collect::<Vec<_>>(),
        ["usage", "total_tokens"]
    );
    assert_eq!(path.to_string(), "json:usage.total_tokens");
    assert_eq!(path.max(), DEFAULT_MAX);
    assert_eq!(path.clone().with_max(10).max(), 10);

    // Keys are taken as they are: case, Unicode, quotes, a leading zero (not only digits).
    let odd = cost_from("json:Données.k\"q.0x1.é😀");
    assert_eq!(
        odd.json_keys().unwrap().collect::<Vec<_>>(),
        ["Données", "k\"q", "0x1", "é😀"]
    );
    let sixteen = vec!["k"; MAX_PATH_KEYS].join(".");
    assert_eq!(
        cost_from(&format!("json:{sixteen}"))
            .json_keys()
            .unwrap()
            .len(),
        16
    );
    let longest = "k".repeat(MAX_KEY_LEN);
    assert!(format!("json:{longest}").parse::<CostFrom>().is_ok());
}

#[test]
fn cost_from_display_parses_back_to_the_same() {
    for text in [
        "header:x-usage-tokens",
        "header:X-Usage-Tokens",
        "json:usage.total_tokens",
        "json:a",
        "json: a.b ",
        "json:é.k\"q",
    ] {
        let parsed = cost_from(text);
        assert_eq!(cost_from(&parsed.to_string()), parsed, "{text}");
    }
}

#[test]
fn cost_from_refuses_with_what_to_write_instead() {
    let cases: &[(&str, &str)] = &[
        ("", "json:usage.total_tokens"),
        ("usage.total_tokens", "json:PATH"),
        ("body:usage", "header:NAME"),
        ("header:", "header:x-usage-tokens"),
        ("header:bad name", "valid HTTP header name"),
        ("header:x(y)", "valid HTTP header name"),
        ("json:", "json:usage.total_tokens"),
        ("json:   ", "json:usage.total_tokens"),
        ("json:a..b", "single dots"),
        ("json:.a", "single dots"),
        ("json:a.", "single dots"),
        ("json:choices[0].usage", "array indices are not supported"),
        ("json:choices.0.usage", "array indices are not supported"),
        ("json:choices.[]", "array indices are not supported"),
        ("json:usage. total_tokens", "remove the spaces"),
        ("json:usage.total_tokens ", "json:usage.total_tokens"),
    ];
    for (text, hint) in cases {
        // `json:usage.total_tokens ` is trimmed whole and parses: it is only here to show the
        // trim happens on the whole text, not per key.
        if *text == "json:usage.total_tokens " {
            assert!(text.parse::<CostFrom>().is_ok());
            continue;
        }
        let error = text.parse::<CostFrom>().unwrap_err();
        assert!(
            error.reason().contains(hint),
            "{text:?}: {:?} should say {hint:?}",
            error.reason()
        );
        assert_eq!(error.input(), *text);
    }
    let seventeen = vec!["k"; MAX_PATH_KEYS + 1].join(".");
    let error = format!("json:{seventeen}").parse::<CostFrom>().unwrap_err();
    assert!(error.reason().contains("at most 16"), "{}", error.reason());
    let long = "k".repeat(MAX_KEY_LEN + 1);
    let error = format!("json:{long}").parse::<CostFrom>().unwrap_err();
    assert!(error.reason().contains("256 bytes"), "{}", error.reason());
    assert!(error.input().chars().count() <= 81);
}

// ---- header: ----

#[test]
fn header_holds_a_decimal_integer() {
    let from = cost_from("header:x-usage-tokens");
    let read = |values: &[&str]| {
        let mut map = json_headers();
        for value in values {
            map.append("x-usage-tokens", HeaderValue::from_str(value).unwrap());
        }
        read_usage(&from, &map, br#"{"usage":{"total_tokens":1}}"#)
    };
    assert_eq!(read(&["42"]), Usage::Found(42));
    assert_eq!(read(&["0"]), Usage::Found(0));
    assert_eq!(read(&["007"]), Usage::Found(7));
    assert_eq!(read(&[" 42\t"]), Usage::Found(42));
    assert_eq!(read(&["9007199254740992"]), Usage::Found(DEFAULT_MAX));
    assert_eq!(read(&[]), Usage::Missing(MissingReason::NoHeader));
    assert_eq!(read(&["1", "1"]), bad(BadReason::RepeatedHeader));
    for value in [
        "",
        " ",
        "-1",
        "+1",
        "1.0",
        "1e3",
        "0x10",
        "12 tokens",
        "١٢",
        "1 2",
    ] {
        assert_eq!(read(&[value]), bad(BadReason::NotDecimal), "{value:?}");
    }
    for value in [
        "9007199254740993",
        "18446744073709551615",
        "99999999999999999999999",
    ] {
        assert_eq!(read(&[value]), bad(BadReason::TooLarge), "{value:?}");
    }
    let capped = from.clone().with_max(100);
    let mut map = HeaderMap::new();
    map.insert("x-usage-tokens", HeaderValue::from_static("100"));
    assert_eq!(read_usage(&capped, &map, b""), Usage::Found(100));
    map.insert("x-usage-tokens", HeaderValue::from_static("101"));
    assert_eq!(read_usage(&capped, &map, b""), bad(BadReason::TooLarge));
}

#[test]
fn header_source_never_reads_the_body() {
    let from = cost_from("header:x-usage-tokens");
    let mut map = json_headers();
    map.insert("x-usage-tokens", HeaderValue::from_static("5"));
    let mut meter = UsageMeter::new(&from, &map);
    assert!(!meter.reads_body());
    meter.feed(b"not json at all");
    assert_eq!(meter.finish(), Usage::Found(5));
}

// ---- JSON bodies: finding the path ----

#[test]
fn json_finds_the_integer_at_the_path() {
    assert_eq!(
        json(TOTAL, r#"{"usage":{"total_tokens":42}}"#),
        Usage::Found(42)
    );
    assert_eq!(
        json(
            TOTAL,
            r#"{"id":"x","choices":[{"message":{"content":"hi","usage":{"total_tokens":1}}}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"details":{"total_tokens":99}},"z":[1,2,{"usage":{"total_tokens":5}}]}"#
        ),
        Usage::Found(7)
    );
    assert_eq!(json("json:n", r#"{"n":0}"#), Usage::Found(0));
    assert_eq!(
        json("json:a.b.c", r#"{"a":{"b":{"c":3}}}"#),
        Usage::Found(3)
    );
    let deep_path: Vec<String> = (0..MAX_PATH_KEYS).map(|i| format!("k{i}")).collect();
    let mut body = String::new();
    for key in &deep_path {
        body.push_str(&format!("{{\"{key}\":"));
    }
    body.push_str("16");
    body.push_str(&"}".repeat(MAX_PATH_KEYS));
    assert_eq!(
        json(&format!("json:{}", deep_path.join(".")), &body),
        Usage::Found(16)
    );
}

#[test]
fn json_whitespace_anywhere() {
    let body = " \t\r\n{ \n\t\"usage\" \r\n:\t{\r\n  \"total_tokens\"\n :\n 12 \n}\t,\n \"x\" : [ 1 , { } , [ ] , \"\" ] \r\n} \n\t ";
    assert_eq!(json(TOTAL, body), Usage::Found(12));
}

#[test]
fn json_keys_must_match_exactly_and_in_place() {
    for body in [
        r#"{"usage":{"total_token":1}}"#,
        r#"{"usage":{"total_tokens_":1}}"#,
        r#"{"usag":{"total_tokens":1}}"#,
        r#"{"Usage":{"total_tokens":1}}"#,
        r#"{"usage ":{"total_tokens":1}}"#,
        r#"{"total_tokens":1}"#,
        r#"{"a":{"usage":{"total_tokens":1}}}"#,
        r#"{"usage":{"a":{"total_tokens":1}}}"#,
        r#"{"x":{"usage":{"total_tokens":1}},"usage":{}}"#,
        r#"{"usage":[{"total_tokens":1}]}"#,
        r#"[{"usage":{"total_tokens":1}}]"#,
        r#"{"usage":"{\"total_tokens\":1}"}"#,
        r#"{"usage":5}"#,
        r#"{"usage":null}"#,
        r#"{"usage":{"total_tokens":null}}"#,
        r#"{}"#,
        r#"[]"#,
        r#"5"#,
        r#""usage""#,
        r#"null"#,
        r#"  -1.5e3  "#,
    ] {
        assert_eq!(
            json(TOTAL, body),
            Usage::Missing(MissingReason::NotInBody),
            "{body}"
        );
    }
}

#[test]
fn json_keys_are_compared_decoded() {
    // Escapes in keys decode before they are compared, whatever the chunking.
    assert_eq!(
        json(TOTAL, r#"{"us\u0061ge":{"total\u005Ftokens":1}}"#),
        Usage::Found(1)
    );
    assert_eq!(
        json(
            TOTAL,
            r#"{"\u0075\u0073\u0061\u0067\u0065":{"total_tokens":2}}"#
        ),
        Usage::Found(2)
    );
    assert_eq!(
        json(TOTAL, r#"{"usage":{"total\/tokens":9,"total_tokens":3}}"#),
        Usage::Found(3)
    );
    assert_eq!(json("json:a/b", r#"{"a\/b":4}"#), Usage::Found(4));
    assert_eq!(json("json:k\"q", r#"{"k\"q":5}"#), Usage::Found(5));
    assert_eq!(json("json:k\\q", r#"{"k\\q":6}"#), Usage::Found(6));
    assert_eq!(json("json:t\tb", r#"{"t\tb":7}"#), Usage::Found(7));
    assert_eq!(json("json:t\tb", r#"{"t\u0009b":8}"#), Usage::Found(8));
    assert_eq!(json("json:é", r#"{"\u00e9":9}"#), Usage::Found(9));
    assert_eq!(json("json:é", r#"{"\u00C9":1,"é":10}"#), Usage::Found(10));
    assert_eq!(json("json:€", r#"{"\u20ac":11}"#), Usage::Found(11));
    assert_eq!(json("json:😀", r#"{"\ud83d\ude00":12}"#), Usage::Found(12));
    assert_eq!(json("json:😀", r#"{"\uD83D\uDE00":13}"#), Usage::Found(13));
    assert_eq!(json("json:😀", "{\"😀\":14}"), Usage::Found(14));
    assert_eq!(
        json("json:a😀b.c", r#"{"a\ud83d\ude00b":{"c":15}}"#),
        Usage::Found(15)
    );
    // A key that only starts like the path's, or is the path's with more, is another key.
    assert_eq!(
        json("json:é", r#"{"\u00e9\u00e9":1}"#),
        Usage::Missing(MissingReason::NotInBody)
    );
    assert_eq!(
        json("json:😀", r#"{"\ud83d\ude01":1}"#),
        Usage::Missing(MissingReason::NotInBody)
    );
}

#[test]
fn json_skips_strings_with_escapes() {
    let body = r#"{"content":"he said \"usage\": {\"total_tokens\": 1} \\ \/ \b\f\n\r\t \u00e9 \ud83d\ude00 é 😀 \\\"","usage":{"total_tokens":17}}"#;
    assert_eq!(json(TOTAL, body), Usage::Found(17));
    // A string of every printable ASCII byte and some of every UTF-8 length.
    let mut text = String::new();
    for b in 0x20u8..0x7F {
        match b {
            b'"' => text.push_str("\\\""),
            b'\\' => text.push_str("\\\\"),
            _ => text.push(char::from(b)),
        }
    }
    text.push_str("\u{7F}é€😀\u{10FFFF}\u{FFFD}");
    let body = format!(r#"{{"s":"{text}","usage":{{"total_tokens":18}},"t":"{text}"}}"#);
    assert_eq!(json(TOTAL, &body), Usage::Found(18));
}

#[test]
fn json_long_keys_cost_nothing_and_match_nothing() {
    let long = "usage".to_owned() + &"x".repeat(10_000);
    let body =
        format!(r#"{{"{long}":{{"total_tokens":1}},"usage":{{"{long}":2,"total_tokens":3}}}}"#);
    let from = cost_from(TOTAL);
    assert_eq!(
        read_usage(&from, &json_headers(), body.as_bytes()),
        Usage::Found(3)
    );
    // The path's longest key matches.
    let key = "k".repeat(MAX_KEY_LEN);
    let body = format!(r#"{{"{key}k":1,"{key}":2}}"#);
    assert_eq!(json(&format!("json:{key}"), &body), Usage::Found(2));
}

// ---- JSON bodies: what is a cost ----

#[test]
fn json_integers_only() {
    let at = |value: &str| json("json:n", &format!(r#"{{"n":{value}}}"#));
    assert_eq!(at("0"), Usage::Found(0));
    assert_eq!(at("1234567"), Usage::Found(1_234_567));
    assert_eq!(at("9007199254740992"), Usage::Found(1 << 53));
    assert_eq!(at("9007199254740993"), bad(BadReason::TooLarge));
    assert_eq!(at("18446744073709551615"), bad(BadReason::TooLarge));
    assert_eq!(at("18446744073709551616"), bad(BadReason::TooLarge));
    assert_eq!(
        at("100000000000000000000000000000"),
        bad(BadReason::TooLarge)
    );
    assert_eq!(at("-1"), bad(BadReason::Negative));
    assert_eq!(at("-0"), bad(BadReason::Negative));
    assert_eq!(at("-1.5e3"), bad(BadReason::Negative));
    assert_eq!(at("12.0"), bad(BadReason::Fraction));
    assert_eq!(at("0.5"), bad(BadReason::Fraction));
    assert_eq!(at("1.5e3"), bad(BadReason::Fraction));
    assert_eq!(at("1e3"), bad(BadReason::Exponent));
    assert_eq!(at("1E+3"), bad(BadReason::Exponent));
    assert_eq!(at("0e0"), bad(BadReason::Exponent));
    assert_eq!(at("1e-3"), bad(BadReason::Exponent));
    for value in [
        r#""12""#,
        r#""""#,
        "true",
        "false",
        "{}",
        r#"{"n":1}"#,
        "[]",
        "[1]",
    ] {
        assert_eq!(at(value), bad(BadReason::NotANumber), "{value}");
    }
    assert_eq!(at("null"), Usage::Missing(MissingReason::NotInBody));

    let capped = cost_from("json:n").with_max(100);
    let read = |body: &str| read_every_way(&capped, &json_headers(), body.as_bytes());
    assert_eq!(read(r#"{"n":100}"#), Usage::Found(100));
    assert_eq!(read(r#"{"n":101}"#), bad(BadReason::TooLarge));
    let uncapped = cost_from("json:n").with_max(u64::MAX);
    let read = |body: &str| read_every_way(&uncapped, &json_headers(), body.as_bytes());
    assert_eq!(
        read(r#"{"n":18446744073709551615}"#),
        Usage::Found(u64::MAX)
    );
    assert_eq!(
        read(r#"{"n":18446744073709551616}"#),
        bad(BadReason::TooLarge)
    );
}

#[test]
fn json_duplicate_keys_the_last_wins_at_every_level() {
    let cases: &[(&str, Usage)] = &[
        (
            r#"{"usage":{"total_tokens":1},"usage":{"total_tokens":2}}"#,
            Usage::Found(2),
        ),
        (
            r#"{"usage":{"total_tokens":1,"total_tokens":2}}"#,
            Usage::Found(2),
        ),
        (
            r#"{"usage":{"total_tokens":"x","total_tokens":3}}"#,
            Usage::Found(3),
        ),
        (
            r#"{"usage":{"total_tokens":3,"total_tokens":"x"}}"#,
            bad(BadReason::NotANumber),
        ),
        (
            r#"{"usage":{"total_tokens":5,"total_tokens":null}}"#,
            Usage::Missing(MissingReason::NotInBody),
        ),
        (
            r#"{"usage":{"total_tokens":5},"usage":{}}"#,
            Usage::Missing(MissingReason::NotInBody),
        ),
        (
            r#"{"usage":{"total_tokens":5},"usage":7}"#,
            Usage::Missing(MissingReason::NotInBody),
        ),
        (
            r#"{"usage":{"total_tokens":5},"usage":null}"#,
            Usage::Missing(MissingReason::NotInBody),
        ),
        (r#"{"usage":7,"usage":{"total_tokens":6}}"#, Usage::Found(6)),
        (
            r#"{"usage":{"total_tokens":5},"x":{"usage":{}}}"#,
            Usage::Found(5),
        ),
        (
            r#"{"usage":{"total_tokens":5,"x":{"total_tokens":9}}}"#,
            Usage::Found(5),
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(json(TOTAL, body), *expected, "{body}");
        // serde_json agrees.
        let value: serde_json::Value = serde_json::from_str(body).unwrap();
        let there = value
            .pointer("/usage/total_tokens")
            .filter(|v| !v.is_null());
        match expected {
            Usage::Found(n) => assert_eq!(there.and_then(|v| v.as_u64()), Some(*n), "{body}"),
            Usage::Missing(_) => assert!(there.is_none(), "{body}"),
            Usage::Bad(_) => assert!(there.is_some_and(|v| v.as_u64().is_none()), "{body}"),
        }
    }
}

// ---- JSON bodies: not JSON ----

#[test]
fn json_syntax_errors_are_bad_wherever_they_are() {
    let found_then = |tail: &str| format!(r#"{{"usage":{{"total_tokens":5}}{tail}"#);
    for body in [
        found_then(",}"),
        found_then("}}"),
        found_then("} x"),
        found_then("}{}"),
        found_then(",\"a\"}"),
        found_then(",\"a\":}"),
        found_then(",\"a\" 1}"),
        found_then(",'a':1}"),
        found_then(",\"a\":01}"),
        found_then(",\"a\":1.}"),
        found_then(",\"a\":.5}"),
        found_then(",\"a\":-}"),
        found_then(",\"a\":--1}"),
        found_then(",\"a\":+1}"),
        found_then(",\"a\":1e}"),
        found_then(",\"a\":1e+}"),
        found_then(",\"a\":1.e3}"),
        found_then(",\"a\":0x1}"),
        found_then(",\"a\":tru}"),
        found_then(",\"a\":True}"),
        found_then(",\"a\":nul}"),
        found_then(",\"a\":NaN}"),
        found_then(",\"a\":[1,]}"),
        found_then(",\"a\":[1 2]}"),
        found_then(",\"a\":[}"),
        found_then(",\"a\":{]}"),
        found_then(",\"a\":{\"b\"}}"),
        found_then(",\"a\":\"\\x\"}"),
        found_then(",\"a\":\"\\u12g4\"}"),
        found_then(",\"a\":\"\\ud800\"}"),
        found_then(",\"a\":\"\\udc00\"}"),
        found_then(",\"a\":\"\\ud800\\u0041\"}"),
        found_then(",\"a\":\"\\ud800\\ud800\"}"),
        found_then(",\"a\":\"\\ud800\\n\"}"),
        found_then(",\"a\":\"\\ud800x\"}"),
        found_then(",\"a\":\"tab\there\"}"),
        found_then(",\"a\":\"nul\u{0}\"}"),
        found_then(",\"a\":\"line\nbreak\"}"),
        found_then(",\"a\":\u{FEFF}1}"),
        "\u{FEFF}{\"usage\":{\"total_tokens\":5}}".to_owned(),
        "{\"usage\":{\"total_tokens\":5}}\u{0}".to_owned(),
        "x".to_owned(),
        "}".to_owned(),
        ",".to_owned(),
        "5 6".to_owned(),
        "[DONE]".to_owned(),
        "<html>".to_owned(),
    ] {
        let usage = json(TOTAL, &body);
        assert!(is_malformed(usage), "{body}: {usage:?}");
        assert!(
            serde_json::from_str::<serde_json::Value>(&body).is_err(),
            "{body}"
        );
    }
    assert_eq!(json(TOTAL, r#"{"a":1,}"#), malformed(7));
    assert_eq!(json(TOTAL, r#"  x"#), malformed(2));
}

#[test]
fn json_string_bytes_are_not_checked_to_be_utf8() {
    let key_or_value = |bytes: &[u8]| {
        let mut in_value = br#"{"usage":{"total_tokens":5},"a":""#.to_vec();
        in_value.extend_from_slice(bytes);
        in_value.extend_from_slice(br#""}"#);
        let mut in_key = br#"{"usage":{"total_tokens":5,""#.to_vec();
        in_key.extend_from_slice(bytes);
        in_key.extend_from_slice(br#"":1}}"#);
        [in_value, in_key]
    };
    // Invalid UTF-8 (a lone continuation byte, overlong forms, surrogates, beyond U+10FFFF, a
    // cut character) and valid UTF-8 alike: the string's bytes, not the meter's business.
    for bytes in [
        &[0xFF][..],
        &[0x80],
        &[0xC0, 0x80],
        &[0xC3],
        &[0xE0, 0x80, 0x80],
        &[0xED, 0xA0, 0x80],
        &[0xF4, 0x90, 0x80, 0x80],
        &[0xF0, 0x9F, 0x98],
        &[0xC2, 0x80],
        &[0xF0, 0x90, 0x80, 0x80],
        "é€😀".as_bytes(),
    ] {
        for body in key_or_value(bytes) {
            assert_eq!(json_bytes(TOTAL, &body), Usage::Found(5), "{bytes:x?}");
            // What serde_json reads once the bytes are decoded with replacement characters.
            let lossy = String::from_utf8_lossy(&body);
            assert!(serde_json::from_str::<serde_json::Value>(&lossy).is_ok());
        }
    }
    // A key on the path matches byte for byte: invalid UTF-8 never matches.
    assert_eq!(
        json_bytes("json:é", b"{\"\xC3\":1,\"\xE9\":2,\"\xC3\xA9\":3}"),
        Usage::Found(3)
    );
    // Outside strings, a non-ASCII byte is a syntax error.
    for body in [
        &b"{\"usage\":{\"total_tokens\":5}}\xC3\xA9"[..],
        b"\xEF\xBB\xBF{}",
        b"{\xFF}",
    ] {
        assert!(is_malformed(json_bytes(TOTAL, body)), "{body:x?}");
    }
}

#[test]
fn json_that_ends_early_is_truncated() {
    for body in [
        r#"{"usage":{"total_tokens":5}"#,
        r#"{"usage":{"total_tokens":5"#,
        r#"{"usage":{"total_tokens":"#,
        r#"{"usage":{"total_tokens""#,
        r#"{"usage":{"total_tok"#,
        r#"{"usage":{"#,
        r#"{"#,
        r#"["#,
        r#""abc"#,
        r#""\"#,
        r#""\u00"#,
        r#""\ud83d"#,
        r#""\ud83d\"#,
        r#""\ud83d\u"#,
        r#""\ud83d\ude0"#,
        "\"\u{E9}",
        r#"tr"#,
        r#"-"#,
        r#"1."#,
        r#"1e"#,
        r#"1e+"#,
        r#"{"a":1"#,
        r#"{"a":1.5"#,
        r#"[1,"#,
    ] {
        let usage = json(TOTAL, body);
        let usage = if body == "\"\u{E9}" {
            // Cut inside a UTF-8 sequence too.
            assert_eq!(usage, bad(BadReason::Truncated { offset: 3 }));
            json_bytes(TOTAL, &body.as_bytes()[..2])
        } else {
            usage
        };
        assert!(
            matches!(usage, Usage::Bad(BadReason::Truncated { .. })),
            "{body}: {usage:?}"
        );
    }
    assert_eq!(
        json(TOTAL, r#"{"usage":{"total_tokens":5}"#),
        bad(BadReason::Truncated { offset: 27 })
    );
}

#[test]
fn json_top_level_scalars_are_documents() {
    for body in [
        "5",
        " 5 ",
        "-0.5e-3",
        "0",
        "\"usage\"",
        "true",
        "null",
        "[]",
        "{}",
    ] {
        assert_eq!(
            json(TOTAL, body),
            Usage::Missing(MissingReason::NotInBody),
            "{body}"
        );
    }
}

#[test]
fn json_empty_body_is_missing() {
    for body in ["", " ", "\r\n\t "] {
        assert_eq!(
            json(TOTAL, body),
            Usage::Missing(MissingReason::EmptyBody),
            "{body:?}"
        );
    }
}

#[test]
fn json_nesting_is_bounded() {
    let nested = |depth: usize| {
        format!(
            r#"{{"usage":{{"total_tokens":5}},"a":{}1{}}}"#,
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
    };
    // The document is depth 1: `a`'s arrays add depth - 1.
    assert_eq!(json(TOTAL, &nested(MAX_DEPTH)), Usage::Found(5));
    let too_deep = nested(MAX_DEPTH + 1);
    let offset = too_deep.find('[').unwrap() + MAX_DEPTH - 1;
    assert_eq!(
        json(TOTAL, &too_deep),
        bad(BadReason::TooDeep {
            offset: offset as u64
        })
    );
    // A million brackets: refused at the 65th, then nothing more is read.
    let brackets = "[".repeat(1_000_000);
    let from = cost_from(TOTAL);
    assert_eq!(
        read_usage(&from, &json_headers(), brackets.as_bytes()),
        bad(BadReason::TooDeep { offset: 64 })
    );
    // serde_json reads up to 128 levels; we stop at 64.
    let objects = format!(
        "{}{}",
        r#"{"a":"#.repeat(64),
        "1".to_owned() + &"}".repeat(64)
    );
    assert_eq!(
        json(TOTAL, &objects),
        Usage::Missing(MissingReason::NotInBody)
    );
}

// ---- JSON bodies: which responses are read ----

#[test]
fn content_types_read_as_json() {
    let from = cost_from(TOTAL);
    let body = br#"{"usage":{"total_tokens":3}}"#;
    for content_type in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
        "application/problem+json",
        "application/vnd.api+json",
        "application/VND.API+JSON ; x=y",
    ] {
        let map = headers(&[("content-type", content_type)]);
        assert!(UsageMeter::new(&from, &map).reads_body(), "{content_type}");
        assert_eq!(
            read_usage(&from, &map, body),
            Usage::Found(3),
            "{content_type}"
        );
    }
    for content_type in [
        "text/plain",
        "text/json",
        "application/jsonx",
        "application/+json",
        "application/json-seq",
        "application/x-ndjson",
        "json",
        "",
    ] {
        let map = headers(&[("content-type", content_type)]);
        let mut meter = UsageMeter::new(&from, &map);
        assert!(!meter.reads_body(), "{content_type}");
        meter.feed(body);
        assert_eq!(
            meter.finish(),
            Usage::Missing(MissingReason::NotJson),
            "{content_type}"
        );
    }
    assert_eq!(
        read_usage(&from, &HeaderMap::new(), body),
        Usage::Missing(MissingReason::NotJson)
    );
}

#[test]
fn compressed_bodies_are_not_read() {
    let from = cost_from(TOTAL);
    let body = br#"{"usage":{"total_tokens":3}}"#;
    for encodings in [
        &["gzip"][..],
        &["br"],
        &["identity, gzip"],
        &["identity", "zstd"],
        &["x"],
    ] {
        for content_type in ["application/json", "text/event-stream"] {
            let mut map = headers(&[("content-type", content_type)]);
            for encoding in encodings {
                map.append("content-encoding", HeaderValue::from_str(encoding).unwrap());
            }
            let meter = UsageMeter::new(&from, &map);
            assert!(!meter.reads_body());
            assert_eq!(
                read_usage(&from, &map, body),
                Usage::Missing(MissingReason::Compressed),
                "{encodings:?}"
            );
        }
    }
    for encodings in [
        &["identity"][..],
        &["IDENTITY"],
        &["identity", " identity ,"],
        &[""],
    ] {
        let mut map = json_headers();
        for encoding in encodings {
            map.append("content-encoding", HeaderValue::from_str(encoding).unwrap());
        }
        assert_eq!(
            read_usage(&from, &map, body),
            Usage::Found(3),
            "{encodings:?}"
        );
    }
    assert!(MissingReason::Compressed.to_string().contains("identity"));
}

#[test]
fn finishing_early_answers_for_the_bytes_seen() {
    let from = cost_from(TOTAL);
    let mut meter = UsageMeter::new(&from, &json_headers());
    meter.feed(br#"{"usage":{"total_tokens":5}"#);
    assert_eq!(meter.finish(), bad(BadReason::Truncated { offset: 27 }));
    let mut meter = UsageMeter::new(&from, &sse_headers());
    meter.feed(b"data: {\"usage\":{\"total_tokens\":5}}\n\ndata: {\"usage\":");
    assert_eq!(meter.finish(), Usage::Found(5));
}

// ---- event streams ----

fn openai_stream(line_end: &str) -> String {
    let mut stream = String::new();
    for word in ["Hello", "\\\"world\\\"", "é😀", ""] {
        stream.push_str(&format!(
            r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"{word}"}},"finish_reason":null}}],"usage":null}}"#
        ));
        stream.push_str(line_end);
        stream.push_str(line_end);
    }
    stream.push_str(r#"data: {"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#);
    stream.push_str(line_end);
    stream.push_str(line_end);
    stream.push_str("data: [DONE]");
    stream.push_str(line_end);
    stream.push_str(line_end);
    stream
}

#[test]
fn sse_openai_stream_usage_in_the_last_chunk() {
    for line_end in ["\n", "\r\n", "\r"] {
        assert_eq!(
            sse(TOTAL, &openai_stream(line_end)),
            Usage::Found(21),
            "{line_end:?}"
        );
    }
    // Without `include_usage`: every chunk says `"usage":null`, or nothing.
    let without = openai_stream("\n").replace(
        r#""usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}"#,
        r#""usage":null"#,
    );
    assert_eq!(
        sse(TOTAL, &without),
        Usage::Missing(MissingReason::NotInStream)
    );
    assert_eq!(
        sse(TOTAL, "data: [DONE]\n\n"),
        Usage::Missing(MissingReason::NotInStream)
    );
    assert_eq!(sse(TOTAL, ""), Usage::Missing(MissingReason::NotInStream));
}

#[test]
fn sse_anthropic_stream() {
    let stream = "event: message_start\n\
        data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
        event: ping\ndata: {\"type\": \"ping\"}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hi\"}}\n\n\
        event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n\
        event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    assert_eq!(sse("json:usage.output_tokens", stream), Usage::Found(15));
    assert_eq!(
        sse("json:message.usage.input_tokens", stream),
        Usage::Found(25)
    );
}

#[test]
fn sse_the_last_event_that_carries_the_path_wins() {
    let event = |value: &str| format!("data: {{\"usage\":{{\"total_tokens\":{value}}}}}\n\n");
    let stream = [event("5"), event("7"), "data: {\"usage\":null}\n\n".into()].concat();
    assert_eq!(sse(TOTAL, &stream), Usage::Found(7));
    let stream = [event("5"), event("-1")].concat();
    assert_eq!(sse(TOTAL, &stream), bad(BadReason::Negative));
    let stream = [event("-1"), event("8")].concat();
    assert_eq!(sse(TOTAL, &stream), Usage::Found(8));
    let stream = [event("8"), event("\"x\""), "data: [DONE]\n\n".into()].concat();
    assert_eq!(sse(TOTAL, &stream), bad(BadReason::NotANumber));
    let stream = [event("8"), event("1.0")].concat();
    assert_eq!(sse(TOTAL, &stream), bad(BadReason::Fraction));
    // An event that is not JSON carries nothing, even with the path in it.
    let stream = [
        event("8"),
        "data: {\"usage\":{\"total_tokens\":9},}\n\n".into(),
    ]
    .concat();
    assert_eq!(sse(TOTAL, &stream), Usage::Found(8));
    let stream = [
        event("8"),
        "data: {\"usage\":{\"total_tokens\":9}\n\n".into(),
    ]
    .concat();
    assert_eq!(sse(TOTAL, &stream), Usage::Found(8));
    // Nor does a last event that the stream does not end with a blank line.
    let stream = [
        event("8"),
        "data: {\"usage\":{\"total_tokens\":9}}\n".into(),
    ]
    .concat();
    assert_eq!(sse(TOTAL, &stream), Usage::Found(8));
    let stream = [event("8"), "data: {\"usage\":{\"total_tokens\":9}}".into()].concat();
    assert_eq!(sse(TOTAL, &stream), Usage::Found(8));
}

#[test]
fn sse_data_lines_join_with_line_feeds() {
    // Several data lines: one document, joined by LF (JSON whitespace between tokens).
    let stream = "data: {\"usage\":\ndata:{\"total_tokens\"\ndata:  :\r\ndata: 9}}\r\n\n";
    assert_eq!(sse(TOTAL, stream), Usage::Found(9));
    let stream = "data: {\"usage\":{\"total_tokens\":1\ndata: 2}}\n\n";
    assert_eq!(
        sse(TOTAL, stream),
        Usage::Missing(MissingReason::NotInStream)
    );
    // An LF inside a string is a raw control character: not JSON.
    let stream = "data: {\"s\":\"a\ndata: b\",\"usage\":{\"total_tokens\":3}}\n\n";
    assert_eq!(
        sse(TOTAL, stream),
        Usage::Missing(MissingReason::NotInStream)
    );
    // A `data` line with no colon is an empty value; with others around it, an LF.
    let stream = "data: {\"usage\":{\"total_tokens\":\ndata\ndata: 4}}\n\n";
    assert_eq!(sse(TOTAL, stream), Usage::Found(4));
    // Only the first space after the colon goes: the others are JSON whitespace.
    let stream = "data:   {\"usage\":{\"total_tokens\":5}}\n\n";
    assert_eq!(sse(TOTAL, stream), Usage::Found(5));
    let stream = "data:\t{\"usage\":{\"total_tokens\":6}}\n\n";
    assert_eq!(sse(TOTAL, stream), Usage::Found(6));
}

#[test]
fn sse_other_lines_are_ignored() {
    let stream = ": keep-alive\n\
        :data: {\"usage\":{\"total_tokens\":1}}\n\
        event: usage\n\
        id: 7\n\
        retry: 1000\n\
        Data: {\"usage\":{\"total_tokens\":2}}\n\
        datax: {\"usage\":{\"total_tokens\":3}}\n\
        dat: {\"usage\":{\"total_tokens\":3}}\n\
        data : {\"usage\":{\"total_tokens\":3}}\n\
        event\n\
        data: {\"usage\":{\"total_tokens\":10}}\n\
        : a comment inside the event\n\
        id\n\
        \n\
        : the last word\n";
    assert_eq!(sse(TOTAL, stream), Usage::Found(10));
    // Blank lines without data dispatch nothing.
    let stream = "\n\n\r\n\r\rdata: {\"usage\":{\"total_tokens\":11}}\n\n\n\n";
    assert_eq!(sse(TOTAL, stream), Usage::Found(11));
}

#[test]
fn sse_line_endings_mix() {
    let stream = "data: {\"usage\":\r\ndata: {\"total_tokens\":\rdata: 12}}\n\r\n\
        data: {\"x\":1}\r\rdata: [DONE]\r\n\r\n";
    assert_eq!(sse(TOTAL, stream), Usage::Found(12));
    // CR then LF is one line ending, even across chunks; CR then CR is two.
    let stream = "data: {\"usage\":{\"total_tokens\":13}}\r\r";
    assert_eq!(sse(TOTAL, stream), Usage::Found(13));
    let stream = "data: {\"usage\":{\"total_tokens\":14}}\r\n";
    assert_eq!(
        sse(TOTAL, stream),
        Usage::Missing(MissingReason::NotInStream)
    );
}

#[test]
fn sse_byte_order_mark() {
    let event = "data: {\"usage\":{\"total_tokens\":15}}\n\n";
    assert_eq!(sse(TOTAL, &format!("\u{FEFF}{event}")), Usage::Found(15));
    // Only one, only at the start.
    assert_eq!(
        sse(TOTAL, &format!("\u{FEFF}\u{FEFF}{event}")),
        Usage::Missing(MissingReason::NotInStream)
    );
    assert_eq!(
        sse(TOTAL, &format!("\u{FEFF}\u{FEFF}\n{event}")),
        Usage::Found(15)
    );
    // Part of a mark starts a line that is not a data line.
    let mut stream = vec![0xEF, 0xBB];
    stream.extend_from_slice(event.as_bytes());
    assert_eq!(
        read_every_way(&cost_from(TOTAL), &sse_headers(), &stream),
        Usage::Missing(MissingReason::NotInStream)
    );
    let mut stream = vec![0xEF, b'\n'];
    stream.extend_from_slice(event.as_bytes());
    assert_eq!(
        read_every_way(&cost_from(TOTAL), &sse_headers(), &stream),
        Usage::Found(15)
    );
}

#[test]
fn sse_events_are_bounded_too() {
    let deep = format!(
        "data: {{\"usage\":{{\"total_tokens\":1}}}}\n\ndata: {{\"usage\":{{\"total_tokens\":2}},\"a\":{}{}}}\n\n",
        "[".repeat(MAX_DEPTH),
        "]".repeat(MAX_DEPTH)
    );
    assert_eq!(sse(TOTAL, &deep), Usage::Found(1));
}

// ---- the meter itself ----

#[test]
fn meter_is_small_send_and_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<UsageMeter>();
    send_sync::<CostFrom>();
    send_sync::<Usage>();
    let size = std::mem::size_of::<UsageMeter>();
    eprintln!("UsageMeter: {size} bytes");
    assert!(size <= 160, "UsageMeter is {size} bytes");
}

#[test]
fn reasons_read_well_in_logs() {
    assert_eq!(Usage::Found(3).to_string(), "found 3");
    assert_eq!(
        Usage::Bad(BadReason::Malformed { offset: 7 }).to_string(),
        "bad: malformed JSON at byte 7"
    );
    assert_eq!(
        Usage::Missing(MissingReason::NoHeader).to_string(),
        "missing: the response has no usage header"
    );
    assert_eq!(Usage::Found(3).found(), Some(3));
    assert_eq!(Usage::Missing(MissingReason::EmptyBody).found(), None);
}
