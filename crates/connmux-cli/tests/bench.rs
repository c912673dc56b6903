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

/// Nothing outside connmux runs by default: the external ceiling server
/// (and ganesha) only with `--yardstick DIR`, and naming it without one is
/// an error, not a silent skip.
#[test]
fn bench_rpc_runs_only_its_own_servers_unless_given_a_yardstick() {
    let out = Command::new(BIN).args(["bench", "rpc", "--quick"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("yardstick") && !text.contains("ganesha") && !text.contains("vs_yard"), "{text}");
    for server in ["connmux", "raw", "thread"] {
        assert!(
            text.lines().any(|l| l.starts_with("cpu0") && l.split_whitespace().nth(3) == Some(server)),
            "no {server} row in\n{text}"
        );
    }
    assert!(text.contains("x raw RPC/s"), "the targets against the raw loop: {text}");
    let out = Command::new(BIN).args(["bench", "rpc", "--quick", "--servers", "connmux,yardstick"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--yardstick DIR"));
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

/// One message of `bench uneven` ("l4" framing, 16 bytes): kind 1 is heavy.
fn uneven_msg(kind: u8, tag: u32) -> Vec<u8> {
    let mut m = 12u32.to_be_bytes().to_vec();
    m.extend_from_slice(&[kind, 0, 0, 0]);
    m.extend_from_slice(&tag.to_be_bytes());
    m.extend_from_slice(&[0; 4]);
    m
}

/// `bench uneven-server --engine engine` on CPU 0 for at most 30 s, with
/// `extra` arguments.
fn uneven_server(engine: &str, extra: &[&str]) -> Server {
    spawn_server(
        Command::new(BIN)
            .args(["bench", "uneven-server", "-l", "127.0.0.1:0", "--engine", engine, "--cpus", "0"])
            .args(extra)
            .args(["--duration", "30"]),
    )
}

#[test]
fn every_uneven_server_echoes_whole_messages_split_anywhere() {
    let uring = connmux_sys::uring::supported().then_some("uring");
    for engine in ["connmux", "thread", "epoll"].into_iter().chain(uring) {
        let s = uneven_server(engine, &["--heavy-us", "50"]);
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let wire: Vec<u8> = (0..40u32).flat_map(|t| uneven_msg((t % 5 == 0) as u8, t)).collect();
        // Cut so that messages straddle writes (7-byte pieces, then the rest).
        let (head, tail) = wire.split_at(7 * 30);
        for piece in head.chunks(7) {
            c.write_all(piece).unwrap();
            c.flush().unwrap();
        }
        c.write_all(tail).unwrap();
        let mut got = vec![0u8; wire.len()];
        c.read_exact(&mut got).unwrap_or_else(|e| panic!("{engine}: {e}"));
        assert_eq!(got, wire, "{engine}: every message echoed, in order");
    }
}

#[test]
fn hand_written_loops_spend_their_read_work_before_answering() {
    let uring = connmux_sys::uring::supported().then_some("uring");
    for engine in std::iter::once("epoll").chain(uring) {
        let s = uneven_server(engine, &["--read-work-ns", "3000000"]);
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for t in 0..3u32 {
            // A light message: only the read's work stands between it and
            // its echo, so the echo never comes sooner than that.
            let m = uneven_msg(0, t);
            let sent = Instant::now();
            c.write_all(&m).unwrap();
            let mut got = vec![0u8; m.len()];
            c.read_exact(&mut got).unwrap_or_else(|e| panic!("{engine}: {e}"));
            let took = sent.elapsed();
            assert_eq!(got, m, "{engine}: echoed");
            assert!(took >= Duration::from_millis(3), "{engine}: echo after {took:?}, before the read's 3 ms of work");
        }
    }
}

#[test]
fn read_work_is_refused_where_it_would_not_apply() {
    for engine in ["connmux", "thread"] {
        let out = Command::new(BIN)
            .args(["bench", "uneven-server", "-l", "127.0.0.1:0", "--engine", engine])
            .args(["--read-work-ns", "100", "--duration", "5"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{engine}: accepted --read-work-ns");
        assert!(text.contains("--read-work-ns"), "{engine}: {text}");
    }
}

#[test]
fn bench_uneven_quick_prints_every_variant() {
    let out = Command::new(BIN)
        .args(["bench", "uneven", "--quick", "--heavy-conns", "1", "--light-conns", "2", "-a", "4"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    // (The io_uring loop runs where io_uring works.)
    let uring = connmux_sys::uring::supported();
    let rows: Vec<&str> = ["affinity", "rr", "thread", "epoll"].into_iter().chain(uring.then_some("uring")).collect();
    for &row in &rows {
        let line = text.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row} row in\n{text}"));
        let total: f64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        assert!(total > 0.0, "{row} answered nothing:\n{text}");
    }
    assert!(text.contains("against the hand-written epoll loop"), "{text}");
    assert_eq!(text.contains("against the hand-written io_uring loop"), uring, "{text}");
    // The load's threads take CPUs 0, 1 in turn: light connection 2's
    // client shares CPU 0 with the heavy one's, light connection 1's is
    // on CPU 1; each server's light p99 is given for both.
    let tail = text.split("by where its client runs").nth(1).unwrap_or_else(|| panic!("no tail section in\n{text}"));
    for &row in &rows {
        let line = tail.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row} tail in\n{text}"));
        let us: Vec<f64> = line.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        assert!(us.len() == 2 && us.iter().all(|&v| v > 0.0), "{row}: {line}\n{text}");
    }
}

/// `uneven-load --per-conn`: one entry per connection, in order (the heavy
/// ones first), with the CPU its thread was pinned to, and quantiles that
/// grow; its calls add up to the report's rates.
#[test]
fn uneven_load_per_conn_reports_each_connection() {
    let s = uneven_server("connmux", &["--heavy-us", "20"]);
    let out = Command::new(BIN)
        .args(["bench", "uneven-load", "--heavy-conns", "1", "--light-conns", "2", "-a", "2", "-d", "0.3"])
        .args(["--cpus", "0", "--per-conn"])
        .arg(s.addr.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    let conns = doc["conns"].as_array().unwrap_or_else(|| panic!("no conns in {text}"));
    assert_eq!(conns.len(), 3, "{text}");
    let kinds: Vec<bool> = conns.iter().map(|c| c["heavy"].as_bool().unwrap()).collect();
    assert_eq!(kinds, [true, false, false], "{text}");
    let mut light_calls = 0;
    for c in conns {
        assert_eq!(c["cpu"], 0, "{text}");
        assert!(c["calls"].as_u64().unwrap() > 0, "{text}");
        let q = |k: &str| c[k].as_f64().unwrap();
        assert!(0.0 < q("p50_us") && q("p50_us") <= q("p99_us") && q("p99_us") <= q("p999_us"), "{text}");
        if c["heavy"] == false {
            light_calls += c["calls"].as_u64().unwrap();
        }
    }
    let rate = doc["report"]["light_rate"].as_f64().unwrap();
    // The rate is the calls over the longest connection's time (about 0.3 s).
    assert!(rate > 0.0 && (light_calls as f64) < rate, "{light_calls} calls at {rate}/s: {text}");
    // Without the flag, no per-connection figures.
    let plain = Command::new(BIN)
        .args(["bench", "uneven-load", "--heavy-conns", "0", "--light-conns", "1", "-d", "0.2"])
        .arg(s.addr.to_string())
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(doc["conns"].is_null() && doc["ok"] == true, "{doc}");
}

/// `bench kcm`, briefly: a row per shape and server, each with a rate, the
/// ratio to thread per connection, and for two application threads the
/// ratio to one.
#[test]
fn bench_kcm_quick_prints_every_shape_and_server() {
    let out = Command::new(BIN)
        .args(["bench", "kcm", "--quick", "--seconds", "0.2", "--shapes", "8x16,8x1,2x64"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for shape in ["8x16", "8x1", "2x64"] {
        for server in ["thread", "kcm-1", "kcm-2", "kcm-batch-1", "kcm-batch-2", "core-1", "core-2"] {
            let row = text
                .lines()
                .find(|l| l.split_whitespace().take(2).eq([shape, server]))
                .unwrap_or_else(|| panic!("no {shape} {server} row in\n{text}"));
            let cols: Vec<&str> = row.split_whitespace().collect();
            let rate: f64 = cols[2].parse().unwrap();
            assert!(rate > 0.0, "{row}");
            assert!(cols[3].ends_with('x'), "the ratio to thread per connection: {row}");
            assert_eq!(cols[4].ends_with('x'), server.ends_with("-2"), "the ratio to one thread: {row}");
        }
    }
}

/// `bench kcm-server --engine kcm`: the echoes of messages split anywhere
/// come back whole, each once, from application threads on cloned sockets
/// (in any order: two threads answer one connection); and from the threads
/// that drive a core of their own (`--engine core`).
#[test]
fn kcm_server_echoes_whole_messages_from_application_threads() {
    for extra in [
        &["--threads", "2"][..],
        &["--threads", "2", "--batch"][..],
        &["--engine", "thread"][..],
        &["--engine", "core", "--threads", "2"][..],
    ] {
        let s = spawn_server(
            Command::new(BIN)
                .args(["bench", "kcm-server", "-l", "127.0.0.1:0", "--cpus", "0", "--duration", "30"])
                .args(extra),
        );
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let msg = |t: u32| [20u32.to_be_bytes(), t.to_be_bytes(), [t as u8; 4], [1; 4], [2; 4], [3; 4]].concat();
        let wire: Vec<u8> = (0..50u32).flat_map(msg).collect();
        let (head, tail) = wire.split_at(7 * 40);
        for piece in head.chunks(7) {
            c.write_all(piece).unwrap();
        }
        c.write_all(tail).unwrap();
        let mut got = vec![0u8; wire.len()];
        c.read_exact(&mut got).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        let mut echoes: Vec<Vec<u8>> = got.chunks(24).map(<[u8]>::to_vec).collect();
        echoes.sort_by_key(|m| u32::from_be_bytes(m[4..8].try_into().unwrap()));
        let sent: Vec<Vec<u8>> = wire.chunks(24).map(<[u8]>::to_vec).collect();
        assert_eq!(echoes, sent, "{extra:?}: every message echoed whole, once");
    }
}

/// `bench hostile`'s attacks that run on their own: a slow reader, and idle
/// connections filling a capped server; each with the good clients' rate
/// beside it and its ratio to their rate alone.
#[test]
fn bench_hostile_runs_the_slow_reader_and_the_idle_cap_on_their_own() {
    let out = Command::new(BIN)
        .args(["bench", "hostile", "--seconds", "2", "--baseline-seconds", "0.5", "--json"])
        .args(["--attacks", "slow-reader,idle-cap", "--idle-conns", "200", "--slow-messages", "20000"])
        .args(["--", "--no-pin"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    for attack in ["slow-reader", "idle-cap"] {
        let v = &doc["solo"][attack];
        assert!(v["good_beside"]["calls"].as_u64().unwrap() > 0, "{attack}: {doc}");
        assert!(v["good_alone"]["calls"].as_u64().unwrap() > 0, "{attack}: {doc}");
        assert!(v["ratio"].as_f64().unwrap() > 0.0, "{attack}: {doc}");
    }
    let slow = &doc["solo"]["slow-reader"]["seen"];
    assert!(slow["rounds"].as_u64().unwrap() >= 1 && slow["replies_read"].as_u64().unwrap() > 0, "{doc}");
    let cap = &doc["solo"]["idle-cap"];
    assert_eq!(cap["max_conns"], 200, "{doc}");
    assert!(cap["seen"]["held_at_start"].as_u64().unwrap() > 0, "{doc}");
    assert!(cap["newcomers"]["tried"].as_u64().unwrap() > 0, "{doc}");
    assert!(cap["server_counters"]["evicted"].is_u64(), "{doc}");
    // Nothing ran together: no such figures.
    assert!(doc["attacks"].as_object().unwrap().is_empty(), "{doc}");
}
