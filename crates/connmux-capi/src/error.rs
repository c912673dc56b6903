//! Errors across the C boundary: a negative errno as the return value, and a
//! message kept per thread for `connmux_last_error`.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A failed call: the errno it returns (positive here, negated at the
/// boundary) and the message `connmux_last_error` gives.
#[derive(Debug)]
pub(crate) struct Fail {
    pub errno: i32,
    pub msg: String,
}

impl Fail {
    pub fn new(errno: i32, msg: impl Into<String>) -> Fail {
        Fail { errno, msg: msg.into() }
    }

    /// A null pointer where one is required.
    pub fn null(what: &str) -> Fail {
        Fail::new(libc::EFAULT, format!("{what} is a null pointer"))
    }

    pub fn inval(msg: impl Into<String>) -> Fail {
        Fail::new(libc::EINVAL, msg)
    }
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Fail {
        Fail { errno: errno_of(&e), msg: e.to_string() }
    }
}

/// The errno for an I/O error: its OS code, else the closest code for its kind.
pub(crate) fn errno_of(e: &io::Error) -> i32 {
    if let Some(code) = e.raw_os_error() {
        return code;
    }
    match e.kind() {
        io::ErrorKind::WouldBlock => libc::EAGAIN,
        io::ErrorKind::TimedOut => libc::ETIMEDOUT,
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => libc::EINVAL,
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        io::ErrorKind::AlreadyExists => libc::EEXIST,
        io::ErrorKind::BrokenPipe => libc::EPIPE,
        io::ErrorKind::Interrupted => libc::EINTR,
        io::ErrorKind::OutOfMemory => libc::ENOMEM,
        io::ErrorKind::Unsupported => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

thread_local! {
    static LAST: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_last(msg: &str) {
    // An interior NUL cannot reach C: cut the message there.
    let cut = msg.split('\0').next().unwrap_or("");
    let c = CString::new(cut).unwrap_or_default();
    // try_with: during thread exit the slot may be gone; the message is then lost.
    let _ = LAST.try_with(|l| *l.borrow_mut() = Some(c));
}

/// The thread's last message, or null if no call on this thread failed.
pub(crate) fn last_ptr() -> *const c_char {
    LAST.try_with(|l| l.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr())).unwrap_or(std::ptr::null())
}

/// Run the body of an exported function: `Ok(n)` returns `n`, `Err` returns
/// `-errno` and records the message, a panic returns `-EIO` and records it.
/// Nothing unwinds into C.
pub(crate) fn guard(f: impl FnOnce() -> Result<isize, Fail>) -> isize {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => n,
        Ok(Err(fail)) => {
            set_last(&fail.msg);
            -(fail.errno.max(1) as isize)
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last(&format!("internal error (panic): {what}"));
            -(libc::EIO as isize)
        }
    }
}

/// [`guard`] for functions that return `int`.
pub(crate) fn guard_int(f: impl FnOnce() -> Result<isize, Fail>) -> i32 {
    let r = guard(f);
    i32::try_from(r).unwrap_or(if r < 0 { -libc::EOVERFLOW } else { i32::MAX })
}
