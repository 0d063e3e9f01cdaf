//! The usage meter against references: random JSON documents (nested, with escapes, duplicate
//! keys, numbers of every shape, random whitespace and escaping), mutated and truncated
//! documents and garbage, all read by the meter in random chunkings and by `serde_json` (after
//! decoding with replacement characters: the meter does not check string contents to be
//! UTF-8), must get the same answer; and random event streams against a literal reading of the WHATWG
//! parsing rules with `serde_json` for each event.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::Value;
use tollgate_http::usage::{
    BadReason, CostFrom, MAX_DEPTH, MissingReason, Usage, UsageMeter, read_usage,
};

// ---- documents ----

/// A JSON document as written, duplicate keys and number text included.
#[derive(Clone, Debug)]
enum Node {
    Obj(Vec<(String, Node)>),
    Arr(Vec<Node>),
    Str(String),
    Num(String),
    Bool(bool),
    Null,
}

/// Keys that can be on a path.
const PATH_KEYS: &[&str] = &[
    "usage",
    "total_tokens",
    "a",
    "é",
    "k\"q",
    "x\\y/z",
    "t\tb",
    "😀",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(PATH_KEYS).prop_map(str::to_owned),
        1 => prop::sample::select(&["", "7", "a.b", "usage ", "Usage", "total_tokens2", "\u{0}"][..])
            .prop_map(str::to_owned),
        1 => text(),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(any::<char>(), 0..8).prop_map(String::from_iter),
        "[ -~]{0,24}",
    ]
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (0u64..100_000).prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => prop::sample::select(
            &["9007199254740992", "9007199254740993", "18446744073709551616", "-0", "0.0", "12.0", "1e3"][..]
        )
        .prop_map(str::to_owned),
        2 => "-?(0|[1-9][0-9]{0,25})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
    ]
}

fn leaf() -> impl Strategy<Value = Node> {
    prop_oneof![
        3 => number().prop_map(Node::Num),
        2 => text().prop_map(Node::Str),
        1 => any::<bool>().prop_map(Node::Bool),
        1 => Just(Node::Null),
    ]
}

/// A value to plant at the path: mostly a cost.
fn planted() -> impl Strategy<Value = Node> {
    prop_oneof![
        2 => (0u64..1_000_000).prop_map(|n| Node::Num(n.to_string())),
        1 => leaf(),
        1 => node(),
    ]
}

fn node() -> impl Strategy<Value = Node> {
    leaf().prop_recursive(6, 80, 6, |inner| {
        prop_oneof![
            3 => prop::collection::vec((key(), inner.clone()), 0..6).prop_map(Node::Obj),
            1 => prop::collection::vec(inner, 0..5).prop_map(Node::Arr),
        ]
    })
}

fn path() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop::sample::select(PATH_KEYS).prop_map(str::to_owned),
        1..4,
    )
}

/// Puts `leaf` at `path` in `node` (as a new field at a position chosen by `seed`, so an
/// earlier or later duplicate may hide it, as duplicates do).
fn plant(node: Node, path: &[String], leaf: Node, seed: u64) -> Node {
    let Some((first, rest)) = path.split_first() else {
        return leaf;
    };
    let mut fields = match node {
        Node::Obj(fields) => fields,
        other => vec![("other".to_owned(), other)],
    };
    let inner = match fields.get((seed % 7) as usize) {
        Some((_, Node::Obj(inner))) if seed.is_multiple_of(3) => Node::Obj(inner.clone()),
        _ => Node::Obj(Vec::new()),
    };
    let at = (seed % (fields.len() as u64 + 1)) as usize;
    fields.insert(at, (first.clone(), plant(inner, rest, leaf, seed / 11)));
    Node::Obj(fields)
}

/// How a document is written: the whitespace between tokens and the escaping of strings.
struct Writer {
    rng: u64,
    spaces: bool,
    escapes: bool,
    out: Vec<u8>,
}

