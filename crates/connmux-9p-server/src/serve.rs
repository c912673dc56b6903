//! The 9P2000.L service: requests decoded on the I/O workers, answered there
//! when they only touch the connection's fid table or an inode already in
//! memory, and otherwise handed to a pool of file-system threads that send
//! their reply on the connection themselves.
//!
//! Why a pool beside the workers: a read, a directory listing or an fsync
//! may wait on the disk for milliseconds. Run on a worker, that wait would
//! hold every other connection the worker reads; run on the pool, the worker
//! goes on reading and answering the others, and only the threads blocked in
//! the file system wait. The pool sends with an addressed send
//! (`KcmSocket::send_to`) on sockets of the same mux that take no messages.
//!
//! Fairness: a connection has at most `share` requests with the pool at a
//! time; the rest wait in its own backlog, so one client's slow requests
//! hold at most its share of the file-system threads and never the queue
//! the others' requests pass through.
//!
//! Room: a request is run only while its connection's unwritten replies are
//! under [`ROOM`]. A connection over it is paused (its requests stay in its
//! backlog, nothing is read or built for it) and a waker thread looks at it
//! ever less often (1 ms doubling to 100 ms) until the peer has taken
//! enough: a peer that sends reads and never collects the replies holds no
//! thread and no CPU, and no more than [`ROOM`] plus its share of replies
//! in memory.
//!
//! Flush: a Tflush is answered at once. A flushed request still waiting is
//! dropped; a running one that only reads (Tread, Treaddir, ...) is marked,
//! and its reply is not sent. The mark and the send are under the
//! connection's work lock, so the reply either left before the Rflush was
//! produced or never leaves. A running request that may change state (a
//! walk makes a fid, a create a file) is answered, and the Rflush right
//! after it: a dropped reply would have the client take as undone what
//! was done. No open waits, so that reply comes promptly. A second
//! Tversion drops or cancels every request of the connection (all of
//! them: the old session's fids go too), and its Rversion is sent at once;
//! a request of the old session still running changes no fid of
//! the new one.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connmux::service::{Handler, Verdict};
use connmux::{Bytes, KcmSocket, PsockId};
use connmux_9p::header::peek_tag;
use connmux_9p::rmsg::{self, Encoder};
use connmux_9p::{MsgType, Tmsg, WireError};
use rustix::io::Errno;

use crate::fs::{Export, Fid, Quota, Xattr, R};
use crate::users::{self, Users};

/// Unwritten reply bytes of a connection above which its requests wait: half the mux's backlog of replies per connection (4 MiB), so the
/// replies of the requests let through still fit in it.
pub const ROOM: u64 = 2 << 20;

/// Reads of at most this many bytes are answered on the I/O worker when
/// their pages are in memory ([`Export::read_cached`]).
pub const INLINE_READ: usize = 16 * 1024;

/// The smallest msize accepted in Tversion: every reply but a read's or a
/// directory listing's (which are cut to msize) fits in it.
pub const MIN_MSIZE: u32 = 4096;

/// Per-connection state: fids and requests in flight.
pub struct Conn {
    fids: Mutex<HashMap<u32, Arc<Fid>>>,
    /// Tversions seen: a request of an older session changes no fid.
    /// Changed under the `fids` lock.
    session: AtomicU64,
    /// Most fids this connection may hold.
    max_fids: usize,
    /// Its descriptors: open files and handles.
    quota: Quota,
    work: Mutex<Work>,
    msize: AtomicU32,
    /// Reply bytes handed to the mux for this connection; less the bytes the
    /// mux has written, what waits to be written ([`ROOM`]).
    replied: AtomicU64,
    /// The mux's count of bytes written, as last looked at: it only grows,
    /// so while `replied` is less than [`ROOM`] past it no look is needed.
    written: AtomicU64,
    /// Set when the connection was found gone: its backlog is dropped.
    gone: AtomicBool,
    /// The handler's sweep epoch when this state was made
    /// ([`NinepHandler::sweep`]).
    born: u64,
}

/// The requests of a connection that are not answered yet.
#[derive(Default)]
struct Work {
    /// Each tag's requests (ids) not answered. A client may reuse a tag once
    /// it has the reply or the Rflush, so a tag may have more than one.
    tags: HashMap<u16, Vec<u64>>,
    /// Requests flushed (or cancelled by Tversion) while with the pool:
    /// their replies are dropped.
    cancelled: HashSet<u64>,
    /// Running requests that may change the connection's state (a fid
    /// made, opened or removed, a file created): a flush of one is answered
    /// right after its reply, never instead of it, or the client would take
    /// as undone what was done (and, say, reuse a fid number still held).
    changes: HashSet<u64>,
    /// Such a request's id → the Tflushes (tags) answered after its reply.
    deferred: HashMap<u64, Vec<u16>>,
    /// A deferred Tflush's tag → the replies it still waits for.
    flush_waits: HashMap<u16, usize>,
    next_id: u64,
    /// Requests with the pool (queued for a thread or running).
    running: usize,
    /// Requests waiting for the connection's share or for room.
    backlog: VecDeque<Job>,
    backlog_bytes: usize,
    /// Waiting for room: nothing of the backlog goes to the pool.
    paused: bool,
}

