//! The kernel's AF_KCM (Kernel Connection Multiplexor), for the kernel backend and for
//! checking our semantics against the real thing (`Documentation/networking/kcm.rst`,
//! `include/uapi/linux/kcm.h`).
//!
//! A KCM socket is created with [`kcm_socket`]; that also creates its mux. TCP
//! sockets are attached to the mux with [`kcm_attach`] together with a BPF
//! `SOCKET_FILTER` program (the parser) that returns each message's length; more
//! KCM sockets on the same mux come from [`kcm_clone`]. Messages are then sent and
//! received whole with [`sendmsg`]/[`recvmsg`] and the batched forms.
//!
//! Kernels built without `CONFIG_AF_KCM` (such as the one these tests usually run
//! on) answer `socket(AF_KCM, …)` with `EAFNOSUPPORT`; everything else here then
//! has nothing to act on.
//!
//! The message calls ([`sendmsg`], [`recvmsg`], [`sendmmsg`], [`recvmmsg`]) are plain
//! socket calls and work on any socket; they pass `flags` through unchanged, so a
//! caller that does not want `SIGPIPE` must include `MSG_NOSIGNAL`.

use std::io::{self, IoSlice};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use crate::util::{cvt, cvt_size};

/// Address family of KCM sockets.
pub const AF_KCM: libc::c_int = 41;
/// Protocol family, same number as [`AF_KCM`].
pub const PF_KCM: libc::c_int = AF_KCM;
/// Socket option level of KCM's own options.
pub const SOL_KCM: libc::c_int = 281;
/// The only protocol `socket(AF_KCM, …)` accepts.
pub const KCMPROTO_CONNECTED: libc::c_int = 0;
/// `SIOCPROTOPRIVATE + 0`: attach a TCP socket with a parser program.
pub const SIOCKCMATTACH: libc::c_ulong = 0x89E0;
/// `SIOCPROTOPRIVATE + 1`: detach a TCP socket from the mux.
pub const SIOCKCMUNATTACH: libc::c_ulong = 0x89E1;
/// `SIOCPROTOPRIVATE + 2`: make another KCM socket on the same mux.
pub const SIOCKCMCLONE: libc::c_ulong = 0x89E2;
/// `SOL_KCM` option (int): non-zero stops this socket receiving messages.
pub const KCM_RECV_DISABLE: libc::c_int = 1;
/// Send flag: more messages follow, hold transmission (set by `sendmmsg` on all but
/// the last message).
pub const MSG_BATCH: libc::c_int = 0x40000;

/// `struct kcm_attach` from `linux/kcm.h`.
#[repr(C)]
struct KcmAttach {
    fd: libc::c_int,
    bpf_fd: libc::c_int,
}

/// `struct kcm_unattach` and `struct kcm_clone` from `linux/kcm.h`: one int.
#[repr(C)]
struct KcmFd {
    fd: libc::c_int,
}

/// Creates a KCM socket and its mux: `SOCK_SEQPACKET` when `seqpacket`, else
/// `SOCK_DGRAM`; close-on-exec, blocking. `EAFNOSUPPORT` where the kernel has no KCM.
pub fn kcm_socket(seqpacket: bool) -> io::Result<OwnedFd> {
    let ty = if seqpacket { libc::SOCK_SEQPACKET } else { libc::SOCK_DGRAM };
    kcm_socket_raw(ty | libc::SOCK_CLOEXEC, KCMPROTO_CONNECTED)
}

