//! `connmux nfs-server` as users meet it: read and written by Debian's
//! libnfs tools (`nfs-ls`, `nfs-cat`, `nfs-cp` from `libnfs-utils`, which we
//! did not write) and probed by `rpcinfo`; driven procedure by procedure by
//! a raw NFSv3 client over TCP; and attacked with forged handles, escapes
//! through `..` and symlinks, 4 GiB counts, short WRITE data and truncated
//! XDR — each an NFS error or a counted abort, while the server goes on
//! serving a good client beside it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use connmux_nfs::res;
use connmux_nfs::{
    mount, proc3, CreateHow, DirOp, Ftype3, MountCall, NfsCall, Nfsstat3, Sattr3, StableHow, MOUNT_PROGRAM, NFS_PROGRAM,
};
use connmux_oncrpc::record::{RecordLimits, RecordReader};
use connmux_oncrpc::{decode_reply, Call, Credential, Reply};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

mod common;
use common::{spawn_server, Server, BIN};

fn start(export: &Path, extra: &[&str]) -> Server {
    spawn_server(
        Command::new(BIN)
            .args(["nfs-server", "--export"])
            .arg(export)
            .args(["-l", "127.0.0.1:0", "--duration", "120", "--no-pin"])
            .args(extra),
    )
}

/// A fresh directory under the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("connmux-nfs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Seeded random bytes (no run of them repeats at a small shift).
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut b = vec![0u8; len];
    SmallRng::seed_from_u64(u64::from(seed)).fill_bytes(&mut b);
    b
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// libnfs's URL of `path` beneath the export, NFS and MOUNT on the server's one port.
fn url(s: &Server, export: &Path, path: &str) -> String {
    let p = s.addr.port();
    format!("nfs://127.0.0.1{}{path}?version=3&nfsport={p}&mountport={p}", export.display())
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

// ---- libnfs's tools ----

#[test]
fn libnfs_tools_copy_files_in_and_out_and_list_the_export() {
    if !have("nfs-cp") || !have("nfs-cat") || !have("nfs-ls") {
        eprintln!(
            "SKIP: nfs-cp/nfs-cat/nfs-ls not installed (Debian package libnfs-utils; scripts/setup.sh installs it)"
        );
        return;
    }
    let ex = scratch("libnfs");
    let local = scratch("libnfs-local");
    std::fs::create_dir(ex.join("d")).unwrap();
    let sizes = [0usize, 1, 4095, 4096, 65_537, (1 << 20) + 3, 8 << 20];
    for (i, n) in sizes.iter().enumerate() {
        std::fs::write(ex.join("d").join(format!("f{n}")), pattern(*n, i as u32 + 1)).unwrap();
    }
    let s = start(&ex, &["--no-stats-socket"]);
    for (i, n) in sizes.iter().enumerate() {
        let want = pattern(*n, i as u32 + 1);
        // Out: nfs-cp to a local file, and (the small ones) nfs-cat.
        let to = local.join(format!("out{n}"));
        run(Command::new("nfs-cp").arg(url(&s, &ex, &format!("/d/f{n}"))).arg(&to));
        assert!(std::fs::read(&to).unwrap() == want, "nfs-cp out f{n}: bytes differ");
        if *n <= 65_537 {
            let out = run(Command::new("nfs-cat").arg(url(&s, &ex, &format!("/d/f{n}"))));
            assert!(out.stdout == want, "nfs-cat f{n}: bytes differ");
        }
        // In: nfs-cp from a local file to a new file of the export.
        let from = local.join(format!("in{n}"));
        let data = pattern(*n, 100 + i as u32);
        std::fs::write(&from, &data).unwrap();
        run(Command::new("nfs-cp").arg(&from).arg(url(&s, &ex, &format!("/d/in{n}"))));
        assert!(std::fs::read(ex.join("d").join(format!("in{n}"))).unwrap() == data, "nfs-cp in{n}: bytes differ");
    }
    let out = run(Command::new("nfs-ls").arg("-R").arg(url(&s, &ex, "")));
    let text = String::from_utf8_lossy(&out.stdout);
    for n in sizes {
        for name in [format!("d/f{n}"), format!("d/in{n}")] {
            let line = text.lines().find(|l| l.ends_with(&name)).unwrap_or_else(|| panic!("{name} missing:\n{text}"));
            assert!(line.split_whitespace().any(|w| w == n.to_string()), "{name}: size {n} not in {line:?}");
        }
    }
    // A path outside the export is not mounted.
    let out = Command::new("nfs-ls")
        .arg(format!("nfs://127.0.0.1/etc?version=3&nfsport={0}&mountport={0}", s.addr.port()))
        .output()
        .unwrap();
    assert!(!out.status.success(), "nfs-ls /etc: {}", String::from_utf8_lossy(&out.stdout));
    let _ = std::fs::remove_dir_all(&ex);
    let _ = std::fs::remove_dir_all(&local);
}

#[test]
fn rpcinfo_probes_nfs_and_mount_on_the_one_port() {
    if !have("rpcinfo") {
        eprintln!("SKIP: rpcinfo not installed (Debian package rpcbind; scripts/setup.sh installs it)");
        return;
    }
    let ex = scratch("rpcinfo");
    let s = start(&ex, &["--no-stats-socket"]);
    let uaddr = format!("127.0.0.1.{}.{}", s.addr.port() / 256, s.addr.port() % 256);
    let probe = |pv: [&str; 2]| {
        let out = Command::new("rpcinfo").args(["-T", "tcp", "-a", &uaddr]).args(pv).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
    };
    for pv in [["100003", "3"], ["100005", "3"]] {
        let (ok, text) = probe(pv);
        assert!(ok && text.contains("ready and waiting"), "{pv:?}: {text}");
    }
    // NFSv4 is not served: the mismatch names version 3.
    let (ok, text) = probe(["100003", "4"]);
    assert!(!ok && text.contains('3'), "{text}");
    let _ = std::fs::remove_dir_all(&ex);
}

// ---- a raw client ----

struct Rpc {
    s: TcpStream,
    xid: u32,
    rr: RecordReader,
    /// AUTH_SYS uid and gid of the calls (`None`: AUTH_NONE).
    who: Option<(u32, u32)>,
}

impl Rpc {
    fn connect(addr: SocketAddr) -> Rpc {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        let limits = RecordLimits { max_record_len: 4 << 20, ..RecordLimits::default() };
        Rpc { s, xid: 0x1000, rr: RecordReader::new(limits), who: Some((0, 0)) }
    }

    fn send_call(&mut self, prog: u32, procedure: u32, args: &[u8]) -> u32 {
        self.xid += 1;
        let cred = match self.who {
            Some((uid, gid)) => Credential::Sys { stamp: 1, machine_name: b"test", uid, gid, gids: &[] },
            None => Credential::None,
        };
        let mut b = Vec::new();
        Call { xid: self.xid, prog, vers: 3, procedure, cred, args }.encode(1, &mut b).unwrap();
        self.s.write_all(&b).unwrap();
        self.xid
    }

    /// The next reply record, or `None` when the server closed the connection.
    fn recv(&mut self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 256 << 10];
        // Bounded: each turn reads bytes or ends (the read has a timeout).
        loop {
            if let Some(r) = self.rr.next_record().unwrap() {
                return Some(r.to_vec());
            }
            match self.s.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.rr.push(&buf[..n]),
            }
        }
    }

    /// The reply's status and results.
    fn raw(&mut self, prog: u32, procedure: u32, args: &[u8]) -> (Reply, Vec<u8>) {
        let xid = self.send_call(prog, procedure, args);
        let rec = self.recv().expect("a reply");
        let d = decode_reply(&rec).unwrap();
        assert_eq!(d.xid, xid);
        (d.reply, d.results.to_vec())
    }

    /// An NFS call's results (the RPC accepted it).
    fn nfs(&mut self, c: &NfsCall<'_>) -> Vec<u8> {
        let mut args = Vec::new();
        c.encode(&mut args);
        let (r, results) = self.raw(NFS_PROGRAM, c.proc(), &args);
        assert_eq!(r, Reply::Success, "{}", connmux_nfs::proc_name(c.proc()));
        results
    }

    fn status(&mut self, c: &NfsCall<'_>) -> Nfsstat3 {
        res::status(&self.nfs(c)).unwrap().0
    }

    fn mnt(&mut self, path: &[u8]) -> Result<Vec<u8>, u32> {
        let mut args = Vec::new();
        MountCall::Mnt(path).encode(&mut args);
        let (r, results) = self.raw(MOUNT_PROGRAM, mount::mproc::MNT, &args);
        assert_eq!(r, Reply::Success);
        mount::decode_mnt(&results).unwrap().map(<[u8]>::to_vec)
    }

    fn lookup(&mut self, dir: &[u8], name: &[u8]) -> Result<(Vec<u8>, connmux_nfs::Fattr3), Nfsstat3> {
        let r = self.nfs(&NfsCall::Lookup(DirOp { dir, name }));
        res::decode_lookup(&r).unwrap().map(|(fh, a)| (fh.to_vec(), a.unwrap()))
    }

    fn getattr(&mut self, fh: &[u8]) -> Result<connmux_nfs::Fattr3, Nfsstat3> {
        res::decode_getattr(&self.nfs(&NfsCall::Getattr { fh })).unwrap()
    }

    fn read(&mut self, fh: &[u8], offset: u64, count: u32) -> Result<(Vec<u8>, bool), Nfsstat3> {
        let r = self.nfs(&NfsCall::Read { fh, offset, count });
        res::decode_read(&r).unwrap().map(|(d, eof)| (d.to_vec(), eof))
    }
}

