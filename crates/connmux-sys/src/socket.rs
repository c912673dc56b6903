//! Socket calls on borrowed fds: reads, vectored non-blocking sends without `SIGPIPE`,
//! socket options, the checks AF_KCM makes before attaching a TCP socket, and
//! aborting a connection with a reset.
//!
//! Every function takes a [`RawFd`] the caller keeps open for the duration of the
//! call; a closed or foreign fd number is reported by the kernel (`EBADF`,
//! `ENOTSOCK`), never undefined behaviour.

use std::io::{self, IoSlice};
use std::os::fd::RawFd;
use std::time::Duration;

use crate::util::{cvt, cvt_size, retry_eintr};

/// TCP states as numbered in the kernel's `include/net/tcp_states.h` (not in libc).
const TCP_CLOSE: u8 = 7;
const TCP_LISTEN: u8 = 10;

/// `recvfrom(2)` with no address, through `syscall(2)`, not libc's wrapper:
/// the wrapper is a thread-cancellation point and brackets every call with
/// two libc calls that switch asynchronous cancellation on and off
/// (`docs/performance.md` counts them); nothing here uses `pthread_cancel`.
///
/// # Safety
/// As `recv(2)`: `buf` must be valid for writes of `len` bytes.
unsafe fn raw_recv(fd: RawFd, buf: *mut libc::c_void, len: usize, flags: libc::c_int) -> libc::ssize_t {
    // SAFETY: the caller's contract is recv(2)'s; no address is asked for.
    unsafe {
        libc::syscall(
            libc::SYS_recvfrom,
            fd as libc::c_long,
            buf,
            len,
            flags as libc::c_long,
            std::ptr::null_mut::<libc::sockaddr>(),
            std::ptr::null_mut::<libc::socklen_t>(),
        ) as libc::ssize_t
    }
}

/// Reads from a socket into `buf` (`recv(2)` with `MSG_DONTWAIT`: never
/// blocks, whatever the descriptor's `O_NONBLOCK`);
/// 0 means end of stream (or an empty `buf`); nothing to read is
/// `WouldBlock`. Costs what `read(2)` does.
#[inline]
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    retry_eintr(|| {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
        cvt_size(unsafe { raw_recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) })
    })
}

