//! A KCM socket's readiness in one direction: an eventfd that is readable
//! while the condition holds (messages queued, room to send), so that an
//! application's own event loop can wait on it, and `signaled`, whether its
//! counter is non-zero, so that the hot path makes the eventfd's system call
//! only on a transition.
//!
//! ```text
//!            set (the condition became true): notify once
//!   Clear ──────────────────────────────────────────────► Signaled
//!     ▲                                                      │
//!     └──── clear (before the caller checks the condition ───┘
//!            again): drain, under the transition lock
//! ```

use std::io;

use super::prim::{AtomicBool, EventFd, Mutex, Ordering};

/// Wake-up state of one direction of a KCM socket's readiness fd.
pub struct Ready {
    pub fd: EventFd,
    signaled: AtomicBool,
    /// Serializes set/clear transitions (rare: once per empty↔non-empty change).
    transition: Mutex<()>,
}

impl Ready {
    pub fn new() -> io::Result<Ready> {
        Ok(Ready { fd: EventFd::new()?, signaled: AtomicBool::new(false), transition: Mutex::new(()) })
    }

    /// The condition became true: make the fd readable (once).
    pub fn set(&self) {
        // Fast path: already signaled. A `clear` in progress is followed by
        // its caller's re-check of the condition, which this set's condition
        // (established before the call) passes.
        if self.signaled.load(Ordering::Acquire) {
            return;
        }
        let _t = self.transition.lock().unwrap_or_else(|e| e.into_inner());
        if !self.signaled.load(Ordering::Relaxed) {
            // Flag first: a `clear` that sees it takes the lock and so waits
            // for the write, instead of skipping a count about to appear
            // (which would make pollers spin until this thread runs again).
            // (A swap where a store would do: loom 0.7 lets a later
            // read-modify-write read around a plain store that happens before
            // it, which C11 forbids; the swap is modelled exactly and writes
            // the same value.)
            self.signaled.swap(true, Ordering::AcqRel);
            let _ = self.fd.notify();
        }
    }

    /// Whether the condition was last seen true (no syscall).
    pub fn is_set(&self) -> bool {
        self.signaled.load(Ordering::Acquire)
    }

    /// Clear before checking the condition again.
    ///
    /// Flag and counter change together under `transition`, so "signaled iff
    /// the eventfd counter is non-zero" always holds between transitions.
    /// Without the lock, either order of the two steps is wrong: swap-then-
    /// drain lets a `set` land in between and leaves the flag up over an empty
    /// counter (every later `set` is skipped: a waiter sleeps forever);
    /// drain-then-store lets a `set`'s write land after the store and leaves a
    /// count behind a lowered flag (poll keeps returning at once: a blocked
    /// `recv` spins). `connmux-model` checks this file under loom, and both
    /// wrong orders fail there.
    pub fn clear(&self) {
        if !self.signaled.load(Ordering::Acquire) {
            return;
        }
        let _t = self.transition.lock().unwrap_or_else(|e| e.into_inner());
        if self.signaled.load(Ordering::Relaxed) {
            let _ = self.fd.drain();
            self.signaled.swap(false, Ordering::AcqRel);
        }
    }
}
