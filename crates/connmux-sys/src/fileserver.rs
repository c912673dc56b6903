//! The calls a file server needs beyond what `rustix` wraps safely: the
//! descriptor limit raised to its ceiling, a thread's own file-system
//! identity (`setfsuid`/`setfsgid`, and supplementary groups through the
//! raw system call, which changes only the calling thread where glibc's
//! `setgroups` changes every thread), the user database (`getpwnam_r`,
//! `getpwuid_r`, `getgrouplist`), open-file-description byte-range locks
//! (`F_OFD_SETLK`/`F_OFD_GETLK`), and a read of pages already in memory
//! into a buffer's spare capacity (`preadv2` with `RWF_NOWAIT`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::util::{cvt, cvt_size, retry_eintr};

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the limit in
/// force afterwards (the soft one, unchanged where raising failed).
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable rlimit for the call to fill.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) })?;
    if r.rlim_cur < r.rlim_max {
        let want = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
        // SAFETY: `want` is a valid rlimit read by the call.
        if cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) }).is_ok() {
            return Ok(r.rlim_max);
        }
    }
    Ok(r.rlim_cur)
}

/// The soft `RLIMIT_NOFILE`.
pub fn nofile_limit() -> io::Result<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable rlimit for the call to fill.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) })?;
    Ok(r.rlim_cur)
}

/// Reads at most `max` bytes of `fd` at `offset` onto the end of `buf`, into
/// its spare capacity (grown to `max` first): no zeroing of memory the read
/// overwrites. `preadv2` with `RWF_NOWAIT`: only pages already in memory are
/// read, and a read that would wait for the disk fails with `WouldBlock`
/// instead (or is short: the pages in memory before the first that is not).
/// For a thread that must not wait. Returns the bytes read; `buf` is
/// unchanged on error.
pub fn pread_cached_into(fd: BorrowedFd<'_>, buf: &mut Vec<u8>, max: usize, offset: u64) -> io::Result<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let want = max.min(spare.len());
    let off = libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let iov = libc::iovec { iov_base: spare.as_mut_ptr().cast(), iov_len: want };
    let n = retry_eintr(|| {
        // SAFETY: the one iovec covers `want` bytes of the spare capacity,
        // which the kernel writes (never reads) and which outlives the call.
        cvt_size(unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, off, libc::RWF_NOWAIT) })
    })?;
    let n = n.min(want);
    // SAFETY: the first `n` bytes of the spare capacity were written by the read.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// Sets the calling thread's file-system uid (the one permission checks
/// use); fails with `EPERM` when the kernel kept the old one.
pub fn set_thread_fsuid(uid: u32) -> io::Result<()> {
    // SAFETY: setfsuid takes an integer and touches no memory; the raw call
    // changes the calling thread only.
    unsafe { libc::syscall(libc::SYS_setfsuid, uid as libc::c_long) };
    // setfsuid reports the previous value, never an error: ask again (-1
    // changes nothing) to learn what is in force.
    // SAFETY: as above.
    let now = unsafe { libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long) } as u32;
    if now == uid {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
}

/// Sets the calling thread's file-system gid (as [`set_thread_fsuid`]).
pub fn set_thread_fsgid(gid: u32) -> io::Result<()> {
    // SAFETY: setfsgid takes an integer and touches no memory; the raw call
    // changes the calling thread only.
    unsafe { libc::syscall(libc::SYS_setfsgid, gid as libc::c_long) };
    // SAFETY: as above (-1 changes nothing and reports the value in force).
    let now = unsafe { libc::syscall(libc::SYS_setfsgid, -1 as libc::c_long) } as u32;
    if now == gid {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
}

/// Sets the calling thread's supplementary groups, and only its own: the
/// raw system call (glibc's `setgroups` signals every thread to follow).
pub fn set_thread_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: the pointer and length describe `groups`, read by the call
    // only (gid_t is u32 on Linux).
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len() as libc::c_long, groups.as_ptr()) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A user of the system's user database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Every group the user is in, the primary one first.
    pub groups: Vec<u32>,
}

/// Looks a user up by name; `None` when there is none.
pub fn user_by_name(name: &str) -> io::Result<Option<UserEntry>> {
    let Ok(c) = CString::new(name) else { return Ok(None) };
    lookup(&mut |pw, buf: &mut [libc::c_char], res| {
        // SAFETY: every pointer is valid for the call: the name is a NUL-
        // terminated string, `pw` and `res` are writable, and `buf` is a
        // writable buffer of the length passed.
        unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf.as_mut_ptr(), buf.len(), res) }
    })
}

/// Looks a user up by uid; `None` when there is none.
pub fn user_by_uid(uid: u32) -> io::Result<Option<UserEntry>> {
    lookup(&mut |pw, buf: &mut [libc::c_char], res| {
        // SAFETY: `pw` and `res` are writable and `buf` is a writable buffer
        // of the length passed.
        unsafe { libc::getpwuid_r(uid, pw, buf.as_mut_ptr(), buf.len(), res) }
    })
}