impl Writer {
    fn random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.random().is_multiple_of(one_in)
    }

    fn space(&mut self) {
        if self.spaces {
            while self.chance(3) {
                let ws = [b' ', b'\t', b'\n', b'\r'][(self.random() % 4) as usize];
                self.out.push(ws);
            }
        }
    }

    fn hex(&mut self, unit: u16) {
        let text = if self.chance(2) {
            format!("\\u{unit:04x}")
        } else {
            format!("\\u{unit:04X}")
        };
        self.out.extend_from_slice(text.as_bytes());
    }

    fn string(&mut self, s: &str) {
        self.out.push(b'"');
        for c in s.chars() {
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '/' if self.escapes && self.chance(2) => Some("\\/"),
                _ => None,
            };
            if (u32::from(c) < 0x20 || (self.escapes && self.chance(4)))
                && (short.is_none() || self.chance(2))
            {
                let mut units = [0; 2];
                for &unit in c.encode_utf16(&mut units).iter() {
                    self.hex(unit);
                }
            } else if let Some(short) = short {
                self.out.extend_from_slice(short.as_bytes());
            } else {
                let mut buf = [0; 4];
                self.out
                    .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
        self.out.push(b'"');
    }

    fn node(&mut self, node: &Node) {
        self.space();
        match node {
            Node::Obj(fields) => {
                self.out.push(b'{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.space();
                    self.string(key);
                    self.space();
                    self.out.push(b':');
                    self.node(value);
                }
                self.space();
                self.out.push(b'}');
            }
            Node::Arr(items) => {
                self.out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.node(item);
                }
                self.space();
                self.out.push(b']');
            }
            Node::Str(s) => self.string(s),
            Node::Num(n) => self.out.extend_from_slice(n.as_bytes()),
            Node::Bool(b) => self
                .out
                .extend_from_slice(if *b { b"true" } else { b"false" }),
            Node::Null => self.out.extend_from_slice(b"null"),
        }
        self.space();
    }
}

fn write(node: &Node, seed: u64, spaces: bool, escapes: bool) -> Vec<u8> {
    let mut writer = Writer {
        rng: seed | 1,
        spaces,
        escapes,
        out: Vec::new(),
    };
    writer.node(node);
    writer.out
}

// ---- the references ----

fn json_headers() -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("content-type", HeaderValue::from_static("application/json"));
    map
}

fn sse_headers() -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    map
}

fn cost_from(path: &[String]) -> CostFrom {
    format!("json:{}", path.join(".")).parse().unwrap()
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(fields) => 1 + fields.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// What `serde_json` says of `body`: `None` when the two may rightly differ (a number beyond
/// f64's range is JSON to the meter, an error to serde_json).
fn reference(path: &[String], max: u64, body: &[u8]) -> Option<Usage> {
    if body
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return Some(Usage::Missing(MissingReason::EmptyBody));
    }
    // The meter does not check string contents to be UTF-8: what serde_json reads once the
    // body is decoded with replacement characters (which never swallow an ASCII byte, so the
    // structure stays; a non-ASCII byte outside strings stays an error).
    let value: Value = match serde_json::from_str(&String::from_utf8_lossy(body)) {
        Ok(value) => value,
        Err(e) if e.to_string().starts_with("number out of range") => return None,
        // A placeholder offset: only the kind of error is compared.
        Err(e) if e.is_eof() => return Some(Usage::Bad(BadReason::Truncated { offset: 0 })),
        Err(e) if e.to_string().starts_with("recursion limit") => {
            return Some(Usage::Bad(BadReason::TooDeep { offset: 0 }));
        }
        Err(_) => return Some(Usage::Bad(BadReason::Malformed { offset: 0 })),
    };
    if depth(&value) > MAX_DEPTH {
        return Some(Usage::Bad(BadReason::TooDeep { offset: 0 }));
    }
    let mut here = &value;
    for key in path {
        match here.as_object().and_then(|fields| fields.get(key)) {
            Some(next) => here = next,
            None => return Some(Usage::Missing(MissingReason::NotInBody)),
        }
    }
    Some(match here {
        Value::Null => Usage::Missing(MissingReason::NotInBody),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(n), _) if n <= max => Usage::Found(n),
            (Some(_), _) => Usage::Bad(BadReason::TooLarge),
            (None, Some(_)) => Usage::Bad(BadReason::Negative),
            // A float: which of these depends on the text.
            (None, None) => Usage::Bad(BadReason::Fraction),
        },
        _ => Usage::Bad(BadReason::NotANumber),
    })
}

