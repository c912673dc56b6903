//! The io_uring driver: a worker's I/O (`worker::Io`) over one ring, the
//! psocks attached to it (a psock's receive side on the ring is
//! [`conn`]); the pass itself is `driver::worker`.
//!
//! The decisions are the core's, as with the epoll driver (`driver::epoll`); this
//! module only moves bytes:
//! - receive: one multishot receive per psock into the ring's provided buffers;
//!   each buffer is fed to the core no faster than `rx_capacity` allows. When the
//!   core takes nothing (backpressure) the rest of the buffer is held, the receive
//!   is cancelled (so the TCP window closes, as with epoll) and receiving resumes
//!   on `PsockRxResume`. A paused psock keeps no ring buffer: what it was
//!   delivered and the core has not taken is copied out to the psock's own
//!   spill buffer and the ring buffers go back at once, so one connection's
//!   pause (a peer that never reads its replies) never leaves the others
//!   without buffers to receive into. With DEFER_TASKRUN nothing is delivered
//!   between two waits, so a spill holds at most what one wait delivered (at
//!   most the ring, `Tuning::ring_buf_count` × `ring_buf_size`), and it is
//!   fed to the core before the psock's receive is armed again. While the
//!   memory budget is over its limit a receive is armed one-shot (one ring
//!   buffer), so hundreds of peers sending large messages cannot have the
//!   ring deliver far more than the budget's room in one wait.
//!   A send that finds the socket buffer full (the ring honours
//!   `O_NONBLOCK`: `-EAGAIN`) waits for a `POLLOUT` poll, never counted as
//!   a failure of the connection.
//! - transmit: a served read's replies are written at once with a plain
//!   `sendmsg` (`serve_framed`, as the epoll worker does); the psocks that
//!   still have something to write after a pass (replies queued while a
//!   send was in flight, a lane's, another thread's) get one ring `sendmsg`
//!   each (all of the core's chunk), all submitted with the next wait; the
//!   kernel completes each one whole, told to the core in the worker's
//!   next hold.
//! - other threads post [`Command`]s and notify the worker's eventfd, which the
//!   ring polls; the loop takes the commands when that poll completes.
//! - release: a psock's operations are cancelled and their completions reaped
//!   before the worker drops its handle (and so the descriptor).
//!
//! Owns the ring and its buffers. Must not name the epoll driver, the public
//! `Mux` or anything above it; serving is `crate::serve`.

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use connmux_core::mux::{Event, Owned};
use connmux_core::Bytes;
use connmux_sys::uring::{Completion, Ring, RingConfig};

use crate::config::Tuning;
use crate::driver::worker::{self, Io, Woke, Worker};
use crate::shared::{psock_token, Command, MuxHub, Own, ReadEnd, Shared, SockRt, Wrote};

mod conn;
use conn::{pump, pump_alone, pump_tls, stop_rx, Budget, Conn, Feed, Framed, Held, Recv, RxLife};

/// Token of the waker poll.
const WAKE_TOKEN: u64 = u64::MAX;
/// Token of the serving socket's readiness poll.
const SERVE_TOKEN: u64 = u64::MAX - 1;

/// The ring of a worker: the payloads of its sends are the core's `Bytes`.
type WRing = Ring<Bytes>;

/// Free provided buffers kept in the kernel's ring at least (the rest wait
/// on a stack, the most recently used given first). The kernel takes
/// buffers in the order they were given: with all 256 queued a receive
/// lands in the buffer used 256 receives ago, and a read's bytes are no
/// longer in the cache when the parser walks them. The ring deepens when a
/// receive finds it empty (that receive is submitted again) and comes back
/// down after a run of receives that used less than half of it. 4 gave NULL
/// calls at `-j8 -a128`, one worker, 1.015× the calls/s of all 256 queued
/// (`docs/history/performance-log.md`, "Framing without a chain through
/// memory; hot receive buffers"; again, 3 runs on CPU 0 alternated with
/// all queued: median 5.79 M/s against 5.12 M/s, 0.99× of the epoll
/// driver's run beside it against 0.92×).
const RING_BUF_HOT: u16 = 4;

