//! C-level checks of the library through its header (tests/c/unit.c, linked
//! to libconnmux.a): errno returns and messages, TRUNC/EOR/PEEK, SEQPACKET
//! parts, MORE, batch receive and send, addressed receive and send,
//! receive-disable, the pollable descriptor with poll(2), psock failure
//! events, statistics, a BPF parser from an ELF object, and TLS (mutual,
//! with certificates made here); tests/c/backend.c: the backend and
//! driver chosen in the configuration, on each that runs here; and
//! tests/c/service.c: a service answered by a C handler.

mod common;

use std::time::Duration;

#[test]
fn c_unit_checks_pass() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = common::compile("unit", &[manifest.join("tests/c/unit.c")], common::Link::Static);
    let obj = common::bpf_object("len_prefix");
    let tls = tls_files("unit");
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg(&obj).arg(&tls);
    let out = common::run(cmd, Duration::from_secs(120)).expect("run the C checks");
    let _ = std::fs::remove_dir_all(&tls);
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

/// tests/c/backend.c on this machine: `connmux_config.backend` and
/// `.driver`, `connmux_mux_backend`/`connmux_mux_driver`, the kernel
/// backend working or refused with -EOPNOTSUPP (and `CONNMUX_BACKEND_AUTO`
/// then choosing the userspace one), and the same messages on every backend
/// and driver that runs here. The VM run of the conformance script runs it
/// on the kernel's AF_KCM (`backend kernel`).
#[test]
fn c_backend_checks_pass() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = common::compile("backend", &[manifest.join("tests/c/backend.c")], common::Link::Static);
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("here");
    let out = common::run(cmd, Duration::from_secs(120)).expect("run the C backend checks");
    let passed = capi_summary_passed("backend", &out);
    // Config checks and three runs of the messages (auto, epoll, io_uring
    // where it works): ~110 here.
    assert!(passed >= 70, "only {passed} C backend checks ran:\n{}", String::from_utf8_lossy(&out.stdout));
}

/// The checks passed by a C program that ends with "CAPI SUMMARY passed=N
/// failed=M" (check.h's counts), after asserting that it exited 0 with none
/// failed (its output in the message otherwise).
fn capi_summary_passed(what: &str, out: &std::process::Output) -> usize {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = stdout.lines().last().unwrap_or("");
    assert!(
        out.status.success() && summary.starts_with("CAPI SUMMARY ") && summary.ends_with(" failed=0"),
        "C {what} checks failed ({}):\n{stdout}{stderr}",
        out.status
    );
    summary.split_whitespace().find_map(|w| w.strip_prefix("passed=")).and_then(|n| n.parse().ok()).expect("a count")
}

/// tests/c/service.c: `connmux_service_start` with a C handler over real
/// TCP: 4 connections of 2,000 pipelined echoes each (every reply once, in
/// order), no reply, a close, a bad answer (closed and counted), bad framing
/// from the peer, 64 heavy requests (all answered once, on the lanes), the
/// counters, a cap on connections, the calls it refuses; and the same
/// handler behind TLS (200 echoes from a TLS client mux; a plain client
/// reset).
#[test]
fn c_service_checks_pass() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = common::compile("service", &[manifest.join("tests/c/service.c")], common::Link::Static);
    let tls = tls_files("service");
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg(&tls);
    let out = common::run(cmd, Duration::from_secs(120)).expect("run the C service checks");
    let _ = std::fs::remove_dir_all(&tls);
    capi_summary_passed("service", &out);
}

/// A directory with what `test_tls` in unit.c and `tls_service` in service.c read: the server's CA
/// (`ca.pem`), a certificate for localhost it signed (`server.pem`,
/// `server.key`), a CA for clients (`clientca.pem`) and a client
/// certificate it signed (`client.pem`, `client.key`, and `client.der`, the
/// bytes the server must report).
fn tls_files(test: &str) -> std::path::PathBuf {
    // One folder a test: the tests of this file run at once.
    let dir = std::env::temp_dir().join(format!("connmux-capi-tls-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ca = |cn: &str| {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        rcgen::CertifiedIssuer::self_signed(p, rcgen::KeyPair::generate().unwrap()).unwrap()
    };
    let write = |name: &str, data: &[u8]| std::fs::write(dir.join(name), data).unwrap();
    let server_ca = ca("server CA");
    let key = rcgen::KeyPair::generate().unwrap();
    let cert =
        rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &server_ca).unwrap();
    write("ca.pem", server_ca.pem().as_bytes());
    write("server.pem", cert.pem().as_bytes());
    write("server.key", key.serialize_pem().as_bytes());
    let client_ca = ca("client CA");
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, "a C client");
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = p.signed_by(&key, &client_ca).unwrap();
    write("clientca.pem", client_ca.pem().as_bytes());
    write("client.pem", cert.pem().as_bytes());
    write("client.key", key.serialize_pem().as_bytes());
    write("client.der", cert.der());
    dir
}
