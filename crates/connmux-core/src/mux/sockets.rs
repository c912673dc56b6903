//! What the psocks of a mux share: the KCM sockets, the lists of sockets
//! waiting to receive (`kcm_rx_waiters`) and to send (`kcm_tx_waiters`), the
//! psocks waiting for a socket to take a message (`psocks_ready`) and free
//! for a reservation (`psocks_avail`), the hold queue, and the steering
//! policy that picks the socket for a message, what the readers owe each
//! psock (its messages waiting in queues, those taken and not yet answered),
//! each psock's transmit side and what each psock reported ([`Share`]).
//! What one connection's owner holds is in [`super::psock`]; the mux
//! (`super`) moves messages and reports between the two.

use std::collections::VecDeque;

use bytes::Bytes;

use super::limits::MemState;
use super::psock::{Life, RxReport};
use super::slab::Slab;
use super::sock::Sock;
use super::transmit::{PsockTx, Tx};
use super::{
    mix, sid, Event, MuxConfig, MuxError, PsockConfig, PsockId, RecvFlags, RecvInfo, RxMsg, SockId, SockType, Steering,
};
use crate::parser::Parser;
use crate::stats::PsockStats;
use crate::time::Timestamp;

/// The shared part of a mux.
#[derive(Default)]
pub(super) struct Sockets {
    pub(super) socks: Slab<Sock>,
    /// Able sockets, FIFO (`kcm_rx_waiters`).
    pub(super) rx_waiters: VecDeque<SockId>,
    /// The message of each paused psock that no socket could take, FIFO
    /// (`psocks_ready`: KCM keeps it on the psock, `ready_rx_msg`; here the
    /// psock keeps only its length, so a socket that becomes able takes it
    /// without a look at the psock).
    pub(super) psocks_ready: VecDeque<RxMsg>,
    /// Messages moved off disabled/closed sockets that nobody could take.
    pub(super) hold: VecDeque<RxMsg>,
    pub(super) hold_mem: usize,
    pub(super) hold_budget: usize,
    /// Psocks free for transmit, least recently used first (`psocks_avail`).
    pub(super) psocks_avail: VecDeque<PsockId>,
    /// Sockets waiting for a psock, FIFO (`kcm_tx_waiters`).
    pub(super) tx_waiters: VecDeque<SockId>,
    /// Each attached psock's [`Share`], by its index.
    shares: Slab<Share>,
    /// What operations on the hub's side have to tell psocks' owners, in
    /// order, until routed to the owners' queues ([`ToPsock`]).
    pub(super) told: Vec<ToPsock>,
}

/// What an operation on the hub's side (a reader taking or settling a
/// message, a write reported, a socket able, the budget) tells the owner
/// of a psock. The hub never touches a psock's state: what it tells
/// waits in its queue for the psock's owner (`super::hub::Hub::route_told`),
/// which applies it at its next call or when woken; with one owner that is
/// at once, in the same call.
#[derive(Debug)]
pub(super) enum ToPsock {
    /// It was attached to this owner: create its receive side.
    Attach(PsockId, Box<Attaching>),
    /// Its messages waiting for readers are down to half the bound: the
    /// readers no longer hold its reading back.
    Resume(PsockId),
    /// Nothing of it may be left in readers' hands or to write now (a
    /// reader settled its last message, a write ended): a psock whose peer
    /// closed may be drained.
    MayDrain(PsockId),
    /// Its reply backlog fell under the pause mark (written, or dropped
    /// with its socket): it is read again.
    Backlog(PsockId),
    /// Its reply backlog reached the pause mark: what its owner decided
    /// alone from its last report (`super::alone`) no longer holds.
    BacklogOver(PsockId),
    /// Its transmit was aborted (a write failed, its socket closed
    /// mid-message): its life is over.
    TxAborted(PsockId),
    /// Its ready message was taken by a socket (`hold`: its messages waiting
    /// for readers reached the bound with it): it is read again, from what
    /// it had buffered.
    Offered { p: PsockId, hold: bool },
    /// Another thread unattached it (its share is gone, routed to `owner`
    /// by name): drop its receive side.
    Released { p: PsockId, owner: u32 },
    /// The memory budget paused it (a loan of its buffer out is recalled:
    /// what it counts may never come).
    MemPaused(PsockId),
    /// The memory budget resumed it: it is read again.
    MemResumed(PsockId),
    /// The memory budget aborts it (stuck holding `held` of `limit`): its
    /// receive stops, its buffer is freed, `PsockFailed(Rx(MemLimit))`.
    MemAbort { p: PsockId, held: usize, limit: usize },
}

