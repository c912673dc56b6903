//! One round of load: `-j` threads, each with its own TCP connection, each
//! keeping up to `-a` requests in flight and timing every one of them.
//!
//! The connection loop (one blocking socket per thread, as in a lean C client):
//! 1. fill every free slot: encode one request per slot into one send buffer;
//! 2. send the buffer with `MSG_DONTWAIT` (one `send` for the whole batch; what
//!    does not fit stays queued for the next turn);
//! 3. if any fully-sent request is unanswered, block in one `read` (bounded by
//!    `SO_RCVTIMEO` = the I/O timeout), hand the bytes to the protocol's
//!    decoder, and complete each reply it reports, matched by tag;
//! 4. otherwise (everything sent is answered but a request is only partly
//!    sent, so the peer cannot answer it yet) drain whatever is readable without
//!    blocking, then make a blocking send of at most [`SEND_CHUNK`] bytes.
//!
//! Step 4 is what keeps large messages from deadlocking: the client never
//! blocks in `send` while the peer may be blocked sending to it, and never
//! blocks in `read` while the peer is waiting for the rest of a request.
//!
//! A request's RTT runs from the clock read just before the batch holding it
//! was first offered to `send`, to the clock read just after the `read` that
//! completed its reply. Requests still queued because the socket buffer was
//! full therefore include that client-side wait.
//!
//! Every wait is bounded: connect and each blocking read/send by the I/O
//! timeout, the whole round by its limit (the round's `-d` plus `--timeout`).
//! When a connection fails or the limit passes, the other connections are shut
//! down so that their threads return at once.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Barrier, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::conn::Conn;

/// Largest blocking send made while nothing is in flight (see step 4 above);
/// small enough that a byte-echo peer's answer fits the receive buffer.
pub const SEND_CHUNK: usize = 16 * 1024;
/// Receive buffer per connection: one `read` takes at most this much.
const READ_BUF: usize = 128 * 1024;
/// Highest RTT the histogram keeps exactly (1 h); higher values are clamped.
/// With 3 significant digits that is about 256 KiB of counters per connection.
const HIST_MAX_NS: u64 = 3_600_000_000_000;
/// Most requests in flight per connection: the tag keeps the slot in its low bits.
pub const MAX_INFLIGHT: usize = 65_536;

/// `Client::setup`'s way to the server: send the bytes (unless empty), then
/// append the bytes of one read.
pub type Exchange<'a> = dyn FnMut(&[u8], &mut Vec<u8>) -> Result<(), String> + 'a;

/// One connection's protocol: how to write a request and check the replies.
pub trait Client: Send {
    /// Appends one request to `out`. `tag` identifies it among those in flight
    /// (rpctest uses it as the xid).
    fn encode(&mut self, tag: u32, out: &mut Vec<u8>);
    /// Consumes every byte of `input` (the next bytes from the peer), keeping
    /// any partial reply for the next call, and pushes the tag of each reply
    /// it completes, in arrival order. Any reply that is not the one expected
    /// is an error, described in words.
    fn decode(&mut self, input: &[u8], done: &mut Vec<u32>) -> Result<(), String>;

    /// Opens the session before the clock starts (9P's version and attach).
    /// `exchange(request, reply)` sends `request` (unless empty), then appends
    /// the bytes of one read to `reply`. The default does nothing.
    fn setup(&mut self, exchange: &mut Exchange<'_>) -> Result<(), String> {
        let _ = exchange;
        Ok(())
    }

    /// Appends requests that replies just decoded call for, within requests
    /// still in flight (9P's clunk after a walk's reply). The default has none.
    fn follow_up(&mut self, out: &mut Vec<u8>) {
        let _ = out;
    }
}

/// Makes one [`Client`] per connection.
pub trait Workload: Sync {
    type Client: Client;
    fn client(&self, conn: usize) -> Self::Client;
}

/// What one round does.
#[derive(Debug, Clone)]
pub struct RoundPlan {
    pub threads: usize,
    pub inflight: usize,
    /// Requests per connection; `None` = until `duration` ends.
    pub count: Option<u64>,
    /// Stop issuing new requests this long after the start.
    pub duration: Option<Duration>,
    /// The whole round (connect excluded) must end within this.
    pub limit: Duration,
    pub io_timeout: Duration,
    /// Pin connection thread `i` to `cpus[i % len]`.
    pub cpus: Option<Vec<usize>>,
    /// Speak TLS (handshake at connect, before the clock starts).
    pub tls: Option<crate::cmd::tls::ClientSetup>,
}