/// Creates the worker's ring: completion work deferred to its waits where the
/// kernel can (6.1+), else the plain kind.
fn new_ring(t: &Tuning) -> io::Result<WRing> {
    let config = RingConfig {
        entries: 256,
        cq_entries: 4096,
        buf_count: t.ring_buf_count,
        buf_size: t.ring_buf_size,
        buf_hot: RING_BUF_HOT.min(t.ring_buf_count),
        defer_taskrun: true,
    };
    Ring::new_deferred(config)
}

/// A worker's ring and the psocks it drives on it.
struct UringIo {
    /// Declared first, so dropped first: dropping the ring cancels what is
    /// still in flight and waits for it, before the connections (and their
    /// descriptors) go.
    ring: WRing,
    /// Messages reads framed in place in ring buffers, served after the pass.
    framed: Framed,
    /// The memory budget as this worker's feeds and receives last saw it.
    budget: Budget,
    conns: FxHashMap<u64, Conn>,
    /// Psocks whose receive should be (re)armed when buffers allow.
    to_arm: Vec<u64>,
    /// The chunk of the send being queued (its payloads move into the ring;
    /// the vector stays, so a send allocates nothing here).
    tx_slices: Vec<Bytes>,
    /// What the last wait reaped (kept for its room).
    comps: Vec<Completion>,
    /// The worker's eventfd, polled on the ring.
    waker: RawFd,
    waker_armed: bool,
    /// The serving socket's readiness poll is on the ring.
    serve_armed: bool,
}

pub(crate) fn run(sh: Arc<Shared>, index: usize, cpu: Option<usize>, init: Sender<io::Result<()>>) {
    if let Some(cpu) = cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    let ring = match new_ring(&sh.tuning) {
        Ok(r) => {
            let _ = init.send(Ok(()));
            r
        }
        Err(e) => {
            let _ = init.send(Err(e));
            return;
        }
    };
    drop(init);
    run_ring(&sh, index, ring);
}

/// A ring for this thread's worker (`Driver::Auto`: made when the worker
/// is first asked to serve; it is entered by this thread only).
pub(crate) struct WorkerRing(WRing);

impl WorkerRing {
    pub(crate) fn new(sh: &Shared) -> io::Result<WorkerRing> {
        new_ring(&sh.tuning).map(WorkerRing)
    }

    /// Run worker `index` on it until the mux stops.
    pub(crate) fn run(self, sh: &Shared, index: usize) {
        run_ring(sh, index, self.0);
    }
}

fn run_ring(sh: &Shared, index: usize, ring: WRing) {
    let mut io = UringIo {
        ring,
        framed: Framed::default(),
        budget: Budget::Room,
        conns: FxHashMap::default(),
        to_arm: Vec::new(),
        tx_slices: Vec::new(),
        comps: Vec::with_capacity(1024),
        waker: sh.workers[index].waker.as_raw_fd(),
        waker_armed: false,
        serve_armed: false,
    };
    worker::run(sh, index, &mut io);
}

