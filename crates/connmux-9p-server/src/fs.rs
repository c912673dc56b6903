//! The exported directory: every path a client names is resolved beneath it.
//!
//! A fid's path is kept relative to the export, normalised lexically (`..`
//! pops a component and stops at the export's root, as 9P asks of the root),
//! and every open goes through `openat2` from the export's directory with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: no symlink
//! is ever followed by the server (clients read links with Treadlink and walk
//! the target themselves), and the kernel refuses any resolution that would
//! leave the export, whatever a local user renames meanwhile. Creations,
//! removals and renames are `*at` calls of one checked name in a directory
//! opened that way.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use connmux_9p::types::{getattr as gmask, setattr as smask};
use connmux_9p::{Attr, Qid, QidType, SetAttr, StatFs};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

pub use crate::budget::{Budget, Slot};
use crate::locks::{FidLocks, LockInfo, LockedFile, Locks, Owners};
use crate::users::User;

/// A result whose error is the errno the client gets in Rlerror.
pub type R<T> = Result<T, Errno>;

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS);

/// A connection's counts against the export's budgets.
#[derive(Default, Clone)]
pub struct Quota {
    pub open: Arc<AtomicUsize>,
    pub handles: Arc<AtomicUsize>,
    /// Bytes of extended attributes held in fids ([`XATTR_HELD`]).
    pub xattr_bytes: Arc<AtomicUsize>,
}

/// How an export is served.
pub struct Options {
    /// Refuse every change (EROFS).
    pub read_only: bool,
    /// Serve extended attributes (`user.*`, POSIX ACLs).
    pub xattrs: bool,
    /// The budget of open files.
    pub open_files: Arc<Budget>,
    /// The budget of fids' `O_PATH` handles.
    pub handles: Arc<Budget>,
}

/// The exported directory.
pub struct Export {
    root: OwnedFd,
    /// Extended attributes served.
    pub xattrs: bool,
    /// Byte-range locks' holders, as clients described them.
    locks: Locks,
    /// Files and directories opened by clients (Tlopen, Tlcreate).
    pub open_files: Arc<Budget>,
    /// `O_PATH` handles kept by fids that are not open (a fid over this
    /// budget keeps its path only, and is reopened by it when used).
    pub handles: Arc<Budget>,
    /// The path clients name in Tattach (canonical).
    pub path: PathBuf,
    /// The path as given on the command line (also accepted in Tattach).
    given: PathBuf,
    /// Refuse every change.
    pub read_only: bool,
}

/// What a fid refers to once opened.
pub enum Open {
    /// A regular file opened with Tlopen/Tlcreate.
    Regular(File),
    /// Anything else opened so (a FIFO, a socket, a device): non-blocking.
    File(File),
    /// A directory opened for Treaddir: the position is the descriptor's, so
    /// a seek and the read after it go together under the lock.
    Dir(Mutex<OwnedFd>),
}

impl Open {
    fn of(fd: OwnedFd, st: &rfs::Stat) -> Open {
        if rfs::FileType::from_raw_mode(st.st_mode as _) == rfs::FileType::RegularFile {
            Open::Regular(File::from(fd))
        } else {
            Open::File(File::from(fd))
        }
    }
}

/// How a fid that is not open reaches its file.
pub enum Node {
    /// An `O_PATH | O_NOFOLLOW` descriptor, within the handle budget:
    /// attributes and links are read through it without a lookup.
    Handle { fd: OwnedFd, _slot: Slot },
    /// The path only (over the budget, or opened: the open descriptor
    /// serves): looked up again, beneath the export, when used.
    Path,
}

/// One fid of a connection.
pub struct Fid {
    /// Path beneath the export ("" is the root); changes when a rename moves it.
    pub path: Mutex<PathBuf>,
    pub node: Node,
    /// The qid it was walked to.
    pub qid: Qid,
    /// After Tlopen/Tlcreate, with its place in the open-file budget.
    pub open: Option<(Open, Slot)>,
    /// Whom the attach it was walked from named: its operations run as them.
    pub user: Arc<User>,
    /// The directory it was attached to: `..` stops there.
    pub floor: Arc<PathBuf>,
    /// An extended attribute read (Txattrwalk) or being written
    /// (Txattrcreate) through this fid.
    /// (Boxed: most fids have none, and a fid is kept small.)
    pub xattr: Option<Box<Xattr>>,
    /// Of an opened fid: the owners it took byte-range locks for.
    locks: FidLocks,
}

/// An extended attribute behind a fid, and its bytes in the connection's
/// count ([`XATTR_HELD`]).
pub enum Xattr {
    /// Its value (or, for the empty name, the list of names), read by Tread.
    Read { value: Vec<u8>, _held: Held },
    /// To be set at Tclunk to the `size` bytes written by Twrite.
    Write { name: String, size: usize, flags: u32, value: Mutex<Vec<u8>>, _held: Held },
}

