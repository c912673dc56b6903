//! One attached connection's state (a psock): its stream parser, its life,
//! its transmit queue, its deadlines and its counters. What a psock owns is
//! here; where its messages go (sockets, steering, reservation) is the
//! mux's (`super`).

use std::collections::VecDeque;

use bytes::Bytes;

use super::deadlines::Armed;
use super::{MuxConfig, Placed, SockId, TxMsg, TX_CHUNK_BYTES, TX_CHUNK_SLICES};
use crate::stats::PsockStats;
use crate::stream::StreamParser;
use crate::time::Timestamp;

/// A psock's lifecycle (receive side and close), as the core decides it:
///
/// ```text
///            rx_closed(p, None): FIN             nothing to deliver, no hold,
///   Open ───────────────────────────► PeerClosed ────────────────────────────► Drained
///    │      PsockFailed(Closed)          │       nothing to write               PsockDrained
///    │                                   │                                      (close with FIN)
///    │ parse error, oversize, timeout,   │ tx_failed, rx_abort
///    │ rx_abort, rx_closed(p, Some(e))   │
///    ▼                                   ▼
///  Failed ◄──────────────────────────────┘
///  PsockFailed(Rx | Tx | Closed): the driver aborts the connection (RST)
/// ```
///
/// In `PeerClosed` the whole messages already buffered are still cut and
/// delivered (the partial one is dropped) and the transmit queue is still
/// written; only `Open` takes new bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Life {
    Open,
    PeerClosed,
    Drained,
    Failed,
}

impl Life {
    /// Receive is over (no new bytes are taken).
    #[inline]
    pub(super) fn rx_over(self) -> bool {
        self != Life::Open
    }
}

/// A psock's transmit side: who may write it now. One writer at a time, so
/// a message is never interleaved with another on the wire.
///
/// ```text
///          a message queued:                 tx_begin
///          PsockTransmit raised             (the driver)
///   Idle ───────────────────────► Kicked ───────────────► Out { msgs }
///    ▲ │                            │ tx_begin, nothing        │
///    │ │ tx_begin ──────────────────┼──────────────────────────┤
///    │ │                            ▼                          │ tx_complete
///    │ └──────────────────────────► Idle ◄─────────────────────┘
///
///   any ── tx_failed, a reserved psock unattached, its socket closed
///          mid-message ──► Stopped (final: nothing more is written)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tx {
    /// Nothing out, and `PsockTransmit` not raised since the last `tx_begin`.
    Idle,
    /// `PsockTransmit` raised; the driver has not begun a chunk yet.
    Kicked,
    /// A chunk is out with a writer, covering the first `msgs` messages of
    /// the queue (it reports with `tx_complete` or `tx_failed`).
    Out { msgs: usize },
    /// Transmit is over for good.
    Stopped,
}

impl Tx {
    /// Messages at the queue's head the chunk out covers (0: none out).
    #[inline]
    pub(super) fn inflight(self) -> usize {
        match self {
            Tx::Out { msgs } => msgs,
            _ => 0,
        }
    }
    /// A writer has the psock: nobody else may begin a chunk.
    #[inline]
    pub(super) fn busy(self) -> bool {
        matches!(self, Tx::Out { .. })
    }
    /// The writer reports: back to `Idle`, with the messages its chunk
    /// covered (`None`: no chunk was out, nothing to account).
    #[inline]
    pub(super) fn end_chunk(&mut self) -> Option<usize> {
        let inflight = match *self {
            Tx::Out { msgs } => msgs,
            Tx::Idle | Tx::Kicked | Tx::Stopped => return None,
        };
        *self = Tx::Idle;
        Some(inflight)
    }
}

/// Bytes and messages written for one socket: what its send buffer is
/// uncharged by (`(owner, bytes, messages)`).
pub(super) type Charge = (SockId, usize, u32);

