//! The core as the runtime holds it: the hub every psock shares and, for
//! each worker (then each stand-alone slot), the psocks it owns
//! (`connmux_core::mux::Owned`, tagged with the worker's index), plus an
//! owner with no psocks for the calls of application threads.
//!
//! Each call goes through the owner it concerns: a psock's receive side to
//! the psock's owner; a socket's, and every send and write (a psock's
//! transmit side is the hub's), to the application's. What a call tells another
//! owner's psocks (a message placed on it, a socket that became able) is
//! applied before the call returns ([`Owners::settle`]): every owner is
//! under the same lock here. The step after this one takes each worker's
//! `Owned` out of the lock, to the worker, which applies what it is told
//! when woken (`Hub::take_wakes`); the calls made here on a worker's behalf
//! show where.

use std::time::Duration;

use connmux_core::mux::{
    Direct, Hub, MuxConfig, MuxError, MuxRef, MuxView, Owned, OwnerStats, PsockConfig, PsockId, RecvFlags, RecvInfo,
    RxError, RxLoan, SendFlags, SockId, SockType, TxChunk,
};
use connmux_core::run::Run;
use connmux_core::stats::{MuxStats, PsockStats, SockStats};
use connmux_core::{Bytes, Parser, Timestamp};

/// The hub and every owner's psocks.
pub(crate) struct Owners {
    hub: Hub,
    /// By owner tag: the workers, the stand-alone slots, then the
    /// application's (no psocks).
    owned: Vec<Owned>,
    /// Owners woken by the last call (kept for its memory).
    wakes: Vec<u32>,
}

/// A call on psock `$p`'s owner, then what it told others applied.
macro_rules! at {
    ($self:ident, $p:expr, |$m:ident| $call:expr) => {{
        let k = $self.owner_index($p);
        let r = {
            let $m = &mut MuxRef::new(&mut $self.owned[k], &mut $self.hub);
            $call
        };
        $self.settle();
        r
    }};
}

/// A call on the sockets, as the application's owner, then applied.
macro_rules! app {
    ($self:ident, |$m:ident| $call:expr) => {{
        let k = $self.owned.len() - 1;
        let r = {
            let $m = &mut MuxRef::new(&mut $self.owned[k], &mut $self.hub);
            $call
        };
        $self.settle();
        r
    }};
}

impl Owners {
    /// A mux with `config` whose psocks `owners` workers and slots hold.
    #[inline]
    pub fn new(config: MuxConfig, owners: usize) -> Owners {
        let owned = (0..=owners as u32).map(Owned::new).collect();
        Owners { hub: Hub::new(config), owned, wakes: Vec::new() }
    }

    /// The index of the owner holding psock `p`; for one unattached, the
    /// application's (the call then finds no psock).
    #[inline]
    fn owner_index(&self, p: PsockId) -> usize {
        match self.hub.owner_of(p) {
            Some(o) => o as usize,
            None => self.owned.len() - 1,
        }
    }

