//! Signals taken synchronously: a set of signals is blocked in every thread
//! (the mask is inherited by threads spawned afterwards) and one thread waits
//! for them with `sigtimedwait`, so no handler runs in signal context. Also:
//! sending a signal to a process, dying of a signal's default action, and
//! waiting for a child with its resource usage (peak RSS).

use std::io;
use std::time::{Duration, Instant};

use crate::util::cvt;

/// A set of signal numbers (`sigset_t`).
#[derive(Clone, Copy)]
pub struct SigSet(libc::sigset_t);

impl std::fmt::Debug for SigSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigSet")
    }
}

impl SigSet {
    /// The set of `signals`; an unknown number is `EINVAL`.
    pub fn new(signals: &[libc::c_int]) -> io::Result<SigSet> {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initializes the sigset_t it is given a valid pointer to.
        cvt(unsafe { libc::sigemptyset(set.as_mut_ptr()) })?;
        // SAFETY: initialized by the successful sigemptyset above.
        let mut set = unsafe { set.assume_init() };
        for &s in signals {
            // SAFETY: `set` is an initialized sigset_t; a bad number is reported as -1/EINVAL.
            cvt(unsafe { libc::sigaddset(&mut set, s) })?;
        }
        Ok(SigSet(set))
    }
}

/// Block `set` in the calling thread. Threads spawned afterwards inherit the
/// mask, so calling this first thing in `main` blocks the set process-wide:
/// the signals then stay pending until [`wait`] takes them.
pub fn block(set: &SigSet) -> io::Result<()> {
    // SAFETY: `set.0` is an initialized sigset_t; a null old-set pointer is allowed.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set.0, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Wait up to `timeout` for a pending signal of `set` (which must be blocked)
/// and take it: `Some(signo)`, or `None` when the time passed. Another signal
/// interrupting the wait resumes it with the time left.
pub fn wait(set: &SigSet, timeout: Duration) -> io::Result<Option<libc::c_int>> {
    let deadline = Instant::now().checked_add(timeout);
    loop {
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => timeout,
        };
        let ts = libc::timespec {
            tv_sec: left.as_secs().min(i64::MAX as u64) as _,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `set.0` is an initialized sigset_t, `ts` a live timespec; a null
        // siginfo pointer is allowed.
        let r = unsafe { libc::sigtimedwait(&set.0, std::ptr::null_mut(), &ts) };
        match cvt(r) {
            Ok(signo) => return Ok(Some(signo)),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Send `sig` to process `pid` (`kill(2)`).
pub fn kill(pid: u32, sig: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: kill takes plain integers; a bad pid or signal is reported as -1/errno.
    cvt(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// Send `sig` to the calling thread (`raise(3)`).
pub fn raise(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: raise takes a plain integer; a bad signal is reported as non-zero/errno.
    match unsafe { libc::raise(sig) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// End the process by `sig`'s default action (as if it had not been caught or
/// ignored): what a shell reports as 128+`sig`. Used for `SIGPIPE` on a closed
/// standard output, which Rust's runtime otherwise ignores. Falls back to
/// `exit(128 + sig)` if the signal does not end the process.
pub fn die_of(sig: libc::c_int) -> ! {
    // SAFETY: restoring the default disposition of one signal has no memory effects.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
    if let Ok(set) = SigSet::new(&[sig]) {
        // SAFETY: `set.0` is an initialized sigset_t; a null old-set pointer is allowed.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set.0, std::ptr::null_mut()) };
    }
    // SAFETY: raise sends a signal to the calling thread; no memory is involved.
    unsafe { libc::raise(sig) };
    std::process::exit(128 + sig)
}

/// How a child process ended, with its resource usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// `Some(code)` when it exited, `None` when a signal ended it.
    pub code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// Its peak resident set size, KiB (`ru_maxrss`).
    pub max_rss_kib: u64,
}

/// Reap child `pid` if it has ended (`wait4` with `WNOHANG`): `None` while it
/// still runs.
pub fn try_wait_rusage(pid: u32) -> io::Result<Option<Exit>> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ECHILD))?;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `status` and `ru` are live and writable for the call.
    let r = cvt(unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) })?;
    if r == 0 {
        return Ok(None);
    }
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    Ok(Some(Exit { code, signal, max_rss_kib: ru.ru_maxrss.max(0) as u64 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_signal_is_taken_by_wait() {
        // SIGUSR2 is used by nothing else in this test binary.
        let set = SigSet::new(&[libc::SIGUSR2]).unwrap();
        block(&set).unwrap();
        assert_eq!(wait(&set, Duration::from_millis(10)).unwrap(), None);
        // To this thread, which blocks it (another test thread would not).
        raise(libc::SIGUSR2).unwrap();
        assert_eq!(wait(&set, Duration::from_secs(5)).unwrap(), Some(libc::SIGUSR2));
    }

    #[test]
    fn unknown_signal_is_refused() {
        assert!(SigSet::new(&[12345]).is_err());
    }
}
