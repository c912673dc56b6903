//! A KCM socket's readiness in one direction: whether the condition holds
//! (messages queued, room to send: `signaled`, an atomic the hot path
//! reads), and an eventfd readable while it holds, for whoever waits on it.
//!
//! ```text
//!            set (the condition became true): flag; the eventfd written
//!            once, if anyone may wait on it
//!   Clear ──────────────────────────────────────────────► Signaled
//!     ▲                                                      │
//!     └──── clear (before the caller checks the condition ───┘
//!            again): flag down, the eventfd drained if written,
//!            under the transition lock
//! ```
//!
//! Who waits, and what the eventfd then promises:
//! - a poller that stays registered (an application's event loop on
//!   `KcmSocket::as_fd`, tokio's `AsyncFd`, a worker's epoll or ring poll
//!   on its serving socket) takes the fd with [`Ready::polled_fd`]: from
//!   then on the eventfd is readable exactly while `signaled` is up;
//! - the library's own blocking calls wait through [`Ready::wait`], counted
//!   for the length of that one wait.
//!
//! Why the count: a socket whose thread is busy taking messages has nobody
//! asleep on it, and an eventfd write for each batch queued to it (and a
//! read to drain it) was two system calls of the worker's and the thread's
//! for nothing (`bench kcm`: 80 k of each in 1.5 s, against 20 k sleeps).
//! `set` and `wait` are a Dekker pair (each writes its own variable, fences,
//! then reads the other's): either the waiter sees `signaled` and does not
//! sleep, or `set` sees the waiter and writes the eventfd. `connmux-model`
//! checks this file under loom.

use std::io;

use super::prim::{fence, AtomicBool, AtomicUsize, EventFd, Mutex, Ordering};

/// In `waiters`: a poller stays registered on the eventfd for good.
const POLLED: usize = 1 << (usize::BITS - 1);

/// Wake-up state of one direction of a KCM socket's readiness fd.
pub struct Ready {
    fd: EventFd,
    signaled: AtomicBool,
    /// Threads in [`Ready::wait`] now, plus [`POLLED`] once a poller stays.
    waiters: AtomicUsize,
    /// Serializes set/clear transitions; holds whether the eventfd's counter
    /// is non-zero (written since it was last drained).
    transition: Mutex<bool>,
}

impl Ready {
    pub fn new() -> io::Result<Ready> {
        Ok(Ready {
            fd: EventFd::new()?,
            signaled: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            transition: Mutex::new(false),
        })
    }

    /// The condition became true: raise the flag and, if anyone may wait,
    /// make the fd readable (once).
    pub fn set(&self) {
        // Fast path: already signaled. A `clear` in progress is followed by
        // its caller's re-check of the condition, which this set's condition
        // (established before the call) passes; a waiter that came since
        // saw the flag and did not sleep.
        if self.signaled.load(Ordering::Acquire) {
            return;
        }
        let mut written = self.transition.lock().unwrap_or_else(|e| e.into_inner());
        if !self.signaled.load(Ordering::Relaxed) {
            // (A swap where a store would do: loom 0.7 lets a later
            // read-modify-write read around a plain store that happens before
            // it, which C11 forbids; the swap is modelled exactly and writes
            // the same value.)
            self.signaled.swap(true, Ordering::AcqRel);
            fence(Ordering::SeqCst);
            if self.waiters.load(Ordering::Relaxed) != 0 && !*written {
                let _ = self.fd.notify();
                *written = true;
            }
        }
    }

    /// Whether the condition was last seen true (no syscall).
    pub fn is_set(&self) -> bool {
        self.signaled.load(Ordering::Acquire)
    }

    /// Clear before checking the condition again.
    ///
    /// Flag and counter change together under `transition`, so "written iff
    /// the eventfd counter is non-zero" and "written implies signaled" hold
    /// between transitions (and, once polled, "signaled iff written").
    /// Without the lock, either order of the two steps is wrong: swap-then-
    /// drain lets a `set` land in between and leaves the flag up over an empty
    /// counter (every later `set` is skipped: a poller sleeps forever);
    /// drain-then-store lets a `set`'s write land after the store and leaves a
    /// count behind a lowered flag (poll keeps returning at once: a blocked
    /// `recv` spins). `connmux-model` checks this file under loom, and both
    /// wrong orders fail there.
    pub fn clear(&self) {
        if !self.signaled.load(Ordering::Acquire) {
            return;
        }
        let mut written = self.transition.lock().unwrap_or_else(|e| e.into_inner());
        if self.signaled.load(Ordering::Relaxed) {
            if std::mem::take(&mut *written) {
                let _ = self.fd.drain();
            }
            self.signaled.swap(false, Ordering::AcqRel);
        }
    }

    /// Sleep in `sleep` (a poll of the fd, bounded as the caller likes)
    /// unless the condition is set; `None` when it was (the caller looks
    /// again at once). Counted as a waiter meanwhile: a `set` during the
    /// sleep writes the fd.
    pub fn wait<R>(&self, sleep: impl FnOnce(&EventFd) -> R) -> Option<R> {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        let r = match self.signaled.load(Ordering::Relaxed) {
            true => None,
            false => Some(sleep(&self.fd)),
        };
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        r
    }

    /// The fd, for a poller that stays registered on it but waits on it
    /// only inside [`Ready::wait`] (a stand-alone socket's pass, whose
    /// epoll watches it): the eventfd stays written only while counted.
    pub fn counted_fd(&self) -> &EventFd {
        &self.fd
    }

    /// The fd, for a poller that stays registered on it: from now on every
    /// `set` makes it readable (and it is made readable now if the
    /// condition holds), as an application's event loop expects.
    pub fn polled_fd(&self) -> &EventFd {
        if self.waiters.load(Ordering::Acquire) & POLLED == 0 {
            let mut written = self.transition.lock().unwrap_or_else(|e| e.into_inner());
            // (Under the lock, as `set`'s look at `waiters`: no fence needed.)
            self.waiters.fetch_or(POLLED, Ordering::AcqRel);
            if self.signaled.load(Ordering::Relaxed) && !*written {
                let _ = self.fd.notify();
                *written = true;
            }
        }
        &self.fd
    }
}
