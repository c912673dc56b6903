//! Large messages on loopback TCP, both drivers: their bodies are read
//! straight into the psock's assembly buffer (`Mux::rx_lend`); what must hold
//! is what holds for every message: whole, in order, counted once, within the
//! receive limits, under the assembly deadline, through backpressure and
//! in-place serving.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use connmux::service::Verdict;
use connmux::{Bytes, PsockError, PsockId, RxError, SockType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A message of `len` body bytes whose contents name it (`seq`) throughout.
fn body(seq: u32, len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(seq) as u8).collect();
    if len >= 4 {
        b[..4].copy_from_slice(&seq.to_be_bytes());
    }
    b
}

/// Sizes around and well above the lending threshold, with small ones between.
fn sizes(rng: &mut StdRng, n: usize) -> Vec<usize> {
    (0..n)
        .map(|_| match rng.gen_range(0..8) {
            0 | 1 => rng.gen_range(4..300),
            2 => rng.gen_range((16 << 10) - 8..(16 << 10) + 8),
            3 | 4 => rng.gen_range(20 << 10..100 << 10),
            5 | 6 => 64 << 10,
            _ => rng.gen_range(200 << 10..(1 << 20) - 4),
        })
        .collect()
}

/// Write `wire` in random pieces, sometimes pausing (so reads see partial
/// headers and bodies, and whole runs of messages).
fn write_in_pieces(mut peer: TcpStream, wire: Vec<u8>, seed: u64) -> TcpStream {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut at = 0;
    while at < wire.len() {
        let n = match rng.gen_range(0..4) {
            0 => rng.gen_range(1..8),
            1 => rng.gen_range(1..5000),
            _ => rng.gen_range(1..300_000),
        }
        .min(wire.len() - at);
        peer.write_all(&wire[at..at + n]).unwrap();
        at += n;
        if rng.gen_bool(0.05) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    peer
}

fn large_and_small_messages_arrive_whole_in_order_and_counted_once() {
    let mux = mux_with(|c| c.core.max_msg_size = 1 << 20);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    let mut rng = StdRng::seed_from_u64(0x1a7e);
    let msgs: Vec<Vec<u8>> =
        sizes(&mut rng, 60).into_iter().enumerate().map(|(i, n)| framed(&body(i as u32, n))).collect();
    let wire: Vec<u8> = msgs.concat();
    let total = wire.len();
    let w = std::thread::spawn(move || write_in_pieces(peer, wire, 7));
    for (i, want) in msgs.iter().enumerate() {
        let got = sock.recv_msg().unwrap_or_else(|e| panic!("message {i} on {:?}: {e}", driver()));
        assert_eq!(got.data.len(), want.len(), "message {i} on {:?}", driver());
        assert!(got.data[..] == want[..], "message {i} on {:?}: contents differ", driver());
    }
    let _peer = w.join().unwrap();
    let st = mux.psock_stats(p).unwrap();
    assert_eq!((st.rx_msgs, st.rx_bytes), (msgs.len() as u64, total as u64), "on {:?}", driver());
}

fn timeout_mid_large_body_drops_it_and_counts_once() {
    let mux = mux_with(|c| {
        c.core.max_msg_size = 1 << 20;
        c.core.assembly_timeout = Some(Duration::from_millis(150));
    });
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    // A whole large message first (later reads are lent), then most of another.
    let first = framed(&body(1, 300 << 10));
    let second = framed(&body(2, 300 << 10));
    let w = std::thread::spawn(move || {
        peer.write_all(&first).unwrap();
        peer.write_all(&second[..200 << 10]).unwrap();
        peer
    });
    let got = sock.recv_msg().unwrap();
    assert_eq!(got.data.len(), (300 << 10) + 4);
    let start = Instant::now();
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    assert_eq!((ev.psock, ev.error), (p, PsockError::Rx(RxError::Timeout)), "on {:?}", driver());
    assert!(start.elapsed() < Duration::from_secs(2));
    let _peer = w.join().unwrap();
    let st = mux.psock_stats(p).unwrap();
    assert_eq!((st.rx_msg_timeouts, st.rx_msgs, st.rx_bytes), (1, 1, (300 << 10) + 4), "on {:?}", driver());
    sock.set_nonblocking(true).unwrap();
    assert!(sock.recv_msg().is_err(), "nothing partial is delivered");
    // Another connection still carries large messages.
    let (o2, mut p2) = pair();
    mux.attach(&o2, l4()).unwrap();
    let m = framed(&body(3, 100 << 10));
    let m2 = m.clone();
    let w = std::thread::spawn(move || {
        p2.write_all(&m2).unwrap();
        p2
    });
    sock.set_nonblocking(false).unwrap();
    assert!(sock.recv_msg().unwrap().data[..] == m[..]);
    let _p2 = w.join().unwrap();
}

fn large_messages_wait_under_backpressure_and_lose_nothing() {
    // The socket holds about one message: the next completes and waits in
    // the psock, which stops reading (the window closes) until it drains.
    let mux = mux_with(|c| {
        c.core.max_msg_size = 1 << 20;
        c.core.sock_rcvbuf = 64 << 10;
    });
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    let msgs: Vec<Vec<u8>> = (0..12).map(|i| framed(&body(i, [150 << 10, 70 << 10, 500][i as usize % 3]))).collect();
    let wire = msgs.concat();
    let w = std::thread::spawn(move || write_in_pieces(peer, wire, 11));
    // Nobody reads: the core must not hold more than its limits. Once it
    // is full the worker stops reading and the bytes pile up in the
    // connection's receive queue, or (io_uring) what one ring wait had
    // already delivered is kept by the driver for that connection, and the
    // writer may finish: waited for, not slept on.
    eventually(|| {
        use std::os::fd::AsRawFd;
        (connmux_sys::socket::inq(ours.as_raw_fd()).unwrap() >= 16 << 10 || w.is_finished()).then_some(())
    });
    let held = mux.proc_kcm();
    assert!(mux.stats().rx_msgs <= 3, "on {:?}: messages parsed while nobody takes them:\n{held}", driver());
    for (i, want) in msgs.iter().enumerate() {
        let got = sock.recv_msg().unwrap();
        assert!(got.data[..] == want[..], "message {i} on {:?}", driver());
    }
    let _peer = w.join().unwrap();
    assert_eq!(mux.psock_stats(p).unwrap().rx_msgs, msgs.len() as u64);
}

fn echo_service_returns_large_messages_intact() {
    let mux = mux_with(|c| c.core.max_msg_size = 1 << 20);
    let handler = Arc::new(|req: Bytes, _from: PsockId, _s: &mut bytes::BytesMut| Verdict::Reply(req));
    let svc = l4_service(mux, handler);
    let mut c = TcpStream::connect(svc.local_addr()).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    let mut rng = StdRng::seed_from_u64(0xec40);
    let msgs: Vec<Vec<u8>> =
        sizes(&mut rng, 40).into_iter().enumerate().map(|(i, n)| framed(&body(i as u32, n))).collect();
    // Two in flight, as `connmux bench size` runs it.
    let mut sent = 0;
    for (i, want) in msgs.iter().enumerate() {
        while sent < msgs.len() && sent < i + 2 {
            c.write_all(&msgs[sent]).unwrap();
            sent += 1;
        }
        let mut got = vec![0u8; want.len()];
        c.read_exact(&mut got).unwrap();
        assert!(got == *want, "reply {i} on {:?}", driver());
    }
    // (Counted as the messages reach the core; `eventually`: the last read may still be in its worker.)
    let st = eventually(|| Some(svc.mux().stats()).filter(|st| st.rx_msgs >= msgs.len() as u64));
    assert_eq!(st.rx_msgs, msgs.len() as u64);
    assert_eq!(st.rx_bytes, msgs.iter().map(Vec::len).sum::<usize>() as u64);
    svc.shutdown();
}

/// What the multiplexor holds of a large message, as it is read and until
/// it is taken, is what `Mux::memory_used` says (the figure the servers'
/// allocator trims follow); none once it is taken.
fn memory_used_follows_a_large_message_until_it_is_taken() {
    let mux = mux_with(|c| c.core.max_msg_size = 1 << 20);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    let _p = mux.attach(&ours, l4()).unwrap();
    assert_eq!(mux.memory_used(), 0, "nothing read yet");
    let msg = framed(&body(1, 512 << 10));
    let half = msg.len() / 2;
    write_all(&mut peer, &msg[..half]);
    let held = eventually(|| Some(mux.memory_used()).filter(|&n| n >= half));
    assert!(held <= msg.len() + (64 << 10), "half a message read: {held} bytes held ({} sent)", msg.len());
    write_all(&mut peer, &msg[half..]);
    eventually(|| Some(mux.memory_used()).filter(|&n| n >= msg.len()));
    let got = sock.recv_msg().unwrap();
    assert!(got.data[..] == msg[..], "the message, whole, on {:?}", driver());
    // Taken: none of it held. The io_uring driver keeps a receive armed
    // straight into the psock's buffer for the next message (as large as
    // this one, predicted), which counts whole while it is armed: its
    // allocation, with the page its first byte is placed within.
    let after = mux.memory_used();
    match driver() {
        connmux::Driver::Epoll => assert_eq!(after, 0, "taken: nothing held"),
        _ => assert!(after <= msg.len() + 4096, "taken: {after} bytes held, more than the next message's receive"),
    }
}

on_both_drivers!(
    memory_used_follows_a_large_message_until_it_is_taken,
    large_and_small_messages_arrive_whole_in_order_and_counted_once,
    timeout_mid_large_body_drops_it_and_counts_once,
    large_messages_wait_under_backpressure_and_lose_nothing,
    echo_service_returns_large_messages_intact,
);
