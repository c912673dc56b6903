//! Who a client is: each Tattach names a user (`n_uname`, else `uname`),
//! and every file operation on the fids walked from it is done as that
//! user, diod's model. Run as root, the server maps the name to a uid, its
//! primary gid and its groups (the system's user database), and a
//! file-system thread takes that identity for the operation with
//! `setfsuid`/`setfsgid` and the raw `setgroups` system call, which change
//! the calling thread only: the kernel then checks permissions and owns new
//! files exactly as for that user's own processes. Run as anyone else, the
//! server can take no other identity: an attach as another user is refused
//! (EPERM), or, with `--squash-users`, served as the server's own user.

use std::cell::RefCell;
use std::sync::Arc;

use connmux_sys::fileserver as sys;
use rustix::io::Errno;

/// A file operation's result (as `crate::fs::R`; this module sits below
/// `fs`, which names `User`).
type R<T> = Result<T, Errno>;

/// `n_uname` when the client names no uid.
pub const NONUNAME: u32 = u32::MAX;

/// The gid of a create that names no group (`(gid_t)-1`, as gVisor's p9
/// client sends): the user's primary group.
pub const NOGID: u32 = u32::MAX;

/// An identity file operations run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary one included).
    pub groups: Vec<u32>,
}

impl User {
    /// Whether `gid` may own what this user creates (a member, or root).
    pub fn may_use_gid(&self, gid: u32) -> bool {
        self.uid == 0 || self.gid == gid || self.groups.contains(&gid)
    }
}

/// How attaches are mapped to identities.
pub enum Users {
    /// Running as root: each attach's user, looked up.
    Switch,
    /// Running as `me`: attaches as `me` only (by uid, or by name with no
    /// uid); others are refused.
    Own { me: Arc<User>, name: Option<String> },
    /// Every attach served as `me` (`--squash-users`).
    Squash { me: Arc<User> },
}

impl Users {
    /// The mapping for this process: switching when it runs as root (and
    /// `squash` is not asked), else its own user.
    pub fn for_this_process(squash: bool) -> Users {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let entry = sys::user_by_uid(uid).ok().flatten();
        let me =
            Arc::new(User { uid, gid, groups: entry.as_ref().map(|e| e.groups.clone()).unwrap_or_else(|| vec![gid]) });
        if squash {
            Users::Squash { me }
        } else if uid == 0 {
            Users::Switch
        } else {
            Users::Own { me, name: entry.map(|e| e.name) }
        }
    }

    /// Whether file operations change the thread's identity.
    pub fn switches(&self) -> bool {
        matches!(self, Users::Switch)
    }

    /// The identity of an attach. Root: `n_uname` when given, else `uname`
    /// (a number is a uid), looked up in the user database for its groups;
    /// a uid the database does not know (or cannot be asked about: a static
    /// binary without the C library's NSS modules) is served as that uid
    /// with the gid of the same number and no other group, and a name it
    /// does not know as `nobody` (uid and gid 65534, no other group: the
    /// kernel's own client attaches its mount as `nobody` before it
    /// attaches each user by uid). Not root: the server's own user, EPERM
    /// for anyone else.
    pub fn resolve(&self, uname: &str, n_uname: u32) -> R<Arc<User>> {
        match self {
            Users::Squash { me } => Ok(me.clone()),
            Users::Own { me, name } => {
                let mine = if n_uname != NONUNAME {
                    n_uname == me.uid
                } else {
                    uname.is_empty() || name.as_deref() == Some(uname) || uname.parse::<u32>() == Ok(me.uid)
                };
                if mine {
                    Ok(me.clone())
                } else {
                    Err(Errno::PERM)
                }
            }
            Users::Switch => {
                let uid = if n_uname != NONUNAME { Some(n_uname) } else { uname.parse::<u32>().ok() };
                let entry = match uid {
                    Some(u) => sys::user_by_uid(u).ok().flatten(),
                    None => sys::user_by_name(uname).ok().flatten(),
                };
                let user = match (entry, uid) {
                    (Some(e), _) => User { uid: e.uid, gid: e.gid, groups: e.groups },
                    (None, Some(u)) => User { uid: u, gid: u, groups: vec![u] },
                    (None, None) => User { uid: NOBODY, gid: NOBODY, groups: vec![NOBODY] },
                };
                Ok(Arc::new(user))
            }
        }
    }
}

/// The uid and gid an attach by a name the user database does not know is
/// served as (the kernel's overflow uid).
pub const NOBODY: u32 = 65534;

thread_local! {
    /// The identity this thread's file-system calls run as now (`None`: the
    /// process's own).
    static CURRENT: RefCell<Option<(u32, u32, Vec<u32>)>> = const { RefCell::new(None) };
}

/// Makes the calling thread's file-system calls run as `user`, its files
/// created with group `gid` (the user's primary group unless given and
/// allowed; [`NOGID`] gives none). Nothing is called when the thread
/// already has that identity.
pub fn become_user(user: &User, gid: Option<u32>) -> R<()> {
    let gid = gid.filter(|g| *g != NOGID && user.may_use_gid(*g)).unwrap_or(user.gid);
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        if let Some((u, g, groups)) = &*c {
            if *u == user.uid && *g == gid && *groups == user.groups {
                return Ok(());
            }
        }
        // Groups and gid before the uid (a fsuid other than root drops the
        // file-system capabilities only; CAP_SETGID and CAP_SETUID stay, so
        // the next switch, back to root or to another user, works).
        let r = sys::set_thread_groups(&user.groups)
            .and_then(|()| sys::set_thread_fsgid(gid))
            .and_then(|()| sys::set_thread_fsuid(user.uid));
        match r {
            Ok(()) => {
                *c = Some((user.uid, gid, user.groups.clone()));
                Ok(())
            }
            Err(e) => {
                // Unknown state: the next call sets everything again.
                *c = None;
                Err(Errno::from_io_error(&e).unwrap_or(Errno::PERM))
            }
        }
    })
}
