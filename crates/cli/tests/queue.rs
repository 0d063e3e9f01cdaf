//! The `queue` action end to end: real `tollgate serve` processes over a real `redis-server`,
//! webhooks sent pipelined, and an upstream that counts arrivals. 1,000 webhooks through two
//! instances are each delivered once and never faster than the policy's rate; an instance
//! killed mid-drain loses nothing (the survivor takes over its messages); a 10-second upstream
//! outage only delays deliveries (the oldest message's age gauge grows meanwhile, and falls to 0
//! after); a poison message ends in the dead letters, counted by their gauge until re-driven.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod queue_support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use queue_support::*;

/// How much earlier than its slot a delivery may be seen to arrive: the upstream timestamps a
/// request when its thread gets to read it, and on a loaded machine (CI runs these tests side
/// by side on two cores) a thread can be late by this much, which bunches the arrivals it then
/// reads. Slack enough for that, and still far too little for a drain at twice the rate.
const JITTER: Duration = Duration::from_millis(400);

/// The queue's gauges, which the drainer reads from Redis every second.
const DEPTH: &str = "tollgate_queue_depth{policy=\"hooks\"}";
const OLDEST: &str = "tollgate_queue_oldest_age_seconds{policy=\"hooks\"}";
const DEAD: &str = "tollgate_queue_dead_letter_depth{policy=\"hooks\"}";

#[test]
fn a_missing_metric_series_is_none_not_zero() {
    let text = "# TYPE tollgate_queue_depth gauge\n\
                tollgate_queue_depth{policy=\"hooks-2\"} 0\n\
                tollgate_queue_depth{policy=\"hooks\"} 3\n";
    assert_eq!(series_value(text, DEPTH), Some(3.0));
    assert_eq!(
        series_value(text, "tollgate_queue_depth{policy=\"hook\"}"),
        None
    );
    assert_eq!(series_value(text, OLDEST), None);
}

/// Every queued id, from what the senders got back (each a 200 passed live or a 202).
fn queued_ids(sent: &[Sent]) -> Vec<String> {
    for s in sent {
        assert!(s.status == 200 || s.status == 202, "{s:?}");
    }
    sent.iter().filter_map(|s| s.id.clone()).collect()
}

/// How many times each idempotency key arrived.
fn arrivals_by_key(up: &Upstream) -> HashMap<String, usize> {
    let mut by_key = HashMap::new();
    for a in up.arrivals() {
        if let Some(k) = a.key {
            *by_key.entry(k).or_insert(0) += 1;
        }
    }
    by_key
}

/// The webhook numbers that arrived.
fn arrived_numbers(up: &Upstream) -> HashSet<usize> {
    up.arrivals().iter().map(|a| a.webhook).collect()
}

#[test]
fn a_thousand_webhooks_through_two_instances_arrive_once_each_at_or_under_the_rate() {
    let redis = Redis::start(&[]);
    let up = Upstream::new();
    up.listen();
    let (rate, burst) = (200.0, 11.0);
    let config = queue_config(&redis, up.port, "200/s", 10, "queue_max_depth = 2000\n");
    let a = Instance::start(&config);
    let b = Instance::start(&config);
    let (pa, pb) = (a.proxy, b.proxy);
    let to_a = std::thread::spawn(move || send_webhooks(pa, 0..500, 2, None));
    let to_b = std::thread::spawn(move || send_webhooks(pb, 500..1000, 2, None));
    let mut sent = to_a.join().unwrap();
    sent.extend(to_b.join().unwrap());
    let ids = queued_ids(&sent);
    eprintln!(
        "1,000 webhooks: {} queued, {} passed at once",
        ids.len(),
        1000 - ids.len()
    );
    assert!(
        ids.len() >= 500,
        "most of a burst is over the rate: {}",
        ids.len()
    );

    eventually("every webhook arrived", Duration::from_secs(90), || {
        arrived_numbers(&up).len() == 1000
    });
    // Settled: the queue is empty (every delivery acknowledged) before duplicates are counted.
    eventually("the queue is empty", Duration::from_secs(30), || {
        a.metric(DEPTH) == 0.0 && b.metric(DEPTH) == 0.0
    });
    let arrivals = up.arrivals();
    assert_eq!(arrivals.len(), 1000, "each webhook once");
    let by_key = arrivals_by_key(&up);
    assert_eq!(by_key.len(), ids.len());
    for id in &ids {
        assert_eq!(by_key.get(id), Some(&1), "{id}");
    }

    // The bucket decided every arrival, live or delivered, across both instances.
    let first = arrivals.iter().map(|a| a.at).min().unwrap();
    let last = arrivals.iter().map(|a| a.at).max().unwrap();
    let span = last - first;
    let most = most_in_window(&arrivals, Duration::from_secs(1));
    eprintln!(
        "rate 200/s: 1,000 arrivals over {span:?} ({:.1}/s), at most {most} in any second",
        999.0 / span.as_secs_f64()
    );
    let allowed = |window: Duration| rate * (window + JITTER).as_secs_f64() + burst;
    assert!(
        1000.0 <= allowed(span),
        "1,000 arrivals in {span:?}: faster than 200/s"
    );
    assert!(
        most as f64 <= allowed(Duration::from_secs(1)),
        "{most} arrivals in one second"
    );
}

