//! The service framework on loopback: accept → attach, in-place handlers,
//! replies on the connection a request came from, misbehaving peers aborted.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use connmux::service::{Service, Verdict};
use connmux::{Bytes, PsockId, Steering};

fn echo_service(workers: usize, steering: Steering, max_msg: usize) -> Service {
    let mux = mux_with(|c| {
        c.workers = workers;
        c.core.steering = steering;
        c.core.max_msg_size = max_msg;
    });
    let handler = Arc::new(|req: Bytes, _from: PsockId, _s: &mut bytes::BytesMut| Verdict::Reply(req));
    l4_service(mux, handler)
}

/// One client: `count` requests, at most `in_flight` outstanding. Every reply
/// must answer an outstanding request of this client, once. With `ordered`,
/// replies must also come back in request order (one worker: no stealing).
fn client_round_trips(addr: std::net::SocketAddr, id: u32, count: u32, in_flight: u32, ordered: bool) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    let mut answered = vec![false; count as usize];
    let mut next_send = 0u32;
    let mut received = 0u32;
    while received < count {
        let mut batch = Vec::new();
        while next_send < count && next_send - received < in_flight {
            let mut body = id.to_be_bytes().to_vec();
            body.extend_from_slice(&next_send.to_be_bytes());
            batch.extend_from_slice(&framed(&body));
            next_send += 1;
        }
        c.write_all(&batch).unwrap();
        let body = read_framed(&mut c);
        assert_eq!(&body[..4], &id.to_be_bytes(), "reply for another connection");
        let seq = u32::from_be_bytes(body[4..8].try_into().unwrap());
        assert!(seq < next_send, "reply {seq} to a request not sent yet");
        assert!(!std::mem::replace(&mut answered[seq as usize], true), "reply {seq} twice");
        if ordered {
            assert_eq!(seq, received, "reply out of request order");
        }
        received += 1;
    }
}

fn echo_service_many_clients_pipelined_complete() {
    // Two workers may each take messages of one connection (stealing, round
    // robin), so replies can pass each other; with one worker they cannot.
    for (workers, steering, ordered) in
        [(2, Steering::Affinity, false), (2, Steering::RoundRobin, false), (1, Steering::Affinity, true)]
    {
        let svc = echo_service(workers, steering, 1 << 16);
        let addr = svc.local_addr();
        let clients: Vec<_> =
            (0..8).map(|id| std::thread::spawn(move || client_round_trips(addr, id, 2000, 16, ordered))).collect();
        for c in clients {
            c.join().unwrap();
        }
        assert_eq!(svc.stats().accepted.load(Ordering::Relaxed), 8);
        // (A reply its worker wrote is counted at the worker's next pass.)
        let s = eventually(|| Some(svc.mux().stats()).filter(|s| s.rx_msgs >= 16_000));
        assert!(s.rx_msgs >= 16_000, "{s:?}");
        svc.shutdown();
    }
}

fn bad_client_is_aborted_while_good_client_continues() {
    let svc = echo_service(2, Steering::Affinity, 1024);
    let addr = svc.local_addr();
    let good = std::thread::spawn(move || client_round_trips(addr, 1, 3000, 4, false));
    // Oversize length: the connection is reset, with a counter.
    let mut bad = TcpStream::connect(addr).unwrap();
    bad.set_read_timeout(Some(WAIT)).unwrap();
    bad.write_all(&100_000u32.to_be_bytes()).unwrap();
    let mut b = [0u8; 16];
    let r = bad.read(&mut b);
    assert!(matches!(r, Ok(0) | Err(_)), "bad client should be disconnected, got {r:?}");
    good.join().unwrap();
    let s = svc.mux().stats();
    assert_eq!(s.psock.rx_msg_too_big, 1);
    assert!(svc.stats().closed.load(Ordering::Relaxed) >= 1);
}

/// A handler that answers in place: the request's first body byte says how
/// (`A` append the echo to `out`, `R` reply with a buffer of its own, `N` no
/// reply, `C` close the connection).
struct Verdicts;
impl connmux::service::Handler for Verdicts {
    fn handle(&self, req: Bytes, _from: PsockId, _s: &mut bytes::BytesMut) -> Verdict {
        Verdict::Reply(req)
    }
    fn handle_in_place(
        &self,
        req: &[u8],
        _from: PsockId,
        _s: &mut bytes::BytesMut,
        out: &mut bytes::BytesMut,
    ) -> Verdict {
        match req.get(4) {
            Some(b'A') => {
                out.extend_from_slice(req);
                Verdict::Appended
            }
            Some(b'N') => Verdict::NoReply,
            Some(b'C') => Verdict::Close,
            _ => Verdict::Reply(Bytes::copy_from_slice(req)),
        }
    }
}