impl ToPsock {
    /// The psock told.
    pub(super) fn psock(&self) -> PsockId {
        match *self {
            ToPsock::Attach(p, _)
            | ToPsock::Resume(p)
            | ToPsock::MayDrain(p)
            | ToPsock::Backlog(p)
            | ToPsock::BacklogOver(p)
            | ToPsock::TxAborted(p)
            | ToPsock::Offered { p, .. }
            | ToPsock::Released { p, .. }
            | ToPsock::MemPaused(p)
            | ToPsock::MemResumed(p)
            | ToPsock::MemAbort { p, .. } => p,
        }
    }
}

/// A psock's receive side to create, as its owner is told
/// ([`ToPsock::Attach`]).
pub(super) struct Attaching {
    pub(super) parser: Box<dyn Parser>,
    pub(super) cfg: PsockConfig,
}

impl std::fmt::Debug for Attaching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attaching").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// What the sockets' side keeps of one psock: its messages in the hands of
/// readers, its reservation, its transmit side ([`PsockTx`]: any sender
/// writes it), and what the psock reported (messages received from it,
/// whether it can still answer). The psock's owner is told what it needs of
/// this (its reading held back, its last message answered or written);
/// the sockets' side decides from it and never reads the psock.
#[derive(Debug)]
pub(super) struct Share {
    /// Which owner holds the psock ([`super::Owned`]'s tag): what is told
    /// to the psock goes there.
    pub(super) owner: u32,
    /// Its messages waiting in sockets' receive queues (or the hold queue),
    /// not yet taken by a reader (`MuxConfig::psock_queued_max`).
    pub(super) queued: usize,
    /// `queued` reached `psock_queued_max`: the psock is not read until it
    /// is down to half (then `PsockRxResume`).
    pub(super) queued_full: bool,
    /// Its life as its owner last set it (see [`Life`]): while its peer
    /// has closed in order (`PeerClosed`), the last of its messages leaving
    /// readers' hands, or its last write, is told ([`ToPsock::MayDrain`]),
    /// as the psock may then drain (not before: nothing waits for it, and
    /// a server settles each request); other threads read here whether it
    /// closes in order, or has drained, without its owner.
    pub(super) life: Life,
    /// Messages handed to holding sockets' readers and not yet settled
    /// ([`super::Mux::set_holds`], [`super::Mux::rx_settle`]): requests
    /// still being answered.
    pub(super) holds: u64,
    // ---- transmit: the reservation (KCM's `tx_kcm`) ----
    /// The socket holding its reservation.
    pub(super) tx_kcm: Option<SockId>,
    /// Messages of `tx_kcm` placed on it and not yet written whole
    /// ([`Sockets::written`]).
    pub(super) tx_rsvd_msgs: usize,
    /// On the list of psocks free for a reservation (`psocks_avail`).
    pub(super) in_avail: bool,
    /// Times it was reserved and released (its `reserved`/`unreserved`
    /// statistics).
    pub(super) reserved: u64,
    pub(super) unreserved: u64,
    // ---- transmit: its queue, and what the psock reported of its life ----
    /// Its transmit side.
    pub(super) tx: PsockTx,
    /// Addressed sends refused for its reply backlog (its
    /// `tx_backlog_refusals`).
    pub(super) refusals: u64,
    /// Messages placed on it over its life (kept here only: the sockets'
    /// side places them), the first term of its outstanding work
    /// ([`Share::outstanding`]).
    pub(super) placed: u64,
    /// What its receive side last reported (its counters, among them the
    /// messages received from it: the second term; what it holds, whether
    /// it waits): statistics are read here.
    pub(super) rx: RxReport,
    /// It can still answer (transmit not stopped, receive running): lowered
    /// for good by the glue when that ends, so `TxPolicy::LeastOutstanding`
    /// and the memory budget pass it over without a look at the psock.
    pub(super) answers: bool,
    // ---- the memory budget ----
    /// What its receive side holds (`rx_mem` plus what the driver holds
    /// below the parser), as last added to `Hub::rx_held_sum`.
    pub(super) counted: usize,
    /// Whether the budget lets it be read (see `super::limits`).
    pub(super) mem: MemState,
}

