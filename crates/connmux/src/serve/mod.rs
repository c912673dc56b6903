//! In-place serving: a worker runs the handler on the messages steered to its
//! own socket (or on a read's messages where they lie in its read buffer),
//! puts the replies of a read's run to one connection in one entry, queues
//! them in the core and writes them, offers a heavy connection's messages to
//! its lane and takes the lane's verdicts back.
//!
//! Owns a serving worker's buffers ([`ServeBufs`]) and what it serves
//! ([`Serving`]). Called by both drivers; must not name a driver, the public
//! `Mux` or anything above them, and does no I/O but the writes the core's
//! runtime side does (`Shared::write_begun`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use connmux_core::mux::{Event, MuxError, PsockId};
use connmux_core::run::{Messages, Run};
use connmux_core::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::config::Tuning;
use crate::handler::{since, Done, Handler, Job, Lanes, ServiceStats, Verdict, SCRATCH_CHUNK, SCRATCH_LOW};
use crate::lane::Heavy;
use crate::shared::{Ctx, PsockRt, Shared, SockRt};

/// What a serving worker serves (from `Command::Serve`): its own socket and
/// the handler, and the lanes it offers heavy connections' messages to.
pub(crate) struct Serving {
    pub sock: Arc<SockRt>,
    pub handler: Arc<dyn Handler>,
    /// Where connections closed by the handler are counted (a service's).
    pub stats: Option<Arc<ServiceStats>>,
    /// The heavy lanes (`crate::lane`); this worker's is `index`, and so is
    /// its inbox there.
    pub lanes: Arc<Lanes>,
    pub index: usize,
}

/// What a served request turned into, in the order the requests came.
pub(crate) enum Out {
    /// `count` whole replies, back to back, for one connection.
    Replies(PsockId, connmux_core::Bytes, u32),
    /// Reset and unattach this connection.
    Close(PsockId),
}

/// In-place runs of light connections: one in this many is timed, on
/// average ([`ServeBufs::time_run`]).
const TIME_EVERY: u8 = 4;

/// Which light runs are timed: the first at run `TIME_EVERY`, then after
/// `TIME_EVERY - 1`, `TIME_EVERY` or `TIME_EVERY + 1` more, picked by a
/// seeded `SmallRng` (the same picks every time). A fixed period is one the
/// order of a worker's connections can fall into: with four connections
/// served in turn, only the fourth was ever timed, and a heavy one among the
/// other three was never found. A varied period walks the timed run over all
/// of them; the first one stays at `TIME_EVERY`, so a heavy connection is
/// found as soon as before.
struct Sample {
    untimed: u8,
    period: u8,
    rng: SmallRng,
}

impl Default for Sample {
    fn default() -> Sample {
        Sample { untimed: 0, period: TIME_EVERY, rng: SmallRng::seed_from_u64(0x9E37_79B9) }
    }
}

impl Sample {
    /// Whether this run is timed.
    #[inline]
    fn next(&mut self) -> bool {
        self.untimed += 1;
        if self.untimed < self.period {
            return false;
        }
        self.untimed = 0;
        self.period = TIME_EVERY - 1 + self.rng.gen_range(0..3u8);
        true
    }
}

/// Timed runs without a slow one after which the connections whose runs
/// looked slow are forgotten ([`ServeBufs::time_run`]): many more than a
/// worker serves of other connections between two runs of a busy one (a
/// pass reads each ready connection once), so a heavy connection among
/// thousands of light ones is still caught.
const SUSPECT_RUNS: u16 = 4096;

/// Sleeps after its last run answered in place for which a worker still
/// counts as serving light connections ([`ServeBufs::light_lately`]): a
/// light connection's requests may skip a few of its passes (those that
/// only take its lane's verdicts or write).
const LIGHT_SLEEPS: u8 = 16;

/// Messages a serving worker takes from its socket per lock hold, and at
/// most that many handed to it straight from reads it could not serve in
/// place: large enough that one lock hold pays for many messages, small
/// enough that a worker gets back to its reads (and so to its other
/// connections) soon; a pass serves at most 64 such batches. (A read's
/// messages framed in place are all served: the read size bounds them.)
pub(crate) const SERVE_BATCH: usize = 256;

/// Slow runs in a row ([`Limits::slow`]) that make a connection heavy: one
/// long run can be a preemption, several in a row are a heavy connection.
const SLOW_HITS: u32 = 3;

/// Connections on probation at once ([`ServeBufs::probe`]); one more waits
/// for a place (its next slow run asks again).
const PROBES_MAX: usize = 16;

/// A worker's own copy of the `Tuning` values it reads per message.
#[derive(Clone, Copy)]
struct Limits {
    /// `Tuning::slow_handler` in nanoseconds: compared on every run, where
    /// making and comparing a `Duration` shows in a light call's cost.
    slow_handler_ns: u64,
    /// `Tuning::busy_handler` in nanoseconds.
    busy_handler_ns: u64,
}

