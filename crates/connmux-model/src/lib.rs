//! Concurrency models of connmux's cross-thread protocols, checked with loom.
//!
//! The runtime (`crates/connmux/src/shared/`, `serve/`, `driver/`, `socket.rs`)
//! shares three things between threads; each is modelled here line for line
//! with loom's primitives in place of std's, so loom can run every
//! interleaving (up to a preemption bound):
//!
//! - [`Ready`]: a KCM socket's readiness, an eventfd plus an `AtomicBool`
//!   mirror (`signaled`) so `set` makes the syscall only on a transition:
//!   the runtime's own file (`connmux::sync::ready`, [`ClearOrder::Locked`]),
//!   compiled with loom's types, the eventfd a counter under a mutex with a
//!   condition variable (`notify` adds, `drain` zeroes, `poll` waits for
//!   non-zero), so a lost wake-up shows up as loom's deadlock report; beside
//!   it the two wrong orders of `clear`, [`ClearOrder::DrainThenMark`]
//!   (which leaves a stale count: a blocked recv spins) and
//!   [`ClearOrder::MarkThenDrain`] (before commit 3f5c7fc), which loses a
//!   wake-up. [`Ready::waited`] is the runtime's readiness with no poller
//!   registered, whose eventfd is written only while a blocking call
//!   sleeps on it ([`Ready::wait_poll`]).
//! - [`Runtime`]: the **real** `connmux_core::mux::Mux` behind a loom mutex
//!   (the hub lock), with the runtime's `flush` (tx_begin → writev outside the
//!   lock → tx_complete), the worker's deferred-flush hand-off
//!   (`flush_queued`), the epoll write interest and the owner writing its
//!   replies outside the hub (`serve::write_alone`, the psock's
//!   `sync::writer::Writer` from the runtime's own file), over a modelled
//!   TCP socket with a bounded send buffer ([`Wire`]).
//! - The event dispatch of `Shared::dispatch` for the events these models
//!   raise (transmit kicks, writability, readability, release).
//!
//! - [`sync`]: the runtime's inbox (verdicts posted to a worker), crew
//!   (heavy lanes, their takers, stealing), readiness and a psock's writer
//!   word, not modelled but
//!   compiled from the runtime's own files with loom's types
//!   (`tests/crew.rs`, `tests/ready.rs`).
//!
//! What it does not model: the kernel (epoll is a flag and a level check,
//! the socket a byte budget), blocking with timeouts, or more than one
//! worker's epoll.

pub mod sync;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Mutex;

use connmux_core::mux::{Event, Mux as CoreMux, MuxConfig, PsockConfig, PsockId, SockId, SockType};

pub use sync::prim::EventFd;

/// The orders of `Ready::clear`: the runtime's, and the two wrong ones that
/// loom must reject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClearOrder {
    /// The runtime's own file (`connmux::sync::ready`): flag and counter
    /// change together under a lock, with a lock-free fast path when the
    /// flag already says so.
    Locked,
    /// `if signaled { drain(); signaled = false }` without the lock: a `set`
    /// whose write lands after the store leaves a count behind a lowered flag.
    DrainThenMark,
    /// Before 3f5c7fc: `if signaled.swap(false) { drain() }`. A `set` between
    /// the two raises the counter, the drain eats it, `signaled` stays true
    /// over an empty counter, and every later `set` is skipped.
    MarkThenDrain,
}

/// A readiness: the runtime's (`ClearOrder::Locked`, compiled from its own
/// file), or one of the wrong orders of `clear`, written here to show that
/// loom finds what they break.
pub enum Ready {
    Runtime(sync::ready::Ready),
    Wrong { fd: EventFd, signaled: AtomicBool, order: ClearOrder },
}

