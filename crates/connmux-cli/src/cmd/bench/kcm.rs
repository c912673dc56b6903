//! `connmux bench kcm`: the KCM programming model itself, application
//! threads on cloned sockets, beside a thread-per-connection server driven
//! by the same client in the same run.
//!
//! Servers, each its own process under `taskset -c CPUS`:
//! - `thread`: one blocking thread per connection, reading 64 KiB at a time
//!   and answering every whole message of a read with one write (what a
//!   competent hand-written server does);
//! - `kcm-N`: a userspace [`connmux::Mux`] (`--workers` workers pinned to
//!   `--cpus`, `--driver`) with every accepted connection attached with the
//!   `l4` parser, and N application threads, each on its own clone of one
//!   `KcmSocket` (the original is receive-disabled: as on AF_KCM, a socket
//!   nobody reads would hold the messages steered to it for ever), each
//!   doing `recv_msg` then `send_to` the message's connection;
//! - `kcm-batch-N`: the same with `recv_batch` (up to 64 messages) and one
//!   `send_batch_to` of their echoes;
//! - `alone-N`: N application threads each on a stand-alone clone
//!   (`KcmSocket::stand_alone`), the connections attached to the clones in
//!   turn and read by their threads in `recv_msg`, no worker between;
//!   `alone-batch-N` the same with `recv_batch` and `send_batch_to`;
//! - `core-N`: N threads each owning the connections it accepted and a
//!   core `Mux` of its own, reading, framing, receiving and echoing with
//!   no worker, lock or wake-up between (`kcm_core.rs`): the floor of an
//!   application thread that reads its own connections.
//!
//! The client (`bench kcm-load`, under the same `taskset`, one blocking
//! thread per connection pinned to the CPUs in turn): M connections each
//! keeping K messages in flight for `--seconds`, every echo checked against
//! what was sent (each message carries its tag and a payload made from it;
//! echoes may come back in any order: two application threads may answer
//! one connection's messages out of order). Shapes `MxK` are run in every
//! round against every server, in a rotating order; the table gives the
//! median over rounds of messages/s, the ratio to `thread` and, for N > 1
//! application threads, the ratio to one.
//!
//! Wire format: the `l4` framing (a 4-byte big-endian length of what
//! follows), then the 4-byte tag, then `--size` - 8 bytes of payload.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use super::{cpu_list, exe, free_port, loadavg, median, ratio, taskset, Proc};
use crate::cmd::loadgen::engine::{self, Client, Workload};

/// Messages per `recv_batch` call of the batch variant.
const BATCH: usize = 64;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Interleaved rounds (each runs every shape against every server once).
    #[arg(short = 'i', long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds per run.
    #[arg(short = 'd', long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Connections (a list runs each); with `--inflight`, replaces `--shapes`
    /// by every pair of the two lists.
    #[arg(long, value_delimiter = ',')]
    pub conns: Vec<usize>,
    /// Messages in flight per connection (a list runs each, e.g. `1,16`);
    /// see `--conns`.
    #[arg(long, value_delimiter = ',')]
    pub inflight: Vec<usize>,
    /// The shapes run when neither `--conns` nor `--inflight` is given:
    /// CONNSxINFLIGHT. Given one of the two, the other takes its default
    /// (8 connections, 16 in flight).
    #[arg(long, value_delimiter = ',', default_value = "8x16,8x1,2x64")]
    pub shapes: Vec<String>,
    /// Application threads on cloned sockets (a list runs each).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Bytes of one message, its 4-byte length included (at least 8).
    #[arg(long, default_value_t = 28)]
    pub size: usize,
    /// CPUs of the servers (connmux: one worker per CPU unless
    /// `--workers`) and of the client, whose threads take them in turn.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub cpus: Vec<usize>,
    /// connmux workers (default: one per CPU of `--cpus`).
    #[arg(long)]
    pub workers: Option<usize>,
    /// connmux's I/O driver: auto (the library's default: io_uring where it
    /// works), epoll or uring.
    #[arg(long, default_value = "auto")]
    pub driver: String,
    /// Only `recv_msg` + `send_to` (no batch variant).
    #[arg(long)]
    pub no_batch: bool,
    /// No `core-N` variant (threads each driving a core of their own).
    #[arg(long)]
    pub no_core: bool,
    /// A smoke run: one round of 0.3 s.
    #[arg(long)]
    pub quick: bool,
}