/// The named counter of `connmux stat SOCK`.
fn counter(sock: &Path, name: &str) -> u64 {
    let out = Command::new(BIN).arg("stat").arg(sock).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} not in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn every_procedure_changes_the_export_as_asked() {
    let ex = scratch("procs");
    let s = start(&ex, &["--no-stats-socket"]);
    let mut c = Rpc::connect(s.addr);
    let root = c.mnt(ex.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(c.mnt(b"/").unwrap(), root, "\"/\" names the export too");
    let ra = c.getattr(&root).unwrap();
    assert_eq!(ra.ftype, Ftype3::Dir);

    // CREATE (guarded), then WRITE at each stability: one verifier.
    let at = DirOp { dir: &root, name: b"file" };
    let how = CreateHow::Guarded(Sattr3 { mode: Some(0o640), ..Sattr3::default() });
    let fh = res::decode_create(&c.nfs(&NfsCall::Create { at, how })).unwrap().unwrap().unwrap().to_vec();
    assert_eq!(c.status(&NfsCall::Create { at, how }), Nfsstat3::ERR_EXIST, "guarded create of an existing file");
    let data = pattern(300_000, 7);
    let mut verfs = Vec::new();
    for (i, stable) in [StableHow::Unstable, StableHow::DataSync, StableHow::FileSync].into_iter().enumerate() {
        let part = &data[i * 100_000..(i + 1) * 100_000];
        let r = c.nfs(&NfsCall::Write { fh: &fh, offset: (i * 100_000) as u64, stable, data: part });
        let (count, committed, verf) = res::decode_write(&r).unwrap().unwrap();
        assert_eq!((count, committed), (100_000, stable as u32));
        verfs.push(verf);
    }
    let r = c.nfs(&NfsCall::Commit { fh: &fh, offset: 0, count: 0 });
    let (st, mut rd) = res::status(&r).unwrap();
    assert_eq!(st, Nfsstat3::OK);
    connmux_nfs::Wcc::get(&mut rd).unwrap();
    verfs.push(rd.fixed("verf", 8).unwrap().try_into().unwrap());
    assert!(verfs.windows(2).all(|w| w[0] == w[1]), "one write verifier per server start: {verfs:?}");
    assert!(std::fs::read(ex.join("file")).unwrap() == data);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(ex.join("file")).unwrap().permissions().mode() & 0o777, 0o640);
    // READ back in pieces, eof at the end.
    let (got, eof) = c.read(&fh, 0, 200_000).unwrap();
    assert!(got == data[..200_000] && !eof);
    let (got, eof) = c.read(&fh, 200_000, 200_000).unwrap();
    assert!(got == data[200_000..] && eof);

    // SETATTR: truncate, and a guard that does not match.
    let size = Sattr3 { size: Some(1000), ..Sattr3::default() };
    assert_eq!(c.status(&NfsCall::Setattr { fh: &fh, attr: size, guard: None }), Nfsstat3::OK);
    assert_eq!(std::fs::metadata(ex.join("file")).unwrap().len(), 1000);
    let bad = Some(connmux_nfs::Nfstime3 { seconds: 1, nseconds: 0 });
    assert_eq!(c.status(&NfsCall::Setattr { fh: &fh, attr: size, guard: bad }), Nfsstat3::ERR_NOT_SYNC);

    // MKDIR, SYMLINK, READLINK, LINK, RENAME.
    let dir =
        res::decode_create(&c.nfs(&NfsCall::Mkdir { at: DirOp { dir: &root, name: b"dir" }, attr: Sattr3::default() }))
            .unwrap()
            .unwrap()
            .unwrap()
            .to_vec();
    assert!(ex.join("dir").is_dir());
    let link = DirOp { dir: &dir, name: b"ln" };
    let r = c.nfs(&NfsCall::Symlink { at: link, attr: Sattr3::default(), target: b"../file" });
    let lfh = res::decode_create(&r).unwrap().unwrap().unwrap().to_vec();
    let r = c.nfs(&NfsCall::Readlink { fh: &lfh });
    let (st, mut rd) = res::status(&r).unwrap();
    assert_eq!(st, Nfsstat3::OK);
    connmux_nfs::types::get_post_op_attr(&mut rd).unwrap();
    assert_eq!(rd.opaque("target", 100).unwrap(), b"../file");
    assert_eq!(std::fs::read_link(ex.join("dir/ln")).unwrap(), Path::new("../file"));
    assert_eq!(c.status(&NfsCall::Link { fh: &fh, at: DirOp { dir: &dir, name: b"hard" } }), Nfsstat3::OK);
    assert_eq!(c.getattr(&fh).unwrap().nlink, 2);
    let from = DirOp { dir: &root, name: b"file" };
    let to = DirOp { dir: &dir, name: b"moved" };
    assert_eq!(c.status(&NfsCall::Rename { from, to }), Nfsstat3::OK);
    assert!(!ex.join("file").exists() && ex.join("dir/moved").exists());
    // The handle names the file, not the path: it follows the rename.
    assert_eq!(c.getattr(&fh).unwrap().size, 1000);
    let (got, _) = c.read(&fh, 0, 10).unwrap();
    assert!(got == data[..10]);

    // READDIRPLUS lists every entry with its handle.
    let r = c.nfs(&NfsCall::Readdirplus { dir: &dir, cookie: 0, verf: [0; 8], dircount: 4096, maxcount: 32768 });
    let (entries, eof) = res::decode_readdirplus(&r).unwrap().unwrap();
    assert!(eof);
    let mut names: Vec<&[u8]> = entries.iter().map(|e| e.name).filter(|n| *n != b"." && *n != b"..").collect();
    names.sort();
    assert_eq!(names, [&b"hard"[..], b"ln", b"moved"]);
    let moved = entries.iter().find(|e| e.name == b"moved").unwrap();
    assert_eq!(moved.fh, Some(&fh[..]));
    // READDIR in small pieces, following the cookies, finds the same names.
    let mut cookie = 0;
    let mut seen = Vec::new();
    for _ in 0..20 {
        let r = c.nfs(&NfsCall::Readdir { dir: &dir, cookie, verf: [0; 8], count: 200 });
        let (st, mut rd) = res::status(&r).unwrap();
        assert_eq!(st, Nfsstat3::OK);
        connmux_nfs::types::get_post_op_attr(&mut rd).unwrap();
        rd.fixed("verf", 8).unwrap();
        while rd.bool("more").unwrap() {
            rd.u64("fileid").unwrap();
            seen.push(rd.opaque("name", 255).unwrap().to_vec());
            cookie = rd.u64("cookie").unwrap();
        }
        if rd.bool("eof").unwrap() {
            break;
        }
    }
    seen.retain(|n| n != b"." && n != b"..");
    seen.sort();
    assert_eq!(seen, [b"hard".to_vec(), b"ln".to_vec(), b"moved".to_vec()]);

    // FSSTAT, FSINFO, PATHCONF, ACCESS.
    for call in [NfsCall::Fsstat { fh: &root }, NfsCall::Fsinfo { fh: &root }, NfsCall::Pathconf { fh: &root }] {
        assert_eq!(c.status(&call), Nfsstat3::OK);
    }
    let r = c.nfs(&NfsCall::Access { fh: &root, access: 0x3f });
    let (st, mut rd) = res::status(&r).unwrap();
    assert_eq!(st, Nfsstat3::OK);
    connmux_nfs::types::get_post_op_attr(&mut rd).unwrap();
    assert_ne!(rd.u32("access").unwrap() & 0x03, 0, "the root may be read and searched");

    // REMOVE and RMDIR, and their errors.
    assert_eq!(c.status(&NfsCall::Rmdir(DirOp { dir: &root, name: b"dir" })), Nfsstat3::ERR_NOTEMPTY);
    assert_eq!(c.status(&NfsCall::Remove(DirOp { dir: &root, name: b"dir" })), Nfsstat3::ERR_ISDIR);
    for name in [&b"hard"[..], b"ln", b"moved"] {
        assert_eq!(c.status(&NfsCall::Remove(DirOp { dir: &dir, name })), Nfsstat3::OK);
    }
    assert_eq!(c.status(&NfsCall::Rmdir(DirOp { dir: &root, name: b"dir" })), Nfsstat3::OK);
    assert!(!ex.join("dir").exists());
    // The removed file's handle is stale; so is the directory's.
    assert_eq!(c.getattr(&fh), Err(Nfsstat3::ERR_STALE));
    assert_eq!(c.getattr(&dir), Err(Nfsstat3::ERR_STALE));
    assert_eq!(c.lookup(&root, b"dir").map(|_| ()), Err(Nfsstat3::ERR_NOENT));
    let _ = std::fs::remove_dir_all(&ex);
}

