//! `connmux bench udp`: NULL calls over UDP (`rpctest -u`) against the
//! rpc-server's UDP service and two servers written by hand, same client,
//! same run.
//!
//! Servers (all in this binary, each its own process under `taskset`):
//! - `connmux`: `rpc-server` (its UDP service: a socket and thread per
//!   worker, recvmmsg/sendmmsg batches, the RPC handler);
//! - `loop`: `bench udp-loop-server`, the hand-written loop: per CPU one
//!   SO_REUSEPORT socket and one pinned thread doing `recvmmsg` of up to 32
//!   datagrams, the reply of each written next to the others, one
//!   `sendmmsg`: the least a batched UDP server does;
//! - `thread`: `bench udp-thread-server`, thread per socket: per CPU one
//!   SO_REUSEPORT socket and one (unpinned) thread doing `recv_from` and
//!   `send_to`, one datagram at a time.
//!
//! All three answer with the same reply function
//! (`Registry::null_fast_datagram`, else `handle_datagram`).
//! Placements as in `bench rpc`: `cpu0` (every server on CPU 0, one
//! socket; the load on CPU 0 too) and `spread` (a socket per CPU 0 and 1,
//! the load's threads on CPU 0 and 1 in turn). Rounds are interleaved;
//! the table has medians over rounds, with ratios to `loop` and `thread`,
//! and the requests lost (given up after `--udp-retry`), all rounds.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::rpc::{parse_setting, placement, Placement, Setting};
use super::{cpu_list, exe, free_port, loadavg, ratio, taskset, verdict, Proc, Rounds};

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("rounds", |a| a.help("Rounds (each runs every placement, setting and server once)")),
    mut_arg("seconds", |a| a.help("Seconds per run"))
)]
pub struct Args {
    #[command(flatten)]
    pub run: Rounds,
    /// Load settings THREADS:IN_FLIGHT (rpctest -u -j and -a).
    #[arg(long, value_delimiter = ',', default_value = "1:1,1:32,4:32")]
    pub settings: Vec<String>,
    /// Placements: cpu0 (everything on CPU 0), spread (a socket per CPU 0 and 1).
    #[arg(long, value_delimiter = ',', default_value = "cpu0,spread")]
    pub placements: Vec<String>,
    /// Servers: connmux, loop (hand-written recvmmsg/sendmmsg), thread
    /// (thread per socket); also connmux-nogso (each reply sent apart).
    #[arg(long, value_delimiter = ',', default_value = "connmux,loop,thread")]
    pub servers: Vec<String>,
    /// A smoke run: one round of 0.3 s, settings 1:1 and 1:32, CPU 0 only.
    #[arg(long)]
    pub quick: bool,
}

/// The hidden baseline servers' flags.
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    #[arg(short, long)]
    pub listen: SocketAddr,
    /// CPUs: one socket and thread per entry.
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Pin each thread to its CPU (the loop; the thread-per-socket server
    /// leaves its threads to the scheduler).
    #[arg(long)]
    pub pin: bool,
    /// Datagrams one recvmmsg takes (0: one recv_from at a time, no batch).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
}

/// The registry both baselines answer with: NFS 3-4, as the rpc-server's.
fn registry() -> connmux_oncrpc::Registry {
    crate::cmd::server::registry(&[]).expect("no extra programs")
}

fn bind(addr: SocketAddr) -> anyhow::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    let _ = s.set_recv_buffer_size(4 << 20);
    s.bind(&addr.into()).with_context(|| format!("binding UDP {addr}"))?;
    Ok(s.into())
}

/// `bench udp-loop-server` (`--batch N`) and `bench udp-thread-server`
/// (`--batch 0`): the baselines. Run until killed.
pub fn run_server(a: ServerArgs) -> anyhow::Result<i32> {
    let cpus = if a.cpus.is_empty() { vec![0] } else { a.cpus.clone() };
    let reg = Arc::new(registry());
    let mut threads = Vec::new();
    for &cpu in &cpus {
        let sock = bind(a.listen)?;
        let (reg, pin, batch) = (reg.clone(), a.pin, a.batch);
        threads.push(std::thread::spawn(move || {
            if pin {
                let _ = connmux_sys::affinity::pin_current_thread(cpu);
            }
            match batch {
                0 => one_at_a_time(&sock, &reg),
                n => batched(&sock, &reg, n),
            }
        }));
    }
    println!("udp baseline listening on {} ({} sockets)", a.listen, cpus.len());
    for t in threads {
        let _ = t.join();
    }
    Ok(0)
}

