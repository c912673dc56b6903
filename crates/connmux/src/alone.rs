//! Stand-alone sockets ([`crate::KcmSocket::stand_alone`]): a KCM socket
//! whose own application thread reads the connections attached to it, in
//! its `recv`, with no worker thread between a connection and the thread
//! that receives its messages.
//!
//! ```text
//!   recv ─► queue empty ─► the slot's pass (epoll wait: its psocks, its
//!     ▲                    waker, the socket's readiness; reads fed to the
//!     │                    core, commands, deadlines, writes)
//!     └────────────────────────────┘ until a message is queued for it
//! ```
//!
//! Why: a message read by a worker thread for an application thread costs
//! a wake-up of that thread (the worker's eventfd write, a context switch);
//! a thread that reads its own connections does not pay it (`bench kcm`,
//! `alone-N` beside `kcm-N` and `core-N`).
//!
//! A closed socket's connections stay attached (a closed AF_KCM socket
//! leaves its psocks): the slot gets a thread of its own, which runs its
//! passes until the last of them is unattached, then frees the slot.
//!
//! Owns [`AloneSock`]: the slot a socket holds (`Config::stand_alone`
//! slots, made at start: `Shared::alone`) and the worker state kept there
//! between the socket's calls (`driver::epoll::Slot`). Must not name
//! `KcmSocket`, `tls` or `service`: the socket stands on this.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connmux_core::mux::PsockId;

use crate::driver::epoll::Slot;
use crate::mux::Mux;
use crate::shared::{Ctx, Own, Shared, SockRt, WorkerIo, NO_TAG};

/// The longest a second thread receiving on one stand-alone socket waits
/// on its readiness before it looks whether the pass is free (the first
/// may have returned, and the slot's connections are read only in a pass).
const SHARED_WAIT: Duration = Duration::from_millis(1);

/// The longest a closed socket's slot thread waits in one pass before it
/// looks whether its connections are all unattached (an unattach does not
/// wake it): the slot is free again at most this long after.
const ORPHAN_LOOK: Duration = Duration::from_millis(50);

/// A stand-alone socket's slot and its worker state.
pub(crate) struct AloneSock {
    index: usize,
    /// Taken by the thread in the socket's `recv` for one pass at a time.
    state: Mutex<Slot>,
}