/// The meter's answer and the reference's agree: the same cost, the same kind of absence, and
/// for bad answers the same kind of fault.
fn same(meter: Usage, reference: Usage) -> bool {
    use BadReason::*;
    match (meter, reference) {
        (Usage::Found(a), Usage::Found(b)) => a == b,
        (Usage::Missing(a), Usage::Missing(b)) => a == b,
        (Usage::Bad(Malformed { .. }), Usage::Bad(Malformed { .. }))
        | (Usage::Bad(Truncated { .. }), Usage::Bad(Truncated { .. }))
        | (Usage::Bad(TooDeep { .. }), Usage::Bad(TooDeep { .. })) => true,
        // serde_json reads a float: the text said which.
        (Usage::Bad(Negative | Fraction | Exponent | TooLarge), Usage::Bad(Fraction)) => true,
        (Usage::Bad(a), Usage::Bad(b)) => a == b,
        _ => false,
    }
}

/// `body` fed in pieces of the given sizes (cycled), then whatever is left.
fn feed_chunked(cost_from: &CostFrom, headers: &HeaderMap, body: &[u8], sizes: &[usize]) -> Usage {
    let mut meter = UsageMeter::new(cost_from, headers);
    let mut rest = body;
    for size in sizes.iter().cycle().take(body.len()) {
        if rest.is_empty() {
            break;
        }
        let (piece, tail) = rest.split_at((*size).min(rest.len()));
        meter.feed(piece);
        rest = tail;
    }
    meter.feed(rest);
    meter.finish()
}

fn check_json(
    path: &[String],
    max: u64,
    body: &[u8],
    sizes: &[usize],
) -> Result<(), TestCaseError> {
    let from = cost_from(path).with_max(max);
    let whole = read_usage(&from, &json_headers(), body);
    let chunked = feed_chunked(&from, &json_headers(), body, sizes);
    prop_assert_eq!(
        whole,
        chunked,
        "chunked {:?}",
        String::from_utf8_lossy(body)
    );
    if let Some(expected) = reference(path, max, body) {
        // serde_json reads a `\u` escape's four digits before it checks them, so near the end
        // of the body it says "truncated" where the meter already saw a byte that is no hex
        // digit: both refuse the body.
        let short_escape = match (whole, expected) {
            (
                Usage::Bad(BadReason::Malformed { offset }),
                Usage::Bad(BadReason::Truncated { .. }),
            ) => usize::try_from(offset).is_ok_and(|o| o.saturating_add(5) >= body.len()),
            _ => false,
        };
        prop_assert!(
            short_escape || same(whole, expected),
            "meter {:?}, serde_json {:?}, path {:?}, body {:?}",
            whole,
            expected,
            path,
            String::from_utf8_lossy(body)
        );
    }
    Ok(())
}

fn mutate(body: &mut Vec<u8>, edits: &[(usize, u8, u8)]) {
    const BYTES: &[u8] =
        b"{}[]\":,\\ u0123456789.eE+-tfnrlD\n\r\t\x00\x1f\x7f\xff\xc3\xa9\xed\xa0\x80\xf0\x9f";
    for &(at, kind, byte) in edits {
        let byte = BYTES[usize::from(byte) % BYTES.len()];
        let at = if body.is_empty() {
            0
        } else {
            at % (body.len() + 1)
        };
        match kind % 5 {
            0 if at < body.len() => body[at] = byte,
            1 if at < body.len() => {
                body.remove(at);
            }
            2 => body.insert(at, byte),
            3 => body.truncate(at),
            _ => {
                let end = (at + usize::from(byte) % 16).min(body.len());
                let copy = body[at..end].to_vec();
                body.splice(at..at, copy);
            }
        }
    }
}

fn sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..40, 1..12)
}

