//! `connmux rpctest` over several servers: one client mux, one connection per
//! server, calls spread by the mux's transmit policy.
//!
//! Each round makes a new client mux (`--tx-policy`), connects once to every
//! server and attaches the connections with the ONC RPC record-marking
//! parser. One thread keeps `-j × -a` NULL calls in flight through one KCM
//! socket with plain sends, so the mux picks the server of every call, and
//! takes each reply whole with `recv_msg`, which says which connection
//! answered. A round ends after `-j × -c` calls are answered (or `-d`
//! seconds, then the calls in flight). Every reply is checked (a REPLY,
//! MSG_ACCEPTED, SUCCESS, the xid of a call in flight); anything else fails
//! the run with exit status 1, as does a stall of `--io-timeout`.
//!
//! A server whose connection fails (closed, reset, a bad record) is reported
//! on stderr and in the output (`failed_servers`), its connection is
//! unattached, and the calls still unanswered are sent again with their xids
//! (those it held are lost with it; a second answer to a call is dropped and
//! counted as `duplicates`). The run fails only when no server is left.
//!
//! Output: one row per round with the calls each server answered, a median
//! row (per-server medians), a `summary` line (`per_server=N,N,...`: the calls
//! each server answered over all rounds, as `calls=` counts all rounds), or
//! with `--json` one document holding the same.

use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use connmux::{Config, Mux, Placement, PsockId, SockType, TxPolicy};
use connmux_oncrpc::check_reply;
use serde::Serialize;

use super::loadgen::report::median;
use super::loadgen::{CommonArgs, Target};

/// `--tx-policy`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// KCM's: plain sends rotate over the connections.
    RoundRobin,
    /// Each call to the server with the fewest calls not yet answered.
    LeastOutstanding,
}

impl From<Policy> for TxPolicy {
    fn from(p: Policy) -> TxPolicy {
        match p {
            Policy::RoundRobin => TxPolicy::RoundRobin,
            Policy::LeastOutstanding => TxPolicy::LeastOutstanding,
        }
    }
}

#[derive(Serialize, Clone, Debug)]
struct RoundOut {
    round: u64,
    calls: u64,
    secs: f64,
    rpc_per_s: f64,
    rtt_us_p50: f64,
    rtt_us_p99: f64,
    rtt_us_max: f64,
    /// Calls answered by each server, in the order given.
    per_server: Vec<u64>,
    /// Servers whose connection failed in this round.
    failed_servers: Vec<String>,
    resent: u64,
    duplicates: u64,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    tool: &'static str,
    mode: &'static str,
    servers: Vec<&'a str>,
    tx_policy: Policy,
    inflight: u64,
    rounds: &'a [RoundOut],
    median: Median,
    /// Calls answered by each server over all rounds.
    total_per_server: Vec<u64>,
    ok: bool,
    error: Option<String>,
}

#[derive(Serialize)]
struct Median {
    rpc_per_s: f64,
    rtt_us_p50: f64,
    rtt_us_p99: f64,
    per_server: Vec<u64>,
}

