//! The waker: when to look again at each paused connection (once its
//! peer may have read enough of its replies) and when to sweep the state of
//! connections the mux no longer has; what a look and a sweep do is the
//! pool's (`Pool::look`, `Conns::sweep`).
//!
//! Why it looks rather than waits for a signal: the runtime tells no one
//! that a connection's replies were written (its events are failures and
//! closes; a socket's writability is its own send buffer, not one peer's
//! backlog; [`connmux::KcmSocket::flush`] itself naps). So the waker looks
//! at each paused connection's written bytes ([`connmux::Mux::psock_stats`])
//! after [`WAKE_FIRST`], then ever less often, doubling to [`WAKE_MAX`]: a
//! peer that never reads costs a look every 100 ms, not a spin. It sleeps
//! on a condition variable in between, woken at once when a connection is
//! paused or the pool stops; with none paused it wakes only to sweep
//! ([`SWEEP_EVERY`]).

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::conn::Conn;
use crate::Serve;

/// The waker's first look at a paused connection comes after this, and
/// the looks after it ever further apart, up to [`WAKE_MAX`].
pub const WAKE_FIRST: Duration = Duration::from_millis(1);
pub const WAKE_MAX: Duration = Duration::from_millis(100);

/// How often the state of connections that are gone is swept.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A connection waiting for room.
struct Paused<T: Serve> {
    conn: Arc<Conn<T>>,
    /// When the waker looks next, and the wait after that (doubled at each
    /// look that finds no room).
    next: Instant,
    nap: Duration,
}

/// The connections paused for room, and the condition the waker thread
/// sleeps on.
pub(crate) struct Waker<T: Serve> {
    paused: Mutex<Vec<Paused<T>>>,
    wake: Condvar,
}

impl<T: Serve> Waker<T> {
    pub(crate) fn new() -> Waker<T> {
        Waker { paused: Mutex::default(), wake: Condvar::new() }
    }

    /// Hands a connection just paused to the waker.
    pub(crate) fn pause(&self, conn: Arc<Conn<T>>) {
        let next = Instant::now() + WAKE_FIRST;
        self.paused.lock().unwrap().push(Paused { conn, next, nap: WAKE_FIRST });
        self.wake.notify_one();
    }

    /// Wakes the waker thread so that it sees `stopping` (set before).
    pub(crate) fn stop(&self) {
        let _l = self.paused.lock().unwrap();
        self.wake.notify_all();
    }

    /// The waker thread, until `stopping`: `look` at each paused connection
    /// when due (`false`: still no room, look again later), `sweep` every
    /// [`SWEEP_EVERY`].
    pub(crate) fn run(
        &self,
        stopping: &AtomicBool,
        mut sweep: impl FnMut(),
        mut look: impl FnMut(&Arc<Conn<T>>) -> bool,
    ) {
        let mut sweep_at = Instant::now() + SWEEP_EVERY;
        loop {
            let list = {
                let mut l = self.paused.lock().unwrap();
                // Asleep while none is paused and no sweep is due.
                loop {
                    if stopping.load(SeqCst) {
                        return;
                    }
                    let now = Instant::now();
                    if !l.is_empty() || now >= sweep_at {
                        break;
                    }
                    l = self.wake.wait_timeout(l, sweep_at - now).unwrap().0;
                }
                std::mem::take(&mut *l)
            };
            if Instant::now() >= sweep_at {
                sweep();
                sweep_at = Instant::now() + SWEEP_EVERY;
            }
            let mut still = Vec::new();
            let now = Instant::now();
            for mut e in list {
                if e.next > now {
                    still.push(e);
                    continue;
                }
                if !look(&e.conn) {
                    e.nap = (e.nap * 2).min(WAKE_MAX);
                    e.next = now + e.nap;
                    still.push(e);
                }
            }
            if let Some(first) = still.iter().map(|e| e.next).min() {
                let mut l = self.paused.lock().unwrap();
                let fresh = !l.is_empty();
                l.extend(still);
                // Until the next look or sweep is due, or a connection is
                // paused meanwhile (its first look is due sooner), or the
                // pool stops.
                if !fresh && !stopping.load(SeqCst) {
                    let wait = first.min(sweep_at).saturating_duration_since(Instant::now()).max(WAKE_FIRST);
                    drop(self.wake.wait_timeout(l, wait).unwrap());
                }
            }
        }
    }
}
