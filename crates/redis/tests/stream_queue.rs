//! The Redis Streams queue against real `redis-server` processes: the depth bound holds under
//! concurrent pushers, each message goes to one consumer, a stopped consumer's messages are
//! claimed by another (and the stopped one learns it lost them), a message's life from push
//! to delivered or dead letter and back, scripts reloaded after `SCRIPT FLUSH`, and every key
//! of a queue in one Cluster slot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{RedisCluster, RedisServer};
use tollgate_redis::RedisConfig;
use tollgate_redis::stream_queue::{
    MessageState, NewMessage, Pushed, Redriven, StreamQueue, StreamQueues,
};

const TIMEOUT: Duration = Duration::from_secs(5);

async fn queue(config: &RedisConfig, consumer: &str, name: &str) -> StreamQueue {
    StreamQueues::connect(config, consumer, TIMEOUT)
        .await
        .expect("connect")
        .queue(name)
}

fn message<'a>(id: &'a str, payload: &'a [u8]) -> NewMessage<'a> {
    NewMessage {
        id,
        key: b"tenant-1",
        payload,
        enqueued_ms: 1_000,
    }
}

#[tokio::test]
async fn the_depth_bound_holds_under_concurrent_pushers() {
    let redis = RedisServer::start();
    let config = RedisConfig::standalone(&redis.url());
    let q = queue(&config, "a", "bounded").await;
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let q = q.clone();
            tokio::spawn(async move {
                let id = format!("m{i}");
                q.push(message(&id, b"x"), 50).await.unwrap()
            })
        })
        .collect();
    let mut queued = 0;
    for t in tasks {
        if matches!(t.await.unwrap(), Pushed::Queued(_)) {
            queued += 1;
        }
    }
    assert_eq!(queued, 50);
    assert_eq!(q.stats().await.unwrap().depth, 50);
    // Taken but not finished still counts: the queue stays full.
    assert_eq!(q.read(10).await.unwrap().len(), 10);
    assert_eq!(
        q.push(message("late", b"x"), 50).await.unwrap(),
        Pushed::Full
    );
}

