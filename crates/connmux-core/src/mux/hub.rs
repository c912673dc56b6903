//! The shared half of a mux ([`Hub`]): the KCM sockets and the mux's lists
//! ([`Sockets`]), the psocks' transmit sides (`super::transmit`), the
//! events for the application, the mux's counters and the memory budget
//! (its decisions are in `super::limits`). What is here touches no psock's
//! receive side: what an operation on this side has for a psock's owner (a
//! socket that took its ready message, its backlog written, its transmit
//! aborted, the budget's verdict) is told as a [`ToPsock`] value, which
//! waits in the hub's queue for the psock's owner ([`Hub::route_told`])
//! until that owner applies it (`super::MuxRef`).
//!
//! Here: closing a socket, a socket becoming able, the transmit side
//! (sends, batches, reservations, the placement of each message on a
//! psock's queue, the send buffers), the owners' queues and the statistics
//! over them.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::psock::Life;
use super::sock::Sock;
use super::sockets::{Attaching, Sockets, ToPsock};
use super::transmit::Charge;
use super::{
    Event, MuxConfig, MuxCounters, MuxError, OutAtRelease, Placed, PsockConfig, PsockId, SendFlags, SockId, SockType,
    TxMsg, TxPolicy,
};
use crate::parser::Parser;
use crate::stats::{MuxStats, PsockStats};
use crate::time::Timestamp;

/// Over its send buffer, a socket refuses addressed sends to the psocks
/// whose backlog is at least this fraction of the buffer (see
/// [`Hub::send_addressed`]).
const SNDBUF_SHARE: usize = 8;

/// What every psock shares: the KCM sockets and the mux's lists, the
/// events for the application, the mux's counters and the memory budget's
/// sum.
pub struct Hub {
    pub(super) config: MuxConfig,
    pub(super) sk: Sockets,
    pub(super) events: VecDeque<Event>,
    pub(super) counters: MuxCounters,
    /// Counters of unattached psocks, so totals never drop.
    pub(super) folded: PsockStats,
    pub(super) max_msg_peak: usize,
    /// Σ psocks `rx_held`, kept as they change (the budget's hot-path term).
    pub(super) rx_held_sum: usize,
    /// Past the memory budget's limit and not yet back at its low mark.
    pub(super) mem_over: bool,
    /// The most the budget counted when a read was counted
    /// (`MuxStats::mem_peak`).
    pub(super) mem_peak: usize,
    /// When the earliest budget pause runs out of grace.
    pub(super) mem_next: Option<Timestamp>,
    /// `TxPolicy::LeastOutstanding`: the index of the psock chosen last (ties
    /// go to the next one).
    pub(super) tx_last: u32,
    /// What was told to each owner's psocks and not yet applied, in order,
    /// by owner tag: an owner applies its queue at its next call, or when
    /// woken for it ([`Event::Wake`]). The only way anything crosses from
    /// one owner (or an application thread) to another's psock.
    pub(super) pending: Vec<VecDeque<ToPsock>>,
    /// Chunks whose writer was still out when their psock was unattached
    /// (see [`OutAtRelease`]); one entry per such psock until its writer
    /// reports, so bounded by the writers (threads, ring sends) out.
    pub(super) out_at_release: Vec<OutAtRelease>,
    /// `tx_complete`'s list of finished messages, kept to reuse its memory.
    pub(super) tx_done: Vec<Charge>,
    /// The latest time any owner told (a write's time: writers carry none).
    pub(super) now: Timestamp,
}

impl Hub {
    /// The shared half of a mux with `config`: no sockets, no psocks.
    pub fn new(config: MuxConfig) -> Hub {
        let max_msg_peak = config.max_msg_size;
        Hub {
            config,
            sk: Sockets::default(),
            events: VecDeque::new(),
            counters: MuxCounters::default(),
            folded: PsockStats::default(),
            max_msg_peak,
            rx_held_sum: 0,
            mem_over: false,
            mem_peak: 0,
            mem_next: None,
            tx_last: u32::MAX,
            pending: Vec::new(),
            out_at_release: Vec::new(),
            tx_done: Vec::new(),
            now: Timestamp::ZERO,
        }
    }

