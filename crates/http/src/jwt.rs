//! Verifying Bearer JWTs for the `jwt:<claim>` key selector.
//!
//! A token is used only after its signature, algorithm and expiry check out. Everything else —
//! a forged signature, `alg: none`, another algorithm than the configured one, an expired or
//! not-yet-valid token, a token too large to be real — makes the key *absent*, never trusted:
//! the next selector of the chain decides, exactly as if no token had been sent.

use std::fmt;

use http::HeaderMap;
use http::header::AUTHORIZATION;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::ConfigError;

/// Tokens longer than this are not looked at: real ones are a few hundred bytes, and parsing
/// kilobytes of attacker-chosen base64 and JSON per request is a cheap way to burn CPU.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;

/// The claims of a verified token.
pub(crate) type Claims = Map<String, Value>;

/// Verifies Bearer tokens with one configured key and algorithm.
#[derive(Clone)]
pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
    algorithm: Algorithm,
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key material.
        f.debug_struct("JwtVerifier")
            .field("algorithm", &self.algorithm)
            .field("leeway", &self.validation.leeway)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// HS256 with a shared secret.
    pub fn hs256(secret: &[u8]) -> Result<Self, ConfigError> {
        if secret.is_empty() {
            return Err(ConfigError::new(
                "hs256 secret",
                "the HS256 secret must not be empty",
            ));
        }
        Ok(Self::with_key(
            DecodingKey::from_secret(secret),
            Algorithm::HS256,
        ))
    }

    /// RS256 with an RSA public key in PEM (`-----BEGIN PUBLIC KEY-----`).
    pub fn rs256_pem(pem: &[u8]) -> Result<Self, ConfigError> {
        install_provider();
        let key = DecodingKey::from_rsa_pem(pem).map_err(|e| {
            ConfigError::new(
                "rs256 public key",
                format!("not an RSA public key in PEM: {e}"),
            )
        })?;
        Ok(Self::with_key(key, Algorithm::RS256))
    }

    /// ES256 with a P-256 public key in PEM (`-----BEGIN PUBLIC KEY-----`).
    pub fn es256_pem(pem: &[u8]) -> Result<Self, ConfigError> {
        install_provider();
        let key = DecodingKey::from_ec_pem(pem).map_err(|e| {
            ConfigError::new(
                "es256 public key",
                format!("not an EC public key in PEM: {e}"),
            )
        })?;
        Ok(Self::with_key(key, Algorithm::ES256))
    }

    fn with_key(key: DecodingKey, algorithm: Algorithm) -> Self {
        install_provider();
        // Only the configured algorithm: accepting whatever the token's header names is how
        // HS256-signed-with-the-public-key and `none` attacks work.
        let mut validation = Validation::new(algorithm);
        validation.leeway = 30;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        // An audience is only checked when one is configured.
        validation.validate_aud = false;
        JwtVerifier {
            key,
            validation,
            algorithm,
        }
    }

    /// Accepts only tokens whose `aud` is one of `audiences`.
    pub fn audience<T: ToString>(mut self, audiences: &[T]) -> Self {
        self.validation.set_audience(audiences);
        self.validation.validate_aud = true;
        self
    }

    /// Accepts only tokens whose `iss` is one of `issuers`.
    pub fn issuer<T: ToString>(mut self, issuers: &[T]) -> Self {
        self.validation.set_issuer(issuers);
        self
    }

    /// Clock skew tolerated on `exp` and `nbf`, in seconds (default 30).
    pub fn leeway(mut self, seconds: u64) -> Self {
        self.validation.leeway = seconds;
        self
    }

    /// The algorithm tokens must be signed with.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The claims of `token` if it verifies; `None` otherwise (whatever the reason).
    pub(crate) fn verify(&self, token: &str) -> Option<Claims> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return None;
        }
        jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .ok()
            .map(|data| data.claims)
    }

    /// The claims of the request's `Authorization: Bearer` token, if it verifies.
    pub(crate) fn verify_request(&self, headers: &HeaderMap) -> Option<Claims> {
        let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
        let (scheme, token) = value.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.verify(token.trim())
    }
}

/// With both of jsonwebtoken's crypto backends enabled somewhere in a build it cannot pick one
/// by itself and panics; installing ours first (a no-op when one is installed) prevents that.
fn install_provider() {
    let _already = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
}

/// A claim's value as key bytes: strings as they are, numbers and booleans as their JSON text.
/// Objects, arrays and null are not identities.
pub(crate) fn claim_bytes<'c>(
    claims: &'c Claims,
    name: &str,
) -> Option<std::borrow::Cow<'c, [u8]>> {
    match claims.get(name)? {
        Value::String(s) if !s.is_empty() => Some(std::borrow::Cow::Borrowed(s.as_bytes())),
        Value::Number(n) => Some(std::borrow::Cow::Owned(n.to_string().into_bytes())),
        Value::Bool(b) => Some(std::borrow::Cow::Borrowed(if *b {
            b"true"
        } else {
            b"false"
        })),
        _ => None,
    }
}
