//! The epoll driver: a worker's I/O ([`Io`]) over one epoll; the pass
//! itself is `driver::worker`.
//!
//! A wait reports readiness; each readable psock is read at once into the
//! worker's one buffer (no more than the core will take: backpressure closes
//! the TCP window) and fed to the core, and the read's messages for this
//! worker's own socket are served where they lie before the next read. The
//! psocks with something to send get one `writev` each when the loop flushes
//! (so the replies to one read go out in one `writev`).
//!
//! Owns the worker's read buffer and its wait; the serving steps are
//! `crate::serve`, the core's runtime side `crate::shared`. Must not name the
//! io_uring driver, the public `Mux` or anything above it.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use connmux_core::mux::{Event, Owned, SockId};
use connmux_sys::epoll::{Epoll, Events, Interest};

use crate::driver::worker::{self, Io, Woke, Worker, WorkerState};
use crate::driver::{SERVE_TOKEN, WAKER_TOKEN};
use crate::shared::{token_psock, Command, MuxHub, PsockRt, ReadEnd, Rts, Shared, SockRt, WorkerIo};

/// An epoll worker's state between passes, run by whichever thread holds
/// it: the worker's own thread (`crate::lead`), an application thread
/// leading it from a plain socket's `recv` (`crate::lead`), or a
/// stand-alone socket's slot (`Config::stand_alone`,
/// `KcmSocket::stand_alone`: a worker with no thread of its own, whose
/// pass the socket's `recv` runs while nothing is queued for it; its epoll
/// watches the socket's receive readiness for good, so that a message
/// another worker queued for the socket ends the pass's wait).
pub(crate) struct Slot {
    /// The worker index (`Shared::worker`).
    index: usize,
    /// What its `Worker` owns between passes (`None` once ended).
    parts: Option<WorkerState>,
    passes: worker::Passes,
    /// The serving socket's readiness could not be watched (`EpollIo`).
    serve_unwatched: bool,
    /// The socket whose readiness its epoll watches while a thread of that
    /// socket leads it (`Slot::watch`).
    led_by: Option<(SockId, RawFd)>,
    evs: Events,
    buf: Vec<u8>,
    rts: Rts,
}

impl Slot {
    /// The state of worker `index`, with no psocks yet.
    pub(crate) fn worker(sh: &Shared, index: usize) -> Slot {
        Slot {
            index,
            parts: Some(WorkerState::new(sh, index)),
            passes: worker::Passes::new(),
            serve_unwatched: false,
            led_by: None,
            evs: Events::with_capacity(256),
            buf: vec![0u8; sh.read_chunk],
            rts: Rts::default(),
        }
    }

    /// The state of stand-alone slot `index` for socket `sock`, whose
    /// readiness the slot's epoll now watches.
    pub(crate) fn alone(sh: &Shared, index: usize, sock: &Arc<SockRt>) -> std::io::Result<Slot> {
        let Some(WorkerIo::Epoll(epoll)) = sh.worker(index).io_decided() else {
            unreachable!("a stand-alone slot is an epoll")
        };
        // (Its pass is counted as a wait on it: `AloneSock::wait`.)
        epoll.add(sock.rx.counted_fd().as_raw_fd(), SERVE_TOKEN, Interest::READ)?;
        let mut s = Slot::worker(sh, index);
        if let Some(st) = &mut s.parts {
            st.own().keep_for(Some(sock), sh.read_chunk);
        }
        // Its first pass looks at the commands first (`worker::promise`).
        sh.worker(index).commands.look_soon();
        Ok(s)
    }