    /// The mux's statistics: every psock's share (what its owner last
    /// reported, and its transmit side) and the totals of the unattached.
    pub fn stats(&self) -> MuxStats {
        let mut agg = self.folded.clone();
        let mut psocks = 0;
        for (_, sh) in self.sk.shares() {
            super::add_psock_stats(&mut agg, &sh.stats());
            psocks += 1;
        }
        MuxStats {
            rx_msgs: agg.rx_msgs,
            rx_bytes: agg.rx_bytes,
            tx_msgs: agg.tx_msgs,
            tx_bytes: agg.tx_bytes,
            tx_retries: self.counters.tx_retries,
            psock_attach: self.counters.psock_attach,
            psock_unattach: self.counters.psock_unattach,
            psock_unattach_rsvd: self.counters.psock_unattach_rsvd,
            rx_ready_drops: self.counters.rx_ready_drops,
            mem_used: self.mem_total(),
            mem_peak: self.mem_peak,
            mem_pauses: self.counters.mem_pauses,
            mem_aborts: self.counters.mem_aborts,
            idle_timeouts: self.counters.idle_timeouts,
            handshake_timeouts: self.counters.handshake_timeouts,
            kcms: self.sk.socks.len(),
            psocks,
            psock: agg,
        }
    }

    /// Bytes the hub itself holds: the sockets' receive and send queues
    /// (open messages included) and the hold queue.
    pub fn memory_held(&self) -> usize {
        let socks: usize = self.sk.socks.iter().map(|(_, _, s)| s.rx_mem + s.tx_mem).sum();
        socks + self.sk.hold_mem
    }

    /// What the memory budget counts now ([`super::Mux::memory_used`] as
    /// it is kept per read: every owner's psocks and the hub).
    pub fn memory_counted(&self) -> usize {
        self.mem_total()
    }

    /// The next event for the application (taking one tells nothing).
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Whether psock `p` is attached and its peer closed its side in order
    /// (its life `PeerClosed` or `Drained`, as its owner last set it).
    #[inline]
    pub fn peer_closed(&self, p: PsockId) -> bool {
        self.sk.share(p).is_some_and(|sh| matches!(sh.life, Life::PeerClosed | Life::Drained))
    }

    /// Whether psock `p` is attached and `Drained` (its `PsockDrained` was
    /// raised).
    #[inline]
    pub fn drained(&self, p: PsockId) -> bool {
        self.sk.share(p).is_some_and(|sh| sh.life == Life::Drained)
    }

    /// The owner (tag) holding psock `p` (`None`: not attached).
    #[inline]
    pub fn owner_of(&self, p: PsockId) -> Option<u32> {
        self.sk.owner(p)
    }

    /// Move what operations told psocks (`sk.told`) to their owners'
    /// queues, in order; owner `me` (the caller) applies its own next, and
    /// what has no owner (its psock is gone) is applied by `me` too (it
    /// finds the psock gone). Another owner whose queue was empty is to be
    /// woken.
    #[inline]
    pub(super) fn route_told(&mut self, me: u32) {
        if self.sk.told.is_empty() {
            return;
        }
        let mut told = std::mem::take(&mut self.sk.told);
        for t in told.drain(..) {
            let o = match &t {
                ToPsock::Released { owner, .. } => *owner,
                _ => self.sk.owner(t.psock()).unwrap_or(me),
            };
            let i = o as usize;
            if self.pending.len() <= i {
                self.pending.resize_with(i + 1, VecDeque::new);
            }
            if o != me && self.pending[i].is_empty() {
                self.events.push_back(Event::Wake(o));
            }
            self.pending[i].push_back(t);
        }
        // (Keep the list's memory: told again on the next call.)
        if self.sk.told.is_empty() {
            self.sk.told = told;
        }
    }

