//! The acceptance cases of the KCM specification (§7) that need real sockets,
//! on loopback TCP, plus connmux's own additions (addressed mode, serving).

#[macro_use]
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

fn case_01_create_dgram_and_seqpacket() {
    let mux = mux_with(|_| {});
    let d = mux.socket(SockType::Dgram).unwrap();
    let s = mux.socket(SockType::SeqPacket).unwrap();
    assert_eq!(d.sock_type(), SockType::Dgram);
    assert_eq!(s.sock_type(), SockType::SeqPacket);
}

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

fn case_04_attach_twice_is_ealready_and_first_still_works() {
    let mux = mux_with(|_| {});
    let other = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    assert_eq!(errno(mux.attach(&ours, l4()).unwrap_err()), libc::EALREADY);
    assert_eq!(errno(other.attach(&ours, l4()).unwrap_err()), libc::EALREADY);
    write_all(&mut peer, &framed(b"still here"));
    let mut buf = [0u8; 64];
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &framed(b"still here")[..]);
}

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

fn case_08_two_messages_in_one_segment_are_framed_apart() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
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

fn case_09_message_over_three_segments_is_delivered_once_whole() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_nonblocking(true).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let (fence_ours, mut fence) = pair();
    mux.attach(&fence_ours, l4()).unwrap();
    let body: Vec<u8> = (0..96u8).collect();
    let msg = framed(&body);
    for part in [&msg[..30], &msg[30..70]] {
        write_all(&mut peer, part);
        assert_eq!(settled_rx(&sock, &ours, &mut fence), Vec::<Vec<u8>>::new(), "a part came out as a message");
    }
    write_all(&mut peer, &msg[70..]);
    // The positive twin: the same wait sees the message once it is whole.
    assert_eq!(settled_rx(&sock, &ours, &mut fence), vec![msg.clone()]);
    // Delivered once.
    assert_eq!(settled_rx(&sock, &ours, &mut fence), Vec::<Vec<u8>>::new());
}

/// The messages `sock` gets from what arrived on `ours` so far, waited for
/// without a sleep: once the worker has taken every byte of `ours` (its
/// receive queue is empty), a fence message goes through `fence`, another
/// connection on the same single worker, which reads and frames it after
/// `ours`'s bytes. Returns the messages received before the fence (leaves
/// `sock` non-blocking).
fn settled_rx(sock: &connmux::KcmSocket, ours: &TcpStream, fence: &mut TcpStream) -> Vec<Vec<u8>> {
    use std::os::fd::AsRawFd;
    eventually(|| (connmux_sys::socket::inq(ours.as_raw_fd()).unwrap() == 0).then_some(()));
    write_all(fence, &framed(b"fence"));
    sock.set_nonblocking(true).unwrap();
    let mut before = Vec::new();
    // Bounded: each turn takes one message, and `eventually` gives up after WAIT.
    loop {
        let m = eventually(|| sock.recv_msg().ok());
        if m.data[..] == framed(b"fence")[..] {
            return before;
        }
        before.push(m.data.to_vec());
        assert!(before.len() < 1000, "no fence among {} messages", before.len());
    }
}

fn case_11_bytes_queued_before_attach_are_delivered() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    write_all(&mut peer, &framed(b"early"));
    // The bytes are in the connection's receive queue before the attach.
    eventually(|| {
        use std::os::fd::AsRawFd;
        (connmux_sys::socket::inq(ours.as_raw_fd()).unwrap() == framed(b"early").len()).then_some(())
    });
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

fn case_12_oversize_length_aborts_that_psock_only() {
    let mux = mux_with(|c| c.core.max_msg_size = 1000);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
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
    sock.set_nonblocking(true).unwrap();
    assert_eq!(sock.recv_msg().unwrap_err().kind(), ErrorKind::WouldBlock);
}

fn case_15_assembly_timeout_from_first_byte() {
    let mux = mux_with(|c| c.core.assembly_timeout = Some(Duration::from_millis(100)));
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
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

fn case_15_no_timeout_waits_indefinitely() {
    // The positive twin first: with a 100 ms timeout the same wait (ten
    // times that) sees the abort; without one it sees nothing, and the
    // message completes whenever its bytes come.
    for timeout in [Some(Duration::from_millis(100)), None] {
        let mux = mux_with(|c| c.core.assembly_timeout = timeout);
        let sock = mux.socket(SockType::Dgram).unwrap();
        let (ours, mut peer) = pair();
        let p = mux.attach(&ours, l4()).unwrap();
        let msg = framed(&[3u8; 40]);
        write_all(&mut peer, &msg[..10]);
        let ev = mux.events().recv_timeout(Duration::from_secs(1)).ok();
        match timeout {
            Some(_) => {
                let ev = ev.expect("the timeout fired within ten times its length");
                assert_eq!((ev.psock, ev.error), (p, PsockError::Rx(RxError::Timeout)));
            }
            None => {
                assert!(ev.is_none(), "{ev:?} with no assembly timeout");
                write_all(&mut peer, &msg[10..]);
                sock.set_read_timeout(Some(WAIT)).unwrap();
                assert_eq!(&sock.recv_msg().unwrap().data[..], &msg[..]);
            }
        }
    }
}

fn case_16_big_message_without_stall() {
    let mux = mux_with(|c| c.core.max_msg_size = 1 << 20);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
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
        s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
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

fn case_34_sends_queue_without_psock_then_flush_on_attach() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_nonblocking(true).unwrap();
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
    sock.set_nonblocking(true).unwrap();
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(b"before fin")[..]);
}

fn case_40_closing_app_fd_keeps_attachment_until_last_socket_closes() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
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

fn case_43_statistics_over_real_tcp() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
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

