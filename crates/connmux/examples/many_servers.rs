//! One client mux over many servers.
//!
//! Starts three call servers on loopback (each a connmux `Service`; the last
//! one burns `--burn-us` of CPU per call, 200 µs by default), attaches one
//! connection to each of them to a single client mux, and makes `--calls`
//! calls through one KCM socket with at most `--window` unanswered: plain
//! sends, so the mux's transmit policy picks the server of each call. It does
//! so with KCM's rotation (`TxPolicy::RoundRobin`) and with
//! `TxPolicy::LeastOutstanding`, `--rounds` times each, alternately, and
//! prints the calls each server answered, the calls per second, and the ratio
//! of the medians. With `--kill`, one more least-outstanding run stops server 1
//! after a third of the calls: the calls it had not answered are sent again
//! and answered by the others.
//!
//! ```text
//! cargo run --release -p connmux --example many_servers -- [--calls N] [--window N] [--burn-us N] [--rounds N] [--kill]
//! ```
//!
//! The wire format is the `l4` framing: a 4-byte big-endian length, then the
//! body. A call's body is its 8-byte id; a reply's is the id and the index of
//! the server that answered.

use std::collections::HashSet;
use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use connmux::service::{Handler, Service, ServiceConfig, Verdict};
use connmux::{Bytes, Config, KcmSocket, Mux, Placement, PsockId, SockType, TxPolicy};

/// Answers a call with its id and this server's index, after `burn` of work.
struct Answer {
    index: u8,
    burn: Duration,
}

impl Handler for Answer {
    fn handle(&self, request: Bytes, _from: PsockId, scratch: &mut BytesMut) -> Verdict {
        if request.len() != 12 {
            return Verdict::Close;
        }
        let t = Instant::now();
        while t.elapsed() < self.burn {
            std::hint::spin_loop();
        }
        scratch.put_u32(9);
        scratch.put_slice(&request[4..12]);
        scratch.put_u8(self.index);
        Verdict::Reply(scratch.split().freeze())
    }
}

fn l4() -> Box<dyn connmux::Parser> {
    connmux::parsers::from_spec("l4").expect("built-in parser")
}

fn server(index: u8, burn: Duration) -> io::Result<Service> {
    let mux = Mux::new(Config { workers: 1, placement: Placement::Unpinned, ..Config::default() })?;
    let cfg = ServiceConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        sock_type: SockType::SeqPacket,
        parser: Arc::new(l4),
    };
    Service::start(mux, cfg, Arc::new(Answer { index, burn }))
}

/// What one run saw.
struct Run {
    per_server: Vec<usize>,
    elapsed: Duration,
    failed: Vec<PsockId>,
    resent: usize,
}

