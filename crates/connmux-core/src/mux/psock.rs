//! One attached connection's receive side (a psock, as its owner holds
//! it): its stream parser, its life, its deadlines and its counters. Where
//! its messages go (sockets, steering) is the hub's, and so is its
//! transmit side, which any sender writes (`super::transmit`).

use super::deadlines::Armed;
use super::transmit::backlog_pause;
use super::{MuxConfig, SockId};
use crate::stats::PsockStats;
use crate::stream::{StreamParser, StreamStats};
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
    /// The assembly deadline armed in the mux's [`Deadlines`], if any (it
    /// mirrors `stream.deadline()` after every call).
    pub(super) timer: Option<Armed>,
    /// Bytes the driver holds for it below the parser, not yet fed
    /// ([`Mux::set_rx_below`]): counted in the memory budget.
    pub(super) below: usize,
    /// Last time bytes were received (its idle time counts from the later
    /// of this and its last write).
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
    /// What the hub let its owner read and frame alone, as of its last
    /// report (`MuxRef::note_room`, `super::alone`): the budget's room
    /// then, or 0 while the hub held its reading back (the budget's pause,
    /// its reply backlog), held messages of it in a queue, or had half its
    /// budget used.
    pub(super) hub_room: usize,
}

impl Psock {
    /// Its receive side runs: open, its stream not stopped.
    #[inline]
    pub(super) fn rx_running(&self) -> bool {
        !self.life.rx_over() && !self.stream.is_stopped()
    }

    /// Whether the server holds its reading back, its receive side running
    /// or not: a message no socket could take, the memory budget, a peer not
    /// reading its replies (its reply `backlog`, as its share keeps it), or
    /// readers that have not taken its queued messages (`PsockRxResume`
    /// when that ends).
    #[inline]
    pub(super) fn held_back(&self, config: &MuxConfig, mem_paused: bool, backlog: usize) -> bool {
        self.ready.is_some() || self.readers_hold || mem_paused || backlog >= backlog_pause(config)
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
    /// What it reports to its share ([`RxReport`]).
    #[inline]
    pub(super) fn report(&self) -> RxReport {
        let buffered = self.stream.buffered();
        RxReport {
            stream: self.stream.stats().clone(),
            record_timeouts: self.record_timeouts,
            held: self.rx_held(),
            ready: self.ready.is_some(),
            stopped: self.stream.is_stopped(),
            wait: (self.ready.is_none() && buffered > 0).then(|| self.stream.need()),
            last_active: self.last_active,
        }
    }
}

/// What a psock's receive side last reported to its share, after every
/// call that changed it (`MuxRef::recount`, `recount_only`): the mux's statistics,
/// `/proc/net/kcm` and the idlest psock are read on the hub alone, with no
/// look at a psock its owner holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct RxReport {
    /// Its stream parser's counters.
    pub(super) stream: StreamStats,
    /// Records below the parser that did not end in time.
    pub(super) record_timeouts: u64,
    /// Bytes held: the partial message, read-ahead and a ready message.
    pub(super) held: usize,
    /// It holds a message no socket could take (KCM's `RxPause RdyRx`).
    pub(super) ready: bool,
    /// An error stopped its stream (`RxStop`).
    pub(super) stopped: bool,
    /// It waits for more of a message (`RxWait`), the bytes still missing
    /// where known.
    pub(super) wait: Option<Option<usize>>,
    /// When bytes were last received.
    pub(super) last_active: Timestamp,
}

impl RxReport {
    /// Its receive statistics: the stream parser's counters (the transmit
    /// side's are its share's).
    pub(super) fn rx_stats(&self) -> PsockStats {
        let st = &self.stream;
        let mut s = PsockStats::default();
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
