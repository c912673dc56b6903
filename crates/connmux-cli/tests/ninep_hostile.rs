//! `connmux 9p-server` against clients that try to freeze it: renames within
//! one directory fid, opens of FIFOs nobody writes, reads whose replies are
//! never collected, flushes and new sessions over pending requests, and
//! stop signals. Each attack runs beside a good client that must go on being
//! answered; the server is the real binary, over TCP on loopback.

mod ninep_support;

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use connmux_9p::rmsg::Rmsg;
use connmux_9p::{MsgType, Tmsg, NOFID};
use ninep_support::*;

/// Renames within one directory name that directory's fid twice; each must
/// be answered, and the server goes on serving the others.
#[test]
fn renames_within_one_directory_fid_are_answered() {
    let ex = export_with_good_file("rename");
    for i in 0..16 {
        std::fs::write(ex.join(format!("a{i}")), b"x").unwrap();
    }
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let alone = good_client(s.addr, &ex, Duration::from_secs(1));
    let mut c = Client::session(s.addr, &ex);
    let names: Vec<(String, String)> = (0..16).map(|i| (format!("a{i}"), format!("b{i}"))).collect();
    for (i, (old, new)) in names.iter().enumerate() {
        c.send_tag(100 + i as u16, &Tmsg::Renameat { olddirfid: 0, oldname: old, newdirfid: 0, newname: new });
    }
    for answered in 0..16 {
        let b = c.recv().unwrap_or_else(|e| panic!("only {answered} of 16 renames answered: {e}"));
        assert_eq!(type_of(&b), MsgType::RRENAMEAT, "{:?}", Rmsg::decode(&b));
    }
    let beside = good_client(s.addr, &ex, Duration::from_secs(1));
    eprintln!("good client: {alone:.0} reads/s alone, {beside:.0} after 16 same-fid renames");
    for i in 0..16 {
        assert!(ex.join(format!("b{i}")).exists() && !ex.join(format!("a{i}")).exists());
    }
    let _ = std::fs::remove_dir_all(&ex);
}

/// Opens of a FIFO that has no writer, from 16 connections: each is
/// answered at once (the open does not wait for a writer), a read of it
/// too, and the good client is served meanwhile and after they close.
#[test]
fn fifo_opens_without_a_writer_do_not_hold_the_threads() {
    let ex = export_with_good_file("fifo");
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let alone = good_client(s.addr, &ex, Duration::from_secs(1));
    let mut first = Client::session(s.addr, &ex);
    let b = first.ok(&Tmsg::Mknod { dfid: 0, name: "fifo", mode: 0o010644, major: 0, minor: 0, gid: 0 });
    assert_eq!(type_of(&b), MsgType::RMKNOD);
    let mut attackers: Vec<Client> = (0..16).map(|_| Client::session(s.addr, &ex)).collect();
    for a in attackers.iter_mut() {
        a.ok(&Tmsg::Walk { fid: 0, newfid: 1, names: vec!["fifo"] });
        a.send_tag(500, &Tmsg::Lopen { fid: 1, flags: 0 });
    }
    let beside = good_client(s.addr, &ex, Duration::from_secs(1));
    for (i, a) in attackers.iter_mut().enumerate() {
        let b = a.recv().unwrap_or_else(|e| panic!("FIFO open {i}: no reply within {ANSWER_WITHIN:?}: {e}"));
        assert_eq!(tag_of(&b), 500);
    }
    // A read of the FIFO is answered too (nothing to read: an error or nothing).
    let b = attackers[0].call(&Tmsg::Read { fid: 1, offset: 0, count: 4096 });
    assert!(matches!(type_of(&b), MsgType::RREAD | MsgType::RLERROR));
    drop(attackers);
    let after = good_client(s.addr, &ex, Duration::from_secs(1));
    eprintln!("good client: {alone:.0} reads/s alone, {beside:.0} beside 16 FIFO opens, {after:.0} after");
    let _ = std::fs::remove_dir_all(&ex);
}

