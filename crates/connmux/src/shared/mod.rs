//! State shared by the workers and the application threads, and the one place
//! where the core's events are turned into I/O and wake-ups.
//!
//! Lock discipline: `Shared::hub` is the only lock on the data path. No
//! syscall is made while it is held except the eventfd/epoll_ctl calls of event
//! dispatch, which never block (they run after the lock is released).
//!
//! Owns the hub lock, the runtime sides of sockets and psocks (`SockRt`,
//! `PsockRt`, readiness), the workers' references (`WorkerRef`: waker,
//! [`Command`]s), event dispatch and flushing (TLS psocks' records:
//! [`tls`]). Must not name a driver, serving, the lanes, the public `Mux`,
//! `KcmSocket` or anything above them: they all stand on this.

use rustc_hash::FxHashMap;
use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use connmux_core::mux::{Event, PsockError, PsockId, SockId};
use connmux_core::{Bytes, Timestamp};
use connmux_sys::epoll::{Epoll, Interest};
use connmux_sys::eventfd::EventFd;

mod kept;
mod outs;
mod own;
pub(crate) mod tls;

pub(crate) use crate::sync::inbox::Inbox;
pub(crate) use crate::sync::ready::Ready;

pub(crate) use kept::Kept;
pub(crate) use outs::{Cork, Outs};
pub(crate) use own::{commit_read, feed_read, feed_read_in_place, Own, Promise};

use crate::config::Tuning;
use crate::handler::{Handler, Lanes, ServiceStats};
use crate::sync::keep::Keep;

/// A psock failure, as KCM reports it on the attached TCP socket (POLLERR +
/// SO_ERROR). The application should `Mux::unattach` the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PsockEvent {
    pub psock: PsockId,
    pub error: PsockError,
}

/// Sockets attached to any mux in this process, by inode: KCM refuses a socket
/// whose `sk_user_data` is already set (EALREADY), whichever mux holds it.
pub(crate) static ATTACHED: Mutex<std::collections::BTreeSet<u64>> = Mutex::new(std::collections::BTreeSet::new());

/// Requests from other threads, posted to the worker's inbox
/// ([`WorkerRef::command`]). The epoll worker gets `Serve`, `Told`,
/// `Resume` and `Flush` (other threads use epoll_ctl directly); the
/// io_uring worker gets all of them, as its ring is its own.
pub(crate) enum Command {
    /// Run `handler` in place on messages steered to socket `sock`, and
    /// offer heavy connections' messages to lane `index` of `lanes`.
    Serve {
        sock: Arc<SockRt>,
        handler: Arc<dyn Handler>,
        stats: Option<Arc<ServiceStats>>,
        lanes: Arc<Lanes>,
        index: usize,
    },
    /// What was told to this worker's psocks waits in the hub
    /// (`Event::Wake`): apply it.
    Told,
    /// A psock was attached to this worker: start receiving.
    Attach(Arc<PsockRt>),
    /// The core takes bytes from this psock again (`PsockRxResume`).
    Resume(PsockId),
    /// The core wants the loan of the psock's assembly buffer back
    /// (`PsockRxRecall`: paused by the budget, or a loan made ahead that
    /// stayed out with nothing read): end the receive that holds it.
    Recall(PsockId),
    /// The psock failed: stop receiving from it.
    StopRx(PsockId),
    /// The psock has bytes to write that another thread could not (an
    /// io_uring worker's: its ring's `sendmsg` waits for room).
    Flush(PsockId),
    /// Write what socket `sock`'s sends left waiting (`SockRt::outs`):
    /// asked once while they wait, so none waits on the application.
    WriteOuts(Arc<SockRt>),
    /// The core released the psock: end its operations, then drop it.
    Release(Arc<PsockRt>),
}

/// A map of psocks' runtime sides (a worker's, a socket's outs), so that
/// a readiness or a send is acted on with no hold of the hub lock; filled
/// from the hub's (`MuxHub::psocks`) on a miss. Weak: a released psock's
/// connection closes when the hub and its other holders let it go, not
/// when this map is next looked at (its `released` flag stops reads and
/// sends before that).
#[derive(Default)]
pub(crate) struct Rts {
    map: rustc_hash::FxHashMap<PsockId, Weak<PsockRt>>,
    /// At this many entries the released ones are swept out.
    sweep_at: usize,
}

impl Rts {
    pub fn get(&mut self, sh: &Shared, p: PsockId) -> Option<Arc<PsockRt>> {
        if let Some(rt) = self.map.get(&p).and_then(Weak::upgrade) {
            if !rt.released.load(Ordering::Acquire) {
                return Some(rt);
            }
            self.map.remove(&p);
            return None;
        }
        let rt = sh.psock_rt(p)?;
        if self.map.len() >= self.sweep_at {
            self.map.retain(|_, rt| rt.strong_count() > 0);
            self.sweep_at = 2 * self.map.len().max(32);
        }
        self.map.insert(p, Arc::downgrade(&rt));
        Some(rt)
    }
}

