//! The queue's connection to Redis (standalone or Cluster, TLS with the `tls` feature), every
//! call bounded by a timeout, scripts run by their SHA-1, and failures sorted into those worth
//! retrying and those not.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use tollgate::StoreError;

use super::Shared;
use crate::RedisConfig;

/// One Lua script and its SHA-1.
pub(super) struct QueueScript {
    text: &'static str,
    sha: String,
}

impl QueueScript {
    pub(super) fn new(text: &'static str) -> Self {
        QueueScript {
            text,
            sha: redis::Script::new(text).get_hash().to_owned(),
        }
    }
}

pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    pub(super) async fn query(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        match self {
            Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

/// A connection to the Redis `config` names, each call bounded by `timeout`.
pub(super) async fn connect(
    config: &RedisConfig,
    timeout: Duration,
) -> Result<Connection, StoreError> {
    let unavailable = |e: RedisError| StoreError::Unavailable {
        reason: e.to_string(),
    };
    Ok(if config.cluster {
        #[allow(unused_mut)]
        let mut builder = ClusterClientBuilder::new(config.nodes.clone());
        #[cfg(feature = "tls")]
        if let Some(pem) = &config.tls_root_cert_pem {
            builder = builder.certs(tls_certificates(pem));
        }
        let client = builder
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()
            .map_err(unavailable)?;
        let connection = tokio::time::timeout(timeout, client.get_async_connection())
            .await
            .map_err(|_| StoreError::Timeout { after: timeout })?
            .map_err(unavailable)?;
        Connection::Cluster(connection)
    } else {
        let url = config.nodes.first().map_or("", String::as_str);
        let client = match &config.tls_root_cert_pem {
            #[cfg(feature = "tls")]
            Some(pem) => redis::Client::build_with_tls(url, tls_certificates(pem)),
            _ => redis::Client::open(url),
        }
        .map_err(unavailable)?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Connection::Single(
            ConnectionManager::new_lazy_with_config(client, manager).map_err(unavailable)?,
        )
    })
}

impl Shared {
    /// Runs `script` by its SHA-1, sending its text once when Redis does not have it (a restart,
    /// a failover, a Cluster node that never saw it).
    pub(super) async fn eval(
        &self,
        script: &QueueScript,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<Value, StoreError> {
        let build = |name: &str, first: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(first).arg(keys.len());
            for k in keys {
                cmd.arg(*k);
            }
            for a in &args {
                cmd.arg(a.as_slice());
            }
            cmd
        };
        match self.send(&build("EVALSHA", &script.sha)).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.send(&build("EVAL", script.text)).await
            }
            other => other,
        }
        .map_err(|e| self.classify(e))
    }

    pub(super) async fn query(&self, cmd: &redis::Cmd) -> Result<Value, StoreError> {
        self.send(cmd).await.map_err(|e| self.classify(e))
    }

    /// One command, bounded by the timeout (reported as a timeout error).
    async fn send(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        let after = self.timeout;
        tokio::time::timeout(after, self.connection.query(cmd))
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer from Redis in time",
                )))
            })
    }

    /// Whether a failure is worth retrying (Redis away, slow, failing over) or not: the store's
    /// rule, with a timeout reported as one (with this queue's bound).
    fn classify(&self, e: RedisError) -> StoreError {
        if e.is_timeout() {
            return StoreError::Timeout {
                after: self.timeout,
            };
        }
        crate::store::classify(e)
    }
}

#[cfg(feature = "tls")]
fn tls_certificates(root_pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_pem.to_vec()),
    }
}