    /// One pass, its wait at most `cap` (and no longer than its psocks'
    /// earliest deadline).
    pub(crate) fn pass(&mut self, sh: &Shared, cap: Option<Duration>) {
        let me = sh.worker(self.index);
        let Some(WorkerIo::Epoll(epoll)) = me.io_decided() else { return };
        let Some(st) = &mut self.parts else { return };
        let mut w = st.worker(sh);
        // (Worker 0 keeps the mux's time: `worker::wait_timeout`.)
        let timeout = match (self.passes.timeout(&w, self.index == 0), cap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut io = EpollIo {
            epoll,
            evs: &mut self.evs,
            buf: &mut self.buf,
            rts: &mut self.rts,
            serve_unwatched: self.serve_unwatched,
        };
        worker::pass(me, &mut io, &mut w, &mut self.passes, timeout);
        self.serve_unwatched = io.serve_unwatched;
    }

    /// A thread of socket `sock` leads this worker: its epoll watches the
    /// socket's readiness (counted while the thread waits in the pass), so
    /// that a message another thread queues for the socket ends the wait.
    pub(crate) fn watch(&mut self, sh: &Shared, sock: &SockRt) -> std::io::Result<()> {
        if self.led_by.is_some_and(|(id, _)| id == sock.id) {
            return Ok(());
        }
        self.unwatch(sh);
        let Some(WorkerIo::Epoll(epoll)) = sh.worker(self.index).io_decided() else { return Ok(()) };
        let fd = sock.rx.counted_fd().as_raw_fd();
        epoll.add(fd, SERVE_TOKEN, Interest::READ)?;
        self.led_by = Some((sock.id, fd));
        Ok(())
    }

    /// The socket whose receiving thread runs its passes from now on
    /// (`None`: no more): its reads go to that socket while its queue is
    /// short (`Owned::set_reader`), framed alone and kept for it where
    /// they may be (`Own::frame_mine`; moved to the socket as it lets go,
    /// `Own::end_keep`), and raise no readiness for it (`Own::led`: it
    /// looks at its queue after the pass).
    pub(crate) fn lead_by(&mut self, sh: &Shared, sock: Option<&Arc<SockRt>>) {
        let Some(st) = &mut self.parts else { return };
        if sock.is_none() {
            st.own().end_keep(sh, true);
        }
        st.own().keep_for(sock, sh.read_chunk);
        st.set_reader(sock.map(|s| s.id));
    }

    /// No thread leads it now: the led socket's readiness is not watched
    /// (it stays readable while that socket has messages, and would end
    /// every wait of the worker's own thread).
    pub(crate) fn unwatch(&mut self, sh: &Shared) {
        if let Some((_, fd)) = self.led_by.take() {
            if let Some(WorkerIo::Epoll(epoll)) = sh.worker(self.index).io_decided() {
                // (Gone already if the socket closed: its eventfd left the
                // epoll with it.)
                let _ = epoll.delete(fd);
            }
        }
    }

    /// The slot's own state for one call of its socket (none while its
    /// pass runs: the caller holds the slot).
    pub(crate) fn own(&mut self) -> Option<&mut crate::shared::Own> {
        self.parts.as_mut().map(WorkerState::own)
    }

    /// Its socket closed while connections are attached to the slot: no
    /// socket looks at a queue after its passes now, so a message queued
    /// for any raises that socket's readiness, and what was written whole
    /// reaches the core.
    pub(crate) fn orphan(&mut self, sh: &Shared) {
        if let Some(st) = &mut self.parts {
            let own = st.own();
            let mut core = sh.lock();
            // (Moved on with the socket's queue as it closes; the slot
            // looks for no socket from now on.)
            own.unkeep(&mut core.mux);
            own.keep_for(None, 0);
            own.hold(&mut core);
        }
        // Its passes no longer look at the commands first: asks wake it
        // from now on, and one already made is taken in its next pass.
        let me = sh.worker(self.index);
        if me.commands.look_now() {
            let _ = me.waker.notify();
        }
    }

    /// The socket is closing, or the worker stops: the writes made whole
    /// reach the core.
    pub(crate) fn end(&mut self, sh: &Shared) {
        if let Some(mut st) = self.parts.take() {
            st.worker(sh).end();
        }
    }
}

/// A worker's epoll: readiness, then a read into the worker's one buffer
/// (whose messages for its own socket are served before the next read).
struct EpollIo<'a> {
    epoll: &'a Epoll,
    evs: &'a mut Events,
    buf: &'a mut Vec<u8>,
    /// Its psocks' runtime sides, found with no hold of the hub lock.
    rts: &'a mut Rts,
    /// The serving socket's readiness could not be added to the epoll: its
    /// messages are looked for every pass, and no sleep is long.
    serve_unwatched: bool,
}

impl Io for EpollIo<'_> {
    // Inlined into the loop, its one caller: the call's register saves and
    // restores cost about 15 instructions a pass, which at one request per
    // pass is the loop's whole overhead over a hand-written one.
    #[inline(always)]
    fn wait(&mut self, w: &mut Worker<'_>, timeout: Option<Duration>) -> Woke {
        let mut woke = Woke { serve_ready: self.serve_unwatched, ..Woke::default() };
        let sh = w.sh;
        let timeout = match self.serve_unwatched {
            false => timeout,
            true => crate::driver::unwatched_wait(timeout),
        };
        let n = self.epoll.wait(self.evs, timeout).unwrap_or(0);
        if n == 0 {
            return woke;
        }
        woke.reported = true;
        for ev in self.evs.iter() {
            match ev.token {
                WAKER_TOKEN => woke.commands = true,
                SERVE_TOKEN => woke.serve_ready = true,
                t => {
                    let p = token_psock(t);
                    let readable = ev.readable || ev.hup || ev.error;
                    let Some(rt) = self.rts.get(sh, p) else { continue };
                    // What the psock takes, as its receive side alone
                    // knows (`Owned::rx_room_alone`); else `read_psock`
                    // asks the hub.
                    let rx = match readable && rt.tls.is_none() && !w.bufs.own.told {
                        true => Some(w.owned.rx_room_alone(p)).filter(|&cap| cap > 0),
                        false => None,
                    }
                    .map(|cap| RxRoom { cap, loan: None });
                    if ev.writable {
                        sh.set_interest(&rt, |i| i.write = false);
                        if !rt.flush_queued.swap(true, Ordering::AcqRel) {
                            w.dirty.push(rt.clone());
                        }
                    }
                    if readable {
                        read_psock(w, &rt, rx, self.buf);
                    }
                }
            }
        }
        woke
    }

    fn watch_serve(&mut self, sock: &SockRt) {
        self.serve_unwatched = self.epoll.add(sock.rx.polled_fd().as_raw_fd(), SERVE_TOKEN, Interest::READ).is_err();
    }

    fn command(&mut self, w: &mut Worker<'_>, c: Command) {
        // A TLS psock may take bytes again (see `tls::epoll_read`). Other
        // threads reach epoll psocks through epoll_ctl: no other command
        // comes here.
        if let Command::Resume(p) = c {
            if let Some(rt) = self.rts.get(w.sh, p) {
                read_psock(w, &rt, None, self.buf);
            }
        }
    }

    fn flush(&mut self, w: &mut Worker<'_>) {
        for rt in w.dirty.drain(..) {
            rt.flush_queued.store(false, Ordering::Release);
            w.sh.flush(&rt, w.events);
        }
    }
}

