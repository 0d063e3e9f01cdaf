//! The parts of a request the engine looks at, borrowed: the tower layer fills them from an
//! `http::Request`, the server from its proxy, its check API or forward-auth headers.

use std::borrow::Cow;
use std::net::IpAddr;

use http::header::HOST;
use http::{Extensions, HeaderMap, Method, request::Parts};

use crate::rate_limit::PeerFn;

/// A request as the policy engine sees it.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path as sent, still percent-encoded (the engine normalises it for matching).
    pub path: &'a str,
    /// The query string without the `?`.
    pub query: Option<&'a str>,
    /// The host the request is for, from the URI's authority or the `Host` header.
    pub host: Option<&'a str>,
    /// The headers (API keys, `Authorization`, forwarding headers).
    pub headers: &'a HeaderMap,
    /// The extensions, where an application's auth layer puts a [`UserId`](crate::UserId).
    pub extensions: Option<&'a Extensions>,
    /// The socket's remote address; forwarding headers are believed only when it is a trusted
    /// proxy.
    pub peer: Option<IpAddr>,
    /// Where to find the peer in `extensions` when `peer` is `None`. Called only if some key
    /// needs the client's address, so a request keyed by its API key never looks: the tower
    /// layer saves an extension lookup or three per request that way.
    pub peer_lookup: Option<PeerFn>,
    /// The client's address when the caller already knows it (the server's check API, where
    /// the caller states it): used as is, forwarding headers are not read.
    pub client_ip: Option<IpAddr>,
}

impl<'a> RequestInfo<'a> {
    /// The request described by `parts`, from `peer`.
    pub fn from_parts(parts: &'a Parts, peer: Option<IpAddr>) -> Self {
        Self::from_request_parts(
            &parts.method,
            &parts.uri,
            &parts.headers,
            Some(&parts.extensions),
            peer,
        )
    }

    /// The request `request`, from `peer`.
    pub fn from_request<B>(request: &'a http::Request<B>, peer: Option<IpAddr>) -> Self {
        Self::from_request_parts(
            request.method(),
            request.uri(),
            request.headers(),
            Some(request.extensions()),
            peer,
        )
    }

    /// What the tower layer reads of `request`: no peer (it is looked up with `peer_lookup`
    /// when a key needs it), and the host only when some route matches on it (`with_host`),
    /// which spares the `Host` header's lookup for every request of the usual engine.
    pub(crate) fn for_layer<B>(
        request: &'a http::Request<B>,
        peer_lookup: PeerFn,
        with_host: bool,
    ) -> Self {
        let (uri, headers) = (request.uri(), request.headers());
        let host = if with_host {
            host_of(uri, headers)
        } else {
            None
        };
        RequestInfo {
            peer_lookup: Some(peer_lookup),
            ..Self::with_parts(
                request.method(),
                uri,
                host,
                headers,
                Some(request.extensions()),
            )
        }
    }

    fn from_request_parts(
        method: &'a Method,
        uri: &'a http::Uri,
        headers: &'a HeaderMap,
        extensions: Option<&'a Extensions>,
        peer: Option<IpAddr>,
    ) -> Self {
        let host = host_of(uri, headers);
        Self::with_parts(method, uri, host, headers, extensions).with_peer(peer)
    }

    fn with_parts(
        method: &'a Method,
        uri: &'a http::Uri,
        host: Option<&'a str>,
        headers: &'a HeaderMap,
        extensions: Option<&'a Extensions>,
    ) -> Self {
        RequestInfo {
            method,
            path: uri.path(),
            query: uri.query(),
            host,
            headers,
            extensions,
            peer: None,
            peer_lookup: None,
            client_ip: None,
        }
    }

    /// A request described attribute by attribute, for callers with no `http::Request` (the
    /// check API, forward-auth). `path_and_query` may carry a `?query`.
    pub fn new(method: &'a Method, path_and_query: &'a str, headers: &'a HeaderMap) -> Self {
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        RequestInfo {
            method,
            path,
            query,
            host: headers.get(HOST).and_then(|h| h.to_str().ok()),
            headers,
            extensions: None,
            peer: None,
            peer_lookup: None,
            client_ip: None,
        }
    }

