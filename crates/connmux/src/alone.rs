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
use crate::shared::{Shared, SockRt, WorkerIo};

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
                // (Raising no readiness: only its receives look, and its
                // other threads look again within `SHARED_WAIT`.)
                if let Some(own) = st.own() {
                    own.end_keep(sh, false);
                }
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

/// Slot `index` is free again: what its pass wrote whole is told, what was
/// asked of it (for connections gone with it) dropped.
fn free(sh: &Shared, index: usize, mut st: Slot) {
    st.end(sh);
    let slot = sh.worker(index);
    let _ = slot.waker.drain();
    slot.commands.take_all(&mut Vec::new());
    sh.alone_free.lock().unwrap().push(index);
}
