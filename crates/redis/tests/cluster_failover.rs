//! A Cluster master killed under traffic: the limiter keeps answering (by `on_error`) and, once
//! the replica is promoted, decides in Redis again, on the new master.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, SystemTime};

use common::RedisCluster;
use tollgate::testing::unique;
use tollgate::{Check, Policy, Quota, Store, Timestamp};
use tollgate_redis::{OnError, RedisConfig, RedisStore};

fn wall() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_killed_then_replica_promoted() {
    let mut cluster = RedisCluster::start();
    let mut config = RedisConfig::cluster(&cluster.seeds());
    config.on_error = OnError::Local;
    config.timeout = Duration::from_millis(200);
    let store = RedisStore::new(config).await.unwrap();
    let policy = Policy::new(
        &unique("failover"),
        Quota::fixed_window(1_000_000, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    let key = b"failover-key";
    let check = [Check::new(&policy, key, 1)];
    for _ in 0..10 {
        assert!(store.apply_redis(wall(), &check).await.unwrap().allowed());
    }
    let name = store.key_of(&check[0]);
    let slot: u16 = cluster.nodes[0]
        .command(&["CLUSTER", "KEYSLOT", &name])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let old_master = cluster.master_of(slot).port;
    // Replication is asynchronous: writes acknowledged by the master but not yet on its replica
    // are lost when it dies, as Redis documents. The test is about the limiter across a
    // failover, so it waits until the replica has everything the master has before the crash.
    let synced = common::eventually(Duration::from_secs(10), || {
        let info = cluster.master_of(slot).command(&["INFO", "replication"]);
        async move { info.as_deref().is_some_and(replica_caught_up) }
    })
    .await;
    assert!(synced, "the replica never caught up with its master");
    tokio::task::block_in_place(|| cluster.master_of(slot).kill());

    // The limiter keeps answering throughout; Redis decides again once a replica took over.
    let back = common::eventually(Duration::from_secs(20), || async {
        let d = store.apply(wall(), &check).await.unwrap();
        assert!(d.allowed(), "on_error = local admits meanwhile");
        match store.apply_redis(wall(), &check).await {
            Ok(_) => true,
            Err(e) => {
                eprintln!("still failing over: {e}");
                false
            }
        }
    })
    .await;
    assert!(back, "no decision from Redis 20 s after the master died");
    // Every node learns of the promotion by gossip: poll until the one asked knows.
    let promoted = common::eventually(Duration::from_secs(10), || {
        let port = cluster.master_port(slot);
        async move { port.is_some_and(|p| p != old_master) }
    })
    .await;
    assert!(
        promoted,
        "the cluster never showed a new master for the slot"
    );
    // The promoted replica had the replicated state: the count continued, it did not restart.
    let d = store
        .apply_redis(wall(), &[Check::new(&policy, key, 0)])
        .await
        .unwrap();
    let remaining = d.as_slice()[0].remaining;
    assert!(
        remaining <= 1_000_000 - 11,
        "the count restarted from scratch: remaining {remaining}"
    );
}

/// Whether a master's `INFO replication` shows a replica at the master's own offset.
fn replica_caught_up(info: &str) -> bool {
    let field = |line: &str, key: &str| -> Option<u64> {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
    };
    let master = info
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .and_then(|v| v.trim().parse::<u64>().ok());
    let replica = info
        .lines()
        .filter(|l| l.starts_with("slave"))
        .filter_map(|l| field(l, "offset="))
        .max();
    matches!((master, replica), (Some(m), Some(r)) if r >= m)
}
