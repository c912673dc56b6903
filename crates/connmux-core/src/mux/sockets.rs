//! What the psocks of a mux share: the KCM sockets, the lists of sockets
//! waiting to receive (`kcm_rx_waiters`) and to send (`kcm_tx_waiters`), the
//! psocks waiting for a socket to take a message (`psocks_ready`) and free
//! for a reservation (`psocks_avail`), the hold queue, and the steering
//! policy that picks the socket for a message. What one connection owns is
//! in [`super::psock`]; the mux (`super`) moves messages between the two.

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
}

impl Sockets {
    /// Whether a message of psock `p` waits in a socket's receive queue or
    /// the hold queue (not yet taken by a reader).
    pub(super) fn holds_message_of(&self, p: PsockId) -> bool {
        self.socks.iter().any(|(_, _, s)| s.rx_queue.iter().any(|m| m.psock == p))
            || self.hold.iter().any(|m| m.psock == p)
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
