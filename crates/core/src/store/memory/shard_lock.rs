//! The shards' reader-writer locks, built so that a reader pays one atomic instruction.
//!
//! A known key is decided under its shard's shared lock. A reader-writer lock counts its
//! readers, so taking and releasing it are two locked read-modify-writes, on top of the one
//! that decides the key's word; `perf annotate` of `benches/check.rs` put about 40% of a
//! check's samples on those three. Here a reader does not count, which made a check of one hot
//! key about a fifth faster and one over 100,000 keys about a tenth (`benches/check.rs`,
//! against the `crossbeam` `ShardedLock` it replaces): each thread has a slot per shard (its
//! *row*), which it takes from idle to reading with one compare-and-swap and gives back with a
//! plain store, as only its holder can release it. A writer takes the shard's gate, a `std`
//! lock, and then every row's slot of the shard.
//!
//! Threads get rows in turn, so threads that outnumber the rows share some. A reader whose slot
//! is taken (by a thread that shares its row, or by a writer) reads under the gate instead, as
//! an ordinary reader-writer lock does, and waits there for a writer without spinning. So does
//! a reader that finds a writer waiting for the slots: readers that keep taking their slot back
//! would otherwise keep a writer out for as long as they run.
//!
//! Like `std`'s locks, neither side is reentrant: a thread that holds a shard must not lock it
//! again.

// The one module of the workspace with unsafe code: a lock hands out references to what it
// guards. Its rules are the lock's own and stated at each block.
#![allow(unsafe_code)]

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A slot nobody holds.
const IDLE: u8 = 0;
/// A slot a reader holds.
const READING: u8 = 1;
/// A slot a writer holds.
const WRITING: u8 = 2;

/// The most rows: a writer takes a slot in each.
const MAX_ROWS: usize = 16;

/// Keeps what neighbours write off each other's cache lines (two lines: the x86 prefetcher
/// fetches pairs).
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

/// One shard: its gate and what it guards.
#[derive(Debug)]
struct Guarded<T> {
    gate: RwLock<()>,
    /// A writer holds the gate and is taking the slots: new readers go to the gate.
    writing: AtomicBool,
    value: UnsafeCell<T>,
}

/// A fixed set of values, each behind its own reader-writer lock.
#[derive(Debug)]
pub(super) struct ShardLocks<T> {
    shards: Box<[Padded<Guarded<T>>]>,
    /// Row-major: row `r`'s slot of shard `i` is at `r * stride + i`. A row is one thread's
    /// (or a few threads'), so the slots a thread writes sit together, away from the others'.
    slots: Box<[AtomicU8]>,
    stride: usize,
    /// A power of two.
    rows: usize,
}

// SAFETY: the values are only reached through the guards, which give shared references to
// readers only while no writer holds the shard and a unique one to a writer only while no reader
// does: the rules `RwLock<T>` is `Sync` under.
unsafe impl<T: Send + Sync> Sync for ShardLocks<T> {}

impl<T> ShardLocks<T> {
    /// One lock per value.
    pub(super) fn new(values: impl IntoIterator<Item = T>) -> Self {
        let shards: Box<[Padded<Guarded<T>>]> = values
            .into_iter()
            .map(|value| {
                Padded(Guarded {
                    gate: RwLock::new(()),
                    writing: AtomicBool::new(false),
                    value: UnsafeCell::new(value),
                })
            })
            .collect();
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let rows = (2 * threads).next_power_of_two().clamp(4, MAX_ROWS);
        let stride = shards.len().next_multiple_of(128);
        let slots = (0..rows * stride).map(|_| AtomicU8::new(IDLE)).collect();
        ShardLocks {
            shards,
            slots,
            stride,
            rows,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.shards.len()
    }

    /// Shard `index`'s lock.
    #[inline(always)]
    pub(super) fn lock(&self, index: usize) -> Lock<'_, T> {
        Lock { locks: self, index }
    }

