//! Envoy's rate limit service in the server: built over the server's store, counted in its
//! metrics and traced with its telemetry, served on `[server] grpc_listen`.

use std::sync::Arc;

use tokio::sync::watch;
use tollgate::SystemClock;

use crate::metrics::Metrics;
use crate::store::AnyStore;
use crate::{Config, Limits, ServerError, config, serve, telemetry, tls};

/// Envoy's rate limit service, bounded like the other listeners: `max_connections` at once,
/// the same drain; over TLS (HTTP/2 only) when `[server]` has it.
pub(crate) async fn serve_envoy(
    service: tollgate_envoy::RlsService<AnyStore, SystemClock>,
    listener: tokio::net::TcpListener,
    mut stop: watch::Receiver<bool>,
    limits: Limits,
    tls: Option<Arc<tls::Tls>>,
) {
    let shutdown = async move { serve::stopped(&mut stop).await };
    let options = tollgate_envoy::ServeOptions {
        max_connections: limits.max_connections,
        drain: limits.drain,
    };
    let served = match tls {
        None => tollgate_envoy::serve_with(listener, service, shutdown, options).await,
        Some(tls) => {
            let handshake = move |stream: tokio::net::TcpStream| {
                let tls = Arc::clone(&tls);
                async move {
                    let peer = stream.peer_addr().ok()?;
                    tls.accept(stream, peer, limits.header_read_timeout).await
                }
            };
            tollgate_envoy::serve_with_io(listener, service, shutdown, options, handshake).await
        }
    };
    if let Err(e) = served {
        tracing::error!(error = %e, "Envoy rate limit service stopped");
    }
}

/// Envoy's rate limit service over the server's store.
pub(crate) fn envoy_service(
    config: &Config,
    envoy: &config::Envoy,
    store: &AnyStore,
    metrics: &Arc<Metrics>,
    (gate, telemetry): (tollgate_envoy::AddressGate, &Arc<telemetry::Telemetry>),
) -> Result<tollgate_envoy::RlsService<AnyStore, SystemClock>, ServerError> {
    let rls = rls_config(config, envoy);
    let limiter = tollgate::Limiter::builder()
        .store(store.clone())
        .clock(SystemClock::new())
        .build()
        .map_err(ServerError::EnvoyLimiter)?;
    // Envoy's decisions are counted where every other door's are: per policy and outcome in
    // `/metrics`, and in the top-keys sketches.
    let metrics = Arc::clone(metrics);
    let observer: tollgate_envoy::Observer = Arc::new(move |policy, key, outcome| {
        metrics.decision(policy, outcome);
        let refused = !matches!(
            outcome,
            tollgate::Outcome::Allowed | tollgate::Outcome::FailOpen
        );
        metrics.top.policy(policy).record(key, refused);
    });
    let service = tollgate_envoy::RlsService::new(limiter, &rls)
        .map_err(ServerError::Envoy)?
        .with_observer(observer)
        .with_gate(gate);
    if !telemetry.on() {
        return Ok(service);
    }
    // Each call a span, a child of the trace context Envoy sent with it.
    let telemetry = Arc::clone(telemetry);
    let tracer: tollgate_envoy::CallTracer = Arc::new(move |headers| {
        let trace = telemetry::Trace::from_headers(telemetry::Door::Envoy, headers);
        telemetry
            .begin(&trace)
            .map(|span| Box::new(span) as Box<dyn tollgate_envoy::CallSpan>)
    });
    Ok(service.with_tracer(tracer))
}

/// The Envoy service's configuration: the descriptors and the server's header settings.
pub(crate) fn rls_config(config: &Config, envoy: &config::Envoy) -> tollgate_envoy::Config {
    let h = &config.headers;
    tollgate_envoy::Config::new()
        .domains(envoy.domains.clone())
        .failure_mode(envoy.failure_mode)
        .x_ratelimit_headers(h.legacy)
        .ietf_headers(h.ietf)
        .reset_format(h.reset_format)
}