impl Ready {
    pub fn new(order: ClearOrder) -> Ready {
        match order {
            ClearOrder::Locked => {
                // A poller registered from the start (the fd then follows
                // the flag exactly); `Ready::waited` is the other use.
                let r = sync::ready::Ready::new().expect("a model eventfd");
                r.polled_fd();
                Ready::Runtime(r)
            }
            order => {
                Ready::Wrong { fd: EventFd::new().expect("a model eventfd"), signaled: AtomicBool::new(false), order }
            }
        }
    }
    pub fn fd(&self) -> &EventFd {
        match self {
            Ready::Runtime(r) => r.polled_fd(),
            Ready::Wrong { fd, .. } => fd,
        }
    }
    /// The runtime's readiness that nobody polls: only the library's own
    /// waits (`Ready::wait_poll`), each counted while it sleeps.
    pub fn waited() -> Ready {
        Ready::Runtime(sync::ready::Ready::new().expect("a model eventfd"))
    }
    /// A blocking call's sleep on the runtime's readiness (`Ready::wait`
    /// around a poll of the fd).
    pub fn wait_poll(&self) {
        match self {
            Ready::Runtime(r) => {
                r.wait(|fd| fd.poll());
            }
            Ready::Wrong { fd, .. } => fd.poll(),
        }
    }
    pub fn set(&self) {
        match self {
            Ready::Runtime(r) => r.set(),
            Ready::Wrong { fd, signaled, .. } => {
                if !signaled.swap(true, Ordering::AcqRel) {
                    let _ = fd.notify();
                }
            }
        }
    }
    pub fn clear(&self) {
        match self {
            Ready::Runtime(r) => r.clear(),
            Ready::Wrong { fd, signaled, order: ClearOrder::DrainThenMark } => {
                if signaled.load(Ordering::Acquire) {
                    let _ = fd.drain();
                    // (A swap for the store: see `connmux::sync::ready`.)
                    signaled.swap(false, Ordering::AcqRel);
                }
            }
            Ready::Wrong { fd, signaled, .. } => {
                if signaled.swap(false, Ordering::AcqRel) {
                    let _ = fd.drain();
                }
            }
        }
    }
    pub fn signaled(&self) -> bool {
        match self {
            Ready::Runtime(r) => r.is_set(),
            Ready::Wrong { signaled, .. } => signaled.load(Ordering::Acquire),
        }
    }
}

/// A TCP socket's send side: bytes the peer has received, and the room left
/// in the kernel's buffers (`writev` takes at most that, `WouldBlock` at 0).
pub struct Wire {
    state: Mutex<WireState>,
}

struct WireState {
    delivered: Vec<u8>,
    room: usize,
    writes: usize,
}

/// The result of a modelled `writev`.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteResult {
    Wrote(usize),
    WouldBlock,
}

impl Wire {
    pub fn new(room: usize) -> Wire {
        Wire { state: Mutex::new(WireState { delivered: Vec::new(), room, writes: 0 }) }
    }
    /// `writev`: as many bytes as there is room for, in slice order.
    pub fn writev(&self, slices: &[connmux_core::Bytes]) -> WriteResult {
        let mut st = self.state.lock().unwrap();
        if st.room == 0 {
            return WriteResult::WouldBlock;
        }
        st.writes += 1;
        let mut n = 0;
        for s in slices {
            let k = s.len().min(st.room);
            st.delivered.extend_from_slice(&s[..k]);
            st.room -= k;
            n += k;
            if k < s.len() {
                break;
            }
        }
        WriteResult::Wrote(n)
    }
    /// The peer reads: `n` more bytes of room.
    pub fn peer_reads(&self, n: usize) {
        self.state.lock().unwrap().room += n;
    }
    /// EPOLLOUT: there is room.
    pub fn writable(&self) -> bool {
        self.state.lock().unwrap().room > 0
    }
    pub fn delivered(&self) -> Vec<u8> {
        self.state.lock().unwrap().delivered.clone()
    }
}

/// Who dispatches: the worker defers flushes to the end of its pass, other
/// threads write at once (`shared::Ctx`).
pub enum Ctx<'a> {
    App,
    Worker(&'a mut Vec<PsockId>),
}

/// The runtime around the real core, for one psock on one worker.
pub struct Runtime {
    /// The hub lock (`Shared::hub`).
    pub core: Mutex<CoreMux>,
    pub psock: PsockId,
    pub wire: Wire,
    /// `PsockInterest::write` (the worker's epoll write interest).
    pub write_interest: Mutex<bool>,
    /// `PsockRt::flush_queued`.
    pub flush_queued: AtomicBool,
    /// Chunks out with a writer right now, and the most ever seen.
    pub inflight: AtomicUsize,
    pub max_inflight: AtomicUsize,
    /// `PsockReleased` events seen.
    pub released: AtomicUsize,
    /// Readiness of the sockets the model created (SockWritable/SockReadable).
    pub tx_ready: Ready,
    pub rx_ready: Ready,
    /// Old runtime: the flush bound exits without handing over (before 3f5c7fc).
    pub drop_unfinished_flush: bool,
    /// Rounds of one `flush` (the runtime uses 1024; loom needs few).
    pub flush_rounds: usize,
    /// `PsockRt::writer`: the psock's owner writing outside the hub, or the
    /// hub's writers (the runtime's own file, `sync::writer`).
    pub writer: sync::writer::Writer,
}