fn addressed_mode_replies_reach_the_right_client() {
    let mux = mux_with(|c| c.workers = 2);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
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

/// `send_batch_to`: replies to a batch received from three connections go
/// back each on its own, interleaved in the batch, in order per connection;
/// an unaddressed one among them takes a connection the mux picks. A batch
/// stopped by a connection that is gone returns the count before it, and
/// what it had accepted still goes out (nothing waits for a send that is
/// not coming).
fn send_batch_to_answers_each_connection_and_a_short_batch_still_goes_out() {
    let mux = mux_with(|c| c.workers = 2);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let mut peers = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (ours, peer) = pair();
        ids.push(mux.attach(&ours, l4()).unwrap());
        peers.push((ours, peer));
    }
    let replies: Vec<(usize, Vec<u8>)> = (0..30).map(|i| (i % 3, framed(format!("reply {i}").as_bytes()))).collect();
    let batch: Vec<(Option<connmux::PsockId>, &[u8])> =
        replies.iter().map(|(c, r)| (Some(ids[*c]), r.as_slice())).collect();
    assert_eq!(sock.send_batch_to(&batch).unwrap(), 30);
    for (c, (_, peer)) in peers.iter_mut().enumerate() {
        for (_, r) in replies.iter().filter(|(to, _)| *to == c) {
            assert_eq!(read_framed(peer), r[4..], "connection {c} on {:?}", driver());
        }
    }
    // An unaddressed message in the batch: on one of the three.
    let plain = framed(b"plain");
    let one = framed(b"to 0");
    assert_eq!(sock.send_batch_to(&[(None, &plain[..]), (Some(ids[0]), &one[..])]).unwrap(), 2);
    // (Each peer read until both came, within the deadline.)
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    for (_, peer) in peers.iter_mut() {
        peer.set_nonblocking(true).unwrap();
    }
    while got.len() < 2 && Instant::now() < deadline {
        for (c, (_, peer)) in peers.iter_mut().enumerate() {
            let mut head = [0u8; 4];
            if peer.peek(&mut head).is_ok_and(|n| n == 4) {
                let len = u32::from_be_bytes(head) as usize;
                let mut m = vec![0u8; 4 + len];
                if peer.peek(&mut m).is_ok_and(|n| n == m.len()) {
                    peer.read_exact(&mut m).unwrap();
                    got.push((c, m[4..].to_vec()));
                }
            }
        }
        std::thread::yield_now();
    }
    for (_, peer) in peers.iter_mut() {
        peer.set_nonblocking(false).unwrap();
    }
    assert!(got.iter().any(|(c, m)| *c == 0 && m == b"to 0"), "the addressed one: {got:?}");
    assert!(got.iter().any(|(_, m)| m == b"plain"), "the plain one on some connection: {got:?}");
    // A connection gone in the middle: the count before it, and those go out.
    let (gone_ours, _gone_peer) = pair();
    let gone = mux.attach(&gone_ours, l4()).unwrap();
    mux.unattach_id(gone).unwrap();
    let (a, b) = (framed(b"before"), framed(b"after"));
    let short = [(Some(ids[1]), &a[..]), (Some(gone), &a[..]), (Some(ids[1]), &b[..])];
    assert_eq!(sock.send_batch_to(&short).unwrap(), 1, "on {:?}", driver());
    let peer = &mut peers[1].1;
    peer.set_read_timeout(Some(WAIT)).unwrap();
    assert_eq!(read_framed(peer), b"before", "held by a batch nobody ends, on {:?}", driver());
    // The first message refused: its error.
    assert!(sock.send_batch_to(&[(Some(gone), &a[..])]).is_err());
}

/// `send_msg_batch`: replies sent with BATCH go out, in order, with the
/// next reply sent without it, or at `end_batch`; `end_batch` with no batch
/// open does nothing.
fn send_msg_batch_goes_out_with_the_next_send_or_at_end_batch() {
    let mux = mux_with(|c| c.workers = 2);
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    let msg = |body: &str| connmux::Bytes::from(framed(body.as_bytes()));
    sock.end_batch().unwrap();
    sock.send_msg_batch(msg("one"), p, true).unwrap();
    sock.send_msg_batch(msg("two"), p, true).unwrap();
    sock.send_msg_batch(msg("three"), p, false).unwrap();
    for want in ["one", "two", "three"] {
        assert_eq!(read_framed(&mut peer), want.as_bytes(), "on {:?}", driver());
    }
    sock.send_msg_batch(msg("four"), p, true).unwrap();
    sock.send_msg_batch(msg("five"), p, true).unwrap();
    sock.end_batch().unwrap();
    for want in ["four", "five"] {
        assert_eq!(read_framed(&mut peer), want.as_bytes(), "ended, on {:?}", driver());
    }
}

/// The receive readiness (`as_fd`) taken only once messages were queued
/// and one was received (nobody waited meanwhile, so the runtime wrote no
/// eventfd) is readable at once, unreadable once the queue is empty, and
/// readable again when the next message comes.
fn readiness_descriptor_taken_late_follows_the_queue() {
    use std::os::fd::{AsFd, AsRawFd};
    let readable =
        |s: &connmux::KcmSocket, t: Duration| connmux_sys::poll::poll_readable(s.as_fd().as_raw_fd(), Some(t)).unwrap();
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    write_all(&mut peer, &[framed(b"one"), framed(b"two")].concat());
    eventually(|| (sock.queued() == 2).then_some(()));
    assert_eq!(&sock.recv_msg().unwrap().data[4..], b"one");
    assert!(readable(&sock, Duration::ZERO), "a message is queued: the descriptor must say so");
    assert_eq!(&sock.recv_msg().unwrap().data[4..], b"two");
    assert!(!readable(&sock, Duration::ZERO), "nothing queued: not readable, on {:?}", driver());
    write_all(&mut peer, &framed(b"three"));
    assert!(readable(&sock, WAIT), "the next message makes it readable again");
    assert_eq!(&sock.recv_msg().unwrap().data[4..], b"three");
}