/// Eight connections each send 64 reads of 1 MiB and never read a reply:
/// the good client is served beside them, and once they are gone the
/// server is idle (no thread goes on trying to deliver their replies).
#[test]
fn reads_nobody_collects_neither_block_nor_spin() {
    let ex = export_with_good_file("uncollected");
    std::fs::write(ex.join("big"), vec![1u8; 4 << 20]).unwrap();
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let alone = good_client(s.addr, &ex, Duration::from_secs(1));
    let mut attackers: Vec<Client> = (0..8).map(|_| Client::session(s.addr, &ex)).collect();
    for a in attackers.iter_mut() {
        a.open(1, "big");
        for i in 0..64u16 {
            a.send_tag(1000 + i, &Tmsg::Read { fid: 1, offset: u64::from(i % 4) << 20, count: 1 << 20 });
        }
    }
    let beside = good_client(s.addr, &ex, Duration::from_secs(2));
    let cpu0 = s.cpu_seconds();
    std::thread::sleep(Duration::from_secs(1));
    let cpu_attacked = s.cpu_seconds() - cpu0;
    drop(attackers);
    let quiet = s.wait_quiet(0.2, Duration::from_secs(15));
    let after = good_client(s.addr, &ex, Duration::from_secs(1));
    eprintln!(
        "good client: {alone:.0} reads/s alone, {beside:.0} beside 8x64 uncollected 1 MiB reads, {after:.0} after; \
         server CPU {cpu_attacked:.2} s/s under attack, {quiet:.2} s/s after"
    );
    assert!(quiet < 0.2, "the server still uses {quiet:.2} CPU seconds a second after the attackers left");
    let _ = std::fs::remove_dir_all(&ex);
}

/// 60 KiB reads of pages in memory are answered on the I/O worker (the
/// file-system threads' count of requests stays); a client that sends 200
/// of them (12 MB) before it reads a reply is held to its room all the same: the replies past it wait with the file-system
/// threads (the connection paused) instead of piling up in the mux past
/// its backlog, where a worker's reply would abort the connection. Every
/// read is answered, whole and in order of its data, once the client reads.
#[test]
fn cached_reads_answered_on_the_worker_keep_to_the_room() {
    let ex = export_with_good_file("cached-room");
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(ex.join("big"), &data).unwrap();
    let dir = scratch("cached-room-stat");
    let sock = dir.join("s.sock");
    let s = Server::start(&ex, &["--stats-socket", sock.to_str().unwrap()]);
    let stat = |name: &str| {
        let out = Command::new(BIN).arg("stat").arg(&sock).output().unwrap();
        counter(&String::from_utf8_lossy(&out.stdout), name)
    };
    const N: u16 = 200;
    const COUNT: u32 = 60 << 10;
    let mut a = Client::session(s.addr, &ex);
    a.open(1, "big");
    // A read answered on the worker: the file-system threads' count stays.
    // (Its pages are in memory, written just now; a read right behind a
    // request the threads answered may find that one still counted with
    // them, and go to them too.)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = stat("fs_thread_requests");
        let b = a.ok(&Tmsg::Read { fid: 1, offset: 0, count: COUNT });
        assert_eq!(b.len(), 11 + COUNT as usize);
        if stat("fs_thread_requests") == before {
            break;
        }
        assert!(Instant::now() < deadline, "no 60 KiB read answered on the worker within 10 s");
    }
    let offset = |i: u16| u64::from(i % 16) * u64::from(COUNT);
    let mut req = Vec::new();
    for i in 0..N {
        Tmsg::Read { fid: 1, offset: offset(i), count: COUNT }.encode(1000 + i, &mut req);
    }
    a.c.write_all(&req).unwrap();
    // The replies pile up while the client reads none, to the room: then
    // the connection is paused.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat("paused") == 0 {
        assert!(Instant::now() < deadline, "not paused within 10 s: its replies not held to the room");
        std::thread::sleep(Duration::from_millis(10));
    }
    let beside = good_client(s.addr, &ex, Duration::from_secs(1));
    let mut seen = vec![false; usize::from(N)];
    for answered in 0..N {
        let b = a.recv().unwrap_or_else(|e| panic!("only {answered} of {N} reads answered: {e}"));
        assert_eq!(type_of(&b), MsgType::RREAD, "{:?}", Rmsg::decode(&b));
        let i = tag_of(&b) - 1000;
        assert!(!std::mem::replace(&mut seen[usize::from(i)], true), "read {i} answered twice");
        let at = offset(i) as usize;
        assert_eq!(&b[11..], &data[at..at + COUNT as usize], "read {i}'s data");
    }
    // And the connection goes on.
    a.ok(&Tmsg::Read { fid: 1, offset: 0, count: 16 });
    eprintln!("{N} reads of 60 KiB answered after they waited; good client {beside:.0} reads/s beside");
    let _ = std::fs::remove_dir_all(&ex);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection that queues more requests than its backlog holds (its
/// replies uncollected, so they wait) is closed, and counted; the good
/// client is served beside it.
#[test]
fn a_connection_over_its_backlog_is_closed() {
    let ex = export_with_good_file("overload");
    std::fs::write(ex.join("big"), vec![1u8; 4 << 20]).unwrap();
    let dir = scratch("overload-stat");
    let sock = dir.join("s.sock");
    let s = Server::start(&ex, &["--fs-queue", "16", "--stats-socket", sock.to_str().unwrap()]);
    let mut a = Client::session(s.addr, &ex);
    a.open(1, "big");
    let mut req = Vec::new();
    for i in 0..64u16 {
        Tmsg::Read { fid: 1, offset: u64::from(i % 4) << 20, count: 1 << 20 }.encode(1000 + i, &mut req);
    }
    a.c.write_all(&req).unwrap();
    let beside = good_client(s.addr, &ex, Duration::from_secs(1));
    // Its replies are read now: some reads were answered, then the close.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut answered = 0;
    let closed = loop {
        assert!(Instant::now() < deadline, "still open after {answered} replies");
        match a.recv() {
            Ok(_) => answered += 1,
            Err(e) => break e,
        }
        assert!(answered < 64, "every read answered: nothing was refused");
    };
    let out = Command::new(BIN).arg("stat").arg(&sock).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("overloads=") && l != "overloads=0"), "{text}");
    eprintln!("closed after {answered} of 64 reads ({closed}); good client {beside:.0} reads/s beside");
    let _ = std::fs::remove_dir_all(&ex);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection whose reads wait (its replies uncollected) flushes the
