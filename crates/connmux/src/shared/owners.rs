//! The core's shared half as the runtime holds it, behind the one lock:
//! the hub every psock shares, and an owner with no psocks through which
//! application threads (and workers, for what is not a psock's receive
//! side: sends, writes, sockets, unattach, statistics) call it.
//!
//! Each worker (and each stand-alone slot) owns its psocks' receive sides
//! outright (`connmux_core::mux::Owned`, in its `driver::worker::Worker`,
//! tagged with its index) and passes them to the calls on them. What a
//! call tells another owner's psocks waits in the hub for that owner,
//! which is woken for it (`Event::Wake`, dispatched as
//! `WorkerRef::tell`) and applies it in its next pass; every receive call
//! applies what waits first.

use std::time::Duration;

use connmux_core::mux::{
    Hub, MuxConfig, MuxError, MuxRef, MuxView, Owned, PsockConfig, PsockId, RecvFlags, RecvInfo, SendFlags, SockId,
    SockType, TxChunk,
};
use connmux_core::stats::{MuxStats, PsockStats, SockStats};
use connmux_core::{Bytes, Parser, Timestamp};

/// The hub, and the application's owner (no psocks).
pub(crate) struct Owners {
    hub: Hub,
    app: Owned,
}

/// A call as the application's owner.
macro_rules! app {
    ($self:ident, |$m:ident| $call:expr) => {{
        let $m = &mut MuxRef::new(&mut $self.app, &mut $self.hub);
        $call
    }};
}

impl Owners {
    /// A mux with `config` whose psocks `owners` workers and slots hold
    /// (tags `0..owners`; the application's is the next).
    #[inline]
    pub fn new(config: MuxConfig, owners: usize) -> Owners {
        Owners { hub: Hub::new(config), app: Owned::new(owners as u32) }
    }

    #[inline]
    fn view(&self) -> MuxView<'_> {
        MuxView::new(&self.app, &self.hub)
    }

    // ---- a psock's receive side, with its owner's psocks `o` ----

    /// Owner `o`'s psocks and the hub, for a call on them (what was told
    /// to them is applied first).
    #[inline]
    pub fn of<'a>(&'a mut self, o: &'a mut Owned) -> MuxRef<'a> {
        MuxRef::new(o, &mut self.hub)
    }
    /// Owner `o`'s psocks and the hub to read, what was told to them
    /// applied first.
    #[inline]
    pub fn view_of<'a>(&'a mut self, o: &'a mut Owned) -> MuxView<'a> {
        MuxRef::new(o, &mut self.hub).apply_pending();
        MuxView::new(o, &self.hub)
    }
    #[inline]
    pub fn peer_closed(&self, p: PsockId) -> bool {
        self.hub.peer_closed(p)
    }
    #[inline]
    pub fn drained(&self, p: PsockId) -> bool {
        self.hub.drained(p)
    }

    /// SIOCKCMATTACH for owner `owner` (a worker's index, or a slot's):
    /// attached at once as far as the sockets go; the owner, woken,
    /// creates its receive side.
    #[inline]
    pub fn attach(&mut self, owner: usize, parser: Box<dyn Parser>, cfg: PsockConfig) -> PsockId {
        app!(self, |m| m.attach_to(owner as u32, parser, cfg))
    }
    /// SIOCKCMUNATTACH, from any thread: the hub's part at once, the
    /// owner's when it runs.
    #[inline]
    pub fn unattach(&mut self, p: PsockId) -> Result<(), MuxError> {
        app!(self, |m| m.unattach(p))
    }
    #[inline]
    pub fn rx_settle(&mut self, p: PsockId, n: u64) {
        app!(self, |m| m.rx_settle(p, n))
    }
    #[inline]
    pub fn psock_stats(&self, p: PsockId) -> Result<PsockStats, MuxError> {
        self.view().psock_stats(p)
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

    // ---- the time, statistics ----

    /// The time, told to the hub (before an attach: its idle scan).
    #[inline]
    pub fn note_now(&mut self, now: Timestamp) {
        app!(self, |m| m.note_now(now))
    }
    #[inline]
    pub fn stats(&self) -> MuxStats {
        self.view().stats()
    }
    #[inline]
    pub fn memory_used(&self) -> usize {
        self.view().memory_used()
    }
    #[inline]
    pub fn psock_count(&self) -> usize {
        self.view().psock_count()
    }
    #[inline]
    pub fn psocks(&self) -> Vec<PsockId> {
        self.view().psocks()
    }
    #[inline]
    pub fn idlest(&self, now: Timestamp) -> Option<(PsockId, Duration)> {
        self.view().idlest(now)
    }
    #[inline]
    pub fn proc_kcm(&self) -> String {
        self.view().proc_kcm()
    }
    #[inline]
    pub fn proc_kcm_stats(&self) -> String {
        self.view().proc_kcm_stats()
    }
}
