//! What `grpc.health.v1.Health` on Envoy's listener reports: whether the store answers, as
//! `/readyz` says, probed every second, so a `Watch`ing client hears of Redis going away and
//! coming back within about a second.

use std::time::Duration;

use tokio::sync::watch;

use crate::store::AnyStore;

/// How often the store is probed.
const PROBE: Duration = Duration::from_secs(1);

/// Probes `store` (a Redis `PING`, bounded by the store's timeout) every second and sets
/// `health` from the answer, until `stop`. The memory store always answers: nothing to probe.
pub(crate) async fn probe_store(
    store: AnyStore,
    health: tollgate_envoy::Health,
    mut stop: watch::Receiver<bool>,
) {
    if matches!(store, AnyStore::Memory(_)) {
        return;
    }
    let mut tick = tokio::time::interval(PROBE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = crate::serve::stopped(&mut stop) => return,
        }
        let ready = store.ready().await;
        if ready.is_ok() != health.is_serving() {
            match &ready {
                Ok(()) => tracing::info!("gRPC health: SERVING (the store answers again)"),
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC health: NOT_SERVING (the store does not answer)")
                }
            }
        }
        health.set_serving(ready.is_ok());
    }
}