/// What one connection did in one round.
pub struct ConnStats {
    pub calls: u64,
    /// From the round's common start to this connection's last reply.
    pub elapsed_ns: u64,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub reads: u64,
    pub writes: u64,
    /// RTT per request, in ns.
    pub hist: Histogram<u64>,
    /// This connection's own failure (not counting being stopped because
    /// another connection failed).
    pub error: Option<String>,
    /// Over UDP: requests given up as lost.
    pub lost: Option<u64>,
}

impl ConnStats {
    pub(crate) fn new() -> Self {
        ConnStats {
            calls: 0,
            elapsed_ns: 0,
            tx_bytes: 0,
            rx_bytes: 0,
            reads: 0,
            writes: 0,
            hist: new_histogram(),
            error: None,
            lost: None,
        }
    }
}

/// An empty RTT histogram (ns, 3 significant digits, up to 1 h).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds")
}

/// Everything one round produced.
pub struct RoundOutcome {
    pub conns: Vec<ConnStats>,
    /// The round hit its limit and was stopped.
    pub timed_out: bool,
}

/// Live numbers for a progress display, read while the round runs.
pub trait Progress {
    /// Called about every `interval()` with the calls done so far and the
    /// time since the round's start.
    fn tick(&mut self, calls: u64, elapsed: Duration);
    fn interval(&self) -> Option<Duration>;
}

/// A per-connection counter on its own cache line, so connections that
/// publish progress on different CPUs do not contend for one line.
#[repr(align(64))]
struct Padded(AtomicU64);

enum Note {
    Finished,
    Failed,
}

/// What a round's load threads share with the thread that watches them
/// ([`run_load_threads`]): TCP's and UDP's rounds.
pub(super) struct Shared {
    abort: AtomicBool,
    t0_ns: AtomicU64,
    calls: Vec<Padded>,
    ready: Barrier,
    go: Barrier,
    base: Instant,
}

impl Shared {
    pub(super) fn new(threads: usize) -> Self {
        Shared {
            abort: AtomicBool::new(false),
            t0_ns: AtomicU64::new(0),
            calls: (0..threads).map(|_| Padded(AtomicU64::new(0))).collect(),
            ready: Barrier::new(threads + 1),
            go: Barrier::new(threads + 1),
            base: Instant::now(),
        }
    }

    pub(super) fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// Waits until every thread is ready and the clock has started; returns
    /// the round's common start.
    pub(super) fn start(&self) -> u64 {
        self.ready.wait();
        self.go.wait();
        self.t0_ns.load(Relaxed)
    }

    /// Whether the round is being stopped: a thread returns as soon as it sees it.
    pub(super) fn aborted(&self) -> bool {
        self.abort.load(Relaxed)
    }

    /// Publishes thread `i`'s calls so far for the progress display.
    pub(super) fn set_calls(&self, i: usize, calls: u64) {
        self.calls[i].0.store(calls, Relaxed);
    }
}

/// How a round stops its load threads early (on a failure or at the limit),
/// beyond setting the abort flag, and so how long its watcher may wait.
pub(super) trait Stop {
    /// Makes every load thread see the abort flag soon; called at most once.
    fn stop(&self);
    /// The longest wait for the next thread's note, `left` before the
    /// round's limit (zero once it has passed); `stopped` once `stop` ran.
    fn wait(&self, left: Duration, stopped: bool) -> Duration;
}

/// TCP's [`Stop`]: a clone of every connected socket, so a failure or the
/// round limit can shut all of them down and unblock their threads.
struct ShutAll(Mutex<Vec<TcpStream>>);