#[test]
fn handles_survive_a_restart_of_the_server() {
    let ex = scratch("restart");
    std::fs::create_dir_all(ex.join("a/b")).unwrap();
    std::fs::write(ex.join("a/b/f"), pattern(5000, 3)).unwrap();
    let fh = {
        let s = start(&ex, &["--no-stats-socket"]);
        let mut c = Rpc::connect(s.addr);
        let root = c.mnt(b"/").unwrap();
        let (a, _) = c.lookup(&root, b"a").unwrap();
        let (b, _) = c.lookup(&a, b"b").unwrap();
        c.lookup(&b, b"f").unwrap().0
    };
    // A new process has met nothing: it finds the file from the handle alone.
    let s = start(&ex, &["--no-stats-socket"]);
    let mut c = Rpc::connect(s.addr);
    assert_eq!(c.getattr(&fh).unwrap().size, 5000);
    let (got, eof) = c.read(&fh, 0, 5000).unwrap();
    assert!(got == pattern(5000, 3) && eof);
    // A file renamed behind the server's back is found again too.
    std::fs::rename(ex.join("a/b/f"), ex.join("a/g")).unwrap();
    assert_eq!(c.getattr(&fh).unwrap().size, 5000);
    // Removed behind its back: stale.
    std::fs::remove_file(ex.join("a/g")).unwrap();
    assert_eq!(c.getattr(&fh), Err(Nfsstat3::ERR_STALE));
    let _ = std::fs::remove_dir_all(&ex);
}

