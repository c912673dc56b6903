//! Serving datagrams: a [`Handler`] answers UDP datagrams as it answers a
//! TCP service's messages, one datagram being one whole message.
//!
//! [`UdpService::start`] binds one UDP socket per worker to the service's
//! address (`SO_REUSEPORT`: the kernel spreads the peers over the sockets
//! by their addresses, and with [`Config::incoming_cpu`] prefers the socket
//! of the CPU that received the datagram, `SO_INCOMING_CPU`), and runs one
//! thread per socket, pinned as the mux's workers are ([`Config::workers`],
//! [`Config::placement`]). Each thread takes up to [`UdpConfig::batch`]
//! datagrams with one `recvmmsg`, runs the handler on each where it lies
//! ([`Handler::handle_in_place`]), and sends the replies with one
//! `sendmmsg`, each to the address its request came from. UDP has its own
//! loop, on either driver: no connection, nothing to parse or to assemble.
//!
//! What the handler's answers mean here:
//!
//! | verdict | over UDP |
//! |---|---|
//! | `Appended`, `Reply` | one datagram back to the sender; a reply longer than [`UdpConfig::max_datagram`] is not sent and counted in `refused_too_large` |
//! | `NoReply` | nothing sent |
//! | `Close` | the datagram is dropped and counted in `malformed` (there is no connection to close) |
//!
//! A datagram longer than [`UdpConfig::max_datagram`] is cut by the kernel:
//! it is dropped unanswered and counted in `truncated`.
//!
//! Roaming: a worker whose batches hold several datagrams (its peers send
//! faster than it answers) and whose CPU it shares with them gains from a
//! CPU of its own. With `SO_INCOMING_CPU` a lone busy peer's datagrams all
//! go to the worker on the peer's CPU, while a sibling's CPU may stand
//! idle. So every [`ROAM_EVERY`] a worker looks at its batches: at two
//! datagrams a batch or more, it moves its thread (pins it) onto the CPU of
//! a sibling whose CPU was idle at least half of the last look and that
//! hosts no other guest; it goes back to its own CPU once its batches fall
//! under 1.25 datagrams (each datagram waits on the answer to the last:
//! crossing CPUs would only add a wake-up to each), once the host serves
//! an eighth as many datagrams as it does, or once nothing came for
//! [`WAKE_EVERY`]. A guest looks at its socket again for up to
//! [`GUEST_SPIN`] before it sleeps: the CPU was idle, and a sleeping
//! thread costs its peer a wake-up per batch. The socket stays the
//! worker's, so the datagrams of a peer are still answered in the order
//! they came. `roams` counts the moves.
//!
//! One at a time: a peer with one request in flight sends the next only
//! once it has the answer to the last, so each batch holds one datagram,
//! and `recvmmsg` then looks for a second that is not there (and
//! `sendmmsg` reads a vector for one reply). After a receive that took one
//! datagram a worker at home takes the next with `recvfrom` (`MSG_TRUNC`:
//! its whole length, so a cut one is told) and answers with `sendto`; every fourth receive is still a
//! batch's (`LONE_PROBE`), and one that takes two datagrams or more goes
//! back to batches.
//!
//! `from`: every datagram is handed over with `from` =
//! [`udp_psock`]`(worker)`, a `PsockId` no connection has (index
//! [`UDP_PSOCK_INDEX`], generation the worker's index), so a handler can
//! tell a datagram from a connection's message; it names no peer, and
//! nothing may be sent to it (`KcmSocket::send_to` fails: no such psock).
//! A handler answers a datagram only through its verdict.
//!
//! Stop: [`UdpService::shutdown`] (or drop) sets a flag and shuts each
//! socket's receive side down, which wakes a thread blocked in `recvmmsg`
//! (a receive timeout of [`WAKE_EVERY`] bounds the wait where that does not
//! wake it); it returns once every thread has ended.
//!
//! Names `config` and `handler` only.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connmux_core::mux::PsockId;
use connmux_core::Bytes;
use connmux_sys::udp::{recv_batch, RecvBatch, SendBatch};

