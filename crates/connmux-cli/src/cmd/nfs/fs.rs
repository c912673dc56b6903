//! The exported directory as NFS sees it: file handles, and the lookups
//! from a handle to a path that never leave the export.
//!
//! A file handle is 36 bytes: a magic word, the export's id, and the file's
//! device, inode and generation (its birth time where the file system keeps
//! one, else 0). It names the file, not a path: it survives renames and a
//! server restart, and a handle of a file removed (whose inode number came
//! back for another file) is stale, not the other file.
//!
//! From handle to file: a map from each file met (LOOKUP, READDIRPLUS,
//! CREATE, ...) to its directory and its name there gives a path beneath
//! the export, opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` from the export's directory (as the 9P server
//! does: no symlink is followed by the server, and the kernel refuses any
//! resolution that would leave the export); the file opened must be the
//! handle's (device, inode, generation). When it is not (a rename by
//! another process, a restarted server that has met nothing yet), the
//! export is searched breadth first from its root (bounded, one search at
//! a time, every file seen remembered); a handle not found is stale, and
//! not searched for again for [`MISS_HOLD`], nor is any other handle not
//! among the files remembered once a search has read the whole export. A handle is never a path, so
//! none can name anything outside the export.

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connmux_nfs::{Fattr3, Ftype3, Nfsstat3, Nfstime3};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags, Statx, StatxFlags};
use rustix::io::Errno;

/// A result whose error is an errno.
pub type R<T> = Result<T, Errno>;

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS);

/// Bytes of a handle.
pub const HANDLE_LEN: usize = 36;
const MAGIC: [u8; 4] = *b"CMN3";

/// A handle not found by a search is answered stale for this long without
/// another search (a client's forged handles cost one search each).
pub const MISS_HOLD: Duration = Duration::from_secs(5);
/// Most directory entries one search reads.
pub const SEARCH_MAX: usize = 1_000_000;
/// Most files remembered (past it the map starts over).
const NAMES_MAX: usize = 4_000_000;
/// Open files kept for READ, WRITE and COMMIT.
const FILES_MAX: usize = 512;

/// A file's identity: device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub dev: u64,
    pub ino: u64,
}

/// A decoded handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub export: u64,
    pub key: Key,
    pub gen: u64,
}

impl Handle {
    /// The handle's bytes.
    pub fn bytes(&self) -> [u8; HANDLE_LEN] {
        let mut b = [0u8; HANDLE_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..12].copy_from_slice(&self.export.to_be_bytes());
        b[12..20].copy_from_slice(&self.key.dev.to_be_bytes());
        b[20..28].copy_from_slice(&self.key.ino.to_be_bytes());
        b[28..36].copy_from_slice(&self.gen.to_be_bytes());
        b
    }

    /// A handle from its bytes; `None` when they are not one of ours.
    pub fn parse(b: &[u8]) -> Option<Handle> {
        if b.len() != HANDLE_LEN || b[..4] != MAGIC {
            return None;
        }
        let w = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Handle { export: w(4), key: Key { dev: w(12), ino: w(20) }, gen: w(28) })
    }
}

/// A file found beneath the export.
pub struct Node {
    /// Its path beneath the export ("" is the root).
    pub path: PathBuf,
    /// An `O_PATH | O_NOFOLLOW` descriptor of it.
    pub fd: OwnedFd,
    /// Its attributes when found.
    pub st: Statx,
}

impl Node {
    pub fn key(&self) -> Key {
        key_of(&self.st)
    }
    pub fn is_dir(&self) -> bool {
        ftype(&self.st) == Ftype3::Dir
    }
}

/// A file's identity from its attributes.
pub fn key_of(st: &Statx) -> Key {
    Key { dev: rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor), ino: st.stx_ino }
}

