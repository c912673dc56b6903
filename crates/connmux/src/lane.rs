//! The heavy lanes: where a serving worker sends the requests of a
//! connection whose handler runs long, and the threads that answer them on
//! every CPU.
//!
//! A worker that serves in place runs the handler on its own thread, so one
//! connection whose requests burn the CPU would keep the worker's other
//! connections waiting behind each request. When the worker finds such a
//! connection (`Tuning::slow_handler`, `Tuning::slow_hits` runs in a row) it marks it
//! heavy, in its own state (no lock, nothing shared changes), and from then
//! on offers that connection's messages to its lane instead of running
//! them (`sync::crew`):
//!
//! ```text
//!  worker i ──offer(msg)──► lane i (bounded queue) ──► home i  (CPU i, nice +3)
//!     ▲                                          └───► help j  (CPU j ≠ i, SCHED_IDLE): steals
//!     └──────────── inbox i ◄── Done { psock, verdict } ─────┘
//!  worker i queues the reply on the connection and writes it (the owner writes)
//! ```
//!
//! - lane `i`'s **home** thread, pinned on worker `i`'s CPU at
//!   `Config::lane_nice` below the worker: the kernel shares that CPU
//!   between the worker and its lane, so a light request waits for a time
//!   slice, not for a heavy request to end;
//! - a **helper** on every worker's CPU, under `SCHED_IDLE`, takes messages
//!   from the *other* workers' lanes while they are behind
//!   (`Tuning::lane_steal_from` messages or more, 2): one heavy
//!   connection's requests run on every CPU at once (KCM's point: messages,
//!   not connections, are spread), in each CPU's spare time only.
//!
//! A taker never touches the core or the connection: it runs the handler
//! and posts the verdict to the worker that offered the message
//! (`sync::inbox`, one eventfd wake-up per batch), which queues the reply
//! and settles the request as it does for its own. Nothing a taker holds is
//! waited for by anyone else, so a helper preempted for as long as its CPU
//! is busy delays only the one message it took.
//!
//! With helpers, a heavy connection's replies may leave in another order
//! than its requests came, as under KCM (protocols that match replies by
//! tag or xid, such as ONC RPC and 9P, need no order). `Config::lane_in_order`
//! starts no helpers: each lane has one taker, its replies keep request
//! order, and a heavy connection is answered on one CPU.
//!
//! A connection is heavy for a while, not for ever: once `Tuning::lane_return_after`
//! of its requests in a row ran short and none of them is still in the
//! lane, its worker runs its requests itself again.
//!
//! Owns the lane threads and a worker's view of its heavy connections
//! ([`Heavy`]); the queues themselves are `handler::Lanes`. Must not name
//! serving, a driver or the public `Mux`: a lane thread holds only the
//! `Shared` whose workers it wakes.

use std::sync::Arc;
use std::time::Duration;

use connmux_core::mux::PsockId;

use bytes::BytesMut;

use crate::handler::{Done, Handler, Lanes, Verdict, SCRATCH_CHUNK, SCRATCH_LOW};
use crate::shared::Shared;
use crate::sync::crew::Taker;

/// How long a taker with nothing to do sleeps before it looks again anyway
/// (work and shutdown unpark it at once; this only bounds a lost wake-up).
const IDLE: Duration = Duration::from_secs(1);

/// A worker's view of its heavy connections (its own state: no lock).
pub(crate) struct Heavy {
    /// Bytes of this worker's requests in its lane (offered, not answered).
    bytes: usize,
    conns: rustc_hash::FxHashMap<PsockId, HeavyConn>,
    /// `Tuning::lane_return_after`.
    return_after: u32,
}

impl Default for Heavy {
    fn default() -> Heavy {
        Heavy::new(crate::config::Tuning::default().lane_return_after)
    }
}

#[derive(Default)]
struct HeavyConn {
    /// Its messages offered and not yet answered.
    in_lane: u32,
    /// Short runs in a row.
    short: u32,
}