impl Limits {
    /// Whether a run of `n` requests of one connection that took `each`
    /// nanoseconds apiece counts as slow: one long request, or a busy run
    /// (`Tuning::busy_handler`).
    #[inline]
    fn slow(&self, each: u64, n: usize) -> bool {
        each >= self.slow_handler_ns
            || (each >= self.busy_handler_ns && each.saturating_mul(n as u64) >= self.slow_handler_ns)
    }
}

impl From<&Tuning> for Limits {
    fn from(t: &Tuning) -> Limits {
        Limits {
            slow_handler_ns: u64::try_from(t.slow_handler.as_nanos()).unwrap_or(u64::MAX),
            busy_handler_ns: u64::try_from(t.busy_handler.as_nanos()).unwrap_or(u64::MAX),
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::from(&Tuning::default())
    }
}

/// A worker's buffers for in-place serving, kept across passes.
#[derive(Default)]
pub(crate) struct ServeBufs {
    /// `Config::tuning`, copied at start.
    limits: Limits,
    msgs: Vec<(connmux_core::Bytes, PsockId)>,
    outs: Vec<Out>,
    /// Where handlers build replies.
    scratch: bytes::BytesMut,
    /// Small replies to the current run's connection, back to back.
    run_buf: bytes::BytesMut,
    run: Option<(PsockId, u32)>,
    /// Consecutive long handler runs per psock (only psocks with one).
    slow_hits: rustc_hash::FxHashMap<PsockId, u32>,
    /// A psock that has just turned out heavy (for [`to_lane`]).
    pub slow: Option<PsockId>,
    /// Picks the light runs that are timed ([`ServeBufs::time_run`]).
    sample: Sample,
    /// Runs timed since the last slow one while `slow_hits` is not empty.
    suspect_runs: u16,
    /// The psocks whose runs looked slow `SLOW_HITS` times in a row by
    /// the clock: the next run of each is timed in this thread's CPU time,
    /// which a preemption does not advance, and that decides (on a busy
    /// machine light requests often look slow by the clock). Several at
    /// once: heavy connections served in turn would otherwise each take
    /// the one place before the other's next run, and neither be decided.
    probe: Vec<PsockId>,
    /// Where a read's messages lie in the read buffer (in-place serving).
    pub runs: Vec<Run>,
    /// Connections a handler closed in the batch being served: their later
    /// requests are not handled (nothing after the close is answered).
    closed: Vec<PsockId>,
    /// The chunk of replies written at once by `send_outs`.
    slices: Vec<connmux_core::Bytes>,
    /// Requests handled per psock since the last `send_outs`, settled with
    /// the core once their replies are queued (`Mux::rx_settle`).
    settle: Vec<(PsockId, u64)>,
    /// This worker's heavy connections (`crate::lane`).
    heavy: Heavy,
    /// The lane posts its replies quietly (it is far behind; the last
    /// verdicts taken include such a post): the worker's sleeps are bounded
    /// by `lane::LANE_REPLY_WAIT` until it takes only loud posts or one
    /// runs out with nothing posted (`driver::worker::lane_awake`).
    pub lane_quiet: bool,
    /// Sleeps left for which the worker still counts as serving light
    /// connections (`LIGHT_SLEEPS` after each run answered in place:
    /// [`ServeBufs::light_lately`]).
    light_sleeps: u8,
    /// Verdicts taken from the inbox.
    done: Vec<Done>,
    /// The hand-off between this worker's reads, dispatch and `serve`.
    pub own: crate::shared::Own,
}

impl ServeBufs {
    /// Empty buffers for a worker of a mux tuned with `t`.
    pub fn new(t: &Tuning) -> ServeBufs {
        ServeBufs { limits: Limits::from(t), ..ServeBufs::default() }
    }

    /// `n` requests of `p` were handled (answered or not).
    #[inline]
    fn handled(&mut self, p: PsockId, n: u64) {
        match self.settle.last_mut() {
            Some((q, k)) if *q == p => *k += n,
            _ => self.settle.push((p, n)),
        }
    }

    /// Whether the next in-place run is timed: every run while some
    /// connection's runs looked slow (until it is found heavy or not),
    /// else one in `TIME_EVERY` on average ([`Sample`]). The clock reading
    /// after a run is a good share of a light request's cost, and a heavy
    /// connection is caught all the same, a few runs later. A suspect not
    /// seen slow again within `SUSPECT_RUNS` timed runs is forgotten (a
    /// preempted run of a connection that then closed would otherwise keep
    /// every run timed).
    #[inline]
    fn time_run(&mut self) -> bool {
        if !self.slow_hits.is_empty() {
            self.suspect_runs += 1;
            if self.suspect_runs >= SUSPECT_RUNS {
                self.slow_hits.clear();
                self.probe.clear();
                self.suspect_runs = 0;
            }
            return true;
        }
        self.sample.next()
    }

