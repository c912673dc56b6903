//! Side by side: three workloads through the userspace engine and through
//! the kernel's KCM, alternated in one run, medians and ratios.
//!
//! - receive: a peer thread writes N messages of 64 bytes (4-byte length +
//!   a 60-byte body carrying a sequence number), 64 messages per write; the
//!   endpoint receives them one `recv` at a time and checks the sequence.
//! - echo (the KCM model, `connmux bench kcm`'s program on one connection):
//!   a client keeps [`INFLIGHT`] messages of 28 bytes in flight; an
//!   application thread answers each with `recv` then `send` (a plain send:
//!   one connection, so the reply lands where the request came from on
//!   both backends); the client checks every echo (each once; with one
//!   thread, in sequence).
//! - echo-2: the same with two application threads, each on its own
//!   socket (the first and a clone), as `bench kcm`'s kcm-2.
//!
//! Figures are messages per second; under an emulated VM only the ratio
//! means anything.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use connmux::{SendFlags, SockType};

use crate::backend::{new_mux, tcp_pair, Kind, Opts};

const MSG: usize = 64;
const PER_WRITE: usize = 64;
/// The echo workload's message size and messages in flight.
const ECHO_MSG: usize = 28;
const INFLIGHT: usize = 16;

fn one(kind: Kind, n: usize) -> Result<f64, String> {
    let m = new_mux(kind, Opts::default()).map_err(|e| e.to_string())?;
    let s = m.socket(SockType::Dgram).map_err(|e| e.to_string())?;
    s.set_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    if let Some(fd) = s.raw() {
        // A KCM message is charged a whole skb (docs/kcmvm.md, "Receive buffers"): a big buffer.
        let _ = connmux_sys::socket::setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 64 << 20);
    }
    let (mut peer, low) = tcp_pair().map_err(|e| e.to_string())?;
    m.attach(low.as_fd(), "l4").map_err(|e| e.to_string())?;
    let writer = std::thread::spawn(move || {
        let mut buf = vec![0u8; MSG * PER_WRITE];
        let mut seq = 0u64;
        while (seq as usize) < n {
            let k = PER_WRITE.min(n - seq as usize);
            for i in 0..k {
                let at = i * MSG;
                buf[at..at + 4].copy_from_slice(&((MSG - 4) as u32).to_be_bytes());
                buf[at + 4..at + 12].copy_from_slice(&(seq + i as u64).to_le_bytes());
            }
            if peer.write_all(&buf[..k * MSG]).is_err() {
                break;
            }
            seq += k as u64;
        }
        peer
    });
    let t = Instant::now();
    let mut buf = [0u8; 256];
    let mut bad = 0;
    for i in 0..n {
        let g = s.recv(&mut buf, false).map_err(|e| format!("recv {i}: {e}"))?;
        if g.len != MSG || buf[4..12] != (i as u64).to_le_bytes() {
            bad += 1;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let _peer = writer.join().map_err(|_| "writer panicked")?;
    if bad > 0 {
        return Err(format!("{bad} messages out of sequence"));
    }
    Ok(n as f64 / secs)
}

/// The echo workload: `n` messages through one application thread.
fn echo(kind: Kind, n: usize) -> Result<f64, String> {
    echo_threads(kind, n, 1)
}

/// The echo workload through two application threads on two sockets.
fn echo2(kind: Kind, n: usize) -> Result<f64, String> {
    echo_threads(kind, n, 2)
}

/// `n` messages echoed by `threads` application threads, each receiving
/// and sending on its own socket (the first and clones of it): the
/// client's rate, from its first send to its last echo.
fn echo_threads(kind: Kind, n: usize, threads: usize) -> Result<f64, String> {
    let m = new_mux(kind, Opts::default()).map_err(|e| e.to_string())?;
    let first = m.socket(SockType::Dgram).map_err(|e| e.to_string())?;
    let mut socks = Vec::with_capacity(threads);
    for _ in 1..threads {
        socks.push(first.try_clone().map_err(|e| e.to_string())?);
    }
    socks.push(first);
    // Bounded waits: a thread looks whether the client is done between them.
    for s in &socks {
        s.set_timeout(Some(Duration::from_millis(50))).map_err(|e| e.to_string())?;
    }
    let (mut peer, low) = tcp_pair().map_err(|e| e.to_string())?;
    m.attach(low.as_fd(), "l4").map_err(|e| e.to_string())?;
    peer.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    let done = Arc::new(AtomicBool::new(false));
    let client = {
        let done = done.clone();
        std::thread::spawn(move || -> Result<f64, String> {
            let r = client(&mut peer, n, threads == 1);
            done.store(true, Ordering::Release);
            r
        })
    };
    let servers: Vec<_> = socks
        .into_iter()
        .map(|s| {
            let done = done.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let mut buf = [0u8; 256];
                // Bounded: every turn waits at most the socket's timeout,
                // and the client ends within its read timeout.
                while !done.load(Ordering::Acquire) {
                    match s.recv(&mut buf, false) {
                        Ok(g) => {
                            s.send(&buf[..g.len], SendFlags { eor: true, ..Default::default() })
                                .map_err(|e| format!("send: {e}"))?;
                        }
                        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                            // (Timed out: look whether the client is done.)
                        }
                        Err(e) => return Err(format!("recv: {e}")),
                    }
                }
                Ok(())
            })
        })
        .collect();
    let rate = client.join().map_err(|_| "client panicked")?;
    for s in servers {
        s.join().map_err(|_| "an application thread panicked")??;
    }
    rate
}

