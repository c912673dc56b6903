//! The C examples built with the system's C compiler against libconnmux and
//! run over loopback: examples/c/ninep_server.c against 9P clients,
//! examples/c/rpc_null_service.c against ONC RPC calls.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const TVERSION: u8 = 100;
const RVERSION: u8 = 101;
const TATTACH: u8 = 104;
const RATTACH: u8 = 105;
const RERROR: u8 = 107;
const TFLUSH: u8 = 108;
const RFLUSH: u8 = 109;
const TWALK: u8 = 110;
const RWALK: u8 = 111;
const TCLUNK: u8 = 120;
const RCLUNK: u8 = 121;
const TSTAT: u8 = 124;

fn example_source() -> PathBuf {
    common::repo_root().join("examples/c/ninep_server.c")
}

/// A 9P message: size[4] type[1] tag[2] body.
fn msg(ty: u8, tag: u16, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(7 + body.len());
    m.extend_from_slice(&((7 + body.len()) as u32).to_le_bytes());
    m.push(ty);
    m.extend_from_slice(&tag.to_le_bytes());
    m.extend_from_slice(body);
    m
}

fn s9(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u16).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// Request `i` of a connection, and the reply type it must get.
fn request(i: usize, tag: u16) -> (Vec<u8>, u8) {
    match i % 7 {
        0 => {
            let mut b = 65536u32.to_le_bytes().to_vec();
            b.extend(s9("9P2000"));
            (msg(TVERSION, tag, &b), RVERSION)
        }
        1 => {
            let mut b = [1u32.to_le_bytes(), u32::MAX.to_le_bytes()].concat();
            b.extend(s9("user"));
            b.extend(s9(""));
            (msg(TATTACH, tag, &b), RATTACH)
        }
        2 => {
            let mut b = [1u32.to_le_bytes(), 2u32.to_le_bytes()].concat();
            b.extend(0u16.to_le_bytes());
            (msg(TWALK, tag, &b), RWALK)
        }
        3 => {
            let mut b = [1u32.to_le_bytes(), 2u32.to_le_bytes()].concat();
            b.extend(1u16.to_le_bytes());
            b.extend(s9("missing"));
            (msg(TWALK, tag, &b), RERROR)
        }
        4 => (msg(TCLUNK, tag, &2u32.to_le_bytes()), RCLUNK),
        5 => (msg(TFLUSH, tag, &7u16.to_le_bytes()), RFLUSH),
        _ => (msg(TSTAT, tag, &1u32.to_le_bytes()), RERROR),
    }
}

/// Read one 9P message (size, type, tag, body).
fn read_msg(r: &mut impl Read) -> std::io::Result<(u8, u16, Vec<u8>)> {
    let mut hdr = [0u8; 7];
    r.read_exact(&mut hdr)?;
    let size = u32::from_le_bytes(hdr[..4].try_into().unwrap()) as usize;
    assert!((7..=8192).contains(&size), "reply size {size}");
    let mut body = vec![0u8; size - 7];
    r.read_exact(&mut body)?;
    Ok((hdr[4], u16::from_le_bytes([hdr[5], hdr[6]]), body))
}

/// Check a reply's body for its type.
fn check_body(ty: u8, body: &[u8]) {
    match ty {
        RVERSION => {
            assert_eq!(&body[..4], &8192u32.to_le_bytes(), "msize capped at the server's 8192");
            assert_eq!(&body[4..], &s9("9P2000")[..]);
        }
        RATTACH => {
            assert_eq!(body.len(), 13);
            assert_eq!(body[0], 0x80, "root qid is a directory");
        }
        RWALK => assert_eq!(body, &0u16.to_le_bytes()),
        RERROR => {
            let n = u16::from_le_bytes([body[0], body[1]]) as usize;
            let ename = std::str::from_utf8(&body[2..2 + n]).unwrap();
            assert!(ename == "file not found" || ename == "operation not supported", "{ename}");
        }
        RCLUNK | RFLUSH => assert!(body.is_empty()),
        other => panic!("unexpected reply type {other}"),
    }
}