#[test]
fn an_instance_killed_mid_drain_loses_nothing_and_the_survivor_finishes() {
    let redis = Redis::start(&[]);
    let up = Upstream::new();
    up.listen();
    let extra = "queue_claim_after = \"2s\"\nqueue_concurrency = 16\n";
    let config = queue_config(&redis, up.port, "100/s", 10, extra);
    let mut a = Instance::start(&config);
    let b = Instance::start(&config);
    let sent = send_webhooks(a.proxy, 0..300, 2, None);
    let ids = queued_ids(&sent);
    assert!(ids.len() >= 150, "{} queued", ids.len());
    eventually("the drain is under way", Duration::from_secs(30), || {
        up.arrivals().len() >= 80
    });
    a.kill();
    let at_kill = up.arrivals().len();

    eventually("every webhook arrived", Duration::from_secs(60), || {
        arrived_numbers(&up).len() == 300
    });
    eventually("the queue is empty", Duration::from_secs(30), || {
        b.metric(DEPTH) == 0.0
    });
    let by_key = arrivals_by_key(&up);
    let mut twice = 0;
    for id in &ids {
        let n = by_key.get(id).copied().unwrap_or(0);
        assert!(n >= 1, "{id} lost");
        twice += usize::from(n > 1);
    }
    eprintln!(
        "killed at {at_kill} arrivals of {}; {twice} delivered twice",
        up.arrivals().len()
    );
    // At least once: only what the killed instance held (at most its concurrency) can go twice.
    assert!(twice <= 16, "{twice} delivered twice");
    assert!(up.arrivals().len() > at_kill);
    // What the killed instance held was taken over, not found by chance.
    assert!(b.metric("tollgate_queue_claimed_total{policy=\"hooks\"}") > 0.0);
    assert!(
        b.metric("tollgate_queue_deliveries_total{policy=\"hooks\",result=\"delivered\"}") > 0.0
    );
}

