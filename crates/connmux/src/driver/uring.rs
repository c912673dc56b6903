//! An I/O worker on io_uring: one thread, one ring, the psocks attached to it.
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
//!   most the ring, `Tuning::ring_buf_count` × `ring_buf_size`), and it is fed to the core before
//!   the psock's receive is armed again.
//! - transmit: the psocks that have something to write after a pass get one
//!   `sendmsg` each (all of the core's chunk: the replies of the pass), all
//!   submitted with the next wait; the kernel completes each one whole.
//! - other threads post [`Command`]s and notify the worker's eventfd, which the
//!   ring polls.
//! - release: a psock's operations are cancelled and their completions reaped
//!   before the worker drops its handle (and so the descriptor).

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use connmux_core::mux::{Event, PsockId, RxLoan};
use connmux_core::{Bytes, Timestamp};
use connmux_sys::uring::{Completion, Ring, RingConfig};

use crate::shared::{psock_token, Core, Ctx, PsockRt, Shared};
use crate::shared::Command;
use crate::config::Tuning;
use crate::serve::{serve, Serving};

/// Token of the waker poll.
const WAKE_TOKEN: u64 = u64::MAX;
/// Token of the serving socket's readiness poll.
const SERVE_TOKEN: u64 = u64::MAX - 1;

/// The ring of a worker: the payloads of its sends are the core's `Bytes`.
type WRing = Ring<Bytes>;

/// Creates the worker's ring: completion work deferred to its waits where the
/// kernel can (6.1+), else the plain kind.
fn new_ring(t: &Tuning) -> io::Result<WRing> {
    let config = RingConfig {
        entries: 256,
        cq_entries: 4096,
        buf_count: t.ring_buf_count,
        buf_size: t.ring_buf_size,
        defer_taskrun: true,
    };
    match Ring::new(config) {
        Ok(r) => Ok(r),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ring::new(RingConfig { defer_taskrun: false, ..config }),
        Err(e) => Err(e),
    }
}

/// Bytes of a provided buffer not yet taken by the core.
struct Held {
    buf: u16,
    off: usize,
}

/// One psock as this worker drives it.
struct Conn {
    rt: Arc<PsockRt>,
    /// A multishot receive is in flight.
    recv_armed: bool,
    /// Its cancellation was queued (paused, stopped or released).
    recv_cancelled: bool,
    /// Buffers delivered but not yet (fully) taken by the core, in order.
    /// Empty after every pass but while the core takes bytes (a paused
    /// psock's rest goes to `spill`).
    held: VecDeque<Held>,
    /// Bytes copied out of ring buffers when the core paused the psock; fed
    /// before anything held (they came first), from `spill_off`.
    spill: Vec<u8>,
    spill_off: usize,
    /// The spill's unfed bytes as last told to the core (`Mux::set_rx_below`).
    spill_counted: usize,
    /// The receive ended with end of stream (None) or an error: reported to the
    /// core once the held bytes before it have been fed.
    eof: Option<Option<i32>>,
    /// Receive is over for good (failed, end of stream reported).
    rx_stopped: bool,
    /// A send is in flight, of this many bytes.
    sending: Option<usize>,
    /// The core released it: waiting for its operations to end.
    released: bool,
    /// TLS: the records of the send in flight, or what a short send left.
    tls_out: Option<Bytes>,
    /// The psock's assembly buffer, lent by the core for the receive in
    /// flight into it (a large message: `Ring::recv_into`, not the multishot
    /// receive); the ring holds the bytes until the completion.
    loan: Option<RxLoan>,
}

impl Conn {
    fn idle(&self) -> bool {
        !self.recv_armed && self.sending.is_none()
    }

    /// Bytes delivered and not yet taken by the core: wait for them to be
    /// fed before receiving more.
    fn holds_bytes(&self) -> bool {
        !self.held.is_empty() || self.spill_off < self.spill.len()
    }

    /// The core paused the psock: copy what its ring buffers still hold to
    /// the spill and give the buffers back (after the messages framed in
    /// them are served).
    fn spill_held(&mut self, ring: &mut WRing, lent: &mut Lent) {
        for h in self.held.drain(..) {
            if let Some(data) = ring.buffer(h.buf) {
                self.spill.extend_from_slice(&data[h.off.min(data.len())..]);
            }
            lent.give_back(ring, h.buf);
        }
    }

