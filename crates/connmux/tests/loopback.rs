//! The acceptance cases of the KCM specification (§7) that need real sockets,
//! on loopback TCP, plus connmux's own additions (addressed mode, serving).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;
use connmux::{PsockError, RxError, SockType};

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

#[test]
fn case_01_create_dgram_and_seqpacket() {
    let mux = mux_with(|_| {});
    let d = mux.socket(SockType::Dgram).unwrap();
    let s = mux.socket(SockType::SeqPacket).unwrap();
    assert_eq!(d.sock_type(), SockType::Dgram);
    assert_eq!(s.sock_type(), SockType::SeqPacket);
}

#[test]
fn case_02_clone_same_mux_same_type() {
    let mux = mux_with(|_| {});
    let a = mux.socket(SockType::SeqPacket).unwrap();
    a.set_recv_disable(true).unwrap();
    let b = a.try_clone().unwrap();
    assert_eq!(b.sock_type(), SockType::SeqPacket);
    assert_ne!(a.id(), b.id());
    // Default options: the clone does not inherit receive-disable.
    assert!(!b.recv_disabled().unwrap());
    assert_eq!(mux.stats().kcms, 2);
}

#[test]
fn case_03_attach_non_tcp_is_eopnotsupp() {
    let mux = mux_with(|_| {});
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    assert_eq!(errno(mux.attach(&udp, l4()).unwrap_err()), libc::EOPNOTSUPP);
    let (u1, _u2) = UnixStream::pair().unwrap();
    assert_eq!(errno(mux.attach(&u1, l4()).unwrap_err()), libc::EOPNOTSUPP);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    assert_eq!(errno(mux.attach(&listener, l4()).unwrap_err()), libc::EOPNOTSUPP);
    let fresh = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    assert_eq!(errno(mux.attach(&fresh, l4()).unwrap_err()), libc::EOPNOTSUPP);
    assert_eq!(mux.stats().psock_attach, 0);
}

#[test]
fn case_04_attach_twice_is_ealready_and_first_still_works() {
    let mux = mux_with(|_| {});
    let other = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT));
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    assert_eq!(errno(mux.attach(&ours, l4()).unwrap_err()), libc::EALREADY);
    assert_eq!(errno(other.attach(&ours, l4()).unwrap_err()), libc::EALREADY);
    write_all(&mut peer, &framed(b"still here"));
    let mut buf = [0u8; 64];
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &framed(b"still here")[..]);
}

#[test]
fn case_05_unattach_not_attached_or_twice_is_enoent() {
    let mux = mux_with(|_| {});
    let _sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, _peer) = pair();
    assert_eq!(errno(mux.unattach(&ours).unwrap_err()), libc::ENOENT);
    mux.attach(&ours, l4()).unwrap();
    mux.unattach(&ours).unwrap();
    assert_eq!(errno(mux.unattach(&ours).unwrap_err()), libc::ENOENT);
    assert_eq!(mux.stats().psock_unattach, 1);
}

#[test]
fn case_08_two_messages_in_one_segment_are_framed_apart() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT));
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let mut both = framed(b"abcdef");
    both.extend_from_slice(&framed(b"ghijkl"));
    write_all(&mut peer, &both); // one write, one segment on loopback
    let mut buf = [0u8; 64];
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &framed(b"abcdef")[..]);
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &framed(b"ghijkl")[..]);
}

#[test]
fn case_09_message_over_three_segments_is_delivered_once_whole() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_nonblocking(true);
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let body: Vec<u8> = (0..96u8).collect();
    let msg = framed(&body);
    let mut buf = [0u8; 200];
    for part in [&msg[..30], &msg[30..70]] {
        write_all(&mut peer, part);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(sock.recv(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
    }
    write_all(&mut peer, &msg[70..]);
    let n = eventually(|| sock.recv(&mut buf).ok());
    assert_eq!(&buf[..n], &msg[..]);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(sock.recv(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
}

#[test]
fn case_11_bytes_queued_before_attach_are_delivered() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT));
    let (ours, mut peer) = pair();
    write_all(&mut peer, &framed(b"early"));
    std::thread::sleep(Duration::from_millis(20));
    mux.attach(&ours, l4()).unwrap();
    let mut buf = [0u8; 64];
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &framed(b"early")[..]);
}

/// A second, well-behaved connection whose traffic must be unaffected.
fn good_neighbour(mux: &connmux::Mux, sock: &connmux::KcmSocket) -> (TcpStream, TcpStream) {
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    write_all(&mut peer, &framed(b"neighbour"));
    let m = sock.recv_msg().unwrap();
    assert_eq!(&m.data[..], &framed(b"neighbour")[..]);
    (ours, peer)
}

