//! Key selectors: who a request is counted against.
//!
//! A policy names a chain of selectors (`["header:x-api-key", "jwt:sub", "ip"]`); the first that
//! finds a value in the request gives the key. The selector's kind and name are part of the
//! stored key, so the API key `1.2.3.4` never shares a counter with the IP address 1.2.3.4.
//! Credentials (headers, query parameters, JWT claims) are stored only as a keyed hash, and so
//! is any value longer than [`MAX_RAW_KEY`] bytes.

use std::cell::OnceCell;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use http::HeaderName;
use http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};
use siphasher::sip128::SipHasher24;
use smallvec::SmallVec;
use tollgate::key_digest::KeyDigest;

use crate::jwt::{Claims, JwtVerifier, claim_bytes};
use crate::request::{RequestInfo, query_params};
use crate::{ConfigError, Refusal};

/// Values longer than this are hashed before they become store keys: the core's one
/// long-key rule.
pub use tollgate::key_digest::MAX_RAW_KEY;

/// A store key under construction; most fit inline, without allocating.
pub(crate) type KeyBuf = SmallVec<[u8; 72]>;

/// An identity the application's own authentication put in the request's extensions, for the
/// `user` selector:
///
/// ```
/// # let mut request = http::Request::new(());
/// request.extensions_mut().insert(tollgate_http::UserId::new("customer-42"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UserId(pub String);

impl UserId {
    /// The user `id`.
    pub fn new(id: impl Into<String>) -> Self {
        UserId(id.into())
    }
}

/// Where one kind of key comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeySelector {
    /// `header:<name>`: a request header, such as an API key. Stored hashed.
    Header(HeaderName),
    /// `query:<name>`: a query-string parameter. Stored hashed.
    Query(String),
    /// `user`: the [`UserId`] in the request's extensions.
    User,
    /// `jwt:<claim>`: a claim of the verified Bearer token. Stored hashed.
    Jwt(String),
    /// `ip`: the client address (IPv6 grouped by prefix).
    Ip,
}

impl FromStr for KeySelector {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let text = input.trim();
        let (kind, arg) = match text.split_once(':') {
            Some((k, a)) => (k, Some(a.trim())),
            None => (text, None),
        };
        match (kind, arg) {
            ("header", Some(name)) if !name.is_empty() => HeaderName::from_bytes(name.as_bytes())
                .map(KeySelector::Header)
                .map_err(|_| ConfigError::new(input, "not a valid HTTP header name")),
            ("query", Some(name)) if !name.is_empty() => Ok(KeySelector::Query(name.to_owned())),
            ("jwt", Some(claim)) if !claim.is_empty() => Ok(KeySelector::Jwt(claim.to_owned())),
            ("user", None) => Ok(KeySelector::User),
            ("ip", None) => Ok(KeySelector::Ip),
            ("header" | "query" | "jwt", _) => Err(ConfigError::new(
                input,
                format!(
                    "write the {} after the colon, like \"{kind}:{}\"",
                    what(kind),
                    example(kind)
                ),
            )),
            ("user" | "ip", Some(_)) => Err(ConfigError::new(
                input,
                format!("\"{kind}\" takes no argument; write just \"{kind}\""),
            )),
            _ => Err(ConfigError::new(
                input,
                "unknown key selector; use \"header:<name>\", \"query:<name>\", \"user\", \
                 \"jwt:<claim>\" or \"ip\"",
            )),
        }
    }
}

fn what(kind: &str) -> &'static str {
    match kind {
        "header" => "header name",
        "query" => "query parameter name",
        _ => "claim name",
    }
}

fn example(kind: &str) -> &'static str {
    match kind {
        "header" => "x-api-key",
        "query" => "api_key",
        _ => "sub",
    }
}

impl fmt::Display for KeySelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySelector::Header(name) => write!(f, "header:{name}"),
            KeySelector::Query(name) => write!(f, "query:{name}"),
            KeySelector::User => f.write_str("user"),
            KeySelector::Jwt(claim) => write!(f, "jwt:{claim}"),
            KeySelector::Ip => f.write_str("ip"),
        }
    }
}

/// Selectors tried in order; the first that finds a value wins.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeyChain {
    selectors: Vec<KeySelector>,
}

impl KeyChain {
    /// A chain of `selectors`. An empty chain gives every request the policy's anonymous key: a
    /// limit shared by everyone.
    pub fn new(selectors: impl IntoIterator<Item = KeySelector>) -> Self {
        KeyChain {
            selectors: selectors.into_iter().collect(),
        }
    }