impl Heavy {
    /// No heavy connection yet; one goes back to its worker after
    /// `return_after` short runs in a row.
    pub fn new(return_after: u32) -> Heavy {
        Heavy { bytes: 0, conns: Default::default(), return_after }
    }

    /// Whether `p`'s messages go to the lane.
    #[inline]
    pub fn contains(&self, p: PsockId) -> bool {
        !self.conns.is_empty() && self.conns.contains_key(&p)
    }

    /// Mark `p` heavy. Returns whether it was not already.
    pub fn mark(&mut self, p: PsockId) -> bool {
        if self.conns.len() >= 4096 {
            // Bounded: connections with nothing in the lane are forgotten
            // (a closed one's entry would otherwise stay).
            self.conns.retain(|_, c| c.in_lane > 0);
        }
        let new = !self.conns.contains_key(&p);
        self.conns.entry(p).or_default();
        new
    }

    /// Whether a request of `len` bytes fits in the lane's byte bound.
    #[inline]
    pub fn room(&self, len: usize, limit: usize) -> bool {
        self.bytes + len <= limit
    }

    /// A message of `p`, `len` bytes, went to the lane.
    pub fn offered(&mut self, p: PsockId, len: usize) {
        self.bytes += len;
        self.conns.entry(p).or_default().in_lane += 1;
    }

    /// A message of `p` came back. Returns whether `p` is light again (and
    /// no longer heavy).
    pub fn answered(&mut self, p: PsockId, short: bool, len: usize) -> bool {
        self.bytes = self.bytes.saturating_sub(len);
        let Some(c) = self.conns.get_mut(&p) else { return false };
        c.in_lane = c.in_lane.saturating_sub(1);
        c.short = if short { c.short + 1 } else { 0 };
        if c.short >= self.return_after && c.in_lane == 0 {
            self.conns.remove(&p);
            return true;
        }
        false
    }

    /// `p` was closed: forget it once nothing of it is in the lane.
    pub fn closed(&mut self, p: PsockId) {
        if self.conns.get(&p).is_some_and(|c| c.in_lane == 0) {
            self.conns.remove(&p);
        }
    }
}

/// Where a lane thread runs and what it does.
pub(crate) struct LaneCtx {
    pub who: Taker,
    /// The CPU of the worker it sits beside.
    pub cpu: Option<usize>,
    /// Nice steps below that worker (`Config::lane_nice`; a helper runs
    /// under `SCHED_IDLE` instead).
    pub nice: i32,
}

/// A lane thread: take messages (`ctx.who`), answer them, post the
/// verdicts to the workers that offered them, until the crew stops.
pub(crate) fn run(sh: Arc<Shared>, lanes: Arc<Lanes>, handler: Arc<dyn Handler>, ctx: LaneCtx) {
    if let Some(cpu) = ctx.cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    // Best effort: a lane at the worker's priority still works.
    if matches!(ctx.who, Taker::Helper(_)) {
        let _ = connmux_sys::affinity::idle_current_thread();
    } else if ctx.nice != 0 {
        let _ = connmux_sys::affinity::renice_current_thread(ctx.nice);
    }
    let slow = sh.tuning.slow_handler;
    let mut scratch = BytesMut::new();
    while let Some((lane, job)) = lanes.crew.next(ctx.who, IDLE) {
        let len = job.data.len();
        if scratch.capacity() - scratch.len() < SCRATCH_LOW {
            scratch.reserve(SCRATCH_CHUNK);
        }
        // CPU time, not the clock: a helper runs in its CPU's spare time and
        // may be preempted for long in the middle of a short request.
        let cpu0 = connmux_sys::clock::thread_cpu_nanos();
        let verdict = match handler.handle(job.data, job.psock, &mut scratch) {
            // `handle` has no `out` to append to.
            Verdict::Appended => Verdict::NoReply,
            v => v,
        };
        let took = connmux_sys::clock::thread_cpu_nanos().saturating_sub(cpu0);
        let short = Duration::from_nanos(took) < slow;
        if lanes.inboxes[lane].post(Done { psock: job.psock, verdict, short, len }) {
            let _ = sh.workers[lane].waker.notify();
        }
    }
}
