//! The epoll driver: an I/O worker's loop on one thread, one epoll, the
//! psocks attached to it.
//!
//! Each pass: wait for readiness, read each readable psock (no more than the
//! core will take: backpressure closes the TCP window), feed the bytes, run the
//! in-place handler on the messages steered to this worker's socket, then write
//! every psock that has something to send, once (so the replies to one read go
//! out in one `writev`).
//!
//! Owns the worker's read buffer and its wait; the serving steps are
//! `crate::serve`, the core's runtime side `crate::shared`. Must not name the
//! io_uring driver, the public `Mux` or anything above it.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use connmux_core::mux::Event;
use connmux_core::Timestamp;
use connmux_sys::epoll::{Events, Interest};

use crate::driver::{SERVE_TOKEN, WAKER_TOKEN};
use crate::serve::{serve_in_place, ServeBufs, Serving};
use crate::shared::{token_psock, Command, Core, Ctx, PsockRt, ReadEnd, Shared, WorkerIo};

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
    let mut bufs = ServeBufs::new(&sh.tuning);

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
                                    bufs.own.serve = Some((sock.id, sh.tuning.serve_batch));
                                    bufs.own.can_lease = sh.tuning.lease;
                                    serving = Some(Serving { sock, handler, stats, lanes, index });
                                    serve_ready = true;
                                }
                                // A TLS psock may take bytes again (see `tls::epoll_read`).
                                Command::Resume(p) => {
                                    if let Some(rt) = sh.psock_rt(p) {
                                        let ip = InPlace { sv: serving.as_ref(), bufs: &mut bufs, dirty: &mut dirty };
                                        read_psock(&sh, &rt, None, &mut buf, &mut core_events, ip);
                                    }
                                }
                                Command::Unlease(p) => {
                                    let now = sh.now();
                                    let mut core = sh.lock();
                                    bufs.own.unlease(&mut core, p, now);
                                    core.drain_events(&mut core_events);
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
                        // A psock lent to this worker: no core lock (its
                        // writes never wait: a short one gives it back).
                        if let (true, Some(sv)) = (readable, serving.as_ref()) {
                            if let Some(fd) = bufs.own.leases.get(&p).map(|l| l.rt.fd()) {
                                read_leased(&sh, sv, p, fd, &mut buf, &mut core_events, &mut bufs, &mut dirty);
                                continue;
                            }
                        }
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
                            let ip = InPlace { sv: serving.as_ref(), bufs: &mut bufs, dirty: &mut dirty };
                            read_psock(&sh, &rt, rx, &mut buf, &mut core_events, ip);
                        }
                    }
                }
            }
        }
        // The worker's own state (writes made whole, leases), then the
        // deadlines (assembly timeouts): one hold.
        {
            let now = sh.now();
            let mut core = sh.lock();
            bufs.own.hold(&mut core, now);
            core.drain_events(&mut core_events);
            next_deadline = core.mux.poll_timeout();
            if let Some(t) = next_deadline {
                if t <= now {
                    core.mux.handle_timeout(now);
                    core.drain_events(&mut core_events);
                    next_deadline = core.mux.poll_timeout();
                }
            }
        }
        sh.dispatch(&mut core_events, &mut Ctx::Worker(&mut dirty, &mut bufs.own));
        if let Some(sv) = &serving {
            crate::serve::pass(&sh, sv, &mut bufs, &mut core_events, &mut dirty, serve_ready);
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
        crate::serve::end_pass(serving.as_ref(), &mut bufs);
    }
}

