//! `connmux 9p-server` against the real binary over TCP on loopback: the
//! attach's user (file operations done as that user when the server runs as
//! root; attaches as another user refused when it does not), byte-range
//! locks, extended attributes and attaching to a sub-directory.
//!
//! The users tests need root (to own files as root and start the server as
//! another user); run elsewhere, they say so and pass.

mod ninep_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use connmux_9p::tmsg::Lock;
use connmux_9p::{MsgType, Tmsg, NOFID};
use ninep_support::*;

const EPERM: u32 = 1;
const EACCES: u32 = 13;
/// The unprivileged user of the tests (whether or not the user database
/// knows it: an unknown uid is served with the gid of the same number).
const USER: u32 = 1000;

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// The gid files made by [`USER`] get: its primary group, or `USER`.
fn user_gid() -> u32 {
    let out = Command::new("id").args(["-g", &USER.to_string()]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(USER)
}

/// A session attached as uid `n_uname`: the reply to the attach (an
/// Rattach, or an Rlerror), and the client.
fn attach_as(s: &Server, export: &Path, n_uname: u32) -> (Vec<u8>, Client) {
    let mut c = Client::connect(s.addr);
    c.ok(&Tmsg::Version { msize: 65536, version: "9P2000.L" });
    let b = c.call(&Tmsg::Attach { fid: 0, afid: NOFID, uname: "", aname: export.to_str().unwrap(), n_uname });
    (b, c)
}

/// Run as root, a client attaching as uid 1000 is that user: it cannot read
/// root's 0600 file nor create in root's 0755 directory, what it creates is
/// its own (uid 1000, its group, also when it asks for a group it is not
/// in), it cannot give a file away; root's own attach reads the file.
#[test]
fn as_root_each_attach_acts_as_its_user() {
    if !is_root() {
        eprintln!("skipped: the server must run as root to act as another user");
        return;
    }
    let ex = scratch("users");
    std::fs::write(ex.join("secret"), b"root only").unwrap();
    std::fs::set_permissions(ex.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(ex.join("shared")).unwrap();
    std::fs::set_permissions(ex.join("shared"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let s = Server::start(&ex, &["--no-stats-socket"]);
    assert!(s.lines.lock().unwrap()[0].contains("as each attach's user"));

    let (b, mut u) = attach_as(&s, &ex, USER);
    assert_eq!(type_of(&b), MsgType::RATTACH, "{:?}", errno_of(&b));
    u.ok(&Tmsg::Walk { fid: 0, newfid: 1, names: vec!["secret"] });
    assert_eq!(errno_of(&u.call(&Tmsg::Lopen { fid: 1, flags: 0 })), Some(EACCES), "root's 0600 file read by uid 1000");
    // Not in root's directory.
    u.ok(&Tmsg::Walk { fid: 0, newfid: 2, names: vec![] });
    let b = u.call(&Tmsg::Lcreate { fid: 2, name: "x", flags: 2, mode: 0o644, gid: USER });
    assert_eq!(errno_of(&b), Some(EACCES));
    assert!(!ex.join("x").exists());
    // In the shared one, its own; asking for root's group gets its own.
    u.ok(&Tmsg::Walk { fid: 0, newfid: 3, names: vec!["shared"] });
    u.ok(&Tmsg::Lcreate { fid: 3, name: "mine", flags: 2, mode: 0o640, gid: 0 });
    u.ok(&Tmsg::Write { fid: 3, offset: 0, data: b"hello" });
    u.ok(&Tmsg::Walk { fid: 0, newfid: 4, names: vec!["shared"] });
    u.ok(&Tmsg::Mkdir { dfid: 4, name: "d", mode: 0o750, gid: USER });
    u.ok(&Tmsg::Symlink { fid: 4, name: "l", target: "mine", gid: USER });
    let gid = user_gid();
    for name in ["mine", "d", "l"] {
        let m = std::fs::symlink_metadata(ex.join("shared").join(name)).unwrap();
        assert_eq!((m.uid(), m.gid()), (USER, gid), "{name}: owner");
    }
    assert_eq!(std::fs::read(ex.join("shared/mine")).unwrap(), b"hello");
    // It cannot give its file to root.
    u.ok(&Tmsg::Walk { fid: 0, newfid: 5, names: vec!["shared", "mine"] });
    let chown = connmux_9p::SetAttr { valid: connmux_9p::types::setattr::UID, uid: 0, ..Default::default() };
    assert_eq!(errno_of(&u.call(&Tmsg::Setattr { fid: 5, attr: chown })), Some(EPERM));

    // Root's attach, on another connection, reads the secret and the user's file.
    let (b, mut r) = attach_as(&s, &ex, 0);
    assert_eq!(type_of(&b), MsgType::RATTACH);
    r.open(1, "secret");
    let b = r.ok(&Tmsg::Read { fid: 1, offset: 0, count: 64 });
    assert_eq!(&b[11..], b"root only");
    // The user's operations still run as the user after root's ran on the
    // same threads.
    u.ok(&Tmsg::Walk { fid: 0, newfid: 6, names: vec!["secret"] });
    assert_eq!(errno_of(&u.call(&Tmsg::Lopen { fid: 6, flags: 0 })), Some(EACCES));
    // A user named by uname alone (no n_uname): root by name.
    let mut n = Client::connect(s.addr);
    n.ok(&Tmsg::Version { msize: 65536, version: "9P2000.L" });
    n.ok(&Tmsg::Attach { fid: 0, afid: NOFID, uname: "root", aname: "", n_uname: u32::MAX });
    n.open(1, "secret");
    // A name the user database does not know is nobody (65534): it cannot
    // read the secret (the kernel's client attaches its mount so).
    n.ok(&Tmsg::Attach { fid: 9, afid: NOFID, uname: "no-such-user-x", aname: "", n_uname: u32::MAX });
    n.ok(&Tmsg::Walk { fid: 9, newfid: 10, names: vec!["secret"] });
    assert_eq!(errno_of(&n.call(&Tmsg::Lopen { fid: 10, flags: 0 })), Some(EACCES));
    let _ = std::fs::remove_dir_all(&ex);
}

/// Run as uid 1000, the server refuses an attach as root (EPERM) and serves
/// one as uid 1000; with --squash-users it serves root's attach as uid 1000.
#[test]
fn not_root_attaches_as_another_user_are_refused() {
    if !is_root() {
        eprintln!("skipped: starting the server as uid 1000 needs root");
        return;
    }
    let ex = scratch("notroot");
    std::os::unix::fs::chown(&ex, Some(USER), Some(USER)).unwrap();
    let as_user = || {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", &USER.to_string(), "--regid", &USER.to_string(), "--clear-groups", BIN]);
        c
    };
    let s = Server::start_in(as_user(), &ex, &["--no-stats-socket"]);
    assert!(s.lines.lock().unwrap()[0].contains(&format!("as uid {USER} only")));
    let (b, _) = attach_as(&s, &ex, 0);
    assert_eq!(errno_of(&b), Some(EPERM), "an attach as root, to a server run as uid 1000");
    let (b, mut c) = attach_as(&s, &ex, USER);
    assert_eq!(type_of(&b), MsgType::RATTACH);
    c.ok(&Tmsg::Lcreate { fid: 0, name: "f", flags: 2, mode: 0o644, gid: USER });
    assert_eq!(std::fs::metadata(ex.join("f")).unwrap().uid(), USER);
    drop(s);
    let s = Server::start_in(as_user(), &ex, &["--no-stats-socket", "--squash-users"]);
    let (b, mut c) = attach_as(&s, &ex, 0);
    assert_eq!(type_of(&b), MsgType::RATTACH, "squashed");
    c.ok(&Tmsg::Lcreate { fid: 0, name: "g", flags: 2, mode: 0o644, gid: 0 });
    assert_eq!(std::fs::metadata(ex.join("g")).unwrap().uid(), USER);
    let _ = std::fs::remove_dir_all(&ex);
}

/// Tlock's status (0 success, 1 blocked) for a range of `fid`.
fn lock(c: &mut Client, fid: u32, lock_type: u8, start: u64, length: u64, who: (u32, &str)) -> u8 {
    let l = Lock { fid, lock_type, flags: 0, start, length, proc_id: who.0, client_id: who.1 };
    let b = c.ok(&Tmsg::Lock(l));
    assert_eq!(type_of(&b), MsgType::RLOCK);
    b[7]
}

/// Tgetlock's answer: type, start, length, proc_id, client_id.
fn getlock(c: &mut Client, fid: u32, lock_type: u8, start: u64, length: u64) -> (u8, u64, u64, u32, String) {
    getlock_as(c, fid, lock_type, start, length, (1, "asker"))
}

/// Tgetlock's answer to the process `who` (proc_id, client_id).
fn getlock_as(
    c: &mut Client,
    fid: u32,
    lock_type: u8,
    start: u64,
    length: u64,
    who: (u32, &str),
) -> (u8, u64, u64, u32, String) {
    let l = Lock { fid, lock_type, flags: 0, start, length, proc_id: who.0, client_id: who.1 };
    let b = c.ok(&Tmsg::Getlock(l));
    assert_eq!(type_of(&b), MsgType::RGETLOCK);
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let proc_id = u32::from_le_bytes(b[24..28].try_into().unwrap());
    let n = u16::from_le_bytes([b[28], b[29]]) as usize;
    (b[7], u64_at(8), u64_at(16), proc_id, String::from_utf8(b[30..30 + n].to_vec()).unwrap())
}

/// POSIX byte-range locks through Tlock/Tgetlock, as two processes' locks
/// on a local disk: ranges apart do not conflict, overlapping ones do
/// (BLOCKED, never a wait), read locks share, Tgetlock names the holder as
/// its client described it, an unlock or a clunk lets the other in, and a
/// local process sees the clients' locks.
#[test]
fn byte_range_locks_conflict_by_range_and_name_their_holder() {
    let ex = scratch("locks");
    std::fs::write(ex.join("f"), vec![0u8; 4096]).unwrap();
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let mut a = Client::session(s.addr, &ex);
    let mut b = Client::session(s.addr, &ex);
    for c in [&mut a, &mut b] {
        c.ok(&Tmsg::Walk { fid: 0, newfid: 1, names: vec!["f"] });
        c.ok(&Tmsg::Lopen { fid: 1, flags: 2 });
    }
    let (wr, rd, un) = (1, 0, 2);
    assert_eq!(lock(&mut a, 1, wr, 0, 10, (4242, "host-a")), 0);
    assert_eq!(lock(&mut b, 1, wr, 10, 10, (77, "host-b")), 0, "ranges apart");
    assert_eq!(lock(&mut b, 1, wr, 5, 1, (77, "host-b")), 1, "inside a's range: blocked");
    assert_eq!(getlock(&mut b, 1, wr, 0, 0), (wr, 0, 10, 4242, "host-a".to_string()));
    assert_eq!(getlock(&mut a, 1, wr, 12, 1), (wr, 10, 10, 77, "host-b".to_string()));
    assert_eq!(getlock(&mut a, 1, wr, 30, 5).0, un, "nothing there");
    // Linux's client asks every F_GETLK as UNLCK: answered as a write
    // lock's question.
    assert_eq!(getlock(&mut b, 1, un, 5, 1), (wr, 0, 10, 4242, "host-a".to_string()));
    assert_eq!(getlock(&mut a, 1, un, 30, 5).0, un, "nothing there");
    // A local process sees them (an open file description of its own).
    let local = std::fs::OpenOptions::new().read(true).write(true).open(ex.join("f")).unwrap();
    let w = |start, len| connmux_sys::fileserver::RangeLock { kind: libc::F_WRLCK as _, start, len, pid: 0 };
    use std::os::fd::AsFd;
    assert!(!connmux_sys::fileserver::ofd_setlk(local.as_fd(), &w(3, 1)).unwrap());
    assert!(connmux_sys::fileserver::ofd_setlk(local.as_fd(), &w(50, 1)).unwrap());
    assert_eq!(lock(&mut a, 1, wr, 50, 1, (4242, "host-a")), 1, "the local lock blocks a client");
    drop(local);
    // Read locks share; a write over them is blocked.
    assert_eq!(lock(&mut a, 1, rd, 100, 10, (4242, "host-a")), 0);
    assert_eq!(lock(&mut b, 1, rd, 100, 10, (77, "host-b")), 0);
    assert_eq!(lock(&mut b, 1, wr, 105, 1, (77, "host-b")), 1);
    assert_eq!(getlock(&mut b, 1, un, 105, 1).0, rd, "a's read lock, asked as UNLCK");
    // An unlock lets b in; a's clunk drops its read lock.
    assert_eq!(lock(&mut a, 1, un, 0, 10, (4242, "host-a")), 0);
    assert_eq!(lock(&mut b, 1, wr, 5, 1, (77, "host-b")), 0);
    a.ok(&Tmsg::Clunk { fid: 1 });
    assert_eq!(lock(&mut b, 1, wr, 105, 1, (77, "host-b")), 0);
    let _ = std::fs::remove_dir_all(&ex);
}

/// A lock's owner is a process of a client (proc_id and client_id, on its
/// connection), not an opened fid: two fids one process opened on a file
/// share its locks, as two descriptors of one process do on a local disk
/// (no conflict, Tgetlock sees none, an unlock through either releases
/// them); another process of the same client conflicts, and so does the
/// same proc_id and client_id on another connection. A write lock through a
/// fid opened read-only is EBADF, as fcntl(2) answers it.
#[test]
fn locks_belong_to_a_process_not_to_an_opened_fid() {
    const EBADF: u32 = 9;
    let ex = scratch("lockowner");
    std::fs::write(ex.join("f"), vec![0u8; 4096]).unwrap();
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let mut a = Client::session(s.addr, &ex);
    let mut other = Client::session(s.addr, &ex);
    // Fids 1 and 2 read-write, 3 read-only, all of one file.
    let open = |c: &mut Client, fid, flags| {
        c.ok(&Tmsg::Walk { fid: 0, newfid: fid, names: vec!["f"] });
        c.ok(&Tmsg::Lopen { fid, flags });
    };
    for (fid, flags) in [(1, 2), (2, 2), (3, 0)] {
        open(&mut a, fid, flags);
    }
    open(&mut other, 1, 2);
    let (wr, rd, un) = (1, 0, 2);
    let p = (10, "host");
    assert_eq!(lock(&mut a, 1, wr, 0, 10, p), 0);
    assert_eq!(lock(&mut a, 2, wr, 5, 10, p), 0, "the same process through its second open");
    assert_eq!(getlock_as(&mut a, 2, wr, 0, 0, p).0, un, "its own locks do not conflict");
    assert_eq!(lock(&mut a, 3, rd, 0, 4, p), 0, "a read lock through the read-only open");
    let b = a.call(&Tmsg::Lock(Lock {
        fid: 3,
        lock_type: wr,
        flags: 0,
        start: 0,
        length: 1,
        proc_id: 10,
        client_id: "host",
    }));
    assert_eq!(errno_of(&b), Some(EBADF), "a write lock through a read-only open");
    assert_eq!(lock(&mut a, 2, wr, 12, 1, (11, "host")), 1, "another process of the client");
    assert_eq!(
        getlock_as(&mut a, 1, wr, 12, 1, (11, "host")),
        (wr, 4, 11, 10, "host".to_string()),
        "the merged write lock [4, 15)"
    );
    assert_eq!(lock(&mut other, 1, wr, 12, 1, p), 1, "the same names on another connection");
    // An unlock of the whole file through one open releases what the other took.
    assert_eq!(lock(&mut a, 3, un, 0, 0, p), 0);
    assert_eq!(lock(&mut a, 2, wr, 0, 20, (11, "host")), 0);
    // The other process's clunk of its open releases its locks.
    a.ok(&Tmsg::Clunk { fid: 2 });
    assert_eq!(lock(&mut other, 1, wr, 0, 20, p), 0);
    let _ = std::fs::remove_dir_all(&ex);
}

const ENODATA: u32 = 61;

/// The value of Txattrwalk `name` of fid `fid` (the list for ""), read
/// through fid 900, or the errno.
fn xattr_get(c: &mut Client, fid: u32, name: &str) -> Result<Vec<u8>, u32> {
    let b = c.call(&Tmsg::Xattrwalk { fid, newfid: 900, name });
    if let Some(e) = errno_of(&b) {
        return Err(e);
    }
    assert_eq!(type_of(&b), MsgType::RXATTRWALK);
    let size = u64::from_le_bytes(b[7..15].try_into().unwrap()) as usize;
    let mut v = Vec::new();
    // Bounded by `size`: each read returns more, or the loop ends.
    while v.len() < size {
        let r = c.ok(&Tmsg::Read { fid: 900, offset: v.len() as u64, count: 1000 });
        if r.len() == 11 {
            break;
        }
        v.extend_from_slice(&r[11..]);
    }
    c.ok(&Tmsg::Clunk { fid: 900 });
    assert_eq!(v.len(), size);
    Ok(v)
}

/// Txattrcreate of `name` on a clone of `fid` (as fid 901), `value`
/// written, and the clunk's errno (None: set).
fn xattr_set(c: &mut Client, fid: u32, name: &str, value: &[u8], size: u64, flags: u32) -> Option<u32> {
    c.ok(&Tmsg::Walk { fid, newfid: 901, names: vec![] });
    let b = c.call(&Tmsg::Xattrcreate { fid: 901, name, size, flags });
    if let Some(e) = errno_of(&b) {
        c.ok(&Tmsg::Clunk { fid: 901 });
        return Some(e);
    }
    if !value.is_empty() {
        c.ok(&Tmsg::Write { fid: 901, offset: 0, data: value });
    }
    errno_of(&c.call(&Tmsg::Clunk { fid: 901 }))
}

/// An attribute's value as the file system has it.
fn local_xattr(p: &Path, name: &str) -> rustix::io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(65536);
    rustix::fs::getxattr(p, name, rustix::buffer::spare_capacity(&mut v))?;
    Ok(v)
}

/// A POSIX ACL as Linux stores it in `system.posix_acl_access`: the owner
/// rw, uid `user` rw, the group and others nothing, the mask rw.
fn acl_granting(user: u32) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    let undefined = u32::MAX;
    for (tag, perm, id) in
        [(0x01u16, 6u16, undefined), (0x02, 6, user), (0x04, 0, undefined), (0x10, 6, undefined), (0x20, 0, undefined)]
    {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Extended attributes through Txattrwalk/Txattrcreate, checked against the
/// file system itself: a `user.*` value set by a client is there locally,
/// one set locally is listed and read by the client, a removal removes,
/// names outside `user.*` and the ACLs are not served, sizes are checked
/// (over 64 KiB E2BIG, fewer bytes than declared EINVAL and nothing set),
/// and a POSIX ACL set by a client grants uid 1000 what the modes do not.
/// With --no-xattrs: EOPNOTSUPP.
#[test]
fn xattrs_round_trip_and_an_acl_set_by_a_client_grants_access() {
    let ex = scratch("xattrs");
    let f = ex.join("f");
    std::fs::write(&f, b"acl-guarded").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let mut c = Client::session(s.addr, &ex);
    c.ok(&Tmsg::Walk { fid: 0, newfid: 1, names: vec!["f"] });
    assert_eq!(xattr_set(&mut c, 1, "user.color", b"red", 3, 0), None);
    assert_eq!(local_xattr(&f, "user.color").unwrap(), b"red");
    rustix::fs::setxattr(&f, "user.shape", b"round", rustix::fs::XattrFlags::empty()).unwrap();
    let list = xattr_get(&mut c, 1, "").unwrap();
    let names: Vec<&[u8]> = list.split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
    assert!(names.contains(&&b"user.color"[..]) && names.contains(&&b"user.shape"[..]), "{list:?}");
    assert_eq!(xattr_get(&mut c, 1, "user.shape").unwrap(), b"round");
    assert_eq!(xattr_get(&mut c, 1, "user.none"), Err(ENODATA));
    assert_eq!(xattr_get(&mut c, 1, "trusted.x"), Err(ENODATA), "not served");
    assert_eq!(xattr_set(&mut c, 1, "trusted.x", b"v", 1, 0), Some(95));
    assert_eq!(xattr_set(&mut c, 1, "user.big", b"", 70_000, 0), Some(7), "E2BIG");
    assert_eq!(xattr_set(&mut c, 1, "user.short", b"abc", 4, 0), Some(22), "3 bytes of 4");
    assert!(local_xattr(&f, "user.short").is_err());
    // Linux's client removes with size 0 and XATTR_REPLACE.
    assert_eq!(xattr_set(&mut c, 1, "user.color", b"", 0, 2), None);
    assert!(local_xattr(&f, "user.color").is_err());

    let acl = acl_granting(USER);
    match xattr_set(&mut c, 1, "system.posix_acl_access", &acl, acl.len() as u64, 0) {
        Some(95) => eprintln!("skipped the ACL: the file system of {} has none", ex.display()),
        Some(e) => panic!("setting an ACL: errno {e}"),
        None if is_root() => {
            assert_eq!(xattr_get(&mut c, 1, "system.posix_acl_access").unwrap(), acl);
            let (b, mut u) = attach_as(&s, &ex, USER);
            assert_eq!(type_of(&b), MsgType::RATTACH);
            u.ok(&Tmsg::Walk { fid: 0, newfid: 1, names: vec!["f"] });
            u.ok(&Tmsg::Lopen { fid: 1, flags: 2 });
            let r = u.ok(&Tmsg::Read { fid: 1, offset: 0, count: 64 });
            assert_eq!(&r[11..], b"acl-guarded", "the ACL grants uid 1000 what mode 0600 does not");
        }
        None => {}
    }
    drop(s);
    let s = Server::start(&ex, &["--no-stats-socket", "--no-xattrs"]);
    let mut c = Client::session(s.addr, &ex);
    assert_eq!(xattr_get(&mut c, 0, "user.shape"), Err(95));
    let _ = std::fs::remove_dir_all(&ex);
}

/// An attach may name a sub-directory of the export (by its path, or
/// relative to the export): its fids cannot walk above it; a path outside,
/// with `..`, a file or nothing is refused.
#[test]
fn an_attach_to_a_subdirectory_is_confined_to_it() {
    let ex = scratch("aname");
    std::fs::create_dir(ex.join("sub")).unwrap();
    std::fs::write(ex.join("sub/inner"), b"inside").unwrap();
    std::fs::write(ex.join("top"), b"outside").unwrap();
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let sub = ex.join("sub");
    for aname in [sub.to_str().unwrap(), "sub", "sub/"] {
        let mut c = Client::connect(s.addr);
        c.ok(&Tmsg::Version { msize: 65536, version: "9P2000.L" });
        let att = c.ok(&Tmsg::Attach { fid: 0, afid: NOFID, uname: "", aname, n_uname: 0 });
        c.open(1, "inner");
        assert_eq!(&c.ok(&Tmsg::Read { fid: 1, offset: 0, count: 64 })[11..], b"inside");
        // `..` of the attach point is the attach point.
        let w = c.ok(&Tmsg::Walk { fid: 0, newfid: 2, names: vec![".."] });
        assert_eq!(&w[9..22], &att[7..20], "{aname}: .. leaves the attach point");
        let w = c.call(&Tmsg::Walk { fid: 0, newfid: 3, names: vec!["..", "top"] });
        assert_eq!(type_of(&w), MsgType::RWALK);
        assert_eq!(u16::from_le_bytes([w[7], w[8]]), 1, "{aname}: only .. walked");
        assert_eq!(errno_of(&c.call(&Tmsg::Getattr { fid: 3, mask: 0x7ff })), Some(9), "no fid made");
    }
    let top = ex.join("top");
    let up = format!("{}/sub/..", ex.display());
    for (aname, errno) in [("/etc", 2), (up.as_str(), 2), ("../x", 2), (top.to_str().unwrap(), 20), ("nope", 2)] {
        let mut c = Client::connect(s.addr);
        c.ok(&Tmsg::Version { msize: 65536, version: "9P2000.L" });
        let b = c.call(&Tmsg::Attach { fid: 0, afid: NOFID, uname: "", aname, n_uname: 0 });
        assert_eq!(errno_of(&b), Some(errno), "aname {aname}");
    }
    let _ = std::fs::remove_dir_all(&ex);
}

/// Small reads (answered on the I/O worker when the pages are in memory)
/// are exact: whole within the file, short only at its end, empty past it,
/// and a read of a file changed locally sees the change.
#[test]
fn small_reads_are_exact_at_the_end_of_the_file() {
    let ex = scratch("smallreads");
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(ex.join("f"), &data).unwrap();
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let mut c = Client::session(s.addr, &ex);
    c.open(1, "f");
    for (offset, count) in
        [(0u64, 32u32), (9_990, 32), (9_999, 1), (10_000, 32), (20_000, 32), (0, 16_384), (5_000, 8_000)]
    {
        let b = c.ok(&Tmsg::Read { fid: 1, offset, count });
        let from = (offset as usize).min(data.len());
        let to = (offset as usize + count as usize).min(data.len());
        assert_eq!(&b[11..], &data[from..to], "read {count} at {offset}");
    }
    std::fs::write(ex.join("f"), b"changed").unwrap();
    let b = c.ok(&Tmsg::Read { fid: 1, offset: 0, count: 32 });
    assert_eq!(&b[11..], b"changed");
    let _ = std::fs::remove_dir_all(&ex);
}
