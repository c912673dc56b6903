//! An I/O worker: one thread, one epoll, the psocks attached to it.
//!
//! Each pass: wait for readiness, read each readable psock (no more than the
//! core will take: backpressure closes the TCP window), feed the bytes, run the
//! in-place handler on the messages steered to this worker's socket, then write
//! every psock that has something to send, once (so the replies to one read go
//! out in one `writev`).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use connmux_core::mux::{Event, MuxError, PsockId};
use connmux_core::{Bytes, Timestamp};
use connmux_sys::epoll::{Events, Interest};

use crate::config::Placement;
use crate::handler::{since, Done, Handler, Job, Lanes, ServiceStats, SCRATCH_CHUNK, SCRATCH_LOW, SLOW_HANDLER};
use crate::lane::Heavy;
use crate::shared::{token_psock, Command, Ctx, PsockRt, Shared, SockRt, WorkerIo, SERVE_BATCH};

pub(crate) const WAKER_TOKEN: u64 = u64::MAX;
pub(crate) const SERVE_TOKEN: u64 = u64::MAX - 1;


pub(crate) fn cpus_for(placement: &Placement, workers: usize) -> Vec<Option<usize>> {
    match placement {
        Placement::Unpinned => vec![None; workers],
        Placement::Cpus(list) if !list.is_empty() => (0..workers).map(|i| Some(list[i % list.len()])).collect(),
        _ => {
            let avail = connmux_sys::affinity::available_cpus().unwrap_or_default();
            if avail.is_empty() {
                vec![None; workers]
            } else {
                (0..workers).map(|i| Some(avail[i % avail.len()])).collect()
            }
        }
    }
}

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

