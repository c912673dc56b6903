//! What a socket's own passes keep for its receives (`Keep`): handed from
//! the thread whose pass kept it (a led worker's pass, a stand-alone
//! slot's) to the socket's receives, with no hold of the hub lock, and
//! given back to the hub when the socket stops receiving.
//!
//! ```text
//!   a pass ends: deposit ──► kept ──► a receive takes it (take)
//!        │ stopped
//!        ▼
//!   refused: the depositor gives them back in a hold of the hub
//!
//!   receive-disable, under the hub lock: stop (the flag stored, then
//!   what is kept given back); receiving again: mirror(false)
//! ```
//!
//! Stopped, nothing stays kept: a receive's hold (`hold`) that finds
//! the socket stopped gives back whatever it sees all the same, a guard
//! that costs nothing.
//!
//! Why one place: the flag is stored before the lock is taken to give
//! back, and looked at under that lock by a deposit, so every message is
//! either given back by the stop or refused to the depositor, and none
//! stays on a socket that no longer receives; a receive looks at the flag
//! under the same lock before it takes one. `connmux-model` checks this
//! file under loom (`tests/keep.rs`).

use super::prim::{AtomicBool, Mutex, MutexGuard, Ordering};

/// A socket's kept messages (`K`: the runtime's `shared::Kept`) and
/// whether it receives.
pub struct Keep<K> {
    kept: Mutex<K>,
    stopped: AtomicBool,
}

impl<K: Default> Default for Keep<K> {
    fn default() -> Self {
        Keep { kept: Mutex::new(K::default()), stopped: AtomicBool::new(false) }
    }
}

impl<K> Keep<K> {
    fn lock(&self) -> MutexGuard<'_, K> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pass's messages kept (`put` runs on what is kept), unless the
    /// socket has stopped receiving: `false`, nothing put, and the caller
    /// gives them back in a hold of the hub.
    pub fn deposit(&self, put: impl FnOnce(&mut K)) -> bool {
        let mut k = self.lock();
        if self.stopped.load(Ordering::Acquire) {
            return false;
        }
        put(&mut k);
        true
    }

    /// A receive's look with no hold of the hub: `take` on what is kept,
    /// while the socket receives (`None`: stopped).
    pub fn take<T>(&self, take: impl FnOnce(&mut K) -> Option<T>) -> Option<T> {
        let mut k = self.lock();
        match self.stopped.load(Ordering::Acquire) {
            true => None,
            false => take(&mut k),
        }
    }

    /// A receive's hold of the hub (the caller holds its lock): `f` on
    /// what is kept and whether the socket has stopped receiving.
    pub fn hold<T>(&self, f: impl FnOnce(&mut K, bool) -> T) -> T {
        let mut k = self.lock();
        let stopped = self.stopped.load(Ordering::Acquire);
        f(&mut k, stopped)
    }

    /// The socket stops receiving (the caller holds the hub lock): no
    /// deposit is taken from now on, and what is kept is given back
    /// (`give_back`).
    pub fn stop(&self, give_back: impl FnOnce(&mut K)) {
        self.stopped.store(true, Ordering::Release);
        give_back(&mut self.lock());
    }

    /// Whether it receives as the hub says (under the hub lock: its
    /// making, a receive-disable, receiving again).
    pub fn mirror(&self, stopped: bool) {
        self.stopped.store(stopped, Ordering::Release);
    }

    /// `f` on what is kept, whether or not the socket receives (its
    /// readiness, its close).
    pub fn with<T>(&self, f: impl FnOnce(&mut K) -> T) -> T {
        f(&mut self.lock())
    }
}
