//! A reply backlog far longer than one write call takes is written whole
//! once the connection has room, both drivers: a call writes at most a
//! bounded run of chunks in a row, and the last chunk of its run is told
//! to the core before it lets go (a chunk taken and never told stays out
//! with its writer, and nobody may write the psock again: the peer waits
//! forever for the rest).

#[macro_use]
mod common;

use std::io::Read;

use common::*;
use connmux::SockType;
use socket2::SockRef;

/// 100,000 small replies queue while the connection's buffers are full,
/// then the buffer grows to take all of them with no read: one flush
/// writes chunk after chunk, past its bound, and every reply arrives in
/// order.
fn a_backlog_longer_than_one_flush_arrives_whole() {
    const N: u32 = 100_000;
    // (Replies the peer has not read stay within `psock_sndbuf`.)
    let mux = mux_with(|c| c.core.psock_sndbuf = 64 << 20);
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    // Small buffers while the backlog builds: a few replies fill them.
    SockRef::from(&ours).set_send_buffer_size(4096).unwrap();
    SockRef::from(&peer).set_recv_buffer_size(4096).unwrap();
    let p = mux.attach(&ours, l4()).unwrap();
    for i in 0..N {
        sock.send_to(&framed(&i.to_be_bytes()), p).unwrap();
    }
    let waiting = sock.unsent().unwrap();
    assert!(waiting > 64 * 1024, "{waiting} replies wait: fewer than the test needs");
    // Room for all of them in our send buffer, with no read: the next
    // flush (this send's, or the worker's on the room) writes them all.
    // (The peer's window opens too, or reading them takes many seconds.)
    SockRef::from(&ours).set_send_buffer_size(16 << 20).unwrap();
    SockRef::from(&peer).set_recv_buffer_size(4 << 20).unwrap();
    sock.send_to(&framed(&N.to_be_bytes()), p).unwrap();
    for i in 0..=N {
        let mut got = [0u8; 8];
        peer.read_exact(&mut got).unwrap_or_else(|e| panic!("reply {i} of {N} on {:?}: {e}", driver()));
        assert_eq!(got, framed(&i.to_be_bytes())[..], "reply {i} of {N} on {:?}", driver());
    }
    eventually(|| (sock.unsent().unwrap() == 0).then_some(()));
}

on_both_drivers!(a_backlog_longer_than_one_flush_arrives_whole);