type PwCall<'a> = dyn FnMut(*mut libc::passwd, &mut [libc::c_char], *mut *mut libc::passwd) -> libc::c_int + 'a;

fn lookup(call: &mut PwCall<'_>) -> io::Result<Option<UserEntry>> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // Bounded: the buffer doubles up to 1 MiB.
    loop {
        // SAFETY: passwd is plain old data; all-zero is a valid value.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut res: *mut libc::passwd = std::ptr::null_mut();
        let r = call(&mut pw, &mut buf, &mut res);
        if r == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        if res.is_null() {
            return Ok(None);
        }
        // SAFETY: on success pw_name points to a NUL-terminated string in `buf`.
        let name = unsafe { CStr::from_ptr(pw.pw_name) };
        let groups = group_list(name, pw.pw_gid)?;
        return Ok(Some(UserEntry {
            name: name.to_string_lossy().into_owned(),
            uid: pw.pw_uid,
            gid: pw.pw_gid,
            groups,
        }));
    }
}

/// The groups of user `name` whose primary group is `gid` (first).
fn group_list(name: &CStr, gid: u32) -> io::Result<Vec<u32>> {
    let mut n: libc::c_int = 64;
    // Bounded: the list grows to what the call said it needs, at most 65,536.
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut got = n;
        // SAFETY: `name` is NUL-terminated, `groups` holds `got` entries and
        // `got` is writable.
        let r = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut got) };
        if r >= 0 {
            groups.truncate(got.max(0) as usize);
            if let Some(i) = groups.iter().position(|&g| g == gid) {
                groups.remove(i);
            }
            groups.insert(0, gid);
            return Ok(groups);
        }
        if got <= n || got > 65_536 {
            return Err(io::Error::from_raw_os_error(libc::ERANGE));
        }
        n = got;
    }
}

/// A byte-range lock: `F_RDLCK`, `F_WRLCK` or `F_UNLCK` over `len` bytes
/// from `start` (`len` 0: to the end of the file, and beyond).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeLock {
    pub kind: libc::c_short,
    pub start: i64,
    pub len: i64,
    /// Of a lock reported by [`ofd_getlk`]: the holder's pid, -1 for an
    /// open file description's lock.
    pub pid: i32,
}

fn flock_of(l: &RangeLock) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is a valid value.
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = l.kind;
    f.l_whence = libc::SEEK_SET as libc::c_short;
    f.l_start = l.start;
    f.l_len = l.len;
    // Must be 0 for the OFD commands.
    f.l_pid = 0;
    f
}

/// `F_OFD_SETLK`: takes (or releases) a lock of the open file description
/// without waiting; `Ok(false)` when another holds a conflicting one.
pub fn ofd_setlk(fd: BorrowedFd<'_>, l: &RangeLock) -> io::Result<bool> {
    let f = flock_of(l);
    // SAFETY: `f` is a valid flock read by the call.
    match cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &f) }) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `F_OFD_GETLK`: the first lock that would conflict with `l`, if any.
pub fn ofd_getlk(fd: BorrowedFd<'_>, l: &RangeLock) -> io::Result<Option<RangeLock>> {
    let mut f = flock_of(l);
    // SAFETY: `f` is a valid flock, read and written by the call.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut f) })?;
    if f.l_type == libc::F_UNLCK as libc::c_short {
        return Ok(None);
    }
    Ok(Some(RangeLock { kind: f.l_type, start: f.l_start, len: f.l_len, pid: f.l_pid }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_in_the_user_database() {
        let r = user_by_uid(0).unwrap().expect("uid 0");
        assert_eq!(r.uid, 0);
        assert_eq!(r.groups.first(), Some(&r.gid));
        assert_eq!(user_by_name(&r.name).unwrap().unwrap().uid, 0);
        assert_eq!(user_by_name("no-such-user-here-x").unwrap(), None);
    }

    #[test]
    fn ofd_locks_conflict_between_descriptions_by_range() {
        let p = std::env::temp_dir().join(format!("connmux-sys-ofd-{}", std::process::id()));
        std::fs::write(&p, b"0123456789").unwrap();
        let a = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let b = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        use std::os::fd::AsFd;
        let w = |start, len| RangeLock { kind: libc::F_WRLCK as _, start, len, pid: 0 };
        assert!(ofd_setlk(a.as_fd(), &w(0, 5)).unwrap());
        assert!(ofd_setlk(b.as_fd(), &w(5, 5)).unwrap(), "ranges apart do not conflict");
        assert!(!ofd_setlk(b.as_fd(), &w(4, 1)).unwrap());
        let held = ofd_getlk(b.as_fd(), &w(0, 0)).unwrap().expect("a's lock");
        assert_eq!((held.start, held.len), (0, 5));
        let _ = std::fs::remove_file(&p);
    }
}