/// `socket(AF_KCM, ty, protocol)` with the arguments as given, to see the kernel's
/// checks (`ESOCKTNOSUPPORT` for a type other than DGRAM/SEQPACKET, then
/// `EPROTONOSUPPORT` for a protocol other than 0).
pub fn kcm_socket_raw(ty: libc::c_int, protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket() takes no pointers; a non-negative result is a new fd we own.
    let fd = cvt(unsafe { libc::socket(AF_KCM, ty, protocol) })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Attaches the TCP socket `tcp` to `kcm`'s mux with parser program `bpf_prog`
/// (`SIOCKCMATTACH`). The kernel keeps its own reference to both, so the caller may
/// close its fds afterwards. Errors as the kernel gives them: `ENOENT` when `tcp` is
/// not a socket, `EOPNOTSUPP` for a non-TCP or listening/closed socket, `EALREADY`
/// when `tcp` is attached already, `EINVAL`/`EBADF` for a bad program.
pub fn kcm_attach(kcm: RawFd, tcp: RawFd, bpf_prog: RawFd) -> io::Result<()> {
    let mut info = KcmAttach { fd: tcp, bpf_fd: bpf_prog };
    // SAFETY: SIOCKCMATTACH reads one struct kcm_attach from a live local.
    cvt(unsafe { libc::ioctl(kcm, SIOCKCMATTACH as _, &mut info) })?;
    Ok(())
}

/// Detaches `tcp` from `kcm`'s mux (`SIOCKCMUNATTACH`): `ENOENT` if it is not attached
/// to this mux, `EALREADY` if a detach is in progress.
pub fn kcm_unattach(kcm: RawFd, tcp: RawFd) -> io::Result<()> {
    let mut info = KcmFd { fd: tcp };
    // SAFETY: SIOCKCMUNATTACH reads one struct kcm_unattach from a live local.
    cvt(unsafe { libc::ioctl(kcm, SIOCKCMUNATTACH as _, &mut info) })?;
    Ok(())
}

/// Makes another KCM socket on `kcm`'s mux (`SIOCKCMCLONE`). As the kernel creates it,
/// the new fd is blocking and *not* close-on-exec, with default socket options.
pub fn kcm_clone(kcm: RawFd) -> io::Result<OwnedFd> {
    let mut info = KcmFd { fd: -1 };
    // SAFETY: SIOCKCMCLONE reads and writes one struct kcm_clone in a live local.
    cvt(unsafe { libc::ioctl(kcm, SIOCKCMCLONE as _, &mut info) })?;
    // SAFETY: on success the kernel installed a new fd in `info.fd`, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(info.fd) })
}

/// Sets `KCM_RECV_DISABLE`: a disabled socket gets no new messages, and the ones in its
/// queue move to the mux's other sockets.
pub fn kcm_set_recv_disable(kcm: RawFd, disable: bool) -> io::Result<()> {
    crate::socket::setsockopt_int(kcm, SOL_KCM, KCM_RECV_DISABLE, disable.into())
}

/// Reads `KCM_RECV_DISABLE`.
pub fn kcm_recv_disabled(kcm: RawFd) -> io::Result<bool> {
    Ok(crate::socket::getsockopt_int(kcm, SOL_KCM, KCM_RECV_DISABLE)? != 0)
}

/// `recvmsg(2)` of one message into `buf`; returns the bytes copied and the message
/// flags the kernel set (such as `MSG_TRUNC` when `buf` was too short, or `MSG_EOR`).
/// With `MSG_TRUNC` in `flags` the count is the message's full length.
pub fn recvmsg(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, libc::c_int)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is plain data; all-zero is "no name, no iov, no control".
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: `msg` points at one iovec covering `buf`, live for the call.
    let n = cvt_size(unsafe { libc::recvmsg(fd, &mut msg, flags) })?;
    Ok((n, msg.msg_flags))
}

