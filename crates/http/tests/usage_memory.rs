//! The usage meter reads any body in bounded memory: 100 MB bodies (JSON with a huge array, a
//! huge string, a huge key; event streams with many events, one huge event, one huge comment),
//! generated and streamed through the meter, never copied, and the heap does not grow by a
//! byte while the meter is built, fed and finished.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::{HeaderMap, HeaderValue};
use peak_alloc::PeakAlloc;
use tollgate_http::usage::{CostFrom, Usage, UsageMeter};

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

const TOTAL: usize = 100 * 1000 * 1000;
const CHUNK: usize = 16 * 1024;

/// A body: `head`, then `middle` repeated to make 100 MB in all, then `tail`.
struct Body {
    head: Vec<u8>,
    middle: Vec<u8>,
    tail: Vec<u8>,
}

impl Body {
    /// `unit` repeated to fill one chunk.
    fn new(head: &str, unit: &str, tail: &str) -> Self {
        Body {
            head: head.as_bytes().to_vec(),
            middle: unit.repeat(CHUNK / unit.len()).into_bytes(),
            tail: tail.as_bytes().to_vec(),
        }
    }
}

/// Feeds the body in chunks and answers the usage and how far the heap's peak rose above what
/// was in use before the meter was built.
fn stream_through(cost_from: &CostFrom, content_type: &'static str, body: &Body) -> (Usage, usize) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static(content_type));
    let before = HEAP.current_usage();
    HEAP.reset_peak_usage();
    let mut meter = UsageMeter::new(cost_from, &headers);
    meter.feed(&body.head);
    let mut fed = body.head.len() + body.tail.len();
    while fed < TOTAL {
        // Chunk boundaries move around: a short piece, then the rest of the block.
        let cut = fed % 7 + 1;
        meter.feed(&body.middle[..cut]);
        meter.feed(&body.middle[cut..]);
        fed += body.middle.len();
    }
    meter.feed(&body.tail);
    let usage = meter.finish();
    (usage, HEAP.peak_usage().saturating_sub(before))
}

#[test]
fn hundred_megabyte_bodies_in_constant_memory() {
    let total: CostFrom = "json:usage.total_tokens".parse().unwrap();
    let cases: Vec<(&str, &str, Body)> = vec![
        (
            "JSON: a huge array of choices",
            "application/json",
            Body::new(
                r#"{"id":"chatcmpl-1","choices":["#,
                r#"{"index":12,"message":{"role":"assistant","content":"Hello \"there\", é😀 \u00e9\n"},"usage":{"total_tokens":1},"x":[1.5e3,true,null,{}]},"#,
                r#"{}],"usage":{"prompt_tokens":1,"total_tokens":77}}"#,
            ),
        ),
        (
            "JSON: one huge string",
            "application/json",
            Body::new(
                r#"{"choices":[{"message":{"content":""#,
                r#"All work and no play makes Jack a dull boy. \"Quoted\" \\ \/ \t é€😀 "#,
                r#""}}],"usage":{"total_tokens":78}}"#,
            ),
        ),
        (
            "JSON: one huge key on the path's level",
            "application/json",
            Body::new(
                r#"{"usage"#,
                "usage_usage_",
                r#"":1,"usage":{"total_tokens":79}}"#,
            ),
        ),
        (
            "SSE: many events",
            "text/event-stream",
            Body::new(
                ": stream\n",
                "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word\"},\"finish_reason\":null}],\"usage\":null}\r\n\r\n",
                "data: {\"choices\":[],\"usage\":{\"total_tokens\":80}}\n\ndata: [DONE]\n\n",
            ),
        ),
        (
            "SSE: one huge event",
            "text/event-stream",
            Body::new(
                "data: {\"usage\":{\"total_tokens\":81},\"content\":\"",
                "a long, long event that is never buffered, ",
                "\"}\n\n",
            ),
        ),
        (
            "SSE: one huge comment, then an event",
            "text/event-stream",
            Body::new(
                ":",
                "a comment line that never ends ",
                "\ndata: {\"usage\":{\"total_tokens\":82}}\n\n",
            ),
        ),
    ];
    for (expected, (name, content_type, body)) in (77..).zip(cases) {
        // The heap is the process's: the test harness's own threads may allocate meanwhile
        // (they do at start-up), so a case that saw the heap grow is run again; the meter's
        // part must be nothing, every time.
        let mut runs = Vec::new();
        for _ in 0..3 {
            let (usage, grown) = stream_through(&total, content_type, &body);
            assert_eq!(usage, Usage::Found(expected), "{name}");
            runs.push(grown);
            if grown == 0 {
                break;
            }
        }
        eprintln!("{name}: heap peak +{runs:?} bytes");
        assert_eq!(
            runs.last(),
            Some(&0),
            "{name}: the heap grew by {runs:?} bytes"
        );
    }
}
