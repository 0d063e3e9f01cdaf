//! Redis key names: `<prefix>:{<hmac of the key>}:<policy fingerprint>`. The client's key (an
//! API key, an IP) never appears in clear: it is replaced by a keyed hash of fixed length, so
//! keys of any length cost the same and nobody reading Redis learns them.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// HMAC-SHA256 (RFC 2104, the `hmac` crate) keyed once: each key clones the keyed state, whose
/// pads are already absorbed, so a key costs two hash finishes.
#[derive(Clone)]
pub(crate) struct KeyHasher {
    keyed: Hmac<Sha256>,
}

impl KeyHasher {
    pub(crate) fn new(secret: &[u8]) -> Self {
        KeyHasher {
            // HMAC takes a key of any length (longer than a block: hashed first), so this
            // cannot fail; `new_from_slice` says so only because other MACs have fixed keys.
            keyed: <Hmac<Sha256> as Mac>::new_from_slice(secret)
                .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length")),
        }
    }

    /// The first 128 bits of HMAC-SHA256(secret, key).
    pub(crate) fn mac(&self, key: &[u8]) -> [u8; 16] {
        let mut mac = self.keyed.clone();
        mac.update(key);
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        out
    }

    /// [`mac`](Self::mac) as 32 lowercase hex digits: the hash tag of the key's Redis keys.
    #[cfg(test)]
    pub(crate) fn tag(&self, key: &[u8]) -> String {
        hex(&self.mac(key))
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// The Redis key of one (policy, key): the hash tag makes every policy of one client key land
/// in the same Cluster slot, so a multi-policy request stays one atomic script.
pub(crate) fn key_name(prefix: &str, tag: &str, fingerprint: u64) -> String {
    format!("{prefix}:{{{tag}}}:{fingerprint:016x}")
}

/// The Cluster slot of a hash tag: CRC16 (XMODEM) mod 16384, as Redis computes it.
pub(crate) fn slot(tag: &str) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let tag = KeyHasher::new(b"Jefe").tag(b"what do ya want for nothing?");
        assert_eq!(tag, "5bdcc146bf60754e6a042426089575c7");
    }

    #[test]
    fn long_secrets_are_hashed_first() {
        // RFC 4231 test case 6: a 131-byte key.
        let tag = KeyHasher::new(&[0xaa; 131])
            .tag(b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(tag, "60e431591ee0b67f0d8a26aacbf5b77f");
    }

    #[test]
    fn same_output_as_the_hand_written_hmac_it_replaced() {
        // RFC 4231 test case 3 (20 bytes of 0xaa, 50 bytes of 0xdd), and a key name as the
        // store hashes it under the default secret: pinned from the previous hand-written
        // HMAC, so key names in a running Redis stay the same across the change.
        let tag = KeyHasher::new(&[0xaa; 20]).tag(&[0xdd; 50]);
        assert_eq!(tag, "773ea91e36800e46854db8ebd09181a7");
        let tag = KeyHasher::new(crate::DEFAULT_KEY_SECRET).tag(b"customer-42");
        assert_eq!(tag, "e9eb9703f7a5bf8e5b7157b9a09bb3fa");
    }

    #[test]
    fn slots_match_redis() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot(""), 0);
    }

    #[test]
    fn key_names_carry_tag_and_fingerprint() {
        assert_eq!(key_name("tg", "ab", 0x1f), "tg:{ab}:000000000000001f");
    }
}