/// last of them: the Rflush comes, the flushed read is never answered, and
/// the connection goes on.
#[test]
fn a_flush_of_a_waiting_read_is_answered_and_the_read_never_is() {
    let ex = export_with_good_file("flush");
    std::fs::write(ex.join("big"), vec![1u8; 4 << 20]).unwrap();
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let mut c = Client::session(s.addr, &ex);
    c.open(1, "big");
    for i in 0..64u16 {
        c.send_tag(1000 + i, &Tmsg::Read { fid: 1, offset: u64::from(i % 4) << 20, count: 1 << 20 });
    }
    // The last read cannot have been answered: the replies before it fill
    // far more than the connection's room while nothing is read.
    c.send_tag(2000, &Tmsg::Flush { oldtag: 1063 });
    let sent = Instant::now();
    let mut reads = 0;
    // Bounded: at most the 64 reads' replies and the Rflush.
    let took = loop {
        let b = c.recv().unwrap_or_else(|e| panic!("no Rflush within {ANSWER_WITHIN:?} of a reply: {e}"));
        match tag_of(&b) {
            2000 => {
                assert_eq!(type_of(&b), MsgType::RFLUSH);
                break sent.elapsed();
            }
            1063 => panic!("the flushed read was answered (after {reads} other reads)"),
            t => {
                assert!((1000..1063).contains(&t), "tag {t}");
                reads += 1;
            }
        }
        assert!(reads <= 63);
    };
    // The connection goes on: the reads not answered before the Rflush come
    // after it (all but the flushed one), and so does a Tgetattr's reply.
    c.send_tag(3000, &Tmsg::Getattr { fid: 1, mask: 1 });
    let (mut later, mut getattr) = (0, false);
    c.c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    while let Ok(b) = c.recv() {
        match tag_of(&b) {
            1063 => panic!("the flushed read was answered after the Rflush"),
            3000 => getattr = matches!(Rmsg::decode(&b).unwrap().1, Rmsg::Getattr { .. }),
            _ => later += 1,
        }
        assert!(later <= 64);
    }
    assert!(getattr, "no Rgetattr after the Rflush");
    assert_eq!(reads + later, 63, "every read but the flushed one answered");
    eprintln!("Rflush after {reads} read replies, {took:?} after the Tflush");
    let _ = std::fs::remove_dir_all(&ex);
}

