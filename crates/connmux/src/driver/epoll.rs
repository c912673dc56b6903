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

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use connmux_core::mux::{Event, PsockId};
use connmux_sys::epoll::{Epoll, Events, Interest};

use crate::driver::worker::{self, Io, Woke, Worker};
use crate::driver::{SERVE_TOKEN, WAKER_TOKEN};
use crate::serve::LentOut;
use crate::shared::tls::{self, Decrypted, PsockTls};
use crate::shared::{token_psock, Command, Core, PsockRt, ReadEnd, Shared, SockRt, WorkerIo};

pub(crate) fn run(sh: Arc<Shared>, index: usize, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let _ = connmux_sys::affinity::pin_current_thread(cpu);
    }
    let WorkerIo::Epoll(epoll) = &sh.workers[index].io else { unreachable!("epoll worker on a non-epoll WorkerRef") };
    let buf = vec![0u8; sh.read_chunk];
    let me = &sh.workers[index];
    let sole = Sole::new(&sh.tuning);
    let mut io =
        EpollIo { epoll, me, evs: Events::with_capacity(256), buf, plain: Vec::new(), serve_unwatched: false, sole };
    worker::run(&sh, index, &mut io);
    // (The descriptor goes back to the mode it was attached in.)
    io.sole.end();
}

/// Lent connections whose replies backed up (`Own::to_watch`): wait for
/// each to take more (write interest; its event writes the backlog, or
/// flushes the psock's queue where the lease went back meanwhile).
#[cold]
fn watch_backlogs(w: &mut Worker<'_>) {
    for rt in std::mem::take(&mut w.bufs.own.to_watch) {
        // (A backlog the connection took all of since needs no event.)
        if !w.bufs.own.leases.get(&rt.id).is_some_and(|l| l.backlog.is_empty()) {
            w.sh.set_interest(&rt, |i| i.write = true);
        }
    }
}

/// A worker's epoll: readiness, then a read into the worker's one buffer
/// (whose messages for its own socket are served before the next read).
struct EpollIo<'a> {
    epoll: &'a Epoll,
    /// This worker's handles (its psock count, its `woken` flag).
    me: &'a crate::shared::WorkerRef,
    evs: Events,
    buf: Vec<u8>,
    /// A TLS psock's read, decrypted in the worker (`read_tls_psock`).
    plain: Vec<u8>,
    /// The serving socket's readiness could not be added to the epoll: its
    /// messages are looked for every pass, and no sleep is long.
    serve_unwatched: bool,
    /// Its one connection read blocking while busy (`Tuning::sole_read`).
    sole: Sole,
}

/// An epoll worker's one connection, read the way a thread per connection
/// reads it while it is busy (`Tuning::sole_read`): a blocking `recv` in
/// place of the epoll wait and the read that follows it.
///
/// ```text
///           a wait brings only a lent read of the worker's one psock,
///           within SOLE_GAP of its read before
///   Epoll ──────────────────────────────────────────────────► Hot
///     ▲                                                        │ its next wait
///     │ SOLE_TIMEOUT with no bytes, a read later than          ▼ (O_NONBLOCK off,
///     │ SOLE_GAP, or anything else for the worker          Blocking  SO_RCVTIMEO on)
///     └──────────── (O_NONBLOCK on, SO_RCVTIMEO off) ──────────┘ each wait a recv
/// ```
///
/// The worker's other reads and every write stay non-blocking by their
/// flags (`connmux_sys::socket::read`, `writev`), whatever the
/// descriptor's mode, so a connection given back meanwhile is read and
/// written as any other until the next wait puts its mode back.
struct Sole {
    on: bool,
    gap_ns: u64,
    timeout: Duration,
    /// The psock the last wait read on its lease, and when.
    last: Option<(PsockId, u64)>,
    /// The next wait may read this psock blocking.
    hot: Option<PsockId>,
    /// The psock whose descriptor blocks now (held: its number cannot be
    /// taken by another connection while its mode is ours).
    blocking: Option<Arc<PsockRt>>,
}

/// Reads of a worker's one connection this close together make it busy
/// (`Tuning::sole_read`): a client waiting for each reply sends its next
/// request within a few round trips of loopback (tens of microseconds).
const SOLE_GAP: Duration = Duration::from_micros(500);

/// How long a blocking read of a sole connection waits (`SO_RCVTIMEO`,
/// rounded up by the kernel to a scheduler tick): what other threads ask of
/// the worker waits at most this (and the tick) meanwhile.
const SOLE_TIMEOUT: Duration = Duration::from_millis(1);

