//! `connmux bench raw-server`: the ONC RPC NULL server with no framework, the
//! floor under the rpc-server in `connmux bench rpc`.
//!
//! Each of `--threads` threads has its own `SO_REUSEPORT` listener and its own
//! epoll (level-triggered), and owns the connections it accepts. A readable
//! connection gets one `read` of up to 256 KiB; every whole record in it is
//! answered by the same NULL service the rpc-server uses
//! (`connmux_oncrpc::Registry::handle_marked`), and all replies of that read
//! go out in one `write`. A partial record is kept for the next read (at most
//! `MAX_RECORD` bytes, else the connection is closed). A short write parks the
//! rest and switches the connection to writable-only interest, so a client
//! that does not read stops being read (back-pressure). A record that is not
//! a well-formed call closes the connection after the replies before it.
//!
//! What it leaves out, against the rpc-server: the message queue between
//! receive and handler, steering, the KCM socket API, statistics. What it
//! keeps: the parsing and the reply encoding, so
//! rpc-server / raw-server is the cost of the framework alone.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use connmux_oncrpc::record::{RecordMark, MARK_LEN};
use connmux_oncrpc::{Outcome, Registry};
use connmux_sys::epoll::{Epoll, Events, Interest};

/// Bytes taken per `read`.
const READ_BUF: usize = 256 << 10;
/// Largest record (all fragments and marks) accepted.
const MAX_RECORD: usize = 64 << 10;
/// Token of the listener in each thread's epoll.
const LISTENER: u64 = u64::MAX;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on.
    #[arg(short, long, default_value = "127.0.0.1:62049")]
    pub listen: SocketAddr,
    /// Threads, each with its own listener (SO_REUSEPORT) and epoll.
    #[arg(short = 't', long, default_value_t = 1)]
    pub threads: usize,
    /// Pin thread i to CPU cpus[i % len] (default: no pinning).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    pub duration: Option<f64>,
}

/// One connection's state.
struct Conn {
    stream: TcpStream,
    /// The start of a record whose end has not arrived.
    carry: Vec<u8>,
    /// Replies not yet written (only after a short write).
    pending: Vec<u8>,
    pending_at: usize,
    /// Close once `pending` is written.
    close_after: bool,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    calls: AtomicU64,
    closed_bad: AtomicU64,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let mut listeners = Vec::new();
    for _ in 0..a.threads.max(1) {
        listeners.push(reuseport_listener(a.listen)?);
    }
    let local = listeners[0].local_addr()?;
    let mut threads = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let cpu = (!a.cpus.is_empty()).then(|| a.cpus[i % a.cpus.len()]);
        let (stop, counters) = (stop.clone(), counters.clone());
        threads.push(std::thread::Builder::new().name(format!("raw-{i}")).spawn(move || {
            if let Some(c) = cpu {
                let _ = connmux_sys::affinity::pin_current_thread(c);
            }
            if let Err(e) = serve(l, &stop, &counters) {
                eprintln!("raw-server thread {i}: {e}");
            }
        })?);
    }
    println!("raw-server listening on {local} ({} threads)", a.threads.max(1));
    let start = Instant::now();
    loop {
        if a.duration.is_some_and(|d| start.elapsed().as_secs_f64() >= d) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Relaxed);
    for t in threads {
        let _ = t.join();
    }
    println!(
        "raw-server: accepted={} calls={} closed_bad={}",
        counters.accepted.load(Relaxed),
        counters.calls.load(Relaxed),
        counters.closed_bad.load(Relaxed)
    );
    Ok(0)
}

fn reuseport_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