use crate::config::Config;
use crate::handler::{Handler, Verdict};

/// The largest UDP payload over IPv4 (65,535 less the IP and UDP headers).
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// The `PsockId` index that datagrams are handed to a handler with.
pub const UDP_PSOCK_INDEX: u32 = u32::MAX - 1;

/// The `from` of datagrams taken by worker `worker`.
pub const fn udp_psock(worker: u32) -> PsockId {
    PsockId { index: UDP_PSOCK_INDEX, generation: worker }
}

/// Whether `from` is a datagram's, not a connection's.
pub const fn is_udp(from: PsockId) -> bool {
    from.index == UDP_PSOCK_INDEX
}

/// The longest a thread waits in `recvmmsg` before it looks at its stop
/// flag again, where shutting the socket down did not wake it.
pub const WAKE_EVERY: Duration = Duration::from_millis(200);

/// How often a worker looks at its batches to decide where its thread
/// runs (see the module's "Roaming"): several `/proc/stat` steps (10 ms),
/// so that a CPU's idle time over it is measured, not guessed.
pub const ROAM_EVERY: Duration = Duration::from_millis(50);

/// How long a worker running on a sibling's (idle) CPU looks at its socket
/// again before it sleeps: a busy peer's next requests, sent as its
/// replies come, then find it awake (no wake-up for the peer to pay),
/// and an idle stretch costs the CPU little.
pub const GUEST_SPIN: Duration = Duration::from_micros(10);

/// A worker whose receives take one datagram each takes the next with
/// `recvfrom` and answers with `sendto` (see the module's "One at a
/// time"); every `LONE_PROBE`-th receive is still a batch's. Why 4: a queue
/// that forms waits at most three datagrams for its batch, and three
/// receives in four skip the batch's look for a datagram that is not there.
const LONE_PROBE: u32 = 4;

/// Configuration of a [`UdpService`].
#[derive(Clone, Debug)]
pub struct UdpConfig {
    /// The address to bind (port 0: one the kernel picks; every worker's
    /// socket then binds that port).
    pub listen: SocketAddr,
    /// Largest datagram taken and largest reply sent, bytes. Default
    /// [`MAX_UDP_PAYLOAD`]. Each worker holds `batch` buffers of this size.
    pub max_datagram: usize,
    /// Datagrams one `recvmmsg` takes at most (1 to 1024). Default 32.
    pub batch: usize,
    /// `SO_RCVBUF` asked for each socket (the kernel caps it at
    /// `net.core.rmem_max`, and doubles it): datagrams that arrive while the
    /// buffer is full are dropped by the kernel (`RcvbufErrors` in
    /// `/proc/net/snmp`). `None`: the system's default. Default 4 MiB.
    pub rcvbuf: Option<usize>,
    /// Send the replies of a batch that go to one peer, back to back and of
    /// one size, as one segmented buffer (UDP GSO, `UDP_SEGMENT`, Linux
    /// 4.18): the kernel's send path runs once for them (the peer still
    /// receives separate datagrams). Turned off by itself where the kernel
    /// refuses it. Default `true`.
    pub gso: bool,
}

impl UdpConfig {
    /// The defaults, on `listen`.
    pub fn new(listen: SocketAddr) -> UdpConfig {
        UdpConfig { listen, max_datagram: MAX_UDP_PAYLOAD, batch: 32, rcvbuf: Some(4 << 20), gso: true }
    }
}

/// What a [`UdpService`] counted, all workers together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams received.
    pub datagrams_in: u64,
    /// Replies sent.
    pub datagrams_out: u64,
    /// Datagrams the handler refused (`Verdict::Close`): dropped.
    pub malformed: u64,
    /// Datagrams longer than `max_datagram`: dropped.
    pub truncated: u64,
    /// Replies longer than `max_datagram`: not sent.
    pub refused_too_large: u64,
    /// Replies the kernel refused to send (`sendmmsg` errors).
    pub send_errors: u64,
    /// `recvmmsg` calls that returned a batch.
    pub batches: u64,
    /// Times a worker moved its thread onto a sibling's idle CPU.
    pub roams: u64,
}

