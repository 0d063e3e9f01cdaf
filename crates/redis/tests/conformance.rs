//! The store conformance suite against real Redis: a standalone server and a Cluster of 3
//! masters with a replica each, both with the caller's clock (`clock = local`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::OnceLock;

use common::{RedisCluster, RedisServer};

/// One server for the whole binary: the scenarios use per-run unique names, so they can share.
fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

mod standalone {
    tollgate::store_conformance_tests!(|| async {
        super::common::local_store(&super::server().url()).await
    });
}

mod cluster {
    tollgate::store_conformance_tests!(|| async {
        super::common::local_cluster_store(&super::cluster().seeds()).await
    });

    use std::time::Duration;
    use tollgate::testing::{T0, unique};
    use tollgate::{Check, Policy, Quota, Store};

    /// Checks keyed on different values land in different slots; a denial in a later slot
    /// refunds what the earlier slots committed (the one exception to all-or-nothing, made good afterwards).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_denial_in_one_slot_refunds_the_others() {
        let store = super::common::local_cluster_store(&super::cluster().seeds()).await;
        let roomy = Policy::new(
            &unique("xslot-roomy"),
            Quota::fixed_window(10, Duration::from_secs(60)).unwrap(),
        )
        .unwrap();
        let tight = Policy::new(
            &unique("xslot-tight"),
            Quota::fixed_window(1, Duration::from_secs(60)).unwrap(),
        )
        .unwrap();
        // Find two keys in different slots.
        let a = unique("xslot-a");
        let mut b = unique("xslot-b");
        let slot_of = |k: &str| {
            let name = store.key_of(&Check::new(&roomy, k.as_bytes(), 1));
            let out = std::process::Command::new("redis-cli")
                .args(["-p", &super::cluster().nodes[0].port.to_string()])
                .args(["CLUSTER", "KEYSLOT", &name])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        while slot_of(&a) == slot_of(&b) {
            b = unique("xslot-b");
        }
        assert!(
            store
                .apply(T0, &[Check::new(&tight, b.as_bytes(), 1)])
                .await
                .unwrap()
                .allowed()
        );
        let batch = [
            Check::new(&roomy, a.as_bytes(), 4),
            Check::new(&tight, b.as_bytes(), 1),
        ];
        let d = store.apply(T0, &batch).await.unwrap();
        assert!(!d.allowed());
        assert!(d.as_slice()[0].allowed, "roomy alone admits");
        assert_eq!(
            d.as_slice()[0].remaining,
            10,
            "reported as it stands: refunded"
        );
        let peek = store
            .apply(T0, &[Check::new(&roomy, a.as_bytes(), 0)])
            .await
            .unwrap();
        assert_eq!(
            peek.as_slice()[0].remaining,
            10,
            "nothing consumed in the other slot"
        );
        // Both admit across slots: both consume.
        let c = unique("xslot-c");
        let batch = [
            Check::new(&roomy, a.as_bytes(), 4),
            Check::new(&tight, c.as_bytes(), 1),
        ];
        let d = store.apply(T0, &batch).await.unwrap();
        assert!(d.allowed());
        assert_eq!(d.as_slice()[0].remaining, 6);
    }
}

/// With the deny cache on, denials answered from memory still deny exactly until retry_after
/// (the scenarios that compare every field with the pure algorithms run without it above:
/// while cached, `remaining` is reported as it was when denied).
mod with_deny_cache {
    use tollgate_redis::{ClockSource, OnError, RedisConfig, RedisStore};

    async fn store() -> RedisStore {
        let mut config = RedisConfig::standalone(&super::server().url());
        config.clock = ClockSource::Local;
        config.on_error = OnError::Deny;
        RedisStore::new(config).await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn retry_after_is_exact() {
        tollgate::testing::retry_after_is_exact(&store().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ban_after_repeated_denials() {
        tollgate::testing::ban_after_repeated_denials(&store().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn admits_the_quota_then_denies() {
        tollgate::testing::admits_the_quota_then_denies(&store().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn costs_and_peeks() {
        tollgate::testing::costs_and_peeks(&store().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leaky_bucket_delays_and_refunds() {
        tollgate::testing::leaky_bucket_delays_and_refunds(&store().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn quota_returns_with_time() {
        tollgate::testing::quota_returns_with_time(&store().await).await;
    }
    /// Concurrency denials are never cached: a release frees a permit at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_release_frees_a_permit() {
        tollgate::testing::concurrency_release_frees_a_permit(&store().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_renewal_takes_no_second_permit() {
        tollgate::testing::concurrency_renewal_takes_no_second_permit(&store().await).await;
    }
}
