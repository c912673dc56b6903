//! The 9P2000.L service: requests decoded on the I/O workers, answered there
//! when they only touch the connection's fid table or an inode already in
//! memory, and otherwise handed to the file-system threads
//! ([`connmux_fsd::Pool`]) that send their reply on the connection
//! themselves.
//!
//! Why a pool beside the workers: a read, a directory listing or an fsync
//! may wait on the disk for milliseconds. Run on a worker, that wait would
//! hold every other connection the worker reads; run on the pool, the worker
//! goes on reading and answering the others, and only the threads blocked in
//! the file system wait.
//!
//! Fairness and room are the pool's (`connmux-fsd`, shared with the NFS
//! server): a connection has at most `share` requests with the pool at a
//! time, the rest wait in its own backlog; a request is run only while its
//! connection's unwritten replies are under [`ROOM`], and a connection over
//! it is paused until its peer has read enough: a peer that sends reads and
//! never collects the replies holds no thread and no CPU, and no more than
//! [`ROOM`] plus its share of replies in memory.
//!
//! Flush: a Tflush is answered at once. A flushed request still waiting is
//! dropped; a running one that only reads (Tread, Treaddir, ...) is marked,
//! and its reply is not sent. The mark and the send are under the
//! connection's lock (the pool's, [`connmux_fsd::Replier::send_gated`]), so
//! the reply either left before the Rflush was produced or never leaves. A
//! running request that may change state (a walk makes a fid, a create a
//! file) is answered, and the Rflush right after it: a dropped reply would
//! have the client take as undone what was done. No open waits, so that
//! reply comes promptly. A second Tversion drops or cancels every request
//! of the connection (all of them: the old session's fids go too), and its
//! Rversion is sent at once; a request of the old session still running
//! changes no fid of the new one.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use connmux::service::{Handler, Verdict};
use connmux::{Bytes, PsockId};
use connmux_9p::header::peek_tag;
use connmux_9p::rmsg::{self, Encoder};
use connmux_9p::{MsgType, Tmsg, WireError};
use connmux_fsd::{Pool, Queue, Replier, Sent, Serve};
use rustix::io::Errno;

use crate::fs::{Export, Fid, Quota, Xattr, R};
use crate::locks::Owners;
use crate::users::{self, Users};

pub use connmux_fsd::{ROOM, SEND_TIMEOUT};

/// Reads of at most this many bytes are answered on the I/O worker when
/// their pages are in memory ([`Export::read_cached`]) and the connection
/// has room for the reply ([`Pool::room_outside`]): a client's 64 KiB
/// msize (Linux's v9fs, diod's) whole. Larger ones go to the pool: a
/// megabyte copied on the worker would hold its other connections.
pub const INLINE_READ: usize = 64 * 1024;

/// The smallest msize accepted in Tversion: every reply but a read's or a
/// directory listing's (which are cut to msize) fits in it.
pub const MIN_MSIZE: u32 = 4096;

/// A connection as the pool keeps it: its [`Conn`] and, under its lock
/// with its backlog, its [`Work`].
type PoolConn = connmux_fsd::Conn<Files>;

/// Per-connection state: fids and the session.
pub struct Conn {
    fids: Mutex<HashMap<u32, Arc<Fid>>>,
    /// Tversions seen: a request of an older session changes no fid.
    /// Changed under the `fids` lock.
    session: AtomicU64,
    /// Most fids this connection may hold.
    max_fids: usize,
    /// Its descriptors: open files and handles.
    quota: Quota,
    /// The processes of its client that hold byte-range locks.
    lock_owners: Arc<Owners>,
    msize: AtomicU32,
}

/// The requests of a connection that are not answered yet (kept under the
/// same lock as its backlog).
#[derive(Default)]
pub struct Work {
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

