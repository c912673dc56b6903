//! `connmux bench`: the quick RPC matrix completes and prints its table, and
//! the raw-epoll server it measures does the same job as the rpc-server.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{spawn_server, Server, BIN};

fn raw_server() -> Server {
    spawn_server(Command::new(BIN).args([
        "bench",
        "raw-server",
        "-l",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--duration",
        "60",
    ]))
}

fn rpctest(addr: SocketAddr, extra: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["rpctest", "-j2", "-a8", "-c2000", "-i1", "--io-timeout", "5"])
        .args(extra)
        .arg(addr.to_string())
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn bench_rpc_quick_prints_a_table_with_every_server() {
    let t0 = Instant::now();
    let out = Command::new(BIN).args(["bench", "rpc", "--quick", "--servers", "connmux,raw,thread"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
    assert!(text.lines().any(|l| l.starts_with("place") && l.contains("RPC/s") && l.contains("p99_us")), "{text}");
    for setting in ["-j1 -a1", "-j1 -a32"] {
        for server in ["connmux", "raw", "thread"] {
            let row = text
                .lines()
                .find(|l| l.starts_with("cpu0") && l.contains(setting) && l.split_whitespace().nth(3) == Some(server))
                .unwrap_or_else(|| panic!("no row for {server} {setting} in\n{text}"));
            let rate: f64 = row.split_whitespace().nth(4).unwrap().parse().unwrap();
            assert!(rate > 100.0, "{row}");
        }
    }
}

#[test]
fn raw_server_answers_fragmented_and_auth_sys_calls() {
    let s = raw_server();
    for extra in [&[][..], &["-f"][..], &["--fragments", "40"][..], &["-A", "sys"][..]] {
        let (ok, text) = rpctest(s.addr, extra);
        assert!(ok, "rpctest {extra:?} against raw-server: {text}");
    }
}

#[test]
fn raw_server_answers_good_calls_then_closes_on_garbage_and_keeps_serving_others() {
    let s = raw_server();
    let mut bad = TcpStream::connect(s.addr).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut wire = Vec::new();
    connmux_oncrpc::encode_null_call(7, 100_003, 3, 1, &mut wire);
    // A record that is not a call (msg_type 1 = REPLY).
    wire.extend_from_slice(&[0x80, 0, 0, 8, 0, 0, 0, 9, 0, 0, 0, 1]);
    bad.write_all(&wire).unwrap();
    let mut got = Vec::new();
    // The good call's reply, then end of stream.
    let n = bad.read_to_end(&mut got).expect("server closes the connection");
    assert_eq!(n, 28, "one 28-byte reply, then close: {got:02x?}");
    assert_eq!(connmux_oncrpc::check_reply(&got[4..], Some(7)), Ok(7));
    let (ok, text) = rpctest(s.addr, &[]);
    assert!(ok, "a good client after the bad one: {text}");
}
