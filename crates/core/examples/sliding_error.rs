//! Measures the sliding window counter's wrong decisions against the exact log on a synthetic
//! trace: `cargo run --release -p tollgate --features test-util --example sliding_error [clients] [minutes]`.

use tollgate::testing::sliding_error::{Population, measure};

fn main() {
    let mut args = std::env::args().skip(1);
    let clients = args.next().and_then(|a| a.parse().ok()).unwrap_or(5_000);
    let minutes = args.next().and_then(|a| a.parse().ok()).unwrap_or(240);
    for (name, population) in [
        ("realistic", Population::REALISTIC),
        ("heavy", Population::HEAVY),
    ] {
        let m = measure(population, clients, minutes, 7);
        for (setting, r) in [
            ("every-request", m.every_request),
            ("admitted-only", m.admitted_only),
        ] {
            println!(
                "{name} {setting}: clients={clients} minutes={minutes} requests={} exact_admits={} wrongly_admitted={} wrongly_denied={} wrong={:.5}%",
                r.requests,
                r.admitted_exact,
                r.wrongly_admitted,
                r.wrongly_denied,
                r.wrong_share() * 100.0
            );
        }
    }
}
