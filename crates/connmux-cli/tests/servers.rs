//! The servers as a user runs them: the `connmux` binary on loopback, checked
//! by peers we did not write (`rpcinfo` from Debian's rpcbind) and by our own
//! load generators, plus a misbehaving client beside a good one.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{spawn_server, Server, BIN};

/// Start `connmux <args> -l 127.0.0.1:0` and read the address it listens on
/// from its first line ("... listening on ADDR ...").
fn start(args: &[&str]) -> Server {
    spawn_server(Command::new(BIN).args(args).args(["-l", "127.0.0.1:0", "--duration", "60", "--no-stats-socket"]))
}

/// rpcinfo's universal address for a TCP port on 127.0.0.1.
fn uaddr(a: SocketAddr) -> String {
    format!("127.0.0.1.{}.{}", a.port() / 256, a.port() % 256)
}

fn rpcinfo(a: SocketAddr, prog_vers: &[&str]) -> (bool, String) {
    let out = Command::new("rpcinfo")
        .args(["-T", "tcp", "-a", &uaddr(a)])
        .args(prog_vers)
        .output()
        .expect("rpcinfo is installed by scripts/setup.sh (Debian package rpcbind)");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn rpc_server_answers_rpcinfo(engine: &str) {
    let s = start(&["rpc-server", "--engine", engine, "--register", "100005:1-3"]);
    for v in ["3", "4"] {
        let (ok, text) = rpcinfo(s.addr, &["100003", v]);
        assert!(ok && text.contains(&format!("program 100003 version {v} ready and waiting")), "{engine}: {text}");
    }
    // PROG_MISMATCH carries the supported range, which rpcinfo prints.
    let (ok, text) = rpcinfo(s.addr, &["100003", "2"]);
    assert!(!ok, "{engine}: {text}");
    assert!(text.contains("low version = 3, high version = 4"), "{engine}: {text}");
    // A registered program, and one that is not.
    let (ok, text) = rpcinfo(s.addr, &["100005", "2"]);
    assert!(ok && text.contains("ready and waiting"), "{engine}: {text}");
    let (ok, text) = rpcinfo(s.addr, &["100099", "1"]);
    assert!(!ok && text.contains("Program unavailable"), "{engine}: {text}");
}

#[test]
fn connmux_rpc_server_answers_rpcinfo() {
    rpc_server_answers_rpcinfo("connmux");
}

#[test]
fn thread_baseline_rpc_server_answers_rpcinfo() {
    rpc_server_answers_rpcinfo("thread");
}

/// One NULL call record (NFS v3, AUTH_NONE) with the last-fragment mark.
fn null_call(xid: u32) -> Vec<u8> {
    let mut body = Vec::new();
    for w in [xid, 0, 2, 100_003, 3, 0, 0, 0, 0, 0] {
        body.extend_from_slice(&w.to_be_bytes());
    }
    let mut rec = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    rec.extend_from_slice(&body);
    rec
}

/// Read one reply record and return (xid, reply_stat, accept_stat).
fn read_reply(c: &mut TcpStream) -> (u32, u32, u32) {
    let mut mark = [0u8; 4];
    c.read_exact(&mut mark).unwrap();
    let len = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
    let mut body = vec![0u8; len];
    c.read_exact(&mut body).unwrap();
    let w = |i: usize| u32::from_be_bytes(body[i * 4..i * 4 + 4].try_into().unwrap());
    assert_eq!(w(1), 1, "msg_type REPLY");
    (w(0), w(2), w(5))
}

#[test]
fn a_client_sending_a_reply_is_disconnected_and_a_good_client_is_not() {
    let s = start(&["rpc-server"]);
    let mut good = TcpStream::connect(s.addr).unwrap();
    good.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    good.write_all(&null_call(1)).unwrap();
    assert_eq!(read_reply(&mut good), (1, 0, 0));

    // A record whose message type is REPLY: not a call, the connection closes.
    let mut bad = TcpStream::connect(s.addr).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rec = null_call(7);
    rec[8..12].copy_from_slice(&1u32.to_be_bytes());
    bad.write_all(&rec).unwrap();
    let mut b = [0u8; 64];
    let r = bad.read(&mut b);
    assert!(matches!(r, Ok(0) | Err(_)), "the bad client must be disconnected, got {r:?}");

    // The good connection goes on, pipelined.
    let batch: Vec<u8> = (2..102).flat_map(null_call).collect();
    good.write_all(&batch).unwrap();
    let mut xids: Vec<u32> = (0..100)
        .map(|_| read_reply(&mut good))
        .map(|(x, rs, acc)| {
            assert_eq!((rs, acc), (0, 0));
            x
        })
        .collect();
    xids.sort();
    assert_eq!(xids, (2..102).collect::<Vec<_>>());
}

#[test]
fn a_multi_fragment_call_is_answered_once() {
    let s = start(&["rpc-server"]);
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let rec = null_call(42);
    let body = &rec[4..];
    // Three fragments: 4 bytes, the middle, 4 bytes (the last one marked last).
    let mut wire = Vec::new();
    for (i, part) in [&body[..4], &body[4..body.len() - 4], &body[body.len() - 4..]].iter().enumerate() {
        let last = if i == 2 { 0x8000_0000 } else { 0 };
        wire.extend_from_slice(&(last | part.len() as u32).to_be_bytes());
        wire.extend_from_slice(part);
    }
    c.write_all(&wire).unwrap();
    assert_eq!(read_reply(&mut c), (42, 0, 0));
}

fn run_ok(args: &[&str], limit: Duration) -> String {
    let start = Instant::now();
    let out = Command::new(BIN).args(args).output().expect("run connmux");
    assert!(start.elapsed() < limit + Duration::from_secs(60), "took {:?}", start.elapsed());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "connmux {args:?} failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn rpctest_and_echotest_drive_the_servers_without_errors() {
    let rpc = start(&["rpc-server", "--workers", "2"]);
    let a = rpc.addr.to_string();
    let out = run_ok(&["rpctest", "-j2", "-a8", "-c2000", "-i2", "--no-progress", &a], Duration::from_secs(30));
    assert!(out.lines().any(|l| l.starts_with("summary ") && l.contains("result=ok")), "{out}");
    let out = run_ok(&["rpctest", "-j1", "-a4", "-c500", "-i1", "-f", "--no-progress", &a], Duration::from_secs(30));
    assert!(out.contains("result=ok"), "{out}");

    for mode in ["message", "bytes"] {
        let echo = start(&["echo-server", "--mode", mode]);
        let e = echo.addr.to_string();
        let out = run_ok(&["echotest", "-j2", "-a4", "-c2000", "-i1", "--no-progress", &e], Duration::from_secs(30));
        assert!(out.contains("result=ok"), "{mode}: {out}");
    }
}

#[test]
fn demo_prints_rates_for_both_servers() {
    let out = run_ok(&["demo", "-i", "1", "-d", "0.3", "--settings", "1:1,1:8"], Duration::from_secs(30));
    for server in ["connmux", "thread-per-conn"] {
        let rows: Vec<&str> = out.lines().filter(|l| l.split_whitespace().nth(2) == Some(server)).collect();
        assert_eq!(rows.len(), 2, "{server}: {out}");
        for r in rows {
            let rate: f64 = r.split_whitespace().nth(3).unwrap().parse().unwrap();
            assert!(rate > 0.0, "{r}");
        }
    }
    assert!(out.contains("calls answered"), "{out}");
}

/// `connmux stat` on a server's statistics socket.
fn stat(sock: &std::path::Path) -> String {
    let out = Command::new(BIN).arg("stat").arg(sock).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .parse()
        .unwrap()
}

#[test]
fn bad_clients_are_disconnected_and_counted_while_a_good_client_sees_no_error() {
    let sock = std::env::temp_dir().join(format!("connmux-test-{}.sock", std::process::id()));
    let mut child = Command::new(BIN)
        .args(["rpc-server", "-l", "127.0.0.1:0", "--duration", "60", "--assembly-timeout-ms", "300"])
        .arg("--stats-socket")
        .arg(&sock)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr: SocketAddr = line.split_whitespace().find_map(|w| w.parse().ok()).unwrap();
    let s = Server { child, addr };

    // A good client keeps calling, pipelined, the whole time.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let good = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut xid = 0u32;
            let end = Instant::now() + Duration::from_secs(30);
            while !stop.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < end {
                let batch: Vec<u8> = (xid..xid + 8).flat_map(null_call).collect();
                c.write_all(&batch).unwrap();
                for _ in 0..8 {
                    let (x, rs, acc) = read_reply(&mut c);
                    assert!((xid..xid + 8).contains(&x) && rs == 0 && acc == 0, "good client got {x} {rs} {acc}");
                }
                xid += 8;
            }
            xid
        })
    };
    let disconnected = |c: &mut TcpStream| {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 64];
        matches!(c.read(&mut b), Ok(0) | Err(_))
    };
    // Garbage: a record mark then bytes that are not an RPC call.
    let mut garbage = TcpStream::connect(s.addr).unwrap();
    garbage.write_all(&[0x80, 0, 0, 8, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4]).unwrap();
    assert!(disconnected(&mut garbage), "garbage");
    // An oversize record mark (1 GiB, over the 1 MiB --max-msg default).
    let mut oversize = TcpStream::connect(s.addr).unwrap();
    oversize.write_all(&(0x8000_0000u32 | (1 << 30)).to_be_bytes()).unwrap();
    assert!(disconnected(&mut oversize), "oversize");
    // A call split and abandoned: half of it, then nothing (assembly timeout).
    let mut abandoned = TcpStream::connect(s.addr).unwrap();
    abandoned.write_all(&null_call(9)[..20]).unwrap();
    assert!(disconnected(&mut abandoned), "abandoned");

    stop.store(true, std::sync::atomic::Ordering::Release);
    let calls = good.join().unwrap();
    assert!(calls > 0);
    let text = stat(&sock);
    assert_eq!(counter(&text, "rx_msg_too_big"), 1, "{text}");
    assert_eq!(counter(&text, "rx_msg_timeouts"), 1, "{text}");
    assert_eq!(counter(&text, "rpc_bad_calls"), 1, "{text}");
    assert!(counter(&text, "closed") >= 3, "{text}");
    assert!(counter(&text, "accepted") >= 4, "{text}");
    assert!(counter(&text, "tx_msgs") >= calls as u64, "{text}");
    // A NULL call is never heavy nor busy, 8 in flight or not (the worker's
    // check reads CPU time, not the clock).
    assert_eq!(counter(&text, "lane_moves"), 0, "{text}");
    drop(s);
    // (Killed: the server had no chance to remove its socket.)
    let _ = std::fs::remove_file(&sock);
}

