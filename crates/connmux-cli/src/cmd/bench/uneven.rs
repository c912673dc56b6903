//! `connmux bench uneven`: uneven work, KCM's Thrift case. Some requests burn
//! CPU for `--heavy-us` in the handler; all of them arrive on `--heavy-conns`
//! connections, while the other `--light-conns` connections send requests
//! that need no work. Compared, each as its own process with one worker (or
//! thread pool) over CPUs 0 and 1:
//!
//! - `affinity`: connmux's default steering (a connection's messages are
//!   handled where they were read until load is uneven);
//! - `rr`: KCM's round robin over the workers' sockets;
//! - `thread`: one thread per connection, blocking I/O, the kernel schedules;
//! - `epoll`: a hand-written epoll loop per CPU, no framework
//!   (`uneven_epoll`): what an event-driven server costs on this load.
//!
//! Reported, as medians over interleaved rounds: total requests/s, the light
//! connections' requests/s, and the light connections' median and p99 RTT.
//!
//! Wire format ("l4" framing): a 4-byte big-endian length (12), then the
//! kind byte (1 = heavy, 0 = light), 3 zero bytes, the 4-byte tag and 4 zero
//! bytes. The server echoes each message after the work.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::BytesMut;
use connmux::service::{Handler, Service, ServiceConfig, Verdict};
use connmux::{Bytes, Config, Mux, Placement, PsockId, SockType, Steering};
use serde::Serialize;
use serde_json::Value;

use super::{cpu_list, exe, free_port, loadavg, median, ratio, taskset, verdict, Proc};
use crate::cmd::loadgen::engine::{self, Client, Workload};

/// Bytes of one message, header included.
const MSG: usize = 16;
const HEAVY: u8 = 1;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rounds (each runs every variant once, in a rotating order).
    #[arg(short = 'i', long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds per run.
    #[arg(short = 'd', long, default_value_t = 2.0)]
    pub seconds: f64,
    /// CPU time each heavy request burns, microseconds.
    #[arg(long, default_value_t = 200)]
    pub heavy_us: u64,
    /// Connections that send only heavy requests.
    #[arg(long, default_value_t = 1)]
    pub heavy_conns: usize,
    /// Connections that send only light requests.
    #[arg(long, default_value_t = 7)]
    pub light_conns: usize,
    /// Requests in flight per connection.
    #[arg(short = 'a', long, default_value_t = 4)]
    pub inflight: usize,
    /// CPUs: one server worker per CPU; the load's threads take them in turn.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub cpus: Vec<usize>,
    /// connmux's I/O driver: epoll (the default here, as in the figures of
    /// `docs/performance.md`), uring or auto. Heavy lanes work on both.
    #[arg(long, default_value = "epoll")]
    pub driver: String,
    #[command(flatten)]
    pub lanes: LaneArgs,
    /// A smoke run: one round of 0.5 s.
    #[arg(long)]
    pub quick: bool,
}

/// connmux's heavy lanes, as both the bench and its server take
/// them (the bench hands them on to each `uneven-server`; the other
/// engines ignore them).
#[derive(clap::Args, Debug, Clone)]
pub struct LaneArgs {
    /// Nice steps below its worker at which connmux's heavy lane runs.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    pub lane_nice: i32,
    /// The scheduler slice a connmux worker asks for while its heavy lane
    /// has work, microseconds (`Config::lane_worker_slice`; 0: never asked).
    #[arg(long, default_value_t = connmux::Config::default().lane_worker_slice.as_micros() as u64)]
    pub lane_worker_slice_us: u64,
    /// The scheduler slice connmux's heavy lanes ask for, microseconds
    /// (`Config::lane_slice`; 0: the kernel's default).
    #[arg(long, default_value_t = connmux::Config::default().lane_slice.as_micros() as u64)]
    pub lane_slice_us: u64,
    /// No lane helpers: a heavy connection's requests answered in order on
    /// one CPU.
    #[arg(long)]
    pub lane_in_order: bool,
    /// CPU time from which a busy run's requests count as slow,
    /// microseconds (`Tuning::busy_handler`; at `Tuning::slow_handler`,
    /// 50, or above, only long requests make a connection heavy).
    #[arg(long, default_value_t = connmux::Tuning::default().busy_handler.as_micros() as u64)]
    pub busy_us: u64,
}

