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
//!   not connections, are spread), in each CPU's spare time only; a helper
//!   whose message waited on a CPU with no time to spare rests before it
//!   takes another ([`Pace`]), so it is not left waiting in that CPU's run
//!   queue, where it would change how the CPU's own threads are scheduled.
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
use std::time::{Duration, Instant};

use connmux_core::mux::PsockId;

use bytes::BytesMut;

use crate::handler::{Done, Handler, Job, Lanes, Verdict, SCRATCH_CHUNK, SCRATCH_LOW};
use crate::shared::Shared;
use crate::sync::crew::{Crew, Taker};

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

/// A helper's pace: after each message, whether it rests (out of its
/// CPU's run queue) before it takes another.
///
/// A helper runs only in its CPU's spare time, so a message it took on a
/// CPU that has none waits, runnable, until the CPU's own threads give way;
/// while it waits there the kernel schedules those threads differently (a
/// woken one no longer preempts the one running, and each exchange between
/// them costs two sleeps). So a message that waited longer than it ran
/// (and longer than `WAITED_MIN`: a short interruption is not a busy CPU)
/// sends the helper to rest for eight times the wait, doubled after each
/// such message in a row, at most `Tuning::helper_rest_max`; a message
/// that ran without waiting ends the rests.
///
/// ```text
///           waited                   waited again
///   Taking ────────► Resting(8 × wait) ──────────► Resting(2 × d, at most the max)
///     ▲                   │                              │
///     └── ran without waiting (the message after a rest) ┘
/// ```
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pace {
    /// The CPU had time for the last message: take the next at once.
    #[default]
    Taking,
    /// The last message waited: rest this long first.
    Resting(Duration),
}

/// Waits shorter than this are interruptions (a light request served on
/// the helper's CPU), not a CPU with no time to spare.
const WAITED_MIN: Duration = Duration::from_micros(200);