fn serve(listener: TcpListener, stop: &AtomicBool, counters: &Counters) -> std::io::Result<()> {
    let ep = Epoll::new()?;
    ep.add(listener.as_raw_fd(), LISTENER, Interest::READ)?;
    let reg = Registry::default();
    let mut events = Events::with_capacity(256);
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut buf = vec![0u8; READ_BUF];
    let mut out: Vec<u8> = Vec::with_capacity(READ_BUF);
    while !stop.load(Relaxed) {
        ep.wait(&mut events, Some(Duration::from_millis(100)))?;
        for ev in events.iter() {
            if ev.token == LISTENER {
                // Bounded: at most one batch of 64 accepts per wake-up.
                for _ in 0..64 {
                    let Ok((s, _)) = listener.accept() else { break };
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    let slot = free.pop().unwrap_or_else(|| {
                        conns.push(None);
                        conns.len() - 1
                    });
                    if ep.add(s.as_raw_fd(), slot as u64, Interest::READ).is_err() {
                        free.push(slot);
                        continue;
                    }
                    counters.accepted.fetch_add(1, Relaxed);
                    conns[slot] = Some(Conn {
                        stream: s,
                        carry: Vec::new(),
                        pending: Vec::new(),
                        pending_at: 0,
                        close_after: false,
                    });
                }
                continue;
            }
            let slot = ev.token as usize;
            let Some(c) = conns.get_mut(slot).and_then(|c| c.as_mut()) else {
                continue;
            };
            let keep = if !c.pending.is_empty() {
                flush(c, &ep, slot)
            } else {
                on_readable(c, &ep, slot, &reg, &mut buf, &mut out, counters)
            };
            if !keep {
                let _ = ep.delete(c.stream.as_raw_fd());
                conns[slot] = None;
                free.push(slot);
            }
        }
    }
    Ok(())
}

/// Read once, answer every whole record, write the replies in one `write`.
/// False when the connection is to be closed.
fn on_readable(
    c: &mut Conn,
    ep: &Epoll,
    slot: usize,
    reg: &Registry,
    buf: &mut [u8],
    out: &mut Vec<u8>,
    counters: &Counters,
) -> bool {
    let n = match c.stream.read(buf) {
        Ok(0) => return false,
        Ok(n) => n,
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => return true,
        Err(_) => return false,
    };
    out.clear();
    let mut bad = false;
    let mut calls = 0u64;
    if c.carry.is_empty() {
        let used = answer(&buf[..n], reg, out, &mut bad, &mut calls);
        c.carry.extend_from_slice(&buf[used..n]);
    } else {
        c.carry.extend_from_slice(&buf[..n]);
        let used = answer(&c.carry, reg, out, &mut bad, &mut calls);
        c.carry.drain(..used);
    }
    counters.calls.fetch_add(calls, Relaxed);
    if c.carry.len() > MAX_RECORD {
        bad = true;
    }
    if bad {
        counters.closed_bad.fetch_add(1, Relaxed);
        c.close_after = true;
    }
    if out.is_empty() {
        return !bad;
    }
    match c.stream.write(out) {
        Ok(w) if w == out.len() => !bad,
        Ok(w) => park(c, ep, slot, &out[w..]),
        Err(e) if e.kind() == ErrorKind::WouldBlock => park(c, ep, slot, out),
        Err(_) => false,
    }
}

/// Answers the whole records at the start of `input`; returns the bytes used.
fn answer(input: &[u8], reg: &Registry, out: &mut Vec<u8>, bad: &mut bool, calls: &mut u64) -> usize {
    let mut at = 0;
    'records: while at < input.len() {
        // Find the end of the record starting at `at` (its last fragment).
        let mut end = at;
        loop {
            let Some(m) = RecordMark::parse(&input[end..]) else {
                break 'records;
            };
            let next = end + MARK_LEN + m.len as usize;
            if next - at > MAX_RECORD {
                *bad = true;
                break 'records;
            }
            if next > input.len() {
                break 'records;
            }
            end = next;
            if m.last {
                break;
            }
        }
        match reg.handle_marked(&input[at..end], out) {
            Outcome::Replied { .. } => *calls += 1,
            Outcome::CloseConnection(_) => {
                *bad = true;
                break;
            }
        }
        at = end;
    }
    at
}

/// Keep `rest` for later and wait for writability only (back-pressure).
fn park(c: &mut Conn, ep: &Epoll, slot: usize, rest: &[u8]) -> bool {
    c.pending.clear();
    c.pending.extend_from_slice(rest);
    c.pending_at = 0;
    ep.modify(c.stream.as_raw_fd(), slot as u64, Interest::WRITE).is_ok()
}

/// Write parked replies; back to readable interest once they are out.
fn flush(c: &mut Conn, ep: &Epoll, slot: usize) -> bool {
    match c.stream.write(&c.pending[c.pending_at..]) {
        Ok(w) => c.pending_at += w,
        Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
        Err(_) => return false,
    }
    if c.pending_at < c.pending.len() {
        return true;
    }
    c.pending.clear();
    c.pending_at = 0;
    !c.close_after && ep.modify(c.stream.as_raw_fd(), slot as u64, Interest::READ).is_ok()
}
