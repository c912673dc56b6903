//! Leading an epoll worker: an application thread in a plain socket's
//! `recv`, with nothing queued for it, runs an idle worker's pass itself
//! (reads the worker's connections, frames, queues what it framed for the
//! sockets steering picks, its own among them) instead of sleeping until
//! the worker's thread has done so and woken it.
//!
//! ```text
//!                   a receiving thread finds the pass taken (`want`,
//!                   the worker's waker written once: the worker's own
//!                   pass ends; that thread comes back for it, `Led`)
//!   Running ───────────────────────────────────────────────► Aside
//!   (its own thread runs its passes)     (its thread sleeps; the pass is
//!      ▲                                  run by receiving threads only)
//!      │                                                        │
//!      └─── a look (every LEAD_LOOK) finds no pass led since ───┘
//!           and the pass free: the thread takes it back
//! ```
//!
//! Why: a message read by a worker for an application thread costs a
//! wake-up of that thread (the worker's eventfd write, a context switch):
//! two wake-ups a batch (the worker's, by the kernel; the thread's, by the
//! worker) where a thread per connection has one. A thread that reads the
//! connections itself pays only the kernel's (`bench kcm`, `kcm-N`, epoll
//! driver), and what its pass reads for it it keeps, taken with no hold of
//! the hub lock (`Slot::lead_by`, `shared::Kept`).
//!
//! What does not change: steering (what a led pass frames goes where the
//! mux's steering sends it, to any socket; with affinity steering the
//! leader first while its queue is short, `Owned::set_reader`), the pass
//! itself (the same `driver::worker::pass` as the worker thread's), and a
//! worker's connections are read by one thread at a time (whoever holds
//! `state`). While the worker steps aside, its connections are read only
//! while a receiving thread leads it, as a KCM psock is read only while a
//! socket waits; a look every [`LEAD_LOOK`] gives the pass back to the
//! worker's thread once no thread leads it (a poller, a non-blocking
//! socket, a command or a deadline then wait at most that long).
//!
//! Only epoll workers are led (an io_uring worker's ring is entered by its
//! own thread only: with `Driver::Auto`, a worker asked to serve before
//! any connection came runs a ring, `mux::auto_worker`), never one
//! that serves a `Service`, and not one whose thread has not yet come to
//! [`run`] (`Lead::thread`, [`Thread::Starting`]). Must not name
//! `KcmSocket`: the socket stands on this.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::driver::epoll::Slot;
use crate::shared::{Shared, SockRt};

/// How often a worker that stepped aside looks whether receiving threads
/// still lead it: what a poller (or a command, a deadline) waits at most
/// for the worker's thread once no thread receives.
const LEAD_LOOK: Duration = Duration::from_millis(1);

/// An epoll worker's pass, taken by whichever thread runs it.
pub(crate) struct Lead {
    index: usize,
    state: Mutex<Slot>,
    /// A receiving thread found the pass taken by the worker's thread: it
    /// steps aside after its pass.
    want: AtomicBool,
    /// Passes led by receiving threads (a running count): the worker's
    /// thread takes its pass back once a look finds it unchanged.
    led: AtomicU64,
    /// Where the worker's own thread is ([`Thread`], as a `u8`).
    thread: AtomicU8,
}

/// Where an epoll worker's own thread is, for the receiving threads that
/// would lead it.
///
/// ```text
///   Starting ──► Between ◄──► InPass
///   (`run` entered)   (its pass taken and let go, each pass)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Thread {
    /// Not yet in [`run`] (`Driver::Auto`'s undecided worker waits on its
    /// waker, `mux::auto_worker`): not led, as a led pass drains the waker
    /// and would take the wake that tells the thread a psock came (it
    /// would then sleep for good).
    Starting,
    /// In [`run`], between its passes or aside.
    Between,
    /// Holding `state` for a pass of its own: a receiving thread that
    /// finds the pass taken asks it aside and comes back for the pass
    /// within a look ([`Led::Retry`]), where a pass led by another
    /// receiving thread is waited out on the socket's readiness.
    InPass,
}

impl Lead {
    pub(crate) fn new(sh: &Shared, index: usize) -> Lead {
        Lead {
            index,
            state: Mutex::new(Slot::worker(sh, index)),
            want: AtomicBool::new(false),
            led: AtomicU64::new(0),
            thread: AtomicU8::new(Thread::Starting as u8),
        }
    }

    /// Its own thread is now at `at` (only that thread says so).
    fn thread_at(&self, at: Thread) {
        self.thread.store(at as u8, Ordering::Release);
    }

    fn thread_is(&self, at: Thread) -> bool {
        self.thread.load(Ordering::Acquire) == at as u8
    }
}