/// Calls sent back to back in one write, the last one cut in two: every
/// verdict of an in-place handler comes back in request order (appended and
/// own-buffer replies mixed), the completed call after them; a close after
/// good calls answers them first, then resets the connection.
fn in_place_verdicts_keep_request_order() {
    let mux = mux_with(|c| c.core.steering = Steering::Affinity);
    let svc = l4_service(mux, Arc::new(Verdicts));
    let mut c = TcpStream::connect(svc.local_addr()).unwrap();
    c.set_nodelay(true).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    let call = |kind: u8, n: u8| framed(&[kind, n, n, n]);
    for round in 0..50u8 {
        let kinds = [b'A', b'R', b'N', b'A', b'A', b'R', b'N', b'R', b'A'];
        let mut wire: Vec<u8> = kinds.iter().enumerate().flat_map(|(i, &k)| call(k, i as u8)).collect();
        let last = call(b'A', round);
        wire.extend_from_slice(&last[..3]);
        c.write_all(&wire).unwrap();
        std::thread::sleep(Duration::from_millis(1));
        c.write_all(&last[3..]).unwrap();
        for (i, &k) in kinds.iter().enumerate() {
            if k != b'N' {
                assert_eq!(read_framed(&mut c), vec![k, i as u8, i as u8, i as u8], "round {round}");
            }
        }
        assert_eq!(read_framed(&mut c), vec![b'A', round, round, round], "round {round}: the call cut in two");
    }
    let mut wire = call(b'A', 1);
    wire.extend(call(b'R', 2));
    wire.extend(call(b'C', 3));
    wire.extend(call(b'A', 4));
    c.write_all(&wire).unwrap();
    assert_eq!(read_framed(&mut c), vec![b'A', 1, 1, 1]);
    assert_eq!(read_framed(&mut c), vec![b'R', 2, 2, 2]);
    let mut b = [0u8; 16];
    let r = c.read(&mut b);
    assert!(matches!(r, Ok(0) | Err(_)), "the closed connection answered more: {r:?}");
    assert!(svc.stats().closed.load(Ordering::Relaxed) >= 1);
    let st = svc.mux().stats();
    assert!(st.rx_msgs >= 50 * 10 + 3, "{st:?}");
    svc.shutdown();
}

/// A reply another socket queued on a connection with BATCH (a file
/// server's thread, its batch not yet ended) leaves before a reply the
/// connection's worker makes later: the worker writes none of its own
/// past it. (A 9P Rversion overtook a batched Rread of the old session.)
fn a_batched_reply_of_another_socket_is_not_overtaken_by_the_workers() {
    let mux = mux_with(|c| c.core.steering = Steering::Affinity);
    let from = Arc::new(std::sync::Mutex::new(None));
    let seen = from.clone();
    let handler = Arc::new(move |req: Bytes, p: PsockId, _s: &mut bytes::BytesMut| {
        *seen.lock().unwrap() = Some(p);
        Verdict::Reply(req)
    });
    let svc = l4_service(mux, handler);
    let other = svc.mux().socket(connmux::SockType::Dgram).unwrap();
    other.set_recv_disable(true).unwrap();
    let mut c = TcpStream::connect(svc.local_addr()).unwrap();
    c.set_nodelay(true).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    for round in 0..20u8 {
        c.write_all(&framed(&[b'a', round])).unwrap();
        assert_eq!(read_framed(&mut c), [b'a', round]);
        let p = from.lock().unwrap().expect("the handler saw the request");
        other.send_msg_batch(Bytes::from(framed(&[b'h', round])), p, true).unwrap();
        c.write_all(&framed(&[b'b', round])).unwrap();
        assert_eq!(read_framed(&mut c), [b'h', round], "round {round} on {:?}: the worker's reply first", driver());
        assert_eq!(read_framed(&mut c), [b'b', round], "round {round}");
        other.end_batch().unwrap();
    }
    svc.shutdown();
}

on_both_drivers!(
    echo_service_many_clients_pipelined_complete,
    bad_client_is_aborted_while_good_client_continues,
    in_place_verdicts_keep_request_order,
    a_batched_reply_of_another_socket_is_not_overtaken_by_the_workers,
);