/// Encode a psock id as an epoll token (index in the low half, generation high).
pub(crate) fn psock_token(p: PsockId) -> u64 {
    ((p.generation as u64) << 32) | p.index as u64
}
pub(crate) fn token_psock(t: u64) -> PsockId {
    PsockId { index: t as u32, generation: (t >> 32) as u32 }
}

/// Runtime side of a KCM socket.
pub(crate) struct SockRt {
    pub id: SockId,
    pub rx: Ready,
    pub tx: Ready,
    pub nonblocking: AtomicBool,
    pub rcvtimeo: Mutex<Option<Duration>>,
    pub sndtimeo: Mutex<Option<Duration>>,
    /// This socket's addressed sends waiting to be written (corked while
    /// it has more to receive: [`Outs`]); taken by its sending thread, or
    /// by the worker asked to write them.
    pub outs: Mutex<Outs>,
    /// A worker was asked to write `outs` (`Command::WriteOuts`) and has
    /// not taken the ask yet: a send that corks asks again only once it
    /// is clear.
    pub outs_asked: AtomicBool,
    /// Closed (set before the hub closes it): a worker serving it frames no
    /// more alone for it.
    pub closed: AtomicBool,
    /// A receive since the socket last waited left more messages queued:
    /// a backlog forms, and its next wait sleeps at once rather than spin
    /// (`Config::recv_spin`).
    pub backlog: AtomicBool,
    /// Its affinity tag while steering is by affinity and it receives
    /// ([`NO_TAG`] otherwise), set under the hub lock with what it mirrors
    /// ([`SockRt::mirror`]): the messages a pass of its thread frames
    /// alone and keeps for it (`Mine`) are those steering would send it.
    pub kept_tag: std::sync::atomic::AtomicU32,
    /// Steering is by affinity, it receives and has no tag: a worker's
    /// pass its thread leads frames for it alone what steering gives the
    /// reader (`Owned::frame_alone_as_reader`).
    pub untagged: AtomicBool,
    /// What passes its threads ran kept for it ([`Kept`]), received
    /// before its queue in the hub, and whether it receives (stopped
    /// while receive-disabled, set under the hub lock: what was kept goes
    /// back to the hub, `Kept::give_back`).
    pub kept: Keep<Kept>,
}

impl SockRt {
    /// Mirror its steering from the hub (`kept_tag`, `untagged`, whether
    /// it receives: `kept`): called under the hub lock, at its making and
    /// after a change to them.
    pub fn mirror(&self, m: &connmux_core::mux::Mux) {
        let v = m.v();
        let off = m.recv_disabled(self.id).unwrap_or(true);
        let by_affinity = v.config().steering == connmux_core::mux::Steering::Affinity && !off;
        let tag = by_affinity.then(|| v.sock_affinity(self.id)).flatten();
        self.kept_tag.store(tag.unwrap_or(NO_TAG), Ordering::Release);
        self.untagged.store(by_affinity && tag.is_none(), Ordering::Release);
        self.kept.mirror(off);
    }
}

/// No tag (`SockRt::kept_tag`).
pub(crate) const NO_TAG: u32 = u32::MAX;

/// Runtime side of a psock: the connection and which worker owns it.
pub(crate) struct PsockRt {
    pub id: PsockId,
    pub stream: TcpStream,
    /// The worker that reads it (chosen at attach, never changes; see
    /// `MuxInner::pick_worker`).
    pub worker: usize,
    /// Socket inode: the identity used for EALREADY/ENOENT, as KCM uses the sock.
    pub ino: u64,
    pub interest: Mutex<PsockInterest>,
    pub error: Mutex<Option<PsockError>>,
    /// Set while the psock sits in a worker's deferred-flush list.
    pub flush_queued: AtomicBool,
    /// Who writes its connection now: its owner, a served read's replies
    /// with no hold of the hub lock (`serve::write_alone`), or the hub's
    /// writers ([`MuxHub::tx_begin`]).
    pub writer: crate::sync::writer::Writer,
    /// Unattached (set as its release is dispatched, before the unattach
    /// returns): its worker, which finds it through a map of its own,
    /// reads it no more.
    pub released: AtomicBool,
    /// TLS state of a psock attached with `Mux::attach_tls`.
    pub tls: Option<Mutex<tls::PsockTls>>,
    /// The certificate chain its TLS peer presented (leaf first), set once
    /// as the handshake completes (`Mux::tls_peer_certificates`): read with
    /// no lock, so a handler may ask while the TLS state is busy.
    pub tls_peer: OnceLock<Vec<rustls::pki_types::CertificateDer<'static>>>,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PsockInterest {
    pub read: bool,
    pub write: bool,
    pub registered: bool,
}

