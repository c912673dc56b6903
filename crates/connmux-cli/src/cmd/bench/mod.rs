//! `connmux bench`: the benchmarks, each printing a table of medians over
//! interleaved rounds and ratios against baselines measured in the same run.
//!
//! | mode | what it measures |
//! |---|---|
//! | `rpc` | ONC RPC NULL calls: the rpc-server, a raw-epoll server of our own, and the thread-per-connection server (with `--yardstick DIR`, also an external C ceiling server and nfs-ganesha), under one load and one CPU placement |
//! | `uneven` | one connection's requests burn CPU, the others are light: connmux's default steering, KCM's round robin, thread per connection |
//! | `scale` | 8, 1 000 and 10 000 connections with one call in flight each; RSS per idle connection |
//! | `size` | message echo from 64 B to 1 MiB against a plain read/write echo of the same bytes |
//! | `kcm` | the KCM model itself: application threads on cloned `KcmSocket`s (`recv_msg` + `send_to`, and `recv_batch` + `send_batch_to`) echoing pipelined small messages, against thread per connection, same client |
//! | `recv` | messages/s and median one-way delay of whole messages read through connmux (epoll, io_uring) vs a plain blocking read loop on the same socket, 64 B, 1 KiB, 64 KiB |
//! | `instructions` | user-space instructions per NULL call under callgrind (fixed call counts) |
//! | `tls` | NULL calls to the rpc-server with and without `--tls`: RPC/s, median RTT, ratio |
//! | `hostile` | good clients beside attacks (non-readers, half-close, partial records, slowloris, garbage, RST floods): their rate, errors, replies lost, the server's RSS and counters (not in `all`) |
//! | `9p` | the 9p-server beside diod: getattr, walk+clunk, 1 MiB reads, an uneven mix |
//! | `nfs` | the nfs-server beside nfs-ganesha (FSAL_VFS): GETATTR, 4 KiB and 1 MiB READs and WRITEs (not in `all`) |
//! | `udp` | NULL calls over UDP (`rpctest -u`): the rpc-server's UDP service vs a hand-written recvmmsg/sendmmsg loop and thread per socket (not in `all`) |
//! | `all` | all of the above with their defaults |
//!
//! Every server runs as its own process under `taskset`, and every load
//! generator too (`connmux rpctest`/`echotest --json`, or a hidden `bench`
//! load mode), so placement is the same for everything compared. The
//! servers are given their worker count and CPUs explicitly (`--workers`,
//! `--cpus`, one worker per CPU of the placement), not left to the servers'
//! default of one per CPU, so that a row means the placement it names. See
//! `docs/performance.md` for the figures and why placement matters so much
//! on a small machine.

pub mod hostile;
pub mod instr;
pub mod kcm;
mod kcm_core;
pub mod nfs;
pub mod ninep;
#[path = "../rawepoll.rs"]
pub mod rawepoll;
pub mod recv;
pub mod rpc;
pub mod scale;
pub mod size;
pub mod tls;
pub mod udp;
pub mod uneven;
mod uneven_epoll;
mod uneven_uring;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

#[derive(clap::Args, Debug)]
#[command(about = "Benchmarks: tables of medians over interleaved rounds, with ratios to baselines run alongside")]
pub struct Args {
    #[command(subcommand)]
    pub mode: Mode,
}