    /// Close the current run of coalesced replies, if any.
    fn end_run(&mut self) {
        match self.run.take() {
            Some((p, n)) if n > 0 => self.outs.push(Out::Replies(p, self.run_buf.split().freeze(), n)),
            _ => {}
        }
    }

    /// Make the current run one of replies to `psock`, with room to grow.
    #[inline]
    fn open_run(&mut self, psock: PsockId) {
        match self.run {
            Some((p, _)) if p == psock => {}
            // (No run open: the common case, a run written alone.)
            None => self.run = Some((psock, 0)),
            Some(_) => {
                self.end_run();
                self.run = Some((psock, 0));
            }
        }
        if self.run_buf.capacity() - self.run_buf.len() < SCRATCH_LOW {
            self.run_buf.reserve(SCRATCH_CHUNK);
        }
    }

    /// Note how long a handler ran on a message of `psock` (if timed): whether
    /// it counts as slow.
    #[inline]
    fn timed(&mut self, psock: PsockId, t0: Option<u64>) -> bool {
        let Some(t0) = t0 else { return false };
        self.timed_slow(psock, t0)
    }

    /// Note how long a run of `n` requests of `psock` took: slow when their
    /// mean is, or when the run was busy ([`Limits::slow`]; one clock
    /// reading per run, not per request).
    #[inline]
    fn timed_run(&mut self, psock: PsockId, t0: u64, n: usize) -> bool {
        let n = n.max(1);
        self.note_time(psock, since(t0) / n as u64, n)
    }

    fn timed_slow(&mut self, psock: PsockId, t0: u64) -> bool {
        self.note_time(psock, since(t0), 1)
    }

    /// A run of `n` requests took `each_ns` per request.
    fn note_time(&mut self, psock: PsockId, each_ns: u64, n: usize) -> bool {
        if self.limits.slow(each_ns, n) {
            if self.slow_hits.len() >= 4096 {
                self.slow_hits.clear();
                self.probe.clear();
            }
            // One long run can be a preemption; several in a row are a heavy
            // connection.
            self.suspect_runs = 0;
            let hits = self.slow_hits.entry(psock).or_insert(0);
            *hits += 1;
            if *hits >= SLOW_HITS && self.probe.len() < PROBES_MAX && !self.probe.contains(&psock) {
                self.probe.push(psock);
            }
            true
        } else {
            if !self.slow_hits.is_empty() {
                self.slow_hits.remove(&psock);
                self.probe.retain(|&q| q != psock);
            }
            false
        }
    }

    /// Offer a heavy connection's request to this worker's lane, within the
    /// lane's byte bound; given back when it does not fit.
    fn offer(&mut self, sv: &Serving, job: Job) -> Result<(), Job> {
        let (len, psock) = (job.data.len(), job.psock);
        if !self.heavy.room(len, sv.lanes.bytes) {
            return Err(job);
        }
        sv.lanes.crew.offer(sv.index, job)?;
        self.heavy.offered(psock, len);
        Ok(())
    }