on_both_drivers!(
    readiness_descriptor_taken_late_follows_the_queue,
    case_01_create_dgram_and_seqpacket,
    case_02_clone_same_mux_same_type,
    case_03_attach_non_tcp_is_eopnotsupp,
    case_04_attach_twice_is_ealready_and_first_still_works,
    case_05_unattach_not_attached_or_twice_is_enoent,
    case_08_two_messages_in_one_segment_are_framed_apart,
    case_09_message_over_three_segments_is_delivered_once_whole,
    case_11_bytes_queued_before_attach_are_delivered,
    case_12_oversize_length_aborts_that_psock_only,
    case_15_assembly_timeout_from_first_byte,
    case_15_no_timeout_waits_indefinitely,
    case_16_big_message_without_stall,
    case_30_atomic_sends_from_eight_threads_over_two_connections,
    case_32_idle_psocks_rotate_in_lru_order,
    case_34_sends_queue_without_psock_then_flush_on_attach,
    case_39_peer_fin_reports_error_and_keeps_delivered_messages,
    case_40_closing_app_fd_keeps_attachment_until_last_socket_closes,
    case_43_statistics_over_real_tcp,
    addressed_mode_replies_reach_the_right_client,
    send_batch_to_answers_each_connection_and_a_short_batch_still_goes_out,
    send_msg_batch_goes_out_with_the_next_send_or_at_end_batch,
);

// ---- receive semantics on real sockets (§7 cases 10, 17-26) ----

/// Wait until `s` holds `n` messages.
fn wait_queued(s: &connmux::KcmSocket, n: usize) {
    eventually(|| (s.queued() == n).then_some(()));
}

fn case_10_header_split_two_plus_two_needs_more_once() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    let msg = framed(b"split header");
    write_all(&mut peer, &msg[..2]);
    eventually(|| (mux.psock_stats(p).unwrap().rx_need_more_hdr == 1).then_some(()));
    write_all(&mut peer, &msg[2..]);
    assert_eq!(&sock.recv_msg().unwrap().data[..], &msg[..], "{:?}", driver());
    assert_eq!(mux.psock_stats(p).unwrap().rx_need_more_hdr, 1, "{:?}", driver());
}

fn case_17_18_21_dgram_truncation_zero_read_and_eor() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let (m1, m2, m3, m4) = (framed(b"abcdef"), framed(b"second"), framed(b"third!"), framed(b"whole"));
    write_all(&mut peer, &[m1.clone(), m2.clone(), m3, m4.clone()].concat());
    wait_queued(&sock, 4);
    let mut small = [0u8; 4];
    let i = sock.recv_flags(&mut small, Default::default()).unwrap();
    assert_eq!((i.len, i.trunc, i.eor), (4, true, true), "case 17 on {:?}", driver());
    assert_eq!(&small, &m1[..4]);
    // The rest of the first message is gone: the next read is the next message.
    let mut buf = [0u8; 64];
    let i = sock.recv_flags(&mut buf, Default::default()).unwrap();
    assert_eq!(&buf[..i.len], &m2[..], "case 17 on {:?}", driver());
    // Case 18: a zero-byte read consumes one message.
    let i = sock.recv_flags(&mut [], Default::default()).unwrap();
    assert_eq!((i.len, i.trunc), (0, true), "case 18 on {:?}", driver());
    // Case 21: a complete read sets EOR.
    let i = sock.recv_flags(&mut buf, Default::default()).unwrap();
    assert_eq!((&buf[..i.len], i.eor, i.trunc), (&m4[..], true, false), "case 21 on {:?}", driver());
    assert_eq!(sock.stats().unwrap().rx_msgs, 4);
}

fn case_19_20_seqpacket_partial_reads_and_peek() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::SeqPacket).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let msg = framed(b"ten bytes!"); // 14 bytes
    write_all(&mut peer, &msg);
    wait_queued(&sock, 1);
    // Case 20: a peek copies, consumes nothing, sets no flag, counts nothing.
    let mut buf = [0u8; 64];
    let i = sock.recv_flags(&mut buf, connmux::RecvFlags { peek: true }).unwrap();
    assert_eq!((&buf[..i.len], i.eor, i.trunc), (&msg[..], false, false), "case 20 on {:?}", driver());
    assert_eq!(sock.stats().unwrap().rx_msgs, 0);
    // Case 19: SEQPACKET keeps the rest of a short read.
    let mut four = [0u8; 4];
    let i = sock.recv_flags(&mut four, Default::default()).unwrap();
    assert_eq!((i.len, i.eor, i.trunc), (4, false, false), "case 19 on {:?}", driver());
    let i = sock.recv_flags(&mut buf, Default::default()).unwrap();
    assert_eq!((&buf[..i.len], i.eor), (&msg[4..], true), "case 19 on {:?}", driver());
}

/// KCM's round robin (the default, affinity, keeps a connection with the
/// clone that took its last read while that one keeps up:
/// `connmux-core/tests/receive.rs`).
fn case_22_one_read_pass_goes_to_one_socket() {
    let mux = mux_with(|c| c.core.steering = connmux::Steering::RoundRobin);
    let k1 = mux.socket(SockType::Dgram).unwrap();
    let k2 = k1.try_clone().unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let burst: Vec<u8> = (0..5u8).flat_map(|i| framed(&[i; 6])).collect();
    write_all(&mut peer, &burst); // one write: one read pass
    eventually(|| (k1.queued() + k2.queued() == 5).then_some(()));
    assert_eq!((k1.queued(), k2.queued()), (5, 0), "case 22 on {:?}", driver());
    write_all(&mut peer, &burst);
    eventually(|| (k1.queued() + k2.queued() == 10).then_some(()));
    assert_eq!((k1.queued(), k2.queued()), (5, 5), "case 22 on {:?}: the next pass goes to K2", driver());
}

