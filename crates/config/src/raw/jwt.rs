//! `[jwt]`: the one key that verifies the tokens a `jwt:<claim>` key reads, and the check that a
//! policy keyed by a claim has one.

use tollgate_http::JwtVerifier;

use super::{Errors, RawJwt, S};
use crate::{Jwt, PolicyConfig};

/// `[jwt]` (`Some(None)` when absent, `None` when refused), and whether every policy that keys
/// by a claim has a key to verify it with.
pub(super) fn validate_section(
    raw: Option<S<RawJwt>>,
    policies: &[PolicyConfig],
    errs: &mut Errors<'_>,
) -> (Option<Option<Jwt>>, bool) {
    let jwt = match raw {
        None => Some(None),
        Some(j) => validate(j, errs).map(Some),
    };
    let keyed_by_claim = policies
        .iter()
        .find_map(|p| p.jwt_key_at.map(|at| (at, p.name())));
    if let (Some(None), Some((at, name))) = (&jwt, keyed_by_claim) {
        errs.at(at, format!("policy \"{name}\": a \"jwt:<claim>\" key needs a verification key; add [jwt] with hs256_secret_env, rs256_public_key_file or es256_public_key_file"));
        return (jwt, false);
    }
    (jwt, true)
}

/// Exactly one of `hs256_secret_env`, `rs256_public_key_file`, `es256_public_key_file`.
fn validate(j: S<RawJwt>, errs: &mut Errors<'_>) -> Option<Jwt> {
    let at = j.span().start;
    let j = j.into_inner();
    let mut set: Vec<(S<String>, &str)> = Vec::new();
    if let Some(v) = j.hs256_secret_env {
        set.push((v, "hs256_secret_env"));
    }
    if let Some(v) = j.rs256_public_key_file {
        set.push((v, "rs256_public_key_file"));
    }
    if let Some(v) = j.es256_public_key_file {
        set.push((v, "es256_public_key_file"));
    }
    if set.len() != 1 {
        errs.at(at, "[jwt] needs exactly one of hs256_secret_env, rs256_public_key_file, es256_public_key_file".to_owned());
        return None;
    }
    let (v, field) = set.pop()?;
    let pos = v.span().start;
    let value = v.into_inner();
    let built = match field {
        "hs256_secret_env" => match std::env::var(&value) {
            Ok(secret) if !secret.is_empty() => {
                JwtVerifier::hs256(secret.as_bytes()).map_err(|e| e.reason().to_owned())
            }
            _ => Err(format!(
                "the environment variable {value:?} is not set (or empty); export it before starting tollgate, e.g. export {value}=..."
            )),
        },
        _ => {
            let path = errs.relative(&value);
            match std::fs::read(&path) {
                Ok(pem) => if field == "rs256_public_key_file" {
                    JwtVerifier::rs256_pem(&pem)
                } else {
                    JwtVerifier::es256_pem(&pem)
                }
                .map_err(|e| format!("{}: {}", path.display(), e.reason())),
                Err(e) => Err(format!(
                    "cannot read {}: {e}; write the path of a PEM public key (relative to the configuration file)",
                    path.display()
                )),
            }
        }
    };
    match built {
        Ok(verifier) => Some(Jwt {
            source: format!("{field} = {value:?}"),
            verifier,
        }),
        Err(reason) => {
            errs.at(pos, format!("[jwt] field \"{field}\": {reason}"));
            None
        }
    }
}
