//! The heavy lanes: where serving workers send a connection whose requests
//! run long, and how its requests are then answered on every CPU.
//!
//! A worker that serves in place runs the handler on its own thread, so one
//! connection whose requests burn the CPU would keep the worker's other
//! connections waiting behind each request. When the worker finds such a
//! connection (`worker::SLOW_HANDLER`, several times in a row), it steers that
//! connection's messages to its lane: a KCM socket with a tag of its own,
//! tag-only in the core, taken from by
//!
//! - its **home lane**, a thread pinned on the worker's CPU at
//!   `Config::lane_nice` below the worker, and
//! - a **helper** on each other worker's CPU, under `SCHED_IDLE`, which
//!   takes messages from the other workers' lane sockets (stealing).
//!
//! Both take one message at a time, so whichever thread is free takes the
//! next one, and one heavy connection's requests run on every serving CPU at
//! once (KCM's point: messages, not connections, are spread). The kernel's
//! scheduler shares each CPU between its worker, its home lane and its
//! helper as between any threads: a light request waits for a time slice,
//! not for a heavy request to finish; a helper takes only the CPU's spare
//! time (any thread that wakes there preempts it at once), so the light
//! connections read on that CPU keep it; and the light connections stay on
//! the worker that reads them.
//!
//! A helper may be preempted anywhere for as long as its CPU is busy, so it
//! holds nothing that others wait on beyond the core lock: it takes messages
//! straight from the core, leaving the socket's readiness to the lane, and
//! leaves the writing of its replies to the psock's worker.
//!
//! Replies go back with `send_msg` to the psock (atomic per message), so
//! those of one heavy connection may leave in another order than its
//! requests came, as under KCM. `Config::lane_in_order` starts no helpers:
//! each lane socket has one reader, its replies keep request order, and a
//! heavy connection is answered on one CPU.
//!
//! A connection is heavy for a while, not for ever: once its requests have
//! run short [`RETURN_AFTER`] times in a row in its home lane, and none of
//! its messages wait there, it is steered back to its worker.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use connmux_core::mux::{Event, MuxError, PsockId};
use connmux_core::Bytes;

use bytes::BytesMut;

use crate::mux::Mux;
use crate::service::{Handler, ServiceStats, Verdict};
use crate::shared::Ctx;
use crate::socket::{KcmSocket, Message};
use crate::worker::{SCRATCH_CHUNK, SCRATCH_LOW};

/// Messages a lane takes per receive when nobody else reads its socket
/// (`Config::lane_in_order`).
const LANE_BATCH: usize = 16;
/// Messages a lane takes per receive when helpers read its socket too: one,
/// so that every message still waiting can go to the next thread free.
const SHARED_BATCH: usize = 1;
/// How long a lane with nothing to do sleeps before it looks at its stop
/// flag anyway (shutdown wakes it through its socket's readiness at once;
/// this only bounds a wake-up that went missing).
const LANE_IDLE: Duration = Duration::from_secs(1);
/// How long a lane waits after its socket failed (the mux shutting down)
/// before it looks at its stop flag again.
const LANE_RETRY: Duration = Duration::from_millis(100);
/// How long a helper waits when a lane socket still looks readable but has
/// nothing for it (its lane takes the last messages and lowers readiness).
const HELP_BACKOFF: Duration = Duration::from_micros(200);
/// Messages a lane socket must hold for a helper to take one.
const STEAL_FROM: usize = 2;
/// Short handler runs in a row (under `worker::SLOW_HANDLER`) after which a
/// connection leaves the lane: many more than the slow runs that sent it
/// there, so a connection mixing heavy and light requests does not go back
/// and forth.
pub(crate) const RETURN_AFTER: u32 = 64;

/// What a lane thread does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Its worker's lane socket's own reader: counts short runs and returns
    /// connections light again to the worker. `shared`: helpers read the
    /// socket too.
    Home { shared: bool },
    /// Takes messages from the other workers' lane sockets.
    Helper,
}

