//! Stand-alone sockets (`KcmSocket::stand_alone`) over loopback: a clone
//! whose own thread reads the connections attached to it, in its `recv`.
//! Each test runs with the mux's worker threads on either driver (a slot
//! is always an epoll of its own).

#[macro_use]
mod common;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use connmux::{KcmSocket, SockType};

/// Echo every message received on `sock` back to its connection, `n` in all.
fn echo(sock: Arc<KcmSocket>, n: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for i in 0..n {
            let m = sock.recv_msg().unwrap_or_else(|e| panic!("message {i} of {n}: {e}"));
            sock.send_to(&m.data, m.psock).unwrap();
        }
    })
}

/// A client on `peer` sends `n` framed messages (pipelined) and reads
/// every echo: in order when one thread answers (`ordered`); else each
/// once, in any order (two threads may answer one connection's messages,
/// as on AF_KCM).
fn client(mut peer: std::net::TcpStream, tag: u32, n: u32, ordered: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        peer.set_read_timeout(Some(WAIT)).unwrap();
        let msg = |i: u32| [tag.to_be_bytes(), i.to_be_bytes()].concat();
        let all: Vec<u8> = (0..n).flat_map(|i| framed(&msg(i))).collect();
        peer.write_all(&all).unwrap();
        let mut got: Vec<Vec<u8>> = (0..n).map(|_| read_framed(&mut peer)).collect();
        if !ordered {
            got.sort();
        }
        for (i, g) in (0..n).zip(got) {
            assert_eq!(g, msg(i), "echo {i} of {tag}");
        }
    })
}

/// One stand-alone socket, its own two connections: every message is
/// received by its thread and echoed, and the connections sit on its slot
/// (past the worker threads), not on a worker.
fn a_stand_alone_socket_reads_its_own_connections() {
    let mux = mux_with(|c| c.stand_alone = 1);
    let sock = mux.socket(SockType::Dgram).unwrap();
    // (As on AF_KCM, a socket nobody reads would keep what steering gives it.)
    sock.set_recv_disable(true).unwrap();
    let alone = Arc::new(sock.stand_alone().unwrap());
    let mut clients = Vec::new();
    for tag in 0..2u32 {
        let (ours, peer) = pair();
        let p = alone.attach(&ours, l4()).unwrap();
        assert_eq!(mux.psock_worker(p), Some(mux.workers()), "on the stand-alone slot, on {:?}", driver());
        clients.push(client(peer, tag, 2000, true));
    }
    let server = echo(alone.clone(), 4000);
    for c in clients {
        c.join().unwrap();
    }
    server.join().unwrap();
    let st = mux.stats();
    assert_eq!((st.rx_msgs, st.tx_msgs), (4000, 4000), "on {:?}", driver());
}

