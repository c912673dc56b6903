//! The servers over UDP, as users meet them: `rpcinfo -T udp` (Debian's
//! rpcbind package, a peer we did not write) against the rpc-server and the
//! nfs-server, raw datagrams (a NULL call, an echo, a marked call, garbage),
//! `echotest -u` and `rpctest -u`, an NFS READ over UDP cut to fit a
//! datagram, and `--no-udp`. The UDP service has its own loop
//! (recvmmsg/sendmmsg), the same whichever driver the TCP workers run.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use connmux_nfs::{mount, MountCall, NfsCall, MOUNT_PROGRAM, NFS_PROGRAM};
use connmux_oncrpc::{decode_reply, Call, Credential, Reply};

mod common;
use common::{run_connmux, spawn_server, Server, BIN};

fn start(args: &[&str], stats: Option<&Path>) -> Server {
    let mut c = Command::new(BIN);
    c.args(args).args(["-l", "127.0.0.1:0", "--duration", "60"]);
    match stats {
        Some(p) => c.arg("--stats-socket").arg(p),
        None => c.arg("--no-stats-socket"),
    };
    spawn_server(&mut c)
}

fn stats_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("connmux-udp-test-{name}-{}.sock", std::process::id()))
}

/// The named counter of `connmux stat SOCK`.
fn counter(sock: &Path, name: &str) -> u64 {
    let out = Command::new(BIN).arg("stat").arg(sock).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits (at most 10 s) for `connmux stat`'s counter `name` to reach `want`.
fn wait_counter(sock: &Path, name: &str, want: u64) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let v = counter(sock, name);
        if v >= want {
            assert_eq!(v, want, "{name}");
            return;
        }
        assert!(Instant::now() < end, "{name} stays at {v}, want {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn client(to: SocketAddr) -> UdpSocket {
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.connect(to).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("-h").output().is_ok()
}

/// `rpcinfo -T udp -a UADDR PROG VERS`: (success, what it printed).
fn rpcinfo_udp(a: SocketAddr, prog: &str, vers: &str) -> (bool, String) {
    let uaddr = format!("127.0.0.1.{}.{}", a.port() / 256, a.port() % 256);
    let out = Command::new("rpcinfo").args(["-T", "udp", "-a", &uaddr, prog, vers]).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// A call datagram: the record's body, no mark.
fn call(xid: u32, prog: u32, vers: u32, procedure: u32, args: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    let cred = Credential::Sys { stamp: 1, machine_name: b"test", uid: 0, gid: 0, gids: &[] };
    Call { xid, prog, vers, procedure, cred, args }.encode(1, &mut b).unwrap();
    b.split_off(4)
}

#[test]
fn rpcinfo_over_udp_finds_the_rpc_server_and_its_refusals() {
    if !have("rpcinfo") {
        eprintln!("SKIP: rpcinfo not installed (Debian package rpcbind; scripts/setup.sh installs it)");
        return;
    }
    let s = start(&["rpc-server", "--register", "100005:1-3"], None);
    for v in ["3", "4"] {
        let (ok, text) = rpcinfo_udp(s.addr, "100003", v);
        assert!(ok && text.contains(&format!("program 100003 version {v} ready and waiting")), "{text}");
    }
    let (ok, text) = rpcinfo_udp(s.addr, "100003", "2");
    assert!(!ok && text.contains("low version = 3, high version = 4"), "{text}");
    let (ok, text) = rpcinfo_udp(s.addr, "100005", "2");
    assert!(ok && text.contains("ready and waiting"), "{text}");
    let (ok, text) = rpcinfo_udp(s.addr, "100099", "1");
    assert!(!ok && text.contains("Program unavailable"), "{text}");
}

#[test]
fn a_marked_or_broken_datagram_is_counted_and_dropped_and_calls_are_answered() {
    let sock = stats_path("rpc");
    let s = start(&["rpc-server", "--workers", "1"], Some(&sock));
    let c = client(s.addr);
    let null = call(5, 100_003, 3, 0, &[]);
    // A record mark before the call, garbage, a reply: each dropped.
    let marked = [&(0x8000_0000u32 | null.len() as u32).to_be_bytes()[..], &null].concat();
    c.send(&marked).unwrap();
    c.send(b"garbage").unwrap();
    let mut reply = Vec::new();
    connmux_oncrpc::encode_reply(9, &Reply::Success, &mut reply);
    c.send(&reply[4..]).unwrap();
    // Then a NULL call with AUTH_SYS: answered, unmarked.
    c.send(&null).unwrap();
    let mut buf = [0u8; 512];
    let n = c.recv(&mut buf).unwrap();
    let d = decode_reply(&buf[..n]).unwrap();
    assert_eq!((d.xid, d.reply), (5, Reply::Success));
    wait_counter(&sock, "udp_malformed", 3);
    assert_eq!(counter(&sock, "udp_datagrams_in"), 4);
    assert_eq!(counter(&sock, "udp_datagrams_out"), 1);
    assert_eq!(counter(&sock, "rpc_bad_calls"), 3);
    // TCP beside it is untouched.
    assert_eq!(counter(&sock, "accepted"), 0);
}

#[test]
fn echotest_and_rpctest_over_udp_lose_nothing() {
    let rpc = start(&["rpc-server", "--workers", "2"], None);
    let echo = start(&["echo-server", "--workers", "2"], None);
    let limit = Duration::from_secs(60);
    for (args, target) in [
        (vec!["rpctest", "-u", "-j", "2", "-a", "16", "-c", "20000", "-i", "2"], rpc.addr),
        (vec!["rpctest", "-u", "-A", "sys", "-j", "1", "-a", "1", "-c", "2000", "-i", "1"], rpc.addr),
        (vec!["echotest", "-u", "-j", "2", "-a", "16", "-c", "20000", "-i", "2"], echo.addr),
        (
            vec!["echotest", "-u", "--mode", "bytes", "-l", "8000", "-j", "1", "-a", "4", "-c", "2000", "-i", "1"],
            echo.addr,
        ),
    ] {
        // A name, not an address: names are resolved.
        let t = format!("localhost:{}", target.port());
        let r = run_connmux(&[&args[..], &[t.as_str()]].concat(), limit);
        assert_eq!(r.code, 0, "{args:?}: {}{}", r.stdout, r.stderr);
        let summary = r.stdout.lines().find(|l| l.starts_with("summary ")).unwrap();
        assert!(summary.contains(" lost=0 ") && summary.contains("result=ok"), "{summary}");
    }
    // Nothing listens on UDP with --no-udp: the client says so and fails.
    let tcp_only = start(&["rpc-server", "--no-udp"], None);
    let r = run_connmux(&["rpctest", "-u", "-c", "10", "-i", "1", &tcp_only.addr.to_string()], limit);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("nothing listens on UDP") || r.stderr.contains("no reply"), "{}", r.stderr);
}

#[test]
fn echo_server_echoes_a_datagram_whole() {
    let s = start(&["echo-server"], None);
    let c = client(s.addr);
    for len in [1usize, 100, 5000, 60_000] {
        let m: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        c.send(&m).unwrap();
        let mut buf = vec![0u8; 65_536];
        let n = c.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &m[..], "{len}");
    }
}