/// One worker's counters, on a cache line of its own.
#[derive(Default)]
#[repr(align(64))]
struct Counters {
    datagrams_in: AtomicU64,
    datagrams_out: AtomicU64,
    malformed: AtomicU64,
    truncated: AtomicU64,
    refused_too_large: AtomicU64,
    send_errors: AtomicU64,
    batches: AtomicU64,
    roams: AtomicU64,
    /// The worker running on this worker's CPU as its guest; [`NO_GUEST`]: none.
    guest: AtomicUsize,
}

/// No worker runs on this worker's CPU as its guest.
const NO_GUEST: usize = usize::MAX;

/// A running UDP service: one socket and one thread per worker.
pub struct UdpService {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    sockets: Vec<Arc<std::net::UdpSocket>>,
    threads: Vec<JoinHandle<()>>,
    counters: Arc<Vec<Counters>>,
}

/// A UDP socket bound to `addr` with `SO_REUSEPORT` (and `SO_RCVBUF` when
/// given), receiving with a timeout of [`WAKE_EVERY`].
fn bind(addr: SocketAddr, rcvbuf: Option<usize>, cpu: Option<usize>) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    if let Some(b) = rcvbuf {
        // The kernel caps it at rmem_max: a smaller buffer is no error.
        let _ = s.set_recv_buffer_size(b);
    }
    if let Some(c) = cpu {
        // Where the kernel can, it gives this socket the datagrams received
        // on its CPU; older kernels ignore it for UDP.
        let _ = s.set_cpu_affinity(c);
    }
    s.set_read_timeout(Some(WAKE_EVERY))?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

