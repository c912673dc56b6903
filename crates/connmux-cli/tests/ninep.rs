//! `connmux 9p-server` as users meet it: read by diod's own clients
//! (`diodcat`, `diodls` from Debian's diod, which we did not write), used by
//! a raw 9P client over TCP for every change a mount makes, and attacked by
//! clients that try to leave the export, borrow another connection's fids,
//! announce a 2 GiB message or flush what is not there — each refused while
//! the server goes on serving the others.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use connmux_9p::rmsg::Rmsg;
use connmux_9p::types::getattr;
use connmux_9p::{Dirent, MsgType, Qid, QidType, SetAttr, Tmsg, NOFID};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

mod common;
use common::{spawn_server, Server, BIN};
const ENOENT: u32 = 2;
const EBADF: u32 = 9;
const ELOOP: u32 = 40;
const EROFS: u32 = 30;

fn start(export: &Path, extra: &[&str]) -> Server {
    spawn_server(
        Command::new(BIN)
            .args(["9p-server", "--export"])
            .arg(export)
            .args(["-l", "127.0.0.1:0", "--duration", "120", "--no-stats-socket", "--no-pin"])
            .args(extra),
    )
}

/// A fresh directory under the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("connmux-9p-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Seeded random bytes: the same for a seed, and no run of them repeats at a
/// small shift (catches shifted reads).
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut b = vec![0u8; len];
    SmallRng::seed_from_u64(u64::from(seed)).fill_bytes(&mut b);
    b
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

// ---- diod's clients ----

