//! The worker loop, once for both drivers: one thread, the psocks attached
//! to it, and the order of a pass. The drivers (`epoll`, `uring`) implement
//! [`Io`] with only what is theirs: how a wait learns of readable psocks and
//! reads them (readiness and `read` into the worker's buffer, or receive
//! completions into the ring's provided buffers), and how a write goes out
//! (`writev` at once, or a ring send submitted with the next wait).
//!
//! A pass: wait (no longer than the earliest assembly deadline); the reads
//! the wait brought, fed to the core (the messages a read framed for this
//! worker's own socket served in place); the commands other threads posted,
//! if the waker fired; expired assembly deadlines; then rounds of event
//! dispatch, serving (`serve::pass`, first round) and writing the psocks
//! with something to send, until a round leaves nothing to do.
//!
//! Must not name the public `Mux` or anything above it; serving is
//! `crate::serve`, the core's runtime side `crate::shared`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use connmux_core::mux::{Event, FramedAlone, Owned};

use crate::serve::{ServeBufs, Serving};
use crate::shared::{Command, Ctx, Promise, PsockRt, Shared, SockRt, WorkerRef};

/// Rounds of dispatch, serve and flush a worker runs per pass before it
/// goes back to its epoll or ring: what one round's work makes ready
/// (events, connections with bytes to write) is handled in the same pass,
/// and the bound keeps a worker that always finds more from never reaping
/// its completions (what remains goes to the next pass, whose wait does not
/// sleep).
const RING_ROUNDS: usize = 64;

/// What a worker owns between passes: what it serves, its serving
/// buffers, events not yet dispatched, psocks to write, its psocks'
/// receive sides. A pass borrows it in place ([`WorkerState::worker`]).
pub(crate) struct WorkerState {
    serving: Option<Serving>,
    bufs: ServeBufs,
    events: Vec<Event>,
    dirty: Vec<Arc<PsockRt>>,
    owned: Owned,
}

impl WorkerState {
    /// Worker `index` of `sh` (or slot) with empty buffers and no
    /// psocks, serving nothing yet.
    pub(crate) fn new(sh: &Shared, index: usize) -> WorkerState {
        let mut bufs = ServeBufs::new(&sh.tuning);
        bufs.own.owner = index as u32;
        WorkerState { serving: None, bufs, events: Vec::new(), dirty: Vec::new(), owned: Owned::new(index as u32) }
    }

    /// The worker for one pass (or call), borrowing this state.
    pub(crate) fn worker<'a>(&'a mut self, sh: &'a Shared) -> Worker<'a> {
        let WorkerState { serving, bufs, events, dirty, owned } = self;
        Worker { sh, serving, bufs, events, dirty, owned }
    }

    /// Its own hand-off state (a stand-alone slot's socket reads it).
    pub(crate) fn own(&mut self) -> &mut crate::shared::Own {
        &mut self.bufs.own
    }

    /// The socket whose thread reads its psocks now (`Owned::set_reader`).
    pub(crate) fn set_reader(&mut self, sock: Option<connmux_core::mux::SockId>) {
        self.bufs.own.led = sock;
        self.owned.set_reader(sock);
    }
}

/// What a worker's pass hands between the loop and its driver: its
/// [`WorkerState`], borrowed.
pub(crate) struct Worker<'a> {
    pub sh: &'a Shared,
    /// The handler this worker runs in place, once a service asked it to.
    pub serving: &'a mut Option<Serving>,
    /// Its serving buffers, with its own hand-off state (`bufs.own`).
    pub bufs: &'a mut ServeBufs,
    /// Core events not yet dispatched.
    pub events: &'a mut Vec<Event>,
    /// Psocks to write before the pass ends.
    pub dirty: &'a mut Vec<Arc<PsockRt>>,
    /// The receive sides of its psocks: its alone (other threads reach
    /// them through what the hub tells it, `Event::Wake`).
    pub owned: &'a mut Owned,
}

/// What a wait found besides reads and writes.
#[derive(Default)]
pub(crate) struct Woke {
    /// The waker fired: commands may wait.
    pub commands: bool,
    /// The serving socket's queue is readable.
    pub serve_ready: bool,
    /// The wait reported anything at all.
    pub reported: bool,
}