/// Large replies to a client that reads slowly through a small receive
/// window: the worker's write of a read's replies (written at once, in the
/// pass that served them) comes back short or would block, the rest goes
/// out when the connection is writable again, and every reply arrives
/// whole and in order; nothing is aborted.
fn slow_reader_gets_every_large_reply_in_order() {
    let svc = echo_service(1, Steering::Affinity, 1 << 20);
    let addr = svc.local_addr();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // Set before connecting, so the window stays small.
    sock.set_recv_buffer_size(16 << 10).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut c: TcpStream = sock.into();
    c.set_read_timeout(Some(WAIT)).unwrap();
    const N: u32 = 160;
    let body = |i: u32| -> Vec<u8> { (0..64 << 10).map(|k: u32| (k.wrapping_mul(31) ^ i) as u8).collect() };
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..N {
            w.write_all(&framed(&body(i))).unwrap();
        }
    });
    for i in 0..N {
        if i % 8 == 0 {
            // Let the replies pile up against the window.
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(read_framed(&mut c) == body(i), "reply {i} differs");
    }
    writer.join().unwrap();
    // (A reply its worker wrote is counted at the worker's next pass.)
    let n = u64::from(N);
    let st = eventually(|| Some(svc.mux().stats()).filter(|st| st.rx_msgs >= n && st.tx_msgs >= n));
    assert_eq!((st.rx_msgs, st.tx_msgs), (n, n));
    assert_eq!(svc.stats().closed.load(Ordering::Relaxed), 0);
    svc.shutdown();
}

on_both_drivers!(slow_reader_gets_every_large_reply_in_order);

/// Idle lanes sleep on their sockets (a second at a time) and shutdown wakes
/// them: stopping a service whose lanes never had work does not wait for
/// their sleep to run out.
fn shutdown_wakes_idle_lanes() {
    for _ in 0..3 {
        let svc = echo_service(2, Steering::Affinity, 1 << 16);
        // Until the lanes have reached their sleep.
        eventually(|| lanes_asleep().then_some(()));
        let t = std::time::Instant::now();
        svc.shutdown();
        let took = t.elapsed();
        assert!(took < Duration::from_millis(900), "shutdown took {took:?}: an idle lane slept through it");
    }
}

on_both_drivers!(shutdown_wakes_idle_lanes);

/// Whether every lane thread of this process (`connmux-lane*`,
/// `connmux-help*`) is asleep (`S` in `/proc/self/task/*/stat`) and there is
/// at least one.
fn lanes_asleep() -> bool {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return false };
    let mut lanes = 0;
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !(comm.starts_with("connmux-lane") || comm.starts_with("connmux-help")) {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command name's closing parenthesis.
        match stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()) {
            Some('S') => lanes += 1,
            _ => return false,
        }
    }
    lanes > 0
}

/// An echo service whose requests starting with `H` first burn `burn` of
/// the handler thread's CPU time.
fn heavy_echo(mux: connmux::Mux, burn: Duration) -> Service {
    heavy_echo_counted(mux, burn, Default::default())
}

/// [`heavy_echo`], counting the heavy requests it has finished in `done`
/// (before their replies go out).
fn heavy_echo_counted(mux: connmux::Mux, burn: Duration, done: Arc<std::sync::atomic::AtomicU64>) -> Service {
    let handler = Arc::new(move |req: Bytes, _from: PsockId, _s: &mut bytes::BytesMut| {
        if req.get(4) == Some(&b'H') {
            // `burn` of this thread's CPU time, not of the clock: a handler
            // preempted on a loaded machine still costs what the worker's
            // heavy probe (thread CPU time) looks for.
            let t = connmux_sys::clock::thread_cpu_nanos();
            while connmux_sys::clock::thread_cpu_nanos().saturating_sub(t) < burn.as_nanos() as u64 {
                std::hint::spin_loop();
            }
            done.fetch_add(1, Ordering::AcqRel);
        }
        Verdict::Reply(req)
    });
    l4_service(mux, handler)
}

/// A client of [`heavy_echo`]: no Nagle delay, reads bounded by `WAIT`.
fn heavy_client(addr: std::net::SocketAddr) -> TcpStream {
    let c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    c
}

/// Heavy request `i` for [`heavy_echo`] (its echo is the same bytes).
fn heavy_request(i: u32) -> Vec<u8> {
    let mut body = vec![b'H'];
    body.extend_from_slice(&i.to_be_bytes());
    body
}