#[test]
fn diodcat_and_diodls_read_the_export() {
    if !have("diodcat") || !have("diodls") {
        eprintln!("SKIP: diodcat/diodls not installed (Debian package diod; scripts/setup.sh installs it)");
        return;
    }
    let ex = scratch("diod");
    let sizes = [0usize, 1, 65_513, 300_000, 2 << 20];
    for (i, n) in sizes.iter().enumerate() {
        std::fs::write(ex.join(format!("f{n}")), pattern(*n, i as u32 + 1)).unwrap();
    }
    std::fs::create_dir(ex.join("forty")).unwrap();
    for i in 0..40 {
        std::fs::write(ex.join("forty").join(format!("entry{i:02}")), vec![b'x'; i]).unwrap();
    }
    let s = start(&ex, &[]);
    let server = s.addr.to_string();
    let aname = ex.to_str().unwrap();
    for (i, n) in sizes.iter().enumerate() {
        let out =
            Command::new("diodcat").args(["-s", &server, "-a", aname, "-t", "30", &format!("f{n}")]).output().unwrap();
        assert!(out.status.success(), "diodcat f{n}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout.len(), *n, "diodcat f{n}: length");
        assert!(out.stdout == pattern(*n, i as u32 + 1), "diodcat f{n}: bytes differ");
    }
    let out = Command::new("diodls").args(["-s", &server, "-a", aname, "-t", "30", "-l", "forty"]).output().unwrap();
    assert!(out.status.success(), "diodls: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("entry")).collect();
    assert_eq!(lines.len(), 40, "diodls -l:\n{text}");
    for i in 0..40 {
        let name = format!("entry{i:02}");
        let line = lines.iter().find(|l| l.ends_with(&name)).unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        // `-l` prints the size before the date.
        assert!(line.split_whitespace().any(|w| w == i.to_string()), "{name}: size {i} not in {line:?}");
    }
    // A wrong attach name is refused.
    let out = Command::new("diodcat").args(["-s", &server, "-a", "/elsewhere", "-t", "30", "f1"]).output().unwrap();
    assert!(!out.status.success());
    let _ = std::fs::remove_dir_all(&ex);
}

// ---- a raw client ----

struct Client {
    c: TcpStream,
    tag: u16,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.set_nodelay(true).unwrap();
        Client { c, tag: 0 }
    }

    fn send(&mut self, m: &Tmsg<'_>) -> u16 {
        self.tag = self.tag.wrapping_add(1) % 0xfff0;
        let mut b = Vec::new();
        m.encode(self.tag, &mut b);
        self.c.write_all(&b).unwrap();
        self.tag
    }

    fn recv_raw(&mut self) -> std::io::Result<Vec<u8>> {
        let mut size = [0u8; 4];
        self.c.read_exact(&mut size)?;
        let n = u32::from_le_bytes(size) as usize;
        let mut b = size.to_vec();
        b.resize(n, 0);
        self.c.read_exact(&mut b[4..])?;
        Ok(b)
    }

    /// One request, its reply (checked to carry the tag).
    fn call(&mut self, m: &Tmsg<'_>) -> Vec<u8> {
        let tag = self.send(m);
        let b = self.recv_raw().unwrap();
        let (t, _) = Rmsg::decode(&b).unwrap();
        assert_eq!(t, tag, "reply to {m:?}");
        b
    }

    fn ok(&mut self, m: &Tmsg<'_>) -> Vec<u8> {
        let b = self.call(m);
        if let (_, Rmsg::Lerror { errno }) = Rmsg::decode(&b).unwrap() {
            panic!("{m:?}: Rlerror {errno}");
        }
        b
    }

    fn errno(&mut self, m: &Tmsg<'_>) -> u32 {
        let b = self.call(m);
        match Rmsg::decode(&b).unwrap().1 {
            Rmsg::Lerror { errno } => errno,
            other => panic!("{m:?}: wanted an error, got {other:?}"),
        }
    }

    fn session(addr: SocketAddr, export: &Path) -> (Client, Qid) {
        let mut c = Client::connect(addr);
        let b = c.ok(&Tmsg::Version { msize: 1 << 20, version: "9P2000.L" });
        assert!(matches!(Rmsg::decode(&b).unwrap().1, Rmsg::Version { version: "9P2000.L", .. }));
        let b = c.ok(&Tmsg::Attach { fid: 0, afid: NOFID, uname: "u", aname: export.to_str().unwrap(), n_uname: 0 });
        let Rmsg::Qid { qid, .. } = Rmsg::decode(&b).unwrap().1 else { panic!("no qid") };
        (c, qid)
    }

    fn walk(&mut self, fid: u32, newfid: u32, names: &[&str]) -> Result<Vec<Qid>, u32> {
        let b = self.call(&Tmsg::Walk { fid, newfid, names: names.to_vec() });
        match Rmsg::decode(&b).unwrap().1 {
            Rmsg::Walk { qids } => Ok(qids),
            Rmsg::Lerror { errno } => Err(errno),
            other => panic!("walk: {other:?}"),
        }
    }

    fn getattr(&mut self, fid: u32) -> connmux_9p::Attr {
        let b = self.ok(&Tmsg::Getattr { fid, mask: getattr::BASIC });
        let Rmsg::Getattr { attr, .. } = Rmsg::decode(&b).unwrap().1 else { panic!() };
        attr
    }

    fn read_all(&mut self, fid: u32) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..10_000 {
            let b = self.ok(&Tmsg::Read { fid, offset: v.len() as u64, count: 128 * 1024 });
            let Rmsg::Data { data, .. } = Rmsg::decode(&b).unwrap().1 else { panic!() };
            if data.is_empty() {
                return v;
            }
            v.extend_from_slice(data);
        }
        panic!("read did not end");
    }

    fn names(&mut self, fid: u32) -> Vec<String> {
        let mut names = Vec::new();
        let mut offset = 0;
        for _ in 0..10_000 {
            let b = self.ok(&Tmsg::Readdir { fid, offset, count: 512 });
            let Rmsg::Data { data, .. } = Rmsg::decode(&b).unwrap().1 else { panic!() };
            let ents = Dirent::read_all(data).unwrap();
            let Some(last) = ents.last() else { return names };
            offset = last.offset;
            names.extend(ents.iter().map(|e| e.name.to_string()));
        }
        panic!("readdir did not end");
    }

    /// Whether the server has closed this connection (EOF or reset) within
    /// `d`; a read that times out means it is still open.
    fn closed_within(&mut self, d: Duration) -> bool {
        self.c.set_read_timeout(Some(d)).unwrap();
        let mut b = [0u8; 64];
        match self.c.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    }
}