impl Share {
    /// Nothing of the psock is in readers' hands: none of its messages
    /// waits in a queue, every one taken has been answered.
    #[inline]
    pub(super) fn readers_done(&self) -> bool {
        self.queued == 0 && self.holds == 0
    }
    /// One more of its messages waits in a socket's queue; `true` when that
    /// reaches the bound (the psock's reading is then held back until
    /// [`ToPsock::Resume`]).
    #[inline]
    pub(super) fn count_queued(&mut self, config: &MuxConfig) -> bool {
        self.queued += 1;
        if self.queued >= config.psock_queued_max && !self.queued_full {
            self.queued_full = true;
            return true;
        }
        false
    }
    /// Messages placed on it minus messages received from it (never below
    /// 0): the requests it has not answered yet, as
    /// `TxPolicy::LeastOutstanding` counts them.
    #[inline]
    pub(super) fn outstanding(&self) -> u64 {
        self.placed.saturating_sub(self.rx.stream.msgs)
    }
    /// Its psock's statistics: what its receive side reported, its
    /// transmit side's and its reservations'.
    pub(super) fn stats(&self) -> PsockStats {
        let mut st = self.rx.rx_stats();
        super::add_psock_stats(&mut st, &self.tx.stats);
        st.reserved += self.reserved;
        st.unreserved += self.unreserved;
        st.tx_backlog_refusals += self.refusals;
        st
    }
    /// `msgs` messages were placed on its psock.
    #[inline]
    pub(super) fn place(&mut self, msgs: u32) {
        self.placed += u64::from(msgs);
    }
}