impl Io for UringIo {
    /// (Inlined into the worker loop, so that after the ring's wait, which
    /// switches to other threads, no return goes through a frame made
    /// before it but the system call's own: `worker::wait`.)
    #[inline(always)]
    fn wait(&mut self, w: &mut Worker<'_>, timeout: Option<Duration>) -> Woke {
        let ring = &mut self.ring;
        if !self.waker_armed {
            self.waker_armed = ring.poll_readable(self.waker, WAKE_TOKEN).is_ok();
        }
        // A waker that could not be armed wakes nobody: the commands are
        // taken every pass until it is.
        let mut woke = Woke { commands: !self.waker_armed, ..Woke::default() };
        if let (Some(sv), false) = (&w.serving, self.serve_armed) {
            self.serve_armed = ring.poll_readable(sv.sock.rx.polled_fd().as_raw_fd(), SERVE_TOKEN).is_ok();
        }
        // A poll that could not be armed wakes nobody: sleep briefly, and
        // arm it again after.
        let timeout = match self.waker_armed && (self.serve_armed || w.serving.is_none()) {
            true => timeout,
            false => crate::driver::unwatched_wait(timeout),
        };
        if ring.wait(1, timeout).is_err() {
            // Only a broken ring fails here; avoid spinning on it.
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut comps = std::mem::take(&mut self.comps);
        comps.clear();
        self.ring.reap(&mut comps);
        woke.reported = !comps.is_empty();
        self.completions(w, &comps, &mut woke);
        self.comps = comps;
        woke
    }

    /// Serve the messages framed in place in provided buffers, then give
    /// those buffers back to the ring.
    fn serve_framed(&mut self, w: &mut Worker<'_>) {
        let framed = &mut self.framed;
        if let Some(sv) = &w.serving {
            for &(p, buf, a, b) in &framed.batches {
                // Each read's replies are written at once with a plain
                // `sendmsg`, begun in the hold that queues them (as the epoll
                // worker does), when the psock has no ring send in flight
                // and its connection is not known to be full; else they wait
                // on its queue for that send's completion. (Ring sends of
                // every read's replies, submitted with the next wait, saved
                // system calls but answered later: on 16 CPUs 17.0 M NULL
                // calls/s against 20.8 M, on one 2.43 M against 2.57 M.)
                let rt = self
                    .conns
                    .get(&psock_token(p))
                    .filter(|c| !c.released && c.sending.is_none() && !c.out_polled)
                    .map(|c| c.rt.clone());
                let write = match &rt {
                    Some(rt) => crate::serve::Write::Now(rt),
                    None => crate::serve::Write::Queue,
                };
                let read = crate::serve::ReadView {
                    msgs: connmux_core::run::Messages::new(self.ring.buffer(buf).unwrap_or(&[]), &framed.runs[a..b]),
                    psock: p,
                    started: connmux_sys::clock::now_nanos(),
                };
                crate::serve::serve_in_place(w.sh, sv, w.bufs, read, w.events, w.dirty, write);
            }
        }
        if !w.bufs.own.alone.is_empty() {
            // Not counted in a reply's hold (their messages went to the lane).
            w.bufs.own.report(&mut w.sh.lock());
        }
        framed.batches.clear();
        framed.runs.clear();
        for buf in framed.recycle.drain(..) {
            self.ring.recycle(buf);
        }
    }

    fn watch_serve(&mut self, _sock: &SockRt) {
        // Its poll is armed before each wait while the worker serves.
        self.serve_armed = false;
    }

    fn command(&mut self, w: &mut Worker<'_>, c: Command) {
        self.run_command(w, c)
    }

    fn flush(&mut self, w: &mut Worker<'_>) {
        self.flush_dirty(w)
    }

    fn end_pass(&mut self, w: &mut Worker<'_>) {
        if self.budget == Budget::Over {
            // (`Budget`: no multishot receive runs on past the budget.)
            for (&token, conn) in self.conns.iter_mut() {
                if matches!(conn.recv, Recv::Buffers { multishot: true, cancelling: false }) {
                    conn.recv.cancel(&mut self.ring, token);
                }
            }
            self.budget = Budget::Tight;
        }
        self.arm(w.sh, w.owned, w.events)
    }
}

/// The hub lock for one wait's completions, taken at the first that needs
/// it: what reads framed alone before it is counted first (`Own::report`:
/// before any other call on their psocks).
fn hub<'a, 's>(
    core: &'a mut Option<MutexGuard<'s, MuxHub>>,
    sh: &'s Shared,
    own: &mut Own,
) -> &'a mut MutexGuard<'s, MuxHub> {
    core.get_or_insert_with(|| {
        let mut c = sh.lock();
        own.report(&mut c);
        c
    })
}

impl UringIo {
    /// Act on what the ring reports. (A call of its own: one copy, however
    /// many places the loop waits in.)
    #[inline(never)]
    fn completions(&mut self, w: &mut Worker<'_>, comps: &[Completion], woke: &mut Woke) {
        let sh = w.sh;
        let now = sh.now();
        let ring = &mut self.ring;
        let mut core = None;
        for c in comps {
            match *c {
                Completion::Poll { token: WAKE_TOKEN, .. } => {
                    self.waker_armed = false;
                    woke.commands = true;
                }
                Completion::Poll { token: SERVE_TOKEN, .. } => {
                    self.serve_armed = false;
                    woke.serve_ready = true;
                }
                Completion::Poll { token, .. } => {
                    let Some(conn) = self.conns.get_mut(&token) else { continue };
                    conn.out_polled = false;
                    if conn.released {
                        if conn.idle() {
                            self.conns.remove(&token);
                        }
                        continue;
                    }
                    // The connection takes more: the psock's queue.
                    let rt = conn.rt.clone();
                    if !rt.flush_queued.swap(true, Ordering::AcqRel) {
                        w.dirty.push(rt);
                    }
                }
                Completion::Recv { token, buf_id, more, .. } => {
                    let Some(conn) = self.conns.get_mut(&token) else {
                        ring.recycle(buf_id);
                        continue;
                    };
                    if !more {
                        conn.recv.buffers_ended();
                    }
                    if conn.released || conn.life == RxLife::Over {
                        ring.recycle(buf_id);
                    } else if conn.rt.tls.is_some() {
                        conn.held.push_back(Held { buf: buf_id, off: 0 });
                        core = None; // TLS lock before the hub lock
                        pump_tls(sh, w.owned, ring, conn, w.events, &mut self.budget);
                    } else {
                        conn.held.push_back(Held { buf: buf_id, off: 0 });
                        // Framed alone where it may (no hold of the lock
                        // yet in this wait), else fed through the hub.
                        let alone = core.is_none()
                            && w.serving.as_ref().is_some_and(|sv| {
                                pump_alone(conn, ring, &mut self.framed, w.owned, &mut w.bufs.own, &sv.sock, now)
                            });
                        if !alone {
                            let core = hub(&mut core, sh, &mut w.bufs.own);
                            let (events, framed, own, budget) =
                                (&mut w.events, &mut self.framed, &mut w.bufs.own, &mut self.budget);
                            pump(conn, &mut Feed { core, ring, now, events, framed, own, o: w.owned, budget });
                        }
                    }
                    after_recv(&mut self.conns, &mut self.to_arm, token);
                }
                Completion::RecvEnd { token, res } => {
                    let Some(conn) = self.conns.get_mut(&token) else { continue };
                    conn.recv.buffers_ended();
                    if !conn.released && conn.life != RxLife::Over {
                        if let Some(how) = ReadEnd::of_cqe(res).end() {
                            conn.life.end(how);
                        }
                        if conn.rt.tls.is_some() {
                            core = None;
                            pump_tls(sh, w.owned, ring, conn, w.events, &mut self.budget);
                        } else {
                            let core = hub(&mut core, sh, &mut w.bufs.own);
                            let (events, framed, own, budget) =
                                (&mut w.events, &mut self.framed, &mut w.bufs.own, &mut self.budget);
                            pump(conn, &mut Feed { core, ring, now, events, framed, own, o: w.owned, budget });
                        }
                    }
                    after_recv(&mut self.conns, &mut self.to_arm, token);
                }
                Completion::RecvInto { token, res } => {
                    let buf = ring.take_filled(token);
                    let Some(conn) = self.conns.get_mut(&token) else { continue };
                    let loan = conn.recv.loan_ended();
                    let core = hub(&mut core, sh, &mut w.bufs.own);
                    if let (Some(mut loan), Some(buf)) = (loan, buf) {
                        // The buffer goes back whatever happened (the core drops
                        // the bytes of a psock that stopped meanwhile).
                        *loan.buf() = buf;
                        if crate::shared::commit_read(core, w.owned, &mut w.bufs.own, loan, now).is_err()
                            && !conn.released
                        {
                            stop_rx(ring, conn, token, &mut self.framed);
                        }
                    }
                    if !conn.released && conn.life != RxLife::Over {
                        if let Some(how) = ReadEnd::of_cqe(res).end() {
                            conn.life.end(how);
                        }
                        let (events, framed, own, budget) =
                            (&mut w.events, &mut self.framed, &mut w.bufs.own, &mut self.budget);
                        pump(conn, &mut Feed { core, ring, now, events, framed, own, o: w.owned, budget });
                    }
                    after_recv(&mut self.conns, &mut self.to_arm, token);
                }
                Completion::Send { token, res } => {
                    let Some(conn) = self.conns.get_mut(&token) else { continue };
                    let want = conn.sending.take().unwrap_or(0);
                    if !conn.released && conn.rt.tls.is_some() {
                        // The core took the messages when they became records:
                        // here only the records' own progress matters.
                        let sent = conn.tls_out.take().unwrap_or_default();
                        if res == -libc::EAGAIN {
                            // The socket buffer is full (the ring honours
                            // O_NONBLOCK): the records wait for room.
                            conn.tls_out = Some(sent);
                            if wait_for_room(ring, conn, token) {
                                continue;
                            }
                        } else if res < 0 || (res == 0 && want > 0) {
                            core = None;
                            let errno = if res < 0 { -res } else { libc::EPIPE };
                            crate::shared::tls::tx_failed(sh, &conn.rt, errno, w.events);
                        } else if (res as usize) < sent.len() {
                            conn.tls_out = Some(sent.slice(res as usize..));
                        }
                        if !conn.rt.flush_queued.swap(true, Ordering::AcqRel) {
                            w.dirty.push(conn.rt.clone());
                        }
                    } else if conn.rt.tls.is_none() {
                        // (A released psock's too: the core counts a chunk
                        // that was out at the unattach by this report.)
                        // A short count (the connection failed part way) is
                        // followed by the error on the next send.
                        let wrote = Wrote::of_cqe(res, want);
                        let whole = wrote == Wrote::Bytes(want);
                        if whole {
                            // Whole: told in the worker's next hold (a
                            // read's replies', or its pass's), which raises
                            // the psock again if more was queued meanwhile.
                            w.bufs.own.wrote.push((conn.rt.clone(), want));
                        } else {
                            let core = hub(&mut core, sh, &mut w.bufs.own);
                            wrote.apply(core, conn.rt.id);
                            core.drain_events(w.events);
                        }
                        if conn.released {
                            if conn.idle() {
                                self.conns.remove(&token);
                            }
                            continue;
                        }
                        if whole {
                            continue;
                        }
                        if wrote == Wrote::Again && wait_for_room(ring, conn, token) {
                            // Written again when the poll says there is room.
                            continue;
                        }
                        // More may have been queued meanwhile (no transmit event is
                        // raised while a chunk is out).
                        if !conn.rt.flush_queued.swap(true, Ordering::AcqRel) {
                            w.dirty.push(conn.rt.clone());
                        }
                    } else if conn.idle() {
                        self.conns.remove(&token);
                    }
                }
            }
        }
        drop(core);
    }

