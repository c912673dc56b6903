//! C-level checks of the library through its header (tests/c/unit.c, linked
//! to libconnmux.a): errno returns and messages, TRUNC/EOR/PEEK, SEQPACKET
//! parts, MORE, batch receive and send, addressed receive and send,
//! receive-disable, the pollable descriptor with poll(2), psock failure
//! events, statistics, and a BPF parser from an ELF object.

mod common;

use std::time::Duration;

#[test]
fn c_unit_checks_pass() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = common::compile("unit", &[manifest.join("tests/c/unit.c")], common::Link::Static);
    let obj = common::bpf_object("len_prefix");
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg(&obj);
    let out = common::run(cmd, Duration::from_secs(120)).expect("run the C checks");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = stdout.lines().last().unwrap_or("");
    assert!(
        out.status.success() && summary.ends_with(" passed, 0 failed"),
        "C checks failed ({}):\n{stdout}{stderr}",
        out.status
    );
    let passed: usize = summary.split(' ').next().and_then(|n| n.parse().ok()).expect("a count");
    assert!(passed >= 100, "only {passed} C checks ran:\n{stdout}");
}
