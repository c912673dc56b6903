//! The heavy lanes: where a serving worker sends the requests of a
//! connection whose handler runs long, and the threads that answer them on
//! every CPU.
//!
//! A worker that serves in place runs the handler on its own thread, so one
//! connection whose requests burn the CPU would keep the worker's other
//! connections waiting behind each request. When the worker finds such a
//! connection (`Tuning::slow_handler`, three runs in a row;
//! or a busy one, many requests of `Tuning::busy_handler` or more) it marks it
//! heavy, in its own state (no lock, nothing shared changes), and from then
//! on offers that connection's messages to its lane instead of running
//! them (`sync::crew`):
//!
//! ```text
//!  worker i ──offer(msg)──► lane i (bounded queue) ──► home i  (CPU i, nice +3, short slices)
//!     ▲                                          └───► help j  (CPU j ≠ i, SCHED_IDLE): steals
//!     └──────────── inbox i ◄── Done { psock, verdict } ─────┘
//!  worker i queues the reply on the connection and writes it (the owner writes)
//! ```
//!
//! - lane `i`'s **home** thread, pinned on worker `i`'s CPU at
//!   `Config::lane_nice` below the worker: the kernel shares that CPU
//!   between the worker and its lane, so a light request waits for a time
//!   slice, not for a heavy request to end (and while the lane has work the
//!   worker runs in longer slices of its own, `Config::lane_worker_slice`,
//!   so that the lane cuts its passes less often), in short slices of its
//!   own (`Config::lane_slice`), so that a worker woken for light requests
//!   cuts in soon;
//! - a **helper** on every worker's CPU, under `SCHED_IDLE`, takes messages
//!   from the *other* workers' lanes while they are behind
//!   ([`LANE_STEAL_FROM`] messages or more): one heavy
//!   connection's requests run on every CPU at once (KCM's point: messages,
//!   not connections, are spread), in each CPU's spare time only: a helper
//!   takes only while the crew's scout finds its CPU with time to spare
//!   ([`scout`]), and stops when a message it took waited on its CPU
//!   ([`waited`]), so it is not left waiting in a busy CPU's run queue,
//!   where it would change how the CPU's own threads are scheduled.
//!
//! A taker never touches the core or the connection: it runs the handler
//! and posts the verdict to the worker that offered the message
//! (`sync::inbox`, one eventfd wake-up per batch), which queues the reply
//! and settles the request as it does for its own. While the lane is far
//! behind ([`LANE_QUIET_FROM`] messages queued) a taker posts quietly:
//! the worker is not woken for the reply but takes it when it looks next,
//! within [`LANE_REPLY_WAIT`] (it bounds its sleeps meanwhile), and
//! writes it with the others that came (`driver::worker::lane_sleep`).
//! Nothing a taker holds is waited for by anyone else, so a helper
//! preempted for as long as its CPU is busy delays only the one message it
//! took.
//!
//! With helpers, a heavy connection's replies may leave in another order
//! than its requests came, as under KCM (protocols that match replies by
//! tag or xid, such as ONC RPC and 9P, need no order). `Config::lane_in_order`
//! starts no helpers: each lane has one taker, its replies keep request
//! order, and a heavy connection is answered on one CPU.
//!
//! A connection is heavy for a while, not for ever: once [`LANE_RETURN_AFTER`]
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

/// Messages a heavy lane must hold for a helper (on another CPU) to take
/// one: a helper steals from a lane that is behind, not from one its home
/// thread keeps up with. The head always stays for the home thread, so a
/// connection's lone request never waits on a helper whose CPU has no time
/// to spare. 2, so that a heavy connection with only a few requests in
/// flight is still spread over every CPU (`docs/history/performance-log.md`,
/// "Uneven work (KCM's Thrift case)", has the figures).
pub(crate) const LANE_STEAL_FROM: usize = 2;

/// Messages a heavy lane must hold for its takers to post their replies
/// quietly: the worker is then not woken for each reply, but takes them
/// when it looks next (woken by anything else, or at the end of a sleep it
/// bounds by [`LANE_REPLY_WAIT`]), and writes them together. With this many
/// requests queued, the replies are not what the connection waits for.
/// Woken once a reply, the worker of one heavy connection with 32 requests
/// in flight spent about 15% of the CPU its requests were waiting for on
/// wake-ups and writes (`docs/history/performance-log.md`, "Replies of a
/// lane that is far behind"); one heavy connection at `-a32` on 2 CPUs
/// (`bench uneven`, epoll, 4 runs alternated with it off) made 1.82–1.92×
/// a thread per connection's requests, 1.65–1.81× without. Only while the
/// work queued ahead, at the cost of the request just answered, lasts
/// [`LANE_REPLY_WAIT`] or longer: a lane of short requests drains before
/// its quiet replies are taken.
const LANE_QUIET_FROM: usize = 8;