impl LaneArgs {
    /// Set them on a connmux server's configuration.
    fn apply(&self, c: &mut Config) {
        c.lane_nice = self.lane_nice;
        c.lane_worker_slice = Duration::from_micros(self.lane_worker_slice_us);
        c.lane_slice = Duration::from_micros(self.lane_slice_us);
        c.lane_in_order = self.lane_in_order;
        c.tuning.busy_handler = Duration::from_micros(self.busy_us);
    }

    /// The same flags on a command line (for `uneven-server`).
    fn to_args(&self) -> Vec<String> {
        let mut v: Vec<String> = [
            ("--lane-nice", self.lane_nice.to_string()),
            ("--lane-worker-slice-us", self.lane_worker_slice_us.to_string()),
            ("--lane-slice-us", self.lane_slice_us.to_string()),
            ("--busy-us", self.busy_us.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect();
        v.extend(self.lane_in_order.then(|| "--lane-in-order".to_owned()));
        v
    }
}

#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    #[arg(short, long)]
    pub listen: SocketAddr,
    /// connmux, thread (one per connection, blocking), epoll (one
    /// hand-written epoll loop per CPU) or uring (one hand-written io_uring
    /// loop per CPU).
    #[arg(long, default_value = "connmux")]
    pub engine: String,
    /// affinity or rr (connmux only).
    #[arg(long, default_value = "affinity")]
    pub steering: String,
    /// auto, epoll or uring (connmux only).
    #[arg(long, default_value = "epoll")]
    pub driver: String,
    /// Worker CPUs (connmux: one worker each).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub cpus: Vec<usize>,
    #[arg(long, default_value_t = 200)]
    pub heavy_us: u64,
    #[command(flatten)]
    pub lanes: LaneArgs,
    /// CPU time a hand-written loop (epoll, uring) spends on each read it
    /// answers besides the echo, in nanoseconds, before the write: what a
    /// server's own work a batch costs when it shares a CPU with its
    /// client (`docs/performance.md`, "The light worker's batch, timed in
    /// place").
    #[arg(long, default_value_t = 0)]
    pub read_work_ns: u64,
    /// Stop after this many seconds (default: until killed).
    #[arg(long)]
    pub duration: Option<f64>,
}

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    #[arg(long, default_value_t = 1)]
    pub heavy_conns: usize,
    #[arg(long, default_value_t = 7)]
    pub light_conns: usize,
    #[arg(short = 'a', long, default_value_t = 4)]
    pub inflight: usize,
    #[arg(short = 'd', long, default_value_t = 2.0)]
    pub seconds: f64,
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Print each connection's figures beside the report (`conns`: heavy or
    /// light, the CPU its thread is pinned to, calls, p50/p99/p99.9): where
    /// a tail comes from.
    #[arg(long)]
    pub per_conn: bool,
    pub target: SocketAddr,
}

/// Burn the CPU for `d` (a busy loop on the clock: no sleeping, no yielding).
pub(super) fn burn(d: Duration) {
    let end = Instant::now() + d;
    let mut spins = 0u64;
    while Instant::now() < end {
        spins = spins.wrapping_add(1);
        std::hint::spin_loop();
    }
    std::hint::black_box(spins);
}

/// The handler: heavy messages burn, every message is echoed.
struct Uneven {
    heavy: Duration,
}

impl Uneven {
    /// A request of the bench's size, its work done (a heavy one burns the
    /// CPU); false: not one of ours, the connection is closed.
    fn work(&self, request: &[u8]) -> bool {
        if request.len() != MSG {
            return false;
        }
        if request[4] == HEAVY {
            burn(self.heavy);
        }
        true
    }
}

impl Handler for Uneven {
    fn handle(&self, request: Bytes, _from: PsockId, _scratch: &mut BytesMut) -> Verdict {
        match self.work(&request) {
            true => Verdict::Reply(request),
            false => Verdict::Close,
        }
    }

    /// The echo where the request lies, appended to the read's replies: the
    /// thread server's loop does the same (`serve_thread`), so the two
    /// servers differ in how they serve, not in how the handler copies.
    fn handle_in_place(&self, request: &[u8], _from: PsockId, _scratch: &mut BytesMut, out: &mut BytesMut) -> Verdict {
        if !self.work(request) {
            return Verdict::Close;
        }
        out.extend_from_slice(request);
        Verdict::Appended
    }
}