/// An attached connection.
#[derive(Debug)]
pub(super) struct Psock {
    pub(super) stream: StreamParser,
    pub(super) affinity: Option<u32>,
    /// The socket its last read pass steered to as round robin does
    /// (`Steering::Affinity` keeps the next there: `Sockets::keeps_up`).
    pub(super) rx_last: Option<SockId>,
    /// Hard cap on receive bytes held (buffer + ready message).
    pub(super) rx_limit: usize,
    // ---- receive ----
    /// The length of a complete message of it no socket could take
    /// (`ready_rx_msg`), which waits on the hub's ready list
    /// (`Sockets::psocks_ready`, KCM's `strp.paused`): while it is there the
    /// psock is paused (not read, so TCP pushes back on the peer), until a
    /// socket becomes able and takes it ([`super::sockets::ToPsock::Offered`]).
    /// Counted as the psock's in the memory budget.
    pub(super) ready: Option<usize>,
    /// Where it is in its life (see [`Life`]).
    pub(super) life: Life,
    /// The sockets' side holds its reading back: too many of its messages
    /// wait in queues for readers (set when a delivery reaches the bound,
    /// cleared by [`super::sockets::ToPsock::Resume`]).
    pub(super) readers_hold: bool,
    // ---- transmit ----
    pub(super) tx_queue: VecDeque<TxMsg>,
    /// Who may write it now (see [`Tx`]).
    pub(super) tx: Tx,
    /// Bytes of addressed messages on the queue not yet fully written (its
    /// share keeps the copy the sockets' side refuses sends from: every
    /// change here is reported to it).
    pub(super) tx_addr_bytes: usize,
    /// The assembly deadline armed in the mux's [`Deadlines`], if any (it
    /// mirrors `stream.deadline()` after every call).
    pub(super) timer: Option<Armed>,
    /// Bytes the driver holds for it below the parser, not yet fed
    /// ([`Mux::set_rx_below`]): counted in the memory budget.
    pub(super) below: usize,
    /// Last time bytes were received or written (idle timeout).
    pub(super) last_active: Timestamp,
    /// The handshake of the layer below the parser must end by then.
    pub(super) handshake_deadline: Option<Timestamp>,
    /// The partial record the layer below the parser holds must end by then.
    pub(super) record_deadline: Option<Timestamp>,
    /// When the loan out was made ahead, for a message only predicted
    /// ([`Mux::rx_lend_ahead`]); past [`AHEAD_QUIET`] with nothing read the
    /// scan recalls it and the prediction is forgotten.
    pub(super) ahead_since: Option<Timestamp>,
    /// Records below the parser that did not end in time (they count as
    /// assembly timeouts: they are the start of a message the parser never saw).
    pub(super) record_timeouts: u64,
    pub(super) stats: PsockStats,
}

impl Psock {
    /// Its receive side runs: open, its stream not stopped.
    #[inline]
    pub(super) fn rx_running(&self) -> bool {
        !self.life.rx_over() && !self.stream.is_stopped()
    }

    /// Whether the server holds its reading back, its receive side running
    /// or not: a message no socket could take, the memory budget, a peer not
    /// reading its replies, or readers that have not taken its queued
    /// messages (`PsockRxResume` when that ends).
    #[inline]
    pub(super) fn held_back(&self, config: &MuxConfig, mem_paused: bool) -> bool {
        self.ready.is_some() || self.readers_hold || mem_paused || self.tx_addr_bytes >= backlog_pause(config)
    }

    /// It can still answer what is placed on it: its transmit not stopped,
    /// its receive running (told to its share when it ends, for good:
    /// [`super::sockets::Share::answers`]).
    #[inline]
    pub(super) fn answers(&self) -> bool {
        self.tx != Tx::Stopped && self.rx_running()
    }

    /// The next chunk to write (`poll_transmit`, KCM's `kcm_write_msgs`):
    /// the queue's head, up to [`TX_CHUNK_SLICES`] messages and about
    /// [`TX_CHUNK_BYTES`], into `slices` (empty on entry). The transmit side
    /// is `Out` until the writer reports ([`Psock::on_written`]); `false`
    /// when nothing may be written now.
    #[inline]
    pub(super) fn poll_transmit(&mut self, slices: &mut Vec<Bytes>) -> bool {
        match self.tx {
            // The kick is answered even when there is nothing to begin (the
            // queue emptied since: its socket closed, or its balanced messages
            // were taken back): the next message queued kicks again.
            Tx::Kicked => self.tx = Tx::Idle,
            Tx::Idle => {}
            Tx::Out { .. } | Tx::Stopped => return false,
        }
        if self.tx_queue.is_empty() {
            return false;
        }
        let mut bytes = 0;
        // By index: the queue usually holds one message (a served batch's
        // replies), where setting up an iterator costs more than the walk.
        for i in 0..self.tx_queue.len().min(TX_CHUNK_SLICES) {
            if bytes >= TX_CHUNK_BYTES && !slices.is_empty() {
                break;
            }
            let m = &self.tx_queue[i];
            let b = if m.sent == 0 { m.data.clone() } else { m.data.slice(m.sent..) };
            bytes += b.len();
            slices.push(b);
        }
        self.tx = Tx::Out { msgs: slices.len() };
        true
    }