    /// A heavy connection's messages of one read to the lane (copied out of
    /// the read buffer), in order, while it
    /// takes them: returns those the full lane refused, which run here.
    fn offer_read<'a>(&mut self, sv: &Serving, p: PsockId, mut msgs: Messages<'a>) -> Messages<'a> {
        while let Some(m) = msgs.first() {
            // (Checked before the copy: a full lane costs no allocation.)
            if !self.heavy.room(m.len(), sv.lanes.bytes) {
                break;
            }
            if self.offer(sv, Job { data: Bytes::copy_from_slice(m), psock: p }).is_err() {
                break;
            }
            msgs = msgs.after(1);
        }
        msgs
    }

    /// Whether requests this worker offered to its lane are still out
    /// (their verdicts not taken yet): its lane may post replies quietly
    /// (`driver::worker::lane_sleep`).
    #[inline]
    pub(crate) fn lane_out(&self) -> bool {
        self.heavy.out()
    }

    /// The worker, about to sleep with requests in its lane: whether it has
    /// answered requests in place within its last `LIGHT_SLEEPS` sleeps
    /// (light connections keep it waking often). Such a worker sleeps with
    /// no bound on its wait, and its lane's quiet posts wake it
    /// (`driver::worker::lane_sleep`): a near timer on each of its many
    /// sleeps cost its light connections more than the wake-ups it saves.
    pub(crate) fn light_lately(&mut self) -> bool {
        let light = self.light_sleeps > 0;
        self.light_sleeps = self.light_sleeps.saturating_sub(1);
        light
    }

    /// Requests this worker has offered to its lane so far
    /// (`driver::worker::LaneSlice`).
    #[inline]
    pub(crate) fn lane_offers(&self) -> u64 {
        self.heavy.offers()
    }

    /// Before a run of `psock`'s requests: its thread CPU time when it is
    /// on probation (a look at an empty list otherwise).
    #[inline]
    fn probe_start(&self, psock: PsockId) -> Option<u64> {
        self.probe.contains(&psock).then(connmux_sys::clock::thread_cpu_nanos)
    }

    /// After that run of `n` requests: heavy if they were slow in CPU time
    /// ([`Limits::slow`]), else it was the clock (preemption).
    fn probe_end(&mut self, psock: PsockId, cpu0: Option<u64>, n: usize) {
        let Some(cpu0) = cpu0 else { return };
        self.probe.retain(|&q| q != psock);
        let n = n.max(1);
        let each = connmux_sys::clock::thread_cpu_nanos().saturating_sub(cpu0) / n as u64;
        if self.limits.slow(each, n) {
            self.slow.get_or_insert(psock);
        } else {
            self.slow_hits.remove(&psock);
        }
    }

    fn push(&mut self, psock: PsockId, v: Verdict) {
        match v {
            // (Replies a handler appended in a run share one entry already:
            // `Handler::handle_run_in_place`.)
            Verdict::Reply(b) => {
                self.end_run();
                self.outs.push(Out::Replies(psock, b, 1));
            }
            // `Appended` from `handle` (it has no `out`): nothing to send.
            Verdict::NoReply | Verdict::Appended => {}
            Verdict::Close => {
                self.end_run();
                self.closed.push(psock);
                self.outs.push(Out::Close(psock));
            }
        }
    }
}

/// Run the handler on every message queued on this worker's socket.
pub(crate) fn serve(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
) {
    // Everything queued so far is looked at below, after what this worker's
    // reads handed over directly (older than anything queued since).
    bufs.own.pending = false;
    bufs.msgs.append(&mut bufs.own.direct);
    // Bounded: `SERVE_BATCH` × 64 messages per pass, then back to I/O.
    for _ in 0..64 {
        sv.sock.rx.clear();
        {
            let mut core = sh.lock();
            while bufs.msgs.len() < SERVE_BATCH {
                match core.mux.recv_msg(sv.sock.id) {
                    Ok(m) => bufs.msgs.push(m),
                    Err(MuxError::WouldBlock) | Err(_) => break,
                }
            }
            if core.mux.rx_queued(sv.sock.id).unwrap_or(0) > 0 {
                sv.sock.rx.set();
            }
            core.drain_events(events);
        }
        if bufs.msgs.is_empty() {
            break;
        }
        let mut msgs = std::mem::take(&mut bufs.msgs);
        let mut slow_batch = false;
        for (i, (data, psock)) in msgs.drain(..).enumerate() {
            let closed = !bufs.closed.is_empty() && bufs.closed.contains(&psock);
            // A heavy connection's message goes to the lane (settled when
            // its verdict comes back), unless the lane is full.
            let data = match bufs.heavy.contains(psock) && !closed {
                true => match bufs.offer(sv, Job { data, psock }) {
                    Ok(()) => continue,
                    Err(job) => job.data,
                },
                false => data,
            };
            bufs.handled(psock, 1);
            if closed {
                continue;
            }
            if bufs.scratch.capacity() - bufs.scratch.len() < SCRATCH_LOW {
                bufs.scratch.reserve(SCRATCH_CHUNK);
            }
            let t0 = sampled(i).then(connmux_sys::clock::now_nanos);
            let cpu0 = bufs.probe_start(psock);
            let v = sv.handler.handle(data, psock, &mut bufs.scratch);
            bufs.probe_end(psock, cpu0, 1);
            slow_batch |= bufs.timed(psock, t0);
            bufs.push(psock, v);
        }
        bufs.msgs = msgs;
        send_outs(sh, sv, bufs, events, dirty, Write::Queue);
        if slow_batch {
            // Back to I/O: read the other connections before more heavy work
            // (the socket's readiness is still raised if messages wait).
            break;
        }
    }
}

/// Whether the handler's time is taken on the `i`th message of a batch: the
/// first few, then one in 16 (reading the clock for every message costs more
/// than a light handler; a heavy connection is caught all the same).
#[inline]
fn sampled(i: usize) -> bool {
    i < 4 || i.is_multiple_of(16)
}

/// One read of a psock as in-place serving sees it: its whole messages
/// where they lie (framed in place by the core), whose they
/// are and when they were read.
#[derive(Clone, Copy)]
pub(crate) struct ReadView<'a> {
    pub msgs: Messages<'a>,
    pub psock: PsockId,
    /// When the bytes were read (`now_nanos`): the first run's handler time
    /// counts from here.
    pub started: u64,
}