/// A flushed walk that made its fid is answered before the Rflush; one
/// whose reply the Rflush replaces made none: the client's view of which
/// fids exist stays the server's, whichever way each race falls.
#[test]
fn a_flushed_walk_either_answers_first_or_makes_no_fid() {
    let ex = export_with_good_file("flushwalk");
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let mut c = Client::session(s.addr, &ex);
    let (mut answered, mut dropped) = (0, 0);
    for round in 0..300 {
        c.send_tag(10, &Tmsg::Walk { fid: 0, newfid: 7, names: vec!["good"] });
        c.send_tag(11, &Tmsg::Flush { oldtag: 10 });
        let mut walked = false;
        // Bounded: the walk's reply and the Rflush.
        for _ in 0..2 {
            let b = c.recv().unwrap_or_else(|e| panic!("round {round}: no Rflush: {e}"));
            match tag_of(&b) {
                10 => walked = true,
                11 => break,
                t => panic!("round {round}: tag {t}"),
            }
        }
        c.send_tag(12, &Tmsg::Clunk { fid: 7 });
        let b = c.recv().unwrap();
        assert_eq!(tag_of(&b), 12, "round {round}");
        let made = type_of(&b) == MsgType::RCLUNK;
        assert_eq!(made, walked, "round {round}: the walk answered: {walked}, its fid made: {made}");
        if walked {
            answered += 1
        } else {
            dropped += 1
        }
    }
    eprintln!("flushed walks: answered first {answered}, dropped {dropped}");
    let _ = std::fs::remove_dir_all(&ex);
}

/// A second Tversion over pending reads: after the Rversion no reply of the
/// old session comes, and its fids are gone.
#[test]
fn a_second_version_cancels_what_is_pending() {
    let ex = export_with_good_file("version");
    std::fs::write(ex.join("big"), vec![1u8; 4 << 20]).unwrap();
    let s = Server::start(&ex, &["--no-stats-socket"]);
    let mut c = Client::session(s.addr, &ex);
    c.open(1, "big");
    for i in 0..64u16 {
        c.send_tag(1000 + i, &Tmsg::Read { fid: 1, offset: u64::from(i % 4) << 20, count: 1 << 20 });
    }
    c.send_tag(3000, &Tmsg::Version { msize: 1 << 16, version: "9P2000.L" });
    let mut before = 0;
    // Bounded: at most the 64 reads' replies and the Rversion.
    loop {
        let b = c.recv().unwrap_or_else(|e| panic!("no Rversion within {ANSWER_WITHIN:?} of a reply: {e}"));
        if tag_of(&b) == 3000 {
            assert_eq!(type_of(&b), MsgType::RVERSION);
            break;
        }
        before += 1;
        assert!(before <= 64);
    }
    // The old fid is gone; nothing of the old session arrives before these replies.
    c.send_tag(1, &Tmsg::Getattr { fid: 1, mask: 1 });
    let b = c.recv().unwrap();
    assert_eq!(tag_of(&b), 1, "a reply of the old session after the Rversion: {:?}", Rmsg::decode(&b));
    assert!(matches!(Rmsg::decode(&b).unwrap().1, Rmsg::Lerror { errno: 9 }), "{:?}", Rmsg::decode(&b));
    c.send_tag(2, &Tmsg::Attach { fid: 0, afid: NOFID, uname: "u", aname: "", n_uname: 0 });
    let b = c.recv().unwrap();
    assert_eq!(tag_of(&b), 2, "a reply of the old session after the Rversion");
    c.c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut late = Vec::new();
    while let Ok(b) = c.recv() {
        late.push(tag_of(&b));
        assert!(late.len() <= 64);
    }
    assert!(late.is_empty(), "replies of the old session after the Rversion: {late:?}");
    eprintln!("{before} of 64 reads answered before the Rversion, none after");
    let _ = std::fs::remove_dir_all(&ex);
}

