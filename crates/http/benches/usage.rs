//! What reading the usage costs per response, with `json:usage.total_tokens`:
//!
//! - `usage_json_4k`: a 4 KiB OpenAI chat completion, the usage at the end, its answer markdown
//!   prose (a line break or quote every ~60 bytes), code (an escape every ~8 bytes), French
//!   (some non-ASCII) or Chinese (all non-ASCII); pretty-printed as the API sends it, or
//!   compact; fed whole or in three reads;
//!   a response the meter does not read; and for scale the same body parsed into a
//!   `serde_json::Value`.
//! - `usage_sse`: an OpenAI stream (`text/event-stream`, 64 chunks, the usage chunk and
//!   `[DONE]`), fed whole or one read per line.
//! - `usage_header`: `header:x-usage-tokens`.
//!
//! Run with `cargo bench -p tollgate-http --bench usage`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use serde_json::json;
use tollgate_http::usage::{CostFrom, Usage, UsageMeter};

const SIZE: usize = 4096;

/// An assistant's markdown answer: paragraphs, a list, a little code.
const PROSE: &str = "Rate limiting protects an API from clients that send more requests than \
it can serve. There are a few common approaches, each with its own trade-offs.\n\n\
1. **Fixed window**: count requests per key in a window of fixed length, such as one minute. \
It is simple and cheap, but a client can send twice its quota around a window boundary.\n\
2. **Sliding window**: weigh the previous window's count by how much of it still overlaps \
the current one. It smooths the boundary effect at almost no extra cost.\n\
3. **Token bucket**: tokens refill at a steady rate up to a burst size; each request takes \
one. It allows short bursts while keeping the long-run rate.\n\n\
For example, with Redis you could write:\n\n\
```python\ncount = redis.incr(f\"rl:{key}:{window}\")\nif count == 1:\n    \
redis.expire(f\"rl:{key}:{window}\", 60)\nallowed = count <= limit\n```\n\n\
Which one to choose depends on whether your clients are \"bursty\" and on how strictly the \
limit must hold. ";

/// An answer that is mostly code: an escape every eight bytes or so.
const CODE: &str = "```rust\nfn main() {\n    let config = \"{\\\"limit\\\": 100}\";\n    \
println!(\"{}\", config);\n    for (key, value) in map.iter() {\n        \
println!(\"\\\"{key}\\\" => \\\"{value}\\\"\");\n    }\n}\n```\n";

/// French prose: non-ASCII characters every few bytes.
const FRENCH: &str = "Le cœur a ses raisons que la raison ne connaît point ; on le sait en mille \
choses. « Ça » se voit, dès l'été, à l'aube où l'on s'éveille. ";

/// Chinese prose: three bytes a character.
const CHINESE: &str = "速率限制可以保护接口免受过多请求的影响。常见的方法有固定窗口、滑动窗口和令牌桶，\
各有取舍。\n\n";