fn case_23_recv_disable_moves_queued_messages() {
    let mux = mux_with(|_| {});
    let k1 = mux.socket(SockType::Dgram).unwrap();
    let k2 = k1.try_clone().unwrap();
    k2.set_recv_disable(true).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    for i in 0..3u8 {
        write_all(&mut peer, &framed(&[i; 3]));
    }
    wait_queued(&k1, 3);
    k2.set_recv_disable(false).unwrap();
    k1.set_recv_disable(true).unwrap();
    assert!(k1.recv_disabled().unwrap());
    wait_queued(&k2, 3);
    assert_eq!(k1.queued(), 0, "case 23 on {:?}", driver());
    write_all(&mut peer, &framed(b"new"));
    wait_queued(&k2, 4);
    k2.set_read_timeout(Some(WAIT)).unwrap();
    for i in 0..3u8 {
        assert_eq!(&k2.recv_msg().unwrap().data[..], &framed(&[i; 3])[..], "case 23 order on {:?}", driver());
    }
    assert_eq!(&k2.recv_msg().unwrap().data[..], &framed(b"new")[..]);
    // Re-enabled, K1 receives again (K2 is not taking: disabled).
    k1.set_recv_disable(false).unwrap();
    k2.set_recv_disable(true).unwrap();
    write_all(&mut peer, &framed(b"k1 again"));
    k1.set_read_timeout(Some(WAIT)).unwrap();
    assert_eq!(&k1.recv_msg().unwrap().data[..], &framed(b"k1 again")[..], "case 23 on {:?}", driver());
}

fn case_24_backpressure_closes_the_window_and_loses_nothing() {
    const CONNS: u32 = 2;
    let mux = mux_with(|c| {
        c.core.psock_rx_buf = 16 << 10;
        c.core.max_msg_size = 16 << 10;
    });
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_recv_disable(true).unwrap();
    let mut peers = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..CONNS {
        let (ours, peer) = pair();
        // Small kernel buffers so that the window closes after little data.
        socket2::SockRef::from(&ours).set_recv_buffer_size(32 << 10).unwrap();
        socket2::SockRef::from(&peer).set_send_buffer_size(32 << 10).unwrap();
        ids.push(mux.attach(&ours, l4()).unwrap());
        peer.set_nonblocking(true).unwrap();
        peers.push((ours, peer));
    }
    // Write 1 KiB messages until each peer's writes would block for 300 ms:
    // nobody reads, so the window must close.
    let mut sent = vec![0u32; CONNS as usize];
    for (c, (_, peer)) in peers.iter_mut().enumerate() {
        let mut blocked = 0;
        let mut pending: Vec<u8> = Vec::new();
        while blocked < 30 {
            assert!(sent[c] < 100_000, "case 24 on {:?}: the window never closed ({} messages)", driver(), sent[c]);
            if pending.is_empty() {
                let mut body = vec![c as u8; 1020];
                body[..4].copy_from_slice(&sent[c].to_be_bytes());
                pending = framed(&body);
                sent[c] += 1;
            }
            match peer.write(&pending) {
                Ok(n) => {
                    pending.drain(..n);
                    blocked = 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    blocked += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("{e}"),
            }
        }
        // Finish the message in progress (the window is closed; it may need a
        // later read to fit, so keep it for after the re-enable).
        peer.set_nonblocking(false).unwrap();
        if !pending.is_empty() {
            let mut p = peer.try_clone().unwrap();
            std::thread::spawn(move || p.write_all(&pending).unwrap());
        }
    }
    for &p in &ids {
        let st = mux.psock_stats(p).unwrap();
        assert!(
            st.rx_msgs <= 1,
            "case 24 on {:?}: {} messages parsed while nobody can take them",
            driver(),
            st.rx_msgs
        );
    }
    assert_eq!(sock.queued(), 0);
    // Re-enable: every message, in per-connection order.
    sock.set_recv_disable(false).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let total: u32 = sent.iter().sum();
    let mut next = vec![0u32; CONNS as usize];
    for _ in 0..total {
        let m = sock.recv_msg().unwrap();
        let conn = ids.iter().position(|&p| p == m.psock).unwrap();
        let s = u32::from_be_bytes(m.data[4..8].try_into().unwrap());
        assert_eq!(s, next[conn], "case 24 on {:?}: order on connection {conn}", driver());
        next[conn] += 1;
    }
    assert_eq!(next, sent, "case 24 on {:?}", driver());
}

fn case_25_closing_a_socket_moves_its_unread_messages() {
    let mux = mux_with(|_| {});
    let k1 = mux.socket(SockType::Dgram).unwrap();
    let k2 = k1.try_clone().unwrap();
    k2.set_recv_disable(true).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    for i in 0..3u8 {
        write_all(&mut peer, &framed(&[i; 5]));
    }
    wait_queued(&k1, 3);
    k2.set_recv_disable(false).unwrap();
    drop(k1);
    k2.set_read_timeout(Some(WAIT)).unwrap();
    for i in 0..3u8 {
        assert_eq!(&k2.recv_msg().unwrap().data[..], &framed(&[i; 5])[..], "case 25 on {:?}", driver());
    }
}

fn case_26_small_rcvbuf_still_takes_a_bigger_message() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_rcvbuf(1024).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let msg = framed(&vec![9u8; 64 << 10]);
    let w = std::thread::spawn(move || {
        peer.write_all(&msg).unwrap();
        (peer, msg)
    });
    let got = sock.recv_msg().unwrap();
    let (_peer, msg) = w.join().unwrap();
    assert!(got.data[..] == msg[..], "case 26 on {:?}", driver());
}

on_both_drivers!(
    case_10_header_split_two_plus_two_needs_more_once,
    case_17_18_21_dgram_truncation_zero_read_and_eor,
    case_19_20_seqpacket_partial_reads_and_peek,
    case_22_one_read_pass_goes_to_one_socket,
    case_23_recv_disable_moves_queued_messages,
    case_24_backpressure_closes_the_window_and_loses_nothing,
    case_25_closing_a_socket_moves_its_unread_messages,
    case_26_small_rcvbuf_still_takes_a_bigger_message,
);

// ---- transmit and lifecycle on real sockets (§7 cases 27, 28, 33, 36, 42) ----

fn case_27_dgram_more_makes_one_message() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    let more = connmux::SendFlags { more: true, ..Default::default() };
    sock.send_flags(&[&4u32.to_be_bytes()[..], b"ab"].concat(), more).unwrap();
    sock.send_flags(b"cd", Default::default()).unwrap();
    assert_eq!(read_framed(&mut peer), b"abcd", "case 27 on {:?}", driver());
    assert_eq!(eventually(|| mux.psock_stats(p).ok().filter(|s| s.tx_msgs > 0)).tx_msgs, 1);
}

