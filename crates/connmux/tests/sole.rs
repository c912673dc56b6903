//! A worker's one busy connection read the way a thread per connection
//! reads it (`Tuning::sole_read`, epoll driver), over loopback: the
//! descriptor blocks while the connection is busy (a blocking `recv` in
//! place of the epoll wait and the read) and is put back when it goes
//! quiet; nothing another thread asks of the worker meanwhile waits for
//! the connection's next bytes (a send to it, a second connection, the
//! mux's stop); and with the knob off, or on io_uring, it never blocks.
//!
//! The descriptor the test attaches shares its file description with the
//! mux's copy, so its `O_NONBLOCK` is what the worker set.

#[macro_use]
mod common;

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::*;
use connmux::service::{Handler, Serving, Verdict};
use connmux::{Driver, Mux, PsockId, SockType};

struct Echo;

impl Handler for Echo {
    fn handle(&self, request: Bytes, _from: PsockId, _scratch: &mut BytesMut) -> Verdict {
        Verdict::Reply(request)
    }
}

/// One worker serving echo, a connection attached to it: the mux, its
/// serving, our side of the connection (whose mode is the worker's), the
/// client and the psock.
struct Served {
    mux: Mux,
    _serving: Serving,
    ours: TcpStream,
    peer: TcpStream,
    p: PsockId,
}

fn served(sole: bool) -> Served {
    let mux = mux_with(|c| c.tuning.sole_read = sole);
    let serving = mux.serve(SockType::Dgram, Arc::new(Echo)).unwrap();
    let (ours, peer) = pair();
    let p = mux.attach(&ours, l4()).unwrap();
    Served { mux, _serving: serving, ours, peer, p }
}

fn blocking(s: &TcpStream) -> bool {
    !connmux_sys::socket::is_nonblocking(s.as_raw_fd()).unwrap()
}

/// A batch of 16 pipelined calls, their echoes checked in order.
fn batch(peer: &mut TcpStream, round: u32) {
    let reqs: Vec<u8> = (0..16u32).flat_map(|i| framed(&(round * 16 + i).to_be_bytes())).collect();
    write_all(peer, &reqs);
    for i in 0..16u32 {
        assert_eq!(read_framed(peer), (round * 16 + i).to_be_bytes(), "call {i} of batch {round}");
    }
}

/// Batches until our side of the connection blocks (the worker reads it
/// blocking), at most 100,000 batches or `WAIT`: the batches made.
fn busy_until_blocking(s: &mut Served) -> u32 {
    let end = Instant::now() + WAIT;
    for round in 0..100_000u32 {
        batch(&mut s.peer, round);
        if blocking(&s.ours) {
            return round + 1;
        }
        assert!(Instant::now() < end, "never read blocking in {WAIT:?} ({round} batches)");
    }
    panic!("never read blocking in 100,000 batches");
}

fn a_busy_sole_connection_is_read_blocking_and_put_back_when_it_goes_quiet() {
    let mut s = served(true);
    let batches = busy_until_blocking(&mut s);
    eprintln!("read blocking after {batches} batches");
    // Quiet now: within the read's timeout (a scheduler tick or two) the
    // worker goes back to its epoll wait, the descriptor as attached.
    eventually(|| (!blocking(&s.ours)).then_some(()));
    assert_eq!(connmux_sys::socket::rcvtimeo(s.ours.as_raw_fd()).unwrap(), None, "the receive timeout is put back");
    // Served as before, and every call counted once.
    batch(&mut s.peer, batches);
    let calls = 16 * (u64::from(batches) + 1);
    let st = eventually(|| {
        let st = s.mux.psock_stats(s.p).unwrap();
        (st.tx_msgs >= calls).then_some(st)
    });
    assert_eq!((st.rx_msgs, st.tx_msgs), (calls, calls));
}

/// What another thread asks of a worker in a blocking read is done within
/// `bound` although the connection sends nothing more: far more than the
/// read's timeout (at most two ticks of 4 ms), far less than never.
const BOUND: Duration = Duration::from_secs(2);

fn nothing_else_waits_for_the_sole_connections_next_bytes() {
    let mut s = served(true);
    let sock = s.mux.socket(SockType::Dgram).unwrap();
    // A message from another thread to the connection.
    let round = busy_until_blocking(&mut s);
    let t = Instant::now();
    sock.send_to(&framed(b"pushed"), s.p).unwrap();
    assert_eq!(read_framed(&mut s.peer), b"pushed");
    assert!(t.elapsed() < BOUND, "a send to the connection waited {:?}", t.elapsed());
    // A second connection on the same worker.
    busy_until_blocking(&mut s);
    let (ours2, mut peer2) = pair();
    let t = Instant::now();
    s.mux.attach(&ours2, l4()).unwrap();
    write_all(&mut peer2, &framed(b"second"));
    assert_eq!(read_framed(&mut peer2), b"second");
    assert!(t.elapsed() < BOUND, "a second connection waited {:?}", t.elapsed());
    // The first is still served (read through the epoll wait now: two
    // connections).
    batch(&mut s.peer, round + 1);
    drop((ours2, peer2, sock, s));
    // The mux's stop.
    let mut s = served(true);
    busy_until_blocking(&mut s);
    let Served { mux, _serving, ours, peer, .. } = s;
    let t = Instant::now();
    drop(_serving);
    drop(mux);
    assert!(t.elapsed() < BOUND, "the stop waited {:?}", t.elapsed());
    drop((ours, peer));
}

/// With `sole_read` off (epoll), or on io_uring (which waits for every
/// read in its ring), the descriptor never blocks, however busy.
fn never_blocking_without_it() {
    let sole = driver() == Driver::Uring;
    let mut s = served(sole);
    for round in 0..3_000u32 {
        batch(&mut s.peer, round);
        assert!(!blocking(&s.ours), "read blocking after {round} batches");
    }
}

on_both_drivers!(never_blocking_without_it);

mod epoll {
    #[test]
    fn a_busy_sole_connection_is_read_blocking_and_put_back_when_it_goes_quiet() {
        super::common::run_on(
            connmux::Driver::Epoll,
            super::a_busy_sole_connection_is_read_blocking_and_put_back_when_it_goes_quiet,
        )
    }
    #[test]
    fn nothing_else_waits_for_the_sole_connections_next_bytes() {
        super::common::run_on(connmux::Driver::Epoll, super::nothing_else_waits_for_the_sole_connections_next_bytes)
    }
}
