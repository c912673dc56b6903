//! One client mux over many servers, on real TCP over loopback: plain sends
//! spread by the transmit policy (KCM's rotation, or least outstanding), a
//! slowed server, a server that dies mid-run, and per-attach limits.

#[macro_use]
mod common;

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use connmux::{AttachOptions, KcmSocket, Mux, PsockError, PsockId, RxError, SockType, TxPolicy};

/// A call server on loopback: answers each L4 request (an 8-byte call id)
/// with the id and its own index, `delay` after reading it. The delay is a
/// sleep, not a CPU burn: on a loaded machine a burning server takes CPU from
/// the others and the fast ones stop being much faster than it.
struct Server {
    addr: SocketAddr,
    conn: mpsc::Receiver<TcpStream>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(index: u8, delay: Duration) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, conn) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_nodelay(true).unwrap();
            tx.send(s.try_clone().unwrap()).unwrap();
            let mut req = [0u8; 12];
            // Ends when the client goes away or the server is killed.
            while s.read_exact(&mut req).is_ok() {
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                let mut body = req[4..12].to_vec();
                body.push(index);
                if s.write_all(&framed(&body)).is_err() {
                    break;
                }
            }
        });
        Server { addr, conn, thread: Some(thread) }
    }

    /// The server dies: its connection is reset (what the client sees when a
    /// server process is killed with requests unread).
    fn kill(&mut self) {
        let s = self.conn.recv_timeout(WAIT).expect("the server has its connection");
        socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
        s.shutdown(std::net::Shutdown::Both).unwrap();
        self.thread.take().unwrap().join().unwrap();
    }
}

/// A client mux with `policy`, attached to every server.
fn client(policy: TxPolicy, servers: &[Server]) -> (Mux, KcmSocket, Vec<PsockId>) {
    let mux = mux_with(|c| c.core.tx_policy = policy);
    let sock = mux.socket(SockType::SeqPacket).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let psocks = servers
        .iter()
        .map(|s| {
            let c = TcpStream::connect(s.addr).unwrap();
            mux.attach(&c, l4()).unwrap()
        })
        .collect();
    (mux, sock, psocks)
}

/// What a run of calls saw.
#[derive(Debug, Default)]
struct Run {
    /// Calls answered by each server (first answers only).
    per_server: Vec<usize>,
    /// Psocks reported failed, with their error.
    failed: Vec<(PsockId, PsockError)>,
    /// Calls sent again after a psock failed.
    resent: usize,
    elapsed: Duration,
}