    #[inline]
    fn view_at(&self, p: PsockId) -> MuxView<'_> {
        MuxView::new(&self.owned[self.owner_index(p)], &self.hub)
    }

    #[inline]
    fn view(&self) -> MuxView<'_> {
        MuxView::new(&self.owned[self.owned.len() - 1], &self.hub)
    }

    /// Every owner woken by the last call applies what it was told (which
    /// may wake others in turn).
    #[inline]
    pub fn settle(&mut self) {
        if self.hub.wakes_any() {
            self.settle_woken();
        }
    }

    #[inline(never)]
    fn settle_woken(&mut self) {
        self.hub.take_wakes(&mut self.wakes);
        // Bounded: what an owner applies tells others only for the work it
        // hands on (a message placed, a psock resumed).
        while let Some(o) = self.wakes.pop() {
            MuxRef::new(&mut self.owned[o as usize], &mut self.hub).apply_pending();
            self.hub.take_wakes(&mut self.wakes);
        }
    }

    // ---- psocks: their receive sides, on their owners ----

    /// SIOCKCMATTACH on owner `owner` (a worker's index, or a slot's).
    #[inline]
    pub fn attach(&mut self, owner: usize, parser: Box<dyn Parser>, cfg: PsockConfig) -> PsockId {
        let r = MuxRef::new(&mut self.owned[owner], &mut self.hub).attach(parser, cfg);
        self.settle();
        r
    }
    #[inline]
    pub fn unattach(&mut self, p: PsockId) -> Result<(), MuxError> {
        at!(self, p, |m| m.unattach(p))
    }
    #[inline]
    pub fn feed(&mut self, p: PsockId, data: &[u8], now: Timestamp) -> Result<(), MuxError> {
        at!(self, p, |m| m.feed(p, data, now))
    }
    #[inline]
    pub fn feed_direct(
        &mut self,
        p: PsockId,
        data: &[u8],
        now: Timestamp,
        direct: &mut Direct<'_>,
    ) -> Result<(), MuxError> {
        at!(self, p, |m| m.feed_direct(p, data, now, direct))
    }
    #[inline]
    pub fn feed_in_place(
        &mut self,
        p: PsockId,
        data: &[u8],
        now: Timestamp,
        direct: &mut Direct<'_>,
        limit: usize,
        out: &mut Vec<Run>,
    ) -> Result<(), MuxError> {
        at!(self, p, |m| m.feed_in_place(p, data, now, direct, limit, out))
    }
    #[inline]
    pub fn rx_room(&mut self, p: PsockId) -> (usize, Option<RxLoan>) {
        at!(self, p, |m| m.rx_room(p))
    }
    #[inline]
    pub fn rx_lend_ahead(&mut self, p: PsockId) -> Option<RxLoan> {
        at!(self, p, |m| m.rx_lend_ahead(p))
    }
    #[inline]
    pub fn rx_commit(&mut self, loan: RxLoan, now: Timestamp) -> Result<(), MuxError> {
        let p = loan.psock();
        at!(self, p, |m| m.rx_commit(loan, now))
    }
    #[inline]
    pub fn rx_commit_direct(&mut self, loan: RxLoan, now: Timestamp, direct: &mut Direct<'_>) -> Result<(), MuxError> {
        let p = loan.psock();
        at!(self, p, |m| m.rx_commit_direct(loan, now, direct))
    }
    #[inline]
    pub fn rx_closed(&mut self, p: PsockId, errno: Option<i32>) -> Result<(), MuxError> {
        at!(self, p, |m| m.rx_closed(p, errno))
    }
    #[inline]
    pub fn rx_abort(&mut self, p: PsockId, err: RxError) -> Result<(), MuxError> {
        at!(self, p, |m| m.rx_abort(p, err))
    }
    #[inline]
    pub fn rx_settle(&mut self, p: PsockId, n: u64) {
        at!(self, p, |m| m.rx_settle(p, n))
    }
    #[inline]
    pub fn set_rx_below(&mut self, p: PsockId, bytes: usize) {
        at!(self, p, |m| m.set_rx_below(p, bytes))
    }
    #[inline]
    pub fn set_handshake_deadline(&mut self, p: PsockId, deadline: Option<Timestamp>) -> Result<(), MuxError> {
        at!(self, p, |m| m.set_handshake_deadline(p, deadline))
    }
    #[inline]
    pub fn set_record_deadline(&mut self, p: PsockId, deadline: Option<Timestamp>) -> Result<(), MuxError> {
        at!(self, p, |m| m.set_record_deadline(p, deadline))
    }
    #[inline]
    pub fn rx_capacity(&self, p: PsockId) -> usize {
        self.view_at(p).rx_capacity(p)
    }
    #[inline]
    pub fn rx_need(&self, p: PsockId) -> Option<usize> {
        self.view_at(p).rx_need(p)
    }
    #[inline]
    pub fn rx_would_lend_ahead(&self, p: PsockId) -> bool {
        self.view_at(p).rx_would_lend_ahead(p)
    }
    #[inline]
    pub fn peer_closed(&self, p: PsockId) -> bool {
        self.hub.peer_closed(p)
    }
    #[inline]
    pub fn drained(&self, p: PsockId) -> bool {
        self.hub.drained(p)
    }
    #[inline]
    pub fn psock_stats(&self, p: PsockId) -> Result<PsockStats, MuxError> {
        self.view_at(p).psock_stats(p)
    }

    // ---- sends ----

    #[inline]
    pub fn send_to(&mut self, s: SockId, p: PsockId, data: &[u8], flags: SendFlags) -> Result<usize, MuxError> {
        app!(self, |m| m.send_to(s, p, data, flags))
    }
    #[inline]
    pub fn send_msg(&mut self, s: SockId, p: Option<PsockId>, msg: Bytes, batch: bool) -> Result<(), MuxError> {
        app!(self, |m| m.send_msg(s, p, msg, batch))
    }
    #[inline]
    pub fn send_msgs_to(&mut self, s: SockId, p: PsockId, data: Bytes, count: u32) -> Result<(), MuxError> {
        app!(self, |m| m.send_msgs_to(s, p, data, count))
    }
    #[inline]
    pub fn send_msgs_to_begin(
        &mut self,
        s: SockId,
        p: PsockId,
        data: Bytes,
        count: u32,
        slices: &mut Vec<Bytes>,
    ) -> Result<bool, MuxError> {
        app!(self, |m| m.send_msgs_to_begin(s, p, data, count, slices))
    }

    #[inline]
    pub fn tx_begin(&mut self, p: PsockId) -> Option<TxChunk> {
        app!(self, |m| m.tx_begin(p))
    }
    #[inline]
    pub fn tx_begin_into(&mut self, p: PsockId, slices: &mut Vec<Bytes>) -> bool {
        app!(self, |m| m.tx_begin_into(p, slices))
    }
    #[inline]
    pub fn tx_complete(&mut self, p: PsockId, n: usize) {
        app!(self, |m| m.tx_complete(p, n))
    }
    #[inline]
    pub fn tx_failed(&mut self, p: PsockId, errno: i32) {
        app!(self, |m| m.tx_failed(p, errno))
    }
    #[inline]
    pub fn tx_kick(&mut self, p: PsockId) {
        app!(self, |m| m.tx_kick(p))
    }

    // ---- sockets ----

    #[inline]
    pub fn socket(&mut self, ty: SockType) -> SockId {
        app!(self, |m| m.socket(ty))
    }
    #[inline]
    pub fn clone_sock(&mut self, s: SockId) -> Result<SockId, MuxError> {
        app!(self, |m| m.clone_sock(s))
    }
    #[inline]
    pub fn close(&mut self, s: SockId) -> Result<(), MuxError> {
        app!(self, |m| m.close(s))
    }
    #[inline]
    pub fn recv(&mut self, s: SockId, buf: &mut [u8], flags: RecvFlags) -> Result<RecvInfo, MuxError> {
        app!(self, |m| m.recv(s, buf, flags))
    }
    #[inline]
    pub fn recv_msg(&mut self, s: SockId) -> Result<(Bytes, PsockId), MuxError> {
        app!(self, |m| m.recv_msg(s))
    }
    #[inline]
    pub fn send(&mut self, s: SockId, data: &[u8], flags: SendFlags) -> Result<usize, MuxError> {
        app!(self, |m| m.send(s, data, flags))
    }
    #[inline]
    pub fn end_batch(&mut self, s: SockId) -> Result<(), MuxError> {
        app!(self, |m| m.end_batch(s))
    }
    #[inline]
    pub fn set_holds(&mut self, s: SockId, on: bool) -> Result<(), MuxError> {
        app!(self, |m| m.set_holds(s, on))
    }
    #[inline]
    pub fn set_recv_disable(&mut self, s: SockId, disable: bool) -> Result<(), MuxError> {
        app!(self, |m| m.set_recv_disable(s, disable))
    }
    #[inline]
    pub fn set_rcvbuf(&mut self, s: SockId, bytes: usize) -> Result<(), MuxError> {
        app!(self, |m| m.set_rcvbuf(s, bytes))
    }
    #[inline]
    pub fn set_sndbuf(&mut self, s: SockId, bytes: usize) -> Result<(), MuxError> {
        app!(self, |m| m.set_sndbuf(s, bytes))
    }
    #[inline]
    pub fn set_affinity(&mut self, s: SockId, tag: Option<u32>) -> Result<(), MuxError> {
        app!(self, |m| m.set_affinity(s, tag))
    }
    /// The next event (taking one tells nothing).
    #[inline]
    pub fn poll_event(&mut self) -> Option<connmux_core::mux::Event> {
        self.hub.poll_event()
    }
    #[inline]
    pub fn recv_disabled(&self, s: SockId) -> Result<bool, MuxError> {
        self.view().recv_disabled(s)
    }
    #[inline]
    pub fn sock_stats(&self, s: SockId) -> Result<SockStats, MuxError> {
        self.view().sock_stats(s)
    }
    #[inline]
    pub fn tx_unsent(&self, s: SockId) -> Result<usize, MuxError> {
        self.view().tx_unsent(s)
    }
    #[inline]
    pub fn rx_queued(&self, s: SockId) -> Result<usize, MuxError> {
        self.view().rx_queued(s)
    }
    #[inline]
    pub fn writable(&self, s: SockId) -> Result<bool, MuxError> {
        self.view().writable(s)
    }
    #[inline]
    pub fn mem_tight(&self) -> bool {
        self.view().mem_tight()
    }
    #[inline]
    pub fn config(&self) -> &MuxConfig {
        self.view().config()
    }

    // ---- every owner ----

    /// The time, told to every owner.
    #[inline]
    pub fn note_now(&mut self, now: Timestamp) {
        for o in &mut self.owned {
            MuxRef::new(o, &mut self.hub).note_now(now);
        }
        self.settle();
    }
    /// Every owner's deadlines at `now`.
    #[inline]
    pub fn handle_timeout(&mut self, now: Timestamp) {
        for k in 0..self.owned.len() {
            MuxRef::new(&mut self.owned[k], &mut self.hub).handle_timeout(now);
            self.settle();
        }
    }
    /// The earliest deadline of any owner (the hub's among them).
    #[inline]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        // (The application's owner has no psocks: its deadlines are the
        // hub's, which every owner's include.)
        let owners = &self.owned[..self.owned.len() - 1];
        owners.iter().filter_map(|o| MuxView::new(o, &self.hub).poll_timeout()).min()
    }
    fn owner_stats(&self) -> OwnerStats {
        let mut st = OwnerStats::default();
        for o in &self.owned {
            st.add(&MuxView::new(o, &self.hub).owner_stats());
        }
        st
    }
    #[inline]
    pub fn stats(&self) -> MuxStats {
        self.hub.stats(&self.owner_stats())
    }
    #[inline]
    pub fn memory_used(&self) -> usize {
        self.owner_stats().mem + self.hub.memory_held()
    }
    #[inline]
    pub fn psock_count(&self) -> usize {
        self.owned.iter().map(|o| MuxView::new(o, &self.hub).psock_count()).sum()
    }
    #[inline]
    pub fn psocks(&self) -> Vec<PsockId> {
        let mut all: Vec<PsockId> = self.owned.iter().flat_map(|o| MuxView::new(o, &self.hub).psocks()).collect();
        all.sort_by_key(|p| p.index);
        all
    }
    #[inline]
    pub fn idlest(&self, now: Timestamp) -> Option<(PsockId, Duration)> {
        self.owned
            .iter()
            .filter_map(|o| MuxView::new(o, &self.hub).idlest(now))
            .max_by_key(|(p, d)| (*d, std::cmp::Reverse(p.index)))
    }
    #[inline]
    pub fn proc_kcm(&self) -> String {
        let mut out = self.view().proc_kcm_head(&self.stats());
        let mut rows: Vec<(u32, String)> =
            self.owned.iter().flat_map(|o| MuxView::new(o, &self.hub).proc_kcm_psocks()).collect();
        rows.sort_by_key(|(i, _)| *i);
        for (_, row) in rows {
            out.push_str(&row);
        }
        out
    }
    #[inline]
    pub fn proc_kcm_stats(&self) -> String {
        connmux_core::mux::proc_kcm_stats_of(&self.stats())
    }
}