// ---- hostile clients ----

#[test]
fn forged_handles_escapes_huge_counts_and_bad_xdr_are_refused_and_the_server_serves_on() {
    let ex = scratch("hostile");
    let other = scratch("hostile-other");
    let sock = ex.with_extension("sock");
    std::fs::write(ex.join("f"), pattern(3 << 20, 9)).unwrap();
    std::os::unix::fs::symlink("/etc", ex.join("etc")).unwrap();
    std::os::unix::fs::symlink("../../..", ex.join("up")).unwrap();
    let s = start(&ex, &["--stats-socket", sock.to_str().unwrap()]);
    let s2 = start(&other, &["--no-stats-socket"]);
    // The good client, beside the others throughout.
    let mut good = Rpc::connect(s.addr);
    let root = good.mnt(b"/").unwrap();
    let (f, _) = good.lookup(&root, b"f").unwrap();
    let check_good = |good: &mut Rpc| {
        let (got, _) = good.read(&f, 4096, 4096).unwrap();
        assert!(got == pattern(3 << 20, 9)[4096..8192], "the good client's read");
    };
    check_good(&mut good);

    let mut c = Rpc::connect(s.addr);
    // Forged handles: not ours (BADHANDLE), ours in form but naming no file
    // (STALE), another export's (STALE).
    let mut forged = f.clone();
    forged[0] ^= 0xff;
    assert_eq!(c.getattr(&forged), Err(Nfsstat3::ERR_BADHANDLE));
    assert_eq!(c.getattr(b"abc"), Err(Nfsstat3::ERR_BADHANDLE));
    assert_eq!(c.getattr(&[]), Err(Nfsstat3::ERR_BADHANDLE));
    let mut noino = f.clone();
    noino[20..28].copy_from_slice(&u64::MAX.to_be_bytes());
    assert_eq!(c.getattr(&noino), Err(Nfsstat3::ERR_STALE));
    // (A second time: answered from the misses, no second search; nor is
    // another inode searched for so soon after a whole search.)
    assert_eq!(c.getattr(&noino), Err(Nfsstat3::ERR_STALE));
    for ino in 1..100u64 {
        noino[20..28].copy_from_slice(&(u64::MAX - ino).to_be_bytes());
        assert_eq!(c.getattr(&noino), Err(Nfsstat3::ERR_STALE));
    }
    let mut c2 = Rpc::connect(s2.addr);
    let other_root = c2.mnt(b"/").unwrap();
    assert_eq!(c.getattr(&other_root), Err(Nfsstat3::ERR_STALE));
    assert_eq!(c.lookup(&other_root, b"f").map(|_| ()), Err(Nfsstat3::ERR_STALE));
    let mut args = Vec::new();
    NfsCall::Getattr { fh: b"" }.encode(&mut args);
    args[..4].copy_from_slice(&65u32.to_be_bytes());
    args.extend_from_slice(&[0; 68]);
    assert_eq!(c.raw(NFS_PROGRAM, proc3::GETATTR, &args).0, Reply::GarbageArgs, "a 65-byte handle");

    // `..` and symlinks: the parent of the root is the root; a name with
    // a slash is refused; a symlink is a link, never followed by the server.
    let (up, ua) = c.lookup(&root, b"..").unwrap();
    assert_eq!((up.as_slice(), ua.fileid), (root.as_slice(), c.getattr(&root).unwrap().fileid));
    assert_eq!(c.lookup(&root, b"../etc").map(|_| ()), Err(Nfsstat3::ERR_INVAL));
    assert_eq!(c.lookup(&root, b"etc/passwd").map(|_| ()), Err(Nfsstat3::ERR_INVAL));
    let (etc, ea) = c.lookup(&root, b"etc").unwrap();
    assert_eq!(ea.ftype, Ftype3::Lnk);
    assert_eq!(c.lookup(&etc, b"passwd").map(|_| ()), Err(Nfsstat3::ERR_NOTDIR));
    assert_eq!(c.read(&etc, 0, 100), Err(Nfsstat3::ERR_INVAL));
    let (upl, _) = c.lookup(&root, b"up").unwrap();
    assert_eq!(c.lookup(&upl, b"..").map(|_| ()), Err(Nfsstat3::ERR_NOTDIR));
    let how = CreateHow::Unchecked(Sattr3::default());
    assert_eq!(c.status(&NfsCall::Create { at: DirOp { dir: &etc, name: b"x" }, how }), Nfsstat3::ERR_NOTDIR);
    assert!(!Path::new("/etc/x").exists());
    // MOUNT of paths outside the export.
    for p in [&b"/etc"[..], b"/", b"/.."] {
        let mut path = ex.as_os_str().as_encoded_bytes().to_vec();
        path.extend_from_slice(if p == b"/" { b"/../.." } else { p });
        assert_eq!(c.mnt(&path), Err(mount::mountstat::ERR_NOENT), "{}", String::from_utf8_lossy(&path));
    }
    assert_eq!(c.mnt(b"/etc"), Err(mount::mountstat::ERR_NOENT));

    // READ of 4 GiB: answered, cut to rtmax (1 MiB).
    let (got, eof) = c.read(&f, 0, u32::MAX).unwrap();
    assert!(got.len() == 1 << 20 && !eof && got == pattern(3 << 20, 9)[..1 << 20]);
    // WRITE whose count says 4 GiB and whose data is 4 bytes: GARBAGE_ARGS.
    let mut args = Vec::new();
    NfsCall::Write { fh: &f, offset: 0, stable: StableHow::FileSync, data: b"evil" }.encode(&mut args);
    let at = 4 + f.len() + 8;
    args[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(c.raw(NFS_PROGRAM, proc3::WRITE, &args).0, Reply::GarbageArgs);
    // ... and with the data's own length at 4 GiB too (it is not there).
    args[at + 8..at + 12].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(c.raw(NFS_PROGRAM, proc3::WRITE, &args).0, Reply::GarbageArgs);
    assert!(std::fs::read(ex.join("f")).unwrap()[..4] == pattern(3 << 20, 9)[..4], "nothing written");
    // Truncated XDR: every prefix of a LOOKUP's arguments.
    let mut args = Vec::new();
    NfsCall::Lookup(DirOp { dir: &root, name: b"f" }).encode(&mut args);
    for n in 0..args.len() {
        assert_eq!(c.raw(NFS_PROGRAM, proc3::LOOKUP, &args[..n]).0, Reply::GarbageArgs, "cut at {n}");
    }
    // Unknown procedure: PROC_UNAVAIL; the connection goes on.
    assert_eq!(c.raw(NFS_PROGRAM, 22, &[]).0, Reply::ProcUnavail);
    assert_eq!(c.getattr(&f).unwrap().size, 3 << 20, "the hostile connection still served");
    check_good(&mut good);

    // A record that is no call at all: that connection is closed.
    let mut bad = Rpc::connect(s.addr);
    let mut rec = Vec::new();
    connmux_oncrpc::encode_null_call(1, NFS_PROGRAM, 3, 1, &mut rec);
    rec[8..12].copy_from_slice(&1u32.to_be_bytes()); // msg_type REPLY
    bad.s.write_all(&rec).unwrap();
    assert!(bad.recv().is_none(), "closed");
    check_good(&mut good);

    let t0 = Instant::now();
    // The counters say what happened (bounded wait: they are read at once).
    while counter(&sock, "bad_calls") < 1 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(counter(&sock, "bad_calls") >= 1);
    // Two WRITEs, the long handle and every cut LOOKUP.
    assert!(counter(&sock, "garbage_args") >= 3 + args.len() as u64);
    assert!(counter(&sock, "bad_handles") >= 3);
    assert!(counter(&sock, "stale_handles") >= 100);
    assert_eq!(counter(&sock, "handle_searches"), 1, "the forged inode searched for once");
    let _ = std::fs::remove_dir_all(&ex);
    let _ = std::fs::remove_dir_all(&other);
}

#[test]
fn a_client_that_collects_no_replies_holds_no_thread_from_the_others() {
    let ex = scratch("hog");
    let sock = ex.with_extension("sock");
    std::fs::write(ex.join("f"), pattern(8 << 20, 5)).unwrap();
    let s = start(&ex, &["--fs-threads", "4", "--stats-socket", sock.to_str().unwrap()]);
    let mut good = Rpc::connect(s.addr);
    let root = good.mnt(b"/").unwrap();
    let (f, _) = good.lookup(&root, b"f").unwrap();
    // The hog: 300 READs of 1 MiB sent, no reply read.
    let mut hog = Rpc::connect(s.addr);
    let mut calls = Vec::new();
    for i in 0..300u32 {
        let mut args = Vec::new();
        NfsCall::Read { fh: &f, offset: u64::from(i % 8) << 20, count: 1 << 20 }.encode(&mut args);
        let cred = Credential::None;
        Call { xid: i, prog: NFS_PROGRAM, vers: 3, procedure: proc3::READ, cred, args: &args }
            .encode(1, &mut calls)
            .unwrap();
    }
    hog.s.write_all(&calls).unwrap();
    // Its replies fill its backlog: paused, counted.
    let t0 = Instant::now();
    while counter(&sock, "paused") == 0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the hog's connection never paused");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The good client is served at once meanwhile (a thread held in a send
    // to the hog would hold it for SEND_TIMEOUT, 10 s).
    let t0 = Instant::now();
    for i in 0..40u64 {
        let (got, _) = good.read(&f, i * 65536, 65536).unwrap();
        assert!(got == pattern(8 << 20, 5)[(i * 65536) as usize..((i + 1) * 65536) as usize]);
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "40 reads took {:?} beside the hog", t0.elapsed());
    assert_eq!(counter(&sock, "send_failures"), 0);
    // The hog, once it reads, gets every reply.
    for _ in 0..300 {
        let rec = hog.recv().expect("a reply to the hog");
        let d = decode_reply(&rec).unwrap();
        assert_eq!(res::decode_read(d.results).unwrap().unwrap().0.len(), 1 << 20);
    }
    let _ = std::fs::remove_dir_all(&ex);
}

#[test]
fn reads_of_an_open_file_in_memory_are_answered_on_the_workers() {
    let ex = scratch("inline");
    let sock = ex.with_extension("sock");
    let data = pattern((3 << 20) + 5, 6);
    std::fs::write(ex.join("f"), &data).unwrap();
    let s = start(&ex, &["--stats-socket", sock.to_str().unwrap()]);
    let mut c = Rpc::connect(s.addr);
    let root = c.mnt(b"/").unwrap();
    let (f, _) = c.lookup(&root, b"f").unwrap();
    // The first READ opens the file: on a file-system thread.
    assert_eq!(c.read(&f, 0, 4096).unwrap(), (data[..4096].to_vec(), false));
    assert_eq!(counter(&sock, "reads_on_workers"), 0);
    // Open, and its pages in memory (just written): on the worker, the same
    // bytes and eof as the threads give, 1 MiB and the file's end included.
    let len = data.len() as u64;
    for (off, n) in [(4096, 4096), (1 << 20, 1 << 20), (len - 5, 4096), (len, 4096), (7, 0)] {
        let (got, eof) = c.read(&f, off, n).unwrap();
        let end = (off + u64::from(n)).min(len);
        assert_eq!(got, data[off as usize..end as usize], "READ of {n} at {off}");
        assert_eq!(eof, off + u64::from(n) >= len, "eof of READ of {n} at {off}");
    }
    assert_eq!(counter(&sock, "reads_on_workers"), 5);
    assert_eq!(counter(&sock, "nfs_read"), 6);
    // A handle of no file of ours still gets its error (from the threads).
    assert_eq!(c.read(b"not a handle", 0, 4096), Err(Nfsstat3::ERR_BADHANDLE));
    assert_eq!(counter(&sock, "reads_on_workers"), 5);
    let _ = std::fs::remove_dir_all(&ex);
}

#[test]
fn rpctest_loads_getattr_lookup_read_and_write() {
    let ex = scratch("rpctest");
    std::fs::create_dir(ex.join("d")).unwrap();
    std::fs::write(ex.join("d/f"), pattern(100_000, 4)).unwrap();
    let s = start(&ex, &["--no-stats-socket"]);
    let target = s.addr.to_string();
    for (proc, file, size) in [
        ("getattr", "d/f", "4096"),
        ("lookup", "d/f", "4096"),
        ("read", "d/f", "64K"),
        ("read", "d/f", "1M"),
        ("write", "d/new", "8K"),
    ] {
        let args = ["rpctest", "--proc", proc, "--file", file, "--size", size, "-j2", "-a4", "-c300", "-i2", &target];
        let r = common::run_connmux(&args, Duration::from_secs(60));
        assert_eq!(r.code, 0, "{args:?}: {}{}", r.stdout, r.stderr);
        assert!(r.stdout.contains("result=ok") && r.stdout.contains("calls=1200"), "{args:?}: {}", r.stdout);
    }
    assert_eq!(std::fs::metadata(ex.join("d/new")).unwrap().len(), 8192, "written by the WRITEs");
    // A file that is not there: the setup fails, and says why.
    let r =
        common::run_connmux(&["rpctest", "--proc", "read", "--file", "nope", "-c1", &target], Duration::from_secs(60));
    assert_ne!(r.code, 0);
    assert!((r.stdout.clone() + &r.stderr).contains("NFS3ERR_NOENT"), "{}{}", r.stdout, r.stderr);
    let _ = std::fs::remove_dir_all(&ex);
}

#[test]
fn bench_nfs_quick_prints_every_load_beside_ganesha() {
    if !have("ganesha.nfsd") || !have("rpcbind") {
        eprintln!("SKIP: nfs-ganesha or rpcbind not installed (Debian packages nfs-ganesha nfs-ganesha-vfs rpcbind)");
        return;
    }
    let r = common::run_connmux(&["bench", "nfs", "--quick", "--placement", "cpu0"], Duration::from_secs(240));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    for load in ["getattr -j8 -a16", "read 4 KiB -j8 -a16", "read 1 MiB -j1 -a1", "write 1 MiB -j1 -a1"] {
        let line = r.stdout.lines().find(|l| l.starts_with(load)).unwrap_or_else(|| panic!("{load}:\n{}", r.stdout));
        assert!(line.contains("ganesha: PASS") || line.contains("ganesha: MISS"), "{line}");
    }
}

/// Whether this test process runs as root.
fn root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}