#[test]
fn case_12_oversize_length_aborts_that_psock_only() {
    let mux = mux_with(|c| c.core.max_msg_size = 1000);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT));
    let (ours, mut peer) = pair();
    let bad = mux.attach(&ours, l4()).unwrap();
    let mut hdr = framed(&[7u8; 10]);
    hdr[..4].copy_from_slice(&5000u32.to_be_bytes());
    write_all(&mut peer, &hdr);
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    assert_eq!(ev.psock, bad);
    assert!(matches!(ev.error, PsockError::Rx(RxError::TooBig { .. })), "{:?}", ev.error);
    assert_eq!(mux.psock_stats(bad).unwrap().rx_msg_too_big, 1);
    // The KCM socket sees no error and nothing partial; a neighbour still works.
    let (_o2, mut p2) = good_neighbour(&mux, &sock);
    write_all(&mut p2, &framed(b"after"));
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(b"after")[..]);
    sock.set_nonblocking(true);
    assert_eq!(sock.recv_msg().unwrap_err().kind(), ErrorKind::WouldBlock);
}

#[test]
fn case_15_assembly_timeout_from_first_byte() {
    let mux = mux_with(|c| c.core.assembly_timeout = Some(Duration::from_millis(100)));
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT));
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    let start = Instant::now();
    write_all(&mut peer, &framed(&[1u8; 50])[..20]);
    std::thread::sleep(Duration::from_millis(60));
    write_all(&mut peer, &[1u8; 5]); // more bytes do not restart the clock
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    let took = start.elapsed();
    assert_eq!(ev.psock, p);
    assert_eq!(ev.error, PsockError::Rx(RxError::Timeout));
    assert!(took >= Duration::from_millis(95), "fired after {took:?}");
    assert!(took < Duration::from_millis(1000), "fired after {took:?}");
    assert_eq!(mux.psock_stats(p).unwrap().rx_msg_timeouts, 1);
    let _ = good_neighbour(&mux, &sock);
}

#[test]
fn case_15_no_timeout_waits_indefinitely() {
    let mux = mux_with(|c| c.core.assembly_timeout = None);
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let msg = framed(&[3u8; 40]);
    write_all(&mut peer, &msg[..10]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(mux.events().try_recv().is_err());
    write_all(&mut peer, &msg[10..]);
    sock.set_read_timeout(Some(WAIT));
    assert_eq!(&sock.recv_msg().unwrap().data[..], &msg[..]);
}

#[test]
fn case_16_big_message_without_stall() {
    let mux = mux_with(|c| c.core.max_msg_size = 1 << 20);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT));
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let body: Vec<u8> = (0..(600 << 10)).map(|i| (i % 251) as u8).collect();
    let msg = framed(&body);
    let w = std::thread::spawn(move || {
        peer.write_all(&msg).unwrap();
        peer
    });
    let got = sock.recv_msg().unwrap();
    let _peer = w.join().unwrap();
    assert_eq!(got.data.len(), body.len() + 4);
    assert_eq!(&got.data[4..], &body[..]);
}

/// Sizes and contents the atomicity test can check at the receiver.
fn pattern(tid: u8, seq: u32, len: usize) -> Vec<u8> {
    let mut body = vec![0u8; len.max(5)];
    body[0] = tid;
    body[1..5].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in body.iter_mut().enumerate().skip(5) {
        *b = (tid as usize * 31 + seq as usize + i) as u8;
    }
    body
}

#[test]
fn case_30_atomic_sends_from_eight_threads_over_two_connections() {
    const THREADS: u8 = 8;
    const PER_THREAD: u32 = 1_250; // 10,000 messages of 5 B to 64 KiB
    let mux = mux_with(|c| c.workers = 2);
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (o1, mut p1) = pair();
    let (o2, mut p2) = pair();
    mux.attach(&o1, l4()).unwrap();
    mux.attach(&o2, l4()).unwrap();
    // Receivers: parse raw bytes at the peers, check every message is intact.
    let recv = |peer: &mut TcpStream| {
        let mut n = 0u32;
        loop {
            let mut hdr = [0u8; 4];
            match peer.read_exact(&mut hdr) {
                Ok(()) => {}
                Err(_) => return n,
            }
            let mut body = vec![0u8; u32::from_be_bytes(hdr) as usize];
            peer.read_exact(&mut body).unwrap();
            let seq = u32::from_be_bytes(body[1..5].try_into().unwrap());
            assert_eq!(body, pattern(body[0], seq, body.len()), "message mangled or interleaved");
            n += 1;
        }
    };
    p1.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    p2.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    let r1 = std::thread::spawn(move || recv(&mut p1));
    let r2 = std::thread::spawn(move || recv(&mut p2));
    let mut senders = Vec::new();
    for t in 0..THREADS {
        let s = sock.try_clone().unwrap();
        s.set_write_timeout(Some(Duration::from_secs(20)));
        senders.push(std::thread::spawn(move || {
            use rand::{Rng, SeedableRng};
            let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
            for seq in 0..PER_THREAD {
                let len = rng.gen_range(5..=(64 << 10));
                s.send(&framed(&pattern(t, seq, len))).unwrap();
            }
            // Closing a KCM socket drops its unsent messages and aborts a psock
            // part-way through one (kcm_release): keep it open until delivered.
            s
        }));
    }
    let open: Vec<_> = senders.into_iter().map(|s| s.join().unwrap()).collect();
    let total = r1.join().unwrap() + r2.join().unwrap();
    drop(open);
    assert_eq!(total, THREADS as u32 * PER_THREAD);
}