pub fn run_server(a: ServerArgs) -> anyhow::Result<i32> {
    let heavy = Duration::from_micros(a.heavy_us);
    let read_work = Duration::from_nanos(a.read_work_ns);
    if a.read_work_ns > 0 && !matches!(a.engine.as_str(), "epoll" | "uring") {
        bail!("--read-work-ns: the hand-written loops' only (--engine epoll or uring)");
    }
    let stop_at = a.duration.map(|d| Instant::now() + Duration::from_secs_f64(d));
    let wait = || loop {
        if stop_at.is_some_and(|t| Instant::now() >= t) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    match a.engine.as_str() {
        "connmux" => {
            let mut c = Config::default();
            c.workers = a.cpus.len().max(1);
            c.placement = Placement::Cpus(a.cpus.clone());
            a.lanes.apply(&mut c);
            c.driver = match a.driver.as_str() {
                "auto" => connmux::Driver::Auto,
                "epoll" => connmux::Driver::Epoll,
                "uring" => connmux::Driver::Uring,
                o => bail!("--driver {o}: auto, epoll or uring"),
            };
            c.core.steering = match a.steering.as_str() {
                "affinity" => Steering::Affinity,
                "rr" => Steering::RoundRobin,
                o => bail!("--steering {o}: affinity or rr"),
            };
            let mux = Mux::new(c)?;
            let svc = Service::start(
                mux,
                ServiceConfig {
                    listen: a.listen,
                    sock_type: SockType::Dgram,
                    parser: Arc::new(|| connmux::parsers::from_spec("l4").expect("built-in")),
                },
                Arc::new(Uneven { heavy }),
            )?;
            println!("uneven-server (connmux, {}) listening on {}", a.steering, svc.local_addr());
            wait();
            svc.shutdown();
        }
        "thread" => {
            let l = TcpListener::bind(a.listen)?;
            println!("uneven-server (thread per connection) listening on {}", l.local_addr()?);
            std::thread::spawn(move || {
                for c in l.incoming().flatten() {
                    let _ = std::thread::Builder::new().spawn(move || serve_thread(c, heavy));
                }
            });
            wait();
        }
        "epoll" => {
            let l = TcpListener::bind(a.listen)?;
            println!("uneven-server (an epoll loop per CPU) listening on {}", l.local_addr()?);
            super::uneven_epoll::serve(l, &a.cpus, heavy, read_work)?;
            wait();
        }
        "uring" => {
            let l = TcpListener::bind(a.listen)?;
            println!("uneven-server (an io_uring loop per CPU) listening on {}", l.local_addr()?);
            super::uneven_uring::serve(l, &a.cpus, heavy, read_work)?;
            wait();
        }
        o => bail!("--engine {o}: connmux, thread, epoll or uring"),
    }
    Ok(0)
}

/// Bytes a server of this benchmark reads at once.
pub(super) const READ_BUF: usize = 64 << 10;

/// The echo of every whole message at the start of `data` (heavy ones after
/// their work), appended to `out`: how many bytes it took, or `None` when a
/// message is not this benchmark's.
pub(super) fn echo_whole(data: &[u8], heavy: Duration, out: &mut Vec<u8>) -> Option<usize> {
    let mut at = 0;
    while data.len() - at >= MSG {
        let m = &data[at..at + MSG];
        if m[..4] != (MSG as u32 - 4).to_be_bytes() {
            return None;
        }
        if m[4] == HEAVY {
            burn(heavy);
        }
        out.extend_from_slice(m);
        at += MSG;
    }
    Some(at)
}

/// One connection, blocking: answer every whole message of each read, all
/// replies of a read in one write.
fn serve_thread(mut c: TcpStream, heavy: Duration) {
    let _ = c.set_nodelay(true);
    let mut buf = vec![0u8; READ_BUF];
    let mut have = 0;
    let mut out = Vec::with_capacity(READ_BUF);
    loop {
        let n = match c.read(&mut buf[have..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        have += n;
        let Some(at) = echo_whole(&buf[..have], heavy, &mut out) else { return };
        buf.copy_within(at..have, 0);
        have -= at;
        if c.write_all(&out).is_err() {
            return;
        }
        out.clear();
    }
}

struct Load {
    heavy_conns: usize,
}

struct UClient {
    kind: u8,
    buf: Vec<u8>,
}

impl Workload for Load {
    type Client = UClient;
    fn client(&self, conn: usize) -> UClient {
        UClient { kind: if conn < self.heavy_conns { HEAVY } else { 0 }, buf: Vec::new() }
    }
}

impl Client for UClient {
    fn encode(&mut self, tag: u32, out: &mut Vec<u8>) {
        out.extend_from_slice(&(MSG as u32 - 4).to_be_bytes());
        out.extend_from_slice(&[self.kind, 0, 0, 0]);
        out.extend_from_slice(&tag.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
    }
    fn decode(&mut self, input: &[u8], done: &mut Vec<u32>) -> Result<(), String> {
        self.buf.extend_from_slice(input);
        let mut at = 0;
        while self.buf.len() - at >= MSG {
            let m = &self.buf[at..at + MSG];
            if m[..4] != (MSG as u32 - 4).to_be_bytes() || m[4] != self.kind {
                return Err(format!("bad echo {m:02x?}"));
            }
            done.push(u32::from_be_bytes([m[8], m[9], m[10], m[11]]));
            at += MSG;
        }
        self.buf.drain(..at);
        Ok(())
    }
}

#[derive(Serialize, Clone, Copy, Default, Debug)]
struct LoadReport {
    total_rate: f64,
    light_rate: f64,
    heavy_rate: f64,
    light_p50_us: f64,
    light_p99_us: f64,
    heavy_p50_us: f64,
}

/// One connection's figures (`uneven-load --per-conn`: `conns` beside the report).
#[derive(Serialize)]
struct ConnReport {
    heavy: bool,
    /// The CPU its load thread is pinned to (none without `--cpus`).
    cpu: Option<usize>,
    calls: u64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
}

pub fn run_load(a: LoadArgs) -> anyhow::Result<i32> {
    let n = a.heavy_conns + a.light_conns;
    anyhow::ensure!(n > 0 && a.inflight > 0, "need connections and requests in flight");
    let load = Load { heavy_conns: a.heavy_conns };
    let Some((conns, secs)) = engine::timed_load_round(&load, a.target, n, a.inflight, a.seconds, &a.cpus) else {
        return Ok(1);
    };
    let (heavy, light) = conns.split_at(a.heavy_conns);
    let mut lh = engine::new_histogram();
    for c in light {
        lh.add(&c.hist).expect("same bounds");
    }
    let mut hh = engine::new_histogram();
    for c in heavy {
        hh.add(&c.hist).expect("same bounds");
    }
    let sum = |cs: &[engine::ConnStats]| cs.iter().map(|c| c.calls).sum::<u64>() as f64;
    let us = |h: &hdrhistogram::Histogram<u64>, q: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(q) as f64 / 1e3
        }
    };
    let r = LoadReport {
        total_rate: (sum(heavy) + sum(light)) / secs,
        light_rate: sum(light) / secs,
        heavy_rate: sum(heavy) / secs,
        light_p50_us: us(&lh, 0.5),
        light_p99_us: us(&lh, 0.99),
        heavy_p50_us: us(&hh, 0.5),
    };
    let mut doc = serde_json::json!({"ok": true, "report": r});
    if a.per_conn {
        let conns: Vec<ConnReport> = (conns.iter().enumerate())
            .map(|(i, c)| ConnReport {
                heavy: i < a.heavy_conns,
                cpu: (!a.cpus.is_empty()).then(|| a.cpus[i % a.cpus.len()]),
                calls: c.calls,
                p50_us: us(&c.hist, 0.5),
                p99_us: us(&c.hist, 0.99),
                p999_us: us(&c.hist, 0.999),
            })
            .collect();
        doc["conns"] = serde_json::to_value(conns)?;
    }
    println!("{doc}");
    Ok(0)
}

/// One run of the load against one server: its report, and where its light
/// tail is.
#[derive(Clone, Copy)]
struct Run {
    load: LoadReport,
    tail: Tail,
}

/// The light connections' p99 by where their client runs (the median over
/// such connections): on a CPU that also carries a heavy client (whose
/// requests the server answers there when it reads a connection on its
/// client's CPU) and on the other CPUs; `None` where there is no such
/// connection.
#[derive(Clone, Copy, Default)]
struct Tail {
    beside_heavy: Option<f64>,
    elsewhere: Option<f64>,
}

impl Tail {
    fn of(conns: &[Value]) -> Tail {
        let heavy_cpus: Vec<&Value> = conns.iter().filter(|c| c["heavy"] == true).map(|c| &c["cpu"]).collect();
        let p99s = |beside: bool| {
            median_if_any(
                (conns.iter())
                    .filter(|c| c["heavy"] == false && heavy_cpus.contains(&&c["cpu"]) == beside)
                    .filter_map(|c| c["p99_us"].as_f64()),
            )
        };
        Tail { beside_heavy: p99s(true), elsewhere: p99s(false) }
    }
}

/// The median of some figures; `None` when there are none.
fn median_if_any(v: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = v.collect();
    (!v.is_empty()).then(|| median(v))
}

fn load_once(a: &Args, addr: SocketAddr) -> anyhow::Result<Run> {
    let cpus = cpu_list(&a.cpus);
    let out = taskset(&a.cpus, exe()?)
        .args(["bench", "uneven-load", "--per-conn", "--cpus", &cpus])
        .args(["--heavy-conns", &a.heavy_conns.to_string(), "--light-conns", &a.light_conns.to_string()])
        .args(["-a", &a.inflight.to_string(), "-d", &a.seconds.to_string()])
        .arg(addr.to_string())
        .output()?;
    let doc: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("uneven-load printed no JSON: {}", String::from_utf8_lossy(&out.stderr)))?;
    if doc["ok"] != Value::Bool(true) {
        bail!("uneven load against {addr} failed: {}", doc["error"]);
    }
    let r = &doc["report"];
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    let load = LoadReport {
        total_rate: f("total_rate"),
        light_rate: f("light_rate"),
        heavy_rate: f("heavy_rate"),
        light_p50_us: f("light_p50_us"),
        light_p99_us: f("light_p99_us"),
        heavy_p50_us: f("heavy_p50_us"),
    };
    let tail = Tail::of(doc["conns"].as_array().map_or(&[][..], |v| v.as_slice()));
    Ok(Run { load, tail })
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.rounds = 1;
        a.seconds = 0.5;
    }
    anyhow::ensure!(a.rounds > 0 && a.seconds > 0.0, "--rounds and --seconds must be positive");
    let mut variants = vec![
        ("affinity", "connmux", "affinity"),
        ("rr", "connmux", "rr"),
        ("thread", "thread", "affinity"),
        ("epoll", "epoll", "affinity"),
    ];
    // (The io_uring loop only where io_uring works.)
    if connmux_sys::uring::supported() {
        variants.push(("uring", "uring", "affinity"));
    }
    let mut servers = Vec::new();
    for &(name, engine, steering) in &variants {
        let port = free_port()?;
        let mut cmd = taskset(&a.cpus, exe()?);
        cmd.args(["bench", "uneven-server", "-l", &format!("127.0.0.1:{port}")])
            .args(["--engine", engine, "--steering", steering, "--cpus", &cpu_list(&a.cpus), "--driver", &a.driver])
            .args(["--heavy-us", &a.heavy_us.to_string()])
            .args(a.lanes.to_args());
        servers.push(Proc::spawn(name, cmd, port)?);
    }
    println!(
        "connmux bench uneven: {} heavy connection(s) ({} us of CPU per request) and {} light ones, -a{} each; \
         servers with one worker per CPU {:?} (connmux driver {}, lane nice +{}, worker slice beside a lane {} us, lane slice {} us{}); {} round(s) of {} s, interleaved; medians; load avg {}",
        a.heavy_conns,
        a.heavy_us,
        a.light_conns,
        a.inflight,
        a.cpus,
        a.driver,
        a.lanes.lane_nice,
        a.lanes.lane_worker_slice_us,
        a.lanes.lane_slice_us,
        if a.lanes.lane_in_order { ", lanes in order" } else { "" },
        a.rounds,
        a.seconds,
        loadavg()
    );
    let mut res: Vec<Vec<Run>> = vec![Vec::new(); servers.len()];
    for round in 0..a.rounds {
        for k in 0..servers.len() {
            let i = (k + round) % servers.len();
            let r = load_once(&a, servers[i].addr)
                .with_context(|| format!("round {} against {}", round + 1, servers[i].name))?;
            res[i].push(r);
        }
        eprintln!("bench uneven: round {}/{} done", round + 1, a.rounds);
    }
    let med: Vec<LoadReport> = res
        .iter()
        .map(|rs| {
            let m = |f: fn(&LoadReport) -> f64| median(rs.iter().map(|r| f(&r.load)).collect());
            LoadReport {
                total_rate: m(|r| r.total_rate),
                light_rate: m(|r| r.light_rate),
                heavy_rate: m(|r| r.heavy_rate),
                light_p50_us: m(|r| r.light_p50_us),
                light_p99_us: m(|r| r.light_p99_us),
                heavy_p50_us: m(|r| r.heavy_p50_us),
            }
        })
        .collect();
    println!();
    println!(
        "{:<10} {:>11} {:>11} {:>9} {:>13} {:>13} {:>13} {:>10} {:>10}",
        "variant",
        "total/s",
        "light/s",
        "heavy/s",
        "light_p50_us",
        "light_p99_us",
        "heavy_p50_us",
        "vs_thread",
        "p99/thread"
    );
    let thr = med[2];
    for (i, (name, _, _)) in variants.iter().enumerate() {
        let m = med[i];
        println!(
            "{:<10} {:>11.0} {:>11.0} {:>9.0} {:>13.1} {:>13.1} {:>13.1} {:>10} {:>10}",
            name,
            m.total_rate,
            m.light_rate,
            m.heavy_rate,
            m.light_p50_us,
            m.light_p99_us,
            m.heavy_p50_us,
            ratio(m.total_rate, thr.total_rate),
            ratio(m.light_p99_us, thr.light_p99_us)
        );
    }
    // Where the light tail is (`uneven-load --per-conn`): a server that
    // reads a connection on its client's CPU answers the heavy requests
    // beside the light connections whose clients share the heavy client's CPU.
    let tails: Vec<(Option<f64>, Option<f64>)> = res
        .iter()
        .map(|rs| {
            let m = |f: fn(&Tail) -> Option<f64>| median_if_any(rs.iter().filter_map(|r| f(&r.tail)));
            (m(|t| t.beside_heavy), m(|t| t.elsewhere))
        })
        .collect();
    if tails.iter().any(|(b, e)| b.is_some() && e.is_some()) {
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        println!();
        println!("light p99 (us) by where its client runs, median per connection: beside a heavy client / elsewhere");
        for (i, (name, _, _)) in variants.iter().enumerate() {
            println!("{:<10} {:>9} / {}", name, us(tails[i].0), us(tails[i].1));
        }
    }
    let (aff, rr, ep) = (med[0], med[1], med[3]);
    // The event-driven floor: what part of the gap to a blocking thread any
    // epoll (or io_uring) server has on this load, and what part is connmux's.
    println!();
    println!(
        "connmux (affinity) against the hand-written epoll loop: throughput {}, light p99 {}",
        ratio(aff.total_rate, ep.total_rate),
        ratio(aff.light_p99_us, ep.light_p99_us)
    );
    if let Some(ur) = med.get(4) {
        println!(
            "connmux (affinity) against the hand-written io_uring loop: throughput {}, light p99 {}",
            ratio(aff.total_rate, ur.total_rate),
            ratio(aff.light_p99_us, ur.light_p99_us)
        );
    }
    println!();
    println!("targets:");
    // The targets of the case each mix stands for: one heavy connection
    // alone is spread over every CPU (KCM's point); beside light ones, the
    // light ones are answered no later than by a thread of their own.
    let (want_total, want_p99) = match (a.heavy_conns, a.light_conns) {
        (_, 0) => (1.8, None),
        (1, 1) => (1.0, Some(1.0)),
        _ => (1.0, Some(0.5)),
    };
    let t = aff.total_rate / thr.total_rate;
    println!(
        "  {} default steering >= {want_total:.1}x thread-per-connection throughput: {t:.2}x",
        verdict(t >= want_total)
    );
    if let Some(want) = want_p99 {
        let p = aff.light_p99_us / thr.light_p99_us;
        println!("  {} default steering light p99 <= {want:.1}x thread-per-connection: {p:.2}x", verdict(p <= want));
    }
    let ok = aff.total_rate >= rr.total_rate && (a.light_conns == 0 || aff.light_p99_us <= rr.light_p99_us);
    let p99 = match a.light_conns {
        0 => String::new(),
        _ => format!(", light p99 {:.2}x", aff.light_p99_us / rr.light_p99_us),
    };
    println!(
        "  {} default steering never below round robin: throughput {:.2}x{p99}",
        verdict(ok),
        aff.total_rate / rr.total_rate
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::LaneArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct Server {
        #[command(flatten)]
        lanes: LaneArgs,
    }

    /// What the bench hands each `uneven-server` is what it was given:
    /// every flag of `LaneArgs` survives `to_args` and parsing.
    #[test]
    fn lane_flags_reach_the_server_unchanged() {
        let given =
            LaneArgs { lane_nice: -2, lane_worker_slice_us: 1234, lane_slice_us: 56, lane_in_order: true, busy_us: 33 };
        let argv = std::iter::once("uneven-server".to_owned()).chain(given.to_args());
        let got = Server::try_parse_from(argv).expect("the server parses the bench's flags").lanes;
        assert_eq!(format!("{got:?}"), format!("{given:?}"));
    }
}