#[tokio::test]
async fn each_message_goes_to_one_consumer_and_a_stopped_ones_are_claimed() {
    let redis = RedisServer::start();
    let config = RedisConfig::standalone(&redis.url());
    let a = queue(&config, "instance-a", "shared").await;
    let b = queue(&config, "instance-b", "shared").await;
    for i in 0..10 {
        let id = format!("m{i}");
        assert!(matches!(
            a.push(message(&id, b"p"), 100).await.unwrap(),
            Pushed::Queued(_)
        ));
    }
    let taken_a = a.read(4).await.unwrap();
    let taken_b = b.read(100).await.unwrap();
    assert_eq!((taken_a.len(), taken_b.len()), (4, 6));
    let ids: HashSet<&str> = taken_a
        .iter()
        .chain(&taken_b)
        .map(|m| m.id.as_str())
        .collect();
    assert_eq!(ids.len(), 10);
    assert!(b.read(100).await.unwrap().is_empty());

    // a is alive (just touched): nothing of it is claimable.
    let entries_a: Vec<&str> = taken_a.iter().map(|m| m.entry.as_str()).collect();
    assert!(a.keep(&entries_a).await.unwrap().is_empty());
    assert!(
        b.claim(10, Duration::from_secs(3600))
            .await
            .unwrap()
            .is_empty()
    );
    // a stops without a word: once its messages are idle past the claim timeout, b takes them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let entries_b: Vec<&str> = taken_b.iter().map(|m| m.entry.as_str()).collect();
    let claimed = loop {
        // b touches its own, as a live instance does, or it would claim them back from itself.
        assert!(b.keep(&entries_b).await.unwrap().is_empty());
        let got = b.claim(10, Duration::from_millis(200)).await.unwrap();
        if !got.is_empty() {
            break got;
        }
        assert!(Instant::now() < deadline, "never claimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut claimed_ids: Vec<&str> = claimed.iter().map(|m| m.id.as_str()).collect();
    let mut expected: Vec<&str> = taken_a.iter().map(|m| m.id.as_str()).collect();
    claimed_ids.sort_unstable();
    expected.sort_unstable();
    assert_eq!(claimed_ids, expected);
    assert_eq!(claimed[0].payload, b"p");
    // a comes back: it learns it lost them, and must not deliver them as its own.
    let mut lost = a.keep(&entries_a).await.unwrap();
    lost.sort_unstable();
    let mut want: Vec<String> = entries_a.iter().map(|e| (*e).to_owned()).collect();
    want.sort_unstable();
    assert_eq!(lost, want);
    // A clean shutdown hands messages over at once.
    b.release(&entries_b, Duration::from_secs(7200))
        .await
        .unwrap();
    let handed = a.claim(100, Duration::from_secs(3600)).await.unwrap();
    assert_eq!(handed.len(), 6);
}

#[tokio::test]
async fn a_message_lives_from_push_to_delivered_or_dead_and_back() {
    let redis = RedisServer::start();
    let config = RedisConfig::standalone(&redis.url());
    let q = queue(&config, "a", "life").await;
    let Pushed::Queued(_) = q.push(message("one", b"body-1"), 10).await.unwrap() else {
        panic!("full")
    };
    let status = q.status("one").await.unwrap().unwrap();
    assert_eq!((status.state, status.attempts), (MessageState::Queued, 0));
    let m = q.read(1).await.unwrap().pop().unwrap();
    assert_eq!(
        (m.id.as_str(), m.key.as_slice(), m.enqueued_ms),
        ("one", &b"tenant-1"[..], 1_000)
    );
    assert_eq!(q.attempt("one", 2_000).await.unwrap(), 1);
    q.note("one", Some(503), "", 2_001).await.unwrap();
    assert_eq!(q.attempt("one", 3_000).await.unwrap(), 2);
    let status = q.status("one").await.unwrap().unwrap();
    assert_eq!(
        (status.state, status.attempts, status.status),
        (MessageState::Delivering, 2, Some(503))
    );
    q.bury(&m, 2, None, "timed out", 4_000).await.unwrap();
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.depth, stats.dead, stats.oldest_ms), (0, 1, None));
    let dead = q.dead_letters(None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (
            dead[0].message.id.as_str(),
            dead[0].attempts,
            dead[0].error.as_deref(),
            dead[0].died_ms
        ),
        ("one", 2, Some("timed out"), 4_000)
    );
    assert_eq!(dead[0].message.payload, b"body-1");
    assert!(
        q.dead_letters(Some(&dead[0].message.entry), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        q.status("one").await.unwrap().unwrap().state,
        MessageState::Dead
    );

    // Re-driven: the same id, fresh attempts, a new entry; then delivered.
    // Not past the queue's bound: a full queue keeps it dead.
    let _ = q.push(message("filler", b"f"), 10).await.unwrap();
    assert_eq!(q.redrive("one", 5_000, 1).await.unwrap(), Redriven::Full);
    let filler = q.read(1).await.unwrap().pop().unwrap();
    q.complete(&filler, 200, 5_000, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(q.redrive("one", 5_000, 1).await.unwrap(), Redriven::Queued);
    assert_eq!(q.redrive("one", 5_000, 1).await.unwrap(), Redriven::NotDead);
    let status = q.status("one").await.unwrap().unwrap();
    assert_eq!(
        (status.state, status.attempts, status.status),
        (MessageState::Queued, 0, None)
    );
    let again = q.read(1).await.unwrap().pop().unwrap();
    assert_eq!(again.id, "one");
    assert_ne!(again.entry, m.entry);
    assert_eq!(q.stats().await.unwrap().oldest_ms, Some(1_000));
    q.complete(&again, 204, 6_000, Duration::from_secs(60))
        .await
        .unwrap();
    let status = q.status("one").await.unwrap().unwrap();
    assert_eq!(
        (status.state, status.status),
        (MessageState::Delivered, Some(204))
    );
    assert_eq!(q.stats().await.unwrap().depth, 0);
    let ttl: i64 = redis
        .command(&["PTTL", &q.stream_key().replace(":stream", ":s:one")])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");

    // Discarded: gone for good; only dead letters can be.
    let _ = q.push(message("two", b"body-2"), 10).await.unwrap();
    let two = q.read(1).await.unwrap().pop().unwrap();
    assert!(!q.discard("two").await.unwrap());
    q.bury(&two, 1, Some(500), "", 7_000).await.unwrap();
    assert!(q.discard("two").await.unwrap());
    assert_eq!(q.status("two").await.unwrap(), None);
    assert_eq!(q.stats().await.unwrap().dead, 0);
    // Ids are key names: anything else is refused, never sent.
    assert!(q.status("../x").await.unwrap().is_none());
    assert!(q.push(message("a b", b""), 10).await.is_err());
}

#[tokio::test]
async fn scripts_come_back_after_a_script_flush() {
    let redis = RedisServer::start();
    let config = RedisConfig::standalone(&redis.url());
    let q = queue(&config, "a", "flushed").await;
    let _ = q.push(message("one", b"p"), 10).await.unwrap();
    assert!(redis.command(&["SCRIPT", "FLUSH"]).is_some());
    assert!(matches!(
        q.push(message("two", b"p"), 10).await.unwrap(),
        Pushed::Queued(_)
    ));
    assert_eq!(q.read(10).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_queue_lives_in_one_cluster_slot() {
    let cluster = RedisCluster::start();
    let config = RedisConfig::cluster(&cluster.seeds());
    // Two queues, whose keys land on (most likely) different nodes, each whole on its own.
    for name in ["webhooks-out", "billing {events}"] {
        let q = queue(&config, "a", name).await;
        let Pushed::Queued(_) = q.push(message("one", b"p"), 10).await.unwrap() else {
            panic!("full")
        };
        let m = q.read(1).await.unwrap().pop().unwrap();
        q.bury(&m, 1, Some(500), "", 2).await.unwrap();
        assert_eq!(q.redrive("one", 3, 10).await.unwrap(), Redriven::Queued);
        let m = q.read(1).await.unwrap().pop().unwrap();
        q.complete(&m, 200, 4, Duration::from_secs(60))
            .await
            .unwrap();
        let s = q.status("one").await.unwrap().unwrap();
        assert_eq!(s.state, MessageState::Delivered);
        assert!(q.stream_key().contains(":{"), "{}", q.stream_key());
    }
}
