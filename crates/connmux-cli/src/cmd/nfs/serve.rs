//! The NFS version 3 and MOUNT version 3 service: calls checked on the I/O
//! workers (RPC header, credential, program, version; NULL answered there),
//! every other procedure handed to the file-system threads
//! ([`connmux_fsd::Pool`], shared with the 9P server), which decode its
//! arguments, run it against the export and send the reply on the
//! connection themselves: a call that waits on the disk holds one of those
//! threads, never a worker.
//!
//! NFS replies carry the call's xid, so they may leave in any order: the
//! pool's threads answer one connection's calls in parallel.
//!
//! Fairness and room are the pool's, as in the 9P server: a connection has
//! at most `share` calls with the threads at a time (the rest wait in its
//! own backlog, at most `queue` of them, past which the connection is
//! closed, counted in `overloads`), so one client's slow calls hold at most
//! its share of the threads. A call is run only while its connection's
//! unwritten replies are under [`connmux_fsd::ROOM`]; a connection over it is paused
//! until its peer has read enough: a peer that sends READs and never reads
//! the replies holds no thread.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::BytesMut;
use connmux::service::{Handler, Verdict};
use connmux::{Bytes, PsockId};
use connmux_fsd::{Pool, Replier, Serve};
use connmux_nfs::res::{self, FailAttrs};
use connmux_nfs::{
    mount, proc3, types::access as acc, types::fsf, CreateHow, DirOp, Fattr3, MountCall, NfsCall, Nfsstat3, Nfstime3,
    Sattr3, SetTime, StableHow, Wcc, XdrError, MOUNT_PROGRAM, NFS_PROGRAM, VERFSIZE,
};
use connmux_oncrpc::reply::{encode_reply_body, Reply};
use connmux_oncrpc::{encode_reply, CallHeader, Outcome, Registry};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::fs::{self as nfs_fs, check_name, status_of, Export, Node};

/// Largest READ answered (FSINFO's rtmax); a larger count is cut to it.
pub const RTMAX: u32 = 1 << 20;
/// Room for a READ reply's record mark, RPC header and attributes before its data.
const READ_HEAD: usize = 256;
/// Largest READDIR/READDIRPLUS reply built, whatever the client's count.
const DIRMAX: u32 = 1 << 20;

/// Counters of the service.
#[derive(Default)]
pub struct Stats {
    /// Records received.
    pub calls: AtomicU64,
    /// NFS procedures run, by number (NULL counted in `calls` only).
    pub procs: [AtomicU64; 22],
    /// MOUNT procedures run.
    pub mount_calls: AtomicU64,
    /// Replies with a status other than NFS3_OK.
    pub nfs_errors: AtomicU64,
    /// Calls whose arguments did not decode (GARBAGE_ARGS).
    pub garbage_args: AtomicU64,
    /// Records that were no RPC call: the connection was closed.
    pub bad_calls: AtomicU64,
    /// Handles that were none of ours.
    pub bad_handles: AtomicU64,
    /// Handles of files gone or of another export.
    pub stale_handles: AtomicU64,
    /// READs answered on the I/O workers (their files open, their pages in memory).
    pub reads_on_workers: AtomicU64,
    /// Bytes read for READ.
    pub read_bytes: AtomicU64,
    /// Bytes written by WRITE.
    pub write_bytes: AtomicU64,
}

/// The handler on the workers.
pub struct NfsHandler {
    registry: Registry,
    pool: Arc<Pool<Nfs>>,
    pub stats: Arc<Stats>,
}

/// The file-system threads' side: what a call is run against.
pub struct Nfs {
    export: Arc<Export>,
    pub stats: Arc<Stats>,
    /// The write verifier: fixed for the life of the process.
    verf: [u8; VERFSIZE],
    wtmax: u32,
    /// `Some(root_squash)`: calls run as their AUTH_SYS caller.
    identity: Option<bool>,
}

/// The programs served: NFS 3 and MOUNT 3, on one port.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(NFS_PROGRAM, 3, 3).expect("non-empty range");
    r.register(MOUNT_PROGRAM, 3, 3).expect("non-empty range");
    r
}

/// The body of a record given with its marks (one fragment: no copy).
fn body(marked: &[u8]) -> Option<Cow<'_, [u8]>> {
    let m = connmux_oncrpc::RecordMark::parse(marked)?;
    if m.last && marked.len() - 4 == m.len as usize {
        return Some(Cow::Borrowed(&marked[4..]));
    }
    let mut v = Vec::with_capacity(marked.len());
    connmux_oncrpc::record::strip_marks(marked, &mut v).ok()?;
    Some(Cow::Owned(v))
}