    /// `n` bytes of the chunk that covered `inflight` messages were written
    /// (a short write keeps the rest first): the messages written whole
    /// leave the queue. Their owners' charges are returned, consecutive
    /// messages of one owner (a served batch's replies) as one entry: the
    /// last in the return value (usually the only one), earlier ones pushed
    /// on `done`; `wrote` counts those placed by a reservation and the bytes
    /// of the addressed ones (for the sockets' side:
    /// [`super::sockets::Sockets::written`]).
    #[inline]
    pub(super) fn on_written(
        &mut self,
        inflight: usize,
        n: usize,
        now: Timestamp,
        done: &mut Vec<Charge>,
        wrote: &mut Wrote,
    ) -> Option<Charge> {
        if n > 0 {
            self.last_active = now;
        }
        let mut left = n;
        let mut last: Option<Charge> = None;
        for _ in 0..inflight {
            if left == 0 {
                break;
            }
            let m = self.tx_queue.front_mut().expect("inflight message");
            let k = left.min(m.data.len() - m.sent);
            m.sent += k;
            left -= k;
            self.stats.tx_bytes += k as u64;
            if m.sent == m.data.len() {
                let m = self.tx_queue.pop_front().expect("inflight message");
                self.stats.tx_msgs += u64::from(m.msgs);
                match m.placed {
                    Placed::Addressed => {
                        self.tx_addr_bytes -= m.data.len();
                        wrote.addr_bytes += m.data.len();
                    }
                    Placed::Reserved => wrote.rsvd += 1,
                    Placed::Balanced => {}
                }
                match &mut last {
                    Some((owner, len, msgs)) if *owner == m.owner && msgs.checked_add(m.msgs).is_some() => {
                        *len += m.data.len();
                        *msgs += m.msgs;
                    }
                    _ => {
                        if let Some(prev) = last.replace((m.owner, m.data.len(), m.msgs)) {
                            done.push(prev);
                        }
                    }
                }
            }
        }
        last
    }

    /// A message joins the transmit queue (the only way one does).
    #[inline]
    pub(super) fn queue(&mut self, m: TxMsg) {
        if m.addressed() {
            self.tx_addr_bytes += m.data.len();
        }
        self.tx_queue.push_back(m);
    }

    /// Socket `s` closed: its messages not yet begun leave the queue (their
    /// charges die with the socket). A message of `s` part-way written, or in
    /// the chunk out, cannot be taken back: [`DropOwner::MidMessage`], the
    /// psock is to be aborted (the peer may hold a truncated message), as KCM
    /// aborts the reserved psock.
    pub(super) fn drop_owner(&mut self, config: &MuxConfig, s: SockId) -> DropOwner {
        let inflight = self.tx.inflight();
        let mid_message = self.tx_queue.iter().enumerate().any(|(i, m)| m.owner == s && (i < inflight || m.sent > 0));
        if mid_message && self.tx != Tx::Stopped {
            return DropOwner::MidMessage;
        }
        let mut i = 0;
        let mut addr_dropped = 0;
        self.tx_queue.retain(|m| {
            let keep = i < inflight || m.owner != s;
            i += 1;
            if !keep && m.addressed() {
                addr_dropped += m.data.len();
            }
            keep
        });
        let before = self.tx_addr_bytes;
        self.tx_addr_bytes -= addr_dropped;
        DropOwner::Dropped { resume: backlog_drained(config, before, self.tx_addr_bytes), addr_bytes: addr_dropped }
    }

    /// `TxPolicy::LeastOutstanding` and the psock can no longer answer: its
    /// balanced messages not yet begun, in order, to be placed on others.
    pub(super) fn take_back_balanced(&mut self) -> Vec<TxMsg> {
        let keep = self.tx.inflight();
        let mut back = Vec::new();
        let mut i = keep;
        while i < self.tx_queue.len() {
            let m = &self.tx_queue[i];
            if m.placed == Placed::Balanced && m.sent == 0 {
                back.push(self.tx_queue.remove(i).expect("in range"));
            } else {
                i += 1;
            }
        }
        back
    }