impl Sockets {
    /// A psock is attached at `now`, to be held by owner `owner`: its id,
    /// and its share, empty.
    pub(super) fn add_share(&mut self, owner: u32, now: Timestamp) -> PsockId {
        let (index, generation) = self.shares.insert(Share {
            owner,
            queued: 0,
            queued_full: false,
            life: Life::Open,
            holds: 0,
            tx_kcm: None,
            tx_rsvd_msgs: 0,
            in_avail: false,
            reserved: 0,
            unreserved: 0,
            tx: PsockTx::new(now),
            refusals: 0,
            placed: 0,
            rx: RxReport { last_active: now, ..RxReport::default() },
            answers: true,
            counted: 0,
            mem: MemState::Reading,
        });
        PsockId { index, generation }
    }
    /// A psock was unattached: its share, off the list of free psocks.
    pub(super) fn remove_share(&mut self, p: PsockId) -> Option<Share> {
        let sh = self.shares.remove(p.index, p.generation)?;
        if sh.in_avail {
            self.psocks_avail.retain(|x| *x != p);
        }
        Some(sh)
    }
    #[inline]
    pub(super) fn shares_mut(&mut self) -> impl Iterator<Item = (PsockId, &mut Share)> {
        self.shares.iter_mut().map(|(index, generation, sh)| (PsockId { index, generation }, sh))
    }
    #[inline]
    pub(super) fn share(&self, p: PsockId) -> Option<&Share> {
        self.shares.get(p.index, p.generation)
    }
    #[inline]
    pub(super) fn share_mut(&mut self, p: PsockId) -> Option<&mut Share> {
        self.shares.get_mut(p.index, p.generation)
    }
    /// Psock `p`'s share and socket `s`, if it is live, together (what a
    /// psock framed in place is counted on both).
    #[inline]
    pub(super) fn share_and_sock(&mut self, p: PsockId, s: SockId) -> Option<(&mut Share, Option<&mut Sock>)> {
        let sh = self.shares.get_mut(p.index, p.generation)?;
        Some((sh, self.socks.get_mut(s.index, s.generation)))
    }
    /// Socket `s` and psock `p`'s share together (an addressed send looks
    /// at both once).
    #[inline]
    pub(super) fn sock_and_share(&mut self, s: SockId, p: PsockId) -> Option<(&mut Sock, &mut Share)> {
        let sock = self.socks.get_mut(s.index, s.generation)?;
        let sh = self.shares.get_mut(p.index, p.generation)?;
        Some((sock, sh))
    }
    /// The shares of the attached psocks, with their ids.
    pub(super) fn shares(&self) -> impl Iterator<Item = (PsockId, &Share)> {
        self.shares.iter().map(|(index, generation, sh)| (PsockId { index, generation }, sh))
    }
    /// The owner holding psock `p` (`None`: not attached).
    #[inline]
    pub(super) fn owner(&self, p: PsockId) -> Option<u32> {
        self.share(p).map(|sh| sh.owner)
    }
    /// `TxPolicy::LeastOutstanding`: the psock that can still answer with
    /// the fewest outstanding messages; among equals, the first after index
    /// `after` (the one chosen last). From the shares alone: what the psocks
    /// reported.
    pub(super) fn least_outstanding(&self, after: u32) -> Option<PsockId> {
        self.shares()
            .filter(|(_, sh)| sh.answers)
            .min_by_key(|(p, sh)| (sh.outstanding(), p.index.wrapping_sub(after).wrapping_sub(1)))
            .map(|(p, _)| p)
    }
    /// Psock `p`'s owner set its life to `life`.
    #[inline]
    pub(super) fn set_life(&mut self, p: PsockId, life: Life) {
        if let Some(sh) = self.share_mut(p) {
            sh.life = life;
        }
    }
    /// Psock `p` reports that it can no longer answer (its transmit
    /// stopped, or its receive is over): passed over from now on.
    #[inline]
    pub(super) fn no_answers(&mut self, p: PsockId) {
        if let Some(sh) = self.share_mut(p) {
            sh.answers = false;
        }
    }
    /// A reader took a whole message of psock `p` from a queue (`holds`: its
    /// socket holds what its reader takes until settled): tells `Resume`
    /// when that brings its queued messages down to half the bound, and
    /// `MayDrain` when nothing of it is left in readers' hands.
    #[inline]
    pub(super) fn take(&mut self, config: &MuxConfig, p: PsockId, holds: bool) {
        let Some(sh) = self.share_mut(p) else { return };
        sh.queued = sh.queued.saturating_sub(1);
        let resume = sh.queued_full && sh.queued <= config.psock_queued_max / 2;
        if resume {
            sh.queued_full = false;
        }
        let done = if holds {
            sh.holds += 1;
            false
        } else {
            sh.life == Life::PeerClosed && sh.readers_done()
        };
        if done {
            self.told.push(ToPsock::MayDrain(p));
        }
        if resume {
            self.told.push(ToPsock::Resume(p));
        }
    }
    /// `n` messages of psock `p` taken from holding sockets were answered:
    /// tells `MayDrain` when nothing of it is left in readers' hands
    /// and its peer closed (only a closing psock waits for that).
    pub(super) fn settle(&mut self, p: PsockId, n: u64) {
        let Some(sh) = self.share_mut(p) else { return };
        sh.holds = sh.holds.saturating_sub(n);
        if sh.life == Life::PeerClosed && sh.readers_done() {
            self.told.push(ToPsock::MayDrain(p));
        }
    }
    /// `n` messages of psock `p` handed to a reader without a queue (in
    /// place, or straight to the caller's list): holds, if its socket holds.
    #[inline]
    pub(super) fn handed(&mut self, p: PsockId, n: u64, holds: bool) {
        if holds {
            if let Some(sh) = self.share_mut(p) {
                sh.holds += n;
            }
        }
    }