    fn run_command(&mut self, w: &mut Worker<'_>, c: Command) {
        let sh = w.sh;
        let ring = &mut self.ring;
        match c {
            // Taken by the loop (`worker::pass`).
            Command::Serve { .. } | Command::Told | Command::WriteOuts(_) => {}
            Command::Attach(rt) => {
                // An unattach that overtook the attach leaves nothing to drive.
                if !sh.lock().psocks.contains_key(&rt.id) {
                    return;
                }
                let token = psock_token(rt.id);
                self.conns.insert(
                    token,
                    Conn {
                        rt,
                        recv: Recv::Idle,
                        life: RxLife::Open,
                        held: VecDeque::new(),
                        spill: Vec::new(),
                        spill_off: 0,
                        spill_counted: 0,
                        sending: None,
                        out_polled: false,
                        released: false,
                        tls_out: None,
                    },
                );
                self.to_arm.push(token);
            }
            Command::Resume(p) => {
                let token = psock_token(p);
                let Some(conn) = self.conns.get_mut(&token) else { return };
                if conn.rt.tls.is_some() && !conn.released {
                    // Decrypted bytes may wait in TLS after the receive ended.
                    pump_tls(sh, w.owned, ring, conn, w.events, &mut self.budget);
                    self.to_arm.push(token);
                    return;
                }
                if conn.released || conn.life == RxLife::Over {
                    return;
                }
                let mut core = sh.lock();
                let (events, framed, own, budget) =
                    (&mut w.events, &mut self.framed, &mut w.bufs.own, &mut self.budget);
                pump(conn, &mut Feed { core: &mut core, ring, now: sh.now(), events, framed, own, o: w.owned, budget });
                drop(core);
                self.to_arm.push(token);
            }
            Command::Recall(p) => {
                // The receive's completion gives the loan back (with what
                // it read); the next arm lends nothing (`after_recv`, `arm`):
                // the psock is paused, or its prediction forgotten.
                let token = psock_token(p);
                let Some(conn) = self.conns.get_mut(&token) else { return };
                if matches!(conn.recv, Recv::Into { .. }) {
                    conn.recv.cancel(ring, token);
                }
            }
            Command::StopRx(p) => {
                let token = psock_token(p);
                let Some(conn) = self.conns.get_mut(&token) else { return };
                stop_rx(ring, conn, token, &mut self.framed);
            }
            Command::Flush(p) => {
                let token = psock_token(p);
                if let Some(conn) = self.conns.get(&token) {
                    if !conn.released && !conn.rt.flush_queued.swap(true, Ordering::AcqRel) {
                        w.dirty.push(conn.rt.clone());
                    }
                }
            }
            Command::Release(rt) => {
                let token = psock_token(rt.id);
                let Some(conn) = self.conns.get_mut(&token) else { return };
                conn.released = true;
                conn.drop_held(ring, &mut self.framed);
                if conn.idle() {
                    self.conns.remove(&token);
                } else {
                    // Every operation on the descriptor ends (cancelled) before the
                    // handle, and with it the descriptor, is dropped.
                    let _ = ring.cancel_fd(conn.rt.fd());
                }
            }
        }
    }

