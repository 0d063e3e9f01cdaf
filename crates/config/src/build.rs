//! The configuration turned into what decides: the HTTP policy engine and the memory store,
//! built the same way by the server and by every tool that decides requests outside it (such
//! as `tollgate replay` on a manual clock), so both decide alike.

use tollgate::{Clock, MemoryStore, Store};
use tollgate_http::{HeaderConfig, RetryAfterFormat, UsageCounters};

use crate::{Config, PolicyConfig, StoreConfig, StoreKind};

/// The HTTP policy engine `config` describes (policies, keys, routes, costs, headers, trusted
/// proxies, JWT, key hashing, what a failed store answers) over `store`, reading time from
/// `clock`.
pub fn http_engine<S: Store, C: Clock>(
    config: &Config,
    store: S,
    clock: C,
) -> Result<tollgate_http::Engine<S, C>, tollgate_http::ConfigError> {
    http_engine_counting(config, store, clock, UsageCounters::default())
}

/// [`http_engine`], counting the responses whose cost could not be read in `usage`: what a
/// server passes to each configuration it loads, so that the counts outlive reloads.
pub fn http_engine_counting<S: Store, C: Clock>(
    config: &Config,
    store: S,
    clock: C,
    usage: UsageCounters,
) -> Result<tollgate_http::Engine<S, C>, tollgate_http::ConfigError> {
    let h = &config.headers;
    let mut builder = tollgate_http::Engine::builder()
        .usage_counters(usage)
        .store(store)
        .clock(clock)
        .policies(config.policies.iter().map(PolicyConfig::to_http))
        .headers(HeaderConfig {
            legacy: h.legacy,
            reset_format: h.reset_format,
            ietf: h.ietf,
            retry_after_format: RetryAfterFormat::Seconds,
        })
        .on_error(config.store.on_error)
        .ipv6_prefix(config.ipv6_prefix)
        .key_hash_secret(key_hash_secret(&config.store))
        .lists(config.lists.iter().cloned());
    if let Some(p) = &config.proxy {
        builder = builder
            .trusted_proxies(p.trusted_proxies.clone())
            .forwarded_header(p.forwarded_header);
    }
    if let Some(j) = &config.jwt {
        builder = builder.jwt(j.verifier.clone());
    }
    builder.build()
}

/// The memory store `[store]` describes (its `max_keys`), whatever its `kind`: what the server
/// keeps counters in with `kind = "memory"`, and what a replay of a log decides on.
pub fn memory_store(config: &StoreConfig) -> MemoryStore {
    let mut b = MemoryStore::builder();
    if let Some(n) = config.max_keys {
        b = b.max_keys(n);
    }
    b.build()
}

/// The secret the engine hashes credential keys under (`[store] key_secret_env`): the
/// configured one; otherwise one drawn once per process for the memory store, whose keys never
/// leave the process, and the public built-in one for Redis, which every instance must share.
pub fn key_hash_secret(config: &StoreConfig) -> Vec<u8> {
    match (&config.key_secret, &config.kind) {
        (Some(secret), _) => secret.expose().to_vec(),
        (None, StoreKind::Memory) => process_secret().to_vec(),
        (None, StoreKind::Redis) => tollgate_redis::DEFAULT_KEY_SECRET.to_vec(),
    }
}

static PROCESS_SECRET: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

/// 32 random bytes, the same for the life of the process (so reloads keep the counters), unless
/// [`restore_process_secret`] gave it first.
pub fn process_secret() -> &'static [u8] {
    PROCESS_SECRET.get_or_init(|| {
        use std::io::Read as _;
        let mut bytes = vec![0u8; 32];
        let from_os =
            std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
        if from_os.is_err() {
            // No /dev/urandom: std's hasher keys, which come from the OS's random source.
            use std::hash::{BuildHasher as _, Hasher as _};
            for (i, chunk) in bytes.chunks_mut(8).enumerate() {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_usize(i);
                chunk.copy_from_slice(&h.finish().to_le_bytes());
            }
        }
        bytes
    })
}

/// Makes `secret` the [`process_secret`]: the one a previous run of the memory store kept in
/// its state file, so the keys it hashed are found again. False when the process already has
/// one (it was read before), which then stays.
pub fn restore_process_secret(secret: &[u8]) -> bool {
    PROCESS_SECRET.set(secret.to_vec()).is_ok()
}