impl PsockRt {
    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
    pub fn worker(&self) -> usize {
        self.worker
    }
}

/// Everything under the hub lock (KCM's `mux->lock`): the core's hub,
/// through which any thread calls it (`mux`), and the runtime sides of
/// its sockets and psocks. A psock's receive side is not here: its
/// worker owns it (`driver::worker::Worker::owned`).
pub(crate) struct MuxHub {
    pub mux: connmux_core::mux::Mux,
    pub psocks: FxHashMap<PsockId, Arc<PsockRt>>,
    pub socks: FxHashMap<SockId, Arc<SockRt>>,
}

impl MuxHub {
    /// Take the core's pending events into `out`. A psock raised for a
    /// writer has messages queued: its owner writes none of its own past
    /// them (`Writer::mark`, in the hold that drains the event).
    pub fn drain_events(&mut self, out: &mut Vec<Event>) {
        while let Some(e) = self.mux.poll_event() {
            if let Event::PsockTransmit(p) = e {
                if let Some(rt) = self.psocks.get(&p) {
                    rt.writer.mark();
                }
            }
            out.push(e);
        }
    }

    /// A message was queued on psock `p` with no transmit event (its
    /// write held by a batch): the owner writes none of its own past it
    /// (`Writer::mark`), as after an event.
    pub fn mark_queued(&self, p: PsockId) {
        if let Some(rt) = self.psocks.get(&p) {
            rt.writer.mark();
        }
    }

    /// Begin psock `rt`'s next chunk into `slices` as one of the hub's
    /// writers (`Mux::tx_begin_into`): not while its owner writes outside
    /// the hub (`Writer::claim`; the owner writes it when done), and the
    /// owner may write again once nothing is queued or out.
    pub fn tx_begin(&mut self, rt: &PsockRt, slices: &mut Vec<Bytes>) -> bool {
        if !rt.writer.claim() {
            slices.clear();
            return false;
        }
        if self.mux.tx_begin_into(rt.id, slices) {
            return true;
        }
        self.tx_settled(rt);
        false
    }

    /// Psock `rt` has nothing queued and no chunk out: its owner may write
    /// outside the hub again (`Writer::idle`).
    pub fn tx_settled(&mut self, rt: &PsockRt) {
        if self.mux.tx_idle(rt.id) {
            rt.writer.idle();
        }
    }
}

/// How other threads reach a worker's connections.
pub(crate) enum WorkerIo {
    /// epoll_ctl from any thread.
    Epoll(Epoll),
    /// The ring is the worker's alone: other threads post commands.
    Uring,
}

/// Per-worker handles other threads need: its I/O and its waker.
pub(crate) struct WorkerRef {
    /// Set at start, or (`Driver::Auto`) at the worker's first use
    /// (`WorkerRef::io_for_psock`, `WorkerRef::take_ring`).
    io: std::sync::OnceLock<WorkerIo>,
    /// `Driver::Auto`: the epoll, its waker added, that the worker takes
    /// if a psock is attached to it before it is asked to serve.
    spare: Mutex<Option<Epoll>>,
    pub waker: EventFd,
    /// What other threads ask of it, taken each time its waker fires.
    pub commands: Inbox<Command>,
    /// Psocks it reads (attached, not yet released).
    pub psocks: AtomicUsize,
    /// The CPU it is pinned to, if any.
    pub cpu: Option<usize>,
    /// It has taken its `Command::Serve`: it serves in place from its next
    /// read on (`Mux::serve` returns only then).
    pub serving: AtomicBool,
}

impl WorkerRef {
    /// A worker with I/O `io`, or (`None`) one that decides at its first
    /// use, taking `spare` if that is a psock.
    pub fn new(io: Option<WorkerIo>, spare: Option<Epoll>, waker: EventFd, cpu: Option<usize>) -> WorkerRef {
        let cell = std::sync::OnceLock::new();
        if let Some(io) = io {
            let _ = cell.set(io);
        }
        WorkerRef {
            io: cell,
            spare: Mutex::new(spare),
            waker,
            commands: Inbox::default(),
            psocks: AtomicUsize::new(0),
            cpu,
            serving: AtomicBool::new(false),
        }
    }

    /// Its I/O. Decided once it has a psock (a psock's paths call this).
    pub fn io(&self) -> &WorkerIo {
        self.io.get().expect("a worker with psocks has its I/O")
    }