impl Stop for ShutAll {
    fn stop(&self) {
        for s in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Once stopped, every thread returns at once: only its note is awaited.
    fn wait(&self, left: Duration, stopped: bool) -> Duration {
        if stopped {
            Duration::from_secs(3600)
        } else {
            left
        }
    }
}

/// A [`Progress`] that shows nothing.
pub struct Quiet;
impl Progress for Quiet {
    fn tick(&mut self, _: u64, _: Duration) {}
    fn interval(&self) -> Option<Duration> {
        None
    }
}

/// A bench's hidden load mode: `conns` connections to `target`, `inflight`
/// calls in flight on each, for `seconds`, its threads on `cpus` (all CPUs
/// when empty). A failure or a round past its limit is printed as the one
/// JSON line the bench reads (`{"ok": false, "error": ...}`) and comes back
/// as `None`; else the connections' figures and the round's seconds.
pub fn timed_load_round<W: Workload>(
    w: &W,
    target: SocketAddr,
    conns: usize,
    inflight: usize,
    seconds: f64,
    cpus: &[usize],
) -> Option<(Vec<ConnStats>, f64)> {
    let d = Duration::from_secs_f64(seconds);
    let plan = RoundPlan {
        threads: conns,
        inflight,
        count: None,
        duration: Some(d),
        limit: d + Duration::from_secs(30),
        io_timeout: Duration::from_secs(10),
        cpus: (!cpus.is_empty()).then(|| cpus.to_vec()),
        tls: None,
    };
    let out = run_round(w, &[target], &plan, &mut Quiet);
    let error =
        out.conns.iter().find_map(|c| c.error.clone()).or_else(|| out.timed_out.then(|| "round timed out".into()));
    if let Some(e) = error {
        println!("{}", serde_json::json!({"ok": false, "error": e}));
        return None;
    }
    let secs = out.conns.iter().map(|c| c.elapsed_ns).max().unwrap_or(1).max(1) as f64 / 1e9;
    Some((out.conns, secs))
}

/// Runs one round and returns per-connection results. Never blocks longer
/// than connect + `plan.limit` + one I/O timeout.
pub fn run_round<W: Workload>(
    w: &W,
    addrs: &[SocketAddr],
    plan: &RoundPlan,
    progress: &mut dyn Progress,
) -> RoundOutcome {
    assert!(plan.threads >= 1 && (1..=MAX_INFLIGHT).contains(&plan.inflight));
    let sh = &Shared::new(plan.threads);
    let socks = &ShutAll(Mutex::new(Vec::with_capacity(plan.threads)));
    run_load_threads(sh, plan, progress, socks, |i| {
        let client = w.client(i);
        move || conn_thread(i, client, addrs, plan, sh, socks)
    })
}

/// TCP's and UDP's rounds: starts `plan.threads` threads named `load-{i}`,
/// each running the body `thread(i)` makes (made here, in order), starts the
/// clock once every thread is ready, then watches them until each has ended.
/// The first failure, or the round's limit passing, sets the abort flag and
/// calls `stop`. Every wait is bounded by the limit, `stop.wait` and the
/// progress interval.
pub(super) fn run_load_threads<T, B>(
    sh: &Shared,
    plan: &RoundPlan,
    progress: &mut dyn Progress,
    stop: &impl Stop,
    mut thread: T,
) -> RoundOutcome
where
    T: FnMut(usize) -> B,
    B: FnOnce() -> ConnStats + Send,
{
    let (tx, rx) = mpsc::channel::<Note>();
    let mut timed_out = false;
    let conns = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(plan.threads);
        for i in 0..plan.threads {
            let (body, tx) = (thread(i), tx.clone());
            let h = std::thread::Builder::new()
                .name(format!("load-{i}"))
                .stack_size(256 * 1024)
                .spawn_scoped(s, move || {
                    let st = body();
                    let _ = tx.send(if st.error.is_some() { Note::Failed } else { Note::Finished });
                    st
                })
                // The barriers expect every thread: spawn failures are fatal.
                .unwrap_or_else(|e| panic!("cannot start load thread {i}: {e}"));
            handles.push(h);
        }
        drop(tx);
        sh.ready.wait(); // every thread connected (or failed to)
        let t0 = sh.now_ns();
        sh.t0_ns.store(t0, Relaxed);
        sh.go.wait();
        let limit_at = t0 + plan.limit.as_nanos() as u64;
        let mut finished = 0;
        let mut stopped = false;
        // Bounded: every thread notes its end, and once stopped each one
        // returns soon.
        while finished < plan.threads {
            let left = Duration::from_nanos(limit_at.saturating_sub(sh.now_ns()));
            let mut wait = stop.wait(left, stopped);
            if let Some(iv) = progress.interval() {
                wait = wait.min(iv);
            }
            match rx.recv_timeout(wait) {
                Ok(Note::Finished) => finished += 1,
                Ok(Note::Failed) => {
                    finished += 1;
                    if !stopped {
                        stopped = true;
                        sh.abort.store(true, Relaxed);
                        stop.stop();
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if !stopped && sh.now_ns() >= limit_at {
                        stopped = true;
                        timed_out = true;
                        sh.abort.store(true, Relaxed);
                        stop.stop();
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if progress.interval().is_some() {
                let calls = sh.calls.iter().map(|c| c.0.load(Relaxed)).sum();
                progress.tick(calls, Duration::from_nanos(sh.now_ns().saturating_sub(t0)));
            }
        }
        join_load_threads(handles)
    });
    RoundOutcome { conns, timed_out }
}

/// Each load thread's statistics, once it has ended (a thread that
/// panicked counts as a connection with that error).
fn join_load_threads(handles: Vec<std::thread::ScopedJoinHandle<'_, ConnStats>>) -> Vec<ConnStats> {
    handles
        .into_iter()
        .map(|h| {
            h.join().unwrap_or_else(|_| {
                let mut st = ConnStats::new();
                st.error = Some("load thread panicked".into());
                st
            })
        })
        .collect()
}

fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream, String> {
    let mut last = String::from("no address");
    for a in addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("connect to {a}: {e}"),
        }
    }
    Err(last)
}

fn setup(s: &TcpStream, io_timeout: Duration) -> std::io::Result<()> {
    // Requests are small and each batch is one send: never wait for more data.
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(io_timeout))?;
    s.set_write_timeout(Some(io_timeout))?;
    Ok(())
}