    /// The hub's part of unattaching psock `p` (attached: its share is
    /// there), whoever owns it ([`super::MuxRef::unattach`]): a ready
    /// message dropped, what it was to send given back (reserved messages
    /// go elsewhere whole), its share gone, its counters folded into the
    /// totals from its last report, `PsockReleased`.
    pub(super) fn unattach(&mut self, p: PsockId) {
        if self.sk.share(p).is_some_and(|sh| sh.rx.ready) {
            self.counters.rx_ready_drops += 1;
            self.sk.psocks_ready.retain(|m| m.psock != p);
        }
        self.counters.psock_unattach += 1;
        self.tx_unattach(p);
        let Some(share) = self.sk.remove_share(p) else { return };
        self.rx_held_sum -= share.counted;
        super::add_psock_stats(&mut self.folded, &share.stats());
        self.events.push_back(Event::PsockReleased(p));
    }

    /// Owner `o`'s queue of what was told to its psocks (`None`: never any).
    #[inline]
    pub(super) fn pending_for(&mut self, o: u32) -> Option<&mut VecDeque<ToPsock>> {
        self.pending.get_mut(o as usize)
    }

    #[inline]
    pub(super) fn sock(&self, s: SockId) -> Result<&Sock, MuxError> {
        self.sk.socks.get(s.index, s.generation).ok_or(MuxError::BadSock)
    }
    #[inline]
    pub(super) fn sock_mut(&mut self, s: SockId) -> Result<&mut Sock, MuxError> {
        self.sk.socks.get_mut(s.index, s.generation).ok_or(MuxError::BadSock)
    }

    // ---- sockets ----

    /// close() (see [`super::Mux::close`]): every psock drops the socket's
    /// messages (`Hub::drop_owner`); queued received messages move to other
    /// sockets or the hold queue. Closing the last socket purges the hold
    /// queue and returns every psock, for the caller to unattach
    /// ([`super::MuxRef::close`]).
    pub(super) fn close(&mut self, s: SockId) -> Result<Vec<PsockId>, MuxError> {
        let sock = self.sk.socks.remove(s.index, s.generation).ok_or(MuxError::BadSock)?;
        if sock.on_waiters {
            self.sk.rx_waiters.retain(|w| *w != s);
        }
        if sock.tx_waiting {
            self.sk.tx_waiters.retain(|w| *w != s);
        }
        let last = self.sk.socks.len() == 0;
        let ids: Vec<PsockId> = self.sk.shares().map(|(p, _)| p).collect();
        for &p in &ids {
            self.drop_owner(p, s);
        }
        if last {
            self.sk.hold.clear();
            self.sk.hold_mem = 0;
            self.sk.hold_budget = 0;
            self.sk.rx_waiters.clear();
            self.sk.tx_waiters.clear();
            return Ok(ids);
        }
        self.requeue(sock.rx_queue);
        if !self.sk.hold.is_empty() {
            self.sk.hold_budget += sock.rcvbuf_peak + self.max_msg_peak;
        }
        Ok(Vec::new())
    }

    /// Messages leaving a disabled or closed socket: to the first waiting
    /// socket until it is full, then the next, else the hold queue (KCM
    /// `requeue_rx_msgs`).
    pub(super) fn requeue(&mut self, msgs: VecDeque<super::RxMsg>) {
        for msg in msgs {
            match self.sk.rx_waiters.front().copied() {
                Some(w) => self.sk.enqueue_rx(&mut self.events, w, msg),
                None => {
                    self.sk.hold_mem += msg.remaining();
                    self.sk.hold.push_back(msg);
                }
            }
        }
    }

    // ---- psocks ----

    /// SIOCKCMATTACH for owner `owner` (see [`super::MuxRef::attach_to`]):
    /// its share, its id, its owner told to create its receive side, and
    /// it goes to the first socket waiting to transmit, else the tail of
    /// the LRU list.
    pub(super) fn attach(&mut self, owner: u32, parser: Box<dyn Parser>, cfg: PsockConfig) -> PsockId {
        let (limits, _) = super::stream_limits(&self.config, &cfg);
        self.max_msg_peak = self.max_msg_peak.max(limits.max_msg_size);
        let p = self.sk.add_share(owner, self.now);
        self.counters.psock_attach += 1;
        self.sk.told.push(ToPsock::Attach(p, Box::new(Attaching { parser, cfg })));
        self.psock_now_avail(p);
        p
    }