impl Work {
    fn forget(&mut self, tag: u16, id: u64) {
        if let Some(ids) = self.tags.get_mut(&tag) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.tags.remove(&tag);
            }
        }
    }
    /// Tflush `ftag` of `tag`: drops its waiting requests and marks its
    /// running ones cancelled, but for those that may change state, whose
    /// replies the Rflush then follows. Returns whether the Rflush waits.
    fn flush(&mut self, tag: u16, ftag: u16) -> bool {
        let mut waits = 0;
        for id in self.tags.remove(&tag).unwrap_or_default() {
            // (One an earlier Tflush waits for stays: that Rflush needs its reply.)
            if !self.deferred.contains_key(&id) && self.drop_waiting(id) {
                continue;
            }
            if self.changes.contains(&id) {
                self.deferred.entry(id).or_default().push(ftag);
                waits += 1;
            } else {
                self.cancelled.insert(id);
            }
        }
        if waits > 0 {
            *self.flush_waits.entry(ftag).or_default() += waits;
        }
        waits > 0
    }

    /// Tversion: every request is dropped or cancelled (the old session's
    /// fids go with it, so no change of one matters), and so are the
    /// Tflushes waiting for them.
    fn cancel_all(&mut self) {
        let ids: Vec<u64> = self.tags.drain().flat_map(|(_, v)| v).collect();
        for id in ids {
            if !self.drop_waiting(id) {
                self.cancelled.insert(id);
            }
        }
        self.deferred.clear();
        self.flush_waits.clear();
    }

    /// Removes request `id` from the backlog, if it waits there.
    fn drop_waiting(&mut self, id: u64) -> bool {
        let Some(i) = self.backlog.iter().position(|j| j.id == id) else { return false };
        let j = self.backlog.remove(i).expect("found");
        self.backlog_bytes -= j.msg.len();
        self.changes.remove(&id);
        true
    }

    /// Request `id` is answered (or dropped): the Tflushes that waited for
    /// it and for nothing else now, whose Rflush is to be sent.
    fn done(&mut self, tag: u16, id: u64) -> Vec<u16> {
        self.forget(tag, id);
        self.changes.remove(&id);
        let mut ready = Vec::new();
        for ftag in self.deferred.remove(&id).unwrap_or_default() {
            if let Some(n) = self.flush_waits.get_mut(&ftag) {
                *n -= 1;
                if *n == 0 {
                    self.flush_waits.remove(&ftag);
                    ready.push(ftag);
                }
            }
        }
        ready
    }
}

impl Conn {
    fn new(max_fids: usize, born: u64) -> Conn {
        Conn {
            fids: Mutex::default(),
            session: AtomicU64::new(0),
            max_fids,
            quota: Quota::default(),
            work: Mutex::default(),
            msize: AtomicU32::new(0),
            replied: AtomicU64::new(0),
            written: AtomicU64::new(0),
            gone: AtomicBool::new(false),
            born,
        }
    }
}

impl Conn {
    fn fid(&self, fid: u32) -> R<Arc<Fid>> {
        self.fids.lock().unwrap().get(&fid).cloned().ok_or(Errno::BADF)
    }
    fn insert_new(&self, session: u64, fid: u32, f: Fid) -> R<()> {
        let mut fids = self.fids.lock().unwrap();
        if self.session.load(SeqCst) != session {
            return Err(Errno::CANCELED);
        }
        if fids.contains_key(&fid) {
            return Err(Errno::BADF);
        }
        if fids.len() >= self.max_fids {
            return Err(Errno::MFILE);
        }
        fids.insert(fid, Arc::new(f));
        Ok(())
    }
    fn replace(&self, session: u64, fid: u32, f: Fid) -> R<()> {
        let mut fids = self.fids.lock().unwrap();
        if self.session.load(SeqCst) != session {
            return Err(Errno::CANCELED);
        }
        if fids.len() >= self.max_fids && !fids.contains_key(&fid) {
            return Err(Errno::MFILE);
        }
        fids.insert(fid, Arc::new(f));
        Ok(())
    }
    fn remove(&self, session: u64, fid: u32) -> R<Arc<Fid>> {
        let mut fids = self.fids.lock().unwrap();
        if self.session.load(SeqCst) != session {
            return Err(Errno::CANCELED);
        }
        fids.remove(&fid).ok_or(Errno::BADF)
    }
    /// After a rename: the fids at or below `old` now lie below `new`.
    fn moved(&self, old: &Path, new: &Path) {
        for f in self.fids.lock().unwrap().values() {
            let mut p = f.path.lock().unwrap();
            if let Ok(rest) = p.strip_prefix(old) {
                *p = if rest.as_os_str().is_empty() { new.to_path_buf() } else { new.join(rest) };
            }
        }
    }
}

/// Counters shown by `connmux stat`.
#[derive(Default)]
pub struct NinepStats {
    pub requests: AtomicU64,
    pub to_pool: AtomicU64,
    pub errors: AtomicU64,
    pub flushes: AtomicU64,
    /// Tflushes answered after the reply of a request that may change state.
    pub flushes_deferred: AtomicU64,
    /// Replies not sent: their request was flushed or its session ended.
    pub replies_dropped: AtomicU64,
    /// Times a connection was paused: its unwritten replies over [`ROOM`].
    pub paused: AtomicU64,
    /// Connections closed for a malformed message.
    pub bad_messages: AtomicU64,
    /// Connections closed for more requests waiting than `--fs-queue`.
    pub overloads: AtomicU64,
    /// Connections closed because a reply could not be queued in time.
    pub send_failures: AtomicU64,
}

struct Job {
    conn: Arc<Conn>,
    psock: PsockId,
    tag: u16,
    id: u64,
    session: u64,
    msg: Bytes,
}

