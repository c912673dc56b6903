//! A connection's part of the pool: its backlog, its share, its room, and
//! the map of connections with state, swept of those that are gone.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

use connmux::{Bytes, PsockId};

use crate::Serve;

/// One connection: the server's state of it ([`Conn::data`]), its
/// requests not yet run ([`Queue`], behind [`Conn::lock`]) and the count
/// of its replies not yet written.
pub struct Conn<T: Serve> {
    psock: PsockId,
    /// The server's own state of the connection.
    pub data: T::Conn,
    queue: Mutex<Queue<T>>,
    /// Reply bytes handed to the mux for this connection; less the bytes
    /// the mux has written, what waits to be written (the room).
    replied: AtomicU64,
    /// The mux's count of bytes written, as last looked at: it only grows,
    /// so while `replied` is less than the room past it no look is needed.
    written: AtomicU64,
    /// Bytes of the replies the mux holds for this connection now (queued,
    /// not yet written): each counted from [`Conn::hold`] until the mux
    /// lets go of it. Exact, and read without asking the mux (whose count
    /// may wait for the workers to report): what a worker may look at.
    held: Arc<AtomicU64>,
    /// Set when the connection was found gone: its backlog is dropped and
    /// none of its requests is run.
    gone: AtomicBool,
    /// The sweep epoch when this state was made ([`Conns::sweep`]).
    born: u64,
}

/// A connection's requests that are not answered yet, and the server's
/// bookkeeping of them ([`Queue::work`]), under one lock.
pub struct Queue<T: Serve> {
    /// The server's state kept under this lock.
    pub work: T::Work,
    /// Requests with the pool (queued for a thread or running).
    pub(crate) running: usize,
    /// Requests waiting for the connection's share or for room.
    pub(crate) backlog: VecDeque<T::Req>,
    /// Waiting for room: nothing of the backlog goes to the pool.
    pub(crate) paused: bool,
}

impl<T: Serve> Queue<T> {
    /// Takes the first request waiting in the backlog that `which` picks
    /// (a request flushed before it ran).
    pub fn remove_waiting(&mut self, mut which: impl FnMut(&T::Req) -> bool) -> Option<T::Req> {
        let i = self.backlog.iter().position(&mut which)?;
        self.backlog.remove(i)
    }

    /// Requests waiting in the backlog.
    pub fn waiting(&self) -> usize {
        self.backlog.len()
    }

    /// Requests with the threads (queued or running).
    pub fn running(&self) -> usize {
        self.running
    }

    /// Whether the connection waits for room.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// A running request ended (`gone`: its connection is gone, and the
    /// backlog with it): the connection's next request for the same
    /// thread, taken from the backlog unless it waits for room.
    pub(crate) fn end_run(&mut self, gone: bool) -> Option<T::Req> {
        self.running -= 1;
        if gone {
            self.backlog.clear();
            return None;
        }
        if self.paused {
            return None;
        }
        let next = self.backlog.pop_front()?;
        self.running += 1;
        Some(next)
    }
}

impl<T: Serve> Conn<T> {
    fn new(psock: PsockId, data: T::Conn, born: u64) -> Conn<T> {
        Conn {
            psock,
            data,
            queue: Mutex::new(Queue { work: T::Work::default(), running: 0, backlog: VecDeque::new(), paused: false }),
            replied: AtomicU64::new(0),
            written: AtomicU64::new(0),
            held: Arc::default(),
            gone: AtomicBool::new(false),
            born,
        }
    }

    /// The connection.
    pub fn psock(&self) -> PsockId {
        self.psock
    }

    /// Its requests and the server's state kept with them.
    pub fn lock(&self) -> MutexGuard<'_, Queue<T>> {
        self.queue.lock().unwrap()
    }

    /// Whether it was found gone (closed, aborted, swept).
    pub fn gone(&self) -> bool {
        self.gone.load(SeqCst)
    }

    /// Counts `bytes` of reply handed to the mux for it outside the pool
    /// (a reply an I/O worker gave), so that its room counts them too.
    pub fn replied(&self, bytes: usize) {
        self.replied.fetch_add(bytes as u64, Relaxed);
    }

    /// `reply` as the mux is to hold it (no copy): its bytes count in
    /// [`Conn::held`] until the mux drops it, once written (or with the
    /// connection).
    pub fn hold(&self, reply: Bytes) -> Bytes {
        self.held.fetch_add(reply.len() as u64, Relaxed);
        Bytes::from_owner(Held { reply, held: self.held.clone() })
    }

    /// Bytes of the replies given by [`Conn::hold`] that the mux still holds.
    pub fn held(&self) -> u64 {
        self.held.load(Relaxed)
    }

    pub(crate) fn set_gone(&self) {
        self.gone.store(true, SeqCst);
        self.lock().backlog.clear();
    }

    /// Unwritten reply bytes (or less, when under `room`), or `None` when
    /// the mux no longer has the connection.
    pub(crate) fn unwritten(&self, room: u64, mux: &connmux::Mux) -> Option<u64> {
        let replied = self.replied.load(Relaxed);
        let seen = replied.saturating_sub(self.written.load(Relaxed));
        if seen < room {
            // Under the room by the last look: under it now (no look, no lock).
            return Some(seen);
        }
        let written = mux.psock_stats(self.psock).ok()?.tx_bytes;
        self.written.fetch_max(written, Relaxed);
        Some(replied.saturating_sub(written))
    }
}

/// A reply the mux holds ([`Conn::hold`]): uncounted when dropped.
struct Held {
    reply: Bytes,
    held: Arc<AtomicU64>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.reply
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.fetch_sub(self.reply.len() as u64, Relaxed);
    }
}

/// The connections with state, by psock.
pub(crate) struct Conns<T: Serve> {
    map: Mutex<HashMap<PsockId, Arc<Conn<T>>>>,
    /// Sweeps begun.
    epoch: AtomicU64,
}

impl<T: Serve> Conns<T> {
    pub(crate) fn new() -> Conns<T> {
        Conns { map: Mutex::default(), epoch: AtomicU64::new(0) }
    }

    /// The state of `p`, made with `data` if it has none.
    pub(crate) fn get(&self, p: PsockId, data: impl FnOnce() -> T::Conn) -> Arc<Conn<T>> {
        let mut map = self.map.lock().unwrap();
        let born = self.epoch.load(SeqCst);
        map.entry(p).or_insert_with(|| Arc::new(Conn::new(p, data(), born))).clone()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }

    /// Forgets the connections that are gone: not among `live()`, the
    /// connections attached now, and older than that look. A connection
    /// whose state was made after the sweep began may be missing from it
    /// (attached after the look), so it stays: forgotten, its state would
    /// be gone a moment after its first request made it.
    pub(crate) fn sweep(&self, live: impl FnOnce() -> Vec<PsockId>) {
        // (State made before this mark belongs to a connection attached
        // before it, hence before the look.)
        let mark = self.epoch.fetch_add(1, SeqCst) + 1;
        let live: HashSet<_> = live().into_iter().collect();
        let mut gone = Vec::new();
        self.map.lock().unwrap().retain(|p, c| {
            let keep = c.born >= mark || live.contains(p);
            if !keep {
                gone.push(c.clone());
            }
            keep
        });
        // (Each connection's lock outside the map's.)
        for c in gone {
            c.set_gone();
        }
    }
}
