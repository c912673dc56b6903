//! Receiving threads leading epoll workers (`docs/architecture.md`,
//! "Receiving threads lead the workers"): an application thread in a
//! blocking `recv` on a plain clone, with nothing queued for it, runs an
//! idle worker's pass itself. Each test runs on both drivers: on io_uring
//! nothing is led, and the same calls must behave the same.

#[macro_use]
mod common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use connmux::{Driver, SockType};

/// One connection, one call in flight at a time, answered by a thread on a
/// plain clone: every answer right and in order; on epoll the thread read
/// the connection itself (`Mux::led_passes`), on io_uring never.
fn a_blocking_receiver_reads_the_connection_itself() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_recv_disable(true).unwrap();
    let clone = Arc::new(sock.try_clone().unwrap());
    clone.set_recv_disable(false).unwrap();
    let (ours, mut peer) = pair();
    clone.attach(&ours, l4()).unwrap();
    let server = {
        let clone = clone.clone();
        std::thread::spawn(move || {
            for _ in 0..500 {
                let m = clone.recv_msg().unwrap();
                clone.send_to(&m.data, m.psock).unwrap();
            }
        })
    };
    peer.set_read_timeout(Some(WAIT)).unwrap();
    for i in 0..500u32 {
        peer.write_all(&framed(&i.to_be_bytes())).unwrap();
        assert_eq!(read_framed(&mut peer), i.to_be_bytes(), "answer {i} on {:?}", driver());
    }
    server.join().unwrap();
    match driver() {
        Driver::Epoll => assert!(mux.led_passes() > 0, "the receiving thread led no pass"),
        _ => assert_eq!(mux.led_passes(), 0, "io_uring workers are not led"),
    }
}

/// A thread receives on one clone until it has had its messages, then
/// stops receiving (its socket disabled); a second clone is read only
/// through its descriptor (`poll`, then non-blocking receives), as an event
/// loop does. The worker its thread led takes its pass back: the second
/// clone gets every later message (within the test's deadline), as on a
/// mux whose workers were never led.
fn a_polled_socket_is_served_after_the_receiving_thread_stops() {
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_recv_disable(true).unwrap();
    let first = Arc::new(sock.try_clone().unwrap());
    first.set_recv_disable(false).unwrap();
    let polled = sock.try_clone().unwrap();
    polled.set_nonblocking(true).unwrap();
    let (ours, mut peer) = pair();
    first.attach(&ours, l4()).unwrap();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    // The polled clone takes nothing yet: the first thread answers all.
    polled.set_recv_disable(true).unwrap();
    let server = {
        let first = first.clone();
        std::thread::spawn(move || {
            for _ in 0..200 {
                let m = first.recv_msg().unwrap();
                first.send_to(&m.data, m.psock).unwrap();
            }
        })
    };
    for i in 0..200u32 {
        peer.write_all(&framed(&i.to_be_bytes())).unwrap();
        assert_eq!(read_framed(&mut peer), i.to_be_bytes());
    }
    server.join().unwrap();
    // The first thread stops receiving; the polled clone takes over.
    first.set_recv_disable(true).unwrap();
    polled.set_recv_disable(false).unwrap();
    for i in 0..20u32 {
        peer.write_all(&framed(&i.to_be_bytes())).unwrap();
        let m = eventually(|| {
            let _ = connmux_sys::poll::poll_readable(polled.as_raw_fd(), Some(Duration::from_millis(100)));
            polled.recv_msg().ok()
        });
        assert_eq!(m.data[..], framed(&i.to_be_bytes())[..], "message {i} to the polled clone on {:?}", driver());
        polled.send_to(&m.data, m.psock).unwrap();
        assert_eq!(read_framed(&mut peer), i.to_be_bytes());
    }
}