    /// Sets the host.
    pub fn with_host(mut self, host: Option<&'a str>) -> Self {
        self.host = host;
        self
    }

    /// Sets the peer address.
    pub fn with_peer(mut self, peer: Option<IpAddr>) -> Self {
        self.peer = peer;
        self
    }

    /// Sets where to find the peer in the extensions, when no peer is set: looked up only when a
    /// key needs the client's address.
    pub fn with_peer_lookup(mut self, lookup: Option<PeerFn>) -> Self {
        self.peer_lookup = lookup;
        self
    }

    /// The peer address: `peer`, or else what `peer_lookup` finds in the extensions.
    pub fn resolved_peer(&self) -> Option<IpAddr> {
        self.peer.or_else(|| {
            let (lookup, extensions) = self.peer_lookup.zip(self.extensions)?;
            let found = lookup(extensions);
            if found.is_none() {
                no_peer_found();
            }
            found
        })
    }

    /// Sets the client address, bypassing forwarding headers.
    pub fn with_client_ip(mut self, ip: Option<IpAddr>) -> Self {
        self.client_ip = ip;
        self
    }

    /// Sets the extensions.
    pub fn with_extensions(mut self, extensions: Option<&'a Extensions>) -> Self {
        self.extensions = extensions;
        self
    }
}

/// The host a request is for: the URI's authority, or the `Host` header.
fn host_of<'a>(uri: &'a http::Uri, headers: &'a HeaderMap) -> Option<&'a str> {
    uri.host()
        .or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()))
}

/// Every value of query parameter `name`, in order, percent-decoded (`+` is a space).
pub(crate) fn query_params<'q>(
    query: &'q str,
    name: &'q str,
) -> impl Iterator<Item = Cow<'q, [u8]>> + 'q {
    query.split('&').filter_map(move |pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k.as_bytes(), true).as_ref() == name.as_bytes())
            .then(|| percent_decode(v.as_bytes(), true))
    })
}

/// Decodes `%XX` escapes (and `+` as a space when `plus` is set). Invalid escapes stay as
/// they are, as browsers and most servers treat them.
pub(crate) fn percent_decode(input: &[u8], plus: bool) -> Cow<'_, [u8]> {
    if !input.iter().any(|&b| b == b'%' || (plus && b == b'+')) {
        return Cow::Borrowed(input);
    }
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'%' => match (
                input.get(i + 1).and_then(hex),
                input.get(i + 2).and_then(hex),
            ) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(out)
}

pub(crate) fn hex(b: &u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A layer that found no peer address in a request a key needed it for: warned once per
/// process. Every such request falls back to the next key, and at the end of the chain to
/// `anonymous`, one quota that every client shares: one client can then refuse them all.
#[cold]
fn no_peer_found() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    static WARNED: AtomicBool = AtomicBool::new(false);
    // Read first: once warned, every later request without a peer only reads the flag, rather
    // than write a line all threads share.
    if !WARNED.load(Relaxed) && !WARNED.swap(true, Relaxed) {
        tracing::warn!(
            "the rate limit layer found no client address in a request: an `ip` key falls back \
             to the next key, or to `anonymous`, which every client shares. Put the peer's \
             SocketAddr (or tollgate_http::PeerAddr) in the request's extensions, or read it \
             with RateLimitLayer::peer_addr (axum: ConnectInfo<SocketAddr>)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_are_decoded() {
        let q = "a=1&api%5Fkey=s%20e+c&api_key=second&flag";
        let all: Vec<_> = query_params(q, "api_key").collect();
        assert_eq!(all, [&b"s e c"[..], &b"second"[..]]);
        assert_eq!(query_params(q, "flag").next().as_deref(), Some(&b""[..]));
        assert_eq!(query_params(q, "missing").next(), None);
        assert_eq!(percent_decode(b"%zz%4", false).as_ref(), b"%zz%4");
    }
}