    /// The steering policy: which able socket takes a message.
    pub(super) fn steer(
        &self,
        config: &MuxConfig,
        affinity: Option<u32>,
        key: Option<u64>,
        target: &mut Option<SockId>,
    ) -> Option<SockId> {
        let Sockets { socks, rx_waiters, .. } = self;
        let steering = config.steering;
        let mut avoid = None;
        // Sockets any psock's messages may go to (not tag-only ones).
        let open = |w: &SockId| socks.get(w.index, w.generation).is_some_and(|s| !s.tag_only);
        match steering {
            Steering::RoundRobin => {}
            Steering::Affinity => {
                if let Some(tag) = affinity {
                    // Affinity until uneven: the socket with the psock's tag
                    // while its queue is short.
                    let own = rx_waiters
                        .iter()
                        .copied()
                        .find(|w| socks.get(w.index, w.generation).is_some_and(|s| s.affinity == Some(tag)));
                    match own.map(|w| (w, socks.get(w.index, w.generation).expect("waiter present"))) {
                        // A tag-only socket keeps its psocks however long its
                        // queue: one reader answers them, in order.
                        Some((w, sock)) if sock.tag_only || sock.rx_queue.len() <= config.imbalance => return Some(w),
                        Some((w, _)) => avoid = Some(w),
                        // Its tag-only socket cannot take more now: the message
                        // waits for it rather than go to another reader.
                        None if socks.iter().any(|(_, _, s)| s.tag_only && s.affinity == Some(tag)) => return None,
                        None => {}
                    }
                }
            }
            Steering::Key => {
                if let Some(k) = key {
                    // Hash over the able sockets in index order (stable while
                    // the set of able sockets is).
                    let n = rx_waiters.iter().filter(|w| open(w)).count();
                    if n > 0 {
                        let pick = (mix(k) % n as u64) as usize;
                        return socks
                            .iter()
                            .filter(|(_, _, s)| s.on_waiters && !s.tag_only)
                            .nth(pick)
                            .map(|(i, g, _)| sid((i, g)));
                    }
                    return None;
                }
            }
        }
        // Round robin with per-pass batching.
        if let Some(t) = *target {
            if avoid != Some(t) && socks.get(t.index, t.generation).is_some_and(|s| s.on_waiters && !s.tag_only) {
                return Some(t);
            }
        }
        let next = match avoid {
            // Uneven: another socket, else the psock's own after all.
            Some(a) => rx_waiters.iter().copied().find(|w| *w != a && open(w)).or(Some(a)),
            None => rx_waiters.iter().copied().find(|w| open(w)),
        };
        *target = next;
        next
    }

    /// A message of `len` bytes from psock `p`, steered to socket `s`, goes
    /// to a reader in place (counted as received, held if `s` holds) when
    /// nothing waits in `s`'s queue before it; `false`: it must be queued.
    #[inline]
    pub(super) fn hand_direct(&mut self, s: SockId, p: PsockId, len: usize) -> bool {
        let sock = self.socks.get_mut(s.index, s.generation).expect("steered to a live socket");
        if !sock.rx_queue.is_empty() {
            return false;
        }
        sock.stats.rx_msgs += 1;
        sock.stats.rx_bytes += len as u64;
        let holds = sock.holds;
        self.handed(p, 1, holds);
        true
    }

    /// `last`, the socket a psock's last pass steered to with no tag, if it
    /// takes this pass too (`Steering::Affinity`): able, untagged, and its
    /// reader has taken everything queued (it keeps up). A reader still
    /// busy with earlier messages gives the pass to another, as round
    /// robin does: one connection's heavy requests spread over every
    /// thread, light ones stay with one.
    pub(super) fn keeps_up(&self, last: Option<SockId>) -> Option<SockId> {
        let t = last?;
        let s = self.socks.get(t.index, t.generation)?;
        (s.on_waiters && !s.tag_only && s.affinity.is_none() && s.rx_queue.is_empty()).then_some(t)
    }