#[derive(clap::Subcommand, Debug)]
pub enum Mode {
    /// NULL-call RPC/s and RTT: rpc-server vs raw epoll and thread per connection (--yardstick DIR adds a C ceiling server and ganesha).
    Rpc(rpc::Args),
    /// Uneven work: heavy requests on one connection, light on the others.
    Uneven(uneven::Args),
    /// Many connections: throughput at 1k/10k, RSS per idle connection.
    Scale(scale::Args),
    /// Message echo by size vs a plain read/write echo.
    Size(size::Args),
    /// Receiving through connmux (epoll, io_uring) vs a blocking read loop on the same socket.
    Recv(recv::Args),
    /// The KCM model: application threads on cloned KcmSockets echoing
    /// small messages, against thread per connection.
    Kcm(kcm::Args),
    /// User-space instructions per NULL call (callgrind).
    Instructions(instr::Args),
    /// The cost of TLS: RPC/s and median RTT of rpc-server with and without --tls.
    Tls(tls::Args),
    /// Good clients beside hostile ones (non-readers, half-close, partial
    /// records, slowloris, garbage, RST floods): their rate, errors, replies
    /// lost, the server's RSS and counters. Not part of `all`.
    Hostile(hostile::Args),
    /// The 9p-server beside diod: small operations, 1 MiB reads, an uneven mix.
    #[command(name = "9p")]
    Ninep(ninep::Args),
    /// The nfs-server beside nfs-ganesha (FSAL_VFS): GETATTR, 4 KiB and 1 MiB
    /// READs and WRITEs. Not part of `all`.
    Nfs(nfs::Args),
    /// NULL calls over UDP: the rpc-server's UDP service vs a hand-written
    /// recvmmsg/sendmmsg loop and thread per socket. Not part of `all`.
    Udp(udp::Args),
    /// Every benchmark with its defaults.
    All(AllArgs),
    /// The rpc-server's service (same handler, same parser) with a chosen I/O driver.
    #[command(hide = true)]
    MuxServer(MuxServerArgs),
    /// The minimal raw-epoll ONC RPC NULL server (no framework).
    #[command(hide = true)]
    RawServer(rawepoll::Args),
    /// The server of the uneven benchmark.
    #[command(hide = true)]
    UnevenServer(uneven::ServerArgs),
    /// The load generator of the uneven benchmark.
    #[command(hide = true)]
    UnevenLoad(uneven::LoadArgs),
    /// The many-connection load generator of the scale benchmark.
    #[command(hide = true)]
    ScaleLoad(scale::LoadArgs),
    /// The servers of the kcm benchmark.
    #[command(hide = true)]
    KcmServer(kcm::ServerArgs),
    /// The load generator of the kcm benchmark.
    #[command(hide = true)]
    KcmLoad(kcm::LoadArgs),
    /// The hand-written recvmmsg/sendmmsg UDP NULL server of the udp benchmark.
    #[command(hide = true)]
    UdpLoopServer(udp::ServerArgs),
    /// The thread-per-socket UDP NULL server of the udp benchmark.
    #[command(hide = true)]
    UdpThreadServer(udp::ServerArgs),
}

#[derive(clap::Args, Debug)]
pub struct AllArgs {
    /// Shorter rounds everywhere (a smoke run, not a measurement).
    #[arg(long)]
    pub quick: bool,
    /// Directory of an external ceiling server's limit_server.c, passed to
    /// the modes that measure it (rpc, scale, instructions).
    #[arg(long)]
    pub yardstick: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    match a.mode {
        Mode::Rpc(a) => rpc::run(a),
        Mode::Uneven(a) => uneven::run(a),
        Mode::Scale(a) => scale::run(a),
        Mode::Size(a) => size::run(a),
        Mode::Recv(a) => recv::run(a),
        Mode::Kcm(a) => kcm::run(a),
        Mode::Instructions(a) => instr::run(a),
        Mode::Tls(a) => tls::run(a),
        Mode::Hostile(a) => hostile::run(a),
        Mode::Ninep(a) => ninep::run(a),
        Mode::Nfs(a) => nfs::run(a),
        Mode::Udp(a) => udp::run(a),
        Mode::All(a) => {
            let q: &[&str] = if a.quick { &["bench", "--quick"] } else { &["bench"] };
            let dir = a.yardstick.as_ref().map(|d| d.to_string_lossy().into_owned());
            let mut qy: Vec<&str> = q.to_vec();
            if let Some(d) = &dir {
                qy.extend(["--yardstick", d.as_str()]);
            }
            let mut rc = 0;
            rc |= rpc::run(defaults(&qy))?;
            rc |= uneven::run(defaults(q))?;
            rc |= scale::run(defaults(&qy))?;
            rc |= size::run(defaults(q))?;
            rc |= recv::run(defaults(q))?;
            rc |= instr::run(defaults(&qy))?;
            Ok(rc)
        }
        Mode::MuxServer(a) => run_mux_server(a),
        Mode::RawServer(a) => rawepoll::run(a),
        Mode::UnevenServer(a) => uneven::run_server(a),
        Mode::UnevenLoad(a) => uneven::run_load(a),
        Mode::ScaleLoad(a) => scale::run_load(a),
        Mode::KcmServer(a) => kcm::run_server(a),
        Mode::KcmLoad(a) => kcm::run_load(a),
        Mode::UdpLoopServer(a) | Mode::UdpThreadServer(a) => udp::run_server(a),
    }
}