/// Two stand-alone clones, each with its thread and two connections, and
/// one connection on a worker thread: every message is answered. (The
/// worker's messages reach whichever clone steering picks, which wakes
/// from its pass's wait on its readiness.)
fn stand_alone_clones_and_a_worker_connection_together() {
    let mux = mux_with(|c| c.stand_alone = 2);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_recv_disable(true).unwrap();
    let a = Arc::new(sock.stand_alone().unwrap());
    let b = Arc::new(sock.stand_alone().unwrap());
    let mut clients = Vec::new();
    for (tag, s) in [(0u32, &a), (1, &a), (2, &b), (3, &b)] {
        let (ours, peer) = pair();
        s.attach(&ours, l4()).unwrap();
        clients.push(client(peer, tag, 1000, false));
    }
    let (ours, peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    assert!(mux.psock_worker(p).unwrap() < mux.workers(), "a worker thread's");
    clients.push(client(peer, 4, 1000, false));
    let (sa, sb) = (a.clone(), b.clone());
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Each thread echoes until all 5000 are answered between them.
    let run = |s: Arc<KcmSocket>, done: Arc<std::sync::atomic::AtomicUsize>| {
        std::thread::spawn(move || {
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let end = Instant::now() + WAIT;
            while done.load(std::sync::atomic::Ordering::SeqCst) < 5000 {
                assert!(Instant::now() < end, "not every message received within {WAIT:?}");
                if let Ok(m) = s.recv_msg() {
                    s.send_to(&m.data, m.psock).unwrap();
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    let (ta, tb) = (run(sa, done.clone()), run(sb, done.clone()));
    for c in clients {
        c.join().unwrap();
    }
    ta.join().unwrap();
    tb.join().unwrap();
    assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 5000);
}

/// Non-blocking and with a receive timeout: nothing queued is `WouldBlock`
/// (at once, or after the timeout), and a message a peer sent is received
/// by a later call, which reads it.
fn a_stand_alone_socket_honours_its_mode_and_timeout() {
    let mux = mux_with(|c| c.stand_alone = 1);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_recv_disable(true).unwrap();
    let alone = sock.stand_alone().unwrap();
    let (ours, mut peer) = pair();
    alone.attach(&ours, l4()).unwrap();
    alone.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let t0 = Instant::now();
    let e = alone.recv_msg().expect_err("nothing was sent");
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    assert!(t0.elapsed() >= Duration::from_millis(50), "waited {:?}", t0.elapsed());
    alone.set_nonblocking(true).unwrap();
    assert_eq!(alone.recv_msg().expect_err("still nothing").kind(), std::io::ErrorKind::WouldBlock);
    peer.write_all(&framed(b"hello")).unwrap();
    let m = eventually(|| alone.recv_msg().ok());
    assert_eq!(&m.data[4..], b"hello");
}

/// Closing a stand-alone socket leaves its connections attached, as a
/// closed KCM socket leaves its psocks: their messages go to the mux's other
/// socket, whose replies reach them; once they are unattached its slot is
/// free again. Past the configured slots, `stand_alone` refuses.
fn closing_a_stand_alone_socket_leaves_its_connections_then_frees_its_slot() {
    let mux = mux_with(|c| c.stand_alone = 1);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let alone = sock.stand_alone().unwrap();
    let e = sock.stand_alone().err().expect("one slot only");
    assert_eq!(e.kind(), std::io::ErrorKind::OutOfMemory);
    let (ours, mut peer) = pair();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    alone.attach(&ours, l4()).unwrap();
    peer.write_all(&framed(b"before")).unwrap();
    let m = alone.recv_msg().unwrap();
    assert_eq!(&m.data[4..], b"before");
    drop(alone);
    assert_eq!(mux.psock_count(), 1, "its connection stays attached");
    // Read by the slot's own thread now, received on the other socket,
    // answered on the connection.
    for i in 0..50u8 {
        peer.write_all(&framed(&[b'a', i])).unwrap();
        let m = sock.recv_msg().unwrap_or_else(|e| panic!("message {i} after the close: {e}"));
        assert_eq!(&m.data[4..], &[b'a', i]);
        sock.send_to(&m.data, m.psock).unwrap();
        assert_eq!(read_framed(&mut peer), [b'a', i]);
    }
    // Two at once: the reply to the first waits for the second's (the
    // cork), and goes out with nothing more called on the socket (the
    // slot's thread is no socket's; no worker is asked for it).
    peer.write_all(&[framed(b"c1"), framed(b"c2")].concat()).unwrap();
    eventually(|| (sock.queued() == 2).then_some(()));
    let m = sock.recv_msg().unwrap();
    sock.send_to(&m.data, m.psock).unwrap();
    assert_eq!(read_framed(&mut peer), b"c1", "a reply corked by a plain socket on a slot's connection");
    let m = sock.recv_msg().unwrap();
    sock.send_to(&m.data, m.psock).unwrap();
    assert_eq!(read_framed(&mut peer), b"c2");
    assert!(sock.stand_alone().is_err(), "the slot is taken while its connections are attached");
    mux.unattach(&ours).unwrap();
    let again = eventually(|| sock.stand_alone().ok());
    let (ours, _peer) = pair();
    again.attach(&ours, l4()).expect("a connection attached there once is attachable again");
}

/// Two threads receiving on one stand-alone socket: while one runs its
/// pass the other waits on its readiness; once the first has gone (its
/// call timed out in the pass), the second reads the connection itself
/// (else nobody would), and every message is answered.
fn two_threads_on_one_stand_alone_socket() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mux = mux_with(|c| c.stand_alone = 1);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_recv_disable(true).unwrap();
    let alone = Arc::new(sock.stand_alone().unwrap());
    let (ours, mut peer) = pair();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    alone.attach(&ours, l4()).unwrap();
    alone.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    // The first makes one call, which nothing answers: it runs the pass
    // until its timeout, and leaves. The second, started meanwhile,
    // answers every message sent after that.
    let first_done = Arc::new(AtomicBool::new(false));
    let first = {
        let (s, done) = (alone.clone(), first_done.clone());
        std::thread::spawn(move || {
            let r = s.recv_msg();
            assert_eq!(r.err().map(|e| e.kind()), Some(std::io::ErrorKind::WouldBlock), "nothing was sent yet");
            done.store(true, Ordering::SeqCst);
        })
    };
    let second = {
        let s = alone.clone();
        std::thread::spawn(move || {
            let end = Instant::now() + WAIT;
            let mut answered = 0;
            while answered < 100 {
                assert!(Instant::now() < end, "{answered} of 100 answered within {WAIT:?}");
                if let Ok(m) = s.recv_msg() {
                    s.send_to(&m.data, m.psock).unwrap();
                    answered += 1;
                }
            }
        })
    };
    let end = Instant::now() + WAIT;
    while !first_done.load(Ordering::SeqCst) {
        assert!(Instant::now() < end, "the first call never returned");
        std::thread::yield_now();
    }
    first.join().unwrap();
    let all: Vec<u8> = (0..100u8).flat_map(|i| framed(&[2, i])).collect();
    peer.write_all(&all).unwrap();
    let got: Vec<Vec<u8>> = (0..100).map(|_| read_framed(&mut peer)).collect();
    assert_eq!(got, (0..100u8).map(|i| vec![2, i]).collect::<Vec<_>>(), "in order, on {:?}", driver());
    second.join().unwrap();
}

/// A mux with one stand-alone slot, its first socket (receive-disabled:
/// nobody reads it), a stand-alone clone of it, and a connection attached
/// to the clone once its peer (`peer`) had sent `sent`: the clone's first
/// read takes it all.
struct OneAlone {
    mux: connmux::Mux,
    sock: KcmSocket,
    alone: KcmSocket,
    peer: std::net::TcpStream,
    _ours: std::net::TcpStream,
}

fn one_alone(ty: SockType, sent: &[u8]) -> OneAlone {
    let mux = mux_with(|c| c.stand_alone = 1);
    let sock = mux.socket(ty).unwrap();
    sock.set_recv_disable(true).unwrap();
    let alone = sock.stand_alone().unwrap();
    let (ours, mut peer) = pair();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    peer.write_all(sent).unwrap();
    alone.attach(&ours, l4()).unwrap();
    OneAlone { mux, sock, alone, peer, _ours: ours }
}

/// The messages one read of a stand-alone socket's connection brings are
/// received by every receive form, in order, each once: `recv_msg`, `peek`
/// then `recv`, a short buffer (DGRAM: truncated; SEQPACKET: read on),
/// `recv_batch`; `queued` counts those not yet received. The peer sent
/// them and closed its write side: every reply reaches it before the
/// connection's close in order (its FIN waits for the messages the socket
/// has not received).
fn a_stand_alone_socket_receives_a_whole_read_in_every_form() {
    for ty in [SockType::Dgram, SockType::SeqPacket] {
        let body = |i: u8| vec![i; 8 + i as usize];
        let n = 12u8;
        let all: Vec<u8> = (0..n).flat_map(|i| framed(&body(i))).collect();
        let OneAlone { mux: _mux, sock: _sock, alone, mut peer, _ours } = one_alone(ty, &all);
        peer.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got: Vec<(Vec<u8>, connmux::PsockId)> = Vec::new();
        let m = alone.recv_msg().unwrap();
        got.push((m.data.to_vec(), m.psock));
        assert_eq!(alone.queued(), n as usize - 1, "the rest of the read, on {ty:?}");
        let mut buf = [0u8; 256];
        let peeked = alone.recv_flags(&mut buf, connmux::RecvFlags { peek: true }).unwrap();
        let info = alone.recv_from(&mut buf).unwrap();
        assert_eq!((peeked.len, info.len, info.eor, info.trunc), (info.len, framed(&body(1)).len(), true, false));
        got.push((buf[..info.len].to_vec(), info.psock));
        let whole = framed(&body(2));
        let mut short = [0u8; 6];
        let info = alone.recv_flags(&mut short, Default::default()).unwrap();
        assert_eq!(&short[..info.len], &whole[..6]);
        match ty {
            SockType::Dgram => assert!(info.trunc && info.eor, "truncated: {info:?}"),
            SockType::SeqPacket => {
                assert!(!info.eor && !info.trunc, "read on: {info:?}");
                let rest = alone.recv_from(&mut buf).unwrap();
                assert!(rest.eor, "{rest:?}");
                assert_eq!(&buf[..rest.len], &whole[6..]);
            }
        }
        got.push((whole, info.psock));
        let mut batch = Vec::new();
        assert_eq!(alone.recv_batch(&mut batch, 3).unwrap(), 3);
        got.extend(batch.into_iter().map(|m| (m.data.to_vec(), m.psock)));
        while got.len() < n as usize {
            let m = alone.recv_msg().unwrap();
            got.push((m.data.to_vec(), m.psock));
        }
        assert_eq!(alone.queued(), 0);
        for (i, (data, p)) in got.iter().enumerate() {
            assert_eq!(data, &framed(&body(i as u8)), "message {i} on {ty:?}");
            alone.send_to(data, *p).unwrap();
        }
        // The replies, then the end of the stream.
        for i in 0..n {
            assert_eq!(read_framed(&mut peer), body(i), "reply {i} on {ty:?}");
        }
        // (The socket looks again: its slot's pass applies what it took.)
        alone.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut rest = Vec::new();
        let end = Instant::now() + WAIT;
        loop {
            let _ = alone.recv_msg();
            peer.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            match std::io::Read::read_to_end(&mut peer, &mut rest) {
                Ok(_) => break,
                Err(_) => assert!(Instant::now() < end, "no close in order within {WAIT:?}"),
            }
        }
        assert!(rest.is_empty(), "nothing past the replies: {rest:?}");
    }
}

/// `KCM_RECV_DISABLE` on a stand-alone socket holding unread messages
/// (acceptance case 23): they become readable on the other socket, in
/// order, and none stays with it; closing it does the same.
fn a_stand_alone_socket_disabled_or_closed_hands_on_what_it_holds() {
    for close in [false, true] {
        let mux = mux_with(|c| c.stand_alone = 1);
        let other = mux.socket(SockType::Dgram).unwrap();
        other.set_read_timeout(Some(WAIT)).unwrap();
        let alone = other.stand_alone().unwrap();
        let (ours, mut peer) = pair();
        let n = 10u8;
        // All in the connection before it is attached: one read takes it.
        let all: Vec<u8> = (0..n).flat_map(|i| framed(&[i; 5])).collect();
        peer.write_all(&all).unwrap();
        alone.attach(&ours, l4()).unwrap();
        let m = alone.recv_msg().unwrap();
        assert_eq!(&m.data[4..], &[0; 5]);
        assert_eq!(alone.queued(), n as usize - 1);
        match close {
            false => {
                alone.set_recv_disable(true).unwrap();
                assert_eq!(alone.queued(), 0, "nothing stays with a disabled socket");
            }
            true => drop(alone),
        }
        for i in 1..n {
            let m = other.recv_msg().unwrap_or_else(|e| panic!("message {i} (close: {close}): {e}"));
            assert_eq!(&m.data[4..], &[i; 5], "in order (close: {close})");
        }
        assert_eq!(other.queued(), 0);
    }
}

/// A stand-alone socket's replies to its own connection wait while it
/// has more to receive (counted by `unsent`), and leave in the order they
/// were sent: before a send that goes through the hub (a plain `send`), on
/// `flush`, or with the reply to the last message; its counters count
/// them.
fn a_stand_alone_socket_sends_its_replies_in_order() {
    let n = 6u8;
    let all: Vec<u8> = (0..n).flat_map(|i| framed(&[i; 3])).collect();
    let OneAlone { mux: _mux, sock: _sock, alone, mut peer, _ours } = one_alone(SockType::Dgram, &all);
    let reply = |i: u8| framed(&[b'r', i]);
    let m = alone.recv_msg().unwrap();
    alone.send_to(&reply(0), m.psock).unwrap();
    assert_eq!(alone.unsent().unwrap(), 1, "waits while more is to be received");
    // A plain send, written at once through the hub (on the one
    // connection): the reply waiting goes first.
    let _ = alone.recv_msg().unwrap();
    alone.send(&reply(1)).unwrap();
    assert_eq!(read_framed(&mut peer), [b'r', 0]);
    assert_eq!(read_framed(&mut peer), [b'r', 1]);
    let m = alone.recv_msg().unwrap();
    alone.send_to(&reply(2), m.psock).unwrap();
    alone.flush(WAIT).unwrap();
    assert_eq!(read_framed(&mut peer), [b'r', 2], "written by flush");
    for i in 3..n {
        let m = alone.recv_msg().unwrap();
        assert_eq!(&m.data[4..], &[i; 3]);
        alone.send_to(&reply(i), m.psock).unwrap();
    }
    for i in 3..n {
        assert_eq!(read_framed(&mut peer), [b'r', i], "with the reply to the last");
    }
    assert_eq!(alone.unsent().unwrap(), 0);
    let st = alone.stats().unwrap();
    assert_eq!((st.rx_msgs, st.tx_msgs), (n as u64, n as u64));
}

/// More than a connection takes at once (its rest waits in the hub).
const BIG: usize = 8 << 20;

/// A stand-alone socket's replies waiting for a connection whose write
/// another socket left half done (its peer reads slowly) go behind that
/// message, never into it, though its backlog is past its limit then.
fn a_stand_alone_socket_replies_behind_another_sockets_half_written_message() {
    let all: Vec<u8> = (0..3u8).flat_map(|i| framed(&[i; 3])).collect();
    let OneAlone { mux, sock: other, alone, mut peer, _ours } = one_alone(SockType::Dgram, &all);
    let reply = |i: u8| framed(&[b'r', i]);
    let m = alone.recv_msg().unwrap();
    alone.send_to(&reply(0), m.psock).unwrap();
    let big = framed(&vec![7u8; BIG]);
    other.send_to(&big, m.psock).unwrap();
    for i in 1..3 {
        let m = alone.recv_msg().unwrap();
        alone.send_to(&reply(i), m.psock).unwrap();
    }
    let reader = std::thread::spawn(move || {
        let first = read_framed(&mut peer);
        let rest: Vec<Vec<u8>> = (0..3).map(|_| read_framed(&mut peer)).collect();
        (first.len(), first.iter().all(|&b| b == 7), rest)
    });
    // (The slot writes its connection's rest in its passes.)
    alone.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let end = Instant::now() + WAIT;
    while !reader.is_finished() {
        assert!(Instant::now() < end, "not all written within {WAIT:?}: {:?}", mux.stats());
        let _ = alone.recv_msg();
    }
    let (len, whole, rest) = reader.join().unwrap();
    assert_eq!((len, whole), (BIG, true), "the large message whole, first");
    assert_eq!(rest, (0..3u8).map(|i| vec![b'r', i]).collect::<Vec<_>>(), "then the replies, in order");
}

/// A reply corked on a connection that is unattached before it is written
/// is dropped and counted, never written to the connection the mux let
/// go: what its owner writes there next is the first thing the peer
/// reads.
fn a_corked_reply_to_a_connection_unattached_since_is_dropped() {
    let all: Vec<u8> = (0..3u8).flat_map(|i| framed(&[i; 3])).collect();
    let OneAlone { mux, sock: _sock, alone, mut peer, _ours: mut ours } = one_alone(SockType::Dgram, &all);
    let m = alone.recv_msg().unwrap();
    assert_eq!(alone.queued(), 2, "two more kept: the reply corks");
    alone.send_to(&framed(b"reply"), m.psock).unwrap();
    assert_eq!(alone.unsent().unwrap(), 1, "the reply waits");
    let before = mux.stats().psock.tx_addressed_drops;
    mux.unattach(&ours).unwrap();
    alone.flush(WAIT).unwrap();
    assert_eq!(alone.unsent().unwrap(), 0);
    assert_eq!(mux.stats().psock.tx_addressed_drops - before, 1, "dropped and counted");
    write_all(&mut ours, &framed(b"the owner's"));
    assert_eq!(read_framed(&mut peer), b"the owner's", "nothing of the mux's after the unattach");
}

on_both_drivers!(
    a_corked_reply_to_a_connection_unattached_since_is_dropped,
    a_stand_alone_socket_replies_behind_another_sockets_half_written_message,
    a_stand_alone_socket_sends_its_replies_in_order,
    a_stand_alone_socket_disabled_or_closed_hands_on_what_it_holds,
    a_stand_alone_socket_receives_a_whole_read_in_every_form,
    two_threads_on_one_stand_alone_socket,
    a_stand_alone_socket_reads_its_own_connections,
    stand_alone_clones_and_a_worker_connection_together,
    a_stand_alone_socket_honours_its_mode_and_timeout,
    closing_a_stand_alone_socket_leaves_its_connections_then_frees_its_slot,
);
