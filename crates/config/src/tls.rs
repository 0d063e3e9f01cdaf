//! `tls_cert`, `tls_key` and `client_ca` of `[server]`, `[admin]` and `[proxy]`: a listener
//! served over TLS, and with `client_ca`, only to clients whose certificate that CA signed.
//!
//! The files are read and checked whole when the configuration is validated (PEM sections
//! present and parseable, the key matching the certificate, the CA bundle usable), so that
//! `tollgate validate`, a start and a reload refuse what a TLS handshake would fail on later.
//! The server reads them again with [`TlsConfig::load`] whenever they change.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};

use super::Errors;

type S<T> = toml::Spanned<T>;

/// A listener's TLS files, as the configuration names them (relative paths resolved against
/// the configuration file's folder).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// `tls_cert`: the certificate chain, PEM, the listener's own certificate first.
    pub cert: PathBuf,
    /// `tls_key`: its private key, PEM (PKCS#8, PKCS#1 RSA or SEC1 EC).
    pub key: PathBuf,
    /// `client_ca`: CA certificates, PEM. When set, every client must present a certificate
    /// one of them signed (mutual TLS); without one, the handshake fails.
    pub client_ca: Option<PathBuf>,
}

/// Why a listener's TLS files cannot be used: which field's file, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TlsError {
    /// `tls_cert`, `tls_key` or `client_ca`.
    pub field: &'static str,
    /// What is wrong, naming the file.
    pub message: String,
}

impl TlsError {
    fn new(field: &'static str, message: String) -> Self {
        TlsError { field, message }
    }
}

impl TlsConfig {
    /// When the listener's own certificate (the first of `tls_cert`) stops being valid, in
    /// Unix seconds (its `notAfter`). A server does not check its own certificate's dates, and
    /// its clients refuse it once they pass: the server warns ahead and exports this as a
    /// metric to alert on.
    pub fn not_after(&self) -> Result<i64, TlsError> {
        let certs = certificates(&self.cert, "tls_cert")?;
        let first = certs
            .first()
            .ok_or_else(|| TlsError::new("tls_cert", "no certificate".to_owned()))?;
        match x509_parser::parse_x509_certificate(first) {
            Ok((_, cert)) => Ok(cert.validity().not_after.timestamp()),
            Err(e) => Err(TlsError::new(
                "tls_cert",
                format!(
                    "{}: its first certificate does not parse: {e}",
                    self.cert.display()
                ),
            )),
        }
    }

    /// The files read and parsed into a rustls server configuration (TLS 1.2 and 1.3, ring's
    /// algorithms, no ALPN protocols yet: the listener sets those it speaks).
    ///
    /// Refused: a file that cannot be read, one with no PEM section of the kind expected or a
    /// malformed one, a key that does not match the certificate, a CA bundle rustls cannot
    /// verify with.
    pub fn load(&self) -> Result<rustls::ServerConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certified = self.certified_key(&provider)?;
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::new("tls_cert", e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(path, "client_ca")? {
                    roots.add(cert).map_err(|e| {
                        TlsError::new(
                            "client_ca",
                            format!(
                                "{}: a CA certificate rustls cannot use: {e}",
                                path.display()
                            ),
                        )
                    })?;
                }
                // Client certificates are required, not merely asked for: without one, the
                // handshake fails.
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| {
                            TlsError::new("client_ca", format!("{}: {e}", path.display()))
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        Ok(builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified))))
    }

    /// The certificate chain and its key, checked to belong together.
    fn certified_key(&self, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
        let chain = certificates(&self.cert, "tls_cert")?;
        let key = private_key(&self.key)?;
        CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => TlsError::new(
                "tls_key",
                format!(
                    "the key in {} does not match the certificate in {}",
                    self.key.display(),
                    self.cert.display()
                ),
            ),
            rustls::Error::General(_) => TlsError::new(
                "tls_key",
                format!(
                    "{}: a private key rustls cannot use: {e}",
                    self.key.display()
                ),
            ),
            other => TlsError::new(
                "tls_cert",
                format!(
                    "{}: a certificate rustls cannot use: {other}",
                    self.cert.display()
                ),
            ),
        })
    }
}