/// Where a lane thread runs and what it does.
pub(crate) struct LaneCtx {
    pub role: Role,
    /// The CPU of the worker it sits beside.
    pub cpu: Option<usize>,
    /// Nice steps below that worker (`Config::lane_nice`; a helper runs
    /// under `SCHED_IDLE` instead).
    pub nice: i32,
}

/// The affinity tag of worker `i`'s lane socket (worker sockets use `0..workers`).
pub(crate) fn lane_tag(workers: usize, i: usize) -> u32 {
    (workers + i) as u32
}

/// A lane thread: take messages from `socks` (a home lane: its worker's
/// lane socket; a helper: the other workers') and answer them, until `stop`.
/// The sockets are non-blocking: a reply refused because its peer does not
/// read (`MuxConfig::psock_sndbuf`) aborts that connection, as on a worker.
pub(crate) fn run(
    mux: Mux,
    socks: Vec<Arc<KcmSocket>>,
    handler: Arc<dyn Handler>,
    stats: Option<Arc<ServiceStats>>,
    ctx: LaneCtx,
    stop: Arc<AtomicBool>,
) {
    if let Some(cpu) = ctx.cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    // Best effort: a lane at the worker's priority still works.
    if ctx.role == Role::Helper {
        let _ = connmux_sys::affinity::idle_current_thread();
    } else if ctx.nice != 0 {
        let _ = connmux_sys::affinity::renice_current_thread(ctx.nice);
    }
    let batch = if ctx.role == (Role::Home { shared: false }) { LANE_BATCH } else { SHARED_BATCH };
    let fds: Vec<RawFd> = socks.iter().map(|s| s.as_raw_fd()).collect();
    let mut msgs: Vec<Message> = Vec::with_capacity(batch);
    let mut scratch = BytesMut::new();
    // Short runs in a row of each connection in a home lane.
    let mut short: rustc_hash::FxHashMap<PsockId, u32> = Default::default();
    // The socket a helper looks at first (in turn, so none is left behind).
    let mut first = 0;
    // A helper's last wait ended with a socket readable.
    let mut woken = false;
    while !stop.load(Ordering::Acquire) {
        let mut failed = false;
        let mut from = None;
        for k in 0..socks.len() {
            let i = (first + k) % socks.len();
            let got = match ctx.role {
                Role::Helper => take_one(&mux, &socks[i], &mut msgs),
                Role::Home { .. } => socks[i].recv_batch(&mut msgs, batch),
            };
            match got {
                Ok(_) => {
                    from = Some(i);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => failed = true,
            }
        }
        let Some(i) = from else {
            if failed {
                // A socket is gone while the mux shuts down: wait and look at
                // `stop` again. A lane never ends on its own, or the psocks
                // steered to it would wait forever.
                std::thread::sleep(LANE_RETRY);
            } else if ctx.role == Role::Helper && woken {
                // The lane socket still says readable but its lane has not
                // yet seen it empty (a helper leaves readiness to the lane).
                woken = false;
                std::thread::sleep(HELP_BACKOFF);
            } else if !stop.load(Ordering::Acquire) {
                // Looked at again after the receives lowered the readiness: a
                // shutdown that raised it before that has set `stop` too.
                match connmux_sys::poll::poll_any_readable(&fds, Some(LANE_IDLE)) {
                    Ok(r) => woken = r,
                    // Not expected (the fds live as long as `socks`): no spin.
                    Err(_) => std::thread::sleep(LANE_RETRY),
                }
            }
            continue;
        };
        first = i + 1;
        woken = false;
        for m in msgs.drain(..) {
            if scratch.capacity() - scratch.len() < SCRATCH_LOW {
                scratch.reserve(SCRATCH_CHUNK);
            }
            let psock = m.psock;
            let t0 = connmux_sys::clock::now_nanos();
            let verdict = handler.handle(m.data, psock, &mut scratch);
            if let Role::Home { .. } = ctx.role {
                if Duration::from_nanos(crate::worker::since(t0)) < crate::worker::SLOW_HANDLER {
                    if short.len() >= 4096 && !short.contains_key(&psock) {
                        // Bounded: connections that left long ago are forgotten.
                        short.clear();
                    }
                    *short.entry(psock).or_insert(0) += 1;
                } else {
                    short.remove(&psock);
                }
            }
            let close = match verdict {
                Verdict::Reply(b) if ctx.role == Role::Helper => {
                    send_for_worker(&mux, &socks[i], b, psock) == Err(MuxError::WouldBlock)
                }
                Verdict::Reply(b) => {
                    socks[i].send_msg(b, Some(psock)).is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock)
                }
                Verdict::Close => true,
                Verdict::NoReply | Verdict::Appended => false,
            };
            if close {
                if let Some(st) = &stats {
                    st.closed.fetch_add(1, Ordering::Relaxed);
                }
                short.remove(&psock);
                let _ = mux.abort(psock);
            } else {
                // Answered (or nothing to answer): a closing psock may close.
                mux.rx_settle(psock, 1);
            }
        }
        // Every message taken has been answered: a connection light again
        // goes home once none of its messages wait here (else after the
        // next batch). A helper may still be answering one of them then,
        // whose reply may leave after the worker's next ones.
        if let (Role::Home { .. }, Some(home)) = (ctx.role, socks.first()) {
            short.retain(|&p, n| *n < RETURN_AFTER || !mux.lane_return(home.id(), p));
        }
    }
}