    /// Parses `["header:x-api-key", "jwt:sub", "ip"]`, failing on the first bad entry.
    pub fn parse<I, T>(items: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        let selectors = items
            .into_iter()
            .map(|s| s.as_ref().parse())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(KeyChain { selectors })
    }

    /// The selectors, in order.
    pub fn selectors(&self) -> &[KeySelector] {
        &self.selectors
    }

    /// Whether any selector reads a JWT.
    pub(crate) fn uses_jwt(&self) -> bool {
        self.selectors
            .iter()
            .any(|s| matches!(s, KeySelector::Jwt(_)))
    }
}

impl fmt::Display for KeyChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.selectors.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

/// Hashes credentials into fixed-length store keys: SipHash-2-4 with 128-bit output, a keyed
/// PRF, under a key derived from the configured secret, in hex. With a secret, a leaked store
/// dump does not even let anyone test guesses. (SipHash rather than HMAC-SHA-256: the same
/// guarantee for this use at a fraction of the cost on every request, and on CPUs without SHA
/// instructions a large fraction of the whole layer's.) Values that are not credentials but
/// too long to store as they are follow the core's long-key rule instead
/// ([`tollgate::key_digest`]), under the same secret.
#[derive(Clone)]
pub(crate) struct CredentialHasher {
    sip: SipHasher24,
    long_keys: KeyDigest,
}

impl fmt::Debug for CredentialHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.write_str("CredentialHasher")
    }
}

impl CredentialHasher {
    pub(crate) fn new(secret: &[u8]) -> Self {
        // Secrets of any length: the SipHash key is the first 128 bits of their SHA-256.
        let digest = Sha256::digest(secret);
        let mut key = [0u8; 16];
        key.copy_from_slice(&digest[..16]);
        CredentialHasher {
            sip: SipHasher24::new_with_key(&key),
            long_keys: KeyDigest::new(secret),
        }
    }

    /// Appends the hex hash of `value` (32 characters) to `out`.
    pub(crate) fn append(&self, value: &[u8], out: &mut KeyBuf) {
        let hash: u128 = self.sip.hash(value).into();
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 32];
        for (pair, b) in hex.chunks_exact_mut(2).zip(hash.to_be_bytes()) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 0x0f)];
        }
        out.extend_from_slice(&hex);
    }

    /// Appends the key a store counts a value that is not a credential under: the core's
    /// long-key rule ([`KeyDigest::write_key`]) under this hasher's secret.
    pub(crate) fn write_key(&self, value: &[u8], out: &mut impl Extend<u8>) {
        self.long_keys.write_key(value, out);
    }
}

/// What the selectors of one request read from, computed at most once per request however many
/// policies ask: the token verification and the client address.
pub(crate) struct KeyContext<'r> {
    pub(crate) info: &'r RequestInfo<'r>,
    pub(crate) jwt: Option<&'r JwtVerifier>,
    pub(crate) claims: OnceCell<Option<Claims>>,
    pub(crate) client_ip: OnceCell<Result<Option<IpAddr>, Box<Refusal>>>,
    pub(crate) resolve_ip: &'r dyn Fn(&RequestInfo<'_>) -> Result<Option<IpAddr>, Refusal>,
    pub(crate) ipv6_prefix: u8,
}

/// The refusal of a request that sends a field a key is read from more than once (`field`:
/// `header x-api-key`, `query parameter api_key`): which of the values the upstream reads is its
/// own choice, so the request is refused rather than counted under one value while the upstream
/// acts on another.
fn repeated(field: String) -> Refusal {
    Refusal::bad_field(
        field,
        "appears more than once; send it once (the limiter and the upstream could read \
         different values)",
    )
}

