//! `Config::tuning` reaches the workers: values far from the defaults still
//! deliver every reply once and in order, on both drivers, and the thresholds
//! that decide where a request runs are the configured ones; so do the
//! runtime's fixed bounds (the slices of one write).

#[macro_use]
mod common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use connmux::service::{Service, Verdict};
use connmux::{Bytes, Config, Driver, Mux, PsockId, Tuning};

fn echo(mux: Mux) -> Service {
    let handler = Arc::new(|req: Bytes, _from: PsockId, _s: &mut bytes::BytesMut| Verdict::Reply(req));
    l4_service(mux, handler)
}

/// One client: `count` requests of `size` bytes with up to `in_flight`
/// outstanding; every reply must be the next request's echo.
fn round_trips(addr: std::net::SocketAddr, id: u32, count: u32, in_flight: u32, size: usize) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    let body = |i: u32| {
        let mut b = id.to_be_bytes().to_vec();
        b.extend_from_slice(&i.to_be_bytes());
        b.resize(size.max(8), (i % 251) as u8);
        b
    };
    let (mut sent, mut got) = (0u32, 0u32);
    while got < count {
        let mut batch = Vec::new();
        while sent < count && sent - got < in_flight {
            batch.extend_from_slice(&framed(&body(sent)));
            sent += 1;
        }
        c.write_all(&batch).unwrap();
        assert_eq!(read_framed(&mut c), body(got), "client {id}: reply {got} wrong or out of order");
        got += 1;
    }
}

fn clients(svc: &Service, n: u32, count: u32, in_flight: u32, size: usize) {
    let addr = svc.local_addr();
    let ts: Vec<_> =
        (0..n).map(|id| std::thread::spawn(move || round_trips(addr, id, count, in_flight, size))).collect();
    for t in ts {
        t.join().unwrap();
    }
}

/// The smallest ring: two 64-byte provided buffers (a request spans
/// several). Every reply still arrives, in order.
fn smallest_ring_delivers_every_reply_in_order() {
    let mux = mux_with(|c| {
        c.tuning = Tuning { ring_buf_count: 2, ring_buf_size: 64, ..Tuning::default() };
    });
    let svc = echo(mux);
    clients(&svc, 4, 1000, 16, 100);
    // (A reply its worker wrote is counted at the worker's next pass.)
    let st = eventually(|| Some(svc.mux().stats()).filter(|st| st.psock.rx_msgs >= 4000));
    assert_eq!(st.psock.rx_msgs, 4000);
    svc.shutdown();
}

/// More replies at once than one write takes (`shared::MAX_IOV`, 64
/// slices), each its own slice (larger than the 512 bytes a read's run
/// appends together, `Handler::handle_run_in_place`): the writes still carry every reply, in order.
fn many_slices_per_write_deliver_every_reply_in_order() {
    let svc = echo(mux_with(|_| {}));
    clients(&svc, 4, 2000, 256, 600);
    // (A reply its worker wrote is counted at the worker's next pass.)
    let st = eventually(|| Some(svc.mux().stats()).filter(|st| st.psock.rx_msgs >= 8000));
    assert_eq!(st.psock.rx_msgs, 8000);
    svc.shutdown();
}

/// With a slow-handler threshold of zero every connection is heavy after
/// its first timed requests: it goes to the lane (where the default 50 µs
/// would keep an echo on its worker), and its replies still come back in
/// order (one worker: no helper).
fn slow_handler_threshold_is_the_configured_one() {
    let mux = mux_with(|c| {
        c.tuning = Tuning { slow_handler: Duration::ZERO, ..Tuning::default() };
    });
    let svc = echo(mux);
    clients(&svc, 2, 500, 4, 16);
    assert!(svc.mux().lane_moves() >= 1, "no connection went to the lane with a zero threshold");
    svc.shutdown();
}