/// How long a worker whose lane posts quietly ([`LANE_QUIET_FROM`]) sleeps
/// at most, and so how long such a reply may wait for it (the epoll
/// driver's waits count in milliseconds). Only then: a timer this near is
/// reprogrammed on every sleep, which in a virtual machine is a trip to the
/// hypervisor (with every sleep bounded while a lane held requests, light
/// connections on the same worker lost 7% of their calls a second). A
/// worker that also answers light connections sleeps with no bound all the
/// same (with the bound they lost 15% of their calls beside a lane far
/// behind), and a quiet post wakes it (`driver::worker::lane_sleep`).
pub(crate) const LANE_REPLY_WAIT: Duration = Duration::from_millis(1);

/// Short handler runs in a row (under `Tuning::busy_handler`) after which a
/// heavy connection leaves its lane and is served by its worker again: many
/// more than the slow runs that sent it there, so a connection mixing heavy
/// and light requests does not go back and forth.
const LANE_RETURN_AFTER: u32 = 64;

/// How long a taker with nothing to do sleeps before it looks again anyway
/// (work and shutdown unpark it at once; this only bounds a lost wake-up).
const IDLE: Duration = Duration::from_secs(1);

/// A worker's view of its heavy connections (its own state: no lock).
#[derive(Default)]
pub(crate) struct Heavy {
    /// Bytes of this worker's requests in its lane (offered, not answered).
    bytes: usize,
    /// How many requests that is.
    out: usize,
    /// Requests ever offered to the lane (`Heavy::offers`).
    offers: u64,
    conns: rustc_hash::FxHashMap<PsockId, HeavyConn>,
}

#[derive(Default)]
struct HeavyConn {
    /// Its messages offered and not yet answered.
    in_lane: u32,
    /// Short runs in a row.
    short: u32,
}

impl Heavy {
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

    /// Whether requests are in the lane (offered, not answered).
    #[inline]
    pub fn out(&self) -> bool {
        self.out > 0
    }

    /// Requests offered to the lane since the worker started: whether the
    /// lane had work between two looks.
    #[inline]
    pub fn offers(&self) -> u64 {
        self.offers
    }

    /// A message of `p`, `len` bytes, went to the lane.
    pub fn offered(&mut self, p: PsockId, len: usize) {
        self.bytes += len;
        self.out += 1;
        self.offers += 1;
        let c = self.conns.entry(p).or_default();
        c.in_lane += 1;
    }

