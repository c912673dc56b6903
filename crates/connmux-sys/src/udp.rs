//! Datagrams in batches on a plain (unconnected) UDP socket: `recvmmsg(2)`
//! with each datagram's source address ([`recv_batch`] into a [`RecvBatch`]),
//! `sendmmsg(2)` with each datagram's destination ([`send_batch`]).
//!
//! The batches keep their buffers and headers between calls: a call rebuilds
//! the headers' pointers in place and allocates nothing. They hold raw
//! pointers between calls (never read there), so they are not `Send`: a
//! thread makes its own.
//!
//! [`Peer`] is a socket address as the kernel gives it (`sockaddr_storage`
//! and its length): a reply goes back to it without a conversion;
//! [`Peer::to_std`] and [`Peer::from_std`] convert when asked.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

use crate::util::{cvt, cvt_size};

/// Most datagrams one call moves (the kernel's `UIO_MAXIOV`).
pub const MAX_BATCH: usize = libc::UIO_MAXIOV as usize;

/// A socket address as the kernel wrote it (IPv4 or IPv6).
#[derive(Clone, Copy)]
pub struct Peer {
    addr: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl Default for Peer {
    fn default() -> Peer {
        // SAFETY: sockaddr_storage is plain data; all-zero is AF_UNSPEC.
        Peer { addr: unsafe { std::mem::zeroed() }, len: 0 }
    }
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_std() {
            Some(a) => write!(f, "Peer({a})"),
            None => write!(f, "Peer(family {}, {} bytes)", self.addr.ss_family, self.len),
        }
    }
}

impl PartialEq for Peer {
    fn eq(&self, other: &Peer) -> bool {
        self.to_std() == other.to_std()
    }
}

