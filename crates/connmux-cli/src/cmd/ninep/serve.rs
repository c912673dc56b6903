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
//! Flush: a request handed to the pool is in flight until its reply is sent.
//! A Tflush of a tag in flight is answered by the pool thread that sends
//! that tag's reply, right after it (9P lets the reply come first; then the
//! client takes it); a Tflush of any other tag is answered at once. Either
//! way no reply to the old tag follows the Rflush.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::BytesMut;
use connmux::service::{Handler, Verdict};
use connmux::{Bytes, KcmSocket, PsockId};
use connmux_9p::header::peek_tag;
use connmux_9p::rmsg::{self, Encoder};
use connmux_9p::{MsgType, Tmsg, WireError};
use rustix::io::Errno;

use super::fs::{Export, Fid, R};

/// Per-connection state: fids and requests in flight.
pub struct Conn {
    fids: Mutex<HashMap<u32, Arc<Fid>>>,
    /// Most fids this connection may hold (each holds a descriptor).
    max_fids: usize,
    /// Tags handed to the pool, each with the tags of the Tflushes waiting
    /// for its reply.
    in_flight: Mutex<HashMap<u16, InFlight>>,
    msize: AtomicU32,
    /// The handler's sweep epoch when this state was made
    /// ([`NinepHandler::sweep`]).
    born: u64,
}

impl Conn {
    fn new(max_fids: usize, born: u64) -> Conn {
        Conn { fids: Mutex::default(), max_fids, in_flight: Mutex::default(), msize: AtomicU32::new(0), born }
    }
}