    /// Forget the bytes delivered and not taken (receive is over).
    fn drop_held(&mut self, ring: &mut WRing, lent: &mut Lent) {
        for h in self.held.drain(..) {
            lent.give_back(ring, h.buf);
        }
        self.spill = Vec::new();
        self.spill_off = 0;
    }
}

/// Messages framed in place in provided buffers during a pass over the
/// ring's completions (under the core lock), served once the lock is dropped;
/// their buffers go back to the ring only after that.
#[derive(Default)]
struct Lent {
    /// Where the messages lie in their buffers.
    ranges: Vec<std::ops::Range<usize>>,
    /// One per fed piece that framed messages: psock, buffer, `ranges[a..b]`.
    batches: Vec<(PsockId, u16, usize, usize)>,
    /// Buffers fully fed whose messages are still to be served.
    recycle: Vec<u16>,
}

impl Lent {
    /// Give a fully fed buffer back to the ring, after its messages are served.
    fn give_back(&mut self, ring: &mut WRing, buf: u16) {
        if self.batches.iter().any(|b| b.1 == buf) {
            self.recycle.push(buf);
        } else {
            ring.recycle(buf);
        }
    }
}

struct Worker<'a> {
    sh: &'a Shared,
    index: usize,
    lent: Lent,
    conns: FxHashMap<u64, Conn>,
    /// Psocks whose receive should be (re)armed when buffers allow.
    to_arm: Vec<u64>,
    events: Vec<Event>,
    dirty: Vec<Arc<PsockRt>>,
    /// The chunk of the send being queued (its payloads move into the ring;
    /// the vector stays, so a send allocates nothing here).
    tx_slices: Vec<Bytes>,
}

