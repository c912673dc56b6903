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
use connmux_core::Timestamp;
use connmux_sys::epoll::{Events, Interest};

use crate::config::Placement;
use crate::service::Handler;
use crate::shared::{token_psock, Ctx, PsockRt, Shared, SockRt, WorkerIo};

pub(crate) const WAKER_TOKEN: u64 = u64::MAX;
pub(crate) const SERVE_TOKEN: u64 = u64::MAX - 1;

/// Messages a worker takes from its socket per lock acquisition.
const SERVE_BATCH: usize = 256;
/// Replies are cut out of `scratch` in chunks of this size: a handler's small
/// `extend_from_slice` would otherwise allocate a fresh buffer (and a shared
/// header on `split`) for every reply, two allocations per message.
const SCRATCH_CHUNK: usize = 64 * 1024;
/// Below this much spare room a new chunk is started before a handler runs.
const SCRATCH_LOW: usize = 4 * 1024;

/// Requests from other threads, delivered through the worker's waker. The
/// epoll worker gets only `Serve` (other threads use epoll_ctl directly); the
/// io_uring worker gets all of them, as its ring is its own.
pub(crate) enum Command {
    /// Run `handler` in place on messages steered to socket `sock`.
    Serve { sock: Arc<SockRt>, handler: Arc<dyn Handler> },
    /// A psock was attached to this worker: start receiving.
    Attach(Arc<PsockRt>),
    /// The core takes bytes from this psock again (`PsockRxResume`).
    Resume(PsockId),
    /// The psock failed: stop receiving from it.
    StopRx(PsockId),
    /// The psock has bytes to write that another thread could not.
    Flush(PsockId),
    /// The core released the psock: end its operations, then drop it.
    Release(Arc<PsockRt>),
}

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
    let mut msgs = Vec::with_capacity(SERVE_BATCH);
    let mut replies = Vec::with_capacity(SERVE_BATCH);
    let mut scratch = bytes::BytesMut::new();

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
                                Command::Serve { sock, handler } => {
                                    let _ = epoll.add(sock.rx.fd.as_raw_fd(), SERVE_TOKEN, Interest::READ);
                                    crate::shared::set_own_serve(sock.id);
                                    serving = Some(Serving { sock, handler });
                                    serve_ready = true;
                                }
                                // Other threads reach epoll psocks through epoll_ctl.
                                _ => {}
                            }
                        }
                    }
                    SERVE_TOKEN => serve_ready = true,
                    t => {
                        let p = token_psock(t);
                        let Some(rt) = sh.psock_rt(p) else { continue };
                        if ev.writable {
                            sh.set_interest(&rt, |i| i.write = false);
                            if !rt.flush_queued.swap(true, Ordering::AcqRel) {
                                dirty.push(rt.clone());
                            }
                        }
                        if ev.readable || ev.hup || ev.error {
                            read_psock(&sh, &rt, &mut buf, &mut core_events);
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
            // Serve whenever this pass may have steered messages to us.
            if serve_ready || n > 0 {
                serve(&sh, sv, &mut msgs, &mut replies, &mut scratch, &mut core_events, &mut dirty);
            }
        }
        for rt in dirty.drain(..) {
            rt.flush_queued.store(false, Ordering::Release);
            sh.flush(&rt, &mut core_events);
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

/// One read from a readable psock, bounded by what the core will accept.
fn read_psock(sh: &Shared, rt: &PsockRt, buf: &mut [u8], events: &mut Vec<Event>) {
    let cap = sh.lock().mux.rx_capacity(rt.id);
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
    let now = sh.now();
    let mut core = sh.lock();
    match res {
        Ok(0) => {
            let _ = core.mux.rx_closed(rt.id, None);
            core.drain_events(events);
            drop(core);
            sh.set_interest(rt, |i| i.read = false);
        }
        Ok(n) => {
            let _ = core.mux.feed(rt.id, &buf[..n], now);
            core.drain_events(events);
        }
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
        Err(e) => {
            let _ = core.mux.rx_closed(rt.id, Some(e.raw_os_error().unwrap_or(libc::EIO)));
            core.drain_events(events);
            drop(core);
            sh.set_interest(rt, |i| i.read = false);
        }
    }
}

/// Run the handler on every message queued on this worker's socket.
pub(crate) fn serve(
    sh: &Shared,
    sv: &Serving,
    msgs: &mut Vec<(connmux_core::Bytes, PsockId)>,
    replies: &mut Vec<(PsockId, crate::service::Verdict)>,
    scratch: &mut bytes::BytesMut,
    events: &mut Vec<Event>,
    dirty: &mut Vec<Arc<PsockRt>>,
) {
    // Everything queued so far is looked at below.
    let _ = crate::shared::take_own_pending();
    // Bounded: SERVE_BATCH × 64 messages per pass, then back to I/O.
    for _ in 0..64 {
        sv.sock.rx.clear();
        {
            let mut core = sh.lock();
            while msgs.len() < SERVE_BATCH {
                match core.mux.recv_msg(sv.sock.id) {
                    Ok(m) => msgs.push(m),
                    Err(MuxError::WouldBlock) | Err(_) => break,
                }
            }
            if core.mux.rx_queued(sv.sock.id).unwrap_or(0) > 0 {
                sv.sock.rx.set();
            }
            core.drain_events(events);
        }
        if msgs.is_empty() {
            break;
        }
        for (data, psock) in msgs.drain(..) {
            if scratch.capacity() - scratch.len() < SCRATCH_LOW {
                scratch.reserve(SCRATCH_CHUNK);
            }
            let v = sv.handler.handle(data, psock, scratch);
            replies.push((psock, v));
        }
        let mut aborts = Vec::new();
        {
            let mut core = sh.lock();
            for (psock, v) in replies.drain(..) {
                match v {
                    crate::service::Verdict::Reply(b) => {
                        // A reply to a connection that went away is dropped, as
                        // a send on a closed socket would be. A refused one
                        // means its peer has not read `psock_sndbuf` bytes of
                        // replies while still sending: that connection is
                        // aborted (counted in tx_backlog_refusals), nobody
                        // else waits for it.
                        if let Err(MuxError::WouldBlock) = core.mux.send_msg(sv.sock.id, Some(psock), b, false) {
                            aborts.push(psock);
                        }
                    }
                    crate::service::Verdict::NoReply => {}
                    crate::service::Verdict::Close => aborts.push(psock),
                }
            }
            core.drain_events(events);
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
}
