//! The waker: resumes each paused connection once its peer has read
//! enough of its replies, drops the backlog of one that is gone, and
//! sweeps the state of connections the mux no longer has.
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::conn::Conn;
use crate::pool::{Job, Pool};
use crate::Serve;

/// The waker's first look at a paused connection comes after this, and
/// the looks after it ever further apart, up to [`WAKE_MAX`].
pub const WAKE_FIRST: Duration = Duration::from_millis(1);
pub const WAKE_MAX: Duration = Duration::from_millis(100);

/// How often the state of connections that are gone is swept.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A connection waiting for room.
pub(crate) struct Paused<T: Serve> {
    conn: Arc<Conn<T>>,
    /// When the waker looks next, and the wait after that (doubled at each
    /// look that finds no room).
    next: Instant,
    nap: Duration,
}

impl<T: Serve> Pool<T> {
    /// Hands a connection just paused to the waker.
    pub(crate) fn pause(&self, conn: Arc<Conn<T>>) {
        let next = Instant::now() + WAKE_FIRST;
        self.paused.lock().unwrap().push(Paused { conn, next, nap: WAKE_FIRST });
        self.wake.notify_one();
    }

    /// The waker thread: until the pool stops.
    pub(crate) fn waker(&self) {
        let mut sweep_at = Instant::now() + SWEEP_EVERY;
        loop {
            let list = {
                let mut l = self.paused.lock().unwrap();
                // Asleep while none is paused and no sweep is due.
                loop {
                    if self.stopping() {
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
                self.conns.sweep(|| self.mux.psocks());
                sweep_at = Instant::now() + SWEEP_EVERY;
            }
            let mut still = Vec::new();
            let now = Instant::now();
            for mut e in list {
                if e.next > now {
                    still.push(e);
                    continue;
                }
                if !self.look(&e.conn) {
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
                if !fresh && !self.stopping() {
                    let wait = first.min(sweep_at).saturating_duration_since(Instant::now()).max(WAKE_FIRST);
                    drop(self.wake.wait_timeout(l, wait).unwrap());
                }
            }
        }
    }

    /// Looks at one paused connection: resumes it if it has room (its
    /// backlog up to its share back to the queue), drops its backlog if it
    /// is gone. `false`: still no room.
    fn look(&self, conn: &Arc<Conn<T>>) -> bool {
        match conn.unwritten(self.opts.room, &self.mux) {
            None => conn.set_gone(),
            Some(n) if n >= self.opts.room => return false,
            Some(_) => {}
        }
        let mut q = conn.lock();
        q.paused = false;
        if conn.gone() {
            q.backlog.clear();
            return true;
        }
        let mut resumed = Vec::new();
        while q.running < self.opts.share {
            let Some(req) = q.backlog.pop_front() else { break };
            q.running += 1;
            resumed.push(req);
        }
        drop(q);
        for req in resumed {
            if !self.queue(Job { conn: conn.clone(), req }) {
                break;
            }
        }
        true
    }
}
