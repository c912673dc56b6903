//! A close that waits: messages `send` accepted are written before the
//! socket goes (`KcmSocket::close_wait`), where a plain drop would discard
//! those still queued. Real TCP on loopback, both drivers.

#[macro_use]
mod common;
use common::*;

use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use connmux::SockType;

/// Four threads send 200 messages each on clones of one socket and end with
/// `close_wait`: the peer receives all 800.
fn close_wait_delivers_every_accepted_message() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    // Small TCP buffers and a peer that starts reading late: messages wait
    // in the socket's queues when the senders end.
    socket2::SockRef::from(&ours).set_send_buffer_size(64 << 10).unwrap();
    socket2::SockRef::from(&peer).set_recv_buffer_size(64 << 10).unwrap();
    mux.attach(&ours, l4()).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // Count whole L4 messages until 800, bounded in time.
        let mut buf = vec![0u8; 64 << 10];
        let mut pending = Vec::new();
        let mut got = 0u32;
        let t0 = Instant::now();
        while got < 800 && t0.elapsed() < Duration::from_secs(20) {
            let n = match peer.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // Nothing more within the read timeout: count what came.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(e) => panic!("peer read: {e}"),
            };
            pending.extend_from_slice(&buf[..n]);
            let mut at = 0;
            while pending.len() - at >= 4 {
                let len = u32::from_be_bytes(pending[at..at + 4].try_into().unwrap()) as usize;
                if pending.len() - at < 4 + len {
                    break;
                }
                at += 4 + len;
                got += 1;
            }
            pending.drain(..at);
        }
        got
    });
    let senders: Vec<_> = (0..4u8)
        .map(|t| {
            let s = sock.try_clone().unwrap();
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    let mut body = vec![t; 1024];
                    body[..4].copy_from_slice(&i.to_be_bytes());
                    s.send(&framed(&body)).unwrap();
                }
                s.close_wait(Duration::from_secs(10))
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap().expect("close_wait: every message written within the bound");
    }
    assert_eq!(reader.join().unwrap(), 800, "on {:?}", driver());
    drop(sock);
}

/// With no connection to write to, `flush` waits out its bound and says how
/// many messages are still unsent; the same wait succeeds once one is attached.
fn flush_reports_unsent_messages_at_its_deadline() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_nonblocking(true).unwrap();
    for i in 0..3u8 {
        sock.send(&framed(&[i; 16])).unwrap();
    }
    assert_eq!(sock.unsent().unwrap(), 3);
    let e = sock.flush(Duration::from_millis(100)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert_eq!(sock.unsent().unwrap(), 3);
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    sock.flush(Duration::from_secs(10)).expect("written once a connection is attached");
    assert_eq!(sock.unsent().unwrap(), 0);
    for i in 0..3u8 {
        assert_eq!(read_framed(&mut peer), vec![i; 16]);
    }
}

/// An unattach from one thread racing an addressed send from another, 300
/// times on fresh connections: whatever the order, the counts stay exact.
/// A reply the peer received whole is in `tx_msgs` (not in
/// `tx_addressed_drops`, as when the unattach took the psock while its
/// writer was out), and every accepted reply is counted once, one way or
/// the other.
fn an_unattach_racing_a_send_keeps_the_counts_exact() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let msg = framed(&[0x42; 200]);
    let (mut accepted, mut received) = (0u64, 0u64);
    for _ in 0..300 {
        let (ours, mut peer) = pair();
        let p = mux.attach(&ours, l4()).unwrap();
        let go = std::sync::Barrier::new(2);
        let sent = std::thread::scope(|sc| {
            let sender = sc.spawn(|| {
                go.wait();
                sock.send_to(&msg, p).is_ok()
            });
            go.wait();
            let _ = mux.unattach_id(p);
            sender.join().unwrap()
        });
        accepted += u64::from(sent);
        // The psock is gone; its connection closes with ours.
        eventually(|| (!mux.psocks().contains(&p)).then_some(()));
        drop(ours);
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let _ = peer.read_to_end(&mut got);
        assert!(got.len() % msg.len() == 0 || got.len() < msg.len(), "{} bytes", got.len());
        received += (got.len() / msg.len()) as u64;
    }
    let st = eventually(|| {
        let st = mux.stats().psock;
        (st.tx_msgs + st.tx_addressed_drops == accepted).then_some(st)
    });
    assert_eq!(st.tx_msgs, received, "replies the peers got whole, on {:?}", driver());
    println!("[unattach race] {accepted} accepted, {received} received, {} dropped", st.tx_addressed_drops);
}

/// An unattach from an application thread while the psock's worker reads
/// it (its peer writing without pause, another thread receiving), 300
/// times: nothing of the psock is framed, counted or received once the
/// unattach returns, though its owner (the worker) learns of it only
/// later. A second connection on the same worker, attached after, carries
/// a marker: once the marker is received the worker has run past the
/// unattach, and the mux has counted exactly one message more. (With the
/// owner's feed not applying what it was told first, epoll fails within
/// the first 20 rounds: more received than framed.)
fn an_unattach_racing_the_owners_reads_frames_nothing_after() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let batch: Vec<u8> = (0..64).flat_map(|_| framed(&[0; 8])).collect();
    let marker = framed(&[1; 8]);
    for round in 0..300 {
        let base = mux.stats().rx_msgs;
        let (ours, mut peer) = pair();
        peer.set_write_timeout(Some(Duration::from_millis(20))).unwrap();
        let p = mux.attach_on(&ours, l4(), 0).unwrap();
        let stop = AtomicBool::new(false);
        let got = AtomicU64::new(0);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                // Until told to stop: a full window times out, and the
                // write goes on from where it was (whole messages only).
                let mut off = 0;
                while !stop.load(Ordering::Acquire) {
                    match peer.write(&batch[off..]) {
                        Ok(n) => off = (off + n) % batch.len(),
                        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                        Err(_) => break,
                    }
                }
            });
            let receiver = sc.spawn(|| loop {
                let m = sock.recv_msg().expect("a message within the wait");
                if m.data[4] == 1 {
                    return;
                }
                assert_eq!(m.psock, p, "round {round}");
                got.fetch_add(1, Ordering::AcqRel);
            });
            // The writer stops however this thread ends (a failed check
            // included: the scope waits for it).
            let _stop = StopOnDrop(&stop);
            // Unattach while messages flow, a different moment each round.
            let at = 50 + 37 * (round % 30) as u64;
            eventually(|| (got.load(Ordering::Acquire) >= at).then_some(()));
            mux.unattach_id(p).unwrap();
            let at_unattach = mux.stats().rx_msgs;
            let (theirs, mut peer_q) = pair();
            let q = mux.attach_on(&theirs, l4(), 0).unwrap();
            write_all(&mut peer_q, &marker);
            receiver.join().unwrap();
            let st = mux.stats();
            assert_eq!(
                st.rx_msgs,
                at_unattach + 1,
                "round {round} on {:?}: only the marker after the unattach",
                driver()
            );
            let received = got.load(Ordering::Acquire);
            assert!(
                received <= at_unattach - base,
                "round {round} on {:?}: {received} received of {} framed before the unattach",
                driver(),
                at_unattach - base
            );
            mux.unattach_id(q).unwrap();
        });
    }
}

/// Raises its flag when dropped, unwinding too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

on_both_drivers!(
    close_wait_delivers_every_accepted_message,
    flush_reports_unsent_messages_at_its_deadline,
    an_unattach_racing_a_send_keeps_the_counts_exact,
    an_unattach_racing_the_owners_reads_frames_nothing_after,
);
