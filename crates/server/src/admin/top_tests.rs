//! The top-keys sketches against an exact count: the Space-Saving bound holds for every key,
//! merged over threads and periods, and periods roll over as the clock says.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

fn exact(stream: &[u32]) -> HashMap<Vec<u8>, u64> {
    let mut counts = HashMap::new();
    for k in stream {
        *counts
            .entry(format!("ip:10.0.{k}").into_bytes())
            .or_default() += 1;
    }
    counts
}

/// Every listed key's true count is in [count - error, count]; every key truly above
/// `error_bound` is listed when `n` covers the sketch; totals are exact.
fn check(counted: &Counted, truth: &HashMap<Vec<u8>, u64>) {
    assert_eq!(counted.total, truth.values().sum::<u64>());
    for k in &counted.keys {
        let real = truth.get(&k.key).copied().unwrap_or(0);
        assert!(
            k.count >= real && k.count - k.error <= real,
            "{:?}: {} ±{} but {real}",
            String::from_utf8_lossy(&k.key),
            k.count,
            k.error
        );
        assert!(k.error <= counted.error_bound);
    }
    let listed: std::collections::HashSet<&[u8]> =
        counted.keys.iter().map(|k| &k.key[..]).collect();
    for (key, &real) in truth {
        if real > counted.error_bound {
            assert!(
                listed.contains(&key[..]),
                "{} seen {real} times (> {}) is missing",
                String::from_utf8_lossy(key),
                counted.error_bound
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Skewed streams over more keys than the sketch holds, spread over several threads.
    #[test]
    fn merged_counts_bound_the_truth(
        stream in prop::collection::vec((0u32..600, 0u32..600, any::<bool>()), 1..4000),
        threads in 1usize..5,
    ) {
        let top = TopKeys::default();
        top.tick(6_000);
        let policy = top.policy("api");
        // A few heavy keys (small numbers, from the min of two draws) among many light ones.
        let keys: Vec<(u32, bool)> = stream.iter().map(|&(a, b, d)| (a.min(b) / 4 + a % 3, d)).collect();
        let chunks: Vec<Vec<(u32, bool)>> = keys
            .chunks(keys.len().div_ceil(threads))
            .map(<[(u32, bool)]>::to_vec)
            .collect();
        std::thread::scope(|s| {
            for chunk in &chunks {
                let policy = &policy;
                s.spawn(move || {
                    for &(k, denied) in chunk {
                        policy.record(format!("ip:10.0.{k}").as_bytes(), denied);
                    }
                });
            }
        });
        let view = policy.read(usize::MAX);
        let all: Vec<u32> = keys.iter().map(|&(k, _)| k).collect();
        let denied: Vec<u32> = keys.iter().filter(|&&(_, d)| d).map(|&(k, _)| k).collect();
        check(&view.requests, &exact(&all));
        check(&view.denied, &exact(&denied));
    }
}

#[test]
fn small_streams_are_exact_and_sorted() {
    let top = TopKeys::default();
    top.tick(60 * 1000);
    let p = top.policy("api");
    for (key, n) in [
        ("ip:1.1.1.1", 5),
        ("header:x-api-key:ab12", 9),
        ("user:7", 1),
    ] {
        for i in 0..n {
            p.record(key.as_bytes(), i % 2 == 0);
        }
    }
    let view = p.read(2);
    let keys: Vec<(&[u8], u64, u64)> = view
        .requests
        .keys
        .iter()
        .map(|k| (&k.key[..], k.count, k.error))
        .collect();
    assert_eq!(
        keys,
        vec![
            (&b"header:x-api-key:ab12"[..], 9, 0),
            (&b"ip:1.1.1.1"[..], 5, 0)
        ]
    );
    assert_eq!(view.requests.total, 15);
    assert_eq!(view.requests.error_bound, 0);
    assert_eq!(view.denied.total, 5 + 3 + 1);
}

#[test]
fn reads_cover_this_period_and_the_one_before() {
    let top = TopKeys::default();
    let p = top.policy("api");
    top.tick(600);
    p.record(b"ip:old", true);
    top.tick(660);
    p.record(b"ip:new", true);
    let keys =
        |v: &TopView| -> Vec<Vec<u8>> { v.denied.keys.iter().map(|k| k.key.clone()).collect() };
    assert_eq!(
        keys(&p.read(10)),
        vec![b"ip:new".to_vec(), b"ip:old".to_vec()]
    );
    assert_eq!(TopKeys::since_secs(&p.read(10)), 600);
    // Two periods on, the first one is gone, whichever slot it sat in.
    top.tick(720);
    assert_eq!(keys(&p.read(10)), vec![b"ip:new".to_vec()]);
    top.tick(780);
    assert!(p.read(10).denied.keys.is_empty());
    // A thread that writes again reuses the stale slot from scratch.
    p.record(b"ip:later", false);
    assert_eq!(p.read(10).requests.total, 1);
}

#[test]
fn policies_keep_their_sketches_by_name() {
    let top = TopKeys::default();
    top.policy("api").record(b"ip:1", false);
    assert_eq!(top.policy("api").read(5).requests.total, 1);
    assert_eq!(top.policy("other").read(5).requests.total, 0);
}
