//! `--tls` as a user runs it: `connmux rpc-server --tls` and `echo-server
//! --tls` (TLS psocks in the connmux runtime) driven by TLS peers we did not
//! write — Python's `ssl` module and `openssl s_client`, both OpenSSL — and
//! by our own load generators with `--tls`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_connmux");

/// A server subprocess, killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    /// Its output after the "listening" line.
    lines: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `connmux <args> -l 127.0.0.1:0`; the address is on its first line,
/// then `extra` more lines are read (the TLS note).
fn start(args: &[&str], extra: usize) -> Server {
    let mut child = Command::new(BIN)
        .args(args)
        .args(["-l", "127.0.0.1:0", "--duration", "60", "--no-stats-socket"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn connmux");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let mut lines = Vec::new();
    for _ in 0..extra {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        lines.push(l);
    }
    Server { child, addr, lines }
}

/// A fresh directory for this test's files.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("connmux-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Run a command to completion within `limit`, feeding `input`; (status ok, stdout, stderr).
fn run(cmd: &mut Command, input: &[u8], limit: Duration) -> (bool, Vec<u8>, String) {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = String::new();
        let _ = stderr.read_to_string(&mut v);
        v
    });
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    writer.join().unwrap();
    let (o, e) = (out.join().unwrap(), err.join().unwrap());
    assert!(status.is_some(), "{cmd:?} did not end within {limit:?}; stderr: {e}");
    (status.unwrap().success(), o, e)
}

fn path_of(server: &Server, flag: &str) -> PathBuf {
    let line =
        server.lines.iter().find(|l| l.contains(flag)).unwrap_or_else(|| panic!("no {flag} in {:?}", server.lines));
    PathBuf::from(line.split(flag).nth(1).unwrap().split_whitespace().next().unwrap())
}

/// Python's ssl client (OpenSSL) makes ONC RPC NULL calls (ksf.md §2.4: the
/// 44-byte NFSv3 call) to `rpc-server --tls` with a generated certificate,
/// trusting the CA file the server wrote, with hostname checking: several
/// calls in one TLS record, one call cut over two records, replies checked.
#[test]
fn python_ssl_client_makes_null_calls_to_rpc_server_tls() {
    let dir = scratch("py");
    let ca = dir.join("ca.pem");
    let s = start(&["rpc-server", "--tls", "--tls-ca-out", ca.to_str().unwrap()], 1);
    assert_eq!(path_of(&s, "--tls-ca "), ca);
    let script = r#"
import socket, ssl, struct, sys, time
port, cafile = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context(cafile=cafile)
raw = socket.create_connection(("127.0.0.1", port), timeout=10)
s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
def call(xid):
    body = struct.pack(">10I", xid, 0, 2, 100003, 3, 0, 0, 0, 0, 0)
    return struct.pack(">I", 0x80000000 | len(body)) + body
def reply():
    buf = b""
    while len(buf) < 4:
        buf += s.recv(4 - len(buf))
    n = struct.unpack(">I", buf)[0] & 0x7fffffff
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk: raise SystemExit("closed")
        body += chunk
    w = struct.unpack(">%dI" % (n // 4), body)
    assert w[1] == 1 and w[2] == 0 and w[5] == 0, w   # REPLY, MSG_ACCEPTED, SUCCESS
    return w[0]
s.sendall(b"".join(call(x) for x in range(1, 11)))    # ten calls in one record
got = [reply() for _ in range(10)]
c = call(11)
s.sendall(c[:10]); time.sleep(0.05); s.sendall(c[10:])   # one call over two records
got.append(reply())
print(s.version(), " ".join(map(str, sorted(got))))
s.close()
"#;
    let (ok, out, err) = run(
        Command::new("python3").args(["-c", script, &s.addr.port().to_string(), ca.to_str().unwrap()]),
        b"",
        Duration::from_secs(30),
    );
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "python3 ssl client failed: {out}\n{err}");
    assert!(out.starts_with("TLSv1.3 "), "{out}");
    assert!(out.contains(&(1..=11).map(|x| x.to_string()).collect::<Vec<_>>().join(" ")), "{out}");
}

/// A certificate and key made by `openssl req` (PEM files), loaded by
/// `echo-server --tls --tls-cert --tls-key`; `openssl s_client` checks it
/// against the same file and echoes framed messages through the server.
#[test]
fn openssl_s_client_through_echo_server_tls_with_pem_files() {
    let dir = scratch("openssl");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let (ok, _, err) = run(
        Command::new("openssl").args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ]),
        b"",
        Duration::from_secs(30),
    );
    assert!(ok, "openssl req (scripts/setup.sh installs openssl): {err}");
    let s = start(
        &[
            "echo-server",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls",
            "--parser",
            "l4",
        ],
        1,
    );
    // Three L4 messages; s_client sends what it reads on stdin as it comes.
    let mut input = Vec::new();
    for body in [&b"hello over openssl"[..], &[7u8; 3000][..], b"last"] {
        input.extend_from_slice(&(body.len() as u32).to_be_bytes());
        input.extend_from_slice(body);
    }
    let want = input.clone();
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &s.addr.to_string(), "-CAfile", cert.to_str().unwrap()])
        .args(["-verify_return_error", "-verify_hostname", "localhost", "-quiet", "-no_ign_eof", "-nocommands"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.len() < want.len() {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        got
    });
    stdin.write_all(&input).unwrap();
    stdin.flush().unwrap();
    // The echo comes back within the wait, or the reader ends with less.
    let end = Instant::now() + Duration::from_secs(20);
    while !reader.is_finished() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got, input, "echo through s_client; its stderr: {}", String::from_utf8_lossy(&out.stderr));
}