#[test]
fn raw_client_makes_every_change_a_mount_makes() {
    let ex = scratch("ops");
    std::fs::write(ex.join("old"), b"0123456789").unwrap();
    let s = start(&ex, &[]);
    let (mut c, root) = Client::session(s.addr, &ex);
    assert_eq!(root.ty, QidType::DIR);

    // Create, write, read back.
    c.walk(0, 1, &[]).unwrap();
    c.ok(&Tmsg::Lcreate { fid: 1, name: "new", flags: 2, mode: 0o640, gid: 0 });
    let data = pattern(200_000, 9);
    let mut off = 0;
    for chunk in data.chunks(60_000) {
        let b = c.ok(&Tmsg::Write { fid: 1, offset: off, data: chunk });
        assert_eq!(Rmsg::decode(&b).unwrap().1, Rmsg::Write { count: chunk.len() as u32 });
        off += chunk.len() as u64;
    }
    c.ok(&Tmsg::Fsync { fid: 1, datasync: 0 });
    assert!(c.read_all(1) == data);
    assert!(std::fs::read(ex.join("new")).unwrap() == data);
    assert_eq!(std::fs::metadata(ex.join("new")).unwrap().len(), 200_000);
    c.ok(&Tmsg::Clunk { fid: 1 });

    // Truncate and mode through setattr; getattr sees both.
    c.walk(0, 2, &["old"]).unwrap();
    c.ok(&Tmsg::Setattr { fid: 2, attr: SetAttr { valid: 0x8 | 0x1, size: 4, mode: 0o600, ..SetAttr::default() } });
    let a = c.getattr(2);
    assert_eq!((a.size, a.mode & 0o7777), (4, 0o600));
    assert_eq!(std::fs::read(ex.join("old")).unwrap(), b"0123");

    // mkdir, symlink, readlink, rename (the walked fid follows), readdir.
    c.ok(&Tmsg::Mkdir { dfid: 0, name: "dir", mode: 0o755, gid: 0 });
    c.ok(&Tmsg::Symlink { fid: 0, name: "ln", target: "dir/inner", gid: 0 });
    c.walk(0, 3, &["ln"]).unwrap();
    let b = c.ok(&Tmsg::Readlink { fid: 3 });
    assert_eq!(Rmsg::decode(&b).unwrap().1, Rmsg::Readlink { target: "dir/inner" });
    c.walk(0, 4, &["dir"]).unwrap();
    c.ok(&Tmsg::Renameat { olddirfid: 0, oldname: "old", newdirfid: 4, newname: "moved" });
    assert_eq!(c.getattr(2).size, 4, "the fid walked to the old name follows the rename");
    assert!(ex.join("dir/moved").exists() && !ex.join("old").exists());
    c.walk(0, 5, &["dir"]).unwrap();
    c.ok(&Tmsg::Lopen { fid: 5, flags: 0 });
    let mut names = c.names(5);
    names.sort();
    assert_eq!(names, [".", "..", "moved"]);

    // Statfs, then removal of everything made.
    let b = c.ok(&Tmsg::Statfs { fid: 0 });
    assert!(matches!(Rmsg::decode(&b).unwrap().1, Rmsg::Statfs(s) if s.bsize > 0 && s.blocks > 0));
    c.ok(&Tmsg::Unlinkat { dirfid: 4, name: "moved", flags: 0 });
    c.ok(&Tmsg::Unlinkat { dirfid: 0, name: "ln", flags: 0 });
    assert_eq!(c.errno(&Tmsg::Unlinkat { dirfid: 0, name: "ln", flags: 0 }), ENOENT);
    c.ok(&Tmsg::Remove { fid: 4 });
    assert!(!ex.join("dir").exists());
    // The removed fid is clunked.
    assert_eq!(c.errno(&Tmsg::Getattr { fid: 4, mask: 1 }), EBADF);
    drop(s);

    // Read-only: changes refused with EROFS, reads still served.
    let s = start(&ex, &["--read-only"]);
    let (mut c, _) = Client::session(s.addr, &ex);
    c.walk(0, 1, &["new"]).unwrap();
    assert_eq!(c.errno(&Tmsg::Lopen { fid: 1, flags: 1 }), EROFS);
    assert_eq!(c.errno(&Tmsg::Mkdir { dfid: 0, name: "x", mode: 0o755, gid: 0 }), EROFS);
    c.ok(&Tmsg::Lopen { fid: 1, flags: 0 });
    assert!(c.read_all(1) == data);
    let _ = std::fs::remove_dir_all(&ex);
}

