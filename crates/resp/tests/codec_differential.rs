//! The codec held to the `redis` crate's parser (`redis::parse_redis_value`), over random,
//! generated and mutated input:
//!
//! - no input makes the request parser panic, and what it takes is within the input;
//! - whatever array frame it accepts, redis-rs reads as the same array of bulk strings;
//! - whatever redis-rs reads as an array of bulk strings written canonically, it accepts;
//! - inline commands, quoted the way Redis unquotes them, come back word for word;
//! - every reply the writer produces, in RESP2 and RESP3, redis-rs reads as the value meant.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use redis::Value;
use tollgate_resp::codec::{FrameLimits, Parsed, Protocol, ReplyBuf, parse_request};

fn encode(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).bytes());
        out.extend(a);
        out.extend(b"\r\n");
    }
    out
}

/// Bytes that matter to the parser, weighted up among random ones.
fn byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => any::<u8>(),
        2 => prop::sample::select(b"\r\n*$:-+0123456789 \"'\\x\t\0".to_vec()),
    ]
}

fn args() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(byte(), 0..24), 0..8)
}

#[derive(Clone, Debug)]
enum Mutation {
    /// One of the bytes that frame the data (`*`, `$`, digits, CR, LF) replaced.
    Structural(usize, u8),
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        2 => (any::<usize>(), byte()).prop_map(|(i, b)| Mutation::Structural(i, b)),
        1 => (any::<usize>(), byte()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => (any::<usize>(), byte()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        1 => any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len();
        match *m {
            Mutation::Structural(i, b) => {
                let at: Vec<usize> = (0..len)
                    .filter(|&j| b"*$\r\n-0123456789".contains(&bytes[j]))
                    .collect();
                if !at.is_empty() {
                    bytes[at[i % at.len()]] = b;
                }
            }
            Mutation::Set(i, b) if len > 0 => bytes[i % len] = b,
            Mutation::Insert(i, b) => bytes.insert(i % (len + 1), b),
            Mutation::Remove(i) if len > 0 => {
                bytes.remove(i % len);
            }
            Mutation::Truncate(i) => bytes.truncate(i % (len + 1)),
            _ => {}
        }
    }
    bytes
}

/// The properties every input must keep.
fn check(input: &[u8]) -> Result<(), TestCaseError> {
    let limits = FrameLimits::default();
    let parsed = parse_request(input, &limits);
    // Soundness: an accepted array frame is what redis-rs reads in the same bytes.
    if let Ok(Parsed::Request(request, used)) = &parsed {
        prop_assert!(*used > 0 && *used <= input.len());
        if input[0] == b'*' {
            let theirs = redis::parse_redis_value(&input[..*used]);
            let ours: Vec<Value> = request
                .iter()
                .map(|a| Value::BulkString(a.to_vec()))
                .collect();
            match theirs {
                Ok(Value::Array(items)) => prop_assert_eq!(items, ours),
                Ok(Value::Nil) => prop_assert!(ours.is_empty()),
                other => prop_assert!(false, "redis-rs read {:?} where we read {:?}", other, ours),
            }
        }
    }
    // Completeness: an array of bulk strings written canonically at the start is accepted.
    if input.first() == Some(&b'*')
        && let Ok(Value::Array(items)) = redis::parse_redis_value(input)
    {
        let args: Option<Vec<Vec<u8>>> = items
            .into_iter()
            .map(|v| match v {
                Value::BulkString(b) => Some(b),
                _ => None,
            })
            .collect();
        if let Some(args) = args {
            let canonical = encode(&args);
            if input.starts_with(&canonical) && args.len() <= limits.max_args {
                match parsed {
                    Ok(Parsed::Request(request, used)) => {
                        prop_assert_eq!(used, canonical.len());
                        prop_assert_eq!(
                            request.args(),
                            args.iter().map(Vec::as_slice).collect::<Vec<_>>()
                        );
                    }
                    other => prop_assert!(false, "refused a canonical frame: {:?}", other),
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5_000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(input in prop::collection::vec(byte(), 0..96)) {
        check(&input)?;
        let mut starred = vec![b'*'];
        starred.extend(&input);
        check(&starred)?;
    }

    #[test]
    fn generated_frames_parse_back(frames in prop::collection::vec(args(), 1..4)) {
        let mut input = Vec::new();
        for f in &frames {
            input.extend(encode(f));
        }
        let limits = FrameLimits::default();
        let mut at = 0;
        for f in &frames {
            check(&input[at..])?;
            match parse_request(&input[at..], &limits) {
                Ok(Parsed::Request(request, used)) => {
                    prop_assert_eq!(request.args(), f.iter().map(Vec::as_slice).collect::<Vec<_>>());
                    at += used;
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }
        prop_assert_eq!(at, input.len());
        // Every strict prefix of a frame is incomplete, never an error.
        let first = encode(&frames[0]);
        for cut in 0..first.len() {
            prop_assert_eq!(parse_request(&first[..cut], &limits), Ok(Parsed::Incomplete));
        }
    }

    #[test]
    fn mutated_frames(frames in prop::collection::vec(args(), 1..3),
                      mutations in prop::collection::vec(mutation(), 1..4)) {
        let mut input = Vec::new();
        for f in &frames {
            input.extend(encode(f));
        }
        let input = mutate(input, &mutations);
        check(&input)?;
    }

    #[test]
    fn inline_words_come_back(words in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..16), 1..6)) {
        // Quoted as redis-cli quotes: every byte not plainly printable as \xHH.
        let mut line = Vec::new();
        for w in &words {
            line.push(b'"');
            for &b in w {
                if b.is_ascii_alphanumeric() {
                    line.push(b);
                } else {
                    line.extend(format!("\\x{b:02x}").bytes());
                }
            }
            line.extend(b"\" ");
        }
        line.extend(b"\r\n");
        match parse_request(&line, &FrameLimits::default()) {
            Ok(Parsed::Request(request, used)) => {
                prop_assert_eq!(used, line.len());
                prop_assert_eq!(request.args(), words.iter().map(Vec::as_slice).collect::<Vec<_>>());
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn replies_read_back(tree in reply_tree(), resp3 in any::<bool>()) {
        let protocol = if resp3 { Protocol::Resp3 } else { Protocol::Resp2 };
        let mut out = ReplyBuf::new(protocol);
        write(&mut out, &tree);
        let value = redis::parse_redis_value(out.as_bytes());
        prop_assert_eq!(value.ok(), Some(expected(&tree, protocol)));
    }
}

/// A reply to write.
#[derive(Clone, Debug)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Vec<u8>),
    Null,
    Boolean(bool),
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
}

fn reply_tree() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        "[a-zA-Z0-9 ]{0,12}".prop_map(Reply::Simple),
        "[A-Z]{1,8} [a-z ]{0,12}".prop_map(Reply::Error),
        any::<i64>().prop_map(Reply::Integer),
        prop::collection::vec(any::<u8>(), 0..32).prop_map(Reply::Bulk),
        Just(Reply::Null),
        any::<bool>().prop_map(Reply::Boolean),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Reply::Array),
            prop::collection::vec((inner.clone(), inner.clone()), 0..3).prop_map(Reply::Map),
            prop::collection::vec(inner, 0..4).prop_map(Reply::Set),
        ]
    })
}

fn write(out: &mut ReplyBuf, r: &Reply) {
    match r {
        Reply::Simple(s) => out.simple(s.as_bytes()),
        Reply::Error(s) => out.error(s.as_bytes()),
        Reply::Integer(n) => out.integer(*n),
        Reply::Bulk(b) => out.bulk(b),
        Reply::Null => out.null(),
        Reply::Boolean(b) => out.boolean(*b),
        Reply::Array(items) => {
            out.array(items.len());
            items.iter().for_each(|i| write(out, i));
        }
        Reply::Map(pairs) => {
            out.map(pairs.len());
            for (k, v) in pairs {
                write(out, k);
                write(out, v);
            }
        }
        Reply::Set(items) => {
            out.set(items.len());
            items.iter().for_each(|i| write(out, i));
        }
    }
}

/// What redis-rs should read for `r` written in `protocol`.
fn expected(r: &Reply, protocol: Protocol) -> Value {
    let resp3 = protocol == Protocol::Resp3;
    match r {
        Reply::Simple(s) if s == "OK" => Value::Okay,
        Reply::Simple(s) => Value::SimpleString(s.clone()),
        Reply::Error(s) => redis::parse_redis_value(format!("-{s}\r\n").as_bytes()).unwrap(),
        Reply::Integer(n) => Value::Int(*n),
        Reply::Bulk(b) => Value::BulkString(b.clone()),
        Reply::Null => Value::Nil,
        Reply::Boolean(b) if resp3 => Value::Boolean(*b),
        Reply::Boolean(b) => Value::Int(i64::from(*b)),
        Reply::Array(items) => Value::Array(items.iter().map(|i| expected(i, protocol)).collect()),
        Reply::Map(pairs) if resp3 => Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (expected(k, protocol), expected(v, protocol)))
                .collect(),
        ),
        Reply::Map(pairs) => Value::Array(
            pairs
                .iter()
                .flat_map(|(k, v)| [expected(k, protocol), expected(v, protocol)])
                .collect(),
        ),
        Reply::Set(items) if resp3 => {
            Value::Set(items.iter().map(|i| expected(i, protocol)).collect())
        }
        Reply::Set(items) => Value::Array(items.iter().map(|i| expected(i, protocol)).collect()),
    }
}