fn conn_thread<C: Client>(
    i: usize,
    mut client: C,
    addrs: &[SocketAddr],
    plan: &RoundPlan,
    sh: &Shared,
    socks: &ShutAll,
) -> ConnStats {
    let mut st = ConnStats::new();
    let mut sock = None;
    if let Some(cpus) = &plan.cpus {
        let cpu = cpus[i % cpus.len()];
        if let Err(e) = connmux_sys::affinity::pin_current_thread(cpu) {
            st.error = Some(format!("cannot pin to CPU {cpu}: {e}"));
        }
    }
    if st.error.is_none() {
        match connect(addrs, plan.io_timeout).and_then(|s| {
            setup(&s, plan.io_timeout).map_err(|e| format!("socket options: {e}"))?;
            Ok(s)
        }) {
            Ok(s) => {
                if let Ok(c) = s.try_clone() {
                    socks.0.lock().unwrap_or_else(|p| p.into_inner()).push(c);
                }
                match &plan.tls {
                    None => sock = Some(Conn::plain(s)),
                    Some(t) => match Conn::tls(s, t, plan.io_timeout) {
                        Ok(c) => sock = Some(c),
                        Err(e) => st.error = Some(e),
                    },
                }
                if let Some(c) = sock.as_mut() {
                    let mut rbuf = vec![0u8; 64 * 1024];
                    let mut exchange = |req: &[u8], reply: &mut Vec<u8>| -> Result<(), String> {
                        let mut off = 0;
                        // Bounded: each write takes bytes or fails (write timeout).
                        while off < req.len() {
                            off += c.write(&req[off..]).map_err(|e| format!("setup send: {e}"))?;
                        }
                        match c.read(&mut rbuf) {
                            Ok(0) => Err("server closed the connection during setup".to_string()),
                            Ok(k) => {
                                reply.extend_from_slice(&rbuf[..k]);
                                Ok(())
                            }
                            Err(e) => Err(format!("setup read: {e}")),
                        }
                    };
                    if let Err(e) = client.setup(&mut exchange) {
                        st.error = Some(e);
                        sock = None;
                    }
                }
            }
            Err(e) => st.error = Some(e),
        }
    }
    let t0 = sh.start();
    if let Some(mut s) = sock {
        if let Err(e) = drive(i, &mut client, &mut s, plan, sh, t0, &mut st) {
            // Once the round is being stopped, a failure here is only its echo.
            if e != ABORTED && !sh.aborted() {
                st.error = Some(e);
            }
        }
        // Close now so the peer sees the end of this connection's round.
        drop(s);
    }
    st
}

const ABORTED: &str = "stopped";

#[derive(Clone, Copy)]
struct Slot {
    t_sent: u64,
    tag: u32,
    busy: bool,
}

