//! One round of load over UDP (`-u`): `-j` threads, each with its own UDP
//! socket connected to the server, each keeping up to `-a` requests in
//! flight, one request per datagram, and timing every one of them.
//!
//! The loop of a thread:
//! 1. fill every free slot: one request datagram per slot, all sent with
//!    one `sendmmsg` (what the kernel does not take is sent by the next);
//! 2. take the replies that came with one `recvmmsg` (blocking for the
//!    first up to a tick, a quarter of `--udp-retry`), check each one and
//!    match it to its slot by tag;
//! 3. a request unanswered for `--udp-retry` is given up: counted in `lost`
//!    and its slot sends a new request (with a new tag: a late reply to the
//!    old one is told apart, counted in neither `calls` nor `lost`, and
//!    dropped).
//!
//! A bad reply fails the round as over TCP; so does a round in which no
//! reply came for `--io-timeout` while requests were in flight (the server
//! is gone), and an ICMP "port unreachable" (nothing listens on UDP there).
//! A round ends as over TCP, once the requests in flight are answered or
//! given up.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use connmux_sys::udp::{recv_batch, send_batch, RecvBatch, SendBatch};

use super::engine::{run_load_threads, ConnStats, Progress, RoundOutcome, RoundPlan, Shared, Stop, MAX_INFLIGHT};

/// Largest reply datagram taken whole; a longer one is a bad reply.
pub const MAX_REPLY: usize = 65_536;

/// One socket's protocol over UDP: one request per datagram, one reply per
/// request.
pub trait Dgram: Send {
    /// Appends the request datagram for `tag` to `out`.
    fn encode(&mut self, tag: u32, out: &mut Vec<u8>);
    /// Checks one reply datagram and returns the tag it answers; anything
    /// that is not a right reply is an error, in words.
    fn decode(&mut self, dgram: &[u8]) -> Result<u32, String>;
}

/// Makes one [`Dgram`] per socket.
pub trait DgramWorkload: Sync {
    type Client: Dgram;
    fn client(&self, conn: usize) -> Self::Client;
}

/// UDP's [`Stop`]: the abort flag alone, which every thread looks at
/// within a tick.
struct Abort;

impl Stop for Abort {
    fn stop(&self) {}

    /// Never less than 10 ms, so that past the limit the watcher does not spin.
    fn wait(&self, left: Duration, _stopped: bool) -> Duration {
        left.max(Duration::from_millis(10))
    }
}

/// Runs one round over UDP; `retry` is `--udp-retry`. Never blocks longer
/// than `plan.limit` + `retry` + one tick after the start.
pub fn run_round<W: DgramWorkload>(
    w: &W,
    addrs: &[SocketAddr],
    plan: &RoundPlan,
    retry: Duration,
    progress: &mut dyn Progress,
) -> RoundOutcome {
    assert!(plan.threads >= 1 && (1..=MAX_INFLIGHT).contains(&plan.inflight));
    let sh = &Shared::new(plan.threads);
    run_load_threads(sh, plan, progress, &Abort, |i| {
        let client = w.client(i);
        move || thread(i, client, addrs, plan, retry, sh)
    })
}

/// A UDP socket connected to the first address that takes a connect.
fn open(addrs: &[SocketAddr], tick: Duration) -> Result<UdpSocket, String> {
    let mut last = String::from("no address");
    for a in addrs {
        let local: SocketAddr = if a.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
        let s = match UdpSocket::bind(local) {
            Ok(s) => s,
            Err(e) => {
                last = format!("bind: {e}");
                continue;
            }
        };
        if let Err(e) = s.connect(a) {
            last = format!("connect to {a}: {e}");
            continue;
        }
        s.set_read_timeout(Some(tick)).map_err(|e| format!("socket options: {e}"))?;
        // Room for a window of replies: the kernel caps it at rmem_max.
        let _ = socket2::SockRef::from(&s).set_recv_buffer_size(4 << 20);
        return Ok(s);
    }
    Err(last)
}

#[derive(Clone, Copy)]
struct Slot {
    t_sent: u64,
    tag: u32,
    busy: bool,
}

