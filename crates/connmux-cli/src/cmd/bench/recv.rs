//! `connmux bench recv`: receiving whole messages through connmux against a
//! plain blocking read loop, on the same socket.
//!
//! One loopback TCP connection carries everything. A sender thread writes
//! L4 messages (a 4-byte big-endian length, then the payload) into one end;
//! the other end is read, in turn, by
//! - `plain`: a blocking read loop on the socket itself (a 64 KiB `BufReader`,
//!   `read_exact` of each header and body into a reused buffer);
//! - `connmux-epoll` / `connmux-uring`: the socket attached to a fresh mux
//!   with that driver (one worker), messages taken with `KcmSocket::recv_msg`
//!   (blocking); the socket is unattached and the mux dropped after the round,
//!   so the next reader finds the stream where this one left it;
//! - `epoll-batch` / `uring-batch`: the same with `recv_batch` (up to 64
//!   messages per call), as a reader that drains a busy socket would.
//!
//! Each round runs every size and every reader, in a rotating order, twice:
//! - throughput: the sender writes messages back to back (64 KiB writes) for
//!   `--seconds`, then one marked last; messages/s is what the reader took,
//!   from the sender's first write to the last message;
//! - latency: one message in flight; the sender stamps it, the reader notes
//!   the one-way delay when it has the whole message and answers with an
//!   8-byte acknowledgement (connmux: `send_to` the message's connection),
//!   which releases the next. The round's figure is the median delay.
//!
//! Printed: medians over rounds of both figures, and ratios to `plain`.

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::{loadavg, median, ratio};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Payload sizes in bytes (each message is 4 bytes more).
    #[arg(long, value_delimiter = ',', default_value = "64,1024,65536")]
    pub sizes: Vec<usize>,
    /// Interleaved rounds (each reader, each size, once per round).
    #[arg(short = 'i', long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds of streaming per throughput measurement.
    #[arg(short = 'd', long, default_value_t = 0.5)]
    pub seconds: f64,
    /// Round trips per latency measurement (also bounded by `--seconds`).
    #[arg(long, default_value_t = 2000)]
    pub pings: usize,
    /// A smoke run: one round of 0.2 s, 200 round trips.
    #[arg(long)]
    pub quick: bool,
}

/// Who reads the receiving end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reader {
    Plain,
    /// A mux on this driver; `true`: `recv_batch` (up to [`BATCH`] per call)
    /// instead of one `recv_msg` per message.
    Mux(connmux::Driver, bool),
}

/// Messages per `recv_batch` call.
const BATCH: usize = 64;

impl Reader {
    fn name(self) -> &'static str {
        match self {
            Reader::Plain => "plain",
            Reader::Mux(connmux::Driver::Uring, false) => "connmux-uring",
            Reader::Mux(connmux::Driver::Uring, true) => "uring-batch",
            Reader::Mux(_, false) => "connmux-epoll",
            Reader::Mux(_, true) => "epoll-batch",
        }
    }
}

/// Nanoseconds since the first call (one clock for sender and reader).
fn now_ns() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// One message: length, then the payload; payload byte 0 is 1 on the last
/// message of a stream, bytes 1..9 carry the send time in latency runs.
fn message(payload: usize, last: bool, stamp: u64) -> Vec<u8> {
    let mut m = vec![0u8; 4 + payload.max(9)];
    let body = (m.len() - 4) as u32;
    m[..4].copy_from_slice(&body.to_be_bytes());
    m[4] = u8::from(last);
    m[5..13].copy_from_slice(&stamp.to_be_bytes());
    m
}

const ACK: [u8; 8] = [0, 0, 0, 4, b'a', b'c', b'k', b'!'];

/// The receiving side of one measurement: plain reads or a mux.
enum Rx<'a> {
    Plain {
        r: BufReader<&'a TcpStream>,
        w: &'a TcpStream,
        buf: Vec<u8>,
    },
    Mux {
        _mux: connmux::Mux,
        sock: connmux::KcmSocket,
        conn: &'a TcpStream,
        /// With `recv_batch`: messages taken but not yet handed out (reversed).
        batch: Option<Vec<connmux::Message>>,
    },
}