impl NfsHandler {
    /// The handler and its file-system threads on `mux` (`pool`: their
    /// number, the queue — calls waiting for a thread at most, and calls
    /// one connection may have in its own backlog, more and it is closed —
    /// and a connection's share of the threads).
    /// `identity`: `Some(root_squash)` to run calls as their AUTH_SYS caller.
    pub fn start(
        mux: &connmux::Mux,
        export: Arc<Export>,
        wtmax: u32,
        identity: Option<bool>,
        pool: connmux_fsd::Options,
    ) -> std::io::Result<Arc<NfsHandler>> {
        let stats = Arc::new(Stats::default());
        // The verifier: this start's time, so that a client sees a restart
        // (and writes its unstable data again).
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let verf = (t.as_nanos() as u64 ^ u64::from(std::process::id())).to_be_bytes();
        let nfs = Nfs { export, stats: stats.clone(), verf, wtmax, identity };
        let pool = Pool::start(mux, pool, nfs)?;
        Ok(Arc::new(NfsHandler { registry: registry(), pool, stats }))
    }

    /// The file-system threads.
    pub fn pool(&self) -> &Pool<Nfs> {
        &self.pool
    }

    /// Connections with state.
    pub fn conns(&self) -> usize {
        self.pool.conns()
    }

    fn reply(v: Vec<u8>, scratch: &mut BytesMut) -> Verdict {
        scratch.extend_from_slice(&v);
        Verdict::Reply(scratch.split().freeze())
    }
}

impl Handler for NfsHandler {
    fn handle(&self, request: Bytes, from: PsockId, scratch: &mut BytesMut) -> Verdict {
        self.stats.calls.fetch_add(1, Relaxed);
        if let Some(r) = self.registry.null_fast(&request) {
            scratch.extend_from_slice(&r);
            return Verdict::Reply(scratch.split().freeze());
        }
        let mut out = Vec::new();
        let decided = body(&request).and_then(|b| {
            let call = CallHeader::new_checked(&b).ok()?;
            Some((call.xid(), self.registry.decide(&call, call.args().len())))
        });
        match decided {
            // A procedure of a program and version served: for the pool
            // (or the connection's backlog; full, the connection goes).
            Some((_, Reply::ProcUnavail)) => {
                let conn = self.pool.conn(from, || ());
                // A READ of pages in memory: here, as a NULL call is.
                let room = |reply| self.pool.room_outside(&conn, reply);
                if let Some(r) = self.pool.server().answer_cached(&request, room) {
                    conn.replied(r.len());
                    return Verdict::Reply(conn.hold(Bytes::from(r)));
                }
                if self.pool.submit(&conn, |_| request) {
                    Verdict::NoReply
                } else {
                    Verdict::Close
                }
            }
            // NULL, or a refusal (auth, program, version).
            Some((xid, r)) => {
                encode_reply(xid, &r, &mut out);
                Self::reply(out, scratch)
            }
            // Not a call: the registry says whether it deserves an answer
            // (an RPC version mismatch) or the connection goes.
            None => match self.registry.handle_marked_decoded(&request, &mut out) {
                Outcome::Replied { .. } => Self::reply(out, scratch),
                Outcome::CloseConnection(_) => {
                    self.stats.bad_calls.fetch_add(1, Relaxed);
                    Verdict::Close
                }
            },
        }
    }
}

impl Serve for Nfs {
    type Req = Bytes;
    type Conn = ();
    type Work = ();

    fn serve(&self, conn: &connmux_fsd::Conn<Nfs>, record: Bytes, out: &Replier<'_, Nfs>) -> bool {
        out.send(conn, Bytes::from(self.answer(&record)))
    }
}

/// A failed procedure: its status and the attributes its `resfail` carries.
struct Fail {
    status: Nfsstat3,
    /// (Boxed: a failure is rare, and the success path's result small.)
    attrs: Box<FailAttrs>,
}

impl From<Nfsstat3> for Fail {
    fn from(status: Nfsstat3) -> Fail {
        Fail { status, attrs: Box::default() }
    }
}

impl From<Errno> for Fail {
    fn from(e: Errno) -> Fail {
        status_of(e).into()
    }
}

type NR<T> = Result<T, Fail>;

/// Adds attributes to a failure.
trait With<T> {
    fn attr(self, a: Option<Fattr3>) -> NR<T>;
    fn wcc(self, w: Wcc) -> NR<T>;
}

impl<T, E: Into<Fail>> With<T> for Result<T, E> {
    fn attr(self, a: Option<Fattr3>) -> NR<T> {
        self.map_err(|e| {
            let mut f = e.into();
            f.attrs.attr = a;
            f
        })
    }
    fn wcc(self, w: Wcc) -> NR<T> {
        self.map_err(|e| {
            let mut f = e.into();
            f.attrs.wcc = w;
            f
        })
    }
}

