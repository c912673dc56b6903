//! What the psocks of a mux share: the KCM sockets, the lists of sockets
//! waiting to receive (`kcm_rx_waiters`) and to send (`kcm_tx_waiters`), the
//! psocks waiting for a socket to take a message (`psocks_ready`) and free
//! for a reservation (`psocks_avail`), the hold queue, and the steering
//! policy that picks the socket for a message, and what the readers owe each
//! psock (its messages waiting in queues, those taken and not yet answered:
//! [`Share`]). What one connection owns is in [`super::psock`]; the mux
//! (`super`) moves messages between the two.

use std::collections::VecDeque;

use super::slab::Slab;
use super::sock::Sock;
use super::{mix, sid, Event, MuxConfig, PsockId, RxMsg, SockId, Steering};

/// The shared part of a mux.
#[derive(Default)]
pub(super) struct Sockets {
    pub(super) socks: Slab<Sock>,
    /// Able sockets, FIFO (`kcm_rx_waiters`).
    pub(super) rx_waiters: VecDeque<SockId>,
    /// Paused psocks holding a ready message, FIFO (`psocks_ready`).
    pub(super) psocks_ready: VecDeque<PsockId>,
    /// Messages moved off disabled/closed sockets that nobody could take.
    pub(super) hold: VecDeque<RxMsg>,
    pub(super) hold_mem: usize,
    pub(super) hold_budget: usize,
    /// Psocks free for transmit, least recently used first (`psocks_avail`).
    pub(super) psocks_avail: VecDeque<PsockId>,
    /// Sockets waiting for a psock, FIFO (`kcm_tx_waiters`).
    pub(super) tx_waiters: VecDeque<SockId>,
    /// Each attached psock's [`Share`], by its index.
    shares: Vec<Option<Share>>,
}

/// What the sockets' side keeps of one psock: its messages in the hands of
/// readers. The psock's owner is told what it needs of this (its reading
/// held back, its last message answered), never reads it.
#[derive(Debug)]
pub(super) struct Share {
    generation: u32,
    /// Its messages waiting in sockets' receive queues (or the hold queue),
    /// not yet taken by a reader (`MuxConfig::psock_queued_max`).
    pub(super) queued: usize,
    /// `queued` reached `psock_queued_max`: the psock is not read until it
    /// is down to half (then `PsockRxResume`).
    pub(super) queued_full: bool,
    /// Messages handed to holding sockets' readers and not yet settled
    /// ([`super::Mux::set_holds`], [`super::Mux::rx_settle`]): requests
    /// still being answered.
    pub(super) holds: u64,
}

impl Share {
    /// Nothing of the psock is in readers' hands: none of its messages
    /// waits in a queue, every one taken has been answered.
    #[inline]
    pub(super) fn readers_done(&self) -> bool {
        self.queued == 0 && self.holds == 0
    }
    /// One more of its messages waits in a socket's queue.
    #[inline]
    pub(super) fn count_queued(&mut self, config: &MuxConfig) {
        self.queued += 1;
        if self.queued >= config.psock_queued_max {
            self.queued_full = true;
        }
    }
}

impl Sockets {
    /// A psock was attached: its share starts empty.
    pub(super) fn add_share(&mut self, p: PsockId) {
        let i = p.index as usize;
        if self.shares.len() <= i {
            self.shares.resize_with(i + 1, || None);
        }
        self.shares[i] = Some(Share { generation: p.generation, queued: 0, queued_full: false, holds: 0 });
    }
    /// A psock was unattached.
    pub(super) fn remove_share(&mut self, p: PsockId) {
        if let Some(slot) = self.shares.get_mut(p.index as usize) {
            if slot.as_ref().is_some_and(|sh| sh.generation == p.generation) {
                *slot = None;
            }
        }
    }
    #[inline]
    pub(super) fn share(&self, p: PsockId) -> Option<&Share> {
        self.shares.get(p.index as usize)?.as_ref().filter(|sh| sh.generation == p.generation)
    }
    #[inline]
    pub(super) fn share_mut(&mut self, p: PsockId) -> Option<&mut Share> {
        self.shares.get_mut(p.index as usize)?.as_mut().filter(|sh| sh.generation == p.generation)
    }
    /// Whether the sockets hold psock `p`'s reading back: too many of its
    /// messages wait for readers.
    #[inline]
    pub(super) fn holds_back(&self, p: PsockId) -> bool {
        self.share(p).is_some_and(|sh| sh.queued_full)
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
}