    /// Every shard's lock, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = Lock<'_, T>> {
        (0..self.len()).map(|index| self.lock(index))
    }

    /// Row `row`'s slot of shard `index`.
    #[inline(always)]
    fn slot(&self, row: usize, index: usize) -> &AtomicU8 {
        &self.slots[row * self.stride + index]
    }

    /// Locks shard `index` for reading: one compare-and-swap on this thread's slot, or the gate
    /// if the slot is taken.
    #[inline(always)]
    pub(super) fn read(&self, index: usize) -> ReadGuard<'_, T> {
        let shard = &self.shards[index].0;
        let slot = self.slot(thread_row() & (self.rows - 1), index);
        // Acquire: what the last writer did is seen here (it released the slot after). The flag
        // is a courtesy to writers, not what keeps them out: a reader that missed it holds its
        // slot, and the writer waits for it.
        if !shard.writing.load(Ordering::Relaxed)
            && slot
                .compare_exchange(IDLE, READING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return ReadGuard {
                value: &shard.value,
                held: Held::Slot(slot),
            };
        }
        self.read_at_gate(shard)
    }

    /// A reader whose slot is taken: under the gate, as `std`'s readers.
    #[cold]
    #[inline(never)]
    fn read_at_gate<'a>(&self, shard: &'a Guarded<T>) -> ReadGuard<'a, T> {
        let gate = shard.gate.read().unwrap_or_else(PoisonError::into_inner);
        ReadGuard {
            value: &shard.value,
            held: Held::Gate(gate),
        }
    }

    /// Locks shard `index` for writing: its gate (which keeps out other writers and the readers
    /// at the gate), then its slot in every row, waiting for the readers that hold them.
    pub(super) fn write(&self, index: usize) -> WriteGuard<'_, T> {
        let shard = &self.shards[index].0;
        let gate = shard.gate.write().unwrap_or_else(PoisonError::into_inner);
        shard.writing.store(true, Ordering::Relaxed);
        for row in 0..self.rows {
            let slot = self.slot(row, index);
            let mut spins = 0_u32;
            // Acquire: what the slot's last reader read happened before what is written here.
            while slot
                .compare_exchange_weak(IDLE, WRITING, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                // A reader holds a slot for one decision: spin a little, then let it run.
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        WriteGuard {
            shard,
            locks: self,
            index,
            _gate: gate,
        }
    }
}

/// One shard's lock: a handle to pass around.
pub(super) struct Lock<'a, T> {
    locks: &'a ShardLocks<T>,
    index: usize,
}

impl<T> Clone for Lock<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Lock<'_, T> {}

impl<'a, T> Lock<'a, T> {
    /// See [`ShardLocks::read`].
    #[inline(always)]
    pub(super) fn read(self) -> ReadGuard<'a, T> {
        self.locks.read(self.index)
    }

    /// See [`ShardLocks::write`].
    pub(super) fn write(self) -> WriteGuard<'a, T> {
        self.locks.write(self.index)
    }
}

/// How a reader holds its shard.
enum Held<'a> {
    Slot(&'a AtomicU8),
    Gate(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
}

/// A shard locked for reading.
pub(super) struct ReadGuard<'a, T> {
    value: &'a UnsafeCell<T>,
    held: Held<'a>,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: a reader holds the shard, so no writer does (a writer holds every slot of the
        // shard, and the gate exclusively).
        unsafe { &*self.value.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        if let Held::Slot(slot) = self.held {
            // Release: what this reader read happens before the next writer's work. Only the
            // holder releases a slot that is reading, so a store does it.
            slot.store(IDLE, Ordering::Release);
        }
        // A gate's guard releases the gate as it drops.
    }
}

/// A shard locked for writing.
pub(super) struct WriteGuard<'a, T> {
    shard: &'a Guarded<T>,
    locks: &'a ShardLocks<T>,
    index: usize,
    // Dropped after `drop` below has given back the slots.
    _gate: RwLockWriteGuard<'a, ()>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the writer holds the shard alone.
        unsafe { &*self.shard.value.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the writer holds the shard alone, and this guard is borrowed mutably.
        unsafe { &mut *self.shard.value.get() }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        for row in 0..self.locks.rows {
            // Release: what was written here is seen by the next reader of each slot.
            self.locks
                .slot(row, self.index)
                .store(IDLE, Ordering::Release);
        }
        self.shard.writing.store(false, Ordering::Relaxed);
    }
}