fn drive<C: Client>(
    i: usize,
    client: &mut C,
    s: &mut Conn,
    plan: &RoundPlan,
    sh: &Shared,
    t0: u64,
    st: &mut ConnStats,
) -> Result<(), String> {
    let a = plan.inflight;
    // The slot number lives in the low bits of the tag and a per-slot use
    // counter in the rest, so a reply can be found in O(1) and a stale or
    // invented tag is caught.
    let slot_bits = slot_bits(a);
    let slot_mask: u32 = ((1u64 << slot_bits) - 1) as u32;
    let gen_mask: u64 = (1u64 << (32 - slot_bits)) - 1;
    let mut gen: u64 = 0;
    let mut slots = vec![Slot { t_sent: 0, tag: 0, busy: false }; a];
    let mut free: Vec<u32> = (0..a as u32).rev().collect();
    let mut pending: Vec<u8> = Vec::with_capacity(a * 64);
    let mut off = 0usize;
    let (mut queued_total, mut sent_total) = (0u64, 0u64);
    // Cumulative end offsets of requests not yet completely sent.
    let mut unsent_ends: VecDeque<u64> = VecDeque::with_capacity(a);
    let mut rbuf = vec![0u8; READ_BUF];
    let mut done: Vec<u32> = Vec::with_capacity(a);
    let (mut issued, mut inflight) = (0u64, 0usize);
    let mut stopping = false;
    let mut last_reply = t0;
    let deadline = plan.duration.map(|d| t0 + d.as_nanos() as u64);
    let io_secs = plan.io_timeout.as_secs_f64();

    let result = loop {
        if sh.aborted() {
            break Err(ABORTED.to_string());
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
            for _ in 0..n {
                let slot = free.pop().expect("free slot");
                let tag = ((gen << slot_bits) as u32) | slot;
                gen = (gen + 1) & gen_mask;
                slots[slot as usize] = Slot { t_sent: now, tag, busy: true };
                let before = pending.len();
                client.encode(tag, &mut pending);
                queued_total += (pending.len() - before) as u64;
                unsent_ends.push_back(queued_total);
            }
            issued += n;
            inflight += n as usize;
        }
        if off < pending.len() {
            match s.send_nowait(&pending[off..]) {
                Ok(k) => {
                    off += k;
                    sent_total += k as u64;
                    st.tx_bytes += k as u64;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => break Err(format!("send: {e}")),
            }
            st.writes += 1;
            while unsent_ends.front().is_some_and(|&e| e <= sent_total) {
                unsent_ends.pop_front();
            }
        }
        let awaiting = inflight - unsent_ends.len();
        if awaiting > 0 {
            let k = match s.read(&mut rbuf) {
                Ok(0) => break Err(format!("server closed the connection ({inflight} requests in flight)")),
                Ok(k) => k,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    break Err(format!("no reply within {io_secs} s ({awaiting} requests awaiting a reply)"))
                }
                Err(e) => break Err(format!("read: {e}")),
            };
            let now = sh.now_ns();
            st.reads += 1;
            st.rx_bytes += k as u64;
            if let Err(e) = take_replies(client, &rbuf[..k], &mut done, &mut slots, &mut free, slot_mask, now, st) {
                break Err(tls_hint(plan, st, &rbuf[..k], e));
            }
            inflight -= done.len();
            if !done.is_empty() {
                last_reply = now;
            }
            done.clear();
            let before = pending.len();
            client.follow_up(&mut pending);
            queued_total += (pending.len() - before) as u64;
            sh.set_calls(i, st.calls);
        } else if off < pending.len() {
            // Nothing more can be answered until this request is sent whole.
            if let Err(e) = s.set_nonblocking(true) {
                break Err(format!("set non-blocking: {e}"));
            }
            let mut drained = Ok(());
            // Bounded: at most 64 reads of what is already queued.
            for _ in 0..64 {
                match s.read(&mut rbuf) {
                    Ok(0) => {
                        drained = Err(format!("server closed the connection ({inflight} requests in flight)"));
                        break;
                    }
                    Ok(k) => {
                        let now = sh.now_ns();
                        st.reads += 1;
                        st.rx_bytes += k as u64;
                        if let Err(e) =
                            take_replies(client, &rbuf[..k], &mut done, &mut slots, &mut free, slot_mask, now, st)
                        {
                            drained = Err(tls_hint(plan, st, &rbuf[..k], e));
                            break;
                        }
                        inflight -= done.len();
                        if !done.is_empty() {
                            last_reply = now;
                        }
                        done.clear();
                        let before = pending.len();
                        client.follow_up(&mut pending);
                        queued_total += (pending.len() - before) as u64;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        drained = Err(format!("read: {e}"));
                        break;
                    }
                }
            }
            if let Err(e) = drained.and_then(|()| s.set_nonblocking(false).map_err(|e| format!("set blocking: {e}"))) {
                break Err(e);
            }
            let end = pending.len().min(off + SEND_CHUNK);
            match s.write(&pending[off..end]) {
                Ok(k) => {
                    off += k;
                    sent_total += k as u64;
                    st.tx_bytes += k as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    break Err(format!("send stalled for {io_secs} s (peer not reading)"))
                }
                Err(e) => break Err(format!("send: {e}")),
            }
            st.writes += 1;
            while unsent_ends.front().is_some_and(|&e| e <= sent_total) {
                unsent_ends.pop_front();
            }
        } else if inflight == 0 && stopping {
            break Ok(());
        }
        if off == pending.len() && off > 0 {
            pending.clear();
            off = 0;
        }
    };
    st.elapsed_ns = last_reply - t0;
    result
}