/// A helper's reply: queued on the psock like [`KcmSocket::send_msg`], but
/// written by the psock's worker, not here. A helper may be preempted at any
/// moment (`SCHED_IDLE`), and a write it had begun would hold every later
/// reply of that connection until its CPU had time to spare again.
fn send_for_worker(mux: &Mux, sock: &KcmSocket, msg: Bytes, psock: PsockId) -> Result<(), MuxError> {
    let sh = mux.shared();
    let mut events = Vec::new();
    let sent = {
        let mut core = sh.lock();
        let sent = core.mux.send_msg(sock.id(), Some(psock), msg, false);
        core.drain_events(&mut events);
        sent
    };
    events.retain(|ev| match ev {
        Event::PsockTransmit(p) => {
            if let Some(rt) = sh.psock_rt(*p) {
                sh.want_write(&rt);
            }
            false
        }
        _ => true,
    });
    if !events.is_empty() {
        sh.dispatch(&mut events, &mut Ctx::App);
    }
    sent
}

/// A helper's receive: one message from `sock` when at least
/// [`STEAL_FROM`] wait there, leaving the socket's readiness to its lane. A helper may be preempted at any moment
/// (`SCHED_IDLE`); one preempted while raising or lowering readiness would
/// keep the lane asleep on a socket with messages.
fn take_one(mux: &Mux, sock: &KcmSocket, out: &mut Vec<Message>) -> io::Result<usize> {
    let sh = mux.shared();
    let mut events = Vec::new();
    let got = {
        let mut core = sh.lock();
        // Only from a lane that is behind: the head stays for the lane, so a
        // connection's lone request never waits on a helper whose CPU has
        // no time to spare.
        let got = match core.mux.rx_queued(sock.id()) {
            Ok(n) if n >= STEAL_FROM => core.mux.recv_msg(sock.id()),
            Ok(_) => Err(MuxError::WouldBlock),
            Err(e) => Err(e),
        };
        core.drain_events(&mut events);
        got
    };
    if !events.is_empty() {
        sh.dispatch(&mut events, &mut Ctx::App);
    }
    match got {
        Ok((data, psock)) => {
            out.push(Message { data, psock });
            Ok(1)
        }
        Err(e) => Err(crate::mux::io_err(e)),
    }
}
