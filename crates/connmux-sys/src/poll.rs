//! Wait for an fd (or one of a few) to become readable, with a timeout (for blocking receives on an
//! fd that is itself non-blocking, such as a KCM socket's eventfd).

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::util::cvt;

/// Blocks until `fd` is readable or `timeout` passes (`None`: no limit). Returns
/// `Ok(true)` when readable, `Ok(false)` on timeout. Hang-up and error conditions
/// count as readable, because a read then returns at once (end of stream or the
/// error). A signal does not end the wait early: it resumes with the time left.
/// An invalid `fd` (negative or not open) is `EBADF`.
pub fn poll_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    poll_any_readable(&[fd], timeout)
}

/// [`poll_readable`] over several fds: returns `Ok(true)` as soon as any of
/// them is readable. `EINVAL` for no fds.
pub fn poll_any_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<bool> {
    // Up to this many fds need no allocation.
    const ON_STACK: usize = 16;
    if fds.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    if fds.iter().any(|&fd| fd < 0) {
        // ppoll skips negative fds, which would turn this into a plain sleep.
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    let deadline = timeout.map(|t| Instant::now().checked_add(t));
    let idle = libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 };
    let mut stack = [idle; ON_STACK];
    let mut heap = Vec::new();
    let pfds: &mut [libc::pollfd] = if fds.len() <= ON_STACK {
        &mut stack[..fds.len()]
    } else {
        heap.resize(fds.len(), idle);
        &mut heap
    };
    loop {
        for (p, &fd) in pfds.iter_mut().zip(fds) {
            *p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        }
        let left = match deadline {
            None => None,
            // A deadline too far to represent is the same as no deadline.
            Some(None) => None,
            Some(Some(d)) => Some(d.saturating_duration_since(Instant::now())),
        };
        let ts = left.map(|d| libc::timespec {
            // 64-bit on x86_64 with glibc and musl alike.
            tv_sec: d.as_secs().min(i64::MAX as u64) as _,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `pfds` holds exactly `fds.len()` valid pollfds; `ts_ptr` is null or
        // points to a live timespec; a null sigmask leaves the signal mask unchanged.
        let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), fds.len() as libc::nfds_t, ts_ptr, std::ptr::null()) };
        match cvt(r) {
            Ok(0) => return Ok(false),
            Ok(_) => {
                let seen = &pfds[..];
                if seen.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
                    return Err(io::Error::from_raw_os_error(libc::EBADF));
                }
                return Ok(seen.iter().any(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0));
            }
            // Each retry uses the time left, so signals cannot stretch the wait; a
            // deadline that has passed makes the next ppoll return 0 at once.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Whether `fd`, the writing end of a pipe or a socket, has no reader any more
/// (`POLLERR`/`POLLHUP` on a poll that does not wait): a write would fail with
/// `EPIPE`. A file or a terminal is never closed this way.
pub fn write_end_closed(fd: RawFd) -> io::Result<bool> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
    // SAFETY: `pfd` is one valid pollfd; a zero timeout does not wait.
    let r = crate::util::retry_eintr(|| cvt(unsafe { libc::poll(&mut pfd, 1, 0) }))?;
    if r == 0 {
        return Ok(false);
    }
    if pfd.revents & libc::POLLNVAL != 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    Ok(pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn times_out_then_sees_data_from_another_thread() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let t = Instant::now();
        assert!(!poll_readable(s.as_raw_fd(), Some(Duration::from_millis(30))).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(29));
        let w = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c.write_all(b"x").unwrap();
            c
        });
        let t = Instant::now();
        assert!(poll_readable(s.as_raw_fd(), None).unwrap());
        assert!(t.elapsed() < Duration::from_secs(10));
        let c = w.join().unwrap();
        drop(c);
    }

    #[test]
    fn hangup_counts_as_readable_and_bad_fd_is_ebadf() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        drop(c);
        assert!(poll_readable(s.as_raw_fd(), Some(Duration::from_secs(5))).unwrap());
        // ppoll would ignore a negative fd and sleep; we refuse it instead.
        let err = poll_readable(-1, None).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        // An fd number above any open file limit can never be open: POLLNVAL.
        let err = poll_readable(1 << 30, Some(Duration::ZERO)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn any_of_several_fds_wakes_the_wait() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let _c0 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s0, _) = l.accept().unwrap();
        let mut c1 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s1, _) = l.accept().unwrap();
        let fds = [s0.as_raw_fd(), s1.as_raw_fd()];
        assert!(!poll_any_readable(&fds, Some(Duration::from_millis(20))).unwrap());
        c1.write_all(b"x").unwrap();
        assert!(poll_any_readable(&fds, Some(Duration::from_secs(10))).unwrap());
        assert_eq!(poll_any_readable(&[], None).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        assert_eq!(poll_any_readable(&[fds[0], -1], None).unwrap_err().raw_os_error(), Some(libc::EBADF));
    }
}