/// What a worker needs to feed a read: its serving buffers (with its own
/// hand-off state), and, when it serves in place, what runs its handler on
/// a read's messages where they lie.
pub(crate) struct InPlace<'a> {
    pub sv: Option<&'a Serving>,
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
    ip: InPlace<'_>,
) {
    if let Some(tls) = &rt.tls {
        return crate::shared::tls::epoll_read(sh, rt, tls, buf, events);
    }
    let RxRoom { cap, loan } = rx.unwrap_or_else(|| {
        let mut core = sh.lock();
        RxRoom::of(core.mux.rx_room(rt.id))
    });
    if let Some(loan) = loan {
        return read_lent(sh, rt, loan, events, &mut ip.bufs.own);
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
    match ReadEnd::of_io(&res) {
        ReadEnd::Data(n) => feed_bytes(sh, rt, &buf[..n], read_at, events, ip),
        end => read_ended(sh, rt, sh.lock(), end, events),
    }
}

/// The bytes of one read of `rt`, read at `read_at`, to the core; on a
/// serving worker, the whole messages for its own socket served at once,
/// where they lie in `data`.
fn feed_bytes(sh: &Shared, rt: &Arc<PsockRt>, data: &[u8], read_at: u64, events: &mut Vec<Event>, ip: InPlace<'_>) {
    let now = sh.timestamp(read_at);
    let mut core = sh.lock();
    match ip.sv {
        Some(sv) => {
            let mut ranges = std::mem::take(&mut ip.bufs.ranges);
            ranges.clear();
            let _ = crate::shared::feed_read_in_place(&mut core, &mut ip.bufs.own, rt.id, data, now, &mut ranges);
            core.drain_events(events);
            drop(core);
            if !ranges.is_empty() {
                // Its replies are written at once (`send_outs`).
                serve_in_place(sh, sv, ip.bufs, data, &ranges, rt.id, read_at, events, ip.dirty, Some(rt));
                ranges.clear();
            }
            ip.bufs.ranges = ranges;
        }
        None => {
            let _ = crate::shared::feed_read(&mut core, &mut ip.bufs.own, rt.id, data, now);
            core.drain_events(events);
        }
    }
}

/// A read of psock `p`, lent to this worker (`Own::leases`): served with
/// no core lock when it is all whole messages (`serve::serve_leased`);
/// otherwise, or at the end of the stream, the lease goes back and the
/// read goes the usual way.
#[allow(clippy::too_many_arguments)]
fn read_leased(
    sh: &Shared,
    sv: &Serving,
    p: connmux_core::mux::PsockId,
    fd: std::os::fd::RawFd,
    buf: &mut [u8],
    events: &mut Vec<Event>,
    bufs: &mut ServeBufs,
    dirty: &mut Vec<Arc<PsockRt>>,
) {
    let res = connmux_sys::socket::read(fd, buf);
    let read_at = connmux_sys::clock::now_nanos();
    match ReadEnd::of_io(&res) {
        ReadEnd::Data(n) => {
            if let Err(Some(rt)) = crate::serve::serve_leased(sh, sv, bufs, &buf[..n], p, fd, read_at, events, dirty) {
                feed_bytes(sh, &rt, &buf[..n], read_at, events, InPlace { sv: Some(sv), bufs, dirty });
            }
        }
        ReadEnd::Again => {}
        end => {
            let mut core = sh.lock();
            let Some(rt) = bufs.own.unlease_rt(&mut core, p, sh.timestamp(read_at)) else { return };
            read_ended(sh, &rt, core, end, events);
        }
    }
}

/// A read that brought no bytes: the end of the stream reaches the core
/// (and the psock is read no more); would-block, nothing.
fn read_ended(sh: &Shared, rt: &PsockRt, mut core: MutexGuard<'_, Core>, end: ReadEnd, events: &mut Vec<Event>) {
    if let Some(how) = end.end() {
        let _ = core.mux.rx_closed(rt.id, how);
        core.drain_events(events);
        drop(core);
        sh.set_interest(rt, |i| i.read = false);
    }
}

/// [`read_psock`] for a large message: one read straight into the psock's
/// assembly buffer (`Mux::rx_lend`), no more than the message still needs.
fn read_lent(
    sh: &Shared,
    rt: &PsockRt,
    mut loan: connmux_core::mux::RxLoan,
    events: &mut Vec<Event>,
    own: &mut crate::shared::Own,
) {
    let limit = loan.limit();
    let res = connmux_sys::socket::read_into(rt.fd(), loan.buf(), limit);
    let now = sh.now();
    let mut core = sh.lock();
    // The buffer goes back whatever happened (with nothing new on error).
    let _ = crate::shared::commit_read(&mut core, own, loan, now);
    match ReadEnd::of_io(&res) {
        ReadEnd::Data(_) => core.drain_events(events),
        end => read_ended(sh, rt, core, end, events),
    }
}