pub(crate) fn run(sh: Arc<Shared>, index: usize, cpu: Option<usize>, init: Sender<io::Result<()>>) {
    if let Some(cpu) = cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    let mut ring = match new_ring(&sh.tuning) {
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
    let mut w = Worker {
        sh: &sh,
        index,
        lent: Lent::default(),
        conns: FxHashMap::default(),
        to_arm: Vec::new(),
        events: Vec::new(),
        dirty: Vec::new(),
        tx_slices: Vec::new(),
    };
    w.run(&mut ring);
    // Dropping the ring cancels what is still in flight and waits for it, before
    // the connections (and their descriptors) go.
    drop(ring);
    drop(w);
}

impl Worker<'_> {
    fn run(&mut self, ring: &mut WRing) {
        let sh = self.sh;
        let me = &sh.workers[self.index];
        let mut waker_armed = false;
        let mut serving: Option<Serving> = None;
        let mut serve_armed = false;
        let mut comps: Vec<Completion> = Vec::with_capacity(1024);
        let mut bufs = crate::serve::ServeBufs::new(&sh.tuning);
        let rounds = sh.tuning.ring_rounds;

        while !sh.stop.load(Ordering::Acquire) {
            if !waker_armed {
                waker_armed = ring.poll_readable(me.waker.as_raw_fd(), WAKE_TOKEN).is_ok();
            }
            if let (Some(sv), false) = (&serving, serve_armed) {
                serve_armed = ring.poll_readable(sv.sock.rx.fd.as_raw_fd(), SERVE_TOKEN).is_ok();
            }
            let timeout = {
                let core = sh.lock();
                core.mux.poll_timeout().map(|t| {
                    let now = sh.now();
                    Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos())) + Duration::from_micros(100)
                })
            };
            // Wake at least every second to notice `stop` even if a wake-up was lost.
            let timeout = timeout.unwrap_or(Duration::from_secs(1)).min(Duration::from_secs(1));
            if ring.wait(1, Some(timeout)).is_err() {
                // Only a broken ring fails here; avoid spinning on it.
                std::thread::sleep(Duration::from_millis(1));
            }
            comps.clear();
            ring.reap(&mut comps);
            let mut serve_ready = false;
            let mut commands = false;
            self.completions(ring, &comps, &mut waker_armed, &mut serve_armed, &mut serve_ready, &mut commands);
            self.serve_lent(ring, serving.as_ref(), &mut bufs);
            // Commands: taken every pass (the waker only ends the wait). Drain the
            // eventfd before taking them, so a command posted in between leaves it
            // readable for the next wait rather than being slept through.
            if commands {
                let _ = me.waker.drain();
            }
            let cmds: Vec<Command> = std::mem::take(&mut *me.commands.lock().unwrap());
            for c in cmds {
                match c {
                    Command::Serve { sock, handler, stats, lanes, index } => {
                        crate::shared::set_own_serve(sock.id, sh.tuning.serve_batch);
                        serving = Some(Serving { sock, handler, stats, lanes, index });
                        serve_ready = true;
                    }
                    c => self.command(ring, c),
                }
            }
            self.serve_lent(ring, serving.as_ref(), &mut bufs);
            // Deadlines (assembly timeouts).
            {
                let mut core = sh.lock();
                if let Some(t) = core.mux.poll_timeout() {
                    let now = sh.now();
                    if t <= now {
                        core.mux.handle_timeout(now);
                        core.drain_events(&mut self.events);
                    }
                }
            }
            if let Some(sv) = &serving {
                crate::serve::take_done(sh, sv, &mut bufs, &mut self.events, &mut self.dirty);
            }
            // Dispatch, serve in place, write: until nothing is left to do here
            // (bounded; what remains is picked up by the next pass).
            for round in 0..rounds {
                sh.dispatch(&mut self.events, &mut Ctx::Worker(&mut self.dirty));
                if let Some(sv) = &serving {
                    // (A command may have read messages for our socket in a
                    // pass with no completion: `has_direct`.)
                    // (Not on every completion: a read's messages for our
                    // socket were served in place, and a queue left non-empty
                    // keeps the socket's eventfd, so `serve_ready`, up.)
                    if round == 0 && (serve_ready || crate::shared::own_pending() || crate::shared::has_direct()) {
                        serve(sh, sv, &mut bufs, &mut self.events, &mut self.dirty);
                    }
                }
                if self.dirty.is_empty() && self.events.is_empty() {
                    break;
                }
                self.flush_dirty(ring);
            }
            if serving.is_some() {
                if let Some(p) = bufs.slow.take() {
                    crate::serve::to_lane(sh, &mut bufs, p);
                }
            }
            if crate::shared::take_own_pending() {
                // Messages reached our socket after we served: wake ourselves.
                if let Some(sv) = &serving {
                    sv.sock.rx.set();
                }
            }
            self.arm(ring);
        }
    }

    /// Act on what the ring reports.
    fn completions(
        &mut self,
        ring: &mut WRing,
        comps: &[Completion],
        waker_armed: &mut bool,
        serve_armed: &mut bool,
        serve_ready: &mut bool,
        commands: &mut bool,
    ) {
        let sh = self.sh;
        let now = sh.now();
        let mut core = None;
        for c in comps {
            match *c {
                Completion::Poll { token: WAKE_TOKEN, .. } => {
                    *waker_armed = false;
                    *commands = true;
                }
                Completion::Poll { token: SERVE_TOKEN, .. } => {
                    *serve_armed = false;
                    *serve_ready = true;
                }
                Completion::Poll { .. } => {}
                Completion::Recv { token, buf_id, more, .. } => {
                    let Some(conn) = self.conns.get_mut(&token) else {
                        ring.recycle(buf_id);
                        continue;
                    };
                    if !more {
                        conn.recv_armed = false;
                        conn.recv_cancelled = false;
                    }
                    if conn.released || conn.rx_stopped {
                        ring.recycle(buf_id);
                    } else if conn.rt.tls.is_some() {
                        conn.held.push_back(Held { buf: buf_id, off: 0 });
                        core = None; // TLS lock before the core lock
                        pump_tls(sh, ring, conn, &mut self.events);
                    } else {
                        conn.held.push_back(Held { buf: buf_id, off: 0 });
                        let core = core.get_or_insert_with(|| sh.lock());
                        pump(core, ring, conn, now, &mut self.events, &mut self.lent);
                    }
                    self.after_recv(token);
                }
                Completion::RecvEnd { token, res } => {
                    let Some(conn) = self.conns.get_mut(&token) else { continue };
                    conn.recv_armed = false;
                    conn.recv_cancelled = false;
                    if !conn.released && !conn.rx_stopped {
                        if res == 0 {
                            conn.eof = Some(None);
                        } else if res != -libc::ENOBUFS && res != -libc::ECANCELED {
                            conn.eof = Some(Some(-res));
                        }
                        if conn.rt.tls.is_some() {
                            core = None;
                            pump_tls(sh, ring, conn, &mut self.events);
                        } else {
                            let core = core.get_or_insert_with(|| sh.lock());
                            pump(core, ring, conn, now, &mut self.events, &mut self.lent);
                        }
                    }
                    self.after_recv(token);
                }
                Completion::RecvInto { token, res } => {
                    let buf = ring.take_filled(token);
                    let Some(conn) = self.conns.get_mut(&token) else { continue };
                    conn.recv_armed = false;
                    conn.recv_cancelled = false;
                    let core = core.get_or_insert_with(|| sh.lock());
                    if let (Some(mut loan), Some(buf)) = (conn.loan.take(), buf) {
                        // The buffer goes back whatever happened (the core drops
                        // the bytes of a psock that stopped meanwhile).
                        *loan.buf() = buf;
                        if crate::shared::commit_read(core, loan, now).is_err() && !conn.released {
                            stop_rx(ring, conn, token, &mut self.lent);
                        }
                    }
                    if !conn.released && !conn.rx_stopped {
                        if res == 0 {
                            conn.eof = Some(None);
                        } else if res < 0 && res != -libc::ECANCELED {
                            conn.eof = Some(Some(-res));
                        }
                        pump(core, ring, conn, now, &mut self.events, &mut self.lent);
                    }
                    self.after_recv(token);
                }
                Completion::Send { token, res } => {
                    let Some(conn) = self.conns.get_mut(&token) else { continue };
                    let want = conn.sending.take().unwrap_or(0);
                    if !conn.released && conn.rt.tls.is_some() {
                        // The core took the messages when they became records:
                        // here only the records' own progress matters.
                        let sent = conn.tls_out.take().unwrap_or_default();
                        if res < 0 || (res == 0 && want > 0) {
                            core = None;
                            let errno = if res < 0 { -res } else { libc::EPIPE };
                            crate::shared::tls::tx_failed(sh, &conn.rt, errno, &mut self.events);
                        } else if (res as usize) < sent.len() {
                            conn.tls_out = Some(sent.slice(res as usize..));
                        }
                        if !conn.rt.flush_queued.swap(true, Ordering::AcqRel) {
                            self.dirty.push(conn.rt.clone());
                        }
                    } else if !conn.released {
                        let core = core.get_or_insert_with(|| sh.lock());
                        let id = conn.rt.id;
                        if res > 0 || (res == 0 && want == 0) {
                            // A short count (the connection failed part way) is
                            // followed by the error on the next send.
                            core.mux.tx_complete(id, res as usize);
                        } else if res == 0 {
                            core.mux.tx_complete(id, 0);
                            core.mux.tx_failed(id, libc::EPIPE);
                        } else {
                            core.mux.tx_complete(id, 0);
                            core.mux.tx_failed(id, -res);
                        }
                        core.drain_events(&mut self.events);
                        // More may have been queued meanwhile (no transmit event is
                        // raised while a chunk is out).
                        if !conn.rt.flush_queued.swap(true, Ordering::AcqRel) {
                            self.dirty.push(conn.rt.clone());
                        }
                    } else if conn.idle() {
                        self.conns.remove(&token);
                    }
                }
            }
        }
    }

    /// Serve the messages framed in place in provided buffers, then give
    /// those buffers back to the ring.
    fn serve_lent(&mut self, ring: &mut WRing, serving: Option<&Serving>, bufs: &mut crate::serve::ServeBufs) {
        let lent = &mut self.lent;
        if let Some(sv) = serving {
            // One read served in this pass: its replies are written at once,
            // with a plain `sendmsg`, when no ring send of the psock is in
            // flight (as the epoll worker does: one lock hold and no transmit
            // event).
            // Several: ring sends, all submitted with the next wait (one
            // system call for all of them, not one `sendmsg` each).
            let one = lent.batches.len() == 1;
            for &(p, buf, a, b) in &lent.batches {
                let data = ring.buffer(buf).unwrap_or(&[]);
                let rt = match one {
                    true => self
                        .conns
                        .get(&psock_token(p))
                        .filter(|c| !c.released && c.sending.is_none())
                        .map(|c| c.rt.clone()),
                    false => None,
                };
                crate::serve::serve_in_place(
                    self.sh,
                    sv,
                    bufs,
                    data,
                    &lent.ranges[a..b],
                    p,
                    connmux_sys::clock::now_nanos(),
                    &mut self.events,
                    &mut self.dirty,
                    rt.as_ref(),
                );
            }
        }
        lent.batches.clear();
        lent.ranges.clear();
        for buf in lent.recycle.drain(..) {
            ring.recycle(buf);
        }
    }

    /// After a receive completion: rearm, or forget a released psock.
    fn after_recv(&mut self, token: u64) {
        let Some(conn) = self.conns.get(&token) else { return };
        if conn.released {
            if conn.idle() {
                self.conns.remove(&token);
            }
        } else if !conn.recv_armed {
            self.to_arm.push(token);
        }
    }

    fn command(&mut self, ring: &mut WRing, c: Command) {
        let sh = self.sh;
        match c {
            Command::Serve { .. } => {}
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
                        recv_armed: false,
                        recv_cancelled: false,
                        held: VecDeque::new(),
                        spill: Vec::new(),
                        spill_off: 0,
                        spill_counted: 0,
                        eof: None,
                        rx_stopped: false,
                        sending: None,
                        released: false,
                        tls_out: None,
                        loan: None,
                    },
                );
                self.to_arm.push(token);
            }
            Command::Resume(p) => {
                let token = psock_token(p);
                let Some(conn) = self.conns.get_mut(&token) else { return };
                if conn.rt.tls.is_some() && !conn.released {
                    // Decrypted bytes may wait in TLS after the receive ended.
                    pump_tls(sh, ring, conn, &mut self.events);
                    self.to_arm.push(token);
                    return;
                }
                if conn.released || conn.rx_stopped {
                    return;
                }
                let mut core = sh.lock();
                pump(&mut core, ring, conn, sh.now(), &mut self.events, &mut self.lent);
                drop(core);
                self.to_arm.push(token);
            }
            Command::StopRx(p) => {
                let token = psock_token(p);
                let Some(conn) = self.conns.get_mut(&token) else { return };
                stop_rx(ring, conn, token, &mut self.lent);
            }
            Command::Flush(p) => {
                let token = psock_token(p);
                if let Some(conn) = self.conns.get(&token) {
                    if !conn.released && !conn.rt.flush_queued.swap(true, Ordering::AcqRel) {
                        self.dirty.push(conn.rt.clone());
                    }
                }
            }
            Command::Release(rt) => {
                let token = psock_token(rt.id);
                let Some(conn) = self.conns.get_mut(&token) else { return };
                conn.released = true;
                conn.drop_held(ring, &mut self.lent);
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
    fn flush_dirty(&mut self, ring: &mut WRing) {
        let sh = self.sh;
        let mut dirty = std::mem::take(&mut self.dirty);
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
                            None => crate::shared::tls::take_records(sh, &rt, tls, &mut self.events),
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
                                crate::shared::tls::tx_failed(sh, &rt, e.raw_os_error().unwrap_or(libc::EIO), &mut self.events)
                            }
                        }
                        continue;
                    }
                    let begun = {
                        let mut core = sh.lock();
                        let b = core.mux.tx_begin_into(rt.id, &mut self.tx_slices);
                        core.drain_events(&mut self.events);
                        b
                    };
                    if !begun {
                        continue;
                    }
                    let len = self.tx_slices.iter().map(|b| b.len()).sum();
                    match ring.send_drain(rt.fd(), token, &mut self.tx_slices) {
                        Ok(()) => conn.sending = Some(len),
                        Err(e) => {
                            self.tx_slices.clear();
                            let mut core = sh.lock();
                            core.mux.tx_complete(rt.id, 0);
                            core.mux.tx_failed(rt.id, e.raw_os_error().unwrap_or(libc::EIO));
                            core.drain_events(&mut self.events);
                        }
                    }
                }
                Some(_) => {}
                None => sh.flush(&rt, &mut self.events),
            }
        }
        // Keep the vector's room for the next pass.
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
    }

    /// (Re)arm the receives that should run, while there are free buffers.
    fn arm(&mut self, ring: &mut WRing) {
        if self.to_arm.is_empty() {
            return;
        }
        let mut keep = Vec::new();
        for token in std::mem::take(&mut self.to_arm) {
            let Some(conn) = self.conns.get_mut(&token) else { continue };
            if conn.released || conn.rx_stopped || conn.recv_armed || conn.eof.is_some() || conn.holds_bytes() {
                continue;
            }
            if conn.rt.tls.is_none() {
                // A large message: one receive straight into the psock's
                // assembly buffer, no more than the message needs.
                let loan = self.sh.lock().mux.rx_lend(conn.rt.id);
                if let Some(mut loan) = loan {
                    let buf = std::mem::take(loan.buf());
                    let limit = loan.limit();
                    match ring.recv_into(conn.rt.fd(), token, buf, limit) {
                        Ok(()) => {
                            conn.loan = Some(loan);
                            conn.recv_armed = true;
                        }
                        Err((_, buf)) => {
                            *loan.buf() = buf;
                            let _ = self.sh.lock().mux.rx_commit(loan, self.sh.now());
                            keep.push(token);
                        }
                    }
                    continue;
                }
            }
            if ring.buffers_held() >= ring.buf_count() {
                // Every buffer is held (delivered in this pass, not yet
                // served): try again after the next pass.
                keep.push(token);
                continue;
            }
            if ring.recv_multishot(conn.rt.fd(), token).is_ok() {
                conn.recv_armed = true;
            } else {
                keep.push(token);
            }
        }
        keep.sort_unstable();
        keep.dedup();
        self.to_arm = keep;
    }
}

