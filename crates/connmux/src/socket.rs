//! KCM sockets: receive and send whole messages.
//!
//! Owns [`KcmSocket`] (and `Mux::socket`, which makes one): the application
//! threads' calls, on the userspace runtime or on AF_KCM. Must not name
//! `tls` or `service`; the workers never call up into it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connmux_core::mux::{MuxError, PsockId, RecvFlags, RecvInfo, SendFlags, SockId, SockType};
use connmux_core::parser::Parser;
use connmux_core::stats::SockStats;
use connmux_core::Bytes;

use connmux_kernel::KernelSocket;

use crate::kernel::{self, NO_ADDRESS, UNKNOWN_PSOCK};
use crate::mux::{io_err, Mux, MuxImp};
use crate::shared::{Ctx, Ready, SockRt};

/// One received message and the connection it came from (addressed mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub data: Bytes,
    pub psock: PsockId,
}

/// A KCM socket: `recv` returns one whole message, `send` writes one message
/// atomically on one attached connection. Dropping it is `close()`.
///
/// **Closing drops what is not yet written**: `send` returns once the message
/// is queued, and dropping the socket (as KCM's `close()` does) discards
/// every message it accepted that has not yet been written to a connection
/// (its clones keep only their own queues). To end without losing any, call
/// [`KcmSocket::close_wait`] (or [`KcmSocket::flush`], then drop) with a
/// bound on how long to wait.
///
/// Blocking by default (with optional timeouts, like SO_RCVTIMEO/SO_SNDTIMEO);
/// [`KcmSocket::set_nonblocking`] makes calls return `WouldBlock` instead.
/// [`KcmSocket::as_raw_fd`] is an eventfd that is readable while messages are
/// queued, so the socket fits into any event loop.
///
/// On the kernel backend it is an AF_KCM socket ([`crate::Backend`] lists
/// what each call does there).
pub struct KcmSocket {
    mux: Mux,
    imp: SockImp,
    ty: SockType,
    /// A stand-alone socket's slot ([`KcmSocket::stand_alone`]).
    alone: Option<Box<crate::alone::AloneSock>>,
}

enum SockImp {
    User(Arc<SockRt>),
    Kernel(KernelSocket),
}

impl Mux {
    /// Create a KCM socket on this mux (`socket(AF_KCM, type, 0)`).
    pub fn socket(&self, ty: SockType) -> io::Result<KcmSocket> {
        KcmSocket::create(self.clone(), ty)
    }
}

impl KcmSocket {
    pub(crate) fn create(mux: Mux, ty: SockType) -> io::Result<KcmSocket> {
        if let MuxImp::Kernel(k) = &mux.imp {
            let sock = k.k.socket(ty)?;
            return Ok(KcmSocket { mux: mux.clone(), imp: SockImp::Kernel(sock), ty, alone: None });
        }
        let sh = mux.shared().clone();
        let mut core = sh.lock();
        let id = core.mux.socket(ty);
        Self::register(&mux, &mut core, id, ty)
    }

    fn register(mux: &Mux, core: &mut crate::shared::MuxHub, id: SockId, ty: SockType) -> io::Result<KcmSocket> {
        let rt = Arc::new(SockRt {
            id,
            rx: Ready::new()?,
            tx: Ready::new()?,
            nonblocking: AtomicBool::new(false),
            rcvtimeo: Mutex::new(None),
            sndtimeo: Mutex::new(None),
            outs: Mutex::new(Default::default()),
            outs_asked: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            backlog: AtomicBool::new(false),
            kept_tag: std::sync::atomic::AtomicU32::new(crate::shared::NO_TAG),
            untagged: AtomicBool::new(false),
            kept: Default::default(),
        });
        rt.mirror(&core.mux);
        // A new socket can always start a message until it fills its buffer.
        rt.tx.set();
        core.socks.insert(id, rt.clone());
        Ok(KcmSocket { mux: mux.clone(), imp: SockImp::User(rt), ty, alone: None })
    }

    /// SIOCKCMCLONE: another socket on the same mux, same type, default options.
    pub fn try_clone(&self) -> io::Result<KcmSocket> {
        let rt = match &self.imp {
            SockImp::User(rt) => rt,
            SockImp::Kernel(k) => {
                return Ok(KcmSocket {
                    mux: self.mux.clone(),
                    imp: SockImp::Kernel(k.try_clone()?),
                    ty: self.ty,
                    alone: None,
                })
            }
        };
        let sh = self.mux.shared().clone();
        let mut core = sh.lock();
        let id = core.mux.clone_sock(rt.id).map_err(io_err)?;
        let mut events = Vec::new();
        core.drain_events(&mut events);
        let s = Self::register(&self.mux, &mut core, id, self.ty);
        drop(core);
        sh.dispatch(&mut events, &mut Ctx::App);
        s
    }

