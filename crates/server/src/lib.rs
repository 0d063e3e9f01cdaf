//! The Tollgate server as a library: configuration, the decision API (`/v1/check`,
//! `/v1/forward-auth`), the admin listener, the reverse proxy and live reload.
//!
//! Mini-redis style: the caller binds the listeners and hands in a shutdown future, so tests run
//! the whole server on `127.0.0.1:0`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = tollgate_server::Config::builtin();
//! let listeners = tollgate_server::Listeners::bind(&config).await?;
//! tollgate_server::run(config, listeners, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

mod admin;
mod api;
mod envoy;
pub use tollgate_config as config;
mod generation;
mod health;
mod metrics;
mod queue;
mod relay;
mod reload;
mod resp;
mod response;
mod serve;
mod sharded;
mod state;
pub mod store;
mod telemetry;
mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate::{Clock, SystemClock};

pub use config::{Config, ConfigError, Diagnostic, Diagnostics};
pub use tollgate_config::http_engine;

use crate::generation::Generation;
pub use serve::Limits;

use crate::admin::overrides::registry::{self, Backend, Registry};
use crate::envoy::{envoy_service, serve_envoy};
use crate::metrics::Metrics;
use crate::reload::watch_config;
use crate::store::{AnyStore, StoreSetupError};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The store could not be set up.
    #[error(transparent)]
    Store(#[from] StoreSetupError),
    /// The Envoy descriptors could not be compiled.
    #[error("cannot start Envoy's rate limit service: {0}")]
    Envoy(#[source] tollgate_envoy::ConfigError),
    /// The limiter under Envoy's rate limit service could not be built.
    #[error("cannot start Envoy's rate limit service: {0}")]
    EnvoyLimiter(#[source] tollgate::Error),
    /// The policies could not be loaded into the engine.
    #[error("cannot build the policy engine: {0}")]
    Engine(#[from] tollgate_http::ConfigError),
    /// The state file (`[store] path`) cannot be written: checked at start, so that a server
    /// that could never keep its state does not run as if it did; and at a clean stop, when
    /// the last snapshot failed (the exit status says so).
    #[error("[store] path: {0}")]
    State(String),
    /// A listener's TLS files could not be loaded.
    #[error("cannot serve the {listener} listener over TLS: {source}")]
    Tls {
        /// The listener: `api`, `admin`, `proxy` or `grpc`.
        listener: &'static str,
        /// Which file, and why.
        source: config::TlsError,
    },
}

/// Why a reload was rejected (the running configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file (or the Envoy folder) could not be read or is not valid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The policies could not be loaded into the engine.
    #[error("{0}")]
    Engine(#[source] tollgate_http::ConfigError),
    /// The Envoy descriptors could not be compiled.
    #[error("[envoy] {0}")]
    Envoy(#[source] tollgate_envoy::ConfigError),
}

/// The bound listeners the server runs on.
#[derive(Debug)]
pub struct Listeners {
    /// The decision API (`[server] listen`).
    pub api: TcpListener,
    /// The admin endpoints (`[admin] listen`).
    pub admin: TcpListener,
    /// The reverse proxy (`[proxy] listen`), when configured.
    pub proxy: Option<TcpListener>,
    /// Envoy's rate limit service (`[server] grpc_listen`), when configured.
    pub grpc: Option<TcpListener>,
    /// The Redis-protocol door (`[server] resp_listen`), when configured.
    pub resp: Option<TcpListener>,
}

/// The addresses the listeners are bound to (useful with port 0).
#[derive(Clone, Copy, Debug)]
pub struct Addrs {
    /// The decision API.
    pub api: Option<SocketAddr>,
    /// The admin endpoints.
    pub admin: Option<SocketAddr>,
    /// The reverse proxy.
    pub proxy: Option<SocketAddr>,
    /// Envoy's rate limit service.
    pub grpc: Option<SocketAddr>,
    /// The Redis-protocol door.
    pub resp: Option<SocketAddr>,
}

impl Listeners {
    /// Binds the addresses `config` names.
    pub async fn bind(config: &Config) -> Result<Listeners, ServerError> {
        // The accept queue holds a burst of new connections while the accept loop catches up
        // (or while max_connections are busy): a client past it has its SYN dropped and waits a
        // full second to retry. As large as the connection limit, within what the kernel
        // allows (it caps the value at net.core.somaxconn, 4096 on current Linux).
        let backlog =
            u32::try_from(config.limits.max_connections.clamp(1024, 65_535)).unwrap_or(65_535);
        fn listen(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
            let socket = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            // As `TcpListener::bind` does: a restart may rebind while old connections linger in
            // TIME_WAIT.
            #[cfg(unix)]
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(backlog)
        }
        let one = |addr: SocketAddr| {
            listen(addr, backlog).map_err(|source| ServerError::Bind { addr, source })
        };
        Ok(Listeners {
            api: one(config.listen)?,
            admin: one(config.admin_listen)?,
            proxy: config.proxy.as_ref().map(|p| one(p.listen)).transpose()?,
            grpc: config.grpc_listen.map(one).transpose()?,
            resp: config.resp_listen.map(one).transpose()?,
        })
    }

    /// The addresses actually bound.
    pub fn local_addrs(&self) -> Addrs {
        Addrs {
            api: self.api.local_addr().ok(),
            admin: self.admin.local_addr().ok(),
            proxy: self.proxy.as_ref().and_then(|p| p.local_addr().ok()),
            grpc: self.grpc.as_ref().and_then(|p| p.local_addr().ok()),
            resp: self.resp.as_ref().and_then(|p| p.local_addr().ok()),
        }
    }
}

/// State every listener shares; the engine is swapped whole on reload.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The running engine: read without a lock on every request, replaced whole on reload.
    engine: ArcSwap<Generation>,
    store: AnyStore,
    metrics: Arc<Metrics>,
    /// Envoy's rate limit service, kept so a reload can swap its descriptors in place.
    envoy: Option<tollgate_envoy::RlsService<AnyStore, SystemClock>>,
    /// The queues of `queue` policies.
    queues: queue::Queues,
    /// Per-key overrides, installed into every engine generation.
    overrides: Registry,
    /// Live entries of the allow and deny lists, installed into every engine generation.
    lists: admin::lists::registry::Registry,
    /// Where queued requests are delivered: the relay's HTTP/1.1 client.
    upstream: Arc<dyn queue::Deliver>,
    /// Where decisions' spans go ([telemetry]; fixed at start).
    telemetry: Arc<telemetry::Telemetry>,
    /// Set when shutdown begins: `/readyz` answers 503 while the other listeners drain, and
    /// the admin listener stays up until they have.
    draining: std::sync::atomic::AtomicBool,
    /// The TLS listeners, for their certificates' expiry on `/metrics`.
    certificates: Vec<Arc<tls::Tls>>,
}

impl Shared {
    pub(crate) fn engine(&self) -> Arc<Generation> {
        self.engine.load_full()
    }
}

/// Runs the server on `listeners` until `shutdown` completes, then drains in-flight requests.
/// The listeners are bounded by the configuration's [`Config::limits`].
///
/// When the configuration came from a file, it is reloaded on SIGHUP and when the file changes
/// (checked every second).
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    run_serving(config, listeners, shutdown, || {}).await
}

/// [`run`], calling `serving` once every listener serves: the store is connected, the state
/// file restored and the engine built. What a service manager's readiness means (systemd's
/// `READY=1`): the listeners accept connections as soon as they are bound, but answer only
/// from then on, and restoring may first wait for another server's lock on the state file.
pub async fn run_serving(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
    serving: impl FnOnce(),
) -> Result<(), ServerError> {
    let limits = config.limits;
    serve_until(config, listeners, shutdown, limits, serving).await
}

/// [`run`] with explicit listener [`Limits`], in place of the configuration's.
pub async fn run_with(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
) -> Result<(), ServerError> {
    serve_until(config, listeners, shutdown, limits, || {}).await
}

async fn serve_until(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    serving: impl FnOnce(),
) -> Result<(), ServerError> {
    // A state file first: it may hold the key secret the engine hashes credentials under.
    state::check_writable(&config.store).map_err(ServerError::State)?;
    // Held until this function returns, after the last snapshot.
    let _state_lock = state::lock(&config.store)
        .await
        .map_err(ServerError::State)?;
    let (restored_store, restored) = state::restore(&config.store);
    let store = match restored_store {
        Some(memory) => AnyStore::Memory(memory),
        None => AnyStore::from_config(&config.store).await?,
    };
    if config.store.kind == config::StoreKind::Redis && config.store.key_secret.is_none() {
        tracing::warn!(
            "[store] key_secret_env is not set: keys are hashed with the public built-in secret, so \
             whoever can read the Redis data can test guessed API keys against it; set \
             key_secret_env to a variable holding the same secret on every instance"
        );
    }
    let tls = tls::ListenerTls::new(&config)?;
    let metrics = Arc::new(Metrics::default());
    let telemetry = Arc::new(telemetry::Telemetry::start(
        &config.telemetry,
        &tollgate_config::key_hash_secret(&config.store),
    ));
    // Envoy's door consults the running engine's lists; the engine is known once `shared` is.
    let running: Arc<std::sync::OnceLock<std::sync::Weak<Shared>>> = Arc::default();
    let gate: tollgate_envoy::AddressGate = {
        let running = Arc::clone(&running);
        Arc::new(move |ip| running.get()?.upgrade()?.engine().envoy_gate(ip))
    };
    let envoy = match (&config.envoy, listeners.grpc) {
        (Some(e), Some(l)) => Some((
            envoy_service(&config, e, &store, &metrics, (gate, &telemetry))?,
            l,
        )),
        _ => None,
    };
    let envoy_handle = envoy.as_ref().map(|(service, _)| service.clone());
    let queues = queue::Queues::new(&config.store);
    let engine = Generation::new(
        Arc::new(config),
        store.clone(),
        Arc::clone(&metrics),
        Arc::clone(&telemetry),
    )?;
    let overrides = Registry::new(Backend::of(&store));
    let lists = admin::lists::registry::Registry::new(Backend::of(&store));
    let shared = Arc::new(Shared {
        engine: ArcSwap::from_pointee(engine),
        store: store.clone(),
        metrics,
        envoy: envoy_handle,
        queues,
        overrides,
        lists,
        upstream: Arc::new(relay::Upstream::default()),
        telemetry,
        draining: std::sync::atomic::AtomicBool::new(false),
        certificates: tls.all(),
    });
    let _ = running.set(Arc::downgrade(&shared));
    queue::open_configured(&shared).await;
    state::apply(&shared, restored);
    let (stop_tx, stop_rx) = watch::channel(false);
    // Registered before anything is served, so a SIGHUP never finds the default action (exit).
    #[cfg(unix)]
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    #[cfg(not(unix))]
    let hup: Option<()> = None;

    // The admin listener stops last, on a signal of its own: its probes and metrics answer
    // while the other listeners drain.
    let (admin_stop_tx, admin_stop_rx) = watch::channel(false);
    // Before the admin listener serves: its /metrics has the snapshot series from the start.
    state::spawn_keeper(&shared, stop_rx.clone());
    let admin = spawn_admin(&shared, listeners.admin, &tls, admin_stop_rx, limits);
    let mut tasks = spawn_listeners(&shared, listeners.api, &tls, &stop_rx, limits);
    if let Some(l) = listeners.proxy {
        let s = Arc::clone(&shared);
        let t = tls.proxy.clone();
        tasks.spawn(relay::serve_per_core(s, l, stop_rx.clone(), limits, t));
    }
    if let Some((service, listener)) = envoy {
        // Envoy's health checks and watches say what `/readyz` says, from the first call on.
        let health = service.health().clone();
        health.set_serving(store.ready().await.is_ok());
        tokio::spawn(health::probe_store(store.clone(), health, stop_rx.clone()));
        let t = tls.grpc.clone();
        tasks.spawn(serve_envoy(service, listener, stop_rx.clone(), limits, t));
    }
    if let Some(listener) = listeners.resp {
        tasks.spawn(resp::serve(
            Arc::clone(&shared),
            listener,
            stop_rx.clone(),
            limits,
            tls.resp.clone(),
        ));
    }
    tokio::spawn(purge_idle_keys(Arc::clone(&shared), stop_rx.clone()));
    tokio::spawn(live_operations(Arc::clone(&shared), stop_rx.clone()));
    tokio::spawn(watch_config(Arc::clone(&shared), hup, stop_rx.clone()));
    let s = Arc::clone(&shared);
    tokio::spawn(tls::watch_files(
        tls.watched(),
        move || s.engine(),
        stop_rx.clone(),
    ));
    serving();

    shutdown.await;
    tracing::info!(
        drain_timeout = ?limits.drain,
        "shutting down: draining in-flight requests"
    );
    shared
        .draining
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    let _ = admin_stop_tx.send(true);
    let _ = admin.await;
    // Every listener has drained: hand the unspent units of hot-key leases back to Redis, so
    // they do not stay taken from the other instances until the leases end.
    if let Err(e) = shared.store.return_leases(SystemClock::new().now()).await {
        tracing::warn!(error = %e, "shutdown: could not give every lease back to the store");
    }
    // With `[store] path`, the memory store's state, now that nothing changes it any more.
    let saved = state::save_at_stop(&shared).await;
    // The spans not yet exported go now (the exporter waits on its own thread).
    let telemetry = Arc::clone(&shared.telemetry);
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    saved.map_err(ServerError::State)
}

/// The admin listener, a task that ends when `stop` turns true and its connections have
/// drained.
fn spawn_admin(
    shared: &Arc<Shared>,
    admin: tokio::net::TcpListener,
    tls: &tls::ListenerTls,
    stop: watch::Receiver<bool>,
    limits: Limits,
) -> tokio::task::JoinHandle<()> {
    let s = Arc::clone(shared);
    tokio::spawn(serve::serve(
        "admin",
        admin,
        move |peer, req| admin::handle(Arc::clone(&s), peer, req),
        stop,
        limits,
        tls.admin.clone(),
        None::<Arc<serve::quick::Never>>,
    ))
}

/// The decision API's listener and the queue supervisor, each a task that ends when `stop`
/// turns true and its connections have drained.
fn spawn_listeners(
    shared: &Arc<Shared>,
    api: tokio::net::TcpListener,
    tls: &tls::ListenerTls,
    stop: &watch::Receiver<bool>,
    limits: Limits,
) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let s = Arc::clone(shared);
    tasks.spawn(serve::serve(
        "api",
        api,
        move |peer, req| api::handle(Arc::clone(&s), peer, req),
        stop.clone(),
        limits,
        tls.api.clone(),
        Some(Arc::new(api::QuickCheck(Arc::clone(shared)))),
    ));
    tasks.spawn(queue::supervise(
        Arc::clone(shared),
        stop.clone(),
        limits.drain,
    ));
    tasks
}

/// Housekeeping: purges the idle keys of the memory stores every 10 seconds.
async fn purge_idle_keys(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let clock = SystemClock::new();
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = tick.tick() => shared.store.purge(clock.now()),
            _ = serve::stopped(&mut stop) => break,
        }
    }
}

/// The admin listener's live operations: moves the top-keys sketches to each new minute, and
/// keeps the overrides current (with Redis, a change another instance made is applied here
/// within one poll; in memory, expired ones are dropped).
async fn live_operations(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(registry::POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = crate::serve::stopped(&mut stop) => return,
        }
        let now = crate::admin::top::unix_secs();
        shared.metrics.top.tick(now);
        let polled = match shared.overrides.poll(now, || shared.engine()).await {
            Ok(()) => shared.lists.poll(now, || shared.engine()).await,
            Err(e) => Err(e),
        };
        match polled {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("overrides and lists: reading them from the store again");
            }
            Ok(()) => {}
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "overrides and lists: cannot read them from the store; the last ones read stay");
            }
            Err(_) => {}
        }
    }
}
