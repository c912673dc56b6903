//! The heavy lanes: where serving workers send a connection whose requests
//! run long.
//!
//! A worker that serves in place runs the handler on its own thread, so one
//! connection whose requests burn the CPU would keep the worker's other
//! connections waiting behind each request. When the worker finds such a
//! connection (`worker::SLOW_HANDLER`, several times in a row), it steers that
//! connection's messages to the heavy lanes: one KCM socket, tag-only in the
//! core, with the heavy tag, and one lane thread pinned on each worker's CPU,
//! all taking from that one queue, a message at a time. A heavy connection's
//! requests are then answered on every serving CPU at once (KCM's point:
//! messages, not connections, are spread), and whichever lane is free takes
//! the next one. Each lane runs a few nice steps below its worker, so the
//! kernel's scheduler shares the CPU between the worker and the lane as
//! between any two threads: a light request waits for a time slice, not for a
//! heavy request to finish, and the light connections stay on the worker that
//! reads them.
//!
//! Replies go back with `send_msg` to the psock (atomic per message), so
//! those of one heavy connection may leave in another order than its
//! requests came, as under KCM. `Config::lane_in_order` gives each worker a
//! lane of its own instead (its tag, one thread): in order, on one CPU.
//!
//! A connection is heavy for a while, not for ever: once its requests have
//! run short [`RETURN_AFTER`] times in a row on a lane, and none of its
//! messages wait there, it is steered back to its worker.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use connmux_core::mux::PsockId;

use bytes::BytesMut;

use crate::mux::Mux;
use crate::service::{Handler, ServiceStats, Verdict};
use crate::socket::{KcmSocket, Message};
use crate::worker::{SCRATCH_CHUNK, SCRATCH_LOW};

/// Messages a lane of its own takes per receive (`Config::lane_in_order`).
const LANE_BATCH: usize = 16;
/// Messages a lane that shares its queue takes per receive: one, so that
/// every message still waiting can go to the next lane free.
const SHARED_BATCH: usize = 1;
/// How long a lane with nothing to do sleeps before it looks at its stop
/// flag anyway (shutdown wakes it through its socket's readiness at once;
/// this only bounds a wake-up that went missing).
const LANE_IDLE: Duration = Duration::from_secs(1);
/// How long a lane waits after its socket failed (the mux shutting down)
/// before it looks at its stop flag again.
const LANE_RETRY: Duration = Duration::from_millis(100);
/// Short handler runs in a row (under `worker::SLOW_HANDLER`) after which a
/// connection leaves the lane: many more than the slow runs that sent it
/// there, so a connection mixing heavy and light requests does not go back
/// and forth.
pub(crate) const RETURN_AFTER: u32 = 64;

/// Where a lane runs and how it takes its messages.
pub(crate) struct LaneCtx {
    /// Whether other lanes take from the same socket.
    pub shared: bool,
    /// The CPU of the worker it sits beside.
    pub cpu: Option<usize>,
    /// `Config::lane_nice`.
    pub nice: i32,
}

/// The affinity tag of worker `i`'s lane (worker sockets use `0..workers`):
/// with `in_order`, one per worker; else the one heavy tag all lanes share.
pub(crate) fn lane_tag(workers: usize, i: usize, in_order: bool) -> u32 {
    if in_order {
        (workers + i) as u32
    } else {
        workers as u32
    }
}

/// A lane's thread: take the lane socket's messages and answer them, until
/// `stop` (the socket is shared with the other lanes unless
/// `Config::lane_in_order`). The socket is non-blocking: a reply refused because its peer does
/// not read (`MuxConfig::psock_sndbuf`) aborts that connection, as on a worker.
pub(crate) fn run(
    mux: Mux,
    sock: Arc<KcmSocket>,
    handler: Arc<dyn Handler>,
    stats: Option<Arc<ServiceStats>>,
    ctx: LaneCtx,
    stop: Arc<AtomicBool>,
) {
    if let Some(cpu) = ctx.cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    if ctx.nice != 0 {
        // Best effort: a lane at the worker's priority still works.
        let _ = connmux_sys::affinity::renice_current_thread(ctx.nice);
    }
    let batch = if ctx.shared { SHARED_BATCH } else { LANE_BATCH };
    let mut msgs: Vec<Message> = Vec::with_capacity(batch);
    let mut scratch = BytesMut::new();
    // Short runs in a row of each connection in the lane.
    let mut short: rustc_hash::FxHashMap<PsockId, u32> = Default::default();
    while !stop.load(Ordering::Acquire) {
        match sock.recv_batch(&mut msgs, batch) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Looked at again after the receive lowered the readiness: a
                // shutdown that raised it before that has set `stop` too.
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let _ = connmux_sys::poll::poll_readable(sock.as_raw_fd(), Some(LANE_IDLE));
                continue;
            }
            // The socket is gone while the mux shuts down: wait and look at
            // `stop` again. The lane never ends on its own, or the psocks
            // steered to it would wait forever.
            Err(_) => {
                std::thread::sleep(LANE_RETRY);
                continue;
            }
        }
        for m in msgs.drain(..) {
            if scratch.capacity() - scratch.len() < SCRATCH_LOW {
                scratch.reserve(SCRATCH_CHUNK);
            }
            let psock = m.psock;
            let t0 = connmux_sys::clock::now_nanos();
            let verdict = handler.handle(m.data, psock, &mut scratch);
            if Duration::from_nanos(crate::worker::since(t0)) < crate::worker::SLOW_HANDLER {
                if short.len() >= 4096 && !short.contains_key(&psock) {
                    // Bounded: connections that left long ago are forgotten.
                    short.clear();
                }
                *short.entry(psock).or_insert(0) += 1;
            } else {
                short.remove(&psock);
            }
            let close = match verdict {
                Verdict::Reply(b) => sock.send_msg(b, Some(psock)).is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock),
                Verdict::Close => true,
                Verdict::NoReply | Verdict::Appended => false,
            };
            if close {
                if let Some(st) = &stats {
                    st.closed.fetch_add(1, Ordering::Relaxed);
                }
                short.remove(&psock);
                let _ = mux.abort(psock);
            }
        }
        // Every message taken has been answered: a connection light again
        // goes home once none of its messages wait here (else after the
        // next batch). Another lane may still be answering one of them, so
        // with shared lanes a reply may pass that one.
        short.retain(|&p, n| *n < RETURN_AFTER || !mux.lane_return(sock.id(), p));
    }
}
