//! The TLS fields: pairs, positions, unreadable and unusable files named with their reason.

use std::path::{Path, PathBuf};

use crate::{Config, ConfigError};

/// A fresh folder with a CA-signed certificate for localhost (`cert.pem`, `key.pem`), the CA
/// (`ca.pem`), another key (`other.key`) and a file of garbage (`junk.pem`).
fn files(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tollgate-config-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let write = |f: &str, text: &str| std::fs::write(dir.join(f), text).unwrap();
    write("cert.pem", &cert.pem());
    write("key.pem", &key.serialize_pem());
    write("ca.pem", &ca.pem());
    write(
        "other.key",
        &rcgen::KeyPair::generate().unwrap().serialize_pem(),
    );
    write("junk.pem", "not a certificate\n");
    dir
}

fn errors(text: &str) -> Vec<String> {
    match Config::parse("t.toml", text) {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(d)) => d.0.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
    }
}

fn p(dir: &Path, f: &str) -> String {
    dir.join(f).display().to_string()
}

#[test]
fn a_valid_pair_and_client_ca_on_every_listener() {
    let d = files("valid");
    let tls = format!(
        "tls_cert = {:?}\ntls_key = {:?}\nclient_ca = {:?}\n",
        p(&d, "cert.pem"),
        p(&d, "key.pem"),
        p(&d, "ca.pem")
    );
    let text = format!(
        "[server]\n{tls}\n[admin]\n{tls}\n[proxy]\nlisten = \"127.0.0.1:8000\"\nupstream = \"http://127.0.0.1:3000\"\n{tls}"
    );
    let c = Config::parse("t.toml", &text).unwrap();
    for t in [
        c.tls.as_ref(),
        c.admin_tls.as_ref(),
        c.proxy.as_ref().and_then(|p| p.tls.as_ref()),
    ] {
        let t = t.unwrap();
        assert_eq!(t.cert, d.join("cert.pem"));
        assert_eq!(t.key, d.join("key.pem"));
        assert_eq!(t.client_ca.as_deref(), Some(d.join("ca.pem").as_path()));
    }
    let plain = Config::parse("t.toml", "[server]\nlisten = \"127.0.0.1:1\"\n").unwrap();
    assert!(plain.tls.is_none() && plain.admin_tls.is_none());
}

#[test]
fn half_a_pair_or_a_lone_client_ca_is_refused_at_its_field() {
    let e = errors("[server]\ntls_cert = \"a.pem\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("t.toml:2:12: [server] field \"tls_cert\" needs tls_key"),
        "{e:?}"
    );
    let e = errors("[admin]\ntls_key = \"a.key\"\n");
    assert!(
        e[0].starts_with("t.toml:2:11: [admin] field \"tls_key\" needs tls_cert"),
        "{e:?}"
    );
    let e = errors("[server]\nclient_ca = \"ca.pem\"\n");
    assert!(
        e[0].starts_with("t.toml:2:13: [server] field \"client_ca\" needs tls_cert and tls_key"),
        "{e:?}"
    );
    let e = errors(
        "[proxy]\nlisten = \"127.0.0.1:8000\"\nupstream = \"http://127.0.0.1:3000\"\ntls_cert = \"\"\ntls_key = \"k\"\n",
    );
    assert!(
        e[0].starts_with("t.toml:4:12: [proxy] field \"tls_cert\" is empty"),
        "{e:?}"
    );
}

#[test]
fn unreadable_and_unusable_files_are_named_with_their_reason() {
    let d = files("bad");
    let case = |cert: &str, key: &str, ca: Option<&str>| {
        let mut t = format!(
            "[server]\ntls_cert = {:?}\ntls_key = {:?}\n",
            p(&d, cert),
            p(&d, key)
        );
        if let Some(ca) = ca {
            t.push_str(&format!("client_ca = {:?}\n", p(&d, ca)));
        }
        let e = errors(&t);
        assert_eq!(e.len(), 1, "{e:?}");
        e[0].clone()
    };
    let e = case("missing.pem", "key.pem", None);
    assert!(
        e.starts_with("t.toml:2:12: [server] field \"tls_cert\": cannot read "),
        "{e}"
    );
    assert!(e.contains("missing.pem"), "{e}");
    let e = case("junk.pem", "key.pem", None);
    assert!(
        e.contains("field \"tls_cert\"") && e.contains("junk.pem: no certificate in it"),
        "{e}"
    );
    let e = case("cert.pem", "junk.pem", None);
    assert!(
        e.starts_with("t.toml:3:11: [server] field \"tls_key\""),
        "{e}"
    );
    assert!(e.contains("junk.pem: no private key in it"), "{e}");
    let e = case("cert.pem", "other.key", None);
    assert!(
        e.starts_with("t.toml:3:11: [server] field \"tls_key\": the key in "),
        "{e}"
    );
    assert!(e.contains("does not match the certificate in"), "{e}");
    let e = case("cert.pem", "key.pem", Some("junk.pem"));
    assert!(
        e.starts_with("t.toml:4:13: [server] field \"client_ca\""),
        "{e}"
    );
    assert!(e.contains("no certificate in it"), "{e}");
    // A PEM key where the certificate goes: no certificate section.
    let e = case("key.pem", "key.pem", None);
    assert!(e.contains("no certificate in it"), "{e}");
}

#[test]
fn relative_paths_are_read_from_the_configuration_files_folder() {
    let d = files("relative");
    let file = d.join("tollgate.toml");
    std::fs::write(
        &file,
        "[admin]\ntls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n",
    )
    .unwrap();
    let c = Config::load(&file).unwrap();
    assert_eq!(c.admin_tls.unwrap().cert, d.join("cert.pem"));
}

#[test]
fn the_redis_door_follows_the_servers_tls_on_any_address() {
    let d = files("resp");
    let tls = format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        p(&d, "cert.pem"),
        p(&d, "key.pem")
    );
    for listen in ["0.0.0.0:6380", "127.0.0.1:6380"] {
        let text = format!("[server]\n{tls}resp_listen = \"{listen}\"\n");
        assert!(errors(&text).is_empty(), "{listen}: {:?}", errors(&text));
    }
}

#[test]
fn the_certificates_end_is_read_from_its_first_certificate() {
    let d = files("not-after");
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.not_after = rcgen::date_time_ymd(2031, 7, 1);
    std::fs::write(d.join("dated.pem"), params.self_signed(&key).unwrap().pem()).unwrap();
    // The chain's other certificates (the CA after it) do not count.
    let chain = std::fs::read_to_string(d.join("dated.pem")).unwrap()
        + &std::fs::read_to_string(d.join("ca.pem")).unwrap();
    std::fs::write(d.join("chain.pem"), chain).unwrap();
    let tls = |cert: &str| crate::TlsConfig {
        cert: d.join(cert),
        key: d.join("key.pem"),
        client_ca: None,
    };
    // 2031-07-01T00:00:00Z
    assert_eq!(tls("dated.pem").not_after().unwrap(), 1_940_630_400);
    assert_eq!(tls("chain.pem").not_after().unwrap(), 1_940_630_400);
    let e = tls("junk.pem").not_after().unwrap_err().to_string();
    assert!(e.contains("tls_cert"), "{e}");
}
