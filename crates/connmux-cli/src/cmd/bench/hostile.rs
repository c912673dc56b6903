//! `connmux bench hostile`: good clients beside hostile ones.
//!
//! Starts an `rpc-server` process (or with `--server echo` an `echo-server`
//! framing messages with the `l4` parser; its driver chosen by `--driver`,
//! any other server flag after `--`), measures the good clients alone for a moment
//! (the baseline of this run), then runs them again for `--seconds` beside a
//! mix of attacks, each on its own threads:
//!
//! | attack | what it does |
//! |---|---|
//! | `non-readers` | connections with `SO_RCVBUF` 4096 pipelining NULL calls and never reading |
//! | `half-close` | rounds of many pipelined calls, `shutdown(SHUT_WR)`, then reading to the end (from `--half-close-late-ms` after connecting): calls sent vs replies read, FIN or RST |
//! | `partial` | connections each holding one record of about 1 MiB, all but its last byte sent |
//! | `slowloris` | connections sending a call one byte at a time, a byte every 100 ms each |
//! | `garbage` | connections sending bad record marks (2 GiB, zero-length fragments) or random bytes |
//! | `rst` | connect, half a call, then close with RST, as fast as one thread can |
//! | `slow-reader` | rounds of `--slow-messages` requests (echo: 8 KiB messages) pipelined on one connection whose replies are read slowly (`--slow-read-bytes` every `--slow-read-pause-us`): the server stops reading it while its replies back up, and must deliver every one |
//! | `idle-cap` | a second server of the same kind capped at `--idle-conns` connections (`--max-conns`), filled by connections that never send (reopened when closed): newcomers must be answered, the idlest making room |
//!
//! The first six run together, beside the good clients; `slow-reader` and
//! `idle-cap` each run after them on their own beside the good clients (the
//! capped server with its own baseline), so that the good clients' rate
//! beside each is printed as a ratio to their rate alone.
//!
//! It prints the good clients' calls/s alone and under attack (and the
//! ratio), their errors and reply times, how many new connections (one every
//! 250 ms, one call each) were answered within 1 s, what each attack saw, the server's
//! RSS (start, peak, end, after the attackers left) from `/proc`, the
//! server's counters from its statistics socket, and how it stopped on
//! SIGTERM. Findings are printed, not judged: the exit status is 0 when the
//! run completed, whatever it found. `--json` prints one JSON object instead.
//! Short by default (CI runs it for 3 s); run it for an hour with
//! `--seconds 3600`.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use serde_json::{json, Value};
use socket2::{Domain, Socket, Type};

use super::{exe, free_port, loadavg, ratio, rss_kib, Proc};

/// Every attack, in the order they are printed.
const ATTACKS: [&str; 8] =
    ["non-readers", "half-close", "partial", "slowloris", "garbage", "rst", "slow-reader", "idle-cap"];
/// The attacks that run each on its own, after the others.
const SOLO: [&str; 2] = ["slow-reader", "idle-cap"];

