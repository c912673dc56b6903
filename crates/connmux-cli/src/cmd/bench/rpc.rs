//! `connmux bench rpc`: NULL-call throughput and RTT of every RPC server we
//! have, under the same load and the same CPU placement, in one run.
//!
//! Servers: `rpc-server` (connmux), `raw` (`bench raw-server`: the same job on
//! bare epoll), `thread` (`rpc-server --engine thread`): all in this binary.
//! External ceilings only when asked for: with `--yardstick DIR`, also
//! `yardstick` (the C `limit_server` from DIR, built at run time) and
//! `ganesha` (nfs-ganesha, started in its own network namespace by DIR's
//! `ganesha/run.sh` when `ganesha.nfsd` is installed).
//!
//! Placements: `cpu0` puts every server (one worker) and the load generator on
//! CPU 0; `spread` gives each server one worker per CPU (0 and 1) and pins the
//! load generator's connection threads to CPUs 0 and 1 in turn. Each server
//! process runs under `taskset -c` of its placement's CPUs and is given its
//! worker count and CPUs explicitly (`--workers`, `--cpus`), never the
//! server's default, so a row means the same placement whatever the default
//! becomes; `connmux-default` is the one exception, there to measure it.
//!
//! Rounds are interleaved: every round runs every placement, setting and
//! server once (servers in a rotating order), and the table shows the median
//! over rounds of RPC/s, median RTT and p99 RTT, with ratios to the raw loop,
//! thread per connection and (when run) the yardstick. The targets compare
//! rpc-server with the ceiling: the yardstick when it runs, else the raw loop.

use std::path::PathBuf;

use anyhow::Context;

use super::{
    build_yardstick, cpu_list, exe, free_port, loadavg, loadgen, ratio, taskset, verdict, Figures, Proc, Rounds,
};

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("rounds", |a| a.help("Rounds (each runs every placement, setting and server once)")),
    mut_arg("seconds", |a| a.help("Seconds per run"))
)]
pub struct Args {
    #[command(flatten)]
    pub run: Rounds,
    /// Load settings THREADS:IN_FLIGHT (rpctest -j and -a).
    #[arg(long, value_delimiter = ',', default_value = "1:1,1:32,1:128,2:128,8:128,64:16")]
    pub settings: Vec<String>,
    /// Placements: cpu0 (everything on CPU 0), spread (one worker per CPU 0 and 1).
    #[arg(long, value_delimiter = ',', default_value = "cpu0,spread")]
    pub placements: Vec<String>,
    /// Servers to measure: connmux, raw, thread; yardstick and ganesha with --yardstick;
    /// also connmux-epoll, connmux-uring (one driver), connmux-in-turn
    /// (connections to the workers in turn, not by incoming CPU) and
    /// connmux-default (rpc-server with its default flags: one worker per CPU
    /// of the placement's affinity mask).
    #[arg(long, value_delimiter = ',', default_value = "connmux,raw,thread")]
    pub servers: Vec<String>,
    /// Directory of an external ceiling server's limit_server.c (built at run
    /// time; its ganesha/run.sh starts nfs-ganesha where installed). Adds the
    /// columns yardstick and ganesha; without it only connmux's own servers run.
    #[arg(long)]
    pub yardstick: Option<PathBuf>,
    /// A smoke run: one round of 0.3 s, settings 1:1 and 1:32, CPU 0 only, no ganesha.
    #[arg(long)]
    pub quick: bool,
}

/// A placement: its name and the CPUs of its servers' workers and load.
#[derive(Clone, Debug)]
pub struct Placement {
    pub name: String,
    pub cpus: Vec<usize>,
}

pub fn placement(name: &str) -> anyhow::Result<Placement> {
    let avail = connmux_sys::affinity::available_cpus()?;
    let cpus = match name {
        "cpu0" => vec![0],
        "spread" => vec![0, 1],
        other => super::super::loadgen::target::parse_cpu_list(other)
            .map_err(|e| anyhow::anyhow!("placement {other}: {e}"))?,
    };
    if let Some(c) = cpus.iter().find(|c| !avail.contains(c)) {
        anyhow::bail!("placement {name}: CPU {c} is not available (available: {avail:?})");
    }
    Ok(Placement { name: name.into(), cpus })
}

