//! What a socket's own passes kept for it (`Kept`): the messages a pass its
//! thread ran (a stand-alone slot's, or a worker's it led: `crate::lead`)
//! framed for it alone (`Own::frame_mine`) or, in a led pass, was handed
//! for it by the hub's steering (`shared::feed_read`), moved here as the
//! pass ends, and taken by the socket's receives before its queue in the
//! hub, with no hold of the hub lock.
//!
//! ```text
//!   a pass keeps ─────────► Own::mine ──(pass ends: Own::end_keep)──► Kept
//!                                                                      │
//!   recv takes one (its settle noted) ◄────────────────────────────────┤
//!   the socket's next hold of the hub: the settles told (`rx_settle`) ◄┤
//!   receive-disable, close: given back to the hub, unreceived ◄────────┘
//!     (`Mux::unkeep`: the socket's queue, or the other sockets'); a
//!     pass that ends after a receive-disable is refused and gives back
//!     its own (`sync::keep`, checked under loom)
//! ```
//!
//! Each message is held by its psock until taken and its settle told (a
//! psock's close waits for it, as for a queued message). Order: a psock's
//! messages are framed alone only while none of its messages waits in the
//! hub (`Owned::frame_alone`), so taking these first keeps each psock's
//! order; another psock's queued meanwhile may be overtaken (KCM orders a
//! psock's messages, not psocks; a message is handed from the hub only
//! while the socket's queue there is empty). Bounded: a pass keeps more
//! only while it holds less than one read chunk (`Config::read_chunk`),
//! and a socket's thread runs one only once these are taken.
//!
//! Lock order: the hub, then a socket's `Kept`.

use std::collections::VecDeque;

use connmux_core::mux::{PsockId, RecvInfo, SockId, SockType};
use connmux_core::Bytes;

/// A socket's kept messages (`SockRt::kept`).
#[derive(Default)]
pub(crate) struct Kept {
    msgs: VecDeque<(Bytes, PsockId)>,
    /// Messages taken whose settle the hub has not been told (psock, count).
    settle: Vec<(PsockId, u64)>,
}

impl Kept {
    /// Messages kept.
    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    /// A pass's messages, after those kept already.
    pub fn append(&mut self, msgs: &mut VecDeque<(Bytes, PsockId)>) {
        self.msgs.append(msgs);
    }

    /// The next message.
    pub fn take(&mut self) -> Option<(Bytes, PsockId)> {
        let (data, p) = self.msgs.pop_front()?;
        self.settle_one(p);
        Some((data, p))
    }

    /// `recv` of the next message into `buf` (as the hub's: a short buffer
    /// truncates a DGRAM message, and a SEQPACKET one is read on by the
    /// next call; `peek` takes nothing).
    pub fn recv(&mut self, ty: SockType, buf: &mut [u8], peek: bool) -> Option<RecvInfo> {
        let (data, psock) = self.msgs.front_mut()?;
        let (rem, psock) = (data.len(), *psock);
        let n = buf.len().min(rem);
        buf[..n].copy_from_slice(&data[..n]);
        if peek {
            return Some(RecvInfo { len: n, eor: false, trunc: false, psock });
        }
        if n < rem && ty == SockType::SeqPacket {
            *data = data.slice(n..);
            return Some(RecvInfo { len: n, eor: false, trunc: false, psock });
        }
        self.msgs.pop_front();
        self.settle_one(psock);
        Some(RecvInfo { len: n, eor: true, trunc: n < rem, psock })
    }

    /// The settles of the messages taken, told to the hub (in a hold of
    /// the socket's).
    pub fn settle(&mut self, m: &mut connmux_core::mux::Mux) {
        for (p, n) in self.settle.drain(..) {
            m.rx_settle(p, n);
        }
    }

    /// Everything kept goes back to socket `s`'s queue in the hub,
    /// unreceived (the socket is receive-disabled or closes: the hub moves
    /// them on), the settles told first.
    pub fn give_back(&mut self, m: &mut connmux_core::mux::Mux, s: SockId) {
        self.settle(m);
        if !self.msgs.is_empty() {
            m.unkeep(s, self.msgs.drain(..).collect());
        }
    }

    fn settle_one(&mut self, p: PsockId) {
        match self.settle.last_mut() {
            Some((q, n)) if *q == p => *n += 1,
            _ => self.settle.push((p, 1)),
        }
    }
}