/// A wait bounded sooner than this many `SOLE_TIMEOUT`s (a deadline due)
/// is the epoll wait: the blocking read could overrun it by a tick.
const SOLE_TIMEOUTS_AHEAD: u32 = 10;

impl Sole {
    fn new(t: &crate::Tuning) -> Sole {
        Sole {
            on: t.sole_read,
            gap_ns: SOLE_GAP.as_nanos() as u64,
            timeout: SOLE_TIMEOUT,
            last: None,
            hot: None,
            blocking: None,
        }
    }

    /// A wait brought a lent read of `p` at `at`, and nothing else: hot if
    /// its read before came within the gap.
    #[inline]
    fn saw(&mut self, p: PsockId, at: u64) {
        self.hot = match self.last {
            Some((q, t)) if q == p && at.saturating_sub(t) <= self.gap_ns => Some(p),
            _ => None,
        };
        self.last = Some((p, at));
    }

    /// Back to the epoll wait: the descriptor's mode as it was.
    #[cold]
    fn end(&mut self) {
        self.hot = None;
        self.put_back();
    }

    /// The blocking descriptor's mode as it was, if there is one.
    #[cold]
    fn put_back(&mut self) {
        if let Some(rt) = self.blocking.take() {
            let _ = connmux_sys::socket::set_rcvtimeo(rt.fd(), None);
            let _ = connmux_sys::socket::set_nonblocking(rt.fd(), true);
        }
    }
}

impl EpollIo<'_> {
    /// The psock a wait may read blocking (`Sole`), and its descriptor:
    /// hot, the worker's one psock, lent (plain, nothing backed up, not
    /// revoked), nothing in its lane, no wake, no message for its socket.
    #[inline]
    fn sole_psock(&self, w: &Worker<'_>) -> Option<(PsockId, std::os::fd::RawFd)> {
        let p = self.sole.hot?;
        if self.me.psocks.load(Ordering::Relaxed) != 1
            || self.me.woken.load(Ordering::SeqCst)
            || w.serving.as_ref().is_none_or(|sv| sv.sock.rx.is_set())
            || w.bufs.lane_out()
            || w.bufs.own.leases.len() != 1
        {
            return None;
        }
        let l = w.bufs.own.leases.get(&p)?;
        let plain = l.rt.tls.is_none() && l.backlog.is_empty() && !l.rt.lease_revoked.load(Ordering::Acquire);
        plain.then(|| (p, l.rt.fd()))
    }

    /// One blocking read of the sole psock `p` (descriptor `fd`), served
    /// as a lent read: `None` when it timed out (or was interrupted), for
    /// the epoll wait.
    #[inline(always)]
    fn sole_read(&mut self, w: &mut Worker<'_>, p: PsockId, fd: std::os::fd::RawFd) -> Option<Woke> {
        if !matches!(&self.sole.blocking, Some(b) if b.id == p) {
            // (Another connection's episode, if any, ends first.)
            self.sole.put_back();
            self.begin_sole(w.bufs.own.leases.get(&p)?.rt.clone())?;
        }
        let res = connmux_sys::socket::recv_wait(fd, &mut self.buf);
        if matches!(ReadEnd::of_io(&res), ReadEnd::Again) {
            return None;
        }
        let lent = w.bufs.own.leases.len();
        read_leased(w, p, fd, &self.buf, res);
        let kept = w.bufs.own.leases.len() == lent;
        match kept {
            true => self.sole.saw(p, w.bufs.own.read_at),
            false => self.sole.hot = None,
        }
        Some(Woke {
            commands: self.me.woken.load(Ordering::SeqCst),
            serve_ready: w.serving.as_ref().is_some_and(|sv| sv.sock.rx.is_set()),
            reported: true,
            leased_only: kept,
        })
    }

    /// `rt`'s descriptor made blocking, with the read's timeout.
    #[cold]
    fn begin_sole(&mut self, rt: Arc<PsockRt>) -> Option<()> {
        let fd = rt.fd();
        connmux_sys::socket::set_rcvtimeo(fd, Some(self.sole.timeout)).ok()?;
        self.sole.blocking = Some(rt);
        connmux_sys::socket::set_nonblocking(fd, false).ok()
    }
}