/// `sendmsg(2)` of the bytes of `bufs` (at most `UIO_MAXIOV` slices) with `flags` as
/// given (`MSG_EOR`, `MSG_MORE`, `MSG_BATCH`, `MSG_DONTWAIT`, `MSG_NOSIGNAL`…); returns
/// the bytes the kernel took.
pub fn sendmsg(fd: RawFd, bufs: &[IoSlice<'_>], flags: libc::c_int) -> io::Result<usize> {
    crate::socket::sendmsg_flags(fd, bufs, flags)
}

/// `sendmmsg(2)`: each element of `msgs` is one message, all sent with `flags` (the
/// kernel adds `MSG_BATCH` to all but the last). Returns how many messages were sent.
pub fn sendmmsg(fd: RawFd, msgs: &[&[u8]], flags: libc::c_int) -> io::Result<usize> {
    let with_flags: Vec<(&[u8], libc::c_int)> = msgs.iter().map(|m| (*m, 0)).collect();
    sendmmsg_flags(fd, &with_flags, flags)
}

/// `sendmmsg(2)` where each message also carries its own `msg_flags`: the kernel honours
/// `MSG_EOR` there (so on `SOCK_SEQPACKET` some entries can leave a message open).
pub fn sendmmsg_flags(fd: RawFd, msgs: &[(&[u8], libc::c_int)], flags: libc::c_int) -> io::Result<usize> {
    // The kernel handles at most UIO_MAXIOV messages per call.
    let msgs = &msgs[..msgs.len().min(libc::UIO_MAXIOV as usize)];
    let mut iovs: Vec<libc::iovec> =
        msgs.iter().map(|(m, _)| libc::iovec { iov_base: m.as_ptr() as *mut _, iov_len: m.len() }).collect();
    let mut hdrs: Vec<libc::mmsghdr> = Vec::with_capacity(msgs.len());
    for (iov, (_, msg_flags)) in iovs.iter_mut().zip(msgs) {
        // SAFETY: msghdr is plain data; all-zero is "no name, no iov, no control".
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_iov = iov;
        hdr.msg_iovlen = 1;
        hdr.msg_flags = *msg_flags;
        hdrs.push(libc::mmsghdr { msg_hdr: hdr, msg_len: 0 });
    }
    // SAFETY: `hdrs` holds `hdrs.len()` headers, each pointing at one iovec in `iovs`
    // that covers a borrowed message; all live for the call. The kernel only reads the
    // payloads and writes `msg_len`.
    let n = cvt(unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), hdrs.len() as libc::c_uint, flags as _) })?;
    Ok(n as usize)
}

/// What [`recvmmsg`] learned about one received message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvMeta {
    /// Bytes copied into the buffer (the full length when `MSG_TRUNC` was asked for).
    pub len: usize,
    /// Message flags the kernel set (`MSG_TRUNC`, `MSG_EOR`…).
    pub flags: libc::c_int,
}

