//! The heavy lanes' queues and the threads that take from them.
//!
//! Each serving worker has a *lane*: a bounded queue of messages of its
//! heavy connections (a connection whose handler runs long). The worker
//! [`Crew::offer`]s such messages instead of running them itself; two kinds
//! of taker run them:
//!
//! - lane `i`'s **home** thread (on worker `i`'s CPU, a few nice steps
//!   lower) takes from lane `i`;
//! - **helpers** (one on each worker's CPU, `SCHED_IDLE`) take from any
//!   other lane holding at least `steal_from` messages: stealing. The head
//!   of a lane is left to its home thread, so a lone request never waits on
//!   a helper whose CPU has no time to spare. A helper takes only while
//!   its CPU is *spare*: the **scout** (`lane::scout`), awake while a lane
//!   is behind, sets that from the CPU's idle time, and a helper whose
//!   message waited on its CPU clears it; an offer wakes only a spare
//!   helper (and the scout).
//!
//! A taker with nothing to take sleeps. Its wake-up protocol (a Dekker
//! pair: each side writes, fences, then reads the other's variable):
//!
//! ```text
//!  worker (offer)                 taker (wait_next)
//!  lane.push(job)                 sleeping.swap(true)
//!  fence(SeqCst)                  fence(SeqCst)
//!  if sleeping.swap(false):       if let Some(job) = take(): sleeping.swap(false); run it
//!      unpark(taker)              else park(); sleeping.swap(false)
//! ```
//!
//! Either the worker sees the taker asleep (and unparks it: an unpark
//! before the park makes the park return at once), or the taker's second
//! look sees the job. The scout's sleep against an offer, and a helper's
//! against the scout's `set_spare`, are the same pair. Nothing here holds
//! a lock, so a taker preempted anywhere delays only the message it holds.

use std::time::Duration;

use super::prim::{fence, AtomicBool, AtomicUsize, Bounded, Ordering, ThreadSlot};

/// One taker's wake-up state.
#[derive(Default)]
struct Sleeper {
    sleeping: AtomicBool,
    thread: ThreadSlot,
}

impl Sleeper {
    /// Wake it if it sleeps (or is about to look a last time).
    fn wake(&self) -> bool {
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            self.thread.unpark();
            return true;
        }
        false
    }
}

/// Who is taking: lane `i`'s home thread, or helper `i` (the helper on
/// worker `i`'s CPU, which takes from every other lane).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taker {
    Home(usize),
    Helper(usize),
}

/// The lanes of one serving mux and their takers.
pub struct Crew<T> {
    lanes: Vec<Bounded<T>>,
    homes: Vec<Sleeper>,
    helpers: Vec<Sleeper>,
    /// Per helper: whether the scout last found its CPU with time to spare
    /// (an offer wakes only such a helper; `lane::scout`).
    spare: Vec<AtomicBool>,
    /// Per helper: nanoseconds of CPU its messages took (its CPU's spare
    /// time it used, for the scout).
    ran: Vec<AtomicUsize>,
    /// The scout, which watches the helpers' CPUs (`lane::scout`); it
    /// sleeps while no lane is behind.
    scout: Sleeper,
    /// Messages a lane must hold for a helper to take one.
    steal_from: usize,
    stop: AtomicBool,
    /// Where helpers' scans start, so no lane is always looked at last.
    turn: AtomicUsize,
}

impl<T> Crew<T> {
    /// `lanes` lanes of `cap` messages each, one home thread each, and
    /// `helpers` helpers (0: each lane's messages are taken by its home
    /// thread alone, in order).
    pub fn new(lanes: usize, cap: usize, helpers: usize, steal_from: usize) -> Self {
        Crew {
            lanes: (0..lanes).map(|_| Bounded::new(cap)).collect(),
            homes: (0..lanes).map(|_| Sleeper::default()).collect(),
            helpers: (0..helpers).map(|_| Sleeper::default()).collect(),
            spare: (0..helpers).map(|_| AtomicBool::new(false)).collect(),
            ran: (0..helpers).map(|_| AtomicUsize::new(0)).collect(),
            scout: Sleeper::default(),
            steal_from: steal_from.max(1),
            stop: AtomicBool::new(false),
            turn: AtomicUsize::new(0),
        }
    }

    /// Number of helpers.
    pub fn helpers(&self) -> usize {
        self.helpers.len()
    }

    /// Messages lane `lane` holds (offered, not yet taken).
    pub fn queued(&self, lane: usize) -> usize {
        self.lanes[lane].len()
    }

    /// The worker of lane `lane`: queue `job` for the takers, or give it
    /// back when the lane is full (the worker then runs it itself).
    pub fn offer(&self, lane: usize, job: T) -> Result<(), T> {
        self.lanes[lane].push(job)?;
        fence(Ordering::SeqCst);
        if self.homes[lane].wake() {
            // The home thread takes the head; one more message than that is
            // for a helper.
            if self.lanes[lane].len() < self.steal_from {
                return Ok(());
            }
        }
        if !self.helpers.is_empty() && self.lanes[lane].len() >= self.steal_from {
            let n = self.helpers.len();
            let start = self.turn.fetch_add(1, Ordering::Relaxed);
            for k in 0..n {
                let h = (start + k) % n;
                // A helper does not take from its own CPU's lane, nor one
                // whose CPU has no time to spare: woken there it would wait
                // in that CPU's run queue.
                if h != lane && self.is_spare(h) && self.helpers[h].wake() {
                    break;
                }
            }
            // The lane is behind: the scout watches the helpers' CPUs.
            self.scout.wake();
        }
        Ok(())
    }