    /// Request `id` is answered (or dropped): the Tflushes that waited for
    /// it and for nothing else now, whose Rflush is to be sent.
    fn done(&mut self, tag: u16, id: u64) -> Vec<u16> {
        self.forget(tag, id);
        self.changes.remove(&id);
        self.cancelled.remove(&id);
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

/// Removes request `id` from the backlog, if it waits there.
fn drop_waiting(q: &mut Queue<Files>, id: u64) -> bool {
    let found = q.remove_waiting(|r| r.id == id).is_some();
    if found {
        q.work.changes.remove(&id);
    }
    found
}

/// Tflush `ftag` of `tag`: drops its waiting requests and marks its running
/// ones cancelled, but for those that may change state, whose replies the
/// Rflush then follows. Returns whether the Rflush waits.
fn flush(q: &mut Queue<Files>, tag: u16, ftag: u16) -> bool {
    let mut waits = 0;
    for id in q.work.tags.remove(&tag).unwrap_or_default() {
        // (One an earlier Tflush waits for stays: that Rflush needs its reply.)
        if !q.work.deferred.contains_key(&id) && drop_waiting(q, id) {
            continue;
        }
        let w = &mut q.work;
        if w.changes.contains(&id) {
            w.deferred.entry(id).or_default().push(ftag);
            waits += 1;
        } else {
            w.cancelled.insert(id);
        }
    }
    if waits > 0 {
        *q.work.flush_waits.entry(ftag).or_default() += waits;
    }
    waits > 0
}

/// Tversion: every request is dropped or cancelled (the old session's fids
/// go with it, so no change of one matters), and so are the Tflushes
/// waiting for them.
fn cancel_all(q: &mut Queue<Files>) {
    let ids: Vec<u64> = q.work.tags.drain().flat_map(|(_, v)| v).collect();
    for id in ids {
        if !drop_waiting(q, id) {
            q.work.cancelled.insert(id);
        }
    }
    q.work.deferred.clear();
    q.work.flush_waits.clear();
}

impl Conn {
    fn new(max_fids: usize) -> Conn {
        Conn {
            fids: Mutex::default(),
            session: AtomicU64::new(0),
            max_fids,
            quota: Quota::default(),
            lock_owners: Arc::default(),
            msize: AtomicU32::new(0),
        }
    }

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

/// Counters shown by `connmux stat` (the pool's, [`connmux_fsd::PoolStats`],
/// beside them).
#[derive(Default)]
pub struct NinepStats {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub flushes: AtomicU64,
    /// Tflushes answered after the reply of a request that may change state.
    pub flushes_deferred: AtomicU64,
    /// Replies not sent: their request was flushed or its session ended.
    pub replies_dropped: AtomicU64,
    /// Connections closed for a malformed message.
    pub bad_messages: AtomicU64,
}

/// A request for the file-system threads.
pub struct Req {
    tag: u16,
    id: u64,
    session: u64,
    msg: Bytes,
}

impl Req {
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

/// The file-system threads' side: what a request is run against.
pub struct Files {
    /// Whom attaches are served as.
    users: Arc<Users>,
    export: Arc<Export>,
    stats: Arc<NinepStats>,
}

/// The handler run by the I/O workers.
pub struct NinepHandler {
    export: Arc<Export>,
    pool: Arc<Pool<Files>>,
    pub stats: Arc<NinepStats>,
    max_msize: u32,
    max_fids: usize,
}

impl NinepHandler {
    /// The handler and its file-system threads (`pool`: their number, the
    /// queue, a connection's share, their nice level), on `mux`.
    pub fn start(
        mux: &connmux::Mux,
        export: Arc<Export>,
        max_msize: u32,
        max_fids: usize,
        users: Arc<Users>,
        pool: connmux_fsd::Options,
    ) -> std::io::Result<Arc<NinepHandler>> {
        let stats = Arc::new(NinepStats::default());
        let files = Files { users, export: export.clone(), stats: stats.clone() };
        let pool = Pool::start(mux, pool, files)?;
        Ok(Arc::new(NinepHandler { export, pool, stats, max_msize: max_msize.max(MIN_MSIZE), max_fids }))
    }

    /// The file-system threads.
    pub fn pool(&self) -> &Pool<Files> {
        &self.pool
    }

    fn conn(&self, p: PsockId) -> Arc<PoolConn> {
        self.pool.conn(p, || Conn::new(self.max_fids))
    }

    /// The export served.
    pub fn export(&self) -> &Export {
        &self.export
    }

    /// Connections with state.
    pub fn conns(&self) -> usize {
        self.pool.conns()
    }

    /// Answers a request here, or `None` when it goes to the pool.
    fn inline(&self, pc: &PoolConn, tag: u16, m: &Tmsg<'_>, out: &mut Vec<u8>) -> Option<R<()>> {
        let conn = &pc.data;
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
                // fid is gone. Lock order: the pool's, then fids.
                cancel_all(&mut pc.lock());
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
                if flush(&mut pc.lock(), *oldtag, tag) {
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
                // (Counted in the room until the mux lets go of it: `handle`.)
                if !self.pool.room_outside(pc, (connmux_9p::IO_HEADER + count) as u64) {
                    return None;
                }
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
    fn submit(&self, conn: &Arc<PoolConn>, tag: u16, msg: Bytes) -> bool {
        let session = conn.data.session.load(SeqCst);
        self.pool.submit(conn, |w| {
            let id = w.next_id;
            w.next_id += 1;
            let req = Req { tag, id, session, msg };
            if req.changes() {
                w.changes.insert(id);
            }
            w.tags.entry(tag).or_default().push(id);
            req
        })
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
                self.conn(from).replied(out.len());
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
                conn.replied(out.len());
                if matches!(m, Tmsg::Read { .. }) {
                    // The data, not copied again; held against the room.
                    return Verdict::Reply(conn.hold(Bytes::from(out)));
                }
                scratch.extend_from_slice(&out);
                Verdict::Reply(scratch.split().freeze())
            }
            None => {
                if self.submit(&conn, tag, request) {
                    Verdict::NoReply
                } else {
                    Verdict::Close
                }
            }
        }
    }
}

impl Serve for Files {
    type Req = Req;
    type Conn = Conn;
    type Work = Work;

    /// Runs a request (not one flushed or of an ended session) and sends
    /// its reply unless it was flushed meanwhile, then the Rflushes that
    /// waited for it.
    fn serve(&self, pc: &PoolConn, job: Req, out: &Replier<'_, Files>) -> bool {
        let conn = &pc.data;
        let mut reply = Vec::with_capacity(128);
        let stale = conn.session.load(SeqCst) != job.session;
        if !stale && !pc.lock().work.cancelled.contains(&job.id) {
            if let Ok((tag, m)) = Tmsg::decode(&job.msg) {
                if let Err(e) = self.answer(conn, job.session, tag, &m, &mut reply) {
                    reply.clear();
                    self.stats.errors.fetch_add(1, Relaxed);
                    reply_error(&mut reply, tag, e);
                }
            }
        }
        let (tag, id) = (job.tag, job.id);
        let gate = |w: &mut Work| {
            let flushed = w.cancelled.contains(&id);
            if flushed {
                self.stats.replies_dropped.fetch_add(1, Relaxed);
            }
            !flushed
        };
        let then = |w: &mut Work, sent: Sent| {
            // Under the same lock: the Rflushes that waited for this reply
            // go right after it.
            let ready = w.done(tag, id);
            if sent == Sent::Failed {
                return Vec::new();
            }
            ready
                .into_iter()
                .map(|ftag| {
                    let mut f = Vec::with_capacity(7);
                    rmsg::empty(&mut f, MsgType::RFLUSH, ftag);
                    Bytes::from(f)
                })
                .collect()
        };
        out.send_gated(pc, Bytes::from(reply), gate, then) != Sent::Failed
    }
}

impl Files {
    /// Whom attaches are served as.
    pub fn users(&self) -> &Users {
        &self.users
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
                let status = x.lock(&*conn.fid(l.fid)?, l, &conn.lock_owners, &conn.quota)?;
                let mut e = Encoder::begin(out, MsgType::RLOCK, tag);
                e.u8(status);
                e.finish();
            }
            Tmsg::Getlock(l) => {
                let i = x.getlock(&*conn.fid(l.fid)?, l, &conn.lock_owners)?;
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
