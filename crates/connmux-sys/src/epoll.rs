//! epoll: readiness notification for many fds at once.
//!
//! An [`Epoll`] owns the epoll fd. Each registered fd carries a caller-chosen `u64`
//! token that comes back in its [`Event`]s; the kernel never interprets it.
//!
//! Interests are level-triggered unless [`Interest::edge`] is set. Readable interest
//! also asks for `EPOLLRDHUP`, so a peer's half-close is reported as [`Event::hup`]
//! without a read.
//!
//! `Epoll` is `Send + Sync`: `epoll_ctl` and `epoll_wait` may be called from several
//! threads at once (the kernel serialises them), which is how another thread
//! registers a new psock with a worker that is blocked in [`Epoll::wait`].

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::util::{cvt, timeout_ms};

/// What readiness to report for a registered fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interest {
    /// Report `EPOLLIN` (and `EPOLLRDHUP`).
    pub readable: bool,
    /// Report `EPOLLOUT`.
    pub writable: bool,
    /// Edge-triggered (`EPOLLET`): report each change once instead of while it lasts.
    pub edge: bool,
}

impl Interest {
    /// Level-triggered readable.
    pub const READ: Interest = Interest { readable: true, writable: false, edge: false };
    /// Level-triggered writable.
    pub const WRITE: Interest = Interest { readable: false, writable: true, edge: false };
    /// Level-triggered readable and writable.
    pub const READ_WRITE: Interest = Interest { readable: true, writable: true, edge: false };

    /// The same interest, edge-triggered.
    pub const fn edge(self) -> Interest {
        Interest { edge: true, ..self }
    }

    fn bits(self) -> u32 {
        let mut bits = 0;
        if self.readable {
            bits |= (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        }
        if self.writable {
            bits |= libc::EPOLLOUT as u32;
        }
        if self.edge {
            bits |= libc::EPOLLET as u32;
        }
        bits
    }
}

/// One readiness report from [`Epoll::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// The token given to [`Epoll::add`] / [`Epoll::modify`].
    pub token: u64,
    /// `EPOLLIN`: a read will not block (data, or end of stream).
    pub readable: bool,
    /// `EPOLLOUT`: a write will not block.
    pub writable: bool,
    /// `EPOLLERR`: an error is pending (read it with [`crate::socket::take_error`]).
    pub error: bool,
    /// `EPOLLHUP` or `EPOLLRDHUP`: the peer closed (at least) its sending side.
    pub hup: bool,
}

impl Event {
    fn from_raw(ev: libc::epoll_event) -> Event {
        // Copy the fields out: `epoll_event` is packed on x86-64, so no references.
        let bits = ev.events;
        let token = ev.u64;
        let has = |flag: libc::c_int| bits & flag as u32 != 0;
        Event {
            token,
            readable: has(libc::EPOLLIN),
            writable: has(libc::EPOLLOUT),
            error: has(libc::EPOLLERR),
            hup: has(libc::EPOLLHUP) || has(libc::EPOLLRDHUP),
        }
    }
}

/// A buffer of events filled by [`Epoll::wait`]; its capacity is the most events one
/// wait returns.
pub struct Events {
    buf: Vec<libc::epoll_event>,
}

impl Events {
    /// Room for `capacity` events per wait (at least 1).
    pub fn with_capacity(capacity: usize) -> Events {
        // epoll_wait refuses maxevents <= 0 and more than INT_MAX.
        let capacity = capacity.clamp(1, libc::c_int::MAX as usize);
        Events { buf: Vec::with_capacity(capacity) }
    }

    /// The most events one wait can return.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// How many events the last wait returned.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the last wait returned no event.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Forgets the events of the last wait.
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// The events of the last wait, in the kernel's order.
    pub fn iter(&self) -> impl Iterator<Item = Event> + '_ {
        self.buf.iter().map(|ev| Event::from_raw(*ev))
    }
}