impl Job {
    /// Whether the request may change the connection's or the export's
    /// state: all but those that only read.
    fn changes(&self) -> bool {
        const READ_ONLY: [MsgType; 7] = [
            MsgType::TREAD,
            MsgType::TGETATTR,
            MsgType::TREADDIR,
            MsgType::TSTATFS,
            MsgType::TREADLINK,
            MsgType::TGETLOCK,
            MsgType::TFSYNC,
        ];
        let ty = self.msg.get(4).copied().unwrap_or(0);
        !READ_ONLY.iter().any(|t| t.0 == ty)
    }
}

/// The handler run by the I/O workers.
pub struct NinepHandler {
    export: Arc<Export>,
    conns: Mutex<HashMap<PsockId, Arc<Conn>>>,
    pool: Arc<Pool>,
    pub stats: Arc<NinepStats>,
    max_msize: u32,
    max_fids: usize,
    /// Requests of one connection waiting in its backlog, at most.
    backlog_max: usize,
    /// Sweeps begun ([`NinepHandler::sweep`]).
    epoch: AtomicU64,
}

/// A connection waiting for room.
struct Paused {
    conn: Arc<Conn>,
    psock: PsockId,
    /// When the waker looks next, and the wait after that (doubled each
    /// look that finds no room: a peer that never reads costs a look a
    /// [`WAKE_MAX`], not one a [`WAKE_FIRST`]).
    next: Instant,
    nap: Duration,
}

/// The file-system threads' shared part.
pub struct Pool {
    /// Whom attaches are served as.
    users: Arc<Users>,
    jobs: crossbeam::channel::Receiver<Job>,
    tx: crossbeam::channel::Sender<Job>,
    export: Arc<Export>,
    stats: Arc<NinepStats>,
    /// Requests of one connection with the pool at a time, at most.
    share: usize,
    /// Connections paused for room, looked at by the waker.
    paused: Mutex<Vec<Paused>>,
    wake: Condvar,
    /// Sockets to send replies on, one per thread (set once the mux runs).
    pub senders: OnceLock<Vec<KcmSocket>>,
    /// The mux (set once it runs): what it has written of each connection.
    pub mux: OnceLock<connmux::Mux>,
    /// Disconnected (its sender dropped) when the server stops: the
    /// threads end.
    quit: crossbeam::channel::Receiver<()>,
    /// Set when the server stops: the waker ends.
    stopping: AtomicBool,
}

impl NinepHandler {
    /// `queue`: requests waiting for a file-system thread, at most, and
    /// requests one connection may have waiting in its own backlog (more,
    /// and the connection is closed: `overloads`). A worker that finds the
    /// queue full waits for room (its connections' TCP windows close
    /// meanwhile); a connection's backlog holds at most `queue` × msize.
    /// `share`: a connection's requests with the file-system threads at a
    /// time, at most.
    pub fn new(
        export: Arc<Export>,
        max_msize: u32,
        queue: usize,
        max_fids: usize,
        share: usize,
        users: Arc<Users>,
        quit: crossbeam::channel::Receiver<()>,
    ) -> (Arc<NinepHandler>, Arc<Pool>) {
        let (tx, rx) = crossbeam::channel::bounded(queue.max(1));
        let stats = Arc::new(NinepStats::default());
        let pool = Arc::new(Pool {
            users,
            jobs: rx,
            tx,
            export: export.clone(),
            stats: stats.clone(),
            share: share.max(1),
            paused: Mutex::default(),
            wake: Condvar::new(),
            senders: OnceLock::new(),
            mux: OnceLock::new(),
            quit,
            stopping: AtomicBool::new(false),
        });
        let h = NinepHandler {
            export,
            conns: Mutex::default(),
            pool: pool.clone(),
            stats,
            max_msize: max_msize.max(MIN_MSIZE),
            max_fids,
            backlog_max: queue.max(1),
            epoch: AtomicU64::new(0),
        };
        (Arc::new(h), pool)
    }

    fn conn(&self, p: PsockId) -> Arc<Conn> {
        let mut conns = self.conns.lock().unwrap();
        let born = self.epoch.load(SeqCst);
        conns.entry(p).or_insert_with(|| Arc::new(Conn::new(self.max_fids, born))).clone()
    }

    /// Forget the connections that are gone: not among `live()`, the
    /// connections attached now, and older than that look. A connection
    /// whose state was made after the sweep began may be missing from it
    /// (attached after the look), so it stays: forgotten, its fids would
    /// be gone a moment after its attach made them (its next walk EBADF).
    pub fn sweep(&self, live: impl FnOnce() -> Vec<PsockId>) {
        // (State made before this mark belongs to a connection attached
        // before it, hence before the look.)
        let mark = self.epoch.fetch_add(1, SeqCst) + 1;
        let live: std::collections::HashSet<_> = live().into_iter().collect();
        self.conns.lock().unwrap().retain(|p, c| {
            let keep = c.born >= mark || live.contains(p);
            if !keep {
                c.gone.store(true, SeqCst);
                let mut w = c.work.lock().unwrap();
                w.backlog.clear();
                w.backlog_bytes = 0;
            }
            keep
        });
    }

    /// The export served.
    pub fn export(&self) -> &Export {
        &self.export
    }

    /// Connections with state.
    pub fn conns(&self) -> usize {
        self.conns.lock().unwrap().len()
    }