fn max() -> impl Strategy<Value = u64> {
    prop_oneof![4 => Just(1u64 << 53), 1 => 0u64..200_000, 1 => Just(u64::MAX)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    /// Random documents, written every way, and the path often planted in them.
    #[test]
    fn json_agrees_with_serde_json(
        doc in node(),
        path in path(),
        planted in prop::option::weighted(0.7, (planted(), any::<u64>())),
        seed in any::<u64>(),
        spaces in any::<bool>(),
        escapes in any::<bool>(),
        max in max(),
        sizes in sizes(),
    ) {
        let doc = match planted {
            Some((value, at)) => plant(doc, &path, value, at),
            None => doc,
        };
        let body = write(&doc, seed, spaces, escapes);
        check_json(&path, max, &body, &sizes)?;
        // serde_json's own writing of what it read, compact and pretty.
        if let Ok(value) = serde_json::from_slice::<Value>(&body) {
            check_json(&path, max, &serde_json::to_vec(&value).unwrap(), &sizes)?;
            check_json(&path, max, &serde_json::to_vec_pretty(&value).unwrap(), &sizes)?;
        }
    }

    /// Documents with bytes changed, removed, inserted, repeated, or cut short.
    #[test]
    fn mutated_json_agrees_with_serde_json(
        doc in node(),
        path in path(),
        planted in (planted(), any::<u64>()),
        seed in any::<u64>(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..4),
        sizes in sizes(),
    ) {
        let doc = plant(doc, &path, planted.0, planted.1);
        let mut body = write(&doc, seed, seed % 2 == 0, seed % 3 == 0);
        mutate(&mut body, &edits);
        check_json(&path, 1 << 53, &body, &sizes)?;
    }

    /// Any bytes at all.
    #[test]
    fn garbage_agrees_with_serde_json(
        body in prop::collection::vec(any::<u8>(), 0..160),
        path in path(),
        sizes in sizes(),
    ) {
        check_json(&path, 1 << 53, &body, &sizes)?;
    }
}

// ---- event streams ----

/// One event of a generated stream.
#[derive(Clone, Debug)]
enum Event {
    /// A JSON document as data, written pretty (several data lines) or not.
    Json { doc: Node, pretty: bool },
    /// `[DONE]`.
    Done,
    /// Data that is not a document.
    Text(String),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => (node(), any::<bool>()).prop_map(|(doc, pretty)| Event::Json { doc, pretty }),
        1 => Just(Event::Done),
        1 => "[ -~]{0,20}".prop_map(Event::Text),
    ]
}

/// The stream's bytes: each event's data lines with, around them, comments and other fields;
/// every line ending LF, CRLF or CR, chosen by `seed`.
fn stream(events: &[Event], seed: u64, bom: bool, end: bool) -> Vec<u8> {
    let mut writer = Writer {
        rng: seed | 1,
        spaces: false,
        escapes: true,
        out: Vec::new(),
    };
    let mut out = Vec::new();
    if bom {
        out.extend_from_slice("\u{FEFF}".as_bytes());
    }
    let line_end = |writer: &mut Writer, out: &mut Vec<u8>| {
        let ending: &[u8] = match writer.random() % 3 {
            0 => b"\n",
            1 => b"\r\n",
            _ => b"\r",
        };
        out.extend_from_slice(ending);
    };
    for (i, event) in events.iter().enumerate() {
        if writer.chance(4) {
            out.extend_from_slice(b": keep-alive");
            line_end(&mut writer, &mut out);
        }
        if writer.chance(3) {
            out.extend_from_slice(b"event: chunk");
            line_end(&mut writer, &mut out);
        }
        let data = match event {
            Event::Json { doc, pretty } => {
                writer.out.clear();
                writer.spaces = *pretty;
                writer.node(doc);
                // Pretty writing puts line feeds between tokens: one data line each. A CR
                // would end a line too.
                std::mem::take(&mut writer.out)
                    .into_iter()
                    .map(|b| if b == b'\r' { b' ' } else { b })
                    .collect()
            }
            Event::Done => b"[DONE]".to_vec(),
            Event::Text(text) => text.as_bytes().to_vec(),
        };
        for line in data.split(|&b| b == b'\n') {
            out.extend_from_slice(if writer.chance(2) {
                b"data: "
            } else {
                b"data:"
            });
            out.extend_from_slice(line);
            line_end(&mut writer, &mut out);
            if writer.chance(8) {
                out.extend_from_slice(b"id: 1");
                line_end(&mut writer, &mut out);
            }
        }
        if i + 1 < events.len() || end {
            line_end(&mut writer, &mut out);
        }
    }
    out
}

/// The events of a stream, read by the letter of the WHATWG rules (the whole stream at hand).
fn reference_events(stream: &[u8]) -> Vec<Vec<u8>> {
    let stream = stream.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(stream);
    let mut events = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    let mut rest = stream;
    // Only complete lines: an unended last line belongs to an event never dispatched.
    while let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
        let line = &rest[..end];
        let skip = if rest[end] == b'\r' && rest.get(end + 1) == Some(&b'\n') {
            2
        } else {
            1
        };
        rest = &rest[end + skip..];
        if line.is_empty() {
            if !data.is_empty() {
                if data.last() == Some(&b'\n') {
                    data.pop();
                }
                events.push(std::mem::take(&mut data));
            }
            continue;
        }
        if line[0] == b':' {
            continue;
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        if name == b"data" {
            data.extend_from_slice(value);
            data.push(b'\n');
        }
    }
    events
}