impl AloneSock {
    /// A free slot for socket `rt` of `mux` (`Config::stand_alone`).
    pub(crate) fn take(mux: &Mux, rt: &Arc<SockRt>) -> io::Result<AloneSock> {
        let u = mux
            .user()
            .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "stand-alone sockets are userspace only"))?;
        let index = u.shared.alone_free.lock().unwrap().pop().ok_or_else(|| {
            io::Error::new(io::ErrorKind::OutOfMemory, "every stand-alone slot is taken (Config::stand_alone)")
        })?;
        match Slot::alone(&u.shared, index, rt) {
            Ok(a) => Ok(AloneSock { index, state: Mutex::new(a) }),
            Err(e) => {
                u.shared.alone_free.lock().unwrap().push(index);
                Err(e)
            }
        }
    }

    /// The slot's worker index (what `Mux::attach_inner` takes).
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// `f` on the slot's own state while it keeps messages for socket
    /// `rt` (`shared::Mine`), unless another thread of the socket runs
    /// its pass (it keeps none then: a pass runs only once they are
    /// taken). Kept by a pass that ran while the socket was
    /// receive-disabled, they go back to the hub instead (`Own::unkeep`).
    pub(crate) fn mine<T>(&self, sh: &Shared, rt: &SockRt, f: impl FnOnce(&mut Own) -> T) -> Option<T> {
        let mut st = self.state.try_lock().ok()?;
        let own = st.own().filter(|o| o.has_mine())?;
        if rt.rx_off.load(Ordering::Acquire) {
            let mut events = Vec::new();
            {
                let mut core = sh.lock();
                own.unkeep(&mut core.mux);
                core.drain_events(&mut events);
            }
            sh.dispatch(&mut events, &mut Ctx::App);
            return None;
        }
        Some(f(own))
    }

    /// How many messages the slot keeps for the socket (0 while another
    /// thread runs its pass).
    pub(crate) fn mine_len(&self) -> usize {
        self.with_own(|o| o.map_or(0, |o| o.mine_len()))
    }

    /// `f` with the slot's own state, or `None` while another thread of
    /// the socket runs its pass (it keeps nothing then).
    pub(crate) fn with_own<T>(&self, f: impl FnOnce(Option<&mut Own>) -> T) -> T {
        let mut st = self.state.try_lock().ok();
        f(st.as_mut().and_then(|s| s.own()))
    }

    /// Nothing is queued for socket `rt`: run the slot's pass, its wait
    /// bounded by the socket's receive timeout (`deadline`, set by the
    /// call's first wait), then the caller looks at the queue again. A
    /// non-blocking socket makes one pass that does not wait (`passed`),
    /// then `WouldBlock`. While another thread of this socket runs the
    /// pass, this one waits on the socket's readiness, at most
    /// [`SHARED_WAIT`] at a time: the pass may be free by its next look,
    /// and nobody else reads the slot's connections.
    pub(crate) fn wait(
        &self,
        sh: &Shared,
        rt: &SockRt,
        deadline: &mut Option<Option<Instant>>,
        passed: &mut bool,
    ) -> io::Result<()> {
        let left = match rt.nonblocking.load(Ordering::Relaxed) {
            true if std::mem::replace(passed, true) => return Err(io::ErrorKind::WouldBlock.into()),
            true => Some(Duration::ZERO),
            false => {
                let d = *deadline.get_or_insert_with(|| rt.rcvtimeo.lock().unwrap().map(|d| Instant::now() + d));
                crate::shared::time_left(d)?
            }
        };
        match self.state.try_lock() {
            // Counted as a wait on the socket's readiness (its epoll
            // watches it): another thread's message wakes the pass, and
            // one queued just before it begins ends it at once.
            Ok(mut st) => {
                rt.rx.wait(|_| st.pass(sh, left));
            }
            Err(_) => {
                let cap = left.map_or(SHARED_WAIT, |l| l.min(SHARED_WAIT));
                rt.rx
                    .wait(|fd| connmux_sys::poll::poll_readable(std::os::fd::AsRawFd::as_raw_fd(fd), Some(cap)))
                    .transpose()?;
            }
        }
        Ok(())
    }

    /// The socket `rt` closes. Connections attached through it stay
    /// attached, as a closed KCM socket leaves its mux's psocks: a thread of
    /// the slot's own reads them (their messages go to the mux's other
    /// sockets, as steering picks) until the last is unattached or the mux
    /// stops, then frees the slot. With none attached the slot is free at
    /// once.
    pub(crate) fn close(self: Box<Self>, mux: &Mux, rt: &SockRt) {
        let Some(u) = mux.user() else { return };
        let sh = &u.shared;
        let mut st = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        let index = self.index;
        if let Some(WorkerIo::Epoll(epoll)) = sh.worker(index).io_decided() {
            let _ = epoll.delete(std::os::fd::AsRawFd::as_raw_fd(rt.rx.counted_fd()));
        }
        st.orphan(sh);
        if sh.worker(index).psocks.load(Ordering::Acquire) == 0 {
            return free(sh, index, st);
        }
        let shared = sh.clone();
        let spawned = std::thread::Builder::new().name(format!("connmux-a{index}")).spawn(move || {
            // Bounded by the mux's stop (its drop wakes the slot).
            while !shared.stop.load(Ordering::Acquire) && shared.worker(index).psocks.load(Ordering::Acquire) > 0 {
                st.pass(&shared, Some(ORPHAN_LOOK));
            }
            free(&shared, index, st);
        });
        match spawned {
            Ok(t) => {
                let mut threads = u.threads.lock().unwrap();
                // (Those of slots freed since are done: bounded by the slots.)
                threads.retain(|t| !t.is_finished());
                threads.push(t);
            }
            // No thread: nobody would read them (the slot's writes were
            // told by `orphan`; the slot stays taken).
            Err(_) => {
                let mine: Vec<PsockId> =
                    sh.lock().psocks.values().filter(|p| p.worker() == index).map(|p| p.id).collect();
                for p in mine {
                    let _ = mux.unattach_id(p);
                }
            }
        }
    }
}

/// Mirror socket `rt`'s steering for its slot (`SockRt::kept_tag`,
/// `SockRt::rx_off`): called under the hub lock, after a change to them.
pub(crate) fn mirror(m: &connmux_core::mux::Mux, rt: &SockRt) {
    let v = m.v();
    let off = m.recv_disabled(rt.id).unwrap_or(true);
    let by_tag = v.config().steering == connmux_core::mux::Steering::Affinity && !off;
    let tag = by_tag.then(|| v.sock_affinity(rt.id)).flatten().unwrap_or(NO_TAG);
    rt.kept_tag.store(tag, Ordering::Release);
    rt.rx_off.store(off, Ordering::Release);
}

/// Slot `index` is free again: what its pass wrote whole is told, what was
/// asked of it (for connections gone with it) dropped.
fn free(sh: &Shared, index: usize, mut st: Slot) {
    st.end(sh);
    let slot = sh.worker(index);
    let _ = slot.waker.drain();
    slot.commands.take_all(&mut Vec::new());
    sh.alone_free.lock().unwrap().push(index);
}