impl Pace {
    /// After a message that ran `ran` (thread CPU time) in `wall` (clock):
    /// the pace for the next one.
    pub fn after(self, ran: Duration, wall: Duration, max: Duration) -> Pace {
        let waited = wall.saturating_sub(ran);
        if waited <= ran.max(WAITED_MIN) {
            return Pace::Taking;
        }
        let rest = match self {
            Pace::Taking => waited.saturating_mul(8),
            Pace::Resting(d) => d.saturating_mul(2).max(waited.saturating_mul(8)),
        };
        Pace::Resting(rest.min(max))
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
    let helper = matches!(ctx.who, Taker::Helper(_));
    let mut pace = Pace::Taking;
    let mut scratch = BytesMut::new();
    while let Some((lane, job)) = lanes.crew.next(ctx.who, IDLE) {
        let len = job.data.len();
        if scratch.capacity() - scratch.len() < SCRATCH_LOW {
            scratch.reserve(SCRATCH_CHUNK);
        }
        // CPU time, not the clock: a helper runs in its CPU's spare time and
        // may be preempted for long in the middle of a short request.
        let cpu0 = connmux_sys::clock::thread_cpu_nanos();
        let wall0 = connmux_sys::clock::now_nanos();
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
        if helper {
            let wall = Duration::from_nanos(connmux_sys::clock::now_nanos().saturating_sub(wall0));
            pace = pace.after(Duration::from_nanos(took), wall, sh.tuning.helper_rest_max);
            if let Pace::Resting(d) = pace {
                // Until the scout sees spare time on this CPU, at most `d`.
                lanes.crew.rest(ctx.who, d);
            }
        }
    }
}

/// How often the scout looks at the CPUs of resting helpers.
const SCOUT_EVERY: Duration = Duration::from_millis(100);
/// A resting helper's CPU has time to spare once it was idle a tenth of the
/// rest so far, and at least this long (`/proc/stat` counts in 10 ms steps).
const SPARE_MIN: Duration = Duration::from_millis(20);

/// Whether a CPU idle `idle` over `over` has time to spare for a helper.
fn spare(idle: Duration, over: Duration) -> bool {
    idle >= SPARE_MIN && idle.saturating_mul(10) >= over
}

/// The scout: ends the rest of a helper (`cpus[h]`: the CPU helper `h` is
/// pinned to) once its CPU shows time to spare, so a helper rests long on
/// a busy CPU yet comes back soon after the CPU frees up. It runs at the
/// workers' priority (a helper under `SCHED_IDLE` could not look promptly
/// on a busy CPU without waiting in its run queue, which is what it rests
/// to avoid), every `SCOUT_EVERY` while a helper rests, and sleeps
/// otherwise. A helper on no CPU in particular rests its time out.
pub(crate) fn scout(lanes: Arc<Lanes>, cpus: Vec<Option<usize>>) {
    let crew = &lanes.crew;
    let pinned: Vec<usize> = cpus.iter().flatten().copied().collect();
    // Per helper: its CPU's idle time and the clock when its rest was first seen.
    let mut since: Vec<Option<(u64, Instant)>> = vec![None; cpus.len()];
    while crew.scout_wait(IDLE) {
        scout_look(crew, &cpus, &pinned, &mut since);
        if !crew.scout_pause(SCOUT_EVERY) {
            break;
        }
    }
}

/// One look of the scout: a resting helper's CPU idle time is noted when
/// its rest is first seen, and the rest is ended at a later look that
/// finds the CPU had time to spare since.
fn scout_look(crew: &Crew<Job>, cpus: &[Option<usize>], pinned: &[usize], since: &mut [Option<(u64, Instant)>]) {
    let resting: Vec<usize> = (0..cpus.len()).filter(|&h| crew.resting(h)).collect();
    if resting.is_empty() || pinned.is_empty() {
        since.iter_mut().for_each(|s| *s = None);
        return;
    }
    let Ok(idle) = connmux_sys::affinity::cpus_idle_nanos(pinned) else { return };
    let now = Instant::now();
    for (h, cpu) in cpus.iter().enumerate() {
        let Some(cpu) = cpu else { continue };
        let Some(idle) = pinned.iter().position(|c| c == cpu).and_then(|i| idle[i]) else { continue };
        if !resting.contains(&h) {
            since[h] = None;
            continue;
        }
        match since[h] {
            None => since[h] = Some((idle, now)),
            Some((idle0, t0)) => {
                if spare(Duration::from_nanos(idle.saturating_sub(idle0)), now - t0) {
                    crew.wake_rested(h);
                    since[h] = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{spare, Pace, WAITED_MIN};
    use std::time::Duration;

    const MAX: Duration = Duration::from_secs(1);
    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_message_that_ran_without_waiting_keeps_the_helper_taking() {
        // On an idle CPU the clock and the thread's CPU time agree.
        assert_eq!(Pace::Taking.after(us(200), us(210), MAX), Pace::Taking);
        // Interrupted for less than it ran, or for less than WAITED_MIN.
        assert_eq!(Pace::Taking.after(us(200), us(390), MAX), Pace::Taking);
        assert_eq!(Pace::Taking.after(us(10), us(10) + WAITED_MIN, MAX), Pace::Taking);
        // And one that ran without waiting ends a run of rests.
        assert_eq!(Pace::Resting(Duration::from_millis(500)).after(us(200), us(200), MAX), Pace::Taking);
    }

    #[test]
    fn a_message_that_waited_longer_than_it_ran_rests_the_helper_longer_each_time() {
        // 200 µs of work that took 5 ms on the clock: the CPU had no time.
        let p = Pace::Taking.after(us(200), us(5_200), MAX);
        assert_eq!(p, Pace::Resting(Duration::from_millis(40)), "eight times the wait");
        let p = p.after(us(200), us(1_200), MAX);
        assert_eq!(p, Pace::Resting(Duration::from_millis(80)), "doubled while messages keep waiting");
        let mut p = p;
        for _ in 0..10 {
            p = p.after(us(200), us(5_200), MAX);
        }
        assert_eq!(p, Pace::Resting(MAX), "never past the maximum");
        // A wait longer than the maximum itself rests the maximum.
        assert_eq!(Pace::Taking.after(us(200), Duration::from_secs(30), MAX), Pace::Resting(MAX));
    }

    #[test]
    fn a_cpu_has_time_to_spare_once_idle_a_tenth_of_the_rest() {
        let ms = Duration::from_millis;
        assert!(spare(ms(20), ms(200)));
        assert!(spare(ms(100), ms(300)));
        assert!(!spare(ms(19), ms(100)), "under /proc/stat's two steps");
        assert!(!spare(ms(20), ms(201)), "under a tenth");
        assert!(!spare(ms(0), ms(5_000)), "a busy CPU");
    }
}
