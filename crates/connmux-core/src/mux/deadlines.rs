//! The psocks' assembly deadlines, ordered: a min-heap with lazy invalidation,
//! so that finding the next deadline costs O(1) and expiring costs O(log n)
//! per deadline that expires, whatever the number of psocks.
//!
//! Each psock remembers the deadline it has armed as `(when, seq)`; `seq` is
//! unique per arming, so an entry is live exactly while its psock still holds
//! that pair. Clearing or re-arming a deadline, or removing the psock, leaves
//! the old entry in the heap; it is dropped when it reaches the top (the top
//! is always live, which is what lets [`Deadlines::next`] take `&self`) or
//! when stale entries outnumber live ones (the heap is rebuilt from the live
//! ones: at most `2 × armed + SLACK` entries, amortised O(1) per arming).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Timestamp;

/// A psock's armed deadline: when, and the arming's sequence number.
pub(crate) type Armed = (Timestamp, u64);

/// Stale entries tolerated before a rebuild, beyond as many as are live.
const SLACK: usize = 64;

/// One heap entry: deadline, psock index, psock generation, arming seq.
type Entry = Reverse<(Timestamp, u32, u32, u64)>;

#[derive(Default)]
pub(crate) struct Deadlines {
    heap: BinaryHeap<Entry>,
    /// Psocks with a deadline armed (= live entries).
    armed: usize,
    next_seq: u64,
}

impl Deadlines {
    /// The earliest armed deadline. Exact when the top is live (see [`Deadlines::clean`]).
    #[inline]
    pub(crate) fn next(&self) -> Option<Timestamp> {
        self.heap.peek().map(|Reverse(e)| e.0)
    }

    /// Bring psock `(index, generation)`'s armed deadline in line with its
    /// stream's `want`. Returns true if an entry may have gone stale (the
    /// caller then runs [`Deadlines::clean`]).
    #[inline]
    pub(crate) fn sync(
        &mut self,
        index: u32,
        generation: u32,
        slot: &mut Option<Armed>,
        want: Option<Timestamp>,
    ) -> bool {
        if slot.map(|a| a.0) == want {
            return false;
        }
        let had = slot.take().is_some();
        if had {
            self.armed -= 1;
        }
        if let Some(when) = want {
            let seq = self.next_seq;
            self.next_seq += 1;
            *slot = Some((when, seq));
            self.armed += 1;
            self.heap.push(Reverse((when, index, generation, seq)));
            if self.heap.len() > 2 * self.armed + SLACK {
                // Caller must rebuild (it knows which entries are live).
                return true;
            }
        }
        had
    }

    /// A psock with this armed deadline is gone.
    #[inline]
    pub(crate) fn forget(&mut self, slot: Option<Armed>) -> bool {
        if slot.is_some() {
            self.armed -= 1;
            return true;
        }
        false
    }

    /// Pop the top entry if it is due at `now`: `(index, generation, armed)`.
    #[inline]
    pub(crate) fn pop_due(&mut self, now: Timestamp) -> Option<(u32, u32, Armed)> {
        match self.heap.peek() {
            Some(Reverse((when, ..))) if *when <= now => {
                let Reverse((when, index, generation, seq)) = self.heap.pop().expect("peeked");
                Some((index, generation, (when, seq)))
            }
            _ => None,
        }
    }

    /// The psock's deadline was taken out by `pop_due` and matched: it is no
    /// longer armed.
    #[inline]
    pub(crate) fn fired(&mut self, slot: &mut Option<Armed>) {
        if slot.take().is_some() {
            self.armed -= 1;
        }
    }

    /// Drop stale entries: from the top until it is live, or all of them when
    /// they outnumber the live ones. `live(index, generation)` is the psock's
    /// armed deadline, if it exists.
    pub(crate) fn clean(&mut self, live: impl Fn(u32, u32) -> Option<Armed>) {
        let is_live =
            |Reverse((when, index, generation, seq)): &Entry| live(*index, *generation) == Some((*when, *seq));
        if self.heap.len() > 2 * self.armed + SLACK {
            self.heap.retain(is_live);
            debug_assert_eq!(self.heap.len(), self.armed);
            return;
        }
        while let Some(top) = self.heap.peek() {
            if is_live(top) {
                break;
            }
            self.heap.pop();
        }
    }

    /// Entries held (live and stale), for tests of the bound.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}
