//! Running a call as its AUTH_SYS caller (`nfs-server --auth-sys`): the
//! file-system thread takes the caller's uid, gid and groups for the call
//! and gives them back after, with the per-thread `setresuid`,
//! `setresgid` and `setgroups` system calls (rustix's `thread` calls, not
//! libc's, which would change every thread of the process).
//!
//! Only the effective ids change: the real and saved uid stay 0, so the
//! thread can become root again; the kernel takes the effective set of
//! capabilities away while the effective uid is not 0 and gives it back
//! when it is. The file-system uid and gid follow the effective ones.
//! Nested: [`as_server`] (a search of the export, which must see every
//! directory) returns to the server's own identity and back.

use std::cell::RefCell;

use rustix::fs::{Gid, Uid};
use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};

/// An identity a call runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

/// The identity of `nobody` (AUTH_NONE calls, and root when squashed).
pub const NOBODY: u32 = 65534;

thread_local! {
    /// The identity this thread runs as now; `None`: the server's own.
    static CURRENT: RefCell<Option<Cred>> = const { RefCell::new(None) };
}

/// The server's own groups, restored after a call.
static SERVER_GROUPS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();

/// Reads the server's groups (once, before any thread changes its own).
pub fn init() -> anyhow::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let groups = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|v| v.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    let _ = SERVER_GROUPS.set(groups);
    Ok(())
}

fn apply(c: Option<&Cred>) -> std::io::Result<()> {
    match c {
        // Root first: the rest needs its privileges.
        None => {
            set_thread_res_uid(None, Uid::ROOT, None)?;
            set_thread_res_gid(None, Gid::ROOT, None)?;
            let g: Vec<Gid> = SERVER_GROUPS.get().map_or(&[][..], |v| v).iter().map(|&g| Gid::from_raw(g)).collect();
            set_thread_groups(&g)?;
        }
        // The user last: after it, nothing else may be changed.
        Some(c) => {
            let g: Vec<Gid> = c.gids.iter().map(|&g| Gid::from_raw(g)).collect();
            set_thread_groups(&g)?;
            set_thread_res_gid(None, Gid::from_raw(c.gid), None)?;
            set_thread_res_uid(None, Uid::from_raw(c.uid), None)?;
        }
    }
    Ok(())
}

/// While alive, the thread runs as the identity it had before.
pub struct Guard {
    prev: Option<Cred>,
    changed: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.changed {
            // From a user back to root cannot fail (the saved uid is 0);
            // should it, the thread would go on as the user: abort rather.
            let prev = self.prev.take();
            if let Some(p) = &prev {
                // (Back to root first, then to the previous user.)
                apply(None).and_then(|()| apply(Some(p))).expect("restoring a file-system thread's identity");
            } else {
                apply(None).expect("restoring a file-system thread's identity");
            }
            CURRENT.with(|c| *c.borrow_mut() = prev);
        }
    }
}

/// Runs the thread as `c` (`None`: the server's own identity) until the
/// guard is dropped.
pub fn become_(c: Option<Cred>) -> std::io::Result<Guard> {
    let prev = CURRENT.with(|cur| cur.borrow().clone());
    if prev == c {
        return Ok(Guard { prev: None, changed: false });
    }
    if prev.is_some() {
        apply(None)?;
    }
    if let Err(e) = apply(c.as_ref()) {
        // Whatever was half done is undone.
        let _ = apply(None);
        let _ = prev.as_ref().map(|p| apply(Some(p)));
        return Err(e);
    }
    CURRENT.with(|cur| *cur.borrow_mut() = c);
    Ok(Guard { prev, changed: true })
}

/// The server's own identity until the guard is dropped (a no-op where
/// the thread runs as the server already).
pub fn as_server() -> std::io::Result<Guard> {
    become_(None)
}

/// Whether this process runs as root (the only case where calls can take
/// their caller's identity).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().nth(1)?.parse::<u32>().ok())
    }) == Some(0)
}