/// A reply to one call datagram appended to `out`; `false`: none.
fn answer(reg: &connmux_oncrpc::Registry, d: &[u8], out: &mut Vec<u8>) -> bool {
    if let Some(r) = reg.null_fast_datagram(d) {
        out.extend_from_slice(&r);
        return true;
    }
    matches!(reg.handle_datagram(d, out), connmux_oncrpc::Outcome::Replied { .. })
}

/// The hand-written batched loop.
fn batched(sock: &UdpSocket, reg: &connmux_oncrpc::Registry, n: usize) {
    use connmux_sys::udp::{recv_batch, send_batch, RecvBatch, SendBatch};
    let fd = sock.as_raw_fd();
    let mut rb = RecvBatch::new(n, 2048);
    let mut sb = SendBatch::new();
    let mut out = Vec::with_capacity(n * 64);
    let mut spans: Vec<(usize, usize, usize)> = Vec::with_capacity(n);
    loop {
        let Ok(got) = recv_batch(fd, &mut rb, libc::MSG_WAITFORONE) else { continue };
        out.clear();
        spans.clear();
        for i in 0..got {
            let at = out.len();
            if !rb.truncated(i) && answer(reg, rb.datagram(i), &mut out) {
                spans.push((at, out.len(), i));
            }
        }
        let mut k = 0;
        while k < spans.len() {
            let items = spans[k..].iter().map(|&(a, b, i)| (&out[a..b], Some(rb.peer(i))));
            match send_batch(fd, &mut sb, items, libc::MSG_NOSIGNAL) {
                Ok(s) => k += s.max(1),
                Err(_) => k += 1,
            }
        }
    }
}

/// Thread per socket: one datagram at a time.
fn one_at_a_time(sock: &UdpSocket, reg: &connmux_oncrpc::Registry) {
    let mut buf = [0u8; 2048];
    let mut out = Vec::with_capacity(64);
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
        out.clear();
        if answer(reg, &buf[..n], &mut out) {
            let _ = sock.send_to(&out, from);
        }
    }
}

/// A NULL call answered over UDP at `addr` within `limit`: the server is up.
fn wait_udp(addr: SocketAddr, limit: Duration) -> anyhow::Result<()> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.connect(addr)?;
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    let mut call = Vec::new();
    connmux_oncrpc::encode_null_call(7, 100_003, 3, 1, &mut call);
    let t0 = Instant::now();
    let mut buf = [0u8; 512];
    while t0.elapsed() < limit {
        let _ = s.send(&call[4..]);
        if s.recv(&mut buf).is_ok() {
            return Ok(());
        }
    }
    bail!("no UDP reply from {addr} within {limit:?}")
}

fn start(kind: &str, p: &Placement) -> anyhow::Result<Proc> {
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let (n, cpus, exe) = (p.cpus.len().to_string(), cpu_list(&p.cpus), exe()?);
    let mut c = taskset(&p.cpus, &exe);
    match kind {
        "connmux" | "connmux-nogso" => {
            c.args(["rpc-server", "-l", &listen, "--workers", &n, "--cpus", &cpus, "--no-stats-socket"]);
            if kind == "connmux-nogso" {
                c.arg("--no-udp-gso");
            }
        }
        "loop" => {
            c.args(["bench", "udp-loop-server", "-l", &listen, "--cpus", &cpus, "--pin"]);
        }
        "thread" => {
            c.args(["bench", "udp-thread-server", "-l", &listen, "--cpus", &cpus, "--batch", "0"]);
        }
        other => bail!("unknown server {other:?} (connmux, connmux-nogso, loop, thread)"),
    }
    let name = format!("{kind}@{}", p.name);
    let proc_ = Proc::spawn_detached(&name, c, port)?;
    wait_udp(proc_.addr, Duration::from_secs(20)).with_context(|| format!("{name} did not answer over UDP"))?;
    Ok(proc_)
}

