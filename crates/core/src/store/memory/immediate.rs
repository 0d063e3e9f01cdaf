//! The memory store's futures: ready on their first poll, since every operation runs under a
//! shard lock and waits for nothing else.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::MemoryStore;
use crate::{Check, Decision, StoreError, Timestamp};

/// A future that does its work when first polled and is ready then: the memory store's
/// answers, without the state machine an `async` block would wrap around them (it showed in
/// the instruction count of every check).
pub(super) struct Immediate<F>(pub(super) Option<F>);

impl<F: FnOnce() -> T + Unpin, T> Future for Immediate<F> {
    type Output = T;

    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<T> {
        match self.0.take() {
            Some(work) => Poll::Ready(work()),
            // Polled again after completing: stays pending, as a fused future would.
            None => Poll::Pending,
        }
    }
}

/// [`Store::apply_one`]'s future: [`Immediate`] without a closure, whose call shim the compiler
/// stopped inlining once two callers polled it (about 110 instructions more per check,
/// callgrind).
pub(super) struct ApplyOne<'s, 'c> {
    pub(super) store: &'s MemoryStore,
    pub(super) now: Timestamp,
    pub(super) check: Option<Check<'c>>,
}

impl Future for ApplyOne<'_, '_> {
    type Output = Result<Decision, StoreError>;

    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        match self.check.take() {
            Some(check) => Poll::Ready(Ok(self.store.apply_one_now(self.now, &check))),
            // Polled again after completing: stays pending, as a fused future would.
            None => Poll::Pending,
        }
    }
}
