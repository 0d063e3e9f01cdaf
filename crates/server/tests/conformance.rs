//! The server's `AnyStore` passes the store conformance suite over the memory store: it must
//! forward every operation (including the single-check path and the immediacy promise) to the
//! store it wraps. Its Redis side is the Redis store's, tested in `tollgate-redis`.

tollgate::store_conformance_tests!(|| async {
    tollgate_server::store::AnyStore::Memory(tollgate::MemoryStore::new())
});