impl Peer {
    /// The kernel's form of `a`.
    pub fn from_std(a: SocketAddr) -> Peer {
        let mut p = Peer::default();
        match a {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for
                // sockaddr_in (the kernel's own contract for it).
                unsafe { std::ptr::write((&mut p.addr as *mut libc::sockaddr_storage).cast(), sin) };
                p.len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe { std::ptr::write((&mut p.addr as *mut libc::sockaddr_storage).cast(), sin6) };
                p.len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            }
        }
        p
    }

    /// The address as std's type; `None` for a family other than IPv4 and IPv6.
    pub fn to_std(&self) -> Option<SocketAddr> {
        match self.addr.ss_family as libc::c_int {
            libc::AF_INET if self.len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
                // SAFETY: the family says the storage holds a sockaddr_in,
                // and the storage is aligned for it.
                let sin: libc::sockaddr_in =
                    unsafe { std::ptr::read((&self.addr as *const libc::sockaddr_storage).cast()) };
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
            }
            libc::AF_INET6 if self.len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
                // SAFETY: as above, for sockaddr_in6.
                let sin6: libc::sockaddr_in6 =
                    unsafe { std::ptr::read((&self.addr as *const libc::sockaddr_storage).cast()) };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// Room for up to `count` datagrams of up to `slot` bytes each, and what
/// the last [`recv_batch`] put there.
pub struct RecvBatch {
    data: Vec<u8>,
    slot: usize,
    peers: Vec<Peer>,
    lens: Vec<usize>,
    flags: Vec<libc::c_int>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    n: usize,
}

impl RecvBatch {
    /// `count` datagrams (1 to [`MAX_BATCH`]) of `slot` bytes (at least 1);
    /// a longer datagram is cut to `slot` and marked [`RecvBatch::truncated`].
    pub fn new(count: usize, slot: usize) -> RecvBatch {
        let count = count.clamp(1, MAX_BATCH);
        let slot = slot.max(1);
        RecvBatch {
            data: vec![0; count * slot],
            slot,
            peers: vec![Peer::default(); count],
            lens: vec![0; count],
            flags: vec![0; count],
            iovs: Vec::with_capacity(count),
            hdrs: Vec::with_capacity(count),
            n: 0,
        }
    }

    /// Datagrams the last call received.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Most datagrams one call takes.
    pub fn capacity(&self) -> usize {
        self.peers.len()
    }

    /// Datagram `i` of the last call (cut to the slot when it was longer).
    pub fn datagram(&self, i: usize) -> &[u8] {
        assert!(i < self.n, "datagram {i} of {}", self.n);
        let at = i * self.slot;
        &self.data[at..at + self.lens[i].min(self.slot)]
    }

    /// Whether datagram `i` was longer than the slot (`MSG_TRUNC`).
    pub fn truncated(&self, i: usize) -> bool {
        assert!(i < self.n, "datagram {i} of {}", self.n);
        self.flags[i] & libc::MSG_TRUNC != 0 || self.lens[i] > self.slot
    }

    /// Where datagram `i` came from.
    pub fn peer(&self, i: usize) -> &Peer {
        assert!(i < self.n, "datagram {i} of {}", self.n);
        &self.peers[i]
    }

    /// The sources of the last call's datagrams, in order.
    pub fn peers(&self) -> &[Peer] {
        &self.peers[..self.n]
    }
}

/// `recvmmsg(2)` into `b` (no timeout): blocks for the first datagram unless
/// `flags` has `MSG_DONTWAIT` (or the socket is non-blocking); with
/// `MSG_WAITFORONE` returns as soon as one came and no more are queued.
/// Returns how many were received (also [`RecvBatch::len`]); a signal is
/// `Interrupted`, not retried.
pub fn recv_batch(fd: RawFd, b: &mut RecvBatch, flags: libc::c_int) -> io::Result<usize> {
    let count = b.peers.len();
    b.n = 0;
    b.iovs.clear();
    b.hdrs.clear();
    for chunk in b.data.chunks_exact_mut(b.slot) {
        b.iovs.push(libc::iovec { iov_base: chunk.as_mut_ptr().cast(), iov_len: chunk.len() });
    }
    for (iov, peer) in b.iovs.iter_mut().zip(b.peers.iter_mut()) {
        // SAFETY: msghdr is plain data; all-zero is "no name, no iov, no control".
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_name = (&mut peer.addr as *mut libc::sockaddr_storage).cast();
        hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        hdr.msg_iov = iov;
        hdr.msg_iovlen = 1;
        b.hdrs.push(libc::mmsghdr { msg_hdr: hdr, msg_len: 0 });
    }
    // SAFETY: `hdrs` holds `count` headers; each points at one iovec covering
    // its own slot of `data` and at its own `sockaddr_storage` with its size,
    // all exclusively borrowed through `b` for the call; no timeout pointer.
    let n = cvt(unsafe {
        libc::recvmmsg(fd, b.hdrs.as_mut_ptr(), count as libc::c_uint, flags as _, std::ptr::null_mut())
    })? as usize;
    for i in 0..n {
        let h = &b.hdrs[i];
        b.lens[i] = h.msg_len as usize;
        b.flags[i] = h.msg_hdr.msg_flags;
        b.peers[i].len = h.msg_hdr.msg_namelen;
    }
    b.n = n;
    Ok(n)
}

/// `recvfrom(2)` of one datagram into `buf`, its source into `peer`.
/// Returns the datagram's whole length (`MSG_TRUNC`): longer than `buf`, it
/// was cut to `buf`. A wake without a datagram (the receive side shut down)
/// returns 0 and leaves `peer` empty ([`Peer::to_std`] `None`). A signal is
/// `Interrupted`, not retried.
pub fn recv_one(fd: RawFd, buf: &mut [u8], peer: &mut Peer, flags: libc::c_int) -> io::Result<usize> {
    peer.len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `buf` is exclusively borrowed for the call and the kernel writes
    // at most `buf.len()` bytes into it; `peer.addr` is a sockaddr_storage,
    // exclusively borrowed, its size in `peer.len`, which the kernel updates.
    let n = cvt_size(unsafe {
        libc::recvfrom(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            flags | libc::MSG_TRUNC,
            (&mut peer.addr as *mut libc::sockaddr_storage).cast(),
            &mut peer.len,
        )
    });
    if n.is_err() {
        peer.len = 0;
    }
    n
}

/// `sendto(2)` of `buf` as one datagram to `peer`. Returns the bytes sent.
pub fn send_one(fd: RawFd, buf: &[u8], peer: &Peer, flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` and `peer.addr` are borrowed for the call and only read;
    // `peer.len` is at most the size of `peer.addr`.
    cvt_size(unsafe {
        libc::sendto(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            flags,
            (&peer.addr as *const libc::sockaddr_storage).cast(),
            peer.len,
        )
    })
}

/// `SOL_UDP` and its `UDP_SEGMENT` option (`linux/udp.h`): a send of one
/// buffer the kernel cuts into datagrams of this size (UDP GSO, Linux 4.18).
const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;

/// Most datagrams one segmented send may carry (the kernel's
/// `UDP_MAX_SEGMENTS` before Linux 6.9; 128 since).
pub const MAX_SEGMENTS: usize = 64;

/// A control message holding one `u16` (`UDP_SEGMENT`'s), aligned as
/// `cmsghdr` is.
#[derive(Clone, Copy, Default)]
#[repr(C, align(8))]
struct SegCmsg([u8; 32]);

/// The headers of [`send_batch`], kept between calls.
#[derive(Default)]
pub struct SendBatch {
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    cmsgs: Vec<SegCmsg>,
}

impl SendBatch {
    pub fn new() -> SendBatch {
        SendBatch::default()
    }
}

/// `sendmmsg(2)` of `msgs` (at most [`MAX_BATCH`] are taken), each datagram
/// to its peer (`None`: the socket's connected peer). Returns how many the
/// kernel took, from the first: the caller sends the rest again (an error
/// on the first datagram is returned as the error).
pub fn send_batch<'a, I>(fd: RawFd, b: &mut SendBatch, msgs: I, flags: libc::c_int) -> io::Result<usize>
where
    I: IntoIterator<Item = (&'a [u8], Option<&'a Peer>)>,
{
    b.iovs.clear();
    b.hdrs.clear();
    for (m, peer) in msgs.into_iter().take(MAX_BATCH) {
        b.iovs.push(libc::iovec { iov_base: m.as_ptr() as *mut libc::c_void, iov_len: m.len() });
        // SAFETY: msghdr is plain data; all-zero is "no name, no iov, no control".
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        if let Some(p) = peer {
            hdr.msg_name = (&p.addr as *const libc::sockaddr_storage).cast_mut().cast();
            hdr.msg_namelen = p.len;
        }
        b.hdrs.push(libc::mmsghdr { msg_hdr: hdr, msg_len: 0 });
    }
    if b.hdrs.is_empty() {
        return Ok(0);
    }
    // The iovecs are complete: point each header at its own.
    for (h, iov) in b.hdrs.iter_mut().zip(b.iovs.iter_mut()) {
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: `hdrs` holds `hdrs.len()` headers, each pointing at one iovec
    // over a borrowed datagram and at its borrowed peer address (or none);
    // they live for the call ('a outlives it). The kernel only reads the
    // datagrams and the addresses, and writes `msg_len`.
    let n = cvt(unsafe { libc::sendmmsg(fd, b.hdrs.as_mut_ptr(), b.hdrs.len() as libc::c_uint, flags as _) })?;
    Ok(n as usize)
}

/// [`send_batch`] where each entry may be several datagrams of `seg` bytes
/// back to back (the last may be shorter), sent as one segmented buffer
/// (UDP GSO, `UDP_SEGMENT`): the kernel's way down runs once for them all.
/// `seg` 0 (or not less than the entry) sends the entry as one datagram.
/// An entry holds at most [`MAX_SEGMENTS`] datagrams and 65,507 bytes.
/// A kernel without UDP GSO answers `EINVAL` or `EIO`, `ENOPROTOOPT`:
/// the caller then sends each datagram apart.
pub fn send_batch_segmented<'a, I>(fd: RawFd, b: &mut SendBatch, msgs: I, flags: libc::c_int) -> io::Result<usize>
where
    I: IntoIterator<Item = (&'a [u8], Option<&'a Peer>, u16)>,
{
    b.iovs.clear();
    b.hdrs.clear();
    b.cmsgs.clear();
    let mut segs: [u16; MAX_BATCH] = [0; MAX_BATCH];
    for (k, (m, peer, seg)) in msgs.into_iter().take(MAX_BATCH).enumerate() {
        b.iovs.push(libc::iovec { iov_base: m.as_ptr() as *mut libc::c_void, iov_len: m.len() });
        // SAFETY: msghdr is plain data; all-zero is "no name, no iov, no control".
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        if let Some(p) = peer {
            hdr.msg_name = (&p.addr as *const libc::sockaddr_storage).cast_mut().cast();
            hdr.msg_namelen = p.len;
        }
        segs[k] = if seg > 0 && usize::from(seg) < m.len() { seg } else { 0 };
        b.hdrs.push(libc::mmsghdr { msg_hdr: hdr, msg_len: 0 });
        b.cmsgs.push(SegCmsg::default());
    }
    if b.hdrs.is_empty() {
        return Ok(0);
    }
    // SAFETY: CMSG_SPACE and CMSG_LEN only compute sizes.
    let (space, len) = unsafe { (libc::CMSG_SPACE(2) as usize, libc::CMSG_LEN(2) as usize) };
    debug_assert!(space <= std::mem::size_of::<SegCmsg>());
    for (k, ((h, iov), c)) in b.hdrs.iter_mut().zip(b.iovs.iter_mut()).zip(b.cmsgs.iter_mut()).enumerate() {
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
        if segs[k] > 0 {
            h.msg_hdr.msg_control = c.0.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = space as _;
            // SAFETY: the header points at `c`, a zeroed, aligned buffer of
            // at least CMSG_SPACE(2) bytes: CMSG_FIRSTHDR gives its start.
            let cm = unsafe { libc::CMSG_FIRSTHDR(&h.msg_hdr) };
            // SAFETY: `cm` is that start, in bounds and aligned for cmsghdr;
            // CMSG_DATA is within the CMSG_LEN(2) bytes written.
            unsafe {
                (*cm).cmsg_level = SOL_UDP;
                (*cm).cmsg_type = UDP_SEGMENT;
                (*cm).cmsg_len = len as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), segs[k]);
            }
        }
    }
    // SAFETY: as in `send_batch`, and each header's control buffer is its
    // own entry of `cmsgs`, alive for the call; the kernel only reads it.
    let n = cvt(unsafe { libc::sendmmsg(fd, b.hdrs.as_mut_ptr(), b.hdrs.len() as libc::c_uint, flags as _) })?;
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    #[test]
    fn peers_convert_both_ways() {
        for a in ["127.0.0.1:9", "10.1.2.3:65535", "[::1]:62049", "[fe80::1%2]:7"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(Peer::from_std(a).to_std(), Some(a));
        }
        assert_eq!(Peer::default().to_std(), None);
    }

    #[test]
    fn a_batch_comes_in_with_its_sources_and_goes_back_to_them() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (a, c) = (UdpSocket::bind("127.0.0.1:0").unwrap(), UdpSocket::bind("127.0.0.1:0").unwrap());
        for s in [&a, &c] {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        }
        let to = server.local_addr().unwrap();
        a.send_to(b"one", to).unwrap();
        c.send_to(b"two!", to).unwrap();
        a.send_to(&[7u8; 100], to).unwrap();
        let mut b = RecvBatch::new(8, 64);
        let mut got = 0;
        let mut seen = Vec::new();
        // Bounded: three datagrams, each call blocks for at least one.
        while got < 3 {
            let n = recv_batch(server.as_raw_fd(), &mut b, libc::MSG_WAITFORONE).unwrap();
            for i in 0..n {
                seen.push((b.datagram(i).to_vec(), b.truncated(i), b.peer(i).to_std().unwrap()));
            }
            got += n;
        }
        assert_eq!(seen[0], (b"one".to_vec(), false, a.local_addr().unwrap()));
        assert_eq!(seen[1], (b"two!".to_vec(), false, c.local_addr().unwrap()));
        assert_eq!(seen[2], (vec![7u8; 64], true, a.local_addr().unwrap()));
        // Replies to each source, in one call.
        let peers: Vec<Peer> = seen.iter().map(|s| Peer::from_std(s.2)).collect();
        let replies: [&[u8]; 3] = [b"r1", b"r2", b"r3"];
        let mut sb = SendBatch::new();
        let sent =
            send_batch(server.as_raw_fd(), &mut sb, replies.iter().copied().zip(peers.iter().map(Some)), 0).unwrap();
        assert_eq!(sent, 3);
        let mut buf = [0u8; 16];
        assert_eq!(a.recv(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"r1");
        assert_eq!(c.recv(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"r2");
        assert_eq!(a.recv(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"r3");
        // Nothing queued: MSG_DONTWAIT says so.
        let e = recv_batch(server.as_raw_fd(), &mut b, libc::MSG_DONTWAIT).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(b.is_empty());
    }

    #[test]
    fn a_segmented_send_arrives_as_separate_datagrams() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let to = Peer::from_std(c.local_addr().unwrap());
        // Three datagrams of 4 bytes and one of 2, in one buffer; then a
        // plain one.
        let buf = b"aaaabbbbccccdd";
        let mut sb = SendBatch::new();
        let items = [(&buf[..], Some(&to), 4u16), (&b"plain"[..], Some(&to), 0)];
        match send_batch_segmented(server.as_raw_fd(), &mut sb, items, 0) {
            Ok(n) => assert_eq!(n, 2),
            // A kernel without UDP GSO.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT)) => return,
            Err(e) => panic!("{e}"),
        }
        let mut got = Vec::new();
        for _ in 0..5 {
            let mut b = [0u8; 16];
            let n = c.recv(&mut b).unwrap();
            got.push(b[..n].to_vec());
        }
        assert_eq!(got, [&b"aaaa"[..], b"bbbb", b"cccc", b"dd", b"plain"]);
    }

    #[test]
    fn a_connected_socket_sends_without_addresses() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.connect(server.local_addr().unwrap()).unwrap();
        let msgs: [&[u8]; 2] = [b"x", b"yy"];
        let mut sb = SendBatch::new();
        assert_eq!(send_batch(c.as_raw_fd(), &mut sb, msgs.iter().map(|m| (*m, None)), 0).unwrap(), 2);
        let mut buf = [0u8; 4];
        assert_eq!(server.recv(&mut buf).unwrap(), 1);
        assert_eq!(server.recv(&mut buf).unwrap(), 2);
        assert_eq!(send_batch(c.as_raw_fd(), &mut sb, std::iter::empty(), 0).unwrap(), 0);
    }
}