fn run_connmux(args: &[&str], limit: Duration) -> String {
    let (ok, out, err) = run(Command::new(BIN).args(args), b"", limit);
    let out = String::from_utf8_lossy(&out).to_string();
    assert!(ok, "connmux {args:?} failed: {out}\n{err}");
    out
}

fn summary<'a>(out: &'a str, key: &str) -> &'a str {
    let line = out.lines().find(|l| l.starts_with("summary ")).unwrap_or_else(|| panic!("no summary in {out}"));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// Our load generators with --tls against our servers with --tls: rpctest
/// trusting the generated CA, echotest with --tls-insecure; every reply right.
#[test]
fn rpctest_and_echotest_with_tls() {
    let dir = scratch("load");
    let ca = dir.join("ca.pem");
    let rpc = start(&["rpc-server", "--tls", "--tls-ca-out", ca.to_str().unwrap(), "-w", "2", "--no-pin"], 1);
    let out = run_connmux(
        &[
            "rpctest",
            "--tls",
            "--tls-ca",
            ca.to_str().unwrap(),
            "-j2",
            "-a8",
            "-c2000",
            "-i2",
            "--no-progress",
            &rpc.addr.to_string(),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(summary(&out, "result"), "ok", "{out}");
    assert_eq!(summary(&out, "calls"), "8000", "{out}");

    let echo = start(&["echo-server", "--tls", "--tls-ca-out", dir.join("echo-ca.pem").to_str().unwrap()], 1);
    let out = run_connmux(
        &[
            "echotest",
            "--tls",
            "--tls-insecure",
            "-j2",
            "-a4",
            "-c1000",
            "-i2",
            "--no-progress",
            &echo.addr.to_string(),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(summary(&out, "result"), "ok", "{out}");

    // A plain client at a TLS server gets no reply: its bytes are not a
    // ClientHello, so the server fails the handshake and drops it.
    let (ok, _, _) = run(
        Command::new(BIN).args([
            "rpctest",
            "-j1",
            "-a1",
            "-c10",
            "-i1",
            "--io-timeout",
            "5",
            "--no-progress",
            &rpc.addr.to_string(),
        ]),
        b"",
        Duration::from_secs(60),
    );
    assert!(!ok, "a plain rpctest must fail against a TLS server");
    // And a TLS client that trusts another CA refuses the server.
    let (ok, _, err) = run(
        Command::new(BIN).args([
            "rpctest",
            "--tls",
            "--tls-ca",
            dir.join("echo-ca.pem").to_str().unwrap(),
            "-j1",
            "-a1",
            "-c10",
            "-i1",
            "--no-progress",
            &rpc.addr.to_string(),
        ]),
        b"",
        Duration::from_secs(60),
    );
    assert!(!ok, "a client that does not trust the server's CA must fail");
    assert!(err.contains("certificate") || err.contains("UnknownIssuer"), "{err}");
}

/// `openssl <args>` (scripts/setup.sh installs it), which must succeed.
fn openssl(args: &[&str]) {
    let (ok, _, err) = run(Command::new("openssl").args(args), b"", Duration::from_secs(30));
    assert!(ok, "openssl {args:?}: {err}");
}

/// Mutual TLS as a user sets it up with openssl: a client CA, a client
/// certificate it signed, and a stranger's self-signed one.
/// `rpc-server --tls --tls-client-ca` answers rpctest presenting the client
/// certificate (`--tls-client-cert/--tls-client-key`); rpctest without one
/// and with the stranger's fails, and `openssl s_client` without one is
/// told why (TLS 1.3's "certificate required" alert). (The refusals'
/// counters are checked in `crates/connmux/tests/tls.rs`.)
#[test]
fn mutual_tls_with_client_certificates() {
    let dir = scratch("mtls");
    let f = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec[..],
            &["-keyout", &f("ca.key"), "-out", &f("client-ca.pem"), "-days", "2", "-subj", "/CN=client CA"],
            &[
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,digitalSignature",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    openssl(
        &[&["req", "-new"][..], &ec[..], &["-keyout", &f("c.key"), "-out", &f("c.csr"), "-subj", "/CN=alice"]].concat(),
    );
    openssl(&[
        "x509",
        "-req",
        "-in",
        &f("c.csr"),
        "-CA",
        &f("client-ca.pem"),
        "-CAkey",
        &f("ca.key"),
        "-CAcreateserial",
        "-out",
        &f("c.pem"),
        "-days",
        "2",
        "-extfile",
        &f("ext"),
    ]);
    openssl(
        &[
            &["req", "-x509"][..],
            &ec[..],
            &["-keyout", &f("s.key"), "-out", &f("s.pem"), "-days", "2", "-subj", "/CN=mallory"],
            &["-addext", "extendedKeyUsage=clientAuth"],
        ]
        .concat(),
    );

    let s = start(
        &[
            "rpc-server",
            "--tls",
            "--tls-ca-out",
            &f("server-ca.pem"),
            "--tls-client-ca",
            &f("client-ca.pem"),
            "-w",
            "1",
        ],
        1,
    );
    assert!(s.lines[0].contains("clients must present a certificate signed by"), "{:?}", s.lines);
    let (server_ca, addr) = (f("server-ca.pem"), s.addr.to_string());
    let rpctest = |extra: &[&str]| {
        let args = [
            &["rpctest", "--tls", "--tls-ca", &server_ca][..],
            extra,
            &["-j1", "-a4", "-c500", "-i1", "--io-timeout", "5", "--no-progress", &addr],
        ]
        .concat();
        run(Command::new(BIN).args(&args), b"", Duration::from_secs(60))
    };
    let (ok, out, err) = rpctest(&["--tls-client-cert", &f("c.pem"), "--tls-client-key", &f("c.key")]);
    let out = String::from_utf8_lossy(&out).to_string();
    assert!(ok, "rpctest with the client certificate: {out}\n{err}");
    assert_eq!(summary(&out, "calls"), "500", "{out}");
    let (ok, _, _) = rpctest(&[]);
    assert!(!ok, "rpctest without a client certificate must be refused");
    let (ok, _, _) = rpctest(&["--tls-client-cert", &f("s.pem"), "--tls-client-key", &f("s.key")]);
    assert!(!ok, "rpctest with a certificate of another CA must be refused");
    // A peer we did not write hears why.
    let (_, _, err) = run(
        Command::new("openssl")
            .args(["s_client", "-connect", &s.addr.to_string(), "-CAfile", &f("server-ca.pem")])
            .args(["-verify_return_error", "-quiet", "-ign_eof", "-nocommands"]),
        &[0u8; 48],
        Duration::from_secs(20),
    );
    assert!(err.contains("certificate required"), "openssl s_client without a certificate: {err}");

    // Asked for without --tls: a clear error, not a plain server.
    let (ok, _, err) = run(
        Command::new(BIN).args([
            "rpc-server",
            "--tls-client-ca",
            &f("client-ca.pem"),
            "-l",
            "127.0.0.1:0",
            "--duration",
            "5",
            "--no-stats-socket",
        ]),
        b"",
        Duration::from_secs(20),
    );
    assert!(!ok && err.contains("--tls-client-ca") && err.contains("--tls"), "{err}");
}

/// `connmux bench tls --quick` prints its table: both servers' rates, median
/// RTTs and the ratios, for each setting.
#[test]
fn bench_tls_quick_prints_plain_and_tls_figures() {
    let out = run_connmux(&["bench", "tls", "--quick"], Duration::from_secs(60));
    assert!(
        out.lines().any(|l| l.starts_with("setting") && l.contains("TLS RPC/s") && l.contains("TLS/plain")),
        "{out}"
    );
    for setting in ["-j1 -a1", "-j1 -a32"] {
        let row = out.lines().find(|l| l.starts_with(setting)).unwrap_or_else(|| panic!("no {setting} row in\n{out}"));
        let cols: Vec<&str> = row[setting.len()..].split_whitespace().collect();
        let plain: f64 = cols[0].parse().unwrap();
        let tls: f64 = cols[1].parse().unwrap();
        assert!(plain > 100.0 && tls > 100.0, "{row}");
        assert!(cols[2].ends_with('x') && cols[5].ends_with('x'), "{row}");
    }
}
