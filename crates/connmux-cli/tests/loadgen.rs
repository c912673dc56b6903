//! `connmux rpctest` and `connmux echotest` run as processes against small
//! servers started here on 127.0.0.1 ephemeral ports: a correct NULL-RPC
//! responder (connmux-oncrpc's `RecordReader` and `Registry`, one thread per
//! connection), deliberately broken ones, and echo servers. Every child
//! process and every server is bounded in time.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::{run_connmux as connmux, Run};
use connmux_oncrpc::{encode_reply, Outcome, RecordLimits, RecordReader, Registry, Reply};

/// Longest any server thread lives, whatever the test does.
const SERVER_LIFETIME: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    bytes: AtomicU64,
    conns: AtomicU64,
}

/// A listener on 127.0.0.1:0 whose accept loop gives each connection a thread
/// running `serve`; it stops when dropped (or after `SERVER_LIFETIME`).
struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl Server {
    fn start<F>(serve: F) -> Server
    where
        F: Fn(TcpStream, &Counters) + Send + Sync + 'static,
    {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let serve = Arc::new(serve);
        let (stop2, c2) = (stop.clone(), counters.clone());
        thread::spawn(move || {
            let t0 = Instant::now();
            while !stop2.load(Ordering::Relaxed) && t0.elapsed() < SERVER_LIFETIME {
                match l.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_nodelay(true).unwrap();
                        // Bounded: a forgotten connection ends its thread.
                        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                        c2.conns.fetch_add(1, Ordering::Relaxed);
                        let (serve, c3) = (serve.clone(), c2.clone());
                        thread::spawn(move || serve(s, &c3));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Server { addr, stop, counters }
    }

    fn target(&self) -> String {
        self.addr.to_string()
    }
    fn calls(&self) -> u64 {
        self.counters.calls.load(Ordering::Relaxed)
    }
    fn bytes(&self) -> u64 {
        self.counters.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum RpcMode {
    /// Registry::default(): NFS v3..v4 NULL → SUCCESS, others refused.
    Good,
    /// As Good, but the replies to each read's calls go out in reverse order.
    Reversed,
    /// SUCCESS, but with xid + 1.
    WrongXid,
    /// Every reply sent twice.
    Duplicate,
    /// An HTTP error line instead of a reply.
    Garbage,
    /// Close the connection at the first call.
    Close,
    /// Read and never answer.
    Silent,
}

fn rpc_server(mode: RpcMode) -> Server {
    Server::start(move |mut s, c| {
        let reg = Registry::default();
        let mut rr = RecordReader::new(RecordLimits::default());
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            c.bytes.fetch_add(n as u64, Ordering::Relaxed);
            rr.push(&buf[..n]);
            let mut replies: Vec<Vec<u8>> = Vec::new();
            loop {
                let rec = match rr.next_record() {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(_) => return,
                };
                c.calls.fetch_add(1, Ordering::Relaxed);
                let xid = u32::from_be_bytes([rec[0], rec[1], rec[2], rec[3]]);
                let mut one = Vec::new();
                match mode {
                    RpcMode::Good | RpcMode::Reversed | RpcMode::Duplicate => {
                        if let Outcome::CloseConnection(_) = reg.handle(rec, &mut one) {
                            return;
                        }
                        if mode == RpcMode::Duplicate {
                            one.extend_from_slice(&one.clone());
                        }
                    }
                    RpcMode::WrongXid => encode_reply(xid.wrapping_add(1), &Reply::Success, &mut one),
                    RpcMode::Garbage => one.extend_from_slice(b"HTTP/1.0 400 Bad Request\r\n\r\n"),
                    RpcMode::Close => return,
                    RpcMode::Silent => {}
                }
                replies.push(one);
            }
            if mode == RpcMode::Reversed {
                replies.reverse();
            }
            if s.write_all(&replies.concat()).is_err() {
                return;
            }
        }
    })
}

/// Message echo with "l4" framing: each message goes back whole.
fn l4_echo_server() -> Server {
    Server::start(|s, c| {
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::with_capacity(256 * 1024, s);
        let mut msg = Vec::new();
        loop {
            let mut hdr = [0u8; 4];
            if r.read_exact(&mut hdr).is_err() {
                return;
            }
            let len = u32::from_be_bytes(hdr) as usize;
            if len > 32 << 20 {
                return;
            }
            msg.clear();
            msg.extend_from_slice(&hdr);
            msg.resize(4 + len, 0);
            if r.read_exact(&mut msg[4..]).is_err() {
                return;
            }
            c.calls.fetch_add(1, Ordering::Relaxed);
            c.bytes.fetch_add(msg.len() as u64, Ordering::Relaxed);
            if w.write_all(&msg).is_err() {
                return;
            }
        }
    })
}

/// Byte echo; with `flip_at`, the byte at that stream offset comes back altered.
fn byte_echo_server(flip_at: Option<u64>) -> Server {
    Server::start(move |mut s, c| {
        let mut buf = vec![0u8; 64 * 1024];
        let mut off = 0u64;
        loop {
            let n = match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Some(f) = flip_at {
                if (off..off + n as u64).contains(&f) {
                    buf[(f - off) as usize] ^= 0x40;
                }
            }
            off += n as u64;
            c.bytes.fetch_add(n as u64, Ordering::Relaxed);
            if s.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    })
}

const LIMIT: Duration = Duration::from_secs(60);

/// `key=value` from the summary line.
fn summary(run: &Run, key: &str) -> String {
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("summary "))
        .unwrap_or_else(|| panic!("no summary line in:\n{}\n{}", run.stdout, run.stderr));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .to_string()
}

fn ok(run: &Run) {
    assert_eq!(run.code, 0, "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
}

/// A failed run: exit status 1, its error on stderr and in a FAILED row on
/// stdout, and no figures for the failed round: no median row, a summary
/// with `result=FAILED` and no rate or latency keys.
fn failed_with(run: &Run, words: &str) {
    assert_eq!(run.code, 1, "expected failure; stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains(words), "stderr lacks {words:?}:\n{}", run.stderr);
    let failed: Vec<&str> = run.stdout.lines().filter(|l| l.split_whitespace().nth(1) == Some("FAILED")).collect();
    assert_eq!(failed.len(), 1, "one FAILED row:\n{}", run.stdout);
    assert!(failed[0].contains(words), "FAILED row lacks {words:?}: {}", failed[0]);
    assert!(!run.stdout.lines().any(|l| l.starts_with("median")), "a median row:\n{}", run.stdout);
    assert_eq!(summary(run, "result"), "FAILED");
    let line = run.stdout.lines().find(|l| l.starts_with("summary ")).unwrap();
    for key in ["rpc_per_s=", "msg_per_s=", "rtt_us_p50=", "calls=", "mbps="] {
        assert!(!line.contains(key), "figure {key} in a failed summary: {line}");
    }
}

#[test]
fn rpctest_counts_every_call_and_prints_rows_median_and_summary() {
    let srv = rpc_server(RpcMode::Good);
    let run = connmux(&["rpctest", "-j2", "-a8", "-c500", "-i3", &srv.target()], LIMIT);
    ok(&run);
    // stderr is a pipe here: no progress line, and nothing else on success.
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 1 + 3 + 1 + 1, "{}", run.stdout);
    assert!(lines[0].contains("RPC/s") && lines[0].contains("p50_us") && lines[0].contains("p99.9_us"));
    for (i, l) in lines[1..4].iter().enumerate() {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f[0], (i + 1).to_string());
        assert_eq!((f[1], f[2], f[3]), ("2", "8", "1000"), "{l}");
        assert!(f[5].parse::<f64>().unwrap() > 0.0, "rate in {l}");
        assert_eq!(*f.last().unwrap(), "0", "errs in {l}");
    }
    assert!(lines[4].starts_with("median"));
    assert_eq!(summary(&run, "calls"), "3000");
    assert_eq!(summary(&run, "errors"), "0");
    assert_eq!(summary(&run, "result"), "ok");
    assert!(summary(&run, "rpc_per_s").parse::<f64>().unwrap() > 0.0);
    let (p50, p99): (f64, f64) =
        (summary(&run, "rtt_us_p50").parse().unwrap(), summary(&run, "rtt_us_p99").parse().unwrap());
    assert!(p50 > 0.0 && p99 >= p50);
    // Every call reached the server as one 44-byte record (ksf.md §2.4).
    assert_eq!(srv.calls(), 3000);
    assert_eq!(srv.bytes(), 3000 * 44);
    // New connections each round: 2 per round.
    assert_eq!(srv.counters.conns.load(Ordering::Relaxed), 6);
}

#[test]
fn rpctest_f_sends_three_fragments_and_fragments_n_sends_n() {
    let srv = rpc_server(RpcMode::Good);
    ok(&connmux(&["rpctest", "-f", "-a4", "-c200", "-i1", &srv.target()], LIMIT));
    assert_eq!(srv.calls(), 200);
    assert_eq!(srv.bytes(), 200 * 52, "3 marks + 40-byte body");
    let srv = rpc_server(RpcMode::Good);
    ok(&connmux(&["rpctest", "--fragments", "5", "-a4", "-c100", "-i1", &srv.target()], LIMIT));
    assert_eq!(srv.bytes(), 100 * (40 + 5 * 4));
}

#[test]
fn rpctest_auth_sys_and_hostname_target() {
    let srv = rpc_server(RpcMode::Good);
    let target = format!("localhost:{}", srv.addr.port());
    let run = connmux(&["rpctest", "-A", "sys", "-a2", "-c100", "-i1", &target], LIMIT);
    ok(&run);
    assert_eq!(srv.calls(), 100);
    assert!(srv.bytes() > 100 * 44, "AUTH_SYS calls are longer");
    assert_eq!(summary(&run, "target"), target);
}

#[test]
fn rpctest_accepts_replies_out_of_order() {
    let srv = rpc_server(RpcMode::Reversed);
    ok(&connmux(&["rpctest", "-a32", "-c2000", "-i1", &srv.target()], LIMIT));
    assert_eq!(srv.calls(), 2000);
}

#[test]
fn rpctest_duration_mode_runs_for_about_the_duration() {
    let srv = rpc_server(RpcMode::Good);
    let run = connmux(&["rpctest", "-d", "0.3", "-a4", "-i2", &srv.target()], LIMIT);
    ok(&run);
    let calls: u64 = summary(&run, "calls").parse().unwrap();
    assert!(calls > 0 && calls == srv.calls(), "{calls} vs {}", srv.calls());
    for l in run.stdout.lines().skip(1).take(2) {
        let secs: f64 = l.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert!((0.25..5.0).contains(&secs), "{l}");
    }
}

#[test]
fn rpctest_fails_on_wrong_xid() {
    let srv = rpc_server(RpcMode::WrongXid);
    failed_with(&connmux(&["rpctest", "-a4", "-c100", "-i3", &srv.target()], LIMIT), "matches no request in flight");
    // It stopped after the failing round: the server saw one connection.
    assert_eq!(srv.counters.conns.load(Ordering::Relaxed), 1);
}

#[test]
fn rpctest_fails_on_prog_unavail() {
    // The real responder serves NFS only; ask for MOUNT (100005).
    let srv = rpc_server(RpcMode::Good);
    failed_with(&connmux(&["rpctest", "--prog", "100005", "-c10", "-i1", &srv.target()], LIMIT), "PROG_UNAVAIL");
    // And a version it does not serve.
    failed_with(&connmux(&["rpctest", "--vers", "2", "-c10", "-i1", &srv.target()], LIMIT), "PROG_MISMATCH");
}

#[test]
fn rpctest_fails_on_garbage_duplicates_and_close() {
    let srv = rpc_server(RpcMode::Garbage);
    failed_with(&connmux(&["rpctest", "-c10", "-i1", &srv.target()], LIMIT), "bad reply");
    let srv = rpc_server(RpcMode::Duplicate);
    failed_with(&connmux(&["rpctest", "-a2", "-c50", "-i1", &srv.target()], LIMIT), "matches no request in flight");
    let srv = rpc_server(RpcMode::Close);
    failed_with(&connmux(&["rpctest", "-j2", "-c10", "-i1", &srv.target()], LIMIT), "closed the connection");
}

#[test]
fn rpctest_gives_up_on_a_silent_server_within_the_io_timeout() {
    let srv = rpc_server(RpcMode::Silent);
    let run = connmux(&["rpctest", "-j2", "-a4", "-c10", "-i1", "--io-timeout", "0.5", &srv.target()], LIMIT);
    failed_with(&run, "no reply within 0.5 s");
    assert!(run.took < Duration::from_secs(10), "took {:?}", run.took);
    // The round limit stops a round that goes on too long, even when replies trickle.
    let srv = rpc_server(RpcMode::Good);
    let run = connmux(&["rpctest", "-a1", "-c100000000", "-i1", "--timeout", "0.5", &srv.target()], LIMIT);
    failed_with(&run, "did not finish within 0.5 s");
    assert!(run.took < Duration::from_secs(10), "took {:?}", run.took);
}

#[test]
fn rpctest_fails_when_nothing_listens() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let run = connmux(&["rpctest", "-c10", "-i3", &format!("127.0.0.1:{port}")], LIMIT);
    failed_with(&run, "connect to 127.0.0.1");
    // Failing in its first round, the run prints no header and no figures:
    // the FAILED row and the summary only.
    assert_eq!(run.stdout.lines().count(), 2, "{}", run.stdout);
    let run = connmux(&["echotest", "-c10", "-i1", &format!("127.0.0.1:{port}")], LIMIT);
    failed_with(&run, "Connection refused");
    // --json: ok false, the error, and no median or pooled figures.
    let run = connmux(&["rpctest", "--json", "-c10", "-i1", &format!("127.0.0.1:{port}")], LIMIT);
    assert_eq!(run.code, 1);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert!(v["error"].as_str().unwrap().contains("connect to 127.0.0.1"), "{v}");
    assert!(v["median"].is_null() && v["all"].is_null(), "{v}");
    assert!(v["rounds"][0]["error"].is_string(), "the round is marked failed: {v}");
}

/// A real `connmux` server started with `--tls` (and a plain one), killed on
/// drop; its address comes from its first line.
struct ConnmuxServer {
    child: std::process::Child,
    addr: SocketAddr,
    /// Kept open so the server's later lines never meet a closed pipe.
    _stdout: BufReader<std::process::ChildStdout>,
}

impl ConnmuxServer {
    fn start(args: &[&str]) -> ConnmuxServer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_connmux"))
            .args(args)
            .args(["-l", "127.0.0.1:0", "--duration", "60", "--no-stats-socket", "--workers", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        let addr = line
            .split_whitespace()
            .find_map(|w| w.parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        ConnmuxServer { child, addr, _stdout: stdout }
    }
}

impl Drop for ConnmuxServer {
    /// A stop signal first, so that the server removes what it wrote at
    /// default places (a generated CA); killed if it is still there after
    /// a few seconds.
    fn drop(&mut self) {
        let _ = connmux_sys::signal::kill(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain load generator at a server that speaks TLS is told so (the
/// server's first byte, 0x15, is a TLS alert), prints no figures and fails;
/// the same load with --tls against the same server succeeds.
#[test]
fn plain_load_at_a_tls_server_says_the_server_speaks_tls() {
    let rpc = ConnmuxServer::start(&["rpc-server", "--tls"]);
    let target = rpc.addr.to_string();
    let run = connmux(&["rpctest", "-a4", "-c10", "-i2", "--io-timeout", "5", &target], LIMIT);
    failed_with(&run, "the server speaks TLS (try --tls)");
    let run = connmux(&["rpctest", "--tls", "--tls-insecure", "-a4", "-c10", "-i2", &target], LIMIT);
    ok(&run);
    assert_eq!(summary(&run, "calls"), "20");

    let echo = ConnmuxServer::start(&["echo-server", "--tls"]);
    let target = echo.addr.to_string();
    for mode in ["msg", "bytes"] {
        let run = connmux(&["echotest", "--mode", mode, "-a4", "-c10", "-i1", "--io-timeout", "5", &target], LIMIT);
        failed_with(&run, "the server speaks TLS (try --tls)");
    }
    // A plain server answers plainly: no TLS hint on a plain failure.
    let plain = ConnmuxServer::start(&["rpc-server"]);
    let run = connmux(&["rpctest", "--vers", "2", "-c10", "-i1", &plain.addr.to_string()], LIMIT);
    failed_with(&run, "PROG_MISMATCH");
    assert!(!run.stderr.contains("TLS"), "{}", run.stderr);
}

#[test]
fn rpctest_json_document() {
    let srv = rpc_server(RpcMode::Good);
    let run = connmux(&["rpctest", "--json", "-j2", "-a4", "-c100", "-i2", "-q", "50,90,99", &srv.target()], LIMIT);
    ok(&run);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["tool"], "rpctest");
    assert_eq!(v["ok"], true);
    assert_eq!(v["errors"], 0);
    assert_eq!(v["config"]["fragments"], 1);
    assert_eq!(v["config"]["call_bytes"], 44);
    let rounds = v["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2);
    for r in rounds {
        assert_eq!(r["calls"], 200);
        assert_eq!(r["conns"].as_array().unwrap().len(), 2);
        assert_eq!(r["quantiles"].as_array().unwrap().len(), 3);
        assert_eq!(r["tx_bytes"], 200 * 44);
        assert_eq!(r["rx_bytes"], 200 * 28);
        let (p50, p99) = (r["p50_us"].as_f64().unwrap(), r["p99_us"].as_f64().unwrap());
        assert!(0.0 < p50 && p50 <= p99 && p99 <= r["max_us"].as_f64().unwrap());
    }
    assert_eq!(v["all"]["calls"], 400);
    assert!(v["median"]["rate"].as_f64().unwrap() > 0.0);
}

#[test]
fn rpctest_plots_svg_and_png() {
    let srv = rpc_server(RpcMode::Good);
    let dir = std::env::temp_dir().join(format!("connmux-loadgen-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (svg, png) = (dir.join("rtt.svg"), dir.join("rtt.png"));
    for f in [&svg, &png] {
        ok(&connmux(&["rpctest", "-a4", "-c300", "-i2", "--plot", f.to_str().unwrap(), &srv.target()], LIMIT));
    }
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<?xml") && s.contains("<svg") && s.trim_end().ends_with("</svg>"));
    assert!(s.matches("<polyline").count() >= 3, "round lines and the pooled one");
    // 600 calls: the x axis ends at 99 % (the last power of ten below the count).
    assert!(s.contains(">90%<") && s.contains(">99%<") && !s.contains("99.9%") && s.contains("all rounds"));
    let p = std::fs::read(&png).unwrap();
    assert_eq!(&p[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&p[12..16], b"IHDR");
    let (w, h) = (u32::from_be_bytes(p[16..20].try_into().unwrap()), u32::from_be_bytes(p[20..24].try_into().unwrap()));
    assert!(w >= 400 && h >= 300, "{w}x{h}");
    let bad = connmux(&["rpctest", "-c10", "-i1", "--plot", dir.join("x.gif").to_str().unwrap(), &srv.target()], LIMIT);
    assert_ne!(bad.code, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rpctest_pins_to_an_available_cpu_and_refuses_others() {
    let srv = rpc_server(RpcMode::Good);
    ok(&connmux(&["rpctest", "--cpu", "0", "-j2", "-c50", "-i1", &srv.target()], LIMIT));
    let run = connmux(&["rpctest", "--cpu", "4000", "-c50", "-i1", &srv.target()], LIMIT);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("not available"), "{}", run.stderr);
}

#[test]
fn bad_arguments_are_refused() {
    for args in [
        &["rpctest", "-j", "0"][..],
        &["rpctest", "-c", "0"],
        &["rpctest", "-c", "5x"],
        &["rpctest", "-q", "101"],
        &["rpctest", "-d", "0"],
        &["rpctest", "host:0"],
        &["echotest", "-l", "0"],
        &["echotest", "-l", "16m", "-a", "17"],
    ] {
        let run = connmux(args, LIMIT);
        assert_ne!(run.code, 0, "{args:?}");
        assert!(!run.stderr.is_empty(), "{args:?}");
    }
}

#[test]
fn echotest_message_mode_verifies_l4_echoes() {
    let srv = l4_echo_server();
    let run = connmux(&["echotest", "-j2", "-a8", "-c300", "-i2", "-l", "100", &srv.target()], LIMIT);
    ok(&run);
    assert!(run.stdout.lines().next().unwrap().contains("msgs/s"));
    assert_eq!(summary(&run, "calls"), "1200");
    assert!(summary(&run, "msg_per_s").parse::<f64>().unwrap() > 0.0);
    assert_eq!(srv.calls(), 1200);
    assert_eq!(srv.bytes(), 1200 * 104);
}

#[test]
fn echotest_large_messages_do_not_deadlock() {
    // Many in flight, each far bigger than a socket buffer.
    let srv = l4_echo_server();
    ok(&connmux(&["echotest", "-a4", "-c6", "-i1", "-l", "1m", &srv.target()], LIMIT));
    assert_eq!(srv.calls(), 6);
    let srv = byte_echo_server(None);
    ok(&connmux(&["echotest", "--mode", "bytes", "-a3", "-c6", "-i1", "-l", "2m", &srv.target()], LIMIT));
    assert_eq!(srv.bytes(), 6 * 2 * 1024 * 1024);
}

#[test]
fn echotest_byte_mode_and_duration() {
    let srv = byte_echo_server(None);
    let run = connmux(&["echotest", "--mode", "bytes", "-d", "0.2", "-a16", "-l", "7", "-i1", &srv.target()], LIMIT);
    ok(&run);
    let calls: u64 = summary(&run, "calls").parse().unwrap();
    assert!(calls > 0);
    assert_eq!(srv.bytes(), calls * 7);
}

#[test]
fn echotest_fails_on_an_altered_echo() {
    let srv = byte_echo_server(Some(1000));
    let run = connmux(&["echotest", "--mode", "bytes", "-a4", "-c100", "-i1", "-l", "64", &srv.target()], LIMIT);
    // Byte 1000 of the stream is byte 40 of message 15.
    failed_with(&run, "echo of message 15 differs at byte 40");
    // A flipped length header is caught too.
    let srv = byte_echo_server(Some(1));
    failed_with(&connmux(&["echotest", "-c10", "-i1", &srv.target()], LIMIT), "differs at byte 1");
}