/// Bytes of extended attributes a connection holds in fids, at most (ENOMEM
/// beyond): a client cannot make the server hold a value in each of
/// thousands of fids.
pub const XATTR_HELD: usize = 1 << 20;
/// The largest value or list (Linux's `XATTR_SIZE_MAX`).
pub const XATTR_MAX: usize = 64 * 1024;

/// Bytes counted against a connection's [`XATTR_HELD`], given back on drop.
pub struct Held {
    n: usize,
    count: Arc<AtomicUsize>,
}

impl Held {
    fn take(count: &Arc<AtomicUsize>, n: usize) -> R<Held> {
        if count.fetch_add(n, Relaxed) + n > XATTR_HELD {
            count.fetch_sub(n, Relaxed);
            return Err(Errno::NOMEM);
        }
        Ok(Held { n, count: count.clone() })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.count.fetch_sub(self.n, Relaxed);
    }
}

/// Which extended attributes clients may read and write: the user
/// namespace and POSIX ACLs (the kernel checks them as for a local caller);
/// `trusted.*` and `security.*` are the server host's business.
pub fn xattr_served(name: &str) -> bool {
    name.starts_with("user.") || name == "system.posix_acl_access" || name == "system.posix_acl_default"
}

/// A fid's size in memory, beside its path's bytes and its map entry (a
/// connection may hold 131,072 of them).
pub const FID_SIZE: usize = std::mem::size_of::<Fid>();
const _: () = assert!(FID_SIZE <= 160, "a fid grew");

impl Fid {
    fn bare(path: PathBuf, qid: Qid, user: Arc<User>, floor: Arc<PathBuf>) -> Fid {
        Fid {
            path: Mutex::new(path),
            node: Node::Path,
            qid,
            open: None,
            user,
            floor,
            xattr: None,
            locks: FidLocks::default(),
        }
    }

    /// The open file, if the fid was opened as one.
    fn file(&self) -> Option<&File> {
        match &self.open {
            Some((Open::File(f) | Open::Regular(f), _)) => Some(f),
            _ => None,
        }
    }

    /// The open file, if the fid was opened as a regular one.
    pub fn regular(&self) -> Option<&File> {
        match &self.open {
            Some((Open::Regular(f), _)) => Some(f),
            _ => None,
        }
    }

    /// Whether attributes are read without a lookup or a lock (Tgetattr on
    /// an I/O worker): a handle or an open file.
    pub fn cheap(&self) -> bool {
        matches!(self.node, Node::Handle { .. }) || self.file().is_some()
    }
}

/// A checked single name: not empty, no `/`, not `.` or `..`, no NUL.
pub fn check_name(name: &str) -> R<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Errno::INVAL);
    }
    if name.len() > 255 {
        return Err(Errno::NAMETOOLONG);
    }
    Ok(name)
}

fn qid_of(st: &rfs::Stat) -> Qid {
    let ty = match rfs::FileType::from_raw_mode(st.st_mode as _) {
        rfs::FileType::Directory => QidType::DIR,
        rfs::FileType::Symlink => QidType::SYMLINK,
        _ => QidType::FILE,
    };
    // The version changes with the contents (mtime), so a client's cache
    // notices a change made by another client or locally.
    let version = (st.st_mtime as u32) ^ (st.st_mtime_nsec as u32) ^ (st.st_size as u32);
    Qid { ty, version, path: st.st_ino }
}

impl Export {
    /// Opens `dir` as the export.
    /// `open_files` and `handles`: the descriptor budgets.
    pub fn open(dir: &Path, o: Options) -> std::io::Result<Export> {
        let ctx = |p: &Path, e: &dyn std::fmt::Display| std::io::Error::other(format!("export {}: {e}", p.display()));
        let path = std::fs::canonicalize(dir).map_err(|e| ctx(dir, &e))?;
        let root = rfs::open(&path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| ctx(&path, &e))?;
        Ok(Export {
            root,
            xattrs: o.xattrs,
            locks: Locks::default(),
            open_files: o.open_files,
            handles: o.handles,
            path,
            given: dir.to_path_buf(),
            read_only: o.read_only,
        })
    }