    /// Its I/O if decided (`Driver::Auto` decides at first use).
    pub fn io_decided(&self) -> Option<&WorkerIo> {
        self.io.get()
    }

    /// A psock is being attached to it: its I/O, epoll (its spare) unless
    /// it took a ring already.
    pub fn io_for_psock(&self) -> &WorkerIo {
        self.io.get_or_init(|| {
            let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner()).take();
            WorkerIo::Epoll(spare.expect("an undecided worker has a spare epoll"))
        })
    }

    /// It is asked to serve before any psock came (`Driver::Auto`): it
    /// runs a ring. `false`: a psock came first, and it stays on epoll.
    pub fn take_ring(&self) -> bool {
        self.io.set(WorkerIo::Uring).is_ok()
    }

    /// Post a command and wake the worker, unless a wake is owed already
    /// (the inbox says: one wake a batch; the worker drains its eventfd
    /// before it takes the batch, so a post after that wakes it again).
    pub fn command(&self, c: Command) {
        if self.commands.post(c) {
            let _ = self.waker.notify();
        }
    }

    /// Post a command that may wait a moment: it wakes the worker unless
    /// the worker promised to look at its commands soon
    /// (`Inbox::post_lazy`, `driver::worker::CORK_WAIT`).
    pub fn command_lazy(&self, c: Command) {
        if self.commands.post_lazy(c) {
            let _ = self.waker.notify();
        }
    }

    /// What was told to the worker's psocks waits in the hub
    /// (`Event::Wake`, raised once until it applies): it applies it in
    /// its next pass.
    pub fn tell(&self) {
        self.command(Command::Told);
    }

    /// Wake the worker (its waker's eventfd, what a wait watches), for
    /// what it finds without a command (a lane's replies, the mux's stop).
    pub fn wake(&self) -> std::io::Result<()> {
        self.waker.notify()
    }
}

pub(crate) struct Shared {
    pub hub: Mutex<MuxHub>,
    /// The worker threads' handles, by index.
    pub workers: Vec<WorkerRef>,
    /// The stand-alone sockets' slots (`Config::stand_alone`): a worker with
    /// no thread of its own, whose pass a stand-alone socket's `recv` runs.
    /// Slot `i` is worker index `workers.len() + i`.
    pub alone: Vec<WorkerRef>,
    /// The slots no socket holds, and none of whose connections are left
    /// from a socket that closed (worker indexes).
    pub alone_free: Mutex<Vec<usize>>,
    pub stop: AtomicBool,
    pub read_chunk: usize,
    /// `Config::recv_spin`.
    pub recv_spin: Duration,
    /// `Config::lane_nice`.
    pub lane_nice: i32,
    /// `Config::lane_worker_slice`.
    pub lane_worker_slice: std::time::Duration,
    /// `Config::lane_slice`.
    pub lane_slice: std::time::Duration,
    pub events_tx: crossbeam::channel::Sender<PsockEvent>,
    pub events_dropped: AtomicU64,
    /// `connmux_sys::clock::now_nanos` when the mux started: the core's time 0.
    pub clock_origin: u64,
    pub tls: tls::TlsCounters,
    /// Psocks steered to a worker's heavy lane.
    pub lane_moves: AtomicU64,
    /// Psocks steered back from a lane to their worker.
    pub lane_returns: AtomicU64,
    /// Replies a lane posted without waking their worker (it was far
    /// behind: `lane::LANE_QUIET_FROM`).
    pub lane_quiet: AtomicU64,
    /// Unattach a psock once it is drained (`Event::PsockDrained`), not
    /// only shut its write side down: a service's connections are its own.
    pub unattach_drained: AtomicBool,
    /// `Config::tuning`. Workers copy what
    /// they read per message into their own state when they start.
    pub tuning: Tuning,
}