/// Stop receiving from a failed psock for good: its held bytes are dropped.
fn stop_rx(ring: &mut WRing, conn: &mut Conn, token: u64, lent: &mut Lent) {
    conn.rx_stopped = true;
    conn.eof = None;
    conn.drop_held(ring, lent);
    if conn.recv_armed && !conn.recv_cancelled {
        conn.recv_cancelled = ring.cancel_recv(token).is_ok();
    }
}

/// [`pump`] for a TLS psock: the held ciphertext through TLS into the core,
/// no more than it takes; called without the core lock (TLS lock first).
fn pump_tls(sh: &Shared, ring: &mut WRing, conn: &mut Conn, events: &mut Vec<Event>) {
    let rt = conn.rt.clone();
    let Some(tls) = &rt.tls else { return };
    let token = psock_token(rt.id);
    let mut st = tls.lock().unwrap();
    let mut full = false;
    // What was spilled while paused comes first; TLS takes all of it unless
    // it is full.
    if conn.spill_off < conn.spill.len() {
        let (took, _) = crate::shared::tls::rx(sh, &rt, &mut st, &conn.spill[conn.spill_off..], events);
        conn.spill_off += took;
        if conn.spill_off < conn.spill.len() {
            full = true;
        } else {
            conn.spill = Vec::new();
            conn.spill_off = 0;
        }
    }
    // Bounded: each round takes a whole buffer, or stops.
    while let Some(h) = conn.held.front_mut() {
        if full {
            break;
        }
        let (took, r, len) = {
            let data = ring.buffer(h.buf).unwrap_or(&[]);
            let (took, r) = crate::shared::tls::rx(sh, &rt, &mut st, &data[h.off.min(data.len())..], events);
            (took, r, data.len())
        };
        h.off += took;
        if h.off >= len {
            let buf = h.buf;
            conn.held.pop_front();
            ring.recycle(buf);
        }
        if r == crate::shared::tls::Rx::Full {
            full = true;
            break;
        }
    }
    if !full && conn.held.is_empty() {
        // Decrypted bytes kept from an earlier pass.
        full = crate::shared::tls::rx(sh, &rt, &mut st, &[], events).1 == crate::shared::tls::Rx::Full;
    }
    if full {
        // Backpressure: close the window as epoll would (stop reading), and
        // keep no ring buffer meanwhile.
        if conn.recv_armed && !conn.recv_cancelled {
            conn.recv_cancelled = ring.cancel_recv(token).is_ok();
        }
        conn.spill_held(ring, &mut Lent::default()); // TLS buffers are never lent
        return;
    }
    if st.done() {
        drop(st);
        stop_rx(ring, conn, token, &mut Lent::default()); // TLS buffers are never lent
        return;
    }
    if let Some(errno) = conn.eof.take() {
        // No receive after this; a resume still drains what TLS holds.
        conn.rx_stopped = true;
        crate::shared::tls::rx_eof(sh, &rt, &mut st, errno, events);
    }
}

