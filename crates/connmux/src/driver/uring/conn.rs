//! A psock as the io_uring worker drives it ([`Conn`]), and the receive side:
//! bytes delivered into the ring's provided buffers are held, fed to the core
//! no faster than it takes them ([`pump`]), spilled to the psock's own buffer
//! when it pauses, and the buffers go back to the ring once the messages
//! framed in them are served ([`Framed`]).
//!
//! Owns no thread: the worker in `driver::uring` calls it. Must not name
//! anything above the core's runtime side (`shared`).

use std::collections::VecDeque;
use std::sync::Arc;

use connmux_core::mux::{Event, Owned, PsockId, RxLoan};
use connmux_core::{Bytes, Timestamp};

use super::WRing;
use crate::shared::{psock_token, MuxHub, Own, PsockRt, Shared, SockRt};

/// Bytes of a provided buffer not yet taken by the core.
pub(super) struct Held {
    pub(super) buf: u16,
    pub(super) off: usize,
}

/// One psock as this worker drives it.
pub(super) struct Conn {
    pub(super) rt: Arc<PsockRt>,
    /// The receive in flight on the ring, if any (see [`Recv`]).
    pub(super) recv: Recv,
    /// Where its receive side is in its life (see [`RxLife`]).
    pub(super) life: RxLife,
    /// Buffers delivered but not yet (fully) taken by the core, in order.
    /// Empty after every pass but while the core takes bytes (a paused
    /// psock's rest goes to `spill`).
    pub(super) held: VecDeque<Held>,
    /// Bytes copied out of ring buffers when the core paused the psock; fed
    /// before anything held (they came first), from `spill_off`.
    pub(super) spill: Vec<u8>,
    pub(super) spill_off: usize,
    /// The spill's memory as last told to the core (`Mux::set_rx_below`).
    pub(super) spill_counted: usize,
    /// A send is in flight, of this many bytes.
    pub(super) sending: Option<usize>,
    /// A `POLLOUT` poll is in flight: a send found the socket buffer full
    /// (`wait_for_room`), waiting for the connection to take more.
    pub(super) out_polled: bool,
    /// The core released it: waiting for its operations to end.
    pub(super) released: bool,
    /// TLS: the records of the send in flight, or what a short send left.
    pub(super) tls_out: Option<Bytes>,
}

/// The receive a connection has in flight on the ring:
///
/// ```text
///           arm: recv_multishot / recv_once
///   Idle ─────────────────────────────────────► Buffers { multishot, cancelling }
///    ▲ │    arm: recv_into the psock's assembly     │
///    │ │    buffer (a large message: Mux::rx_lend)  │  cancel (paused, stopped,
///    │ └──────────────────────────────► Into { loan, cancelling }  recalled, a
///    │                                              │  large message began):
///    │    its last completion (Recv without more,   │  cancelling = true
///    └─── RecvEnd, RecvInto: the loan goes back) ◄──┘
/// ```
pub(super) enum Recv {
    Idle,
    /// Into the ring's provided buffers, until its last completion: one
    /// buffer (`multishot` false: armed while the memory budget is over),
    /// or as many as the peer's bytes fill.
    Buffers {
        multishot: bool,
        cancelling: bool,
    },
    /// Straight into the psock's assembly buffer, lent by the core; the ring
    /// holds the bytes until the completion.
    Into {
        loan: RxLoan,
        cancelling: bool,
    },
}

impl Recv {
    pub(super) fn armed(&self) -> bool {
        !matches!(self, Recv::Idle)
    }
    /// Ask the ring to end the receive in flight (once).
    pub(super) fn cancel(&mut self, ring: &mut WRing, token: u64) {
        if let Recv::Buffers { cancelling, .. } | Recv::Into { cancelling, .. } = self {
            if !*cancelling {
                *cancelling = ring.cancel_recv(token).is_ok();
            }
        }
    }
    /// The last completion of a receive into the ring's buffers came.
    pub(super) fn buffers_ended(&mut self) {
        if matches!(self, Recv::Buffers { .. }) {
            *self = Recv::Idle;
        }
    }
    /// The completion of a receive into a loan came: the loan, to give back.
    pub(super) fn loan_ended(&mut self) -> Option<RxLoan> {
        match std::mem::replace(self, Recv::Idle) {
            Recv::Into { loan, .. } => Some(loan),
            other => {
                *self = other;
                None
            }
        }
    }
}