/// A driver: the I/O of one worker thread.
pub(crate) trait Io {
    /// Wait for I/O, at most `timeout` (`None`: until something comes),
    /// and act on what it reports: bytes
    /// read are fed to the core, a write's result reaches it
    /// (`shared::ReadEnd`, `shared::Wrote`).
    fn wait(&mut self, w: &mut Worker<'_>, timeout: Option<Duration>) -> Woke;

    /// Serve the messages reads framed in place in buffers the driver must
    /// get back (after `wait`, and after the commands). A driver that reads
    /// into one buffer of its own serves each read's messages at once, and
    /// has nothing to do here.
    fn serve_framed(&mut self, _w: &mut Worker<'_>) {}

    /// The worker now serves `sock`: watch its readiness.
    fn watch_serve(&mut self, sock: &SockRt);

    /// A command from another thread (`Serve` is the loop's).
    fn command(&mut self, w: &mut Worker<'_>, c: Command);

    /// Write the psocks in `w.dirty` (and empty it).
    fn flush(&mut self, w: &mut Worker<'_>);

    /// The pass is over: what the driver does before the next wait.
    fn end_pass(&mut self, _w: &mut Worker<'_>) {}
}

/// What a worker keeps from one pass to the next besides its [`Worker`].
pub(crate) struct Passes {
    /// The earliest assembly deadline as of the end of the last pass.
    /// Deadlines start only when this worker feeds its own psocks (in the
    /// pass), so the value read at the end of a pass is still right when
    /// the next one waits.
    next_deadline: Option<connmux_core::Timestamp>,
    slice: LaneSlice,
}

impl Passes {
    pub(crate) fn new() -> Passes {
        // (Its first pass's hold reads its deadlines.)
        Passes { next_deadline: None, slice: LaneSlice::default() }
    }

    /// How long the next pass's wait may sleep ([`wait_timeout`]).
    pub(crate) fn timeout(&self, w: &Worker<'_>, keeper: bool) -> Option<Duration> {
        wait_timeout(w.sh, w, self.next_deadline, keeper)
    }
}

impl Worker<'_> {
    /// Before the worker goes away: the writes it made whole since its last
    /// hold reach the core.
    pub(crate) fn end(&mut self) {
        self.bufs.own.hold(&mut self.sh.lock());
    }
}

/// Run worker `index` until the mux stops.
pub(crate) fn run(sh: &Shared, index: usize, io: &mut impl Io) {
    let me = &sh.workers[index];
    let mut state = WorkerState::new(sh, index);
    let mut w = state.worker(sh);
    let mut passes = Passes::new();
    // Worker 0 keeps the mux's time: it never sleeps longer than a second
    // (`wait_timeout`).
    let keeper = index == 0;
    while !sh.stop.load(Ordering::Acquire) {
        let timeout = passes.timeout(&w, keeper);
        pass(me, io, &mut w, &mut passes, timeout);
    }
    w.end();
}

/// One pass of worker `me` (its handles), its wait at most `timeout`: the
/// wait and the reads it brought, the commands, the hold, then rounds of
/// dispatch, serving and writing. A worker thread runs passes until the
/// mux stops; a stand-alone socket's `recv` runs its slot's while nothing
/// is queued for it.
#[inline(always)]
pub(crate) fn pass(
    me: &WorkerRef,
    io: &mut impl Io,
    w: &mut Worker<'_>,
    passes: &mut Passes,
    timeout: Option<Duration>,
) {
    let sh = w.sh;
    // A promise to look at the commands made at the end of the last pass
    // (`promise`): a worker's wait keeps it for at most `CORK_WAIT`, then
    // it ends; a stand-alone slot's ends before its wait, which may be long.
    let promised = w.bufs.own.promise;
    let (timeout, mut looked) = match promised {
        Promise::Nothing => (timeout, false),
        _ => before_wait(me, w, timeout),
    };
    let woke = wait(io, w, timeout);
    if promised != Promise::Nothing {
        looked |= after_wait(me, w);
    }
    io.serve_framed(w);
    let mut serve_ready = woke.serve_ready;
    if woke.commands || looked {
        // Drain the eventfd before taking the commands, so a command
        // posted in between leaves it readable for the next wait rather
        // than being slept through (`sync::inbox`: a post after the take
        // wakes it again).
        if woke.commands {
            let _ = me.waker.drain();
        }
        let mut cmds = Vec::new();
        me.commands.take_all(&mut cmds);
        for c in cmds {
            match c {
                Command::Told => w.bufs.own.told = true,
                // (Any worker: the sends may be to any worker's psocks.)
                Command::WriteOuts(sock) => sh.write_outs_asked(&sock),
                Command::Serve { sock, handler, stats, lanes, index } => {
                    io.watch_serve(&sock);
                    w.bufs.own.serve = Some((sock.id, crate::serve::SERVE_BATCH));
                    w.bufs.own.alone_tag = alone_tag(sh, &sock);
                    *w.serving = Some(Serving { sock, handler, stats, lanes, index });
                    serve_ready = true;
                    me.serving.store(true, Ordering::Release);
                }
                c => io.command(w, c),
            }
        }
        io.serve_framed(w);
    }
    // The worker's own state (writes made whole), then the deadlines
    // (assembly timeouts): one hold.
    hold(sh, w, &mut passes.next_deadline);
    // Dispatch, serve in place, write: until nothing is left to do here
    // (bounded; what remains is picked up by the next pass).
    for round in 0..RING_ROUNDS {
        if !w.events.is_empty() {
            sh.dispatch(w.events, &mut Ctx::Worker(w.dirty, &mut w.bufs.own));
        }
        if let (0, Some(sv)) = (round, &w.serving) {
            // (A command may have read messages for our socket in a
            // pass with no read: `Own::has_direct`.)
            crate::serve::pass(sh, sv, w.bufs, w.events, w.dirty, serve_ready);
        }
        if w.bufs.own.told {
            // A call of its own told its psocks (a write ended, a message
            // was taken): applied now, not at the next pass.
            apply_told(w);
        }
        // (Looked at first: an empty flush still costs a few dozen
        // instructions, every pass.)
        if w.dirty.is_empty() && w.events.is_empty() {
            break;
        }
        io.flush(w);
    }
    crate::serve::end_pass(w.serving.as_ref(), w.bufs);
    // (A worker that serves nothing hands what it reads to application
    // threads. One that serves a `Service` hands its spill-over to other
    // workers, which cork nothing: it promises nothing and pays nothing.)
    if w.serving.is_none() {
        promise(me, w, woke.reported);
    }
    io.end_pass(w);
    passes.slice.follow(sh.lane_worker_slice, w.bufs.lane_offers());
}

/// The longest a corked reply waits for its worker when the application
/// thread that corked it does not call again (`Shared::send_out`): a worker
/// that serves nothing promises, after a pass that read anything, to look
/// at its commands within this long (`Inbox::look_soon`), so that those
/// threads' corks need not wake it (`WorkerRef::command_lazy`). In
/// `bench kcm` (8 × 16, 2 threads) a wake-up of the worker a batch, for
/// replies the thread wrote itself a moment later, cost 8% of the
/// messages (paired runs, median). A worker that made no promise pays
/// nothing for it.
const CORK_WAIT: Duration = Duration::from_millis(1);

/// The end of a pass of a worker that serves nothing (or of a stand-alone
/// slot). A worker whose pass read anything handed it to application
/// threads: it promises to look at the commands within [`CORK_WAIT`], so
/// that their corked replies' asks need not wake it. A stand-alone slot
/// promises to look first thing in its next pass: nobody runs one until
/// its socket's thread calls again, and that thread's own asks (for the
/// replies it corked, which its next wait writes) then wake nothing; while
/// a second thread of the socket waits in the pass, an ask wakes it.
#[inline(never)]
fn promise(me: &WorkerRef, w: &mut Worker<'_>, read: bool) {
    let own = &mut w.bufs.own;
    own.promise = match (own.looks().is_some(), read) {
        (true, _) => Promise::First,
        (false, true) => Promise::Within,
        (false, false) => Promise::Nothing,
    };
    if own.promise != Promise::Nothing {
        me.commands.look_soon();
    }
}

/// Before the wait that follows a promise ([`promise`]): a worker's wait
/// sleeps at most [`CORK_WAIT`] (it looks after it); a slot looks now,
/// and does not sleep if asks wait. Returns the wait's bound and whether
/// the commands must be taken.
#[inline(never)]
fn before_wait(me: &WorkerRef, w: &mut Worker<'_>, timeout: Option<Duration>) -> (Option<Duration>, bool) {
    if w.bufs.own.promise == Promise::First {
        w.bufs.own.promise = Promise::Nothing;
        return match me.commands.look_now() {
            true => (Some(Duration::ZERO), true),
            false => (timeout, false),
        };
    }
    (Some(timeout.map_or(CORK_WAIT, |t| t.min(CORK_WAIT))), false)
}

/// After that wait: a worker's promise ends (whether asks wait).
#[inline(never)]
fn after_wait(me: &WorkerRef, w: &mut Worker<'_>) -> bool {
    std::mem::take(&mut w.bufs.own.promise) == Promise::Within && me.commands.look_now()
}

/// Passes of a worker in `Config::lane_worker_slice` slices with nothing
/// offered to its lane, after which it gives the slice back: long enough
/// that a heavy connection's pause between requests keeps it, short next to
/// a second of a busy worker's passes.
const SLICE_IDLE_PASSES: u32 = 4096;

/// Whether this worker runs in `Config::lane_worker_slice` slices (while
/// its lane has work) or the kernel's:
///
/// ```text
///            request offered to the lane (sched_setattr)
///   Kernel's ─────────────────────────────────────────► Long
///      ▲                                                  │
///      └──────────────────────────────────────────────────┘
///        SLICE_IDLE_PASSES passes with none offered (sched_setattr, 0)
/// ```
#[derive(Default)]
struct LaneSlice {
    long: bool,
    /// `Heavy::offers` at the last look.
    offers: u64,
    /// Passes since the last look, while `long`.
    passes: u32,
}

impl LaneSlice {
    /// Once a pass: ask for `slice`, or give it back, as the lane's offers
    /// (`offers`, a running count) say.
    #[inline]
    fn follow(&mut self, slice: Duration, offers: u64) {
        if !self.long {
            if offers != self.offers && !slice.is_zero() {
                self.set(slice);
            }
            self.offers = offers;
            return;
        }
        self.passes += 1;
        if self.passes < SLICE_IDLE_PASSES {
            return;
        }
        self.passes = 0;
        if offers == self.offers {
            self.set(Duration::ZERO);
        }
        self.offers = offers;
    }

    #[cold]
    fn set(&mut self, slice: Duration) {
        self.long = !slice.is_zero();
        // Best effort: a worker cut up as any thread still works. (Zero is
        // the kernel's default again.)
        let _ = connmux_sys::affinity::set_current_thread_slice(slice);
    }
}

/// The driver's wait, its sleep bounded while the lane posts quietly
/// ([`lane_sleep`]). Inlined into the loop: after the wait, which often
/// switches to the client, every return through a frame made before it is
/// mispredicted.
#[inline(always)]
fn wait(io: &mut impl Io, w: &mut Worker<'_>, timeout: Option<Duration>) -> Woke {
    let lane = w.bufs.lane_out() && timeout != Some(Duration::ZERO);
    let timeout = match lane {
        true => lane_sleep(w, timeout),
        false => timeout,
    };
    let woke = io.wait(w, timeout);
    if lane {
        lane_awake(w, &woke);
    }
    woke
}

/// A worker with requests in its lane, about to sleep at most `timeout`.
/// The lane's takers post replies quietly while it is far behind
/// (`lane::LANE_QUIET_FROM`; `lane::run`): one wake-up and one write
/// then serve several. So the worker sleeps at most `lane::LANE_REPLY_WAIT`
/// while its lane posts quietly (`ServeBufs::lane_quiet`) or a post waits;
/// otherwise with no bound, and a quiet post wakes it
/// (`Inbox::sleep_unbounded`, until [`lane_awake`]). A worker that also
/// serves light connections (`ServeBufs::light_lately`) never bounds its
/// sleep: the timer, reprogrammed on each of its many sleeps, cost its
/// light connections 15% of their calls beside a lane far behind
/// (`docs/performance.md`, "Replies of a lane that is far behind"); it
/// sleeps unbounded, or takes waiting posts at once.
#[inline(never)]
fn lane_sleep(w: &mut Worker<'_>, timeout: Option<Duration>) -> Option<Duration> {
    let bound = crate::lane::LANE_REPLY_WAIT;
    let Some(sv) = w.serving.as_ref() else { return timeout };
    let light = w.bufs.light_lately();
    let bounded = Some(timeout.map_or(bound, |t| t.min(bound)));
    if w.bufs.lane_quiet && !light {
        return bounded;
    }
    match (sv.lanes.inboxes[sv.index].sleep_unbounded(), light) {
        (true, _) => timeout,
        (false, true) => Some(Duration::ZERO),
        (false, false) => bounded,
    }
}

/// After the wait [`lane_sleep`] bounded or announced: a wait that found
/// nothing (it ran out) with nothing posted means the lane no longer posts
/// quietly (it caught up, or its requests run long), and the next sleep
/// need not be bounded.
#[inline(never)]
fn lane_awake(w: &mut Worker<'_>, woke: &Woke) {
    let Some(sv) = w.serving.as_ref() else { return };
    let inbox = &sv.lanes.inboxes[sv.index];
    inbox.awake();
    if w.bufs.lane_quiet && !woke.reported && !inbox.pending() {
        w.bufs.lane_quiet = false;
    }
}

/// How long the next wait may sleep: until the earliest deadline, or not
/// at all while events wait. Never shorter for anything else: a near timer
/// is reprogrammed on every sleep, which in a virtual machine is a trip to
/// the hypervisor.
///
/// With no deadline, the mux's time `keeper` (worker 0) sleeps at most a
/// second: a deadline that an application thread's call starts in the core
/// (an attach's idle scan, the memory budget after a release) reaches it
/// then, and its hold handles every psock's. The other workers sleep with
/// no timer, as a hand-written loop does: what another thread hands them
/// wakes them (the command queue and its eventfd, the lanes' verdicts
/// through the inbox, the serving socket's readiness, the mux's stop), and
/// a deadline another worker starts is that worker's to keep. A timer on
/// every sleep cost a light connection 2–6% of its messages a second
/// (`docs/performance.md`, "A timer on every sleep; the io_uring floor").
fn wait_timeout(
    sh: &Shared,
    w: &Worker<'_>,
    next_deadline: Option<connmux_core::Timestamp>,
    keeper: bool,
) -> Option<Duration> {
    const KEEP: Duration = Duration::from_secs(1);
    match (w.events.is_empty(), next_deadline) {
        (true, Some(t)) => {
            let now = sh.now();
            let t = Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos())) + Duration::from_micros(100);
            Some(t.min(KEEP))
        }
        (true, None) => keeper.then_some(KEEP),
        // The last pass ran out of rounds with events left (or a hold
        // raised some): look at the driver's I/O without sleeping, then go
        // on with them.
        (false, _) => Some(Duration::ZERO),
    }
}

/// The worker's hold of the hub lock: its own state (writes made whole),
/// then the deadlines (assembly timeouts),
/// expired ones handled; `next_deadline` is the earliest left.
fn hold(sh: &Shared, w: &mut Worker<'_>, next_deadline: &mut Option<connmux_core::Timestamp>) {
    let now = sh.now();
    let mut core = sh.lock();
    w.bufs.own.hold(&mut core);
    if w.bufs.own.led.is_some() {
        // (For the next pass a receiving thread leads: `Own::tags_free`.)
        w.bufs.own.tags_free = !core.mux.v().tag_taken(w.bufs.own.owner);
    }
    if std::mem::take(&mut w.bufs.own.told) {
        // With its time first: a psock attached for it starts its clocks
        // from now.
        core.mux.of(w.owned).note_now(now);
    }
    *next_deadline = core.mux.view_of(w.owned).poll_timeout();
    if let Some(t) = *next_deadline {
        if t <= now {
            core.mux.of(w.owned).handle_timeout(now);
            *next_deadline = core.mux.view_of(w.owned).poll_timeout();
        }
    }
    // Last: every call above may raise events (what it applied first too).
    core.drain_events(w.events);
}

/// The affinity tag of socket `sock`, when steering sends the messages
/// of a psock with that tag to it while its queue is empty: what a serving
/// worker frames alone (`Own::alone_tag`).
#[cold]
fn alone_tag(sh: &Shared, sock: &SockRt) -> Option<u32> {
    let core = sh.lock();
    let v = core.mux.v();
    (v.config().steering == connmux_core::mux::Steering::Affinity).then(|| v.sock_affinity(sock.id)).flatten()
}

/// What was told to the worker's psocks, applied (`Own::told`).
#[cold]
fn apply_told(w: &mut Worker<'_>) {
    w.bufs.own.told = false;
    let now = w.sh.now();
    let mut core = w.sh.lock();
    core.mux.of(w.owned).note_now(now);
    core.drain_events(w.events);
}

/// The bytes of one read of `rt`, read at `read_at`, to the core; on a
/// serving worker, the whole messages for its own socket served at once,
/// where they lie in `data`.
pub(crate) fn feed_bytes(w: &mut Worker<'_>, rt: &Arc<PsockRt>, data: &[u8], read_at: u64) {
    let sh = w.sh;
    let now = sh.timestamp(read_at);
    match &w.serving {
        Some(sv) => {
            let bufs = &mut w.bufs;
            let mut runs = std::mem::take(&mut bufs.runs);
            runs.clear();
            let framed = match bufs.own.alone_tag_for(&sv.sock, rt) {
                Some(tag) => w.owned.frame_alone(rt.id, data, now, sv.sock.id, tag, &mut runs),
                None => None,
            };
            let taken = framed.as_ref().map_or(0, FramedAlone::taken);
            match framed {
                // Every byte framed alone: no hold until the replies'.
                Some(f) if taken == data.len() => bufs.own.alone.push(f),
                framed => {
                    let mut core = sh.lock();
                    let (o, own) = (&mut w.owned, &mut bufs.own);
                    let _ = match framed {
                        Some(f) => {
                            core.mux.report_alone(f);
                            crate::shared::feed_read(&mut core, o, own, rt.id, &data[taken..], now)
                        }
                        None => crate::shared::feed_read_in_place(&mut core, o, own, rt.id, data, now, &mut runs),
                    };
                    core.drain_events(w.events);
                }
            }
            if !runs.is_empty() {
                // Its replies are written at once (`send_outs`), what it
                // framed alone counted in the same hold.
                let (events, dirty) = (&mut w.events, &mut w.dirty);
                let msgs = connmux_core::run::Messages::new(data, &runs);
                let read = crate::serve::ReadView { msgs, psock: rt.id, started: read_at };
                crate::serve::serve_in_place(sh, sv, bufs, read, events, dirty, crate::serve::Write::Now(rt));
                runs.clear();
            }
            if !bufs.own.alone.is_empty() {
                // Not counted there (its messages went to the lane).
                bufs.own.report(&mut sh.lock());
            }
            bufs.runs = runs;
        }
        None => {
            // A stand-alone slot keeps what it may frame alone for its
            // socket (`Own::frame_mine`); the hub counts it in the pass's
            // hold, or in this one with the rest of the read.
            let bufs = &mut w.bufs;
            let taken = match bufs.own.mine.is_some() {
                true => bufs.own.frame_mine(w.owned, rt, data, now, &mut bufs.runs),
                false => 0,
            };
            if taken < data.len() {
                let mut core = sh.lock();
                bufs.own.report(&mut core);
                let _ = crate::shared::feed_read(&mut core, w.owned, &mut bufs.own, rt.id, &data[taken..], now);
                core.drain_events(w.events);
            }
        }
    }
}
