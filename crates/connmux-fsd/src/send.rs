//! Queuing a reply on its connection from a file-system thread.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, Instant};

use connmux::{Bytes, KcmSocket};

use crate::conn::{Conn, Queue};
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
    /// Unwritten reply bytes of a connection the threads may leave in the
    /// mux at most, below the mux's own bound: past that a reply
    /// an I/O worker makes (an Rversion, say) is refused and aborts the
    /// connection, so the threads leave it room. A reply that would take
    /// the connection past it waits as one the mux refuses does.
    ceiling: u64,
    /// How long a reply may wait for room (`Options::send_timeout`).
    send_timeout: Duration,
    /// The pool stops: waits end at once.
    stopping: &'a AtomicBool,
    stats: &'a PoolStats,
    /// The connection of the request being run (its address), set by the
    /// pool before [`Serve::serve`](crate::Serve::serve): its reply, once
    /// queued or dropped, ends the request under the same hold of the
    /// connection's lock ([`Replier::finish`]).
    running: Cell<usize>,
    /// What that end found: `Some(next)`, the request ended, and `next` is
    /// its connection's next request taken from the backlog for this
    /// thread.
    finished: Cell<Option<Option<T::Req>>>,
    /// Replies sent with BATCH since the last without: written with the
    /// next reply sent without it, or at [`Replier::end_batch`].
    batched: Cell<usize>,
    serve: PhantomData<fn(&T)>,
}

/// Replies of one connection held back, at most, each for the run of the
/// next request ([`Replier::may_batch`]): then one goes without BATCH and
/// takes them all in one write.
const BATCH_MAX: usize = 4;

/// The first nap of a thread whose reply the mux refused (the connection's
/// backlog is full), and the longest: the naps double in between.
const NAP_FIRST: Duration = Duration::from_millis(1);
const NAP_MAX: Duration = Duration::from_millis(50);

impl<'a, T: Serve> Replier<'a, T> {
    pub(crate) fn new(
        sock: &'a KcmSocket,
        ceiling: u64,
        send_timeout: Duration,
        stopping: &'a AtomicBool,
        stats: &'a PoolStats,
    ) -> Replier<'a, T> {
        Replier {
            sock,
            ceiling,
            send_timeout,
            stopping,
            stats,
            running: Cell::new(0),
            finished: Cell::new(None),
            batched: Cell::new(0),
            serve: PhantomData,
        }
    }

    /// A request of `conn` is about to run on this thread.
    pub(crate) fn arm(&self, conn: &Conn<T>) {
        self.running.set(conn as *const Conn<T> as usize);
        self.finished.set(None);
    }

    /// Whether the request run ended with its reply, and then the next
    /// request of its connection for this thread (`Some(None)`: none).
    /// `None`: not ended (no reply went, or it failed): the pool ends it.
    pub(crate) fn take_finished(&self) -> Option<Option<T::Req>> {
        self.running.set(0);
        self.finished.take()
    }

    /// Whether the reply of `conn`'s running request may wait for the
    /// next one's: this thread takes that next request right after the
    /// reply ([`Replier::finish`]: the backlog has one, under the same
    /// hold of the lock), and fewer than [`BATCH_MAX`] wait already. A
    /// lone reply (no next request) never waits. If the thread does not
    /// run the next request itself, the pool ends the batch at once.
    fn may_batch(&self, conn: &Conn<T>, q: &Queue<T>) -> bool {
        self.running.get() == conn as *const Conn<T> as usize
            && self.batched.get() < BATCH_MAX
            && !q.paused
            && !q.backlog.is_empty()
            && !conn.gone()
            && !self.stopping.load(SeqCst)
    }

    /// Writes the replies held back by BATCH now.
    pub(crate) fn end_batch(&self) {
        if self.batched.replace(0) > 0 {
            let _ = self.sock.end_batch();
        }
    }

    /// Ends the running request of `conn` under the lock its reply was
    /// queued (or dropped) under: no longer counted as running, so a
    /// request the connection's worker reads right after the reply is not
    /// taken as behind a busy connection; and takes the next of its
    /// backlog for this thread, all in that one hold of the lock.
    fn finish(&self, conn: &Conn<T>, q: &mut Queue<T>) {
        if self.running.get() != conn as *const Conn<T> as usize {
            return;
        }
        self.running.set(0);
        self.finished.set(Some(q.end_run(conn.gone())));
    }

    /// Queues `reply` on `conn` (nothing for an empty one). `false`: it
    /// could not be queued (see [`Replier::send_gated`]).
    pub fn send(&self, conn: &Conn<T>, reply: Bytes) -> bool {
        self.send_gated(conn, reply, |_| true, |_, _| Vec::new()) != Sent::Failed
    }

    /// Queues `reply` on `conn`, waiting out a full backlog of the
    /// connection (or the threads' ceiling in it) up to the send timeout,
    /// under the connection's lock: `gate` (called before each try) says
    /// whether it is still wanted (`false`: dropped), and `then` is told
    /// what became of it and returns the messages to queue right behind it
    /// (not waited for: a full backlog fails them). So nothing decided under that lock (a
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
                if !self.queue_more(conn, more) {
                    return Sent::Failed;
                }
                self.finish(conn, &mut q);
                return Sent::Dropped;
            }
            let len = reply.len();
            let batch = self.may_batch(conn, &q);
            // The room's measure (reply bytes not yet written; the mux is
            // asked only near the ceiling). One reply alone goes whatever
            // its size, as the mux takes it.
            let over = match conn.unwritten(self.ceiling.saturating_sub(len as u64), self.sock.mux()) {
                Some(n) => n > 0 && n + len as u64 > self.ceiling,
                None => false,
            };
            let sent = if over {
                // What this thread's batch holds is written now: it may be
                // what keeps the connection over the ceiling.
                self.end_batch();
                Err(std::io::ErrorKind::WouldBlock.into())
            } else {
                self.sock.send_msg_batch(conn.hold(reply.clone()), conn.psock(), batch)
            };
            match sent {
                Ok(()) => {
                    conn.replied(len);
                    self.batched.set(if batch { self.batched.get() + 1 } else { 0 });
                    let more = then(&mut q.work, Sent::Queued);
                    if !self.queue_more(conn, more) {
                        return Sent::Failed;
                    }
                    self.finish(conn, &mut q);
                    return Sent::Queued;
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && Instant::now() < deadline
                        && !self.stopping.load(SeqCst) =>
                {
                    drop(q);
                    if nap == NAP_FIRST {
                        self.stats.send_waits.fetch_add(1, Relaxed);
                    }
                    // (The mux wrote what the batch held.)
                    self.batched.set(0);
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
                self.batched.set(0);
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