/// `calls` calls with at most `window` unanswered, through one socket.
/// After `kill_after` answers, `kill` runs once. When a psock fails, it is
/// unattached and every call still unanswered is sent again with its id (the
/// calls written to a dead server are lost with it, as on any transport); a
/// second answer to a call is not counted.
fn run(
    mux: &Mux,
    sock: &KcmSocket,
    servers: usize,
    calls: usize,
    window: usize,
    mut kill: Option<(usize, &mut dyn FnMut())>,
) -> Run {
    let mut r = Run { per_server: vec![0; servers], ..Run::default() };
    let mut answered = vec![false; calls];
    let mut unanswered: HashSet<u64> = HashSet::new();
    let (mut next, mut done) = (0u64, 0usize);
    let start = Instant::now();
    let end = start + WAIT * 3;
    while done < calls {
        assert!(Instant::now() < end, "{done} of {calls} calls answered in {:?}: {r:?}", WAIT * 3);
        while (next as usize) < calls && unanswered.len() < window {
            sock.send(&framed(&next.to_be_bytes())).unwrap();
            unanswered.insert(next);
            next += 1;
        }
        match sock.recv_msg() {
            Ok(m) => {
                assert_eq!(m.data.len(), 13, "a whole reply");
                let id = u64::from_be_bytes(m.data[4..12].try_into().unwrap());
                let server = m.data[12] as usize;
                if !std::mem::replace(&mut answered[id as usize], true) {
                    unanswered.remove(&id);
                    r.per_server[server] += 1;
                    done += 1;
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("recv: {e}"),
        }
        if let Some((after, f)) = kill.as_mut() {
            if done >= *after {
                f();
                kill = None;
            }
        }
        while let Ok(ev) = mux.events().try_recv() {
            r.failed.push((ev.psock, ev.error));
            let _ = mux.unattach_id(ev.psock);
            for id in &unanswered {
                sock.send(&framed(&id.to_be_bytes())).unwrap();
                r.resent += 1;
            }
        }
    }
    r.elapsed = start.elapsed();
    r
}

const CALLS: usize = 3000;
const WINDOW: usize = 24;
/// Server 2's delay per call in the rotation test: its share does not depend
/// on it, only the run's length does.
const ROTATION_DELAY: Duration = Duration::from_micros(200);
/// Server 2's delay per call in the least-outstanding test: it answers at
/// most 200 calls per second, however loaded the machine, where a fast
/// server on a busy 2-CPU machine still answers thousands, so a sixth of the
/// calls is far above what it gets when the policy works and far below the
/// third that rotation would give it.
const LEAST_OUTSTANDING_DELAY: Duration = Duration::from_millis(5);

fn slow_server_share(policy: TxPolicy, delay: Duration) -> Run {
    let servers: Vec<Server> =
        (0..3u8).map(|i| Server::start(i, if i == 2 { delay } else { Duration::ZERO })).collect();
    let (mux, sock, psocks) = client(policy, &servers);
    let r = run(&mux, &sock, 3, CALLS, WINDOW, None);
    eprintln!("{policy:?}: per server {:?} in {:?}", r.per_server, r.elapsed);
    assert!(r.failed.is_empty(), "{r:?}");
    assert_eq!(r.per_server.iter().sum::<usize>(), CALLS);
    // The statistics agree: each psock wrote as many requests as its server answered.
    for (i, p) in psocks.iter().enumerate() {
        assert_eq!(mux.psock_stats(*p).unwrap().tx_msgs, r.per_server[i] as u64, "psock {i}");
    }
    r
}

fn rotation_sends_the_slow_server_a_third() {
    let r = slow_server_share(TxPolicy::RoundRobin, ROTATION_DELAY);
    assert!(r.per_server[2].abs_diff(CALLS / 3) <= CALLS / 100, "{:?}", r.per_server);
}

fn least_outstanding_sends_the_slow_server_at_most_a_sixth() {
    let r = slow_server_share(TxPolicy::LeastOutstanding, LEAST_OUTSTANDING_DELAY);
    assert!(r.per_server[2] * 6 <= CALLS, "slow server answered {} of {CALLS}: {:?}", r.per_server[2], r.per_server);
}

/// Server 1 dies after a third of the calls: every call is still answered,
/// by the others from then on, and the dead connection is reported.
fn a_server_killed_mid_run_loses_no_call() {
    let mut servers: Vec<Server> = (0..3u8).map(|i| Server::start(i, Duration::ZERO)).collect();
    let (mux, sock, psocks) = client(TxPolicy::LeastOutstanding, &servers);
    let mut killed = false;
    let mut kill = || {
        servers[1].kill();
        killed = true;
    };
    let r = run(&mux, &sock, 3, CALLS, WINDOW, Some((CALLS / 3, &mut kill)));
    assert!(killed);
    eprintln!("per server {:?}, resent {}, failed {:?}", r.per_server, r.resent, r.failed);
    assert_eq!(r.per_server.iter().sum::<usize>(), CALLS, "every call answered once");
    assert!(r.per_server[1] < CALLS / 3 + WINDOW, "the dead server answered only before it died: {r:?}");
    // Each survivor took a good share of the rest, not necessarily half:
    // least outstanding follows speed, and the whole run lasts about 20 ms,
    // so a survivor the scheduler holds back for a few of them takes less
    // (one CI run: 1,998 and 641 of the 3,000 calls, the dead one 361).
    assert!(r.per_server[0] > CALLS / 6 && r.per_server[2] > CALLS / 6, "the others took the rest: {r:?}");
    // Reported: the failure event names the dead server's psock, and only it.
    assert!(!r.failed.is_empty(), "{r:?}");
    for (p, e) in &r.failed {
        assert_eq!(*p, psocks[1], "{r:?}");
        assert!(matches!(e, PsockError::Closed | PsockError::Tx(_)), "{r:?}");
    }
    assert_eq!(mux.psocks().len(), 2, "the dead psock was unattached");
    assert_eq!(mux.stats().psock_unattach, 1);
}

/// AttachOptions: a size limit and an assembly timeout of one psock, where the
/// mux's defaults hold for another attached beside it.
fn attach_options_limit_one_psock() {
    let mux = mux_with(|c| {
        c.core.max_msg_size = 1 << 20;
        c.core.assembly_timeout = None;
    });
    let sock = mux.socket(SockType::SeqPacket).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (small, mut small_peer) = pair();
    let (slow, mut slow_peer) = pair();
    let (plain, mut plain_peer) = pair();
    let p_small = mux.attach_with(&small, AttachOptions::new(l4()).max_msg_size(64)).unwrap();
    let p_slow =
        mux.attach_with(&slow, AttachOptions::new(l4()).assembly_timeout(Some(Duration::from_millis(100)))).unwrap();
    let p_plain = mux.attach(&plain, l4()).unwrap();
    // Under the limit: delivered. Over it: that psock fails with EMSGSIZE.
    write_all(&mut small_peer, &framed(&[1; 60]));
    assert_eq!(sock.recv_msg().unwrap().psock, p_small);
    write_all(&mut small_peer, &framed(&[2; 100]));
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    assert_eq!(ev.psock, p_small);
    assert!(matches!(ev.error, PsockError::Rx(RxError::TooBig { max: 64, .. })), "{ev:?}");
    // The same size is fine on the psock with the mux's limit.
    write_all(&mut plain_peer, &framed(&[3; 100]));
    let m = sock.recv_msg().unwrap();
    assert_eq!((m.psock, m.data.len()), (p_plain, 104));
    // A half message: the psock with a timeout fails after it...
    write_all(&mut slow_peer, &framed(&[4; 50])[..20]);
    let ev = mux.events().recv_timeout(WAIT).unwrap();
    assert_eq!(ev.psock, p_slow);
    assert_eq!(ev.error, PsockError::Rx(RxError::Timeout));
    // ...while the psock without one still completes its half message once
    // the rest comes, long after that timeout.
    write_all(&mut plain_peer, &framed(&[5; 50])[..20]);
    let t = Instant::now();
    eventually(|| (t.elapsed() > Duration::from_millis(300)).then_some(()));
    write_all(&mut plain_peer, &framed(&[5; 50])[20..]);
    let m = sock.recv_msg().unwrap();
    assert_eq!((m.psock, m.data.len()), (p_plain, 54));
    assert!(mux.psock_error(p_plain).is_none());
    assert!(mux.events().is_empty());
    assert_eq!(mux.psock_stats(p_small).unwrap().rx_msg_too_big, 1);
    assert_eq!(mux.psock_stats(p_slow).unwrap().rx_msg_timeouts, 1);
    // Both bad connections are aborted; the plain one still works.
    mux.abort(p_small).unwrap();
    mux.abort(p_slow).unwrap();
    write_all(&mut plain_peer, &framed(b"after"));
    assert_eq!(&sock.recv_msg().unwrap().data[4..], b"after");
    drop((small_peer, slow_peer));
}

fn attach_options_refuse_a_zero_limit() {
    let mux = mux_with(|_| {});
    let (c, _peer) = pair();
    let e = mux.attach_with(&c, AttachOptions::new(l4()).max_msg_size(0)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(mux.psocks().is_empty());
}

on_both_drivers!(
    rotation_sends_the_slow_server_a_third,
    least_outstanding_sends_the_slow_server_at_most_a_sixth,
    a_server_killed_mid_run_loses_no_call,
    attach_options_limit_one_psock,
    attach_options_refuse_a_zero_limit,
);