    /// This socket's id (kernel backend: its `/proc/net/kcm` index, and a
    /// number that tells it from earlier sockets with the same index).
    pub fn id(&self) -> SockId {
        match &self.imp {
            SockImp::User(rt) => rt.id,
            SockImp::Kernel(k) => SockId { index: k.index().unwrap_or(u32::MAX), generation: k.key() as u32 },
        }
    }
    pub fn sock_type(&self) -> SockType {
        self.ty
    }
    pub fn mux(&self) -> &Mux {
        &self.mux
    }

    /// Attach a connection to this socket's mux (see [`Mux::attach`]); to
    /// a stand-alone socket ([`KcmSocket::stand_alone`]), read by this
    /// socket's own thread in its `recv`.
    pub fn attach(&self, conn: &impl std::os::fd::AsFd, parser: Box<dyn Parser>) -> io::Result<PsockId> {
        match &self.alone {
            Some(a) => self.mux.attach_inner(conn, parser, a.index(), None),
            None => self.mux.attach(conn, parser),
        }
    }

    /// A clone of this socket (as [`KcmSocket::try_clone`]) that stands
    /// alone: the connections attached through it ([`KcmSocket::attach`])
    /// are read by the thread that receives on it, in its `recv` calls,
    /// while nothing is queued for it — no worker thread, no wake-up
    /// between a connection and that thread. Messages of the mux's other
    /// connections still reach it as they reach any clone, and its
    /// connections' messages may go to other sockets as steering decides.
    ///
    /// Its connections are read only while a thread is in its `recv` (or
    /// `recv_msg`, `recv_batch`...): a socket nobody receives on holds
    /// them unread, as AF_KCM holds the messages of a socket nobody reads,
    /// and what a connection of it could not take at once waits for that
    /// too (a send writes at once as far as the connection takes it).
    /// Closing it leaves them attached, as a closed AF_KCM socket leaves
    /// the mux's psocks: a thread of the slot's own reads them from then on
    /// (their messages go to the mux's other sockets) until the last is
    /// unattached, and the slot is free again. Takes one of the mux's
    /// `Config::stand_alone` slots (`OutOfMemory` when all are taken;
    /// `Unsupported` on the kernel backend).
    ///
    /// What its own reads bring for it is kept for its next receives and
    /// does not make its descriptor ([`AsFd`]) readable: polling it tells
    /// of the mux's other connections' messages only (its own connections
    /// are read in its receives anyway). Its addressed sends wait while it
    /// has more to receive and leave together ([`KcmSocket::send_to`]'s
    /// cork).
    pub fn stand_alone(&self) -> io::Result<KcmSocket> {
        if let SockImp::Kernel(_) = &self.imp {
            return Err(kernel::unsupported(
                "KcmSocket::stand_alone",
                "the kernel's AF_KCM reads its connections itself",
            ));
        }
        let mut s = self.try_clone()?;
        let SockImp::User(rt) = &s.imp else { unreachable!("a userspace socket's clone") };
        let alone = crate::alone::AloneSock::take(&self.mux, rt)?;
        // Its connections' messages are steered to it (until uneven), as a
        // worker's are to the socket it serves: the slot's index is their
        // affinity tag.
        let tag = alone.index() as u32;
        s.alone = Some(Box::new(alone));
        s.set_affinity(Some(tag))?;
        Ok(s)
    }
    /// Attach a connection with a BPF parser (see [`Mux::attach_bpf`]).
    pub fn attach_bpf(&self, conn: &impl std::os::fd::AsFd, program: &crate::BpfProgram) -> io::Result<PsockId> {
        self.mux.attach_bpf(conn, program)
    }
    /// Unattach a connection (see [`Mux::unattach`]).
    pub fn unattach(&self, conn: &impl std::os::fd::AsFd) -> io::Result<()> {
        self.mux.unattach(conn)
    }

    /// The kernel backend's socket, if this is one (for what only AF_KCM
    /// has: its fd's other socket options, `recvmmsg` into buffers).
    pub fn kernel(&self) -> Option<&KernelSocket> {
        match &self.imp {
            SockImp::User(_) => None,
            SockImp::Kernel(k) => Some(k),
        }
    }