pub(crate) fn run(sh: Arc<Shared>, index: usize, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    let me = &sh.workers[index];
    let WorkerIo::Epoll(epoll) = &me.io else { unreachable!("epoll worker on a non-epoll WorkerRef") };
    let mut evs = Events::with_capacity(256);
    let mut buf = vec![0u8; sh.read_chunk];
    let mut core_events: Vec<Event> = Vec::new();
    let mut dirty: Vec<Arc<PsockRt>> = Vec::new();
    let mut serving: Option<Serving> = None;
    let mut bufs = ServeBufs::default();

    // The earliest assembly deadline as of the end of the last pass. Deadlines
    // start only when this worker feeds its own psocks (in the pass), so the
    // value read at the end of a pass is still right when the next one waits.
    let mut next_deadline: Option<Timestamp> = sh.lock().mux.poll_timeout();
    while !sh.stop.load(Ordering::Acquire) {
        let timeout = next_deadline.map(|t| {
            let now = sh.now();
            Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos())) + Duration::from_micros(100)
        });
        // Wake at least every second to notice `stop` even if a waker was lost.
        let timeout = Some(timeout.unwrap_or(Duration::from_secs(1)).min(Duration::from_secs(1)));
        let n = match epoll.wait(&mut evs, timeout) {
            Ok(n) => n,
            Err(_) => continue,
        };
        let mut serve_ready = false;
        if n > 0 {
            for ev in evs.iter() {
                match ev.token {
                    WAKER_TOKEN => {
                        let _ = me.waker.drain();
                        let cmds: Vec<Command> = std::mem::take(&mut *me.commands.lock().unwrap());
                        for c in cmds {
                            match c {
                                Command::Serve { sock, handler, stats, lanes, index } => {
                                    let _ = epoll.add(sock.rx.fd.as_raw_fd(), SERVE_TOKEN, Interest::READ);
                                    crate::shared::set_own_serve(sock.id);
                                    serving = Some(Serving { sock, handler, stats, lanes, index });
                                    serve_ready = true;
                                }
                                // A TLS psock may take bytes again (see `tls::epoll_read`).
                                Command::Resume(p) => {
                                    if let Some(rt) = sh.psock_rt(p) {
                                        let ip = serving.as_ref().map(|sv| InPlace {
                                            sv,
                                            bufs: &mut bufs,
                                            dirty: &mut dirty,
                                        });
                                        read_psock(&sh, &rt, None, &mut buf, &mut core_events, ip);
                                    }
                                }
                                // Other threads reach epoll psocks through epoll_ctl.
                                _ => {}
                            }
                        }
                    }
                    SERVE_TOKEN => serve_ready = true,
                    t => {
                        let p = token_psock(t);
                        let readable = ev.readable || ev.hup || ev.error;
                        // The psock and, for a plain read, what the core will
                        // take: one lock hold.
                        let (rt, rx) = {
                            let mut core = sh.lock();
                            let Some(rt) = core.psocks.get(&p).cloned() else { continue };
                            let rx = (readable && rt.tls.is_none()).then(|| RxRoom::of(core.mux.rx_room(p)));
                            (rt, rx)
                        };
                        if ev.writable {
                            sh.set_interest(&rt, |i| i.write = false);
                            if !rt.flush_queued.swap(true, Ordering::AcqRel) {
                                dirty.push(rt.clone());
                            }
                        }
                        if readable {
                            let ip = serving.as_ref().map(|sv| InPlace { sv, bufs: &mut bufs, dirty: &mut dirty });
                            read_psock(&sh, &rt, rx, &mut buf, &mut core_events, ip);
                        }
                    }
                }
            }
        }
        // Deadlines (assembly timeouts).
        {
            let mut core = sh.lock();
            next_deadline = core.mux.poll_timeout();
            if let Some(t) = next_deadline {
                let now = sh.now();
                if t <= now {
                    core.mux.handle_timeout(now);
                    core.drain_events(&mut core_events);
                    next_deadline = core.mux.poll_timeout();
                }
            }
        }
        sh.dispatch(&mut core_events, &mut Ctx::Worker(&mut dirty));
        if let Some(sv) = &serving {
            take_done(&sh, sv, &mut bufs, &mut core_events, &mut dirty);
            // Serve whenever this pass may have steered messages to us.
            // (Not on every readable event: a read's messages for our socket
            // were served in place, and a queue left non-empty keeps the
            // socket's eventfd, so `serve_ready`, up.)
            if serve_ready || crate::shared::own_pending() || crate::shared::has_direct() {
                serve(&sh, sv, &mut bufs, &mut core_events, &mut dirty);
            }
            if let Some(p) = bufs.slow.take() {
                to_lane(&sh, &mut bufs, p);
            }
        }
        // (Looked at first: an empty drain still costs a few dozen
        // instructions, every pass.)
        if !dirty.is_empty() {
            for rt in dirty.drain(..) {
                rt.flush_queued.store(false, Ordering::Release);
                sh.flush(&rt, &mut core_events);
            }
        }
        if !core_events.is_empty() {
            // Writes can release psocks or wake senders; anything to write now
            // is written by the app path.
            sh.dispatch(&mut core_events, &mut Ctx::App);
        }
        if crate::shared::take_own_pending() {
            // Messages reached our socket after we served: wake ourselves.
            if let Some(sv) = &serving {
                sv.sock.rx.set();
            }
        }
    }
}

/// What a worker that serves in place needs to run its handler on a read's
/// messages where they lie.
pub(crate) struct InPlace<'a> {
    pub sv: &'a Serving,
    pub bufs: &'a mut ServeBufs,
    pub dirty: &'a mut Vec<Arc<PsockRt>>,
}

/// What the core takes from a psock now: bytes into the worker's buffer, or
/// a loan of the psock's own assembly buffer (`Mux::rx_lend`).
struct RxRoom {
    cap: usize,
    loan: Option<connmux_core::mux::RxLoan>,
}

impl RxRoom {
    fn of((cap, loan): (usize, Option<connmux_core::mux::RxLoan>)) -> RxRoom {
        RxRoom { cap, loan }
    }
}

