//! The pool's counters, which the threads, the replier and the waker add to.

use std::sync::atomic::AtomicU64;

/// The pool's counters.
#[derive(Default, Debug)]
pub struct PoolStats {
    /// Requests handed to the threads.
    pub queued: AtomicU64,
    /// Times a connection was paused: its unwritten replies over the room.
    pub paused: AtomicU64,
    /// Requests refused because their connection's backlog was full.
    pub overloads: AtomicU64,
    /// Replies that waited to be queued: the connection's backlog in the
    /// mux was full, or the threads' replies in it at their ceiling (each
    /// reply counted once, however long it waited).
    pub send_waits: AtomicU64,
    /// Replies that could not be queued in time (connection aborted).
    pub send_failures: AtomicU64,
}
