//! `connmux bench hostile` run briefly, as CI runs it: the run completes, its
//! output parses, and on the epoll driver the good clients are answered
//! beside the attacks. What the attacks cost (replies lost, RSS, the good
//! clients' rate) is printed by the bench and not judged here: the fixes for
//! several of them are separate work.

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_connmux");

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