/// Runs the rounds; the exit status.
pub fn run(
    c: &CommonArgs,
    servers: &[Target],
    policy: Policy,
    call: &dyn Fn(u32, &mut Vec<u8>),
) -> anyhow::Result<i32> {
    if c.tls.tls {
        anyhow::bail!("--tls with several servers is not supported (one client mux over TLS connections: use the library's attach_tls)");
    }
    if c.plot.is_some() || c.cpus.is_some() {
        anyhow::bail!("--plot and --cpu are not supported with several servers");
    }
    let plan = c.plan()?;
    let window = plan.threads * plan.inflight;
    let count = plan.count.map(|n| n * plan.threads as u64);
    let mut rounds: Vec<RoundOut> = Vec::new();
    let mut error = None;
    if !c.json && !c.no_header {
        println!(
            " round servers   INF      calls    secs      RPC/s    p50_us    p99_us    max_us  per server ({policy:?}: {})",
            servers.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(" ")
        );
    }
    for r in 1..=c.rounds {
        match round(r, servers, policy, window, count, plan.duration, plan.io_timeout, call) {
            Ok(out) => {
                if !c.json {
                    println!(
                        "{:>6} {:>7} {:>5} {:>10} {:>7.3} {:>10.0} {:>9.1} {:>9.1} {:>9.1}  {}",
                        out.round,
                        servers.len(),
                        window,
                        out.calls,
                        out.secs,
                        out.rpc_per_s,
                        out.rtt_us_p50,
                        out.rtt_us_p99,
                        out.rtt_us_max,
                        out.per_server.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ")
                    );
                }
                rounds.push(out);
            }
            Err(e) => {
                eprintln!("rpctest: round {r}: {e:#}");
                error = Some(format!("{e:#}"));
                break;
            }
        }
    }
    let med = Median {
        rpc_per_s: median(rounds.iter().map(|r| r.rpc_per_s).collect()),
        rtt_us_p50: median(rounds.iter().map(|r| r.rtt_us_p50).collect()),
        rtt_us_p99: median(rounds.iter().map(|r| r.rtt_us_p99).collect()),
        per_server: (0..servers.len())
            .map(|i| median(rounds.iter().map(|r| r.per_server[i] as f64).collect()) as u64)
            .collect(),
    };
    let totals: Vec<u64> = (0..servers.len()).map(|i| rounds.iter().map(|r| r.per_server[i]).sum()).collect();
    let ok = error.is_none();
    let failed: usize = rounds.iter().map(|r| r.failed_servers.len()).sum();
    if c.json {
        let doc = JsonOut {
            tool: "rpctest",
            mode: "mux",
            servers: servers.iter().map(|t| t.name.as_str()).collect(),
            tx_policy: policy,
            inflight: window as u64,
            rounds: &rounds,
            median: med,
            total_per_server: totals,
            ok,
            error,
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        if !rounds.is_empty() {
            let total: u64 = rounds.iter().map(|r| r.calls).sum();
            println!(
                "median {:>7} {:>5} {:>10} {:>7} {:>10.0} {:>9.1} {:>9.1} {:>9} {}",
                servers.len(),
                window,
                "",
                "",
                med.rpc_per_s,
                med.rtt_us_p50,
                med.rtt_us_p99,
                "",
                med.per_server.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ")
            );
            println!(
                "summary tool=rpctest mode=mux servers={} tx_policy={} inflight={} rounds={} calls={} rpc_per_s={:.0} rtt_us_p50={:.1} rtt_us_p99={:.1} per_server={} failed_servers={} result={}",
                servers.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(","),
                serde_json::to_value(policy)?.as_str().unwrap_or("?"),
                window,
                rounds.len(),
                total,
                med.rpc_per_s,
                med.rtt_us_p50,
                med.rtt_us_p99,
                totals.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(","),
                failed,
                if ok { "ok" } else { "FAILED" }
            );
        } else {
            println!("summary tool=rpctest mode=mux rounds=0 result=FAILED");
        }
    }
    Ok(if ok { 0 } else { 1 })
}

/// One round: a fresh client mux over every server.
#[allow(clippy::too_many_arguments)]
fn round(
    r: u64,
    servers: &[Target],
    policy: Policy,
    window: usize,
    count: Option<u64>,
    duration: Option<Duration>,
    io_timeout: Duration,
    call: &dyn Fn(u32, &mut Vec<u8>),
) -> anyhow::Result<RoundOut> {
    let mut cfg = Config { workers: 1, placement: Placement::Unpinned, ..Config::default() };
    cfg.core.tx_policy = policy.into();
    let mux = Mux::new(cfg)?;
    let sock = mux.socket(SockType::SeqPacket)?;
    sock.set_read_timeout(Some(Duration::from_millis(20).min(io_timeout)))?;
    let mut index: HashMap<PsockId, usize> = HashMap::new();
    for (i, t) in servers.iter().enumerate() {
        let conn = connect(t, io_timeout)?;
        let p = mux.attach(&conn, connmux::parsers::from_spec("oncrpc:strip").expect("built-in parser"))?;
        index.insert(p, i);
    }
    let mut out = RoundOut {
        round: r,
        calls: 0,
        secs: 0.0,
        rpc_per_s: 0.0,
        rtt_us_p50: 0.0,
        rtt_us_p99: 0.0,
        rtt_us_max: 0.0,
        per_server: vec![0; servers.len()],
        failed_servers: Vec::new(),
        resent: 0,
        duplicates: 0,
    };
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    // xid → when the call was first sent.
    let mut inflight: HashMap<u32, Instant> = HashMap::with_capacity(window);
    // Xids start at a round-dependent value so that rounds never share one.
    let first_xid = (r as u32).wrapping_mul(0x0100_0000);
    let mut next = first_xid;
    let mut buf = Vec::with_capacity(64);
    let start = Instant::now();
    let mut last_reply = start;
    let mut live = servers.len();
    let sent_all =
        |sent: u64, now: Instant| count.is_some_and(|n| sent >= n) || duration.is_some_and(|d| now - start >= d);
    let mut sent: u64 = 0;
    loop {
        let now = Instant::now();
        while inflight.len() < window && !sent_all(sent, now) {
            buf.clear();
            call(next, &mut buf);
            sock.send(&buf)?;
            inflight.insert(next, now);
            next = next.wrapping_add(1);
            sent += 1;
        }
        if inflight.is_empty() {
            break;
        }
        match sock.recv_msg() {
            Ok(m) => {
                let xid = check_reply(&m.data, None).map_err(|e| anyhow::anyhow!("bad reply: {e}"))?;
                let now = Instant::now();
                match inflight.remove(&xid) {
                    Some(t0) => {
                        hist.saturating_record((now - t0).as_nanos().div_ceil(1000).max(1) as u64);
                        out.calls += 1;
                        last_reply = now;
                        if let Some(&i) = index.get(&m.psock) {
                            out.per_server[i] += 1;
                        }
                    }
                    // A call sent again after a server failed, answered twice.
                    None if xid.wrapping_sub(first_xid) < next.wrapping_sub(first_xid) => out.duplicates += 1,
                    None => anyhow::bail!("reply with xid {xid:#x}, which no call had"),
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if last_reply.elapsed() > io_timeout {
                    anyhow::bail!("no reply for {io_timeout:?} with {} calls in flight", inflight.len());
                }
            }
            Err(e) => return Err(e.into()),
        }
        while let Ok(ev) = mux.events().try_recv() {
            let name = index.get(&ev.psock).map_or("?", |&i| servers[i].name.as_str());
            eprintln!("rpctest: server {name} failed ({:?}); its unanswered calls go to the others", ev.error);
            if mux.unattach_id(ev.psock).is_ok() {
                out.failed_servers.push(name.to_owned());
                live -= 1;
            }
            if live == 0 {
                anyhow::bail!("every server failed");
            }
            let xids: Vec<u32> = inflight.keys().copied().collect();
            for xid in xids {
                buf.clear();
                call(xid, &mut buf);
                sock.send(&buf)?;
                out.resent += 1;
            }
            last_reply = Instant::now();
        }
    }
    out.secs = (last_reply - start).as_secs_f64();
    out.rpc_per_s = if out.secs > 0.0 { out.calls as f64 / out.secs } else { 0.0 };
    out.rtt_us_p50 = hist.value_at_quantile(0.5) as f64;
    out.rtt_us_p99 = hist.value_at_quantile(0.99) as f64;
    out.rtt_us_max = hist.max() as f64;
    Ok(out)
}

fn connect(t: &Target, timeout: Duration) -> anyhow::Result<TcpStream> {
    let mut last = None;
    for a in &t.addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(anyhow::anyhow!("connect to {}: {}", t.name, last.map_or("no address".into(), |e| e.to_string())))
}