/// Reads at most `max` bytes from a socket onto the end of `buf` (as [`read`],
/// never blocking, into its spare capacity, which grows to `max` first if
/// smaller): the bytes land where they will be used, with no copy and no
/// zeroing. Returns the bytes read (0: end of stream, or `max == 0`); `buf`
/// is unchanged on error.
pub fn read_into(fd: RawFd, buf: &mut bytes::BytesMut, max: usize) -> io::Result<usize> {
    if buf.capacity() - buf.len() < max {
        buf.reserve(max);
    }
    let spare = buf.spare_capacity_mut();
    let want = max.min(spare.len());
    let n = retry_eintr(|| {
        // SAFETY: the kernel writes at most `want` bytes, all within the spare
        // capacity (`want <= spare.len()`); it never reads them.
        cvt_size(unsafe { raw_recv(fd, spare.as_mut_ptr().cast(), want, libc::MSG_DONTWAIT) })
    })?;
    let n = n.min(want);
    // SAFETY: the first `n` bytes of the spare capacity were written by `read`.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// Sends the bytes of `bufs` in order with one `sendmsg(MSG_NOSIGNAL | MSG_DONTWAIT)`:
/// never blocks, never raises `SIGPIPE` (a closed peer is `EPIPE`). Returns how many
/// bytes the kernel took, which may be fewer than offered (then the caller keeps the
/// rest); nothing taken is `WouldBlock`. At most `UIO_MAXIOV` (1024) slices are sent
/// per call.
#[inline]
pub fn writev(fd: RawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    sendmsg_flags(fd, bufs, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
}

/// `sendmsg(2)` without an address or control data, with `flags` as given.
#[inline]
pub(crate) fn sendmsg_flags(fd: RawFd, bufs: &[IoSlice<'_>], flags: libc::c_int) -> io::Result<usize> {
    if let [one] = bufs {
        // One slice: `sendto` with no address, which spares the kernel
        // copying a `msghdr` and importing an iovec array (the common case:
        // a read's replies written from one buffer).
        return retry_eintr(|| {
            // SAFETY: the kernel reads at most `one.len()` bytes from `one`, a
            // live borrowed slice, for the call; no address is passed.
            cvt_size(unsafe {
                libc::syscall(
                    libc::SYS_sendto,
                    fd as libc::c_long,
                    one.as_ptr(),
                    one.len(),
                    flags as libc::c_long,
                    std::ptr::null::<libc::sockaddr>(),
                    0 as libc::c_long,
                ) as libc::ssize_t
            })
        });
    }
    let iovlen = bufs.len().min(libc::UIO_MAXIOV as usize);
    // SAFETY: msghdr is plain data; all-zero is "no name, no iov, no control".
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is guaranteed ABI-compatible with `struct iovec` on Unix; the kernel only
    // reads through msg_iov.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iovlen as _;
    retry_eintr(|| {
        // SAFETY: `msg` points at `iovlen` live iovecs borrowed from `bufs` for the call.
        // (Through `syscall(2)`, not libc's cancellable wrapper: see `raw_recv`.)
        cvt_size(unsafe {
            libc::syscall(libc::SYS_sendmsg, fd as libc::c_long, &msg as *const libc::msghdr, flags as libc::c_long)
                as libc::ssize_t
        })
    })
}

/// Reads and clears the socket's pending error (`SO_ERROR`): `None` when there is none,
/// else the errno value (such as `ECONNRESET`).
pub fn take_error(fd: RawFd) -> io::Result<Option<i32>> {
    let err = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)?;
    Ok(if err == 0 { None } else { Some(err) })
}

/// Sets or clears `O_NONBLOCK` (`ioctl(FIONBIO)`, one system call).
pub fn set_nonblocking(fd: RawFd, nonblocking: bool) -> io::Result<()> {
    let mut on: libc::c_int = nonblocking.into();
    // SAFETY: FIONBIO reads one int from a live local.
    cvt(unsafe { libc::ioctl(fd, libc::FIONBIO, &mut on) })?;
    Ok(())
}

/// Whether `O_NONBLOCK` is set.
pub fn is_nonblocking(fd: RawFd) -> io::Result<bool> {
    // SAFETY: F_GETFL takes no pointer argument.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    Ok(flags & libc::O_NONBLOCK != 0)
}

/// Sets `TCP_NODELAY` (disable Nagle: small messages go out at once).
pub fn set_nodelay(fd: RawFd, nodelay: bool) -> io::Result<()> {
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, nodelay.into())
}

/// Reads `TCP_NODELAY`.
pub fn nodelay(fd: RawFd) -> io::Result<bool> {
    Ok(getsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY)? != 0)
}

/// Asks for a receive buffer of `bytes` (`SO_RCVBUF`; values above `i32::MAX` are
/// clamped). The kernel doubles the value for bookkeeping and caps it at
/// `net.core.rmem_max`; read the result with [`rcvbuf`].
pub fn set_rcvbuf(fd: RawFd, bytes: usize) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, clamp_int(bytes))
}

/// Asks for a send buffer of `bytes` (`SO_SNDBUF`), as for [`set_rcvbuf`].
pub fn set_sndbuf(fd: RawFd, bytes: usize) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, clamp_int(bytes))
}

/// The receive buffer size as the kernel reports it (`SO_RCVBUF`, already doubled).
pub fn rcvbuf(fd: RawFd) -> io::Result<usize> {
    Ok(getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?.max(0) as usize)
}

/// The send buffer size as the kernel reports it (`SO_SNDBUF`, already doubled).
pub fn sndbuf(fd: RawFd) -> io::Result<usize> {
    Ok(getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)?.max(0) as usize)
}

/// The receive timeout (`SO_RCVTIMEO`); `None` when it is 0, meaning "block forever".
pub fn rcvtimeo(fd: RawFd) -> io::Result<Option<Duration>> {
    get_timeout(fd, libc::SO_RCVTIMEO)
}

/// Sets the receive timeout (`SO_RCVTIMEO`); `None` or zero means "block forever".
/// The kernel keeps it in scheduler ticks, rounding up (a 1 µs timeout reads back as
/// one tick, such as 4 ms).
pub fn set_rcvtimeo(fd: RawFd, timeout: Option<Duration>) -> io::Result<()> {
    set_timeout(fd, libc::SO_RCVTIMEO, timeout)
}