fn case_28_seqpacket_message_ends_on_eor() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::SeqPacket).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let open = connmux::SendFlags::default();
    sock.send_flags(&9u32.to_be_bytes(), open).unwrap();
    sock.send_flags(b"one", open).unwrap();
    sock.send_flags(b"two", open).unwrap();
    sock.send_flags(b"333", connmux::SendFlags { eor: true, ..Default::default() }).unwrap();
    // Each write() is its own message.
    sock.send(&framed(b"w1")).unwrap();
    sock.send(&framed(b"w2")).unwrap();
    assert_eq!(read_framed(&mut peer), b"onetwo333", "case 28 on {:?}", driver());
    assert_eq!(read_framed(&mut peer), b"w1");
    assert_eq!(read_framed(&mut peer), b"w2");
}

fn case_33_batch_holds_until_a_send_without_it_and_goes_on_one_connection() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (o1, mut p1) = pair();
    let (o2, mut p2) = pair();
    mux.attach(&o1, l4()).unwrap();
    mux.attach(&o2, l4()).unwrap();
    let batch = connmux::SendFlags { batch: true, ..Default::default() };
    // A second socket's markers, one per idle connection (they rotate, T1
    // first), show each connection's bytes so far.
    let marker = mux.socket(SockType::Dgram).unwrap();
    for i in 0..3u8 {
        sock.send_flags(&framed(&[i; 4]), batch).unwrap();
    }
    let seen = frames_before_markers(&marker, &mut [&mut p1, &mut p2]);
    assert_eq!(seen, Vec::<Vec<u8>>::new(), "case 33 on {:?}: batched bytes on the wire", driver());
    sock.send(&framed(&[3; 4])).unwrap();
    for i in 0..4u8 {
        assert_eq!(read_framed(&mut p1), [i; 4], "case 33 on {:?}", driver());
    }
    // sendmmsg of 16: all on one connection (the other, least recently used), contiguous.
    let msgs: Vec<Vec<u8>> = (0..16u8).map(|i| framed(&[i; 8])).collect();
    let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
    assert_eq!(sock.send_batch(&refs).unwrap(), 16);
    for i in 0..16u8 {
        assert_eq!(read_framed(&mut p2), [i; 8], "case 33 on {:?}", driver());
    }
    // The positive twin: the same wait sees an unbatched message.
    sock.send(&framed(b"plain")).unwrap();
    let seen = frames_before_markers(&marker, &mut [&mut p1, &mut p2]);
    assert_eq!(seen, vec![b"plain".to_vec()], "case 33 on {:?}: an unbatched send", driver());
    drop((o1, o2));
}

fn case_36_reset_mid_message_resends_it_whole_elsewhere() {
    use std::os::fd::AsRawFd;
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_write_timeout(Some(WAIT)).unwrap();
    let (o1, p1) = pair();
    let (o2, mut p2) = pair();
    socket2::SockRef::from(&o1).set_send_buffer_size(32 << 10).unwrap();
    socket2::SockRef::from(&p1).set_recv_buffer_size(32 << 10).unwrap();
    let t1 = mux.attach(&o1, l4()).unwrap();
    mux.attach(&o2, l4()).unwrap();
    let body: Vec<u8> = (0..(800 << 10)).map(|i| (i % 253) as u8).collect();
    let msg = framed(&body);
    sock.send(&msg).unwrap(); // T1 first (least recently used); its peer does not read
    p1.set_nonblocking(true).unwrap();
    eventually(|| {
        let mut b = [0u8; 1];
        matches!(p1.peek(&mut b), Ok(1)).then_some(())
    });
    // Reset T1 from the peer: the write in progress fails.
    connmux_sys::socket::abort(p1.as_raw_fd()).unwrap();
    drop(p1);
    let got = read_framed(&mut p2);
    assert!(got[..] == body[..], "case 36 on {:?}: the message must arrive whole on T2", driver());
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    assert_eq!(ev.psock, t1, "case 36 on {:?}", driver());
    let st = mux.stats();
    assert_eq!(st.tx_retries, 1, "case 36 on {:?}: {st:?}", driver());
    assert_eq!(mux.psock_stats(t1).unwrap().tx_aborts, 1);
    drop((o1, sock));
}

fn case_42_closing_the_last_socket_releases_every_connection() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (o1, mut p1) = pair();
    let (o2, mut p2) = pair();
    mux.attach(&o1, l4()).unwrap();
    mux.attach(&o2, l4()).unwrap();
    drop((o1, o2));
    sock.send(&framed(b"x")).unwrap();
    write_all(&mut p2, &framed(b"y"));
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(b"y")[..]);
    drop(sock);
    let s = mux.stats();
    assert_eq!((s.kcms, s.psocks, s.psock_unattach), (0, 0, 2), "case 42 on {:?}: {s:?}", driver());
    assert_eq!((s.tx_msgs, s.rx_msgs), (1, 1), "case 42 on {:?}: counters kept", driver());
    for p in [&mut p1, &mut p2] {
        let mut rest = Vec::new();
        p.read_to_end(&mut rest).unwrap(); // EOF: the connection closed
        assert!(rest.len() <= 5, "case 42 on {:?}", driver());
    }
}

on_both_drivers!(
    case_27_dgram_more_makes_one_message,
    case_28_seqpacket_message_ends_on_eor,
    case_33_batch_holds_until_a_send_without_it_and_goes_on_one_connection,
    case_36_reset_mid_message_resends_it_whole_elsewhere,
    case_42_closing_the_last_socket_releases_every_connection,
);

// ---- the rest of §7 on real sockets (cases 6, 13, 14, 29, 31, 35, 37, 41) ----

/// A pair whose transmit stalls after a few tens of KiB while its peer does not
/// read (small send buffer on our side, small receive buffer at the peer): a
/// big message sent on it stays partly written until the peer reads.
fn stalling_pair() -> (TcpStream, TcpStream) {
    let (ours, peer) = pair();
    socket2::SockRef::from(&ours).set_send_buffer_size(32 << 10).unwrap();
    socket2::SockRef::from(&peer).set_recv_buffer_size(32 << 10).unwrap();
    (ours, peer)
}

