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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use connmux_core::mux::Event;

use crate::serve::{LentOut, ServeBufs, Serving};
use crate::shared::tls::{Decrypted, PsockTls};
use crate::shared::{Command, Ctx, PsockRt, Shared, SockRt, WorkerRef};

/// Rounds of dispatch, serve and flush a worker runs per pass before it
/// goes back to its epoll or ring: what one round's work makes ready
/// (events, connections with bytes to write) is handled in the same pass,
/// and the bound keeps a worker that always finds more from never reaping
/// its completions (what remains goes to the next pass, whose wait does not
/// sleep).
const RING_ROUNDS: usize = 64;

/// How long a busy worker may keep what its lent psocks did (messages,
/// bytes, their idle clock) before telling the core, in a hold of the core
/// lock. A worker that did nothing else in a pass skips that hold until
/// then: at one request per pass the hold is a large share of the pass
/// (`docs/history/performance-log.md`, "Leases: a quiet connection served
/// with no shared lock"). A worker that goes to sleep keeps
/// them too (a served request takes no hold of the core lock): a reader of
/// the statistics asks every worker holding leases to tell them first
/// (`Shared::tell_untold`). With an idle timeout the worker tells before it
/// sleeps instead, and an idle timeout shorter than 16 times this shortens
/// it to a sixteenth of the timeout.
const LEASE_SYNC: Duration = Duration::from_millis(1);

/// What a worker's pass hands between the loop and its driver.
pub(crate) struct Worker<'a> {
    pub sh: &'a Shared,
    /// The handler this worker runs in place, once a service asked it to.
    pub serving: Option<Serving>,
    /// Its serving buffers, with its own hand-off state (`bufs.own`).
    pub bufs: ServeBufs,
    /// Core events not yet dispatched.
    pub events: Vec<Event>,
    /// Psocks to write before the pass ends.
    pub dirty: Vec<Arc<PsockRt>>,
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
    /// Everything the wait reported was a read of a psock lent to this
    /// worker, served with no hold of the core lock (and each lease is
    /// still here): nothing of the core changed, so the pass's hold may
    /// wait (`Own::hold_can_wait`). `Own::read_at` is then the latest
    /// clock reading.
    pub leased_only: bool,
}

/// A driver: the I/O of one worker thread.
pub(crate) trait Io {
    /// Wait for I/O, at most `timeout` (`None`: until something comes),
    /// and act on what it reports: bytes
    /// read are fed to the core, a write's result reaches it
    /// (`shared::ReadEnd`, `shared::Wrote`). Replies of lent reads it
    /// leaves for later (`ServeBufs::deferred`) the loop writes as soon as
    /// it returns ([`wait`]).
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

    /// Whether this driver serves psocks lent to its worker
    /// (`Tuning::lease`, `Own::leases`): it reads them itself (and
    /// decrypts a TLS psock's reads, `shared::tls::decrypt_read`).
    fn leases(&self) -> bool {
        false
    }
}

