//! The TLS tests' certificates (made with rcgen: CAs, server and client certificates) and
//! clients (HTTP/1.1 and gRPC over tokio-rustls), on real sockets.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::{CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// How long any one exchange may take before the test calls it a hang.
pub const NO_HANG: Duration = Duration::from_secs(20);

/// Redis clients offer no application protocol.
pub const NO_ALPN: &[&[u8]] = &[];

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM, and the certificate's DER to compare with what a peer shows.
#[derive(Clone)]
pub struct Leaf {
    pub cert: String,
    pub key: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A server certificate for `localhost` and 127.0.0.1, named `name` (each with a key,
    /// and so a serial, of its own).
    pub fn server(&self, name: &str) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.leaf(params)
    }

    /// [`server`](Self::server), valid until `not_after`.
    pub fn server_until(&self, name: &str, not_after: time::OffsetDateTime) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_after = not_after;
        self.leaf(params)
    }

    /// A client certificate named `name`.
    pub fn client(&self, name: &str) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.leaf(params)
    }

    fn leaf(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

/// A fresh folder under the system's temporary directory.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `leaf` as `dir/server.pem` and `dir/server.key`.
pub fn install(dir: &Path, leaf: &Leaf) {
    std::fs::write(dir.join("server.pem"), &leaf.cert).unwrap();
    std::fs::write(dir.join("server.key"), &leaf.key).unwrap();
}

/// A listener's TLS fields: `dir/server.pem` and `dir/server.key`, and `dir/ca.pem` as the
/// client CA when `mtls`.
pub fn tls_fields(dir: &Path, mtls: bool) -> String {
    let mut tls = format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        dir.join("server.pem"),
        dir.join("server.key")
    );
    if mtls {
        tls.push_str(&format!("client_ca = {:?}\n", dir.join("ca.pem")));
    }
    tls
}

/// A client configuration trusting `trust`, presenting `cert` when given, offering `alpn`.
pub fn client_config(trust: &Ca, cert: Option<&Leaf>, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trust.der()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match cert {
        None => builder.with_no_client_auth(),
        Some(leaf) => builder
            .with_client_auth_cert(
                vec![leaf.der.clone()],
                PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A TLS connection to `addr` as `localhost`.
pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// The certificate the server at `addr` shows a new connection.
pub async fn served_cert(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> CertificateDer<'static> {
    let tls = tokio::time::timeout(NO_HANG, connect(addr, config))
        .await
        .unwrap()
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

/// An HTTP/1.1 connection over TLS.
pub struct Https {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Https {
    pub async fn open(
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<Https, String> {
        let tls = connect(addr, config)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        Ok(Https { send })
    }

    /// Sends one request; its status and body.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<(u16, String), String> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        self.send.ready().await.map_err(|e| format!("ready: {e}"))?;
        let res = self
            .send
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        status_and_body(res).await
    }
}

/// A response's status and its body as text.
async fn status_and_body(
    res: hyper::Response<hyper::body::Incoming>,
) -> Result<(u16, String), String> {
    let status = res.status().as_u16();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// One request on a new TLS connection, within [`NO_HANG`].
pub async fn https(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    tokio::time::timeout(NO_HANG, async {
        Https::open(addr, config)
            .await?
            .request(method, path, body)
            .await
    })
    .await
    .expect("an answer or an error, not a hang")
}

/// One request over HTTP/2 on a new TLS connection, within [`NO_HANG`]: the protocol ALPN
/// chose, then the status and body. Errs when the handshake or the request fails.
pub async fn https2(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(Option<Vec<u8>>, u16, String), String> {
    tokio::time::timeout(NO_HANG, async {
        let tls = connect(addr, config)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(tls),
        )
        .await
        .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("https://localhost{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let res = send
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let (status, body) = status_and_body(res).await?;
        Ok((alpn, status, body))
    })
    .await
    .expect("an answer or an error, not a hang")
}

/// tonic's connector for a channel over tokio-rustls.
#[derive(Clone)]
struct TlsConnector {
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
}

impl tonic::codegen::Service<hyper::Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: hyper::Uri) -> Self::Future {
        let (addr, config) = (self.addr, Arc::clone(&self.config));
        Box::pin(async move { connect(addr, config).await.map(TokioIo::new) })
    }
}

/// A gRPC client of the rate limit service at `addr` over TLS (HTTP/2 by ALPN).
pub async fn grpc_client(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<tollgate_envoy::RlsClient, String> {
    let connector = TlsConnector { addr, config };
    let channel = tokio::time::timeout(
        NO_HANG,
        tonic::transport::Endpoint::from_static("http://localhost")
            .connect_with_connector(connector),
    )
    .await
    .expect("connected or refused, not a hang")
    .map_err(|e| format!("connect: {e}"))?;
    Ok(tollgate_envoy::RlsClient::new(channel))
}

/// One command over a new TLS connection, and its whole reply (an array of integers, an
/// error, a status). `Err` when the connection fails or closes first (a refused certificate
/// shows there under TLS 1.3: after the client's side of the handshake).
pub async fn resp_command(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    args: &[&str],
) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = connect(addr, config)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut command = format!("*{}\r\n", args.len());
    for a in args {
        command.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    tls.write_all(command.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    tls.flush().await.map_err(|e| format!("flush: {e}"))?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let text = String::from_utf8_lossy(&reply).into_owned();
        // An array of n integers is done after 1 + n lines; anything else after one.
        let lines = text.matches("\r\n").count();
        let want = match text.strip_prefix('*') {
            Some(rest) => {
                1 + rest
                    .split("\r\n")
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            }
            None => 1,
        };
        if lines >= want && !text.is_empty() {
            return Ok(text);
        }
        let read = tokio::time::timeout(NO_HANG, tls.read(&mut buf))
            .await
            .map_err(|_| "no reply in time".to_owned())?;
        match read {
            Ok(0) => return Err(format!("closed after {text:?}")),
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}