impl UdpService {
    /// Bind `cfg.listen` once per worker of `mux_cfg` and serve `handler`
    /// there (see the module's documentation).
    pub fn start(mux_cfg: &Config, cfg: UdpConfig, handler: Arc<dyn Handler>) -> io::Result<UdpService> {
        let workers = mux_cfg.workers.max(1);
        let cpus = mux_cfg.placement.cpus(workers);
        let steer = |i: usize| if mux_cfg.incoming_cpu { cpus[i] } else { None };
        let first = bind(cfg.listen, cfg.rcvbuf, steer(0))?;
        let local = first.local_addr()?;
        let mut sockets = vec![Arc::new(first)];
        for i in 1..workers {
            sockets.push(Arc::new(bind(local, cfg.rcvbuf, steer(i))?));
        }
        let counters: Arc<Vec<Counters>> = Arc::new(
            (0..workers).map(|_| Counters { guest: AtomicUsize::new(NO_GUEST), ..Counters::default() }).collect(),
        );
        let all_cpus = Arc::new(cpus.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let mut svc = UdpService { local, stop, sockets: sockets.clone(), threads: Vec::new(), counters };
        for (i, sock) in sockets.into_iter().enumerate() {
            let w = Worker {
                index: i,
                cpus: all_cpus.clone(),
                sock,
                handler: handler.clone(),
                stop: svc.stop.clone(),
                counters: svc.counters.clone(),
                max: cfg.max_datagram.clamp(1, MAX_UDP_PAYLOAD),
                batch: cfg.batch.clamp(1, connmux_sys::udp::MAX_BATCH),
                gso: cfg.gso,
            };
            // An error here drops `svc`, which stops the threads started.
            let t = std::thread::Builder::new().name(format!("connmux-udp{i}")).spawn(move || w.run())?;
            svc.threads.push(t);
        }
        Ok(svc)
    }

    /// The address the sockets are bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Threads (and sockets) serving.
    pub fn workers(&self) -> usize {
        self.sockets.len()
    }

    /// The counters, all workers summed.
    pub fn stats(&self) -> UdpStats {
        let mut s = UdpStats::default();
        for c in self.counters.iter() {
            s.datagrams_in += c.datagrams_in.load(Relaxed);
            s.datagrams_out += c.datagrams_out.load(Relaxed);
            s.malformed += c.malformed.load(Relaxed);
            s.truncated += c.truncated.load(Relaxed);
            s.refused_too_large += c.refused_too_large.load(Relaxed);
            s.send_errors += c.send_errors.load(Relaxed);
            s.batches += c.batches.load(Relaxed);
            s.roams += c.roams.load(Relaxed);
        }
        s
    }

    /// Stop every thread and close the sockets; returns once the threads
    /// have ended.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        for s in &self.sockets {
            // On an unconnected UDP socket this answers ENOTCONN but still
            // marks the receive side shut and wakes its blocked readers.
            let _ = socket2::SockRef::from(&**s).shutdown(std::net::Shutdown::Read);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for UdpService {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// A reply waiting for the batch's `sendmmsg`: bytes of the run buffer, or
/// a buffer of its own; and the request it answers.
enum Out {
    Span(usize, usize),
    Own(Bytes),
}

/// What one receive took: `n` datagrams into the batch, or one of `len`
/// bytes (longer than the largest taken: cut).
#[derive(Clone, Copy)]
enum Got {
    Batch(usize),
    One(usize),
}

/// Where the bytes of one send lie: a range of the run buffer, or the
/// reply (by its index) that has a buffer of its own.
#[derive(Clone, Copy)]
enum Src {
    Out(usize, usize),
    Own(usize),
}

/// One entry of a `sendmmsg`: `n` datagrams of `seg` bytes (the last may
/// be shorter; `seg` 0: one datagram) to the peer of request `peer`.
#[derive(Clone, Copy)]
struct Item {
    src: Src,
    peer: usize,
    seg: u16,
    n: u32,
}

struct Worker {
    index: usize,
    /// Every worker's CPU, by index.
    cpus: Arc<Vec<Option<usize>>>,
    sock: Arc<std::net::UdpSocket>,
    handler: Arc<dyn Handler>,
    stop: Arc<AtomicBool>,
    counters: Arc<Vec<Counters>>,
    max: usize,
    batch: usize,
    gso: bool,
}

impl Worker {
    fn run(self) {
        if let Some(c) = self.cpus[self.index] {
            // Unpinned if the CPU went away: it still serves.
            let _ = connmux_sys::affinity::pin_current_thread(c);
        }
        let mut roam = Roam::new(self.index, &self.cpus);
        let fd = self.sock.as_raw_fd();
        let c = &self.counters[self.index];
        let from = udp_psock(self.index as u32);
        let mut many = RecvBatch::new(self.batch, self.max);
        // One datagram taken alone, and where it came from.
        let mut one = vec![0u8; self.max];
        let mut one_peer = connmux_sys::udp::Peer::default();
        // Receives in a row that took one datagram each (see `LONE_PROBE`).
        let mut lone: u32 = 0;
        let mut sb = SendBatch::new();
        let mut out = BytesMut::with_capacity(crate::handler::SCRATCH_CHUNK);
        let mut scratch = BytesMut::with_capacity(crate::handler::SCRATCH_CHUNK);
        let mut replies: Vec<(Out, usize)> = Vec::with_capacity(self.batch);
        // Replies to one peer sent as one segmented buffer, until the
        // kernel refuses it.
        let mut gso = self.gso;
        let mut items: Vec<Item> = Vec::with_capacity(self.batch);
        // Bounded by the stop flag, looked at after every wake (at most
        // WAKE_EVERY apart).
        while !self.stop.load(std::sync::atomic::Ordering::Acquire) {
            let single = !lone.is_multiple_of(LONE_PROBE) && roam.away.is_none();
            let got = match roam.away {
                Some(_) => spin(fd, &mut many),
                None => None,
            };
            let recv = || -> io::Result<Got> {
                if single {
                    let len = connmux_sys::udp::recv_one(fd, &mut one, &mut one_peer, 0)?;
                    return Ok(Got::One(len));
                }
                got.unwrap_or_else(|| recv_batch(fd, &mut many, libc::MSG_WAITFORONE)).map(Got::Batch)
            };
            let got = match recv() {
                Ok(g) => {
                    lone = if matches!(g, Got::One(_) | Got::Batch(1)) { lone.wrapping_add(1).max(1) } else { 0 };
                    g
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    // Nothing came for WAKE_EVERY.
                    roam.home(&self.cpus, &self.counters);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // An error queued on the socket (e.g. from an ICMP
                    // message) is cleared by reading it: look again, a
                    // moment later (an error that stays must not spin).
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
            };
            if self.stop.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
            if matches!(got, Got::One(_)) && one_peer.to_std().is_none() {
                // Woken with no datagram (the socket shut down): look again.
                continue;
            }
            let n = match got {
                Got::Batch(n) => n,
                Got::One(_) => 1,
            };
            c.batches.fetch_add(1, Relaxed);
            c.datagrams_in.fetch_add(n as u64, Relaxed);
            roam.batch(n, &self.cpus, &self.counters);
            let (mut malformed, mut truncated, mut refused) = (0u64, 0u64, 0u64);
            for i in 0..n {
                let (d, cut) = match got {
                    Got::Batch(_) => (many.datagram(i), many.truncated(i)),
                    Got::One(len) => (&one[..len.min(self.max)], len > self.max),
                };
                if cut {
                    truncated += 1;
                    continue;
                }
                if scratch.capacity() - scratch.len() < crate::handler::SCRATCH_LOW {
                    scratch.reserve(crate::handler::SCRATCH_CHUNK);
                }
                let mark = out.len();
                match self.handler.handle_in_place(d, from, &mut scratch, &mut out) {
                    Verdict::Appended if out.len() > mark => {
                        if out.len() - mark > self.max {
                            out.truncate(mark);
                            refused += 1;
                        } else {
                            replies.push((Out::Span(mark, out.len()), i));
                        }
                    }
                    Verdict::Appended | Verdict::NoReply => out.truncate(mark),
                    Verdict::Reply(b) => {
                        out.truncate(mark);
                        if b.len() > self.max {
                            refused += 1;
                        } else {
                            replies.push((Out::Own(b), i));
                        }
                    }
                    Verdict::Close => {
                        out.truncate(mark);
                        malformed += 1;
                    }
                }
            }
            let (sent, errors) = match got {
                Got::Batch(_) => self.send(fd, &mut sb, &many, &out, &replies, &mut items, &mut gso),
                Got::One(_) => match replies.first() {
                    None => (0, 0),
                    Some((o, _)) => {
                        let b = match o {
                            Out::Span(a, b) => &out[*a..*b],
                            Out::Own(b) => &b[..],
                        };
                        // Bounded: it is tried again only after a signal.
                        loop {
                            match connmux_sys::udp::send_one(fd, b, &one_peer, libc::MSG_NOSIGNAL) {
                                Ok(_) => break (1, 0),
                                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                                Err(_) => break (0, 1),
                            }
                        }
                    }
                },
            };
            c.datagrams_out.fetch_add(sent, Relaxed);
            for (counter, v) in [
                (&c.malformed, malformed),
                (&c.truncated, truncated),
                (&c.refused_too_large, refused),
                (&c.send_errors, errors),
            ] {
                if v > 0 {
                    counter.fetch_add(v, Relaxed);
                }
            }
            replies.clear();
            out.clear();
            if out.capacity() > 4 * crate::handler::SCRATCH_CHUNK {
                // A batch of large replies: do not keep their room.
                out = BytesMut::with_capacity(crate::handler::SCRATCH_CHUNK);
            }
        }
    }

    /// Sends every reply of a batch, in `sendmmsg` calls of what is left;
    /// a reply the kernel refuses is skipped. Replies to one peer that lie
    /// back to back in `out`, of one size (the last may be shorter), go as
    /// one segmented send (UDP GSO) while the kernel takes them (`gso`).
    /// `items` is room kept between batches. Returns (sent, refused).
    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        fd: i32,
        sb: &mut SendBatch,
        rb: &RecvBatch,
        out: &[u8],
        replies: &[(Out, usize)],
        items: &mut Vec<Item>,
        gso: &mut bool,
    ) -> (u64, u64) {
        items.clear();
        let mut k = 0;
        // Bounded: each turn takes at least one reply.
        while k < replies.len() {
            let (o, i) = &replies[k];
            let (at, mut end) = match o {
                Out::Span(a, b) => (*a, *b),
                Out::Own(_) => {
                    items.push(Item { src: Src::Own(k), peer: *i, seg: 0, n: 1 });
                    k += 1;
                    continue;
                }
            };
            let seg = end - at;
            let mut n = 1;
            k += 1;
            if *gso && seg <= usize::from(u16::MAX) {
                // Bounded: each turn adds a reply to the group or stops.
                while let Some((Out::Span(a, b), j)) = replies.get(k) {
                    let len = b - a;
                    if *a != end
                        || len > seg
                        || n >= connmux_sys::udp::MAX_SEGMENTS
                        || b - at > MAX_UDP_PAYLOAD
                        || rb.peer(*j) != rb.peer(*i)
                    {
                        break;
                    }
                    end = *b;
                    n += 1;
                    k += 1;
                    if len < seg {
                        break;
                    }
                }
            }
            let seg = if n > 1 { seg as u16 } else { 0 };
            items.push(Item { src: Src::Out(at, end), peer: *i, seg, n: n as u32 });
        }
        let bytes = |src: Src| -> &[u8] {
            match src {
                Src::Out(a, b) => &out[a..b],
                Src::Own(r) => match &replies[r].0 {
                    Out::Own(b) => b,
                    Out::Span(a, b) => &out[*a..*b],
                },
            }
        };
        let (mut k, mut sent, mut errors) = (0, 0u64, 0u64);
        // Bounded: each turn sends at least one entry, skips one, or (once)
        // splits the rest into single datagrams.
        while k < items.len() {
            let list = items[k..].iter().map(|it| (bytes(it.src), Some(rb.peer(it.peer)), it.seg));
            match connmux_sys::udp::send_batch_segmented(fd, sb, list, libc::MSG_NOSIGNAL) {
                Ok(0) => {
                    errors += u64::from(items[k].n);
                    k += 1;
                }
                Ok(n) => {
                    sent += items[k..k + n].iter().map(|x| u64::from(x.n)).sum::<u64>();
                    k += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if items[k].seg > 0
                        && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT)) =>
                {
                    // No UDP GSO here: the rest one datagram at a time.
                    *gso = false;
                    let rest: Vec<Item> = items[k..]
                        .iter()
                        .flat_map(|it| {
                            let (src, seg) = (it.src, usize::from(it.seg));
                            let (a, b) = match src {
                                Src::Out(a, b) if seg > 0 => (a, b),
                                _ => (0, 0),
                            };
                            let one = (seg == 0).then_some(Item { n: 1, ..*it });
                            let cut = (a..b).step_by(seg.max(1)).map(move |x| Item {
                                src: Src::Out(x, (x + seg).min(b)),
                                peer: it.peer,
                                seg: 0,
                                n: 1,
                            });
                            one.into_iter().chain(cut)
                        })
                        .collect();
                    items.truncate(k);
                    items.extend(rest);
                }
                Err(_) => {
                    errors += u64::from(items[k].n);
                    k += 1;
                }
            }
        }
        (sent, errors)
    }
}

/// A guest's look at its socket before it sleeps: `recvmmsg` without
/// waiting, again and again for up to [`GUEST_SPIN`]; `None`: nothing came.
fn spin(fd: i32, rb: &mut RecvBatch) -> Option<io::Result<usize>> {
    let t0 = Instant::now();
    // Bounded by GUEST_SPIN.
    loop {
        match recv_batch(fd, rb, libc::MSG_DONTWAIT) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return Some(r),
        }
        if t0.elapsed() >= GUEST_SPIN {
            return None;
        }
        std::hint::spin_loop();
    }
}

/// What a worker saw over one look ([`ROAM_EVERY`]).
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    /// How long it lasted.
    over: Duration,
    /// Batches and datagrams the worker took.
    batches: u64,
    datagrams: u64,
    /// Datagrams its host took (while a guest).
    host_in: u64,
}