impl KeyContext<'_> {
    /// Writes the key for `chain` into `out`; `Ok(false)` when no selector found a value, `Err`
    /// when the first selector with a value found it more than once.
    pub(crate) fn key(
        &self,
        chain: &KeyChain,
        hasher: &CredentialHasher,
        out: &mut KeyBuf,
    ) -> Result<bool, Refusal> {
        for selector in &chain.selectors {
            if self.select(selector, hasher, out)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Writes the key `selector` reads into `out`: `Ok(false)` when the request has none, an
    /// error when it has the field twice (the upstream might read the other one).
    pub(crate) fn select(
        &self,
        selector: &KeySelector,
        hasher: &CredentialHasher,
        out: &mut KeyBuf,
    ) -> Result<bool, Refusal> {
        out.clear();
        match selector {
            KeySelector::Header(name) => self.select_header(name, hasher, out),
            KeySelector::Query(name) => self.select_query(name, hasher, out),
            KeySelector::User => Ok(self.select_user(hasher, out)),
            KeySelector::Jwt(claim) => self.select_jwt(claim, hasher, out),
            KeySelector::Ip => self.select_ip(out),
        }
    }

    /// `header:<name>:<credential digest>`.
    #[inline]
    fn select_header(
        &self,
        name: &HeaderName,
        hasher: &CredentialHasher,
        out: &mut KeyBuf,
    ) -> Result<bool, Refusal> {
        let mut values = self.info.headers.get_all(name).iter();
        let Some(value) = values.next() else {
            return Ok(false);
        };
        if values.next().is_some() {
            return Err(repeated(format!("header {name}")));
        }
        let value = trim(value.as_bytes());
        if value.is_empty() {
            return Ok(false);
        }
        out.extend_from_slice(b"header:");
        out.extend_from_slice(name.as_str().as_bytes());
        out.push(b':');
        hasher.append(value, out);
        Ok(true)
    }

    /// `query:<name>:<credential digest>`.
    #[inline]
    fn select_query(
        &self,
        name: &str,
        hasher: &CredentialHasher,
        out: &mut KeyBuf,
    ) -> Result<bool, Refusal> {
        let Some(query) = self.info.query else {
            return Ok(false);
        };
        let mut values = query_params(query, name);
        let Some(value) = values.next() else {
            return Ok(false);
        };
        if values.next().is_some() {
            return Err(repeated(format!("query parameter {name}")));
        }
        if value.is_empty() {
            return Ok(false);
        }
        out.extend_from_slice(b"query:");
        out.extend_from_slice(name.as_bytes());
        out.push(b':');
        hasher.append(&value, out);
        Ok(true)
    }

    /// `user:<id>` from the [`UserId`] extension, the id as the long-key rule writes it
    /// (`user:#<digest>` past [`MAX_RAW_KEY`]).
    #[inline]
    fn select_user(&self, hasher: &CredentialHasher, out: &mut KeyBuf) -> bool {
        let Some(UserId(id)) = self.info.extensions.and_then(|e| e.get::<UserId>()) else {
            return false;
        };
        if id.is_empty() {
            return false;
        }
        out.extend_from_slice(b"user:");
        hasher.write_key(id.as_bytes(), out);
        true
    }

    /// `jwt:<claim>:<digest>` of a verified token's claim.
    #[inline]
    fn select_jwt(
        &self,
        claim: &str,
        hasher: &CredentialHasher,
        out: &mut KeyBuf,
    ) -> Result<bool, Refusal> {
        let Some(verifier) = self.jwt else {
            return Ok(false);
        };
        if self
            .info
            .headers
            .get_all(AUTHORIZATION)
            .iter()
            .nth(1)
            .is_some()
        {
            return Err(repeated(format!("header {AUTHORIZATION}")));
        }
        let claims = self
            .claims
            .get_or_init(|| verifier.verify_request(self.info.headers));
        let Some(value) = claims.as_ref().and_then(|c| claim_bytes(c, claim)) else {
            return Ok(false);
        };
        out.extend_from_slice(b"jwt:");
        out.extend_from_slice(claim.as_bytes());
        out.push(b':');
        hasher.append(&value, out);
        Ok(true)
    }

    /// `ip:<client address>` (its network for IPv6); refused when a trusted proxy's report
    /// of the client cannot be read.
    #[inline]
    fn select_ip(&self, out: &mut KeyBuf) -> Result<bool, Refusal> {
        let ip = self
            .client_ip
            .get_or_init(|| (self.resolve_ip)(self.info).map_err(Box::new));
        match ip {
            Ok(Some(ip)) => {
                write_ip(*ip, self.ipv6_prefix, out);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(refusal) => Err(Refusal::clone(refusal)),
        }
    }
}

/// `ip:203.0.113.9`, or `ip:2001:db8:1:2::/64` for the IPv6 network the address is in.
fn write_ip(ip: IpAddr, ipv6_prefix: u8, out: &mut KeyBuf) {
    out.extend_from_slice(b"ip:");
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            // By hand: `Display` for addresses goes through the formatting machinery, and this
            // runs on every request keyed by IP.
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(digits.format(octet).as_bytes());
            }
        }
        v6 @ IpAddr::V6(_) => {
            use std::io::Write;
            let net = crate::cidr::mask(v6, ipv6_prefix);
            let mut text = [0u8; 64];
            let mut cursor = std::io::Cursor::new(&mut text[..]);
            if write!(cursor, "{net}/{ipv6_prefix}").is_ok() {
                let len = usize::try_from(cursor.position()).unwrap_or(0);
                out.extend_from_slice(&text[..len]);
            }
        }
    }
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &bytes[start..end.max(start)]
}

#[cfg(test)]
mod tests;
