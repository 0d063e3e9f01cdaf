//! Pseudo-random numbers for the crate's unit tests: the same sequence on every run, so a
//! failure comes back when the test runs again.

/// Xorshift64 from `seed` (not 0): each call gives the next number.
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}