/// The send timeout (`SO_SNDTIMEO`); `None` when it is 0, meaning "block forever".
pub fn sndtimeo(fd: RawFd) -> io::Result<Option<Duration>> {
    get_timeout(fd, libc::SO_SNDTIMEO)
}

/// Sets the send timeout (`SO_SNDTIMEO`); `None` or zero means "block forever".
pub fn set_sndtimeo(fd: RawFd, timeout: Option<Duration>) -> io::Result<()> {
    set_timeout(fd, libc::SO_SNDTIMEO, timeout)
}

fn get_timeout(fd: RawFd, name: libc::c_int) -> io::Result<Option<Duration>> {
    let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
    // SAFETY: timeval is plain data; we view it as bytes only for the kernel to fill.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(
            (&mut tv as *mut libc::timeval).cast::<u8>(),
            std::mem::size_of::<libc::timeval>(),
        )
    };
    getsockopt_raw(fd, libc::SOL_SOCKET, name, bytes)?;
    if tv.tv_sec == 0 && tv.tv_usec == 0 {
        return Ok(None);
    }
    Ok(Some(Duration::new(tv.tv_sec.max(0) as u64, (tv.tv_usec.max(0) as u32) * 1000)))
}

fn set_timeout(fd: RawFd, name: libc::c_int, timeout: Option<Duration>) -> io::Result<()> {
    let tv = match timeout {
        None => libc::timeval { tv_sec: 0, tv_usec: 0 },
        Some(d) => {
            // Round a sub-microsecond timeout up, so it does not become "forever".
            // time_t and suseconds_t are 64-bit on x86_64 with glibc and musl alike.
            let mut usec = i64::from(d.subsec_nanos().div_ceil(1000));
            let mut sec = d.as_secs().min(i64::MAX as u64 - 1) as i64;
            if usec == 1_000_000 {
                sec += 1;
                usec = 0;
            }
            libc::timeval { tv_sec: sec as _, tv_usec: usec as _ }
        }
    };
    // SAFETY: timeval is plain data; the kernel only reads these bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts((&tv as *const libc::timeval).cast::<u8>(), std::mem::size_of::<libc::timeval>())
    };
    setsockopt_raw(fd, libc::SOL_SOCKET, name, bytes)
}

/// The checks AF_KCM's `SIOCKCMATTACH` makes on the socket to attach, in the
/// kernel's order (`kcm_attach_ioctl`, `kcm_attach`):
/// - `fd` is not an open socket (`EBADF`, `ENOTSOCK`): `ENOENT`, as KCM reports a
///   failed socket lookup;
/// - not AF_INET/AF_INET6, not `SOCK_STREAM`, or not `IPPROTO_TCP`: `EOPNOTSUPP`;
/// - TCP state LISTEN or CLOSE (never connected, or fully closed): `EOPNOTSUPP`.
///
/// Other states, including SYN_SENT and CLOSE_WAIT, are accepted, as in the kernel.
pub fn tcp_check_attachable(fd: RawFd) -> io::Result<()> {
    let not_supported = || io::Error::from_raw_os_error(libc::EOPNOTSUPP);
    let domain = match getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN) {
        Ok(d) => d,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::ENOTSOCK)) => {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        Err(e) => return Err(e),
    };
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(not_supported());
    }
    if getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err(not_supported());
    }
    if getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL)? != libc::IPPROTO_TCP {
        return Err(not_supported());
    }
    let state = tcp_state(fd)?;
    if state == TCP_LISTEN || state == TCP_CLOSE {
        return Err(not_supported());
    }
    Ok(())
}