fn thread<C: Dgram>(
    i: usize,
    mut client: C,
    addrs: &[SocketAddr],
    plan: &RoundPlan,
    retry: Duration,
    sh: &Shared,
) -> ConnStats {
    let mut st = ConnStats::new();
    st.lost = Some(0);
    let tick = (retry / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
    if let Some(cpus) = &plan.cpus {
        let cpu = cpus[i % cpus.len()];
        if let Err(e) = connmux_sys::affinity::pin_current_thread(cpu) {
            st.error = Some(format!("cannot pin to CPU {cpu}: {e}"));
        }
    }
    let sock = match st.error {
        None => open(addrs, tick).map_err(|e| st.error = Some(e)).ok(),
        Some(_) => None,
    };
    let t0 = sh.start();
    if let Some(s) = sock {
        if let Err(e) = drive(i, &mut client, &s, plan, retry, tick, sh, t0, &mut st) {
            if !sh.aborted() {
                st.error = Some(e);
            }
        }
    }
    st
}

#[allow(clippy::too_many_arguments)]
fn drive<C: Dgram>(
    i: usize,
    client: &mut C,
    s: &UdpSocket,
    plan: &RoundPlan,
    retry: Duration,
    tick: Duration,
    sh: &Shared,
    t0: u64,
    st: &mut ConnStats,
) -> Result<(), String> {
    let fd = s.as_raw_fd();
    let a = plan.inflight;
    let slot_bits = usize::BITS - (a - 1).leading_zeros();
    let slot_mask: u32 = ((1u64 << slot_bits) - 1) as u32;
    let gen_mask: u64 = (1u64 << (32 - slot_bits)) - 1;
    let mut gen: u64 = 0;
    let mut slots = vec![Slot { t_sent: 0, tag: 0, busy: false }; a];
    let mut free: Vec<u32> = (0..a as u32).rev().collect();
    let mut buf: Vec<u8> = Vec::with_capacity(a * 64);
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(a);
    let mut rb = RecvBatch::new(a.min(64), MAX_REPLY);
    let mut sb = SendBatch::new();
    let (mut issued, mut inflight, mut lost) = (0u64, 0usize, 0u64);
    let mut stopping = false;
    let (mut last_reply, mut last_scan) = (t0, t0);
    let deadline = plan.duration.map(|d| t0 + d.as_nanos() as u64);
    let (retry_ns, tick_ns, io_ns) =
        (retry.as_nanos() as u64, tick.as_nanos() as u64, plan.io_timeout.as_nanos() as u64);
    let result = loop {
        if sh.aborted() {
            break Err("stopped".into());
        }
        let now = sh.now_ns();
        if !stopping && (deadline.is_some_and(|d| now >= d) || plan.count.is_some_and(|c| issued >= c)) {
            stopping = true;
        }
        if !stopping && !free.is_empty() {
            let mut n = free.len() as u64;
            if let Some(c) = plan.count {
                n = n.min(c - issued);
            }
            buf.clear();
            spans.clear();
            for _ in 0..n {
                let slot = free.pop().expect("free slot");
                let tag = ((gen << slot_bits) as u32) | slot;
                gen = (gen + 1) & gen_mask;
                slots[slot as usize] = Slot { t_sent: now, tag, busy: true };
                let at = buf.len();
                client.encode(tag, &mut buf);
                spans.push((at, buf.len()));
            }
            issued += n;
            inflight += n as usize;
            let mut k = 0;
            // Bounded: each call sends at least one datagram or fails.
            while k < spans.len() {
                let items = spans[k..].iter().map(|&(a, b)| (&buf[a..b], None));
                match send_batch(fd, &mut sb, items, libc::MSG_NOSIGNAL) {
                    Ok(sent) => {
                        st.writes += 1;
                        st.tx_bytes += spans[k..k + sent].iter().map(|(a, b)| (b - a) as u64).sum::<u64>();
                        k += sent.max(1);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                        // An earlier datagram met a closed port; this one
                        // was not sent: look again (the next fails for good).
                        return Err(format!("nothing listens on UDP there (port unreachable): {e}"));
                    }
                    Err(e) => return Err(format!("send: {e}")),
                }
            }
        }
        if inflight == 0 && stopping {
            break Ok(());
        }
        match recv_batch(fd, &mut rb, libc::MSG_WAITFORONE) {
            Ok(n) => {
                let now = sh.now_ns();
                st.reads += 1;
                for k in 0..n {
                    let d = rb.datagram(k);
                    st.rx_bytes += d.len() as u64;
                    if rb.truncated(k) {
                        return Err(format!("a reply longer than {MAX_REPLY} bytes"));
                    }
                    let tag = client.decode(d)?;
                    let idx = (tag & slot_mask) as usize;
                    match slots.get_mut(idx) {
                        Some(slot) if slot.busy && slot.tag == tag => {
                            slot.busy = false;
                            free.push(idx as u32);
                            st.hist.saturating_record(now.saturating_sub(slot.t_sent).max(1));
                            st.calls += 1;
                            inflight -= 1;
                            last_reply = now;
                        }
                        // A late reply to a request given up: dropped.
                        _ if idx < a => {}
                        _ => return Err(format!("reply with tag {tag:#010x} matches no request sent")),
                    }
                }
                sh.set_calls(i, st.calls);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                return Err(format!("nothing listens on UDP there (port unreachable): {e}"));
            }
            Err(e) => return Err(format!("receive: {e}")),
        }
        let now = sh.now_ns();
        if now.saturating_sub(last_scan) >= tick_ns {
            last_scan = now;
            for (idx, slot) in slots.iter_mut().enumerate() {
                if slot.busy && now.saturating_sub(slot.t_sent) >= retry_ns {
                    slot.busy = false;
                    free.push(idx as u32);
                    inflight -= 1;
                    lost += 1;
                }
            }
            // Requests keep going unanswered (or none ever was): the server is gone.
            if inflight > 0 && now.saturating_sub(last_reply) >= io_ns {
                return Err(format!("no reply within {} s", plan.io_timeout.as_secs_f64()));
            }
        }
    };
    st.lost = Some(lost);
    st.elapsed_ns = last_reply.saturating_sub(t0);
    result
}