/// `recvmmsg(2)` without a timeout: receives up to `min(bufs.len(), meta.len())`
/// messages, message `i` into `bufs[i]`, its length and flags into `meta[i]`. Returns
/// the number received (blocking for the first unless `MSG_DONTWAIT`; with
/// `MSG_WAITFORONE` it returns as soon as one arrived and no more are queued).
pub fn recvmmsg(fd: RawFd, bufs: &mut [&mut [u8]], meta: &mut [RecvMeta], flags: libc::c_int) -> io::Result<usize> {
    let count = bufs.len().min(meta.len()).min(libc::UIO_MAXIOV as usize);
    let mut iovs: Vec<libc::iovec> =
        bufs[..count].iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
    let mut hdrs: Vec<libc::mmsghdr> = Vec::with_capacity(count);
    for iov in iovs.iter_mut() {
        // SAFETY: msghdr is plain data; all-zero is "no name, no iov, no control".
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_iov = iov;
        hdr.msg_iovlen = 1;
        hdrs.push(libc::mmsghdr { msg_hdr: hdr, msg_len: 0 });
    }
    // SAFETY: `hdrs` holds `count` headers, each pointing at one iovec that covers a
    // distinct, exclusively borrowed buffer; all live for the call; no timeout pointer.
    let n =
        cvt(unsafe { libc::recvmmsg(fd, hdrs.as_mut_ptr(), count as libc::c_uint, flags as _, std::ptr::null_mut()) })?
            as usize;
    for (m, h) in meta.iter_mut().zip(&hdrs[..n]) {
        *m = RecvMeta { len: h.msg_len as usize, flags: h.msg_hdr.msg_flags };
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixDatagram, UnixStream};
    use std::time::Duration;

    fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
        r.unwrap_err().raw_os_error().unwrap()
    }

    /// Whether this kernel has AF_KCM: the kcm module creates `/proc/net/kcm` when it
    /// loads, and `socket(AF_KCM)` loads it on demand, so ask after trying a socket.
    fn kernel_has_kcm() -> bool {
        let _ = kcm_socket(true);
        std::path::Path::new("/proc/net/kcm").exists()
    }

    fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: socketpair writes two fds into a live 2-element array.
        cvt(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })
            .unwrap();
        // SAFETY: both fds were just created and are owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn kcm_socket_matches_this_kernel() {
        let seq = kcm_socket(true);
        let dgram = kcm_socket(false);
        if kernel_has_kcm() {
            drop((seq.unwrap(), dgram.unwrap()));
            real_kcm::run_all();
        } else {
            // This machine's kernel (CONFIG_AF_KCM unset): exactly EAFNOSUPPORT.
            assert_eq!(errno(seq), libc::EAFNOSUPPORT);
            assert_eq!(errno(dgram), libc::EAFNOSUPPORT);
            assert_eq!(errno(kcm_socket_raw(libc::SOCK_STREAM, 0)), libc::EAFNOSUPPORT);
        }
    }

    #[test]
    fn kcm_calls_on_a_tcp_socket_are_refused() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let fd = c.as_raw_fd();
        // SIOCPROTOPRIVATE ioctls are unknown to TCP: ENOTTY.
        assert_eq!(errno(kcm_attach(fd, fd, -1)), libc::ENOTTY);
        assert_eq!(errno(kcm_clone(fd)), libc::ENOTTY);
        assert_eq!(errno(kcm_unattach(fd, fd)), libc::ENOTTY);
        // SOL_KCM is an unknown level for TCP: as measured on Linux 6.18, setsockopt
        // says ENOPROTOOPT and getsockopt EOPNOTSUPP.
        assert_eq!(errno(kcm_set_recv_disable(fd, true)), libc::ENOPROTOOPT);
        assert_eq!(errno(kcm_recv_disabled(fd)), libc::EOPNOTSUPP);
        assert_eq!(errno(kcm_clone(1 << 30)), libc::EBADF);
    }

    #[test]
    fn seqpacket_messages_keep_boundaries_eor_and_trunc() {
        let (a, b) = seqpacket_pair();
        let sent = sendmsg(
            a.as_raw_fd(),
            &[IoSlice::new(b"hello "), IoSlice::new(b"world")],
            libc::MSG_EOR | libc::MSG_NOSIGNAL,
        )
        .unwrap();
        assert_eq!(sent, 11);
        sendmsg(a.as_raw_fd(), &[IoSlice::new(b"second")], libc::MSG_EOR).unwrap();
        let mut buf = [0u8; 64];
        let (n, fl) = recvmsg(b.as_raw_fd(), &mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"hello world");
        // (AF_UNIX reports no MSG_EOR on receive; KCM SEQPACKET does.)
        assert!(fl & libc::MSG_TRUNC == 0, "flags {fl:#x}");
        // A short buffer truncates the message and says so; the rest is gone.
        let mut small = [0u8; 3];
        let (n, fl) = recvmsg(b.as_raw_fd(), &mut small, 0).unwrap();
        assert_eq!((n, &small[..]), (3, &b"sec"[..]));
        assert!(fl & libc::MSG_TRUNC != 0, "flags {fl:#x}");
        assert_eq!(errno(recvmsg(b.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT)), libc::EAGAIN);
        // MSG_TRUNC | MSG_PEEK reports the full length without consuming.
        sendmsg(a.as_raw_fd(), &[IoSlice::new(&[9u8; 40])], libc::MSG_EOR).unwrap();
        let (n, _) = recvmsg(b.as_raw_fd(), &mut small, libc::MSG_TRUNC | libc::MSG_PEEK).unwrap();
        assert_eq!(n, 40);
        let (n, _) = recvmsg(b.as_raw_fd(), &mut buf, 0).unwrap();
        assert_eq!(n, 40);
    }

    #[test]
    fn sendmmsg_and_recvmmsg_move_batches() {
        let (a, b) = UnixDatagram::pair().unwrap();
        let msgs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 10 + i as usize]).collect();
        let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
        assert_eq!(sendmmsg(a.as_raw_fd(), &refs, libc::MSG_NOSIGNAL).unwrap(), 5);
        let mut store = [[0u8; 12]; 6];
        let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
        let mut meta = [RecvMeta::default(); 6];
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = recvmmsg(b.as_raw_fd(), &mut bufs, &mut meta, libc::MSG_DONTWAIT).unwrap();
        assert_eq!(n, 5);
        for i in 0..5 {
            let want = 10 + i;
            let copied = want.min(12);
            assert_eq!(meta[i].len, copied);
            assert!(bufs[i][..copied].iter().all(|&x| x == i as u8));
            // Messages 3 and 4 (13 and 14 bytes) did not fit in 12.
            assert_eq!(meta[i].flags & libc::MSG_TRUNC != 0, want > 12, "msg {i}");
        }
        assert_eq!(meta[5], RecvMeta::default());
        assert_eq!(errno(recvmmsg(b.as_raw_fd(), &mut bufs, &mut meta, libc::MSG_DONTWAIT)), libc::EAGAIN);
    }

    #[test]
    fn sendmmsg_entry_flags_carry_eor_on_seqpacket() {
        // On SOCK_SEQPACKET the kernel honours MSG_EOR in an entry's own msg_flags; for
        // AF_UNIX every entry is a record anyway, so check what arrives is 3 records.
        let (a, b) = seqpacket_pair();
        let sent = sendmmsg_flags(
            a.as_raw_fd(),
            &[(b"one", libc::MSG_EOR), (b"two", 0), (b"three", libc::MSG_EOR)],
            libc::MSG_NOSIGNAL,
        )
        .unwrap();
        assert_eq!(sent, 3);
        let mut buf = [0u8; 16];
        let mut got = Vec::new();
        for _ in 0..3 {
            let (n, _) = recvmsg(b.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT).unwrap();
            got.push(buf[..n].to_vec());
        }
        assert_eq!(got, vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
    }

    #[test]
    fn sendmsg_without_nosignal_flag_is_passed_through() {
        // A closed peer: with MSG_NOSIGNAL the error is EPIPE and no signal is raised.
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        assert_eq!(errno(sendmsg(a.as_raw_fd(), &[IoSlice::new(b"x")], libc::MSG_NOSIGNAL)), libc::EPIPE);
    }

    /// Checks against a kernel that has AF_KCM (run in the kcmvm harness, scripts/kcmvm.sh:
    /// Debian's kernel).
    mod real_kcm {
        use super::*;
        use crate::socket::tcp_check_attachable;
        use std::io::{Read, Write};
        use std::net::UdpSocket;
        use std::os::fd::AsFd;
        use std::time::Instant;

        /// `r6 = r1; r0 = ld_abs_w[0]; r0 += 4; exit`: a 4-byte big-endian length
        /// header, then that many bytes. (Correct while each message starts a segment;
        /// see docs/kcmvm.md, "Parsers read from the segment", so the tests send one
        /// message at a time.)
        fn length_parser() -> OwnedFd {
            let insns: [[u8; 8]; 4] = [
                [0xbf, 0x16, 0, 0, 0, 0, 0, 0], // mov r6, r1
                [0x20, 0x00, 0, 0, 0, 0, 0, 0], // ld_abs_w r0 = pkt[0..4]
                [0x07, 0x00, 0, 0, 4, 0, 0, 0], // add r0, 4
                [0x95, 0x00, 0, 0, 0, 0, 0, 0], // exit
            ];
            crate::bpf::prog_load_socket_filter(&insns, "GPL").unwrap()
        }

        fn framed(body: &[u8]) -> Vec<u8> {
            let mut m = (body.len() as u32).to_be_bytes().to_vec();
            m.extend_from_slice(body);
            m
        }

        fn tcp_pair() -> (TcpStream, TcpStream) {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            (c, s)
        }

        fn recv_timeout(fd: RawFd, buf: &mut [u8]) -> (usize, i32) {
            assert!(crate::poll::poll_readable(fd, Some(Duration::from_secs(10))).unwrap(), "no message within 10 s");
            recvmsg(fd, buf, libc::MSG_DONTWAIT).unwrap()
        }

        pub(super) fn run_all() {
            socket_argument_checks();
            attach_checks_match_tcp_check_attachable();
            messages_both_ways_clone_and_recv_disable();
            eprintln!("real AF_KCM checks passed");
        }

        fn socket_argument_checks() {
            assert_eq!(errno(kcm_socket_raw(libc::SOCK_STREAM, 0)), libc::ESOCKTNOSUPPORT);
            assert_eq!(errno(kcm_socket_raw(libc::SOCK_DGRAM, 1)), libc::EPROTONOSUPPORT);
            // The type is checked first.
            assert_eq!(errno(kcm_socket_raw(libc::SOCK_STREAM, 1)), libc::ESOCKTNOSUPPORT);
            let k = kcm_socket(true).unwrap();
            let fd = k.as_raw_fd();
            assert!(!kcm_recv_disabled(fd).unwrap());
            // KCM_RECV_DISABLE: optlen below sizeof(int) is EINVAL; another name ENOPROTOOPT.
            assert_eq!(errno(crate::socket::setsockopt_raw(fd, SOL_KCM, KCM_RECV_DISABLE, &[1, 0])), libc::EINVAL);
            assert_eq!(errno(crate::socket::setsockopt_int(fd, SOL_KCM, 2, 1)), libc::ENOPROTOOPT);
            // SOL_SOCKET options go to the generic layer and work.
            crate::socket::set_rcvbuf(fd, 64 * 1024).unwrap();
            assert_eq!(crate::socket::rcvbuf(fd).unwrap(), 128 * 1024);
            // Unattach of something never attached.
            let (c, _s) = tcp_pair();
            assert_eq!(errno(kcm_unattach(fd, c.as_raw_fd())), libc::ENOENT);
        }

        /// For each kind of fd, the kernel's attach answer equals our userspace check.
        fn attach_checks_match_tcp_check_attachable() {
            let kcm = kcm_socket(true).unwrap();
            let prog = length_parser();
            let (c, s) = tcp_pair();
            let (c2, s2) = tcp_pair();
            drop(c2); // s2 is now CLOSE_WAIT
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            // SAFETY: plain socket() call; checked and owned below.
            let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
            assert!(raw >= 0);
            // SAFETY: a fresh socket we own.
            let unconnected = unsafe { OwnedFd::from_raw_fd(raw) };
            let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
            let (u1, _u2) = UnixStream::pair().unwrap();
            let efd = crate::eventfd::EventFd::new().unwrap();
            let cases: [(&str, RawFd); 8] = [
                ("established", s.as_raw_fd()),
                ("close_wait", s2.as_raw_fd()),
                ("listener", listener.as_raw_fd()),
                ("unconnected", unconnected.as_raw_fd()),
                ("udp", udp.as_raw_fd()),
                ("unix", u1.as_raw_fd()),
                ("eventfd", efd.as_raw_fd()),
                ("not open", 1 << 20),
            ];
            for (name, fd) in cases {
                let ours = tcp_check_attachable(fd).err().and_then(|e| e.raw_os_error());
                let kernel = kcm_attach(kcm.as_raw_fd(), fd, prog.as_raw_fd()).err().and_then(|e| e.raw_os_error());
                assert_eq!(ours, kernel, "{name}: ours {ours:?}, kernel {kernel:?}");
                eprintln!("attach {name}: {kernel:?} (same as ours)");
                if kernel.is_none() {
                    // Attached: a second attach is EALREADY, then detach.
                    assert_eq!(errno(kcm_attach(kcm.as_raw_fd(), fd, prog.as_raw_fd())), libc::EALREADY);
                    kcm_unattach(kcm.as_raw_fd(), fd).unwrap();
                    assert_eq!(errno(kcm_unattach(kcm.as_raw_fd(), fd)), libc::ENOENT);
                }
            }
            // A bad program fd.
            assert_eq!(errno(kcm_attach(kcm.as_raw_fd(), s.as_raw_fd(), 1 << 20)), libc::EBADF);
            drop(c);
        }

        fn messages_both_ways_clone_and_recv_disable() {
            let kcm = kcm_socket(true).unwrap();
            let k = kcm.as_raw_fd();
            let prog = length_parser();
            let (mut c, s) = tcp_pair();
            kcm_attach(k, s.as_raw_fd(), prog.as_raw_fd()).unwrap();
            drop(prog); // the kernel holds its own reference

            // Peer -> KCM: one whole message per recvmsg, with MSG_EOR on SEQPACKET.
            let mut buf = [0u8; 256];
            for body in [&b"hello"[..], &b"kernel connection multiplexor"[..]] {
                c.write_all(&framed(body)).unwrap();
                let (n, fl) = recv_timeout(k, &mut buf);
                assert_eq!(&buf[..n], &framed(body)[..]);
                assert!(fl & libc::MSG_EOR != 0, "flags {fl:#x}");
            }
            // A short buffer on SEQPACKET (kcm-semantics 1.10, confirmed on 6.1): the
            // message is dequeued anyway, so the rest is lost, flagged neither
            // MSG_EOR nor MSG_TRUNC.
            c.write_all(&framed(b"0123456789")).unwrap();
            let mut small = [0u8; 6];
            let (n, fl) = recv_timeout(k, &mut small);
            assert_eq!((n, fl & (libc::MSG_EOR | libc::MSG_TRUNC)), (6, 0));
            assert_eq!(&small, b"\0\0\0\x0a01");
            assert_eq!(errno(recvmsg(k, &mut buf, libc::MSG_DONTWAIT)), libc::EAGAIN);

            // KCM -> peer: sendmsg with MSG_EOR, then a sendmmsg batch.
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let m = framed(b"reply");
            assert_eq!(
                sendmsg(k, &[IoSlice::new(&m[..4]), IoSlice::new(&m[4..])], libc::MSG_EOR | libc::MSG_NOSIGNAL)
                    .unwrap(),
                m.len()
            );
            let mut got = vec![0u8; m.len()];
            c.read_exact(&mut got).unwrap();
            assert_eq!(got, m);
            let batch: Vec<Vec<u8>> = (0..3u8).map(|i| framed(&[i; 7])).collect();
            let refs: Vec<(&[u8], i32)> = batch.iter().map(|b| (b.as_slice(), libc::MSG_EOR)).collect();
            assert_eq!(sendmmsg_flags(k, &refs, libc::MSG_NOSIGNAL).unwrap(), 3);
            let mut got = vec![0u8; 33];
            c.read_exact(&mut got).unwrap();
            assert_eq!(got, batch.concat());

            // Clone: same mux, blocking, not close-on-exec.
            let clone = kcm_clone(k).unwrap();
            let cl = clone.as_raw_fd();
            assert!(!crate::socket::is_nonblocking(cl).unwrap());
            // SAFETY: F_GETFD takes no pointer.
            assert_eq!(unsafe { libc::fcntl(cl, libc::F_GETFD) } & libc::FD_CLOEXEC, 0);
            // Disable receive on the original: the next message goes to the clone.
            kcm_set_recv_disable(k, true).unwrap();
            assert!(kcm_recv_disabled(k).unwrap());
            assert!(!kcm_recv_disabled(cl).unwrap());
            c.write_all(&framed(b"for the clone")).unwrap();
            let (n, _) = recv_timeout(cl, &mut buf);
            assert_eq!(&buf[..n], &framed(b"for the clone")[..]);
            assert_eq!(errno(recvmsg(k, &mut buf, libc::MSG_DONTWAIT)), libc::EAGAIN);
            kcm_set_recv_disable(k, false).unwrap();
            assert!(!kcm_recv_disabled(k).unwrap());

            // recvmmsg collects several queued messages.
            kcm_set_recv_disable(cl, true).unwrap();
            let start = Instant::now();
            for i in 0..3u8 {
                c.write_all(&framed(&[b'a' + i; 3])).unwrap();
                // One message per segment (see length_parser).
                std::thread::sleep(Duration::from_millis(50));
            }
            let mut store = [[0u8; 16]; 4];
            let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
            let mut meta = [RecvMeta::default(); 4];
            let mut total = 0;
            while total < 3 && start.elapsed() < Duration::from_secs(10) {
                assert!(crate::poll::poll_readable(k, Some(Duration::from_secs(10))).unwrap());
                total += recvmmsg(k, &mut bufs[total..], &mut meta[total..], libc::MSG_DONTWAIT).unwrap();
            }
            assert_eq!(total, 3);
            for i in 0..3 {
                assert_eq!(meta[i].len, 7);
                assert_eq!(&bufs[i][..7], &framed(&[b'a' + i as u8; 3])[..]);
            }

            kcm_unattach(k, s.as_raw_fd()).unwrap();
            assert_eq!(errno(kcm_unattach(k, s.as_raw_fd())), libc::ENOENT);
            let _ = s.as_fd();
        }
    }
}