    /// Answers a request here, or `None` when it goes to the pool.
    fn inline(&self, conn: &Conn, tag: u16, m: &Tmsg<'_>, out: &mut Vec<u8>) -> Option<R<()>> {
        Some(match m {
            Tmsg::Version { msize, version } => {
                // Below the floor some replies would not fit.
                if *msize < MIN_MSIZE {
                    return Some(Err(Errno::INVAL));
                }
                let msize = (*msize).min(self.max_msize);
                conn.msize.store(msize, Relaxed);
                // A new session: what is pending of the old one is
                // cancelled (no reply of it follows the Rversion) and every
                // fid is gone. Lock order: work, then fids.
                conn.work.lock().unwrap().cancel_all();
                {
                    let mut fids = conn.fids.lock().unwrap();
                    conn.session.fetch_add(1, SeqCst);
                    fids.clear();
                }
                let v = if version.starts_with(connmux_9p::VERSION_L) { connmux_9p::VERSION_L } else { "unknown" };
                let mut e = Encoder::begin(out, MsgType::RVERSION, tag);
                e.u32(msize).str(v);
                e.finish();
                Ok(())
            }
            // No authentication: ENOENT is how diod says none is needed, and
            // its clients go on to attach.
            Tmsg::Auth { .. } => Err(Errno::NOENT),
            Tmsg::Flush { oldtag } => {
                self.stats.flushes.fetch_add(1, Relaxed);
                if conn.work.lock().unwrap().flush(*oldtag, tag) {
                    // Answered by the file-system thread, after the reply.
                    self.stats.flushes_deferred.fetch_add(1, Relaxed);
                    return Some(Ok(()));
                }
                rmsg::empty(out, MsgType::RFLUSH, tag);
                Ok(())
            }
            Tmsg::Clunk { fid } => {
                let mut fids = conn.fids.lock().unwrap();
                // A Txattrcreate fid sets its attribute as it goes: on the pool.
                if fids.get(fid).is_some_and(|f| matches!(f.xattr.as_deref(), Some(Xattr::Write { .. }))) {
                    return None;
                }
                fids.remove(fid).map(|_| rmsg::empty(out, MsgType::RCLUNK, tag)).ok_or(Errno::BADF)
            }
            // Here when it costs an fstat of a descriptor the fid holds; one
            // to be looked up by path goes to the pool (a lookup may wait on
            // the disk).
            Tmsg::Getattr { fid, .. } => match conn.fid(*fid) {
                Ok(f) if f.cheap() => {
                    self.export.getattr(&f).map(|(valid, q, a)| rmsg::getattr(out, tag, valid, &q, &a))
                }
                Ok(_) => return None,
                Err(e) => Err(e),
            },
            Tmsg::Xattrwalk { .. } | Tmsg::Xattrcreate { .. } if !self.export.xattrs => Err(Errno::OPNOTSUPP),
            // A small read of a regular file whose pages are in memory: here,
            // as a getattr is (it cannot wait on the disk); anything else
            // (a page to read from the disk, an error) on the pool.
            Tmsg::Read { fid, offset, count } if *count as usize <= INLINE_READ => {
                let f = conn.fid(*fid).ok()?;
                f.regular()?;
                let msize = conn.msize.load(Relaxed).max(MIN_MSIZE) as usize;
                let count = (*count as usize).min(msize - connmux_9p::IO_HEADER);
                let mut e = Encoder::begin(out, MsgType::RREAD, tag);
                e.u32(0);
                match self.export.read_cached(&f, *offset, count, e.buf()) {
                    Ok(n) => {
                        e.patch_u32(7, n as u32);
                        e.finish();
                        Ok(())
                    }
                    Err(_) => {
                        out.clear();
                        return None;
                    }
                }
            }
            _ => return None,
        })
    }

    /// Hands a request to the pool, or to its connection's backlog when the
    /// connection has its share with the pool or waits for room. `false`:
    /// the backlog is full, and the connection is to be closed.
    fn submit(&self, conn: Arc<Conn>, psock: PsockId, tag: u16, msg: Bytes) -> bool {
        let mut w = conn.work.lock().unwrap();
        let id = w.next_id;
        w.next_id += 1;
        let job = Job { conn: conn.clone(), psock, tag, id, session: conn.session.load(SeqCst), msg };
        if job.changes() {
            w.changes.insert(id);
        }
        if w.paused || w.running >= self.pool.share {
            if w.backlog.len() >= self.backlog_max {
                return false;
            }
            w.tags.entry(tag).or_default().push(id);
            w.backlog_bytes += job.msg.len();
            w.backlog.push_back(job);
            return true;
        }
        w.tags.entry(tag).or_default().push(id);
        w.running += 1;
        drop(w);
        self.stats.to_pool.fetch_add(1, Relaxed);
        let _ = self.pool.tx.send(job);
        true
    }
}

/// The fid whose user a request acts as, and the group a creation asks
/// for (`None` for an attach, which names its user itself).
fn acting_fid(m: &Tmsg<'_>) -> Option<(u32, Option<u32>)> {
    let just = |f: &u32| Some((*f, None));
    match m {
        Tmsg::Lcreate { fid, gid, .. } | Tmsg::Symlink { fid, gid, .. } => Some((*fid, Some(*gid))),
        Tmsg::Mkdir { dfid, gid, .. } | Tmsg::Mknod { dfid, gid, .. } => Some((*dfid, Some(*gid))),
        Tmsg::Walk { fid, .. }
        | Tmsg::Lopen { fid, .. }
        | Tmsg::Read { fid, .. }
        | Tmsg::Write { fid, .. }
        | Tmsg::Readdir { fid, .. }
        | Tmsg::Setattr { fid, .. }
        | Tmsg::Getattr { fid, .. }
        | Tmsg::Remove { fid }
        | Tmsg::Clunk { fid }
        | Tmsg::Readlink { fid }
        | Tmsg::Rename { fid, .. }
        | Tmsg::Statfs { fid }
        | Tmsg::Fsync { fid, .. }
        | Tmsg::Xattrwalk { fid, .. }
        | Tmsg::Xattrcreate { fid, .. } => just(fid),
        Tmsg::Unlinkat { dirfid, .. } => just(dirfid),
        Tmsg::Link { dfid, .. } => just(dfid),
        Tmsg::Renameat { olddirfid, .. } => just(olddirfid),
        Tmsg::Lock(l) | Tmsg::Getlock(l) => just(&l.fid),
        _ => None,
    }
}

