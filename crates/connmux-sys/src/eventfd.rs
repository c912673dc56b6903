//! eventfd: a kernel counter that is readable while non-zero, used to wake a thread
//! blocked in `epoll_wait` (register [`EventFd::as_raw_fd`] for read interest).
//!
//! Many [`EventFd::notify`] calls before one [`EventFd::drain`] coalesce into one
//! wake-up; `drain` says how many there were.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::util::{cvt, cvt_size, retry_eintr};

/// An owned, non-blocking, close-on-exec eventfd. `Send + Sync`: any thread may notify.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Creates an eventfd with counter 0 (`EFD_NONBLOCK | EFD_CLOEXEC`).
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new fd we own.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Adds 1 to the counter, making the fd readable. If the counter is already at its
    /// maximum (`EAGAIN`), the fd is readable anyway, so that is success too.
    pub fn notify(&self) -> io::Result<()> {
        let one: u64 = 1;
        let r = retry_eintr(|| {
            // SAFETY: writes 8 bytes from a live u64 on our stack.
            cvt_size(unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) })
        });
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Reads and resets the counter: the number of notifications since the last drain,
    /// 0 if there were none (the fd is then no longer readable).
    pub fn drain(&self) -> io::Result<u64> {
        let mut value: u64 = 0;
        let r = retry_eintr(|| {
            // SAFETY: reads at most 8 bytes into a live u64 on our stack.
            cvt_size(unsafe { libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) })
        });
        match r {
            Ok(_) => Ok(value),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epoll::{Epoll, Events, Interest};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn notifications_coalesce_and_drain_resets() {
        let efd = EventFd::new().unwrap();
        assert_eq!(efd.drain().unwrap(), 0);
        efd.notify().unwrap();
        efd.notify().unwrap();
        efd.notify().unwrap();
        assert_eq!(efd.drain().unwrap(), 3);
        assert_eq!(efd.drain().unwrap(), 0);
    }

    #[test]
    fn wakes_epoll_from_another_thread() {
        let efd = Arc::new(EventFd::new().unwrap());
        let ep = Epoll::new().unwrap();
        ep.add(efd.as_raw_fd(), 5, Interest::READ).unwrap();
        let mut events = Events::with_capacity(2);
        assert_eq!(ep.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        let e2 = efd.clone();
        let t = std::thread::spawn(move || e2.notify().unwrap());
        assert_eq!(ep.wait(&mut events, Some(Duration::from_secs(10))).unwrap(), 1);
        assert_eq!(events.iter().next().unwrap().token, 5);
        t.join().unwrap();
        assert_eq!(efd.drain().unwrap(), 1);
        assert_eq!(ep.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    }

    #[test]
    fn is_nonblocking_and_cloexec() {
        let efd = EventFd::new().unwrap();
        // SAFETY: F_GETFL/F_GETFD take no pointer argument.
        let fl = unsafe { libc::fcntl(efd.as_raw_fd(), libc::F_GETFL) };
        // SAFETY: as above.
        let fd_flags = unsafe { libc::fcntl(efd.as_raw_fd(), libc::F_GETFD) };
        assert!(fl & libc::O_NONBLOCK != 0);
        assert!(fd_flags & libc::FD_CLOEXEC != 0);
    }
}
