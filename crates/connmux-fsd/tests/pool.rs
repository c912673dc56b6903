//! The pool behind a real service over TCP on loopback: a request names
//! the size of its reply, a file-system thread builds and sends it. A peer
//! that reads none of its replies is paused alone, resumed once it reads,
//! and a pool with a paused connection or with threads waiting to queue
//! replies stops and joins every thread within a deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connmux::service::{Handler, Service, ServiceConfig, Verdict};
use connmux::{Bytes, Mux, PsockId, SockType};
use connmux_fsd::{Conn, Options, Pool, Replier, Serve};

/// Replies of the size each request asks for.
struct Sized;

impl Serve for Sized {
    type Req = u32;
    type Conn = ();
    type Work = ();
    fn serve(&self, conn: &Conn<Sized>, size: u32, out: &Replier<'_, Sized>) -> bool {
        let mut r = Vec::with_capacity(4 + size as usize);
        r.extend_from_slice(&size.to_be_bytes());
        r.resize(4 + size as usize, 7);
        out.send(conn, Bytes::from(r))
    }
}

struct H {
    pool: Arc<Pool<Sized>>,
    seen: Mutex<Vec<PsockId>>,
}

impl Handler for H {
    fn handle(&self, request: Bytes, from: PsockId, _scratch: &mut BytesMut) -> Verdict {
        let Some(size) = request.get(4..8).map(|b| u32::from_be_bytes(b.try_into().unwrap())) else {
            return Verdict::Close;
        };
        let conn = self.pool.conn(from, || ());
        {
            let mut seen = self.seen.lock().unwrap();
            if !seen.contains(&from) {
                seen.push(from);
            }
        }
        if self.pool.submit(&conn, |_| size) {
            Verdict::NoReply
        } else {
            Verdict::Close
        }
    }
}

struct Rig {
    svc: Option<Service>,
    pool: Arc<Pool<Sized>>,
    h: Arc<H>,
    addr: SocketAddr,
}

fn rig(name: &str, room: u64, share: usize) -> Rig {
    let mux = Mux::new(connmux::Config::default()).unwrap();
    let opts = Options { name: name.into(), threads: 4, queue: 256, share, room, ..Options::default() };
    let pool = Pool::start(&mux, opts, Sized).unwrap();
    let h = Arc::new(H { pool: pool.clone(), seen: Mutex::default() });
    let cfg = ServiceConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        sock_type: SockType::Dgram,
        parser: Arc::new(|| connmux::parsers::from_spec("l4").unwrap()),
    };
    let svc = Service::start(mux, cfg, h.clone()).unwrap();
    let addr = svc.local_addr();
    Rig { svc: Some(svc), pool, h, addr }
}

fn ask(c: &mut TcpStream, size: u32) {
    let mut m = 4u32.to_be_bytes().to_vec();
    m.extend_from_slice(&size.to_be_bytes());
    c.write_all(&m).unwrap();
}

fn answer(c: &mut TcpStream) -> usize {
    let mut len = [0u8; 4];
    c.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    c.read_exact(&mut body).unwrap();
    body.len()
}

/// Waits for `cond` until `within` has passed; panics with `what` then.
fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The pool's threads listed now, by their name's prefix (`comm`).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with(prefix))
        .count()
}

/// Waits until no thread named `prefix…` is listed. A joined thread may
/// still be listed for a moment: the kernel wakes its joiner when the
/// thread lets go of the process's memory, a little before it takes the
/// thread off the list. One that stop did not join stays, and fails this.
fn wait_threads_gone(prefix: &str) {
    wait_for(&format!("every {prefix} thread gone after the join"), Duration::from_secs(5), || {
        threads_named(prefix) == 0
    });
}

/// Stops the pool on another thread, so that a stop that hangs fails the
/// test instead of hanging it; returns how long it took.
fn stop_within(pool: &Arc<Pool<Sized>>, within: Duration) -> Duration {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = pool.clone();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        p.stop();
        let _ = tx.send(t0.elapsed());
    });
    rx.recv_timeout(within).unwrap_or_else(|_| panic!("the pool did not stop within {within:?}"))
}

#[test]
fn a_peer_that_reads_nothing_is_paused_alone_and_resumed_when_it_reads() {
    let r = rig("fsdp", connmux_fsd::Options::default().room, 2);
    // (A thread names itself when it first runs.)
    wait_for("4 file-system threads and the waker", Duration::from_secs(10), || threads_named("fsdp-") == 5);
    let mut hog = TcpStream::connect(r.addr).unwrap();
    for _ in 0..64 {
        ask(&mut hog, 1 << 20);
    }
    wait_for("the hog's connection paused", Duration::from_secs(10), || r.pool.stats.paused.load(Relaxed) >= 1);
    // Another client is answered meanwhile.
    let mut good = TcpStream::connect(r.addr).unwrap();
    good.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = Instant::now();
    for _ in 0..200 {
        ask(&mut good, 100);
        assert_eq!(answer(&mut good), 100);
    }
    eprintln!("200 small requests beside a paused peer in {:?}", t0.elapsed());
    // The hog reads: all 64 replies come, so the waker resumed it.
    hog.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for i in 0..64 {
        assert_eq!(answer(&mut hog), 1 << 20, "reply {i}");
    }
    let stopped = stop_within(&r.pool, Duration::from_secs(5));
    wait_threads_gone("fsdp-");
    eprintln!("stopped in {stopped:?}");
    drop(r.svc);
}