    /// Non-blocking mode (`O_NONBLOCK`): receives and sends that would wait
    /// return `WouldBlock` instead. Kernel backend: `MSG_DONTWAIT` on each
    /// call. As [`std::net::TcpStream::set_nonblocking`], it returns a result
    /// (it cannot fail on either backend today).
    pub fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match &self.imp {
            SockImp::User(rt) => rt.nonblocking.store(nb, Ordering::Relaxed),
            SockImp::Kernel(k) => k.set_nonblocking(nb),
        }
        Ok(())
    }
    /// SO_RCVTIMEO for blocking receives (`None`: wait forever), counted from
    /// the call's first wait; such a receive then fails with `WouldBlock`.
    /// Kernel backend: `setsockopt(SO_RCVTIMEO)`, whose error is returned.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.imp {
            SockImp::User(rt) => {
                *rt.rcvtimeo.lock().unwrap_or_else(|e| e.into_inner()) = t;
                Ok(())
            }
            SockImp::Kernel(k) => k.set_read_timeout(t),
        }
    }
    /// SO_SNDTIMEO for blocking sends (`None`: wait forever), counted from the
    /// call's first wait; such a send then fails with `WouldBlock`. Kernel
    /// backend: `setsockopt(SO_SNDTIMEO)`, whose error is returned.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.imp {
            SockImp::User(rt) => {
                *rt.sndtimeo.lock().unwrap_or_else(|e| e.into_inner()) = t;
                Ok(())
            }
            SockImp::Kernel(k) => k.set_write_timeout(t),
        }
    }
    /// Whether the socket is in non-blocking mode.
    pub fn nonblocking(&self) -> bool {
        match &self.imp {
            SockImp::User(rt) => rt.nonblocking.load(Ordering::Relaxed),
            SockImp::Kernel(k) => k.nonblocking(),
        }
    }
    /// KCM_RECV_DISABLE.
    pub fn set_recv_disable(&self, disable: bool) -> io::Result<()> {
        match &self.imp {
            // What was kept for it goes back first, to the front of its
            // queue, and moves on with it (in order); a pass under way in
            // another thread gives back what it keeps after it
            // (`Own::end_keep`).
            SockImp::User(rt) => self.with_core(rt, |m, id| {
                if disable {
                    rt.kept.stop(|k| k.give_back(m, id));
                }
                m.set_recv_disable(id, disable)?;
                rt.mirror(m);
                Ok(())
            }),
            SockImp::Kernel(k) => k.set_recv_disable(disable),
        }
    }
    pub fn recv_disabled(&self) -> io::Result<bool> {
        match &self.imp {
            SockImp::User(rt) => self.mux.shared().lock().mux.recv_disabled(rt.id).map_err(io_err),
            SockImp::Kernel(k) => k.recv_disabled(),
        }
    }
    /// SO_RCVBUF of this socket (bytes of queued messages before it is
    /// skipped; the kernel doubles the value).
    pub fn set_rcvbuf(&self, bytes: usize) -> io::Result<()> {
        match &self.imp {
            SockImp::User(rt) => self.with_core(rt, |m, id| m.set_rcvbuf(id, bytes)),
            SockImp::Kernel(k) => k.set_rcvbuf(bytes),
        }
    }
    /// SO_SNDBUF of this socket (checked when a new message starts; the
    /// kernel doubles the value).
    pub fn set_sndbuf(&self, bytes: usize) -> io::Result<()> {
        match &self.imp {
            SockImp::User(rt) => self.with_core(rt, |m, id| m.set_sndbuf(id, bytes)),
            SockImp::Kernel(k) => k.set_sndbuf(bytes),
        }
    }
    /// Affinity tag for the affinity steering policy (a worker index).
    /// Refused on the kernel backend, which steers messages itself.
    pub fn set_affinity(&self, tag: Option<u32>) -> io::Result<()> {
        match &self.imp {
            SockImp::User(rt) => self.with_core(rt, |m, id| {
                m.set_affinity(id, tag)?;
                rt.mirror(m);
                Ok(())
            }),
            SockImp::Kernel(_) => Err(kernel::unsupported(
                "KcmSocket::set_affinity",
                "the kernel steers messages itself and has no workers",
            )),
        }
    }

    fn with_core<T>(
        &self,
        rt: &SockRt,
        f: impl FnOnce(&mut connmux_core::mux::Mux, SockId) -> Result<T, MuxError>,
    ) -> io::Result<T> {
        let sh = self.mux.shared();
        let mut events = Vec::new();
        let r = {
            let mut core = sh.lock();
            let r = f(&mut core.mux, rt.id).map_err(io_err);
            core.drain_events(&mut events);
            r
        };
        sh.dispatch(&mut events, &mut Ctx::App);
        r
    }

    /// Wait until `ready` is set, honouring non-blocking mode and the timeout
    /// (`timeo`), at most `cap` when given (the caller then comes back
    /// whether or not it is set). The call's deadline is set by its first
    /// wait: a call that finds what it wants reads no clock and takes no
    /// timeout lock.
    fn wait(
        rt: &SockRt,
        ready: &Ready,
        timeo: &Mutex<Option<Duration>>,
        deadline: &mut Option<Option<Instant>>,
        spin: Duration,
        cap: Option<Duration>,
    ) -> io::Result<()> {
        if rt.nonblocking.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let deadline = *deadline.get_or_insert_with(|| Self::deadline(timeo));
        if !spin.is_zero() {
            // Spin briefly, then sleep: a message that comes within `spin`
            // is taken without the wake-up (see `Config::recv_spin`).
            let until = Instant::now() + spin;
            let until = deadline.map_or(until, |d| d.min(until));
            // Bounded by the clock, and by a count in case it stands still.
            for _ in 0..100_000 {
                if ready.is_set() {
                    return Ok(());
                }
                if Instant::now() >= until {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let timeout = match (crate::shared::time_left(deadline)?, cap) {
            (Some(t), Some(c)) => Some(t.min(c)),
            (t, c) => t.or(c),
        };
        ready.wait(|fd| connmux_sys::poll::poll_readable(fd.as_raw_fd(), timeout)).transpose()?;
        Ok(())
    }

    fn deadline(t: &Mutex<Option<Duration>>) -> Option<Instant> {
        t.lock().unwrap().map(|d| Instant::now() + d)
    }

    /// Receive loop shared by the recv forms: clear readiness, try, wait.
    /// What its own passes kept for it is tried first (`kept`, with the
    /// socket's `Kept` not empty; `shared::Kept`).
    fn recv_loop<T>(
        &self,
        rt: &Arc<SockRt>,
        mut kept: impl FnMut(&mut crate::shared::Kept) -> T,
        mut attempt: impl FnMut(&mut crate::shared::MuxHub) -> Result<T, MuxError>,
    ) -> io::Result<T> {
        let sh = self.mux.shared();
        let mut deadline = None;
        let mut events = Vec::new();
        // A non-blocking stand-alone socket's one pass of its slot is made.
        let mut passed = false;
        loop {
            if let Some(got) = rt.kept.take(|k| (k.len() > 0).then(|| kept(k))) {
                return Ok(got);
            }
            let r = {
                let mut core = sh.lock();
                let (r, kept_now) = rt.kept.hold(|k, stopped| {
                    // (Stopped: the receive-disable gave back what was
                    // kept and deposits are refused since; given back all
                    // the same if any is seen, `sync::keep`.)
                    match stopped {
                        true => k.give_back(&mut core.mux, rt.id),
                        false => k.settle(&mut core.mux),
                    }
                    // (Counted after: kept since the look above by another
                    // thread's pass, whose readiness this must not clear.)
                    (attempt(&mut core), k.len())
                });
                // Readiness follows the queue, decided under the lock that
                // every enqueue takes: no eventfd call unless it changes.
                if kept_now + core.mux.rx_queued(rt.id).unwrap_or(0) > 0 {
                    rt.rx.set();
                    if r.is_ok() && !rt.backlog.load(Ordering::Relaxed) {
                        rt.backlog.store(true, Ordering::Relaxed);
                    }
                } else {
                    rt.rx.clear();
                }
                core.drain_events(&mut events);
                r
            };
            if !events.is_empty() {
                sh.dispatch(&mut events, &mut Ctx::App);
            }
            match r {
                Err(MuxError::WouldBlock) => {
                    // Nothing is left unwritten while the thread waits.
                    sh.write_outs(rt);
                    if let Some(a) = &self.alone {
                        // Its own connections are read here, in this
                        // thread, while nothing is queued for it.
                        a.wait(sh, rt, &mut deadline, &mut passed)?;
                        continue;
                    }
                    // A blocking call reads connections itself while a
                    // worker's pass is free (`crate::lead`).
                    if !rt.nonblocking.load(Ordering::Relaxed) {
                        let u = self.mux.user().expect("a userspace socket's mux");
                        let d = *deadline.get_or_insert_with(|| Self::deadline(&rt.rcvtimeo));
                        match crate::lead::lead(sh, &u.leads, rt, d)? {
                            crate::lead::Led::Passed => continue,
                            crate::lead::Led::Retry(look) => {
                                Self::wait(rt, &rt.rx, &rt.rcvtimeo, &mut deadline, Duration::ZERO, Some(look))?;
                                continue;
                            }
                            crate::lead::Led::Wait => {}
                        }
                    }
                    // Spin only while messages come one at a time (the
                    // latency of each is what a wake-up would add to); past
                    // a backlog, sleep, and the next wake finds a batch.
                    let spin = match rt.backlog.swap(false, Ordering::Relaxed) {
                        true => Duration::ZERO,
                        false => sh.recv_spin,
                    };
                    Self::wait(rt, &rt.rx, &rt.rcvtimeo, &mut deadline, spin, None)?
                }
                other => return other.map_err(io_err),
            }
        }
    }

    /// recvmsg: copy one message (or the next part of it, SEQPACKET) into `buf`.
    /// DGRAM: a short buffer truncates (`trunc`), the rest is discarded.
    /// Kernel backend: `recvmsg` on the AF_KCM socket; `psock` is
    /// [`UNKNOWN_PSOCK`].
    pub fn recv_flags(&self, buf: &mut [u8], flags: RecvFlags) -> io::Result<RecvInfo> {
        match &self.imp {
            SockImp::User(rt) => {
                let (id, ty) = (rt.id, self.ty);
                // (Both forms copy into `buf`: one borrows it at a time.)
                let buf = std::cell::RefCell::new(buf);
                self.recv_loop(
                    rt,
                    |k| k.recv(ty, &mut buf.borrow_mut(), flags.peek).expect("kept: looked at first"),
                    |core| core.mux.recv(id, &mut buf.borrow_mut(), flags),
                )
            }
            SockImp::Kernel(k) => {
                let i = k.recv_flags(buf, flags)?;
                Ok(RecvInfo { len: i.len, eor: i.eor, trunc: i.trunc, psock: UNKNOWN_PSOCK })
            }
        }
    }

    /// `recv_flags` with no flags; returns the bytes copied.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_flags(buf, RecvFlags::default()).map(|i| i.len)
    }

    /// The userspace socket state, or the refusal of an addressed call.
    fn addressed(&self, call: &'static str) -> io::Result<&Arc<SockRt>> {
        match &self.imp {
            SockImp::User(rt) => Ok(rt),
            SockImp::Kernel(_) => Err(kernel::unsupported(call, NO_ADDRESS)),
        }
    }

    /// Receive one whole message without copying, with the psock it came from.
    /// Refused on the kernel backend (the psock is unknown there).
    pub fn recv_msg(&self) -> io::Result<Message> {
        let rt = self.addressed("KcmSocket::recv_msg")?;
        let id = rt.id;
        self.recv_loop(rt, |k| k.take().expect("kept: looked at first"), |core| core.mux.recv_msg(id))
            .map(|(data, psock)| Message { data, psock })
    }

    /// Addressed receive: the message and where to send the answer.
    /// Refused on the kernel backend.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<RecvInfo> {
        self.addressed("KcmSocket::recv_from")?;
        self.recv_flags(buf, RecvFlags::default())
    }

    /// recvmmsg: up to `max` whole messages; blocks (per the socket's mode) only
    /// for the first. Refused on the kernel backend (each [`Message`] names
    /// its psock; [`KcmSocket::kernel`] has `recv_batch` into buffers).
    pub fn recv_batch(&self, out: &mut Vec<Message>, max: usize) -> io::Result<usize> {
        let rt = self.addressed("KcmSocket::recv_batch")?;
        let id = rt.id;
        let start = out.len();
        let out = std::cell::RefCell::new(out);
        self.recv_loop(
            rt,
            |k| {
                let mut out = out.borrow_mut();
                let mut n = 0;
                while n < max {
                    let Some((data, psock)) = k.take() else { break };
                    out.push(Message { data, psock });
                    n += 1;
                }
                n
            },
            |core| {
                let mut out = out.borrow_mut();
                let mut n = 0;
                while n < max {
                    match core.mux.recv_msg(id) {
                        Ok((data, psock)) => {
                            out.push(Message { data, psock });
                            n += 1;
                        }
                        Err(MuxError::WouldBlock) if n > 0 => break,
                        Err(e) => return Err(e),
                    }
                }
                Ok(n)
            },
        )?;
        Ok(out.into_inner().len() - start)
    }

    /// The send forms' loop through the hub: what the socket's sends left
    /// waiting in its outs goes first (one socket's sends keep their
    /// order), then try under the hub lock, write what the send queued,
    /// wait per the socket's mode.
    fn send_loop(
        &self,
        rt: &SockRt,
        mut attempt: impl FnMut(&mut crate::shared::MuxHub) -> Result<usize, MuxError>,
    ) -> io::Result<usize> {
        let sh = self.mux.shared();
        let mut deadline = None;
        let mut events = Vec::new();
        loop {
            sh.write_outs(rt);
            let r = {
                let mut core = sh.lock();
                let r = attempt(&mut core);
                if !matches!(r, Err(MuxError::WouldBlock)) || core.mux.writable(rt.id).unwrap_or(false) {
                    rt.tx.set();
                } else {
                    rt.tx.clear();
                }
                core.drain_events(&mut events);
                r
            };
            if !events.is_empty() {
                sh.dispatch(&mut events, &mut Ctx::App);
            }
            match r {
                Err(MuxError::WouldBlock) => Self::wait(rt, &rt.tx, &rt.sndtimeo, &mut deadline, Duration::ZERO, None)?,
                other => return other.map_err(io_err),
            }
        }
    }

    /// What its replies may wait for: messages kept for it (its replies
    /// wait for those too), and its stand-alone slot, if it is one.
    fn cork(&self, rt: &SockRt) -> crate::shared::Cork {
        crate::shared::Cork { kept: rt.kept.with(|k| k.len() > 0), slot: self.alone.as_ref().map(|a| a.index()) }
    }

    /// sendmsg with KCM flags (MORE on DGRAM, EOR on SEQPACKET, BATCH).
    pub fn send_flags(&self, data: &[u8], flags: SendFlags) -> io::Result<usize> {
        match &self.imp {
            SockImp::User(rt) => {
                let id = rt.id;
                self.send_loop(rt, |h| h.mux.send(id, data, flags))
            }
            SockImp::Kernel(k) => k.send_flags(data, flags),
        }
    }

    /// Send one complete message (`write()` semantics: EOR on SEQPACKET).
    pub fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.send_flags(data, SendFlags { eor: true, ..Default::default() })
    }

    /// Addressed send: one whole message on the connection `psock`.
    /// Refused on the kernel backend.
    ///
    /// While this socket has more messages queued to receive, the message
    /// is *corked*: it waits in the socket (bounded by
    /// `Config::read_chunk` bytes) and is written with the answers to
    /// those messages (one write for many replies, as a server reading a
    /// connection's requests in one read answers them), by this socket's
    /// next send made with nothing queued, its next wait (a receive or a
    /// send that blocks, or returns `WouldBlock`), [`KcmSocket::flush`] or
    /// close, or the connection's worker, which is asked at once: a corked
    /// reply never waits for the application to call again (on a
    /// stand-alone socket's own connections it waits for the socket's next
    /// receive, whose thread is the one that reads them). The same holds
    /// for [`KcmSocket::send_msg`] to a psock and an all-addressed
    /// [`KcmSocket::send_batch_to`]; plain sends, TLS connections and a
    /// connection with sends of the hub's waiting are written at once.
    pub fn send_to(&self, data: &[u8], psock: PsockId) -> io::Result<usize> {
        let rt = self.addressed("KcmSocket::send_to")?;
        if self.mux.shared().send_out(rt, psock, data, false, self.cork(rt)) {
            return Ok(data.len());
        }
        let id = rt.id;
        self.send_loop(rt, |h| h.mux.send_to(id, psock, data, SendFlags { eor: true, ..Default::default() }))
    }

    /// Addressed send of a message already in a `Bytes` (no copy). On the
    /// kernel backend `psock` must be `None` (a plain send, copied).
    pub fn send_msg(&self, msg: Bytes, psock: Option<PsockId>) -> io::Result<()> {
        let rt = match (&self.imp, psock) {
            (SockImp::User(rt), _) => rt,
            (SockImp::Kernel(k), None) => return k.send(&msg).map(drop),
            (SockImp::Kernel(_), Some(_)) => {
                return Err(kernel::unsupported("KcmSocket::send_msg to a psock", NO_ADDRESS))
            }
        };
        if let Some(p) = psock {
            if self.mux.shared().send_out(rt, p, &msg, false, self.cork(rt)) {
                return Ok(());
            }
        }
        let id = rt.id;
        let len = msg.len();
        self.send_loop(rt, |h| h.mux.send_msg(id, psock, msg.clone(), false).map(|_| len)).map(|_| ())
    }

    /// [`KcmSocket::send_msg`] to `psock` with BATCH when `batch`: the
    /// message is queued on its connection and written with the next one
    /// this socket sends without BATCH (or at [`KcmSocket::end_batch`]), in
    /// one write. For a server that answers a connection's requests one
    /// after another and has the next in hand. Refused on the kernel
    /// backend.
    pub fn send_msg_batch(&self, msg: Bytes, psock: PsockId, batch: bool) -> io::Result<()> {
        let rt = self.addressed("KcmSocket::send_msg_batch")?;
        let id = rt.id;
        let len = msg.len();
        self.send_loop(rt, |h| {
            h.mux.send_msg(id, Some(psock), msg.clone(), batch)?;
            if batch {
                // Queued on the psock, its write held for the batch: the
                // owner writes no reply of its own past it (a reply it
                // makes later, in answer to a later request, would leave
                // first; no transmit event marks the psock until the batch
                // ends).
                h.mark_queued(psock);
            }
            Ok(len)
        })
        .map(|_| ())
    }

    /// Ends the batch this socket has open (sends with BATCH and none
    /// without since): what it holds is written now. Nothing to do with no
    /// batch open. Refused on the kernel backend.
    pub fn end_batch(&self) -> io::Result<()> {
        let rt = self.addressed("KcmSocket::end_batch")?;
        let id = rt.id;
        self.send_loop(rt, |h| h.mux.end_batch(id).map(|_| 0)).map(|_| ())
    }

    /// sendmmsg: every message but the last carries BATCH, so the batch goes out
    /// together on one connection, accepted under one hold of the core.
    /// Returns the number of messages sent (as [`KcmSocket::send_batch_to`]).
    pub fn send_batch(&self, msgs: &[&[u8]]) -> io::Result<usize> {
        match &self.imp {
            SockImp::User(rt) => self.send_each(rt, msgs.len(), |i| (None, msgs[i])),
            SockImp::Kernel(k) => k.send_batch(msgs),
        }
    }

    /// sendmmsg to chosen connections: each message whole on its psock
    /// (`None`: on one the mux picks, as [`KcmSocket::send`]), the batch
    /// accepted under one hold of the core (every message but the last
    /// carries BATCH), so each connection's messages of the batch leave in
    /// one write. What a server answering a batch received with
    /// [`KcmSocket::recv_batch`] sends back. A full send buffer pushes what
    /// the batch holds and waits per the socket's mode before the rest;
    /// another error ends the batch (what it holds goes out). Returns the
    /// number of messages sent: fewer than `msgs.len()` when one failed
    /// after the first (then the error is lost, as sendmmsg's), or the
    /// error when the first did. On the kernel backend only unaddressed
    /// messages (`None`) may be sent.
    pub fn send_batch_to(&self, msgs: &[(Option<PsockId>, &[u8])]) -> io::Result<usize> {
        match &self.imp {
            SockImp::User(rt) => {
                // Addressed ones wait in the socket's outs, as `send_to`'s,
                // the last one's send writing them; from the first they do
                // not take, the hub's.
                let (sh, cork) = (self.mux.shared(), self.cork(rt));
                let mut done = 0;
                while let Some((Some(p), data)) = msgs.get(done) {
                    if !sh.send_out(rt, *p, data, done + 1 < msgs.len(), cork) {
                        break;
                    }
                    done += 1;
                }
                match done == msgs.len() {
                    true => Ok(done),
                    // (`send_loop` writes what the first ones left waiting;
                    // sendmmsg's short count when the rest's first fails.)
                    false => match self.send_each(rt, msgs.len() - done, |i| msgs[done + i]) {
                        Ok(n) => Ok(done + n),
                        Err(_) if done > 0 => Ok(done),
                        Err(e) => Err(e),
                    },
                }
            }
            SockImp::Kernel(k) if msgs.iter().all(|(p, _)| p.is_none()) => {
                let datas: Vec<&[u8]> = msgs.iter().map(|(_, d)| *d).collect();
                k.send_batch(&datas)
            }
            SockImp::Kernel(_) => Err(kernel::unsupported("KcmSocket::send_batch_to a psock", NO_ADDRESS)),
        }
    }

    /// The userspace side of both batch sends: message `msg(i)` of `n`, each
    /// whole, BATCH on all but the last.
    fn send_each<'a>(
        &self,
        rt: &SockRt,
        n: usize,
        msg: impl Fn(usize) -> (Option<PsockId>, &'a [u8]),
    ) -> io::Result<usize> {
        let id = rt.id;
        let mut sent = 0;
        let r = self.send_loop(rt, |h| {
            let m = &mut h.mux;
            while sent < n {
                let (p, data) = msg(sent);
                let flags = SendFlags { eor: true, batch: sent + 1 < n, more: false };
                let r = match p {
                    Some(p) => m.send_to(id, p, data, flags),
                    None => m.send(id, data, flags),
                };
                match r {
                    Ok(_) => sent += 1,
                    // The core pushed what the batch held; `send_loop`
                    // waits (or returns WouldBlock) and comes back here.
                    Err(MuxError::WouldBlock) => return Err(MuxError::WouldBlock),
                    Err(e) => {
                        // Not coming back: the batch so far goes out.
                        let _ = m.end_batch(id);
                        return Err(e);
                    }
                }
            }
            Ok(sent)
        });
        match r {
            // (sendmmsg returns a short count; the core has pushed out what
            // was batched before the refusal.)
            Err(_) if sent > 0 => Ok(sent),
            other => other,
        }
    }

    /// This socket's counters (`/proc/net/kcm` kcm-N line).
    pub fn stats(&self) -> io::Result<SockStats> {
        match &self.imp {
            SockImp::User(rt) => self.mux.shared().lock().mux.sock_stats(rt.id).map_err(io_err),
            SockImp::Kernel(k) => k.stats(),
        }
    }

    /// Messages this socket accepted (`send`) and has not yet written to a
    /// connection; dropping the socket now would discard them.
    pub fn unsent(&self) -> io::Result<usize> {
        match &self.imp {
            SockImp::User(rt) => {
                let waiting = self.mux.shared().outs_msgs(rt);
                Ok(waiting + self.mux.shared().lock().mux.tx_unsent(rt.id).map_err(io_err)?)
            }
            SockImp::Kernel(_) => {
                Err(kernel::unsupported("KcmSocket::unsent", "AF_KCM does not report a socket's unsent messages"))
            }
        }
    }

    /// Wait, at most `timeout`, until every message this socket accepted has
    /// been written to its connection (its kernel send buffer): then a drop
    /// loses nothing. `TimedOut` if messages are still unsent at the
    /// deadline (a connection whose peer does not read, or no connection
    /// attached); nothing is dropped by the call itself. A message built with
    /// MORE/without EOR and never ended is not waited for (it cannot be sent).
    /// Unsupported on the kernel backend (AF_KCM's close drops them too).
    pub fn flush(&self, timeout: Duration) -> io::Result<()> {
        if let SockImp::User(rt) = &self.imp {
            self.mux.shared().write_outs(rt);
        }
        let deadline = Instant::now() + timeout;
        let mut nap = Duration::from_micros(50);
        // Bounded by the deadline (and the count, should the clock stand still).
        for _ in 0..1_000_000 {
            let left = self.unsent()?;
            if left == 0 {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{left} messages still unsent")));
            }
            // The workers write; nothing signals "all written": look again soon.
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_millis(5));
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "messages still unsent"))
    }

    /// `close()` that waits, at most `timeout`, for the messages this socket
    /// accepted to be written first ([`KcmSocket::flush`]); the socket is
    /// closed either way, and the result says whether anything was dropped
    /// (`TimedOut`: messages were still unsent and are discarded). On the
    /// kernel backend it closes at once and returns `Unsupported`.
    pub fn close_wait(self, timeout: Duration) -> io::Result<()> {
        self.flush(timeout)
    }

    /// Messages waiting to be received (kernel backend: the socket's
    /// `/proc/net/kcm` Recv-Q; 0 if it cannot be read).
    pub fn queued(&self) -> usize {
        match &self.imp {
            SockImp::User(rt) => {
                let kept = rt.kept.with(|k| k.len());
                kept + self.mux.shared().lock().mux.rx_queued(rt.id).unwrap_or(0)
            }
            SockImp::Kernel(k) => k.stats().map(|s| s.rx_queued).unwrap_or(0),
        }
    }
}