impl Runtime {
    /// A core with one attached psock (`room` bytes of socket buffer) and the
    /// given configuration.
    pub fn new(cfg: MuxConfig, room: usize) -> Runtime {
        let mut core = CoreMux::new(cfg);
        let psock = core.attach(connmux_core::parsers::from_spec("l4").unwrap(), PsockConfig::default());
        while core.poll_event().is_some() {}
        Runtime {
            core: Mutex::new(core),
            psock,
            wire: Wire::new(room),
            write_interest: Mutex::new(false),
            flush_queued: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            max_inflight: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
            tx_ready: Ready::new(ClearOrder::Locked),
            rx_ready: Ready::new(ClearOrder::Locked),
            drop_unfinished_flush: false,
            flush_rounds: 4,
            writer: Default::default(),
        }
    }

    pub fn socket(&self, ty: SockType) -> SockId {
        let mut core = self.core.lock().unwrap();
        let s = core.socket(ty);
        while core.poll_event().is_some() {}
        s
    }

    /// Run `f` on the core under the lock, then dispatch its events outside it
    /// (`KcmSocket::with_core` / `send_loop`).
    pub fn with_core<T>(&self, ctx: &mut Ctx<'_>, f: impl FnOnce(&mut CoreMux) -> T) -> T {
        let mut events = Vec::new();
        let r = {
            let mut core = self.core.lock().unwrap();
            let r = f(&mut core);
            self.drain(&mut core, &mut events);
            r
        };
        self.dispatch(&mut events, ctx);
        r
    }

    /// `MuxHub::drain_events`: a psock raised for a writer is the hub's
    /// (`Writer::mark`), in the hold that drains the event.
    pub fn drain(&self, core: &mut CoreMux, events: &mut Vec<Event>) {
        while let Some(e) = core.poll_event() {
            if e == Event::PsockTransmit(self.psock) {
                self.writer.mark();
            }
            events.push(e);
        }
    }

    /// `serve::write_alone`: the psock's owner writes `msg` (of socket `s`)
    /// with no hold of the lock when the hub has nothing of the psock's;
    /// a short write's rest goes to the hub, first. `false`: not taken (the
    /// runtime then queues it through the hub).
    pub fn owner_write(&self, s: SockId, msg: &[u8]) -> bool {
        if !self.writer.own() {
            return false;
        }
        let now = self.inflight.fetch_add(1, Ordering::AcqRel) + 1;
        self.max_inflight.fetch_max(now, Ordering::AcqRel);
        let data = connmux_core::Bytes::copy_from_slice(msg);
        let sent = match self.wire.writev(std::slice::from_ref(&data)) {
            WriteResult::Wrote(w) => w,
            WriteResult::WouldBlock => 0,
        };
        self.inflight.fetch_sub(1, Ordering::AcqRel);
        let mut events = Vec::new();
        {
            // (The runtime counts a whole write in its next hold; here at once.)
            let mut core = self.core.lock().unwrap();
            match sent == data.len() {
                true => core.tx_direct(s, self.psock, sent, 1),
                false => core.tx_direct_rest(s, self.psock, data, sent, 1),
            }
            self.drain(&mut core, &mut events);
        }
        if self.writer.disown() {
            self.flush(&mut events);
        }
        self.dispatch(&mut events, &mut Ctx::App);
        true
    }