/// Bytes a reply to `tag` of a request takes at most in Rlerror.
fn reply_error(out: &mut Vec<u8>, tag: u16, e: Errno) {
    rmsg::rlerror(out, tag, e.raw_os_error() as u32);
}

impl Handler for NinepHandler {
    fn handle(&self, request: Bytes, from: PsockId, scratch: &mut BytesMut) -> Verdict {
        self.stats.requests.fetch_add(1, Relaxed);
        let (tag, m) = match Tmsg::decode(&request) {
            Ok(x) => x,
            Err(WireError::UnknownType(_)) => {
                // A request of another dialect: an error, and the connection goes on.
                let mut out = Vec::with_capacity(11);
                reply_error(&mut out, peek_tag(&request).unwrap_or(0), Errno::OPNOTSUPP);
                self.stats.errors.fetch_add(1, Relaxed);
                self.conn(from).replied.fetch_add(out.len() as u64, Relaxed);
                return Verdict::Reply(Bytes::from(out));
            }
            Err(_) => {
                self.stats.bad_messages.fetch_add(1, Relaxed);
                return Verdict::Close;
            }
        };
        let conn = self.conn(from);
        let mut out = Vec::new();
        match self.inline(&conn, tag, &m, &mut out) {
            Some(Ok(())) if out.is_empty() => Verdict::NoReply,
            Some(r) => {
                if let Err(e) = r {
                    self.stats.errors.fetch_add(1, Relaxed);
                    out.clear();
                    reply_error(&mut out, tag, e);
                }
                conn.replied.fetch_add(out.len() as u64, Relaxed);
                scratch.extend_from_slice(&out);
                Verdict::Reply(scratch.split().freeze())
            }
            None => {
                if self.submit(conn, from, tag, request) {
                    Verdict::NoReply
                } else {
                    self.stats.overloads.fetch_add(1, Relaxed);
                    Verdict::Close
                }
            }
        }
    }
}

/// How long a pool thread waits to queue a reply before it gives up on the
/// connection (a peer that reads nothing cannot hold the thread longer).
/// Set on each sender when it is made.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The waker's first look at a paused connection comes after this, and
/// the looks after it ever further apart, up to [`WAKE_MAX`].
const WAKE_FIRST: Duration = Duration::from_millis(1);
const WAKE_MAX: Duration = Duration::from_millis(100);

impl Pool {
    /// Runs pool thread `i` until the server stops (its quit channel is
    /// disconnected), `nice` steps below the workers (0: beside them).
    pub fn run(&self, i: usize, mux: connmux::Mux, nice: i32) {
        if nice != 0 {
            let _ = connmux_sys::affinity::renice_current_thread(nice);
        }
        let sock = &self.senders.get().expect("senders set before the service starts")[i];
        // Never waits inside the mux: a full backlog is waited out here,
        // sleeping (`send_reply`), not by retrying at once. (A userspace
        // socket's mode cannot fail to change.)
        let _ = sock.set_nonblocking(true);
        loop {
            let job = crossbeam::channel::select! {
                recv(self.jobs) -> j => match j {
                    Ok(j) => j,
                    Err(_) => return,
                },
                recv(self.quit) -> _ => return,
            };
            let mut next = Some(job);
            // Bounded: each turn answers or parks a request of the backlog.
            while let Some(job) = next.take() {
                next = self.serve(job, sock, &mux);
            }
        }
    }

    /// Whom attaches are served as.
    pub fn users(&self) -> &Users {
        &self.users
    }

    /// Ends the waker (the file-system threads end when the quit channel's
    /// sender is dropped).
    pub fn stop(&self) {
        self.stopping.store(true, SeqCst);
        let _l = self.paused.lock().unwrap();
        self.wake.notify_all();
    }

    /// Unwritten reply bytes of a connection (or less, when under
    /// [`ROOM`]), or `None` when it is gone.
    fn unwritten(&self, conn: &Conn, p: PsockId, mux: &connmux::Mux) -> Option<u64> {
        let replied = conn.replied.load(Relaxed);
        let seen = replied.saturating_sub(conn.written.load(Relaxed));
        if seen < ROOM {
            // Under ROOM by the last look: under it now (no look, no lock).
            return Some(seen);
        }
        let written = mux.psock_stats(p).ok()?.tx_bytes;
        conn.written.fetch_max(written, Relaxed);
        Some(replied.saturating_sub(written))
    }

