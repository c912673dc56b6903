//! `connmux::udp`: a handler answering datagrams over real UDP on loopback.
//! UDP has its own loop (recvmmsg/sendmmsg), whatever `Config::driver` says:
//! these tests cover it once.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connmux::service::{Handler, Verdict};
use connmux::udp::{is_udp, UdpConfig, UdpService, UdpStats};
use connmux::{Bytes, Config, Placement, PsockId};

/// Echoes a datagram; `!` first: refused (`Close`); `?` first: no reply;
/// `+N` first: a reply of N bytes of its own buffer; `#` first: echoed
/// once [`GATE`] is open (at most 10 s).
struct Echo;

/// Holds the handler of a `#` datagram (one test's).
static GATE: AtomicBool = AtomicBool::new(false);

impl Handler for Echo {
    fn handle(&self, request: Bytes, from: PsockId, _scratch: &mut BytesMut) -> Verdict {
        assert!(is_udp(from));
        Verdict::Reply(request)
    }
    fn handle_in_place(&self, request: &[u8], from: PsockId, _s: &mut BytesMut, out: &mut BytesMut) -> Verdict {
        assert!(is_udp(from), "{from:?}");
        match request.first() {
            Some(b'!') => Verdict::Close,
            Some(b'?') => Verdict::NoReply,
            Some(b'#') => {
                let end = Instant::now() + Duration::from_secs(10);
                // Bounded by the deadline.
                while !GATE.load(Ordering::Acquire) && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(1));
                }
                out.extend_from_slice(request);
                Verdict::Appended
            }
            Some(b'+') => {
                let n: usize = std::str::from_utf8(&request[1..]).unwrap().parse().unwrap();
                Verdict::Reply(Bytes::from(vec![b'x'; n]))
            }
            _ => {
                out.extend_from_slice(request);
                Verdict::Appended
            }
        }
    }
}

fn config(workers: usize) -> Config {
    let mut c = Config::default();
    c.workers = workers;
    c.placement = Placement::Unpinned;
    c
}

fn start(workers: usize, max: usize) -> UdpService {
    start_gso(workers, max, true)
}

fn start_gso(workers: usize, max: usize, gso: bool) -> UdpService {
    let mut u = UdpConfig::new("127.0.0.1:0".parse().unwrap());
    u.max_datagram = max;
    u.gso = gso;
    UdpService::start(&config(workers), u, Arc::new(Echo)).unwrap()
}

fn client(to: SocketAddr) -> UdpSocket {
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.connect(to).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c
}

/// Waits (at most 10 s) until `f(stats)` holds.
fn wait_for(svc: &UdpService, f: impl Fn(&UdpStats) -> bool) -> UdpStats {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let s = svc.stats();
        if f(&s) {
            return s;
        }
        assert!(Instant::now() < end, "counters never got there: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn datagrams_are_echoed_to_their_senders_by_every_worker() {
    let svc = start(2, 2048);
    assert_eq!(svc.workers(), 2);
    // Many senders: SO_REUSEPORT spreads them over both sockets.
    let clients: Vec<UdpSocket> = (0..16).map(|_| client(svc.local_addr())).collect();
    for round in 0..20u32 {
        for (i, c) in clients.iter().enumerate() {
            c.send(format!("hello {i} {round}").as_bytes()).unwrap();
        }
        for (i, c) in clients.iter().enumerate() {
            let mut buf = [0u8; 64];
            let n = c.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], format!("hello {i} {round}").as_bytes());
        }
    }
    let s = wait_for(&svc, |s| s.datagrams_out == 320);
    assert_eq!((s.datagrams_in, s.malformed, s.truncated, s.refused_too_large), (320, 0, 0, 0));
    assert!(s.batches >= 1 && s.batches <= 320, "{s:?}");
}

#[test]
fn a_refused_datagram_is_counted_and_dropped_and_the_sender_still_answered() {
    let svc = start(1, 2048);
    let c = client(svc.local_addr());
    c.send(b"!garbage").unwrap();
    c.send(b"?quiet").unwrap();
    c.send(b"after").unwrap();
    let mut buf = [0u8; 64];
    let n = c.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"after", "the refused and the silent datagram get nothing");
    let s = wait_for(&svc, |s| s.malformed == 1);
    assert_eq!((s.datagrams_in, s.datagrams_out), (3, 1));
}