impl<'a> Rx<'a> {
    fn open(reader: Reader, conn: &'a TcpStream) -> anyhow::Result<Rx<'a>> {
        match reader {
            Reader::Plain => {
                // A mux left the descriptor non-blocking (the flag is shared by dups).
                conn.set_nonblocking(false)?;
                conn.set_read_timeout(Some(Duration::from_secs(10)))?;
                Ok(Rx::Plain { r: BufReader::with_capacity(64 << 10, conn), w: conn, buf: Vec::new() })
            }
            Reader::Mux(driver, batched) => {
                let mut c = connmux::Config::default();
                c.workers = 1;
                c.placement = connmux::Placement::Unpinned;
                c.driver = driver;
                c.core.max_msg_size = 2 << 20;
                let mux = connmux::Mux::new(c).with_context(|| format!("a mux on {driver:?}"))?;
                let sock = mux.socket(connmux::SockType::Dgram)?;
                sock.set_read_timeout(Some(Duration::from_secs(10)))?;
                sock.set_write_timeout(Some(Duration::from_secs(10)))?;
                let parser = connmux::parsers::from_spec("l4").context("l4 parser")?;
                mux.attach(conn, parser)?;
                Ok(Rx::Mux { _mux: mux, sock, conn, batch: batched.then(Vec::new) })
            }
        }
    }

    /// The next whole message: (payload byte 0, send stamp), and the
    /// connection to answer on (mux only).
    #[inline]
    fn next(&mut self) -> anyhow::Result<(u8, u64, Option<connmux::PsockId>)> {
        match self {
            Rx::Plain { r, buf, .. } => {
                let mut hdr = [0u8; 4];
                r.read_exact(&mut hdr)?;
                let n = u32::from_be_bytes(hdr) as usize;
                buf.resize(n, 0);
                r.read_exact(buf)?;
                Ok((buf[0], u64::from_be_bytes(buf[1..9].try_into()?), None))
            }
            Rx::Mux { sock, batch, .. } => {
                let m = match batch {
                    None => sock.recv_msg()?,
                    Some(q) => {
                        if q.is_empty() {
                            sock.recv_batch(q, BATCH)?;
                            q.reverse();
                        }
                        q.pop().context("recv_batch returned nothing")?
                    }
                };
                Ok((m.data[4], u64::from_be_bytes(m.data[5..13].try_into()?), Some(m.psock)))
            }
        }
    }

    fn ack(&mut self, psock: Option<connmux::PsockId>) -> anyhow::Result<()> {
        match (self, psock) {
            (Rx::Plain { w, .. }, _) => w.write_all(&ACK)?,
            (Rx::Mux { sock, .. }, Some(p)) => {
                sock.send_to(&ACK, p)?;
            }
            (Rx::Mux { .. }, None) => bail!("no connection to answer on"),
        }
        Ok(())
    }

    /// Give the connection back (unattach; the mux and its workers go).
    fn close(self) -> anyhow::Result<()> {
        if let Rx::Mux { _mux: mux, sock, conn, .. } = self {
            // The last acks may still be queued: unattaching drops them.
            sock.flush(Duration::from_secs(5)).context("acks still unsent after 5 s")?;
            mux.unattach(conn)?;
            drop(sock);
            drop(mux); // joins the workers: nothing of theirs reads the socket after this
        }
        Ok(())
    }
}

/// Messages per second the reader takes from a stream of `payload`-byte messages.
fn throughput(reader: Reader, ours: &TcpStream, peer: &TcpStream, payload: usize, secs: f64) -> anyhow::Result<f64> {
    let mut rx = Rx::open(reader, ours)?;
    let one = message(payload, false, 0);
    let per_write = ((64 << 10) / one.len()).max(1);
    let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * per_write).collect();
    let start = Instant::now();
    let (got, sent) = std::thread::scope(|s| -> anyhow::Result<(u64, u64)> {
        let sender = s.spawn(move || -> std::io::Result<u64> {
            let mut w = peer;
            let mut sent = 0u64;
            let end = start + Duration::from_secs_f64(secs);
            while Instant::now() < end {
                w.write_all(&batch)?;
                sent += per_write as u64;
            }
            w.write_all(&message(payload, true, 0))?;
            Ok(sent + 1)
        });
        let mut got = 0u64;
        loop {
            let (flag, _, _) = rx.next()?;
            got += 1;
            if flag == 1 {
                break;
            }
        }
        let sent = sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
        Ok((got, sent))
    })?;
    let took = start.elapsed().as_secs_f64();
    rx.close()?;
    if got != sent {
        bail!("{}: {got} messages taken of {sent} sent", reader.name());
    }
    Ok(got as f64 / took)
}