/// A connection's receive side:
///
/// ```text
///   Open ── a receive ends with end of stream or an error ──► Ending(how)
///    │                                                          │ the bytes held before it
///    │ failed (StopRx), no more bytes taken                     │ fed: reported to the core
///    └────────────────────────────────► Over ◄───────────────────┘
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RxLife {
    Open,
    /// End of stream (`None`) or an error, reported to the core once the
    /// bytes held before it have been fed.
    Ending(Option<i32>),
    /// Receive is over for good.
    Over,
}

impl RxLife {
    /// A receive ended this way (ignored once the side is past `Open`).
    pub(super) fn end(&mut self, how: Option<i32>) {
        if *self == RxLife::Open {
            *self = RxLife::Ending(how);
        }
    }
    /// The end to report now (the side is then `Over`), if it is ending.
    pub(super) fn take_end(&mut self) -> Option<Option<i32>> {
        match *self {
            RxLife::Ending(how) => {
                *self = RxLife::Over;
                Some(how)
            }
            _ => None,
        }
    }
}

impl Conn {
    pub(super) fn idle(&self) -> bool {
        !self.recv.armed() && self.sending.is_none() && !self.out_polled
    }

    /// Bytes delivered and not yet taken by the core: wait for them to be
    /// fed before receiving more.
    pub(super) fn holds_bytes(&self) -> bool {
        !self.held.is_empty() || self.spill_off < self.spill.len()
    }

    /// The core paused the psock: copy what its ring buffers still hold to
    /// the spill and give the buffers back (after the messages framed in
    /// them are served).
    pub(super) fn spill_held(&mut self, ring: &mut WRing, framed: &mut Framed) {
        // One allocation of the size needed (the budget counts it whole).
        let more: usize =
            self.held.iter().map(|h| ring.buffer(h.buf).map_or(0, |d| d.len().saturating_sub(h.off))).sum();
        self.spill.reserve_exact(more);
        for h in self.held.drain(..) {
            if let Some(data) = ring.buffer(h.buf) {
                self.spill.extend_from_slice(&data[h.off.min(data.len())..]);
            }
            framed.give_back(ring, h.buf);
        }
    }

    /// Forget the bytes delivered and not taken (receive is over).
    pub(super) fn drop_held(&mut self, ring: &mut WRing, framed: &mut Framed) {
        for h in self.held.drain(..) {
            framed.give_back(ring, h.buf);
        }
        self.spill = Vec::new();
        self.spill_off = 0;
    }
}

/// Messages framed in place in provided buffers during a pass over the
/// ring's completions (under the hub lock), served once the lock is dropped;
/// their buffers go back to the ring only after that.
#[derive(Default)]
pub(super) struct Framed {
    /// Where the messages lie in their buffers.
    pub(super) runs: Vec<connmux_core::run::Run>,
    /// One per fed piece that framed messages: psock, buffer, `runs[a..b]`.
    pub(super) batches: Vec<(PsockId, u16, usize, usize)>,
    /// Buffers fully fed whose messages are still to be served.
    pub(super) recycle: Vec<u16>,
}

/// The memory budget as a worker's feeds see it, for its receives:
///
/// ```text
///      a feed, or a receive armed,           the pass ends: every
///      finds it over                         multishot receive cancelled
///   Room ─────────────────────────► Over ─────────────────────────────────► Tight
///    ▲                                                                        │
///    └──────────────── a receive armed finds it under again ──────────────────┘
/// ```
///
/// Why: a multishot receive armed while the budget had room goes on taking
/// a ring buffer after another in every wait, spilled past the budget, until
/// its psock is next fed and paused (a TLS psock's: its ciphertext spilled);
/// hundreds of them, on a worker starved of CPU, took the budget's count to
/// 1.8 times its limit. Cancelled, each is armed again taking one buffer at
/// a time (`UringIo::arm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Budget {
    Room,
    /// Found over; the multishot receives are still to be cancelled.
    Over,
    /// Over, the multishot receives cancelled: receives take one buffer.
    Tight,
}