impl Nfs {
    /// The record-marked reply to one call record (checked on a worker).
    pub fn answer(&self, record: &[u8]) -> Vec<u8> {
        let Some(b) = body(record) else { return Vec::new() };
        let Ok(call) = CallHeader::new_checked(&b) else { return Vec::new() };
        let (xid, proc, args) = (call.xid(), call.procedure(), call.args());
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&[0; 4]);
        encode_reply_body(xid, &Reply::Success, &mut out);
        let mark = out.len();
        let done = if call.program().0 == MOUNT_PROGRAM {
            MountCall::decode(proc, args).map(|m| {
                self.stats.mount_calls.fetch_add(1, Relaxed);
                self.mount(&m, &mut out)
            })
        } else {
            NfsCall::decode(proc, args).map(|c| {
                if let Some(n) = self.stats.procs.get(proc as usize) {
                    n.fetch_add(1, Relaxed);
                }
                let who = self.identity.map(|squash| caller(&call, squash));
                let r = match who.map(|c| super::ids::become_(Some(c))).transpose() {
                    Ok(_as_caller) => self.nfs(&c, &mut out),
                    Err(_) => Err(Nfsstat3::ERR_SERVERFAULT.into()),
                };
                if let Err(f) = r {
                    out.truncate(mark);
                    self.stats.nfs_errors.fetch_add(1, Relaxed);
                    if f.status == Nfsstat3::ERR_BADHANDLE {
                        self.stats.bad_handles.fetch_add(1, Relaxed);
                    } else if f.status == Nfsstat3::ERR_STALE {
                        self.stats.stale_handles.fetch_add(1, Relaxed);
                    }
                    res::put_failure(&mut out, proc, f.status, &f.attrs);
                }
            })
        };
        if let Err(e) = done {
            out.clear();
            let r = if matches!(e, XdrError::UnknownProc(_)) {
                Reply::ProcUnavail
            } else {
                self.stats.garbage_args.fetch_add(1, Relaxed);
                Reply::GarbageArgs
            };
            encode_reply(xid, &r, &mut out);
            return out;
        }
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&(len | 0x8000_0000).to_be_bytes());
        out
    }

    /// The record-marked reply to a READ of a file open and in memory, built
    /// where the call was read (an I/O worker), where nothing may wait on the
    /// disk: the file found only through the kernel's caches and the open
    /// files ([`Export::cached_file`]), its pages read with `RWF_NOWAIT`.
    /// `None` for any other call, or any doubt: it goes to the file-system
    /// threads. Why here: such a READ is one copy, and the hand-off to a
    /// thread and back costs as much again (a single 1 MiB reader was
    /// 0.65-0.97x nfs-ganesha, whose one thread reads and writes).
    /// `room(bytes)`: whether the connection has room for a reply of at most
    /// that many bytes (asked only of a READ).
    pub fn answer_cached(&self, record: &[u8], room: impl FnOnce(u64) -> bool) -> Option<Vec<u8>> {
        if self.identity.is_some() {
            return None;
        }
        let b = body(record)?;
        let call = CallHeader::new_checked(&b).ok()?;
        if call.program().0 != NFS_PROGRAM || call.procedure() != proc3::READ {
            return None;
        }
        let Ok(NfsCall::Read { fh, offset, count }) = NfsCall::decode(proc3::READ, call.args()) else { return None };
        let count = count.min(RTMAX) as usize;
        if !room((READ_HEAD + count) as u64) {
            return None;
        }
        let (st, f) = self.export.cached_file(fh)?;
        let a = self.export.fattr(&st);
        let mut out = Vec::with_capacity(READ_HEAD + count);
        out.extend_from_slice(&[0; 4]);
        encode_reply_body(call.xid(), &Reply::Success, &mut out);
        let at = res::read_begin(&mut out, Some(&a));
        let got = connmux_sys::fileserver::pread_cached_into(f.file.as_fd(), &mut out, count, offset).ok()?;
        let end = offset.saturating_add(got as u64);
        // Short before the end of the file: the rest is not in memory.
        if got < count && end < a.size {
            return None;
        }
        self.stats.procs[proc3::READ as usize].fetch_add(1, Relaxed);
        self.stats.reads_on_workers.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(got as u64, Relaxed);
        let k = res::read_finish(&mut out, at, got < count || end >= a.size);
        out.extend_from_slice(res::read_padding(k));
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&(len | 0x8000_0000).to_be_bytes());
        Some(out)
    }

    fn mount(&self, m: &MountCall<'_>, out: &mut Vec<u8>) {
        let x = &*self.export;
        match m {
            MountCall::Null | MountCall::Umnt(_) | MountCall::Umntall => {}
            MountCall::Mnt(p) => {
                match x.mount_path(p) {
                    // AUTH_SYS (1), AUTH_NONE (0): both served.
                    Some(n) => mount::mnt_ok(out, &x.handle_of(&n.st).bytes(), &[1, 0]),
                    None => mount::mnt_err(out, mount::mountstat::ERR_NOENT),
                }
            }
            MountCall::Dump => mount::dump_empty(out),
            MountCall::Export => mount::exports(out, &[x.path.as_os_str().as_bytes()]),
        }
    }

    fn attr(&self, n: &Node) -> Fattr3 {
        self.export.fattr(&n.st)
    }

    /// Attributes now (after a change).
    fn post(&self, n: &Node) -> Option<Fattr3> {
        self.export.restat(n).map(|st| self.export.fattr(&st))
    }

    fn wcc_of(&self, n: &Node) -> Wcc {
        let a = self.attr(n);
        Wcc { before: Some(a.wcc()), after: Some(a) }
    }

    /// A handle that must be a directory.
    fn dir(&self, fh: &[u8]) -> NR<Node> {
        let d = self.export.resolve(fh)?;
        if !d.is_dir() {
            return Err(Nfsstat3::ERR_NOTDIR).attr(Some(self.attr(&d)));
        }
        Ok(d)
    }

    /// A directory for a change of its entries: the directory, its
    /// descriptor, the checked name and the attributes before.
    fn dir_change<'n>(&self, at: &DirOp<'n>) -> NR<(Node, rustix::fd::OwnedFd, &'n OsStr, Wcc)> {
        let d = self.dir(at.dir).map_err(|mut f| {
            f.attrs.wcc.after = f.attrs.attr;
            f
        })?;
        let w = self.wcc_of(&d);
        self.export.writable().wcc(w)?;
        let name = check_name(at.name).wcc(w)?;
        let fd = self.export.dir_fd(&d.path).wcc(w)?;
        Ok((d, fd, name, w))
    }

    fn after(&self, d: &Node, w: Wcc) -> Wcc {
        Wcc { before: w.before, after: self.post(d) }
    }

    fn nfs(&self, c: &NfsCall<'_>, out: &mut Vec<u8>) -> NR<()> {
        let x = &*self.export;
        match *c {
            NfsCall::Null => {}
            NfsCall::Getattr { fh } => res::getattr_ok(out, &self.attr(&x.resolve(fh)?)),
            NfsCall::Setattr { fh, attr, guard } => {
                let n = x.resolve(fh)?;
                let w = self.wcc_of(&n);
                x.writable().wcc(w)?;
                if guard.is_some_and(|g| Some(g) != w.before.map(|b| b.ctime)) {
                    return Err(Nfsstat3::ERR_NOT_SYNC).wcc(w);
                }
                let r = self.setattr(&n, &attr);
                let w = Wcc { before: w.before, after: self.post(&n) };
                r.wcc(w)?;
                res::wcc_ok(out, &w);
            }
            NfsCall::Lookup(DirOp { dir, name }) => {
                let d = self.dir(dir)?;
                let da = Some(self.attr(&d));
                let path = match name {
                    b"." => d.path.clone(),
                    // The parent of the root is the root.
                    b".." => d.path.parent().map(Path::to_path_buf).unwrap_or_default(),
                    n => d.path.join(check_name(n).attr(da)?),
                };
                let c = x.node_at(path).attr(da)?;
                if let Some(n) = c.path.file_name() {
                    if c.path.parent() == Some(d.path.as_path()) {
                        x.remember(d.key(), n, c.key());
                    }
                }
                res::lookup_ok(out, &x.handle_of(&c.st).bytes(), Some(&self.attr(&c)), da.as_ref());
            }
            NfsCall::Access { fh, access } => {
                let n = x.resolve(fh)?;
                let a = self.attr(&n);
                let can = |m| x.access(&n, m);
                let (r, w, xx) = (can(rfs::Access::READ_OK), can(rfs::Access::WRITE_OK), can(rfs::Access::EXEC_OK));
                let mut got = 0;
                let is_dir = n.is_dir();
                if r {
                    got |= acc::READ;
                }
                if w {
                    got |= acc::MODIFY | acc::EXTEND | if is_dir { acc::DELETE } else { 0 };
                }
                if xx {
                    got |= if is_dir { acc::LOOKUP } else { acc::EXECUTE };
                }
                if !is_dir {
                    // Removal is the directory's business: left to REMOVE.
                    got |= acc::DELETE;
                }
                if x.read_only {
                    got &= !(acc::MODIFY | acc::EXTEND | acc::DELETE);
                }
                res::access_ok(out, Some(&a), access & got);
            }
            NfsCall::Readlink { fh } => {
                let n = x.resolve(fh)?;
                let a = Some(self.attr(&n));
                if a.is_some_and(|a| a.ftype != connmux_nfs::Ftype3::Lnk) {
                    return Err(Nfsstat3::ERR_INVAL).attr(a);
                }
                let t = rfs::readlinkat(&n.fd, "", Vec::new()).attr(a)?;
                res::readlink_ok(out, a.as_ref(), t.as_bytes());
            }
            NfsCall::Read { fh, offset, count } => {
                let n = x.resolve(fh)?;
                let a = self.attr(&n);
                let f = x.file(&n, false).attr(Some(a))?;
                let count = count.min(RTMAX) as usize;
                let at = res::read_begin(out, Some(&a));
                let start = out.len();
                // Read into the spare capacity (no zeroing of what is about
                // to be overwritten), kept to `count` (more would only be cut).
                out.reserve_exact(count + 3);
                if out.capacity() > start + count {
                    out.shrink_to(start + count);
                }
                // Bounded: each turn reads at least a byte or ends. A short
                // read before the end is retried (a short reply means eof).
                while out.len() - start < count {
                    let off = offset.saturating_add((out.len() - start) as u64);
                    match rustix::io::pread(&f.file, rustix::buffer::spare_capacity(out), off) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(Errno::INTR) => {}
                        Err(e) => return Err(e).attr(Some(a)),
                    }
                }
                let got = (out.len() - start).min(count);
                out.truncate(start + got);
                self.stats.read_bytes.fetch_add(got as u64, Relaxed);
                let eof = got < count || offset.saturating_add(got as u64) >= a.size;
                let k = res::read_finish(out, at, eof);
                out.extend_from_slice(res::read_padding(k));
            }
            NfsCall::Write { fh, offset, stable, data } => {
                let n = x.resolve(fh)?;
                let w = self.wcc_of(&n);
                x.writable().wcc(w)?;
                if data.len() > self.wtmax as usize {
                    return Err(Nfsstat3::ERR_INVAL).wcc(w);
                }
                let f = x.file(&n, true).wcc(w)?;
                let r = f.file.write_all_at(data, offset).map_err(|e| errno(&e)).and_then(|()| match stable {
                    StableHow::Unstable => Ok(()),
                    StableHow::DataSync => rfs::fdatasync(&f.file),
                    StableHow::FileSync => rfs::fsync(&f.file),
                });
                let w = Wcc { before: w.before, after: self.post(&n) };
                r.wcc(w)?;
                self.stats.write_bytes.fetch_add(data.len() as u64, Relaxed);
                res::write_ok(out, &w, data.len() as u32, stable, &self.verf);
            }
            NfsCall::Create { at, how } => {
                let (d, dfd, name, w) = self.dir_change(&at)?;
                let (attr, excl, verf) = match how {
                    CreateHow::Unchecked(a) => (a, false, None),
                    CreateHow::Guarded(a) => (a, true, None),
                    CreateHow::Exclusive(v) => (Sattr3::default(), true, Some(v)),
                };
                let mode = attr.mode.unwrap_or(0o644) & 0o7777;
                let base = OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
                let open = |extra: OFlags| rfs::openat2(&dfd, name, base | extra, Mode::from_raw_mode(mode), RESOLVE);
                let (fd, created) = match open(OFlags::EXCL) {
                    Ok(fd) => (fd, true),
                    Err(Errno::EXIST) if !excl => (open(OFlags::empty()).wcc(self.after(&d, w))?, false),
                    Err(Errno::EXIST) if verf.is_some() => {
                        // A retransmitted exclusive create finds its own file
                        // (the verifier kept in its mtime, as nfsd does).
                        let st = nfs_fs::statx_at(&dfd, Path::new(name)).wcc(self.after(&d, w))?;
                        let v = verf.expect("checked");
                        if (st.stx_mtime.tv_sec as u32, st.stx_mtime.tv_nsec) != verf_time(&v) {
                            return Err(Nfsstat3::ERR_EXIST).wcc(self.after(&d, w));
                        }
                        let fl = OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW;
                        (rfs::openat2(&dfd, name, fl, Mode::empty(), RESOLVE).wcc(self.after(&d, w))?, false)
                    }
                    Err(e) => return Err(e).wcc(self.after(&d, w)),
                };
                let r = (|| -> Result<(), Errno> {
                    if created {
                        let st = nfs_fs::statx_at(&fd, Path::new(""))?;
                        if u32::from(st.stx_mode) & 0o7777 != mode {
                            rfs::fchmod(&fd, Mode::from_raw_mode(mode))?;
                        }
                        if attr.uid.is_some() || attr.gid.is_some() {
                            rfs::fchown(&fd, attr.uid.map(rfs::Uid::from_raw), attr.gid.map(rfs::Gid::from_raw))?;
                        }
                        if let Some(v) = verf {
                            let (sec, nsec) = verf_time(&v);
                            let t = rfs::Timespec { tv_sec: i64::from(sec), tv_nsec: nsec as _ };
                            rfs::futimens(&fd, &rfs::Timestamps { last_access: t, last_modification: t })?;
                        }
                    }
                    if let (false, Some(size)) = (created, attr.size) {
                        rfs::ftruncate(&fd, size)?;
                    }
                    Ok(())
                })();
                r.wcc(self.after(&d, w))?;
                let st = nfs_fs::statx_at(&fd, Path::new("")).wcc(self.after(&d, w))?;
                x.remember(d.key(), name, nfs_fs::key_of(&st));
                res::create_ok(out, Some(&x.handle_of(&st).bytes()), Some(&x.fattr(&st)), &self.after(&d, w));
            }
            NfsCall::Mkdir { at, attr } => {
                let (d, dfd, name, w) = self.dir_change(&at)?;
                let mode = attr.mode.unwrap_or(0o755) & 0o7777;
                rfs::mkdirat(&dfd, name, Mode::from_raw_mode(mode)).wcc(self.after(&d, w))?;
                let c = x.node_at(d.path.join(name)).wcc(self.after(&d, w))?;
                if u32::from(c.st.stx_mode) & 0o7777 != mode {
                    let _ = rfs::chmod(nfs_fs::fd_path(&c.fd).as_str(), Mode::from_raw_mode(mode));
                }
                x.remember(d.key(), name, c.key());
                let a = self.post(&c);
                res::create_ok(out, Some(&x.handle_of(&c.st).bytes()), a.as_ref(), &self.after(&d, w));
            }
            NfsCall::Symlink { at, attr: _, target } => {
                let (d, dfd, name, w) = self.dir_change(&at)?;
                if target.contains(&0) {
                    return Err(Nfsstat3::ERR_INVAL).wcc(w);
                }
                // Stored as given; the server never follows it.
                rfs::symlinkat(OsStr::from_bytes(target), &dfd, name).wcc(self.after(&d, w))?;
                let c = x.node_at(d.path.join(name)).wcc(self.after(&d, w))?;
                x.remember(d.key(), name, c.key());
                res::create_ok(out, Some(&x.handle_of(&c.st).bytes()), Some(&self.attr(&c)), &self.after(&d, w));
            }
            NfsCall::Mknod { at, .. } => {
                let (d, _, _, w) = self.dir_change(&at)?;
                return Err(Nfsstat3::ERR_NOTSUPP).wcc(self.after(&d, w));
            }
            NfsCall::Remove(at) | NfsCall::Rmdir(at) => {
                let (d, dfd, name, w) = self.dir_change(&at)?;
                let st = nfs_fs::statx_at(&dfd, Path::new(name)).wcc(w)?;
                let rmdir = matches!(c, NfsCall::Rmdir(_));
                let is_dir = nfs_fs::ftype(&st) == connmux_nfs::Ftype3::Dir;
                if is_dir != rmdir {
                    let e = if rmdir { Nfsstat3::ERR_NOTDIR } else { Nfsstat3::ERR_ISDIR };
                    return Err(e).wcc(w);
                }
                let flags = if rmdir { AtFlags::REMOVEDIR } else { AtFlags::empty() };
                rfs::unlinkat(&dfd, name, flags).wcc(self.after(&d, w))?;
                x.forget(d.key(), name, nfs_fs::key_of(&st));
                res::wcc_ok(out, &self.after(&d, w));
            }
            NfsCall::Rename { from, to } => {
                let (fd, ffd, fname, fw) = self.dir_change(&from)?;
                let fail2 = |f: Fail, tw: Wcc| {
                    let mut f = f;
                    f.attrs.wcc = self.after(&fd, fw);
                    f.attrs.wcc2 = tw;
                    f
                };
                let (td, tfd, tname, tw) = self.dir_change(&to).map_err(|f| {
                    let w = f.attrs.wcc;
                    fail2(f, w)
                })?;
                let src = nfs_fs::statx_at(&ffd, Path::new(fname)).map_err(|e| fail2(e.into(), tw))?;
                let over = nfs_fs::statx_at(&tfd, Path::new(tname)).ok();
                rfs::renameat(&ffd, fname, &tfd, tname).map_err(|e| fail2(e.into(), self.after(&td, tw)))?;
                let key = nfs_fs::key_of(&src);
                if let Some(o) = over {
                    let ok = nfs_fs::key_of(&o);
                    if ok != key {
                        x.forget(td.key(), tname, ok);
                    }
                }
                x.remember(td.key(), tname, key);
                res::rename_ok(out, &self.after(&fd, fw), &self.after(&td, tw));
            }
            NfsCall::Link { fh, at } => {
                let n = x.resolve(fh)?;
                let a = Some(self.attr(&n));
                let (d, dfd, name, w) = self.dir_change(&at).attr(a)?;
                let fail = |e: Errno| {
                    let mut f = Fail::from(e);
                    f.attrs.attr = a;
                    f.attrs.wcc = self.after(&d, w);
                    f
                };
                let (Some(parent), Some(oname)) = (n.path.parent(), n.path.file_name()) else {
                    return Err(fail(Errno::INVAL));
                };
                let pfd = x.dir_fd(parent).map_err(fail)?;
                rfs::linkat(&pfd, oname, &dfd, name, AtFlags::empty()).map_err(fail)?;
                x.remember(d.key(), name, n.key());
                res::link_ok(out, self.post(&n).as_ref(), &self.after(&d, w));
            }
            NfsCall::Readdir { dir, cookie, count, .. } => self.readdir(dir, cookie, count, None, out)?,
            NfsCall::Readdirplus { dir, cookie, dircount, maxcount, .. } => {
                self.readdir(dir, cookie, maxcount, Some(dircount), out)?
            }
            NfsCall::Fsstat { fh } => {
                let n = x.resolve(fh)?;
                let a = Some(self.attr(&n));
                let v = rfs::fstatvfs(&n.fd).attr(a)?;
                let f = v.f_frsize.max(1);
                let s = res::Fsstat {
                    tbytes: v.f_blocks.saturating_mul(f),
                    fbytes: v.f_bfree.saturating_mul(f),
                    abytes: v.f_bavail.saturating_mul(f),
                    tfiles: v.f_files,
                    ffiles: v.f_ffree,
                    afiles: v.f_favail,
                    invarsec: 0,
                };
                res::fsstat_ok(out, a.as_ref(), &s);
            }
            NfsCall::Fsinfo { fh } => {
                let n = x.resolve(fh)?;
                let s = res::Fsinfo {
                    rtmax: RTMAX,
                    rtpref: RTMAX,
                    rtmult: 4096,
                    wtmax: self.wtmax,
                    wtpref: self.wtmax,
                    wtmult: 4096,
                    dtpref: 64 << 10,
                    maxfilesize: i64::MAX as u64,
                    time_delta: (0, 1),
                    properties: fsf::LINK | fsf::SYMLINK | fsf::HOMOGENEOUS | fsf::CANSETTIME,
                };
                res::fsinfo_ok(out, Some(&self.attr(&n)), &s);
            }
            NfsCall::Pathconf { fh } => {
                let n = x.resolve(fh)?;
                res::pathconf_ok(out, Some(&self.attr(&n)), 65_000, 255);
            }
            NfsCall::Commit { fh, .. } => {
                let n = x.resolve(fh)?;
                let w = self.wcc_of(&n);
                let f = x.file(&n, false).wcc(w)?;
                rfs::fsync(&f.file).wcc(w)?;
                res::commit_ok(out, &Wcc { before: w.before, after: self.post(&n) }, &self.verf);
            }
        }
        Ok(())
    }

    /// READDIR (`dircount` None) and READDIRPLUS: entries from `cookie`
    /// (a `d_off` of the directory, 0 for its start) while they fit in
    /// `count` bytes of reply (and `dircount` of names for READDIRPLUS).
    fn readdir(&self, dir: &[u8], cookie: u64, count: u32, dircount: Option<u32>, out: &mut Vec<u8>) -> NR<()> {
        let x = &*self.export;
        let d = self.dir(dir)?;
        let a = Some(self.attr(&d));
        let fd = x.dir_fd(&d.path).attr(a)?;
        if cookie != 0 {
            rfs::seek(&fd, rfs::SeekFrom::Start(cookie)).map_err(|_| Fail::from(Nfsstat3::ERR_BAD_COOKIE)).attr(a)?;
        }
        let start = out.len();
        res::readdir_begin(out, a.as_ref(), &[0; VERFSIZE]);
        let budget = (count.min(DIRMAX) as usize).saturating_sub(out.len() - start + res::READDIR_END_LEN);
        let names_budget = dircount.map_or(usize::MAX, |n| n as usize);
        let (mut used, mut names_used, mut entries) = (0usize, 0usize, 0usize);
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut raw = rfs::RawDir::new(&fd, &mut buf);
        let mut eof = true;
        let at_root = d.path.as_os_str().is_empty();
        // Bounded by the directory's entries and the budget.
        while let Some(ent) = raw.next() {
            let ent = ent.attr(a)?;
            let name = ent.file_name().to_bytes();
            let ncost = res::readdir_entry_len(name);
            let mut fileid = ent.ino();
            if name == b".." && at_root {
                fileid = d.st.stx_ino;
            }
            let plus = if dircount.is_some() && name != b"." && name != b".." {
                nfs_fs::statx_at(&fd, Path::new(OsStr::from_bytes(name))).ok()
            } else {
                None
            };
            let cost = match dircount {
                None => ncost,
                Some(_) => res::readdirplus_entry_len(name, plus.is_some(), plus.map(|_| nfs_fs::HANDLE_LEN)),
            };
            if used + cost > budget || names_used + ncost > names_budget {
                eof = false;
                break;
            }
            used += cost;
            names_used += ncost;
            entries += 1;
            let next = ent.next_entry_cookie();
            match dircount {
                None => res::readdir_entry(out, fileid, name, next),
                Some(_) => {
                    if let Some(st) = &plus {
                        x.remember(d.key(), OsStr::from_bytes(name), nfs_fs::key_of(st));
                    }
                    let fa = plus.as_ref().map(|st| x.fattr(st));
                    let h = plus.as_ref().map(|st| x.handle_of(st).bytes());
                    res::readdirplus_entry(out, fileid, name, next, fa.as_ref(), h.as_ref().map(|h| &h[..]));
                }
            }
        }
        if entries == 0 && !eof {
            out.truncate(start);
            return Err(Nfsstat3::ERR_TOOSMALL).attr(a);
        }
        res::readdir_end(out, eof);
        Ok(())
    }

    fn setattr(&self, n: &Node, a: &Sattr3) -> NR<()> {
        let x = &*self.export;
        if let Some(size) = a.size {
            let f = x.file(n, true)?;
            f.file.set_len(size).map_err(|e| Fail::from(errno(&e)))?;
        }
        let proc_path = nfs_fs::fd_path(&n.fd);
        if let Some(mode) = a.mode {
            if n.st.stx_mode as u32 & 0o170000 != 0o120000 {
                // Through the descriptor's magic link: the file found, not
                // a name that may have changed since.
                rfs::chmod(proc_path.as_str(), Mode::from_raw_mode(mode & 0o7777))?;
            }
        }
        if a.uid.is_some() || a.gid.is_some() {
            let uid = a.uid.map(rfs::Uid::from_raw);
            let gid = a.gid.map(rfs::Gid::from_raw);
            rfs::chownat(&n.fd, "", uid, gid, AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW)?;
        }
        if (a.atime != SetTime::DontChange || a.mtime != SetTime::DontChange)
            && n.st.stx_mode as u32 & 0o170000 != 0o120000
        {
            let t = |s: SetTime| match s {
                SetTime::DontChange => rfs::Timespec { tv_sec: 0, tv_nsec: rfs::UTIME_OMIT },
                SetTime::ServerTime => rfs::Timespec { tv_sec: 0, tv_nsec: rfs::UTIME_NOW },
                SetTime::ClientTime(Nfstime3 { seconds, nseconds }) => {
                    rfs::Timespec { tv_sec: i64::from(seconds), tv_nsec: nseconds.min(999_999_999) as _ }
                }
            };
            let times = rfs::Timestamps { last_access: t(a.atime), last_modification: t(a.mtime) };
            rfs::utimensat(rfs::CWD, proc_path.as_str(), &times, AtFlags::empty())?;
        }
        Ok(())
    }
}