/// The thread of epoll worker `lead`: its passes until the mux stops,
/// aside while receiving threads lead it.
pub(crate) fn run(sh: Arc<Shared>, lead: Arc<Lead>, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    lead.thread_at(Thread::Between);
    while !sh.stop.load(Ordering::Acquire) {
        {
            let mut st = lead.state.lock().unwrap_or_else(|e| e.into_inner());
            lead.thread_at(Thread::InPass);
            st.unwatch(&sh);
            st.pass(&sh, None);
            lead.thread_at(Thread::Between);
        }
        if lead.want.load(Ordering::Acquire) {
            step_aside(&sh, &lead);
        }
    }
    lead.state.lock().unwrap_or_else(|e| e.into_inner()).end(&sh);
}

/// Receiving threads want the pass: sleep, in looks [`LEAD_LOOK`] apart,
/// until one finds no pass led since the last and the pass free. While a
/// receiving thread waits in the pass, the worker's thread waits for it
/// to end (no looks: a quiet mux wakes nobody), then looks again.
fn step_aside(sh: &Shared, lead: &Lead) {
    let mut seen = lead.led.load(Ordering::Acquire);
    loop {
        std::thread::sleep(LEAD_LOOK);
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
        let now = lead.led.load(Ordering::Acquire);
        if now != seen {
            seen = now;
            continue;
        }
        match lead.state.try_lock() {
            Ok(_) => {
                lead.want.store(false, Ordering::Release);
                return;
            }
            // A receiving thread waits in the pass: until it returns.
            Err(_) => drop(lead.state.lock()),
        }
    }
}

/// Passes receiving threads led, over `leads` (`Mux::led_passes`).
pub(crate) fn led_passes(leads: &[Arc<Lead>]) -> u64 {
    leads.iter().map(|l| l.led.load(Ordering::Relaxed)).sum()
}

/// What [`lead`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Led {
    /// It ran a pass: the caller looks at its queue again.
    Passed,
    /// Every pass is held by other receiving threads (or none may be
    /// led): the caller waits on its readiness (those passes queue its
    /// messages and raise it).
    Wait,
    /// A worker's own thread holds the pass it may lead, asked to step
    /// aside: the caller waits on its readiness at most this long, then
    /// comes back for the pass. (Not blocking on the lock: the worker's
    /// thread may take its pass back before the caller runs again, and a
    /// thread blocked on the lock would not see its queued messages.)
    Retry(Duration),
}

/// A blocking `recv` of socket `rt` found nothing queued: run a pass of
/// one of `leads` (the one the socket prefers first), its wait bounded by
/// the call's `deadline` and counted as a wait on the socket's readiness.
/// Every pass taken: the first one's thread (or a worker's own, in
/// preference) is asked to step aside after its pass.
pub(crate) fn lead(sh: &Shared, leads: &[Arc<Lead>], rt: &Arc<SockRt>, deadline: Option<Instant>) -> io::Result<Led> {
    if leads.is_empty() {
        return Ok(Led::Wait);
    }
    let left = crate::shared::time_left(deadline)?;
    let start = rt.id.index as usize % leads.len();
    // The first pass found taken, whose thread is asked to step aside,
    // and whether a worker's own thread holds it.
    let mut taken: Option<(&Lead, bool)> = None;
    for k in 0..leads.len() {
        let l = &leads[(start + k) % leads.len()];
        // (A worker with no connections has nothing to read: a thread
        // waiting in its pass would not see another worker's pass free.)
        let me = sh.worker(l.index);
        let epoll = matches!(me.io_decided(), Some(crate::shared::WorkerIo::Epoll(_)));
        let idle = me.psocks.load(Ordering::Acquire) == 0;
        if !epoll || l.thread_is(Thread::Starting) || me.serving.load(Ordering::Acquire) || idle {
            continue;
        }
        let Ok(mut st) = l.state.try_lock() else {
            let own = l.thread_is(Thread::InPass);
            if taken.is_none_or(|(_, o)| own && !o) {
                taken = Some((l, own));
            }
            continue;
        };
        if st.watch(sh, rt).is_err() {
            return Ok(Led::Wait);
        }
        l.led.fetch_add(1, Ordering::AcqRel);
        st.lead_by(sh, Some(rt));
        rt.rx.wait(|_| st.pass(sh, left));
        st.lead_by(sh, None);
        return Ok(Led::Passed);
    }
    match taken {
        Some((l, own)) => {
            ask_aside(sh, l);
            // (Back within half a look: before the worker's thread, aside
            // now, looks whether anyone leads it.)
            Ok(if own { Led::Retry(LEAD_LOOK / 2) } else { Led::Wait })
        }
        None => Ok(Led::Wait),
    }
}

/// Ask worker `l`'s thread to step aside after its pass (its waker
/// written once: it ends the pass's wait).
fn ask_aside(sh: &Shared, l: &Lead) {
    if !l.want.swap(true, Ordering::AcqRel) {
        let _ = sh.worker(l.index).wake();
    }
}