#[test]
fn auth_sys_calls_run_as_their_caller() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !root() {
        eprintln!("SKIP: --auth-sys needs the server to run as root");
        return;
    }
    let ex = scratch("authsys");
    std::fs::set_permissions(&ex, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(ex.join("secret"), b"root only").unwrap();
    std::fs::set_permissions(ex.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(ex.join("home")).unwrap();
    std::os::unix::fs::chown(ex.join("home"), Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(ex.join("home"), std::fs::Permissions::from_mode(0o700)).unwrap();
    for squash in [false, true] {
        let extra: &[&str] = if squash { &["--auth-sys", "--root-squash"] } else { &["--auth-sys"] };
        let s = start(&ex, &[&["--no-stats-socket"], extra].concat());
        let mut rootc = Rpc::connect(s.addr);
        let root_fh = rootc.mnt(b"/").unwrap();
        let (secret, _) = rootc.lookup(&root_fh, b"secret").unwrap();
        let (home, _) = rootc.lookup(&root_fh, b"home").unwrap();
        // Root reads the secret, unless squashed.
        let r = rootc.read(&secret, 0, 100);
        if squash {
            assert_eq!(r.map(|_| ()), Err(Nfsstat3::ERR_ACCES), "root squashed");
        } else {
            assert_eq!(r.unwrap().0, b"root only");
        }
        // uid 1000: not the secret, not a new file in the root's directory,
        // but one in its own home, owned by it.
        let mut user = Rpc::connect(s.addr);
        user.who = Some((1000, 1000));
        assert_eq!(user.read(&secret, 0, 100).map(|_| ()), Err(Nfsstat3::ERR_ACCES));
        let how = CreateHow::Unchecked(Sattr3 { mode: Some(0o644), ..Sattr3::default() });
        let at = DirOp { dir: &root_fh, name: b"intruder" };
        assert_eq!(user.status(&NfsCall::Create { at, how }), Nfsstat3::ERR_ACCES);
        let name = format!("mine{}", u8::from(squash));
        let at = DirOp { dir: &home, name: name.as_bytes() };
        let fh = res::decode_create(&user.nfs(&NfsCall::Create { at, how })).unwrap().unwrap().unwrap().to_vec();
        let w = NfsCall::Write { fh: &fh, offset: 0, stable: StableHow::FileSync, data: b"hello" };
        assert_eq!(user.status(&w), Nfsstat3::OK);
        let md = std::fs::metadata(ex.join("home").join(&name)).unwrap();
        assert_eq!((md.uid(), md.gid(), md.len()), (1000, 1000, 5), "made as its caller");
        // ACCESS answers for the caller.
        let r = user.nfs(&NfsCall::Access { fh: &secret, access: 0x01 });
        let (_, mut rd) = res::status(&r).unwrap();
        connmux_nfs::types::get_post_op_attr(&mut rd).unwrap();
        assert_eq!(rd.u32("access").unwrap(), 0, "uid 1000 may not read the secret");
        // AUTH_NONE: nobody, who may not enter uid 1000's home.
        let mut anon = Rpc::connect(s.addr);
        anon.who = None;
        assert_eq!(anon.lookup(&home, name.as_bytes()).map(|_| ()), Err(Nfsstat3::ERR_ACCES));
        // The threads came back to the server's identity: root again reads.
        if !squash {
            assert_eq!(rootc.read(&secret, 0, 100).unwrap().0, b"root only");
        }
    }
    assert!(!ex.join("intruder").exists());
    let _ = std::fs::remove_dir_all(&ex);
}

#[test]
fn read_only_export_refuses_changes() {
    let ex = scratch("ro");
    std::fs::write(ex.join("f"), b"keep").unwrap();
    let s = start(&ex, &["--no-stats-socket", "--read-only"]);
    let mut c = Rpc::connect(s.addr);
    let root = c.mnt(b"/").unwrap();
    let (f, _) = c.lookup(&root, b"f").unwrap();
    let w = NfsCall::Write { fh: &f, offset: 0, stable: StableHow::FileSync, data: b"gone" };
    assert_eq!(c.status(&w), Nfsstat3::ERR_ROFS);
    let how = CreateHow::Unchecked(Sattr3::default());
    assert_eq!(c.status(&NfsCall::Create { at: DirOp { dir: &root, name: b"new" }, how }), Nfsstat3::ERR_ROFS);
    assert_eq!(c.status(&NfsCall::Remove(DirOp { dir: &root, name: b"f" })), Nfsstat3::ERR_ROFS);
    assert_eq!(std::fs::read(ex.join("f")).unwrap(), b"keep");
    assert_eq!(c.read(&f, 0, 10).unwrap().0, b"keep");
    let _ = std::fs::remove_dir_all(&ex);
}