const RESOLVE: rfs::ResolveFlags =
    rfs::ResolveFlags::BENEATH.union(rfs::ResolveFlags::NO_SYMLINKS).union(rfs::ResolveFlags::NO_MAGICLINKS);

/// The identity a call runs as: its AUTH_SYS uid, gid and groups (uid 0
/// as nobody when `squash`); nobody for any other credential.
fn caller(call: &CallHeader<'_>, squash: bool) -> super::ids::Cred {
    use super::ids::{Cred, NOBODY};
    let nobody = Cred { uid: NOBODY, gid: NOBODY, gids: Vec::new() };
    if call.cred().flavor != connmux_oncrpc::AuthFlavor::AUTH_SYS {
        return nobody;
    }
    match connmux_oncrpc::AuthSysParams::parse(call.cred().body) {
        Ok(p) if !(squash && p.uid == 0) => Cred { uid: p.uid, gid: p.gid, gids: p.gids().collect() },
        _ => nobody,
    }
}

/// The errno of an I/O error (EIO when it has none).
fn errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

/// The mtime an exclusive CREATE's verifier is kept in: seconds from its
/// first half, nanoseconds (below 10^9) from its second.
fn verf_time(v: &[u8; VERFSIZE]) -> (u32, u32) {
    let w = |i: usize| u32::from_be_bytes(v[i..i + 4].try_into().expect("4 bytes"));
    (w(0), w(4) % 1_000_000_000)
}