/// A connection whose requests take long (300 µs of CPU each) is handed to
/// the heavy lanes, the others stay; every client still gets every reply,
/// once, for its own requests (the light ones in order).
fn heavy_connection_goes_to_the_lane() {
    // One at a time: a helper takes only where its CPU has time to spare,
    // and two heavy-lane tests at once leave each other none.
    let _alone = serial();
    let mux = mux_with(|c| {
        c.workers = 2;
        c.core.steering = Steering::Affinity;
    });
    let svc = heavy_echo(mux, Duration::from_micros(300));
    let addr = svc.local_addr();
    // The heavy client's id starts with 'H'; the light ones' with 0.
    let heavy_id = u32::from_be_bytes([b'H', 0, 0, 1]);
    // Its replies may pass each other: both workers' lanes answer it.
    let heavy = std::thread::spawn(move || client_round_trips(addr, heavy_id, 300, 2, false));
    let light: Vec<_> =
        (1..=6).map(|id| std::thread::spawn(move || client_round_trips(addr, id, 3000, 4, true))).collect();
    for c in light {
        c.join().unwrap();
    }
    heavy.join().unwrap();
    // At least the heavy one (a light one preempted three runs in a row on a
    // loaded machine may follow it; its replies still come back in order).
    assert!(svc.mux().lane_moves() >= 1, "the heavy connection never went to a lane");
    let all = 300 + 6 * 3000;
    let st = eventually(|| Some(svc.mux().stats()).filter(|st| st.psock.rx_msgs >= all));
    assert_eq!(st.psock.rx_msgs, all);
    svc.shutdown();
}

/// With one worker, a light connection is answered while heavy requests
/// (100 ms of CPU each) run in the lane: light round trips complete while a
/// heavy request is running, not only between heavy replies. (How long a
/// light round trip takes beside heavy ones is `connmux bench uneven`'s to
/// measure, not a test's.)
fn light_requests_are_not_answered_behind_heavy_ones() {
    // One at a time: a helper takes only where its CPU has time to spare,
    // and two heavy-lane tests at once leave each other none.
    let _alone = serial();
    let mux = mux_with(|c| c.workers = 1);
    // Heavy requests finished by the handler so far.
    let heavy_done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let svc = heavy_echo_counted(mux, Duration::from_millis(100), heavy_done.clone());
    let addr = svc.local_addr();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let heavy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(WAIT)).unwrap();
            // Two in flight, bounded: at most 60 requests (6 s of CPU).
            let req = framed(&[b'H', 0, 0, 0]);
            c.write_all(&req).unwrap();
            for _ in 0..60 {
                c.write_all(&req).unwrap();
                assert_eq!(read_framed(&mut c), vec![b'H', 0, 0, 0]);
                if stop.load(Ordering::Acquire) {
                    break;
                }
            }
            assert_eq!(read_framed(&mut c), vec![b'H', 0, 0, 0]);
        })
    };
    let deadline = std::time::Instant::now() + WAIT;
    while svc.mux().lane_moves() == 0 {
        assert!(std::time::Instant::now() < deadline, "the heavy connection never went to the lane");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    // A light request answered behind a heavy one is handled after that
    // heavy request finishes (two are always in flight, so one is always
    // running): its round trip spans a heavy finish. One answered beside it
    // spans none unless a heavy request happens to end meanwhile. Counted,
    // not timed.
    let mut beside = 0;
    for i in 0..20u8 {
        let before = heavy_done.load(Ordering::Acquire);
        c.write_all(&framed(&[b'L', i])).unwrap();
        assert_eq!(read_framed(&mut c), vec![b'L', i]);
        if heavy_done.load(Ordering::Acquire) == before {
            beside += 1;
        }
        // Spread the light requests over several heavy ones.
        std::thread::sleep(Duration::from_millis(7));
    }
    stop.store(true, Ordering::Release);
    heavy.join().unwrap();
    assert!(beside >= 10, "only {beside} of 20 light round trips completed while no heavy request finished");
    svc.shutdown();
}

