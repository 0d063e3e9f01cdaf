//! The connection to Redis: one multiplexed connection that reconnects by itself (standalone),
//! or a Cluster connection made in the background so no call waits longer than its timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::time::Instant;
use tollgate::StoreError;

use super::coalesce::Coalescer;
use crate::config::RedisConfig;

pub(crate) enum Connection {
    /// Reconnects by itself; created lazily, so a Redis that is down at start is no error.
    /// Script calls go through the coalescer, which writes concurrent ones together, within
    /// the store's timeout.
    Single(ConnectionManager, Arc<Coalescer>, Duration),
    Cluster(Arc<ClusterState>),
}

pub(crate) struct ClusterState {
    client: ClusterClient,
    /// Connected in the background, so no call waits longer than its timeout for it.
    conn: RwLock<Option<ClusterConnection>>,
    connecting: AtomicBool,
}

/// A handle for one call: cheap clones of the shared connection. A standalone handle carries
/// the deadline of the script calls made through it: the store's timeout after it was taken.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager, Arc<Coalescer>, Instant),
    Cluster(ClusterConnection),
}

impl Connection {
    /// The client for `config` (validated); connects lazily.
    pub(crate) fn new(config: &RedisConfig, connect_timeout: Duration) -> Result<Self, RedisError> {
        if config.cluster {
            #[allow(unused_mut)]
            let mut builder = ClusterClientBuilder::new(config.nodes.clone());
            #[cfg(feature = "tls")]
            if let Some(pem) = &config.tls_root_cert_pem {
                builder = builder.certs(tls_certificates(pem));
            }
            let client = builder
                .connection_timeout(connect_timeout)
                .response_timeout(config.timeout.max(Duration::from_millis(10)))
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(100)
                .build()?;
            return Ok(Connection::Cluster(Arc::new(ClusterState {
                client,
                conn: RwLock::new(None),
                connecting: AtomicBool::new(false),
            })));
        }
        let url = config.nodes[0].as_str();
        let client = match &config.tls_root_cert_pem {
            #[cfg(feature = "tls")]
            Some(pem) => redis::Client::build_with_tls(url, tls_certificates(pem))?,
            _ => redis::Client::open(url)?,
        };
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // No timer of the client's own: every call through the store is bounded by the
            // store's timeout (the coalescer's deadline per batch, or `RedisStore::bounded`),
            // and a second timer per decision cost about 3% of the store's CPU.
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let manager = ConnectionManager::new_lazy_with_config(client, manager_config)?;
        let coalescer = Arc::new(Coalescer::new(manager.clone()));
        Ok(Connection::Single(manager, coalescer, config.timeout))
    }

    /// Batches of script calls handed to a standalone connection together (0 for a Cluster).
    pub(crate) fn batches(&self) -> u64 {
        match self {
            Connection::Single(_, coalescer, _) => coalescer.batches(),
            Connection::Cluster(_) => 0,
        }
    }

    /// A handle for one call, or `Unavailable` while the Cluster is not connected yet.
    pub(crate) async fn get(&self) -> Result<Conn, StoreError> {
        match self {
            Connection::Single(manager, coalescer, timeout) => {
                // A timeout past the clock's range is as good as none.
                let now = Instant::now();
                let deadline = now
                    .checked_add(*timeout)
                    .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365));
                Ok(Conn::Single(manager.clone(), coalescer.clone(), deadline))
            }
            Connection::Cluster(state) => {
                if let Some(c) = state
                    .conn
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                {
                    return Ok(Conn::Cluster(c.clone()));
                }
                if !state.connecting.swap(true, Ordering::AcqRel) {
                    let state = state.clone();
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    tokio::spawn(async move {
                        let result = state.client.get_async_connection().await;
                        if let Ok(c) = &result {
                            *state.conn.write().unwrap_or_else(|e| e.into_inner()) =
                                Some(c.clone());
                        }
                        state.connecting.store(false, Ordering::Release);
                        let _ = tx.send(result);
                    });
                    if let Ok(Ok(c)) = rx.await {
                        return Ok(Conn::Cluster(c));
                    }
                }
                Err(StoreError::Unavailable {
                    reason: "not connected to the Redis Cluster yet".to_owned(),
                })
            }
        }
    }
}

#[cfg(feature = "tls")]
fn tls_certificates(root_pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_pem.to_vec()),
    }
}

/// Connection trouble and cluster reconfiguration are retryable ([`StoreError::Unavailable`]);
/// anything else Redis says is a [`StoreError::Protocol`].
pub(crate) fn classify(e: RedisError) -> StoreError {
    let retryable = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                        | ServerErrorKind::ReadOnly
                )
        );
    if retryable {
        StoreError::Unavailable {
            reason: e.to_string(),
        }
    } else {
        StoreError::Protocol {
            reason: e.to_string(),
        }
    }
}

/// Whether Redis answered that it does not know the script (a restarted or new node).
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

impl Conn {
    /// Sends `cmd`: with a standalone Redis, in one write with the calls other tasks make at
    /// the same time, by the handle's deadline (see `coalesce.rs`).
    pub(crate) async fn query(&mut self, cmd: Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(_, coalescer, deadline) => coalescer.call(cmd, *deadline).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(c, _, _) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c, _, _) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c, _, _) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