#[test]
fn nfs_over_udp_answers_rpcinfo_and_cuts_a_read_to_a_datagram() {
    let ex = std::env::temp_dir().join(format!("connmux-udp-nfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ex);
    std::fs::create_dir_all(&ex).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(ex.join("big"), &data).unwrap();
    let sock = stats_path("nfs");
    let mut cmd = Command::new(BIN);
    cmd.args(["nfs-server", "--export"]).arg(&ex);
    cmd.args(["-l", "127.0.0.1:0", "--duration", "60", "--no-pin", "--udp-max", "16K", "--stats-socket"]).arg(&sock);
    let s = spawn_server(&mut cmd);
    if have("rpcinfo") {
        for p in ["100003", "100005"] {
            let (ok, text) = rpcinfo_udp(s.addr, p, "3");
            assert!(ok && text.contains("ready and waiting"), "{p}: {text}");
        }
    }
    let c = client(s.addr);
    let mut buf = vec![0u8; 65_536];
    let mut ask = |xid: u32, prog: u32, procedure: u32, args: &[u8]| -> Vec<u8> {
        c.send(&call(xid, prog, 3, procedure, args)).unwrap();
        let n = c.recv(&mut buf).unwrap();
        assert!(n <= 16 << 10, "a reply of {n} bytes over --udp-max");
        let d = decode_reply(&buf[..n]).unwrap();
        assert_eq!((d.xid, d.reply), (xid, Reply::Success));
        d.results.to_vec()
    };
    let mut args = Vec::new();
    let path = ex.as_os_str().as_encoded_bytes();
    MountCall::Mnt(path).encode(&mut args);
    let root = mount::decode_mnt(&ask(1, MOUNT_PROGRAM, mount::mproc::MNT, &args)).unwrap().unwrap().to_vec();
    args.clear();
    NfsCall::Lookup(connmux_nfs::DirOp { dir: &root, name: b"big" }).encode(&mut args);
    let r = ask(2, NFS_PROGRAM, 3, &args);
    let (fh, _) = connmux_nfs::res::decode_lookup(&r).unwrap().unwrap();
    let fh = fh.to_vec();
    // A READ of 64 KiB comes back short, as much as fits in 16 KiB, not at
    // its end; the client reads on from there and gets the file.
    let mut got = Vec::new();
    let mut xid = 10;
    while got.len() < data.len() {
        args.clear();
        NfsCall::Read { fh: &fh, offset: got.len() as u64, count: 64 << 10 }.encode(&mut args);
        xid += 1;
        let r = ask(xid, NFS_PROGRAM, 6, &args);
        let (d, eof) = connmux_nfs::res::decode_read(&r).unwrap().unwrap();
        assert!(!d.is_empty() && d.len() <= 16 << 10, "{}", d.len());
        got.extend_from_slice(d);
        assert_eq!(eof, got.len() == data.len());
    }
    assert_eq!(got, data);
    assert_eq!(counter(&sock, "udp_refused_too_large"), 0);
    let _ = std::fs::remove_dir_all(&ex);
}

#[test]
fn bench_udp_quick_prints_every_server_and_the_targets() {
    let r = run_connmux(&["bench", "udp", "--quick"], Duration::from_secs(120));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    for server in ["connmux", "loop", "thread"] {
        assert!(r.stdout.lines().any(|l| l.starts_with("cpu0") && l.contains(server)), "{server}: {}", r.stdout);
    }
    assert!(r.stdout.contains("connmux >= 1.0x loop RPC/s, cpu0 -j1 -a32"), "{}", r.stdout);
    assert!(r.stdout.contains("no request lost"), "{}", r.stdout);
}

#[test]
fn the_baselines_answer_null_calls_and_drop_garbage() {
    for engine in ["udp-loop-server", "udp-thread-server"] {
        // Any free port: the baselines bind UDP alone.
        let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut child = Command::new(BIN)
            .args(["bench", engine, "-l", &addr.to_string(), "--cpus", "0"])
            .args(if engine == "udp-thread-server" { &["--batch", "0"][..] } else { &[][..] })
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut line).unwrap();
        assert!(line.contains("listening"), "{line}");
        let c = client(addr);
        c.send(b"junk").unwrap();
        c.send(&call(3, 100_003, 3, 0, &[])).unwrap();
        let mut buf = [0u8; 256];
        let n = c.recv(&mut buf).unwrap();
        assert_eq!(decode_reply(&buf[..n]).unwrap().xid, 3, "{engine}");
        let _ = child.kill();
        let _ = child.wait();
    }
}