#[test]
fn everything_is_delivered_after_a_ten_second_upstream_outage() {
    let redis = Redis::start(&[]);
    // Not listening yet: connections are refused.
    let up = Upstream::new();
    let extra = "queue_backoff = \"100ms\"\nqueue_attempts = 30\n";
    let config = queue_config(&redis, up.port, "100/s", 0, extra);
    let inst = Instance::start(&config);
    // One connection each: the proxy closes a connection after a 502 to a request with a body.
    let sent = send_one_by_one(inst.proxy, 0..50);
    let down_since = Instant::now();
    // Those that went straight through got the proxy's 502: the queue never had them.
    for s in &sent {
        assert!(s.status == 502 || s.status == 202, "{s:?}");
    }
    let ids: Vec<String> = sent.iter().filter_map(|s| s.id.clone()).collect();
    assert!(ids.len() >= 40, "{} queued", ids.len());
    eventually("deliveries are retried", Duration::from_secs(10), || {
        inst.metric("tollgate_queue_retries_total{policy=\"hooks\"}") > 0.0
    });
    // The outage lasts its 10 seconds; meanwhile nothing runs out of attempts.
    let dead = "tollgate_queue_dead_letters_total{policy=\"hooks\"}";
    while down_since.elapsed() < Duration::from_secs(10) {
        assert_eq!(inst.metric(dead), 0.0);
        std::thread::sleep(Duration::from_millis(500));
    }
    // The oldest message was queued before the outage began and is still there: it is at
    // least as old as the outage (a lower bound a slow machine only makes truer).
    let waited = down_since.elapsed();
    let oldest = inst.metric(OLDEST);
    assert!(
        oldest >= waited.as_secs_f64() - 0.5,
        "{OLDEST} {oldest} after {waited:?} of outage"
    );
    assert!(inst.metric(DEPTH) >= ids.len() as f64);
    up.listen();
    eventually(
        "every queued webhook arrived",
        Duration::from_secs(40),
        || arrivals_by_key(&up).len() == ids.len(),
    );
    let by_key = arrivals_by_key(&up);
    let mut most_attempts = 0;
    for id in &ids {
        assert_eq!(by_key.get(id), Some(&1), "{id}");
        let status = status_of(inst.proxy, id);
        assert_eq!(status["state"], "delivered", "{status}");
        most_attempts = most_attempts.max(status["attempts"].as_u64().unwrap());
    }
    eprintln!(
        "after a 10 s outage: {} delivered, up to {most_attempts} attempts each",
        ids.len()
    );
    assert!(most_attempts > 1);
    assert_eq!(inst.metric(dead), 0.0);
    eventually("the gauges say empty", Duration::from_secs(10), || {
        inst.metric(DEPTH) == 0.0 && inst.metric(OLDEST) == 0.0
    });
}

#[test]
fn a_poison_message_ends_in_the_dead_letters() {
    let redis = Redis::start(&[]);
    let up = Upstream::new();
    up.listen();
    let extra = "queue_attempts = 3\nqueue_backoff = \"50ms\"\n";
    let config = queue_config(&redis, up.port, "5/s", 0, extra);
    let inst = Instance::start(&config);
    // Webhook 1 is the poison: the second of a pipelined burst, so over the rate and queued.
    let sent = send_webhooks(inst.proxy, 0..20, 1, Some(1));
    let ids = queued_ids(&sent);
    let poison = sent[1].id.clone().expect("the poison was queued");
    eventually("the poison is dead", Duration::from_secs(60), || {
        status_of(inst.proxy, &poison)["state"] == "dead"
    });
    let status = status_of(inst.proxy, &poison);
    assert_eq!(status["attempts"], 3, "{status}");
    assert_eq!(status["status"], 500, "{status}");
    let (code, body) = request(inst.admin, "GET", "/v1/queues/hooks/dead", &[], "");
    assert_eq!(code, 200, "{body}");
    let dead: serde_json::Value = serde_json::from_str(&body).unwrap();
    let list = dead["dead_letters"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{body}");
    assert_eq!(list[0]["id"], poison.as_str());
    assert_eq!(list[0]["target"], "/hooks/1");
    eventually("the others arrived", Duration::from_secs(30), || {
        arrived_numbers(&up).len() == 20
    });
    let by_key = arrivals_by_key(&up);
    assert_eq!(by_key.get(&poison), Some(&3));
    for id in ids.iter().filter(|id| **id != poison) {
        assert_eq!(by_key.get(id), Some(&1), "{id}");
    }
    let died = "tollgate_queue_dead_letters_total{policy=\"hooks\"}";
    assert_eq!(inst.metric(died), 1.0);
    eventually(
        "the gauge counts the dead letter",
        Duration::from_secs(10),
        || inst.metric(DEAD) == 1.0,
    );

    // Re-driven once the upstream takes it: delivered, and the gauge falls; the count of
    // messages that died stays.
    up.cure();
    let path = format!("/v1/queues/hooks/dead/{poison}/redrive");
    let admin_host = inst.admin.to_string();
    let (code, body) = request(inst.admin, "POST", &path, &[("Host", &admin_host)], "");
    assert_eq!(code, 200, "{body}");
    eventually("the poison is delivered", Duration::from_secs(30), || {
        status_of(inst.proxy, &poison)["state"] == "delivered"
    });
    assert_eq!(arrivals_by_key(&up).get(&poison), Some(&4));
    eventually("the gauge falls", Duration::from_secs(10), || {
        inst.metric(DEAD) == 0.0
    });
    assert_eq!(inst.metric(died), 1.0);
}
