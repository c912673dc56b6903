//! `connmux rpctest` over several servers (one client mux), run as a process
//! against NULL-RPC responders started here on 127.0.0.1 ephemeral ports:
//! per-server counts, a slowed server, a server that dies mid-run, and the
//! old single-server form beside it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::Run;
use connmux_oncrpc::{Outcome, RecordLimits, RecordReader, Registry};

/// A NULL-RPC responder: one thread per connection; each call waits `delay`
/// before its answer; after `die_after` calls it resets its connection (a
/// killed server).
struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
}

impl Server {
    fn start(delay: Duration, die_after: Option<u64>) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let (stop2, calls2) = (stop.clone(), calls.clone());
        thread::spawn(move || {
            let t0 = Instant::now();
            while !stop2.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(120) {
                match l.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_nodelay(true).unwrap();
                        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                        let calls = calls2.clone();
                        thread::spawn(move || serve(s, delay, die_after, &calls));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Server { addr, stop, calls }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(mut s: TcpStream, delay: Duration, die_after: Option<u64>, calls: &AtomicU64) {
    let reg = Registry::default();
    let mut rr = RecordReader::new(RecordLimits::default());
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        rr.push(&buf[..n]);
        out.clear();
        loop {
            let rec = match rr.next_record() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(_) => return,
            };
            if die_after.is_some_and(|d| calls.load(Ordering::Relaxed) >= d) {
                socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
                return; // dropped: RST, with calls unanswered
            }
            // Slowed by waiting, not by burning a CPU: on a loaded machine a
            // spinning server took the CPU its fast peers needed, and least
            // outstanding then had no fast server to prefer (1 run in 15 or
            // so under a parallel torture test gave the slowed one 19–25%).
            if !delay.is_zero() {
                thread::sleep(delay);
            }
            if let Outcome::CloseConnection(_) = reg.handle(rec, &mut out) {
                return;
            }
            calls.fetch_add(1, Ordering::Relaxed);
        }
        if s.write_all(&out).is_err() {
            return;
        }
    }
}

/// Runs the connmux binary for at most 60 s.
fn connmux(args: &[&str]) -> Run {
    common::run_connmux(args, Duration::from_secs(60))
}

fn json(r: &Run) -> serde_json::Value {
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n{}", r.stdout, r.stderr))
}

fn per_server(round: &serde_json::Value) -> Vec<u64> {
    round["per_server"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
}

const CALLS: u64 = 3000;

/// Three servers, the third slowed by 2 ms per call: rotation gives it a
/// third of the calls, least outstanding at most a sixth; both count every call.
fn slowed(policy: &str) -> Vec<u64> {
    let servers: Vec<Server> =
        (0..3).map(|i| Server::start(if i == 2 { Duration::from_millis(2) } else { Duration::ZERO }, None)).collect();
    let list = servers.iter().map(|s| s.addr.to_string()).collect::<Vec<_>>().join(",");
    let r = connmux(&["rpctest", "-j1", "-a24", "-c3000", "-i1", "--json", "--tx-policy", policy, "-s", &list]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let doc = json(&r);
    assert_eq!(doc["mode"], "mux");
    assert_eq!(doc["ok"], true);
    let round = &doc["rounds"][0];
    assert_eq!(round["calls"].as_u64(), Some(CALLS));
    let counts = per_server(round);
    assert_eq!(counts.iter().sum::<u64>(), CALLS, "{counts:?}");
    for (s, n) in servers.iter().zip(&counts) {
        assert_eq!(s.calls.load(Ordering::Relaxed), *n, "each server answered what rpctest counted for it");
    }
    counts
}

#[test]
fn rotation_gives_the_slowed_server_a_third() {
    assert_eq!(slowed("round-robin"), vec![1000, 1000, 1000]);
}

#[test]
fn least_outstanding_gives_the_slowed_server_at_most_a_sixth() {
    let counts = slowed("least-outstanding");
    assert!(counts[2] * 6 <= CALLS, "{counts:?}");
}

#[test]
fn table_and_summary_name_every_server() {
    let a = Server::start(Duration::ZERO, None);
    let b = Server::start(Duration::ZERO, None);
    // Repeated -s and the positional target together.
    let r = connmux(&["rpctest", "-a4", "-c500", "-i2", &a.addr.to_string(), "-s", &b.addr.to_string()]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let summary = r.stdout.lines().find(|l| l.starts_with("summary ")).expect("a summary line");
    assert!(summary.contains(&format!("servers={},{}", a.addr, b.addr)), "{summary}");
    assert!(summary.contains("calls=1000 ") && summary.contains("result=ok"), "{summary}");
    let per: Vec<u64> = summary
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("per_server="))
        .unwrap()
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(per.iter().sum::<u64>(), 1000, "calls each server answered over both rounds: {summary}");
    assert_eq!(r.stdout.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count(), 2);
    // The old single form is the per-connection load generator, unchanged.
    let r = connmux(&["rpctest", "-a4", "-c500", "-i1", &a.addr.to_string()]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let summary = r.stdout.lines().find(|l| l.starts_with("summary ")).unwrap();
    assert!(summary.contains(&format!("target={}", a.addr)) && !summary.contains("mode=mux"), "{summary}");
}

/// Server 1 resets its connection after 300 calls: every call is still
/// answered (by the others), the run succeeds, the server is named as failed.
#[test]
fn a_server_that_dies_mid_run_loses_no_call() {
    let servers = [
        Server::start(Duration::ZERO, None),
        Server::start(Duration::ZERO, Some(300)),
        Server::start(Duration::ZERO, None),
    ];
    let list = servers.iter().map(|s| s.addr.to_string()).collect::<Vec<_>>().join(",");
    let r = connmux(&["rpctest", "-a24", "-c3000", "-i1", "--json", "-s", &list]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let doc = json(&r);
    let round = &doc["rounds"][0];
    assert_eq!(round["calls"].as_u64(), Some(CALLS));
    let counts = per_server(round);
    assert_eq!(counts.iter().sum::<u64>(), CALLS);
    // It answered at most its 300: replies still in flight when it resets
    // may be lost with the connection, and those calls are answered by the
    // others.
    assert!(counts[1] > 0 && counts[1] <= 300, "the dying server answered at most its 300: {counts:?}");
    assert_eq!(round["failed_servers"], serde_json::json!([servers[1].addr.to_string()]));
    assert!(round["resent"].as_u64().unwrap() > 0, "{round}");
    assert!(r.stderr.contains(&format!("server {} failed", servers[1].addr)), "{}", r.stderr);
}

#[test]
fn tls_with_several_servers_is_refused_clearly() {
    let r = connmux(&["rpctest", "--tls", "--tls-insecure", "-s", "127.0.0.1:1,127.0.0.1:2"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("several servers"), "{}", r.stderr);
}
