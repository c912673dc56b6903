//! Queuing a reply on its connection from a file-system thread.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use connmux::{Bytes, KcmSocket};

use crate::conn::Conn;
use crate::stats::PoolStats;
use crate::Serve;

/// What became of a reply ([`Replier::send_gated`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// Queued on its connection.
    Queued,
    /// Not sent: empty, or refused by the gate.
    Dropped,
    /// Could not be queued (the connection is gone, or its backlog stayed
    /// full for the send timeout, or the pool stops).
    Failed,
}

/// A file-system thread's way to its connections: the socket it sends on.
pub struct Replier<'a, T: Serve> {
    sock: &'a KcmSocket,
    /// How long a reply may wait for room (`Options::send_timeout`).
    send_timeout: Duration,
    /// The pool stops: waits end at once.
    stopping: &'a AtomicBool,
    stats: &'a PoolStats,
    serve: PhantomData<fn(&T)>,
}

/// The first nap of a thread whose reply the mux refused (the connection's
/// backlog is full), and the longest: the naps double in between.
const NAP_FIRST: Duration = Duration::from_millis(1);
const NAP_MAX: Duration = Duration::from_millis(50);

impl<'a, T: Serve> Replier<'a, T> {
    pub(crate) fn new(
        sock: &'a KcmSocket,
        send_timeout: Duration,
        stopping: &'a AtomicBool,
        stats: &'a PoolStats,
    ) -> Replier<'a, T> {
        Replier { sock, send_timeout, stopping, stats, serve: PhantomData }
    }

    /// Queues `reply` on `conn` (nothing for an empty one). `false`: it
    /// could not be queued (see [`Replier::send_gated`]).
    pub fn send(&self, conn: &Conn<T>, reply: Bytes) -> bool {
        self.send_gated(conn, reply, |_| true, |_, _| Vec::new()) != Sent::Failed
    }

    /// Queues `reply` on `conn`, waiting out a full backlog of the
    /// connection up to the send timeout, under the connection's lock:
    /// `gate` (called before each try) says whether it is still wanted
    /// (`false`: dropped), and `then` is told what became of it and
    /// returns the messages to queue right behind it (not waited for: a
    /// full backlog fails them). So nothing decided under that lock (a
    /// flush of the request, say) can come between the check and the send.
    ///
    /// Why naps, and not a wake-up: the runtime raises no event when a
    /// connection's backlog drains (a socket's writability is its own
    /// send buffer, not one peer's backlog), so the thread looks again
    /// after 1 ms, doubling to 50 ms. The naps are bounded by the send
    /// timeout, and a pool that stops ends them at once.
    pub fn send_gated(
        &self,
        conn: &Conn<T>,
        reply: Bytes,
        mut gate: impl FnMut(&mut T::Work) -> bool,
        then: impl FnOnce(&mut T::Work, Sent) -> Vec<Bytes>,
    ) -> Sent {
        let deadline = Instant::now() + self.send_timeout;
        let mut nap = NAP_FIRST;
        // Bounded by the deadline: each turn that finds no room sleeps.
        loop {
            let mut q = conn.lock();
            if reply.is_empty() || !gate(&mut q.work) {
                let more = then(&mut q.work, Sent::Dropped);
                return if self.queue_more(conn, more) { Sent::Dropped } else { Sent::Failed };
            }
            let len = reply.len();
            match self.sock.send_msg(conn.hold(reply.clone()), Some(conn.psock())) {
                Ok(()) => {
                    conn.replied(len);
                    let more = then(&mut q.work, Sent::Queued);
                    return if self.queue_more(conn, more) { Sent::Queued } else { Sent::Failed };
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && Instant::now() < deadline
                        && !self.stopping.load(SeqCst) =>
                {
                    drop(q);
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(NAP_MAX);
                }
                Err(_) => {
                    then(&mut q.work, Sent::Failed);
                    return Sent::Failed;
                }
            }
        }
    }

    /// Messages behind a reply, not waited for. `false`: one was refused.
    fn queue_more(&self, conn: &Conn<T>, more: Vec<Bytes>) -> bool {
        let mut ok = true;
        for m in more {
            let len = m.len();
            if self.sock.send_msg(conn.hold(m), Some(conn.psock())).is_ok() {
                conn.replied(len);
            } else {
                ok = false;
            }
        }
        ok
    }

    /// The pool's counters.
    pub fn stats(&self) -> &PoolStats {
        self.stats
    }
}