/// What becomes of a served read's replies once queued ([`send_outs`]).
#[derive(Clone, Copy)]
pub(crate) enum Write<'a> {
    /// They wait on the psock's queue for its writer (`PsockTransmit`).
    Queue,
    /// The read psock's next chunk is begun in the replies' hold and
    /// written at once with a plain `writev`.
    Now(&'a Arc<PsockRt>),
}

/// Run the handler on the messages of one read where they lie (`read`),
/// then queue the replies, written as `write` says ([`send_outs`]).
pub(crate) fn serve_in_place(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    mut read: ReadView<'_>,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
    write: Write<'_>,
) {
    let p = read.psock;
    if bufs.heavy.contains(p) {
        read.msgs = bufs.offer_read(sv, p, read.msgs);
        if read.msgs.is_empty() {
            return;
        }
    }
    bufs.handled(p, read.msgs.len() as u64);
    run_in_place(sv, bufs, read);
    send_outs(sh, sv, bufs, events, dirty, write)
}

/// The handler on the messages of one read where they lie (`read`), timed
/// (one run in a few, [`ServeBufs::time_run`]), its verdicts kept in `bufs`
/// (replies coalesced per run). Inlined into its two callers: at one
/// request a read, the call's register saves and restores were a good share
/// of the path (`connmux bench instructions`, `docs/performance.md`).
#[inline(always)]
fn run_in_place(sv: &Serving, bufs: &mut ServeBufs, read: ReadView<'_>) -> bool {
    let handler = &*sv.handler;
    let ReadView { msgs, psock: p, started } = read;
    bufs.light_sleeps = LIGHT_SLEEPS;
    let mut rest = msgs;
    let mut first = true;
    // Bounded: each turn handles at least one request.
    while !rest.is_empty() {
        if bufs.scratch.capacity() - bufs.scratch.len() < SCRATCH_LOW {
            bufs.scratch.reserve(SCRATCH_CHUNK);
        }
        bufs.open_run(p);
        // The first run is timed from `started` (when its bytes were read:
        // framing them is part of its time, and a clock reading is saved).
        let timed = bufs.time_run();
        let t0 = match (timed, std::mem::take(&mut first)) {
            (false, _) => 0,
            (true, true) => started,
            (true, false) => connmux_sys::clock::now_nanos(),
        };
        let cpu0 = bufs.probe_start(p);
        let served = handler.handle_run_in_place(rest, p, &mut bufs.scratch, &mut bufs.run_buf);
        // A handler that says it handled none (or more than it was given)
        // still moves the run on, so this loop ends.
        let handled = served.handled.clamp(1, rest.len());
        bufs.probe_end(p, cpu0, handled);
        if timed {
            bufs.timed_run(p, t0, handled);
        }
        if let Some((_, n)) = &mut bufs.run {
            *n += served.appended;
        }
        rest = rest.after(handled);
        match served.stop {
            Some(v) => {
                let close = matches!(v, Verdict::Close);
                bufs.push(p, v);
                if close {
                    // Nothing after the close is answered.
                    return true;
                }
            }
            None if served.handled == 0 => break,
            None => {}
        }
    }
    false
}

