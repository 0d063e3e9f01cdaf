//! Redis key names: `<prefix>:{<hmac of the key>}:<policy fingerprint>`. The client's key (an
//! API key, an IP) never appears in clear: it is replaced by a keyed hash of fixed length, so
//! keys of any length cost the same and nobody reading Redis learns them.

use sha2::{Digest, Sha256};

/// HMAC-SHA256 (RFC 2104) with the pads absorbed once, so each key costs two hash finishes.
#[derive(Clone)]
pub(crate) struct KeyHasher {
    inner: Sha256,
    outer: Sha256,
}

impl KeyHasher {
    pub(crate) fn new(secret: &[u8]) -> Self {
        let mut block = [0u8; 64];
        if secret.len() > 64 {
            block[..32].copy_from_slice(&Sha256::digest(secret));
        } else {
            block[..secret.len()].copy_from_slice(secret);
        }
        let ipad: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
        let opad: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
        KeyHasher {
            inner: Sha256::new_with_prefix(&ipad),
            outer: Sha256::new_with_prefix(&opad),
        }
    }

    /// The first 128 bits of HMAC-SHA256(secret, key).
    pub(crate) fn mac(&self, key: &[u8]) -> [u8; 16] {
        let mut inner = self.inner.clone();
        inner.update(key);
        let mut outer = self.outer.clone();
        outer.update(inner.finalize());
        let mac = outer.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&mac[..16]);
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