    /// A taker: the next message for it now, with the lane it came from,
    /// if there is one (no wait).
    pub fn try_next(&self, who: Taker) -> Option<(usize, T)> {
        if self.stop.load(Ordering::Acquire) {
            return None;
        }
        self.take(who)
    }

    /// A taker whose [`Crew::try_next`] found nothing: the next message for
    /// it, with the lane it came from; waits (parked, at most `idle` per
    /// look) while there is none, its sleep announced before each look.
    /// `None` once [`Crew::stop`] was called.
    pub fn wait_next(&self, who: Taker, idle: Duration) -> Option<(usize, T)> {
        let me = self.sleeper(who);
        me.thread.set_current();
        loop {
            me.sleeping.swap(true, Ordering::AcqRel);
            fence(Ordering::SeqCst);
            if self.stop.load(Ordering::Acquire) {
                me.sleeping.swap(false, Ordering::AcqRel);
                return None;
            }
            if let Some(got) = self.take(who) {
                me.sleeping.swap(false, Ordering::AcqRel);
                return Some(got);
            }
            me.thread.park(idle);
            me.sleeping.swap(false, Ordering::AcqRel);
        }
    }

    /// The scout: wait until some lane is behind (true: it holds a message
    /// for a helper), or the crew stops (false), parked meanwhile (an offer
    /// that leaves a lane behind wakes it: the same announce, fence, look
    /// protocol as a taker's sleep). Before it parks, what it found spare is
    /// forgotten (it does not watch meanwhile).
    pub fn scout_wait(&self, idle: Duration) -> bool {
        let me = &self.scout;
        me.thread.set_current();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return false;
            }
            if self.watch() {
                return true;
            }
            me.sleeping.swap(true, Ordering::AcqRel);
            fence(Ordering::SeqCst);
            if !self.stop.load(Ordering::Acquire) && !self.watch() {
                self.spare.iter().for_each(|s| s.store(false, Ordering::Release));
                me.thread.park(idle);
            }
            me.sleeping.swap(false, Ordering::AcqRel);
        }
    }

    /// Whether the scout has something to watch: a lane behind.
    fn watch(&self) -> bool {
        self.lanes.iter().any(|l| l.len() >= self.steal_from)
    }

    /// Whether helper `h` may take messages (the scout found its CPU with
    /// time to spare at its last look).
    pub fn is_spare(&self, h: usize) -> bool {
        self.spare[h].load(Ordering::Acquire)
    }

    /// The scout's finding for helper `h`'s CPU; time to spare wakes the
    /// helper if it sleeps (it looks for messages at once). A helper sets
    /// its own to false when its message waited.
    pub fn set_spare(&self, h: usize, spare: bool) {
        self.spare[h].store(spare, Ordering::Release);
        if spare {
            fence(Ordering::SeqCst);
            self.helpers[h].wake();
        }
    }

    /// Helper `h`'s message took `ns` of its CPU time.
    pub fn ran(&self, h: usize, ns: u64) {
        self.ran[h].fetch_add(ns as usize, Ordering::Relaxed);
    }

    /// CPU time helper `h`'s messages took so far (nanoseconds).
    pub fn helper_ran(&self, h: usize) -> u64 {
        self.ran[h].load(Ordering::Relaxed) as u64
    }

    /// The scout, between two looks at the helpers' CPUs: `every`, or
    /// less. False once the crew stopped.
    pub fn scout_pause(&self, every: Duration) -> bool {
        if !self.stop.load(Ordering::Acquire) {
            self.scout.thread.park(every);
        }
        !self.stop.load(Ordering::Acquire)
    }

    fn sleeper(&self, who: Taker) -> &Sleeper {
        match who {
            Taker::Home(i) => &self.homes[i],
            Taker::Helper(i) => &self.helpers[i],
        }
    }

    /// One look, without waiting.
    pub fn take(&self, who: Taker) -> Option<(usize, T)> {
        match who {
            Taker::Home(i) => self.lanes[i].pop().map(|t| (i, t)),
            Taker::Helper(me) => {
                if !self.is_spare(me) {
                    return None;
                }
                let n = self.lanes.len();
                let start = self.turn.fetch_add(1, Ordering::Relaxed);
                for k in 0..n {
                    let i = (start + k) % n;
                    if i != me && self.lanes[i].len() >= self.steal_from {
                        if let Some(t) = self.lanes[i].pop() {
                            return Some((i, t));
                        }
                    }
                }
                None
            }
        }
    }

    /// End every taker's [`Crew::wait_next`] (what is still queued is dropped
    /// with the crew).
    pub fn stop(&self) {
        self.stop.swap(true, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        for s in self.homes.iter().chain(&self.helpers).chain([&self.scout]) {
            s.sleeping.swap(false, Ordering::AcqRel);
            s.thread.unpark();
        }
    }
}