/// Where a worker's thread goes after a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Move {
    Stay,
    /// Onto the CPU of this sibling.
    To(usize),
    Home,
}

/// The rule of the module's "Roaming". `away`: whether the worker is a
/// guest now; `siblings`: each sibling that could host it, with its CPU's
/// idle time over the window (`None`: not known yet).
fn verdict(w: &Window, away: bool, siblings: &[(usize, Option<Duration>)]) -> Move {
    if away {
        // Under 1.25 datagrams a batch, or the host busy in its own right.
        let home = w.batches == 0 || w.datagrams * 4 < w.batches * 5 || w.host_in * 8 >= w.datagrams;
        return if home { Move::Home } else { Move::Stay };
    }
    if w.batches == 0 || w.datagrams < 2 * w.batches {
        return Move::Stay;
    }
    siblings
        .iter()
        .filter_map(|&(j, idle)| Some((j, idle?)))
        .filter(|&(_, idle)| idle * 2 >= w.over)
        .max_by_key(|&(_, idle)| idle)
        .map_or(Move::Stay, |(j, _)| Move::To(j))
}

/// A worker's roaming (see the module's documentation): its current look
/// and where its thread runs.
struct Roam {
    me: usize,
    /// Whether the worker is pinned and some sibling is pinned to another
    /// CPU: else it never moves and counts nothing.
    can: bool,
    /// The sibling whose CPU the thread runs on.
    away: Option<usize>,
    since: Instant,
    window: Window,
    /// The host's `datagrams_in` when the look began.
    host_seen: u64,
    /// The siblings' CPUs' idle time (by worker index) at `since`, when
    /// read then.
    idle: Option<Vec<Option<u64>>>,
}