/// An owned epoll instance (`EPOLL_CLOEXEC`).
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// Creates an epoll instance.
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new fd we own.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(Epoll { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, event: Option<libc::epoll_event>) -> io::Result<()> {
        let mut ev = event.unwrap_or(libc::epoll_event { events: 0, u64: 0 });
        // SAFETY: `ev` is a valid epoll_event on our stack for the duration of the call
        // (EPOLL_CTL_DEL ignores it); a bad `fd` is reported as EBADF, not UB.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    /// Registers `fd` with `interest`; its events will carry `token`.
    /// Fails with `EEXIST` if `fd` is already registered.
    pub fn add(&self, fd: RawFd, token: u64, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, Some(libc::epoll_event { events: interest.bits(), u64: token }))
    }

    /// Changes the token and interest of a registered `fd` (`ENOENT` if not registered).
    pub fn modify(&self, fd: RawFd, token: u64, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, Some(libc::epoll_event { events: interest.bits(), u64: token }))
    }

    /// Removes `fd` (`ENOENT` if not registered). Closing an fd removes it too, but only
    /// once every duplicate of it is closed: delete explicitly before closing.
    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, None)
    }

    /// Waits until at least one registered fd is ready or `timeout` passes (`None`:
    /// forever; timeouts are rounded up to whole milliseconds), and fills `events`.
    /// Returns the number of events; 0 on timeout and when a signal interrupted the
    /// wait (the caller's loop decides whether to wait again).
    #[inline]
    pub fn wait(&self, events: &mut Events, timeout: Option<Duration>) -> io::Result<usize> {
        events.buf.clear();
        let max = events.buf.capacity().min(libc::c_int::MAX as usize) as libc::c_int;
        // SAFETY: the kernel writes at most `max` events into the Vec's spare capacity,
        // which is at least `max` elements long. `epoll_pwait` with no signal mask
        // is `epoll_wait` (which some architectures lack), called through
        // `syscall(2)` rather than libc's cancellable wrapper (see `socket::read`).
        let n = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait,
                self.fd.as_raw_fd() as libc::c_long,
                events.buf.as_mut_ptr(),
                max as libc::c_long,
                timeout_ms(timeout) as libc::c_long,
                std::ptr::null::<libc::sigset_t>(),
                8usize,
            ) as libc::c_int
        };
        match cvt(n) {
            Ok(n) => {
                // SAFETY: the kernel initialised the first `n <= max <= capacity` elements.
                unsafe { events.buf.set_len(n as usize) };
                Ok(n as usize)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Epoll {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::time::Instant;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn epoll_is_send_sync() {
        assert_send_sync::<Epoll>();
    }

    #[test]
    fn reports_readable_with_token_then_times_out_after_drain() {
        let (mut a, b) = pair();
        let ep = Epoll::new().unwrap();
        ep.add(b.as_raw_fd(), 42, Interest::READ).unwrap();
        let mut events = Events::with_capacity(8);

        let t = Instant::now();
        assert_eq!(ep.wait(&mut events, Some(Duration::from_millis(20))).unwrap(), 0);
        assert!(t.elapsed() >= Duration::from_millis(19), "waited {:?}", t.elapsed());

        a.write_all(b"hello").unwrap();
        assert_eq!(ep.wait(&mut events, Some(Duration::from_secs(5))).unwrap(), 1);
        let ev = events.iter().next().unwrap();
        assert_eq!(ev.token, 42);
        assert!(ev.readable && !ev.hup && !ev.error);
        assert!(!ev.writable, "only read interest was asked for");

        // Level-triggered: still readable until drained.
        assert_eq!(ep.wait(&mut events, Some(Duration::ZERO)).unwrap(), 1);
        let mut buf = [0u8; 16];
        assert_eq!((&b).read(&mut buf).unwrap(), 5);
        assert_eq!(ep.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        assert!(events.is_empty());
    }

    #[test]
    fn edge_triggered_reports_once() {
        let (mut a, b) = pair();
        let ep = Epoll::new().unwrap();
        ep.add(b.as_raw_fd(), 1, Interest::READ.edge()).unwrap();
        let mut events = Events::with_capacity(4);
        a.write_all(b"x").unwrap();
        assert_eq!(ep.wait(&mut events, Some(Duration::from_secs(5))).unwrap(), 1);
        assert_eq!(ep.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    }

    #[test]
    fn modify_delete_and_errors() {
        let (a, b) = pair();
        let ep = Epoll::new().unwrap();
        let mut events = Events::with_capacity(4);
        ep.add(b.as_raw_fd(), 7, Interest::READ).unwrap();
        assert_eq!(ep.add(b.as_raw_fd(), 7, Interest::READ).unwrap_err().raw_os_error(), Some(libc::EEXIST));
        // A fresh TCP socket is writable at once.
        ep.modify(b.as_raw_fd(), 9, Interest::READ_WRITE).unwrap();
        assert_eq!(ep.wait(&mut events, Some(Duration::from_secs(5))).unwrap(), 1);
        let ev = events.iter().next().unwrap();
        assert_eq!((ev.token, ev.writable, ev.readable), (9, true, false));
        ep.delete(b.as_raw_fd()).unwrap();
        assert_eq!(ep.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        assert_eq!(ep.delete(b.as_raw_fd()).unwrap_err().raw_os_error(), Some(libc::ENOENT));
        assert_eq!(ep.modify(a.as_raw_fd(), 1, Interest::READ).unwrap_err().raw_os_error(), Some(libc::ENOENT));
        assert_eq!(ep.add(-1, 1, Interest::READ).unwrap_err().raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn peer_half_close_is_hup_and_readable() {
        let (a, b) = pair();
        let ep = Epoll::new().unwrap();
        ep.add(b.as_raw_fd(), 3, Interest::READ).unwrap();
        a.shutdown(Shutdown::Write).unwrap();
        let mut events = Events::with_capacity(4);
        assert_eq!(ep.wait(&mut events, Some(Duration::from_secs(5))).unwrap(), 1);
        let ev = events.iter().next().unwrap();
        assert!(ev.hup && ev.readable, "{ev:?}");
    }

    #[test]
    fn capacity_bounds_events_per_wait() {
        let ep = Epoll::new().unwrap();
        let pairs: Vec<_> = (0..3).map(|_| pair()).collect();
        for (i, (_, b)) in pairs.iter().enumerate() {
            ep.add(b.as_raw_fd(), i as u64, Interest::WRITE).unwrap();
        }
        let mut events = Events::with_capacity(2);
        assert_eq!(events.capacity(), 2);
        assert_eq!(ep.wait(&mut events, Some(Duration::from_secs(5))).unwrap(), 2);
        assert_eq!(events.len(), 2);
        let mut all = Events::with_capacity(0);
        assert_eq!(all.capacity(), 1);
        assert_eq!(ep.wait(&mut all, Some(Duration::from_secs(5))).unwrap(), 1);
    }

    #[test]
    fn wait_from_another_thread_sees_registration() {
        let ep = std::sync::Arc::new(Epoll::new().unwrap());
        let (mut a, b) = pair();
        let ep2 = ep.clone();
        let waiter = std::thread::spawn(move || {
            let mut events = Events::with_capacity(4);
            let n = ep2.wait(&mut events, Some(Duration::from_secs(10))).unwrap();
            let token = events.iter().next().map(|e| e.token);
            (n, token)
        });
        ep.add(b.as_raw_fd(), 77, Interest::READ).unwrap();
        a.write_all(b"go").unwrap();
        assert_eq!(waiter.join().unwrap(), (1, Some(77)));
    }
}