/// `calls` calls with at most `window` unanswered over one client mux with
/// `policy`. `stop` (a server index and a call count) stops that server once
/// that many calls are answered.
fn run(
    policy: TxPolicy,
    servers: &mut [Option<Service>],
    calls: usize,
    window: usize,
    stop: Option<(usize, usize)>,
) -> io::Result<Run> {
    let mut cfg = Config { workers: 1, placement: Placement::Unpinned, ..Config::default() };
    cfg.core.tx_policy = policy;
    let mux = Mux::new(cfg)?;
    let sock = mux.socket(SockType::SeqPacket)?;
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    for s in servers.iter().flatten() {
        let conn = TcpStream::connect(s.local_addr())?;
        mux.attach(&conn, l4())?;
    }
    let mut r = Run { per_server: vec![0; servers.len()], elapsed: Duration::ZERO, failed: Vec::new(), resent: 0 };
    let mut answered = vec![false; calls];
    let mut unanswered: HashSet<u64> = HashSet::new();
    let (mut next, mut done) = (0u64, 0usize);
    let mut stop = stop;
    let start = Instant::now();
    let give_up = start + Duration::from_secs(60);
    while done < calls {
        if Instant::now() > give_up {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{done} of {calls} calls answered in 60 s")));
        }
        while (next as usize) < calls && unanswered.len() < window {
            send_call(&sock, next)?;
            unanswered.insert(next);
            next += 1;
        }
        match sock.recv_msg() {
            Ok(m) if m.data.len() == 13 => {
                let id = u64::from_be_bytes(m.data[4..12].try_into().expect("8 bytes"));
                if let Some(seen) = answered.get_mut(id as usize) {
                    // A call sent again may be answered twice: count it once.
                    if !std::mem::replace(seen, true) {
                        unanswered.remove(&id);
                        r.per_server[m.data[12] as usize] += 1;
                        done += 1;
                    }
                }
            }
            Ok(m) => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("reply of {} bytes", m.data.len())))
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
        if let Some((index, after)) = stop {
            if done >= after {
                if let Some(s) = servers[index].take() {
                    s.shutdown();
                }
                stop = None;
            }
        }
        // A server that died: unattach its connection and send again every
        // call not answered yet (those it had are lost with it).
        while let Ok(ev) = mux.events().try_recv() {
            eprintln!("psock {:?} failed: {:?}", ev.psock, ev.error);
            r.failed.push(ev.psock);
            let _ = mux.unattach_id(ev.psock);
            for &id in &unanswered {
                send_call(&sock, id)?;
                r.resent += 1;
            }
        }
    }
    r.elapsed = start.elapsed();
    Ok(r)
}

fn send_call(sock: &KcmSocket, id: u64) -> io::Result<()> {
    let mut call = [0u8; 12];
    call[..4].copy_from_slice(&8u32.to_be_bytes());
    call[4..].copy_from_slice(&id.to_be_bytes());
    sock.send(&call).map(drop)
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} takes a number")),
        None => default,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let calls = arg(&args, "--calls", 20_000);
    let window = arg(&args, "--window", 24);
    let burn = Duration::from_micros(arg(&args, "--burn-us", 200) as u64);
    let rounds = arg(&args, "--rounds", 3).max(1);
    let kill = args.iter().any(|a| a == "--kill");

    let mut servers: Vec<Option<Service>> =
        (0..3u8).map(|i| server(i, if i == 2 { burn } else { Duration::ZERO }).map(Some)).collect::<io::Result<_>>()?;
    println!("3 servers on loopback, server 2 burns {burn:?} per call; {calls} calls, at most {window} unanswered");
    println!(
        "{:<18} {:>5} {:>24} {:>12} {:>12}",
        "policy", "round", "calls answered per server", "slow share", "calls/s"
    );
    let mut rates = [Vec::new(), Vec::new()];
    for round in 1..=rounds {
        for (k, policy) in [TxPolicy::RoundRobin, TxPolicy::LeastOutstanding].into_iter().enumerate() {
            let r = run(policy, &mut servers, calls, window, None)?;
            let rate = calls as f64 / r.elapsed.as_secs_f64();
            rates[k].push(rate);
            println!(
                "{:<18} {:>5} {:>24} {:>11.1}% {:>12.0}",
                format!("{policy:?}"),
                round,
                format!("{:?}", r.per_server),
                100.0 * r.per_server[2] as f64 / calls as f64,
                rate
            );
        }
    }
    let (rr, lo) = (median(rates[0].clone()), median(rates[1].clone()));
    println!("median calls/s: RoundRobin {rr:.0}, LeastOutstanding {lo:.0}; ratio {:.2}x", lo / rr);
    if kill {
        let r = run(TxPolicy::LeastOutstanding, &mut servers, calls, window, Some((1, calls / 3)))?;
        println!(
            "server 1 stopped after {} calls: answered per server {:?}, all {} answered; {} calls sent again, failed psocks {:?}",
            calls / 3,
            r.per_server,
            r.per_server.iter().sum::<usize>(),
            r.resent,
            r.failed
        );
    }
    Ok(())
}