    /// Write each dirty psock: one `sendmsg` with the core's whole chunk for the
    /// psocks this worker drives, a direct write for others' (their worker
    /// takes over if it would block).
    fn flush_dirty(&mut self, w: &mut Worker<'_>) {
        let sh = w.sh;
        let ring = &mut self.ring;
        let mut dirty = std::mem::take(w.dirty);
        for rt in dirty.drain(..) {
            rt.flush_queued.store(false, Ordering::Release);
            let token = psock_token(rt.id);
            match self.conns.get_mut(&token) {
                Some(conn) if !conn.released => {
                    if conn.sending.is_some() {
                        continue; // its completion flushes again
                    }
                    if let Some(tls) = &rt.tls {
                        // Records in order: what a short send left, else new ones.
                        let out = match conn.tls_out.take() {
                            Some(rest) => rest,
                            None => crate::shared::tls::take_records(sh, &rt, tls, w.events),
                        };
                        if out.is_empty() {
                            continue;
                        }
                        let len = out.len();
                        self.tx_slices.push(out.clone());
                        match ring.send_drain(rt.fd(), token, &mut self.tx_slices) {
                            Ok(()) => {
                                conn.sending = Some(len);
                                conn.tls_out = Some(out);
                            }
                            Err(e) => {
                                self.tx_slices.clear();
                                crate::shared::tls::tx_failed(sh, &rt, e.raw_os_error().unwrap_or(libc::EIO), w.events)
                            }
                        }
                        continue;
                    }
                    let begun = {
                        let mut core = sh.lock();
                        let b = core.tx_begin(&rt, &mut self.tx_slices);
                        core.drain_events(w.events);
                        b
                    };
                    if !begun {
                        continue;
                    }
                    send_chunk(ring, conn, token, &mut self.tx_slices, sh, w.events);
                }
                Some(_) => {}
                None => sh.flush(&rt, w.events),
            }
        }
        // Keep the vector's room for the next pass.
        if w.dirty.is_empty() {
            *w.dirty = dirty;
        }
    }