#[derive(clap::Args, Debug)]
pub struct MuxServerArgs {
    #[arg(short, long)]
    pub listen: std::net::SocketAddr,
    /// One worker per CPU, pinned.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub cpus: Vec<usize>,
    /// auto, epoll or uring.
    #[arg(long, default_value = "auto")]
    pub driver: String,
    /// Stop after this many seconds (default: until killed).
    #[arg(long)]
    pub duration: Option<f64>,
    /// No connection is ever found heavy (`Tuning::slow_handler` and
    /// `busy_handler` at their most): under an instruction counter
    /// (`bench instructions`, callgrind) every request runs ~50 times as
    /// long, so a NULL call would look heavy and go to a lane at times.
    #[arg(long)]
    pub never_heavy: bool,
}

/// `connmux rpc-server` as `crate::cmd::server` builds it, but with the
/// driver chosen here (rpc-server always takes the default, `auto`).
fn run_mux_server(a: MuxServerArgs) -> anyhow::Result<i32> {
    let mut c = connmux::Config::default();
    c.workers = a.cpus.len().max(1);
    c.placement = connmux::Placement::Cpus(a.cpus.clone());
    c.driver = match a.driver.as_str() {
        "auto" => connmux::Driver::Auto,
        "epoll" => connmux::Driver::Epoll,
        "uring" => connmux::Driver::Uring,
        o => bail!("--driver {o}: auto, epoll or uring"),
    };
    if a.never_heavy {
        c.tuning.slow_handler = Duration::MAX;
        c.tuning.busy_handler = Duration::MAX;
    }
    let svc = crate::cmd::server::start_rpc_service(c, a.listen, crate::cmd::server::registry(&[])?)?;
    println!("mux-server listening on {} (driver {:?})", svc.local_addr(), svc.mux().driver());
    let start = Instant::now();
    while a.duration.is_none_or(|d| start.elapsed().as_secs_f64() < d) {
        std::thread::sleep(Duration::from_millis(50));
    }
    svc.shutdown();
    Ok(0)
}

/// The interleaved rounds of a comparison and the seconds of each
/// measurement (`-i`, `-d`). A mode words their help for itself:
/// `#[command(mut_arg("rounds", ..), mut_arg("seconds", ..))]`.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Rounds {
    #[arg(short = 'i', long, default_value_t = 3)]
    pub rounds: usize,
    #[arg(short = 'd', long, default_value_t = 1.0)]
    pub seconds: f64,
}

impl Rounds {
    /// A `--quick` smoke run: `rounds` of 0.3 s.
    pub fn quick(rounds: usize) -> Rounds {
        Rounds { rounds, seconds: 0.3 }
    }

    /// Both must be positive.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.rounds > 0 && self.seconds > 0.0, "--rounds and --seconds must be positive");
        Ok(())
    }
}

/// A mode's arguments as parsed from `argv` (its defaults plus `--quick`).
fn defaults<T: clap::Args + clap::FromArgMatches>(argv: &[&str]) -> T {
    let m = T::augment_args(clap::Command::new("bench")).get_matches_from(argv);
    T::from_arg_matches(&m).expect("every bench mode parses its own defaults")
}

/// The `connmux` binary itself.
pub fn exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("locating the connmux binary")
}