impl Budget {
    /// A feed saw the budget over (`tight`), or not (which changes nothing:
    /// only a receive armed with room says it has room again).
    pub(super) fn saw(&mut self, tight: bool) {
        if tight && *self == Budget::Room {
            *self = Budget::Over;
        }
    }
}

impl Framed {
    /// Give a fully fed buffer back to the ring, after its messages are served.
    pub(super) fn give_back(&mut self, ring: &mut WRing, buf: u16) {
        if self.batches.iter().any(|b| b.1 == buf) {
            self.recycle.push(buf);
        } else {
            ring.recycle(buf);
        }
    }
}

/// Stop receiving from a failed psock for good: its held bytes are dropped.
pub(super) fn stop_rx(ring: &mut WRing, conn: &mut Conn, token: u64, framed: &mut Framed) {
    conn.life = RxLife::Over;
    conn.drop_held(ring, framed);
    conn.recv.cancel(ring, token);
}

/// [`pump`] for a TLS psock: the held ciphertext through TLS into the core,
/// no more than it takes; called without the hub lock (TLS lock first).
/// What stays spilled counts in the budget as the psock's, as with [`pump`].
pub(super) fn pump_tls(
    sh: &Shared,
    o: &mut Owned,
    ring: &mut WRing,
    conn: &mut Conn,
    events: &mut Vec<Event>,
    budget: &mut Budget,
) {
    pump_tls_held(sh, o, ring, conn, events);
    if spill_memory(conn) != conn.spill_counted {
        // (A spill: the core took no more, perhaps for its budget.)
        let mut core = sh.lock();
        tell_spill(conn, &mut core, o, events);
        budget.saw(core.mux.mem_tight());
    }
}

/// What the psock's spill holds for the budget: its allocation while any of
/// it is unfed (it is freed whole once all is fed).
fn spill_memory(conn: &Conn) -> usize {
    match conn.spill.len() > conn.spill_off {
        true => conn.spill.capacity(),
        false => 0,
    }
}

/// Tell the core's budget what the spill holds now, if it changed
/// (`Mux::set_rx_below`); the budget may pause or abort a psock then.
fn tell_spill(conn: &mut Conn, core: &mut MuxHub, o: &mut Owned, events: &mut Vec<Event>) {
    let below = spill_memory(conn);
    if below != conn.spill_counted {
        conn.spill_counted = below;
        core.mux.of(o).set_rx_below(conn.rt.id, below);
        core.drain_events(events);
    }
}