impl Io for EpollIo<'_> {
    // Inlined into the loop, its one caller: the call's register saves and
    // restores cost about 15 instructions a pass, which at one request per
    // pass is the loop's whole overhead over a hand-written one.
    #[inline(always)]
    fn wait(&mut self, w: &mut Worker<'_>, timeout: Option<Duration>) -> Woke {
        let mut woke = Woke { serve_ready: self.serve_unwatched, ..Woke::default() };
        let sh = w.sh;
        if !w.bufs.own.to_watch.is_empty() {
            watch_backlogs(w);
        }
        let timeout = match self.serve_unwatched {
            false => timeout,
            true => crate::driver::unwatched_wait(timeout),
        };
        // (A wait bounded sooner, a deadline due, is the epoll wait; what
        // is hot stays so.)
        let ahead = self.sole.timeout * SOLE_TIMEOUTS_AHEAD;
        if (self.sole.hot.is_some() || self.sole.blocking.is_some()) && timeout.is_none_or(|t| t >= ahead) {
            match self.sole_psock(w) {
                Some((p, fd)) => match self.sole_read(w, p, fd) {
                    Some(woke) => return woke,
                    None => self.sole.end(),
                },
                None => self.sole.end(),
            }
        }
        let n = self.epoll.wait(&mut self.evs, timeout).unwrap_or(0);
        if n == 0 {
            return woke;
        }
        woke.reported = true;
        woke.leased_only = true;
        for ev in self.evs.iter() {
            match ev.token {
                WAKER_TOKEN => woke.commands = true,
                SERVE_TOKEN => {
                    woke.serve_ready = true;
                    woke.leased_only = false;
                }
                t => {
                    let p = token_psock(t);
                    let mut readable = ev.readable || ev.hup || ev.error;
                    let mut writable = ev.writable;
                    // A psock lent to this worker: no core lock. Replies its
                    // connection did not take wait on the lease for this
                    // (a TLS one's records wait in its session, for the
                    // core's flush below).
                    if writable && w.bufs.own.leases.get(&p).is_some_and(|l| !l.backlog.is_empty()) {
                        crate::serve::write_backlog(sh, &mut w.bufs, p, &mut w.events);
                        writable = false;
                        if !readable {
                            continue;
                        }
                    }
                    let lease = match readable {
                        true => w.bufs.own.leases.get(&p).map(|l| (l.rt.fd(), l.rt.tls.is_some())),
                        false => None,
                    };
                    if let Some((fd, tls)) = lease {
                        let lent = w.bufs.own.leases.len();
                        match tls {
                            false => {
                                let res = connmux_sys::socket::read(fd, &mut self.buf);
                                read_leased(w, p, fd, &self.buf, res);
                                if n == 1 && self.sole.on && w.bufs.own.leases.len() == lent {
                                    self.sole.saw(p, w.bufs.own.read_at);
                                }
                            }
                            true => read_leased_tls(w, p, &mut self.buf, &mut self.plain),
                        }
                        // (A lease given back took the core lock.)
                        woke.leased_only &= w.bufs.own.leases.len() == lent;
                        if !writable {
                            continue;
                        }
                        readable = false;
                    }
                    woke.leased_only = false;
                    // The psock, lent first if it may be, and what the core
                    // will take: one lock hold.
                    let (rt, rx, lent) = {
                        let mut core = sh.lock();
                        let Some(rt) = core.psocks.get(&p).cloned() else { continue };
                        let lent = readable && worker::lend_before_read(w, &mut core, &rt);
                        let rx = (readable && !lent).then(|| match rt.tls {
                            None => RxRoom::of(core.mux.rx_room(p)),
                            Some(_) => RxRoom { cap: core.mux.rx_capacity(p), loan: None },
                        });
                        (rt, rx, lent)
                    };
                    if writable {
                        sh.set_interest(&rt, |i| i.write = false);
                        if !rt.flush_queued.swap(true, Ordering::AcqRel) {
                            w.dirty.push(rt.clone());
                        }
                    }
                    if lent {
                        let res = connmux_sys::socket::read(rt.fd(), &mut self.buf);
                        read_leased(w, p, rt.fd(), &self.buf, res);
                    } else if readable {
                        read_psock(w, &rt, rx, &mut self.buf, &mut self.plain);
                    }
                }
            }
        }
        woke
    }

    fn watch_serve(&mut self, sock: &SockRt) {
        self.serve_unwatched = self.epoll.add(sock.rx.fd.as_raw_fd(), SERVE_TOKEN, Interest::READ).is_err();
    }

    fn command(&mut self, w: &mut Worker<'_>, c: Command) {
        // A TLS psock may take bytes again (see `tls::epoll_read`); an
        // application thread's corked sends wait to be written. Other
        // threads reach epoll psocks through epoll_ctl: no other command
        // comes here.
        match c {
            Command::Resume(p) => {
                if let Some(rt) = w.sh.psock_rt(p) {
                    read_psock(w, &rt, None, &mut self.buf, &mut self.plain);
                }
            }
            // An application thread's corked sends (`Ctx::Cork`).
            Command::Flush(p) => {
                if let Some(rt) = w.sh.psock_rt(p) {
                    rt.flush_asked.store(false, Ordering::Release);
                    if !rt.flush_queued.swap(true, Ordering::AcqRel) {
                        w.dirty.push(rt);
                    }
                }
            }
            _ => {}
        }
    }

    fn leases(&self) -> bool {
        true
    }

    fn flush(&mut self, w: &mut Worker<'_>) {
        for rt in w.dirty.drain(..) {
            rt.flush_queued.store(false, Ordering::Release);
            w.sh.flush(&rt, &mut w.events);
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
fn read_psock(w: &mut Worker<'_>, rt: &Arc<PsockRt>, rx: Option<RxRoom>, buf: &mut [u8], plain: &mut Vec<u8>) {
    let sh = w.sh;
    if let Some(tls) = &rt.tls {
        if w.serving.is_some() && w.bufs.own.can_lease {
            let cap = rx.map_or_else(|| sh.lock().mux.rx_capacity(rt.id), |rx| rx.cap);
            return read_tls(w, rt, tls, false, cap, buf, plain);
        }
        return crate::shared::tls::epoll_read(sh, rt, tls, buf, &mut w.events);
    }
    let RxRoom { cap, loan } = rx.unwrap_or_else(|| {
        let mut core = sh.lock();
        RxRoom::of(core.mux.rx_room(rt.id))
    });
    if let Some(loan) = loan {
        return read_lent(sh, rt, loan, &mut w.events, &mut w.bufs.own);
    }
    if cap == 0 {
        // Paused by backpressure or stopped: stop polling for input until the
        // core says PsockRxResume. That resume may come from another thread
        // between the check above and this change (its `read = true` then finds
        // read already on and does nothing): check again after turning it off.
        sh.set_interest(rt, |i| i.read = false);
        if sh.lock().mux.rx_capacity(rt.id) > 0 {
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
        end => read_ended(sh, rt, sh.lock(), end, &mut w.events),
    }
}

/// A TLS psock's read on a serving worker that takes leases, at most `cap`
/// bytes: decrypted here, its plaintext served on the psock's lease
/// (`leased`) or fed to the core ([`worker::tls_plaintext`]), then the rest
/// of its records the usual way. Not while rustls holds something back, or
/// the core takes nothing (the usual `tls::epoll_read` then, the lease
/// given back first).
fn read_tls(
    w: &mut Worker<'_>,
    rt: &Arc<PsockRt>,
    tls: &Mutex<PsockTls>,
    leased: bool,
    cap: usize,
    buf: &mut [u8],
    plain: &mut Vec<u8>,
) {
    let sh = w.sh;
    let mut st = tls.lock().unwrap();
    if cap == 0 || !st.decrypts_in_worker() {
        drop(st);
        if leased {
            w.bufs.own.give_back(sh, rt.id, connmux_sys::clock::now_nanos(), &mut w.events);
        }
        return tls::epoll_read(sh, rt, tls, buf, &mut w.events);
    }
    // (Records only shrink: the plaintext stays within what the core takes.)
    let want = cap.min(buf.len());
    let res = connmux_sys::socket::read(rt.fd(), &mut buf[..want]);
    let read_at = connmux_sys::clock::now_nanos();
    w.bufs.own.read_at = read_at;
    match ReadEnd::of_io(&res) {
        ReadEnd::Data(n) => {
            plain.clear();
            let d = tls::decrypt_read(rt, &mut st, &buf[..n], plain, &mut w.events);
            drop(st);
            worker::tls_plaintext(w, rt, tls, leased, &d, plain, read_at);
            if !matches!(d, Decrypted::Whole) {
                tls::after_decrypt(sh, rt, tls, &buf[..n], d, &mut w.events);
            }
        }
        ReadEnd::Again => {}
        end => {
            drop(st);
            if leased {
                w.bufs.own.give_back(sh, rt.id, read_at, &mut w.events);
            }
            if let Some(how) = end.end() {
                tls::read_end(sh, rt, tls, how, &mut w.events);
            }
        }
    }
}

/// A read of psock `p`, lent to this worker (`Own::leases`; `fd` is its
/// connection): served with no core lock when it is all whole messages
/// (`serve::serve_leased`); otherwise, or at the end of the stream, the
/// lease goes back and the read goes the usual way. Inlined into the wait,
/// its one caller, for the same reason as the wait into the loop.
#[inline(always)]
fn read_leased(w: &mut Worker<'_>, p: PsockId, fd: std::os::fd::RawFd, buf: &[u8], res: std::io::Result<usize>) {
    let sh = w.sh;
    let Some(sv) = w.serving.as_ref() else { return };
    let read_at = connmux_sys::clock::now_nanos();
    w.bufs.own.read_at = read_at;
    match ReadEnd::of_io(&res) {
        ReadEnd::Data(n) => {
            let (events, dirty, out) = (&mut w.events, &mut w.dirty, LentOut::Plain(fd));
            let served = crate::serve::serve_leased(sh, sv, &mut w.bufs, &buf[..n], p, out, read_at, events, dirty);
            if let Err(crate::serve::GivenBack { rt: Some(rt), from }) = served {
                if from < n {
                    worker::feed_bytes(w, &rt, &buf[from..n], read_at);
                }
            }
        }
        ReadEnd::Again => {}
        end => {
            let mut core = sh.lock();
            let Some(rt) = w.bufs.own.unlease_rt(&mut core, p, sh.timestamp(read_at)) else { return };
            read_ended(sh, &rt, core, end, &mut w.events);
        }
    }
}

/// [`read_leased`] for a TLS psock: decrypted here; plaintext that is all
/// whole messages is served on the lease and its replies made into records
/// and written (`LentOut::Tls`). Anything else gives the lease back first.
fn read_leased_tls(w: &mut Worker<'_>, p: PsockId, buf: &mut [u8], plain: &mut Vec<u8>) {
    let Some(rt) = w.bufs.own.leases.get(&p).map(|l| l.rt.clone()) else { return };
    let Some(tls) = &rt.tls else { return };
    // (A lent psock holds nothing: the core would take a whole buffer.)
    read_tls(w, &rt, tls, true, buf.len(), buf, plain);
}

/// A read that brought no bytes: the end of the stream reaches the core
/// (and the psock is read no more); would-block, nothing.
fn read_ended(sh: &Shared, rt: &PsockRt, mut core: MutexGuard<'_, Core>, end: ReadEnd, events: &mut Vec<Event>) {
    if let Some(how) = end.end() {
        let _ = core.mux.rx_closed(rt.id, how);
        core.drain_events(events);
        drop(core);
        sh.set_interest(rt, |i| i.read = false);
    }
}

/// [`read_psock`] for a large message: one read straight into the psock's
/// assembly buffer (`Mux::rx_lend`), no more than the message still needs.
fn read_lent(
    sh: &Shared,
    rt: &PsockRt,
    mut loan: connmux_core::mux::RxLoan,
    events: &mut Vec<Event>,
    own: &mut crate::shared::Own,
) {
    let limit = loan.limit();
    let res = connmux_sys::socket::read_into(rt.fd(), loan.buf(), limit);
    let now = sh.now();
    let mut core = sh.lock();
    // The buffer goes back whatever happened (with nothing new on error).
    let _ = crate::shared::commit_read(&mut core, own, loan, now);
    match ReadEnd::of_io(&res) {
        ReadEnd::Data(_) => core.drain_events(events),
        end => read_ended(sh, rt, core, end, events),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_hot_only_after_two_reads_within_the_gap() {
        let mut s = Sole::new(&crate::Tuning::default());
        let (a, b) = (PsockId { index: 1, generation: 1 }, PsockId { index: 2, generation: 1 });
        s.saw(a, 1_000_000);
        assert_eq!(s.hot, None, "one read tells nothing");
        s.saw(a, 1_400_000);
        assert_eq!(s.hot, Some(a), "two within 500 µs");
        s.saw(a, 2_000_000);
        assert_eq!(s.hot, None, "600 µs after the last: quiet");
        s.saw(a, 2_100_000);
        assert_eq!(s.hot, Some(a), "busy again");
        s.saw(b, 2_200_000);
        assert_eq!(s.hot, None, "another connection's read: not the same one");
        s.end();
        assert_eq!((s.hot, s.blocking.is_none()), (None, true));
    }
}