/// The row of this thread: threads take rows in turn, the first time they read.
#[inline(always)]
fn thread_row() -> usize {
    thread_local! {
        static ROW: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    ROW.with(|row| match row.get() {
        usize::MAX => {
            let assigned = NEXT.fetch_add(1, Ordering::Relaxed) % MAX_ROWS;
            row.set(assigned);
            assigned
        }
        assigned => assigned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// What a writer changes in two halves, non-atomically: a reader that ever sees the halves
    /// differ ran while a writer wrote.
    #[derive(Default)]
    struct Pair {
        left: u64,
        right: u64,
        /// Touched by readers under the shared lock, as a table's words are.
        reads: AtomicU64,
    }

    /// How many operations each thread of a test runs: few under Miri, which checks every
    /// access of every interleaving it runs for data races, and runs slowly for it.
    const OPS: usize = if cfg!(miri) { 200 } else { 20_000 };

    #[test]
    fn readers_never_see_a_write_in_progress_and_writers_lose_nothing() {
        let threads = if cfg!(miri) {
            MAX_ROWS + 2
        } else {
            3 * MAX_ROWS / 2
        };
        let locks = ShardLocks::new((0..3).map(|_| Pair::default()));
        let torn = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (locks, torn) = (&locks, &torn);
                s.spawn(move || {
                    for i in 0..OPS {
                        let index = (i + t) % 3;
                        if (i + t) % 7 == 0 {
                            let mut pair = locks.write(index);
                            pair.left += 1;
                            std::hint::black_box(&mut *pair);
                            pair.right += 1;
                        } else {
                            let pair = locks.read(index);
                            if pair.left != pair.right {
                                torn.fetch_add(1, Ordering::Relaxed);
                            }
                            pair.reads.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(torn.load(Ordering::Relaxed), 0);
        let writes: u64 = (0..threads)
            .map(|t| (0..OPS).filter(|i| (i + t) % 7 == 0).count() as u64)
            .sum();
        let (mut written, mut read) = (0, 0);
        for index in 0..3 {
            let pair = locks.read(index);
            assert_eq!(pair.left, pair.right);
            written += pair.left;
            read += pair.reads.load(Ordering::Relaxed);
        }
        assert_eq!(written, writes, "every write landed");
        assert_eq!(read, (threads * OPS) as u64 - writes, "every read ran");
    }

    /// Readers that take their slot back as soon as they give it up do not keep a writer out.
    /// Each reader stops after a budget of reads; the writer must be done before they have used
    /// it. The budget is seconds of reading, so a writer thread the scheduler leaves waiting for
    /// a few milliseconds on a busy machine does not fail the test; a writer kept out does. (On
    /// two cores the scheduler lets the writer in even without the `writing` flag; the flag is
    /// for machines with a core per reader.)
    #[test]
    fn a_writer_gets_in_while_readers_hammer_the_shard() {
        const READS: u64 = if cfg!(miri) { 20_000 } else { 200_000_000 };
        let locks = ShardLocks::new([0_u64]);
        let done = AtomicBool::new(false);
        let reads_when_done = std::thread::scope(|s| {
            let readers: Vec<_> = (0..3)
                .map(|_| {
                    let (locks, done) = (&locks, &done);
                    s.spawn(move || {
                        let mut reads = 0_u64;
                        while !done.load(Ordering::Relaxed) && reads < READS {
                            std::hint::black_box(*locks.read(0));
                            reads += 1;
                        }
                        reads
                    })
                })
                .collect();
            for _ in 0..100 {
                *locks.write(0) += 1;
            }
            done.store(true, Ordering::Relaxed);
            readers.into_iter().map(|r| r.join().unwrap_or(READS)).max()
        });
        assert_eq!(*locks.read(0), 100);
        assert!(
            reads_when_done.is_some_and(|r| r < READS),
            "the writer waited out the readers' whole budget"
        );
    }

    #[test]
    fn a_reader_whose_slot_is_taken_reads_at_the_gate() {
        let locks = ShardLocks::new([7_u32]);
        let first = locks.read(0);
        // The same thread's second read finds its slot taken (the locks are not reentrant for
        // writers; two reads are fine) and goes through the gate.
        let second = locks.read(0);
        assert!(matches!(first.held, Held::Slot(_)));
        assert!(matches!(second.held, Held::Gate(_)));
        assert_eq!((*first, *second), (7, 7));
        drop((first, second));
        *locks.write(0) += 1;
        assert_eq!(*locks.read(0), 8);
    }

    #[test]
    fn a_panicking_writer_leaves_the_shard_usable() {
        let locks = ShardLocks::new([0_u32]);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut value = locks.write(0);
            *value = 1;
            panic!("mid-write");
        }));
        assert!(result.is_err());
        assert_eq!(*locks.read(0), 1);
        *locks.write(0) = 2;
        assert_eq!(*locks.read(0), 2);
    }
}