/// A message far larger than what a [`stalling_pair`] can hold in flight.
fn big_body() -> Vec<u8> {
    (0..(800 << 10)).map(|i| (i % 253) as u8).collect()
}

/// Wait until the peer has received the first byte of something.
fn wait_first_byte(peer: &TcpStream) {
    peer.set_nonblocking(true).unwrap();
    eventually(|| {
        let mut b = [0u8; 1];
        matches!(peer.peek(&mut b), Ok(1)).then_some(())
    });
    peer.set_nonblocking(false).unwrap();
}

/// The messages that reach `peers` before markers sent now through `marker`
/// (a socket with no open message), one per connection, waited for without
/// a sleep: a connection's bytes keep their order, so whatever was written
/// there before its marker comes first. Idle connections take the markers
/// in turn, one each; with one connection it takes the one marker.
fn frames_before_markers(marker: &connmux::KcmSocket, peers: &mut [&mut TcpStream]) -> Vec<Vec<u8>> {
    for _ in 0..peers.len() {
        marker.send(&framed(b"marker")).unwrap();
    }
    let mut before = Vec::new();
    for peer in peers.iter_mut() {
        peer.set_read_timeout(Some(WAIT)).unwrap();
        // Bounded: each turn reads one message (or fails after WAIT).
        loop {
            let m = read_framed(peer);
            if m == b"marker" {
                break;
            }
            before.push(m);
            assert!(before.len() < 1000, "no marker among {} messages", before.len());
        }
    }
    before
}

/// Bytes `peer` can read now, until it has been quiet for 200 ms (at most WAIT).
fn drain_quiet(peer: &mut TcpStream) -> usize {
    peer.set_nonblocking(true).unwrap();
    let end = Instant::now() + WAIT;
    let mut quiet_since = Instant::now();
    let mut total = 0;
    let mut buf = vec![0u8; 64 << 10];
    while Instant::now() < end && quiet_since.elapsed() < Duration::from_millis(200) {
        match peer.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n;
                quiet_since = Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break,
        }
    }
    peer.set_nonblocking(false).unwrap();
    total
}

/// Case 6. KCM_RECV_DISABLE is `set_recv_disable(bool)` / `recv_disabled()`:
/// there is no option length or level to get wrong (`docs/kcm-compat.md`), so
/// what remains is that get after set(1) returns 1 and that the option acts
/// on real traffic.
fn case_06_recv_disable_reads_back_and_takes_effect() {
    let mux = mux_with(|_| {});
    let k1 = mux.socket(SockType::Dgram).unwrap();
    let k2 = k1.try_clone().unwrap();
    assert!(!k1.recv_disabled().unwrap(), "case 6 on {:?}: enabled by default", driver());
    k1.set_recv_disable(true).unwrap();
    assert!(k1.recv_disabled().unwrap(), "case 6 on {:?}: get after set(1) returns 1", driver());
    k1.set_recv_disable(true).unwrap();
    assert!(k1.recv_disabled().unwrap(), "case 6 on {:?}: setting it twice keeps it", driver());
    assert!(!k2.recv_disabled().unwrap(), "case 6 on {:?}: the option is per socket", driver());
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    for i in 0..3u8 {
        write_all(&mut peer, &framed(&[i; 4]));
    }
    wait_queued(&k2, 3);
    assert_eq!(k1.queued(), 0, "case 6 on {:?}: a disabled socket is offered nothing", driver());
    k1.set_recv_disable(false).unwrap();
    assert!(!k1.recv_disabled().unwrap(), "case 6 on {:?}: get after set(0) returns 0", driver());
    k2.set_recv_disable(true).unwrap();
    write_all(&mut peer, &framed(b"to k1"));
    k1.set_read_timeout(Some(WAIT)).unwrap();
    // K2's three moved to K1 when K2 was disabled; the new one follows them.
    for i in 0..3u8 {
        assert_eq!(&k1.recv_msg().unwrap().data[..], &framed(&[i; 4])[..], "case 6 on {:?}", driver());
    }
    assert_eq!(&k1.recv_msg().unwrap().data[..], &framed(b"to k1")[..], "case 6 on {:?}", driver());
}

/// L4, except that a message whose first payload byte is 0xEE makes it answer
/// -EINVAL, as a BPF parser returning -22 would (case 13).
struct RefusesEe;

impl connmux::Parser for RefusesEe {
    fn parse(&mut self, buf: &[u8]) -> connmux::Parse {
        match buf.get(..5) {
            Some(h) if h[4] == 0xEE => connmux::Parse::Invalid(connmux::ParseError::Program(libc::EINVAL)),
            Some(h) => connmux::Parse::Length(u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize + 4),
            None => connmux::Parse::NeedMore(5 - buf.len()),
        }
    }
    fn name(&self) -> &str {
        "refuses-ee"
    }
}

fn case_13_parser_error_is_posted_with_its_errno() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, Box::new(RefusesEe)).unwrap();
    // One good message, the refused one, then more that must not be parsed.
    let stream = [framed(b"\x01good"), framed(b"\xEEbad"), framed(b"\x02after")].concat();
    write_all(&mut peer, &stream);
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    assert_eq!(ev.psock, p, "case 13 on {:?}", driver());
    match &ev.error {
        PsockError::Rx(e @ RxError::Parser(connmux::ParseError::Program(22))) => assert_eq!(e.errno(), libc::EINVAL),
        other => panic!("case 13 on {:?}: {other:?}", driver()),
    }
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(b"\x01good")[..], "case 13 on {:?}", driver());
    let st = mux.psock_stats(p).unwrap();
    assert_eq!((st.rx_interrupted, st.rx_msgs), (1, 1), "case 13 on {:?}: RX-Intr", driver());
    // Receive stopped on that connection; the socket has no error.
    write_all(&mut peer, &framed(b"\x03later"));
    let _ = good_neighbour(&mux, &sock);
    sock.set_nonblocking(true).unwrap();
    assert_eq!(sock.recv_msg().unwrap_err().kind(), ErrorKind::WouldBlock, "case 13 on {:?}", driver());
    assert_eq!(mux.psock_stats(p).unwrap().rx_msgs, 1);
}