#[test]
fn stop_joins_the_threads_while_a_connection_is_paused() {
    let r = rig("fsdq", connmux_fsd::Options::default().room, 2);
    let mut hog = TcpStream::connect(r.addr).unwrap();
    for _ in 0..64 {
        ask(&mut hog, 1 << 20);
    }
    wait_for("the hog's connection paused", Duration::from_secs(10), || r.pool.stats.paused.load(Relaxed) >= 1);
    let took = stop_within(&r.pool, Duration::from_secs(2));
    assert!(took < Duration::from_secs(1), "stop took {took:?}");
    eprintln!("stopped in {took:?} with a connection paused");
    wait_threads_gone("fsdq-");
    // Stopped, the pool takes nothing more.
    let conn = r.pool.conn(PsockId { index: 999, generation: 1 }, || ());
    assert!(!r.pool.submit(&conn, |_| 1), "a stopped pool queued a request");
    drop(r.svc);
}

#[test]
fn stop_joins_threads_that_wait_to_queue_replies() {
    // No room bound: the threads queue replies until the mux refuses them
    // (the connection's backlog full) and then wait, with naps, for it.
    let r = rig("fsdr", u64::MAX, 2);
    let mut hog = TcpStream::connect(r.addr).unwrap();
    // In one write: every request is read before the backlog pauses the
    // connection (asked one write at a time, a client descheduled part way
    // left too few read for the backlog to refuse any).
    let mut all = Vec::new();
    for _ in 0..64 {
        all.extend_from_slice(&4u32.to_be_bytes());
        all.extend_from_slice(&(1u32 << 20).to_be_bytes());
    }
    hog.write_all(&all).unwrap();
    let mux = r.svc.as_ref().unwrap().mux().clone();
    wait_for("a reply refused by the full backlog", Duration::from_secs(10), || {
        let seen = r.h.seen.lock().unwrap().clone();
        seen.iter().any(|p| mux.psock_stats(*p).is_ok_and(|s| s.tx_backlog_refusals > 0))
    });
    let took = stop_within(&r.pool, Duration::from_secs(3));
    // Well under the send timeout (10 s): the naps see the stop.
    assert!(took < Duration::from_secs(1), "stop took {took:?}");
    eprintln!("stopped in {took:?} with threads waiting to queue replies");
    wait_threads_gone("fsdr-");
    drop(r.svc);
}

/// The threads' replies leave the last part of a connection's backlog in
/// the mux to the replies its I/O worker makes, which the mux refuses past
/// it (and the worker then aborts the connection). Replies of 1.75 MiB for
/// a peer that reads none: once the kernel's buffers are full, a second
/// one passes the room (2 MiB) but not the threads' ceiling of one and a
/// half rooms (3 MiB of the mux's 4), so it waits, and a reply sent as a
/// worker sends one still goes; every reply arrives once the peer reads.
#[test]
fn the_threads_leave_room_in_the_backlog_for_the_workers_replies() {
    let room = connmux_fsd::Options::default().room;
    let r = rig("fsdc", room, 4);
    let mut hog = TcpStream::connect(r.addr).unwrap();
    const BIG: u32 = 7 << 18;
    for _ in 0..8 {
        ask(&mut hog, BIG);
    }
    wait_for("a reply waiting for room in the mux", Duration::from_secs(10), || {
        r.pool.stats.send_waits.load(Relaxed) >= 1
    });
    let p = r.h.seen.lock().unwrap()[0];
    let mux = r.svc.as_ref().unwrap().mux().clone();
    let worker = mux.socket(SockType::Dgram).unwrap();
    worker.set_recv_disable(true).unwrap();
    worker.set_nonblocking(true).unwrap();
    worker.send_to(&0u32.to_be_bytes(), p).expect("a worker's reply refused beside the threads' replies");
    assert_eq!(mux.psock_stats(p).unwrap().tx_backlog_refusals, 0);
    hog.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sizes: Vec<usize> = (0..9).map(|_| answer(&mut hog)).collect();
    sizes.sort();
    assert_eq!(sizes[0], 0, "the worker's reply");
    assert!(sizes[1..].iter().all(|&n| n == BIG as usize), "{sizes:?}");
    assert_eq!(r.pool.stats.send_failures.load(Relaxed), 0);
    r.pool.stop();
    drop(r.svc);
}

#[test]
fn a_sweep_keeps_the_state_of_a_connection_attached_while_it_looks() {
    let mux = Mux::new(connmux::Config::default()).unwrap();
    let opts = Options { name: "fsds".into(), threads: 1, ..Options::default() };
    let pool = Pool::start(&mux, opts, Sized).unwrap();
    let p = |index| PsockId { index, generation: 1 };
    let (gone, old, new) = (p(1), p(2), p(3));
    let gone_conn = pool.conn(gone, || ());
    pool.conn(old, || ());
    // `new` attaches, and its first request makes its state, after the
    // sweep's look at the attached connections (which saw `old` only).
    pool.sweep(|| {
        let live = vec![old];
        pool.conn(new, || ());
        live
    });
    assert_eq!(pool.conns(), 2, "the gone one forgotten, the new one kept");
    assert!(gone_conn.gone(), "the forgotten one marked gone");
    // The next sweep, which sees it, keeps it; one that does not, forgets it.
    pool.sweep(|| vec![old, new]);
    assert_eq!(pool.conns(), 2);
    pool.sweep(|| vec![new]);
    assert_eq!(pool.conns(), 1);
    pool.stop();
}
