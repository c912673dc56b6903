//! Leading an epoll worker: an application thread in a plain socket's
//! `recv`, with nothing queued for it, runs an idle worker's pass itself
//! (reads the worker's connections, frames, queues what it framed for the
//! sockets steering picks, its own among them) instead of sleeping until
//! the worker's thread has done so and woken it.
//!
//! ```text
//!                   a receiving thread finds the pass taken (`want`,
//!                   the worker's waker written once)
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
//! driver).
//!
//! What does not change: steering (what a led pass frames goes where the
//! mux's steering sends it, to any socket), the pass itself (the same
//! `driver::worker::pass` as the worker thread's), and a worker's
//! connections are read by one thread at a time (whoever holds `state`).
//! While the worker steps aside, its connections are read only while a
//! receiving thread leads it, as a KCM psock is read only while a socket
//! waits; a look every [`LEAD_LOOK`] gives the pass back to the worker's
//! thread once no thread leads it (a poller, a non-blocking socket, a
//! command or a deadline then wait at most that long).
//!
//! Only epoll workers are led (an io_uring worker's ring is entered by its
//! own thread only), and never one that serves a `Service`. Must not name
//! `KcmSocket`: the socket stands on this.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connmux_core::mux::SockId;

use crate::driver::epoll::Slot;
use crate::shared::{Shared, SockRt, NO_TAG};

/// How often a worker that stepped aside looks whether receiving threads
/// still lead it: what a poller (or a command, a deadline) waits at most
/// for the worker's thread once no thread receives.
const LEAD_LOOK: Duration = Duration::from_millis(1);

/// In `SockRt::led_tag`: the application set the socket's affinity
/// itself; leading a worker does not change it.
pub(crate) const APP_TAG: u32 = u32::MAX - 1;

/// An epoll worker's pass, taken by whichever thread runs it.
pub(crate) struct Lead {
    index: usize,
    state: Mutex<LeadState>,
    /// A receiving thread found the pass taken by the worker's thread: it
    /// steps aside after its pass.
    want: AtomicBool,
    /// Passes led by receiving threads (a running count): the worker's
    /// thread takes its pass back once a look finds it unchanged.
    led: AtomicU64,
}

/// What the thread running the pass holds.
struct LeadState {
    slot: Slot,
    /// The socket that last led it and took its psocks' affinity tag (the
    /// worker's index): with `Steering::Affinity` its reads go to that
    /// socket while the socket keeps up, then to the others (affinity
    /// until uneven). Its messages then raise no readiness for another
    /// thread: the leader takes them after its pass.
    tagged: Option<SockId>,
}

impl Lead {
    pub(crate) fn new(sh: &Shared, index: usize) -> Lead {
        Lead {
            index,
            state: Mutex::new(LeadState { slot: Slot::worker(sh, index), tagged: None }),
            want: AtomicBool::new(false),
            led: AtomicU64::new(0),
        }
    }
}

/// The thread of epoll worker `lead`: its passes until the mux stops,
/// aside while receiving threads lead it.
pub(crate) fn run(sh: Arc<Shared>, lead: Arc<Lead>, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    while !sh.stop.load(Ordering::Acquire) {
        {
            let st = &mut lead.state.lock().unwrap_or_else(|e| e.into_inner()).slot;
            st.unwatch(&sh);
            st.pass(&sh, None);
        }
        if lead.want.load(Ordering::Acquire) {
            step_aside(&sh, &lead);
        }
    }
    lead.state.lock().unwrap_or_else(|e| e.into_inner()).slot.end(&sh);
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

/// A blocking `recv` of socket `rt` found nothing queued: run a pass of
/// one of `leads` (the one the socket prefers first), its wait bounded by
/// the call's `deadline` and counted as a wait on the socket's readiness.
/// `false`: every pass was taken (the preferred worker's thread is asked
/// to step aside after its pass); the caller waits on its readiness.
pub(crate) fn lead(sh: &Shared, leads: &[Arc<Lead>], rt: &SockRt, deadline: Option<Instant>) -> io::Result<bool> {
    if leads.is_empty() {
        return Ok(false);
    }
    let left = crate::shared::time_left(deadline)?;
    let start = rt.id.index as usize % leads.len();
    for k in 0..leads.len() {
        let l = &leads[(start + k) % leads.len()];
        if sh.worker(l.index).serving.load(Ordering::Acquire) {
            continue;
        }
        let Ok(mut st) = l.state.try_lock() else { continue };
        l.led.fetch_add(1, Ordering::AcqRel);
        if st.tagged != Some(rt.id) {
            retag(sh, l.index, st.tagged.take(), rt);
            st.tagged = Some(rt.id);
        }
        let st = &mut st.slot;
        if st.watch(sh, rt).is_err() {
            return Ok(false);
        }
        // (Its own messages raise no readiness: it looks after the pass.)
        st.own().expect("a worker's state between passes").led = Some(rt.id);
        rt.rx.wait(|_| st.pass(sh, left));
        st.own().expect("a worker's state between passes").led = None;
        return Ok(true);
    }
    let l = &leads[start];
    if !sh.worker(l.index).serving.load(Ordering::Acquire) && !l.want.swap(true, Ordering::AcqRel) {
        let _ = sh.worker(l.index).wake();
    }
    Ok(false)
}

/// Socket `rt` leads worker `index`, which socket `old` led before: `old`
/// gives back the worker's tag it took, and `rt` takes it, unless the
/// application set either's affinity itself.
#[cold]
fn retag(sh: &Shared, index: usize, old: Option<SockId>, rt: &SockRt) {
    let tag = index as u32;
    let mut core = sh.lock();
    if let Some(o) = old.and_then(|o| core.socks.get(&o).cloned()) {
        if o.led_tag.load(Ordering::Relaxed) == tag {
            let _ = core.mux.set_affinity(o.id, None);
            o.led_tag.store(NO_TAG, Ordering::Relaxed);
        }
    }
    if rt.led_tag.load(Ordering::Relaxed) != APP_TAG && core.mux.set_affinity(rt.id, Some(tag)).is_ok() {
        rt.led_tag.store(tag, Ordering::Relaxed);
    }
}