/// The TCP state number (`TCP_INFO.tcpi_state`: 1 ESTABLISHED … 7 CLOSE, 8
/// CLOSE_WAIT, 10 LISTEN, as in the kernel's `tcp_states.h`).
pub fn tcp_state(fd: RawFd) -> io::Result<u8> {
    // tcpi_state is the first byte of struct tcp_info; the kernel copies
    // min(optlen, sizeof(tcp_info)) bytes, so a short buffer is enough.
    let mut info = [0u8; 8];
    let n = getsockopt_raw(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info)?;
    if n == 0 {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    Ok(info[0])
}

/// Sends FIN after the data already queued (`shutdown(SHUT_WR)`); reading goes on.
pub fn shutdown_write(fd: RawFd) -> io::Result<()> {
    // SAFETY: shutdown takes no pointers.
    cvt(unsafe { libc::shutdown(fd, libc::SHUT_WR) })?;
    Ok(())
}

/// Aborts a TCP connection: the peer sees a reset (`ECONNRESET`) at once, and
/// queued unsent data is dropped.
///
/// How: `SO_LINGER` {on, 0} (so that closing the fd resets rather than sends FIN,
/// whatever happens next), then `connect(AF_UNSPEC)`, which `connect(2)` documents as
/// dissolving a TCP association; the kernel (`tcp_disconnect`) sends the RST then.
/// Locally the socket moves to CLOSE, epoll reports `error` and `hup`, the next read
/// or [`take_error`] gives `ECONNRESET` (a socket that had not reached a state that
/// needs a reset, such as one already closed by both sides, gets no error). The fd
/// stays open until the caller closes it. If the disconnect is refused (not a TCP
/// socket), both directions are shut down instead and the reset waits for close.
pub fn abort(fd: RawFd) -> io::Result<()> {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: linger is plain data; the kernel only reads these bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts((&linger as *const libc::linger).cast::<u8>(), std::mem::size_of::<libc::linger>())
    };
    setsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_LINGER, bytes)?;
    // SAFETY: sockaddr is plain data; all-zero with sa_family AF_UNSPEC is the
    // "dissolve" address connect(2) describes.
    let mut addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    addr.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: passes a live sockaddr and its exact size.
    let r = unsafe { libc::connect(fd, &addr, std::mem::size_of::<libc::sockaddr>() as libc::socklen_t) };
    if cvt(r).is_ok() {
        return Ok(());
    }
    // SAFETY: shutdown takes no pointers.
    match cvt(unsafe { libc::shutdown(fd, libc::SHUT_RDWR) }) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Bytes received and not yet read (`ioctl(SIOCINQ)`).
pub fn inq(fd: RawFd) -> io::Result<usize> {
    ioctl_int(fd, libc::FIONREAD) // SIOCINQ is FIONREAD
}

/// Bytes written and not yet acknowledged by the peer (`ioctl(SIOCOUTQ)`).
pub fn outq(fd: RawFd) -> io::Result<usize> {
    ioctl_int(fd, libc::TIOCOUTQ) // SIOCOUTQ is TIOCOUTQ
}

fn ioctl_int(fd: RawFd, request: libc::Ioctl) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: these requests write one int into a live local.
    cvt(unsafe { libc::ioctl(fd, request, &mut n) })?;
    Ok(n.max(0) as usize)
}

fn clamp_int(v: usize) -> libc::c_int {
    v.min(libc::c_int::MAX as usize) as libc::c_int
}

/// `getsockopt` of an `int` option.
pub fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut buf = [0u8; 4];
    getsockopt_raw(fd, level, name, &mut buf)?;
    Ok(libc::c_int::from_ne_bytes(buf))
}

/// `setsockopt` of an `int` option.
pub fn setsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    setsockopt_raw(fd, level, name, &value.to_ne_bytes())
}

/// `getsockopt` into `buf`, with `optlen = buf.len()`; returns the length the kernel
/// wrote back (it may be shorter than `buf`). Any level and option name, so callers can
/// see exactly the kernel's answer (such as `EINVAL` or `ENOPROTOOPT`).
pub fn getsockopt_raw(fd: RawFd, level: libc::c_int, name: libc::c_int, buf: &mut [u8]) -> io::Result<usize> {
    let mut len = buf.len().min(libc::socklen_t::MAX as usize) as libc::socklen_t;
    // SAFETY: the kernel writes at most `len <= buf.len()` bytes into `buf` and updates `len`.
    cvt(unsafe { libc::getsockopt(fd, level, name, buf.as_mut_ptr().cast(), &mut len) })?;
    Ok(len as usize)
}