/// The bytes of `path`, or why they cannot be read.
fn read(path: &Path, field: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e| TlsError::new(field, format!("cannot read {}: {e}", path.display())))
}

/// The PEM file at `path`, read whole, once it is known to hold at least one certificate:
/// `[store] tls_ca`, which the Redis client parses itself.
pub(crate) fn ca_pem(path: &Path, field: &'static str) -> Result<Vec<u8>, TlsError> {
    certificates(path, field)?;
    read(path, field)
}

/// Every `CERTIFICATE` section of the PEM file at `path` (at least one).
fn certificates(
    path: &Path,
    field: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path, field)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(field, format!("{}: not valid PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsError::new(
            field,
            format!(
                "{}: no certificate in it (a PEM file with -----BEGIN CERTIFICATE----- sections)",
                path.display()
            ),
        ));
    }
    Ok(certs)
}

/// The first private key of the PEM file at `path`.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path, "tls_key")?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let reason = match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no private key in it (a PEM file with \
                 -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)"
                .to_owned(),
            e => format!("not valid PEM: {e}"),
        };
        TlsError::new("tls_key", format!("{}: {reason}", path.display()))
    })
}

/// The TLS fields of one table, as written.
pub(crate) struct RawTls<'a> {
    pub(crate) cert: Option<&'a S<String>>,
    pub(crate) key: Option<&'a S<String>>,
    pub(crate) client_ca: Option<&'a S<String>>,
}

/// The TLS fields of `ctx` (e.g. `"[server]"`): both of `tls_cert` and
/// `tls_key` or neither, `client_ca` only with them, and the files usable. `Some(None)`:
/// no TLS; `None`: refused (and reported at the field concerned).
pub(crate) fn validate(
    ctx: &str,
    raw: RawTls<'_>,
    errs: &mut Errors<'_>,
) -> Option<Option<TlsConfig>> {
    let (cert, key) = match (raw.cert, raw.key) {
        (None, None) => {
            if let Some(ca) = raw.client_ca {
                errs.at(
                    ca.span().start,
                    format!(
                        "{ctx} field \"client_ca\" needs tls_cert and tls_key: client certificates \
                         are asked for in a TLS handshake; add e.g. tls_cert = \"server.pem\" and \
                         tls_key = \"server.key\""
                    ),
                );
                return None;
            }
            return Some(None);
        }
        (Some(c), None) => {
            errs.at(
                c.span().start,
                format!(
                    "{ctx} field \"tls_cert\" needs tls_key, the certificate's private key; add \
                     e.g. tls_key = \"server.key\""
                ),
            );
            return None;
        }
        (None, Some(k)) => {
            errs.at(
                k.span().start,
                format!(
                    "{ctx} field \"tls_key\" needs tls_cert, the certificate it is the key of; \
                     add e.g. tls_cert = \"server.pem\""
                ),
            );
            return None;
        }
        (Some(c), Some(k)) => (c, k),
    };
    let mut empty = false;
    for (v, field) in [
        (Some(cert), "tls_cert"),
        (Some(key), "tls_key"),
        (raw.client_ca, "client_ca"),
    ] {
        if let Some(v) = v.filter(|v| v.get_ref().is_empty()) {
            errs.at(
                v.span().start,
                format!("{ctx} field \"{field}\" is empty; write the path of a PEM file"),
            );
            empty = true;
        }
    }
    if empty {
        return None;
    }
    let tls = TlsConfig {
        cert: errs.relative(cert.get_ref()),
        key: errs.relative(key.get_ref()),
        client_ca: raw.client_ca.map(|c| errs.relative(c.get_ref())),
    };
    if let Err(e) = tls.load() {
        let pos = match e.field {
            "tls_key" => key.span().start,
            "client_ca" => raw.client_ca.map_or(cert.span().start, |c| c.span().start),
            _ => cert.span().start,
        };
        errs.at(pos, format!("{ctx} field \"{}\": {}", e.field, e.message));
        return None;
    }
    Some(Some(tls))
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