/// The echo client: [`INFLIGHT`] messages in flight until `n` came back,
/// each once (`in_order`: in sequence).
fn client(peer: &mut std::net::TcpStream, n: usize, in_order: bool) -> Result<f64, String> {
    let t = Instant::now();
    let (mut sent, mut got) = (0usize, 0usize);
    let mut seen = vec![false; n];
    let mut out = Vec::with_capacity(ECHO_MSG * INFLIGHT);
    let mut inb = vec![0u8; 64 << 10];
    let mut have = 0;
    // Bounded: each round reads at least one byte, or fails.
    while got < n {
        out.clear();
        while sent < n && sent - got < INFLIGHT {
            out.extend_from_slice(&((ECHO_MSG - 4) as u32).to_be_bytes());
            out.extend_from_slice(&(sent as u64).to_le_bytes());
            out.resize(out.len() + ECHO_MSG - 12, 0x5a);
            sent += 1;
        }
        peer.write_all(&out).map_err(|e| format!("client write: {e}"))?;
        let r = std::io::Read::read(peer, &mut inb[have..]).map_err(|e| format!("client read: {e}"))?;
        if r == 0 {
            return Err(format!("closed after {got} echoes"));
        }
        have += r;
        let whole = have / ECHO_MSG;
        for i in 0..whole {
            let at = i * ECHO_MSG;
            let seq = u64::from_le_bytes(inb[at + 4..at + 12].try_into().expect("8 bytes")) as usize;
            if (in_order && seq != got) || seq >= n || std::mem::replace(&mut seen[seq], true) {
                return Err(format!("echo {seq} out of sequence or twice (after {got})"));
            }
            got += 1;
        }
        inb.copy_within(whole * ECHO_MSG..have, 0);
        have -= whole * ECHO_MSG;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// One workload: messages per second through a backend, or what failed.
type Workload = fn(Kind, usize) -> Result<f64, String>;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Returns the exit status.
pub fn run(n: usize, reps: usize) -> i32 {
    let kernel = connmux_kernel::KernelMux::supported();
    println!("BENCH n={n} msg={MSG}B per_write={PER_WRITE} reps={reps} kernel_kcm={kernel}");
    let kinds: Vec<Kind> = if kernel { vec![Kind::User, Kind::Kernel] } else { vec![Kind::User] };
    // The echo crosses threads twice per message: a quarter as many.
    let workloads: [(&str, usize, Workload); 3] =
        [("receive", n, one), ("echo", (n / 4).max(1), echo), ("echo-2", (n / 4).max(1), echo2)];
    for (name, n, f) in workloads {
        let mut res: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
        for r in 0..reps.max(1) {
            for (i, k) in kinds.iter().enumerate() {
                match f(*k, n) {
                    Ok(rate) => {
                        println!("BENCH {name} n={n} rep={} backend={:<9} rate={:.0} msg/s", r + 1, k.name(), rate);
                        res[i].push(rate);
                    }
                    Err(e) => {
                        println!("BENCH {name} rep={} backend={} FAILED: {e}", r + 1, k.name());
                        return 1;
                    }
                }
            }
        }
        let meds: Vec<f64> = res.iter_mut().map(|v| median(v)).collect();
        for (k, m) in kinds.iter().zip(&meds) {
            println!("BENCH {name} median backend={:<9} {:.0} msg/s", k.name(), m);
        }
        if meds.len() == 2 {
            println!("BENCH {name} ratio userspace/kernel = {:.2}", meds[0] / meds[1]);
        }
    }
    0
}