    /// `reader`, the socket whose thread reads the psocks now
    /// ([`super::Owned::set_reader`]), if it takes this pass
    /// (`Steering::Affinity`): able, untagged, and its queue short (at most
    /// `imbalance`, as a tagged socket's). It began reading because
    /// nothing was queued for it, and takes what it read right after, in
    /// the same thread: a read kept there crosses no thread (`bench kcm`,
    /// 8 × 16, two threads: 0.68× → 0.95× a thread per connection against
    /// the rule of [`Sockets::keeps_up`]). A heavy connection still
    /// spreads: a thread busy with its messages reads nothing, and the
    /// next read is another thread's.
    pub(super) fn reads_on(&self, config: &MuxConfig, reader: Option<SockId>) -> Option<SockId> {
        let t = reader?;
        let s = self.socks.get(t.index, t.generation)?;
        (s.on_waiters && !s.tag_only && s.affinity.is_none() && s.rx_queue.len() <= config.imbalance).then_some(t)
    }

    /// End of a psock's pass under round robin: the socket it kept taking
    /// (`target` of [`Sockets::steer`]) goes to the tail of the waiters.
    pub(super) fn end_pass(&mut self, t: SockId) {
        if let Some(pos) = self.rx_waiters.iter().position(|w| *w == t) {
            if pos + 1 != self.rx_waiters.len() {
                self.rx_waiters.remove(pos);
                self.rx_waiters.push_back(t);
            }
        }
    }

    /// Whether [`Sockets::steer`] sends the next message of a psock with
    /// tag `affinity` to socket `s` with nothing queued before it: its own
    /// socket, able, its queue empty (so framing in place keeps the order).
    pub(super) fn steers_here(&self, config: &MuxConfig, s: SockId, affinity: Option<u32>) -> bool {
        let Some(sock) = self.socks.get(s.index, s.generation) else { return false };
        config.steering == Steering::Affinity
            && affinity.is_some()
            && sock.affinity == affinity
            && sock.on_waiters
            && sock.rx_queue.is_empty()
    }

    /// A message no socket could take: it is offered again, in turn, when a
    /// socket becomes able ([`Sockets::next_offer`]); its psock pauses.
    pub(super) fn wait_offer(&mut self, msg: RxMsg) {
        self.psocks_ready.push_back(msg);
    }

    /// Deliver a message of a psock to a socket's queue (which must be
    /// able): `true` when its messages waiting for readers reach the bound,
    /// so that the psock is not read until [`ToPsock::Resume`].
    #[inline]
    pub(super) fn deliver(&mut self, config: &MuxConfig, events: &mut VecDeque<Event>, s: SockId, msg: RxMsg) -> bool {
        let p = msg.psock;
        self.enqueue_rx(events, s, msg);
        self.share_mut(p).is_some_and(|sh| sh.count_queued(config))
    }

    /// Queue a message on a socket (which must be able).
    #[inline]
    pub(super) fn enqueue_rx(&mut self, events: &mut VecDeque<Event>, s: SockId, msg: RxMsg) {
        let Sockets { socks, rx_waiters, .. } = self;
        let sock = socks.get_mut(s.index, s.generation).expect("steered to a live socket");
        let was_empty = sock.rx_queue.is_empty();
        sock.rx_mem += msg.remaining();
        sock.rx_queue.push_back(msg);
        if sock.rx_mem >= sock.rcvbuf && sock.on_waiters {
            // Full: leave the waiter list until reads make room.
            sock.on_waiters = false;
            rx_waiters.retain(|w| *w != s);
        }
        if was_empty {
            events.push_back(Event::SockReadable(s));
        }
    }

    /// recvmsg on socket `s` (see [`super::Mux::recv`]); what the reader
    /// took is told to its psock ([`Sockets::take`]).
    pub(super) fn recv(
        &mut self,
        config: &MuxConfig,
        s: SockId,
        buf: &mut [u8],
        flags: RecvFlags,
    ) -> Result<RecvInfo, MuxError> {
        let sock = self.socks.get_mut(s.index, s.generation).ok_or(MuxError::BadSock)?;
        let ty = sock.ty;
        let head = sock.rx_queue.front_mut().ok_or(MuxError::WouldBlock)?;
        let rem = head.remaining();
        let n = buf.len().min(rem);
        buf[..n].copy_from_slice(&head.data[head.off..head.off + n]);
        let psock = head.psock;
        if flags.peek {
            return Ok(RecvInfo { len: n, eor: false, trunc: false, psock });
        }
        let (eor, trunc, consumed) = if n == rem {
            (true, false, rem)
        } else if ty == SockType::Dgram {
            (true, true, rem)
        } else {
            head.off += n;
            (false, false, n)
        };
        sock.rx_mem -= consumed;
        sock.stats.rx_bytes += n as u64;
        if eor {
            sock.rx_queue.pop_front();
            sock.stats.rx_msgs += 1;
            let holds = sock.holds;
            self.take(config, psock, holds);
        }
        Ok(RecvInfo { len: n, eor, trunc, psock })
    }