    // ---- receive ----

    /// A socket became able (created, enabled, drained below SO_RCVBUF): it
    /// takes the hold queue, then paused psocks' messages, then joins the
    /// waiter list (KCM `kcm_rcv_ready`). Each psock whose message it took
    /// is told so ([`ToPsock::Offered`]), in order, after the socket joined.
    pub(super) fn rcv_ready(&mut self, s: SockId) {
        if !self.sk.rcv_ready_hold(&mut self.events, s) {
            return;
        }
        // Paused psocks offer the message they hold to `s` while it can
        // take one (KCM: `psocks_ready` first, then the waiter list).
        let first = self.sk.told.len();
        while let Some(msg) = self.sk.next_offer(s) {
            let p = msg.psock;
            let hold = self.sk.deliver(&self.config, &mut self.events, s, msg);
            self.sk.told.push(ToPsock::Offered { p, hold });
        }
        self.sk.join_waiters(s);
        debug_assert!(self.sk.told[first..].iter().all(|t| matches!(t, ToPsock::Offered { .. })));
    }

    // ---- transmit: sends ----

    /// sendmsg (see [`super::Mux::send`]).
    pub(super) fn send(&mut self, s: SockId, data: &[u8], flags: SendFlags) -> Result<usize, MuxError> {
        let sock = self.sock_mut(s)?;
        let complete = match sock.ty {
            SockType::Dgram => !flags.more,
            SockType::SeqPacket => flags.eor,
        };
        if sock.open.is_none() {
            if data.is_empty() {
                if complete && !flags.batch && sock.wait_more {
                    sock.wait_more = false;
                    self.tx_push(s);
                }
                return Ok(0);
            }
            if sock.tx_mem >= sock.sndbuf {
                return Err(self.would_block(s));
            }
            if !complete {
                sock.open = Some(BytesMut::with_capacity(data.len()));
            }
        }
        let len = match sock.open.as_mut() {
            // A whole message in one call: copied once, when queued.
            None => data.len(),
            Some(open) => {
                open.extend_from_slice(data);
                open.len()
            }
        };
        sock.tx_mem += data.len();
        sock.tx_msg_peak = sock.tx_msg_peak.max(len);
        sock.stats.tx_bytes += data.len() as u64;
        if complete {
            let msg = match sock.open.take() {
                None => crate::copied(data),
                Some(open) => open.freeze(),
            };
            self.queue_msg(s, msg, flags.batch);
        }
        Ok(data.len())
    }

    /// A whole message, zero-copy, on the socket's psock (the unaddressed
    /// form of [`super::Mux::send_msg`]).
    pub(super) fn send_msg(&mut self, s: SockId, msg: Bytes, batch: bool) -> Result<(), MuxError> {
        let sock = self.sock_mut(s)?;
        if msg.is_empty() {
            if !batch && sock.wait_more {
                sock.wait_more = false;
                self.tx_push(s);
            }
            return Ok(());
        }
        if sock.tx_mem >= sock.sndbuf {
            return Err(self.would_block(s));
        }
        sock.tx_mem += msg.len();
        sock.tx_msg_peak = sock.tx_msg_peak.max(msg.len());
        sock.stats.tx_bytes += msg.len() as u64;
        self.queue_msg(s, msg, batch);
        Ok(())
    }

    /// End the batch socket `s` has open (see [`super::Mux::end_batch`]).
    pub(super) fn end_batch(&mut self, s: SockId) -> Result<(), MuxError> {
        let sock = self.sock_mut(s)?;
        if std::mem::take(&mut sock.wait_more) {
            self.tx_push(s);
            self.kick_held(s);
        }
        Ok(())
    }

