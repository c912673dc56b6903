//! POSIX byte-range locks (Tlock, Tgetlock) as processes have them on a
//! local disk: a lock belongs to a process, and two descriptors one
//! process opened on a file share its locks, while two processes' conflict.
//!
//! A process here is a lock owner: Tlock's `proc_id` and `client_id`, as
//! one user, on one connection (a client cannot reach another connection's
//! locks by naming its process), on one file. The server takes an owner's
//! locks with `F_OFD_SETLK` on one open file description of its own, shared
//! by every fid the owner locks through: the kernel then merges, splits and
//! converts them as for one process, and other owners' descriptions (and
//! local processes) conflict with them. An owner lives while a fid it
//! locked through is open: the clunk of its last one releases its locks,
//! as a process's last close does. Linux's client also sends an unlock of
//! the whole file at each close, which releases them through any fid.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use connmux_9p::tmsg::Lock;
use connmux_sys::fileserver::{self as sys, RangeLock};
use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::io::Errno;

use crate::budget::Slot;

type R<T> = Result<T, Errno>;

const RDLCK: u8 = 0;
const WRLCK: u8 = 1;
const UNLCK: u8 = 2;

/// A lock owner's names (its connection is the [`Owners`] table it is in).
#[derive(Clone, PartialEq, Eq, Hash)]
struct OwnerKey {
    ino: u64,
    uid: u32,
    proc_id: u32,
    client_id: Box<str>,
}

/// A connection's lock owners, by their names. Weak: an owner lives while
/// a fid holds it ([`FidLocks`]).
#[derive(Default)]
pub struct Owners(Mutex<HashMap<OwnerKey, Weak<Owner>>>);

/// A lock owner and the open file description its locks are taken on.
pub struct Owner {
    fd: OwnedFd,
    /// Its holders' records in [`LockTable`] are under this id.
    id: u64,
    key: OwnerKey,
    owners: Arc<Owners>,
    table: Arc<LockTable>,
    /// The description is a descriptor of the open-file budget.
    _slot: Slot,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.table.forget(self.key.ino, self.id);
        let mut m = self.owners.0.lock().unwrap();
        // A new owner of the same names may have replaced this one.
        if m.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            m.remove(&self.key);
        }
    }
}

/// The owners an opened fid took or released locks for (usually one; a
/// file opened before a fork is shared by processes).
#[derive(Default)]
pub struct FidLocks(Mutex<Vec<Arc<Owner>>>);

impl FidLocks {
    fn find(&self, key: &OwnerKey) -> Option<Arc<Owner>> {
        self.0.lock().unwrap().iter().find(|o| o.key == *key).cloned()
    }
}

/// An opened fid's side of a Tlock or Tgetlock.
pub struct LockedFile<'a> {
    pub file: &'a File,
    /// A regular file (else a FIFO, a device: its description is shared,
    /// never reopened).
    pub regular: bool,
    pub ino: u64,
    pub uid: u32,
    pub held: &'a FidLocks,
    pub owners: &'a Arc<Owners>,
}

impl LockedFile<'_> {
    fn key(&self, l: &Lock<'_>) -> OwnerKey {
        OwnerKey { ino: self.ino, uid: self.uid, proc_id: l.proc_id, client_id: l.client_id.into() }
    }

    /// The owner of these names, if it exists.
    fn owner(&self, key: &OwnerKey) -> Option<Arc<Owner>> {
        if let Some(o) = self.held.find(key) {
            return Some(o);
        }
        let o = self.owners.0.lock().unwrap().get(key).and_then(Weak::upgrade);
        o
    }

    /// A description for a new owner: a second description of the file,
    /// read-write where the user may (so a read lock through one open and a
    /// write lock through another, as one process may take them, both
    /// work), else the fid's own.
    fn description(&self) -> R<OwnedFd> {
        let mode = rfs::fcntl_getfl(self.file)? & OFlags::ACCMODE;
        if self.regular && mode != OFlags::RDWR {
            let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(self.file));
            let fl = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
            if let Ok(fd) = rfs::open(path.as_str(), fl, Mode::empty()) {
                return Ok(fd);
            }
        }
        self.file.as_fd().try_clone_to_owned().map_err(|e| errno(&e))
    }
}

/// The holders of the server's locks, and the owners' ids.
#[derive(Default)]
pub struct Locks {
    table: Arc<LockTable>,
    next_id: AtomicU64,
}

impl Locks {
    /// Tlock, never waiting: 0 success, 1 blocked (the client retries a
    /// blocking lock). `slot`: a place in the open-file budget, for a new
    /// owner's description.
    pub fn lock(&self, f: &LockedFile<'_>, l: &Lock<'_>, slot: impl FnOnce() -> R<Slot>) -> R<u8> {
        let (rl, end) = range_lock(l.lock_type, l.start, l.length)?;
        // As fcntl(2): a read lock needs an open for reading, a write lock
        // one for writing.
        let mode = rfs::fcntl_getfl(f.file)? & OFlags::ACCMODE;
        if (l.lock_type == RDLCK && mode == OFlags::WRONLY) || (l.lock_type == WRLCK && mode == OFlags::RDONLY) {
            return Err(Errno::BADF);
        }
        let key = f.key(l);
        let owner = match f.owner(&key) {
            Some(o) => o,
            // An owner that never locked holds nothing to release.
            None if l.lock_type == UNLCK => return Ok(0),
            None => self.new_owner(f, key, slot)?,
        };
        {
            let mut held = f.held.0.lock().unwrap();
            if !held.iter().any(|o| Arc::ptr_eq(o, &owner)) {
                held.push(owner.clone());
            }
        }
        if !sys::ofd_setlk(owner.fd.as_fd(), &rl).map_err(|e| errno(&e))? {
            return Ok(1);
        }
        let what = (l.lock_type != UNLCK).then_some((l.lock_type, l.proc_id, l.client_id));
        self.table.note(f.ino, owner.id, l.start, end, what);
        Ok(0)
    }

