//! `connmux 9p-server`'s descriptor budget against the real binary over TCP
//! on loopback: a fid that is not open holds no descriptor past the handle
//! budget, open files are capped per connection (EMFILE) and in total
//! (ENFILE) for that client only, the soft descriptor limit is raised at
//! start, and clients making very many fids leave a good client its rate
//! and the server's descriptors (`/proc/PID/fd`) under its limit.

mod common;
mod ninep_support;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use connmux_9p::{MsgType, Tmsg};
use ninep_support::*;

const EMFILE: u32 = 24;
const ENFILE: u32 = 23;

/// The good client's reads per second while `busy()` holds (at least
/// `least`, so a short attack still gives a rate).
fn good_client_while(addr: SocketAddr, export: &Path, least: Duration, busy: impl Fn() -> bool) -> f64 {
    let mut c = Client::session(addr, export);
    c.open(1, "good");
    let start = Instant::now();
    let mut n = 0u64;
    // Bounded: `busy` ends with the attack, which is bounded, and each read
    // is answered within ANSWER_WITHIN or the test fails.
    while start.elapsed() < least || busy() {
        let b = c.ok(&Tmsg::Read { fid: 1, offset: (n % 16) * 4096, count: 4096 });
        assert_eq!(type_of(&b), MsgType::RREAD);
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// The good client's best rate in windows of 500 ms until one reaches half
/// of `alone` or 10 s have passed (the convention of the hostile tests: a
/// starved client fails however long it is watched, while single windows
/// swing with the load of a shared 2-CPU machine).
fn best_rate(addr: SocketAddr, export: &Path, alone: f64) -> f64 {
    let t = Instant::now();
    let mut best = 0.0f64;
    // Bounded by the deadline.
    while best < 0.5 * alone && t.elapsed() < Duration::from_secs(10) {
        best = best.max(good_client(addr, export, Duration::from_millis(500)));
    }
    best
}

/// Walks fids `first..first + n` from the root to `name` on `c`, `batch`
/// requests written at a time, and checks every one made a fid.
fn walk_many(c: &mut Client, first: u32, n: u32, batch: u32, name: &str) {
    let mut done = 0;
    // Bounded by `n`.
    while done < n {
        let k = batch.min(n - done);
        let mut req = Vec::new();
        for i in 0..k {
            Tmsg::Walk { fid: 0, newfid: first + done + i, names: vec![name] }.encode(1 + i as u16, &mut req);
        }
        c.c.write_all(&req).unwrap();
        for _ in 0..k {
            let b = c.recv().unwrap_or_else(|e| panic!("after {done} walks: {e}"));
            assert_eq!(type_of(&b), MsgType::RWALK, "walk {done}: Rlerror {:?}", errno_of(&b));
        }
        done += k;
    }
}

fn stats_dir(name: &str) -> (PathBuf, PathBuf) {
    let d = scratch(&format!("{name}-stat"));
    let s = d.join("s.sock");
    (d, s)
}

/// One connection makes 100,000 fids (walks pipelined 250 at a time) while
/// a good client reads: every walk answered, the fids usable, the good
/// client answered throughout (each read within 5 s) and, while the fids
/// are held, at half its rate or more, and the server's descriptors under
/// its limit and within the handle budget throughout. (During the burst
/// of walks, the attacker and the server share 2 CPUs with the good
/// client: its rate then is reported, not bounded.)
#[test]
fn a_hundred_thousand_fids_on_one_connection() {
    let ex = export_with_good_file("fids100k");
    let (sd, sock) = stats_dir("fids100k");
    let s = Server::start(&ex, &["--stats-socket", sock.to_str().unwrap()]);
    let (limit, base) = (s.fd_limit(), s.fds());
    let watch = FdWatch::start(s.child.id());
    let alone = good_client(s.addr, &ex, Duration::from_secs(1));
    let done = Arc::new(AtomicBool::new(false));
    let (addr, ex2, d2) = (s.addr, ex.clone(), done.clone());
    let started = Instant::now();
    let attacker = std::thread::spawn(move || {
        let mut c = Client::session(addr, &ex2);
        walk_many(&mut c, 1, 100_000, 250, "good");
        let took = started.elapsed();
        // The first fid and the last (one kept a handle, one only its path).
        for fid in [1, 100_000] {
            c.ok(&Tmsg::Getattr { fid, mask: 0x7ff });
            c.ok(&Tmsg::Lopen { fid, flags: 0 });
            let b = c.ok(&Tmsg::Read { fid, offset: 0, count: 16 });
            assert_eq!(b.len(), 11 + 16);
        }
        d2.store(true, Relaxed);
        (c, took)
    });
    let during = good_client_while(s.addr, &ex, Duration::from_secs(1), || !done.load(Relaxed));
    let (c, took) = attacker.join().unwrap();
    let beside = best_rate(s.addr, &ex, alone);
    let text = Server::stat(&sock);
    let handles = counter(&text, "handles");
    let peak = watch.max();
    eprintln!(
        "100,000 fids on one connection in {took:.1?}; good client {alone:.0} reads/s alone, {during:.0} during the walks, \
         {beside:.0} beside the fids held; descriptors {base} at start, {peak} at most (limit {limit}); handles {handles}"
    );
    assert!(peak < limit, "{peak} descriptors against a limit of {limit}");
    // The handle budget is a quarter of the limit, a connection's share a
    // sixteenth: 100,000 fids hold no more (beside a few of the good
    // client's sessions, not yet swept).
    assert!(handles as usize <= limit / 16 + 16, "{handles} handles");
    assert!(peak < base + limit / 16 + 64, "{peak} descriptors, {base} at start");
    assert!(beside >= alone * 0.5, "good client {beside:.0} reads/s beside, {alone:.0} alone");
    drop(c);
    let _ = std::fs::remove_dir_all(&ex);
    let _ = std::fs::remove_dir_all(&sd);
}

/// 1,000 connections of `fids` fids each (from 4 client threads, each
/// connection's walks pipelined), beside a good client: every walk
/// answered, the good client answered throughout and at half its rate or
/// more while the fids are held, the descriptors under the limit. At the
/// issue's full size (`CONNMUX_9P_FIDS=1000`, walks for 11–16 s) also at
/// half its rate or more during the walks (1.11–1.45 of it measured, the
/// file-system threads at nice +3 below the workers that answer its reads;
/// 0.36–0.61 with them beside the workers). Scaled down, the burst lasts
/// about as long as the 1,000 sessions' setup, and the rate is printed.
#[test]
fn a_thousand_connections_of_many_fids() {
    const CONNS: usize = 1000;
    // Scaled from the 1,000 × 1,000 of the issue so the file runs in CI's
    // minutes on 2 CPUs; `CONNMUX_9P_FIDS=1000` runs the full size.
    let fids: u32 = std::env::var("CONNMUX_9P_FIDS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let ex = export_with_good_file("conns1000");
    let s = Server::start(&ex, &["--no-stats-socket", "--max-conns", "2000"]);
    let (limit, base) = (s.fd_limit(), s.fds());
    let watch = FdWatch::start(s.child.id());
    let alone = good_client(s.addr, &ex, Duration::from_secs(1));
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (addr, ex2) = (s.addr, ex.clone());
            std::thread::spawn(move || {
                let mut cs: Vec<Client> = (0..CONNS / 4).map(|_| Client::session(addr, &ex2)).collect();
                let batch = 100u32;
                let mut made = 0;
                // Bounded by `fids`: a batch on every connection, then every reply.
                while made < fids {
                    let k = batch.min(fids - made);
                    for c in cs.iter_mut() {
                        let mut req = Vec::new();
                        for i in 0..k {
                            Tmsg::Walk { fid: 0, newfid: 1 + made + i, names: vec!["good"] }
                                .encode(1 + i as u16, &mut req);
                        }
                        c.c.write_all(&req).unwrap();
                    }
                    for c in cs.iter_mut() {
                        for _ in 0..k {
                            let b = c.recv().unwrap_or_else(|e| panic!("after {made} walks: {e}"));
                            assert_eq!(type_of(&b), MsgType::RWALK, "Rlerror {:?}", errno_of(&b));
                        }
                    }
                    made += k;
                }
                for c in cs.iter_mut() {
                    c.ok(&Tmsg::Getattr { fid: fids, mask: 0x7ff });
                }
                cs
            })
        })
        .collect();
    let d2 = done.clone();
    let waiter = std::thread::spawn(move || {
        let cs: Vec<Vec<Client>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        d2.store(true, Relaxed);
        cs
    });
    let during = good_client_while(s.addr, &ex, Duration::from_secs(1), || !done.load(Relaxed));
    let cs = waiter.join().unwrap();
    let took = started.elapsed();
    let beside = best_rate(s.addr, &ex, alone);
    let peak = watch.max();
    eprintln!(
        "{CONNS} connections x {fids} fids in {took:.1?}; good client {alone:.0} reads/s alone, {during:.0} during the walks, \
         {beside:.0} beside the fids held; descriptors {base} at start, {peak} at most (limit {limit})"
    );
    assert!(peak < limit, "{peak} descriptors against a limit of {limit}");
    assert!(beside >= alone * 0.5, "good client {beside:.0} reads/s beside, {alone:.0} alone");
    if fids >= 1000 {
        assert!(during >= alone * 0.5, "good client {during:.0} reads/s during the walks, {alone:.0} alone");
    }
    drop(cs);
    let _ = std::fs::remove_dir_all(&ex);
}

/// Opens past a connection's cap are EMFILE, past the total ENFILE, each to
/// the client that asked: no connection is reset, the good client reads on,
/// a clunk gives its open back, and `stat` counts the open files and the
/// refusals.
#[test]
fn opens_over_the_budget_are_refused_to_that_client_only() {
    let ex = export_with_good_file("openbudget");
    for i in 0..40 {
        std::fs::write(ex.join(format!("f{i}")), b"x").unwrap();
    }
    let (sd, sock) = stats_dir("openbudget");
    let s =
        Server::start(&ex, &["--max-open", "48", "--max-open-conn", "16", "--stats-socket", sock.to_str().unwrap()]);
    let mut good = Client::session(s.addr, &ex);
    good.open(1, "good");
    // Opens fids 1..=n of `c` (f0, f1, ...); returns each answer's errno.
    let open_n = |c: &mut Client, n: u32| -> Vec<Option<u32>> {
        (1..=n)
            .map(|fid| {
                let name = format!("f{fid}");
                c.ok(&Tmsg::Walk { fid: 0, newfid: fid, names: vec![&name] });
                errno_of(&c.call(&Tmsg::Lopen { fid, flags: 0 }))
            })
            .collect()
    };
    let mut a = Client::session(s.addr, &ex);
    let ra = open_n(&mut a, 20);
    assert!(ra[..16].iter().all(|e| e.is_none()), "{ra:?}");
    assert!(ra[16..].iter().all(|e| *e == Some(EMFILE)), "{ra:?}");
    let mut b = Client::session(s.addr, &ex);
    assert!(open_n(&mut b, 16).iter().all(|e| e.is_none()));
    let mut c = Client::session(s.addr, &ex);
    let rc = open_n(&mut c, 16);
    // 1 (the good client) + 16 + 16 + 15 = 48: the last one is over the total.
    assert!(rc[..15].iter().all(|e| e.is_none()), "{rc:?}");
    assert_eq!(rc[15], Some(ENFILE), "{rc:?}");
    // A create is refused the same way, and creates nothing.
    let b2 = c.call(&Tmsg::Walk { fid: 0, newfid: 100, names: vec![] });
    assert_eq!(type_of(&b2), MsgType::RWALK);
    let r = c.call(&Tmsg::Lcreate { fid: 100, name: "new", flags: 2, mode: 0o644, gid: 0 });
    assert_eq!(errno_of(&r), Some(ENFILE));
    assert!(!ex.join("new").exists());
    // Nobody was reset: each connection answers, the good client reads.
    for cl in [&mut a, &mut b, &mut c] {
        cl.ok(&Tmsg::Getattr { fid: 1, mask: 0x7ff });
        cl.ok(&Tmsg::Read { fid: 1, offset: 0, count: 1 });
    }
    good.ok(&Tmsg::Read { fid: 1, offset: 0, count: 4096 });
    let text = Server::stat(&sock);
    assert_eq!(counter(&text, "open_files"), 48, "{text}");
    assert_eq!(counter(&text, "open_refused"), 6, "{text}");
    // A clunk gives one back.
    a.ok(&Tmsg::Clunk { fid: 1 });
    a.ok(&Tmsg::Lopen { fid: 17, flags: 0 });
    drop((a, b, c));
    let _ = std::fs::remove_dir_all(&ex);
    let _ = std::fs::remove_dir_all(&sd);
}

/// Started with a soft limit of 256 under a hard one above it, the server
/// raises the soft limit to the hard one. Started with both at 1,024 (the
/// common default), one client walking 5,000 fids and opening files until
/// refused locks no one out: a new client attaches and reads, and the
/// descriptors stay under 1,024.
#[test]
fn the_descriptor_limit_is_raised_and_one_client_cannot_use_it_up() {
    let ex = export_with_good_file("limit");
    for i in 0..400 {
        std::fs::write(ex.join(format!("f{i}")), b"x").unwrap();
    }
    let mut sh = Command::new("sh");
    sh.args(["-c", "ulimit -Sn 256 && ulimit -Hn 4096 && exec \"$0\" \"$@\"", BIN]);
    let s = Server::start_in(sh, &ex, &["--no-stats-socket"]);
    assert_eq!(s.fd_limit(), 4096, "the soft limit raised to the hard one");
    drop(s);
    let mut sh = Command::new("sh");
    sh.args(["-c", "ulimit -n 1024 && exec \"$0\" \"$@\"", BIN]);
    let s = Server::start_in(sh, &ex, &["--no-stats-socket"]);
    assert_eq!(s.fd_limit(), 1024);
    let watch = FdWatch::start(s.child.id());
    let mut a = Client::session(s.addr, &ex);
    walk_many(&mut a, 1, 5000, 200, "good");
    let mut refused = None;
    for i in 0..400u32 {
        let (fid, name) = (10_000 + i, format!("f{i}"));
        a.ok(&Tmsg::Walk { fid: 0, newfid: fid, names: vec![&name] });
        if let Some(e) = errno_of(&a.call(&Tmsg::Lopen { fid, flags: 0 })) {
            refused = Some((i, e));
            break;
        }
    }
    let (opened, e) = refused.expect("an open refused");
    assert_eq!(e, EMFILE, "the connection's cap");
    let rate = good_client(s.addr, &ex, Duration::from_millis(500));
    eprintln!(
        "limit 1,024: 5,000 fids and {opened} open files on one connection, then EMFILE; a new client {rate:.0} reads/s; \
         {} descriptors at most",
        watch.max()
    );
    assert!(watch.max() < 1024);
    let _ = std::fs::remove_dir_all(&ex);
}

/// Connections that each send all but the last 16 bytes of a 9P message of
/// 1 MiB less 64 bytes (within `--max-msg`), then nothing.
fn partial_messages(addr: SocketAddr, n: usize, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    const LEN: u32 = (1 << 20) - 64;
    // size[4] (little-endian, counting itself), type (Twrite), tag, then filler.
    let mut head = LEN.to_le_bytes().to_vec();
    head.extend_from_slice(&[MsgType::TWRITE.0, 1, 0]);
    head.resize(LEN as usize - 16, 0x33);
    common::peers::holders(addr, head, n, stop)
}

/// 300 connections each holding a partial 9P message of about 1 MiB under a
/// 64 MiB budget: the budget pauses them (on io_uring a paused connection
/// gives its ring buffers back), and a good client keeps at least half of
/// its read rate alone, as on the RPC and echo servers (`hostile_round2`).
fn partial_messages_under_a_small_budget(driver: &str) {
    let ex = export_with_good_file(&format!("partial-{driver}"));
    let (dir, sock) = stats_dir(&format!("partial-{driver}"));
    let s = Server::start(&ex, &["--driver", driver, "--mem-limit", "64M", "--stats-socket", sock.to_str().unwrap()]);
    let alone = good_client(s.addr, &ex, Duration::from_secs(1));
    let stop = Arc::new(AtomicBool::new(false));
    let holders = partial_messages(s.addr, 300, stop.clone());
    // The holders connect and send within about a second; then the budget
    // has paused them.
    std::thread::sleep(Duration::from_secs(1));
    let beside = best_rate(s.addr, &ex, alone);
    let stat = Server::stat(&sock);
    stop.store(true, Relaxed);
    for h in holders {
        h.join().unwrap();
    }
    let pauses = counter(&stat, "mem_pauses");
    eprintln!(
        "{driver}: good client {alone:.0} reads/s alone, {beside:.0} beside 300 partial messages ({:.2}x); \
         mem_pauses {pauses}, mem_aborts {}, mem_peak {} KiB",
        beside / alone,
        counter(&stat, "mem_aborts"),
        counter(&stat, "mem_peak") >> 10
    );
    assert!(pauses > 0, "{driver}: 300 MiB of partial messages under a 64 MiB budget paused nobody:\n{stat}");
    // The budget's count at its highest, within what its design allows past
    // the limit (as `limits.rs` asserts for the RPC server).
    let mem_peak = counter(&stat, "mem_peak") as usize;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let bound = common::peers::budget_peak_bound(64 << 20, 301, driver, workers);
    assert!(mem_peak <= bound, "{driver}: the budget counted {mem_peak} bytes at its peak, over {bound}");
    assert!(beside >= alone * 0.5, "{driver}: good client {beside:.0} reads/s beside, {alone:.0} alone");
    let _ = std::fs::remove_dir_all(&ex);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn partial_messages_under_a_small_budget_epoll() {
    partial_messages_under_a_small_budget("epoll");
}

#[test]
fn partial_messages_under_a_small_budget_uring() {
    partial_messages_under_a_small_budget("uring");
}