fn reference_stream(path: &[String], stream: &[u8]) -> Option<Usage> {
    let mut last = None;
    for data in reference_events(stream) {
        match reference(path, 1 << 53, &data)? {
            found @ Usage::Found(_) => last = Some(found),
            Usage::Bad(
                BadReason::Malformed { .. }
                | BadReason::Truncated { .. }
                | BadReason::TooDeep { .. },
            )
            | Usage::Missing(_) => {}
            bad @ Usage::Bad(_) => last = Some(bad),
        }
    }
    Some(last.unwrap_or(Usage::Missing(MissingReason::NotInStream)))
}

fn check_stream(path: &[String], body: &[u8], sizes: &[usize]) -> Result<(), TestCaseError> {
    let from = cost_from(path);
    let whole = read_usage(&from, &sse_headers(), body);
    let chunked = feed_chunked(&from, &sse_headers(), body, sizes);
    prop_assert_eq!(
        whole,
        chunked,
        "chunked {:?}",
        String::from_utf8_lossy(body)
    );
    if let Some(expected) = reference_stream(path, body) {
        prop_assert!(
            same(whole, expected),
            "meter {:?}, reference {:?}, path {:?}, stream {:?}",
            whole,
            expected,
            path,
            String::from_utf8_lossy(body)
        );
    }
    Ok(())
}

fn planted_events() -> impl Strategy<Value = (Vec<String>, Vec<Event>)> {
    (
        path(),
        prop::collection::vec(
            (
                event(),
                prop::option::weighted(0.4, (planted(), any::<u64>())),
            ),
            0..8,
        ),
    )
        .prop_map(|(path, events)| {
            let events = events
                .into_iter()
                .map(|(event, plant_here)| match (event, plant_here) {
                    (Event::Json { doc, pretty }, Some((value, at))) => Event::Json {
                        doc: plant(doc, &path, value, at),
                        pretty,
                    },
                    (event, _) => event,
                })
                .collect();
            (path, events)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 800, ..ProptestConfig::default() })]

    #[test]
    fn streams_agree_with_the_reference(
        (path, events) in planted_events(),
        seed in any::<u64>(),
        bom in any::<bool>(),
        end in any::<bool>(),
        sizes in sizes(),
    ) {
        let body = stream(&events, seed, bom, end);
        check_stream(&path, &body, &sizes)?;
    }

    #[test]
    fn mutated_streams_agree_with_the_reference(
        (path, events) in planted_events(),
        seed in any::<u64>(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..5),
        sizes in sizes(),
    ) {
        let mut body = stream(&events, seed, seed % 5 == 0, true);
        mutate(&mut body, &edits);
        check_stream(&path, &body, &sizes)?;
    }

    #[test]
    fn garbage_streams_agree_with_the_reference(
        body in prop::collection::vec(
            prop_oneof![4 => any::<u8>(), 2 => prop::sample::select(&b"data: {}[]\"\n\r:5"[..])],
            0..200,
        ),
        path in path(),
        sizes in sizes(),
    ) {
        check_stream(&path, &body, &sizes)?;
    }
}

/// The generators reach every answer, often: a differential test that only ever compares
/// "missing" with "missing" proves nothing.
#[test]
fn generated_documents_reach_every_answer() {
    let mut runner = TestRunner::deterministic();
    let strategy = (node(), path(), (planted(), any::<u64>()), any::<u64>());
    let (mut found, mut missing, mut bad_value, mut malformed) = (0, 0, 0, 0);
    for _ in 0..2000 {
        let (doc, path, (value, at), seed) = strategy.new_tree(&mut runner).unwrap().current();
        let doc = plant(doc, &path, value, at);
        let body = write(&doc, seed, seed % 2 == 0, seed % 3 == 0);
        match read_usage(&cost_from(&path), &json_headers(), &body) {
            Usage::Found(_) => found += 1,
            Usage::Missing(_) => missing += 1,
            Usage::Bad(BadReason::Malformed { .. }) => malformed += 1,
            Usage::Bad(_) => bad_value += 1,
        }
    }
    eprintln!("found {found}, missing {missing}, bad value {bad_value}, malformed {malformed}");
    assert!(found > 600, "found {found}");
    assert!(missing > 100, "missing {missing}");
    assert!(bad_value > 200, "bad {bad_value}");
    assert_eq!(malformed, 0);
}
