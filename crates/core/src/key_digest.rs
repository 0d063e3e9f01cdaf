//! The long-key rule, defined once for every way into Tollgate: a key longer than
//! [`MAX_RAW_KEY`] bytes is stored as a fixed-length keyed hash of itself, so a client cannot
//! make the store hold (or the server copy) arbitrarily long keys. So is a key that is not
//! UTF-8 (the Redis-protocol door takes any bytes), or that holds a control character (a
//! newline, a NUL): every key a store counts is then printable text, which `/v1/top` shows and
//! `/v1/overrides` takes as it is. [`KeyDigest::write_key`]
//! writes every key a caller names the way stores count it (and `/v1/top` shows it).
//!
//! The hash is HMAC-SHA256 (RFC 2104, the `hmac` crate) cut to 128 bits: keyed, so with a
//! secret a store dump does not let anyone test guesses, and collision-resistant even when the
//! key is public, so no one can craft a long value that shares another's count. The Redis store
//! names its keys with the same digest.
//!
//! ```
//! use tollgate::key_digest::{KeyDigest, MAX_RAW_KEY};
//!
//! let digest = KeyDigest::new(b"a secret shared by every instance");
//! let long = vec![b'x'; MAX_RAW_KEY + 1];
//! let mut key = Vec::new();
//! digest.write_hex(&long, &mut key);
//! assert_eq!(key.len(), 32);
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Keys longer than this many bytes are replaced by their [`KeyDigest`] before they reach a
/// store.
pub const MAX_RAW_KEY: usize = 256;

/// HMAC-SHA256 under one secret, keyed once: each digest clones the keyed state, whose pads
/// are already absorbed, so a digest costs two hash finishes.
#[derive(Clone)]
pub struct KeyDigest {
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret (nor state derived from it).
        f.write_str("KeyDigest")
    }
}

impl KeyDigest {
    /// A digest keyed by `secret` (any length; an empty one stands for "no secret").
    pub fn new(secret: &[u8]) -> Self {
        KeyDigest {
            // HMAC takes a key of any length (longer than a block: hashed first), so this
            // cannot fail; `new_from_slice` says so only because other MACs have fixed keys.
            keyed: <Hmac<Sha256> as Mac>::new_from_slice(secret)
                .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length")),
        }
    }

    /// The first 128 bits of HMAC-SHA256(secret, `value`).
    pub fn digest(&self, value: &[u8]) -> [u8; 16] {
        let mut mac = self.keyed.clone();
        mac.update(value);
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        out
    }

    /// Appends the key a store counts `value` under: `value` itself when it is UTF-8 without
    /// control characters, at most [`MAX_RAW_KEY`] bytes long and does not begin with `#`;
    /// otherwise `#` and the 32 hex digits of its [`digest`](Self::digest). A value written as
    /// itself never begins with `#`, so no value can pass for another's digest.
    pub fn write_key(&self, value: &[u8], out: &mut impl Extend<u8>) {
        if value.len() <= MAX_RAW_KEY
            && value.first() != Some(&b'#')
            && std::str::from_utf8(value).is_ok()
            && !has_control(value)
        {
            out.extend(value.iter().copied());
        } else {
            out.extend([b'#']);
            self.write_hex(value, out);
        }
    }

    /// Appends [`digest`](Self::digest) of `value` to `out` as 32 lowercase hex digits.
    pub fn write_hex(&self, value: &[u8], out: &mut impl Extend<u8>) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digest = self.digest(value);
        out.extend(
            digest
                .iter()
                .flat_map(|b| [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0x0f)]]),
        );
    }
}

/// Whether UTF-8 `text` holds a control character (`char::is_control`: C0, DEL and C1),
/// read byte by byte: C1 characters are the two-byte sequences `C2 80` to `C2 9F`.
fn has_control(text: &[u8]) -> bool {
    text.iter().enumerate().any(|(i, &b)| {
        b < 0x20 || b == 0x7f || (b == 0xc2 && text.get(i + 1).is_some_and(|n| *n <= 0x9f))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_themselves_unless_long_or_marked() {
        let d = KeyDigest::new(b"s");
        let key = |v: &[u8]| {
            let mut out = Vec::new();
            d.write_key(v, &mut out);
            out
        };
        assert_eq!(key(b"customer-42"), b"customer-42");
        let long = vec![b'x'; MAX_RAW_KEY + 1];
        let hashed = key(&long);
        assert_eq!((hashed.len(), hashed[0]), (33, b'#'));
        assert_eq!(key(&long[..MAX_RAW_KEY]), &long[..MAX_RAW_KEY]);
        // A value that looks like a digest is hashed too, so it never shares the long key's count.
        assert_ne!(key(&hashed), hashed);
        assert_eq!(key(&hashed)[0], b'#');
        // Bytes that are not UTF-8 are hashed: every stored key is text, and none can be shown
        // under the same name as another.
        let binary = key(b"bin\xff\x00");
        assert_eq!((binary.len(), binary[0]), (33, b'#'));
        assert!(std::str::from_utf8(&binary).is_ok());
        assert_ne!(key(b"\xff"), key(b"\xfe"));
        assert_eq!(key("caf\u{e9}".as_bytes()), "caf\u{e9}".as_bytes());
        // So are keys holding a control character (C0, DEL, C1): `/v1/overrides` takes no
        // such name, and every stored key must be one it takes. Other characters are kept.
        for control in [
            "evil\nkey",
            "\0nul",
            "tab\tkey",
            "del\u{7f}",
            "c1\u{85}",
            "c1\u{9f}",
        ] {
            let k = key(control.as_bytes());
            assert_eq!((k.len(), k[0]), (33, b'#'), "{control:?}");
        }
        for kept in ["\u{a0}nbsp", "\u{c0}", "\u{100}", "\u{2028}", "a b"] {
            assert_eq!(key(kept.as_bytes()), kept.as_bytes(), "{kept:?}");
        }
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            let mut buf = [0u8; 4];
            let text = c.encode_utf8(&mut buf).as_bytes();
            assert_eq!(has_control(text), c.is_control(), "{c:?}");
        }
    }

    fn hex(value: &[u8], secret: &[u8]) -> String {
        let mut out = Vec::new();
        KeyDigest::new(secret).write_hex(value, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn digest_is_hmac_sha256_cut_to_128_bits() {
        // RFC 4231 test case 2 (key "Jefe") and case 6 (a 131-byte key, hashed first).
        assert_eq!(
            hex(b"what do ya want for nothing?", b"Jefe"),
            "5bdcc146bf60754e6a042426089575c7"
        );
        assert_eq!(
            hex(
                b"Test Using Larger Than Block-Size Key - Hash Key First",
                &[0xaa; 131]
            ),
            "60e431591ee0b67f0d8a26aacbf5b77f"
        );
    }

    #[test]
    fn digest_is_keyed_and_fixed_length() {
        let long = vec![b'k'; MAX_RAW_KEY * 4];
        let a = hex(&long, b"");
        let b = hex(&long, b"pepper");
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        // A different value of the same length: a different digest.
        let mut other = long.clone();
        other[MAX_RAW_KEY] = b'j';
        assert_ne!(hex(&other, b""), a);
    }
}