/// SIGTERM, SIGINT and SIGHUP stop the server as they stop the others:
/// exit 0, the totals printed, the statistics socket removed.
#[test]
fn stop_signals_end_the_server_with_its_totals() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT"), (libc::SIGHUP, "SIGHUP")] {
        let ex = export_with_good_file(&format!("sig{sig}"));
        let sock = ex.join("s.sock");
        let mut s = Server::start(&ex, &["--stats-socket", sock.to_str().unwrap(), "--grace-ms", "2000"]);
        assert!(sock.exists());
        good_client(s.addr, &ex, Duration::from_millis(200));
        connmux_sys::signal::kill(s.child.id(), sig).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        let st = loop {
            if let Some(st) = s.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "{name}: still running");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(st.code(), Some(0), "{name}: {st:?}");
        let deadline = Instant::now() + Duration::from_secs(5);
        // (The reader thread may lag the exit by a moment.)
        while !s.lines.lock().unwrap().iter().any(|l| l.starts_with("requests=")) {
            assert!(Instant::now() < deadline, "{name}: no totals: {:?}", s.lines.lock().unwrap());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!sock.exists(), "{name}: the statistics socket is left behind");
        let _ = std::fs::remove_dir_all(&ex);
    }
}

/// What open(2), readlink(2), mkdir(2) and creat(2) do locally, the server
/// does for its clients: a directory opened for writing is EISDIR, a create
/// without O_EXCL of an existing name opens it, readlink of a file is
/// EINVAL, modes land exactly as sent (the server's umask 022 takes nothing
/// away), and an msize too small for the replies is refused.
#[test]
fn opens_creates_readlinks_and_modes_as_on_linux() {
    const EEXIST: u32 = 17;
    const EISDIR: u32 = 21;
    const EINVAL: u32 = 22;
    let ex = export_with_good_file("linux");
    std::fs::create_dir(ex.join("d")).unwrap();
    let s = Server::start_umask_022(&ex, &["--no-stats-socket"]);
    let mut small = Client::connect(s.addr);
    let b = small.call(&Tmsg::Version { msize: 1024, version: "9P2000.L" });
    assert_eq!(errno_of(&b), Some(EINVAL), "msize 1024: {:?}", Rmsg::decode(&b));
    let mut c = Client::session(s.addr, &ex);
    for (flags, what) in [(1u32, "O_WRONLY"), (2, "O_RDWR"), (0o1000, "O_TRUNC")] {
        c.ok(&Tmsg::Walk { fid: 0, newfid: 1, names: vec!["d"] });
        let b = c.call(&Tmsg::Lopen { fid: 1, flags });
        assert_eq!(errno_of(&b), Some(EISDIR), "Tlopen of a directory {what}");
        c.ok(&Tmsg::Clunk { fid: 1 });
    }
    c.ok(&Tmsg::Walk { fid: 0, newfid: 1, names: vec!["good"] });
    let b = c.call(&Tmsg::Readlink { fid: 1 });
    assert_eq!(errno_of(&b), Some(EINVAL), "Treadlink of a regular file");
    c.ok(&Tmsg::Clunk { fid: 1 });
    // Tlcreate of an existing name: opened without O_EXCL (contents kept), EEXIST with it.
    c.ok(&Tmsg::Walk { fid: 0, newfid: 1, names: vec![] });
    c.ok(&Tmsg::Lcreate { fid: 1, name: "good", flags: 0, mode: 0o600, gid: 0 });
    let b = c.ok(&Tmsg::Read { fid: 1, offset: 0, count: 16 });
    let Rmsg::Data { data, .. } = Rmsg::decode(&b).unwrap().1 else { panic!() };
    assert_eq!(data, &[7u8; 16][..], "the existing file opened, not emptied");
    c.ok(&Tmsg::Clunk { fid: 1 });
    c.ok(&Tmsg::Walk { fid: 0, newfid: 1, names: vec![] });
    let b = c.call(&Tmsg::Lcreate { fid: 1, name: "good", flags: 0o200, mode: 0o600, gid: 0 });
    assert_eq!(errno_of(&b), Some(EEXIST), "Tlcreate O_EXCL of an existing name");
    // Modes as sent.
    c.ok(&Tmsg::Mkdir { dfid: 0, name: "open", mode: 0o777, gid: 0 });
    c.ok(&Tmsg::Lcreate { fid: 1, name: "shared", flags: 1, mode: 0o666, gid: 0 });
    use std::os::unix::fs::PermissionsExt;
    let mode = |n: &str| std::fs::metadata(ex.join(n)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("open"), 0o777, "Tmkdir 0777");
    assert_eq!(mode("shared"), 0o666, "Tlcreate 0666");
    let _ = std::fs::remove_dir_all(&ex);
}