fn pump_tls_held(sh: &Shared, o: &mut Owned, ring: &mut WRing, conn: &mut Conn, events: &mut Vec<Event>) {
    let rt = conn.rt.clone();
    let Some(tls) = &rt.tls else { return };
    let token = psock_token(rt.id);
    let mut st = tls.lock().unwrap();
    let mut at = crate::shared::tls::RxAt { sh, o, rt: &rt, events };
    st.set_unsent(conn.sending.is_some() || conn.tls_out.is_some());
    let mut full = false;
    // What was spilled while paused comes first; TLS takes all of it unless
    // it is full.
    if conn.spill_off < conn.spill.len() {
        let (took, _) = crate::shared::tls::rx(&mut at, &mut st, &conn.spill[conn.spill_off..]);
        conn.spill_off += took;
        if conn.spill_off < conn.spill.len() {
            full = true;
        } else {
            conn.spill = Vec::new();
            conn.spill_off = 0;
        }
    }
    // Bounded: each round takes a whole buffer, or stops.
    while let Some(h) = conn.held.front_mut() {
        if full {
            break;
        }
        let (took, r, len) = {
            let data = ring.buffer(h.buf).unwrap_or(&[]);
            let (took, r) = crate::shared::tls::rx(&mut at, &mut st, &data[h.off.min(data.len())..]);
            (took, r, data.len())
        };
        h.off += took;
        if h.off >= len {
            let buf = h.buf;
            conn.held.pop_front();
            ring.recycle(buf);
        }
        if r == crate::shared::tls::Rx::Full {
            full = true;
            break;
        }
    }
    if !full && conn.held.is_empty() {
        // Decrypted bytes kept from an earlier pass.
        full = crate::shared::tls::rx(&mut at, &mut st, &[]).1 == crate::shared::tls::Rx::Full;
    }
    if full {
        // Backpressure: close the window as epoll would (stop reading), and
        // keep no ring buffer meanwhile.
        conn.recv.cancel(ring, token);
        conn.spill_held(ring, &mut Framed::default()); // TLS is decrypted, never framed in place
        return;
    }
    if st.done() {
        drop(st);
        stop_rx(ring, conn, token, &mut Framed::default()); // TLS is decrypted, never framed in place
        return;
    }
    if let Some(errno) = conn.life.take_end() {
        // No receive after this; a resume still drains what TLS holds.
        crate::shared::tls::rx_eof(&mut at, &mut st, errno);
    }
}

/// What feeding a psock's bytes to the core takes besides the psock: the
/// core (locked), the worker's ring, the time of the read, and where the
/// results go.
pub(super) struct Feed<'a> {
    pub(super) core: &'a mut MuxHub,
    pub(super) ring: &'a mut WRing,
    pub(super) now: Timestamp,
    pub(super) events: &'a mut Vec<Event>,
    /// Messages framed in place in ring buffers, served after the pass.
    pub(super) framed: &'a mut Framed,
    pub(super) own: &'a mut Own,
    /// The worker's psocks' receive sides.
    pub(super) o: &'a mut Owned,
    /// What the feed saw of the memory budget.
    pub(super) budget: &'a mut Budget,
}

/// A received buffer framed with no hold of the hub lock
/// (`Owned::frame_alone`), where the psock's receive side alone may
/// decide: its one held buffer, nothing spilled, its receive open, room for
/// all of it (`Owned::rx_room_alone`), its messages for this worker's own
/// socket `sock` (`Own::alone_tag_for`). `true`: all of it framed (its runs in
/// `framed`, what the hub must count in `own.alone`); else what is left is
/// fed through the hub ([`pump`]).
pub(super) fn pump_alone(
    conn: &mut Conn,
    ring: &mut WRing,
    framed: &mut Framed,
    o: &mut Owned,
    own: &mut Own,
    sock: &SockRt,
    now: Timestamp,
) -> bool {
    let Some(tag) = own.alone_tag_for(sock, &conn.rt) else { return false };
    let id = conn.rt.id;
    if conn.life != RxLife::Open || conn.held.len() != 1 || !conn.spill.is_empty() {
        return false;
    }
    let Some(h) = conn.held.front_mut() else { return false };
    let Some(data) = ring.buffer(h.buf) else { return false };
    if h.off != 0 || o.rx_room_alone(id) < data.len() {
        return false;
    }
    let a = framed.runs.len();
    let Some(f) = o.frame_alone(id, data, now, sock.id, tag, &mut framed.runs) else { return false };
    let (taken, len, buf) = (f.taken(), data.len(), h.buf);
    own.alone.push(f);
    framed.batches.push((id, buf, a, framed.runs.len()));
    h.off = taken;
    if taken < len {
        return false;
    }
    conn.held.pop_front();
    framed.give_back(ring, buf);
    true
}

/// Feed the held bytes of one psock to the core, no more than it takes. When it
/// takes nothing (paused), keep the rest and cancel the receive; when all is fed,
/// report an end of stream that came after it. What stays spilled counts in
/// the core's memory budget as the psock's.
pub(super) fn pump(conn: &mut Conn, f: &mut Feed<'_>) {
    pump_held(conn, f);
    f.budget.saw(f.core.mux.mem_tight());
    tell_spill(conn, f.core, f.o, f.events);
}