/// A busy connection goes to the lane though none of its requests is long:
/// sixteen at a time of 20 µs of CPU each hold its worker 320 µs a read
/// (`Tuning::busy_handler`, 10 µs, under `slow_handler`, 50 µs). With the
/// busy rule off (`busy_handler` at `slow_handler`) the same load stays
/// with its worker. Replies come back in order either way (one worker: its
/// lane has one taker). Its lane, up to 15 requests behind, posts no reply
/// quietly: that is 300 µs of work ahead, less than a reply may wait
/// (`lane::LANE_REPLY_WAIT`, 1 ms), though more requests than
/// `lane::LANE_QUIET_FROM` (8); without the time rule, about 7 replies of
/// each round of 16 would be.
fn a_busy_connection_of_medium_requests_goes_to_the_lane() {
    // One at a time: a helper takes only where its CPU has time to spare,
    // and two heavy-lane tests at once leave each other none.
    let _alone = serial();
    for busy_rule in [true, false] {
        let mux = mux_with(|c| {
            c.workers = 1;
            if !busy_rule {
                c.tuning.busy_handler = c.tuning.slow_handler;
            }
        });
        let svc = heavy_echo(mux, Duration::from_micros(20));
        let mut c = heavy_client(svc.local_addr());
        let req = heavy_request;
        // Rounds of 16 requests in one write (one read for the worker, one
        // run of 320 µs), their replies read before the next: at most 400
        // rounds; with the rule, until 10 rounds after the move.
        let (mut seq, mut after_move) = (0u32, 0);
        for _ in 0..400 {
            let batch: Vec<u8> = (seq..seq + 16).flat_map(|i| framed(&req(i))).collect();
            c.write_all(&batch).unwrap();
            for i in seq..seq + 16 {
                assert_eq!(read_framed(&mut c), req(i), "reply {i} out of order (busy rule {busy_rule})");
            }
            seq += 16;
            if svc.mux().lane_moves() >= 1 {
                after_move += 1;
                if after_move == 10 {
                    break;
                }
            }
            if !busy_rule && seq >= 100 * 16 {
                break;
            }
        }
        match busy_rule {
            true => {
                assert!(after_move == 10, "the busy connection never went to the lane ({seq} requests)");
                // (One request that took far longer, preempted by the
                // machine's host, may look like much work ahead.)
                let quiet = svc.mux().lane_quiet_replies();
                assert!(quiet <= 4, "a lane of short requests posted {quiet} replies quietly");
            }
            // (The worker's probe reads CPU time: 20 µs each is not slow
            // however long a preempted run takes by the clock.)
            false => assert_eq!(svc.mux().lane_moves(), 0, "moved to the lane with the busy rule off"),
        }
        svc.shutdown();
    }
}

/// A connection heavy for a while goes to the lane, and back to its worker
/// once its requests run short again; every reply comes back, in order,
/// through both moves (two in flight, so a request is always waiting).
fn connection_light_again_leaves_the_lane() {
    // One at a time: a helper takes only where its CPU has time to spare,
    // and two heavy-lane tests at once leave each other none.
    let _alone = serial();
    // A light request counts as short under `busy_handler` of CPU time with
    // its verdict's post (a system call); 64 in a row must be short. Under
    // AddressSanitizer on a loaded machine one in a few hundred took 10 µs
    // (the default), so the bar is 100 µs here: a light echo is still far
    // below it and a heavy request (300 µs) far above.
    let mux = mux_with(|c| {
        c.workers = 1;
        c.tuning.busy_handler = Duration::from_micros(100);
    });
    let svc = heavy_echo(mux, Duration::from_micros(300));
    let addr = svc.local_addr();
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    // 20 heavy requests, then up to 2,000 light ones until it has returned.
    let req = |i: u32| {
        let mut body = vec![if i < 20 { b'H' } else { b'L' }];
        body.extend_from_slice(&i.to_be_bytes());
        body
    };
    let total = 2_000u32;
    c.write_all(&framed(&req(0))).unwrap();
    let mut sent = 1;
    let mut got = 0;
    while got < total {
        if sent < total {
            c.write_all(&framed(&req(sent))).unwrap();
            sent += 1;
        }
        assert_eq!(read_framed(&mut c), req(got), "reply {got} out of order");
        got += 1;
        if got == 20 {
            assert!(svc.mux().lane_moves() >= 1, "the heavy requests never went to the lane");
        }
        if svc.mux().lane_returns() >= 1 {
            break;
        }
    }
    // The requests still in flight are answered too.
    while got < sent {
        assert_eq!(read_framed(&mut c), req(got), "reply {got} out of order");
        got += 1;
    }
    // (A light request preempted three times in a row on a loaded machine
    // may send it to the lane again: at least one move and one return.)
    assert!(svc.mux().lane_returns() >= 1, "the connection never left the lane");
    assert!(got > 20, "returned before its light requests");
    svc.shutdown();
}

/// What the handler saw of the heavy requests that ran on a lane.
#[derive(Default)]
struct LaneRuns {
    /// Heavy requests running now, and the most seen at once.
    running: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    /// (lane or helper thread's name, CPU) of each run.
    seen: std::sync::Mutex<std::collections::BTreeSet<(String, usize)>>,
}

impl LaneRuns {
    fn threads(&self) -> usize {
        self.seen.lock().unwrap().iter().map(|(t, _)| t).collect::<std::collections::BTreeSet<_>>().len()
    }
    fn cpus(&self) -> usize {
        self.seen.lock().unwrap().iter().map(|(_, c)| c).collect::<std::collections::BTreeSet<_>>().len()
    }
}