    /// Send buffer full: remember to raise SockWritable; flush a held batch
    /// first (KCM `kcm_push` before it waits for memory).
    pub(super) fn would_block(&mut self, s: SockId) -> MuxError {
        let sock = self.sk.socks.get_mut(s.index, s.generation).expect("live");
        sock.want_writable = true;
        if std::mem::take(&mut sock.wait_more) {
            self.tx_push(s);
            self.kick_held(s);
        }
        MuxError::WouldBlock
    }

    /// A complete message joins the socket's queue; without BATCH everything
    /// queued goes to the socket's psock.
    fn queue_msg(&mut self, s: SockId, msg: Bytes, batch: bool) {
        let sock = self.sk.socks.get_mut(s.index, s.generation).expect("live");
        sock.tx_queue.push_back(msg);
        sock.tx_msgs += 1;
        sock.stats.tx_msgs += 1;
        if batch {
            sock.wait_more = true;
        } else {
            sock.wait_more = false;
            self.tx_push(s);
            self.kick_held(s);
        }
    }

    // ---- transmit: addressed sends ----

    /// Psock `p` can take an addressed send: attached (`NoPsock`), its
    /// transmit not stopped (`Pipe`), as its share keeps them.
    #[inline]
    pub(super) fn check_addressed(&self, p: PsockId) -> Result<(), MuxError> {
        match self.sk.share(p) {
            None => Err(MuxError::NoPsock),
            Some(sh) if sh.tx.stopped() => Err(MuxError::Pipe),
            Some(_) => Ok(()),
        }
    }

    /// An addressed send of `msgs` whole messages in `msg` from socket `s`
    /// on psock `p` (checked by [`Hub::check_addressed`]): charged and
    /// queued on the psock, or refused for the psock's backlog or the
    /// socket's send buffer. `kick`: raise `PsockTransmit` for `p` (a
    /// caller that takes the chunk itself at once does not need it).
    #[inline]
    pub(super) fn send_addressed(
        &mut self,
        s: SockId,
        p: PsockId,
        msg: Bytes,
        batch: bool,
        msgs: u32,
        kick: bool,
    ) -> Result<(), MuxError> {
        let limit = self.config.psock_sndbuf;
        let (sock, sh) = self.sk.sock_and_share(s, p).expect("checked");
        if sh.tx.addr_bytes >= limit {
            sh.refusals += 1;
            return Err(self.would_block(s));
        }
        // Over the socket's send buffer, refused only to a psock that holds
        // a good share of it itself: one socket's replies go to many peers,
        // and those that do not read must not hold up the replies to the
        // others (a socket sending to one peer keeps KCM's SO_SNDBUF bound).
        if sock.tx_mem >= sock.sndbuf && sh.tx.addr_bytes >= sock.sndbuf / SNDBUF_SHARE {
            return Err(self.would_block(s));
        }
        self.queue_addressed(s, p, msg, batch, msgs, kick);
        Ok(())
    }

    /// [`Hub::send_addressed`] past its limits: charged and queued.
    pub(super) fn queue_addressed(&mut self, s: SockId, p: PsockId, msg: Bytes, batch: bool, msgs: u32, kick: bool) {
        let (sock, sh) = self.sk.sock_and_share(s, p).expect("checked");
        sock.charge(msg.len(), msgs);
        sh.place(msgs);
        let before = sh.tx.addr_bytes;
        sh.tx.queue(TxMsg::new(msg, s, Placed::Addressed, msgs));
        let mark = super::transmit::backlog_pause(&self.config);
        if before < mark && sh.tx.addr_bytes >= mark {
            // Its owner stops reading it alone (`Owned::rx_room_alone`):
            // the hub holds it back until `Backlog`.
            self.sk.told.push(ToPsock::BacklogOver(p));
        }
        let sock = self.sk.socks.get_mut(s.index, s.generation).expect("checked");
        if batch {
            if !sock.held_psocks.contains(&p) {
                sock.held_psocks.push(p);
            }
            sock.wait_more = true;
            return;
        }
        sock.wait_more = false;
        // The socket's queued messages go to its psock, the psocks its batch
        // held are kicked: neither for a server's replies (nothing queued,
        // nothing held).
        let (queued, held) = (!sock.tx_queue.is_empty(), !sock.held_psocks.is_empty());
        if kick {
            self.kick(p);
        }
        if queued {
            self.tx_push(s);
        }
        if held {
            self.kick_held(s);
        }
    }