/// Start one RPC server of kind `kind` with the placement's workers.
pub fn start_server(kind: &str, p: &Placement, yard: Option<&PathBuf>) -> anyhow::Result<Option<Proc>> {
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let n = p.cpus.len().to_string();
    let cpus = cpu_list(&p.cpus);
    let exe = exe()?;
    let cmd = match kind {
        "connmux" | "connmux-in-turn" => {
            let mut c = taskset(&p.cpus, &exe);
            c.args(["rpc-server", "-l", &listen, "--workers", &n, "--cpus", &cpus, "--no-stats-socket"]);
            if kind == "connmux-in-turn" {
                // Connections to the workers in turn, not by incoming CPU.
                c.args(["--attach", "in-turn"]);
            }
            c
        }
        "connmux-default" => {
            // No --workers or --cpus: the server's own default (one worker
            // per CPU it may run on) under the placement's taskset.
            let mut c = taskset(&p.cpus, &exe);
            c.args(["rpc-server", "-l", &listen, "--no-stats-socket"]);
            c
        }
        "connmux-epoll" | "connmux-uring" => {
            let driver = kind.trim_start_matches("connmux-");
            let mut c = taskset(&p.cpus, &exe);
            c.args(["bench", "mux-server", "-l", &listen, "--cpus", &cpus, "--driver", driver]);
            c
        }
        "raw" => {
            let mut c = taskset(&p.cpus, &exe);
            c.args(["bench", "raw-server", "-l", &listen, "--threads", &n, "--cpus", &cpus]);
            c
        }
        "thread" => {
            let mut c = taskset(&p.cpus, &exe);
            c.args(["rpc-server", "--engine", "thread", "-l", &listen, "--no-stats-socket"]);
            c
        }
        "yardstick" => {
            let Some(bin) = yard else { return Ok(None) };
            let mut c = taskset(&p.cpus, bin);
            c.args(["-t", &n, "-p", &port.to_string(), "-q"]);
            if p.cpus.len() > 1 {
                c.arg("-P");
            }
            c
        }
        "ganesha" => anyhow::bail!("nfs-ganesha is started per placement by the rpc benchmark"),
        other => anyhow::bail!("unknown server {other:?}"),
    };
    Proc::spawn(&format!("{kind}@{}", p.name), cmd, port).map(Some)
}

/// nfs-ganesha via the yardstick's `ganesha/run.sh` (its own network
/// namespace); its threads are then moved onto the placement's CPUs.
fn start_ganesha(p: &Placement, yardstick_dir: &std::path::Path) -> anyhow::Result<Option<Proc>> {
    let run_sh = yardstick_dir.join("ganesha/run.sh");
    if !run_sh.exists() || !super::on_path("ganesha.nfsd") {
        eprintln!("bench: nfs-ganesha is not installed (ganesha.nfsd), or no {}; skipped", run_sh.display());
        return Ok(None);
    }
    let st = std::process::Command::new("bash").arg(&run_sh).arg("start").status()?;
    if !st.success() {
        eprintln!("bench: {} start failed; ganesha skipped", run_sh.display());
        return Ok(None);
    }
    let pid: u32 =
        std::fs::read_to_string("/tmp/limit_ganesha/ganesha.pid").context("ganesha pid file")?.trim().parse()?;
    let _ = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu_list(&p.cpus), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status();
    let stop = Box::new(move || {
        let _ = std::process::Command::new("bash").arg(&run_sh).arg("stop").status();
    });
    Ok(Some(Proc::external(
        &format!("ganesha@{}", p.name),
        "127.0.0.1:2049".parse().expect("literal"),
        pid,
        vec!["ip".into(), "netns".into(), "exec".into(), "limit_ns".into()],
        stop,
    )))
}