/// A loopback port that was free (TCP and UDP) a moment ago, for a server
/// started next. Chosen below the kernel's ephemeral range
/// (`ip_local_port_range`): a port from that range, as `bind(0)` gives, can
/// be taken in between as the source port of any connection a client makes
/// (a server then failed "Address already in use").
pub fn free_port() -> anyhow::Result<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let low: u16 = range.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(32768);
    const FIRST: u16 = 10_000;
    if low > FIRST + 1000 {
        use std::hash::BuildHasher;
        let span = u64::from(low - FIRST);
        // Randomly seeded: two processes choosing at once choose apart.
        let random = std::collections::hash_map::RandomState::new();
        // Bounded: a few tries at spread-out ports, then the kernel's choice.
        for i in 0..64u64 {
            let port = FIRST + (random.hash_one(i) % span) as u16;
            let free = std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
                && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok();
            if free {
                return Ok(port);
            }
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// `0,1` for `[0, 1]`.
pub fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

pub use crate::cmd::loadgen::report::median;

/// A command run under `taskset -c CPUS`.
pub fn taskset(cpus: &[usize], program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("taskset");
    c.arg("-c").arg(cpu_list(cpus)).arg(program);
    c
}

/// A server process, stopped (SIGKILL) and reaped on drop.
pub struct Proc {
    pub name: String,
    pub addr: SocketAddr,
    child: Option<Child>,
    /// The server's own pid when it differs from the child's (ganesha).
    pub pid: u32,
    /// Command prefix the load generator needs to reach it (a netns).
    pub client_prefix: Vec<String>,
    on_drop: Option<Box<dyn FnOnce()>>,
}

impl Proc {
    /// Spawn `cmd` (stdout discarded, stderr inherited) and wait until `port`
    /// accepts connections.
    pub fn spawn(name: &str, cmd: Command, port: u16) -> anyhow::Result<Proc> {
        Self::spawn_within(name, cmd, port, Duration::from_secs(20))
    }

    /// [`Proc::spawn`] with a limit on the wait for the listener.
    pub fn spawn_within(name: &str, mut cmd: Command, port: u16, limit: Duration) -> anyhow::Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        let pid = child.id();
        let mut p = Proc {
            name: name.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child: Some(child),
            pid,
            client_prefix: Vec::new(),
            on_drop: None,
        };
        p.wait_listening(limit)?;
        Ok(p)
    }

    /// Spawn `cmd` (stdout discarded, stderr inherited) without waiting for
    /// a TCP listener: the caller waits its own way (a UDP server).
    pub fn spawn_detached(name: &str, mut cmd: Command, port: u16) -> anyhow::Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        let pid = child.id();
        Ok(Proc {
            name: name.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child: Some(child),
            pid,
            client_prefix: Vec::new(),
            on_drop: None,
        })
    }

    /// A server that something else started and stops (`stop` runs on drop).
    pub fn external(
        name: &str,
        addr: SocketAddr,
        pid: u32,
        client_prefix: Vec<String>,
        stop: Box<dyn FnOnce()>,
    ) -> Proc {
        Proc { name: name.into(), addr, child: None, pid, client_prefix, on_drop: Some(stop) }
    }

    fn wait_listening(&mut self, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(c) = &mut self.child {
                if let Some(st) = c.try_wait()? {
                    bail!("{} exited before listening ({st})", self.name);
                }
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("{} did not listen on {} within {:?}", self.name, self.addr, limit)
    }

    /// Wait (bounded) for the process to exit by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        if let Some(c) = &mut self.child {
            while start.elapsed() < limit {
                if c.try_wait()?.is_some() {
                    self.child = None;
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            bail!("{} still running after {:?}", self.name, limit);
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

/// Resident set size of a process, KiB (VmRSS).
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")
}

/// One round's figures from a load generator's `--json` median row.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    pub rate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Client CPU seconds of the round.
    pub cpu_s: f64,
}

impl Figures {
    /// Column-wise median of rounds.
    pub fn median_of(rounds: &[Figures]) -> Figures {
        Figures {
            rate: median(rounds.iter().map(|f| f.rate).collect()),
            p50_us: median(rounds.iter().map(|f| f.p50_us).collect()),
            p99_us: median(rounds.iter().map(|f| f.p99_us).collect()),
            cpu_s: median(rounds.iter().map(|f| f.cpu_s).collect()),
        }
    }
}

/// Run `connmux <tool> --json --no-progress -i 1 <args> ADDR` under
/// `taskset -c CPUS` (after `prefix`, e.g. `ip netns exec NS`), with its
/// threads pinned to CPUS in turn, and read the median row.
pub fn loadgen(
    tool: &str,
    prefix: &[String],
    cpus: &[usize],
    args: &[String],
    addr: SocketAddr,
) -> anyhow::Result<Figures> {
    let exe = exe()?;
    let mut cmd = match prefix.split_first() {
        Some((p0, rest)) => {
            let mut c = Command::new(p0);
            c.args(rest).arg("taskset").arg("-c").arg(cpu_list(cpus)).arg(&exe);
            c
        }
        None => taskset(cpus, &exe),
    };
    cmd.arg(tool)
        .args(["--json", "--no-progress", "-i", "1", "--cpu", &cpu_list(cpus)])
        .args(args)
        .arg(addr.to_string());
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let doc: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!("{tool} printed no JSON (exit {:?}): {}", out.status.code(), String::from_utf8_lossy(&out.stderr))
    })?;
    if doc["ok"] != Value::Bool(true) || !out.status.success() {
        bail!("{tool} {} against {addr} failed: {}", args.join(" "), doc["error"].as_str().unwrap_or("errors"));
    }
    let m = &doc["median"];
    let f = |k: &str| m[k].as_f64().with_context(|| format!("{tool} report lacks median.{k}"));
    Ok(Figures {
        rate: f("rate")?,
        p50_us: f("p50_us")?,
        p99_us: f("p99_us")?,
        cpu_s: m["cpu_s"].as_f64().unwrap_or(0.0),
    })
}

