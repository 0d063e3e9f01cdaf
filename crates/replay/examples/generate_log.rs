//! Writes a synthetic access log for `scripts/bench-replay.sh` and for trying `tollgate
//! replay`: `cargo run --release -p tollgate-replay --example generate_log -- LINES [SECONDS]
//! [CLIENTS] [--with-key]` prints LINES combined-format lines spread evenly over SECONDS
//! (default a day) from CLIENTS addresses (default 5,000; a tenth of the traffic from ten busy
//! ones), starting 2024-03-01T00:00:00Z. `--with-key` appends `"$http_x_api_key" $msec`.

use std::io::{self, BufWriter, Write};

use time::OffsetDateTime;
use time::macros::format_description;

const START: i64 = 1_709_251_200;

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let with_key = args.iter().any(|a| a == "--with-key");
    let numbers: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let lines = numbers.first().copied().unwrap_or(1_000_000);
    let seconds = numbers.get(1).copied().unwrap_or(86_400).max(1);
    let clients = numbers.get(2).copied().unwrap_or(5_000).max(11);
    let mut out = BufWriter::with_capacity(1 << 20, io::stdout().lock());
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64*: repeatable without a dependency.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let clf = format_description!("[day]/[month repr:short]/[year]:[hour]:[minute]:[second] +0000");
    let mut stamp = String::new();
    let mut stamp_second = i64::MIN;
    for i in 0..lines {
        let micros = (i as u128 * u128::from(seconds) * 1_000_000 / u128::from(lines)) as i64;
        let second = START + micros / 1_000_000;
        if second != stamp_second {
            stamp = OffsetDateTime::from_unix_timestamp(second)
                .ok()
                .and_then(|t| t.format(clf).ok())
                .unwrap_or_default();
            stamp_second = second;
        }
        let r = next();
        let client = if r % 10 == 0 {
            r / 10 % 10
        } else {
            10 + r / 10 % (clients - 10)
        };
        let ip = format!(
            "10.{}.{}.{}",
            client >> 16 & 255,
            client >> 8 & 255,
            client & 255
        );
        let (method, path) = match r >> 32 & 7 {
            0 => ("POST", format!("/v1/export/{}", r >> 40 & 1023)),
            1 => ("GET", "/healthz".to_owned()),
            _ => (
                "GET",
                format!("/v1/items/{}?page={}", r >> 40 & 65_535, r >> 56 & 7),
            ),
        };
        write!(
            out,
            "{ip} - - [{stamp}] \"{method} {path} HTTP/1.1\" 200 {} \"-\" \"bench/1.0\"",
            r >> 20 & 4095
        )?;
        if with_key {
            let msec = START as f64 + micros as f64 / 1e6;
            write!(out, " \"key-{client}\" {msec:.3}")?;
        }
        out.write_all(b"\n")?;
    }
    out.flush()
}
