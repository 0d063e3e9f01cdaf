//! Redis key names: `<prefix>:{<hmac of the key>}:<policy fingerprint>`. The client's key (an
//! API key, an IP) never appears in clear: it is replaced by a keyed hash of fixed length, so
//! keys of any length cost the same and nobody reading Redis learns them.

/// The keyed hash of a client key in a Redis key name: the core's long-key digest
/// (HMAC-SHA256 cut to 128 bits), so a key's name is the digest every entry point stores long
/// keys under.
pub(crate) use tollgate::key_digest::KeyDigest;

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

/// Appends `bytes` as lowercase hex.
fn push_hex(s: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
}

/// The Redis key of one (policy, key) for the client key's keyed hash `digest`: the hash tag
/// makes every policy of one client key land in the same Cluster slot, so a multi-policy
/// request stays one atomic script.
pub(crate) fn key_name(prefix: &str, digest: &[u8], fingerprint: u64) -> String {
    key_and_slot(prefix, digest, fingerprint, false).0
}

/// [`key_name`], and in a Cluster the [`slot`] of its hash tag (0 otherwise: one node holds
/// every key), in one allocation with no formatting machinery (on every Redis decision; `format!` and the
/// bitwise CRC were about a tenth of the store's CPU).
pub(crate) fn key_and_slot(
    prefix: &str,
    digest: &[u8],
    fingerprint: u64,
    cluster: bool,
) -> (String, u16) {
    let mut s = String::with_capacity(prefix.len() + digest.len() * 2 + 21);
    s.push_str(prefix);
    s.push_str(":{");
    let tag_start = s.len();
    push_hex(&mut s, digest);
    let slot = if cluster { slot(&s[tag_start..]) } else { 0 };
    s.push_str("}:");
    push_hex(&mut s, &fingerprint.to_be_bytes());
    (s, slot)
}

/// The lockout record of `policy` (by name: a ban outlives a change of quota) for the client
/// key's keyed hash `digest`: the same hash tag as the key's state, so the check's script reads
/// and writes both in one slot.
pub(crate) fn ban_key(prefix: &str, digest: &[u8], policy: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + digest.len() * 2 + policy.len() + 8);
    s.push_str(prefix);
    s.push_str(":{");
    push_hex(&mut s, digest);
    s.push_str(BAN_INFIX);
    s.push_str(policy);
    s
}

/// What separates the hash tag from the policy's name in a lockout record's key.
pub(crate) const BAN_INFIX: &str = "}:ban:";

/// The Cluster slot of a hash tag: CRC16 (XMODEM) mod 16384, as Redis computes it, a byte at a
/// time from a table.
pub(crate) fn slot(tag: &str) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag.as_bytes() {
        crc = (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)];
    }
    crc % 16384
}

/// CRC16-XMODEM (polynomial 0x1021) of every byte value.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

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
        assert_eq!(key_name("tg", &[0xab], 0x1f), "tg:{ab}:000000000000001f");
        let digest = [0xab, 0x01];
        assert_eq!(
            key_and_slot("tg", &digest, u64::MAX - 1, true),
            ("tg:{ab01}:fffffffffffffffe".to_owned(), slot("ab01"))
        );
        assert_eq!(
            key_and_slot("tg", &digest, 0x1f, false),
            ("tg:{ab01}:000000000000001f".to_owned(), 0)
        );
    }

    #[test]
    fn the_slot_table_matches_the_bitwise_crc() {
        fn bitwise(tag: &str) -> u16 {
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
        for n in 0u32..5000 {
            let tag = hex(&n.wrapping_mul(2_654_435_761).to_le_bytes()).repeat(1 + n as usize % 5);
            assert_eq!(slot(&tag), bitwise(&tag), "{tag}");
        }
    }
}