/// One client: `n` pipelined requests with distinct tags, then every reply
/// (matched by tag, any order). Returns the number of replies checked.
fn client(port: u16, n: usize, seed: usize) -> usize {
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut want = HashMap::new();
    let mut all = Vec::new();
    for i in 0..n {
        let tag = i as u16;
        let (m, reply) = request(i + seed, tag);
        want.insert(tag, reply);
        all.extend_from_slice(&m);
    }
    c.write_all(&all).expect("send requests");
    let mut r = BufReader::new(c);
    for _ in 0..n {
        let (ty, tag, body) = read_msg(&mut r).expect("a reply within the timeout");
        let expected = want.remove(&tag).unwrap_or_else(|| panic!("reply with unknown or repeated tag {tag}"));
        assert_eq!(ty, expected, "reply type for tag {tag}");
        check_body(ty, &body);
    }
    assert!(want.is_empty());
    n
}

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
    lines: mpsc::Receiver<String>,
}

impl Server {
    fn start(bin: &PathBuf, args: &[&str]) -> Server {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the example server");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = lines.recv_timeout(Duration::from_secs(30)).expect("the server's first line");
        let port = first.strip_prefix("port ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{first:?}"));
        Server { child, stdin, port, lines }
    }

    /// Close stdin (the stop signal) and collect the report lines.
    fn stop(mut self) -> (Vec<String>, std::process::ExitStatus) {
        drop(self.stdin.take());
        let mut report = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(30)) {
            report.push(l);
        }
        let status = common::wait_output(self.child, Duration::from_secs(30)).expect("server exit").status;
        (report, status)
    }
}

/// (sum of the per-worker request counts, workers reporting, the totals line's numbers).
fn parse_report(report: &[String]) -> (u64, usize, HashMap<String, u64>) {
    let mut sum = 0;
    let mut workers = 0;
    let mut totals = HashMap::new();
    for l in report {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["worker", _, "requests", n] => {
                sum += n.parse::<u64>().unwrap();
                workers += 1;
            }
            ["total", rest @ ..] => {
                for kv in rest.chunks(2) {
                    totals.insert(kv[0].to_string(), kv[1].parse().unwrap());
                }
            }
            _ => panic!("unexpected report line {l:?}"),
        }
    }
    (sum, workers, totals)
}

#[test]
fn ninep_server_answers_pipelined_clients_on_worker_threads() {
    let bin = common::compile("ninep_server", &[example_source()], common::Link::Shared);
    let server = Server::start(&bin, &["-w", "4", "-m", "2"]);
    let port = server.port;
    const CLIENTS: usize = 8;
    const PER_CLIENT: usize = 300;
    let handles: Vec<_> = (0..CLIENTS).map(|i| std::thread::spawn(move || client(port, PER_CLIENT, i))).collect();
    let answered: usize = handles.into_iter().map(|h| h.join().expect("client")).sum();
    assert_eq!(answered, CLIENTS * PER_CLIENT);
    let (report, status) = server.stop();
    assert!(status.success(), "server exit {status}, report {report:?}");
    let (sum, workers, totals) = parse_report(&report);
    assert_eq!(workers, 4, "{report:?}");
    assert_eq!(sum, answered as u64, "every request handled by one worker: {report:?}");
    assert_eq!(totals["rx_msgs"], answered as u64);
    assert_eq!(totals["tx_msgs"], answered as u64);
}

#[test]
fn ninep_server_resets_a_peer_that_breaks_framing_and_serves_the_rest() {
    let bin = common::compile("ninep_server_static", &[example_source()], common::Link::Static);
    let server = Server::start(&bin, &["-w", "2", "-m", "1"]);
    let port = server.port;
    assert_eq!(client(port, 20, 0), 20);
    // size 3 < 7: the 9p parser refuses the stream; the server resets the peer.
    let mut bad = TcpStream::connect(("127.0.0.1", port)).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    bad.write_all(&[3, 0, 0, 0, TVERSION, 0, 0]).unwrap();
    let mut buf = [0u8; 64];
    match bad.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the bad peer got {other:?} instead of a reset"),
    }
    // An oversized message (above the server's 8192-byte limit) too.
    let mut big = TcpStream::connect(("127.0.0.1", port)).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    big.write_all(&msg(TVERSION, 1, &[0u8; 9000])).unwrap_or(());
    assert!(matches!(big.read(&mut buf), Ok(0) | Err(_)), "oversized peer still served");
    assert_eq!(client(port, 50, 3), 50);
    let (report, status) = server.stop();
    assert!(status.success(), "server exit {status}");
    let (sum, _, totals) = parse_report(&report);
    assert_eq!(sum, 70);
    assert!(totals["failed"] >= 2, "{report:?}");
}