    /// (Re)arm the receives that should run, while there are free buffers.
    fn arm(&mut self, sh: &Shared, o: &mut Owned, events: &mut Vec<Event>) {
        let (ring, budget) = (&mut self.ring, &mut self.budget);
        if self.to_arm.is_empty() {
            return;
        }
        let mut keep = Vec::new();
        for token in std::mem::take(&mut self.to_arm) {
            let Some(conn) = self.conns.get_mut(&token) else { continue };
            if conn.released || conn.life != RxLife::Open || conn.recv.armed() || conn.holds_bytes() {
                continue;
            }
            // Over the memory budget, a receive takes one ring buffer, not
            // as many as the peer's bytes fill: a multishot receive of each
            // of hundreds of peers sending large messages would deliver far
            // more than the budget's room in one wait, all of it to be held.
            let tight;
            if conn.rt.tls.is_some() {
                // Its ciphertext is spilled past the budget like a plain
                // psock's bytes: one buffer at a time while it is over.
                tight = sh.lock().mux.mem_tight();
            } else {
                // A large message: one receive straight into the psock's
                // assembly buffer, no more than the message needs (one only
                // predicted while the budget has room: `Mux::rx_lend_ahead`).
                let loan = {
                    let mut core = sh.lock();
                    tight = core.mux.mem_tight();
                    let loan = core.mux.of(o).rx_lend_ahead(conn.rt.id);
                    // (What the call applied first may have raised events.)
                    core.drain_events(events);
                    loan
                };
                if let Some(mut loan) = loan {
                    let buf = std::mem::take(loan.buf());
                    let limit = loan.limit();
                    match ring.recv_into(conn.rt.fd(), token, buf, limit) {
                        Ok(()) => conn.recv = Recv::Into { loan, cancelling: false },
                        Err((_, buf)) => {
                            *loan.buf() = buf;
                            let mut core = sh.lock();
                            let _ = core.mux.of(o).rx_commit(loan, sh.now());
                            core.drain_events(events);
                            keep.push(token);
                        }
                    }
                    continue;
                }
            }
            // What this receive found of the budget (`Budget`).
            match tight {
                true => budget.saw(true),
                false => *budget = Budget::Room,
            }
            if ring.buffers_held() >= ring.buf_count() {
                // Every buffer is held (delivered in this pass, not yet
                // served): try again after the next pass.
                keep.push(token);
                continue;
            }
            let armed = match tight {
                true => ring.recv_once(conn.rt.fd(), token),
                false => ring.recv_multishot(conn.rt.fd(), token),
            };
            if armed.is_ok() {
                conn.recv = Recv::Buffers { multishot: !tight, cancelling: false };
            } else {
                keep.push(token);
            }
        }
        keep.sort_unstable();
        keep.dedup();
        self.to_arm = keep;
    }
}

/// Send the chunk the core handed out for `conn` (in `slices`, left empty)
/// on the ring, with the next wait; a send that cannot be queued fails the
/// psock's transmit.
fn send_chunk(
    ring: &mut WRing,
    conn: &mut Conn,
    token: u64,
    slices: &mut Vec<Bytes>,
    sh: &Shared,
    events: &mut Vec<Event>,
) {
    let len = slices.iter().map(|b| b.len()).sum();
    match ring.send_drain(conn.rt.fd(), token, slices) {
        Ok(()) => conn.sending = Some(len),
        Err(e) => {
            slices.clear();
            let mut core = sh.lock();
            Wrote::Failed(e.raw_os_error().unwrap_or(libc::EIO)).apply(&mut core, conn.rt.id);
            core.drain_events(events);
        }
    }
}

/// A send found the socket buffer full: a `POLLOUT` poll whose completion
/// writes again (the flush then takes the psock's queue). False when no
/// poll could be queued (write again at once, as before).
fn wait_for_room(ring: &mut WRing, conn: &mut Conn, token: u64) -> bool {
    if !conn.out_polled {
        conn.out_polled = ring.poll_writable(conn.rt.fd(), token).is_ok();
    }
    conn.out_polled
}

/// After a receive completion: rearm, or forget a released psock.
fn after_recv(conns: &mut FxHashMap<u64, Conn>, to_arm: &mut Vec<u64>, token: u64) {
    let Some(conn) = conns.get(&token) else { return };
    if conn.released {
        if conn.idle() {
            conns.remove(&token);
        }
    } else if !conn.recv.armed() {
        to_arm.push(token);
    }
}