/// Median one-way delay (µs) of a message sent while nothing else is in flight.
fn latency(
    reader: Reader,
    ours: &TcpStream,
    peer: &TcpStream,
    payload: usize,
    pings: usize,
    secs: f64,
) -> anyhow::Result<f64> {
    let mut rx = Rx::open(reader, ours)?;
    let end = Instant::now() + Duration::from_secs_f64(secs.max(0.1));
    let samples = std::thread::scope(|s| -> anyhow::Result<Vec<f64>> {
        let sender = s.spawn(move || -> std::io::Result<()> {
            let mut w = peer;
            let mut ack = [0u8; 8];
            let mut i = 0;
            loop {
                let last = i + 1 >= pings || Instant::now() >= end;
                w.write_all(&message(payload, last, now_ns()))?;
                w.read_exact(&mut ack)?;
                i += 1;
                if last {
                    return Ok(());
                }
            }
        });
        let mut delays = Vec::with_capacity(pings);
        loop {
            let (flag, stamp, psock) = rx.next()?;
            delays.push(now_ns().saturating_sub(stamp) as f64 / 1e3);
            rx.ack(psock)?;
            if flag == 1 {
                break;
            }
        }
        sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
        Ok(delays)
    })?;
    rx.close()?;
    Ok(median(samples))
}

pub fn run(mut a: Args) -> anyhow::Result<i32> {
    if a.quick {
        a.rounds = 1;
        a.seconds = 0.2;
        a.pings = 200;
    }
    let mut readers = vec![Reader::Plain, Reader::Mux(connmux::Driver::Epoll, false)];
    if connmux_sys::uring::supported() {
        readers.push(Reader::Mux(connmux::Driver::Uring, false));
    }
    readers.push(Reader::Mux(connmux::Driver::Epoll, true));
    if connmux_sys::uring::supported() {
        readers.push(Reader::Mux(connmux::Driver::Uring, true));
    } else {
        eprintln!("bench recv: io_uring is not available here; connmux-uring skipped");
    }
    let l = TcpListener::bind("127.0.0.1:0")?;
    let peer = TcpStream::connect(l.local_addr()?)?;
    let (ours, _) = l.accept()?;
    peer.set_nodelay(true)?;
    ours.set_nodelay(true)?; // as attach sets it: the plain reader's acks go out the same way
    peer.set_read_timeout(Some(Duration::from_secs(10)))?;
    let _ = now_ns();
    println!(
        "connmux bench recv: whole messages off one loopback TCP connection, connmux (one worker, each driver) \
         vs a plain blocking read loop on the same socket; {} round(s), readers interleaved; {} s of streaming \
         and up to {} round trips per measurement; threads unpinned; {} CPUs; load avg {}",
        a.rounds,
        a.seconds,
        a.pings,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    // [size][reader] -> per-round (msgs/s, p50 µs)
    let mut res = vec![vec![(Vec::new(), Vec::new()); readers.len()]; a.sizes.len()];
    for round in 0..a.rounds {
        for (zi, &size) in a.sizes.iter().enumerate() {
            for k in 0..readers.len() {
                let ri = (k + round + zi) % readers.len();
                let r = readers[ri];
                let rate =
                    throughput(r, &ours, &peer, size, a.seconds).with_context(|| format!("{size} B, {}", r.name()))?;
                let p50 = latency(r, &ours, &peer, size, a.pings, a.seconds)
                    .with_context(|| format!("{size} B, {}", r.name()))?;
                res[zi][ri].0.push(rate);
                res[zi][ri].1.push(p50);
            }
        }
        eprintln!("bench recv: round {}/{} done", round + 1, a.rounds);
    }
    println!();
    println!(
        "{:>8} {:<14} {:>12} {:>10} {:>10} {:>11} {:>11}",
        "payload", "reader", "msgs/s", "MB/s", "p50_us", "msgs/s vs", "p50 vs"
    );
    for (zi, &size) in a.sizes.iter().enumerate() {
        let base_rate = median(res[zi][0].0.clone());
        let base_p50 = median(res[zi][0].1.clone());
        for (ri, r) in readers.iter().enumerate() {
            let rate = median(res[zi][ri].0.clone());
            let p50 = median(res[zi][ri].1.clone());
            println!(
                "{:>8} {:<14} {:>12.0} {:>10.1} {:>10.1} {:>11} {:>11}",
                size,
                r.name(),
                rate,
                rate * (size + 4) as f64 / 1e6,
                p50,
                ratio(rate, base_rate),
                ratio(p50, base_p50)
            );
        }
    }
    println!();
    println!("msgs/s: median over rounds of messages taken per second while the sender streams;");
    println!("p50_us: median over rounds of each round's median one-way delay, one message in flight;");
    println!("ratios are against `plain` (the same socket read directly) measured in the same rounds.");
    Ok(0)
}