/// One read from a readable psock, bounded by what the core will accept
/// (`rx`, when the caller has already asked the core). On a serving worker,
/// the read's whole messages for its own socket are served at once, where
/// they lie in `buf`.
fn read_psock(
    sh: &Shared,
    rt: &Arc<PsockRt>,
    rx: Option<RxRoom>,
    buf: &mut [u8],
    events: &mut Vec<Event>,
    in_place: Option<InPlace<'_>>,
) {
    if let Some(tls) = &rt.tls {
        return crate::shared::tls::epoll_read(sh, rt, tls, buf, events);
    }
    let RxRoom { cap, loan } = rx.unwrap_or_else(|| {
        let mut core = sh.lock();
        RxRoom::of(core.mux.rx_room(rt.id))
    });
    if let Some(loan) = loan {
        return read_lent(sh, rt, loan, events);
    }
    if cap == 0 {
        // Paused by backpressure or stopped: stop polling for input until the
        // core says PsockRxResume. That resume may come from another thread
        // between the check above and this change (its `read = true` then finds
        // read already on and does nothing): check again after turning it off.
        sh.set_interest(rt, |i| i.read = false);
        if sh.lock().mux.rx_capacity(rt.id) > 0 {
            sh.set_interest(rt, |i| i.read = true);
        }
        return;
    }
    let want = cap.min(buf.len());
    let res = connmux_sys::socket::read(rt.fd(), &mut buf[..want]);
    // One clock reading: the core's timestamp and the handlers' start.
    let read_at = connmux_sys::clock::now_nanos();
    let now = sh.timestamp(read_at);
    let mut core = sh.lock();
    match res {
        Ok(0) => {
            let _ = core.mux.rx_closed(rt.id, None);
            core.drain_events(events);
            drop(core);
            sh.set_interest(rt, |i| i.read = false);
        }
        Ok(n) => match in_place {
            Some(ip) => {
                let mut ranges = std::mem::take(&mut ip.bufs.ranges);
                let _ = crate::shared::feed_read_in_place(&mut core, rt.id, &buf[..n], now, &mut ranges);
                core.drain_events(events);
                drop(core);
                if !ranges.is_empty() {
                    // Its replies are written at once (`send_outs`).
                    serve_in_place(sh, ip.sv, ip.bufs, &buf[..n], &ranges, rt.id, read_at, events, ip.dirty, Some(rt));
                    ranges.clear();
                }
                ip.bufs.ranges = ranges;
            }
            None => {
                let _ = crate::shared::feed_read(&mut core, rt.id, &buf[..n], now);
                core.drain_events(events);
            }
        },
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
        Err(e) => {
            let _ = core.mux.rx_closed(rt.id, Some(e.raw_os_error().unwrap_or(libc::EIO)));
            core.drain_events(events);
            drop(core);
            sh.set_interest(rt, |i| i.read = false);
        }
    }
}

/// [`read_psock`] for a large message: one read straight into the psock's
/// assembly buffer (`Mux::rx_lend`), no more than the message still needs.
fn read_lent(sh: &Shared, rt: &PsockRt, mut loan: connmux_core::mux::RxLoan, events: &mut Vec<Event>) {
    let limit = loan.limit();
    let res = connmux_sys::socket::read_into(rt.fd(), loan.buf(), limit);
    let now = sh.now();
    let mut core = sh.lock();
    // The buffer goes back whatever happened (with nothing new on error).
    let _ = crate::shared::commit_read(&mut core, loan, now);
    match res {
        Ok(0) => {
            let _ = core.mux.rx_closed(rt.id, None);
            core.drain_events(events);
            drop(core);
            sh.set_interest(rt, |i| i.read = false);
        }
        Ok(_) => core.drain_events(events),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
        Err(e) => {
            let _ = core.mux.rx_closed(rt.id, Some(e.raw_os_error().unwrap_or(libc::EIO)));
            core.drain_events(events);
            drop(core);
            sh.set_interest(rt, |i| i.read = false);
        }
    }
}

/// What a served request turned into, in the order the requests came.
pub(crate) enum Out {
    /// `count` whole replies, back to back, for one connection.
    Replies(PsockId, connmux_core::Bytes, u32),
    /// Reset and unattach this connection.
    Close(PsockId),
}

/// Replies up to this size are copied into the worker's run buffer so that
/// consecutive replies to one connection enter its transmit queue as one
/// entry (one queue operation instead of one per reply); larger ones are
/// queued as they are.
const COALESCE_MAX: usize = 512;

const SLOW_HITS: u32 = 3;

