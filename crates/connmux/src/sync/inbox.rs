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
//!
//! A *quiet* post ([`Inbox::post_quiet`]) wakes the owner only if it sleeps
//! with no bound on its wait; an owner that finds posts waiting before it
//! sleeps bounds its wait instead, and picks them up when that ends. A
//! Dekker pair (each side writes, fences, then reads the other's variable):
//!
//! ```text
//!  poster (post_quiet)                       owner (sleep_unbounded)
//!  queue.push(item)                          unbounded.swap(true)
//!  if notified.swap(true): return (owed)     fence(SeqCst)
//!  fence(SeqCst)                             if notified.load(): unbounded.swap(false)
//!  if unbounded.load(): wake owner               sleep at most the bound
//!                                            else sleep; awake(): unbounded = false
//! ```
//!
//! Either the owner sees the post (and bounds its sleep) or the poster sees
//! the owner's unbounded sleep (and wakes it); a post that found the flag
//! up already is covered by the post that raised it.
//!
//! A *lazy* post ([`Inbox::post_lazy`]) is the other way round, for an
//! owner that only sometimes bounds its sleeps: it wakes the owner unless
//! the owner promised to look within a bound of its own
//! ([`Inbox::look_soon`]), so an owner that makes no promise pays nothing.
//! Ending the promise is the owner's half of a Dekker pair:
//!
//! ```text
//!  poster (post_lazy)                        owner (look_now)
//!  queue.push(item)                          soon.swap(false)
//!  if notified.swap(true): return (owed)     fence(SeqCst)
//!  fence(SeqCst)                             if notified.load(): take them
//!  if !soon.load(): wake owner
//! ```
//!
//! A poster that saw the promise standing did not wake the owner, and the
//! owner's look after ending it sees that post.

use super::prim::{fence, AtomicBool, Ordering, Queue};

/// Items for one owner thread.
pub struct Inbox<T> {
    queue: Queue<T>,
    /// Up from a post until the owner's next [`Inbox::take_all`].
    notified: AtomicBool,
    /// Up while the owner sleeps with no bound on its wait
    /// ([`Inbox::sleep_unbounded`]): a quiet post must wake it.
    unbounded: AtomicBool,
    /// Up while the owner promises to look within a bound of its own
    /// ([`Inbox::look_soon`]): a lazy post need not wake it.
    soon: AtomicBool,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox {
            queue: Queue::default(),
            notified: AtomicBool::new(false),
            unbounded: AtomicBool::new(false),
            soon: AtomicBool::new(false),
        }
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

    /// Post `item` without waking the owner unless it must: returns `true`
    /// when the caller must wake it (the first post since the owner last
    /// looked, and the owner sleeps with no bound on its wait). An owner
    /// that is awake, or sleeps bounded, takes it when it looks next.
    #[must_use = "an owner asleep with no bound sleeps until woken"]
    pub fn post_quiet(&self, item: T) -> bool {
        self.post_then_look(item, || self.unbounded.load(Ordering::Acquire))
    }

    /// Post `item` to an owner that may have promised to look soon: returns
    /// `true` when the caller must wake it (the first post since the owner
    /// last looked, and no promise stands).
    #[must_use = "an owner that promised nothing sleeps until woken"]
    pub fn post_lazy(&self, item: T) -> bool {
        self.post_then_look(item, || !self.soon.load(Ordering::Acquire))
    }

    /// The poster's half of both Dekker pairs: push, raise the flag, and
    /// if this post raised it, fence and ask `must_wake` (a look at the
    /// owner's variable).
    fn post_then_look(&self, item: T, must_wake: impl FnOnce() -> bool) -> bool {
        self.queue.push(item);
        if self.notified.swap(true, Ordering::AcqRel) {
            return false;
        }
        fence(Ordering::SeqCst);
        must_wake()
    }

    /// The owner promises to look ([`Inbox::look_now`]) within a bound of
    /// its own, woken or not: lazy posts stop waking it.
    pub fn look_soon(&self) {
        // (A swap for the store: see `take_all`.)
        self.soon.swap(true, Ordering::AcqRel);
    }

    /// The owner ends its promise: whether posts wait, which it must take
    /// now (a lazy post may not have woken it).
    pub fn look_now(&self) -> bool {
        self.soon.swap(false, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        self.notified.load(Ordering::Acquire)
    }

    /// The owner, about to sleep: whether it may sleep with no bound on
    /// its wait (then a quiet post wakes it, until [`Inbox::awake`]).
    /// `false`: posts wait, some perhaps posted quietly: the owner sleeps
    /// at most the bound their posters count on.
    pub fn sleep_unbounded(&self) -> bool {
        self.unbounded.swap(true, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        if self.notified.load(Ordering::Acquire) {
            self.unbounded.swap(false, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// The owner is awake again after [`Inbox::sleep_unbounded`].
    pub fn awake(&self) {
        self.unbounded.store(false, Ordering::Release);
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