#[test]
fn ninep_server_with_a_bpf_parser_program() {
    let bin = common::compile("ninep_server_bpf", &[example_source()], common::Link::Shared);
    let obj = common::bpf_object("ninep");
    let server = Server::start(&bin, &["-w", "2", "-b", obj.to_str().unwrap()]);
    let port = server.port;
    let handles: Vec<_> = (0..3).map(|i| std::thread::spawn(move || client(port, 100, i))).collect();
    let answered: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let (report, status) = server.stop();
    assert!(status.success());
    assert_eq!(parse_report(&report).0, answered as u64);
}

/// An ONC RPC call of procedure `proc`, `xid`, AUTH_NONE, in one record
/// fragment (as `rpctest` sends it) or, `split`, in three (1, 38 and 1
/// bytes, as `rpctest -f` does).
fn rpc_call(xid: u32, proc_: u32, split: bool) -> Vec<u8> {
    let body: Vec<u8> = [xid, 0, 2, 100_003, 3, proc_, 0, 0, 0, 0].iter().flat_map(|w| w.to_be_bytes()).collect();
    let mark = |len: usize, last: bool| ((len as u32) | if last { 0x8000_0000 } else { 0 }).to_be_bytes();
    match split {
        false => [&mark(body.len(), true)[..], &body].concat(),
        true => [&mark(1, false)[..], &body[..1], &mark(38, false), &body[1..39], &mark(1, true), &body[39..]].concat(),
    }
}

/// The 28-byte reply to call `xid`: accepted, with `stat` (0 SUCCESS, 3 PROC_UNAVAIL).
fn rpc_reply(xid: u32, stat: u32) -> Vec<u8> {
    [0x8000_0018u32, xid, 1, 0, 0, 0, stat].iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// examples/c/rpc_null_service.c, served by the mux's workers through
/// `connmux_service_start`: 1,000 pipelined NULL calls answered in order,
/// another procedure PROC_UNAVAIL, a call in three fragments, and a reply
/// sent as a call resetting its connection only.
#[test]
fn rpc_null_service_answers_calls_on_the_workers() {
    let src = common::repo_root().join("examples/c/rpc_null_service.c");
    let bin = common::compile("rpc_null_service", &[src], common::Link::Shared);
    let srv = Server::start(&bin, &["-w", "2"]);
    let connect = || {
        let c = TcpStream::connect(("127.0.0.1", srv.port)).expect("connect");
        c.set_nodelay(true).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    };
    let mut c = connect();
    let calls: Vec<u8> = (0..1000).flat_map(|x| rpc_call(x, 0, false)).collect();
    c.write_all(&calls).unwrap();
    let mut got = vec![0u8; 28 * 1000];
    c.read_exact(&mut got).expect("1,000 replies");
    let want: Vec<u8> = (0..1000).flat_map(|x| rpc_reply(x, 0)).collect();
    assert!(got == want, "the replies to 1,000 NULL calls differ from 28-byte SUCCESS replies in order");
    for (xid, proc_, split, stat) in [(7_000, 5, false, 3), (7_001, 0, true, 0)] {
        c.write_all(&rpc_call(xid, proc_, split)).unwrap();
        let mut r = [0u8; 28];
        c.read_exact(&mut r).expect("a reply");
        assert_eq!(r.to_vec(), rpc_reply(xid, stat), "call {xid} (procedure {proc_}, split {split})");
    }
    // Not a call: that connection is reset, the other goes on.
    let mut bad = connect();
    bad.write_all(&rpc_reply(1, 0)).unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(bad.read(&mut b), Ok(0) | Err(_)), "a reply sent as a call was answered");
    c.write_all(&rpc_call(7_002, 0, false)).unwrap();
    let mut r = [0u8; 28];
    c.read_exact(&mut r).expect("a reply after the other connection's reset");
    assert_eq!(r.to_vec(), rpc_reply(7_002, 0));
    drop((c, bad));
    let (_, status) = srv.stop();
    assert!(status.success(), "rpc_null_service exited with {status}");
}