    /// Answers one request; returns the next of its connection's backlog
    /// for this thread to run when the queue has no room for it.
    fn serve(&self, job: Job, sock: &KcmSocket, mux: &connmux::Mux) -> Option<Job> {
        let conn = job.conn.clone();
        let stale = || conn.gone.load(SeqCst) || conn.session.load(SeqCst) != job.session;
        // Every request, not only reads: a peer that collects no reply would
        // otherwise hold threads in `send_reply` with small ones too.
        if !stale() {
            match self.unwritten(&conn, job.psock, mux) {
                None => conn.gone.store(true, SeqCst),
                Some(n) if n >= ROOM => {
                    // No room: the request waits, first in line, and the
                    // connection is paused until its peer reads.
                    let mut w = conn.work.lock().unwrap();
                    w.running -= 1;
                    w.backlog_bytes += job.msg.len();
                    w.backlog.push_front(job);
                    if !w.paused {
                        w.paused = true;
                        self.stats.paused.fetch_add(1, Relaxed);
                        let (c, p) = (conn.clone(), w.backlog[0].psock);
                        drop(w);
                        let next = Instant::now() + WAKE_FIRST;
                        self.paused.lock().unwrap().push(Paused { conn: c, psock: p, next, nap: WAKE_FIRST });
                        self.wake.notify_one();
                    }
                    return None;
                }
                Some(_) => {}
            }
        }
        let mut out = Vec::with_capacity(128);
        // (A request of a connection gone or of an ended session is not run.)
        let cancelled = stale() || conn.work.lock().unwrap().cancelled.contains(&job.id);
        if !cancelled {
            if let Ok((tag, m)) = Tmsg::decode(&job.msg) {
                if let Err(e) = self.answer(&conn, job.session, tag, &m, &mut out) {
                    out.clear();
                    self.stats.errors.fetch_add(1, Relaxed);
                    reply_error(&mut out, tag, e);
                }
            }
        }
        let ok = self.send_reply(&job, out, sock);
        if !ok {
            self.stats.send_failures.fetch_add(1, Relaxed);
            let _ = mux.abort(job.psock);
            conn.gone.store(true, SeqCst);
        }
        let mut w = conn.work.lock().unwrap();
        w.running -= 1;
        if w.paused || conn.gone.load(SeqCst) {
            if conn.gone.load(SeqCst) {
                w.backlog.clear();
                w.backlog_bytes = 0;
            }
            return None;
        }
        let next = w.backlog.pop_front()?;
        w.backlog_bytes -= next.msg.len();
        w.running += 1;
        drop(w);
        self.stats.to_pool.fetch_add(1, Relaxed);
        // Behind the others' requests when there is room; else this thread
        // runs it (it cannot wait for room in the queue it takes from).
        match self.tx.try_send(next) {
            Ok(()) => None,
            Err(e) => Some(e.into_inner()),
        }
    }