#[test]
fn datagrams_and_replies_over_the_limit_are_dropped_and_counted() {
    let svc = start(1, 1000);
    let c = client(svc.local_addr());
    // A request longer than max_datagram is cut by the kernel: dropped.
    c.send(&[b'a'; 1500]).unwrap();
    // A reply longer than max_datagram is not sent.
    c.send(b"+1001").unwrap();
    // One that fits is.
    c.send(b"+1000").unwrap();
    let mut buf = [0u8; 4096];
    let n = c.recv(&mut buf).unwrap();
    assert_eq!(n, 1000);
    let s = wait_for(&svc, |s| s.truncated == 1 && s.refused_too_large == 1);
    assert_eq!((s.datagrams_in, s.datagrams_out), (3, 1));
}

/// One request in flight: the worker takes each with `recvfrom` (a batch's
/// receive one time in four); a datagram over the limit is cut and dropped
/// on either receive; a queue that forms behind a busy handler is taken in
/// batches again.
#[test]
fn one_datagram_at_a_time_then_a_queue_taken_in_batches() {
    let svc = start(1, 100);
    let c = client(svc.local_addr());
    let mut buf = [0u8; 256];
    for i in 0..20u32 {
        let m = format!("one {i}");
        c.send(m.as_bytes()).unwrap();
        let n = c.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], m.as_bytes());
    }
    // Over-long datagrams, each taken alone: the 21st, 23rd, 25th and 27th
    // receives, all one at a time.
    for i in 0..4u32 {
        c.send(&[b'a'; 101]).unwrap();
        wait_for(&svc, |s| s.truncated == u64::from(i) + 1);
        let m = format!("after {i}");
        c.send(m.as_bytes()).unwrap();
        let n = c.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], m.as_bytes(), "the cut datagram gets nothing");
    }
    // Exactly the limit is taken whole.
    c.send(&[b'b'; 100]).unwrap();
    assert_eq!(c.recv(&mut buf).unwrap(), 100);
    let s0 = wait_for(&svc, |s| s.datagrams_out == 25);
    assert_eq!((s0.datagrams_in, s0.truncated, s0.send_errors), (29, 4, 0));
    assert_eq!(s0.batches, 29, "one datagram a receive");
    // The handler holds the gate while 64 datagrams queue behind it.
    c.send(b"#gate").unwrap();
    let s1 = wait_for(&svc, |s| s.datagrams_in == 30);
    for i in 0..64u32 {
        c.send(format!("q {i}").as_bytes()).unwrap();
    }
    GATE.store(true, Ordering::Release);
    let n = c.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"#gate");
    for i in 0..64u32 {
        let n = c.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], format!("q {i}").as_bytes(), "in the order sent");
    }
    let s2 = wait_for(&svc, |s| s.datagrams_out == 25 + 65);
    assert_eq!(s2.datagrams_in, 94);
    // At most three taken one at a time, then batches of up to 32.
    let batches = s2.batches - s1.batches;
    assert!(batches <= 3 + 3, "64 queued datagrams took {batches} receives: {s2:?}");
}

/// With GSO (the default) the replies of a batch to one peer leave as one
/// segmented send; the peer still gets them one datagram each.
#[test]
fn a_burst_the_socket_buffer_holds_is_answered_whole() {
    burst(true);
    burst(false);
}

fn burst(gso: bool) {
    let svc = start_gso(1, 2048, gso);
    let c = client(svc.local_addr());
    // 64 datagrams of 64 bytes at once: what the smallest default socket
    // buffers (208 KiB, each datagram costing about 2 KiB there) hold both ways.
    for i in 0..64u32 {
        let mut m = [0u8; 64];
        m[..4].copy_from_slice(&i.to_be_bytes());
        c.send(&m).unwrap();
    }
    let mut seen = [false; 64];
    for _ in 0..64 {
        let mut buf = [0u8; 128];
        let n = c.recv(&mut buf).unwrap();
        assert_eq!(n, 64);
        seen[u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize] = true;
    }
    assert!(seen.iter().all(|s| *s));
    let s = wait_for(&svc, |s| s.datagrams_out == 64);
    assert_eq!((s.datagrams_in, s.send_errors), (64, 0));
}

fn udp_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|n| n.starts_with("connmux-udp"))
        .count()
}