    /// Take socket `s`'s head message whole (see [`super::Mux::recv_msg`]),
    /// told to its psock; with whether the socket can now rejoin the
    /// waiters (it was full and is not any more).
    pub(super) fn recv_msg(&mut self, config: &MuxConfig, s: SockId) -> Result<(Bytes, PsockId, bool), MuxError> {
        let sock = self.socks.get_mut(s.index, s.generation).ok_or(MuxError::BadSock)?;
        let msg = sock.rx_queue.pop_front().ok_or(MuxError::WouldBlock)?;
        let len = msg.remaining();
        sock.rx_mem -= len;
        sock.stats.rx_msgs += 1;
        sock.stats.rx_bytes += len as u64;
        let rejoin = !sock.on_waiters && sock.able();
        let holds = sock.holds;
        let data = if msg.off == 0 { msg.data } else { msg.data.slice(msg.off..) };
        self.take(config, msg.psock, holds);
        Ok((data, msg.psock, rejoin))
    }

    /// Socket `s` became able (created, enabled, drained below SO_RCVBUF):
    /// it takes the hold queue first. `false` when there is nothing more
    /// for it to take now (it was on the waiters already, or is full).
    pub(super) fn rcv_ready_hold(&mut self, events: &mut VecDeque<Event>, s: SockId) -> bool {
        let Some(sock) = self.socks.get(s.index, s.generation) else { return false };
        if sock.on_waiters || !sock.able() {
            return false;
        }
        while let Some(msg) = self.hold.pop_front() {
            self.hold_mem -= msg.remaining();
            self.enqueue_rx(events, s, msg);
            if !self.socks.get(s.index, s.generation).expect("live").able() {
                if self.hold.is_empty() {
                    self.hold_budget = 0;
                }
                return false;
            }
        }
        self.hold_budget = 0;
        true
    }

    /// The next paused psock's ready message to offer to socket `s`, while
    /// `s` can take one.
    #[inline]
    pub(super) fn next_offer(&mut self, s: SockId) -> Option<RxMsg> {
        if !self.socks.get(s.index, s.generation)?.able() {
            return None;
        }
        self.psocks_ready.pop_front()
    }

    /// Socket `s` joins the waiters if it is able and not on them.
    pub(super) fn join_waiters(&mut self, s: SockId) {
        let Some(sock) = self.socks.get_mut(s.index, s.generation) else { return };
        if sock.able() && !sock.on_waiters {
            sock.on_waiters = true;
            self.rx_waiters.push_back(s);
        }
    }

    // ---- transmit: reservations (KCM's `psocks_avail`, `tx_waiters`) ----

    /// Reserve the least recently used free psock for socket `s`.
    pub(super) fn reserve(&mut self, s: SockId) -> Option<PsockId> {
        while let Some(p) = self.psocks_avail.pop_front() {
            let Some(sh) = self.share_mut(p) else { continue };
            sh.in_avail = false;
            if sh.tx.stopped() {
                continue;
            }
            sh.tx_kcm = Some(s);
            sh.reserved += 1;
            self.socks.get_mut(s.index, s.generation).expect("live").tx_psock = Some(p);
            return Some(p);
        }
        None
    }

    /// Socket `s` has messages and no psock: it waits for one.
    pub(super) fn wait_for_psock(&mut self, s: SockId) {
        let sock = self.socks.get_mut(s.index, s.generation).expect("live");
        if !sock.tx_waiting {
            sock.tx_waiting = true;
            self.tx_waiters.push_back(s);
        }
    }

