//! A psock's transmit side ([`PsockTx`]: its queue, who may write it now,
//! its reply backlog, its counters) and the hub's calls on it: a chunk
//! begun, written or failed, a socket's close, a psock's unattach.
//!
//! It is kept with the psock's share on the hub's side, not with the psock:
//! as KCM keeps a message's bytes on the socket that sends it and has
//! whichever thread sends write them, any sender here reaches a psock's
//! queue without its owner, and writes it. What the owner needs of it is
//! told ([`ToPsock::Backlog`], [`ToPsock::MayDrain`], [`ToPsock::TxAborted`]);
//! what the owner's receive side does to it comes in through the hub
//! (`Hub::tx_take_back`, `Hub::tx_evacuate`).

use std::collections::VecDeque;

use bytes::Bytes;

use super::hub::Hub;
use super::psock::Life;
use super::sockets::ToPsock;
use super::{
    Event, MuxConfig, OutAtRelease, Placed, PsockError, PsockId, SockId, TxMsg, TxPolicy, EPIPE, TX_CHUNK_BYTES,
    TX_CHUNK_SLICES,
};
use crate::stats::PsockStats;
use crate::time::Timestamp;

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
///   any ── tx_failed, an unattach (counted an abort if reserved), its socket
///          closed mid-message ──► Stopped (final: nothing more is written)
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
    fn end_chunk(&mut self) -> Option<usize> {
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

/// One psock's transmit side.
#[derive(Debug)]
pub(super) struct PsockTx {
    queue: VecDeque<TxMsg>,
    /// Who may write it now (see [`Tx`]).
    pub(super) state: Tx,
    /// Bytes of addressed messages on the queue not yet written whole: its
    /// reply backlog. Addressed sends to it are refused past
    /// `MuxConfig::psock_sndbuf`; it is not read past half of that
    /// ([`backlog_pause`]).
    pub(super) addr_bytes: usize,
    /// Last time bytes were written (its idle time counts from the later of
    /// this and its last read).
    pub(super) last_write: Timestamp,
    /// Its transmit counters (`tx_msgs`, `tx_bytes`, `tx_aborts`,
    /// `tx_addressed_drops`; the rest stay 0).
    pub(super) stats: PsockStats,
}

impl PsockTx {
    pub(super) fn new(now: Timestamp) -> PsockTx {
        PsockTx {
            queue: VecDeque::new(),
            state: Tx::Idle,
            addr_bytes: 0,
            last_write: now,
            stats: PsockStats::default(),
        }
    }

    /// Its transmit is over for good: never reserved or sent on again.
    #[inline]
    pub(super) fn stopped(&self) -> bool {
        self.state == Tx::Stopped
    }

    /// Nothing to write and no writer out.
    #[inline]
    pub(super) fn idle_empty(&self) -> bool {
        !self.state.busy() && self.queue.is_empty()
    }

    /// Messages on the queue, and the bytes of them not yet written.
    pub(super) fn pending(&self) -> (usize, usize) {
        (self.queue.len(), self.queue.iter().map(|m| m.data.len() - m.sent).sum())
    }

    /// A message joins the queue (the only way one does).
    #[inline]
    pub(super) fn queue(&mut self, m: TxMsg) {
        debug_assert!(self.state != Tx::Stopped, "placed on a psock whose transmit stopped");
        if m.addressed() {
            self.addr_bytes += m.data.len();
        }
        self.queue.push_back(m);
    }

    /// A message part-way written by a writer outside the hub joins the
    /// queue first (`Hub::tx_direct_rest`): nothing may be out.
    fn queue_front(&mut self, m: TxMsg) {
        debug_assert!(!self.state.busy(), "a chunk out while another writer wrote");
        if m.addressed() {
            self.addr_bytes += m.data.len();
        }
        self.queue.push_front(m);
    }

    /// The next chunk to write (`poll_transmit`, KCM's `kcm_write_msgs`):
    /// the queue's head, up to [`TX_CHUNK_SLICES`] messages and about
    /// [`TX_CHUNK_BYTES`], into `slices` (empty on entry). The transmit side
    /// is `Out` until the writer reports ([`PsockTx::on_written`]); `false`
    /// when nothing may be written now.
    #[inline]
    fn poll_transmit(&mut self, slices: &mut Vec<Bytes>) -> bool {
        match self.state {
            // The kick is answered even when there is nothing to begin (the
            // queue emptied since: its socket closed, or its balanced messages
            // were taken back): the next message queued kicks again.
            Tx::Kicked => self.state = Tx::Idle,
            Tx::Idle => {}
            Tx::Out { .. } | Tx::Stopped => return false,
        }
        if self.queue.is_empty() {
            return false;
        }
        let mut bytes = 0;
        // By index: the queue usually holds one message (a served batch's
        // replies), where setting up an iterator costs more than the walk.
        for i in 0..self.queue.len().min(TX_CHUNK_SLICES) {
            if bytes >= TX_CHUNK_BYTES && !slices.is_empty() {
                break;
            }
            let m = &self.queue[i];
            let b = if m.sent == 0 { m.data.clone() } else { m.data.slice(m.sent..) };
            bytes += b.len();
            slices.push(b);
        }
        self.state = Tx::Out { msgs: slices.len() };
        true
    }

    /// `n` bytes of the chunk that covered `inflight` messages were written
    /// (a short write keeps the rest first): the messages written whole
    /// leave the queue. Their owners' charges are returned, consecutive
    /// messages of one owner (a served batch's replies) as one entry: the
    /// last in the return value (usually the only one), earlier ones pushed
    /// on `done`; `wrote` counts those placed by a reservation and the bytes
    /// of the addressed ones.
    #[inline]
    fn on_written(
        &mut self,
        inflight: usize,
        n: usize,
        now: Timestamp,
        done: &mut Vec<Charge>,
        wrote: &mut Wrote,
    ) -> Option<Charge> {
        if n > 0 {
            self.last_write = now;
        }
        let mut left = n;
        let mut last: Option<Charge> = None;
        for _ in 0..inflight {
            if left == 0 {
                break;
            }
            let m = self.queue.front_mut().expect("inflight message");
            let k = left.min(m.data.len() - m.sent);
            m.sent += k;
            left -= k;
            self.stats.tx_bytes += k as u64;
            if m.sent == m.data.len() {
                let m = self.queue.pop_front().expect("inflight message");
                self.stats.tx_msgs += u64::from(m.msgs);
                match m.placed {
                    Placed::Addressed => self.addr_bytes -= m.data.len(),
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

    /// Socket `s` closed: its messages not yet begun leave the queue (their
    /// charges die with the socket). A message of `s` part-way written, or in
    /// the chunk out, cannot be taken back: [`DropOwner::MidMessage`], the
    /// psock is to be aborted (the peer may hold a truncated message), as KCM
    /// aborts the reserved psock.
    fn drop_owner(&mut self, config: &MuxConfig, s: SockId) -> DropOwner {
        let inflight = self.state.inflight();
        let mid_message = self.queue.iter().enumerate().any(|(i, m)| m.owner == s && (i < inflight || m.sent > 0));
        if mid_message && self.state != Tx::Stopped {
            return DropOwner::MidMessage;
        }
        let mut i = 0;
        let mut addr_dropped = 0;
        self.queue.retain(|m| {
            let keep = i < inflight || m.owner != s;
            i += 1;
            if !keep && m.addressed() {
                addr_dropped += m.data.len();
            }
            keep
        });
        let before = self.addr_bytes;
        self.addr_bytes -= addr_dropped;
        DropOwner::Dropped { resume: backlog_drained(config, before, self.addr_bytes) }
    }

    /// `TxPolicy::LeastOutstanding` and the psock can no longer answer: its
    /// balanced messages not yet begun, in order, to be placed on others.
    fn take_back_balanced(&mut self) -> Vec<TxMsg> {
        let keep = self.state.inflight();
        let mut back = Vec::new();
        let mut i = keep;
        while i < self.queue.len() {
            let m = &self.queue[i];
            if m.placed == Placed::Balanced && m.sent == 0 {
                back.push(self.queue.remove(i).expect("in range"));
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
    /// report instead ([`OutAtRelease`]).
    fn evacuate(&mut self, writer_out: bool, inflight: usize) -> Evacuated {
        let mut ev = Evacuated::default();
        for (i, m) in self.queue.drain(..).enumerate() {
            let in_chunk = writer_out && i < inflight;
            if m.addressed() {
                self.addr_bytes -= m.data.len();
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
}

/// What socket `s`'s close did to a psock ([`PsockTx::drop_owner`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DropOwner {
    /// A message of the socket is part-way out: the psock is to be aborted.
    MidMessage,
    /// Its messages left; `resume`: that took the reply backlog under the
    /// pause mark (the psock is read again).
    Dropped { resume: bool },
}

/// What a psock's write took off its queue besides the charges
/// ([`PsockTx::on_written`]).
#[derive(Debug, Default)]
struct Wrote {
    /// Messages placed by a reservation, written whole.
    rsvd: usize,
}

/// What left a psock's transmit queue that will not be written
/// ([`PsockTx::evacuate`]).
#[derive(Debug, Default)]
struct Evacuated {
    /// Messages placed by a reservation or by balancing, in order, each with
    /// whether it was begun (out with a writer or part written: sending it
    /// whole elsewhere is a retry).
    placed: Vec<(TxMsg, bool)>,
    /// The charges of the addressed messages dropped.
    dropped: Vec<Charge>,
    /// The chunk out with a writer, in order: `Ok` its addressed messages,
    /// kept for the writer's report; `Err(n)` the `n` bytes it had of a
    /// message gone elsewhere.
    out: Vec<Result<TxMsg, usize>>,
}

/// The reply backlog (`PsockTx::addr_bytes`) at which a psock stops being
/// read.
#[inline]
pub(super) fn backlog_pause(config: &MuxConfig) -> usize {
    config.psock_sndbuf / 2
}

/// A psock's reply backlog went from at or over the pause mark to under it:
/// it is read again (`PsockRxResume`).
#[inline]
fn backlog_drained(config: &MuxConfig, before: usize, after: usize) -> bool {
    before >= backlog_pause(config) && after < backlog_pause(config)
}

impl Hub {
    /// Psock `p`'s transmit side (`None`: not attached).
    #[inline]
    fn ptx(&mut self, p: PsockId) -> Option<&mut PsockTx> {
        self.sk.share_mut(p).map(|sh| &mut sh.tx)
    }

    /// Raise `PsockTransmit` if the psock has bytes, no chunk out, and was
    /// not told since its last `tx_begin`.
    pub(super) fn kick(&mut self, p: PsockId) {
        let Some(tx) = self.ptx(p) else { return };
        if tx.state == Tx::Idle && !tx.queue.is_empty() {
            tx.state = Tx::Kicked;
            self.events.push_back(Event::PsockTransmit(p));
        }
    }

    /// The next chunk of psock `p` into `slices` (cleared first); see
    /// `super::MuxRef::tx_begin_into`.
    #[inline]
    pub(super) fn tx_begin_into(&mut self, p: PsockId, slices: &mut Vec<Bytes>) -> bool {
        slices.clear();
        self.ptx(p).is_some_and(|tx| tx.poll_transmit(slices))
    }

    /// Nothing queued on psock `p`, no chunk out, no writer raised and its
    /// transmit not stopped (`false` for a psock gone).
    #[inline]
    pub(super) fn tx_idle(&mut self, p: PsockId) -> bool {
        self.ptx(p).is_some_and(|tx| tx.state == Tx::Idle && tx.queue.is_empty())
    }

    /// `msgs` addressed messages of socket `s`, `len` bytes, written whole on
    /// psock `p` by a writer outside the hub; see `super::Mux::tx_direct`.
    pub(super) fn tx_direct(&mut self, s: SockId, p: PsockId, len: usize, msgs: u32) {
        if let Some(sock) = self.sk.socks.get_mut(s.index, s.generation) {
            sock.stats.tx_msgs += u64::from(msgs);
            sock.stats.tx_bytes += len as u64;
        }
        let now = self.now;
        let Some(sh) = self.sk.share_mut(p) else {
            // Unattached since: into the folded totals, as a chunk out at
            // the unattach is.
            self.folded.tx_msgs += u64::from(msgs);
            self.folded.tx_bytes += len as u64;
            return;
        };
        sh.place(msgs);
        sh.tx.stats.tx_msgs += u64::from(msgs);
        sh.tx.stats.tx_bytes += len as u64;
        sh.tx.last_write = now;
        if sh.life == Life::PeerClosed {
            self.sk.told.push(ToPsock::MayDrain(p));
        }
    }

    /// [`Hub::tx_direct`] for a write that took only the first `sent` bytes
    /// of `data` (0: none, or it failed); see `super::Mux::tx_direct_rest`.
    pub(super) fn tx_direct_rest(&mut self, s: SockId, p: PsockId, data: Bytes, sent: usize, msgs: u32) {
        let now = self.now;
        if let Some(sock) = self.sk.socks.get_mut(s.index, s.generation) {
            // (A socket closed since charges nothing: what it had queued is
            // written or dropped with no charge to return.)
            sock.charge(data.len(), msgs);
        }
        let Some(sh) = self.sk.share_mut(p) else {
            // Unattached since: dropped, as its queued messages are.
            self.folded.tx_bytes += sent as u64;
            self.folded.tx_addressed_drops += u64::from(msgs);
            return self.uncharge(s, data.len(), msgs);
        };
        if sh.tx.stopped() {
            sh.tx.stats.tx_bytes += sent as u64;
            sh.tx.stats.tx_addressed_drops += u64::from(msgs);
            return self.uncharge(s, data.len(), msgs);
        }
        sh.place(msgs);
        sh.tx.stats.tx_bytes += sent as u64;
        if sent > 0 {
            sh.tx.last_write = now;
        }
        let before = sh.tx.addr_bytes;
        let mut m = TxMsg::new(data, s, Placed::Addressed, msgs);
        m.sent = sent;
        sh.tx.queue_front(m);
        if before < backlog_pause(&self.config) && sh.tx.addr_bytes >= backlog_pause(&self.config) {
            self.sk.told.push(ToPsock::BacklogOver(p));
        }
        self.kick(p);
    }

    /// `n` bytes of psock `p`'s chunk were written (at the latest time an
    /// owner told); see `super::MuxRef::tx_complete`.
    pub(super) fn tx_complete(&mut self, p: PsockId, n: usize) {
        let now = self.now;
        let Some(sh) = self.sk.share_mut(p) else { return self.released_complete(p, n) };
        let tx = &mut sh.tx;
        let Some(inflight) = tx.state.end_chunk() else { return };
        let backlog_before = tx.addr_bytes;
        let mut wrote = Wrote::default();
        let last = tx.on_written(inflight, n, now, &mut self.tx_done, &mut wrote);
        // The peer read its replies: read it again.
        let resume = backlog_drained(&self.config, backlog_before, tx.addr_bytes);
        let closing = sh.life == Life::PeerClosed;
        let release = self.sk.written(p, wrote.rsvd);
        if resume {
            self.sk.told.push(ToPsock::Backlog(p));
        }
        if let Some(last) = last {
            for i in 0..self.tx_done.len() {
                let (owner, len, msgs) = self.tx_done[i];
                self.uncharge(owner, len, msgs);
            }
            self.tx_done.clear();
            let (owner, len, msgs) = last;
            self.uncharge(owner, len, msgs);
        }
        if release {
            self.unreserve(p);
        }
        if closing {
            self.sk.told.push(ToPsock::MayDrain(p));
        }
    }

    /// The writer of a chunk that was out when its psock was unattached
    /// ([`OutAtRelease`]) wrote `n` bytes of it: its addressed messages
    /// written whole are sent, the others dropped, into the folded totals.
    fn released_complete(&mut self, p: PsockId, n: usize) {
        let Some(i) = self.out_at_release.iter().position(|o| o.p == p) else { return };
        let out = self.out_at_release.swap_remove(i);
        let mut left = n;
        for m in out.msgs {
            match m {
                Err(len) => left = left.saturating_sub(len),
                Ok(m) => {
                    let want = m.data.len() - m.sent;
                    let k = left.min(want);
                    left -= k;
                    self.folded.tx_bytes += k as u64;
                    if k == want {
                        self.folded.tx_msgs += u64::from(m.msgs);
                    } else {
                        self.folded.tx_addressed_drops += u64::from(m.msgs);
                    }
                    self.uncharge(m.owner, m.data.len(), m.msgs);
                }
            }
        }
    }

    /// The write failed with a hard error: abort the psock's transmit (see
    /// `super::MuxRef::tx_failed`).
    pub(super) fn tx_failed(&mut self, p: PsockId, errno: i32) {
        if self.ptx(p).is_some_and(|tx| !tx.stopped()) {
            self.tx_abort(p, errno);
        }
    }

    /// Stop a psock's transmit for good: tx_aborts, PsockFailed(Tx), its
    /// messages given back (KCM `kcm_abort_tx_psock` + retry); its owner
    /// is told its life is over.
    fn tx_abort(&mut self, p: PsockId, errno: i32) {
        let tx = self.ptx(p).expect("live");
        let inflight = tx.state.inflight();
        tx.stats.tx_aborts += 1;
        self.sk.set_life(p, Life::Failed);
        self.sk.told.push(ToPsock::TxAborted(p));
        self.sk.stop_tx(p);
        self.events.push_back(Event::PsockFailed(p, PsockError::Tx(errno)));
        self.tx_evacuate(p, false, inflight);
    }

    /// Psock `p` is unattached: its transmit ends (a reserved psock's is
    /// aborted, counted: it may be out of sync mid-message) and its queue
    /// is given back; a chunk a writer has out is counted when that writer
    /// reports.
    pub(super) fn tx_unattach(&mut self, p: PsockId) {
        let Some(sh) = self.sk.share_mut(p) else { return };
        let tx = &mut sh.tx;
        let (writer_out, inflight) = (tx.state.busy(), tx.state.inflight());
        if sh.tx_kcm.is_some() {
            tx.stats.tx_aborts += 1;
            self.counters.psock_unattach_rsvd += 1;
        }
        self.sk.stop_tx(p);
        self.tx_evacuate(p, writer_out, inflight);
    }

    /// Empty a psock's transmit queue that will not be written: the reserving
    /// socket's messages go back to the head of its queue, in order, to be
    /// sent whole elsewhere (tx_retries for each one already started);
    /// addressed messages are dropped (tx_addressed_drops). With `writer_out`
    /// (an unattach while a writer has the chunk), the chunk's addressed
    /// messages wait for the writer's report instead ([`OutAtRelease`]).
    /// `inflight`: the messages of the chunk that was out (its state is the
    /// caller's to have set: `Stopped`, or `Idle` for an unattach).
    fn tx_evacuate(&mut self, p: PsockId, writer_out: bool, inflight: usize) {
        let kcm = self.sk.unreserve(p);
        let ev = self.ptx(p).expect("live").evacuate(writer_out, inflight);
        if !ev.out.is_empty() && ev.out.iter().any(Result::is_ok) {
            self.out_at_release.push(OutAtRelease { p, msgs: ev.out });
        }
        let mut back = Vec::new();
        let mut rebalance: Vec<(SockId, Bytes)> = Vec::new();
        for (m, started) in ev.placed {
            let live_owner = self.sk.socks.get(m.owner.index, m.owner.generation).is_some();
            let resend = match m.placed {
                Placed::Balanced => live_owner,
                _ => live_owner && Some(m.owner) == kcm,
            };
            if !resend {
                self.uncharge(m.owner, m.data.len(), m.msgs);
                continue;
            }
            self.counters.tx_retries += u64::from(started);
            match m.placed {
                Placed::Balanced => rebalance.push((m.owner, m.data)),
                _ => back.push(m.data),
            }
        }
        for (owner, len, msgs) in ev.dropped {
            self.uncharge(owner, len, msgs);
        }
        if let Some(s) = kcm {
            if self.sk.give_back(s, back.into_iter()) {
                self.tx_push(s);
            }
        }
        if !rebalance.is_empty() {
            self.give_back_each(rebalance);
        }
    }

    /// Messages given back to their sockets, each socket's in order, then
    /// placed again (sockets in the order the last of their messages was
    /// queued, as they are given back from the tail).
    fn give_back_each(&mut self, back: Vec<(SockId, Bytes)>) {
        let mut owners: Vec<SockId> = Vec::new();
        for (s, _) in back.iter().rev() {
            if !owners.contains(s) {
                owners.push(*s);
            }
        }
        for &s in &owners {
            self.sk.give_back(s, back.iter().filter(|(o, _)| *o == s).map(|(_, d)| d.clone()));
        }
        for s in owners {
            self.tx_push(s);
        }
    }

    /// `TxPolicy::LeastOutstanding`: psock `p` can no longer answer (its
    /// receive side failed or closed), so its messages not yet started go
    /// back to their sockets, in order, to be placed on the others.
    pub(super) fn tx_take_back(&mut self, p: PsockId) {
        if self.config.tx_policy != TxPolicy::LeastOutstanding {
            return;
        }
        let Some(tx) = self.ptx(p) else { return };
        let back: Vec<(SockId, Bytes)> = tx.take_back_balanced().into_iter().map(|m| (m.owner, m.data)).collect();
        self.give_back_each(back);
    }

    /// Socket `s` closed: psock `p` drops its messages not yet begun
    /// ([`PsockTx::drop_owner`]); one part-way through one of them is
    /// aborted. A reservation `s` held is released.
    pub(super) fn drop_owner(&mut self, p: PsockId, s: SockId) {
        let config = &self.config;
        let Some(sh) = self.sk.share_mut(p) else { return };
        let resume = match sh.tx.drop_owner(config, s) {
            DropOwner::MidMessage => return self.tx_abort(p, EPIPE),
            DropOwner::Dropped { resume } => resume,
        };
        let reserved_by_s = sh.tx_kcm == Some(s);
        if reserved_by_s {
            self.sk.unreserve(p);
        }
        if resume {
            self.sk.told.push(ToPsock::Backlog(p));
        }
        if reserved_by_s {
            self.psock_now_avail(p);
        }
    }
}