/// One run of `rpctest -u`: its median figures and the requests lost.
fn load(p: &Placement, s: Setting, seconds: f64, addr: SocketAddr) -> anyhow::Result<(super::Figures, u64)> {
    let exe = exe()?;
    let mut cmd = taskset(&p.cpus, &exe);
    cmd.args(["rpctest", "-u", "--json", "--no-progress", "-i", "1", "--cpu", &cpu_list(&p.cpus)])
        .args(s.rpctest_args(seconds))
        .arg(addr.to_string());
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("rpctest -u printed no JSON: {}", String::from_utf8_lossy(&out.stderr)))?;
    if doc["ok"] != serde_json::Value::Bool(true) {
        bail!("rpctest -u {s} against {addr} failed: {}", doc["error"].as_str().unwrap_or("errors"));
    }
    let m = &doc["median"];
    let f = |k: &str| m[k].as_f64().with_context(|| format!("rpctest report lacks median.{k}"));
    let fig = super::Figures { rate: f("rate")?, p50_us: f("p50_us")?, p99_us: f("p99_us")?, cpu_s: 0.0 };
    Ok((fig, m["lost"].as_u64().unwrap_or(0)))
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.run = Rounds::quick(1);
        a.settings = vec!["1:1".into(), "1:32".into()];
        a.placements = vec!["cpu0".into()];
    }
    a.run.check()?;
    let settings = a.settings.iter().map(|s| parse_setting(s)).collect::<anyhow::Result<Vec<_>>>()?;
    let placements = a.placements.iter().map(|p| placement(p)).collect::<anyhow::Result<Vec<_>>>()?;
    let kinds: Vec<&str> = a.servers.iter().map(String::as_str).collect();
    println!(
        "connmux bench udp: ONC RPC NULL calls over UDP on loopback (rpctest -u); {} round(s) of {} s per server, \
         setting and placement, interleaved; medians over rounds; load avg {}",
        a.run.rounds,
        a.run.seconds,
        loadavg()
    );
    let mut servers: Vec<Vec<Proc>> = Vec::new();
    for p in &placements {
        servers.push(kinds.iter().map(|k| start(k, p)).collect::<anyhow::Result<Vec<_>>>()?);
    }
    // results[placement][setting][server] = (figures, lost) per round
    let mut results = vec![vec![vec![Vec::new(); kinds.len()]; settings.len()]; placements.len()];
    for round in 0..a.run.rounds {
        for (pi, p) in placements.iter().enumerate() {
            for (si, s) in settings.iter().enumerate() {
                for k in 0..kinds.len() {
                    let vi = (k + round + si) % kinds.len();
                    let srv = &servers[pi][vi];
                    let r = load(p, *s, a.run.seconds, srv.addr)
                        .with_context(|| format!("round {} {s} against {}", round + 1, srv.name))?;
                    results[pi][si][vi].push(r);
                }
            }
        }
        eprintln!("bench udp: round {}/{} done (load avg {})", round + 1, a.run.rounds, loadavg());
    }
    drop(servers);
    println!();
    println!(
        "{:<7} {:<12} {:<8} {:>10} {:>9} {:>9} {:>8} {:>9} {:>9}",
        "place", "setting", "server", "RPC/s", "p50_us", "p99_us", "lost", "vs_loop", "vs_thread"
    );
    let mut lines = Vec::new();
    for (pi, p) in placements.iter().enumerate() {
        for (si, s) in settings.iter().enumerate() {
            let med: Vec<(super::Figures, u64)> = results[pi][si]
                .iter()
                .map(|r: &Vec<(super::Figures, u64)>| {
                    let f: Vec<super::Figures> = r.iter().map(|x| x.0).collect();
                    (super::Figures::median_of(&f), r.iter().map(|x| x.1).sum())
                })
                .collect();
            let get = |name: &str| kinds.iter().position(|k| *k == name).map(|i| med[i].0);
            let (lp, th) = (get("loop"), get("thread"));
            for (vi, (m, lost)) in med.iter().enumerate() {
                let r = |b: Option<super::Figures>| b.map_or("-".into(), |b| ratio(m.rate, b.rate));
                println!(
                    "{:<7} {:<12} {:<8} {:>10.0} {:>9.1} {:>9.1} {:>8} {:>9} {:>9}",
                    p.name,
                    s.to_string(),
                    kinds[vi],
                    m.rate,
                    m.p50_us,
                    m.p99_us,
                    lost,
                    r(lp),
                    r(th)
                );
            }
            if let Some(c) = get("connmux") {
                if p.name == "cpu0" {
                    if let Some(l) = lp {
                        let x = c.rate / l.rate;
                        lines.push(format!(
                            "{} connmux >= 1.0x loop RPC/s, {} {s}: {x:.2}x",
                            verdict(x >= 1.0),
                            p.name
                        ));
                    }
                }
                if p.name == "spread" {
                    if let Some(t) = th {
                        let x = c.rate / t.rate;
                        lines.push(format!(
                            "{} connmux >= 1.5x thread RPC/s, {} {s}: {x:.2}x",
                            verdict(x >= 1.5),
                            p.name
                        ));
                    }
                }
            }
        }
    }
    let lost: u64 = results.iter().flatten().flatten().flatten().map(|x| x.1).sum();
    lines.push(format!("{} no request lost (all servers, all rounds): {lost} lost", verdict(lost == 0)));
    println!();
    println!("targets:");
    for l in lines {
        println!("  {l}");
    }
    Ok(0)
}
