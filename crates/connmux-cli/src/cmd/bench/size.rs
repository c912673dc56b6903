//! `connmux bench size`: message echo by message size.
//!
//! `connmux echo-server --mode message --parser l4` (whole messages through
//! the multiplexor) against `echo-server --engine thread` (one thread per
//! connection doing plain `read`/`write` of whatever arrives: raw TCP), both
//! driven by `connmux echotest --mode msg` with the same messages (a 4-byte
//! length and the payload), so both move exactly the same bytes. Medians over
//! interleaved rounds of messages/s, payload MB/s one way, and median RTT.

use std::path::PathBuf;

use anyhow::Context;

use super::rpc::placement;
use super::{congestion_control, cpu_list, exe, free_port, loadavg, loadgen, ratio, taskset, verdict, Figures, Proc};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Payload sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "64,1024,16384,65536,262144,1048576")]
    pub sizes: Vec<u64>,
    /// Messages in flight on the one connection.
    #[arg(short = 'a', long, default_value_t = 2)]
    pub inflight: u64,
    /// Rounds, each on new connections. With BBR the load's pacing of large
    /// messages can differ from one connection to the next (see
    /// docs/performance.md, "Message size"), so many short rounds.
    #[arg(short = 'i', long, default_value_t = 7)]
    pub rounds: usize,
    #[arg(short = 'd', long, default_value_t = 0.5)]
    pub seconds: f64,
    /// I/O driver of the connmux server: auto, epoll or uring.
    #[arg(long, default_value = "auto")]
    pub driver: String,
    /// Placement: cpu0 or spread.
    #[arg(long, default_value = "cpu0")]
    pub placement: String,
    /// Unused (kept so every mode takes the same options).
    #[arg(long, hide = true)]
    pub yardstick: Option<PathBuf>,
    /// A smoke run: 64 B and 64 KiB, one round of 0.3 s.
    #[arg(long)]
    pub quick: bool,
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.sizes = vec![64, 65536];
        a.rounds = 1;
        a.seconds = 0.3;
    }
    let p = placement(&a.placement)?;
    let n = p.cpus.len().to_string();
    let max = a.sizes.iter().max().copied().unwrap_or(0) + 4096;
    let start = |kind: &str| -> anyhow::Result<Proc> {
        let port = free_port()?;
        let listen = format!("127.0.0.1:{port}");
        let mut c = taskset(&p.cpus, exe()?);
        c.args(["echo-server", "-l", &listen, "--no-stats-socket"]);
        if kind == "connmux" {
            c.args(["--mode", "message", "--parser", "l4", "--max-msg", &max.to_string()])
                .args(["--workers", &n, "--cpus", &cpu_list(&p.cpus)])
                .args(["--driver", &a.driver]);
        } else {
            c.args(["--engine", "thread"]);
        }
        Proc::spawn(kind, c, port)
    };
    let servers = [start("connmux")?, start("raw-tcp")?];
    println!(
        "connmux bench size: message echo (l4 framing), one connection, -a{}, {} driver; servers and load on {:?}; \
         {} round(s) of {} s, interleaved; medians; TCP congestion control {}; load avg {}",
        a.inflight,
        a.driver,
        p.cpus,
        a.rounds,
        a.seconds,
        congestion_control(),
        loadavg()
    );
    let mut res = vec![vec![Vec::<Figures>::new(); servers.len()]; a.sizes.len()];
    for round in 0..a.rounds {
        for (zi, size) in a.sizes.iter().enumerate() {
            for k in 0..servers.len() {
                let si = (k + round + zi) % servers.len();
                let args: Vec<String> = ["--mode", "msg", "-l", &size.to_string(), "-j", "1"]
                    .into_iter()
                    .map(String::from)
                    .chain(["-a".into(), a.inflight.to_string(), "-d".into(), a.seconds.to_string()])
                    .collect();
                let f = loadgen("echotest", &[], &p.cpus, &args, servers[si].addr)
                    .with_context(|| format!("{size} B against {}", servers[si].name))?;
                res[zi][si].push(f);
            }
        }
        eprintln!("bench size: round {}/{} done", round + 1, a.rounds);
    }
    drop(servers);
    println!();
    println!(
        "{:>8} {:>12} {:>10} {:>10} {:>12} {:>10} {:>10} {:>9}",
        "bytes", "connmux/s", "MB/s", "p50_us", "raw-tcp/s", "MB/s", "p50_us", "ratio"
    );
    let mut lines = Vec::new();
    for (zi, &size) in a.sizes.iter().enumerate() {
        let c = Figures::median_of(&res[zi][0]);
        let r = Figures::median_of(&res[zi][1]);
        let mb = |f: &Figures| f.rate * size as f64 / 1e6;
        println!(
            "{:>8} {:>12.0} {:>10.1} {:>10.1} {:>12.0} {:>10.1} {:>10.1} {:>9}",
            size,
            c.rate,
            mb(&c),
            c.p50_us,
            r.rate,
            mb(&r),
            r.p50_us,
            ratio(c.rate, r.rate)
        );
        if size >= 65536 {
            let x = c.rate / r.rate;
            lines.push(format!("{} {size} B messages >= 0.9x raw TCP: {x:.2}x", verdict(x >= 0.9)));
        }
    }
    if !lines.is_empty() {
        println!();
        println!("targets:");
        for l in lines {
            println!("  {l}");
        }
    }
    Ok(0)
}