    /// Sends a job's reply unless the request was cancelled, under the
    /// connection's work lock (so no Rflush can come between the check and
    /// the send), and forgets the request. `false`: the reply could not be
    /// queued within [`SEND_TIMEOUT`].
    fn send_reply(&self, job: &Job, out: Vec<u8>, sock: &KcmSocket) -> bool {
        let reply = Bytes::from(out);
        let deadline = Instant::now() + SEND_TIMEOUT;
        let mut nap = Duration::from_millis(1);
        // Bounded by the deadline: each turn that finds no room sleeps.
        loop {
            let mut w = job.conn.work.lock().unwrap();
            if w.cancelled.remove(&job.id) || reply.is_empty() {
                if !reply.is_empty() {
                    self.stats.replies_dropped.fetch_add(1, Relaxed);
                }
                let flushes = w.done(job.tag, job.id);
                return self.send_flushes(job, &flushes, sock);
            }
            let len = reply.len() as u64;
            match sock.send_msg(reply.clone(), Some(job.psock)) {
                Ok(()) => {
                    job.conn.replied.fetch_add(len, Relaxed);
                    // Under the same lock: the Rflushes that waited for this
                    // reply go right after it.
                    let flushes = w.done(job.tag, job.id);
                    return self.send_flushes(job, &flushes, sock);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    drop(w);
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(50));
                }
                Err(_) => {
                    w.done(job.tag, job.id);
                    return false;
                }
            }
        }
    }

    /// Rflushes of `tags` on the job's connection (called under its work
    /// lock, right after the reply they waited for). A full backlog is not
    /// waited out here: the connection is aborted (`false`).
    fn send_flushes(&self, job: &Job, tags: &[u16], sock: &KcmSocket) -> bool {
        let mut ok = true;
        for &ftag in tags {
            let mut out = Vec::with_capacity(7);
            rmsg::empty(&mut out, MsgType::RFLUSH, ftag);
            let len = out.len() as u64;
            ok &= sock.send_msg(Bytes::from(out), Some(job.psock)).is_ok();
            job.conn.replied.fetch_add(len, Relaxed);
        }
        ok
    }

    /// The waker: resumes each paused connection once it has room, and
    /// drops the backlog of one that is gone. Runs until the server stops
    /// ([`Pool::stop`]), asleep while no connection is paused.
    pub fn waker(self: Arc<Self>) {
        let mux = self.mux.get().expect("mux set before the waker starts").clone();
        loop {
            let list = {
                let mut l = self.paused.lock().unwrap();
                // Sleeps while none is paused: no CPU when all is well.
                while l.is_empty() && !self.stopping.load(SeqCst) {
                    l = self.wake.wait(l).unwrap();
                }
                if self.stopping.load(SeqCst) {
                    return;
                }
                std::mem::take(&mut *l)
            };
            let mut still = Vec::new();
            let now = Instant::now();
            for mut e in list {
                if e.next > now {
                    still.push(e);
                    continue;
                }
                let conn = e.conn.clone();
                let room = match self.unwritten(&conn, e.psock, &mux) {
                    None => {
                        conn.gone.store(true, SeqCst);
                        true
                    }
                    Some(n) => n < ROOM,
                };
                if !room {
                    e.nap = (e.nap * 2).min(WAKE_MAX);
                    e.next = now + e.nap;
                    still.push(e);
                    continue;
                }
                let mut w = conn.work.lock().unwrap();
                w.paused = false;
                if conn.gone.load(SeqCst) {
                    w.backlog.clear();
                    w.backlog_bytes = 0;
                    continue;
                }
                let mut resumed = Vec::new();
                while w.running < self.share {
                    let Some(j) = w.backlog.pop_front() else { break };
                    w.backlog_bytes -= j.msg.len();
                    w.running += 1;
                    resumed.push(j);
                }
                drop(w);
                for j in resumed {
                    self.stats.to_pool.fetch_add(1, Relaxed);
                    let _ = self.tx.send(j);
                }
            }
            if let Some(first) = still.iter().map(|e| e.next).min() {
                let mut l = self.paused.lock().unwrap();
                let fresh = !l.is_empty();
                l.extend(still);
                // Until the next look is due, or a connection is paused
                // meanwhile (its first look is due sooner).
                if !fresh {
                    let wait = first.saturating_duration_since(Instant::now()).max(WAKE_FIRST);
                    drop(self.wake.wait_timeout(l, wait).unwrap());
                }
            }
        }
    }

    fn answer(&self, conn: &Conn, session: u64, tag: u16, m: &Tmsg<'_>, out: &mut Vec<u8>) -> R<()> {
        let x = &*self.export;
        let msize = conn.msize.load(Relaxed).max(4096) as usize;
        // As the fid's user (the attach's, for an attach).
        if self.users.switches() {
            if let Some((fid, gid)) = acting_fid(m) {
                users::become_user(&conn.fid(fid)?.user, gid)?;
            }
        }
        match m {
            Tmsg::Attach { fid, afid: _, uname, aname, n_uname } => {
                let Some(at) = x.attach_point(aname) else {
                    return Err(Errno::NOENT);
                };
                let user = self.users.resolve(uname, *n_uname)?;
                if self.users.switches() {
                    users::become_user(&user, None)?;
                }
                let f = x.attach(&conn.quota, user, at)?;
                let q = f.qid;
                conn.insert_new(session, *fid, f)?;
                rmsg::qid(out, MsgType::RATTACH, tag, &q);
            }
            Tmsg::Walk { fid, newfid, names } => {
                let from = conn.fid(*fid)?;
                if newfid != fid && conn.fids.lock().unwrap().contains_key(newfid) {
                    return Err(Errno::BADF);
                }
                let (qids, new) = x.walk(&from, names, &conn.quota)?;
                if let Some(f) = new {
                    conn.replace(session, *newfid, f)?;
                }
                let mut e = Encoder::begin(out, MsgType::RWALK, tag);
                e.u16(qids.len() as u16);
                for q in &qids {
                    e.qid(q);
                }
                e.finish();
            }
            Tmsg::Lopen { fid, flags } => {
                let f = conn.fid(*fid)?;
                if f.open.is_some() {
                    return Err(Errno::BADF);
                }
                let (nf, q) = x.lopen(&f, *flags, &conn.quota)?;
                conn.replace(session, *fid, nf)?;
                let mut e = Encoder::begin(out, MsgType::RLOPEN, tag);
                e.qid(&q).u32(0);
                e.finish();
            }
            Tmsg::Lcreate { fid, name, flags, mode, gid: _ } => {
                let dir = conn.fid(*fid)?;
                let (nf, q) = x.lcreate(&dir, name, *flags, *mode, &conn.quota)?;
                conn.replace(session, *fid, nf)?;
                let mut e = Encoder::begin(out, MsgType::RLCREATE, tag);
                e.qid(&q).u32(0);
                e.finish();
            }
            Tmsg::Read { fid, offset, count } => {
                let f = conn.fid(*fid)?;
                let count = (*count as usize).min(msize - connmux_9p::IO_HEADER);
                out.reserve_exact(connmux_9p::IO_HEADER + count);
                let mut e = Encoder::begin(out, MsgType::RREAD, tag);
                e.u32(0);
                let n = x.read(&f, *offset, count, e.buf())?;
                e.patch_u32(7, n as u32);
                e.finish();
            }
            Tmsg::Write { fid, offset, data } => {
                let f = conn.fid(*fid)?;
                let n = x.write(&f, *offset, data)?;
                let mut e = Encoder::begin(out, MsgType::RWRITE, tag);
                e.u32(n);
                e.finish();
            }
            Tmsg::Readdir { fid, offset, count } => {
                let f = conn.fid(*fid)?;
                let count = (*count as usize).min(msize - connmux_9p::IO_HEADER);
                let mut e = Encoder::begin(out, MsgType::RREADDIR, tag);
                e.u32(0);
                let start = e.len();
                x.readdir(&f, *offset, count, e.buf())?;
                let n = e.len() - start;
                e.patch_u32(7, n as u32);
                e.finish();
            }
            Tmsg::Setattr { fid, attr } => {
                x.setattr(&*conn.fid(*fid)?, attr)?;
                rmsg::empty(out, MsgType::RSETATTR, tag);
            }
            Tmsg::Remove { fid } => {
                // The fid is clunked whether or not the removal succeeds.
                let f = conn.remove(session, *fid)?;
                x.remove(&f)?;
                rmsg::empty(out, MsgType::RREMOVE, tag);
            }
            Tmsg::Unlinkat { dirfid, name, flags } => {
                x.unlinkat(&*conn.fid(*dirfid)?, name, *flags)?;
                rmsg::empty(out, MsgType::RUNLINKAT, tag);
            }
            Tmsg::Mkdir { dfid, name, mode, gid: _ } => {
                let q = x.mkdir(&*conn.fid(*dfid)?, name, *mode)?;
                rmsg::qid(out, MsgType::RMKDIR, tag, &q);
            }
            Tmsg::Symlink { fid, name, target, gid: _ } => {
                let q = x.symlink(&*conn.fid(*fid)?, name, target)?;
                rmsg::qid(out, MsgType::RSYMLINK, tag, &q);
            }
            Tmsg::Mknod { dfid, name, mode, .. } => {
                let q = x.mknod(&*conn.fid(*dfid)?, name, *mode)?;
                rmsg::qid(out, MsgType::RMKNOD, tag, &q);
            }
            Tmsg::Readlink { fid } => {
                let t = x.readlink(&*conn.fid(*fid)?)?;
                let mut e = Encoder::begin(out, MsgType::RREADLINK, tag);
                e.str(&t);
                e.finish();
            }
            Tmsg::Link { dfid, fid, name } => {
                x.link(&*conn.fid(*dfid)?, &*conn.fid(*fid)?, name)?;
                rmsg::empty(out, MsgType::RLINK, tag);
            }
            Tmsg::Rename { fid, dfid, name } => {
                let (old, new) = x.rename(&*conn.fid(*fid)?, &*conn.fid(*dfid)?, name)?;
                conn.moved(&old, &new);
                rmsg::empty(out, MsgType::RRENAME, tag);
            }
            Tmsg::Renameat { olddirfid, oldname, newdirfid, newname } => {
                let (old, new) = x.renameat(&*conn.fid(*olddirfid)?, oldname, &*conn.fid(*newdirfid)?, newname)?;
                conn.moved(&old, &new);
                rmsg::empty(out, MsgType::RRENAMEAT, tag);
            }
            Tmsg::Statfs { fid } => {
                let s = x.statfs(&*conn.fid(*fid)?)?;
                rmsg::statfs(out, tag, &s);
            }
            Tmsg::Fsync { fid, datasync } => {
                x.fsync(&*conn.fid(*fid)?, *datasync != 0)?;
                rmsg::empty(out, MsgType::RFSYNC, tag);
            }
            Tmsg::Lock(l) => {
                let status = x.lock(&*conn.fid(l.fid)?, l)?;
                let mut e = Encoder::begin(out, MsgType::RLOCK, tag);
                e.u8(status);
                e.finish();
            }
            Tmsg::Getlock(l) => {
                let i = x.getlock(&*conn.fid(l.fid)?, l)?;
                let mut e = Encoder::begin(out, MsgType::RGETLOCK, tag);
                e.u8(i.kind).u64(i.start).u64(i.length).u32(i.proc_id).str(&i.client_id);
                e.finish();
            }
            Tmsg::Xattrwalk { fid, newfid, name } => {
                let f = conn.fid(*fid)?;
                if newfid != fid && conn.fids.lock().unwrap().contains_key(newfid) {
                    return Err(Errno::BADF);
                }
                let (nf, size) = x.xattrwalk(&f, name, &conn.quota)?;
                conn.replace(session, *newfid, nf)?;
                let mut e = Encoder::begin(out, MsgType::RXATTRWALK, tag);
                e.u64(size);
                e.finish();
            }
            Tmsg::Xattrcreate { fid, name, size, flags } => {
                let nf = x.xattrcreate(&*conn.fid(*fid)?, name, *size, *flags, &conn.quota)?;
                conn.replace(session, *fid, nf)?;
                rmsg::empty(out, MsgType::RXATTRCREATE, tag);
            }
            // (Here only for a fid of Txattrcreate: its value is set now.)
            Tmsg::Clunk { fid } => {
                let f = conn.remove(session, *fid)?;
                x.xattr_commit(&f)?;
                rmsg::empty(out, MsgType::RCLUNK, tag);
            }
            Tmsg::Getattr { fid, .. } => {
                let (valid, q, a) = x.getattr(&*conn.fid(*fid)?)?;
                rmsg::getattr(out, tag, valid, &q, &a);
            }
            // Answered on the workers.
            Tmsg::Version { .. } | Tmsg::Auth { .. } | Tmsg::Flush { .. } => return Err(Errno::INVAL),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_keeps_the_state_of_a_connection_attached_while_it_looks() {
        let dir = std::env::temp_dir().join(format!("connmux-9p-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let b = || crate::fs::Budget::new(16, 16);
        let o = crate::fs::Options { read_only: true, xattrs: false, open_files: b(), handles: b() };
        let export = Arc::new(Export::open(&dir, o).unwrap());
        let me = Arc::new(crate::users::User { uid: 0, gid: 0, groups: vec![0] });
        let (_quit, rx) = crossbeam::channel::bounded(0);
        let (h, _pool) = NinepHandler::new(export, 65536, 4, 16, 2, Arc::new(Users::Squash { me }), rx);
        let (gone, old, new) = (
            PsockId { index: 1, generation: 1 },
            PsockId { index: 2, generation: 1 },
            PsockId { index: 3, generation: 1 },
        );
        h.conn(gone);
        h.conn(old);
        // `new` attaches, and its first request makes its state, after the
        // sweep's look at the attached connections (which saw `old` only).
        h.sweep(|| {
            let live = vec![old];
            h.conn(new);
            live
        });
        let mut kept: Vec<PsockId> = h.conns.lock().unwrap().keys().copied().collect();
        kept.sort();
        assert_eq!(kept, vec![old, new], "the gone one forgotten, the new one kept");
        // The next sweep, which sees it, keeps it; one that does not, forgets it.
        h.sweep(|| vec![old, new]);
        assert_eq!(h.conns(), 2);
        h.sweep(|| vec![new]);
        assert_eq!(h.conns(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