/// An echo service on two workers pinned on CPUs 0 and 1 whose requests
/// starting with `H` burn `burn` of CPU, noting in `runs` those run on a lane.
/// `None` where CPUs 0 and 1 are not both available.
fn recording_heavy_echo(burn: Duration, in_order: bool, runs: Arc<LaneRuns>) -> Option<Service> {
    let avail = connmux_sys::affinity::available_cpus().unwrap();
    if !(avail.contains(&0) && avail.contains(&1)) {
        eprintln!("SKIPPED: CPUs 0 and 1 are not both available here ({avail:?})");
        return None;
    }
    let mux = mux_with(|c| {
        c.workers = 2;
        c.placement = connmux::Placement::Cpus(vec![0, 1]);
        c.lane_in_order = in_order;
    });
    let handler = Arc::new(move |req: Bytes, _from: PsockId, _s: &mut bytes::BytesMut| {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        let on_lane = name.starts_with("connmux-lane") || name.starts_with("connmux-help");
        if req.get(4) == Some(&b'H') && on_lane {
            let now = runs.running.fetch_add(1, Ordering::AcqRel) + 1;
            runs.most.fetch_max(now, Ordering::AcqRel);
            let cpu = connmux_sys::affinity::current_cpu().expect("sched_getcpu");
            runs.seen.lock().unwrap().insert((name, cpu));
            let t = std::time::Instant::now();
            while t.elapsed() < burn {
                std::hint::spin_loop();
            }
            runs.running.fetch_sub(1, Ordering::AcqRel);
        } else if req.get(4) == Some(&b'H') {
            // On a worker, before the connection turned heavy.
            let t = std::time::Instant::now();
            while t.elapsed() < burn {
                std::hint::spin_loop();
            }
        }
        Verdict::Reply(req)
    });
    Some(l4_service(mux, handler))
}

/// The feature KCM is for: one connection's heavy requests (1 ms of CPU
/// each, 16 in flight) are answered on both workers' CPUs at once, by its
/// worker's lane and the other CPU's helper. Every reply comes back once (in any order) for its
/// own request.
fn one_heavy_connection_runs_on_two_cpus_at_once() {
    // One at a time: a helper takes only where its CPU has time to spare,
    // and two heavy-lane tests at once leave each other none.
    let _alone = serial();
    let runs = Arc::new(LaneRuns::default());
    let Some(svc) = recording_heavy_echo(Duration::from_millis(1), false, runs.clone()) else { return };
    let jiffies = cpu_jiffies();
    let mut c = heavy_client(svc.local_addr());
    let req = heavy_request;
    const MAX: u32 = 5_000;
    let mut answered = vec![false; MAX as usize];
    let deadline = std::time::Instant::now() + WAIT;
    let spread = || runs.most.load(Ordering::Acquire) >= 2 && runs.cpus() >= 2 && runs.threads() >= 2;
    let (mut sent, mut got) = (0u32, 0u32);
    let mine = self_jiffies();
    while sent < MAX && !spread() && std::time::Instant::now() < deadline {
        let mut batch = Vec::new();
        while sent < MAX && sent - got < 16 {
            batch.extend_from_slice(&framed(&req(sent)));
            sent += 1;
        }
        c.write_all(&batch).unwrap();
        let body = read_framed(&mut c);
        let i = u32::from_be_bytes(body[1..5].try_into().unwrap());
        assert!(i < sent && !std::mem::replace(&mut answered[i as usize], true), "reply {i} unexpected or twice");
        got += 1;
    }
    while got < sent {
        let body = read_framed(&mut c);
        let i = u32::from_be_bytes(body[1..5].try_into().unwrap());
        assert!(i < sent && !std::mem::replace(&mut answered[i as usize], true), "reply {i} unexpected or twice");
        got += 1;
    }
    // A helper takes only where its CPU has time to spare: where other
    // processes kept the CPUs busy meanwhile (half a CPU or more), the
    // test cannot tell and says so.
    let others = others_busy(&jiffies, mine);
    if !spread() && others >= 0.5 {
        eprintln!(
            "INCONCLUSIVE: other processes kept {others:.2} CPUs busy; {:?}; CPUs busy over the test: {}",
            runs.seen.lock().unwrap(),
            busy_since(&jiffies)
        );
        svc.shutdown();
        return;
    }
    assert!(
        spread(),
        "{sent} requests and never on two CPUs at once: {:?}; CPUs busy over the test: {}",
        runs.seen.lock().unwrap(),
        busy_since(&jiffies)
    );
    assert_eq!(svc.mux().lane_moves(), 1);
    svc.shutdown();
}