/// Two threads on two clones, four connections pipelining: each message is
/// answered once, whichever thread leads which worker.
fn two_receiving_threads_share_the_connections() {
    let mux = mux_with(|c| c.workers = 2);
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_recv_disable(true).unwrap();
    let total = 4 * 1000;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut threads = Vec::new();
    for _ in 0..2 {
        let clone = sock.try_clone().unwrap();
        clone.set_recv_disable(false).unwrap();
        clone.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let done = done.clone();
        threads.push(std::thread::spawn(move || {
            while done.load(std::sync::atomic::Ordering::Acquire) < total {
                let Ok(m) = clone.recv_msg() else { continue };
                clone.send_to(&m.data, m.psock).unwrap();
                done.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
        }));
    }
    let mut clients = Vec::new();
    let mut keep = Vec::new();
    for tag in 0..4u32 {
        let (ours, mut peer) = pair();
        sock.attach(&ours, l4()).unwrap();
        keep.push(ours);
        clients.push(std::thread::spawn(move || {
            peer.set_read_timeout(Some(WAIT)).unwrap();
            let msg = |i: u32| [tag.to_be_bytes(), i.to_be_bytes()].concat();
            let all: Vec<u8> = (0..1000).flat_map(|i| framed(&msg(i))).collect();
            peer.write_all(&all).unwrap();
            let mut got: Vec<Vec<u8>> = (0..1000).map(|_| read_framed(&mut peer)).collect();
            got.sort();
            for (i, g) in (0..1000).zip(got) {
                assert_eq!(g, msg(i), "echo {i} of connection {tag}");
            }
        }));
    }
    for c in clients {
        c.join().unwrap();
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(mux.stats().rx_msgs, total as u64);
}

/// `Driver::Auto`: an attach makes an undecided worker an epoll one and
/// tells its thread through the worker's waker. A thread that receives at
/// once leads that worker's pass, which drains the same waker: it must not
/// take the wake (the worker's thread would wait for it for good). After the
/// receive, a message that only the worker's own thread can read (nobody
/// receives: the socket is polled) arrives. A fresh mux each round, as
/// the race is the first attach's.
#[test]
fn auto_a_worker_told_of_its_first_psock_runs_its_passes() {
    for round in 0..500 {
        let mut c = connmux::Config::default();
        c.workers = 2;
        c.placement = connmux::Placement::Unpinned;
        c.driver = Driver::Auto;
        let mux = connmux::Mux::new(c).unwrap();
        let sock = mux.socket(SockType::Dgram).unwrap();
        let (ours, mut peer) = pair();
        peer.write_all(&framed(b"first")).unwrap();
        sock.attach(&ours, l4()).unwrap();
        assert_eq!(sock.recv_msg().unwrap().data[..], framed(b"first")[..]);
        sock.set_nonblocking(true).unwrap();
        peer.write_all(&framed(b"second")).unwrap();
        let m = eventually(|| {
            let _ = connmux_sys::poll::poll_readable(sock.as_raw_fd(), Some(Duration::from_millis(100)));
            sock.recv_msg().ok()
        });
        assert_eq!(m.data[..], framed(b"second")[..], "round {round}");
    }
}

/// What a receiving thread's pass kept for its socket (on epoll, a read
/// framed for it with no hold of the hub lock: `shared::Kept`) counts in
/// its `queued`, and moves on as a queue does, with what was queued for
/// it in the hub after it (a second burst, read by the worker's own
/// thread): a receive-disable (even rounds) or a close (odd rounds) hands
/// the rest to the other clone, in order, none lost or twice.
fn what_a_receiving_thread_kept_moves_on_as_its_queue() {
    const N: u32 = 64;
    const M: u32 = 16;
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_recv_disable(true).unwrap();
    for round in 0..20u32 {
        let first = sock.try_clone().unwrap();
        let second = sock.try_clone().unwrap();
        second.set_recv_disable(true).unwrap();
        let (ours, mut peer) = pair();
        let p = first.attach(&ours, l4()).unwrap();
        let burst: Vec<u8> = (0..N).flat_map(|i| framed(&(round * (N + M) + i).to_be_bytes())).collect();
        // On epoll the burst comes while the receiving thread leads the
        // worker, so that its pass keeps it.
        let led = mux.led_passes();
        let m = std::thread::scope(|sc| {
            let receiver = sc.spawn(|| first.recv_msg().unwrap());
            if driver() == Driver::Epoll {
                eventually(|| (mux.led_passes() > led).then_some(()));
            }
            peer.write_all(&burst).unwrap();
            receiver.join().unwrap()
        });
        assert_eq!(m.data[4..], (round * (N + M)).to_be_bytes(), "round {round}: the first");
        eventually(|| (first.queued() == N as usize - 1).then_some(()));
        let later: Vec<u8> = (N..N + M).flat_map(|i| framed(&(round * (N + M) + i).to_be_bytes())).collect();
        peer.write_all(&later).unwrap();
        eventually(|| (first.queued() == (N + M) as usize - 1).then_some(()));
        second.set_recv_disable(false).unwrap();
        match round % 2 {
            0 => first.set_recv_disable(true).unwrap(),
            _ => drop(first),
        }
        for i in 1..N + M {
            let m = second.recv_msg().unwrap();
            assert_eq!(m.data[4..], (round * (N + M) + i).to_be_bytes(), "round {round} on {:?}", driver());
        }
        assert_eq!(second.queued(), 0, "round {round}: none twice");
        mux.unattach_id(p).unwrap();
    }
}

on_both_drivers!(
    what_a_receiving_thread_kept_moves_on_as_its_queue,
    a_blocking_receiver_reads_the_connection_itself,
    a_polled_socket_is_served_after_the_receiving_thread_stops,
    two_receiving_threads_share_the_connections,
);