/// Queue the replies of served messages on their connections (in the order
/// they were produced) and abort the connections whose handler asked for it.
///
/// `write`: the connection whose read was just served, when it has no
/// chunk out (`Write::Now`): the core hands its chunk over with the last
/// reply run (`send_msgs_to_begin`) and it is written here, saving the
/// transmit event, the deferred-flush list and one lock hold per read. Its
/// replies still go through the core's transmit queue, so a send of
/// another thread is never interleaved.
fn send_outs(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
    write: Write<'_>,
) {
    bufs.closed.clear();
    if let Write::Now(rt) = write {
        if write_alone(sh, sv, bufs, rt, events, dirty) {
            return;
        }
    }
    bufs.end_run();
    if bufs.outs.is_empty() {
        if !bufs.settle.is_empty() || !bufs.own.alone.is_empty() {
            let mut core = sh.lock();
            bufs.own.report(&mut core);
            for (p, n) in bufs.settle.drain(..) {
                core.mux.rx_settle(p, n);
            }
            core.drain_events(events);
            drop(core);
            sh.dispatch(events, &mut Ctx::Worker(dirty, &mut bufs.own));
        }
        return;
    }
    let mut aborts = Vec::new();
    let mut begun = false;
    {
        let mut core = sh.lock();
        // What the read framed alone, counted before its replies, and the
        // chunks written whole told: the replies may begin the next.
        bufs.own.open(&mut core);
        let last = bufs.outs.len() - 1;
        for (i, out) in bufs.outs.drain(..).enumerate() {
            match out {
                Out::Replies(psock, b, n) => {
                    // A reply to a connection that went away is dropped, as a
                    // send on a closed socket would be. A refused one means its
                    // peer has not read `psock_sndbuf` bytes of replies while
                    // still sending: that connection is aborted (counted in
                    // tx_backlog_refusals), nobody else waits for it.
                    let r = match write {
                        Write::Now(rt) if i == last && rt.id == psock && rt.tls.is_none() => {
                            // Begun with no transmit event: the hub's from
                            // here (`Writer::mark`), until written.
                            rt.writer.mark();
                            core.mux.send_msgs_to_begin(sv.sock.id, psock, b, n, &mut bufs.slices).map(|b| begun = b)
                        }
                        _ if n == 1 => core.mux.send_msg(sv.sock.id, Some(psock), b, false),
                        _ => core.mux.send_msgs_to(sv.sock.id, psock, b, n),
                    };
                    if let Err(MuxError::WouldBlock) = r {
                        aborts.push(psock);
                    }
                }
                Out::Close(psock) => {
                    bufs.heavy.closed(psock);
                    if let Some(st) = &sv.stats {
                        st.closed.fetch_add(1, Ordering::Relaxed);
                    }
                    aborts.push(psock)
                }
            }
        }
        // Their replies are queued: a closing psock may close once written.
        for (p, n) in bufs.settle.drain(..) {
            core.mux.rx_settle(p, n);
        }
        bufs.own.close(&mut core);
        core.drain_events(events);
    }
    if let (Write::Now(rt), true) = (write, begun) {
        sh.write_owned(rt, events, &mut bufs.slices, &mut bufs.own);
    }
    sh.dispatch(events, &mut Ctx::Worker(dirty, &mut bufs.own));
    for p in aborts {
        if let Some(rt) = sh.psock_rt(p) {
            // Answer the good calls that came before the bad one first.
            sh.flush(&rt, events);
            let _ = connmux_sys::socket::abort(rt.fd());
        }
        let mut core = sh.lock();
        let _ = core.mux.unattach(p);
        core.drain_events(events);
        drop(core);
        sh.dispatch(events, &mut Ctx::Worker(dirty, &mut bufs.own));
    }
}

/// The replies to one read of `rt`, the worker's own psock, written by
/// the worker with no hold of the hub lock, when the hub has nothing of
/// the psock's queued or out and no other writer may begin one meanwhile
/// (`Writer::own`): they are counted, and the read's requests settled, in
/// the worker's next hold (`Own::open`: its pass's, at the latest). A
/// short write hands the rest to the hub, first on the psock's queue, in a
/// hold that settles the requests after it. The replies are the open run's
/// (written from the run buffer, split off it only when part is left) or
/// the one reply queued. `false`: not taken (the replies go through the
/// hub, [`send_outs`]).
///
/// Why: every served read took the hub lock for its replies, and that
/// hold (the replies queued, their chunk begun, and told written in the
/// next) cost about 670 of the 2,938 instructions of a NULL call at one
/// in flight (`docs/performance.md`, "Replies written by their psock's
/// owner"); splitting the run buffer into a chunk that was then dropped,
/// about 90 more.
fn write_alone(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    rt: &Arc<PsockRt>,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
) -> bool {
    let run = match (bufs.run, &bufs.outs[..]) {
        (Some((p, n)), []) if p == rt.id && n > 0 => true,
        (None | Some((_, 0)), [Out::Replies(p, _, _)]) if *p == rt.id => false,
        _ => return false,
    };
    if rt.tls.is_some() || bufs.own.told || rt.released.load(Ordering::Acquire) || !rt.writer.own() {
        return false;
    }
    let wrote = |res: &std::io::Result<usize>| match crate::shared::Wrote::of_io(res) {
        crate::shared::Wrote::Bytes(w) => w,
        // Nothing out: the hub's writer meets the same again or the error.
        _ => 0,
    };
    let (p, n, b, sent) = match run {
        true => {
            let Some((p, n)) = bufs.run.take() else { unreachable!("matched above") };
            let sent = wrote(&connmux_sys::socket::writev(rt.fd(), &[std::io::IoSlice::new(&bufs.run_buf)]));
            if sent == bufs.run_buf.len() {
                bufs.run_buf.clear();
                (p, n, None, sent)
            } else {
                (p, n, Some(bufs.run_buf.split().freeze()), sent)
            }
        }
        false => {
            bufs.run = None;
            let Some(Out::Replies(p, b, n)) = bufs.outs.pop() else { unreachable!("matched above") };
            let sent = wrote(&crate::shared::writev_bytes(rt.fd(), std::slice::from_ref(&b)));
            (p, n, (sent < b.len()).then_some(b), sent)
        }
    };
    match b {
        None => {
            bufs.own.sent.push((sv.sock.id, p, sent, n));
            bufs.own.settle.append(&mut bufs.settle);
        }
        Some(b) => {
            let mut core = sh.lock();
            bufs.own.open(&mut core);
            core.mux.tx_direct_rest(sv.sock.id, p, b, sent, n);
            // Settled once the rest is queued: a psock whose peer closed
            // drains only after it is written.
            for (p, n) in bufs.settle.drain(..) {
                core.mux.rx_settle(p, n);
            }
            bufs.own.close(&mut core);
            // Raises the psock for a writer (`PsockTransmit`): marked the
            // hub's before the worker lets go of it.
            core.drain_events(events);
        }
    }
    if rt.writer.disown() {
        // A hub writer found it writing and left its chunk: written now.
        sh.flush(rt, events);
    }
    if !events.is_empty() {
        sh.dispatch(events, &mut Ctx::Worker(dirty, &mut bufs.own));
    }
    true
}