impl Roam {
    fn new(me: usize, cpus: &[Option<usize>]) -> Roam {
        let can = cpus[me].is_some_and(|home| cpus.iter().any(|c| c.is_some_and(|c| c != home)));
        Roam { me, can, away: None, since: Instant::now(), window: Window::default(), host_seen: 0, idle: None }
    }

    /// Counts a batch of `n` and, once a look is over, moves the thread
    /// where [`verdict`] says.
    fn batch(&mut self, n: usize, cpus: &[Option<usize>], counters: &[Counters]) {
        if !self.can {
            return;
        }
        self.window.batches += 1;
        self.window.datagrams += n as u64;
        let now = Instant::now();
        let over = now.duration_since(self.since);
        if over < ROAM_EVERY {
            return;
        }
        let Some(home) = cpus[self.me] else { return };
        self.window.over = over;
        if let Some(h) = self.away {
            self.window.host_in = counters[h].datagrams_in.load(Relaxed).wrapping_sub(self.host_seen);
        }
        let mut siblings = Vec::new();
        if self.away.is_none() && self.window.datagrams >= 2 * self.window.batches {
            // Only a worker that would move reads /proc/stat.
            let read: Vec<usize> = cpus.iter().map(|c| c.unwrap_or(home)).collect();
            let idle = connmux_sys::affinity::cpus_idle_nanos(&read).ok();
            for (j, c) in cpus.iter().enumerate() {
                let free = counters[j].guest.load(Relaxed) == NO_GUEST;
                if j == self.me || !free || c.is_none_or(|c| c == home) {
                    continue;
                }
                let spent = match (&self.idle, &idle) {
                    (Some(a), Some(b)) => a[j].zip(b[j]).map(|(a, b)| Duration::from_nanos(b.saturating_sub(a))),
                    _ => None,
                };
                siblings.push((j, spent));
            }
            self.idle = idle;
        } else {
            self.idle = None;
        }
        match verdict(&self.window, self.away.is_some(), &siblings) {
            Move::Stay => {}
            Move::Home => self.home(cpus, counters),
            Move::To(j) => {
                let to = cpus[j].expect("a sibling with a CPU");
                if counters[j].guest.compare_exchange(NO_GUEST, self.me, Relaxed, Relaxed).is_ok() {
                    if connmux_sys::affinity::pin_current_thread(to).is_ok() {
                        self.away = Some(j);
                        counters[self.me].roams.fetch_add(1, Relaxed);
                    } else {
                        counters[j].guest.store(NO_GUEST, Relaxed);
                    }
                }
                self.idle = None;
            }
        }
        if let Some(h) = self.away {
            self.host_seen = counters[h].datagrams_in.load(Relaxed);
        }
        self.since = now;
        self.window = Window::default();
    }

