//! A worker's inbox: other threads post items, the worker takes them all in
//! its next pass. One wake-up per batch, not per item.
//!
//! ```text
//!  poster                                   owner (one thread)
//!  queue.push(item)                          if notified.load():
//!  if !notified.swap(true): wake owner          notified.swap(false)
//!                                               pop until empty
//! ```
//!
//! No item is left unseen: a post whose `swap` found the flag up came
//! before the owner's `swap(false)` in the flag's order, so its push is
//! visible to the owner's pops after it; a post after that `swap(false)`
//! finds the flag down and wakes the owner again. The wake-up itself is the
//! caller's (a worker's eventfd): [`Inbox::post`] says when one is owed.

use super::prim::AtomicBool;
use super::prim::{Ordering, Queue};

/// Items for one owner thread.
pub struct Inbox<T> {
    queue: Queue<T>,
    /// Up from a post until the owner's next [`Inbox::take_all`].
    notified: AtomicBool,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox { queue: Queue::default(), notified: AtomicBool::new(false) }
    }
}

impl<T> Inbox<T> {
    /// Post `item`. Returns `true` when the caller must wake the owner
    /// (the first post since the owner last looked).
    #[must_use = "the owner sleeps until woken"]
    pub fn post(&self, item: T) -> bool {
        self.queue.push(item);
        !self.notified.swap(true, Ordering::AcqRel)
    }

    /// Whether posts may be waiting (one load: the owner looks every pass).
    pub fn pending(&self) -> bool {
        self.notified.load(Ordering::Acquire)
    }

    /// The owner: take every item posted so far, in the order posted by each
    /// poster. Returns how many.
    pub fn take_all(&self, out: &mut Vec<T>) -> usize {
        // An RMW, not a store: a post's `swap` must read either this write or
        // one after it (loom also models a plain store less exactly).
        if !self.notified.swap(false, Ordering::AcqRel) {
            return 0;
        }
        let before = out.len();
        while let Some(t) = self.queue.pop() {
            out.push(t);
        }
        out.len() - before
    }
}
