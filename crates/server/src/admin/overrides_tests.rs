//! The override body parser: every field checked for its type, unknown ones and bad expiries
//! refused by name.

use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::*;

const NOW: u64 = 1_900_000_000;

fn parse(body: Value) -> Result<Record, (StatusCode, Value)> {
    let obj = body.as_object().cloned().unwrap_or_default();
    parse_record(
        "api".into(),
        "ip:203.0.113.9".into(),
        &obj,
        Duration::from_secs(NOW),
    )
    .map_err(|bad| {
        let res = bad.response();
        let status = res.status();
        let bytes = futures_lite_block(res);
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    })
}

/// The body of a response the parser built (always complete in memory).
fn futures_lite_block(res: Response<Body>) -> Vec<u8> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        res.into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
    })
    .unwrap_or_default()
}

#[test]
fn a_full_body_is_read() {
    let r =
        parse(json!({"limit": 1000, "window": "1h", "expires": "2h", "reason": " incident 42 "}))
            .unwrap();
    assert_eq!(r.limit, Some(1000));
    assert_eq!(r.window.as_deref(), Some("1h"));
    assert_eq!(r.expires, Some(NOW + 7200));
    assert_eq!(r.reason, "incident 42");
    let r = parse(
        json!({"capacity": 5, "refill": "1/s", "expires": "2030-06-01T00:00:00Z", "reason": "x"}),
    )
    .unwrap();
    assert_eq!(r.expires, Some(1_906_502_400));
    assert_eq!(r.refill.as_deref(), Some("1/s"));
}

#[test]
fn bad_input_names_the_field() {
    for (body, field) in [
        (json!({"limit": 0, "reason": "x"}), "limit"),
        (json!({"limit": -3, "reason": "x"}), "limit"),
        (json!({"limit": "many", "reason": "x"}), "limit"),
        (json!({"limit": 5_000_000_000u64, "reason": "x"}), "limit"),
        (json!({"window": "soon", "reason": "x"}), "window"),
        (json!({"refill": "fast", "reason": "x"}), "refill"),
        (json!({"queue": 1.5, "reason": "x"}), "queue"),
        (json!({"limit": 5}), "reason"),
        (json!({"limit": 5, "reason": "   "}), "reason"),
        (json!({"limit": 5, "reason": "a\u{0}b"}), "reason"),
        (
            json!({"limit": 5, "reason": "x", "expires": "yesterday"}),
            "expires",
        ),
        (
            json!({"limit": 5, "reason": "x", "expires": "2001-01-01T00:00:00Z"}),
            "expires",
        ),
        (
            json!({"limit": 5, "reason": "x", "expires": "0s"}),
            "expires",
        ),
        (
            json!({"limit": 5, "reason": "x", "colour": "red"}),
            "colour",
        ),
    ] {
        let (status, problem) = parse(body.clone()).expect_err(&body.to_string());
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(problem["field"], field, "{body}: {problem}");
        assert_eq!(problem["status"], 400);
    }
}