    /// `Shared::dispatch`, for this model's one psock and its sockets.
    pub fn dispatch(&self, events: &mut Vec<Event>, ctx: &mut Ctx<'_>) {
        let mut i = 0;
        // Bounded: flush appends at most a few events per round.
        while i < events.len() && i < 256 {
            let ev = events[i].clone();
            i += 1;
            match ev {
                Event::SockReadable(_) => self.rx_ready.set(),
                Event::SockWritable(_) => self.tx_ready.set(),
                Event::PsockTransmit(p) => {
                    if p != self.psock {
                        continue;
                    }
                    match ctx {
                        Ctx::Worker(list) => {
                            if !self.flush_queued.swap(true, Ordering::AcqRel) {
                                list.push(p);
                            }
                        }
                        Ctx::App => self.flush(events),
                    }
                }
                Event::PsockRxResume(_) | Event::PsockFailed(..) | Event::PsockDrained(_) => {}
                // (This model lends no assembly buffer: nothing to recall.)
                Event::PsockRxRecall(_) | Event::Wake(_) => {}
                Event::PsockReleased(_) => {
                    self.released.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
        events.clear();
    }

    /// `Shared::flush`: write what the core has until it has nothing or the
    /// socket would block; the write itself is outside the hub lock.
    pub fn flush(&self, events: &mut Vec<Event>) {
        let p = self.psock;
        for _ in 0..self.flush_rounds {
            let chunk = {
                let mut core = self.core.lock().unwrap();
                // `MuxHub::tx_begin`: not while the owner writes (it writes
                // this when done); the owner's again once nothing is left.
                if !self.writer.claim() {
                    return;
                }
                match core.tx_begin(p) {
                    Some(c) => c,
                    None => {
                        if core.tx_idle(p) {
                            self.writer.idle();
                        }
                        self.drain(&mut core, events);
                        return;
                    }
                }
            };
            // The invariant the core's tx_busy gives: one chunk out per psock.
            let now = self.inflight.fetch_add(1, Ordering::AcqRel) + 1;
            self.max_inflight.fetch_max(now, Ordering::AcqRel);
            assert!(chunk.slices.iter().all(|s| !s.is_empty()), "tx_begin handed out an empty message");
            let want = chunk.len();
            let res = self.wire.writev(&chunk.slices);
            self.inflight.fetch_sub(1, Ordering::AcqRel);
            let mut core = self.core.lock().unwrap();
            match res {
                WriteResult::Wrote(w) => {
                    core.tx_complete(p, w);
                    self.drain(&mut core, events);
                    if w < want {
                        drop(core);
                        *self.write_interest.lock().unwrap() = true;
                        return;
                    }
                }
                WriteResult::WouldBlock => {
                    core.tx_complete(p, 0);
                    self.drain(&mut core, events);
                    drop(core);
                    *self.write_interest.lock().unwrap() = true;
                    return;
                }
            }
        }
        if !self.drop_unfinished_flush {
            *self.write_interest.lock().unwrap() = true;
        }
    }

    /// One worker pass for the psock (`worker::run`): a writable event clears
    /// the write interest and queues a flush (once, `flush_queued`); then
    /// `events` are dispatched in worker context; then every queued psock is
    /// flushed, and what that raised is dispatched in app context.
    pub fn worker_pass(&self, mut events: Vec<Event>) {
        let mut dirty: Vec<PsockId> = Vec::new();
        let writable_event = {
            let mut wi = self.write_interest.lock().unwrap();
            // Level-triggered EPOLLOUT with write interest.
            if *wi && self.wire.writable() {
                *wi = false;
                true
            } else {
                false
            }
        };
        if writable_event && !self.flush_queued.swap(true, Ordering::AcqRel) {
            dirty.push(self.psock);
        }
        self.dispatch(&mut events, &mut Ctx::Worker(&mut dirty));
        let mut out = Vec::new();
        for _p in dirty.drain(..) {
            self.flush_queued.store(false, Ordering::Release);
            self.flush(&mut out);
        }
        if !out.is_empty() {
            self.dispatch(&mut out, &mut Ctx::App);
        }
    }

    /// After every thread is done: the peer reads everything and the worker
    /// runs until nothing changes (bounded). What is still queued then has
    /// nobody to send it: a lost transmit.
    pub fn settle(&self) {
        for _ in 0..64 {
            self.wire.peer_reads(1 << 20);
            self.worker_pass(Vec::new());
        }
    }

    /// Every byte the core holds (`Mux::memory_used`).
    pub fn memory_used(&self) -> usize {
        self.core.lock().unwrap().memory_used()
    }
}

/// An L4-framed message (4-byte big-endian body length, then the body).
pub fn framed(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// Cut an L4 stream into its messages; panics on a torn one.
pub fn unframe(mut wire: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !wire.is_empty() {
        assert!(wire.len() >= 4, "torn header: {wire:?}");
        let n = u32::from_be_bytes(wire[..4].try_into().unwrap()) as usize;
        assert!(wire.len() >= 4 + n, "torn message: want {n}, have {}", wire.len() - 4);
        out.push(wire[4..4 + n].to_vec());
        wire = &wire[4 + n..];
    }
    out
}

/// A small configuration for models: a send buffer of `sndbuf` bytes.
pub fn small_config(sndbuf: usize) -> MuxConfig {
    MuxConfig {
        sock_sndbuf: sndbuf,
        sock_rcvbuf: 1 << 10,
        max_msg_size: 1 << 10,
        psock_rx_buf: 1 << 10,
        ..Default::default()
    }
}

/// A loom model builder with the given preemption bound.
pub fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b
}