/// A serving worker's step of one pass, the same on both drivers: the
/// lanes' verdicts first, then the handler on what reached the worker's
/// socket (`ready`: its readiness fired; or this pass's reads handed it
/// messages, or a dispatch saw it readable), then a connection found heavy
/// goes to the lane. Inlined into the worker's loop: in most passes of a
/// light connection served in place there is nothing to do here, and the
/// checks cost less than the call.
#[inline(always)]
pub(crate) fn pass(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
    ready: bool,
) {
    if sv.lanes.inboxes[sv.index].pending() {
        take_done(sh, sv, bufs, events, dirty);
    }
    // Not on every readable event: a read's messages for the socket were
    // served in place, and a queue left non-empty keeps the socket's
    // readiness, so `ready`, up.
    if ready || bufs.own.pending || bufs.own.has_direct() {
        serve(sh, sv, bufs, events, dirty);
    }
    if let Some(p) = bufs.slow.take() {
        to_lane(sh, bufs, p);
    }
}

/// The end of a worker's pass: messages reached its socket after it served
/// (a dispatch after `pass` saw it readable): raise its readiness, so the
/// next wait returns at once.
pub(crate) fn end_pass(sv: Option<&Serving>, bufs: &mut ServeBufs) {
    if bufs.own.take_pending() {
        if let Some(sv) = sv {
            sv.sock.rx.set();
        }
    }
}

/// Offer heavy psock `p`'s next messages to this worker's lane
/// (`crate::lane`). Those older than the move that still wait for this
/// worker go there too when it takes them, so with one taker per lane its
/// replies keep their order.
pub(crate) fn to_lane(sh: &Shared, bufs: &mut ServeBufs, p: PsockId) {
    if bufs.heavy.mark(p) {
        bufs.slow_hits.remove(&p);
        sh.lane_moves.fetch_add(1, Ordering::Relaxed);
    }
}

/// Queue the verdicts the lanes posted to this worker (replies, closes) as
/// if it had run the handler itself, and settle those requests.
pub(crate) fn take_done(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
) {
    let inbox = &sv.lanes.inboxes[sv.index];
    if !inbox.pending() {
        return;
    }
    let mut done = std::mem::take(&mut bufs.done);
    inbox.take_all(&mut done);
    // The lane posts quietly as long as what it posted last was: a lane
    // that caught up posts loudly again, and the worker's sleeps need no
    // bound (it may be woken too often by others to see one run out).
    if !done.is_empty() {
        bufs.lane_quiet = done.iter().any(|d| d.quiet);
    }
    for d in done.drain(..) {
        if bufs.heavy.answered(d.psock, d.short, d.len) {
            sh.lane_returns.fetch_add(1, Ordering::Relaxed);
        }
        bufs.handled(d.psock, 1);
        if !bufs.closed.is_empty() && bufs.closed.contains(&d.psock) {
            continue;
        }
        bufs.push(d.psock, d.verdict);
    }
    bufs.done = done;
    send_outs(sh, sv, bufs, events, dirty, Write::Queue);
}

#[cfg(test)]
mod tests {
    use super::{Limits, ServeBufs, LIGHT_SLEEPS, SUSPECT_RUNS, TIME_EVERY};
    use connmux_core::mux::PsockId;

    /// About one in `TIME_EVERY` of `n` runs (the generator is seeded: the
    /// count is the same every time).
    fn about_one_in_four(timed: usize, n: usize) -> bool {
        let want = n / usize::from(TIME_EVERY);
        timed.abs_diff(want) <= want / 8
    }

