//! Live reload: the configuration file (and the Envoy folder) read again on `SIGHUP` and
//! whenever a watched file changes, swapped in whole when it is valid, the running one kept
//! when it is not. What a reload cannot change (the store, listen addresses, listener limits,
//! TLS on or off) is kept and logged as taking effect on restart.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::envoy::rls_config;
use crate::generation::Generation;
use crate::{Config, Limits, ReloadError, Shared, tls};

impl Shared {
    /// Re-reads the configuration from where it came from (its file, its `--envoy-config`
    /// folder); keeps the running one when the new one is bad.
    pub(crate) fn reload(&self) -> Result<(), ReloadError> {
        let current = self.engine();
        let mut config = match current.config().reread() {
            Ok(c) => c,
            Err(e) => {
                self.metrics.reload(false);
                return Err(ReloadError::Config(e));
            }
        };
        let old = current.config();
        if old.store != config.store {
            tracing::warn!(
                "reload: [store] changes take effect on restart; the running store is kept"
            );
            // Its settings too (failure mode, key secret): a new key secret would silently
            // start every counter afresh.
            config.store = old.store.clone();
        }
        let descriptors = |c: &Config| {
            c.envoy
                .as_ref()
                .map(|e| (e.domains.clone(), e.failure_mode))
        };
        let envoy_changed =
            descriptors(old) != descriptors(&config) || old.headers != config.headers;
        let envoy_reload = match (&self.envoy, &config.envoy) {
            (Some(service), Some(envoy)) if envoy_changed => {
                Some((service, rls_config(&config, envoy)))
            }
            (None, Some(_)) | (Some(_), None) if envoy_changed => {
                tracing::warn!(
                    "reload: turning Envoy's rate limit service on or off takes effect on restart"
                );
                None
            }
            _ => None,
        };
        if old.listen != config.listen
            || old.admin_listen != config.admin_listen
            || old.proxy.as_ref().map(|p| p.listen) != config.proxy.as_ref().map(|p| p.listen)
        {
            tracing::warn!("reload: listen address changes take effect on restart");
        }
        if tls::turned_on_or_off(old, &config) {
            tracing::warn!(
                "reload: turning TLS on or off for a listener takes effect on restart; new \
                 certificate files are picked up now"
            );
        }
        if !same_limits(&old.limits, &config.limits) {
            tracing::warn!("reload: listener limit changes take effect on restart");
        }
        let engine = Generation::new(
            Arc::new(config),
            self.store.clone(),
            Arc::clone(&self.metrics),
            Arc::clone(&self.telemetry),
        )
        .map_err(|e| {
            self.metrics.reload(false);
            ReloadError::Engine(e)
        })?;
        // Swapped only after the engine was built, and before it is installed: a bad descriptor
        // tree leaves both the descriptors and the engine as they were.
        if let Some((service, rls)) = envoy_reload {
            service.reload(&rls).map_err(|e| {
                self.metrics.reload(false);
                ReloadError::Envoy(e)
            })?;
        }
        let engine = Arc::new(engine);
        // The overrides go into the new engine before it serves, and no change to them can
        // land on the old one in between.
        self.lists.install_then(&engine, || {
            self.overrides
                .install_then(&engine, || self.engine.store(Arc::clone(&engine)));
        });
        self.metrics.reload(true);
        Ok(())
    }
}

/// Whether two sets of listener limits are the same.
fn same_limits(a: &Limits, b: &Limits) -> bool {
    a.header_read_timeout == b.header_read_timeout
        && a.max_header_bytes == b.max_header_bytes
        && a.max_connections == b.max_connections
        && a.idle_timeout == b.idle_timeout
        && a.drain == b.drain
}

/// Reloads on SIGHUP and whenever a watched file changes, appears or goes (checked every
/// second): the configuration file and every envoyproxy/ratelimit file of the Envoy folder,
/// subfolders included, as envoyproxy/ratelimit reloads its runtime directory.
pub(crate) async fn watch_config(
    shared: Arc<Shared>,
    #[cfg(unix)] mut hup: Option<tokio::signal::unix::Signal>,
    #[cfg(not(unix))] _hup: Option<()>,
    mut stop: watch::Receiver<bool>,
) {
    // What the running configuration was read from, not the files now: an edit made while
    // the server started is a change to take in.
    let mut last = shared.engine().config().read_from();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        #[cfg(unix)]
        let hup_signal = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let hup_signal = std::future::pending::<()>();
        let forced = tokio::select! {
            _ = tick.tick() => false,
            _ = hup_signal => true,
            _ = crate::serve::stopped(&mut stop) => return,
        };
        let engine = shared.engine();
        let config = engine.config();
        if config.source.is_none() && config.envoy_dir.is_none() {
            if forced {
                tracing::info!("SIGHUP: running on the built-in default; nothing to reload");
            }
            continue;
        }
        let now = config.files_now();
        if !forced && now == last {
            continue;
        }
        // Read before the reload reads them: an edit landing in between differs from `last`
        // at the next look, and is taken in then.
        last = now;
        let from = from_text(config);
        match shared.reload() {
            Ok(()) => {
                tracing::info!(from = %from, "configuration reloaded");
                // The new configuration may watch other files (another Envoy folder).
                last = shared.engine().config().read_from();
            }
            Err(e) => tracing::error!(
                from = %from,
                "configuration rejected; the running one stays:\n{e}"
            ),
        }
    }
}

/// Where `config` is read from, for the logs.
fn from_text(config: &Config) -> String {
    let mut parts: Vec<String> = config
        .source
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    parts.extend(
        config
            .envoy
            .iter()
            .map(|e| e.config_dir.display().to_string()),
    );
    parts.join(" and ")
}