#[test]
fn hostile_clients_stay_inside_and_others_are_served() {
    let base = scratch("hostile");
    let (ex, outside) = (base.join("export"), base.join("outside"));
    std::fs::create_dir_all(&ex).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"SECRET").unwrap();
    std::fs::write(ex.join("inside"), b"inside").unwrap();
    std::os::unix::fs::symlink("../outside/secret", ex.join("link")).unwrap();
    std::os::unix::fs::symlink("../outside", ex.join("dlink")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", ex.join("abs")).unwrap();
    let s = start(&ex, &[]);
    let (mut a, root) = Client::session(s.addr, &ex);
    let served = |c: &mut Client| assert_eq!(c.getattr(0).mode & 0o170000, 0o040000, "still served");

    // `..` stops at the export's root; ../../etc/passwd is not found.
    assert_eq!(a.walk(0, 1, &[".."]).unwrap(), vec![root]);
    // A walk that stops early answers the names it could walk (each `..`
    // the root again) and makes no new fid.
    assert_eq!(a.walk(0, 2, &["..", "..", "etc", "passwd"]).unwrap(), vec![root, root]);
    assert_eq!(a.errno(&Tmsg::Getattr { fid: 2, mask: 1 }), EBADF);
    assert_eq!(a.walk(0, 2, &["..", "outside", "secret"]).unwrap(), vec![root]);
    assert_eq!(a.errno(&Tmsg::Getattr { fid: 2, mask: 1 }), EBADF);
    assert_eq!(a.walk(0, 2, &["etc", "passwd"]), Err(ENOENT));
    assert_eq!(a.walk(0, 2, &["/etc/passwd"]).unwrap_err(), 22);
    served(&mut a);

    // Symlinks out of the export: walked to as links, never followed.
    for l in ["link", "abs"] {
        let q = a.walk(0, 3, &[l]).unwrap();
        assert_eq!(q[0].ty, QidType::SYMLINK);
        assert_eq!(a.errno(&Tmsg::Lopen { fid: 3, flags: 0 }), ELOOP, "{l}");
        a.ok(&Tmsg::Clunk { fid: 3 });
    }
    // Through a symlinked directory: no walk, no create, no unlink.
    assert_eq!(a.walk(0, 4, &["dlink", "secret"]).unwrap().len(), 1);
    assert_eq!(a.errno(&Tmsg::Getattr { fid: 4, mask: 1 }), EBADF);
    a.walk(0, 4, &["dlink"]).unwrap();
    assert_ne!(a.errno(&Tmsg::Lcreate { fid: 4, name: "pwned", flags: 2, mode: 0o644, gid: 0 }), 0);
    assert_ne!(a.errno(&Tmsg::Unlinkat { dirfid: 4, name: "secret", flags: 0 }), 0);
    assert_ne!(a.errno(&Tmsg::Mkdir { dfid: 4, name: "pwned", mode: 0o755, gid: 0 }), 0);
    assert_ne!(a.errno(&Tmsg::Renameat { olddirfid: 0, oldname: "inside", newdirfid: 4, newname: "pwned" }), 0);
    // Names that are paths are refused.
    assert_eq!(a.errno(&Tmsg::Mkdir { dfid: 0, name: "../pwned", mode: 0o755, gid: 0 }), 22);
    assert_eq!(a.errno(&Tmsg::Symlink { fid: 0, name: "..", target: "x", gid: 0 }), 22);
    served(&mut a);

    // Another connection's fids do not exist here.
    let mut b = Client::connect(s.addr);
    b.ok(&Tmsg::Version { msize: 8192, version: "9P2000.L" });
    assert_eq!(b.errno(&Tmsg::Getattr { fid: 0, mask: 1 }), EBADF);
    assert_eq!(b.walk(0, 9, &["inside"]), Err(EBADF));
    assert_eq!(b.errno(&Tmsg::Clunk { fid: 0 }), EBADF);
    served(&mut a);

    // A Tflush of a tag never sent: Rflush, and the connection goes on.
    let bb = b.call(&Tmsg::Flush { oldtag: 4242 });
    assert_eq!(Rmsg::decode(&bb).unwrap().1, Rmsg::Empty { ty: MsgType::RFLUSH });
    b.ok(&Tmsg::Attach { fid: 0, afid: NOFID, uname: "u", aname: "", n_uname: 0 });
    served(&mut b);

    // A size field of 2 GiB: that connection is closed, the others go on.
    let mut c = Client::connect(s.addr);
    let mut msg = Vec::new();
    Tmsg::Clunk { fid: 0 }.encode(1, &mut msg);
    msg[..4].copy_from_slice(&(2u32 << 30).to_le_bytes());
    c.c.write_all(&msg).unwrap();
    assert!(c.closed_within(Duration::from_secs(10)), "a 2 GiB message closes its connection");
    // The same wait sees a live connection as open.
    let mut d = Client::connect(s.addr);
    assert!(!d.closed_within(Duration::from_millis(200)));
    served(&mut a);
    served(&mut b);

    // Nothing outside was read or written.
    let entries: Vec<_> = std::fs::read_dir(&outside).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries, vec![std::ffi::OsString::from("secret")]);
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"SECRET");
    assert!(!base.join("pwned").exists());
    assert!(ex.join("inside").exists());
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_flushed_request_gets_no_reply_after_rflush() {
    let ex = scratch("flush");
    std::fs::write(ex.join("big"), pattern(1 << 20, 3)).unwrap();
    let s = start(&ex, &[]);
    let (mut c, _) = Client::session(s.addr, &ex);
    c.walk(0, 1, &["big"]).unwrap();
    c.ok(&Tmsg::Lopen { fid: 1, flags: 0 });
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut after_read, mut before_read) = (0, 0);
    // Many rounds: each time the read is in flight or already answered
    // when the flush arrives, and either way its reply must come first.
    for round in 0..200 {
        assert!(Instant::now() < deadline);
        let rtag = c.send(&Tmsg::Read { fid: 1, offset: 0, count: 1 << 19 });
        let ftag = c.send(&Tmsg::Flush { oldtag: rtag });
        let mut seen_read = false;
        let (t, m) = loop {
            let b = c.recv_raw().unwrap();
            let (t, m) = Rmsg::decode(&b).map(|(t, m)| (t, format!("{m:?}"))).unwrap();
            if t == rtag {
                assert!(!seen_read, "round {round}: two replies to the read");
                seen_read = true;
                continue;
            }
            break (t, m);
        };
        assert_eq!(t, ftag, "round {round}: {m}");
        assert!(m.contains("RFLUSH") || m.contains("109"), "round {round}: {m}");
        if seen_read {
            after_read += 1
        } else {
            before_read += 1
        }
        // Nothing for the read follows: the next reply is the next request's.
        let b = c.call(&Tmsg::Getattr { fid: 1, mask: 1 });
        assert!(matches!(Rmsg::decode(&b).unwrap().1, Rmsg::Getattr { .. }));
    }
    eprintln!("flush rounds: read answered first {after_read}, read dropped {before_read}");
    let _ = std::fs::remove_dir_all(&ex);
}