#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    #[arg(short, long)]
    pub listen: SocketAddr,
    /// thread (one blocking thread per connection), kcm (application
    /// threads on cloned KCM sockets) or core (threads each driving a core
    /// `Mux` of their own over the connections they accepted).
    #[arg(long, default_value = "kcm")]
    pub engine: String,
    /// kcm: application threads, each on its own clone; core: threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// kcm: `recv_batch` + `send_batch_to` instead of `recv_msg` + `send_to`.
    #[arg(long)]
    pub batch: bool,
    /// kcm: each application thread on a stand-alone clone
    /// (`KcmSocket::stand_alone`), the connections attached to the clones
    /// in turn and read by their threads.
    #[arg(long)]
    pub alone: bool,
    /// kcm: the workers' CPUs (one worker each, unless `--workers`).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub cpus: Vec<usize>,
    /// kcm: workers, pinned to `--cpus` in turn.
    #[arg(long)]
    pub workers: Option<usize>,
    /// kcm: auto, epoll or uring.
    #[arg(long, default_value = "auto")]
    pub driver: String,
    /// Stop after this many seconds (default: until killed).
    #[arg(long)]
    pub duration: Option<f64>,
}

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    #[arg(long, default_value_t = 8)]
    pub conns: usize,
    #[arg(short = 'a', long, default_value_t = 16)]
    pub inflight: usize,
    #[arg(long, default_value_t = 28)]
    pub size: usize,
    #[arg(short = 'd', long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Pin connection thread `i` to `cpus[i % len]`.
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    pub target: SocketAddr,
}

/// Payload byte `i` of the message tagged `tag`.
#[inline]
fn pattern(tag: u32, i: usize) -> u8 {
    (tag.wrapping_mul(0x9e37_79b9) >> 24) as u8 ^ (i as u8).wrapping_mul(13)
}

/// One message of `size` bytes carrying `tag`.
fn message(size: usize, tag: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&((size - 4) as u32).to_be_bytes());
    out.extend_from_slice(&tag.to_be_bytes());
    out.extend((0..size - 8).map(|i| pattern(tag, i)));
}