/// The yardstick is an external ceiling server (a C `limit_server.c`), not
/// part of connmux: it runs only when `--yardstick DIR` names its sources,
/// and is then built into a scratch directory (gcc -O2, as its Makefile
/// does). `None` (with the reason printed) without a directory, or when the
/// sources or the compiler are missing.
pub fn build_yardstick(dir: Option<&Path>) -> Option<PathBuf> {
    let dir = dir?;
    let src = dir.join("limit_server.c");
    if !src.exists() {
        eprintln!("bench: no limit_server.c in --yardstick {} (yardstick skipped)", dir.display());
        return None;
    }
    let out_dir = std::env::temp_dir().join(format!("connmux-bench-yardstick-{}", std::process::id()));
    if std::fs::create_dir_all(&out_dir).is_err() {
        return None;
    }
    let bin = out_dir.join("limit_server");
    let st = Command::new("gcc").args(["-O2", "-g", "-Wall", "-Wextra", "-pthread", "-o"]).arg(&bin).arg(&src).status();
    match st {
        Ok(s) if s.success() => Some(bin),
        other => {
            eprintln!("bench: building the yardstick failed ({other:?}); skipped");
            None
        }
    }
}

/// The servers to measure: those asked for, plus `extra` (the external
/// servers that `--yardstick DIR` brings) when a directory is given and
/// they were not named. Naming one of `extra` without a directory is an
/// error: nothing outside the checkout is looked for by default.
pub fn with_external(servers: &mut Vec<String>, dir: Option<&Path>, extra: &[&str]) -> anyhow::Result<()> {
    for e in extra {
        let named = servers.iter().any(|s| s == e);
        match dir {
            Some(_) if !named => servers.push((*e).to_string()),
            None if named => {
                anyhow::bail!("{e} is not part of connmux: give --yardstick DIR (the directory of limit_server.c)")
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether a program is on PATH.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file())).unwrap_or(false)
}

/// A ratio printed as `0.93x`, or `-` without a baseline.
pub fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

/// `PASS`/`MISS` for a target line.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// The system's TCP congestion control (it decides, with BBR, how the load
/// paces large messages: see docs/performance.md, "Message size").
pub fn congestion_control() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The 1-minute load average, to print beside results.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(String::from))
        .unwrap_or_else(|| "?".into())
}
