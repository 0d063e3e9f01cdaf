//! `[forward_auth]`: which callers of `/v1/forward-auth` are proxies whose `X-Forwarded-For` is
//! believed. The default trusts loopback, so a proxy on the same host works as is.

use serde::Deserialize;
use tollgate_http::{Cidr, TrustedProxies};
use toml::Spanned;

use super::Errors;

/// What `trusted_proxies` is when the file does not say: this host only.
pub(super) const DEFAULT_TRUSTED: [&str; 2] = ["127.0.0.0/8", "::1/128"];

/// `[forward_auth]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardAuthConfig {
    /// `trusted_proxies`: the caller must be in one of these networks for its
    /// `X-Forwarded-For` to be read; the list is then walked right to left past the hops that
    /// are also in it. An untrusted caller is itself the client.
    pub trusted_proxies: TrustedProxies,
}

impl Default for ForwardAuthConfig {
    fn default() -> Self {
        ForwardAuthConfig {
            trusted_proxies: TrustedProxies::parse(DEFAULT_TRUSTED).unwrap_or_default(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawForwardAuth {
    trusted_proxies: Option<Vec<Spanned<String>>>,
}

/// Validates `[forward_auth]`; its absence is the default.
pub(super) fn validate(
    raw: Option<RawForwardAuth>,
    errs: &mut Errors<'_>,
) -> Option<ForwardAuthConfig> {
    let Some(list) = raw.and_then(|r| r.trusted_proxies) else {
        return Some(ForwardAuthConfig::default());
    };
    let mut nets = Vec::with_capacity(list.len());
    let mut ok = true;
    for item in list {
        match item.get_ref().parse::<Cidr>() {
            Ok(c) => nets.push(c),
            Err(e) => {
                errs.at(
                    item.span().start,
                    format!(
                        "[forward_auth] field \"trusted_proxies\": {:?}: {}; write e.g. trusted_proxies = [\"127.0.0.1/32\", \"10.0.0.0/8\"]",
                        e.input(),
                        e.reason()
                    ),
                );
                ok = false;
            }
        }
    }
    ok.then(|| ForwardAuthConfig {
        trusted_proxies: TrustedProxies::new(nets),
    })
}
