//! `connmux bench hostile` run briefly, as CI runs it: the run completes, its
//! output parses, and on the epoll driver the good clients are answered
//! beside the attacks. What the attacks cost (replies lost, RSS, the good
//! clients' rate) is printed by the bench and not judged here: the fixes for
//! several of them are separate work.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod common;
use common::{spawn_server, BIN};

fn hostile(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(BIN)
        .args(["bench", "hostile", "--seconds", "3", "--baseline-seconds", "0.5"])
        .args(args)
        // Unpinned: the tests run side by side; servers all pinned to CPU 0
        // would measure each other.
        .args(["--", "--no-pin"])
        .output()
        .expect("run connmux bench hostile");
    (out.status, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn hostile_on_epoll_good_clients_are_answered() {
    let (st, stdout, stderr) = hostile(&["--driver", "epoll", "--json"]);
    assert!(st.success(), "{st:?}\n{stdout}\n{stderr}");
    let doc: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    eprintln!("{doc:#}");
    assert!(doc["good_alone"]["calls"].as_u64().unwrap() > 0, "{doc}");
    assert!(doc["good_under_attack"]["calls"].as_u64().unwrap() > 0, "{doc}");
    assert!(doc["newcomers"]["tried"].as_u64().unwrap() > 0, "{doc}");
    for attack in ["non-readers", "half-close", "partial", "slowloris", "garbage", "rst"] {
        assert!(doc["attacks"][attack].is_object(), "{attack}: {doc}");
    }
    // Every attack reached the server.
    assert!(doc["attacks"]["half-close"]["calls_sent"].as_u64().unwrap() > 0, "{doc}");
    assert!(doc["attacks"]["garbage"]["connections"].as_u64().unwrap() > 0, "{doc}");
    assert!(doc["server_counters"]["accepted"].as_u64().unwrap() > 0, "{doc}");
    // (Machine-wide, so not judged: the tests beside this one make their own.)
    assert!(doc["listen_drops"].is_u64(), "{doc}");
    assert!(doc["rss_kib"]["start"].as_u64().unwrap() > 0, "{doc}");
    assert!(doc["stop"]["sigterm_exited"].as_bool().is_some(), "{doc}");
}

#[test]
fn hostile_on_uring_prints_its_findings() {
    let (st, stdout, stderr) = hostile(&["--driver", "uring"]);
    assert!(st.success(), "{st:?}\n{stdout}\n{stderr}");
    eprintln!("{stdout}");
    for line in
        ["good clients", "newcomers", "non-readers", "half-close", "server RSS", "server counters", "server stop"]
    {
        assert!(stdout.lines().any(|l| l.starts_with(line)), "no {line:?} line:\n{stdout}");
    }
}

#[test]
fn hostile_refuses_an_unknown_attack() {
    let (st, _, stderr) = hostile(&["--attacks", "teardrop"]);
    assert_eq!(st.code(), Some(1));
    assert!(stderr.contains("unknown attack \"teardrop\""), "{stderr}");
}

#[test]
fn hostile_on_the_echo_server_prints_its_findings() {
    // Only the output is checked: on the echo server, non-readers starve the
    // good clients today (see the issue on hostile clients); the bench
    // prints that rather than failing on it.
    let (st, stdout, stderr) = hostile(&["--server", "echo", "--driver", "epoll", "--json"]);
    assert!(st.success(), "{st:?}\n{stdout}\n{stderr}");
    let doc: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    eprintln!("{doc:#}");
    assert_eq!(doc["server"], "echo-server");
    assert!(doc["good_alone"]["calls"].as_u64().unwrap() > 0, "{doc}");
    assert!(doc["good_under_attack"]["calls"].is_u64(), "{doc}");
    assert!(doc["attacks"]["half-close"]["calls_sent"].as_u64().unwrap() > 0, "{doc}");
    assert!(doc["server_counters"]["accepted"].as_u64().unwrap() > 0, "{doc}");
}

/// Send `sig` (`STOP`, `CONT`) to process `pid`.
fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().expect("run kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

/// A burst of connections while the server gets no CPU (its accept thread
/// stopped, as under a flood of connections that reset): the kernel
/// completes them into the listener's backlog, and each is answered once
/// the server runs again. With std's backlog of 128 the 130th connection's
/// SYN was dropped, which costs a client a second (its first retransmit).
#[test]
fn connections_made_while_the_server_gets_no_cpu_wait_in_its_backlog() {
    let mut s = spawn_server(Command::new(BIN).args(["rpc-server", "-l", "127.0.0.1:0", "--no-stats-socket"]));
    let pid = s.child.id();
    signal(pid, "STOP");
    let n = 600;
    // (Bounded: the first connection that times out ends the burst.)
    let conns: Vec<TcpStream> =
        (0..n).map_while(|_| TcpStream::connect_timeout(&s.addr, Duration::from_millis(500)).ok()).collect();
    signal(pid, "CONT");
    assert_eq!(conns.len(), n, "connections completed while the server was stopped");
    for (i, mut c) in conns.into_iter().enumerate() {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut call = Vec::new();
        connmux_oncrpc::encode_null_call(i as u32, 100_003, 3, 0, &mut call);
        c.write_all(&call).unwrap();
        let mut reply = [0u8; 28];
        c.read_exact(&mut reply).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        assert_eq!(connmux_oncrpc::check_reply(&reply[4..], Some(i as u32)), Ok(i as u32), "connection {i}");
    }
    let _ = s.child.kill();
}
