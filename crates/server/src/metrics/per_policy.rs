//! What the engine and the store count per policy, read when `/metrics` is rendered: hot-key
//! leases (Redis), responses whose cost could not be read, and concurrency slots.

use std::fmt::Write as _;

use super::escape_label;

/// Per policy with a lease (once it took one): what its hot-key leases took from Redis, spent
/// here, gave back, and hold now (`docs/redis.md`).
pub(super) fn render_leases(out: &mut String, leases: &[tollgate_redis::LeaseStats]) {
    if leases.is_empty() {
        return;
    }
    type Field = fn(&tollgate_redis::LeaseStats) -> u64;
    let families: [(&str, &str, &str, Field); 5] = [
        (
            "tollgate_lease_grants_total",
            "counter",
            "Hot-key leases taken from Redis, by policy.",
            |s| s.grants,
        ),
        (
            "tollgate_lease_units_taken_total",
            "counter",
            "Units hot-key leases took from Redis, by policy.",
            |s| s.units_taken,
        ),
        (
            "tollgate_lease_units_spent_total",
            "counter",
            "Lease units admitted requests spent without calling Redis (and the cost of each \
             request that took a lease), by policy.",
            |s| s.units_spent,
        ),
        (
            "tollgate_lease_units_returned_total",
            "counter",
            "Unspent lease units handed back to Redis (renewal, eviction, shutdown), by policy.",
            |s| s.units_returned,
        ),
        (
            "tollgate_lease_units_held",
            "gauge",
            "Lease units this instance holds now: taken - spent - returned, by policy.",
            |s| s.units_held(),
        ),
    ];
    for (name, kind, help, field) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for s in leases {
            let policy = escape_label(&s.policy);
            let _ = writeln!(out, "{name}{{policy=\"{policy}\"}} {}", field(s));
        }
    }
}

/// `tollgate_usage_fallbacks_total`: per policy that charges by the response, the responses
/// whose cost could not be read (missing, malformed, compressed) and were charged the policy's
/// `cost` instead. Counted since the configuration was last loaded.
pub(crate) fn render_usage_fallbacks<'a>(
    out: &mut String,
    fallbacks: impl Iterator<Item = (&'a str, u64)>,
) {
    let mut fallbacks = fallbacks.peekable();
    if fallbacks.peek().is_none() {
        return;
    }
    out.push_str(
        "# HELP tollgate_usage_fallbacks_total Responses whose cost could not be read, charged \
         the policy's cost.\n# TYPE tollgate_usage_fallbacks_total counter\n",
    );
    for (policy, n) in fallbacks {
        let _ = writeln!(
            out,
            "tollgate_usage_fallbacks_total{{policy=\"{}\"}} {n}",
            escape_label(policy)
        );
    }
}

/// `tollgate_in_flight` and `tollgate_slots_expired_total`: per concurrency policy, the
/// requests holding a slot through this instance now (at the proxy and the tower layer; slots
/// handed out as leases or left to forward-auth are not), and the slots that were already taken
/// back at their `lease_ttl` when their request ended. Counted since the configuration was
/// last loaded.
pub(crate) fn render_slots<'a>(out: &mut String, slots: impl Iterator<Item = (&'a str, u64, u64)>) {
    let slots: Vec<_> = slots.collect();
    if slots.is_empty() {
        return;
    }
    out.push_str(
        "# HELP tollgate_in_flight Requests holding a concurrency slot through this instance.\n\
         # TYPE tollgate_in_flight gauge\n",
    );
    for (policy, in_flight, _) in &slots {
        let _ = writeln!(
            out,
            "tollgate_in_flight{{policy=\"{}\"}} {in_flight}",
            escape_label(policy)
        );
    }
    out.push_str(
        "# HELP tollgate_slots_expired_total Slots taken back at their lease_ttl before their \
         request ended.\n# TYPE tollgate_slots_expired_total counter\n",
    );
    for (policy, _, expired) in &slots {
        let _ = writeln!(
            out,
            "tollgate_slots_expired_total{{policy=\"{}\"}} {expired}",
            escape_label(policy)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;

    #[test]
    fn lease_counters_render_per_policy_with_what_is_held() {
        let m = Metrics::default();
        let hot = tollgate_redis::LeaseStats {
            policy: "hot \"key\"".to_owned(),
            grants: 3,
            units_taken: 300,
            units_spent: 250,
            units_returned: 20,
        };
        let text = m.render(None, None, &[hot]);
        for line in [
            "# TYPE tollgate_lease_grants_total counter",
            "tollgate_lease_grants_total{policy=\"hot \\\"key\\\"\"} 3",
            "tollgate_lease_units_taken_total{policy=\"hot \\\"key\\\"\"} 300",
            "tollgate_lease_units_spent_total{policy=\"hot \\\"key\\\"\"} 250",
            "tollgate_lease_units_returned_total{policy=\"hot \\\"key\\\"\"} 20",
            "# TYPE tollgate_lease_units_held gauge",
            "tollgate_lease_units_held{policy=\"hot \\\"key\\\"\"} 30",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(!m.render(None, None, &[]).contains("tollgate_lease"));
    }
}