    /// Runs `f` on a descriptor of the fid's file that reads its attributes:
    /// its open file, its handle, or an `O_PATH` descriptor looked up by its
    /// path for the call (closed after it).
    pub fn with_node<T>(&self, fid: &Fid, f: impl FnOnce(BorrowedFd<'_>) -> R<T>) -> R<T> {
        if let Some(file) = fid.file() {
            return f(file.as_fd());
        }
        if let Node::Handle { fd, .. } = &fid.node {
            return f(fd.as_fd());
        }
        let path = fid.path.lock().unwrap().clone();
        let fd = self.open_beneath(&path, OFlags::PATH, Mode::empty())?;
        f(fd.as_fd())
    }

    /// A fid at `path` whose file `fd` (`O_PATH`) is: it keeps `fd` while
    /// the handle budget allows, else its path only.
    fn fid_with(&self, path: PathBuf, fd: OwnedFd, qid: Qid, q: &Quota, from: &Fid) -> Fid {
        let node = match self.handles.take(&q.handles) {
            Ok(_slot) => Node::Handle { fd, _slot },
            Err(_) => Node::Path,
        };
        Fid { node, ..Fid::bare(path, qid, from.user.clone(), from.floor.clone()) }
    }

    /// The directory beneath the export that `aname` (Tattach's attach
    /// name) names: empty or the export's path (canonical or as given;
    /// compared by components, so a trailing `/` does not matter) is its
    /// root; a path beneath it, or a relative path, a sub-directory (which
    /// the attach's fids cannot walk above). `None`: a path outside, or
    /// with `..`. The name outside the export is never looked up: a client
    /// learns nothing of paths outside from the answer.
    pub fn attach_point(&self, aname: &str) -> Option<PathBuf> {
        let a = Path::new(aname);
        let rest = if aname.is_empty() {
            Path::new("")
        } else if a.is_absolute() {
            a.strip_prefix(&self.path).or_else(|_| a.strip_prefix(&self.given)).ok()?
        } else if a == self.given {
            Path::new("")
        } else {
            a
        };
        let mut out = PathBuf::new();
        for c in rest.components() {
            match c {
                std::path::Component::Normal(n) => out.push(check_name(n.to_str()?).ok()?),
                std::path::Component::CurDir => {}
                _ => return None,
            }
        }
        Some(out)
    }

    fn rel(p: &Path) -> &Path {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    }

    /// `openat2` beneath the export, following no symlink, and never
    /// waiting: with `O_NONBLOCK`, as the name may be a FIFO (whose open
    /// waits for the other end) or a device, and a file-system thread
    /// blocked in `open(2)` would be lost to every client. Callers that hand
    /// the descriptor on clear the flag where it changes nothing but the
    /// wait ([`Export::settle`]).
    pub fn open_beneath(&self, p: &Path, flags: OFlags, mode: Mode) -> R<OwnedFd> {
        // (openat2 refuses O_NONBLOCK beside O_PATH, which opens nothing.)
        let nb = if flags.contains(OFlags::PATH) { OFlags::empty() } else { OFlags::NONBLOCK };
        rfs::openat2(&self.root, Self::rel(p), flags | OFlags::CLOEXEC | OFlags::NOFOLLOW | nb, mode, RESOLVE)
    }

    /// An opened descriptor handed to a client: a regular file gets the
    /// client's own `O_NONBLOCK` (it means nothing to a regular file's I/O
    /// anyway); anything else (a FIFO, a device) stays non-blocking, so no
    /// read or write on it waits in a file-system thread either.
    fn settle(fd: &OwnedFd, st: &rfs::Stat, asked: OFlags) -> R<()> {
        if rfs::FileType::from_raw_mode(st.st_mode as _) == rfs::FileType::RegularFile
            && !asked.contains(OFlags::NONBLOCK)
        {
            let fl = rfs::fcntl_getfl(fd)?;
            rfs::fcntl_setfl(fd, fl - OFlags::NONBLOCK)?;
        }
        Ok(())
    }

    fn node(&self, p: &Path) -> R<(OwnedFd, Qid)> {
        let fd = self.open_beneath(p, OFlags::PATH, Mode::empty())?;
        let st = rfs::fstat(&fd)?;
        Ok((fd, qid_of(&st)))
    }

    fn dir(&self, p: &Path) -> R<OwnedFd> {
        self.open_beneath(p, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
    }

    fn writable(&self) -> R<()> {
        if self.read_only {
            Err(Errno::ROFS)
        } else {
            Ok(())
        }
    }

    /// The root's fid (Tattach).
    /// `at`: the directory beneath the export attached to ([`Export::attach_point`]).
    pub fn attach(&self, q: &Quota, user: Arc<User>, at: PathBuf) -> R<Fid> {
        let fd = self.open_beneath(&at, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        let qid = qid_of(&rfs::fstat(&fd)?);
        let floor = Arc::new(at.clone());
        Ok(self.fid_with(at, fd, qid, q, &Fid::bare(PathBuf::new(), qid, user, floor)))
    }

    /// Twalk from `from` through `names`: the qids walked and, when every
    /// name was walked, the new fid. An error on the first name is the
    /// walk's error.
    pub fn walk(&self, from: &Fid, names: &[&str], q: &Quota) -> R<(Vec<Qid>, Option<Fid>)> {
        let mut path = from.path.lock().unwrap().clone();
        if names.is_empty() {
            // A clone: its own handle, looked up again (the original's may be
            // an open file, or none).
            let (fd, _) = self.node(&path)?;
            return Ok((Vec::new(), Some(self.fid_with(path, fd, from.qid, q, from))));
        }
        let mut qids = Vec::with_capacity(names.len());
        let mut last = None;
        for (i, name) in names.iter().enumerate() {
            let step = match *name {
                // Lexically: the parent of the root (the export's, or the
                // directory attached to) is the root.
                ".." => {
                    if path != *from.floor {
                        path.pop();
                    }
                    Ok(())
                }
                "." => Ok(()),
                n => check_name(n).map(|n| path.push(n)),
            }
            .and_then(|()| self.node(&path));
            match step {
                Ok((fd, q)) => {
                    qids.push(q);
                    last = Some(fd);
                }
                Err(e) if i == 0 => return Err(e),
                Err(_) => return Ok((qids, None)),
            }
        }
        let fd = last.expect("at least one name");
        let qid = *qids.last().expect("at least one qid");
        Ok((qids, Some(self.fid_with(path, fd, qid, q, from))))
    }

    /// Tgetattr.
    pub fn getattr(&self, fid: &Fid) -> R<(u64, Qid, Attr)> {
        let st = self.with_node(fid, |fd| rfs::fstat(fd))?;
        let a = Attr {
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            nlink: st.st_nlink,
            rdev: st.st_rdev,
            size: st.st_size as u64,
            blksize: st.st_blksize as u64,
            blocks: st.st_blocks as u64,
            atime_sec: st.st_atime as u64,
            atime_nsec: st.st_atime_nsec,
            mtime_sec: st.st_mtime as u64,
            mtime_nsec: st.st_mtime_nsec,
            ctime_sec: st.st_ctime as u64,
            ctime_nsec: st.st_ctime_nsec,
            ..Attr::default()
        };
        Ok((gmask::BASIC, qid_of(&st), a))
    }

    /// Tlopen: a new fid for `fid`, opened, within the open-file budget,
    /// and its qid.
    pub fn lopen(&self, fid: &Fid, flags: u32, q: &Quota) -> R<(Fid, Qid)> {
        let slot = self.open_files.take(&q.open)?;
        let path = fid.path.lock().unwrap().clone();
        let (open, qid) = self.open_fid(fid, flags)?;
        let f = Fid { open: Some((open, slot)), ..Fid::bare(path, qid, fid.user.clone(), fid.floor.clone()) };
        Ok((f, qid))
    }

    fn open_fid(&self, fid: &Fid, flags: u32) -> R<(Open, Qid)> {
        let path = fid.path.lock().unwrap().clone();
        let fl = open_flags(flags);
        // As open(2): a directory is opened for reading only.
        if fid.qid.ty == QidType::DIR && fl.intersects(OFlags::WRONLY | OFlags::RDWR | OFlags::TRUNC) {
            return Err(Errno::ISDIR);
        }
        if fl.intersects(OFlags::WRONLY | OFlags::RDWR | OFlags::TRUNC | OFlags::APPEND) {
            self.writable()?;
        }
        if fid.qid.ty == QidType::DIR {
            let fd = self.open_beneath(&path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            return Ok((Open::Dir(Mutex::new(fd)), fid.qid));
        }
        let fd = self.open_beneath(&path, fl, Mode::empty())?;
        let st = rfs::fstat(&fd)?;
        Self::settle(&fd, &st, fl)?;
        Ok((Open::of(fd, &st), qid_of(&st)))
    }

    /// Tread of a regular file's pages already in memory, done where it is
    /// asked (an I/O worker) because it cannot wait: `preadv2` with
    /// `RWF_NOWAIT`, which fails with EAGAIN rather than wait for the disk.
    /// A short read is taken only at the end of the file (a client takes a
    /// short read for the end); any error or doubt is EAGAIN, and the
    /// request goes to a file-system thread.
    pub fn read_cached(&self, fid: &Fid, offset: u64, count: usize, out: &mut Vec<u8>) -> R<usize> {
        let Some(f) = fid.regular() else {
            return Err(Errno::AGAIN);
        };
        let start = out.len();
        // (Into the spare capacity: no bytes written twice.)
        let r = connmux_sys::fileserver::pread_cached_into(f.as_fd(), out, count, offset);
        let n = match r {
            Ok(n) if n == count || n > 0 && offset + n as u64 >= rfs::fstat(f)?.st_size as u64 => n,
            Ok(0) if count == 0 || offset >= rfs::fstat(f)?.st_size as u64 => 0,
            _ => {
                out.truncate(start);
                return Err(Errno::AGAIN);
            }
        };
        out.truncate(start + n);
        Ok(n)
    }

    /// Tlcreate: creates `name` in directory `dir` and opens it; the fid
    /// becomes the new file. As open(2) with `O_CREAT`: without `O_EXCL` an
    /// existing file of that name is opened instead.
    pub fn lcreate(&self, dir: &Fid, name: &str, flags: u32, mode: u32, q: &Quota) -> R<(Fid, Qid)> {
        self.writable()?;
        let name = check_name(name)?;
        let slot = self.open_files.take(&q.open)?;
        let mut path = dir.path.lock().unwrap().clone();
        let dfd = self.dir(&path)?;
        let fl = open_flags(flags);
        let open = |extra: OFlags, mode: u32| {
            let fl = fl | extra | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
            rfs::openat2(&dfd, name, fl, Mode::from_raw_mode(mode & 0o7777), RESOLVE)
        };
        // Created here (then its mode is made exact), or found.
        let (fd, created) = match open(OFlags::CREATE | OFlags::EXCL, mode) {
            Ok(fd) => (fd, true),
            Err(Errno::EXIST) if !OFlags::from_bits_retain(flags).contains(OFlags::EXCL) => {
                (open(OFlags::empty(), 0)?, false)
            }
            Err(e) => return Err(e),
        };
        path.push(name);
        let st = rfs::fstat(&fd)?;
        if !created && rfs::FileType::from_raw_mode(st.st_mode as _) == rfs::FileType::Directory {
            return Err(Errno::ISDIR);
        }
        if created {
            exact_mode(&fd, &st, mode)?;
        }
        Self::settle(&fd, &st, fl)?;
        let qid = qid_of(&st);
        let open = Some((Open::of(fd, &st), slot));
        Ok((Fid { open, ..Fid::bare(path, qid, dir.user.clone(), dir.floor.clone()) }, qid))
    }

    /// Tread on an opened file: appends up to `count` bytes at `offset` to `out`.
    pub fn read(&self, fid: &Fid, offset: u64, count: usize, out: &mut Vec<u8>) -> R<usize> {
        if let Some(Xattr::Read { value: v, .. }) = fid.xattr.as_deref() {
            let from = (offset.min(v.len() as u64)) as usize;
            let part = &v[from..(from + count).min(v.len())];
            out.extend_from_slice(part);
            return Ok(part.len());
        }
        let Some(f) = fid.file() else {
            return Err(Errno::BADF);
        };
        let start = out.len();
        out.reserve_exact(count);
        // Read into the spare capacity: no zeroing of a buffer about to be
        // overwritten. A short read before the end is retried: a reply
        // shorter than asked means the end of the file to a client.
        while out.len() - start < count {
            let got = out.len() - start;
            // Keep the read within `count` even if the allocation is larger.
            if out.capacity() > start + count {
                out.shrink_to(start + count);
            }
            match rustix::io::pread(f, rustix::buffer::spare_capacity(out), offset + got as u64) {
                Ok(0) => break,
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(e) => {
                    out.truncate(start);
                    return Err(e);
                }
            }
        }
        out.truncate(start + count);
        Ok(out.len() - start)
    }

    /// Twrite.
    pub fn write(&self, fid: &Fid, offset: u64, data: &[u8]) -> R<u32> {
        self.writable()?;
        if let Some(Xattr::Write { size, value, .. }) = fid.xattr.as_deref() {
            // Within the size Txattrcreate gave.
            let end = offset.checked_add(data.len() as u64).filter(|&e| e <= *size as u64).ok_or(Errno::NOSPC)?;
            let mut v = value.lock().unwrap();
            if v.len() < end as usize {
                v.resize(end as usize, 0);
            }
            v[offset as usize..end as usize].copy_from_slice(data);
            return Ok(data.len() as u32);
        }
        let Some(f) = fid.file() else {
            return Err(Errno::BADF);
        };
        f.write_at(data, offset).map(|n| n as u32).map_err(|e| errno_of(&e))
    }

    /// Treaddir: appends entries from `offset` (a cookie from an earlier
    /// entry, or 0) while they fit in `count` bytes.
    pub fn readdir(&self, fid: &Fid, offset: u64, count: usize, out: &mut Vec<u8>) -> R<()> {
        let Some((Open::Dir(d), _)) = &fid.open else {
            return Err(Errno::BADF);
        };
        let fd = d.lock().unwrap();
        rfs::seek(&*fd, rfs::SeekFrom::Start(offset))?;
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); count.clamp(512, 64 * 1024)];
        let mut dir = rfs::RawDir::new(&*fd, &mut buf);
        let start = out.len();
        // Bounded by the directory's entries and by `count`.
        while let Some(ent) = dir.next() {
            let ent = ent?;
            let Ok(name) = ent.file_name().to_str() else { continue };
            if out.len() - start + connmux_9p::Dirent::wire_len(name) > count {
                break;
            }
            let (ty, dtype) = match ent.file_type() {
                rfs::FileType::Directory => (QidType::DIR, 4),
                rfs::FileType::Symlink => (QidType::SYMLINK, 10),
                rfs::FileType::RegularFile => (QidType::FILE, 8),
                rfs::FileType::Fifo => (QidType::FILE, 1),
                rfs::FileType::Socket => (QidType::FILE, 12),
                rfs::FileType::CharacterDevice => (QidType::FILE, 2),
                rfs::FileType::BlockDevice => (QidType::FILE, 6),
                _ => (QidType::FILE, 0),
            };
            connmux_9p::Dirent {
                qid: Qid { ty, version: 0, path: ent.ino() },
                offset: ent.next_entry_cookie(),
                dtype,
                name,
            }
            .put(out);
        }
        Ok(())
    }

    /// Tsetattr.
    pub fn setattr(&self, fid: &Fid, a: &SetAttr) -> R<()> {
        self.writable()?;
        let path = fid.path.lock().unwrap().clone();
        if a.valid & smask::SIZE != 0 {
            let fd = self.open_beneath(&path, OFlags::WRONLY, Mode::empty())?;
            rfs::ftruncate(&fd, a.size)?;
        }
        if a.valid & (smask::MODE | smask::UID | smask::GID) != 0 {
            // On the O_PATH descriptor with an empty path: no name is looked up again.
            if a.valid & smask::MODE != 0 {
                if fid.qid.ty == QidType::SYMLINK {
                    return Err(Errno::OPNOTSUPP);
                }
                let fd = self.open_beneath(&path, OFlags::RDONLY, Mode::empty())?;
                rfs::fchmod(&fd, Mode::from_raw_mode(a.mode & 0o7777))?;
            }
            if a.valid & (smask::UID | smask::GID) != 0 {
                let uid = (a.valid & smask::UID != 0).then(|| rustix::fs::Uid::from_raw(a.uid));
                let gid = (a.valid & smask::GID != 0).then(|| rustix::fs::Gid::from_raw(a.gid));
                self.with_node(fid, |fd| {
                    rfs::chownat(fd, "", uid, gid, AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW)
                })?;
            }
        }
        if a.valid & (smask::ATIME | smask::MTIME) != 0 && fid.qid.ty != QidType::SYMLINK {
            let t = |set: u32, on: u32, sec: u64, nsec: u64| rfs::Timespec {
                tv_sec: if a.valid & set != 0 { sec as i64 } else { 0 },
                tv_nsec: if a.valid & on == 0 {
                    rfs::UTIME_OMIT
                } else if a.valid & set != 0 {
                    nsec as _
                } else {
                    rfs::UTIME_NOW
                },
            };
            let times = rfs::Timestamps {
                last_access: t(smask::ATIME_SET, smask::ATIME, a.atime_sec, a.atime_nsec),
                last_modification: t(smask::MTIME_SET, smask::MTIME, a.mtime_sec, a.mtime_nsec),
            };
            let fd = self.open_beneath(&path, OFlags::RDONLY, Mode::empty())?;
            rfs::futimens(&fd, &times)?;
        }
        Ok(())
    }

    /// The directory holding a fid's file, and its name there.
    fn parent_of(&self, fid: &Fid) -> R<(OwnedFd, String)> {
        let path = fid.path.lock().unwrap().clone();
        let name = path.file_name().and_then(|n| n.to_str()).ok_or(Errno::BUSY)?.to_string();
        let parent = path.parent().unwrap_or(Path::new(""));
        Ok((self.dir(parent)?, name))
    }

    /// Tremove: the fid's file goes (the caller clunks the fid either way).
    pub fn remove(&self, fid: &Fid) -> R<()> {
        self.writable()?;
        let (dfd, name) = self.parent_of(fid)?;
        let flags = if fid.qid.ty == QidType::DIR { AtFlags::REMOVEDIR } else { AtFlags::empty() };
        rfs::unlinkat(&dfd, name.as_str(), flags)
    }

    /// Tunlinkat.
    pub fn unlinkat(&self, dir: &Fid, name: &str, flags: u32) -> R<()> {
        self.writable()?;
        let name = check_name(name)?;
        let dfd = self.dir(&dir.path.lock().unwrap())?;
        let f = if flags & 0x200 != 0 { AtFlags::REMOVEDIR } else { AtFlags::empty() };
        rfs::unlinkat(&dfd, name, f)
    }

    /// Tmkdir.
    pub fn mkdir(&self, dir: &Fid, name: &str, mode: u32) -> R<Qid> {
        self.writable()?;
        let name = check_name(name)?;
        let dfd = self.dir(&dir.path.lock().unwrap())?;
        rfs::mkdirat(&dfd, name, Mode::from_raw_mode(mode & 0o7777))?;
        let st = rfs::statat(&dfd, name, AtFlags::SYMLINK_NOFOLLOW)?;
        if st.st_mode & 0o7777 != mode & 0o7777 {
            let fd = rfs::openat2(
                &dfd,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
                RESOLVE,
            )?;
            exact_mode(&fd, &st, mode)?;
        }
        Ok(qid_of(&st))
    }

    /// Tsymlink: the target is stored as given and never followed here.
    pub fn symlink(&self, dir: &Fid, name: &str, target: &str) -> R<Qid> {
        self.writable()?;
        let name = check_name(name)?;
        let dfd = self.dir(&dir.path.lock().unwrap())?;
        rfs::symlinkat(target, &dfd, name)?;
        Ok(qid_of(&rfs::statat(&dfd, name, AtFlags::SYMLINK_NOFOLLOW)?))
    }

    /// Tmknod: FIFOs, sockets and regular files; no device nodes.
    pub fn mknod(&self, dir: &Fid, name: &str, mode: u32) -> R<Qid> {
        self.writable()?;
        let name = check_name(name)?;
        let ft = rfs::FileType::from_raw_mode(mode as _);
        if !matches!(ft, rfs::FileType::Fifo | rfs::FileType::Socket | rfs::FileType::RegularFile) {
            return Err(Errno::PERM);
        }
        let dfd = self.dir(&dir.path.lock().unwrap())?;
        rfs::mknodat(&dfd, name, ft, Mode::from_raw_mode(mode & 0o7777), 0)?;
        let st = rfs::statat(&dfd, name, AtFlags::SYMLINK_NOFOLLOW)?;
        // A socket cannot be opened to fchmod it (and chmod by name would
        // follow a link put in its place): it keeps the umask's mode.
        if st.st_mode & 0o7777 != mode & 0o7777 && ft != rfs::FileType::Socket {
            let fl = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOFOLLOW;
            let fd = rfs::openat2(&dfd, name, fl, Mode::empty(), RESOLVE)?;
            exact_mode(&fd, &st, mode)?;
        }
        Ok(qid_of(&st))
    }

    /// Treadlink.
    pub fn readlink(&self, fid: &Fid) -> R<String> {
        // As readlink(2) on anything but a link.
        if fid.qid.ty != QidType::SYMLINK {
            return Err(Errno::INVAL);
        }
        let t = self.with_node(fid, |fd| rfs::readlinkat(fd, "", Vec::new()))?;
        t.into_string().map_err(|_| Errno::ILSEQ)
    }

    /// Tlink: a hard link to `fid`'s file named `name` in `dir`.
    pub fn link(&self, dir: &Fid, fid: &Fid, name: &str) -> R<()> {
        self.writable()?;
        let name = check_name(name)?;
        let (ofd, oname) = self.parent_of(fid)?;
        let dfd = self.dir(&dir.path.lock().unwrap())?;
        rfs::linkat(&ofd, oname.as_str(), &dfd, name, AtFlags::empty())
    }

    /// Trenameat: returns the old and new paths (for the fids to follow).
    pub fn renameat(&self, odir: &Fid, oname: &str, ndir: &Fid, nname: &str) -> R<(PathBuf, PathBuf)> {
        self.writable()?;
        let (oname, nname) = (check_name(oname)?, check_name(nname)?);
        // One path lock at a time, each released before the next: the two
        // fids may be one (a rename within a directory), and a lock taken
        // twice by one thread never returns.
        let op = odir.path.lock().unwrap().clone();
        let np = ndir.path.lock().unwrap().clone();
        let (ofd, nfd) = (self.dir(&op)?, self.dir(&np)?);
        rfs::renameat(&ofd, oname, &nfd, nname)?;
        Ok((op.join(oname), np.join(nname)))
    }

    /// Trename: `fid`'s file moves into `dir` as `name`.
    pub fn rename(&self, fid: &Fid, dir: &Fid, name: &str) -> R<(PathBuf, PathBuf)> {
        self.writable()?;
        let name = check_name(name)?;
        let old = fid.path.lock().unwrap().clone();
        let (ofd, oname) = self.parent_of(fid)?;
        let np = dir.path.lock().unwrap().clone();
        let nfd = self.dir(&np)?;
        rfs::renameat(&ofd, oname.as_str(), &nfd, name)?;
        Ok((old, np.join(name)))
    }

    /// Tstatfs.
    pub fn statfs(&self, fid: &Fid) -> R<StatFs> {
        let (s, v) = self.with_node(fid, |fd| Ok((rfs::fstatfs(fd)?, rfs::fstatvfs(fd)?)))?;
        Ok(StatFs {
            fs_type: s.f_type as u32,
            bsize: v.f_bsize as u32,
            blocks: v.f_blocks,
            bfree: v.f_bfree,
            bavail: v.f_bavail,
            files: v.f_files,
            ffree: v.f_ffree,
            fsid: v.f_fsid,
            namelen: v.f_namemax as u32,
        })
    }

    /// Tfsync.
    pub fn fsync(&self, fid: &Fid, datasync: bool) -> R<()> {
        let Some(f) = fid.file() else {
            return Ok(());
        };
        if datasync {
            rfs::fdatasync(f)
        } else {
            rfs::fsync(f)
        }
    }

    /// Tlock ([`Locks::lock`]) through an opened fid of a connection whose
    /// lock owners are `owners`.
    pub fn lock(&self, fid: &Fid, l: &connmux_9p::tmsg::Lock<'_>, owners: &Arc<Owners>, q: &Quota) -> R<u8> {
        let f = Self::locked_file(fid, owners)?;
        self.locks.lock(&f, l, || self.open_files.take(&q.open))
    }

    /// Tgetlock ([`Locks::getlock`]).
    pub fn getlock(&self, fid: &Fid, l: &connmux_9p::tmsg::Lock<'_>, owners: &Arc<Owners>) -> R<LockInfo> {
        self.locks.getlock(&Self::locked_file(fid, owners)?, l)
    }

    fn locked_file<'a>(fid: &'a Fid, owners: &'a Arc<Owners>) -> R<LockedFile<'a>> {
        let Some(file) = fid.file() else {
            return Err(Errno::BADF);
        };
        let regular = fid.regular().is_some();
        Ok(LockedFile { file, regular, ino: fid.qid.path, uid: fid.user.uid, held: &fid.locks, owners })
    }

    /// Txattrwalk: a new fid holding `name`'s value (or, for the empty
    /// name, the list of names served), and its size.
    pub fn xattrwalk(&self, fid: &Fid, name: &str, q: &Quota) -> R<(Fid, u64)> {
        if !self.xattrs {
            return Err(Errno::OPNOTSUPP);
        }
        let mut buf = Vec::with_capacity(XATTR_MAX);
        let value = if name.is_empty() {
            self.with_node(fid, |fd| rfs::listxattr(proc_fd(fd), rustix::buffer::spare_capacity(&mut buf)))?;
            // Only the names served.
            let mut list = Vec::new();
            for n in buf.split(|&b| b == 0).filter(|n| !n.is_empty()) {
                if std::str::from_utf8(n).is_ok_and(xattr_served) {
                    list.extend_from_slice(n);
                    list.push(0);
                }
            }
            list
        } else {
            if !xattr_served(name) {
                return Err(Errno::NODATA);
            }
            self.with_node(fid, |fd| rfs::getxattr(proc_fd(fd), name, rustix::buffer::spare_capacity(&mut buf)))?;
            buf
        };
        let held = Held::take(&q.xattr_bytes, value.len())?;
        let size = value.len() as u64;
        let path = fid.path.lock().unwrap().clone();
        let nf = Fid {
            xattr: Some(Box::new(Xattr::Read { value, _held: held })),
            ..Fid::bare(path, fid.qid, fid.user.clone(), fid.floor.clone())
        };
        Ok((nf, size))
    }

    /// Txattrcreate: `fid` becomes a fid whose Twrites make `name`'s value,
    /// set at its Tclunk ([`Export::xattr_commit`]).
    pub fn xattrcreate(&self, fid: &Fid, name: &str, size: u64, flags: u32, q: &Quota) -> R<Fid> {
        if !self.xattrs {
            return Err(Errno::OPNOTSUPP);
        }
        self.writable()?;
        if !xattr_served(name) {
            return Err(Errno::OPNOTSUPP);
        }
        if size > XATTR_MAX as u64 {
            return Err(Errno::TOOBIG);
        }
        if flags & !3 != 0 {
            return Err(Errno::INVAL);
        }
        let size = size as usize;
        let held = Held::take(&q.xattr_bytes, size)?;
        let path = fid.path.lock().unwrap().clone();
        let x = Xattr::Write { name: name.to_string(), size, flags, value: Mutex::new(Vec::new()), _held: held };
        Ok(Fid { xattr: Some(Box::new(x)), ..Fid::bare(path, fid.qid, fid.user.clone(), fid.floor.clone()) })
    }

    /// At the Tclunk of a Txattrcreate fid: the value written is set (all
    /// of its size, else EINVAL), or, for size 0 with `XATTR_REPLACE`, the
    /// attribute removed (how Linux's client says removexattr).
    pub fn xattr_commit(&self, fid: &Fid) -> R<()> {
        let Some(Xattr::Write { name, size, flags, value, .. }) = fid.xattr.as_deref() else {
            return Ok(());
        };
        let v = value.lock().unwrap();
        if v.len() != *size {
            return Err(Errno::INVAL);
        }
        const XATTR_REPLACE: u32 = 2;
        if *size == 0 && flags & XATTR_REPLACE != 0 {
            return self.with_node(fid, |fd| rfs::removexattr(proc_fd(fd), name.as_str()));
        }
        let fl = rfs::XattrFlags::from_bits_retain(*flags);
        self.with_node(fid, |fd| rfs::setxattr(proc_fd(fd), name.as_str(), &v, fl))
    }
}

/// The path of a descriptor in `/proc`: the extended attribute calls by
/// path follow it to the very file the descriptor is (an `O_PATH`
/// descriptor, which the `f*xattr` calls refuse; a symlink's own, as
/// walked, is the link).
fn proc_fd(fd: BorrowedFd<'_>) -> String {
    use std::os::fd::AsRawFd;
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Linux open flags from Tlopen/Tlcreate, less those a client may not ask
/// of the server (creation is Tlcreate's, no controlling terminal, and the
/// server never follows a link).
fn open_flags(flags: u32) -> OFlags {
    let keep = OFlags::ACCMODE
        | OFlags::APPEND
        | OFlags::TRUNC
        | OFlags::NONBLOCK
        | OFlags::DSYNC
        | OFlags::SYNC
        | OFlags::DIRECT
        | OFlags::NOATIME
        | OFlags::LARGEFILE;
    OFlags::from_bits_retain(flags) & keep
}

/// The mode a client asked for, exactly: the client has applied its own
/// umask already, and the server's must not take more bits away.
fn exact_mode(fd: &OwnedFd, st: &rfs::Stat, mode: u32) -> R<()> {
    if st.st_mode & 0o7777 != mode & 0o7777 {
        rfs::fchmod(fd, Mode::from_raw_mode(mode & 0o7777))?;
    }
    Ok(())
}

/// The errno of an I/O error (EIO when it has none).
pub fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}