fn gen_of(st: &Statx) -> u64 {
    if st.stx_mask & StatxFlags::BTIME.bits() != 0 {
        (st.stx_btime.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(u64::from(st.stx_btime.tv_nsec))
    } else {
        0
    }
}

/// The NFS type of a file.
pub fn ftype(st: &Statx) -> Ftype3 {
    match rfs::FileType::from_raw_mode(u32::from(st.stx_mode) as _) {
        rfs::FileType::Directory => Ftype3::Dir,
        rfs::FileType::Symlink => Ftype3::Lnk,
        rfs::FileType::BlockDevice => Ftype3::Blk,
        rfs::FileType::CharacterDevice => Ftype3::Chr,
        rfs::FileType::Socket => Ftype3::Sock,
        rfs::FileType::Fifo => Ftype3::Fifo,
        _ => Ftype3::Reg,
    }
}

fn time(t: &rfs::StatxTimestamp) -> Nfstime3 {
    Nfstime3 { seconds: t.tv_sec as u32, nseconds: t.tv_nsec }
}

/// The statx of `path` beneath `dir` (not following a final symlink).
pub fn statx_at(dir: &OwnedFd, path: &Path) -> R<Statx> {
    let flags = if path.as_os_str().is_empty() {
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    };
    rfs::statx(dir, path, flags, StatxFlags::BASIC_STATS | StatxFlags::BTIME)
}

/// The `/proc/self/fd` link of a descriptor: a path to the file it holds
/// that no rename or symlink swap can redirect.
pub fn fd_path(fd: &OwnedFd) -> String {
    use std::os::fd::AsRawFd;
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// A checked single name: not empty, no `/`, not `.` or `..`, no NUL, at
/// most 255 bytes.
pub fn check_name(name: &[u8]) -> Result<&OsStr, Nfsstat3> {
    if name.len() > 255 {
        return Err(Nfsstat3::ERR_NAMETOOLONG);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Nfsstat3::ERR_INVAL);
    }
    Ok(OsStr::from_bytes(name))
}

/// The NFS status of an errno.
pub fn status_of(e: Errno) -> Nfsstat3 {
    match e {
        Errno::PERM => Nfsstat3::ERR_PERM,
        Errno::NOENT => Nfsstat3::ERR_NOENT,
        Errno::NXIO => Nfsstat3::ERR_NXIO,
        Errno::ACCESS => Nfsstat3::ERR_ACCES,
        Errno::EXIST => Nfsstat3::ERR_EXIST,
        // (EXDEV is also what RESOLVE_BENEATH answers for an escape.)
        Errno::XDEV => Nfsstat3::ERR_XDEV,
        Errno::NODEV => Nfsstat3::ERR_NODEV,
        Errno::NOTDIR => Nfsstat3::ERR_NOTDIR,
        Errno::ISDIR => Nfsstat3::ERR_ISDIR,
        Errno::INVAL => Nfsstat3::ERR_INVAL,
        Errno::FBIG => Nfsstat3::ERR_FBIG,
        Errno::NOSPC => Nfsstat3::ERR_NOSPC,
        Errno::ROFS => Nfsstat3::ERR_ROFS,
        Errno::MLINK => Nfsstat3::ERR_MLINK,
        Errno::NAMETOOLONG => Nfsstat3::ERR_NAMETOOLONG,
        Errno::NOTEMPTY => Nfsstat3::ERR_NOTEMPTY,
        Errno::DQUOT => Nfsstat3::ERR_DQUOT,
        Errno::STALE => Nfsstat3::ERR_STALE,
        // A symlink where a directory was met on the way (the server
        // follows none): as nfsd, not a directory.
        Errno::LOOP => Nfsstat3::ERR_NOTDIR,
        Errno::OPNOTSUPP => Nfsstat3::ERR_NOTSUPP,
        Errno::AGAIN => Nfsstat3::ERR_JUKEBOX,
        _ => Nfsstat3::ERR_IO,
    }
}

/// An open regular file kept for I/O.
pub struct OpenFile {
    pub file: File,
    pub writable: bool,
    gen: u64,
}

/// The exported directory.
pub struct Export {
    root: OwnedFd,
    /// The export's canonical path.
    pub path: PathBuf,
    /// The path as given on the command line.
    pub given: PathBuf,
    /// Refuse every change (NFS3ERR_ROFS).
    pub read_only: bool,
    /// Calls run as their callers: no open file is shared between calls
    /// (one opened for one user must not serve another).
    per_caller: bool,
    root_key: Key,
    /// The export's id in handles.
    pub id: u64,
    /// The fsid every file reports (one file system to the client).
    pub fsid: u64,
    /// Each file met → its directory and its name there.
    names: Mutex<HashMap<Key, (Key, OsString)>>,
    files: Mutex<HashMap<Key, Arc<OpenFile>>>,
    misses: Mutex<HashMap<Key, Instant>>,
    search_lock: Mutex<()>,
    /// When a search last read the whole export without finding its file:
    /// for [`MISS_HOLD`] after it, a file not among those remembered is
    /// not searched for (forged handles naming a new inode each cost no
    /// more than one search every 5 s between them).
    last_full: Mutex<Option<Instant>>,
    /// Searches of the export run.
    pub searches: AtomicU64,
}

impl Export {
    /// Opens `dir` as the export.
    pub fn open(dir: &Path, read_only: bool, per_caller: bool) -> anyhow::Result<Export> {
        let path = std::fs::canonicalize(dir).map_err(|e| anyhow::anyhow!("--export {}: {e}", dir.display()))?;
        let root = rfs::open(&path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| anyhow::anyhow!("--export {}: {e}", path.display()))?;
        let st = statx_at(&root, Path::new("")).map_err(|e| anyhow::anyhow!("--export {}: {e}", path.display()))?;
        let root_key = key_of(&st);
        // The export's id: its root's identity, mixed (FNV-1a), so that a
        // handle of another export (or of this directory's predecessor)
        // is told apart.
        let mut id: u64 = 0xcbf2_9ce4_8422_2325;
        for b in
            root_key.dev.to_le_bytes().into_iter().chain(root_key.ino.to_le_bytes()).chain(gen_of(&st).to_le_bytes())
        {
            id = (id ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        Ok(Export {
            root,
            path,
            given: dir.to_path_buf(),
            read_only,
            per_caller,
            root_key,
            id,
            fsid: id,
            names: Mutex::default(),
            files: Mutex::default(),
            misses: Mutex::default(),
            search_lock: Mutex::new(()),
            last_full: Mutex::new(None),
            searches: AtomicU64::new(0),
        })
    }

    /// The directory a MOUNT path names: "/" or the export's path
    /// (canonical or as given), or a directory beneath it named from there
    /// (each name checked, no `..`, looked up beneath the export only).
    pub fn mount_path(&self, p: &[u8]) -> Option<Node> {
        let p = Path::new(OsStr::from_bytes(p));
        let rest = if p == Path::new("/") {
            Path::new("")
        } else {
            p.strip_prefix(&self.path).or_else(|_| p.strip_prefix(&self.given)).ok()?
        };
        let mut rel = PathBuf::new();
        for c in rest.components() {
            match c {
                std::path::Component::Normal(n) => rel.push(check_name(n.as_bytes()).ok()?),
                std::path::Component::CurDir => {}
                _ => return None,
            }
        }
        let mut at = self.node_at(PathBuf::new()).ok()?;
        // Each step remembered, so that the handle resolves later.
        for name in rel.iter() {
            let next = self.node_at(at.path.join(name)).ok()?;
            self.remember(at.key(), name, next.key());
            at = next;
        }
        at.is_dir().then_some(at)
    }

    /// The handle of a file found.
    pub fn handle_of(&self, st: &Statx) -> Handle {
        Handle { export: self.id, key: key_of(st), gen: gen_of(st) }
    }

    /// NFS attributes.
    pub fn fattr(&self, st: &Statx) -> Fattr3 {
        Fattr3 {
            ftype: ftype(st),
            mode: u32::from(st.stx_mode) & 0o7777,
            nlink: st.stx_nlink,
            uid: st.stx_uid,
            gid: st.stx_gid,
            size: st.stx_size,
            used: st.stx_blocks.saturating_mul(512),
            rdev: (st.stx_rdev_major, st.stx_rdev_minor),
            fsid: self.fsid,
            fileid: st.stx_ino,
            atime: time(&st.stx_atime),
            mtime: time(&st.stx_mtime),
            ctime: time(&st.stx_ctime),
        }
    }

    pub fn writable(&self) -> Result<(), Nfsstat3> {
        if self.read_only {
            Err(Nfsstat3::ERR_ROFS)
        } else {
            Ok(())
        }
    }

    fn rel(p: &Path) -> &Path {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    }

    /// `openat2` beneath the export, following no symlink and never
    /// waiting (`O_NONBLOCK` but with `O_PATH`, which opens nothing).
    pub fn open_beneath(&self, p: &Path, flags: OFlags, mode: Mode) -> R<OwnedFd> {
        let nb = if flags.contains(OFlags::PATH) { OFlags::empty() } else { OFlags::NONBLOCK };
        rfs::openat2(&self.root, Self::rel(p), flags | OFlags::CLOEXEC | OFlags::NOFOLLOW | nb, mode, RESOLVE)
    }

    /// A directory beneath the export, opened to create, remove or list in it.
    pub fn dir_fd(&self, p: &Path) -> R<OwnedFd> {
        self.open_beneath(p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
    }

    /// The file at `path` beneath the export.
    pub fn node_at(&self, path: PathBuf) -> R<Node> {
        let fd = self.open_beneath(&path, OFlags::PATH, Mode::empty())?;
        let st = statx_at(&fd, Path::new(""))?;
        Ok(Node { path, fd, st })
    }

    /// The file a handle names: NFS3ERR_BADHANDLE when the bytes are no
    /// handle of ours, NFS3ERR_STALE when its export or its file is gone.
    pub fn resolve(&self, fh: &[u8]) -> Result<Node, Nfsstat3> {
        let h = Handle::parse(fh).ok_or(Nfsstat3::ERR_BADHANDLE)?;
        if h.export != self.id {
            return Err(Nfsstat3::ERR_STALE);
        }
        let is = |n: &Node| n.key() == h.key && (h.gen == 0 || gen_of(&n.st) == 0 || gen_of(&n.st) == h.gen);
        if let Some(path) = self.path_of(h.key) {
            if let Ok(n) = self.node_at(path) {
                if is(&n) {
                    return Ok(n);
                }
            }
        }
        self.search(h.key).filter(is).ok_or(Nfsstat3::ERR_STALE)
    }

    /// [`Export::resolve`] and [`Export::file`] for a thread that must not
    /// wait on the disk (an I/O worker): the file a handle names, found only
    /// by a path remembered and every component of it in the kernel's lookup
    /// cache (`RESOLVE_CACHED`), and its descriptor only from the open files.
    /// `None` for anything else (no search, no open, no error): the call
    /// goes to a file-system thread, which does all that.
    pub fn cached_file(&self, fh: &[u8]) -> Option<(Statx, Arc<OpenFile>)> {
        if self.per_caller {
            return None;
        }
        let h = Handle::parse(fh).filter(|h| h.export == self.id)?;
        let path = self.path_of(h.key)?;
        let fl = OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let fd = rfs::openat2(&self.root, Self::rel(&path), fl, Mode::empty(), RESOLVE | ResolveFlags::CACHED).ok()?;
        let st = statx_at(&fd, Path::new("")).ok()?;
        let gen = gen_of(&st);
        if key_of(&st) != h.key || (h.gen != 0 && gen != 0 && gen != h.gen) || ftype(&st) != Ftype3::Reg {
            return None;
        }
        let f = self.files.lock().unwrap().get(&h.key).filter(|f| f.gen == gen)?.clone();
        Some((st, f))
    }

    /// The path of a file met, from the names remembered.
    fn path_of(&self, mut key: Key) -> Option<PathBuf> {
        if key == self.root_key {
            return Some(PathBuf::new());
        }
        let names = self.names.lock().unwrap();
        let mut parts: Vec<&OsStr> = Vec::new();
        // Bounded: a path deeper than 4096 directories is not followed.
        for _ in 0..4096 {
            let (parent, name) = names.get(&key)?;
            parts.push(name);
            if *parent == self.root_key {
                return Some(parts.iter().rev().collect());
            }
            key = *parent;
        }
        None
    }

    /// Remembers that `child` is `name` in `dir`.
    pub fn remember(&self, dir: Key, name: &OsStr, child: Key) {
        if child == self.root_key {
            return;
        }
        let mut names = self.names.lock().unwrap();
        if names.len() >= NAMES_MAX {
            names.clear();
        }
        names.insert(child, (dir, name.to_os_string()));
    }

    /// Forgets `child` when it was `name` in `dir` (removed, or renamed over).
    pub fn forget(&self, dir: Key, name: &OsStr, child: Key) {
        let mut names = self.names.lock().unwrap();
        if names.get(&child).is_some_and(|(d, n)| *d == dir && n == name) {
            names.remove(&child);
        }
        drop(names);
        self.files.lock().unwrap().remove(&child);
    }

    /// Breadth-first search of the export for `key`, remembering every file seen.
    fn search(&self, key: Key) -> Option<Node> {
        if let Some(t) = self.misses.lock().unwrap().get(&key) {
            if t.elapsed() < MISS_HOLD {
                return None;
            }
        }
        let _one = self.search_lock.lock().unwrap();
        // Found meanwhile by another search?
        if let Some(n) = self.path_of(key).and_then(|p| self.node_at(p).ok()).filter(|n| n.key() == key) {
            return Some(n);
        }
        if self.last_full.lock().unwrap().is_some_and(|t| t.elapsed() < MISS_HOLD) {
            return None;
        }
        self.searches.fetch_add(1, Relaxed);
        // As the server: a caller's identity must not hide directories from
        // a search whose result stands for every caller.
        let _server = super::ids::as_server().ok()?;
        let mut queue = VecDeque::from([(PathBuf::new(), self.root_key)]);
        let mut seen = 0usize;
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
        // Bounded by SEARCH_MAX entries read.
        while let Some((path, dkey)) = queue.pop_front() {
            let Ok(fd) = self.dir_fd(&path) else { continue };
            let mut dir = rfs::RawDir::new(&fd, &mut buf);
            while let Some(Ok(ent)) = dir.next() {
                seen += 1;
                if seen > SEARCH_MAX {
                    break;
                }
                let name = OsStr::from_bytes(ent.file_name().to_bytes());
                if name == "." || name == ".." {
                    continue;
                }
                let ckey = Key { dev: dkey.dev, ino: ent.ino() };
                let is_dir = ent.file_type() == rfs::FileType::Directory;
                if ckey.ino == key.ino || is_dir {
                    // The entry's own identity (a mount point's differs from its d_ino).
                    let Ok(st) = statx_at(&fd, Path::new(name)) else { continue };
                    let real = key_of(&st);
                    self.remember(dkey, name, real);
                    if real == key {
                        let path = path.join(name);
                        let fd = self.open_beneath(&path, OFlags::PATH, Mode::empty()).ok()?;
                        return Some(Node { path, fd, st });
                    }
                    if is_dir {
                        queue.push_back((path.join(name), real));
                    }
                } else {
                    self.remember(dkey, name, ckey);
                }
            }
            if seen > SEARCH_MAX {
                break;
            }
        }
        if seen <= SEARCH_MAX {
            *self.last_full.lock().unwrap() = Some(Instant::now());
        }
        let mut m = self.misses.lock().unwrap();
        if m.len() > 100_000 {
            m.retain(|_, t| t.elapsed() < MISS_HOLD);
        }
        m.insert(key, Instant::now());
        None
    }

    /// The open regular file of `node`, for writing when `write`.
    pub fn file(&self, node: &Node, write: bool) -> Result<Arc<OpenFile>, Nfsstat3> {
        match ftype(&node.st) {
            Ftype3::Reg => {}
            Ftype3::Dir => return Err(Nfsstat3::ERR_ISDIR),
            _ => return Err(Nfsstat3::ERR_INVAL),
        }
        let key = node.key();
        let gen = gen_of(&node.st);
        if self.per_caller {
            // Opened as this caller, for this call only.
            let fl = if write { OFlags::RDWR } else { OFlags::RDONLY };
            let fd = self.open_beneath(&node.path, fl, Mode::empty()).map_err(status_of)?;
            let flags = rfs::fcntl_getfl(&fd).map_err(status_of)?;
            rfs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK).map_err(status_of)?;
            let st = statx_at(&fd, Path::new("")).map_err(status_of)?;
            if key_of(&st) != key {
                return Err(Nfsstat3::ERR_STALE);
            }
            return Ok(Arc::new(OpenFile { file: File::from(fd), writable: write, gen }));
        }
        if let Some(f) = self.files.lock().unwrap().get(&key) {
            if f.gen == gen && (f.writable || !write) {
                return Ok(f.clone());
            }
        }
        let (fd, writable) = match self.open_beneath(&node.path, OFlags::RDWR, Mode::empty()) {
            Ok(fd) => (fd, true),
            Err(Errno::ACCESS | Errno::ROFS | Errno::PERM) if !write => {
                (self.open_beneath(&node.path, OFlags::RDONLY, Mode::empty()).map_err(status_of)?, false)
            }
            Err(e) => return Err(status_of(e)),
        };
        // A regular file: blocking I/O (O_NONBLOCK means nothing to it, but clear it anyway).
        let fl = rfs::fcntl_getfl(&fd).map_err(status_of)?;
        rfs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK).map_err(status_of)?;
        // The file opened must be the one found.
        let st = statx_at(&fd, Path::new("")).map_err(status_of)?;
        if key_of(&st) != key {
            return Err(Nfsstat3::ERR_STALE);
        }
        let f = Arc::new(OpenFile { file: File::from(fd), writable, gen });
        let mut files = self.files.lock().unwrap();
        if files.len() >= FILES_MAX {
            if let Some(k) = files.keys().next().copied() {
                files.remove(&k);
            }
        }
        files.insert(key, f.clone());
        Ok(f)
    }

    /// The statx of a file found again (its attributes after a change).
    pub fn restat(&self, node: &Node) -> Option<Statx> {
        statx_at(&node.fd, Path::new("")).ok()
    }

    /// Accessibility as the server's user: `faccessat2(AT_EACCESS)` on the
    /// file found, through its descriptor's `/proc/self/fd` link (the file
    /// itself, not a name that may have changed since). A symlink is
    /// readable.
    pub fn access(&self, node: &Node, want: rfs::Access) -> bool {
        if ftype(&node.st) == Ftype3::Lnk {
            return want == rfs::Access::READ_OK;
        }
        rfs::accessat(rfs::CWD, fd_path(&node.fd).as_str(), want, AtFlags::EACCESS).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_forgeries_are_refused() {
        let h = Handle { export: 1, key: Key { dev: 2, ino: 3 }, gen: 4 };
        assert_eq!(Handle::parse(&h.bytes()), Some(h));
        let mut b = h.bytes();
        b[0] ^= 1;
        assert_eq!(Handle::parse(&b), None);
        assert_eq!(Handle::parse(&h.bytes()[..35]), None);
        assert_eq!(Handle::parse(&[]), None);
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name(b"ok").is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert_eq!(check_name(bad), Err(Nfsstat3::ERR_INVAL));
        }
        assert_eq!(check_name(&[b'a'; 256]), Err(Nfsstat3::ERR_NAMETOOLONG));
    }
}