    /// The owner of `key`, made (another fid may have made it meanwhile:
    /// the table decides under its lock).
    fn new_owner(&self, f: &LockedFile<'_>, key: OwnerKey, slot: impl FnOnce() -> R<Slot>) -> R<Arc<Owner>> {
        let mut m = f.owners.0.lock().unwrap();
        if let Some(o) = m.get(&key).and_then(Weak::upgrade) {
            drop(m);
            return Ok(o);
        }
        let _slot = slot()?;
        let fd = f.description()?;
        let id = self.next_id.fetch_add(1, Relaxed) + 1;
        let o =
            Arc::new(Owner { fd, id, key: key.clone(), owners: f.owners.clone(), table: self.table.clone(), _slot });
        m.insert(key, Arc::downgrade(&o));
        drop(m);
        Ok(o)
    }

    /// Tgetlock (`F_OFD_GETLK` on the asking owner's description): the
    /// first lock that would conflict, with the holder its client described
    /// (another owner of this server), or the local process's pid (0 when
    /// not known, as for another open file description's lock taken outside
    /// the server). Linux's client sends every F_GETLK as type UNLCK
    /// (`v9fs_file_getlock`): that is answered as a write lock's question,
    /// any other holder's lock over the range.
    pub fn getlock(&self, f: &LockedFile<'_>, l: &Lock<'_>) -> R<LockInfo> {
        let asked = if l.lock_type == UNLCK { WRLCK } else { l.lock_type };
        let (rl, _) = range_lock(asked, l.start, l.length)?;
        let none = LockInfo {
            kind: UNLCK,
            start: l.start,
            length: l.length,
            proc_id: l.proc_id,
            client_id: l.client_id.to_string(),
        };
        let owner = f.owner(&f.key(l));
        let (fd, me) = match &owner {
            Some(o) => (o.fd.as_fd(), o.id),
            None => (f.file.as_fd(), 0),
        };
        let Some(c) = sys::ofd_getlk(fd, &rl).map_err(|e| errno(&e))? else {
            return Ok(none);
        };
        let (start, length) = (c.start as u64, c.len as u64);
        let end = if length == 0 { u64::MAX } else { start.saturating_add(length - 1) };
        let kind = c.kind as u8;
        let (proc_id, client_id) =
            self.table.holder(f.ino, me, start, end, kind).unwrap_or_else(|| (c.pid.max(0) as u32, String::new()));
        Ok(LockInfo { kind, start, length, proc_id, client_id })
    }
}

/// Tgetlock's answer: the lock type (F_UNLCK when none conflicts), its
/// range, and its holder.
pub struct LockInfo {
    pub kind: u8,
    pub start: u64,
    pub length: u64,
    pub proc_id: u32,
    pub client_id: String,
}

/// A byte-range lock taken through the server, and the holder its client
/// described (Tlock's proc_id and client_id): the kernel reports a
/// conflicting lock's range and type, these records say whose it is.
struct HeldLock {
    owner: u64,
    start: u64,
    /// Inclusive; `u64::MAX`: to the end of the file.
    end: u64,
    kind: u8,
    proc_id: u32,
    client_id: String,
}

/// The holders of locks, by inode.
#[derive(Default)]
struct LockTable {
    m: Mutex<HashMap<u64, Vec<HeldLock>>>,
}

impl LockTable {
    /// After a lock or unlock of `[start, end]` by `owner`: its records
    /// within the range go; a lock adds its own.
    fn note(&self, ino: u64, owner: u64, start: u64, end: u64, lock: Option<(u8, u32, &str)>) {
        let mut m = self.m.lock().unwrap();
        let v = m.entry(ino).or_default();
        v.retain(|h| h.owner != owner || h.start < start || h.end > end);
        if let Some((kind, proc_id, client_id)) = lock {
            v.push(HeldLock { owner, start, end, kind, proc_id, client_id: client_id.to_string() });
        }
        if v.is_empty() {
            m.remove(&ino);
        }
    }

    /// Who else holds a lock over `[start, end]` of `ino` (`kind` first).
    fn holder(&self, ino: u64, me: u64, start: u64, end: u64, kind: u8) -> Option<(u32, String)> {
        let m = self.m.lock().unwrap();
        let v = m.get(&ino)?;
        let over = |h: &&HeldLock| h.owner != me && h.start <= end && start <= h.end;
        let h = v.iter().filter(over).find(|h| h.kind == kind).or_else(|| v.iter().find(over))?;
        Some((h.proc_id, h.client_id.clone()))
    }

    fn forget(&self, ino: u64, owner: u64) {
        let mut m = self.m.lock().unwrap();
        if let Some(v) = m.get_mut(&ino) {
            v.retain(|h| h.owner != owner);
            if v.is_empty() {
                m.remove(&ino);
            }
        }
    }
}

/// A Tlock/Tgetlock range as `fcntl` takes it, and its last byte (length
/// 0, or one past the largest offset: to the end of the file).
fn range_lock(kind: u8, start: u64, length: u64) -> R<(RangeLock, u64)> {
    if kind > UNLCK || start > i64::MAX as u64 {
        return Err(Errno::INVAL);
    }
    let len = if length > i64::MAX as u64 - start { 0 } else { length as i64 };
    let end = if len == 0 { u64::MAX } else { start + length - 1 };
    Ok((RangeLock { kind: kind as i16, start: start as i64, len, pid: 0 }, end))
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}