#[test]
fn ninep_test_loads_every_operation_and_checks_the_replies() {
    let ex = scratch("load");
    std::fs::create_dir(ex.join("d")).unwrap();
    std::fs::write(ex.join("d/f"), pattern(300_000, 5)).unwrap();
    let s = start(&ex, &[]);
    let run = |args: &[&str]| -> serde_json::Value {
        let out = Command::new(BIN)
            .args(["9ptest", "--json", "--no-progress", "-i", "1", "-c", "300", "--io-timeout", "20"])
            .args(args)
            .arg(s.addr.to_string())
            .output()
            .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert!(out.status.success() && doc["ok"] == true, "{args:?}: {doc}");
        doc
    };
    for args in [
        &["--op", "getattr", "--file", "d/f", "-j", "2", "-a", "8"][..],
        &["--op", "walk", "--file", "d/f", "-j", "2", "-a", "8"][..],
        // 300,000 bytes at msize 64 KiB: five Treads per operation.
        &["--op", "read", "--file", "d/f", "--size", "300000", "--msize", "65536", "-j", "1", "-a", "4"][..],
    ] {
        let doc = run(args);
        let calls = doc["median"]["calls"].as_f64().unwrap_or(0.0);
        let j: f64 = args[args.iter().position(|a| *a == "-j").unwrap() + 1].parse().unwrap();
        assert_eq!(calls, 300.0 * j, "{args:?}: {doc}");
    }
    // A read past the end of the file is short: the run fails, saying so.
    let out = Command::new(BIN)
        .args(["9ptest", "--no-progress", "-i", "1", "-c", "10", "--op", "read", "--file", "d/f", "--size", "400000"])
        .arg(s.addr.to_string())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("short read"), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&ex);
}

