//! The primitives `inbox`, `crew` and `ready` are written against: std's
//! atomics, mutex and thread parking, crossbeam's lock-free queues, and the
//! eventfd. `connmux-model` gives the
//! same names with loom's types (queues there are a loom mutex around a
//! `VecDeque`, so loom sees every push and pop as a step).

pub use connmux_sys::eventfd::EventFd;
pub use std::sync::atomic::{fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};
pub use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Where a sleeping thread can be found: set once, by the thread itself,
/// before it first announces that it sleeps; it parks there.
#[derive(Default)]
pub struct ThreadSlot(std::sync::OnceLock<std::thread::Thread>);

impl ThreadSlot {
    /// Record the calling thread (later calls keep the first).
    pub fn set_current(&self) {
        let _ = self.0.set(std::thread::current());
    }
    /// The recorded thread (the caller): sleep until unparked or `timeout`
    /// passes (a bound on a lost wake-up; the model has no timeout, so a
    /// lost one is a deadlock there). An unpark that came first is kept.
    pub fn park(&self, timeout: Duration) {
        std::thread::park_timeout(timeout);
    }
    /// Wake the recorded thread (nothing when none is recorded yet).
    pub fn unpark(&self) {
        if let Some(t) = self.0.get() {
            t.unpark();
        }
    }
}

/// An unbounded multi-producer queue (lock-free).
pub struct Queue<T>(crossbeam::queue::SegQueue<T>);

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue(crossbeam::queue::SegQueue::new())
    }
}

impl<T> Queue<T> {
    pub fn push(&self, t: T) {
        self.0.push(t)
    }
    pub fn pop(&self) -> Option<T> {
        self.0.pop()
    }
}

/// A bounded multi-producer multi-consumer queue (lock-free).
pub struct Bounded<T>(crossbeam::queue::ArrayQueue<T>);

impl<T> Bounded<T> {
    /// Holds at most `cap` items (at least one).
    pub fn new(cap: usize) -> Self {
        Bounded(crossbeam::queue::ArrayQueue::new(cap.max(1)))
    }
    /// Add `t`, or give it back when full.
    pub fn push(&self, t: T) -> Result<(), T> {
        self.0.push(t)
    }
    pub fn pop(&self) -> Option<T> {
        self.0.pop()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
}