#[test]
fn case_32_idle_psocks_rotate_in_lru_order() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (o1, mut p1) = pair();
    let (o2, mut p2) = pair();
    mux.attach(&o1, l4()).unwrap();
    mux.attach(&o2, l4()).unwrap();
    let mut order = Vec::new();
    for i in 0..4u8 {
        sock.send(&framed(&[i])).unwrap();
        // Wait until the message is on the wire before the next send.
        let m = eventually(|| {
            for (name, p) in [("T1", &mut p1), ("T2", &mut p2)] {
                p.set_nonblocking(true).unwrap();
                let mut b = [0u8; 5];
                if let Ok(5) = p.read(&mut b) {
                    return Some((name, b[4]));
                }
            }
            None
        });
        order.push(m);
    }
    assert_eq!(order, vec![("T1", 0), ("T2", 1), ("T1", 2), ("T2", 3)]);
}

#[test]
fn case_34_sends_queue_without_psock_then_flush_on_attach() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_nonblocking(true);
    sock.set_sndbuf(1000).unwrap();
    let mut sent = 0u32;
    loop {
        match sock.send(&framed(&sent.to_be_bytes())) {
            Ok(_) => sent += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::WouldBlock);
                break;
            }
        }
        assert!(sent < 10_000, "send buffer never filled");
    }
    assert!(sent > 10);
    let (o1, mut p1) = pair();
    mux.attach(&o1, l4()).unwrap();
    for i in 0..sent {
        assert_eq!(read_framed(&mut p1), i.to_be_bytes());
    }
}

#[test]
fn case_39_peer_fin_reports_error_and_keeps_delivered_messages() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    write_all(&mut peer, &framed(b"before fin"));
    peer.shutdown(std::net::Shutdown::Write).unwrap();
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    assert_eq!(ev, connmux::PsockEvent { psock: p, error: PsockError::Closed });
    assert_eq!(mux.psock_error(p), Some(PsockError::Closed));
    sock.set_nonblocking(true);
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(b"before fin")[..]);
}

#[test]
fn case_40_closing_app_fd_keeps_attachment_until_last_socket_closes() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT));
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    drop(ours);
    sock.send(&framed(b"out")).unwrap();
    assert_eq!(read_framed(&mut peer), b"out");
    write_all(&mut peer, &framed(b"in"));
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(b"in")[..]);
    drop(sock); // the last KCM socket: every psock is released, the connection closes
    let mut b = [0u8; 1];
    assert_eq!(peer.read(&mut b).unwrap(), 0, "connection should be closed");
}

#[test]
fn case_43_statistics_over_real_tcp() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT));
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    for _ in 0..3 {
        sock.send(&framed(b"123456")).unwrap();
    }
    for _ in 0..3 {
        assert_eq!(read_framed(&mut peer), b"123456");
        write_all(&mut peer, &framed(b"abcdef"));
    }
    let mut buf = [0u8; 32];
    for _ in 0..3 {
        assert_eq!(sock.recv(&mut buf).unwrap(), 10);
    }
    let s = sock.stats().unwrap();
    assert_eq!((s.tx_msgs, s.tx_bytes, s.rx_msgs, s.rx_bytes), (3, 30, 3, 30));
    let ps = eventually(|| mux.psock_stats(p).ok().filter(|ps| ps.tx_msgs == 3));
    assert_eq!((ps.tx_msgs, ps.tx_bytes, ps.rx_msgs, ps.rx_bytes), (3, 30, 3, 30));
    mux.unattach_id(p).unwrap();
    let m = mux.stats();
    assert_eq!((m.tx_msgs, m.tx_bytes), (3, 30));
    assert_eq!((m.rx_msgs, m.rx_bytes), (3, 30));
}

#[test]
fn addressed_mode_replies_reach_the_right_client() {
    let mux = mux_with(|c| c.workers = 2);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT));
    let mut peers = Vec::new();
    for _ in 0..4 {
        let (ours, peer) = pair();
        mux.attach(&ours, l4()).unwrap();
        peers.push((ours, peer));
    }
    for (i, (_, peer)) in peers.iter_mut().enumerate() {
        write_all(peer, &framed(format!("client {i}").as_bytes()));
    }
    for _ in 0..4 {
        let m = sock.recv_msg().unwrap();
        let mut reply = m.data.to_vec();
        reply.extend_from_slice(b" ok");
        let body_len = (reply.len() - 4) as u32;
        reply[..4].copy_from_slice(&body_len.to_be_bytes());
        sock.send_to(&reply, m.psock).unwrap();
    }
    for (i, (_, peer)) in peers.iter_mut().enumerate() {
        assert_eq!(read_framed(peer), format!("client {i} ok").as_bytes());
    }
}