/// A heavy connection far behind (1 ms of CPU a request, 24 in flight) on
/// a worker that sleeps with no timer (worker 1: worker 0 keeps the mux's
/// time): its lane posts the replies without waking the worker
/// (8 or more queued, `lane::LANE_QUIET_FROM`), and every one still comes
/// back (a post the worker slept through would leave the client's read to
/// time out).
fn a_lane_far_behind_posts_its_replies_quietly() {
    // One at a time: a helper takes only where its CPU has time to spare,
    // and two heavy-lane tests at once leave each other none.
    let _alone = serial();
    let mux = mux_with(|c| {
        c.workers = 2;
        // In turn: the first connection to worker 0, the heavy one to 1.
        c.incoming_cpu = false;
    });
    let svc = heavy_echo(mux, Duration::from_millis(1));
    let _first = TcpStream::connect(svc.local_addr()).unwrap();
    eventually(|| (svc.mux().stats().psocks == 1).then_some(()));
    let heavy_id = u32::from_be_bytes([b'H', 0, 0, 1]);
    client_round_trips(svc.local_addr(), heavy_id, 400, 24, false);
    let quiet = svc.mux().lane_quiet_replies();
    assert!(quiet > 0, "400 requests, 24 in flight, and no reply posted quietly");
    svc.shutdown();
}

/// With `Config::lane_in_order` a heavy connection is answered by its own
/// worker's lane alone, and its replies come back in request order.
fn lane_in_order_keeps_a_heavy_connections_replies_in_order() {
    // One at a time: a helper takes only where its CPU has time to spare,
    // and two heavy-lane tests at once leave each other none.
    let _alone = serial();
    let runs = Arc::new(LaneRuns::default());
    let Some(svc) = recording_heavy_echo(Duration::from_micros(300), true, runs.clone()) else { return };
    let heavy_id = u32::from_be_bytes([b'H', 0, 0, 1]);
    client_round_trips(svc.local_addr(), heavy_id, 300, 8, true);
    assert!(svc.mux().lane_moves() >= 1, "the heavy connection never went to a lane");
    assert_eq!(runs.threads(), 1, "ran on more than its own lane: {:?}", runs.seen.lock().unwrap());
    assert_eq!(runs.most.load(Ordering::Acquire), 1);
    svc.shutdown();
}

/// A lane holds at most `Config::lane_bytes` of requests: with a bound below
/// one request, a heavy connection's requests are run by its worker itself
/// (none on a lane thread), and every one is answered; with the default,
/// the same load does reach the lane threads.
fn a_lane_full_by_bytes_leaves_requests_to_the_worker() {
    // One at a time: a helper takes only where its CPU has time to spare,
    // and two heavy-lane tests at once leave each other none.
    let _alone = serial();
    for (bytes, lane_expected) in [(1usize, false), (16 << 20, true)] {
        let on_lane = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mux = mux_with(|c| {
            c.workers = 1;
            c.lane_bytes = bytes;
        });
        let seen = on_lane.clone();
        let handler = Arc::new(move |req: Bytes, _from: PsockId, _s: &mut bytes::BytesMut| {
            if req.get(4) == Some(&b'H') {
                let name = std::thread::current().name().unwrap_or("").to_owned();
                if name.starts_with("connmux-lane") || name.starts_with("connmux-help") {
                    seen.fetch_add(1, Ordering::AcqRel);
                }
                let t = std::time::Instant::now();
                while t.elapsed() < Duration::from_micros(300) {
                    std::hint::spin_loop();
                }
            }
            Verdict::Reply(req)
        });
        let svc = l4_service(mux, handler);
        let heavy_id = u32::from_be_bytes([b'H', 0, 0, 1]);
        client_round_trips(svc.local_addr(), heavy_id, 200, 4, true);
        assert!(svc.mux().lane_moves() >= 1, "lane_bytes {bytes}: the connection never turned heavy");
        let ran = on_lane.load(Ordering::Acquire);
        assert_eq!(ran > 0, lane_expected, "lane_bytes {bytes}: {ran} heavy requests ran on a lane thread");
        svc.shutdown();
    }
}

/// Whether this kernel gives threads no scheduler slice of their own
/// (before Linux 6.12): the slice tests are skipped there, and say so.
fn no_thread_slices() -> bool {
    let none = connmux_sys::affinity::thread_slice(0).ok().flatten().is_none();
    if none {
        eprintln!("SKIPPED: this kernel gives threads no slice of their own");
    }
    none
}

/// This process's threads whose name starts with `prefix` that run in
/// scheduler slices of `slice`.
fn threads_with_slice(prefix: &str, slice: Duration) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|t| {
            let t = t.ok()?;
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let tid: libc::pid_t = t.file_name().to_str()?.parse().ok()?;
            (comm.starts_with(prefix) && connmux_sys::affinity::thread_slice(tid).ok()?? == slice).then_some(())
        })
        .count()
}