/// A worker's buffers for in-place serving, kept across passes.
#[derive(Default)]
pub(crate) struct ServeBufs {
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
    /// Where a read's messages lie in the read buffer (in-place serving).
    ranges: Vec<std::ops::Range<usize>>,
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
    /// Verdicts taken from the inbox.
    done: Vec<Done>,
}

impl ServeBufs {
    /// `n` requests of `p` were handled (answered or not).
    #[inline]
    fn handled(&mut self, p: PsockId, n: u64) {
        match self.settle.last_mut() {
            Some((q, k)) if *q == p => *k += n,
            _ => self.settle.push((p, n)),
        }
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
        if !matches!(self.run, Some((p, _)) if p == psock) {
            self.end_run();
            self.run = Some((psock, 0));
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
    /// mean is (one clock reading per run, not per request).
    #[inline]
    fn timed_run(&mut self, psock: PsockId, t0: u64, n: usize) -> bool {
        let each = since(t0) / n.max(1) as u64;
        self.note_time(psock, Duration::from_nanos(each))
    }

    fn timed_slow(&mut self, psock: PsockId, t0: u64) -> bool {
        self.note_time(psock, Duration::from_nanos(since(t0)))
    }

    fn note_time(&mut self, psock: PsockId, took: Duration) -> bool {
        if took >= SLOW_HANDLER {
            if self.slow_hits.len() >= 4096 {
                self.slow_hits.clear();
            }
            // One long run can be a preemption; several in a row are a heavy
            // connection.
            let hits = self.slow_hits.entry(psock).or_insert(0);
            *hits += 1;
            if *hits == SLOW_HITS {
                self.slow.get_or_insert(psock);
            }
            true
        } else {
            if !self.slow_hits.is_empty() {
                self.slow_hits.remove(&psock);
            }
            false
        }
    }

    fn push(&mut self, psock: PsockId, v: crate::service::Verdict) {
        match v {
            crate::service::Verdict::Reply(b) if b.len() <= COALESCE_MAX => {
                match self.run {
                    Some((p, ref mut n)) if p == psock => *n += 1,
                    _ => {
                        self.end_run();
                        if self.run_buf.capacity() - self.run_buf.len() < SCRATCH_LOW {
                            self.run_buf.reserve(SCRATCH_CHUNK);
                        }
                        self.run = Some((psock, 1));
                    }
                }
                self.run_buf.extend_from_slice(&b);
            }
            crate::service::Verdict::Reply(b) => {
                self.end_run();
                self.outs.push(Out::Replies(psock, b, 1));
            }
            // `Appended` from `handle` (it has no `out`): nothing to send.
            crate::service::Verdict::NoReply | crate::service::Verdict::Appended => {}
            crate::service::Verdict::Close => {
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
    let _ = crate::shared::take_own_pending();
    crate::shared::take_direct(&mut bufs.msgs);
    // Bounded: SERVE_BATCH × 64 messages per pass, then back to I/O.
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
                true => match sv.lanes.crew.offer(sv.index, Job { data, psock }) {
                    Ok(()) => {
                        bufs.heavy.offered(psock);
                        continue;
                    }
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
            let v = sv.handler.handle(data, psock, &mut bufs.scratch);
            slow_batch |= bufs.timed(psock, t0);
            bufs.push(psock, v);
        }
        bufs.msgs = msgs;
        send_outs(sh, sv, bufs, events, dirty, None);
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

/// Run the handler on the messages of one read of psock `p` where they lie
/// in `data` (`ranges`, framed in place by the core), then queue the replies
/// (and write them at once when `write_now` is `p`'s runtime: see [`send_outs`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve_in_place(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    data: &[u8],
    ranges: &[std::ops::Range<usize>],
    p: PsockId,
    started: u64,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
    write_now: Option<&Arc<PsockRt>>,
) {
    let handler = &*sv.handler;
    let mut ranges = ranges;
    if bufs.heavy.contains(p) {
        // A heavy connection's messages go to the lane (copied out of the
        // read buffer), those the full lane refuses are run here.
        while let Some(r) = ranges.first() {
            let job = Job { data: Bytes::copy_from_slice(&data[r.clone()]), psock: p };
            if sv.lanes.crew.offer(sv.index, job).is_err() {
                break;
            }
            bufs.heavy.offered(p);
            ranges = &ranges[1..];
        }
        if ranges.is_empty() {
            return;
        }
    }
    bufs.handled(p, ranges.len() as u64);
    let mut rest = ranges;
    // Bounded: each turn handles at least one request.
    while !rest.is_empty() {
        if bufs.scratch.capacity() - bufs.scratch.len() < SCRATCH_LOW {
            bufs.scratch.reserve(SCRATCH_CHUNK);
        }
        bufs.open_run(p);
        // The first run is timed from `started` (when its bytes were read:
        // framing them is part of its time, and a clock reading is saved).
        let t0 = if rest.len() == ranges.len() { started } else { connmux_sys::clock::now_nanos() };
        let served = handler.handle_run_in_place(data, rest, p, &mut bufs.scratch, &mut bufs.run_buf);
        // A handler that says it handled none (or more than it was given)
        // still moves the run on, so this loop ends.
        let handled = served.handled.clamp(1, rest.len());
        bufs.timed_run(p, t0, handled);
        if let Some((_, n)) = &mut bufs.run {
            *n += served.appended;
        }
        rest = &rest[handled..];
        match served.stop {
            Some(v) => {
                let close = matches!(v, crate::service::Verdict::Close);
                bufs.push(p, v);
                if close {
                    // Nothing after the close is answered.
                    break;
                }
            }
            None if served.handled == 0 => break,
            None => {}
        }
    }
    send_outs(sh, sv, bufs, events, dirty, write_now);
}

/// Queue the replies of served messages on their connections (in the order
/// they were produced) and abort the connections whose handler asked for it.
///
/// `write_now`: the connection whose read was just served (epoll driver):
/// the core hands its chunk over with the last reply run (`send_msgs_to_begin`)
/// and it is written here, saving the transmit event, the deferred-flush list
/// and one lock hold per read. Its replies still go through the core's
/// transmit queue, so a send of another thread is never interleaved.
fn send_outs(
    sh: &Shared,
    sv: &Serving,
    bufs: &mut ServeBufs,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
    write_now: Option<&Arc<PsockRt>>,
) {
    bufs.end_run();
    bufs.closed.clear();
    if bufs.outs.is_empty() {
        if !bufs.settle.is_empty() {
            let mut core = sh.lock();
            for (p, n) in bufs.settle.drain(..) {
                core.mux.rx_settle(p, n);
            }
            core.drain_events(events);
            drop(core);
            sh.dispatch(events, &mut Ctx::Worker(dirty));
        }
        return;
    }
    let mut aborts = Vec::new();
    let mut begun = false;
    {
        let mut core = sh.lock();
        let last = bufs.outs.len() - 1;
        for (i, out) in bufs.outs.drain(..).enumerate() {
            match out {
                Out::Replies(psock, b, n) => {
                    // A reply to a connection that went away is dropped, as a
                    // send on a closed socket would be. A refused one means its
                    // peer has not read `psock_sndbuf` bytes of replies while
                    // still sending: that connection is aborted (counted in
                    // tx_backlog_refusals), nobody else waits for it.
                    let r = match write_now {
                        Some(rt) if i == last && rt.id == psock && rt.tls.is_none() => {
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
        core.drain_events(events);
    }
    if let (true, Some(rt)) = (begun, write_now) {
        sh.write_begun(rt, events, &mut bufs.slices);
    }
    sh.dispatch(events, &mut Ctx::Worker(dirty));
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
        sh.dispatch(events, &mut Ctx::Worker(dirty));
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
    for d in done.drain(..) {
        if bufs.heavy.answered(d.psock, d.short) {
            sh.lane_returns.fetch_add(1, Ordering::Relaxed);
        }
        bufs.handled(d.psock, 1);
        if !bufs.closed.is_empty() && bufs.closed.contains(&d.psock) {
            continue;
        }
        bufs.push(d.psock, d.verdict);
    }
    bufs.done = done;
    send_outs(sh, sv, bufs, events, dirty, None);
}
