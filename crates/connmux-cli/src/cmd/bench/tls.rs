//! `connmux bench tls`: what TLS costs the NULL-call RPC server.
//!
//! Two `rpc-server` processes of the same build, placement and driver, one
//! plain and one with `--tls` (a generated certificate; TLS psocks in the
//! runtime), each driven by `connmux rpctest` (plain, or `--tls` trusting the
//! generated CA). The handshake happens at connect, before rpctest's clock
//! starts, so the figures are the steady-state cost of records: decryption of
//! the calls, encryption of the replies, and the extra copies.
//!
//! Rounds are interleaved: every round measures every setting on both
//! servers, the order alternating round by round; the table shows the median
//! over rounds of RPC/s and median RTT for each, and the ratio TLS/plain.

use anyhow::Context;

use super::rpc::{parse_setting, placement};
use super::{cpu_list, exe, free_port, loadavg, loadgen, ratio, taskset, Figures, Proc};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rounds (each measures every setting on both servers).
    #[arg(short = 'i', long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds per measurement.
    #[arg(short = 'd', long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Load settings THREADS:IN_FLIGHT (rpctest -j and -a).
    #[arg(long, value_delimiter = ',', default_value = "1:1,1:32,8:16")]
    pub settings: Vec<String>,
    /// Placement of both servers and the load generator: cpu0 (everything on
    /// CPU 0), spread (a worker on each of CPUs 0 and 1), or a CPU list.
    #[arg(long, default_value = "cpu0")]
    pub placement: String,
    /// I/O driver of both servers: auto, epoll or uring.
    #[arg(long, default_value = "auto")]
    pub driver: String,
    /// A smoke run: two rounds of 0.3 s, settings 1:1 and 1:32.
    #[arg(long)]
    pub quick: bool,
}

fn start(p: &super::rpc::Placement, driver: &str, tls_ca: Option<&std::path::Path>) -> anyhow::Result<Proc> {
    let port = free_port()?;
    let mut c = taskset(&p.cpus, exe()?);
    c.args(["rpc-server", "-l", &format!("127.0.0.1:{port}"), "--workers", &p.cpus.len().to_string()]).args([
        "--cpus",
        &cpu_list(&p.cpus),
        "--driver",
        driver,
        "--no-stats-socket",
    ]);
    if let Some(ca) = tls_ca {
        c.arg("--tls").arg("--tls-ca-out").arg(ca);
    }
    Proc::spawn(if tls_ca.is_some() { "rpc-server --tls" } else { "rpc-server" }, c, port)
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.rounds = 2;
        a.seconds = 0.3;
        a.settings = vec!["1:1".into(), "1:32".into()];
    }
    anyhow::ensure!(a.rounds > 0 && a.seconds > 0.0, "--rounds and --seconds must be positive");
    let settings = a.settings.iter().map(|s| parse_setting(s)).collect::<anyhow::Result<Vec<_>>>()?;
    let p = placement(&a.placement)?;
    let dir = std::env::temp_dir().join(format!("connmux-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca = dir.join("ca.pem");
    let plain = start(&p, &a.driver, None)?;
    let tls = start(&p, &a.driver, Some(&ca))?;
    println!(
        "connmux bench tls: ONC RPC NULL calls over loopback, rpc-server plain vs --tls (TLS 1.3, rustls/ring, \
         handshake before the clock), CPUs {} for servers and load, driver {}; {} round(s) of {} s, interleaved; \
         medians over rounds; load avg {}",
        cpu_list(&p.cpus),
        a.driver,
        a.rounds,
        a.seconds,
        loadavg()
    );
    // results[setting][0 = plain, 1 = tls]
    let mut results: Vec<[Vec<Figures>; 2]> = vec![[Vec::new(), Vec::new()]; settings.len()];
    for round in 0..a.rounds {
        for (si, s) in settings.iter().enumerate() {
            let base = s.rpctest_args(a.seconds);
            for k in 0..2 {
                let which = (k + round + si) % 2;
                let (srv, mut args) = if which == 0 { (&plain, base.clone()) } else { (&tls, base.clone()) };
                if which == 1 {
                    args.extend(["--tls".into(), "--tls-ca".into(), ca.display().to_string()]);
                }
                let f = loadgen("rpctest", &[], &p.cpus, &args, srv.addr)
                    .with_context(|| format!("round {} {s} against {}", round + 1, srv.name))?;
                results[si][which].push(f);
            }
        }
        eprintln!("bench tls: round {}/{} done (load avg {})", round + 1, a.rounds, loadavg());
    }
    drop((plain, tls));
    let _ = std::fs::remove_dir_all(&dir);
    println!();
    println!(
        "{:<12} {:>11} {:>11} {:>9} {:>10} {:>10} {:>9}",
        "setting", "plain RPC/s", "TLS RPC/s", "TLS/plain", "plain p50", "TLS p50", "TLS/plain"
    );
    for (si, s) in settings.iter().enumerate() {
        let pl = Figures::median_of(&results[si][0]);
        let tl = Figures::median_of(&results[si][1]);
        println!(
            "{:<12} {:>11.0} {:>11.0} {:>9} {:>10.1} {:>10.1} {:>9}",
            s.to_string(),
            pl.rate,
            tl.rate,
            ratio(tl.rate, pl.rate),
            pl.p50_us,
            tl.p50_us,
            ratio(tl.p50_us, pl.p50_us)
        );
    }
    println!(
        "(p50 = median RTT in µs; RPC/s and p50 are medians over {} rounds; the machine is shared and noisy: \
         compare ratios, not absolutes)",
        a.rounds
    );
    Ok(0)
}
