//! Redis key names: `<prefix>:{<hmac of the key>}:<policy fingerprint>`. The client's key (an
//! API key, an IP) never appears in clear: it is replaced by a keyed hash of fixed length, so
//! keys of any length cost the same and nobody reading Redis learns them.

/// The keyed hash of a client key in a Redis key name: the core's long-key digest
/// (HMAC-SHA256 cut to 128 bits), so a key's name is the digest every entry point stores long
/// keys under.
pub(crate) use tollgate::key_digest::KeyDigest;

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

    fn tag_of(digest: &KeyDigest, key: &[u8]) -> String {
        hex(&digest.digest(key))
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let tag = tag_of(&KeyDigest::new(b"Jefe"), b"what do ya want for nothing?");
        assert_eq!(tag, "5bdcc146bf60754e6a042426089575c7");
    }

    #[test]
    fn long_secrets_are_hashed_first() {
        // RFC 4231 test case 6: a 131-byte key.
        let tag = tag_of(
            &KeyDigest::new(&[0xaa; 131]),
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        assert_eq!(tag, "60e431591ee0b67f0d8a26aacbf5b77f");
    }

    #[test]
    fn same_output_as_the_hand_written_hmac_it_replaced() {
        // RFC 4231 test case 3 (20 bytes of 0xaa, 50 bytes of 0xdd), and a key name as the
        // store hashes it under the default secret: pinned from the previous hand-written
        // HMAC, so key names in a running Redis stay the same across the change.
        let tag = tag_of(&KeyDigest::new(&[0xaa; 20]), &[0xdd; 50]);
        assert_eq!(tag, "773ea91e36800e46854db8ebd09181a7");
        let tag = tag_of(&KeyDigest::new(crate::DEFAULT_KEY_SECRET), b"customer-42");
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
