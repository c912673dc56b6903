//! loom's side of `connmux::sync::prim`: the same names, loom's types.
//! Queues are a loom mutex around a `VecDeque` (every push and pop is a
//! step loom can reorder), the eventfd a counter under a loom mutex with a
//! condition variable; parking and polling have no timeout, so a lost
//! wake-up is a deadlock loom reports.

use std::collections::VecDeque;
use std::time::Duration;

pub use loom::sync::atomic::{fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};
use loom::sync::Condvar;
pub use loom::sync::{Mutex, MutexGuard};

/// std's park token, as a loom mutex and condition variable: loom's own
/// `park` drops an unpark that arrives while the thread waits on a mutex,
/// which std does not (and which would show as false deadlocks).
#[derive(Default)]
pub struct ThreadSlot {
    token: Mutex<bool>,
    cv: Condvar,
}

impl ThreadSlot {
    pub fn set_current(&self) {}
    pub fn park(&self, _timeout: Duration) {
        let mut t = self.token.lock().unwrap();
        while !*t {
            t = self.cv.wait(t).unwrap();
        }
        *t = false;
    }
    pub fn unpark(&self) {
        *self.token.lock().unwrap() = true;
        self.cv.notify_one();
    }
}

pub struct Queue<T>(Mutex<VecDeque<T>>);

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue(Mutex::new(VecDeque::new()))
    }
}

impl<T> Queue<T> {
    pub fn push(&self, t: T) {
        self.0.lock().unwrap().push_back(t)
    }
    pub fn pop(&self) -> Option<T> {
        self.0.lock().unwrap().pop_front()
    }
}

pub struct Bounded<T> {
    q: Mutex<VecDeque<T>>,
    cap: usize,
}

impl<T> Bounded<T> {
    pub fn new(cap: usize) -> Self {
        Bounded { q: Mutex::new(VecDeque::new()), cap: cap.max(1) }
    }
    pub fn push(&self, t: T) -> Result<(), T> {
        let mut q = self.q.lock().unwrap();
        if q.len() >= self.cap {
            return Err(t);
        }
        q.push_back(t);
        Ok(())
    }
    pub fn pop(&self) -> Option<T> {
        self.q.lock().unwrap().pop_front()
    }
    pub fn len(&self) -> usize {
        self.q.lock().unwrap().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The eventfd of a readiness: a counter, `poll` blocks while it is zero
/// (so a lost wake-up is a deadlock loom reports).
pub struct EventFd {
    count: Mutex<u64>,
    cv: Condvar,
}

impl EventFd {
    pub fn new() -> std::io::Result<EventFd> {
        Ok(EventFd { count: Mutex::new(0), cv: Condvar::new() })
    }
    /// `write(fd, 1)`.
    pub fn notify(&self) -> std::io::Result<()> {
        *self.count.lock().unwrap() += 1;
        self.cv.notify_all();
        Ok(())
    }
    /// `read(fd)` in non-blocking mode: the counter goes to zero.
    pub fn drain(&self) -> std::io::Result<u64> {
        Ok(std::mem::take(&mut *self.count.lock().unwrap()))
    }
    /// `poll(fd, POLLIN, -1)`: wait until the counter is non-zero.
    pub fn poll(&self) {
        let mut c = self.count.lock().unwrap();
        while *c == 0 {
            c = self.cv.wait(c).unwrap();
        }
    }
    pub fn count(&self) -> u64 {
        *self.count.lock().unwrap()
    }
}