/// The server attacked, and what its requests look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// `rpc-server`: NULL calls in marked records.
    Rpc,
    /// `echo-server --mode message --parser l4`: 4-byte big-endian length,
    /// then the body; the message comes back.
    Echo,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Rpc => "rpc-server",
            Target::Echo => "echo-server",
        }
    }

    fn server_args(self) -> &'static [&'static str] {
        match self {
            Target::Rpc => &["rpc-server"],
            Target::Echo => &["echo-server", "--mode", "message", "--parser", "l4"],
        }
    }

    /// One request carrying `xid` at bytes 4..8 of its reply too.
    fn request(self, xid: u32) -> Vec<u8> {
        match self {
            Target::Rpc => null_call(xid).to_vec(),
            Target::Echo => [4u32.to_be_bytes(), xid.to_be_bytes()].concat(),
        }
    }

    /// Length of one reply.
    fn reply_len(self) -> usize {
        match self {
            Target::Rpc => 28,
            Target::Echo => 8,
        }
    }

    /// The header of a message of `total` bytes, header included.
    fn header(self, total: usize) -> [u8; 4] {
        match self {
            Target::Rpc => (0x8000_0000u32 | (total - 4) as u32).to_be_bytes(),
            Target::Echo => ((total - 4) as u32).to_be_bytes(),
        }
    }

    /// A request the server must refuse by its content, not its framing.
    fn not_a_request(self) -> Option<Vec<u8>> {
        match self {
            // A record whose message type is REPLY.
            Target::Rpc => {
                let mut c = null_call(7).to_vec();
                c[8..12].copy_from_slice(&1u32.to_be_bytes());
                Some(c)
            }
            // Echo takes any message.
            Target::Echo => None,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seconds of attacks (the good clients' baseline runs before, alone).
    #[arg(short = 'd', long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Seconds of the good clients alone, before the attacks.
    #[arg(long, default_value_t = 1.0)]
    pub baseline_seconds: f64,
    /// I/O driver of the server: epoll or uring (or auto).
    #[arg(long, default_value = "epoll")]
    pub driver: String,
    /// Good clients: one call in flight each, a 1 s reply deadline.
    #[arg(long, default_value_t = 2)]
    pub good: usize,
    /// Which attacks (comma-separated): non-readers, half-close, partial,
    /// slowloris, garbage, rst (together), slow-reader, idle-cap (each on
    /// its own).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "non-readers,half-close,partial,slowloris,garbage,rst,slow-reader,idle-cap"
    )]
    pub attacks: Vec<String>,
    /// Requests the slow reader pipelines in each round (rpc: NULL calls,
    /// 200,000 by default; echo: messages of 8 KiB, 10,000).
    #[arg(long)]
    pub slow_messages: Option<usize>,
    /// Bytes the slow reader reads at a time (rpc: 1 KiB by default, some
    /// 2 MB/s of replies; echo: 16 KiB, 32 MB/s): either way its replies
    /// back up for seconds.
    #[arg(long)]
    pub slow_read_bytes: Option<usize>,
    /// Microseconds the slow reader waits after each read.
    #[arg(long, default_value_t = 500)]
    pub slow_read_pause_us: u64,
    /// Idle connections filling the capped server of `idle-cap` (its
    /// `--max-conns`).
    #[arg(long, default_value_t = 1000)]
    pub idle_conns: usize,
    /// Non-reading connections.
    #[arg(long, default_value_t = 10)]
    pub non_readers: usize,
    /// Calls pipelined before each half-close.
    #[arg(long, default_value_t = 10_000)]
    pub half_close_calls: usize,
    /// Milliseconds each half-closing client waits before it starts to read
    /// its replies (its replies back up meanwhile: the server must write
    /// them all, then FIN, once it reads). 0: it reads at once.
    #[arg(long, default_value_t = 0)]
    pub half_close_late_ms: u64,
    /// Connections holding a partial record of about 1 MiB.
    #[arg(long, default_value_t = 32)]
    pub partials: usize,
    /// Slowloris connections.
    #[arg(long, default_value_t = 50)]
    pub slowloris: usize,
    /// The server attacked.
    #[arg(long, value_enum, default_value = "rpc")]
    pub server: Target,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Extra server flags, after `--` (e.g. `-- --workers 2`).
    #[arg(last = true)]
    pub server_args: Vec<String>,
}

/// A NULL call record (NFS v3, AUTH_NONE) with the last-fragment mark.
fn null_call(xid: u32) -> [u8; 44] {
    let mut rec = [0u8; 44];
    rec[..4].copy_from_slice(&(0x8000_0000u32 | 40).to_be_bytes());
    for (i, w) in [xid, 0, 2, 100_003, 3, 0, 0, 0, 0, 0].into_iter().enumerate() {
        rec[4 + i * 4..8 + i * 4].copy_from_slice(&w.to_be_bytes());
    }
    rec
}

/// What the good clients saw in one phase.
#[derive(Default)]
struct Good {
    calls: AtomicU64,
    /// Replies not read within the deadline, connections reset or closed,
    /// replies that did not match the call.
    errors: AtomicU64,
    reconnects: AtomicU64,
    /// Reply times, µs.
    hist: Mutex<Option<Histogram<u64>>>,
}