#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub threads: u64,
    pub inflight: u64,
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "-j{} -a{}", self.threads, self.inflight)
    }
}

impl Setting {
    /// rpctest's arguments for this setting, runs of `seconds`.
    pub fn rpctest_args(&self, seconds: f64) -> Vec<String> {
        ["-j", &self.threads.to_string(), "-a", &self.inflight.to_string(), "-d", &seconds.to_string()]
            .map(String::from)
            .to_vec()
    }
}

pub fn parse_setting(s: &str) -> anyhow::Result<Setting> {
    let (j, a) = s.split_once(':').with_context(|| format!("setting {s}: want THREADS:IN_FLIGHT"))?;
    Ok(Setting { threads: j.trim().parse()?, inflight: a.trim().parse()? })
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.run = Rounds::quick(1);
        a.settings = vec!["1:1".into(), "1:32".into()];
        a.placements = vec!["cpu0".into()];
    }
    super::with_external(&mut a.servers, a.yardstick.as_deref(), &["yardstick", "ganesha"])?;
    if a.quick {
        a.servers.retain(|s| s != "ganesha");
    }
    a.run.check()?;
    let settings = a.settings.iter().map(|s| parse_setting(s)).collect::<anyhow::Result<Vec<_>>>()?;
    let placements = a.placements.iter().map(|p| placement(p)).collect::<anyhow::Result<Vec<_>>>()?;
    let yard = if a.servers.iter().any(|s| s == "yardstick" || s == "ganesha") {
        build_yardstick(a.yardstick.as_deref())
    } else {
        None
    };
    // Ganesha is one process for the whole run: it only runs in the first placement
    // it is started for, so start it per placement in turn (see below).
    let kinds: Vec<&str> = a.servers.iter().map(String::as_str).collect();
    println!(
        "connmux bench rpc: ONC RPC NULL calls over loopback; {} round(s) of {} s per server, setting and placement, \
         interleaved; medians over rounds; load avg {}",
        a.run.rounds,
        a.run.seconds,
        loadavg()
    );
    // results[placement][setting][server] = figures per round
    let mut names: Vec<Vec<String>> = Vec::new();
    let mut results: Vec<Vec<Vec<Vec<Figures>>>> = Vec::new();
    // Start every server except ganesha up front (idle servers cost nothing).
    let mut servers: Vec<Vec<Proc>> = Vec::new();
    for p in &placements {
        let mut v = Vec::new();
        for k in kinds.iter().filter(|k| **k != "ganesha") {
            if let Some(s) = start_server(k, p, yard.as_ref())? {
                v.push(s);
            }
        }
        names.push(v.iter().map(|s| short(&s.name)).collect());
        results.push(vec![vec![Vec::new(); v.len() + 1]; settings.len()]);
        servers.push(v);
    }
    let want_ganesha = kinds.contains(&"ganesha") && super::on_path("ganesha.nfsd");
    if kinds.contains(&"ganesha") && !want_ganesha {
        eprintln!("bench: nfs-ganesha is not installed (no ganesha.nfsd on PATH); skipped");
    }
    let mut has_ganesha = vec![false; placements.len()];
    for round in 0..a.run.rounds {
        for (pi, p) in placements.iter().enumerate() {
            let ganesha = match (&a.yardstick, want_ganesha) {
                (Some(dir), true) => start_ganesha(p, dir)?,
                _ => None,
            };
            if ganesha.is_some() {
                has_ganesha[pi] = true;
            }
            let n = servers[pi].len();
            for (si, s) in settings.iter().enumerate() {
                let args = s.rpctest_args(a.run.seconds);
                for k in 0..n + 1 {
                    let vi = (k + round + si) % (n + 1);
                    let srv = if vi < n { Some(&servers[pi][vi]) } else { ganesha.as_ref() };
                    let Some(srv) = srv else { continue };
                    let f = loadgen("rpctest", &srv.client_prefix, &p.cpus, &args, srv.addr)
                        .with_context(|| format!("round {} {s} against {}", round + 1, srv.name))?;
                    results[pi][si][vi].push(f);
                }
            }
        }
        eprintln!("bench rpc: round {}/{} done (load avg {})", round + 1, a.run.rounds, loadavg());
    }
    drop(servers);

    // The yardstick's column only when it ran.
    let has_yard = names.iter().flatten().any(|n| n == "yardstick");
    let yard_col = |v: String| if has_yard { format!(" {v:>9}") } else { String::new() };
    println!();
    println!(
        "{:<7} {:<12} {:<15} {:>11} {:>9} {:>9} {:>9} {:>9}{}",
        "place",
        "setting",
        "server",
        "RPC/s",
        "p50_us",
        "p99_us",
        "vs_raw",
        "vs_thread",
        yard_col("vs_yard".into())
    );
    let mut table = Vec::new();
    for (pi, p) in placements.iter().enumerate() {
        let mut nm = names[pi].clone();
        nm.push("ganesha".into());
        for (si, s) in settings.iter().enumerate() {
            let med: Vec<Option<Figures>> =
                results[pi][si].iter().map(|r| (!r.is_empty()).then(|| Figures::median_of(r))).collect();
            let get = |name: &str| nm.iter().position(|n| n == name).and_then(|i| med[i]);
            let (yard_f, raw_f, thr_f) = (get("yardstick"), get("raw"), get("thread"));
            for (vi, m) in med.iter().enumerate() {
                let Some(m) = m else { continue };
                let r = |b: Option<Figures>| b.map_or("-".into(), |b| ratio(m.rate, b.rate));
                println!(
                    "{:<7} {:<12} {:<15} {:>11.0} {:>9.1} {:>9.1} {:>9} {:>9}{}",
                    p.name,
                    s.to_string(),
                    nm[vi],
                    m.rate,
                    m.p50_us,
                    m.p99_us,
                    r(raw_f),
                    r(thr_f),
                    yard_col(r(yard_f))
                );
                table.push((p.name.clone(), *s, nm[vi].clone(), *m));
            }
        }
    }
    targets(&table, &has_ganesha);
    Ok(0)
}

