//! The store conformance suite against the in-memory store.

tollgate::store_conformance_tests!(|| async { tollgate::MemoryStore::new() });

/// A store so small it evicts constantly still decides every scenario correctly while it holds
/// the keys (the scenarios use only a few keys at a time).
mod tiny {
    tollgate::store_conformance_tests!(|| async {
        tollgate::MemoryStore::builder()
            .max_keys(64)
            .shards(4)
            .build()
    });
}