/// A chat completion as OpenAI sends it, its answer `text` repeated and cut so that the body is
/// `SIZE` bytes long (give or take a character), the usage at the end.
fn completion(pretty: bool, text: &str) -> Vec<u8> {
    let build = |content: &str| {
        let value = json!({
            "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
            "object": "chat.completion",
            "created": 1741569952,
            "model": "gpt-4o-2024-08-06",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": null, "annotations": []},
                "logprobs": null,
                "finish_reason": "stop"
            }],
            "usage": {
                "prompt_tokens": 1117,
                "completion_tokens": 846,
                "total_tokens": 1963,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": 0,
                    "audio_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0
                }
            },
            "service_tier": "default",
            "system_fingerprint": "fp_fc9f1d7035"
        });
        if pretty {
            serde_json::to_vec_pretty(&value).unwrap()
        } else {
            serde_json::to_vec(&value).unwrap()
        }
    };
    let long = text.repeat(SIZE / text.len() + 2);
    // The longest answer (in whole characters) for which the body fits in SIZE.
    let cut = |mut index: usize| {
        while !long.is_char_boundary(index) {
            index -= 1;
        }
        &long[..index]
    };
    let (mut low, mut high) = (0, long.len());
    while low < high {
        let mid = (low + high).div_ceil(2);
        if build(cut(mid)).len() <= SIZE {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    build(cut(low))
}

/// An OpenAI stream with `stream_options.include_usage`: a role chunk, 64 chunks of a word
/// each, then the usage chunk and `[DONE]`.
fn stream() -> Vec<u8> {
    let chunk = |delta: serde_json::Value, usage: serde_json::Value, finish: bool| {
        let choices = if usage.is_null() {
            json!([{"index": 0, "delta": delta, "logprobs": null,
                    "finish_reason": if finish { json!("stop") } else { json!(null) }}])
        } else {
            json!([])
        };
        let value = json!({
            "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
            "object": "chat.completion.chunk",
            "created": 1741569952,
            "model": "gpt-4o-2024-08-06",
            "service_tier": "default",
            "system_fingerprint": "fp_fc9f1d7035",
            "choices": choices,
            "usage": usage
        });
        format!("data: {value}\n\n")
    };
    let mut out = chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        json!(null),
        false,
    );
    for i in 0..64 {
        out.push_str(&chunk(
            json!({"content": format!(" word{i}")}),
            json!(null),
            i == 63,
        ));
    }
    out.push_str(&chunk(
        json!(null),
        json!({"prompt_tokens": 1117, "completion_tokens": 64, "total_tokens": 1181,
               "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
               "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                   "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}),
        false,
    ));
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

fn headers(content_type: &'static str) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("content-type", HeaderValue::from_static(content_type));
    map.insert("x-request-id", HeaderValue::from_static("req_123"));
    map
}

fn meter(cost_from: &CostFrom, headers: &HeaderMap, chunks: &[&[u8]]) -> Usage {
    let mut meter = UsageMeter::new(cost_from, headers);
    for chunk in chunks {
        meter.feed(black_box(chunk));
    }
    meter.finish()
}

fn bench(c: &mut Criterion) {
    let total: CostFrom = "json:usage.total_tokens".parse().unwrap();
    let json = headers("application/json");

    let mut group = c.benchmark_group("usage_json_4k");
    for (name, body) in [
        ("prose_pretty", completion(true, PROSE)),
        ("prose_compact", completion(false, PROSE)),
        ("code_pretty", completion(true, CODE)),
        ("french_pretty", completion(true, FRENCH)),
        ("chinese_pretty", completion(true, CHINESE)),
    ] {
        assert_eq!(meter(&total, &json, &[&body]), Usage::Found(1963), "{name}");
        assert!(
            body.len().abs_diff(SIZE) < 4,
            "{name}: {} bytes",
            body.len()
        );
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| meter(&total, &json, &[black_box(&body)]))
        });
    }
    // As a proxy relays it: three reads of uneven size.
    let body = completion(true, PROSE);
    let (a, rest) = body.split_at(1000);
    let (b_, c_) = rest.split_at(1700);
    group.bench_function("prose_pretty_3_reads", |b| {
        b.iter(|| meter(&total, &json, &[a, b_, c_]))
    });
    // A response the meter does not read (another content type): nothing per chunk.
    let html = headers("text/html");
    group.bench_function("not_read", |b| {
        b.iter(|| meter(&total, &html, &[black_box(&body)]))
    });
    // For scale: what building a DOM of the body costs.
    group.bench_function("serde_json_value", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&body)).unwrap())
    });
    group.finish();

    let mut group = c.benchmark_group("usage_sse");
    let sse = headers("text/event-stream");
    let body = stream();
    assert_eq!(meter(&total, &sse, &[&body]), Usage::Found(1181));
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function(format!("openai_66_events_{}_bytes", body.len()), |b| {
        b.iter(|| meter(&total, &sse, &[black_box(&body)]))
    });
    // As it arrives: one read per line.
    let lines: Vec<&[u8]> = body.split_inclusive(|&b| b == b'\n').collect();
    group.bench_function("openai_one_read_per_line", |b| {
        b.iter(|| meter(&total, &sse, &lines))
    });
    group.finish();

    let mut group = c.benchmark_group("usage_header");
    let from: CostFrom = "header:x-usage-tokens".parse().unwrap();
    let mut with_header = headers("application/json");
    with_header.insert("x-usage-tokens", HeaderValue::from_static("1963"));
    group.bench_function("found", |b| {
        b.iter(|| meter(&from, black_box(&with_header), &[black_box(&body)]))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