/// Feed the held bytes of one psock to the core, no more than it takes. When it
/// takes nothing (paused), keep the rest and cancel the receive; when all is fed,
/// report an end of stream that came after it. What stays spilled counts in
/// the core's memory budget as the psock's.
fn pump(core: &mut Core, ring: &mut WRing, conn: &mut Conn, now: Timestamp, events: &mut Vec<Event>, lent: &mut Lent) {
    pump_held(core, ring, conn, now, events, lent);
    let below = conn.spill.len() - conn.spill_off;
    if below != conn.spill_counted {
        conn.spill_counted = below;
        core.mux.set_rx_below(conn.rt.id, below);
        // The budget may have paused or aborted a psock.
        core.drain_events(events);
    }
}

fn pump_held(
    core: &mut Core,
    ring: &mut WRing,
    conn: &mut Conn,
    now: Timestamp,
    events: &mut Vec<Event>,
    lent: &mut Lent,
) {
    let id: PsockId = conn.rt.id;
    let token = psock_token(id);
    // What was spilled while paused comes first. Bounded: each round feeds
    // at least one byte, or stops.
    while conn.spill_off < conn.spill.len() {
        let cap = core.mux.rx_capacity(id);
        if cap == 0 {
            pause_psock(core, ring, conn, token, lent);
            core.drain_events(events);
            return;
        }
        let end = (conn.spill_off + cap).min(conn.spill.len());
        let fed = crate::shared::feed_read(core, id, &conn.spill[conn.spill_off..end], now);
        conn.spill_off = end;
        if fed.is_err() {
            core.drain_events(events);
            stop_rx(ring, conn, token, lent);
            return;
        }
    }
    if !conn.spill.is_empty() {
        // All fed: its memory goes back.
        conn.spill = Vec::new();
        conn.spill_off = 0;
    }
    // Bounded: each round feeds at least one byte, or stops.
    while let Some(h) = conn.held.front_mut() {
        let cap = core.mux.rx_capacity(id);
        let data = ring.buffer(h.buf).unwrap_or(&[]);
        if h.off < data.len() && cap == 0 {
            pause_psock(core, ring, conn, token, lent);
            core.drain_events(events);
            return;
        }
        let end = (h.off + cap).min(data.len());
        // Whole messages for this worker's own socket are framed where they
        // lie and served after the pass (`Worker::serve_lent`).
        let a = lent.ranges.len();
        let fed = crate::shared::feed_read_in_place(core, id, &data[h.off..end], now, &mut lent.ranges);
        if lent.ranges.len() > a {
            for r in &mut lent.ranges[a..] {
                *r = r.start + h.off..r.end + h.off;
            }
            lent.batches.push((id, h.buf, a, lent.ranges.len()));
        }
        h.off = end;
        let done = h.off >= data.len();
        if done {
            let buf = h.buf;
            conn.held.pop_front();
            lent.give_back(ring, buf);
        }
        if fed.is_err() {
            // Gone from the core, or over its hard cap (cannot happen within
            // rx_capacity): stop receiving from it.
            core.drain_events(events);
            stop_rx(ring, conn, token, lent);
            return;
        }
    }
    if let Some(errno) = conn.eof.take() {
        let _ = core.mux.rx_closed(id, errno);
        conn.rx_stopped = true;
    } else if conn.recv_armed && !conn.recv_cancelled && conn.loan.is_none() && core.mux.rx_would_lend(id) {
        // A large message began: end the multishot receive (what it still
        // delivers is fed first) so that the next one goes straight into the
        // psock's assembly buffer.
        conn.recv_cancelled = ring.cancel_recv(token).is_ok();
    }
    core.drain_events(events);
}

/// [`pause`], except for a psock the memory budget paused: that one keeps
/// its ring buffers (memory the ring has anyway) instead of copying them into
/// new memory, since the budget pauses when memory is short; it resumes or,
/// stuck past `MuxConfig::mem_grace`, is aborted, and either gives them back.
fn pause_psock(core: &Core, ring: &mut WRing, conn: &mut Conn, token: u64, lent: &mut Lent) {
    if core.mux.mem_paused(conn.rt.id) {
        if conn.recv_armed && !conn.recv_cancelled {
            conn.recv_cancelled = ring.cancel_recv(token).is_ok();
        }
    } else {
        pause(ring, conn, token, lent);
    }
}

/// Backpressure on a psock: close the window as epoll would (stop reading),
/// and give its ring buffers back (their rest is spilled).
fn pause(ring: &mut WRing, conn: &mut Conn, token: u64, lent: &mut Lent) {
    if conn.recv_armed && !conn.recv_cancelled {
        conn.recv_cancelled = ring.cancel_recv(token).is_ok();
    }
    conn.spill_held(ring, lent);
}
