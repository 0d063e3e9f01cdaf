//! The ring buffer a spilled sliding log keeps its older entries in.

use super::RING_MIN;

/// A spilled log's older entries: a ring buffer on the heap whose bounds live in the record,
/// so a decision that merges into the newest entry, the byte count after it and tidying read
/// no heap line, and appending or dropping an entry touches the slot's line only. (A boxed
/// `VecDeque` kept its header on a heap line of its own: one more cache miss per decision
/// at 100,000 keys.)
#[derive(Debug)]
pub(in crate::store::memory) struct HeapEntries {
    slots: Box<[(u64, u32)]>,
    head: u32,
    len: u32,
}

impl HeapEntries {
    pub(super) fn new(entries: impl IntoIterator<Item = (u64, u32)>) -> Self {
        let mut heap = HeapEntries {
            slots: Box::default(),
            head: 0,
            len: 0,
        };
        heap.resize(RING_MIN);
        for entry in entries {
            heap.push_back(entry);
        }
        heap
    }

    pub(super) fn len(&self) -> usize {
        self.len as usize
    }

    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The slot of the `i`th entry (`i` below the capacity).
    #[inline]
    fn slot(&self, i: usize) -> usize {
        let at = self.head as usize + i;
        if at >= self.slots.len() {
            at - self.slots.len()
        } else {
            at
        }
    }

    pub(super) fn get(&self, i: usize) -> Option<(u64, u32)> {
        (i < self.len()).then(|| self.slots[self.slot(i)])
    }

    #[inline]
    pub(super) fn front(&self) -> Option<(u64, u32)> {
        self.get(0)
    }

    pub(super) fn push_back(&mut self, entry: (u64, u32)) {
        if self.len() == self.capacity() {
            self.resize((2 * self.capacity()).max(RING_MIN));
        }
        let at = self.slot(self.len());
        self.slots[at] = entry;
        self.len += 1;
    }

    pub(super) fn pop_front(&mut self) -> Option<(u64, u32)> {
        let entry = self.front()?;
        self.head = u32::try_from(self.slot(1)).unwrap_or(0);
        self.len -= 1;
        Some(entry)
    }

    pub(super) fn pop_back(&mut self) -> Option<(u64, u32)> {
        let entry = self.get(self.len().checked_sub(1)?)?;
        self.len -= 1;
        Some(entry)
    }

    /// Moves the entries, oldest first, to `capacity` slots (at least as many as entries).
    pub(super) fn resize(&mut self, capacity: usize) {
        let capacity = capacity.max(self.len());
        let mut slots = vec![(0, 0); capacity].into_boxed_slice();
        for (i, slot) in slots.iter_mut().take(self.len()).enumerate() {
            *slot = self.slots[self.slot(i)];
        }
        self.slots = slots;
        self.head = 0;
    }
}