/// Answers "need more" until 6 bytes are there, then a length of 1: a length
/// inside the bytes it already declined (case 14).
struct LengthInsideGathered;

impl connmux::Parser for LengthInsideGathered {
    fn parse(&mut self, buf: &[u8]) -> connmux::Parse {
        if buf.len() < 6 {
            connmux::Parse::NeedMore(6 - buf.len())
        } else {
            connmux::Parse::Length(1)
        }
    }
    fn name(&self) -> &str {
        "length-inside-gathered"
    }
}

fn case_14_length_inside_gathered_bytes_is_eproto() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, Box::new(LengthInsideGathered)).unwrap();
    write_all(&mut peer, b"abcd");
    eventually(|| (mux.psock_stats(p).unwrap().rx_need_more_hdr >= 1).then_some(()));
    write_all(&mut peer, b"efgh");
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    assert_eq!(ev.psock, p, "case 14 on {:?}", driver());
    match &ev.error {
        PsockError::Rx(e @ RxError::BadLength { len: 1, .. }) => assert_eq!(e.errno(), libc::EPROTO),
        other => panic!("case 14 on {:?}: {other:?}", driver()),
    }
    let st = mux.psock_stats(p).unwrap();
    assert_eq!(st.rx_bad_hdr_len, 1, "case 14 on {:?}", driver());
    assert_eq!(st.rx_msgs, 0, "case 14 on {:?}", driver());
    assert_eq!(mux.psock_error(p), Some(ev.error.clone()));
    // Nothing was delivered and the socket has no error.
    sock.set_nonblocking(true).unwrap();
    assert_eq!(sock.recv_msg().unwrap_err().kind(), ErrorKind::WouldBlock);
    sock.set_nonblocking(false).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let _ = good_neighbour(&mux, &sock);
}

fn case_29_zero_length_sends() {
    let mux = mux_with(|_| {});
    let d = mux.socket(SockType::Dgram).unwrap();
    let s = mux.socket(SockType::SeqPacket).unwrap();
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    // Markers from a third socket show what reached the wire; the positive
    // twin: a message sent before them is seen.
    let mk = mux.socket(SockType::Dgram).unwrap();
    mk.send(&framed(b"first")).unwrap();
    assert_eq!(frames_before_markers(&mk, &mut [&mut peer]), vec![b"first".to_vec()]);
    // No open message: an empty send makes no message, on either type.
    assert_eq!(d.send(&[]).unwrap(), 0);
    assert_eq!(s.send(&[]).unwrap(), 0);
    assert_eq!(s.send_flags(&[], connmux::SendFlags::default()).unwrap(), 0);
    let seen = frames_before_markers(&mk, &mut [&mut peer]);
    assert_eq!(seen, Vec::<Vec<u8>>::new(), "case 29 on {:?}: an empty send put bytes on the wire", driver());
    assert_eq!((d.stats().unwrap().tx_msgs, s.stats().unwrap().tx_msgs), (0, 0), "case 29 on {:?}", driver());
    // SEQPACKET: an empty EOR send completes the open message.
    s.send_flags(&[&5u32.to_be_bytes()[..], b"abc"].concat(), connmux::SendFlags::default()).unwrap();
    s.send_flags(b"de", connmux::SendFlags::default()).unwrap();
    let seen = frames_before_markers(&mk, &mut [&mut peer]);
    assert_eq!(seen, Vec::<Vec<u8>>::new(), "case 29 on {:?}: an open SEQPACKET message went out", driver());
    assert_eq!(s.send_flags(&[], connmux::SendFlags { eor: true, ..Default::default() }).unwrap(), 0);
    assert_eq!(read_framed(&mut peer), b"abcde", "case 29 on {:?}", driver());
    assert_eq!(s.stats().unwrap().tx_msgs, 1);
    // On the wire: "first" (9 bytes), three markers (10 each) and s's message (9).
    let st = eventually(|| mux.psock_stats(p).ok().filter(|st| st.tx_msgs == 5));
    assert_eq!(st.tx_bytes, 9 + 3 * 10 + 9, "case 29 on {:?}", driver());
}

fn case_31_messages_queued_while_one_is_written_follow_it_on_the_same_connection() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (o1, mut p1) = stalling_pair();
    let (o2, mut p2) = pair();
    mux.attach(&o1, l4()).unwrap();
    mux.attach(&o2, l4()).unwrap();
    let body = big_body();
    sock.send(&framed(&body)).unwrap(); // T1 (least recently used), stalls
    wait_first_byte(&p1);
    for i in 0..3u8 {
        sock.send(&framed(&[i; 10])).unwrap();
    }
    // T2 is idle, yet nothing goes there: the socket keeps its connection
    // until its queue is written out. Another socket's marker goes to T2,
    // the one connection free, behind anything the queue put there.
    let mk = mux.socket(SockType::Dgram).unwrap();
    let seen = frames_before_markers(&mk, &mut [&mut p2]);
    assert_eq!(seen, Vec::<Vec<u8>>::new(), "case 31 on {:?}: a queued message went to the idle connection", driver());
    assert!(read_framed(&mut p1) == body, "case 31 on {:?}: the first message", driver());
    for i in 0..3u8 {
        assert_eq!(read_framed(&mut p1), [i; 10], "case 31 on {:?}: order", driver());
    }
    // Both idle now, T2 the less recently used: the marker goes there.
    let seen = frames_before_markers(&mk, &mut [&mut p2]);
    assert_eq!(seen, Vec::<Vec<u8>>::new(), "case 31 on {:?}", driver());
    drop((o1, o2));
}