/// A worker asks for `Config::lane_worker_slice` once a request goes to its
/// lane, and gives it back after a stretch of passes with none (a slice no
/// other test asks for, so only this mux's worker can have it). Skipped,
/// and said so, on a kernel with no slice of a thread's own (before Linux
/// 6.12).
fn a_worker_beside_a_busy_lane_runs_in_long_slices() {
    if no_thread_slices() {
        return;
    }
    let _alone = serial();
    let slice = Duration::from_micros(7_300);
    let mux = mux_with(|c| {
        c.workers = 1;
        c.lane_worker_slice = slice;
    });
    let svc = heavy_echo(mux, Duration::from_micros(300));
    let addr = svc.local_addr();
    let connect = || {
        let c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.set_nodelay(true).unwrap();
        c
    };
    let light = framed(&[0, 0, 0, 1]);
    let mut c = connect();
    for _ in 0..100 {
        c.write_all(&light).unwrap();
        assert_eq!(read_framed(&mut c), vec![0, 0, 0, 1]);
    }
    assert_eq!(threads_with_slice("connmux-w", slice), 0, "asked before its lane had work");
    // Heavy requests (bounded: 2,000 of 300 µs) until the connection went to
    // the lane and the worker asked.
    let mut h = connect();
    let heavy = framed(&[b'H', 0, 0, 1]);
    let mut sent = 0;
    while !(svc.mux().lane_moves() >= 1 && threads_with_slice("connmux-w", slice) == 1) {
        assert!(sent < 2_000, "the worker never asked for its slice");
        h.write_all(&heavy).unwrap();
        assert_eq!(read_framed(&mut h), vec![b'H', 0, 0, 1]);
        sent += 1;
    }
    drop(h);
    // Light requests only: each is at least one pass of the worker with
    // nothing offered (bounded: 100,000 round trips).
    let mut calls = 0;
    while threads_with_slice("connmux-w", slice) == 1 {
        assert!(calls < 100_000, "the worker kept its slice with an idle lane");
        for _ in 0..256 {
            c.write_all(&light).unwrap();
            assert_eq!(read_framed(&mut c), vec![0, 0, 0, 1]);
        }
        calls += 256;
    }
    svc.shutdown();
}

/// A lane's home thread runs in `Config::lane_slice` slices from its start
/// (a slice no other test asks for, so only this mux's lane can have it);
/// the worker does not. Skipped, and said so, on a kernel with no slice of
/// a thread's own (before Linux 6.12).
#[test]
fn a_lane_runs_in_short_slices() {
    if no_thread_slices() {
        return;
    }
    let _alone = serial();
    let slice = Duration::from_micros(170);
    let mux = mux_with(|c| {
        c.workers = 1;
        c.lane_slice = slice;
    });
    let svc = heavy_echo(mux, Duration::from_micros(300));
    // The lane asks as its thread starts: wait for that (bounded).
    let deadline = std::time::Instant::now() + WAIT;
    while threads_with_slice("connmux-lane", slice) != 1 {
        assert!(std::time::Instant::now() < deadline, "the lane never asked for its slice");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(threads_with_slice("connmux-w", slice), 0, "a worker took the lane's slice");
    svc.shutdown();
}

on_both_drivers!(
    a_lane_full_by_bytes_leaves_requests_to_the_worker,
    one_heavy_connection_runs_on_two_cpus_at_once,
    a_lane_far_behind_posts_its_replies_quietly,
    lane_in_order_keeps_a_heavy_connections_replies_in_order,
    heavy_connection_goes_to_the_lane,
    light_requests_are_not_answered_behind_heavy_ones,
    connection_light_again_leaves_the_lane,
    a_busy_connection_of_medium_requests_goes_to_the_lane,
    a_worker_beside_a_busy_lane_runs_in_long_slices
);

/// `stop_accepting`: new connections are refused, the attached ones are
/// still served.
#[test]
fn stop_accepting_refuses_new_connections_and_serves_the_others() {
    let svc = echo_service(1, Steering::Affinity, 1 << 20);
    let addr = svc.local_addr();
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    c.write_all(&framed(b"before")).unwrap();
    assert_eq!(read_framed(&mut c), b"before");

    svc.stop_accepting();
    let start = std::time::Instant::now();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            _ => {}
        }
        assert!(start.elapsed() < WAIT, "{addr} still accepts after {WAIT:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    c.write_all(&framed(b"after")).unwrap();
    assert_eq!(read_framed(&mut c), b"after");
    svc.shutdown();
}