    // ---- transmit: placement on psocks ----

    /// End of a batch: wake the psocks whose addressed messages it held.
    pub(super) fn kick_held(&mut self, s: SockId) {
        let Some(sock) = self.sk.socks.get_mut(s.index, s.generation) else { return };
        if sock.held_psocks.is_empty() {
            return;
        }
        for p in std::mem::take(&mut sock.held_psocks) {
            self.kick(p);
        }
    }

    /// Hand the socket's queued messages to its psock, reserving one if needed.
    pub(super) fn tx_push(&mut self, s: SockId) {
        if self.config.tx_policy == TxPolicy::LeastOutstanding {
            return self.tx_push_balanced(s);
        }
        let Some(sock) = self.sk.socks.get_mut(s.index, s.generation) else { return };
        if sock.tx_queue.is_empty() {
            return;
        }
        let p = match sock.tx_psock {
            Some(p) => p,
            None => match self.sk.reserve(s) {
                Some(p) => p,
                None => return self.sk.wait_for_psock(s),
            },
        };
        let (sock, sh) = self.sk.sock_and_share(s, p).expect("reserved psock is attached");
        let n = sock.tx_queue.len();
        for data in sock.tx_queue.drain(..) {
            sh.tx.queue(TxMsg::new(data, s, Placed::Reserved, 1));
        }
        sh.tx_rsvd_msgs += n;
        sh.place(n as u32);
        self.kick(p);
    }

    /// `TxPolicy::LeastOutstanding`: each queued message of `s` to the psock
    /// with the least outstanding work at that moment; with no psock that can
    /// answer, `s` waits as for a reservation.
    fn tx_push_balanced(&mut self, s: SockId) {
        loop {
            let Some(sock) = self.sk.socks.get(s.index, s.generation) else { return };
            if sock.tx_queue.is_empty() {
                return;
            }
            let Some(p) = self.sk.least_outstanding(self.tx_last) else {
                return self.sk.wait_for_psock(s);
            };
            let (sock, sh) = self.sk.sock_and_share(s, p).expect("chosen psock is attached");
            let data = sock.tx_queue.pop_front().expect("non-empty");
            sh.tx.queue(TxMsg::new(data, s, Placed::Balanced, 1));
            sh.place(1);
            self.tx_last = p.index;
            self.kick(p);
        }
    }

    /// A psock is free: to the first socket waiting to transmit, else the tail
    /// of the LRU list (KCM `psock_now_avail`).
    pub(super) fn psock_now_avail(&mut self, p: PsockId) {
        if self.config.tx_policy == TxPolicy::LeastOutstanding {
            // No reservations: every waiting socket places its messages anew.
            for w in std::mem::take(&mut self.sk.tx_waiters) {
                if let Some(sock) = self.sk.socks.get_mut(w.index, w.generation) {
                    sock.tx_waiting = false;
                    self.tx_push(w);
                }
            }
            return;
        }
        if let Some(w) = self.sk.now_avail(p) {
            self.tx_push(w);
        }
    }

    /// Release `p`'s reservation (its socket's queue is written out).
    pub(super) fn unreserve(&mut self, p: PsockId) {
        if self.sk.unreserve(p).is_some() {
            self.psock_now_avail(p);
        }
    }

    /// A message left the core (written, or dropped): uncharge its owner.
    #[inline]
    pub(super) fn uncharge(&mut self, owner: SockId, len: usize, msgs: u32) {
        self.sk.uncharge(&mut self.events, owner, len, msgs);
    }
}