/// `rpcinfo -t 127.0.0.1 PROG VERS` asks rpcbind for the port: run rpcbind,
/// the server (registering with `--rpcbind`) and rpcinfo in a network and
/// mount namespace of their own, so nothing outside sees them.
#[test]
fn rpcinfo_finds_both_servers_through_rpcbind() {
    let script = format!(
        r#"set -eu
mount -t tmpfs tmpfs /run
ip link set lo up
/usr/sbin/rpcbind -f & RB=$!
trap 'kill $RB 2>/dev/null || true' EXIT
for i in $(seq 100); do rpcinfo -p 127.0.0.1 >/dev/null 2>&1 && break; sleep 0.05; done
for engine in connmux thread; do
  out=$(mktemp)
  {BIN} rpc-server --engine $engine -l 127.0.0.1:0 --rpcbind --register 100005:1-3 --duration 1.5 --no-stats-socket >$out & SV=$!
  for i in $(seq 100); do grep -q registered $out && break; sleep 0.05; done
  echo "== $engine"
  rpcinfo -t 127.0.0.1 100003 3
  rpcinfo -t 127.0.0.1 100003 4
  rpcinfo -t 127.0.0.1 100005 2
  rpcinfo -p 127.0.0.1 | grep -c ' tcp ' | sed 's/^/tcp registrations: /'
  rpcinfo -p 127.0.0.1 | grep -c ' udp ' | sed 's/^/udp registrations: /'
  if [ $engine = connmux ]; then rpcinfo -u 127.0.0.1 100003 3 | sed 's/^/udp: /'; fi
  wait $SV
  rpcinfo -p 127.0.0.1 | grep -q 100003 && echo "still registered after exit" || echo "withdrawn after exit"
done
"#,
        BIN = BIN
    );
    let out = Command::new("unshare").args(["--net", "--mount", "bash", "-c", &script]).output().expect("unshare");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for engine in ["connmux", "thread"] {
        let part = text.split(&format!("== {engine}")).nth(1).unwrap_or_else(|| panic!("{text}"));
        for pv in ["100003 version 3", "100003 version 4", "100005 version 2"] {
            assert!(part.contains(&format!("program {pv} ready and waiting")), "{engine} {pv}: {text}");
        }
        // rpcbind's own three TCP versions, plus NFS v3, v4 and 100005 v1-3.
        assert!(part.contains("tcp registrations: 8"), "{engine}: {text}");
        // Over UDP too where the server answers there (connmux: by default;
        // the thread engine: TCP only): rpcbind's own three beside them.
        let udp = if engine == "connmux" { 8 } else { 3 };
        assert!(part.contains(&format!("udp registrations: {udp}")), "{engine}: {text}");
        if engine == "connmux" {
            assert!(part.contains("udp: program 100003 version 3 ready and waiting"), "{text}");
        }
        assert!(part.contains("withdrawn after exit"), "{engine}: {text}");
    }
}
