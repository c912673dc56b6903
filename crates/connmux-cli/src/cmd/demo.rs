//! `connmux demo`: the main job in one command. Starts the connmux ONC RPC
//! server and the thread-per-connection baseline in this process, drives each
//! with `connmux rpctest` (a separate process) over loopback, interleaving the
//! two round by round, and prints RPC/s, median and p99 round-trip time, and
//! the ratio connmux / baseline, as medians over the rounds.
//!
//! Placement: everything (both servers and the load generator) runs on one
//! CPU by default. On a small machine a wake-up on the other CPU costs tens of
//! microseconds, so an unpinned run measures the scheduler, not the servers
//! (`docs/performance.md`). `--cpus 0,1` gives the servers one worker per CPU
//! and lets the load generator run on both. The server's worker count is set
//! here from `--cpus`, not left to `rpc-server`'s default (one per CPU), so
//! the demo measures the placement it prints.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use connmux::{Config, Placement};
use serde_json::Value;

use crate::cmd::baseline::Baseline;
use crate::cmd::loadgen::report::median;
use crate::cmd::server::{registry, start_rpc_service};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rounds per server and setting; the servers take turns round by round.
    #[arg(short = 'i', long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds per round.
    #[arg(short = 'd', long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Load settings as THREADS:IN_FLIGHT (rpctest's -j and -a), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1:1,1:32,8:16")]
    pub settings: Vec<String>,
    /// CPUs for the servers' workers (one worker per CPU) and the load
    /// generator, e.g. "0" (default) or "0,1".
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub cpus: Vec<usize>,
    /// I/O driver of the connmux server: auto, epoll or uring.
    #[arg(long, default_value = "auto")]
    pub driver: String,
    /// Only the connmux server (no thread-per-connection baseline).
    #[arg(long)]
    pub no_baseline: bool,
}

/// One load setting.
#[derive(Clone, Copy, Debug)]
struct Setting {
    threads: u64,
    inflight: u64,
}

fn parse_setting(s: &str) -> anyhow::Result<Setting> {
    let (j, a) = s.split_once(':').with_context(|| format!("--settings {s}: want THREADS:IN_FLIGHT"))?;
    let setting = Setting { threads: j.trim().parse()?, inflight: a.trim().parse()? };
    if setting.threads == 0 || setting.inflight == 0 || setting.threads > 1024 {
        bail!("--settings {s}: threads must be 1..=1024 and in-flight at least 1");
    }
    Ok(setting)
}

/// The median-over-rounds figures of one rpctest run (one round).
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
}

/// Run one round of rpctest against `addr` and read its JSON report.
fn rpctest(addr: SocketAddr, s: Setting, seconds: f64, cpus: &[usize]) -> anyhow::Result<Figures> {
    let exe = std::env::current_exe().context("locating the connmux binary")?;
    let cpu_list = cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    let out = Command::new(exe)
        .args(["rpctest", "--json", "--no-progress", "-i", "1"])
        .args(["-j", &s.threads.to_string(), "-a", &s.inflight.to_string()])
        .args(["-d", &seconds.to_string(), "--cpu", &cpu_list])
        .arg(addr.to_string())
        .output()
        .context("running rpctest")?;
    let doc: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "rpctest printed no JSON report (exit {:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if doc["ok"] != Value::Bool(true) || !out.status.success() {
        bail!("rpctest against {addr} failed: {}", doc["error"].as_str().unwrap_or("reply errors or mismatches"));
    }
    let m = &doc["median"];
    let f = |k: &str| m[k].as_f64().with_context(|| format!("rpctest report lacks median.{k}"));
    Ok(Figures { rate: f("rate")?, p50_us: f("p50_us")?, p99_us: f("p99_us")? })
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let settings = a.settings.iter().map(|s| parse_setting(s)).collect::<anyhow::Result<Vec<_>>>()?;
    if a.rounds == 0 || a.seconds.is_nan() || a.seconds <= 0.0 {
        bail!("--rounds and --seconds must be positive");
    }
    let avail = connmux_sys::affinity::available_cpus()?;
    if let Some(c) = a.cpus.iter().find(|c| !avail.contains(c)) {
        bail!("--cpus: CPU {c} is not available to this process (available: {avail:?})");
    }
    // The baseline's threads inherit this thread's placement.
    connmux_sys::affinity::pin_current_thread(a.cpus[0])?;

    let mut config = Config::default();
    config.workers = a.cpus.len();
    config.placement = Placement::Cpus(a.cpus.clone());
    config.driver = crate::cmd::server::parse_driver(&a.driver)?;
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("literal");
    let svc = start_rpc_service(config, listen, registry(&[])?)?;
    let base = if a.no_baseline { None } else { Some(Baseline::start_rpc(listen, registry(&[])?)?) };
    let mut servers: Vec<(&str, SocketAddr)> = vec![("connmux", svc.local_addr())];
    if let Some(b) = &base {
        servers.push(("thread-per-conn", b.local));
    }
    println!(
        "connmux demo: ONC RPC NULL calls (NFS v3) over loopback; rpc-server with {} worker(s) ({:?} driver) on CPU {:?}; \
         {} round(s) of {}s per server and setting, interleaved; figures are medians over rounds",
        a.cpus.len(),
        svc.mux().driver(),
        a.cpus,
        a.rounds,
        a.seconds
    );

    // results[setting][server] = one Figures per round
    let mut results = vec![vec![Vec::<Figures>::new(); servers.len()]; settings.len()];
    for round in 0..a.rounds {
        for (si, s) in settings.iter().enumerate() {
            for (vi, (name, addr)) in servers.iter().enumerate() {
                let f = rpctest(*addr, *s, a.seconds, &a.cpus)
                    .with_context(|| format!("round {} -j{} -a{} against {name}", round + 1, s.threads, s.inflight))?;
                results[si][vi].push(f);
            }
        }
        eprintln!("round {}/{} done", round + 1, a.rounds);
    }

    println!();
    println!(
        "{:<12} {:<16} {:>12} {:>10} {:>10} {:>10}",
        "setting", "server", "RPC/s", "p50_us", "p99_us", "vs thread"
    );
    for (si, s) in settings.iter().enumerate() {
        let med: Vec<Figures> = results[si]
            .iter()
            .map(|rs| Figures {
                rate: median(rs.iter().map(|f| f.rate).collect()),
                p50_us: median(rs.iter().map(|f| f.p50_us).collect()),
                p99_us: median(rs.iter().map(|f| f.p99_us).collect()),
            })
            .collect();
        for (vi, (name, _)) in servers.iter().enumerate() {
            let ratio = match med.get(1) {
                Some(b) if b.rate > 0.0 => format!("{:.2}x", med[vi].rate / b.rate),
                _ => "-".into(),
            };
            println!(
                "{:<12} {:<16} {:>12.0} {:>10.1} {:>10.1} {:>10}",
                format!("-j{} -a{}", s.threads, s.inflight),
                name,
                med[vi].rate,
                med[vi].p50_us,
                med[vi].p99_us,
                ratio
            );
        }
    }
    let st = svc.mux().stats();
    println!();
    println!(
        "connmux rpc-server totals: {} calls answered, {} connections accepted, {} closed for bad input",
        st.tx_msgs,
        svc.stats().accepted.load(std::sync::atomic::Ordering::Relaxed),
        st.psock.rx_msg_too_big + st.psock.rx_bad_hdr_len + st.psock.rx_interrupted,
    );
    svc.shutdown();
    drop(base);
    // Let the load generator's sockets close before the process exits.
    std::thread::sleep(Duration::from_millis(10));
    Ok(0)
}