#[test]
fn shutdown_ends_every_thread_and_frees_the_port() {
    let svc = start(3, 2048);
    let addr = svc.local_addr();
    let c = client(addr);
    c.send(b"ping").unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(c.recv(&mut buf).unwrap(), 4);
    // (A thread names itself when it first runs: one that has not run yet
    // is not counted.)
    let end = Instant::now() + Duration::from_secs(10);
    while udp_threads() < 3 {
        assert!(Instant::now() < end, "only {} UDP threads after 10 s", udp_threads());
        std::thread::sleep(Duration::from_millis(1));
    }
    let t0 = Instant::now();
    svc.shutdown();
    // Woken by the shutdown of each socket, not by the receive timeout.
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // Other tests of this file may run their own services meanwhile: wait
    // for this one's threads to be gone from the count by binding the port,
    // which only works once all its sockets are closed.
    let end = Instant::now() + Duration::from_secs(10);
    while UdpSocket::bind(addr).is_err() {
        assert!(Instant::now() < end, "the port stays bound");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Two workers pinned to the first two CPUs, each socket given the
/// datagrams received on its CPU; `None` on a machine of one CPU.
fn start_on_two_cpus() -> Option<(UdpService, usize)> {
    let cpus = connmux_sys::affinity::available_cpus().unwrap();
    if cpus.len() < 2 {
        eprintln!("one CPU: no sibling to move to");
        return None;
    }
    let mut c = Config::default();
    c.workers = 2;
    c.placement = Placement::Cpus(vec![cpus[0], cpus[1]]);
    c.incoming_cpu = true;
    let svc = UdpService::start(&c, UdpConfig::new("127.0.0.1:0".parse().unwrap()), Arc::new(Echo)).unwrap();
    Some((svc, cpus[0]))
}

/// From a thread pinned to `cpu`: `window` numbered datagrams sent at once
/// (one `sendmmsg`), all their replies taken, again and again until
/// `done(stats)` holds after a round (at most 20 s); each reply must be
/// the echo of the next datagram sent. Returns the datagrams sent.
fn rounds_until(svc: &UdpService, cpu: usize, window: u64, mut done: impl FnMut(&UdpStats) -> bool + Send) -> u64 {
    let to = svc.local_addr();
    std::thread::scope(|s| {
        s.spawn(move || {
            connmux_sys::affinity::pin_current_thread(cpu).unwrap();
            let c = client(to);
            let mut sb = connmux_sys::udp::SendBatch::new();
            let (mut next, mut expect) = (0u64, 0u64);
            let end = Instant::now() + Duration::from_secs(20);
            // Bounded by the deadline.
            loop {
                let msgs: Vec<[u8; 8]> = (next..next + window).map(u64::to_be_bytes).collect();
                let mut k = 0;
                while k < msgs.len() {
                    let items = msgs[k..].iter().map(|m| (&m[..], None));
                    k += connmux_sys::udp::send_batch(c.as_raw_fd(), &mut sb, items, 0).unwrap();
                }
                next += window;
                while expect < next {
                    let mut buf = [0u8; 16];
                    let n = c.recv(&mut buf).expect("a reply within 5 s");
                    assert_eq!(&buf[..n], expect.to_be_bytes(), "replies in the order of the datagrams");
                    expect += 1;
                }
                let st = svc.stats();
                if done(&st) {
                    return next;
                }
                assert!(Instant::now() < end, "not there after 20 s: {st:?}");
            }
        })
        .join()
        .unwrap()
    })
}

/// A peer keeping 32 datagrams in flight from the CPU of the worker it is
/// steered to fills its batches: the worker moves to the sibling's idle
/// CPU, and every datagram is still answered, in order.
#[test]
fn a_worker_sharing_its_cpu_with_a_busy_peer_moves_to_an_idle_sibling_and_answers_in_order() {
    let Some((svc, cpu)) = start_on_two_cpus() else { return };
    let mut before = None;
    let sent = rounds_until(&svc, cpu, 32, move |s| {
        // A few thousand datagrams more once it moved.
        match before {
            None if s.roams > 0 => {
                before = Some(s.datagrams_in);
                false
            }
            Some(at) => s.datagrams_in >= at + 5_000,
            None => false,
        }
    });
    let s = wait_for(&svc, |s| s.datagrams_out == sent);
    assert_eq!((s.datagrams_in, s.send_errors), (sent, 0));
    assert!(s.roams >= 1, "{s:?}");
    assert!(s.datagrams_in >= 2 * s.batches, "several datagrams a batch: {s:?}");
}

/// One datagram at a time: each waits on the reply to the last, a batch
/// holds one, and the worker stays on its CPU (crossing CPUs would add a
/// wake-up to every datagram).
#[test]
fn a_peer_sending_one_datagram_at_a_time_keeps_its_worker_home() {
    let Some((svc, cpu)) = start_on_two_cpus() else { return };
    let t0 = Instant::now();
    // Several looks of the worker (ROAM_EVERY each).
    let sent = rounds_until(&svc, cpu, 1, |_| t0.elapsed() >= 8 * connmux::udp::ROAM_EVERY);
    let s = wait_for(&svc, |s| s.datagrams_out == sent);
    assert_eq!((s.datagrams_in, s.batches, s.roams), (sent, sent, 0), "{s:?}");
}