    #[test]
    fn one_light_run_in_four_is_timed_and_every_run_while_one_looks_slow() {
        let mut b = ServeBufs::new(&crate::Tuning::default());
        let timed = |b: &mut ServeBufs, n: usize| (0..n).filter(|_| b.time_run()).count();
        let first = (1..=8).find(|_| b.time_run());
        assert_eq!(first, Some(usize::from(TIME_EVERY)), "the first timed run");
        let t = timed(&mut b, 4096);
        assert!(about_one_in_four(t, 4096), "{t} of 4096 timed");
        let p = PsockId { index: 1, generation: 1 };
        let slow = b.limits.slow_handler_ns;
        assert!(b.note_time(p, slow, 1), "a run at the threshold is slow");
        assert_eq!(timed(&mut b, 100), 100, "every run timed while a connection looks slow");
        assert!(!b.note_time(p, 0, 1), "a fast run of it clears it");
        let t = timed(&mut b, 4096);
        assert!(about_one_in_four(t, 4096), "{t} of 4096 timed again");
        // A suspect never seen again (closed) is forgotten after SUSPECT_RUNS.
        b.note_time(p, slow, 1);
        assert_eq!(timed(&mut b, usize::from(SUSPECT_RUNS)), usize::from(SUSPECT_RUNS));
        let t = timed(&mut b, 4096);
        assert!(about_one_in_four(t, 4096), "{t} of 4096 timed after");
    }

    /// A run is slow for one long request or for many medium ones that
    /// hold the worker as long; many light ones never are.
    #[test]
    fn a_busy_run_of_medium_requests_counts_as_slow_and_a_run_of_light_ones_does_not() {
        let l = Limits::default();
        let (slow, busy) = (l.slow_handler_ns, l.busy_handler_ns);
        assert!(busy < slow, "the defaults: a busy request is shorter than a slow one");
        assert!(l.slow(slow, 1), "one long request");
        assert!(!l.slow(busy, 1), "one medium request alone");
        let fill = usize::try_from(slow.div_ceil(busy)).unwrap();
        assert!(l.slow(busy, fill), "medium requests holding the worker {slow} ns in all");
        assert!(!l.slow(busy, fill - 1), "medium requests holding it less");
        assert!(!l.slow(busy - 1, 10_000), "requests under busy_handler, however many");
    }

    /// A worker counts as serving light connections for `LIGHT_SLEEPS`
    /// sleeps after a run answered in place, then not, until the next one.
    #[test]
    fn light_lately_lasts_a_few_sleeps_after_a_run_in_place() {
        let mut b = ServeBufs::new(&crate::Tuning::default());
        assert!(!b.light_lately(), "nothing answered in place yet");
        b.light_sleeps = LIGHT_SLEEPS; // a run answered in place
        let light = (0..2 * usize::from(LIGHT_SLEEPS)).filter(|_| b.light_lately()).count();
        assert_eq!(light, usize::from(LIGHT_SLEEPS));
        b.light_sleeps = LIGHT_SLEEPS; // another
        assert!(b.light_lately(), "a run since: light again");
    }

    /// Two heavy connections served in turn, each run slow by the clock:
    /// both are put on probation and found heavy by their next runs' CPU
    /// time. (With one probation at a time, each slow run of the other
    /// took it over before the first's next run: neither was ever found
    /// heavy.)
    #[test]
    fn heavy_connections_served_in_turn_are_each_found_heavy() {
        let mut b = ServeBufs::new(&crate::Tuning { slow_handler: std::time::Duration::ZERO, ..Default::default() });
        let ps = [PsockId { index: 1, generation: 1 }, PsockId { index: 2, generation: 1 }];
        let mut heavy = Vec::new();
        for i in 0..40 {
            let p = ps[i % 2];
            let cpu0 = b.probe_start(p);
            b.probe_end(p, cpu0, 1);
            if let Some(h) = b.slow.take() {
                heavy.push(h);
            }
            b.note_time(p, 1, 1);
        }
        heavy.dedup();
        assert!(ps.iter().all(|p| heavy.contains(p)), "found heavy: {heavy:?}");
    }

    /// Connections served in turn, from 2 to twice `TIME_EVERY`: each one's
    /// runs are timed, about one in `TIME_EVERY` of them, and none waits
    /// long for its next. (By a fixed count, with four in turn only the
    /// fourth was ever timed: `[0, 0, 0, 4096]`.)
    #[test]
    fn connections_served_in_turn_are_each_timed() {
        for conns in 2..=2 * usize::from(TIME_EVERY) {
            let mut b = ServeBufs::new(&crate::Tuning::default());
            let mut timed = vec![0usize; conns];
            let mut last = vec![0usize; conns];
            let mut longest = 0;
            for i in 0..conns * 4096 {
                if b.time_run() {
                    let c = i % conns;
                    timed[c] += 1;
                    longest = longest.max(i - last[c]);
                    last[c] = i;
                }
            }
            assert!(timed.iter().all(|&t| about_one_in_four(t, 4096)), "{conns} in turn: {timed:?}");
            // Each is timed within a few rounds of the last: never left out
            // for long, whatever the order.
            assert!(longest < 64 * conns, "{conns} in turn: {longest} runs between two timed runs of one");
        }
    }
}