/// What the core takes from a psock now: bytes into the worker's buffer, or
/// a loan of the psock's own assembly buffer (`Mux::rx_lend`).
struct RxRoom {
    cap: usize,
    loan: Option<connmux_core::mux::RxLoan>,
}

impl RxRoom {
    fn of((cap, loan): (usize, Option<connmux_core::mux::RxLoan>)) -> RxRoom {
        RxRoom { cap, loan }
    }
}

/// One read from a readable psock, bounded by what the core will accept
/// (`rx`, when the caller has already asked the core). On a serving worker,
/// the read's whole messages for its own socket are served at once, where
/// they lie in `buf`.
fn read_psock(w: &mut Worker<'_>, rt: &Arc<PsockRt>, rx: Option<RxRoom>, buf: &mut [u8]) {
    let sh = w.sh;
    if let Some(tls) = &rt.tls {
        let mut at = crate::shared::tls::RxAt { sh, o: w.owned, rt, events: w.events };
        return crate::shared::tls::epoll_read(&mut at, tls, buf);
    }
    let RxRoom { cap, loan } = rx.unwrap_or_else(|| {
        let mut core = sh.lock();
        let room = RxRoom::of(core.mux.of(w.owned).rx_room(rt.id));
        core.drain_events(w.events);
        room
    });
    if let Some(loan) = loan {
        return read_lent(w, rt, loan);
    }
    if cap == 0 {
        // Paused by backpressure or stopped: stop polling for input until the
        // core says PsockRxResume. That resume may come from another thread
        // between the check above and this change (its `read = true` then finds
        // read already on and does nothing): check again after turning it off.
        sh.set_interest(rt, |i| i.read = false);
        let mut core = sh.lock();
        let cap = core.mux.view_of(w.owned).rx_capacity(rt.id);
        core.drain_events(w.events);
        drop(core);
        if cap > 0 {
            sh.set_interest(rt, |i| i.read = true);
        }
        return;
    }
    let want = cap.min(buf.len());
    let res = connmux_sys::socket::read(rt.fd(), &mut buf[..want]);
    // One clock reading: the core's timestamp and the handlers' start.
    let read_at = connmux_sys::clock::now_nanos();
    match ReadEnd::of_io(&res) {
        ReadEnd::Data(n) => worker::feed_bytes(w, rt, &buf[..n], read_at),
        end => read_ended(sh, w.owned, rt, sh.lock(), end, w.events),
    }
}

/// A read that brought no bytes: the end of the stream reaches the core
/// (and the psock is read no more); would-block, nothing.
fn read_ended(
    sh: &Shared,
    o: &mut Owned,
    rt: &PsockRt,
    mut core: MutexGuard<'_, MuxHub>,
    end: ReadEnd,
    events: &mut Vec<Event>,
) {
    // (Drained whatever the end: the call before it may have raised events.)
    let end = end.end();
    if let Some(how) = end {
        let _ = core.mux.of(o).rx_closed(rt.id, how);
    }
    core.drain_events(events);
    drop(core);
    if end.is_some() {
        sh.set_interest(rt, |i| i.read = false);
    }
}

/// [`read_psock`] for a large message: one read straight into the psock's
/// assembly buffer (`Mux::rx_lend`), no more than the message still needs.
fn read_lent(w: &mut Worker<'_>, rt: &PsockRt, mut loan: connmux_core::mux::RxLoan) {
    let sh = w.sh;
    let limit = loan.limit();
    let res = connmux_sys::socket::read_into(rt.fd(), loan.buf(), limit);
    let now = sh.now();
    let mut core = sh.lock();
    // The buffer goes back whatever happened (with nothing new on error).
    let _ = crate::shared::commit_read(&mut core, w.owned, &mut w.bufs.own, loan, now);
    match ReadEnd::of_io(&res) {
        ReadEnd::Data(_) => core.drain_events(w.events),
        end => read_ended(sh, w.owned, rt, core, end, w.events),
    }
}