    /// Empty a transmit queue that will not be written. Addressed messages
    /// are dropped here (`tx_addressed_drops`), their charges returned; the
    /// others are returned for their sockets to send whole elsewhere. With
    /// `writer_out` (an unattach while a writer has the chunk of `inflight`
    /// messages), the chunk's addressed messages wait for the writer's
    /// report instead ([`super::OutAtRelease`]).
    pub(super) fn evacuate(&mut self, writer_out: bool, inflight: usize) -> Evacuated {
        let mut ev = Evacuated::default();
        for (i, m) in self.tx_queue.drain(..).enumerate() {
            let in_chunk = writer_out && i < inflight;
            if m.addressed() {
                self.tx_addr_bytes -= m.data.len();
                ev.addr_bytes += m.data.len();
                if in_chunk {
                    ev.out.push(Ok(m));
                } else {
                    self.stats.tx_addressed_drops += u64::from(m.msgs);
                    ev.dropped.push((m.owner, m.data.len(), m.msgs));
                }
                continue;
            }
            if in_chunk {
                ev.out.push(Err(m.data.len() - m.sent));
            }
            let started = i < inflight || m.sent > 0;
            ev.placed.push((m, started));
        }
        ev
    }

    #[inline]
    pub(super) fn rx_held(&self) -> usize {
        self.stream.buffered() + self.ready.unwrap_or(0)
    }
    /// What the memory budget counts of the psock's receive side: the
    /// assembly buffer's allocation ([`StreamParser::memory`]) and a ready
    /// message.
    pub(super) fn rx_mem(&self) -> usize {
        self.stream.memory() + self.ready.unwrap_or(0)
    }
    pub(super) fn tx_pending_bytes(&self) -> usize {
        self.tx_queue.iter().map(|m| m.data.len() - m.sent).sum()
    }
    /// Full statistics: transmit side plus the stream parser's counters.
    pub(super) fn full_stats(&self) -> PsockStats {
        let st = self.stream.stats();
        let mut s = self.stats.clone();
        s.rx_msgs = st.msgs;
        s.rx_bytes = st.bytes;
        s.rx_need_more_hdr = st.need_more_hdr;
        s.rx_bad_hdr_len = st.bad_hdr_len;
        s.rx_msg_too_big = st.msg_too_big;
        s.rx_msg_timeouts = st.msg_timeouts + self.record_timeouts;
        s.rx_interrupted = st.interrupted;
        s.rx_unrecov_intr = st.unrecov_intr;
        // A per-psock flag, as in the 2017 kernel (current kernels print 0).
        s.rx_aborts =
            u64::from(st.bad_hdr_len + st.msg_too_big + s.rx_msg_timeouts + st.interrupted + st.unrecov_intr > 0);
        s
    }
}

/// What socket `s`'s close did to a psock ([`Psock::drop_owner`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DropOwner {
    /// A message of the socket is part-way out: the psock is to be aborted.
    MidMessage,
    /// Its messages left; `resume`: that took the reply backlog under the
    /// pause mark (the psock is read again); `addr_bytes`: the bytes of
    /// addressed messages among them (for its share's copy of the backlog).
    Dropped { resume: bool, addr_bytes: usize },
}

/// What a psock's write took off its queue besides the charges
/// ([`Psock::on_written`]), for the sockets' side.
#[derive(Debug, Default)]
pub(super) struct Wrote {
    /// Messages placed by a reservation, written whole.
    pub(super) rsvd: usize,
    /// Bytes of addressed messages written whole.
    pub(super) addr_bytes: usize,
}

/// What left a psock's transmit queue that will not be written
/// ([`Psock::evacuate`]).
#[derive(Debug, Default)]
pub(super) struct Evacuated {
    /// Messages placed by a reservation or by balancing, in order, each with
    /// whether it was begun (out with a writer or part written: sending it
    /// whole elsewhere is a retry).
    pub(super) placed: Vec<(TxMsg, bool)>,
    /// The charges of the addressed messages dropped.
    pub(super) dropped: Vec<Charge>,
    /// The chunk out with a writer, in order: `Ok` its addressed messages,
    /// kept for the writer's report; `Err(n)` the `n` bytes it had of a
    /// message gone elsewhere.
    pub(super) out: Vec<Result<TxMsg, usize>>,
    /// Bytes of the addressed messages that left the queue (dropped, or
    /// kept for the writer's report): for its share's copy of the backlog.
    pub(super) addr_bytes: usize,
}

/// The reply backlog (`tx_addr_bytes`) at which a psock stops being read.
#[inline]
pub(super) fn backlog_pause(config: &MuxConfig) -> usize {
    config.psock_sndbuf / 2
}

/// A psock's reply backlog went from at or over the pause mark to under it:
/// it is read again (`PsockRxResume`).
#[inline]
pub(super) fn backlog_drained(config: &MuxConfig, before: usize, after: usize) -> bool {
    before >= backlog_pause(config) && after < backlog_pause(config)
}