/// Run worker `index` until the mux stops.
pub(crate) fn run(sh: &Shared, index: usize, io: &mut impl Io) {
    let me = &sh.workers[index];
    let mut w = Worker { sh, serving: None, bufs: ServeBufs::new(&sh.tuning), events: Vec::new(), dirty: Vec::new() };
    // Readers of the statistics waiting for this pass's hold (`Command::Tell`).
    let mut tells: Vec<std::sync::mpsc::Sender<()>> = Vec::new();

    // The earliest assembly deadline as of the end of the last pass. Deadlines
    // start only when this worker feeds its own psocks (in the pass), so the
    // value read at the end of a pass is still right when the next one waits.
    let (mut next_deadline, idle) = {
        let core = sh.lock();
        (core.mux.poll_timeout(), core.mux.config().idle_timeout)
    };
    // How long the leases' counts may wait (`LEASE_SYNC`): never so long
    // that untold activity could look like idleness.
    let sync_every = idle.map_or(LEASE_SYNC, |d| LEASE_SYNC.min(d / 16));
    let sync_every_ns = sync_every.as_nanos() as u64;
    // Without an idle timeout nothing but a reader of the statistics needs
    // what the leases did: the worker sleeps with it untold, and such a
    // reader asks (`Shared::tell_untold`). With one, it tells before it
    // sleeps: the core's idle clock must not lag behind.
    let tell_on_request = idle.is_none();
    // Worker 0 keeps the mux's time: it never sleeps longer than a second
    // (`wait_timeout`).
    let keeper = index == 0;
    let _ = me.thread.set(std::thread::current().id());
    let mut look = Look::default();
    let mut slice = LaneSlice::default();
    while !sh.stop.load(Ordering::Acquire) {
        let timeout = wait_timeout(sh, &w, due(next_deadline, &w), keeper);
        let woke = if w.bufs.own.lease_used.is_empty() || timeout == Some(Duration::ZERO) || tell_on_request {
            wait(io, &mut w, timeout)
        } else {
            // Lease counts untold, and an idle timeout: never asleep with
            // them (a busy worker tells them every `LEASE_SYNC`, an
            // idle one before it sleeps). A look without sleeping first,
            // while such looks find work; otherwise they are told at once,
            // then the worker sleeps.
            let woke = match look.now() {
                true => wait(io, &mut w, Some(Duration::ZERO)),
                false => Woke::default(),
            };
            look.found(woke.reported);
            match woke.reported {
                true => woke,
                false => {
                    hold(sh, me, &mut w, &mut next_deadline);
                    let timeout = wait_timeout(sh, &w, due(next_deadline, &w), keeper);
                    wait(io, &mut w, timeout)
                }
            }
        };
        io.serve_framed(&mut w);
        let mut serve_ready = woke.serve_ready;
        if woke.commands {
            // Drain the eventfd before taking the commands, so a command
            // posted in between leaves it readable for the next wait rather
            // than being slept through.
            let _ = me.waker.drain();
            // (Lowered after the drain: a wake between the two leaves the
            // eventfd readable, which costs a pass; lowered before, a wake
            // in between would leave the flag up with nothing behind it.
            // The commands are taken after both.)
            me.woken.store(false, Ordering::SeqCst);
            let cmds: Vec<Command> = std::mem::take(&mut *me.commands.lock().unwrap());
            for c in cmds {
                match c {
                    Command::Serve { sock, handler, stats, lanes, index } => {
                        io.watch_serve(&sock);
                        w.bufs.own.serve = Some((sock.id, crate::serve::SERVE_BATCH));
                        w.bufs.own.can_lease = sh.tuning.lease && io.leases();
                        w.serving = Some(Serving { sock, handler, stats, lanes, index });
                        serve_ready = true;
                        me.serving.store(true, Ordering::Release);
                    }
                    // The pass's hold below tells (a command wake never
                    // skips it), then the reader is answered.
                    Command::Tell(answer) => tells.push(answer),
                    Command::Unlease(p) => w.bufs.own.give_back(sh, p, connmux_sys::clock::now_nanos(), &mut w.events),
                    c => io.command(&mut w, c),
                }
            }
            io.serve_framed(&mut w);
        }
        // The worker's own state (writes made whole, leases), then the
        // deadlines (assembly timeouts): one hold. Skipped by a pass that
        // only served its leases, when what they did may wait and no
        // deadline is due: deadlines start only when this worker feeds the
        // core, which such a pass did not.
        let quiet = woke.leased_only
            && !woke.commands
            && due(next_deadline, &w).is_none_or(|t| t > sh.timestamp(w.bufs.own.read_at))
            && w.bufs.own.hold_can_wait(w.bufs.own.read_at, sync_every_ns);
        if !quiet {
            hold(sh, me, &mut w, &mut next_deadline);
        }
        for answer in tells.drain(..) {
            let _ = answer.send(());
        }
        // Dispatch, serve in place, write: until nothing is left to do here
        // (bounded; what remains is picked up by the next pass).
        for round in 0..RING_ROUNDS {
            if !w.events.is_empty() {
                sh.dispatch(&mut w.events, &mut Ctx::Worker(&mut w.dirty, &mut w.bufs.own));
            }
            if let (0, Some(sv)) = (round, &w.serving) {
                // (A command may have read messages for our socket in a
                // pass with no read: `Own::has_direct`.)
                crate::serve::pass(sh, sv, &mut w.bufs, &mut w.events, &mut w.dirty, serve_ready);
            }
            // (Looked at first: an empty flush still costs a few dozen
            // instructions, every pass.)
            if w.dirty.is_empty() && w.events.is_empty() {
                break;
            }
            io.flush(&mut w);
        }
        crate::serve::end_pass(w.serving.as_ref(), &mut w.bufs);
        io.end_pass(&mut w);
        slice.follow(sh.lane_worker_slice, w.bufs.lane_offers());
    }
    // What the leases did since the last hold reaches the statistics before
    // the worker ends (nothing more is lent).
    w.bufs.own.lease_try.clear();
    let now = sh.now();
    w.bufs.hold(&mut sh.lock(), now);
    me.held(false);
    for answer in tells.drain(..) {
        let _ = answer.send(());
    }
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

/// The driver's wait, then the replies its lent reads left for later
/// (`serve::flush_deferred`: the io_uring driver writes a psock's reads in
/// a row with one `sendto`), written here in the loop's own frame rather
/// than at the end of the driver's pass over its completions. Why: the
/// write wakes the client, which often runs before the write returns, and
/// after a context switch every return through a frame made before it is
/// mispredicted (~12 ns each on the 2-CPU VM of `docs/performance.md`):
/// from here that is the system call's wrapper alone, from the driver it
/// was three frames more.
#[inline(always)]
fn wait(io: &mut impl Io, w: &mut Worker<'_>, timeout: Option<Duration>) -> Woke {
    let lane = w.bufs.lane_out() && timeout != Some(Duration::ZERO);
    let timeout = match lane {
        true => lane_sleep(w, timeout),
        false => timeout,
    };
    let mut woke = io.wait(w, timeout);
    if lane {
        lane_awake(w, &woke);
    }
    if w.bufs.deferred.is_some() {
        flush_deferred(w, &mut woke);
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

/// Write the replies lent reads left for later (`serve::flush_deferred`):
/// after the wait ([`wait`]), and in the io_uring driver before a
/// completion that is not the next read of their psock. A write that runs
/// short gives its lease back, which the pass's hold must then see
/// (`Woke::leased_only`).
#[inline(always)]
pub(crate) fn flush_deferred(w: &mut Worker<'_>, woke: &mut Woke) {
    let lent = w.bufs.own.leases.len();
    crate::serve::flush_deferred(w.sh, &mut w.bufs, &mut w.events);
    woke.leased_only &= w.bufs.own.leases.len() == lent;
}

/// Whether a worker about to sleep with lease counts untold first looks for
/// I/O without sleeping: that look is a system call, worth it while it finds
/// work (the counts then wait for a later hold), wasted when the peer waits
/// for this worker's replies before it sends again (a client with its
/// requests in flight, answered in one write): there every sleep would pay
/// it. So after a look that finds nothing the worker holds at once, and
/// looks again only every `LOOK_EVERY`th time.
#[derive(Default)]
struct Look {
    /// Sleeps since the last look; `None` while looks find work.
    skipped: Option<u8>,
}

const LOOK_EVERY: u8 = 16;

impl Look {
    fn now(&mut self) -> bool {
        match &mut self.skipped {
            None => true,
            Some(n) => {
                *n += 1;
                *n >= LOOK_EVERY
            }
        }
    }

    /// What the pass's look (or the skip of it) found.
    fn found(&mut self, work: bool) {
        match (work, &self.skipped) {
            (true, _) => self.skipped = None,
            (false, Some(n)) if *n < LOOK_EVERY => {}
            (false, _) => self.skipped = Some(0),
        }
    }
}

/// The earliest deadline the worker keeps: the core's assembly deadlines
/// as of its last hold (`next`), and those of messages its leases keep
/// (`Own::keep`, started without a hold).
#[inline]
fn due(next: Option<connmux_core::Timestamp>, w: &Worker<'_>) -> Option<connmux_core::Timestamp> {
    match (next, w.bufs.own.keep.due) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
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

/// The worker's hold of the core lock: its own state (writes made whole,
/// lease counts, new leases), then the deadlines (assembly timeouts),
/// expired ones handled; `next_deadline` is the earliest left.
fn hold(sh: &Shared, me: &WorkerRef, w: &mut Worker<'_>, next_deadline: &mut Option<connmux_core::Timestamp>) {
    let at = connmux_sys::clock::now_nanos();
    let now = sh.timestamp(at);
    w.bufs.own.synced_at = at;
    let mut core = sh.lock();
    w.bufs.hold(&mut core, now);
    core.drain_events(&mut w.events);
    *next_deadline = core.mux.poll_timeout();
    if let Some(t) = *next_deadline {
        if t <= now {
            core.mux.handle_timeout(now);
            core.drain_events(&mut w.events);
            *next_deadline = core.mux.poll_timeout();
        }
    }
    drop(core);
    me.held(!w.bufs.own.leases.is_empty());
}

/// A read of `rt` that would go the core's way, on either driver: the psock
/// lent to this serving worker first if it may be
/// (`ServeBufs::lend_before_read`), under `core`, the hold that read takes
/// anyway. `true`: lent, and the read is to be served on the lease.
pub(crate) fn lend_before_read(w: &mut Worker<'_>, core: &mut crate::shared::Core, rt: &Arc<PsockRt>) -> bool {
    let Some(sv) = w.serving.as_ref() else { return false };
    let lent = w.bufs.lend_before_read(core, rt, &w.sh.workers[sv.index]);
    if lent {
        core.drain_events(&mut w.events);
    }
    lent
}

/// The bytes of one read of `rt`, read at `read_at`, to the core; on a
/// serving worker, the whole messages for its own socket served at once,
/// where they lie in `data`.
pub(crate) fn feed_bytes(w: &mut Worker<'_>, rt: &Arc<PsockRt>, data: &[u8], read_at: u64) {
    let sh = w.sh;
    let now = sh.timestamp(read_at);
    let mut core = sh.lock();
    match &w.serving {
        Some(sv) => {
            let bufs = &mut w.bufs;
            let mut runs = std::mem::take(&mut bufs.runs);
            runs.clear();
            let _ = crate::shared::feed_read_in_place(&mut core, &mut bufs.own, rt.id, data, now, &mut runs);
            core.drain_events(&mut w.events);
            drop(core);
            if !runs.is_empty() {
                // Its replies are written at once (`send_outs`).
                let (events, dirty) = (&mut w.events, &mut w.dirty);
                let msgs = connmux_core::run::Messages::new(data, &runs);
                let read = crate::serve::ReadView { msgs, psock: rt.id, started: read_at };
                crate::serve::serve_in_place(sh, sv, bufs, read, events, dirty, Some(rt));
                runs.clear();
            } else if rt.tls.is_none() {
                // The stream took the read (it holds a message begun, which
                // frames nothing in place): a stream of messages that reads
                // cut would never be lent otherwise. Lent at the pass's
                // hold with that start, if quiet then.
                bufs.try_lease(rt);
            }
            bufs.runs = runs;
        }
        None => {
            let _ = crate::shared::feed_read(&mut core, &mut w.bufs.own, rt.id, data, now);
            core.drain_events(&mut w.events);
        }
    }
}

/// The plaintext of one read of TLS psock `rt`, which its driver read and
/// decrypted in this worker (`d`: how its records went), read at `read_at`.
/// Both drivers end a TLS read here. On the psock's lease (`leased`), when
/// the records were all whole: served there, its replies made into records
/// and written with no core lock (true is returned). Otherwise the lease
/// (if any) goes back and the plaintext goes to the core as a plain read's
/// bytes ([`feed_bytes`]: whole messages for this worker's socket served at
/// once). What `d` leaves (records cut short, a failure) stays with the
/// driver, which holds the bytes.
pub(crate) fn tls_plaintext(
    w: &mut Worker<'_>,
    rt: &Arc<PsockRt>,
    tls: &Mutex<PsockTls>,
    leased: bool,
    d: &Decrypted,
    plain: &[u8],
    read_at: u64,
) -> bool {
    if leased {
        if let (Decrypted::Whole, Some(sv)) = (d, w.serving.as_ref()) {
            if plain.is_empty() {
                return true; // records with no messages (a session ticket)
            }
            let (events, dirty, out) = (&mut w.events, &mut w.dirty, LentOut::Tls(rt, tls));
            let served = crate::serve::serve_leased(w.sh, sv, &mut w.bufs, plain, rt.id, out, read_at, events, dirty);
            let from = match served {
                Ok(()) => return true,
                Err(g) => g.from,
            };
            // The lease went back: the plaintext (what it did not keep) to
            // the core.
            if from < plain.len() {
                feed_bytes(w, rt, &plain[from..], read_at);
            }
            return false;
        }
        w.bufs.own.give_back(w.sh, rt.id, read_at, &mut w.events);
    }
    if !plain.is_empty() {
        feed_bytes(w, rt, plain, read_at);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::{Look, LOOK_EVERY};

    #[test]
    fn a_look_that_finds_nothing_is_taken_again_only_every_sixteenth_sleep() {
        let mut look = Look::default();
        assert!(look.now(), "looks at first");
        look.found(false);
        for _ in 1..LOOK_EVERY {
            assert!(!look.now());
            look.found(false);
        }
        assert!(look.now(), "the sixteenth sleep looks again");
        look.found(true);
        assert!(look.now() && look.now(), "and keeps looking while looks find work");
        look.found(false);
        assert!(!look.now());
    }
}