fn short(name: &str) -> String {
    name.split('@').next().unwrap_or(name).to_string()
}

/// Print the targets of the rpc benchmark with PASS/MISS. The ceiling is
/// the yardstick when it ran, else connmux's own raw epoll loop.
fn targets(table: &[(String, Setting, String, Figures)], _has_ganesha: &[bool]) {
    let find = |place: &str, s: Setting, server: &str| {
        table
            .iter()
            .find(|(p, t, n, _)| p == place && t.threads == s.threads && t.inflight == s.inflight && n == server)
            .map(|x| x.3)
    };
    let mut lines = Vec::new();
    for (p, s, n, f) in table {
        if n != "connmux" {
            continue;
        }
        let ceiling = ["yardstick", "raw"].into_iter().find_map(|c| find(p, *s, c).map(|f| (c, f)));
        if let Some((c, y)) = ceiling {
            let spread_target = p == "spread" && s.inflight == 128 && (s.threads == 2 || s.threads == 8);
            if p == "cpu0" || spread_target {
                let r = f.rate / y.rate;
                lines.push(format!("{} rpc-server >= 0.9x {c} RPC/s, {p} {s}: {r:.2}x", verdict(r >= 0.9)));
            }
            if s.threads == 1 && s.inflight == 1 {
                let r = f.p50_us / y.p50_us;
                lines.push(format!("{} median RTT <= 1.1x {c}, {p} {s}: {r:.2}x", verdict(r <= 1.1)));
            }
        }
        if s.inflight == 128 {
            if let Some(g) = find(p, *s, "ganesha") {
                let r = f.rate / g.rate;
                lines.push(format!("{} rpc-server >= 20x ganesha RPC/s, {p} {s}: {r:.1}x", verdict(r >= 20.0)));
            }
        }
    }
    if !lines.is_empty() {
        println!();
        println!("targets:");
        for l in lines {
            println!("  {l}");
        }
    }
}