/// What is left of a blocking call's time until `deadline` (`None`: no
/// bound), or `WouldBlock` once it has passed: a receive or send timeout
/// (SO_RCVTIMEO/SO_SNDTIMEO) runs out as the kernel's does.
pub(crate) fn time_left(deadline: Option<std::time::Instant>) -> io::Result<Option<Duration>> {
    match deadline {
        Some(d) => {
            let now = std::time::Instant::now();
            if now >= d {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(Some(d - now))
        }
        None => Ok(None),
    }
}

/// Slices written in one `writev`, and handed to rustls's writer at once
/// for a TLS psock (one record takes up to 16 KiB): the core's chunk for
/// one write is cut there. A few dozen replies per write is where batching
/// stops paying, and 64 fit the largest iovec array kept on the stack
/// ([`with_iov`]).
pub(crate) const MAX_IOV: usize = 64;

/// The most chunks one call writes in a row ([`Shared::write_begun`]):
/// a peer that reads as fast as it is written must not keep the writing
/// thread (a worker, or an application thread's send) forever.
const WRITE_ROUNDS: u32 = 1024;

/// `writev` of `bufs` (at most [`MAX_IOV`]), with an iovec array sized
/// for the common small case (filling a 64-entry array costs more than the
/// rest of a one-reply flush).
pub(crate) fn writev_bytes(fd: RawFd, bufs: &[Bytes]) -> io::Result<usize> {
    with_iov(bufs, |iov| connmux_sys::socket::writev(fd, iov))
}

/// `f` on `bufs` as `IoSlice`s (on the stack up to 64 of them).
pub(crate) fn with_iov<R>(bufs: &[Bytes], f: impl FnOnce(&[IoSlice<'_>]) -> R) -> R {
    fn go<const N: usize, R>(bufs: &[Bytes], f: impl FnOnce(&[IoSlice<'_>]) -> R) -> R {
        let mut iov: [IoSlice<'_>; N] = [IoSlice::new(&[]); N];
        for (slot, b) in iov.iter_mut().zip(bufs) {
            *slot = IoSlice::new(b);
        }
        f(&iov[..bufs.len().min(N)])
    }
    match bufs.len() {
        0..=4 => go::<4, R>(bufs, f),
        5..=16 => go::<16, R>(bufs, f),
        17..=64 => go::<64, R>(bufs, f),
        _ => {
            let iov: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
            f(&iov)
        }
    }
}

thread_local! {
    /// The slices of the chunk being written by this thread (`Shared::flush`),
    /// kept so a flush does not allocate (a buffer cache, not state).
    static FLUSH_SLICES: std::cell::RefCell<Vec<Bytes>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How one read of a psock ended, whichever driver made it: the one shape in
/// which a read's result reaches the core (bytes are fed; an end of stream
/// is `rx_closed`, at once on epoll, after the buffers before it on io_uring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadEnd {
    /// This many bytes came (more than 0).
    Data(usize),
    /// Nothing now, the stream goes on (would block, interrupted; on
    /// io_uring a receive out of buffers or cancelled, armed again).
    Again,
    /// The peer closed its write side (FIN).
    Eof,
    /// The connection failed with this errno.
    Failed(i32),
}

impl ReadEnd {
    /// A `read`'s result.
    pub fn of_io(r: &io::Result<usize>) -> ReadEnd {
        match r {
            Ok(0) => ReadEnd::Eof,
            Ok(n) => ReadEnd::Data(*n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => ReadEnd::Again,
            Err(e) => ReadEnd::Failed(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    /// An io_uring receive's completion `res`.
    pub fn of_cqe(res: i32) -> ReadEnd {
        match res {
            n if n > 0 => ReadEnd::Data(n as usize),
            0 => ReadEnd::Eof,
            e if matches!(-e, libc::ENOBUFS | libc::ECANCELED | libc::EAGAIN | libc::EINTR) => ReadEnd::Again,
            e => ReadEnd::Failed(-e),
        }
    }

    /// The end of the stream as `Mux::rx_closed` takes it (`Some(None)`: a
    /// FIN, `Some(Some(errno))`: a failure), or `None` while it goes on.
    pub fn end(self) -> Option<Option<i32>> {
        match self {
            ReadEnd::Eof => Some(None),
            ReadEnd::Failed(errno) => Some(Some(errno)),
            ReadEnd::Data(_) | ReadEnd::Again => None,
        }
    }
}

/// What one write of a psock's chunk did, whichever driver made it: the one
/// shape in which a write's result reaches the core ([`Wrote::apply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// This many bytes went out (possibly fewer than the chunk).
    Bytes(usize),
    /// Nothing went out and the call may be made again (would block,
    /// interrupted).
    Again,
    /// The connection failed with this errno.
    Failed(i32),
}

impl Wrote {
    /// A `writev`'s result.
    pub fn of_io(r: &io::Result<usize>) -> Wrote {
        match r {
            Ok(n) => Wrote::Bytes(*n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Wrote::Again,
            Err(e) => Wrote::Failed(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    /// An io_uring send's completion `res` for a chunk of `want` bytes: 0
    /// bytes of a non-empty chunk is a closed connection (EPIPE).
    pub fn of_cqe(res: i32, want: usize) -> Wrote {
        match res {
            n if n > 0 => Wrote::Bytes(n as usize),
            0 if want == 0 => Wrote::Bytes(0),
            0 => Wrote::Failed(libc::EPIPE),
            // The ring honours the descriptor's O_NONBLOCK: a full socket
            // buffer ends the send with EAGAIN (the driver then waits for
            // room), not with a failure of the connection.
            e if -e == libc::EAGAIN => Wrote::Again,
            e => Wrote::Failed(-e),
        }
    }

    /// Tell the core: the chunk handed out by `tx_begin*` is done with
    /// (a short count: the rest is handed out again), and on failure the
    /// psock's transmit is aborted (its message in progress resent whole
    /// elsewhere).
    pub fn apply(self, core: &mut MuxHub, p: PsockId) {
        match self {
            Wrote::Bytes(n) => core.mux.tx_complete(p, n),
            Wrote::Again => core.mux.tx_complete(p, 0),
            Wrote::Failed(errno) => {
                core.mux.tx_complete(p, 0);
                core.mux.tx_failed(p, errno);
            }
        }
    }
}

/// Who is dispatching: a worker defers writes to the end of its pass so that
/// replies to one read go out in one `writev`; other threads write at once.
pub(crate) enum Ctx<'a> {
    /// An application thread (or the API's own calls): it writes what its
    /// call queued on a psock at once.
    App,
    /// A worker: the psocks to write at the end of its pass, and its own
    /// hand-off state.
    Worker(&'a mut Vec<Arc<PsockRt>>, &'a mut Own),
}

impl Shared {
    /// Worker `i`'s handles: a worker thread's, or past them a stand-alone
    /// socket's slot's.
    #[inline]
    pub fn worker(&self, i: usize) -> &WorkerRef {
        match self.workers.get(i) {
            Some(w) => w,
            None => &self.alone[i - self.workers.len()],
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, MuxHub> {
        // A panic while holding the lock leaves the core in an unknown state;
        // continuing would break KCM's guarantees, so propagate it.
        self.hub.lock().expect("connmux hub lock poisoned")
    }

    pub fn now(&self) -> Timestamp {
        self.timestamp(connmux_sys::clock::now_nanos())
    }

    /// The core's timestamp of a clock reading already taken
    /// (`connmux_sys::clock::now_nanos`: one subtraction, where an `Instant`
    /// costs a `timespec` subtraction and a `Duration` per reading).
    pub fn timestamp(&self, at_nanos: u64) -> Timestamp {
        Timestamp::from_nanos(at_nanos.saturating_sub(self.clock_origin))
    }

    /// Drained psock `rt` has written its last byte: FIN, then unattach it
    /// where the owner asked the mux to (`unattach_drained`: the service).
    pub(crate) fn shut_drained(&self, rt: &PsockRt, events: &mut Vec<Event>) {
        let _ = rt.stream.shutdown(std::net::Shutdown::Write);
        if self.unattach_drained.load(Ordering::Acquire) {
            let mut core = self.lock();
            if core.mux.unattach(rt.id).is_ok() {
                core.drain_events(events);
            }
        }
    }

    /// Act on core events. Must be called without the hub lock held.
    pub fn dispatch(&self, events: &mut Vec<Event>, ctx: &mut Ctx<'_>) {
        let mut i = 0;
        while i < events.len() {
            let ev = events[i].clone();
            i += 1;
            match ev {
                Event::SockReadable(s) => {
                    // The worker serving `s` in place looks at its queue after
                    // this pass anyway: no eventfd round trip to itself.
                    if let Ctx::Worker(_, own) = ctx {
                        if own.serve.is_some_and(|(mine, _)| mine == s) {
                            own.pending = true;
                            continue;
                        }
                        // (A second thread waiting on that socket is woken
                        // by the first's receive, which raises the readiness
                        // while messages are left.)
                        if own.looks() == Some(s) || own.led == Some(s) {
                            continue;
                        }
                    }
                    if let Some(rt) = self.sock_rt(s) {
                        rt.rx.set();
                    }
                }
                Event::SockWritable(s) => {
                    if let Some(rt) = self.sock_rt(s) {
                        rt.tx.set();
                    }
                }
                Event::PsockTransmit(p) => {
                    // Already the last one listed for the end of the pass (an
                    // earlier read of this psock in the same pass, or its send
                    // completion, listed it): no look-up.
                    if let Ctx::Worker(list, _) = ctx {
                        if list.last().is_some_and(|rt| rt.id == p) {
                            continue;
                        }
                    }
                    let Some(rt) = self.psock_rt(p) else { continue };
                    match ctx {
                        Ctx::Worker(list, _) => {
                            if !rt.flush_queued.swap(true, Ordering::AcqRel) {
                                list.push(rt);
                            }
                        }
                        Ctx::App => self.flush(&rt, events),
                    }
                }
                Event::PsockRxResume(p) => {
                    if let Some(rt) = self.psock_rt(p) {
                        match self.worker(rt.worker()).io() {
                            WorkerIo::Epoll(_) => self.set_interest(&rt, |i| i.read = true),
                            WorkerIo::Uring => self.worker(rt.worker()).command(Command::Resume(p)),
                        }
                        if rt.tls.is_some() && matches!(self.worker(rt.worker()).io(), WorkerIo::Epoll(_)) {
                            // Decrypted bytes held back announce no readiness.
                            self.worker(rt.worker()).command(Command::Resume(p));
                        }
                    }
                }
                Event::PsockRxRecall(p) => {
                    // Only an io_uring worker keeps a loan out between
                    // passes (a receive armed into it); epoll's come back
                    // with the read.
                    if let Some(rt) = self.psock_rt(p) {
                        if let WorkerIo::Uring = self.worker(rt.worker()).io() {
                            self.worker(rt.worker()).command(Command::Recall(p));
                        }
                    }
                }
                Event::PsockFailed(p, err) => {
                    if let Some(rt) = self.psock_rt(p) {
                        match self.worker(rt.worker()).io() {
                            WorkerIo::Epoll(_) => self.set_interest(&rt, |i| i.read = false),
                            WorkerIo::Uring => self.worker(rt.worker()).command(Command::StopRx(p)),
                        }
                        let mut slot = rt.error.lock().unwrap();
                        if slot.is_none() {
                            *slot = Some(err.clone());
                        }
                    }
                    if self.events_tx.try_send(PsockEvent { psock: p, error: err }).is_err() {
                        self.events_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Event::PsockDrained(p) => {
                    // The peer closed its write side and has every answer:
                    // close in order (FIN), then let the psock go. A TLS
                    // psock's last records may still wait in TLS (or in a
                    // ring send): close_notify goes behind them, and the
                    // write side is shut once TLS has written it all.
                    let Some(rt) = self.psock_rt(p) else { continue };
                    match &rt.tls {
                        Some(tls) => crate::shared::tls::close_in_order(self, &rt, tls, events),
                        None => self.shut_drained(&rt, events),
                    }
                }
                Event::Wake(o) => match ctx {
                    // Its own: applied before its pass ends.
                    Ctx::Worker(_, own) if own.owner == o => own.told = true,
                    _ => self.worker(o as usize).tell(),
                },
                Event::PsockReleased(p) => {
                    let rt = self.lock().psocks.remove(&p);
                    if let Some(rt) = rt {
                        rt.released.store(true, Ordering::Release);
                        ATTACHED.lock().unwrap().remove(&rt.ino);
                        let mut int = rt.interest.lock().unwrap();
                        self.worker(rt.worker()).psocks.fetch_sub(1, Ordering::AcqRel);
                        if int.registered {
                            int.registered = false;
                            match self.worker(rt.worker()).io() {
                                WorkerIo::Epoll(ep) => {
                                    let _ = ep.delete(rt.fd());
                                }
                                // The worker cancels the connection's operations
                                // and drops its handle once they have ended.
                                WorkerIo::Uring => self.worker(rt.worker()).command(Command::Release(rt.clone())),
                            }
                        }
                        // The connection closes when the last Arc drops.
                    }
                }
            }
        }
        events.clear();
    }

    pub fn sock_rt(&self, s: SockId) -> Option<Arc<SockRt>> {
        self.lock().socks.get(&s).cloned()
    }
    pub fn psock_rt(&self, p: PsockId) -> Option<Arc<PsockRt>> {
        self.lock().psocks.get(&p).cloned()
    }

    /// Change a psock's epoll interest (from any thread: epoll_ctl is thread-safe).
    /// Nothing for an io_uring worker (see [`Shared::want_write`] and the commands).
    pub fn set_interest(&self, rt: &PsockRt, f: impl FnOnce(&mut PsockInterest)) {
        let mut int = rt.interest.lock().unwrap();
        let WorkerIo::Epoll(epoll) = self.worker(rt.worker()).io() else { return };
        let before = *int;
        f(&mut int);
        if !int.registered || (before.read == int.read && before.write == int.write) {
            return;
        }
        let interest = Interest { readable: int.read, writable: int.write, edge: false };
        let _ = epoll.modify(rt.fd(), psock_token(rt.id), interest);
    }

    /// The connection would block with bytes left to write: leave the rest to
    /// its worker (epoll: wait for writability; io_uring: a `sendmsg` that the
    /// kernel completes when there is room).
    pub fn want_write(&self, rt: &PsockRt) {
        match self.worker(rt.worker()).io() {
            WorkerIo::Epoll(_) => self.set_interest(rt, |i| i.write = true),
            WorkerIo::Uring => self.worker(rt.worker()).command(Command::Flush(rt.id)),
        }
    }

    /// Write what the core has for this psock until it has nothing or the
    /// connection would block. Events produced on the way are appended.
    pub fn flush(&self, rt: &PsockRt, events: &mut Vec<Event>) {
        if let Some(tls) = &rt.tls {
            return tls::flush(self, rt, tls, events);
        }
        FLUSH_SLICES.with_borrow_mut(|slices| self.flush_with(rt, events, slices));
    }

    fn flush_with(&self, rt: &PsockRt, events: &mut Vec<Event>, slices: &mut Vec<Bytes>) {
        {
            let mut core = self.lock();
            if !core.tx_begin(rt, slices) {
                core.drain_events(events);
                return;
            }
        }
        self.write_begun(rt, events, slices);
    }

    /// [`Shared::write_begun`] for the worker that owns `rt`, answering one
    /// of its reads: when the chunk goes out whole in one `writev` (the usual
    /// case: a read's replies), the core is told later, in the worker's
    /// next hold of the hub lock, not in a hold of its own
    /// (`own.wrote`, `Own::open`). Until then the chunk
    /// counts as out, so another thread's send to `rt` waits on the queue,
    /// as it does behind any chunk being written. A short or failed write
    /// goes on as `write_begun`.
    pub(crate) fn write_owned(
        &self,
        rt: &Arc<PsockRt>,
        events: &mut Vec<Event>,
        slices: &mut Vec<Bytes>,
        own: &mut Own,
    ) {
        if slices.len() > MAX_IOV {
            return self.write_begun(rt, events, slices);
        }
        let want: usize = slices.iter().map(|b| b.len()).sum();
        let res = writev_bytes(rt.fd(), slices);
        match Wrote::of_io(&res) {
            Wrote::Bytes(w) if w >= want => {
                slices.clear();
                own.wrote.push((rt.clone(), w));
            }
            wrote => {
                slices.clear();
                self.after_write(rt, wrote, &res, want, events, slices);
            }
        }
    }

    /// Write the chunk in `slices`, handed out by the core to this thread
    /// (`tx_begin_into`, `send_msgs_to_begin`), and whatever the core has for
    /// the psock after it, until it has nothing or the connection would block.
    pub fn write_begun(&self, rt: &PsockRt, events: &mut Vec<Event>, slices: &mut Vec<Bytes>) {
        // Bounded: each round either writes bytes, or stops. The next chunk is
        // taken under the same lock that completes this one.
        let n = slices.len().min(MAX_IOV);
        let want: usize = slices[..n].iter().map(|b| b.len()).sum();
        let res = writev_bytes(rt.fd(), &slices[..n]);
        // Written or not, the core still holds the messages: let go of them.
        slices.clear();
        self.after_write(rt, Wrote::of_io(&res), &res, want, events, slices);
    }

    /// The rest of [`Shared::write_begun`] after one `writev` of `want`
    /// bytes: tell the core, and write its next chunk while there is one
    /// and the connection takes it.
    fn after_write(
        &self,
        rt: &PsockRt,
        mut wrote: Wrote,
        res: &io::Result<usize>,
        mut want: usize,
        events: &mut Vec<Event>,
        slices: &mut Vec<Bytes>,
    ) {
        let mut interrupted = matches!(res, Err(e) if e.kind() == io::ErrorKind::Interrupted);
        // Bounded: each round either writes bytes, or stops, and at most
        // `WRITE_ROUNDS` chunks are taken. The next chunk is taken under the
        // same lock that completes this one.
        for round in 1.. {
            let mut core = self.lock();
            wrote.apply(&mut core, rt.id);
            match wrote {
                Wrote::Bytes(w) if w >= want => {}
                // Interrupted: write again at once.
                Wrote::Again if interrupted => {}
                // Short or would block: the rest on the next writable event.
                Wrote::Bytes(_) | Wrote::Again => {
                    core.drain_events(events);
                    drop(core);
                    self.want_write(rt);
                    return;
                }
                Wrote::Failed(_) => {
                    core.drain_events(events);
                    return;
                }
            }
            // The last chunk written is told above, before the bound ends
            // the loop: a chunk taken and not told would stay out with its
            // writer, and nobody could write the psock again.
            let more = round < WRITE_ROUNDS && core.tx_begin(rt, slices);
            core.drain_events(events);
            drop(core);
            if !more {
                if round >= WRITE_ROUNDS {
                    // Perhaps more to write: the rest goes to the worker's
                    // next writable event, not left queued with nobody to
                    // send it.
                    self.want_write(rt);
                }
                return;
            }
            let n = slices.len().min(MAX_IOV);
            want = slices[..n].iter().map(|b| b.len()).sum();
            let res = writev_bytes(rt.fd(), &slices[..n]);
            slices.clear();
            wrote = Wrote::of_io(&res);
            interrupted = matches!(res, Err(e) if e.kind() == io::ErrorKind::Interrupted);
        }
    }
}
