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
    let b = n.call(&Tmsg::Attach { fid: 9, afid: NOFID, uname: "no-such-user-x", aname: "", n_uname: u32::MAX });
    assert_eq!(errno_of(&b), Some(2), "an unknown name is ENOENT");
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