/// Good clients calling one at a time until `end`.
fn good_clients(t: Target, addr: SocketAddr, n: usize, end: Instant) -> Good {
    let good = Arc::new(Good {
        hist: Mutex::new(Some(Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"))),
        ..Good::default()
    });
    let threads: Vec<_> = (0..n)
        .map(|k| {
            let good = good.clone();
            std::thread::spawn(move || {
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
                let mut conn: Option<TcpStream> = None;
                let mut xid = (k as u32) << 24;
                let mut reply = vec![0u8; t.reply_len()];
                while Instant::now() < end {
                    let c = match &mut conn {
                        Some(c) => c,
                        None => match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                            Ok(c) => {
                                let _ = c.set_nodelay(true);
                                let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                                conn.insert(c)
                            }
                            Err(_) => {
                                good.errors.fetch_add(1, Relaxed);
                                std::thread::sleep(Duration::from_millis(10));
                                continue;
                            }
                        },
                    };
                    xid = xid.wrapping_add(1);
                    let sent = Instant::now();
                    let ok = c.write_all(&t.request(xid)).is_ok()
                        && c.read_exact(&mut reply).is_ok()
                        && reply[4..8] == xid.to_be_bytes();
                    if ok {
                        good.calls.fetch_add(1, Relaxed);
                        let _ = h.record(sent.elapsed().as_micros().max(1) as u64);
                    } else {
                        good.errors.fetch_add(1, Relaxed);
                        good.reconnects.fetch_add(1, Relaxed);
                        conn = None;
                    }
                }
                if let Some(all) = good.hist.lock().unwrap().as_mut() {
                    let _ = all.add(&h);
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    Arc::try_unwrap(good).unwrap_or_default()
}

/// The kernel's count of connections dropped at a listener (`ListenDrops`
/// in `/proc/net/netstat`: a full accept queue, among others), machine-wide.
fn listen_drops() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let i = names.split_whitespace().position(|n| n == "ListenDrops")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// New connections during the attacks, one every 250 ms, each making one
/// call with a 1 s deadline: (answered, tried, slowest answer in µs).
fn newcomers(t: Target, addr: SocketAddr, end: Instant) -> (u64, u64, u64) {
    let (mut answered, mut tried, mut slowest) = (0, 0, 0);
    let mut reply = vec![0u8; t.reply_len()];
    while Instant::now() < end {
        let next = Instant::now() + Duration::from_millis(250);
        tried += 1;
        let start = Instant::now();
        let ok = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok_and(|mut c| {
            let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
            c.write_all(&t.request(tried as u32)).is_ok() && c.read_exact(&mut reply).is_ok()
        });
        if ok {
            answered += 1;
            slowest = slowest.max(start.elapsed().as_micros() as u64);
        }
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    (answered, tried, slowest)
}

/// What one attack saw: named counters.
#[derive(Default)]
struct Seen(Mutex<Vec<(&'static str, u64)>>);

impl Seen {
    fn add(&self, k: &'static str, v: u64) {
        let mut s = self.0.lock().unwrap();
        match s.iter_mut().find(|(n, _)| *n == k) {
            Some((_, x)) => *x += v,
            None => s.push((k, v)),
        }
    }
    fn get(&self, k: &str) -> u64 {
        self.0.lock().unwrap().iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v)
    }
    fn pairs(&self) -> Vec<(&'static str, u64)> {
        self.0.lock().unwrap().clone()
    }
}

/// A connection with options set before the handshake.
fn connect_with(addr: SocketAddr, rcvbuf: Option<usize>) -> std::io::Result<TcpStream> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    if let Some(b) = rcvbuf {
        s.set_recv_buffer_size(b)?;
    }
    s.connect_timeout(&addr.into(), Duration::from_secs(1))?;
    Ok(TcpStream::from(s))
}

/// Whether the server closed `c` (EOF or reset) within `limit`; reads and
/// drops whatever it sends.
fn closed_within(c: &mut TcpStream, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        let _ = c.set_read_timeout(Some(end.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))));
        match c.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
    false
}

/// Connections pipelining calls and never reading, open until `end`.
fn non_readers(t: Target, addr: SocketAddr, n: usize, end: Instant, seen: &Seen) {
    let mut conns: Vec<TcpStream> = (0..n)
        .filter_map(|_| connect_with(addr, Some(4096)).ok())
        .inspect(|c| {
            let _ = c.set_nonblocking(true);
        })
        .collect();
    seen.add("connections", conns.len() as u64);
    let batch: Vec<u8> = (0..64u32).flat_map(|x| t.request(x)).collect();
    let mut pos = vec![0usize; conns.len()];
    let mut dead = vec![false; conns.len()];
    while Instant::now() < end {
        let mut wrote = false;
        for (i, c) in conns.iter_mut().enumerate() {
            if dead[i] {
                continue;
            }
            match c.write(&batch[pos[i]..]) {
                Ok(k) => {
                    wrote = true;
                    seen.add("bytes_sent", k as u64);
                    pos[i] = (pos[i] + k) % batch.len();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {
                    dead[i] = true;
                    seen.add("closed_by_server", 1);
                }
            }
        }
        if !wrote {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    seen.add("calls_sent", seen.get("bytes_sent") / t.request(0).len() as u64);
}

/// Rounds of `calls` pipelined calls, half-close, read to the end from
/// `late` after connecting.
fn half_close(t: Target, addr: SocketAddr, calls: usize, late: Duration, end: Instant, seen: &Seen) {
    let all: Vec<u8> = (0..calls as u32).flat_map(|x| t.request(x)).collect();
    while Instant::now() < end {
        let Ok(mut c) = connect_with(addr, None) else {
            seen.add("connect_errors", 1);
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let mut w = match c.try_clone() {
            Ok(w) => w,
            Err(_) => continue,
        };
        let all = all.clone();
        let writer = std::thread::spawn(move || {
            let ok = w.write_all(&all).is_ok();
            let _ = w.shutdown(Shutdown::Write);
            ok
        });
        std::thread::sleep(late);
        // A server that neither answers nor closes: the round ends after 5 s
        // of silence (counted as stalled).
        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0usize;
        let ending = loop {
            match c.read(&mut buf) {
                Ok(0) => break "fin",
                Ok(k) => got += k,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break "stalled",
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break "rst",
            }
        };
        drop(c);
        let sent_all = writer.join().unwrap_or(false);
        seen.add("rounds", 1);
        seen.add("calls_sent", calls as u64);
        seen.add("replies_read", (got / t.reply_len()) as u64);
        seen.add(
            match ending {
                "fin" => "ended_fin",
                "rst" => "ended_rst",
                _ => "ended_stalled",
            },
            1,
        );
        if !sent_all {
            seen.add("send_failed", 1);
        }
    }
    seen.add("replies_lost", seen.get("calls_sent").saturating_sub(seen.get("replies_read")));
}

/// Connections each holding all but the last byte of one record of about 1 MiB.
fn partials(t: Target, addr: SocketAddr, n: usize, end: Instant, seen: &Seen) {
    const RECORD: usize = (1 << 20) - 16;
    let mut rec = t.header(RECORD).to_vec();
    rec.resize(RECORD - 1, 0);
    let mut conns: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    while Instant::now() < end {
        for slot in conns.iter_mut() {
            if Instant::now() >= end {
                break;
            }
            if let Some(c) = slot {
                // Closed by the server (a limit or a timeout): open another.
                if !closed_within(c, Duration::from_millis(1)) {
                    continue;
                }
                seen.add("closed_by_server", 1);
                *slot = None;
            }
            let Ok(mut c) = connect_with(addr, None) else {
                seen.add("connect_errors", 1);
                continue;
            };
            let _ = c.set_write_timeout(Some(Duration::from_secs(2)));
            match c.write_all(&rec) {
                Ok(()) => seen.add("records_held", 1),
                // The server stopped reading it (a limit): held all the same.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    seen.add("send_stalled", 1)
                }
                Err(_) => {
                    seen.add("closed_by_server", 1);
                    continue;
                }
            }
            *slot = Some(c);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Connections sending one byte of a call every 100 ms each.
fn slowloris(t: Target, addr: SocketAddr, n: usize, end: Instant, seen: &Seen) {
    let call = t.request(1);
    let mut conns: Vec<(TcpStream, usize)> =
        (0..n).filter_map(|_| connect_with(addr, None).ok().map(|c| (c, 0))).collect();
    seen.add("connections", conns.len() as u64);
    while Instant::now() < end && !conns.is_empty() {
        conns.retain_mut(|(c, i)| match c.write(&call[*i % call.len()..*i % call.len() + 1]) {
            Ok(_) => {
                *i += 1;
                seen.add("bytes_sent", 1);
                true
            }
            Err(_) => {
                seen.add("closed_by_server", 1);
                false
            }
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    seen.add("open_at_end", conns.len() as u64);
}

/// Bad inputs in turn; each connection should be closed by the server.
fn garbage(t: Target, addr: SocketAddr, end: Instant, seen: &Seen) {
    let mut rng = SmallRng::seed_from_u64(0x9e37_79b9);
    let mut k = 0u64;
    while Instant::now() < end {
        k += 1;
        let bytes: Vec<u8> = match (k % 4, t.not_a_request()) {
            // RPC: a last fragment of 2 GiB - 1; l4: a 4 GiB message.
            (0, _) => vec![0xff, 0xff, 0xff, 0xff],
            // RPC: a non-last fragment of 2 GiB - 1; l4: a 2 GiB message.
            (1, _) => vec![0x7f, 0xff, 0xff, 0xff],
            // Well framed, but not a request.
            (2, Some(bad)) => bad,
            // Random bytes.
            _ => {
                let mut b = vec![0u8; 256];
                rng.fill_bytes(&mut b);
                b
            }
        };
        let Ok(mut c) = connect_with(addr, None) else {
            seen.add("connect_errors", 1);
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        seen.add("connections", 1);
        if c.write_all(&bytes).is_err() || closed_within(&mut c, Duration::from_secs(1)) {
            seen.add("closed_by_server", 1);
        } else {
            seen.add("left_open_1s", 1);
        }
    }
}

/// Connect, half a call, RST.
fn rst_flood(t: Target, addr: SocketAddr, end: Instant, seen: &Seen) {
    let call = t.request(3);
    let half = &call[..call.len() / 2];
    while Instant::now() < end {
        match Socket::new(Domain::IPV4, Type::STREAM, None).and_then(|s| {
            s.connect_timeout(&addr.into(), Duration::from_secs(1))?;
            let _ = s.send(half);
            s.set_linger(Some(Duration::ZERO))?;
            Ok(s)
        }) {
            Ok(s) => {
                drop(s);
                seen.add("resets", 1);
            }
            Err(_) => {
                seen.add("connect_errors", 1);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// What the slow reader sends: its requests and the length of each reply.
fn slow_requests(t: Target, n: usize) -> (Vec<u8>, usize) {
    match t {
        Target::Rpc => ((0..n as u32).flat_map(null_call).collect(), t.reply_len()),
        Target::Echo => {
            const TOTAL: usize = 4 + (8 << 10);
            let mut one = t.header(TOTAL).to_vec();
            one.resize(TOTAL, 0x5a);
            (one.repeat(n), TOTAL)
        }
    }
}

/// Rounds of one connection pipelining `n` requests while its replies are
/// read `chunk` bytes at a time, `pause` apart, until every reply is in
/// (or 5 s without a byte, or the connection ends), from `end` on no new round.
fn slow_reader(t: Target, addr: SocketAddr, n: usize, chunk: usize, pause: Duration, end: Instant, seen: &Seen) {
    let (all, reply_len) = slow_requests(t, n);
    let all = Arc::new(all);
    let want = n * reply_len;
    while Instant::now() < end {
        // A small receive buffer: the replies back up in the server, not here.
        let Ok(mut c) = connect_with(addr, Some(64 << 10)) else {
            seen.add("connect_errors", 1);
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let Ok(mut w) = c.try_clone() else { continue };
        let all = all.clone();
        let writer = std::thread::spawn(move || w.write_all(&all).is_ok());
        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        let t0 = Instant::now();
        let mut buf = vec![0u8; chunk.max(1)];
        let mut got = 0usize;
        let ending = loop {
            if got >= want {
                break "complete";
            }
            match c.read(&mut buf) {
                Ok(0) => break "closed",
                Ok(k) => got += k,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break "stalled",
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break "rst",
            }
            std::thread::sleep(pause);
        };
        let took = t0.elapsed();
        // (A writer still blocked on a connection the server gave up on
        // returns once this end is closed.)
        let _ = c.shutdown(Shutdown::Both);
        drop(c);
        let sent_all = writer.join().unwrap_or(false);
        seen.add("rounds", 1);
        seen.add("requests_sent", n as u64);
        seen.add("replies_read", (got / reply_len) as u64);
        seen.add(
            match ending {
                "complete" => "rounds_complete",
                "closed" => "ended_closed",
                "rst" => "ended_rst",
                _ => "ended_stalled",
            },
            1,
        );
        let ms = took.as_millis() as u64;
        let longest = seen.get("longest_round_ms");
        if ms > longest {
            seen.add("longest_round_ms", ms - longest);
        }
        if !sent_all {
            seen.add("send_failed", 1);
        }
    }
    seen.add("replies_lost", seen.get("requests_sent").saturating_sub(seen.get("replies_read")));
}

/// `n` connections that never send, reopened when the server closes one,
/// until `end`.
fn idle_holders(addr: SocketAddr, n: usize, end: Instant, seen: &Seen) {
    let mut conns: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut first = true;
    while Instant::now() < end {
        for slot in conns.iter_mut() {
            if let Some(c) = slot {
                if !closed_within(c, Duration::from_millis(1)) {
                    continue;
                }
                seen.add("closed_by_server", 1);
                *slot = None;
            }
            match connect_with(addr, None) {
                Ok(c) => {
                    let _ = c.set_nonblocking(true);
                    seen.add("connections", 1);
                    *slot = Some(c);
                }
                Err(_) => seen.add("connect_errors", 1),
            }
        }
        if first {
            seen.add("held_at_start", conns.iter().flatten().count() as u64);
            first = false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// VmRSS samples of a process until `stop`: (start, peak, last), KiB.
fn sample_rss(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, u64, u64)> {
    std::thread::spawn(move || {
        let first = rss_kib(pid).unwrap_or(0);
        let (mut peak, mut last) = (first, first);
        while !stop.load(Relaxed) {
            if let Ok(r) = rss_kib(pid) {
                peak = peak.max(r);
                last = r;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (first, peak, last)
    })
}

/// VmHWM (the kernel's peak RSS) of a process, KiB.
fn hwm_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.split_whitespace().next()?.parse().ok()
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The good clients' figures as JSON.
fn good_json(g: &Good, secs: f64) -> Value {
    let h = g.hist.lock().unwrap();
    let q = |p: f64| h.as_ref().filter(|h| !h.is_empty()).map(|h| h.value_at_quantile(p));
    json!({
        "calls": g.calls.load(Relaxed),
        "calls_per_s": g.calls.load(Relaxed) as f64 / secs,
        "errors": g.errors.load(Relaxed),
        "reconnects": g.reconnects.load(Relaxed),
        "p50_us": q(0.5),
        "p99_us": q(0.99),
        "max_us": h.as_ref().filter(|h| !h.is_empty()).map(|h| h.max()),
    })
}

/// What an attack saw, as JSON.
fn seen_json(s: &Seen) -> Value {
    Value::Object(s.pairs().into_iter().map(|(k, v)| (k.to_string(), Value::from(v))).collect())
}

/// `name=value` lines of a statistics snapshot.
fn counters(text: &str) -> serde_json::Map<String, Value> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| !k.contains(' '))
        .filter_map(|(k, v)| v.trim().parse::<u64>().ok().map(|v| (k.to_string(), Value::from(v))))
        .collect()
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    anyhow::ensure!(a.seconds > 0.0 && a.baseline_seconds > 0.0, "--seconds and --baseline-seconds must be positive");
    anyhow::ensure!(a.good > 0, "--good must be at least 1");
    for at in &a.attacks {
        if !ATTACKS.contains(&at.as_str()) {
            bail!("unknown attack {at:?} ({})", ATTACKS.join(", "));
        }
    }
    let on = |name: &str| a.attacks.iter().any(|x| x == name);
    let together: Vec<&str> = ATTACKS.iter().copied().filter(|n| on(n) && !SOLO.contains(n)).collect();
    let dir = std::env::temp_dir().join(format!("connmux-bench-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let t = a.server;
    let sock: PathBuf = dir.join(format!("{}.sock", t.name()));
    let port = free_port()?;
    let server_cmd = |port: u16, sock: &std::path::Path, extra: &[String]| -> anyhow::Result<std::process::Command> {
        let mut cmd = std::process::Command::new(exe()?);
        cmd.args(t.server_args())
            .args(["-l", &format!("127.0.0.1:{port}"), "--driver", &a.driver, "--stats-socket"])
            .arg(sock)
            .args(&a.server_args)
            .args(extra);
        Ok(cmd)
    };
    let mut server = Proc::spawn(t.name(), server_cmd(port, &sock, &[])?, port)?;
    let pid = server.pid;
    let addr = server.addr;
    if !a.json {
        println!(
            "connmux bench hostile: {} (driver {}{}{}), {} good client(s) alone for {} s, then beside {} for {} s; load avg {}",
            t.name(),
            a.driver,
            if a.server_args.is_empty() { "" } else { ", " },
            a.server_args.join(" "),
            a.good,
            a.baseline_seconds,
            a.attacks.join(", "),
            a.seconds,
            loadavg()
        );
    }

    let stop_rss = Arc::new(AtomicBool::new(false));
    let rss = sample_rss(pid, stop_rss.clone());

    let alone = good_clients(t, addr, a.good, Instant::now() + Duration::from_secs_f64(a.baseline_seconds));

    // (Without an attack to run together, that phase takes no time.)
    let together_secs = if together.is_empty() { 0.0 } else { a.seconds };
    let end = Instant::now() + Duration::from_secs_f64(together_secs);
    let seen: Vec<(&'static str, Arc<Seen>)> = together.iter().map(|n| (*n, Arc::new(Seen::default()))).collect();
    let mut attackers = Vec::new();
    for (name, s) in &seen {
        let s = s.clone();
        let (non_readers_n, calls, partials_n, slow_n) = (a.non_readers, a.half_close_calls, a.partials, a.slowloris);
        let late = Duration::from_millis(a.half_close_late_ms);
        let name = *name;
        attackers.push(std::thread::spawn(move || match name {
            "non-readers" => non_readers(t, addr, non_readers_n, end, &s),
            "half-close" => half_close(t, addr, calls, late, end, &s),
            "partial" => partials(t, addr, partials_n, end, &s),
            "slowloris" => slowloris(t, addr, slow_n, end, &s),
            "garbage" => garbage(t, addr, end, &s),
            _ => rst_flood(t, addr, end, &s),
        }));
    }
    let drops0 = listen_drops();
    let probe = std::thread::spawn(move || newcomers(t, addr, end));
    let under = good_clients(t, addr, a.good, end);
    let (new_answered, new_tried, new_slowest_us) = probe.join().unwrap_or((0, 0, 0));
    for t in attackers {
        let _ = t.join();
    }
    let listen_drops = listen_drops().zip(drops0).map(|(b, a)| b.saturating_sub(a));

    // The attacks that run on their own, each beside the good clients.
    let mut solo = serde_json::Map::new();
    let ratio_of = |beside: &Good, alone: &Good, alone_secs: f64| {
        let r0 = alone.calls.load(Relaxed) as f64 / alone_secs;
        let r1 = beside.calls.load(Relaxed) as f64 / a.seconds;
        if r0 > 0.0 {
            r1 / r0
        } else {
            0.0
        }
    };
    if on("slow-reader") {
        let s = Seen::default();
        let end = Instant::now() + Duration::from_secs_f64(a.seconds);
        let pause = Duration::from_micros(a.slow_read_pause_us);
        let (n, chunk) = match t {
            Target::Rpc => (a.slow_messages.unwrap_or(200_000), a.slow_read_bytes.unwrap_or(1 << 10)),
            Target::Echo => (a.slow_messages.unwrap_or(10_000), a.slow_read_bytes.unwrap_or(16 << 10)),
        };
        let beside = std::thread::scope(|sc| {
            sc.spawn(|| slow_reader(t, addr, n, chunk, pause, end, &s));
            good_clients(t, addr, a.good, end)
        });
        solo.insert(
            "slow-reader".into(),
            json!({
                "seen": seen_json(&s),
                "good_alone": good_json(&alone, a.baseline_seconds),
                "good_beside": good_json(&beside, a.seconds),
                "ratio": ratio_of(&beside, &alone, a.baseline_seconds),
            }),
        );
    }
    if on("idle-cap") {
        let csock = dir.join(format!("{}-capped.sock", t.name()));
        let cport = free_port()?;
        let cap = a.idle_conns.to_string();
        let capped = Proc::spawn(
            &format!("{} --max-conns {cap}", t.name()),
            server_cmd(cport, &csock, &["--max-conns".into(), cap.clone()])?,
            cport,
        )?;
        let caddr = capped.addr;
        let alone_c = good_clients(t, caddr, a.good, Instant::now() + Duration::from_secs_f64(a.baseline_seconds));
        let s = Seen::default();
        let end = Instant::now() + Duration::from_secs_f64(a.seconds);
        let (beside, (answered, tried, slowest)) = std::thread::scope(|sc| {
            sc.spawn(|| idle_holders(caddr, a.idle_conns, end, &s));
            let probe = sc.spawn(|| newcomers(t, caddr, end));
            let g = good_clients(t, caddr, a.good, end);
            (g, probe.join().unwrap_or((0, 0, 0)))
        });
        let c = counters(&crate::cmd::stat::read_one(&csock).unwrap_or_default());
        drop(capped);
        solo.insert(
            "idle-cap".into(),
            json!({
                "max_conns": a.idle_conns,
                "seen": seen_json(&s),
                "newcomers": { "tried": tried, "answered": answered, "slowest_us": slowest },
                "server_counters": { "evicted": c.get("evicted"), "refused": c.get("refused"), "accepted": c.get("accepted") },
                "good_alone": good_json(&alone_c, a.baseline_seconds),
                "good_beside": good_json(&beside, a.seconds),
                "ratio": ratio_of(&beside, &alone_c, a.baseline_seconds),
            }),
        );
    }
    stop_rss.store(true, Relaxed);
    let during = rss.join().unwrap_or((0, 0, 0));
    let peak_hwm = hwm_kib(pid);
    // The attackers' connections are closed: what the server keeps after.
    std::thread::sleep(Duration::from_secs(1));
    let after_kib = rss_kib(pid).unwrap_or(0);
    let stats_text = crate::cmd::stat::read_one(&sock).unwrap_or_default();
    let server_counters = counters(&stats_text);

    // Graceful stop: SIGTERM, bounded wait.
    let stop_start = Instant::now();
    let _ = connmux_sys::signal::kill(pid, libc::SIGTERM);
    let stopped = server.wait_exit(Duration::from_secs(15)).is_ok();
    let stop_ms = stop_start.elapsed().as_millis() as u64;
    let socket_left = sock.exists();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);

    let base_secs = a.baseline_seconds;
    let doc = json!({
        "server": t.name(),
        "driver": a.driver,
        "server_args": a.server_args,
        "seconds": a.seconds,
        "good_alone": good_json(&alone, base_secs),
        "good_under_attack": good_json(&under, a.seconds),
        "newcomers": { "tried": new_tried, "answered": new_answered, "slowest_us": new_slowest_us },
        "listen_drops": listen_drops,
        "attacks": seen.iter().map(|(n, s)| (n.to_string(), seen_json(s))).collect::<serde_json::Map<_, _>>(),
        "rss_kib": { "start": during.0, "peak_sampled": during.1, "peak_hwm": peak_hwm, "end_of_attacks": during.2, "after_1s": after_kib },
        "server_counters": server_counters,
        "stop": { "sigterm_exited": stopped, "ms": stop_ms, "stats_socket_left": socket_left },
        "solo": solo,
    });
    if a.json {
        println!("{doc}");
        return Ok(0);
    }
    let g0 = &doc["good_alone"];
    let g1 = &doc["good_under_attack"];
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    println!();
    let under_attack = if together.is_empty() {
        "no attack run together".to_string()
    } else {
        format!(
            "under attack: {:>9.0} calls/s ({}), p99 {} µs, max {} µs, errors {}, reconnects {}",
            f(&g1["calls_per_s"]),
            ratio(f(&g1["calls_per_s"]), f(&g0["calls_per_s"])),
            g1["p99_us"],
            g1["max_us"],
            g1["errors"],
            g1["reconnects"],
        )
    };
    println!("good clients   alone: {:>9.0} calls/s, p99 {} µs   {under_attack}", f(&g0["calls_per_s"]), g0["p99_us"]);
    if !together.is_empty() {
        println!(
            "newcomers      {new_answered} of {new_tried} new connections answered within 1 s (one call each, every 250 ms), slowest {:.1} ms",
            new_slowest_us as f64 / 1000.0
        );
        println!(
            "listen drops   {} (connections the kernel dropped at a full listener backlog, this machine's, during the attacks)",
            listen_drops.map_or("?".to_string(), |n| n.to_string())
        );
    }
    for (name, s) in &seen {
        let pairs = s.pairs().iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        println!("{name:<14} {pairs}");
    }
    for (name, v) in SOLO.iter().filter_map(|n| solo.get(*n).map(|v| (*n, v))) {
        let seen = v["seen"]
            .as_object()
            .map_or(String::new(), |m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "));
        let extra = match name {
            "idle-cap" => format!(
                "; capped at {}: newcomers {} of {} answered within 1 s (slowest {:.1} ms), evicted={} refused={}",
                v["max_conns"],
                v["newcomers"]["answered"],
                v["newcomers"]["tried"],
                f(&v["newcomers"]["slowest_us"]) / 1000.0,
                v["server_counters"]["evicted"],
                v["server_counters"]["refused"],
            ),
            _ => String::new(),
        };
        println!(
            "{name:<14} {seen}{extra}\n               good clients beside it: {:.0} calls/s ({:.2}x their {:.0} alone{}), p99 {} µs, errors {}",
            f(&v["good_beside"]["calls_per_s"]),
            f(&v["ratio"]),
            f(&v["good_alone"]["calls_per_s"]),
            if name == "idle-cap" { " on the capped server" } else { "" },
            v["good_beside"]["p99_us"],
            v["good_beside"]["errors"],
        );
    }
    println!(
        "server RSS     start {}, peak {} (sampled {}), end of attacks {}, 1 s after the attackers left {}",
        mib(during.0),
        peak_hwm.map(mib).unwrap_or_else(|| "?".into()),
        mib(during.1),
        mib(during.2),
        mib(after_kib)
    );
    let interesting = [
        "accepted",
        "closed",
        "attach_errors",
        "rx_msgs",
        "tx_msgs",
        "rx_aborts",
        "rx_bad_hdr_len",
        "rx_msg_too_big",
        "rx_msg_timeouts",
        "tx_aborts",
        "tx_addressed_drops",
        "tx_backlog_refusals",
        "rpc_bad_calls",
    ];
    let picked: Vec<String> =
        interesting.iter().filter_map(|k| server_counters.get(*k).map(|v| format!("{k}={v}"))).collect();
    println!("server counters {}", picked.join(" "));
    let others: Vec<String> = server_counters
        .iter()
        .filter(|(k, _)| !interesting.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !others.is_empty() {
        println!("                {}", others.join(" "));
    }
    println!(
        "server stop    SIGTERM: {} after {stop_ms} ms; statistics socket {}",
        if stopped { "exited" } else { "still running (killed)" },
        if socket_left { "left behind" } else { "removed" }
    );
    Ok(0)
}
