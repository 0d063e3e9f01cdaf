//! The verdict of `concurrency.lua`'s reply: the permits as the check's permit sees them,
//! decided by the pure algorithm (`Concurrency::decide`), as the memory store decides.

use redis::Value;
use tollgate::algorithm::{Concurrency, Occupancy};
use tollgate::{Check, StoreError, Timestamp};

use super::{BASE, Grant, at, integers, protocol, unsigned};

/// The verdict of `concurrency.lua`'s reply: admitted, others, own expiry and the earliest
/// other's, both relative to the script's clock (0: none).
pub(super) fn one_check(
    check: &Check<'_>,
    alg: &Concurrency,
    reply: Value,
) -> Result<Grant, StoreError> {
    let ints = integers(reply)?;
    let admitted = at(&ints, 0)? == 1;
    let at_base = |left: i64| -> Result<u64, StoreError> {
        Ok(match unsigned(left)? {
            0 => 0,
            left => BASE + left,
        })
    };
    let occupancy = Occupancy {
        others: unsigned(at(&ints, 1)?)?,
        own: at_base(at(&ints, 2)?)?,
        others_earliest: at_base(at(&ints, 3)?)?,
    };
    if occupancy.others > 0 && occupancy.others_earliest == 0 {
        return Err(protocol(
            "the concurrency script reported permits without expiry",
        ));
    }
    let now = Timestamp::from_micros(BASE);
    let verdict = alg.decide(occupancy, now, check.cost, check.permit);
    if admitted != (verdict.allowed && check.cost > 0) {
        return Err(protocol(&format!(
            "the concurrency script and the algorithm disagree (admitted {admitted} for cost {})",
            check.cost
        )));
    }
    Ok(Grant {
        granted: if admitted { check.cost } else { 0 },
        verdict,
        after_grant: verdict,
        now: 0,
        window_left: 0,
    })
}