fn pump_held(conn: &mut Conn, f: &mut Feed<'_>) {
    let Feed { core, ring, now, events, framed, own, o, .. } = f;
    let now = *now;
    let id: PsockId = conn.rt.id;
    let token = psock_token(id);
    // What was spilled while paused comes first, a ring buffer's worth at a
    // time as it was received: the core's capacity is in bytes, and a bound
    // counted in messages (`MuxConfig::psock_queued_max`) stops it only
    // between feeds (the whole spill at once, megabytes of small messages
    // from a peer that does not read, queued ahead of everyone else's).
    // Bounded: each round feeds at least one byte, or stops.
    while conn.spill_off < conn.spill.len() {
        let cap = core.mux.view_of(o).rx_capacity(id).min(ring.buf_size());
        if cap == 0 {
            pause(ring, conn, token, framed);
            core.drain_events(events);
            return;
        }
        let end = (conn.spill_off + cap).min(conn.spill.len());
        let fed = crate::shared::feed_read(core, o, own, id, &conn.spill[conn.spill_off..end], now);
        conn.spill_off = end;
        if fed.is_err() {
            core.drain_events(events);
            stop_rx(ring, conn, token, framed);
            return;
        }
    }
    if !conn.spill.is_empty() {
        // All fed: its memory goes back.
        conn.spill = Vec::new();
        conn.spill_off = 0;
    }
    // Bounded: each round feeds at least one byte, or stops.
    while let Some(h) = conn.held.front_mut() {
        let cap = core.mux.view_of(o).rx_capacity(id);
        let data = ring.buffer(h.buf).unwrap_or(&[]);
        if h.off < data.len() && cap == 0 {
            pause(ring, conn, token, framed);
            core.drain_events(events);
            return;
        }
        let end = (h.off + cap).min(data.len());
        // Whole messages for this worker's own socket are framed where they
        // lie and served after the pass (`UringIo::serve_framed`).
        let a = framed.runs.len();
        let fed = crate::shared::feed_read_in_place(core, o, own, id, &data[h.off..end], now, &mut framed.runs);
        if framed.runs.len() > a {
            for r in &mut framed.runs[a..] {
                r.at += h.off;
            }
            framed.batches.push((id, h.buf, a, framed.runs.len()));
        }
        h.off = end;
        let done = h.off >= data.len();
        if done {
            let buf = h.buf;
            conn.held.pop_front();
            framed.give_back(ring, buf);
        }
        if fed.is_err() {
            // Gone from the core, or over its hard cap (cannot happen within
            // rx_capacity): stop receiving from it.
            core.drain_events(events);
            stop_rx(ring, conn, token, framed);
            return;
        }
    }
    if let Some(errno) = conn.life.take_end() {
        let _ = core.mux.of(o).rx_closed(id, errno);
    } else if matches!(conn.recv, Recv::Buffers { cancelling: false, .. })
        && core.mux.view_of(o).rx_would_lend_ahead(id)
    {
        // A large message began: end the multishot receive (what it still
        // delivers is fed first) so that the next one goes straight into the
        // psock's assembly buffer.
        conn.recv.cancel(ring, token);
    }
    core.drain_events(events);
}

/// Backpressure on a psock, or the memory budget's pause: close the window
/// as epoll would (stop reading), and give its ring buffers back (their rest
/// is spilled). A psock the budget paused gives them back too: the ring is
/// shared by every psock of the worker, and hundreds of paused peers each
/// keeping a buffer would leave none for the psocks still read. The spill
/// counts in the budget as the psock's (`Mux::set_rx_below`).
fn pause(ring: &mut WRing, conn: &mut Conn, token: u64, framed: &mut Framed) {
    conn.recv.cancel(ring, token);
    conn.spill_held(ring, framed);
}