pub fn run_server(a: ServerArgs) -> anyhow::Result<i32> {
    let stop_at = a.duration.map(|d| Instant::now() + Duration::from_secs_f64(d));
    let l = TcpListener::bind(a.listen)?;
    match a.engine.as_str() {
        "thread" => {
            println!("kcm-server (thread per connection) listening on {}", l.local_addr()?);
            std::thread::spawn(move || {
                for c in l.incoming().flatten() {
                    let _ = std::thread::Builder::new().spawn(move || serve_thread(c));
                }
            });
        }
        "kcm" => serve_kcm(l, &a)?,
        "core" => {
            println!("kcm-server ({} thread(s) each with its own core) listening on {}", a.threads, l.local_addr()?);
            super::kcm_core::serve(l, a.threads)?
        }
        o => bail!("--engine {o}: thread, kcm or core"),
    }
    loop {
        if stop_at.is_some_and(|t| Instant::now() >= t) {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One connection, blocking: every whole message of a read echoed, all of
/// a read's echoes in one write; a partial message kept for the next read.
fn serve_thread(mut c: TcpStream) {
    let _ = c.set_nodelay(true);
    let mut buf = vec![0u8; 64 << 10];
    let mut have = 0;
    let mut out = Vec::with_capacity(64 << 10);
    loop {
        if have == buf.len() {
            // A message larger than the buffer: make room for it.
            buf.resize(buf.len() * 2, 0);
        }
        let n = match c.read(&mut buf[have..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        have += n;
        let mut at = 0;
        while have - at >= 4 {
            let len = 4 + u32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
            if have - at < len {
                break;
            }
            out.extend_from_slice(&buf[at..at + len]);
            at += len;
        }
        buf.copy_within(at..have, 0);
        have -= at;
        if !out.is_empty() {
            if c.write_all(&out).is_err() {
                return;
            }
            out.clear();
        }
    }
}

/// The KCM model: a mux, N application threads on clones of one socket, an
/// accept thread attaching connections and a thread unattaching those that
/// ended.
fn serve_kcm(l: TcpListener, a: &ServerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.threads > 0, "--threads must be at least 1");
    let mut c = connmux::Config::default();
    c.workers = a.workers.unwrap_or(a.cpus.len()).max(1);
    c.placement = connmux::Placement::Cpus(a.cpus.clone());
    c.driver = crate::cmd::server::parse_driver(&a.driver)?;
    if a.alone {
        c.stand_alone = a.threads;
        // (One worker thread: it reads nothing, the clones read theirs.)
        c.workers = 1;
    }
    let mux = connmux::Mux::new(c)?;
    let sock = mux.socket(connmux::SockType::Dgram)?;
    // KCM_RECV_DISABLE: this one only makes the clones; nothing reads it.
    sock.set_recv_disable(true)?;
    let mut clones = Vec::with_capacity(a.threads);
    for i in 0..a.threads {
        let s = std::sync::Arc::new(if a.alone { sock.stand_alone()? } else { sock.try_clone()? });
        clones.push(s.clone());
        let batch = a.batch;
        std::thread::Builder::new().name(format!("app-{i}")).spawn(move || {
            let r = if batch { echo_batches(&s) } else { echo_each(&s) };
            if let Err(e) = r {
                eprintln!("kcm-server: application thread {i}: {e}");
            }
        })?;
    }
    println!(
        "kcm-server ({} application thread(s){}, {}, driver {:?}) listening on {}",
        a.threads,
        if a.alone { " on stand-alone clones" } else { "" },
        if a.batch { "recv_batch + send_batch_to" } else { "recv_msg + send_to" },
        mux.driver(),
        l.local_addr()?
    );
    let (m, alone) = (mux.clone(), a.alone);
    std::thread::spawn(move || {
        for (i, c) in l.incoming().flatten().enumerate() {
            let _ = c.set_nodelay(true);
            let parser = connmux::parsers::from_spec("l4").expect("built-in");
            // The mux keeps its own descriptor: ours may go. Stand-alone
            // clones take the connections in turn.
            let r = match alone {
                true => clones[i % clones.len()].attach(&c, parser),
                false => m.attach(&c, parser),
            };
            if let Err(e) = r {
                eprintln!("kcm-server: attach: {e}");
            }
        }
    });
    // Connections that ended are unattached (as a KCM user must), once
    // every echo has been written to those that closed in order.
    std::thread::spawn(move || {
        // (The original socket lives as long as the process.)
        let _original = sock;
        let mut ended: Vec<connmux::PsockId> = Vec::new();
        loop {
            if let Ok(ev) = mux.events().recv_timeout(Duration::from_millis(50)) {
                ended.push(ev.psock);
            }
            ended.retain(|&p| {
                let wait = mux.closes_in_order(p) && !mux.psock_drained(p);
                if !wait {
                    let _ = mux.unattach_id(p);
                }
                wait
            });
        }
    });
    Ok(())
}

/// `recv_msg`, then `send_to` its connection, for ever.
fn echo_each(s: &connmux::KcmSocket) -> std::io::Result<()> {
    loop {
        let m = s.recv_msg()?;
        s.send_to(&m.data, m.psock)?;
    }
}

/// `recv_batch`, then one `send_batch_to` of the echoes, for ever.
fn echo_batches(s: &connmux::KcmSocket) -> std::io::Result<()> {
    let mut got = Vec::with_capacity(BATCH);
    loop {
        got.clear();
        s.recv_batch(&mut got, BATCH)?;
        let out: Vec<(Option<connmux::PsockId>, &[u8])> = got.iter().map(|m| (Some(m.psock), &m.data[..])).collect();
        let mut sent = 0;
        while sent < out.len() {
            sent += s.send_batch_to(&out[sent..])?;
        }
    }
}

struct Load {
    size: usize,
}

/// One connection of the client: decodes echoes in any order, checking each
/// against the message its tag names.
struct KClient {
    size: usize,
    buf: Vec<u8>,
}

impl Workload for Load {
    type Client = KClient;
    fn client(&self, _conn: usize) -> KClient {
        KClient { size: self.size, buf: Vec::new() }
    }
}

impl Client for KClient {
    fn encode(&mut self, tag: u32, out: &mut Vec<u8>) {
        message(self.size, tag, out);
    }

    fn decode(&mut self, input: &[u8], done: &mut Vec<u32>) -> Result<(), String> {
        self.buf.extend_from_slice(input);
        let n = self.size;
        let mut at = 0;
        while self.buf.len() - at >= n {
            let m = &self.buf[at..at + n];
            if m[..4] != ((n - 4) as u32).to_be_bytes() {
                return Err(format!("bad echo length {:02x?}", &m[..4]));
            }
            let tag = u32::from_be_bytes([m[4], m[5], m[6], m[7]]);
            if let Some(i) = m[8..].iter().enumerate().position(|(i, &b)| b != pattern(tag, i)) {
                return Err(format!("echo of message {tag:#x} differs at payload byte {i}"));
            }
            // (The engine refuses a tag not in flight: a duplicate or an invention.)
            done.push(tag);
            at += n;
        }
        self.buf.drain(..at);
        Ok(())
    }
}

pub fn run_load(a: LoadArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(a.conns > 0 && a.inflight > 0, "need connections and messages in flight");
    anyhow::ensure!(a.size >= 8, "--size: at least 8 bytes (length and tag)");
    let load = Load { size: a.size };
    let Some((conns, secs)) = engine::timed_load_round(&load, a.target, a.conns, a.inflight, a.seconds, &a.cpus) else {
        return Ok(1);
    };
    let calls: u64 = conns.iter().map(|c| c.calls).sum();
    println!("{}", serde_json::json!({"ok": true, "calls": calls, "rate": calls as f64 / secs}));
    Ok(0)
}

/// A server of the comparison.
struct Variant {
    name: String,
    engine: Engine,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Engine {
    Thread,
    /// Application threads on clones, and whether they batch.
    Kcm(usize, bool),
    /// Application threads on stand-alone clones, and whether they batch.
    Alone(usize, bool),
    /// Threads each with a core of their own.
    Core(usize),
}

/// `8x16` as (8, 16).
fn parse_shape(s: &str) -> anyhow::Result<(usize, usize)> {
    let (m, k) = s.split_once('x').with_context(|| format!("shape {s:?}: CONNSxINFLIGHT, e.g. 8x16"))?;
    let (m, k): (usize, usize) = (m.trim().parse()?, k.trim().parse()?);
    anyhow::ensure!(m > 0 && k > 0, "shape {s:?}: both must be positive");
    Ok((m, k))
}

fn load_once(a: &Args, (conns, inflight): (usize, usize), addr: SocketAddr) -> anyhow::Result<f64> {
    let out = taskset(&a.cpus, exe()?)
        .args(["bench", "kcm-load", "--cpus", &cpu_list(&a.cpus)])
        .args(["--conns", &conns.to_string(), "-a", &inflight.to_string(), "--size", &a.size.to_string()])
        .args(["-d", &a.seconds.to_string()])
        .arg(addr.to_string())
        .output()?;
    let doc: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("kcm-load printed no JSON: {}", String::from_utf8_lossy(&out.stderr)))?;
    if doc["ok"] != Value::Bool(true) {
        bail!("kcm load against {addr} failed: {}", doc["error"]);
    }
    doc["rate"].as_f64().context("kcm-load reported no rate")
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.rounds = 1;
        a.seconds = 0.3;
    }
    anyhow::ensure!(a.rounds > 0 && a.seconds > 0.0, "--rounds and --seconds must be positive");
    anyhow::ensure!(a.size >= 8, "--size: at least 8 bytes (length and tag)");
    anyhow::ensure!(!a.threads.is_empty() && a.threads.iter().all(|&n| n > 0), "--threads: positive counts");
    crate::cmd::server::parse_driver(&a.driver)?;
    let shapes: Vec<(usize, usize)> = if a.conns.is_empty() && a.inflight.is_empty() {
        a.shapes.iter().map(|s| parse_shape(s)).collect::<anyhow::Result<_>>()?
    } else {
        let ms = if a.conns.is_empty() { vec![8] } else { a.conns.clone() };
        let ks = if a.inflight.is_empty() { vec![16] } else { a.inflight.clone() };
        ms.iter().flat_map(|&m| ks.iter().map(move |&k| (m, k))).collect()
    };
    anyhow::ensure!(shapes.iter().all(|&(m, k)| m > 0 && k > 0), "--conns and --inflight must be positive");
    let mut variants = vec![Variant { name: "thread".into(), engine: Engine::Thread }];
    type MakeEngine = fn(usize, bool) -> Engine;
    let kinds: [(&str, MakeEngine); 2] = [("kcm", Engine::Kcm), ("alone", Engine::Alone)];
    for (kind, engine) in kinds {
        for batch in [false, true] {
            if batch && a.no_batch {
                continue;
            }
            for &n in &a.threads {
                let name = if batch { format!("{kind}-batch-{n}") } else { format!("{kind}-{n}") };
                variants.push(Variant { name, engine: engine(n, batch) });
            }
        }
    }
    if !a.no_core {
        for &n in &a.threads {
            variants.push(Variant { name: format!("core-{n}"), engine: Engine::Core(n) });
        }
    }
    let workers = a.workers.unwrap_or(a.cpus.len()).max(1);
    let mut servers = Vec::new();
    for v in &variants {
        let port = free_port()?;
        let mut cmd = taskset(&a.cpus, exe()?);
        cmd.args(["bench", "kcm-server", "-l", &format!("127.0.0.1:{port}")]);
        match v.engine {
            Engine::Thread => cmd.args(["--engine", "thread"]),
            Engine::Core(n) => cmd.args(["--engine", "core", "--threads", &n.to_string()]),
            Engine::Alone(n, batch) => {
                cmd.args(["--engine", "kcm", "--alone", "--threads", &n.to_string(), "--driver", &a.driver]);
                if batch {
                    cmd.arg("--batch");
                }
                &mut cmd
            }
            Engine::Kcm(n, batch) => {
                cmd.args(["--engine", "kcm", "--threads", &n.to_string(), "--cpus", &cpu_list(&a.cpus)]).args([
                    "--workers",
                    &workers.to_string(),
                    "--driver",
                    &a.driver,
                ]);
                if batch {
                    cmd.arg("--batch");
                }
                &mut cmd
            }
        };
        servers.push(Proc::spawn(&v.name, cmd, port)?);
    }
    let driver = match a.driver.as_str() {
        // (A worker a connection is attached to before any ask to serve
        // runs epoll: `Driver::Auto`.)
        "auto" => "auto (epoll: connections before any service)".to_string(),
        d => d.to_string(),
    };
    println!(
        "connmux bench kcm: {}-byte l4 messages echoed; thread per connection vs a mux ({workers} worker(s), driver \
         {driver}) with N application threads on cloned KcmSockets (recv_msg + send_to{}); alone-N: the same threads \
         on stand-alone clones, each reading its own connections{}; servers and client on \
         CPUs {:?}; {} round(s) of {} s, interleaved; medians; load avg {}",
        a.size,
        if a.no_batch { "" } else { ", and recv_batch + send_batch_to" },
        if a.no_core {
            ""
        } else {
            "; core-N: N threads each driving a core Mux of its own over the connections it accepted (no worker, no lock)"
        },
        a.cpus,
        a.rounds,
        a.seconds,
        loadavg()
    );
    // [shape][variant] -> rates per round
    let mut res = vec![vec![Vec::new(); variants.len()]; shapes.len()];
    for round in 0..a.rounds {
        for (si, &shape) in shapes.iter().enumerate() {
            for k in 0..servers.len() {
                let i = (k + round + si) % servers.len();
                let r = load_once(&a, shape, servers[i].addr).with_context(|| {
                    format!("round {}, {}x{}, against {}", round + 1, shape.0, shape.1, servers[i].name)
                })?;
                res[si][i].push(r);
            }
        }
        eprintln!("bench kcm: round {}/{} done", round + 1, a.rounds);
    }
    println!();
    println!("{:<8} {:<14} {:>12} {:>10} {:>10}", "shape", "server", "msgs/s", "vs_thread", "vs_1_thr");
    for (si, &(m, k)) in shapes.iter().enumerate() {
        let med: Vec<f64> = res[si].iter().map(|r| median(r.clone())).collect();
        for (vi, v) in variants.iter().enumerate() {
            // The same mode with one application thread, where measured.
            let one = match v.engine {
                Engine::Kcm(n, batch) if n > 1 => Some(Engine::Kcm(1, batch)),
                Engine::Core(n) if n > 1 => Some(Engine::Core(1)),
                Engine::Alone(n, batch) if n > 1 => Some(Engine::Alone(1, batch)),
                _ => None,
            };
            let one = one.and_then(|e| variants.iter().position(|w| w.engine == e)).map(|wi| ratio(med[vi], med[wi]));
            println!(
                "{:<8} {:<14} {:>12.0} {:>10} {:>10}",
                format!("{m}x{k}"),
                v.name,
                med[vi],
                ratio(med[vi], med[0]),
                one.unwrap_or_else(|| "-".into())
            );
        }
    }
    println!();
    println!("shape: connections x messages in flight on each; msgs/s: echoes checked per second, median over rounds;");
    println!(
        "vs_thread: against thread per connection in the same rounds; vs_1_thr: N application threads against one."
    );
    Ok(0)
}