    /// Back onto the worker's own CPU, if it was a guest.
    fn home(&mut self, cpus: &[Option<usize>], counters: &[Counters]) {
        if let Some(h) = self.away.take() {
            if let Some(c) = cpus[self.me] {
                let _ = connmux_sys::affinity::pin_current_thread(c);
            }
            counters[h].guest.store(NO_GUEST, Relaxed);
        }
        self.since = Instant::now();
        self.window = Window::default();
        self.idle = None;
    }
}

#[cfg(test)]
mod tests {
    use super::{verdict, Move, Window};
    use std::time::Duration;

    fn window(batches: u64, datagrams: u64, host_in: u64) -> Window {
        Window { over: Duration::from_millis(50), batches, datagrams, host_in }
    }

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    #[test]
    fn a_worker_with_full_batches_moves_to_the_idlest_sibling_idle_half_the_time() {
        let w = window(1_000, 5_000, 0);
        assert_eq!(verdict(&w, false, &[(1, ms(30)), (2, ms(45))]), Move::To(2));
        assert_eq!(verdict(&w, false, &[(1, ms(25))]), Move::To(1));
        assert_eq!(verdict(&w, false, &[(1, ms(24))]), Move::Stay, "idle under half the look");
        assert_eq!(verdict(&w, false, &[(1, None)]), Move::Stay, "idle time not known yet");
        assert_eq!(verdict(&w, false, &[]), Move::Stay, "no sibling");
    }

    #[test]
    fn a_worker_answering_one_datagram_at_a_time_stays_home() {
        assert_eq!(verdict(&window(1_000, 1_999, 0), false, &[(1, ms(50))]), Move::Stay);
        assert_eq!(verdict(&window(1_000, 2_000, 0), false, &[(1, ms(50))]), Move::To(1));
        assert_eq!(verdict(&window(0, 0, 0), false, &[(1, ms(50))]), Move::Stay);
    }

    #[test]
    fn a_guest_goes_home_when_its_batches_shrink_or_its_host_gets_busy() {
        assert_eq!(verdict(&window(1_000, 3_600, 0), true, &[]), Move::Stay);
        assert_eq!(verdict(&window(1_000, 1_250, 0), true, &[]), Move::Stay);
        assert_eq!(verdict(&window(1_000, 1_249, 0), true, &[]), Move::Home);
        assert_eq!(verdict(&window(1_000, 3_600, 449), true, &[]), Move::Stay);
        assert_eq!(verdict(&window(1_000, 3_600, 450), true, &[]), Move::Home);
        assert_eq!(verdict(&window(0, 0, 0), true, &[]), Move::Home);
    }
}