/// A peer sends far more small messages than anyone reads: the psock is read
/// no more once `psock_queued_max` of its messages wait, and each time the
/// reader has taken half it is fed again by at most one read's worth (one
/// ring buffer on io_uring, `read_chunk` on epoll), never by all that its
/// connection delivered in the meantime. Every message arrives once, in order.
fn queued_messages_stay_within_one_read_of_their_bound() {
    const MAX: usize = 64;
    // Bytes per read: 128 messages of 8 bytes (4 of header, 4 of body).
    const STEP: usize = 1024;
    const MSGS: u32 = 20_000;
    let mux = mux_with(|c| {
        c.core.psock_queued_max = MAX;
        c.read_chunk = STEP;
        c.tuning = Tuning { ring_buf_size: STEP as u32, ring_buf_count: 64, ..Tuning::default() };
    });
    let sock = mux.socket(connmux::SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, mut peer) = pair();
    sock.attach(&ours, l4()).unwrap();
    let wire: Vec<u8> = (0..MSGS).flat_map(|i| framed(&i.to_be_bytes())).collect();
    // (Its write waits for the reader once the connection's buffers fill.)
    let writer = std::thread::spawn(move || {
        peer.write_all(&wire).unwrap();
        peer
    });
    let bound = MAX + STEP / 8;
    let (mut next, mut highest) = (0u32, 0usize);
    let mut buf = [0u8; 64];
    // Bounded: each round takes at least one message.
    while next < MSGS {
        // Fed again after the last round took the queue down to half.
        let left = (MSGS - next) as usize;
        let queued = eventually(|| {
            let q = sock.stats().unwrap().rx_queued;
            (q > MAX / 2 || q == left).then_some(q)
        });
        assert!(queued <= bound, "{queued} messages queued at message {next}: over {MAX} by more than one read");
        highest = highest.max(queued);
        let take = if queued == left { queued } else { queued - MAX / 2 };
        for _ in 0..take {
            let n = sock.recv(&mut buf).unwrap();
            assert_eq!(n, 8);
            assert_eq!(u32::from_be_bytes(buf[4..8].try_into().unwrap()), next, "lost or out of order");
            next += 1;
        }
    }
    drop(writer.join().unwrap());
    eprintln!("at most {highest} messages queued (bound {MAX}, one read {})", STEP / 8);
}

on_both_drivers!(
    queued_messages_stay_within_one_read_of_their_bound,
    smallest_ring_delivers_every_reply_in_order,
    many_slices_per_write_deliver_every_reply_in_order,
    slow_handler_threshold_is_the_configured_one,
);

/// A provided-buffer count the ring refuses (not a power of two) fails
/// `Mux::new` on the io_uring driver; with `Auto` a worker asked to serve
/// (which would run a ring) runs epoll instead, and serves.
#[test]
fn ring_buffer_count_is_the_configured_one() {
    if !available(Driver::Uring) {
        eprintln!("SKIPPED: io_uring is not available on this machine");
        return;
    }
    let cfg = |driver| Config {
        driver,
        placement: connmux::Placement::Unpinned,
        tuning: Tuning { ring_buf_count: 3, ..Tuning::default() },
        ..Config::default()
    };
    let err = Mux::new(cfg(Driver::Uring)).err().expect("a ring of 3 provided buffers was created");
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    let auto = Mux::new(cfg(Driver::Auto)).unwrap();
    assert_eq!(auto.driver(), Driver::Auto, "undecided until its first use");
    let svc = echo(auto);
    assert_eq!(svc.mux().driver(), Driver::Epoll, "no ring: epoll");
    round_trips(svc.local_addr(), 0, 50, 4, 16);
    // The same count, a power of two, runs io_uring.
    let ok = Config { tuning: Tuning { ring_buf_count: 4, ..Tuning::default() }, ..cfg(Driver::Uring) };
    assert_eq!(Mux::new(ok).unwrap().driver(), Driver::Uring);
}

/// `Driver::Auto` decides each worker's driver at its first use: a
/// worker asked to serve first runs io_uring (the served path's), one a
/// connection is attached to first runs epoll (where receiving threads
/// lead its passes: `Mux::led_passes`).
#[test]
fn auto_gives_a_service_io_uring_and_clones_epoll() {
    if !available(Driver::Uring) {
        eprintln!("SKIPPED: io_uring is not available on this machine");
        return;
    }
    let cfg =
        || Config { driver: Driver::Auto, workers: 1, placement: connmux::Placement::Unpinned, ..Config::default() };
    let svc = echo(Mux::new(cfg()).unwrap());
    assert_eq!(svc.mux().driver(), Driver::Uring, "asked to serve first");
    round_trips(svc.local_addr(), 0, 50, 4, 16);

    let mux = Mux::new(cfg()).unwrap();
    let sock = mux.socket(connmux::SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    assert_eq!(mux.driver(), Driver::Epoll, "a connection first");
    peer.set_read_timeout(Some(WAIT)).unwrap();
    for i in 0..20u32 {
        peer.write_all(&framed(&i.to_be_bytes())).unwrap();
        let m = sock.recv_msg().unwrap();
        sock.send_to(&m.data, m.psock).unwrap();
        assert_eq!(read_framed(&mut peer), i.to_be_bytes());
    }
    // A thread that waits with nothing coming leads the epoll worker
    // (asked aside, its thread gives the pass up within a look), and gets
    // what comes while it leads.
    std::thread::scope(|sc| {
        let receiver = sc.spawn(|| sock.recv_msg().unwrap());
        eventually(|| (mux.led_passes() > 0).then_some(()));
        peer.write_all(&framed(b"led")).unwrap();
        assert_eq!(receiver.join().unwrap().data[..], framed(b"led")[..]);
    });
}