impl AsRawFd for KcmSocket {
    /// Readable while messages are queued (an eventfd; on the kernel backend
    /// the AF_KCM socket itself). The same descriptor as [`AsFd::as_fd`].
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl AsFd for KcmSocket {
    /// The socket's receive readiness: readable while messages are queued
    /// (an eventfd the runtime keeps non-zero exactly then; on the kernel
    /// backend the AF_KCM socket itself), so the socket fits into any event
    /// loop (`poll`, epoll, tokio's `AsyncFd`). Level-triggered: a reader
    /// that takes the last message makes it unreadable again (but for the
    /// messages a blocking receive's own pass kept for the socket, taken
    /// with no look at the hub: after the last of them it stays readable
    /// until the socket's next receive finds nothing). Only for waiting:
    /// reading or writing it is not a receive or a send.
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.imp {
            SockImp::User(rt) => rt.rx.polled_fd().as_fd(),
            SockImp::Kernel(k) => k.as_fd(),
        }
    }
}

impl KcmSocket {
    /// The descriptor that says a send can start: on the userspace backend
    /// an eventfd readable while the socket's send buffer has room (after a
    /// send that found none, until room comes back), on the kernel backend
    /// the AF_KCM socket (writable when it has room).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn send_ready_fd(&self) -> (BorrowedFd<'_>, bool) {
        match &self.imp {
            SockImp::User(rt) => (rt.tx.polled_fd().as_fd(), false),
            SockImp::Kernel(k) => (k.as_fd(), true),
        }
    }
}

/// `close()`: messages received and not yet read move to the mux's other
/// sockets; messages accepted by `send` and not yet written are dropped (as
/// with KCM). [`KcmSocket::close_wait`] waits for them first.
impl Drop for KcmSocket {
    fn drop(&mut self) {
        // A kernel socket closes when its `KernelSocket` drops.
        let SockImp::User(rt) = &self.imp else { return };
        let sh = self.mux.shared().clone();
        rt.closed.store(true, Ordering::Release);
        sh.write_outs(rt);
        if let Some(a) = self.alone.take() {
            a.close(&self.mux, rt);
        }
        let mut events = Vec::new();
        {
            let mut core = sh.lock();
            // What was kept for it moves on with its queue.
            rt.kept.with(|k| k.give_back(&mut core.mux, rt.id));
            let _ = core.mux.close(rt.id);
            core.socks.remove(&rt.id);
            core.drain_events(&mut events);
        }
        sh.dispatch(&mut events, &mut Ctx::App);
    }
}