/// The error for a reply that failed its check. When a plain client's first
/// bytes from the peer are a TLS record (0x15 an alert, 0x16 a handshake),
/// the server wants TLS, which the reply check alone would not say.
fn tls_hint(plan: &RoundPlan, st: &ConnStats, first_read: &[u8], e: String) -> String {
    if plan.tls.is_some() || st.rx_bytes != first_read.len() as u64 {
        return e;
    }
    match tls_record_kind(first_read) {
        Some(kind) => format!(
            "the server speaks TLS (try --tls): its first byte {:#04x} starts a TLS {kind} record ({e})",
            first_read[0]
        ),
        None => e,
    }
}

/// What a TLS record starting `bytes` is, if its content type says TLS.
fn tls_record_kind(bytes: &[u8]) -> Option<&'static str> {
    match bytes.first() {
        Some(0x15) => Some("alert"),
        Some(0x16) => Some("handshake"),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn take_replies<C: Client>(
    client: &mut C,
    bytes: &[u8],
    done: &mut Vec<u32>,
    slots: &mut [Slot],
    free: &mut Vec<u32>,
    slot_mask: u32,
    now: u64,
    st: &mut ConnStats,
) -> Result<(), String> {
    client.decode(bytes, done)?;
    for &tag in done.iter() {
        let idx = (tag & slot_mask) as usize;
        match slots.get_mut(idx) {
            Some(slot) if slot.busy && slot.tag == tag => {
                slot.busy = false;
                free.push(idx as u32);
                st.hist.saturating_record(now.saturating_sub(slot.t_sent).max(1));
                st.calls += 1;
            }
            _ => return Err(format!("reply with xid {tag:#010x} matches no request in flight")),
        }
    }
    Ok(())
}

/// Bits that hold a slot number below `a` (0 for `a` = 1).
fn slot_bits(a: usize) -> u32 {
    usize::BITS - (a - 1).leading_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_bits_are_the_fewest_that_hold_every_slot() {
        for a in [1usize, 2, 3, 4, 5, 32, 33, 1023, 1024, 1025, MAX_INFLIGHT] {
            let b = slot_bits(a);
            assert!((a - 1) >> b == 0, "a={a} b={b}");
            assert!(b == 0 || (a - 1) >> (b - 1) == 1, "a={a} b={b}");
        }
        assert_eq!(slot_bits(1), 0);
        assert_eq!(slot_bits(MAX_INFLIGHT), 16);
    }

    #[test]
    fn tls_records_are_told_from_replies() {
        assert_eq!(tls_record_kind(&[0x15, 3, 3, 0, 2]), Some("alert"));
        assert_eq!(tls_record_kind(&[0x16, 3, 1]), Some("handshake"));
        // A record mark (rpctest) and an l4 header (echotest) start otherwise.
        assert_eq!(tls_record_kind(&[0x80, 0, 0, 0x18]), None);
        assert_eq!(tls_record_kind(&[0, 0, 0, 64]), None);
        assert_eq!(tls_record_kind(&[]), None);
    }
}