fn case_35_one_message_larger_than_sndbuf_is_accepted() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_sndbuf(4096).unwrap();
    sock.set_nonblocking(true).unwrap();
    // Empty queue, no connection yet: a 100,004-byte message is accepted whole.
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let msg = framed(&body);
    assert_eq!(sock.send(&msg).unwrap(), msg.len(), "case 35 on {:?}", driver());
    // The limit applies when a new message starts: the next one must wait.
    assert_eq!(sock.send(&framed(b"next")).unwrap_err().kind(), ErrorKind::WouldBlock);
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    assert!(read_framed(&mut peer) == body, "case 35 on {:?}: delivered whole", driver());
    // Written out: a new message can start again.
    sock.set_nonblocking(false).unwrap();
    sock.set_write_timeout(Some(WAIT)).unwrap();
    sock.send(&framed(b"next")).unwrap();
    assert_eq!(read_framed(&mut peer), b"next");
    // A message that is already open continues past SO_SNDBUF (DGRAM MORE).
    let more = connmux::SendFlags { more: true, ..Default::default() };
    let part = vec![7u8; 3000];
    sock.send_flags(&[&9000u32.to_be_bytes()[..], &part].concat(), more).unwrap();
    sock.send_flags(&part, more).unwrap(); // 6,004 bytes open, over 4,096
    assert_eq!(sock.send_flags(&part, Default::default()).unwrap(), 3000, "case 35 on {:?}", driver());
    assert_eq!(read_framed(&mut peer), vec![7u8; 9000], "case 35 on {:?}", driver());
    let st = sock.stats().unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes), (3, (msg.len() + 8 + 9004) as u64), "case 35 on {:?}", driver());
    let ps = eventually(|| mux.psock_stats(p).ok().filter(|s| s.tx_msgs == 3));
    assert_eq!(ps.tx_bytes, st.tx_bytes);
}

fn case_37_unattach_mid_message_resends_it_whole_elsewhere() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (o1, mut p1) = stalling_pair();
    let (o2, mut p2) = pair();
    let t1 = mux.attach(&o1, l4()).unwrap();
    let t2 = mux.attach(&o2, l4()).unwrap();
    let body = big_body();
    let msg = framed(&body);
    sock.send(&msg).unwrap(); // T1 first (least recently used); its peer does not read
    wait_first_byte(&p1);
    mux.unattach(&o1).unwrap();
    let got = read_framed(&mut p2);
    assert!(got == body, "case 37 on {:?}: the message must arrive whole on T2", driver());
    let st = mux.stats();
    assert_eq!(
        (st.psock_unattach, st.psock_unattach_rsvd, st.tx_retries, st.psock.tx_aborts),
        (1, 1, 1, 1),
        "case 37 on {:?}: {st:?}",
        driver()
    );
    assert_eq!(mux.psocks(), vec![t2]);
    assert_eq!(errno(mux.psock_stats(t1).unwrap_err()), libc::ENOENT);
    // T1's peer holds only a truncated message: nothing more is written there.
    let on_t1 = drain_quiet(&mut p1);
    assert!(on_t1 > 0 && on_t1 < msg.len(), "case 37 on {:?}: {on_t1} of {} bytes on T1", driver(), msg.len());
    // The application has T1 back (it may attach it again).
    let t1 = mux.attach(&o1, l4()).unwrap();
    assert_ne!(t1, t2);
    drop(sock);
}

fn case_41_close_drops_unsent_messages() {
    let mux = mux_with(|_| {});
    let k1 = mux.socket(SockType::Dgram).unwrap();
    let k2 = k1.try_clone().unwrap();
    k1.set_nonblocking(true).unwrap();
    for i in 0..3u8 {
        k1.send(&framed(&[i; 8])).unwrap(); // no connection yet: queued
    }
    assert_eq!(k1.stats().unwrap().tx_queued, 3);
    drop(k1);
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    k2.send(&framed(b"marker")).unwrap();
    assert_eq!(read_framed(&mut peer), b"marker", "case 41 on {:?}: the closed socket's messages went out", driver());
    // A second marker: nothing of the closed socket's went out between them.
    let seen = frames_before_markers(&k2, &mut [&mut peer]);
    assert_eq!(seen, Vec::<Vec<u8>>::new(), "case 41 on {:?}", driver());
    assert_eq!(eventually(|| mux.psock_stats(p).ok().filter(|s| s.tx_msgs > 1)).tx_msgs, 2);
    assert_eq!(mux.stats().tx_retries, 0);
}

fn case_41_close_mid_message_aborts_that_connection() {
    let mux = mux_with(|_| {});
    let k1 = mux.socket(SockType::Dgram).unwrap();
    let k2 = k1.try_clone().unwrap();
    k2.set_write_timeout(Some(WAIT)).unwrap();
    let (o1, p1) = stalling_pair();
    let (o2, mut p2) = pair();
    let t1 = mux.attach(&o1, l4()).unwrap();
    mux.attach(&o2, l4()).unwrap();
    k1.send(&framed(&big_body())).unwrap(); // on T1, stalls
    wait_first_byte(&p1);
    drop(k1);
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    assert_eq!(
        ev,
        connmux::PsockEvent { psock: t1, error: PsockError::Tx(libc::EPIPE) },
        "case 41 on {:?}: T1 is aborted with EPIPE",
        driver()
    );
    assert_eq!(mux.psock_error(t1), Some(PsockError::Tx(libc::EPIPE)));
    assert_eq!(mux.psock_stats(t1).unwrap().tx_aborts, 1);
    assert_eq!(mux.stats().tx_retries, 0, "case 41 on {:?}: nothing is resent for a closed socket", driver());
    // T1 carries nothing more: the other socket's messages all go on T2
    // (with T1 usable they would alternate, case 32).
    for i in 0..2u8 {
        k2.send(&framed(&[i; 6])).unwrap();
        assert_eq!(read_framed(&mut p2), [i; 6], "case 41 on {:?}", driver());
    }
    drop((o1, p1));
}

on_both_drivers!(
    case_06_recv_disable_reads_back_and_takes_effect,
    case_13_parser_error_is_posted_with_its_errno,
    case_14_length_inside_gathered_bytes_is_eproto,
    case_29_zero_length_sends,
    case_31_messages_queued_while_one_is_written_follow_it_on_the_same_connection,
    case_35_one_message_larger_than_sndbuf_is_accepted,
    case_37_unattach_mid_message_resends_it_whole_elsewhere,
    case_41_close_drops_unsent_messages,
    case_41_close_mid_message_aborts_that_connection,
);