    /// A message of `p` came back. Returns whether `p` is light again (and
    /// no longer heavy).
    pub fn answered(&mut self, p: PsockId, short: bool, len: usize) -> bool {
        self.bytes = self.bytes.saturating_sub(len);
        self.out = self.out.saturating_sub(1);
        let Some(c) = self.conns.get_mut(&p) else { return false };
        c.in_lane = c.in_lane.saturating_sub(1);
        c.short = if short { c.short + 1 } else { 0 };
        if c.short >= LANE_RETURN_AFTER && c.in_lane == 0 {
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

/// Waits shorter than this are interruptions (a light request served on
/// the helper's CPU, another process's thread, a timer), not a CPU with no
/// time to spare: a helper held up behind its CPU's own busy threads waits
/// many milliseconds. Each message found waited idles the helper until
/// the scout's next look (up to `SCOUT_EVERY`), so a floor too low cost a
/// spare CPU up to a third of its time on a machine with other work
/// (`docs/performance.md`, "A helper waiting on a busy CPU").
const WAITED_MIN: Duration = Duration::from_millis(2);

/// Whether a helper's message that ran `ran` (thread CPU time) in `wall`
/// (clock) waited on a CPU with no time to spare: longer than it ran, and
/// longer than `WAITED_MIN`. A helper runs only in its CPU's spare time, so
/// such a message waited, runnable, until the CPU's own threads gave way;
/// while a helper waits there the kernel schedules those threads
/// differently (a woken one no longer preempts the one running, and each
/// exchange between them costs two sleeps), so the helper stops taking
/// until the scout finds the CPU with time to spare again.
fn waited(ran: Duration, wall: Duration) -> bool {
    wall.saturating_sub(ran) > ran.max(WAITED_MIN)
}

/// How long a helper sleeps before it looks again anyway: work (from a
/// spare CPU) and shutdown wake it at once, so this only bounds a lost
/// wake-up; long, because a helper that wakes on a busy CPU waits in its
/// run queue (what it sleeps to avoid).
const HELPER_IDLE: Duration = Duration::from_secs(60);

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
    } else {
        if ctx.nice != 0 {
            let _ = connmux_sys::affinity::renice_current_thread(ctx.nice);
        }
        // Short turns: a light request on this CPU waits for the lane's
        // slice to end, not for the scheduler's next tick.
        if !sh.lane_slice.is_zero() {
            let _ = connmux_sys::affinity::set_current_thread_slice(sh.lane_slice);
        }
    }
    // A request this long keeps its connection heavy (`Tuning::busy_handler`).
    let busy = sh.tuning.busy_handler;
    let helper = match ctx.who {
        Taker::Helper(h) => Some(h),
        Taker::Home(_) => None,
    };
    let idle = if helper.is_some() { HELPER_IDLE } else { IDLE };
    // Replies are posted quietly while the lane holds this many messages
    // ([`LANE_QUIET_FROM`]), and their work ahead lasts `LANE_REPLY_WAIT`.
    let reply_wait_ns = LANE_REPLY_WAIT.as_nanos() as u64;
    let mut scratch = BytesMut::new();
    // This thread's CPU time when it began its message: CPU time, not the
    // clock, because a helper runs in its CPU's spare time and may be
    // preempted for long in the middle of a short request. Read once a
    // message where one follows another (the end of one is the start of
    // the next, with the post between them: a system call is ~0.8 µs on the
    // machines of `docs/performance.md`, 4% of a 20 µs request), and again
    // after a wait: a park and its wake-up cost several µs of CPU, which
    // would make every light request of a lane that keeps up look busy.
    let mut cpu_mark = connmux_sys::clock::thread_cpu_nanos();
    loop {
        let (lane, job) = match lanes.crew.try_next(ctx.who) {
            Some(next) => next,
            None => match lanes.crew.wait_next(ctx.who, idle) {
                Some(next) => {
                    cpu_mark = connmux_sys::clock::thread_cpu_nanos();
                    next
                }
                None => break,
            },
        };
        let len = job.data.len();
        if scratch.capacity() - scratch.len() < SCRATCH_LOW {
            scratch.reserve(SCRATCH_CHUNK);
        }
        // (A helper also reads the clock: did its message wait?)
        let wall0 = helper.map(|_| connmux_sys::clock::now_nanos());
        let verdict = match handler.handle(job.data, job.psock, &mut scratch) {
            // `handle` has no `out` to append to.
            Verdict::Appended => Verdict::NoReply,
            v => v,
        };
        let cpu = connmux_sys::clock::thread_cpu_nanos();
        let took = cpu.saturating_sub(std::mem::replace(&mut cpu_mark, cpu));
        let short = Duration::from_nanos(took) < busy;
        // The worker is woken for the first reply it has not taken yet,
        // unless the lane is far behind: then it takes the reply when it
        // looks next, with those that came meanwhile, and within
        // `LANE_REPLY_WAIT` if it was asleep (`driver::worker::lane_sleep`).
        // Far behind is in messages and in time: the work queued ahead
        // (at this one's cost each) lasts at least that wait, so the reply
        // holds up nothing the lane would get to sooner; a lane of short
        // requests whose replies waited drained meanwhile and left its
        // takers idle (the client sends its next requests on the replies).
        let queued = lanes.crew.queued(lane);
        let quiet = queued >= LANE_QUIET_FROM && (queued as u64).saturating_mul(took) >= reply_wait_ns;
        let done = Done { psock: job.psock, verdict, short, len, quiet };
        let wake = match quiet {
            false => lanes.inboxes[lane].post(done),
            true => {
                sh.lane_quiet.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                lanes.inboxes[lane].post_quiet(done)
            }
        };
        if wake {
            let _ = sh.workers[lane].wake();
        }
        if let (Some(h), Some(wall0)) = (helper, wall0) {
            lanes.crew.ran(h, took);
            let wall = Duration::from_nanos(connmux_sys::clock::now_nanos().saturating_sub(wall0));
            if waited(Duration::from_nanos(took), wall) {
                // No more until the scout finds time to spare here.
                lanes.crew.set_spare(h, false);
            }
        }
    }
}

/// How often the scout looks at the helpers' CPUs while a lane is behind.
const SCOUT_EVERY: Duration = Duration::from_millis(100);
/// A look no older than this is the start of the next one's window; an
/// older one (the scout slept since) is not.
const LOOK_RECENT: Duration = Duration::from_millis(300);
/// The first look's interval after the scout slept (half of it idle is
/// one of `/proc/stat`'s steps).
const SCOUT_FIRST: Duration = Duration::from_millis(20);
/// A CPU has time to spare for its helper once it was idle, or ran the
/// helper's messages, a tenth of the time between two looks, and at least
/// this long (`/proc/stat` counts in 10 ms steps).
const SPARE_MIN: Duration = Duration::from_millis(10);

/// Whether a CPU idle (or running its helper) `free` over `over` has time
/// to spare for a helper.
fn spare(free: Duration, over: Duration) -> bool {
    free >= SPARE_MIN && free.saturating_mul(10) >= over
}

/// The scout: while some lane is behind (it holds messages for helpers),
/// looks at each helper's CPU (`cpus[h]`) every `SCOUT_EVERY` and tells the
/// crew whether it has time to spare: idle time in `/proc/stat` plus the
/// time the helper's own messages took. An offer wakes only a helper with
/// time to spare, and a helper takes only then; so a helper does not wait
/// in a busy CPU's run queue, yet joins within a look or two of its CPU
/// freeing up. It runs at the workers' priority (a helper under
/// `SCHED_IDLE` could not look promptly on a busy CPU), and sleeps while no
/// lane is behind. A helper on no CPU in particular, or on one whose idle
/// time cannot be read (no `/proc`), always counts as spare: the scout
/// cannot tell, and helpers then take as they did before it.
pub(crate) fn scout(lanes: Arc<Lanes>, cpus: Vec<Option<usize>>) {
    let crew = &lanes.crew;
    let pinned: Vec<usize> = cpus.iter().flatten().copied().collect();
    // The last look: when, and per helper its CPU's idle time plus the
    // helper's own CPU time.
    let mut last: Option<(Instant, Vec<Option<u64>>)> = None;
    while crew.scout_wait(IDLE) {
        // The first finding after a sleep comes soon: the helpers join a
        // burst of heavy requests a few tens of milliseconds in.
        let fresh = last.as_ref().is_some_and(|(t, _)| t.elapsed() <= LOOK_RECENT);
        last = scout_look(crew, &cpus, &pinned, last);
        if !crew.scout_pause(if fresh { SCOUT_EVERY } else { SCOUT_FIRST }) {
            break;
        }
    }
}

/// One look of the scout: each helper's CPU found spare or not against the
/// previous look (if it was recent: the scout may have slept since).
fn scout_look(
    crew: &Crew<Job>,
    cpus: &[Option<usize>],
    pinned: &[usize],
    last: Option<(Instant, Vec<Option<u64>>)>,
) -> Option<(Instant, Vec<Option<u64>>)> {
    let Ok(idle) = connmux_sys::affinity::cpus_idle_nanos(pinned) else {
        (0..cpus.len()).filter(|&h| !crew.is_spare(h)).for_each(|h| crew.set_spare(h, true));
        return None;
    };
    let now = Instant::now();
    let free: Vec<Option<u64>> = cpus
        .iter()
        .enumerate()
        .map(|(h, cpu)| {
            let i = pinned.iter().position(|c| Some(c) == cpu.as_ref())?;
            Some(idle[i]? + crew.helper_ran(h))
        })
        .collect();
    let recent = last.filter(|(t, _)| now - *t <= LOOK_RECENT);
    for (h, cpu) in cpus.iter().enumerate() {
        let verdict = match (cpu, &recent, free[h]) {
            (None, _, _) | (Some(_), _, None) => Some(true),
            (Some(_), Some((t, before)), Some(f)) => {
                before[h].map(|b| spare(Duration::from_nanos(f.saturating_sub(b)), now - *t))
            }
            _ => None,
        };
        if let Some(v) = verdict {
            if v != crew.is_spare(h) {
                crew.set_spare(h, v);
            }
        }
    }
    Some((now, free))
}

#[cfg(test)]
mod tests {
    use super::{spare, waited, WAITED_MIN};
    use std::time::Duration;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_message_waited_when_it_waited_longer_than_it_ran() {
        // On an idle CPU the clock and the thread's CPU time agree.
        assert!(!waited(us(200), us(210)));
        // Interrupted for less than it ran, or for less than WAITED_MIN.
        assert!(!waited(us(200), us(390)));
        assert!(!waited(us(10), us(10) + WAITED_MIN));
        // 200 µs of work that took 5 ms on the clock: the CPU had no time.
        assert!(waited(us(200), us(5_200)));
        assert!(waited(us(10), us(10) + WAITED_MIN + us(1)));
    }

    #[test]
    fn a_cpu_has_time_to_spare_once_free_a_tenth_of_the_time() {
        let ms = Duration::from_millis;
        assert!(spare(ms(10), ms(100)));
        assert!(spare(ms(100), ms(100)), "idle, or running its helper");
        assert!(!spare(ms(9), ms(50)), "under one of /proc/stat's steps");
        assert!(!spare(ms(10), ms(101)), "under a tenth");
        assert!(!spare(ms(0), ms(5_000)), "a busy CPU");
    }
}
