//! Readiness of a Cluster store follows the Cluster's own state: a Cluster that lost a master
//! without a replica (`cluster_state:fail`) still answers `PING` on its live nodes while every
//! script is refused with `CLUSTERDOWN`, so `ping` (what `/readyz` asks) must say not ready, and
//! why; it is ready again once the master is back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::RedisCluster;
use tollgate::testing::unique;
use tollgate::{Check, Policy, Quota, Timestamp};
use tollgate_redis::{OnError, RedisConfig, RedisStore};

fn wall() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_cluster_is_not_ready_until_it_serves_again() {
    let mut cluster = RedisCluster::start_with_replicas(0);
    let mut config = RedisConfig::cluster(&cluster.seeds());
    config.on_error = OnError::Deny;
    config.timeout = Duration::from_millis(500);
    let store = RedisStore::new(config).await.unwrap();
    let policy = Policy::new(
        &unique("cluster-ready"),
        Quota::fixed_window(1_000_000, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    let check = [Check::new(&policy, b"ready-key", 1)];
    store.ping().await.expect("a healthy Cluster is ready");
    assert!(store.apply_redis(wall(), &check).await.is_ok());

    // A master with no replica dies: its slots have no owner, and every node goes to
    // cluster_state:fail once the failure is agreed (cluster-node-timeout 1 s).
    let victim = 0;
    tokio::task::block_in_place(|| cluster.nodes[victim].kill_keeping_config());
    let failed = common::eventually(Duration::from_secs(20), || {
        let states: Vec<bool> = cluster
            .nodes
            .iter()
            .filter(|n| n.alive())
            .map(|n| {
                n.command(&["CLUSTER", "INFO"])
                    .is_some_and(|i| i.contains("cluster_state:fail"))
            })
            .collect();
        async move { states.iter().all(|f| *f) }
    })
    .await;
    assert!(failed, "the Cluster never reported cluster_state:fail");

    // Decisions fail (CLUSTERDOWN on the live masters too), and readiness says so, naming
    // the Cluster's state.
    let not_ready = common::eventually(Duration::from_secs(10), || async {
        match store.ping().await {
            Ok(()) => false,
            Err(e) => e.to_string().contains("cluster_state:fail"),
        }
    })
    .await;
    let last = store.ping().await;
    assert!(
        not_ready,
        "ping must fail naming the Cluster's state; it answered {last:?}"
    );
    assert!(
        store.apply_redis(wall(), &check).await.is_err(),
        "decisions fail while the Cluster is down"
    );

    // The master comes back as the same node (its nodes.conf): the Cluster serves again, and
    // the store is ready again by itself.
    tokio::task::block_in_place(|| {
        cluster.nodes[victim].revive();
        cluster.wait_ok(Duration::from_secs(30));
    });
    let ready = common::eventually(Duration::from_secs(20), || async {
        store.ping().await.is_ok()
    })
    .await;
    let last = store.ping().await;
    assert!(ready, "ready again once the Cluster serves: {last:?}");
    let decided = common::eventually(Duration::from_secs(10), || async {
        store.apply_redis(wall(), &check).await.is_ok()
    })
    .await;
    assert!(decided, "decisions come from Redis again");
}