impl Conn {
    fn fid(&self, fid: u32) -> R<Arc<Fid>> {
        self.fids.lock().unwrap().get(&fid).cloned().ok_or(Errno::BADF)
    }
    fn insert_new(&self, fid: u32, f: Fid) -> R<()> {
        let mut fids = self.fids.lock().unwrap();
        if fids.contains_key(&fid) {
            return Err(Errno::BADF);
        }
        if fids.len() >= self.max_fids {
            return Err(Errno::MFILE);
        }
        fids.insert(fid, Arc::new(f));
        Ok(())
    }
    fn replace(&self, fid: u32, f: Fid) -> R<()> {
        let mut fids = self.fids.lock().unwrap();
        if fids.len() >= self.max_fids && !fids.contains_key(&fid) {
            return Err(Errno::MFILE);
        }
        fids.insert(fid, Arc::new(f));
        Ok(())
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

/// The requests of one tag in the pool. A client may reuse a tag as soon as
/// it has the reply, which can be before the pool thread that sent it has
/// counted it done: so a tag counts its requests, and the Tflushes of that
/// tag are answered once none is left.
#[derive(Default)]
struct InFlight {
    requests: u32,
    flushes: Vec<u16>,
}

/// Counters shown by `connmux stat`.
#[derive(Default)]
pub struct NinepStats {
    pub requests: AtomicU64,
    pub to_pool: AtomicU64,
    pub errors: AtomicU64,
    pub flushes: AtomicU64,
    pub flushes_deferred: AtomicU64,
    /// Connections closed for a malformed message.
    pub bad_messages: AtomicU64,
    /// Connections closed because a reply could not be queued in time.
    pub send_failures: AtomicU64,
}

struct Job {
    conn: Arc<Conn>,
    psock: PsockId,
    tag: u16,
    msg: Bytes,
}

/// The handler run by the I/O workers.
pub struct NinepHandler {
    export: Arc<Export>,
    conns: Mutex<HashMap<PsockId, Arc<Conn>>>,
    jobs: crossbeam::channel::Sender<Job>,
    pub stats: Arc<NinepStats>,
    max_msize: u32,
    max_fids: usize,
    /// Sweeps begun ([`NinepHandler::sweep`]).
    epoch: AtomicU64,
}

/// The file-system threads' shared part.
pub struct Pool {
    jobs: crossbeam::channel::Receiver<Job>,
    export: Arc<Export>,
    stats: Arc<NinepStats>,
    /// Sockets to send replies on, one per thread (set once the mux runs).
    pub senders: OnceLock<Vec<KcmSocket>>,
}

impl NinepHandler {
    /// `queue`: requests waiting for a file-system thread, at most. A worker
    /// that finds the queue full waits for room (its connections' TCP windows
    /// close meanwhile), so the memory held is bounded by `queue` × msize,
    /// whatever clients send.
    pub fn new(export: Arc<Export>, max_msize: u32, queue: usize, max_fids: usize) -> (Arc<NinepHandler>, Arc<Pool>) {
        let (tx, rx) = crossbeam::channel::bounded(queue.max(1));
        let stats = Arc::new(NinepStats::default());
        let h = NinepHandler {
            export: export.clone(),
            conns: Mutex::default(),
            jobs: tx,
            stats: stats.clone(),
            max_msize,
            max_fids,
            epoch: AtomicU64::new(0),
        };
        (Arc::new(h), Arc::new(Pool { jobs: rx, export, stats, senders: OnceLock::new() }))
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
        self.conns.lock().unwrap().retain(|p, c| c.born >= mark || live.contains(p));
    }

    /// Connections with state.
    pub fn conns(&self) -> usize {
        self.conns.lock().unwrap().len()
    }

    /// Answers a request here, or `None` when it goes to the pool.
    fn inline(&self, conn: &Conn, tag: u16, m: &Tmsg<'_>, out: &mut Vec<u8>) -> Option<R<()>> {
        Some(match m {
            Tmsg::Version { msize, version } => {
                let msize = (*msize).min(self.max_msize);
                conn.msize.store(msize, Relaxed);
                // A new session: every fid of the old one is gone.
                conn.fids.lock().unwrap().clear();
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
                if let Some(f) = conn.in_flight.lock().unwrap().get_mut(oldtag) {
                    f.flushes.push(tag);
                    self.stats.flushes_deferred.fetch_add(1, Relaxed);
                    return Some(Ok(()));
                }
                rmsg::empty(out, MsgType::RFLUSH, tag);
                Ok(())
            }
            Tmsg::Clunk { fid } => {
                conn.fids.lock().unwrap().remove(fid).map(|_| rmsg::empty(out, MsgType::RCLUNK, tag)).ok_or(Errno::BADF)
            }
            Tmsg::Getattr { fid, .. } => conn
                .fid(*fid)
                .and_then(|f| self.export.getattr(&f))
                .map(|(valid, q, a)| rmsg::getattr(out, tag, valid, &q, &a)),
            Tmsg::Xattrwalk { .. } | Tmsg::Xattrcreate { .. } => Err(Errno::OPNOTSUPP),
            _ => return None,
        })
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
            Some(Ok(())) => {
                scratch.extend_from_slice(&out);
                Verdict::Reply(scratch.split().freeze())
            }
            Some(Err(e)) => {
                self.stats.errors.fetch_add(1, Relaxed);
                reply_error(&mut out, tag, e);
                scratch.extend_from_slice(&out);
                Verdict::Reply(scratch.split().freeze())
            }
            None => {
                conn.in_flight.lock().unwrap().entry(tag).or_default().requests += 1;
                self.stats.to_pool.fetch_add(1, Relaxed);
                let _ = self.jobs.send(Job { conn, psock: from, tag, msg: request });
                Verdict::NoReply
            }
        }
    }
}

/// How long a pool thread waits to queue a reply before it gives up on the
/// connection (a peer that reads nothing cannot hold the thread longer).
/// Set on each sender when it is made.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

impl Pool {
    /// Runs pool thread `i` until the handler (and its sender) is gone,
    /// `nice` steps below the workers: a light request answered on a worker
    /// is not kept waiting for a CPU behind a large read's copy.
    pub fn run(&self, i: usize, mux: connmux::Mux, nice: i32) {
        if nice != 0 {
            let _ = connmux_sys::affinity::renice_current_thread(nice);
        }
        let sock = &self.senders.get().expect("senders set before the service starts")[i];
        while let Ok(job) = self.jobs.recv() {
            // Each reply is its own buffer, handed to the mux without a copy
            // (a copy of a large read would be made under the mux's lock).
            let mut out = Vec::with_capacity(128);
            let Ok((tag, m)) = Tmsg::decode(&job.msg) else { continue };
            if let Err(e) = self.answer(&job.conn, tag, &m, &mut out) {
                out.clear();
                self.stats.errors.fetch_add(1, Relaxed);
                reply_error(&mut out, tag, e);
            }
            let mut ok = sock.send_msg(Bytes::from(out), Some(job.psock)).is_ok();
            let waiting = {
                let mut inf = job.conn.in_flight.lock().unwrap();
                match inf.get_mut(&job.tag) {
                    Some(f) if f.requests > 1 => {
                        f.requests -= 1;
                        Vec::new()
                    }
                    _ => inf.remove(&job.tag).map(|f| f.flushes).unwrap_or_default(),
                }
            };
            for ftag in waiting {
                let mut out = Vec::with_capacity(7);
                rmsg::empty(&mut out, MsgType::RFLUSH, ftag);
                ok &= sock.send_msg(Bytes::from(out), Some(job.psock)).is_ok();
            }
            if !ok {
                self.stats.send_failures.fetch_add(1, Relaxed);
                let _ = mux.abort(job.psock);
            }
        }
    }

