//! The Redis-protocol door on `[server] resp_listen`: `TOLLGATE.CHECK policy key [cost]`
//! decided by the running configuration's engine (the same policies, key rule, overrides,
//! failure rule and metrics as `/v1/check`), and redis-cell's `CL.THROTTLE` over the server's
//! store, under the same failure rule (`[store] on_error`) but no lists and no metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;
use tollgate::{Decision, SystemClock};
use tollgate_resp::{CheckError, CheckReply, Decide, Handler, Plain, Throttle, Transport};

use crate::Shared;
use crate::generation::Disposition;
use crate::serve::Limits;
use crate::store::AnyStore;
use crate::telemetry::{Door, Trace};
use crate::tls::Tls;

/// `TOLLGATE.CHECK` through the generation running when each request arrives.
struct ServerDecide {
    shared: Arc<Shared>,
}

impl Decide for ServerDecide {
    async fn check(&self, policy: &[u8], key: &[u8], cost: u32) -> Result<CheckReply, CheckError> {
        let generation = self.shared.engine();
        let name = std::str::from_utf8(policy).map_err(|_| CheckError::unknown_policy(policy))?;
        if generation
            .policy(name)
            .is_some_and(|p| p.policy.quota().kind() == tollgate::AlgorithmKind::Concurrency)
        {
            // A slot taken here could never be given back: the protocol has no release.
            return Err(CheckError::Other(format!(
                "policy '{name}' limits requests in flight, which this door cannot give back; use POST /v1/check with \"mode\": \"acquire\" and POST /v1/release"
            )));
        }
        let Some(evaluation) = generation
            .check_key(name, key, cost, Trace::root(Door::Resp))
            .await
        else {
            return Err(CheckError::unknown_policy(policy));
        };
        if evaluation.store_failed() {
            // The engine applied `[store] on_error`; answered as every failure of this door.
            return failure_answer(evaluation.allowed()).map(|()| uncounted(true));
        }
        let (decisions, _, disposition) = evaluation.into_parts();
        match disposition {
            // A `delay` policy: the answer has no field for the wait, so it comes when the
            // request's slot does, as forward-auth's 200 does. A caller acting on it at once
            // then goes no faster than the policy's rate.
            Disposition::Hold(hold) => hold.wait().await,
            // Refused before any policy counted it: a deny list (the HTTP doors' 403) is a
            // denial that no wait would lift; anything else is said as the HTTP doors say it.
            Disposition::Respond(answer) if decisions.is_empty() => {
                if answer.status() == hyper::StatusCode::FORBIDDEN {
                    return Ok(uncounted(false));
                }
                return Err(CheckError::Other(refusal_text(answer.body())));
            }
            _ => {}
        }
        let decision: Option<Decision> = decisions.into_first();
        // No decision, and not refused: an allow list let the key through uncounted.
        Ok(decision.map_or_else(|| uncounted(true), CheckReply::from))
    }

    /// `CL.THROTTLE`'s store failures, under the same `[store] on_error` as `TOLLGATE.CHECK`
    /// (fixed at start: a reload keeps the running store's settings). `local` never gets here
    /// but for a failed fallback: the store decides from this instance's memory itself.
    fn store_failed(&self, error: tollgate::Error) -> Result<(), CheckError> {
        if !matches!(error.kind(), tollgate::ErrorKind::Store(_)) {
            return Err(error.into());
        }
        failure_answer(self.shared.engine().config().store.on_error.admits())
    }
}

/// The door's one answer to a store that could not decide, once `on_error` has said whether
/// the request is `admitted`: admitted uncounted (`Ok`), or refused as unavailable (the HTTP
/// doors' 503).
fn failure_answer(admitted: bool) -> Result<(), CheckError> {
    if admitted {
        Ok(())
    } else {
        Err(CheckError::store_refused())
    }
}

/// An answer no policy counted (a list decided it, or the store failed open): no quota to
/// report; when refused, never admissible (`retry_after` -1).
fn uncounted(allowed: bool) -> CheckReply {
    CheckReply {
        allowed,
        limit: 0,
        remaining: 0,
        reset: Duration::ZERO,
        retry_after: None,
    }
}

/// The `detail` of an HTTP door's problem body, for an `-ERR` reply.
fn refusal_text(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_owned))
        .unwrap_or_else(|| "the request was refused".to_owned())
}

/// The door over TLS (`[server]`'s files): each handshake within the header read timeout, in
/// the connection's own task.
struct OverTls {
    tls: Arc<Tls>,
    handshake: Duration,
}

impl Transport for OverTls {
    type Io = TlsStream<TcpStream>;

    async fn open(&self, stream: TcpStream, peer: SocketAddr) -> Option<Self::Io> {
        self.tls.accept(stream, peer, self.handshake).await
    }

    fn is_plain(&self) -> bool {
        false
    }
}

/// Serves the door until `stop`, bounded like every listener (connections, drain); over TLS
/// when `[server]` has it.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    mut stop: watch::Receiver<bool>,
    limits: Limits,
    tls: Option<Arc<Tls>>,
) {
    let throttle = match tollgate::Limiter::builder()
        .store(shared.store.clone())
        .clock(SystemClock::new())
        .build()
    {
        Ok(limiter) => Throttle::<AnyStore, SystemClock>::new(limiter),
        Err(e) => {
            tracing::error!(error = %e, "the Redis-protocol door could not start");
            return;
        }
    };
    // The password of the configuration running when a client connects or says AUTH: a
    // reload that changes it applies to new connections, as CONFIG SET requirepass does.
    let source = Arc::clone(&shared);
    let handler = Handler::new(ServerDecide { shared }, throttle)
        .with_password_from(move || source.engine().resp_password());
    let resp_limits = tollgate_resp::Limits {
        max_connections: limits.max_connections,
        drain: limits.drain,
        ..tollgate_resp::Limits::default()
    };
    let shutdown = async move { crate::serve::stopped(&mut stop).await };
    let served = match tls {
        None => tollgate_resp::serve_over(listener, Plain, handler, resp_limits, shutdown).await,
        Some(tls) => {
            let transport = OverTls {
                tls,
                handshake: limits.header_read_timeout,
            };
            tollgate_resp::serve_over(listener, transport, handler, resp_limits, shutdown).await
        }
    };
    if let Err(e) = served {
        tracing::error!(error = %e, "the Redis-protocol door stopped");
    }
}
