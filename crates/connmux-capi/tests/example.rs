//! The C example built with the system's C compiler against libconnmux and
//! run over loopback: examples/c/rpc_null_service.c against ONC RPC calls.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

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
/// `connmux_service_start`: 1,000 pipelined NULL calls each answered once,
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
    // Each call answered once, in any order: with two workers a pipelining
    // connection's calls spill over to the other worker's socket when its
    // own has a backlog (affinity until uneven), and ONC RPC matches
    // replies to calls by xid.
    let mut replies: Vec<&[u8]> = got.chunks(28).collect();
    replies.sort_by_key(|r| u32::from_be_bytes(r[4..8].try_into().unwrap()));
    let want: Vec<Vec<u8>> = (0..1000).map(|x| rpc_reply(x, 0)).collect();
    assert!(replies == want, "the replies to 1,000 NULL calls are not one 28-byte SUCCESS reply per call");
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