    fn answer(&self, conn: &Conn, tag: u16, m: &Tmsg<'_>, out: &mut Vec<u8>) -> R<()> {
        let x = &*self.export;
        let msize = conn.msize.load(Relaxed).max(4096) as usize;
        match m {
            Tmsg::Attach { fid, afid: _, uname: _, aname, n_uname: _ } => {
                if !x.accepts_aname(aname) {
                    return Err(Errno::NOENT);
                }
                let f = x.attach()?;
                let q = f.qid;
                conn.insert_new(*fid, f)?;
                rmsg::qid(out, MsgType::RATTACH, tag, &q);
            }
            Tmsg::Walk { fid, newfid, names } => {
                let from = conn.fid(*fid)?;
                if newfid != fid && conn.fids.lock().unwrap().contains_key(newfid) {
                    return Err(Errno::BADF);
                }
                let (qids, new) = x.walk(&from, names)?;
                if let Some(f) = new {
                    conn.replace(*newfid, f)?;
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
                let (open, q) = x.lopen(&f, *flags)?;
                let node = f.node.try_clone().map_err(|_| Errno::MFILE)?;
                let path = f.path.lock().unwrap().clone();
                conn.replace(*fid, Fid { path: Mutex::new(path), node, qid: q, open: Some(open) })?;
                let mut e = Encoder::begin(out, MsgType::RLOPEN, tag);
                e.qid(&q).u32(0);
                e.finish();
            }
            Tmsg::Lcreate { fid, name, flags, mode, gid: _ } => {
                let dir = conn.fid(*fid)?;
                let (nf, q) = x.lcreate(&dir, name, *flags, *mode)?;
                conn.replace(*fid, nf)?;
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
                let f = conn.fids.lock().unwrap().remove(fid).ok_or(Errno::BADF)?;
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
                let status = x.lock(&*conn.fid(l.fid)?, l.lock_type)?;
                let mut e = Encoder::begin(out, MsgType::RLOCK, tag);
                e.u8(status);
                e.finish();
            }
            Tmsg::Getlock(l) => {
                conn.fid(l.fid)?;
                // Locks are whole-file flocks held by this server: none is
                // reported as a conflict (F_UNLCK).
                let mut e = Encoder::begin(out, MsgType::RGETLOCK, tag);
                e.u8(2).u64(l.start).u64(l.length).u32(l.proc_id).str(l.client_id);
                e.finish();
            }
            // Answered on the workers.
            Tmsg::Version { .. }
            | Tmsg::Auth { .. }
            | Tmsg::Flush { .. }
            | Tmsg::Clunk { .. }
            | Tmsg::Getattr { .. }
            | Tmsg::Xattrwalk { .. }
            | Tmsg::Xattrcreate { .. } => return Err(Errno::INVAL),
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
        let export = Arc::new(Export::open(&dir, true).unwrap());
        let (h, _pool) = NinepHandler::new(export, 65536, 4, 16);
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