    /// Psock `p` is free for a reservation (KCM `psock_now_avail`): reserved
    /// by the first socket waiting with messages (returned: its queue is to
    /// be placed on `p`), else at the tail of the free list.
    pub(super) fn now_avail(&mut self, p: PsockId) -> Option<SockId> {
        let sh = self.share(p)?;
        if sh.tx.stopped() || sh.tx_kcm.is_some() || sh.in_avail {
            return None;
        }
        while let Some(w) = self.tx_waiters.pop_front() {
            let Some(sock) = self.socks.get_mut(w.index, w.generation) else { continue };
            sock.tx_waiting = false;
            if sock.tx_queue.is_empty() || sock.tx_psock.is_some() {
                continue;
            }
            sock.tx_psock = Some(p);
            let sh = self.share_mut(p).expect("checked");
            sh.tx_kcm = Some(w);
            sh.reserved += 1;
            return Some(w);
        }
        let sh = self.share_mut(p).expect("checked");
        sh.in_avail = true;
        self.psocks_avail.push_back(p);
        None
    }

    /// Release psock `p`'s reservation, if it has one (returned).
    pub(super) fn unreserve(&mut self, p: PsockId) -> Option<SockId> {
        let sh = self.share_mut(p)?;
        let s = sh.tx_kcm.take()?;
        sh.unreserved += 1;
        sh.tx_rsvd_msgs = 0;
        if let Some(sock) = self.socks.get_mut(s.index, s.generation) {
            if sock.tx_psock == Some(p) {
                sock.tx_psock = None;
            }
        }
        Some(s)
    }

    /// Psock `p` wrote `n` messages of its reservation whole. Whether the
    /// reservation is now to be released (nothing of it left on the psock,
    /// nothing more queued on its socket).
    #[inline]
    pub(super) fn written(&mut self, p: PsockId, n: usize) -> bool {
        let Some(sh) = self.share_mut(p) else { return false };
        sh.tx_rsvd_msgs -= n;
        match sh.tx_kcm {
            Some(s) if sh.tx_rsvd_msgs == 0 => {
                self.socks.get(s.index, s.generation).is_none_or(|sock| sock.tx_queue.is_empty())
            }
            _ => false,
        }
    }

    // ---- transmit: send buffers ----

    /// Messages of socket `owner` left the psocks (written, or dropped):
    /// its send buffer is uncharged (a socket closed since has nothing to
    /// uncharge).
    #[inline]
    pub(super) fn uncharge(&mut self, events: &mut VecDeque<Event>, owner: SockId, len: usize, msgs: u32) {
        if let Some(sock) = self.socks.get_mut(owner.index, owner.generation) {
            sock.tx_mem -= len;
            sock.tx_msgs -= msgs as usize;
            self.check_writable(events, owner);
        }
    }

    /// `SockWritable` for a socket that was refused and has room again.
    pub(super) fn check_writable(&mut self, events: &mut VecDeque<Event>, s: SockId) {
        if let Some(sock) = self.socks.get_mut(s.index, s.generation) {
            if sock.want_writable && sock.tx_mem < sock.sndbuf {
                sock.want_writable = false;
                events.push_back(Event::SockWritable(s));
            }
        }
    }

    /// Messages of socket `s` a psock gave back unwritten, in their order:
    /// at the head of its queue, to be placed again. `false`: the socket is
    /// gone (their charges went with it).
    pub(super) fn give_back(&mut self, s: SockId, msgs: impl DoubleEndedIterator<Item = Bytes>) -> bool {
        let Some(sock) = self.socks.get_mut(s.index, s.generation) else { return false };
        for data in msgs.rev() {
            sock.tx_queue.push_front(data);
        }
        true
    }

    /// Psock `p` writes nothing more (its transmit side `Stopped`): off
    /// the free list for good, and it can no longer answer.
    pub(super) fn stop_tx(&mut self, p: PsockId) {
        let Some(sh) = self.share_mut(p) else { return };
        sh.tx.state = Tx::Stopped;
        sh.answers = false;
        if std::mem::replace(&mut sh.in_avail, false) {
            self.psocks_avail.retain(|x| *x != p);
        }
    }
}