/// `setsockopt` with the bytes of `value` and `optlen = value.len()`; any level, any
/// length, so callers can probe the kernel's checks (a short `optlen` gives `EINVAL`).
pub fn setsockopt_raw(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &[u8]) -> io::Result<()> {
    let len = value.len().min(libc::socklen_t::MAX as usize) as libc::socklen_t;
    // SAFETY: the kernel reads at most `len <= value.len()` bytes from `value`.
    cvt(unsafe { libc::setsockopt(fd, level, name, value.as_ptr().cast(), len) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epoll::{Epoll, Events, Interest};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream, UdpSocket};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    /// An fd number above any open file limit: never open.
    const NEVER_OPEN: RawFd = 1 << 30;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
        r.unwrap_err().raw_os_error().unwrap()
    }

    #[test]
    fn read_into_appends_at_most_max_to_the_buffer() {
        let (mut a, b) = pair();
        set_nonblocking(b.as_raw_fd(), true).unwrap();
        let mut buf = bytes::BytesMut::new();
        buf.extend_from_slice(b"ab");
        assert_eq!(read_into(b.as_raw_fd(), &mut buf, 10).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert_eq!(&buf[..], b"ab", "unchanged on error");
        a.write_all(b"0123456789abcdef").unwrap();
        assert!(crate::poll::poll_readable(b.as_raw_fd(), Some(Duration::from_secs(5))).unwrap());
        assert_eq!(read_into(b.as_raw_fd(), &mut buf, 10).unwrap(), 10);
        assert_eq!(&buf[..], b"ab0123456789");
        assert_eq!(read_into(b.as_raw_fd(), &mut buf, 0).unwrap(), 0);
        assert_eq!(read_into(b.as_raw_fd(), &mut buf, 100).unwrap(), 6);
        assert_eq!(&buf[..], b"ab0123456789abcdef");
        drop(a);
        assert_eq!(read_into(b.as_raw_fd(), &mut buf, 100).unwrap(), 0, "end of stream");
    }

    #[test]
    fn read_and_writev_move_bytes_in_order() {
        let (a, b) = pair();
        set_nonblocking(b.as_raw_fd(), true).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(read(b.as_raw_fd(), &mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        let parts = [IoSlice::new(b"head-"), IoSlice::new(b""), IoSlice::new(b"body-"), IoSlice::new(b"tail")];
        assert_eq!(writev(a.as_raw_fd(), &parts).unwrap(), 14);
        assert!(crate::poll::poll_readable(b.as_raw_fd(), Some(Duration::from_secs(5))).unwrap());
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 14 && Instant::now() < deadline {
            match read(b.as_raw_fd(), &mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, b"head-body-tail");
        drop(a);
        assert!(crate::poll::poll_readable(b.as_raw_fd(), Some(Duration::from_secs(5))).unwrap());
        assert_eq!(read(b.as_raw_fd(), &mut buf).unwrap(), 0);
    }

    #[test]
    fn writev_does_not_block_and_reports_partial_sends() {
        let (a, _b) = pair();
        set_sndbuf(a.as_raw_fd(), 4096).unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let mut total = 0usize;
        let mut saw_would_block = false;
        // The peer never reads: the send buffer and the peer's window fill up.
        for _ in 0..10_000 {
            match writev(a.as_raw_fd(), &[IoSlice::new(&chunk)]) {
                Ok(n) => {
                    assert!(n <= chunk.len());
                    total += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    saw_would_block = true;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(saw_would_block, "a blocking socket must not block writev (sent {total})");
        assert!(!is_nonblocking(a.as_raw_fd()).unwrap(), "writev must not change the fd's mode");
    }

    #[test]
    fn writev_to_reset_peer_is_epipe_or_reset_without_sigpipe() {
        let (a, b) = pair();
        set_nodelay(a.as_raw_fd(), true).unwrap();
        abort(b.as_raw_fd()).unwrap();
        drop(b);
        // Give the RST time to arrive; a SIGPIPE would kill the test process.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = None;
        while Instant::now() < deadline {
            match writev(a.as_raw_fd(), &[IoSlice::new(b"x")]) {
                Ok(_) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    last = e.raw_os_error();
                    break;
                }
            }
        }
        assert!(matches!(last, Some(libc::EPIPE | libc::ECONNRESET)), "{last:?}");
    }

    #[test]
    fn abort_resets_the_peer_at_once() {
        let (a, mut b) = pair();
        b.write_all(b"unread by a").unwrap();
        a.set_nonblocking(false).unwrap();
        abort(a.as_raw_fd()).unwrap();
        // Before `a` is closed, the peer already sees the reset.
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        let err = b.read(&mut buf).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ECONNRESET));
        // Locally: state CLOSE, the error is pending, epoll reports error+hup.
        assert_eq!(tcp_state(a.as_raw_fd()).unwrap(), TCP_CLOSE);
        let ep = Epoll::new().unwrap();
        ep.add(a.as_raw_fd(), 1, Interest::READ).unwrap();
        let mut events = Events::with_capacity(2);
        assert_eq!(ep.wait(&mut events, Some(Duration::from_secs(5))).unwrap(), 1);
        let ev = events.iter().next().unwrap();
        assert!(ev.error && ev.hup, "{ev:?}");
        assert_eq!(take_error(a.as_raw_fd()).unwrap(), Some(libc::ECONNRESET));
        assert_eq!(take_error(a.as_raw_fd()).unwrap(), None);
        assert_eq!(errno(tcp_check_attachable(a.as_raw_fd())), libc::EOPNOTSUPP);
    }

    #[test]
    fn abort_of_a_non_tcp_socket_shuts_it_down() {
        let (u1, mut u2) = UnixStream::pair().unwrap();
        // SO_LINGER is accepted on any socket; the disconnect is refused, shutdown runs.
        abort(u1.as_raw_fd()).unwrap();
        let mut buf = [0u8; 4];
        u2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(u2.read(&mut buf).unwrap(), 0);
        assert_eq!(errno(abort(NEVER_OPEN)), libc::EBADF);
    }

    #[test]
    fn take_error_reports_refused_connect() {
        // A port nobody listens on: bind one, learn it, close it.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // SAFETY: plain socket() call; the result is checked and owned below.
        let fd =
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh socket we own.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes([127, 0, 0, 1]) },
            sin_zero: [0; 8],
        };
        // SAFETY: passes a live sockaddr_in and its size.
        let r = unsafe {
            libc::connect(
                sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_in).cast(),
                std::mem::size_of_val(&addr) as u32,
            )
        };
        assert!(r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EINPROGRESS));
        let ep = Epoll::new().unwrap();
        ep.add(sock.as_raw_fd(), 0, Interest::WRITE).unwrap();
        let mut events = Events::with_capacity(1);
        assert_eq!(ep.wait(&mut events, Some(Duration::from_secs(5))).unwrap(), 1);
        assert_eq!(take_error(sock.as_raw_fd()).unwrap(), Some(libc::ECONNREFUSED));
        assert_eq!(take_error(sock.as_raw_fd()).unwrap(), None);
    }

    #[test]
    fn options_round_trip() {
        let (a, _b) = pair();
        let fd = a.as_raw_fd();
        set_nonblocking(fd, true).unwrap();
        assert!(is_nonblocking(fd).unwrap());
        set_nonblocking(fd, false).unwrap();
        assert!(!is_nonblocking(fd).unwrap());

        set_nodelay(fd, true).unwrap();
        assert!(nodelay(fd).unwrap());
        set_nodelay(fd, false).unwrap();
        assert!(!nodelay(fd).unwrap());

        // The kernel doubles the value it is given (see socket(7)).
        set_rcvbuf(fd, 16 * 1024).unwrap();
        assert_eq!(rcvbuf(fd).unwrap(), 32 * 1024);
        set_sndbuf(fd, 16 * 1024).unwrap();
        assert_eq!(sndbuf(fd).unwrap(), 32 * 1024);

        assert_eq!(rcvtimeo(fd).unwrap(), None);
        set_rcvtimeo(fd, Some(Duration::from_millis(1500))).unwrap();
        assert_eq!(rcvtimeo(fd).unwrap(), Some(Duration::from_millis(1500)));
        set_rcvtimeo(fd, Some(Duration::from_nanos(1))).unwrap();
        // Not "forever": the kernel keeps timeouts in scheduler ticks and rounds up.
        let tick = rcvtimeo(fd).unwrap().unwrap();
        assert!(tick >= Duration::from_micros(1) && tick <= Duration::from_millis(10), "{tick:?}");
        set_rcvtimeo(fd, None).unwrap();
        assert_eq!(rcvtimeo(fd).unwrap(), None);
        set_sndtimeo(fd, Some(Duration::from_secs(2))).unwrap();
        assert_eq!(sndtimeo(fd).unwrap(), Some(Duration::from_secs(2)));
        // std's own view agrees with ours.
        assert_eq!(a.write_timeout().unwrap(), Some(Duration::from_secs(2)));

        assert_eq!(errno(set_nodelay(NEVER_OPEN, true)), libc::EBADF);
        let efd = crate::eventfd::EventFd::new().unwrap();
        assert_eq!(errno(rcvbuf(efd.as_raw_fd())), libc::ENOTSOCK);
    }

    #[test]
    fn raw_sockopts_pass_the_kernel_answers_through() {
        let (a, _b) = pair();
        let fd = a.as_raw_fd();
        // An int option with optlen 2 is refused by the kernel.
        assert_eq!(errno(setsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &[0, 1])), libc::EINVAL);
        // An unknown TCP option.
        assert_eq!(errno(setsockopt_int(fd, libc::IPPROTO_TCP, 9999, 1)), libc::ENOPROTOOPT);
        // SOL_KCM on a TCP socket: TCP does not know the level at all.
        let r = setsockopt_int(fd, 281, 1, 1);
        assert!(r.is_err());
        let mut big = [0u8; 16];
        assert_eq!(getsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_TYPE, &mut big).unwrap(), 4);
        assert_eq!(i32::from_ne_bytes(big[..4].try_into().unwrap()), libc::SOCK_STREAM);
    }

    #[test]
    fn inq_and_outq_count_queued_bytes() {
        let (mut a, b) = pair();
        assert_eq!(inq(b.as_raw_fd()).unwrap(), 0);
        a.write_all(&[1u8; 1000]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while inq(b.as_raw_fd()).unwrap() < 1000 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(inq(b.as_raw_fd()).unwrap(), 1000);
        let mut buf = [0u8; 400];
        (&b).read_exact(&mut buf).unwrap();
        assert_eq!(inq(b.as_raw_fd()).unwrap(), 600);
        // On loopback the ACK comes quickly: outq drains to 0.
        while outq(a.as_raw_fd()).unwrap() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(outq(a.as_raw_fd()).unwrap(), 0);
        assert_eq!(errno(inq(NEVER_OPEN)), libc::EBADF);
    }

    #[test]
    fn shutdown_write_sends_fin_but_keeps_reading() {
        let (mut a, mut b) = pair();
        shutdown_write(a.as_raw_fd()).unwrap();
        let mut buf = [0u8; 8];
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(b.read(&mut buf).unwrap(), 0);
        b.write_all(b"late").unwrap();
        a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        a.read_exact(&mut buf[..4]).unwrap();
        assert_eq!(&buf[..4], b"late");
        // The peer's state is CLOSE_WAIT (8), which KCM still accepts.
        assert_eq!(tcp_state(b.as_raw_fd()).unwrap(), 8);
        tcp_check_attachable(b.as_raw_fd()).unwrap();
    }

    #[test]
    fn attachable_only_connected_tcp() {
        let (a, _b) = pair();
        tcp_check_attachable(a.as_raw_fd()).unwrap();
        assert_eq!(tcp_state(a.as_raw_fd()).unwrap(), 1); // ESTABLISHED

        // IPv6 loopback, where the machine has it.
        if let Ok(l6) = TcpListener::bind("[::1]:0") {
            let c6 = TcpStream::connect(l6.local_addr().unwrap()).unwrap();
            tcp_check_attachable(c6.as_raw_fd()).unwrap();
            assert_eq!(errno(tcp_check_attachable(l6.as_raw_fd())), libc::EOPNOTSUPP);
        }

        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(errno(tcp_check_attachable(l.as_raw_fd())), libc::EOPNOTSUPP);

        // A TCP socket never connected is in state CLOSE.
        // SAFETY: plain socket() call; the result is checked and owned below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh socket we own.
        let fresh = unsafe { OwnedFd::from_raw_fd(fd) };
        assert_eq!(errno(tcp_check_attachable(fresh.as_raw_fd())), libc::EOPNOTSUPP);

        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.connect(udp.local_addr().unwrap()).unwrap();
        assert_eq!(errno(tcp_check_attachable(udp.as_raw_fd())), libc::EOPNOTSUPP);

        let (u1, _u2) = UnixStream::pair().unwrap();
        assert_eq!(errno(tcp_check_attachable(u1.as_raw_fd())), libc::EOPNOTSUPP);

        // Not a socket, or not open: ENOENT, as KCM's failed lookup.
        let efd = crate::eventfd::EventFd::new().unwrap();
        assert_eq!(errno(tcp_check_attachable(efd.as_raw_fd())), libc::ENOENT);
        assert_eq!(errno(tcp_check_attachable(NEVER_OPEN)), libc::ENOENT);
        assert_eq!(errno(tcp_check_attachable(-1)), libc::ENOENT);
    }
}
