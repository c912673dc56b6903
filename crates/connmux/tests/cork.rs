//! Addressed sends made while the socket has more messages queued to receive
//! are corked (the replies to a backlog leave together): a corked reply
//! still reaches its peer when the application receives nothing more (the
//! psock's worker writes it), and replies to many connections, answered one
//! message at a time or in batches, arrive whole and in order.

#[macro_use]
mod common;

use std::io::Read;
use std::net::TcpStream;

use common::*;
use connmux::SockType;

/// The peer's next L4 message, or a failure naming what was waited for.
fn reply(peer: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut hdr = [0u8; 4];
    peer.read_exact(&mut hdr).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut body = vec![0u8; u32::from_be_bytes(hdr) as usize];
    peer.read_exact(&mut body).unwrap_or_else(|e| panic!("{what}: {e}"));
    body
}

/// A mux, a socket and a connection whose peer sent four requests, all
/// queued on the socket (the mux and our end are kept alive by the caller).
fn four_queued() -> (connmux::Mux, connmux::KcmSocket, TcpStream, TcpStream) {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    mux.attach(&ours, l4()).unwrap();
    let burst: Vec<u8> = (0..4u8).flat_map(|i| framed(&[i; 8])).collect();
    write_all(&mut peer, &burst);
    eventually(|| (sock.queued() == 4).then_some(()));
    (mux, sock, ours, peer)
}

/// Four requests queued; the application answers the first and receives no
/// more: the answer still arrives (corked, then written by the worker).
fn a_corked_reply_arrives_without_another_receive() {
    let (_mux, sock, _ours, mut peer) = four_queued();
    let m = sock.recv_msg().unwrap();
    assert_eq!(sock.queued(), 3, "the rest stays queued");
    sock.send_to(b"\0\0\0\x06answer", m.psock).unwrap();
    assert_eq!(reply(&mut peer, "the corked answer"), b"answer");
    eventually(|| (sock.unsent().unwrap() == 0).then_some(()));
}

/// As above, twice in a row: the worker has written the first answer when
/// the second is corked on the same psock (still listed as corked, the
/// socket not having waited since); it is asked again, and the second
/// answer arrives too with no further call on the socket.
fn a_second_corked_reply_after_the_worker_wrote_the_first_arrives() {
    let (_mux, sock, _ours, mut peer) = four_queued();
    for answer in [&b"\0\0\0\x05first"[..], b"\0\0\0\x06second"] {
        let m = sock.recv_msg().unwrap();
        assert!(sock.queued() > 0, "the rest stays queued");
        sock.send_to(answer, m.psock).unwrap();
        assert_eq!(reply(&mut peer, "a corked answer"), &answer[4..]);
    }
    eventually(|| (sock.unsent().unwrap() == 0).then_some(()));
}

/// A corked reply, then a message too large to wait in the socket (past
/// `Config::read_chunk`: it goes through the hub) to the same connection,
/// then a small one again: the peer reads them in the order sent.
fn a_corked_reply_and_a_large_send_after_it_keep_their_order() {
    let (_mux, sock, _ours, mut peer) = four_queued();
    let m = sock.recv_msg().unwrap();
    sock.send_to(&framed(b"first"), m.psock).unwrap();
    let big = framed(&vec![9u8; 200 << 10]);
    let reader = std::thread::spawn(move || {
        let got: Vec<Vec<u8>> = (0..3).map(|i| reply(&mut peer, &format!("message {i}"))).collect();
        got
    });
    sock.send_to(&big, m.psock).unwrap();
    sock.send_to(&framed(b"third"), m.psock).unwrap();
    sock.flush(WAIT).unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got[0], b"first");
    assert_eq!(got[1], big[4..], "the large one second, whole");
    assert_eq!(got[2], b"third");
}

/// Four connections pipelining 200 requests each at an application thread
/// that answers every request where it came from (`recv_msg` + `send_to`,
/// then `recv_batch` + `send_batch_to`): each peer gets its 200 answers in
/// order.
fn answers_to_a_backlog_arrive_in_order() {
    for batch in [false, true] {
        let mux = mux_with(|_| {});
        let sock = mux.socket(SockType::Dgram).unwrap();
        sock.set_read_timeout(Some(WAIT)).unwrap();
        const CONNS: usize = 4;
        const EACH: u32 = 200;
        let mut peers = Vec::new();
        for _ in 0..CONNS {
            let (ours, peer) = pair();
            peer.set_read_timeout(Some(WAIT)).unwrap();
            mux.attach(&ours, l4()).unwrap();
            peers.push(peer);
        }
        let mut readers = Vec::new();
        for (c, mut peer) in peers.into_iter().enumerate() {
            let mut all = Vec::new();
            for i in 0..EACH {
                all.extend_from_slice(&framed(&(c as u32 * 1000 + i).to_be_bytes()));
            }
            readers.push(std::thread::spawn(move || {
                write_all(&mut peer, &all);
                for i in 0..EACH {
                    let got = reply(&mut peer, &format!("answer {i} of connection {c}"));
                    assert_eq!(got, (c as u32 * 1000 + i).to_be_bytes(), "batch {batch}, connection {c}, answer {i}");
                }
            }));
        }
        let total = CONNS * EACH as usize;
        let mut answered = 0;
        let mut got = Vec::new();
        while answered < total {
            if batch {
                got.clear();
                sock.recv_batch(&mut got, 16).unwrap();
                let out: Vec<_> = got.iter().map(|m| (Some(m.psock), &m.data[..])).collect();
                let mut sent = 0;
                while sent < out.len() {
                    sent += sock.send_batch_to(&out[sent..]).unwrap();
                }
                answered += got.len();
            } else {
                let m = sock.recv_msg().unwrap();
                sock.send_to(&m.data, m.psock).unwrap();
                answered += 1;
            }
        }
        for r in readers {
            r.join().unwrap();
        }
    }
}

on_both_drivers!(
    a_corked_reply_and_a_large_send_after_it_keep_their_order,
    a_corked_reply_arrives_without_another_receive,
    a_second_corked_reply_after_the_worker_wrote_the_first_arrives,
    answers_to_a_backlog_arrive_in_order
);