#[test]
fn bench_9p_quick_prints_the_9p_server_beside_diod() {
    if !std::path::Path::new("/usr/sbin/diod").exists() {
        eprintln!("SKIP: diod not installed (Debian package diod; scripts/setup.sh installs it)");
        return;
    }
    let out = Command::new(BIN).args(["bench", "9p", "--quick"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for row in ["getattr -j1 -a1", "getattr -j8 -a16", "walk+clunk -j8 -a16", "read 1 MiB -j1 -a1", "uneven: 7 getattr"]
    {
        let line = text.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no row {row:?}:\n{text}"));
        // Both servers measured: two positive rates and a ratio.
        let rates: Vec<f64> = line[30..].split_whitespace().filter_map(|w| w.parse().ok()).collect();
        assert!(rates.len() >= 2 && rates[0] > 0.0 && rates[1] > 0.0, "{line}");
        assert!(line.contains('x'), "{line}");
    }
    // With busy processes on the servers' CPUs: the 60 KiB read row alone,
    // and the busy processes gone after it.
    let out = Command::new(BIN).args(["bench", "9p", "--quick", "--busy", "1"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = text.lines().find(|l| l.starts_with("read 60 KiB")).unwrap_or_else(|| panic!("no busy row:\n{text}"));
    let rates: Vec<f64> = line[30..].split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert!(rates.len() >= 2 && rates[0] > 0.0 && rates[1] > 0.0, "{line}");
    assert!(!text.contains("getattr -j1 -a1"), "--busy measures the reads only:\n{text}");
}

#[test]
fn a_connection_holds_a_bounded_number_of_fids() {
    let ex = scratch("fids");
    let s = start(&ex, &["--max-fids", "100"]);
    let (mut c, _) = Client::session(s.addr, &ex);
    // 100 fids at most, the root's included: clone it 120 times.
    let (mut ok, mut emfile) = (0u32, 0u32);
    for i in 0..120 {
        let b = c.call(&Tmsg::Walk { fid: 0, newfid: 1 + i, names: vec![] });
        match Rmsg::decode(&b).unwrap().1 {
            Rmsg::Walk { .. } => ok += 1,
            Rmsg::Lerror { errno: 24 } => emfile += 1,
            other => panic!("walk {i}: {other:?}"),
        }
    }
    assert_eq!((ok, emfile), (99, 21));
    // Another connection has its own allowance.
    let (mut d, _) = Client::session(s.addr, &ex);
    d.walk(0, 1, &[]).unwrap();
    // Clunking one makes room for one.
    c.ok(&Tmsg::Clunk { fid: 1 });
    c.walk(0, 1, &[]).unwrap();
    assert_eq!(c.errno(&Tmsg::Walk { fid: 0, newfid: 500, names: vec![] }), 24);
    assert_eq!(c.getattr(0).mode & 0o170000, 0o040000);
    let _ = std::fs::remove_dir_all(&ex);
}
